/*
 * dst-pretrain: BERT masked-LM pre-training on libdstransformer. This version has the data side:
 *
 *   dst-pretrain tokenize --vocab FILE [--cased] [FILE|-]     WordPiece ids of each input line
 *   dst-pretrain data --vocab FILE (--corpus FILE | --hdf5 SHARD...) [--batch N] [--seq S]
 *                     [--max-pred P] [--seed N] [--batches K] [--start K] [--depth D] [--cased]
 *                                                            the first batches the loader thread makes
 *
 * Defaults: the embedded corpus and vocabulary (tools/dst-pretrain/data, or where installed), batch 8,
 * seq 128, max-pred 20, seed 42. Exit status: 0 success, 1 failure (the reason on stderr), 2 usage.
 * C99; the training loop (model, engine, checkpoints) joins with the library's training engine.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pretrain_data.h"

#include <unistd.h>

#ifndef DSTP_SOURCE_DATA_DIR
#define DSTP_SOURCE_DATA_DIR "."
#endif
#ifndef DSTP_INSTALLED_DATA_DIR
#define DSTP_INSTALLED_DATA_DIR "."
#endif

/* The embedded corpus and vocabulary: next to the sources (a build tree), else where they are installed. */
static const char *data_path(const char *name) {
    static char buf[2][4096];
    static int which = 0;
    char *out = buf[which ^= 1];
    snprintf(out, sizeof buf[0], "%s/%s", DSTP_SOURCE_DATA_DIR, name);
    if (access(out, R_OK) != 0) snprintf(out, sizeof buf[0], "%s/%s", DSTP_INSTALLED_DATA_DIR, name);
    return out;
}

static const char *prog = "dst-pretrain";

static void usage(FILE *f) {
    fprintf(f,
            "usage: %s tokenize [--vocab FILE] [--cased] [FILE|-]\n"
            "       %s data [--vocab FILE] [--corpus FILE | --hdf5 SHARD...] [--batch N] [--seq S]\n"
            "               [--max-pred P] [--seed N] [--batches K] [--start K] [--depth D] [--cased]\n"
            "tokenize prints the WordPiece ids of each line of FILE (stdin for -).\n"
            "data prints a summary of the first K batches (default 3) of the loader thread: raw text made\n"
            "into masked sentence pairs, or NVIDIA's pre-processed HDF5 shards.\n"
            "Defaults: --vocab %s --corpus %s --batch 8 --seq 128 --max-pred 20 --seed 42.\n"
            "Exit status: 0 success, 1 failure, 2 usage error.\n",
            prog, prog, data_path("vocab.txt"), data_path("kjv.txt"));
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

static int cmd_data(int argc, char **argv) {
    dstp_loader_config cfg;
    const char **shards = NULL;
    long v, batches = 3;
    int i, rc = 0;
    dstp_loader *l = NULL;
    dstp_error err;
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
    for (v = 0; v < batches; ++v) {
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
    }
    dstp_loader_destroy(l);
    free(shards);
    return rc;
}

int main(int argc, char **argv) {
    if (argc < 2 || strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    if (strcmp(argv[1], "tokenize") == 0) return cmd_tokenize(argc - 2, argv + 2);
    if (strcmp(argv[1], "data") == 0) return cmd_data(argc - 2, argv + 2);
    fprintf(stderr, "%s: unknown command '%s'\n", prog, argv[1]);
    usage(stderr);
    return 2;
}
