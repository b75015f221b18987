/*
 * dst-pretrain: BERT masked-LM pre-training on libdstransformer, in C99 on the library's public API.
 *
 *   dst-pretrain train [options]          pre-train (the embedded corpus and a small BERT by default)
 *   dst-pretrain export --checkpoint DIR --out DIR      an engine checkpoint as Hugging Face BertForMaskedLM
 *   dst-pretrain logits (--checkpoint DIR | --hf DIR) --ids "2 45 ..." --out FILE   MLM logits of a sequence
 *   dst-pretrain tokenize [--vocab FILE] [--cased] [FILE|-]     WordPiece ids of each input line
 *   dst-pretrain data [options]           the first batches the loader thread makes
 *
 * `dst-pretrain --help` and `dst-pretrain train --help` list the options; docs/pretrain.md explains them,
 * the outputs and the exit codes (0 success, 1 failure, 2 usage, 3 configuration, 4 data, 5 no such
 * backend, 6 data-parallel communication failed, 130 interrupted after saving a checkpoint).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model.h"  /* defines: dstp_layers */
#include "pretrain_data.h"
#include "train.h"

#include <unistd.h>

#ifndef DSTP_SOURCE_DATA_DIR
#define DSTP_SOURCE_DATA_DIR "."
#endif
#ifndef DSTP_INSTALLED_DATA_DIR
#define DSTP_INSTALLED_DATA_DIR "."
#endif

/* The embedded corpus, vocabulary and configurations: next to the sources (a build tree), else where they
 * are installed. The result lives in one of 8 rotating buffers: at most 8 are in use at a time. */
static const char *data_path(const char *name) {
    static char buf[8][4096];
    static int which = 0;
    char *out = buf[which = (which + 1) % 8];
    snprintf(out, sizeof buf[0], "%s/%s", DSTP_SOURCE_DATA_DIR, name);
    if (access(out, R_OK) != 0) snprintf(out, sizeof buf[0], "%s/%s", DSTP_INSTALLED_DATA_DIR, name);
    return out;
}

static const char *prog = "dst-pretrain";

/* The first 8 bytes of a `data --out` file; the records follow (write_batch). */
#define DSTP_BATCH_FILE_MAGIC "DSTPBAT1"


static void usage(FILE *f) {
    fprintf(f,
            "usage: %s train [options]            BERT masked-LM pre-training (see train --help)\n"
            "       %s export --checkpoint DIR [--tag T] --out DIR [--vocab FILE]\n"
            "       %s logits (--checkpoint DIR [--tag T] | --hf DIR) --ids \"ID ...\" [--types \"T ...\"] --out FILE\n"
            "       %s tokenize [--vocab FILE] [--cased] [FILE|-]\n"
            "       %s data [--vocab FILE] [--corpus FILE | --hdf5 SHARD...] [--batch N] [--seq S]\n"
            "               [--max-pred P] [--seed N] [--batches K] [--start K] [--depth D] [--cased]\n"
            "               [--out FILE]\n"
            "train pre-trains BERT on the library (the embedded corpus and a small model by default: what\n"
            "`./run.sh demo` runs). export writes an engine checkpoint as a Hugging Face BertForMaskedLM\n"
            "folder; logits writes the MLM logits of one sequence (float32 [len, vocab]); tokenize prints\n"
            "the WordPiece ids of each line; data summarises the loader thread's first batches (and with\n"
            "--out writes them whole, as the binary records of docs/pretrain-data.md, for other trainers).\n"
            "Defaults: --vocab %s --corpus %s --batch 8 --seq 128 --max-pred 20 --seed 42.\n"
            "Exit status: 0 success, 1 failure, 2 usage error, 3 configuration error, 4 data error,\n"
            "5 backend not available, 6 data-parallel communication failed, 130 interrupted (a checkpoint\n"
            "was saved first).\n",
            prog, prog, prog, prog, prog, data_path("vocab.txt"), data_path("kjv.txt"));
}

static void train_usage(FILE *f) {
    fprintf(f,
            "usage: %s train [options]\n"
            "Pre-trains BERT for masked-LM (and next-sentence) prediction with the library's layers, model ops\n"
            "and training engine; prints a progress line every steps_per_print steps and writes\n"
            "OUTPUT/metrics.jsonl, OUTPUT/metrics.svg, OUTPUT/checkpoints/ and OUTPUT/hf/.\n"
            "  --model-config FILE  Hugging Face config.json form (default %s)\n"
            "  --ds-config FILE     DeepSpeed-style engine configuration (default %s)\n"
            "  --vocab FILE         WordPiece vocabulary (default %s)\n"
            "  --corpus FILE        raw text: documents separated by blank lines (default %s)\n"
            "  --hdf5 SHARD...      NVIDIA's pre-processed HDF5 shards instead of raw text\n"
            "  --cased              keep case and accents (default: uncased, as the vocabulary)\n"
            "  --seq S              sequence length (default: 128, or max_position_embeddings when smaller;\n"
            "                       HDF5: the shards')\n"
            "  --max-pred P         masked positions per sequence at most (default: 15 %% of seq, rounded up)\n"
            "  --steps N            train until optimizer step N (default: the schedule's total_num_steps\n"
            "                       or total_training_steps, else 1000)\n"
            "  --max-time SECONDS   stop at the first step boundary after this long, saving a checkpoint\n"
            "  --output DIR         where everything goes (default dst-pretrain-out)\n"
            "  --save-every N       a checkpoint every N steps (default 0: at the end only)\n"
            "  --eval-every N       held-out loss and accuracy every N steps (default 100; 0: never)\n"
            "  --eval-batches K     held-out batches (default 8)\n"
            "  --holdout-every K    one document (or sample) in K is held out (default 20)\n"
            "  --print-every N      a progress line every N steps (default: steps_per_print, else 10)\n"
            "  --resume             continue from OUTPUT/checkpoints/latest, bit for bit\n"
            "  --init-from FILE     initial weights from a Hugging Face BERT safetensors file\n"
            "  --export-hf DIR      where the Hugging Face BertForMaskedLM goes (default OUTPUT/hf)\n"
            "  --no-export          no Hugging Face export (Pre-LN models have none)\n"
            "  --backend B          auto (default: CUDA when a GPU is usable), cpu or cuda\n"
            "  --threads N          CPU threads of the library's loops (default: all cores)\n"
            "  --seed N             weights, data order, masking and dropout (default 42)\n"
            "  --depth D            batches the loader thread prepares ahead (default 4)\n"
            "  --quiet              no progress output (the files are written all the same)\n",
            prog, data_path("demo_model.json"), data_path("demo_ds.json"), data_path("vocab.txt"),
            data_path("kjv.txt"));
    /* split in two: C99 compilers need only support string literals of 4095 characters */
    fputs("  --comm C             gradient averaging over the processes: auto (default: NCCL with the CUDA\n"
          "                       backend and more than one process), nccl (also with one), or none\n"
          "  --comm-timeout S     data parallelism: a rank that sees no progress for S seconds (another\n"
          "                       rank stopped) or an NCCL error ends with a message and exit 6\n"
          "                       (default 600; 0: wait forever)\n"
          "  --no-overlap         all-reduce the gradients after the backward, not during it (to measure\n"
          "                       what the overlap gains)\n"
          "  --check-replicas     after every step, compare a checksum of the weights over the ranks: a\n"
          "                       \"replicas\" line in metrics.jsonl, exit 1 if they differ (copies every\n"
          "                       weight to the host: for correctness runs)\n"
          "  --profile            time each phase of a step (data, embeddings and heads, layers, all-reduce\n"
          "                       wait, optimizer, other) with a device synchronisation at its end: one\n"
          "                       \"profile\" line per step in metrics.jsonl and a summary at the end\n"
          "  --profile-calls      --profile, and every library call of the model timed with a device\n"
          "                       synchronisation before and after it: the costliest call sites at the end\n"
          "  --eager-checks       the library's model ops check their token ids, rows and labels before\n"
          "                       returning, waiting for the GPU each time (default: on the GPU without\n"
          "                       waiting, reported by a later call; the loader has checked them already)\n"
          "  --zero-grads         the engine sets the gradients to zero at each step and every backward op\n"
          "                       adds to them (default: the step leaves them, and the first micro-batch\n"
          "                       of the next step writes them: one pass over the gradients fewer)\n"
          "  --no-checkpoint      write no checkpoint (not every N steps, at the end or on a signal)\n"
          "  --layers M           how the layers run: padded (on the padded batch, key lengths), packed (on\n"
          "                       the real tokens only) or auto (default: packed when at most 90 % of the\n"
          "                       batch's positions are real tokens); the same model either way\n"
          "Data parallelism: one process per GPU, started by mpirun or with RANK, WORLD_SIZE, LOCAL_RANK,\n"
          "MASTER_ADDR and MASTER_PORT set (docs/pretrain.md); rank 0 prints and writes the outputs.\n"
          "Ctrl-C (SIGINT) or SIGTERM saves a checkpoint at the next step boundary and exits with 130; a\n"
          "second Ctrl-C ends the process at once. Exit status: 0 success, 1 failure, 2 usage error,\n"
          "3 configuration error (the message names the key), 4 data error, 5 backend not available,\n"
          "6 data-parallel communication failed.\n",
          f);
}

static int parse_int(const char *s, long lo, long hi, long *out) {
    char *end = NULL;
    const long v = strtol(s, &end, 10);
    if (!s[0] || *end || v < lo || v > hi) return 0;
    *out = v;
    return 1;
}

static int cmd_tokenize(int argc, char **argv) {
    const char *vocab_path = data_path("vocab.txt"), *in = "-";
    int cased = 0, i, rc = 0;
    dstp_vocab *vocab = NULL;
    dstp_error err;
    dstp_tokenizer tok;
    FILE *f;
    char *line = NULL;
    size_t cap = 0;
    long n, lineno = 0;
    for (i = 0; i < argc; ++i) {
        if (strcmp(argv[i], "--vocab") == 0 && i + 1 < argc) vocab_path = argv[++i];
        else if (strcmp(argv[i], "--cased") == 0) cased = 1;
        else if (argv[i][0] != '-' || strcmp(argv[i], "-") == 0) in = argv[i];
        else {
            usage(stderr);
            return 2;
        }
    }
    if (dstp_vocab_load(vocab_path, &vocab, &err) != DSTP_OK) {
        fprintf(stderr, "%s: %s\n", prog, err.msg);
        return 1;
    }
    f = strcmp(in, "-") == 0 ? stdin : fopen(in, "rb");
    if (!f) {
        fprintf(stderr, "%s: %s: cannot open\n", prog, in);
        dstp_vocab_free(vocab);
        return 1;
    }
    tok.vocab = vocab;
    tok.lower_case = !cased;
    tok.max_chars_per_word = 100;
    while ((n = (long)getline(&line, &cap, f)) >= 0) {
        dstp_ids ids = {NULL, 0, 0};
        size_t k;
        ++lineno;
        if (n > 0 && line[n - 1] == '\n') line[--n] = '\0';
        if (dstp_tokenize(&tok, line, (size_t)n, &ids, &err) != DSTP_OK) {
            fprintf(stderr, "%s: %s: line %ld: %s\n", prog, in, lineno, err.msg);
            dstp_ids_free(&ids);
            rc = 1;
            break;
        }
        for (k = 0; k < ids.n; ++k) printf(k ? " %d" : "%d", (int)ids.v[k]);
        printf("\n");
        dstp_ids_free(&ids);
    }
    free(line);
    if (f != stdin) fclose(f);
    dstp_vocab_free(vocab);
    return rc;
}

/* One batch as a record of `data --out` (docs/pretrain-data.md): int32 values in the host's byte order,
 * batch, seq, max_pred, nrows, then ids [batch·seq], types [batch·seq], lengths [batch], nsp [batch],
 * rows [nrows], labels [nrows]. Returns 0, or -1 when the file cannot be written. */
static int write_batch(FILE *f, const dstp_batch *b) {
    const int32_t head[4] = {b->batch, b->seq, b->max_pred, b->nrows};
    const size_t n = (size_t)b->batch * (size_t)b->seq, bs = (size_t)b->batch, m = (size_t)b->nrows;
    return fwrite(head, sizeof head[0], 4, f) == 4 && fwrite(b->ids, sizeof(int32_t), n, f) == n &&
                   fwrite(b->types, sizeof(int32_t), n, f) == n && fwrite(b->lengths, sizeof(int32_t), bs, f) == bs &&
                   fwrite(b->nsp, sizeof(int32_t), bs, f) == bs && fwrite(b->rows, sizeof(int32_t), m, f) == m &&
                   fwrite(b->labels, sizeof(int32_t), m, f) == m
               ? 0
               : -1;
}

static int cmd_data(int argc, char **argv) {
    dstp_loader_config cfg;
    const char **shards = NULL;
    long v, batches = 3;
    int i, rc = 0;
    dstp_loader *l = NULL;
    dstp_error err;
    const char *out_path = NULL;
    FILE *out = NULL;
    memset(&cfg, 0, sizeof cfg);
    cfg.vocab = data_path("vocab.txt");
    cfg.lower_case = 1;
    cfg.batch = 8;
    cfg.seq = 128;
    cfg.max_pred = 20;
    cfg.seed = 42;
    cfg.depth = 2;
    shards = (const char **)calloc((size_t)argc + 1, sizeof *shards);
    if (!shards) return 1;
    for (i = 0; i < argc; ++i) {
        const char *a = argv[i], *next = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(a, "--vocab") == 0 && next) cfg.vocab = argv[++i];
        else if (strcmp(a, "--corpus") == 0 && next) cfg.corpus = argv[++i];
        else if (strcmp(a, "--hdf5") == 0 && next) {
            while (i + 1 < argc && argv[i + 1][0] != '-') shards[cfg.num_shards++] = argv[++i];
        } else if (strcmp(a, "--batch") == 0 && next && parse_int(next, 1, 1 << 20, &v)) cfg.batch = (int32_t)v, ++i;
        else if (strcmp(a, "--seq") == 0 && next && parse_int(next, 8, 4096, &v)) cfg.seq = (int32_t)v, ++i;
        else if (strcmp(a, "--max-pred") == 0 && next && parse_int(next, 1, 4096, &v)) cfg.max_pred = (int32_t)v, ++i;
        else if (strcmp(a, "--seed") == 0 && next && parse_int(next, 0, 0x7FFFFFFF, &v)) cfg.seed = (uint64_t)v, ++i;
        else if (strcmp(a, "--batches") == 0 && next && parse_int(next, 1, 1 << 30, &v)) batches = v, ++i;
        else if (strcmp(a, "--start") == 0 && next && parse_int(next, 0, 0x7FFFFFFF, &v)) cfg.start_batch = (uint64_t)v, ++i;
        else if (strcmp(a, "--depth") == 0 && next && parse_int(next, 1, 64, &v)) cfg.depth = (int32_t)v, ++i;
        else if (strcmp(a, "--cased") == 0) cfg.lower_case = 0;
        else if (strcmp(a, "--out") == 0 && next) out_path = argv[++i];
        else {
            fprintf(stderr, "%s: data: bad argument '%s'\n", prog, a);
            usage(stderr);
            free(shards);
            return 2;
        }
    }
    if (cfg.num_shards) cfg.shards = shards;
    else if (!cfg.corpus) cfg.corpus = data_path("kjv.txt");
    if (cfg.num_shards && cfg.corpus) {
        fprintf(stderr, "%s: data: give --corpus or --hdf5, not both\n", prog);
        free(shards);
        return 2;
    }
    if (dstp_loader_create(&cfg, &l, &err) != DSTP_OK) {
        fprintf(stderr, "%s: %s\n", prog, err.msg);
        free(shards);
        return 1;
    }
    if (out_path && !(out = fopen(out_path, "wb"))) {
        fprintf(stderr, "%s: data: --out %s: cannot write: %s\n", prog, out_path, strerror(errno));
        dstp_loader_destroy(l);
        free(shards);
        return 1;
    }
    if (out && fwrite(DSTP_BATCH_FILE_MAGIC, 1, 8, out) != 8) rc = -1;
    for (v = 0; v < batches && rc == 0; ++v) {
        const dstp_batch *b;
        long tokens = 0, nsp = 0, b_i;
        if (dstp_loader_next(l, &b, &err) != DSTP_OK) {
            fprintf(stderr, "%s: %s\n", prog, err.msg);
            rc = 1;
            break;
        }
        for (b_i = 0; b_i < b->batch; ++b_i) {
            tokens += b->lengths[b_i];
            nsp += b->nsp[b_i];
        }
        printf("batch %llu (epoch %llu): %d sequences of %d, %ld tokens, %d masked (%.1f%%), %ld random next\n",
               (unsigned long long)b->index, (unsigned long long)b->epoch, (int)b->batch, (int)b->seq, tokens,
               (int)b->nrows, tokens ? 100.0 * b->nrows / tokens : 0.0, nsp);
        printf("  first ids:");
        for (b_i = 0; b_i < b->lengths[0] && b_i < 16; ++b_i) printf(" %d", (int)b->ids[b_i]);
        printf("\n");
        if (out && write_batch(out, b) != 0) rc = -1;
    }
    if (out && (fclose(out) != 0 || rc == -1)) {
        fprintf(stderr, "%s: data: --out %s: write failed: %s\n", prog, out_path, strerror(errno));
        rc = 1;
    }
    dstp_loader_destroy(l);
    free(shards);
    return rc;
}

static int parse_i64(const char *s, int64_t lo, int64_t hi, int64_t *out) {
    char *end = NULL;
    long long v;
    errno = 0;
    v = strtoll(s, &end, 10);
    if (!s[0] || *end || errno || v < lo || v > hi) return 0;
    *out = (int64_t)v;
    return 1;
}

static int parse_backend(const char *s, dst_backend *b) {
    if (strcmp(s, "auto") == 0) *b = DST_BACKEND_AUTO;
    else if (strcmp(s, "cpu") == 0) *b = DST_BACKEND_CPU;
    else if (strcmp(s, "cuda") == 0) *b = DST_BACKEND_CUDA;
    else return 0;
    return 1;
}

static int parse_comm(const char *s, dstp_comm_kind *k) {
    if (strcmp(s, "auto") == 0) *k = DSTP_COMM_AUTO;
    else if (strcmp(s, "none") == 0) *k = DSTP_COMM_NONE;
    else if (strcmp(s, "nccl") == 0) *k = DSTP_COMM_NCCL;
    else return 0;
    return 1;
}

static int bad_arg(const char *cmd, const char *a, const char *why) {
    fprintf(stderr, "%s: %s: %s '%s' (see %s %s --help)\n", prog, cmd, why, a, prog, cmd);
    return DSTP_EXIT_USAGE;
}

static int cmd_train(int argc, char **argv) {
    dstp_train_options o;
    const char **shards = (const char **)calloc((size_t)argc + 1, sizeof *shards);
    int i, rc;
    int64_t v;
    double d;
    if (!shards) return DSTP_EXIT_FAILURE;
    dstp_train_options_default(&o);
    o.model_config = data_path("demo_model.json");
    o.ds_config = data_path("demo_ds.json");
    o.vocab = data_path("vocab.txt");
    for (i = 0; i < argc; ++i) {
        const char *a = argv[i], *next = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            train_usage(stdout);
            free(shards);
            return DSTP_EXIT_OK;
        }
#define OPT(name) (strcmp(a, name) == 0 && next && (++i, 1))
#define INT(name, lo, hi) (strcmp(a, name) == 0 && next && parse_i64(next, lo, hi, &v) && (++i, 1))
        if (OPT("--model-config")) o.model_config = next;
        else if (OPT("--ds-config")) o.ds_config = next;
        else if (OPT("--vocab")) o.vocab = next;
        else if (OPT("--corpus")) o.corpus = next;
        else if (strcmp(a, "--hdf5") == 0 && next) {
            while (i + 1 < argc && argv[i + 1][0] != '-') shards[o.num_shards++] = argv[++i];
        } else if (strcmp(a, "--cased") == 0) o.cased = 1;
        else if (INT("--seq", 8, 4096)) o.seq = (int32_t)v;
        else if (INT("--max-pred", 1, 4096)) o.max_pred = (int32_t)v;
        else if (INT("--steps", 0, (int64_t)1 << 40)) o.steps = v;
        else if (strcmp(a, "--max-time") == 0 && next && (d = strtod(next, NULL)) > 0 && (++i, 1)) o.max_time = d;
        else if (OPT("--output")) o.output = next;
        else if (INT("--save-every", 0, (int64_t)1 << 40)) o.save_every = v;
        else if (INT("--eval-every", 0, (int64_t)1 << 40)) o.eval_every = v;
        else if (INT("--eval-batches", 1, 100000)) o.eval_batches = (int32_t)v;
        else if (INT("--holdout-every", 2, 1 << 30)) o.holdout_every = (int32_t)v;
        else if (INT("--print-every", 1, (int64_t)1 << 40)) o.print_every = v;
        else if (strcmp(a, "--resume") == 0) o.resume = 1;
        else if (OPT("--init-from")) o.init_from = next;
        else if (OPT("--export-hf")) o.export_hf = next;
        else if (strcmp(a, "--no-export") == 0) o.no_export = 1;
        else if (strcmp(a, "--backend") == 0 && next && parse_backend(next, &o.backend)) ++i;
        else if (INT("--threads", 1, DST_MAX_NUM_THREADS)) o.threads = (int)v;
        else if (INT("--seed", 0, (int64_t)0x7FFFFFFFFFFFFFFF)) o.seed = (uint64_t)v;
        else if (INT("--depth", 1, 64)) o.depth = (int32_t)v;
        else if (strcmp(a, "--quiet") == 0) o.quiet = 1;
        else if (strcmp(a, "--comm") == 0 && next && parse_comm(next, &o.comm)) ++i;
        else if (strcmp(a, "--profile") == 0) o.profile = 1;
        else if (strcmp(a, "--profile-calls") == 0) o.profile = o.profile_calls = 1;
        else if (strcmp(a, "--no-checkpoint") == 0) o.no_checkpoint = 1;
        else if (INT("--comm-timeout", 0, 86400)) o.comm_timeout = (double)v;
        else if (strcmp(a, "--no-overlap") == 0) o.no_overlap = 1;
        else if (strcmp(a, "--check-replicas") == 0) o.check_replicas = 1;
        else if (strcmp(a, "--eager-checks") == 0) o.eager_checks = 1;
        else if (strcmp(a, "--zero-grads") == 0) o.zero_grads = 1;
        else if (strcmp(a, "--layers") == 0 && next &&
                 (strcmp(next, "auto") == 0 || strcmp(next, "padded") == 0 || strcmp(next, "packed") == 0)) {
            o.layers = strcmp(next, "packed") == 0 ? DSTP_LAYERS_PACKED
                       : strcmp(next, "padded") == 0 ? DSTP_LAYERS_PADDED : DSTP_LAYERS_AUTO;
            ++i;
        }
        else {
            free(shards);
            return bad_arg("train", a, next && a[0] == '-' ? "bad option or value" : "unknown argument");
        }
#undef OPT
#undef INT
    }
    if (o.num_shards && o.corpus) {
        free(shards);
        return bad_arg("train", "--hdf5", "give --corpus or --hdf5, not both:");
    }
    if (o.num_shards) o.shards = shards;
    else if (!o.corpus) o.corpus = data_path("kjv.txt");
    if (o.resume && o.init_from) fprintf(stderr, "%s: train: --init-from is ignored with --resume\n", prog);
    rc = dstp_train(&o);
    free(shards);
    return rc;
}

/* "2 45 3" -> ids; returns the count or -1. */
static int32_t parse_ids(const char *s, int32_t *out, int32_t cap) {
    int32_t n = 0;
    while (*s) {
        char *end = NULL;
        long v;
        while (*s == ' ' || *s == ',') ++s;
        if (!*s) break;
        errno = 0;
        v = strtol(s, &end, 10);
        if (end == s || errno || v < 0 || v > 0x7FFFFFFF || n >= cap) return -1;
        out[n++] = (int32_t)v;
        s = end;
    }
    return n;
}

static int cmd_source(int argc, char **argv, int logits) {
    dstp_source_options src;
    const char *cmd = logits ? "logits" : "export", *ids_text = NULL, *types_text = NULL, *out = NULL;
    const char *vocab = data_path("vocab.txt");
    int32_t ids[4096], types[4096], n = 0;
    int i;
    int64_t v;
    memset(&src, 0, sizeof src);
    src.backend = DST_BACKEND_AUTO;
    for (i = 0; i < argc; ++i) {
        const char *a = argv[i], *next = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            usage(stdout);
            return DSTP_EXIT_OK;
        }
        if (strcmp(a, "--checkpoint") == 0 && next) src.checkpoint = argv[++i];
        else if (strcmp(a, "--tag") == 0 && next) src.tag = argv[++i];
        else if (logits && strcmp(a, "--hf") == 0 && next) src.hf = argv[++i];
        else if (logits && strcmp(a, "--ids") == 0 && next) ids_text = argv[++i];
        else if (logits && strcmp(a, "--types") == 0 && next) types_text = argv[++i];
        else if (!logits && strcmp(a, "--vocab") == 0 && next) vocab = argv[++i];
        else if (strcmp(a, "--out") == 0 && next) out = argv[++i];
        else if (strcmp(a, "--backend") == 0 && next && parse_backend(next, &src.backend)) ++i;
        else if (strcmp(a, "--threads") == 0 && next && parse_i64(next, 1, DST_MAX_NUM_THREADS, &v)) src.threads = (int)v, ++i;
        else return bad_arg(cmd, a, "bad option or value");
    }
    if (!out || (!src.checkpoint == !src.hf)) {
        fprintf(stderr, "%s: %s: needs --out and %s\n", prog, cmd, logits ? "one of --checkpoint or --hf" : "--checkpoint");
        usage(stderr);
        return DSTP_EXIT_USAGE;
    }
    if (!logits) return dstp_export(&src, out, vocab);
    memset(types, 0, sizeof types);
    if (!ids_text || (n = parse_ids(ids_text, ids, 4096)) < 1) {
        fprintf(stderr, "%s: logits: --ids needs 1 to 4096 token ids\n", prog);
        return DSTP_EXIT_USAGE;
    }
    if (types_text && parse_ids(types_text, types, 4096) != n) {
        fprintf(stderr, "%s: logits: --types needs as many values as --ids (%d)\n", prog, (int)n);
        return DSTP_EXIT_USAGE;
    }
    return dstp_logits(&src, ids, types, n, out);
}

int main(int argc, char **argv) {
    if (argc < 2 || strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? DSTP_EXIT_USAGE : DSTP_EXIT_OK;
    }
    if (strcmp(argv[1], "train") == 0) return cmd_train(argc - 2, argv + 2);
    if (strcmp(argv[1], "export") == 0) return cmd_source(argc - 2, argv + 2, 0);
    if (strcmp(argv[1], "logits") == 0) return cmd_source(argc - 2, argv + 2, 1);
    if (strcmp(argv[1], "tokenize") == 0) return cmd_tokenize(argc - 2, argv + 2);
    if (strcmp(argv[1], "data") == 0) return cmd_data(argc - 2, argv + 2);
    fprintf(stderr, "%s: unknown command '%s'\n", prog, argv[1]);
    usage(stderr);
    return DSTP_EXIT_USAGE;
}
