/*
 * dst-pretrain's training loop. Per micro-batch (deepspeed_engine.md §7.6): the loader thread's next
 * batch, dstp_model_train (forward, loss, backward: the first micro-batch of a step writes the gradients,
 * the others add to them), dst_engine_step (the optimizer step at an accumulation boundary, which leaves
 * the gradients unzeroed unless --zero-grads). At each boundary: a metrics line; every print interval a progress line;
 * every eval interval the held-out loss; every save interval a checkpoint, whose client state holds
 * what a resume needs (epoch, step, samples, data position, the data settings and the model config).
 *
 * Data parallelism (comm.h): one process per GPU. Rank r trains on batches r, r + W, r + 2W, ... of the
 * one batch stream (W the world size), the last micro-batch of each step hands its buckets of final
 * gradients to the communicator as the backward produces them (NCCL all-reduces on a second stream,
 * overlapping the backward of the earlier layers), and the optimizer step waits for them. Every rank
 * holds the same weights; rank 0 alone prints, writes the metrics, the plot, the checkpoints and the
 * export. The engine of this version steps one process, so each rank's engine gets the configuration
 * with train_batch_size / W, after the whole configuration was checked against the world size.
 */
#include "train.h"

#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <jansson.h>

#include "comm.h"
#include "model.h"
#include "pretrain_data.h"

void dstp_seterr(dstp_error *err, const char *fmt, ...);
dstp_status dstp_read_file(const char *path, char **data, size_t *len, dstp_error *err);

static const char prog[] = "dst-pretrain";

static void fail_msg(const char *fmt, ...) {
    va_list ap;
    fprintf(stderr, "%s: ", prog);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
}

#define LIBCALL(call, code)                                                                                  \
    do {                                                                                                     \
        const dst_status st_ = (call);                                                                       \
        if (st_ != DST_OK) {                                                                                 \
            fail_msg("%s: %s", dst_status_string(st_), dst_last_error());                                    \
            rc = (code);                                                                                     \
            goto done;                                                                                       \
        }                                                                                                    \
    } while (0)

static const char *duration(double s, char *buf, size_t n) {
    const long t = (long)(s + 0.5);
    if (t >= 3600) snprintf(buf, n, "%ldh%02ldm", t / 3600, (t / 60) % 60);
    else if (t >= 60) snprintf(buf, n, "%ldm%02lds", t / 60, t % 60);
    else snprintf(buf, n, "%lds", t);
    return buf;
}

static int mkdirs(const char *path) {
    char tmp[4096];
    size_t i, n = strlen(path);
    if (n == 0 || n >= sizeof tmp) return -1;
    memcpy(tmp, path, n + 1);
    for (i = 1; i <= n; ++i)
        if (tmp[i] == '/' || tmp[i] == '\0') {
            const char c = tmp[i];
            tmp[i] = '\0';
            if (mkdir(tmp, 0777) != 0 && errno != EEXIST) return -1;
            tmp[i] = c;
        }
    return 0;
}

/* ---- signals: Ctrl-C saves a checkpoint and stops at the next step boundary ---------------------------- */
static volatile sig_atomic_t g_stop = 0;
static void on_signal(int sig) { g_stop = sig; }

static void install_signals(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sa.sa_flags = (int)SA_RESETHAND; /* a second Ctrl-C ends the process at once */
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
}

/* ---- data parallelism --------------------------------------------------------------------------------------- */

/* The gradient hook of the last micro-batch of a step: each bucket goes to the communicator. */
static dstp_status reduce_bucket(void *user, const dst_tensor *grads, int n, dstp_error *err) {
    return dstp_comm_reduce((dstp_comm *)user, grads, n, err);
}

/* --no-overlap: the buckets are collected during the backward and reduced together after it. */
typedef struct deferred_grads {
    dst_tensor *t;
    int n, cap;
} deferred_grads;

static dstp_status defer_bucket(void *user, const dst_tensor *grads, int n, dstp_error *err) {
    deferred_grads *d = (deferred_grads *)user;
    if (d->n + n > d->cap) {
        const int cap = 2 * (d->n + n);
        dst_tensor *t = (dst_tensor *)realloc(d->t, (size_t)cap * sizeof *t);
        if (!t) {
            dstp_seterr(err, "--no-overlap: out of memory for %d gradient tensors", cap);
            return DSTP_ERR_NOMEM;
        }
        d->t = t;
        d->cap = cap;
    }
    memcpy(d->t + d->n, grads, (size_t)n * sizeof *grads);
    d->n += n;
    return DSTP_OK;
}

/* FNV-1a (64 bits) of the bytes of every weight of the model as the layers use them (--check-replicas). */
static dstp_status weights_checksum(dstp_model *m, dst_context *ctx, uint64_t *out, dstp_error *err) {
    const int n = dstp_model_tensors(m, NULL, 0);
    dstp_model_tensor *t = (dstp_model_tensor *)calloc((size_t)(n > 0 ? n : 1), sizeof *t);
    unsigned char *host = NULL;
    size_t cap = 0;
    uint64_t h = 14695981039346656037ull;
    dstp_status st = DSTP_OK;
    int i;
    if (!t) {
        dstp_seterr(err, "--check-replicas: out of memory");
        return DSTP_ERR_NOMEM;
    }
    dstp_model_tensors(m, t, n);
    for (i = 0; i < n && st == DSTP_OK; ++i) {
        size_t bytes = dst_dtype_size(t[i].param.dtype), j;
        int d;
        dst_status ls;
        for (d = 0; d < t[i].param.ndim; ++d) bytes *= (size_t)t[i].param.shape[d];
        if (bytes > cap) {
            unsigned char *p = (unsigned char *)realloc(host, bytes);
            if (!p) {
                dstp_seterr(err, "--check-replicas: out of memory for %zu bytes", bytes);
                st = DSTP_ERR_NOMEM;
                break;
            }
            host = p;
            cap = bytes;
        }
        ls = dst_memcpy(ctx, host, t[i].param.data, bytes, DST_COPY_CONTEXT_TO_HOST);
        if (ls != DST_OK) {
            dstp_seterr(err, "--check-replicas: dst_memcpy of %s: %s", t[i].name, dst_last_error());
            st = DSTP_ERR_STATE;
            break;
        }
        for (j = 0; j < bytes; ++j) h = (h ^ host[j]) * 1099511628211ull;
    }
    free(host);
    free(t);
    *out = h;
    return st;
}

/* The configuration one rank's engine runs: train_batch_size divided by the world size (the whole one was
 * checked against it). NULL with a message when the text is not plain JSON. */
static char *per_rank_config(const char *ds_text, int world) {
    json_error_t jerr;
    json_t *root, *tb;
    char *out;
    if (world == 1) return strdup(ds_text);
    root = json_loads(ds_text, 0, &jerr);
    if (!root) {
        fail_msg("DeepSpeed configuration: with WORLD_SIZE %d it must be plain JSON: line %d: %s", world, jerr.line,
                 jerr.text);
        return NULL;
    }
    tb = json_object_get(root, "train_batch_size");
    if (json_is_integer(tb)) json_object_set_new(root, "train_batch_size", json_integer(json_integer_value(tb) / world));
    out = json_dumps(root, JSON_COMPACT);
    json_decref(root);
    if (!out) fail_msg("out of memory");
    return out;
}

/* ---- options ----------------------------------------------------------------------------------------------- */
void dstp_train_options_default(dstp_train_options *o) {
    memset(o, 0, sizeof *o);
    o->seq = 0;      /* min(128, max_position_embeddings) */
    o->max_pred = 0; /* ⌈0.15·seq⌉: 20 at 128 */
    o->steps = -1;
    o->output = "dst-pretrain-out";
    o->eval_every = 100;
    o->eval_batches = 8;
    o->holdout_every = 20;
    o->backend = DST_BACKEND_AUTO;
    o->seed = 42;
    o->comm_timeout = 600.0;
    o->depth = 4;
}

static int read_text(const char *path, const char *what, char **text, int code) {
    dstp_error err;
    size_t len = 0;
    const dstp_status st = dstp_read_file(path, text, &len, &err);
    if (st != DSTP_OK) {
        fail_msg("%s: %s", what, err.msg);
        return code;
    }
    return 0;
}

/* A checkpoint's client state: what a resume needs, and the settings it must match. */
typedef struct resume_state {
    int64_t epoch, step, samples, data_position;
    int64_t seed, seq, max_pred, micro_batch, holdout_every, world;
    char data[16];
} resume_state;

static int get_i64(const json_t *o, const char *key, int64_t *out) {
    const json_t *v = json_object_get(o, key);
    if (!json_is_integer(v)) return 0;
    *out = (int64_t)json_integer_value(v);
    return 1;
}

static char *client_state_json(const resume_state *s, const dstp_model_config *c) {
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    if (!f) return NULL;
    fprintf(f, "{\"epoch\": %lld, \"step\": %lld, \"samples\": %lld, \"data_position\": %lld, \"seed\": %lld, "
               "\"seq\": %lld, \"max_pred\": %lld, \"micro_batch\": %lld, \"holdout_every\": %lld, \"world\": %lld, "
               "\"data\": \"%s\", \"model_config\": ",
            (long long)s->epoch, (long long)s->step, (long long)s->samples, (long long)s->data_position,
            (long long)s->seed, (long long)s->seq, (long long)s->max_pred, (long long)s->micro_batch,
            (long long)s->holdout_every, (long long)s->world, s->data);
    dstp_model_config_write(f, c, 0);
    fprintf(f, "}");
    fclose(f);
    return buf;
}

/* Reads a client state back; *cfg receives the stored model configuration when `cfg` is not NULL. */
static int parse_client_state(const char *text, resume_state *s, dstp_model_config *cfg) {
    json_error_t jerr;
    json_t *root = json_loads(text, JSON_REJECT_DUPLICATES, &jerr);
    dstp_error err;
    const json_t *d, *mc;
    int ok;
    if (!root) {
        fail_msg("the checkpoint's client state is not JSON: line %d, column %d: %s", jerr.line, jerr.column, jerr.text);
        return 0;
    }
    memset(s, 0, sizeof *s);
    d = json_object_get(root, "data");
    mc = json_object_get(root, "model_config");
    ok = get_i64(root, "epoch", &s->epoch) && get_i64(root, "step", &s->step) && get_i64(root, "samples", &s->samples) &&
         get_i64(root, "data_position", &s->data_position) && get_i64(root, "seed", &s->seed) &&
         get_i64(root, "seq", &s->seq) && get_i64(root, "max_pred", &s->max_pred) &&
         get_i64(root, "micro_batch", &s->micro_batch) && get_i64(root, "holdout_every", &s->holdout_every) &&
         json_is_string(d) && mc && s->data_position >= 0;
    if (ok) snprintf(s->data, sizeof s->data, "%s", json_string_value(d));
    if (ok && !get_i64(root, "world", &s->world)) s->world = 1;
    if (ok && cfg && dstp_model_config_from_json(mc, "the checkpoint's model_config", cfg, &err) != DSTP_OK) {
        fail_msg("%s", err.msg);
        ok = 0;
    } else if (!ok) {
        fail_msg("the checkpoint's client state lacks dst-pretrain's keys (epoch, step, samples, data_position, "
                 "seed, seq, max_pred, micro_batch, holdout_every, data, model_config): was it written by dst-pretrain?");
    }
    json_decref(root);
    return ok;
}

static int same_config(const dstp_model_config *a, const dstp_model_config *b) {
    char *x = NULL, *y = NULL;
    size_t nx = 0, ny = 0;
    int same;
    FILE *f = open_memstream(&x, &nx), *g = open_memstream(&y, &ny);
    if (f) dstp_model_config_write(f, a, 0), fclose(f);
    if (g) dstp_model_config_write(g, b, 0), fclose(g);
    same = x && y && strcmp(x, y) == 0;
    free(x);
    free(y);
    return same;
}

/* ---- metrics ------------------------------------------------------------------------------------------------ */

/* Keeps the lines of an earlier run up to `step` (a resume continues the history it had then). */
static int trim_metrics(const char *path, int64_t step) {
    char *text = NULL, *line, *save = NULL;
    size_t len = 0;
    dstp_error err;
    FILE *f;
    if (dstp_read_file(path, &text, &len, &err) != DSTP_OK) return 0; /* no earlier file */
    f = fopen(path, "wb");
    if (!f) {
        free(text);
        return -1;
    }
    for (line = strtok_r(text, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        json_error_t jerr;
        json_t *v = json_loads(line, 0, &jerr);
        int64_t s = 0;
        if (!v) continue;
        if (!get_i64(v, "step", &s) || s <= step) fprintf(f, "%s\n", line);
        json_decref(v);
    }
    free(text);
    return fclose(f) == 0 ? 0 : -1;
}

typedef struct acc {
    double mlm_loss_sum, nsp_loss_sum; /* Σ of per-micro-batch means */
    int64_t micro, mlm_n, mlm_hits, nsp_n, nsp_hits, sequences, tokens;
} acc;

static void acc_add(acc *a, const dstp_result *r) {
    a->mlm_loss_sum += r->mlm_loss;
    a->nsp_loss_sum += r->nsp_loss;
    a->micro += 1;
    a->mlm_n += r->mlm_n;
    a->mlm_hits += r->mlm_hits;
    a->nsp_n += r->nsp_n;
    a->nsp_hits += r->nsp_hits;
    a->sequences += r->sequences;
    a->tokens += r->tokens;
}

static double ratio(int64_t a, int64_t b) { return b > 0 ? (double)a / (double)b : 0.0; }

/* The held-out batches, copied out of a loader of the held-out part. */
typedef struct eval_set {
    dstp_batch *b;
    int32_t n;
} eval_set;

static void eval_free(eval_set *e) {
    int32_t i;
    for (i = 0; e->b && i < e->n; ++i) {
        free(e->b[i].ids);
        free(e->b[i].rows);
    }
    free(e->b);
    memset(e, 0, sizeof *e);
}

static dstp_status eval_build(const dstp_loader_config *base, int32_t count, eval_set *e, size_t *units, dstp_error *err) {
    dstp_loader_config c = *base;
    dstp_loader *l = NULL;
    dstp_status st;
    int32_t i;
    c.heldout = 1;
    c.start_batch = 0;
    c.depth = 1;
    memset(e, 0, sizeof *e);
    st = dstp_loader_create(&c, &l, err);
    if (st != DSTP_OK) return st;
    *units = dstp_loader_units(l);
    e->b = (dstp_batch *)calloc((size_t)count, sizeof *e->b);
    for (i = 0; e->b && i < count && st == DSTP_OK; ++i) {
        const dstp_batch *src;
        dstp_batch *d = &e->b[i];
        size_t tokens;
        st = dstp_loader_next(l, &src, err);
        if (st != DSTP_OK) break;
        *d = *src;
        tokens = (size_t)src->batch * (size_t)src->seq;
        d->ids = (int32_t *)malloc((2 * tokens + 2 * (size_t)src->batch) * sizeof(int32_t));
        d->rows = (int32_t *)malloc((2 * (size_t)src->nrows + 1) * sizeof(int32_t));
        if (!d->ids || !d->rows) {
            free(d->ids);
            free(d->rows);
            st = DSTP_ERR_NOMEM;
            break;
        }
        d->types = d->ids + tokens;
        d->lengths = d->types + tokens;
        d->nsp = d->lengths + src->batch;
        d->labels = d->rows + src->nrows;
        memcpy(d->ids, src->ids, tokens * sizeof(int32_t));
        memcpy(d->types, src->types, tokens * sizeof(int32_t));
        memcpy(d->lengths, src->lengths, (size_t)src->batch * sizeof(int32_t));
        memcpy(d->nsp, src->nsp, (size_t)src->batch * sizeof(int32_t));
        memcpy(d->rows, src->rows, (size_t)src->nrows * sizeof(int32_t));
        memcpy(d->labels, src->labels, (size_t)src->nrows * sizeof(int32_t));
        e->n = i + 1;
    }
    if (!e->b) st = DSTP_ERR_NOMEM;
    if (st == DSTP_ERR_NOMEM) dstp_seterr(err, "held-out set: out of memory");
    dstp_loader_destroy(l);
    if (st != DSTP_OK) eval_free(e);
    return st;
}

/* Mean losses and accuracies over the held-out set: token-weighted for the MLM, sequence-weighted for NSP. */
static dstp_status evaluate(dstp_model *m, const eval_set *e, acc *out, dstp_error *err) {
    int32_t i;
    memset(out, 0, sizeof *out);
    for (i = 0; i < e->n; ++i) {
        dstp_result r;
        const dstp_status st = dstp_model_evaluate(m, &e->b[i], &r, err);
        if (st != DSTP_OK) return st;
        out->mlm_loss_sum += r.mlm_loss * (double)r.mlm_n;
        out->nsp_loss_sum += r.nsp_loss * (double)r.nsp_n;
        out->micro += 1;
        out->mlm_n += r.mlm_n;
        out->mlm_hits += r.mlm_hits;
        out->nsp_n += r.nsp_n;
        out->nsp_hits += r.nsp_hits;
        out->sequences += r.sequences;
        out->tokens += r.tokens;
    }
    return DSTP_OK;
}

static int data_code(dstp_status st) { return st == DSTP_ERR_NOMEM || st == DSTP_ERR_STATE ? DSTP_EXIT_FAILURE : DSTP_EXIT_DATA; }

static const char *backend_name(dst_backend b) { return b == DST_BACKEND_CUDA ? "cuda" : "cpu"; }

/* A context on the requested backend (CUDA: device `device`, the node-local rank); DSTP_EXIT_BACKEND when
 * a GPU was asked for and none is usable. */
static int make_context(dst_backend backend, int threads, int device, dst_context **ctx) {
    int count = 0;
    dst_status st;
    if (backend == DST_BACKEND_CUDA && (dst_cuda_device_count(&count) != DST_OK || count == 0)) {
        fail_msg("--backend cuda: no usable CUDA device (this build %s the CUDA backend)",
                 dst_context_create(DST_BACKEND_CUDA, 0, ctx) == DST_ERR_UNSUPPORTED ? "lacks" : "has");
        return DSTP_EXIT_BACKEND;
    }
    if (backend != DST_BACKEND_CPU && dst_cuda_device_count(&count) == DST_OK && count > 0 && device >= count) {
        fail_msg("LOCAL_RANK %d: this node has %d CUDA devices", device, count);
        return DSTP_EXIT_BACKEND;
    }
    if (backend == DST_BACKEND_CPU || count == 0) device = 0;
    st = dst_context_create(backend, device, ctx);
    if (st != DST_OK) {
        fail_msg("dst_context_create: %s: %s", dst_status_string(st), dst_last_error());
        return st == DST_ERR_UNSUPPORTED ? DSTP_EXIT_BACKEND : DSTP_EXIT_FAILURE;
    }
    if (threads > 0 && dst_context_set_num_threads(*ctx, threads) != DST_OK) {
        fail_msg("--threads %d: %s", threads, dst_last_error());
        return DSTP_EXIT_USAGE;
    }
    return 0;
}

/* The run's length when --steps is not given: the schedule's total steps (WarmupDecayLR, WarmupCosineLR,
 * the BERT script's schedules), else 1000. */
static int64_t schedule_total(const char *ds_text) {
    json_error_t jerr;
    json_t *root = json_loads(ds_text, 0, &jerr);
    int64_t total = 1000, v = 0;
    if (!root) return total; /* e.g. comments, which the engine's parser accepts */
    {
        const json_t *params = json_object_get(json_object_get(root, "scheduler"), "params");
        if (get_i64(params, "total_num_steps", &v) || get_i64(params, "total_training_steps", &v))
            if (v > 0) total = v;
    }
    json_decref(root);
    return total;
}

int dstp_train(const dstp_train_options *o) {
    int rc = DSTP_EXIT_FAILURE, vocab_size;
    char *ds_text = NULL, reason[1024], path[8192], ckdir[4096], client[65536], *cs = NULL, tbuf[3][32];
    dstp_model_config cfg;
    dstp_model_options mo;
    dstp_error err;
    dstp_vocab *vocab = NULL;
    dst_context *ctx = NULL;
    dst_engine *engine = NULL;
    dstp_model *model = NULL;
    dstp_loader *loader = NULL;
    dstp_loader_config lc;
    eval_set ev;
    dst_engine_state es;
    dst_backend backend = DST_BACKEND_CPU;
    resume_state rs;
    dstp_launch launch;
    dstp_comm *comm = NULL;
    dstp_grad_hook hook;
    deferred_grads deferred = {NULL, 0, 0};
    char *rank_ds = NULL;
    int talk = 0, lead = 0, world = 1, k, pending_skip = 0;
    FILE *metrics = NULL;
    acc step_acc, print_acc, last_eval;
    int64_t step = 0, start_step = 0, data_position = 0, print_every, samples = 0, first_step_seen = -1, steps = 0;
    int32_t seq = 0, max_pred = 0;
    double t_start, t_print, t_wait = 0.0, last_step_loss = 0.0, first_loss = 0.0, last_loss = 0.0;
    double first_acc = 0.0, last_acc = 0.0;
    int64_t last_from = 0;
    float lr = 0.0f, grad_scale = 1.0f;
    int have_eval = 0, stopped_early = 0, interrupted = 0, boundary = 0, saved_at_end = 0, evaluated_at = -1;
    size_t train_units = 0, eval_units = 0;
    dstp_profile prof, *pp = NULL;
    double prof_total[DSTP_PHASE_COUNT];
    int64_t prof_steps = 0, prof_micro = 0;
    int first_micro = 1; /* the next micro-batch is the first of a step (a run and a resume start at a boundary) */
    const char *data_kind = o->num_shards ? "hdf5" : "text";
    const char *export_dir = NULL;

    memset(&ev, 0, sizeof ev);
    memset(&step_acc, 0, sizeof step_acc);
    memset(&print_acc, 0, sizeof print_acc);
    memset(&last_eval, 0, sizeof last_eval);
    memset(&rs, 0, sizeof rs);
    memset(prof_total, 0, sizeof prof_total);
    es.struct_size = sizeof es;

    /* 1. The launch: this process's rank among how many (comm.h). */
    if (dstp_launch_read(&launch, &err) != DSTP_OK) {
        fail_msg("%s", err.msg);
        return DSTP_EXIT_USAGE;
    }
    world = launch.world;
    lead = launch.rank == 0;
    talk = lead && !o->quiet;

    /* 2. Configurations: the model's (config.json) and the engine's (DeepSpeed JSON). */
    if (dstp_model_config_load(o->model_config, &cfg, &err) != DSTP_OK) {
        fail_msg("model configuration: %s", err.msg);
        rc = DSTP_EXIT_CONFIG;
        goto done;
    }
    if ((rc = read_text(o->ds_config, "DeepSpeed configuration", &ds_text, DSTP_EXIT_CONFIG)) != 0) goto done;
    rc = DSTP_EXIT_FAILURE;
    if (dst_engine_config_validate(ds_text, world, reason, sizeof reason) != DST_OK) {
        fail_msg("DeepSpeed configuration %s: %s", o->ds_config, reason);
        rc = DSTP_EXIT_CONFIG;
        goto done;
    }
    steps = o->steps >= 0 ? o->steps : schedule_total(ds_text);
    if (dstp_vocab_load(o->vocab, &vocab, &err) != DSTP_OK) {
        fail_msg("%s", err.msg);
        rc = DSTP_EXIT_DATA;
        goto done;
    }
    vocab_size = dstp_vocab_size(vocab);
    if (cfg.vocab_size == 0) {
        cfg.vocab_size = (vocab_size + 7) / 8 * 8; /* bing_bert pads the vocabulary to a multiple of 8 */
    } else if (cfg.vocab_size < vocab_size) {
        fail_msg("model configuration %s: key \"vocab_size\" is %d, smaller than the vocabulary %s (%d tokens)",
                 o->model_config, (int)cfg.vocab_size, o->vocab, vocab_size);
        rc = DSTP_EXIT_CONFIG;
        goto done;
    }
    seq = o->seq > 0 ? o->seq : cfg.max_position_embeddings < 128 ? cfg.max_position_embeddings : 128;
    max_pred = o->max_pred > 0 ? o->max_pred : (int32_t)ceil(0.15 * (double)seq);
    if (seq > cfg.max_position_embeddings && !o->num_shards) {
        fail_msg("--seq %d exceeds the model's \"max_position_embeddings\" (%d)", (int)seq,
                 (int)cfg.max_position_embeddings);
        rc = DSTP_EXIT_CONFIG;
        goto done;
    }
    if (o->init_from && cfg.pre_layer_norm) {
        fail_msg("--init-from %s: Hugging Face BERT weights are Post-LN, the model configuration is Pre-LN", o->init_from);
        rc = DSTP_EXIT_CONFIG;
        goto done;
    }
    if (o->export_hf && cfg.pre_layer_norm) {
        fail_msg("--export-hf: a Hugging Face BertForMaskedLM is Post-LN, the model configuration is Pre-LN "
                 "(\"pre_layer_norm\": true); its checkpoints hold it");
        rc = DSTP_EXIT_CONFIG;
        goto done;
    }

    /* 3. Data: the training stream (a loader thread) and the held-out batches. */
    memset(&lc, 0, sizeof lc);
    lc.corpus = o->corpus;
    lc.shards = o->num_shards ? o->shards : NULL;
    lc.num_shards = o->num_shards;
    lc.vocab = o->vocab;
    lc.lower_case = !o->cased;
    lc.seq = seq;
    lc.max_pred = max_pred;
    lc.seed = o->seed;
    lc.depth = o->depth;
    lc.holdout_every = o->eval_every > 0 && o->eval_batches > 0 ? o->holdout_every : 0;

    /* 4. Backend, engine, model. */
    if ((rc = make_context(o->backend, o->threads, launch.local_rank, &ctx)) != 0) goto done;
    rc = DSTP_EXIT_FAILURE;
    LIBCALL(dst_context_get_backend(ctx, &backend), DSTP_EXIT_FAILURE);
    LIBCALL(dst_context_set_rng_state(ctx, o->seed, 0), DSTP_EXIT_FAILURE);
    /* The batches' ids, rows and labels are made and checked on the host (pretrain_data.c), so the model
     * ops check them again on the device without making the host wait (a failure ends the run at the
     * next library call, with the library's message). */
    LIBCALL(dst_context_set_index_checks(ctx, o->eager_checks ? DST_INDEX_CHECKS_EAGER : DST_INDEX_CHECKS_DEFERRED),
            DSTP_EXIT_FAILURE);
    {
        const dstp_status st = dstp_comm_create(ctx, &launch, o->comm, &comm, &err);
        if (st != DSTP_OK) {
            fail_msg("%s", err.msg);
            rc = st == DSTP_ERR_UNSUPPORTED ? DSTP_EXIT_BACKEND : DSTP_EXIT_FAILURE;
            goto done;
        }
    }
    hook.ready = o->no_overlap ? defer_bucket : reduce_bucket;
    hook.user = o->no_overlap ? (void *)&deferred : (void *)comm;
    if (!(rank_ds = per_rank_config(ds_text, world))) goto done;
    LIBCALL(dst_engine_create(ctx, rank_ds, 1, &engine), DSTP_EXIT_CONFIG);
    /* The first micro-batch of each step writes every gradient (dstp_model_train), so the engine need not
     * zero them at its boundaries. */
    LIBCALL(dst_engine_set_zero_grads_on_step(engine, o->zero_grads ? 1 : 0), DSTP_EXIT_FAILURE);
    LIBCALL(dst_engine_get_state(engine, &es), DSTP_EXIT_FAILURE);
    print_every = o->print_every > 0 ? o->print_every : es.steps_per_print > 0 ? es.steps_per_print : 10;

    /* 5. Resume: the client state first (the data settings it needs must match this run's). */
    snprintf(ckdir, sizeof ckdir, "%s/checkpoints", o->output);
    if (o->resume) {
        dst_checkpoint_options peek;
        char tag[256];
        dstp_model_config stored;
        LIBCALL(dst_checkpoint_latest_tag(ckdir, tag, sizeof tag, NULL), DSTP_EXIT_FAILURE);
        snprintf(path, sizeof path, "%s/%s/mp_rank_00_model_states.safetensors", ckdir, tag);
        LIBCALL(dst_checkpoint_options_default(&peek), DSTP_EXIT_FAILURE);
        peek.restore_rng = 0;
        LIBCALL(dst_checkpoint_load_model(ctx, NULL, 0, NULL, 0, NULL, path, &peek, client, sizeof client, NULL),
                DSTP_EXIT_FAILURE);
        if (!parse_client_state(client, &rs, &stored)) goto done;
        if (rs.world != world) {
            fail_msg("--resume: %s/%s was written by %lld processes, this run has %d: a resume continues the same run "
                     "(the ranks' shares of the batch stream depend on the world size)",
                     ckdir, tag, (long long)rs.world, world);
            rc = DSTP_EXIT_CONFIG;
            goto done;
        }
        if (rs.seed != (int64_t)o->seed || rs.micro_batch != es.train_micro_batch_size_per_gpu ||
            strcmp(rs.data, data_kind) != 0 || rs.holdout_every != lc.holdout_every ||
            (!o->num_shards && (rs.seq != seq || rs.max_pred != max_pred))) {
            fail_msg("--resume: %s/%s was written with seed %lld, micro-batch %lld, %s data, seq %lld, max-pred %lld, "
                     "holdout-every %lld; this run has seed %llu, micro-batch %d, %s data, seq %d, max-pred %d, "
                     "holdout-every %d: a resume continues the same run",
                     ckdir, tag, (long long)rs.seed, (long long)rs.micro_batch, rs.data, (long long)rs.seq,
                     (long long)rs.max_pred, (long long)rs.holdout_every, (unsigned long long)o->seed,
                     (int)es.train_micro_batch_size_per_gpu, data_kind, (int)seq, (int)max_pred,
                     (int)lc.holdout_every);
            rc = DSTP_EXIT_CONFIG;
            goto done;
        }
        if (cfg.vocab_size != stored.vocab_size || !same_config(&cfg, &stored)) {
            fail_msg("--resume: the model configuration %s differs from the one %s/%s was trained with", o->model_config,
                     ckdir, tag);
            rc = DSTP_EXIT_CONFIG;
            goto done;
        }
    }
    lc.batch = es.train_micro_batch_size_per_gpu;
    lc.start_batch = (uint64_t)rs.data_position;
    if (dstp_loader_create(&lc, &loader, &err) != DSTP_OK) {
        fail_msg("%s", err.msg);
        rc = DSTP_EXIT_DATA;
        goto done;
    }
    train_units = dstp_loader_units(loader);
    if (lc.holdout_every) {
        const dstp_status st = eval_build(&lc, o->eval_batches, &ev, &eval_units, &err);
        if (st != DSTP_OK) {
            fail_msg("held-out data: %s", err.msg);
            rc = data_code(st);
            goto done;
        }
    }
    mo.dtype = es.fp16_enabled ? DST_DTYPE_FP16 : es.bf16_enabled ? DST_DTYPE_BF16 : DST_DTYPE_FP32;
    mo.max_batch = es.train_micro_batch_size_per_gpu;
    mo.seq = o->num_shards ? 0 : seq;
    mo.max_pred = max_pred;
    mo.seed = o->seed;
    mo.layers = (dstp_layers)o->layers;
    if (o->num_shards) { /* the shards fix the shape: take it from the first batch */
        const dstp_batch *b0 = NULL;
        dstp_loader_config c0 = lc;
        dstp_loader *l0 = NULL;
        c0.start_batch = 0;
        c0.depth = 1;
        if (dstp_loader_create(&c0, &l0, &err) != DSTP_OK || dstp_loader_next(l0, &b0, &err) != DSTP_OK) {
            fail_msg("%s", err.msg);
            dstp_loader_destroy(l0);
            rc = DSTP_EXIT_DATA;
            goto done;
        }
        mo.seq = b0->seq;
        mo.max_pred = b0->max_pred;
        dstp_loader_destroy(l0);
        if (mo.seq > cfg.max_position_embeddings) {
            fail_msg("the shards hold sequences of %d, more than the model's \"max_position_embeddings\" (%d)",
                     (int)mo.seq, (int)cfg.max_position_embeddings);
            rc = DSTP_EXIT_CONFIG;
            goto done;
        }
        if (o->resume && (rs.seq != mo.seq || rs.max_pred != mo.max_pred)) {
            fail_msg("--resume: the checkpoint was written for sequences of %lld with %lld predictions, the shards "
                     "hold %d and %d", (long long)rs.seq, (long long)rs.max_pred, (int)mo.seq, (int)mo.max_pred);
            rc = DSTP_EXIT_CONFIG;
            goto done;
        }
    }
    {
        const dstp_status st = dstp_model_create(ctx, &cfg, &mo, &model, &err);
        if (st != DSTP_OK) {
            fail_msg("%s", err.msg);
            rc = st == DSTP_ERR_ARG ? DSTP_EXIT_CONFIG : DSTP_EXIT_FAILURE;
            goto done;
        }
    }
    if (o->init_from && !o->resume) {
        int found = 0, total = 0;
        const dstp_status st = dstp_model_import_hf(model, o->init_from, &found, &total, &err);
        if (st != DSTP_OK) {
            fail_msg("--init-from %s", err.msg);
            rc = st == DSTP_ERR_ARG ? DSTP_EXIT_CONFIG : DSTP_EXIT_FAILURE;
            goto done;
        }
        if (talk)
            printf("init: weights from %s (the encoder, and %d of %d head tensors; the rest keep their initialisation)\n",
                   o->init_from, found, total);
    }
    if (dstp_model_register(model, engine, &err) != DSTP_OK) {
        fail_msg("%s", err.msg);
        goto done;
    }
    if (o->resume) {
        LIBCALL(dst_engine_load_checkpoint(engine, ckdir, NULL, NULL, NULL, 0, NULL), DSTP_EXIT_FAILURE);
        LIBCALL(dst_engine_get_state(engine, &es), DSTP_EXIT_FAILURE);
        data_position = rs.data_position;
        samples = es.global_samples * world;
    }
    start_step = step = es.global_steps;

    /* 6. Output (rank 0): the folder, the metrics file (a resume keeps the history up to its step). */
    if (lead && mkdirs(o->output) != 0) {
        fail_msg("%s: cannot create the output folder: %s", o->output, strerror(errno));
        goto done;
    }
    snprintf(path, sizeof path, "%s/metrics.jsonl", o->output);
    if (lead && o->resume && trim_metrics(path, step) != 0) {
        fail_msg("%s: cannot rewrite: %s", path, strerror(errno));
        goto done;
    }
    if (lead && !(metrics = fopen(path, o->resume ? "ab" : "wb"))) {
        fail_msg("%s: cannot write: %s", path, strerror(errno));
        goto done;
    }
    export_dir = o->no_export || cfg.pre_layer_norm ? NULL : o->export_hf;
    if (!o->no_export && !cfg.pre_layer_norm && !export_dir) {
        static char hf_default[4096];
        snprintf(hf_default, sizeof hf_default, "%s/hf", o->output);
        export_dir = hf_default;
    }
    if (talk) {
        int threads = 0;
        dst_context_get_num_threads(ctx, &threads);
        printf("dst-pretrain: libdstransformer %s, backend %s", dst_version_string(), backend_name(backend));
        if (backend == DST_BACKEND_CPU) printf(" (%d threads)", threads);
        printf("\nmodel: BERT, %d layers, hidden %d, %d heads, intermediate %d, vocab %d, %s, %s, %s: %.2fM parameters\n",
               (int)cfg.num_hidden_layers, (int)cfg.hidden_size, (int)cfg.num_attention_heads,
               (int)cfg.intermediate_size, (int)cfg.vocab_size, cfg.pre_layer_norm ? "Pre-LN" : "Post-LN",
               cfg.next_sentence_prediction ? "MLM + NSP" : "MLM", dst_dtype_string(mo.dtype),
               (double)dstp_model_num_parameters(model) / 1e6);
        printf("data: %s%s, %zu %s for training, %zu held out (%d batches), seq %d, up to %d masked, loader %d ahead\n",
               o->num_shards ? o->shards[0] : o->corpus, o->num_shards > 1 ? " ..." : "", train_units,
               o->num_shards ? "samples" : "documents", eval_units, (int)ev.n, (int)mo.seq, (int)mo.max_pred,
               (int)o->depth);
        printf("engine: %s, micro-batch %d x %d accumulation = %d sequences per step, %s\n",
               es.optimizer == DST_OPTIMIZER_LAMB ? "LAMB" : es.optimizer == DST_OPTIMIZER_ADAMW ? "AdamW" : "Adam",
               (int)es.train_micro_batch_size_per_gpu, (int)es.gradient_accumulation_steps, (int)es.train_batch_size,
               es.fp16_enabled ? (es.dynamic_loss_scale ? "fp16, dynamic loss scaling" : "fp16, static loss scale")
                               : es.bf16_enabled ? "bf16" : "fp32");
        if (world > 1 || dstp_comm_world(comm) > 1 || strcmp(dstp_comm_name(comm), "none") != 0)
            printf("data parallel: %d process%s (%s launch), gradients averaged by %s in buckets on a second stream\n",
                   world, world > 1 ? "es" : "", launch.method, dstp_comm_name(comm));
        printf("run: steps %lld -> %lld%s, output %s/ (metrics.jsonl, metrics.svg%s%s)\n", (long long)step,
               (long long)steps, o->resume ? " (resumed)" : "", o->output, o->no_checkpoint ? "" : ", checkpoints/",
               export_dir ? ", hf/" : "");
        fflush(stdout);
    }
    if (metrics && !o->resume) {
        fprintf(metrics, "{\"type\": \"run\", \"step\": 0, \"layers\": %d, \"hidden\": %d, \"vocab\": %d, \"backend\": \"%s\", "
                         "\"dtype\": \"%s\", \"micro_batch\": %d, \"accumulation\": %d, \"seq\": %d, \"world\": %d, "
                         "\"comm\": \"%s\"}\n",
                (int)cfg.num_hidden_layers, (int)cfg.hidden_size, (int)cfg.vocab_size, backend_name(backend),
                dst_dtype_string(mo.dtype), (int)es.train_micro_batch_size_per_gpu, (int)es.gradient_accumulation_steps,
                (int)mo.seq, world, dstp_comm_name(comm));
        fflush(metrics);
    }

    /* 7. The loop, one iteration per micro-batch; the watchdog from here on (the setup above may be long). */
    install_signals();
    if (dstp_comm_watch(comm, o->comm_timeout, DSTP_EXIT_COMM, &err) != DSTP_OK) {
        fail_msg("%s", err.msg);
        goto done;
    }
    if (o->profile) {
        if (dstp_profile_start(&prof, ctx, &err) != DSTP_OK) {
            fail_msg("%s", err.msg);
            goto done;
        }
        pp = &prof;
        prof.per_call = o->profile_calls;
        dstp_model_set_profile(model, pp);
    }
    t_start = t_print = dstp_mono_s();
    grad_scale = es.loss_scale / (float)es.gradient_accumulation_steps;
    while (step < steps) {
        const dstp_batch *b = NULL;
        dstp_result r;
        double t0;
        dstp_status st = dstp_profile_lap(pp, DSTP_PHASE_OTHER, &err); /* the previous iteration's tail */
        t0 = dstp_mono_s();
        /* This rank's batch of the stream: the rest of the previous round, then `rank` others, then its own. */
        for (k = 0; k <= pending_skip + launch.rank && st == DSTP_OK; ++k) st = dstp_loader_next(loader, &b, &err);
        pending_skip = world - 1 - launch.rank;
        t_wait += dstp_mono_s() - t0;
        if (st == DSTP_OK) st = dstp_profile_lap(pp, DSTP_PHASE_DATA, &err);
        if (st != DSTP_OK) {
            fail_msg("data: %s", err.msg);
            rc = data_code(st);
            goto done;
        }
        LIBCALL(dst_engine_is_boundary(engine, &boundary), DSTP_EXIT_FAILURE);
        if (boundary) LIBCALL(dst_engine_get_lr(engine, 0, &lr), DSTP_EXIT_FAILURE);
        dstp_comm_heartbeat(comm);
        st = dstp_model_train(model, b, grad_scale, first_micro && !o->zero_grads, boundary ? &hook : NULL, &r, &err);
        first_micro = boundary;
        if (st == DSTP_OK && boundary && o->no_overlap) { /* every bucket at once, after the backward */
            st = dstp_comm_reduce(comm, deferred.t, deferred.n, &err);
            deferred.n = 0;
        }
        if (st == DSTP_OK && boundary) st = dstp_comm_wait(comm, &err); /* the step after every all-reduce */
        if (st == DSTP_OK && boundary) st = dstp_profile_lap(pp, DSTP_PHASE_COMM, &err);
        if (st != DSTP_OK) {
            fail_msg("%s", err.msg);
            goto done;
        }
        acc_add(&step_acc, &r);
        data_position += world;
        rs.epoch = (int64_t)b->epoch;
        LIBCALL(dst_engine_step(engine), DSTP_EXIT_FAILURE);
        if (dstp_profile_lap(pp, DSTP_PHASE_OPTIMIZER, &err) != DSTP_OK) {
            fail_msg("%s", err.msg);
            goto done;
        }
        ++prof_micro;
        if (!boundary) continue;

        /* A step boundary. */
        LIBCALL(dst_engine_get_state(engine, &es), DSTP_EXIT_FAILURE);
        step = es.global_steps;
        samples = es.global_samples * world;
        grad_scale = es.loss_scale / (float)es.gradient_accumulation_steps;
        if (world > 1) { /* the step's loss and accuracy over the global batch: every rank's micro-batches */
            double v[6];
            v[0] = step_acc.mlm_loss_sum / (double)step_acc.micro;
            v[1] = step_acc.nsp_loss_sum / (double)step_acc.micro;
            v[2] = (double)step_acc.mlm_n;
            v[3] = (double)step_acc.mlm_hits;
            v[4] = (double)step_acc.nsp_n;
            v[5] = (double)step_acc.nsp_hits;
            if (dstp_comm_average(comm, v, 6, &err) != DSTP_OK) {
                fail_msg("%s", err.msg);
                goto done;
            }
            step_acc.mlm_loss_sum = v[0] * (double)step_acc.micro;
            step_acc.nsp_loss_sum = v[1] * (double)step_acc.micro;
            step_acc.mlm_n = llround(v[2] * world);
            step_acc.mlm_hits = llround(v[3] * world);
            step_acc.nsp_n = llround(v[4] * world);
            step_acc.nsp_hits = llround(v[5] * world);
        }
        if (o->check_replicas) {
            uint64_t sum = 0;
            int same = 1;
            if (weights_checksum(model, ctx, &sum, &err) != DSTP_OK || dstp_comm_same(comm, sum, &same, &err) != DSTP_OK) {
                fail_msg("%s", err.msg);
                goto done;
            }
            if (metrics) {
                fprintf(metrics, "{\"type\": \"replicas\", \"step\": %lld, \"ranks\": %d, \"checksum\": \"%016llx\", "
                        "\"same\": %s}\n", (long long)step, world, (unsigned long long)sum, same ? "true" : "false");
                fflush(metrics);
            }
            if (!same) {
                fail_msg("--check-replicas: after step %lld the weights differ between the ranks (rank %d: %016llx)",
                         (long long)step, launch.rank, (unsigned long long)sum);
                goto done;
            }
        }
        {
            const double mlm = step_acc.mlm_loss_sum / (double)step_acc.micro, nsp = step_acc.nsp_loss_sum / (double)step_acc.micro;
            last_step_loss = mlm + nsp;
            if (metrics) fprintf(metrics,
                    "{\"type\": \"train\", \"step\": %lld, \"epoch\": %lld, \"samples\": %lld, \"loss\": %.17g, "
                    "\"mlm_loss\": %.17g, \"mlm_acc\": %.6f, \"nsp_loss\": %.17g, \"nsp_acc\": %.6f, \"lr\": %.9g, "
                    "\"loss_scale\": %g, \"skipped\": %s, \"tokens\": %lld, \"elapsed_s\": %.6f}\n",
                    (long long)step, (long long)rs.epoch, (long long)samples, last_step_loss, mlm,
                    ratio(step_acc.mlm_hits, step_acc.mlm_n), nsp, ratio(step_acc.nsp_hits, step_acc.nsp_n), (double)lr,
                    (double)es.loss_scale, es.last_step_applied ? "false" : "true", (long long)step_acc.tokens,
                    dstp_mono_s() - t_start);
            if (metrics) fflush(metrics);
            if (first_step_seen < 0) first_step_seen = step, first_loss = mlm, first_acc = ratio(step_acc.mlm_hits, step_acc.mlm_n);
        }
        if (pp) { /* this step's time split; its "other" is the previous step's tail */
            int ph;
            if (metrics) {
                fprintf(metrics, "{\"type\": \"profile\", \"step\": %lld, \"micro_batches\": %lld", (long long)step,
                        (long long)prof_micro);
                for (ph = 0; ph < DSTP_PHASE_COUNT; ++ph)
                    fprintf(metrics, ", \"%s_s\": %.6f", dstp_phase_name((dstp_phase)ph), prof.seconds[ph]);
                fprintf(metrics, "}\n");
                fflush(metrics);
            }
            for (ph = 0; ph < DSTP_PHASE_COUNT; ++ph) prof_total[ph] += prof.seconds[ph], prof.seconds[ph] = 0.0;
            ++prof_steps;
            prof_micro = 0;
            /* the call table counts from the second step on: the first one's one-time costs (GEMM algorithm
               choices, allocations) would dominate a short run's */
            if (prof.per_call && prof_steps == 1) dstp_profile_reset_calls(&prof);
        }
        print_acc.mlm_loss_sum += step_acc.mlm_loss_sum / (double)step_acc.micro;
        print_acc.nsp_loss_sum += step_acc.nsp_loss_sum / (double)step_acc.micro;
        print_acc.micro += 1;
        print_acc.mlm_n += step_acc.mlm_n;
        print_acc.mlm_hits += step_acc.mlm_hits;
        print_acc.nsp_n += step_acc.nsp_n;
        print_acc.nsp_hits += step_acc.nsp_hits;
        print_acc.sequences += step_acc.sequences;
        print_acc.tokens += step_acc.tokens;
        memset(&step_acc, 0, sizeof step_acc);
        if (step % print_every == 0 || step == steps) {
            const double t = dstp_mono_s(), dt = t - t_print, per_step = (t - t_start) / (double)(step - start_step);
            /* the end's summary quotes the last interval: one step's loss is noisy */
            last_loss = print_acc.mlm_loss_sum / (double)print_acc.micro;
            last_acc = ratio(print_acc.mlm_hits, print_acc.mlm_n);
            last_from = step - print_acc.micro + 1;
            if (talk) {
                printf("step %6lld/%lld | loss %.4f | mlm %.4f acc %5.1f%%", (long long)step, (long long)steps,
                       (print_acc.mlm_loss_sum + print_acc.nsp_loss_sum) / (double)print_acc.micro,
                       print_acc.mlm_loss_sum / (double)print_acc.micro, 100.0 * ratio(print_acc.mlm_hits, print_acc.mlm_n));
                if (cfg.next_sentence_prediction)
                    printf(" | nsp %.4f acc %3.0f%%", print_acc.nsp_loss_sum / (double)print_acc.micro,
                           100.0 * ratio(print_acc.nsp_hits, print_acc.nsp_n));
                printf(" | lr %.2e | scale %g | %.1f samples/s | %.0f tokens/s | eta %s\n", (double)lr,
                       (double)es.loss_scale, (double)(print_acc.sequences * world) / dt, (double)(print_acc.tokens * world) / dt,
                       duration(per_step * (double)(steps - step), tbuf[0], sizeof tbuf[0]));
                fflush(stdout);
            }
            memset(&print_acc, 0, sizeof print_acc);
            t_print = t;
        }
        if (lead && ev.n && o->eval_every > 0 && (step % o->eval_every == 0 || step == steps)) {
            const double te = dstp_mono_s();
            const dstp_status st2 = evaluate(model, &ev, &last_eval, &err);
            t_print += dstp_mono_s() - te; /* the throughput of the next progress line is the training's */
            if (st2 != DSTP_OK) {
                fail_msg("evaluation: %s", err.msg);
                goto done;
            }
            have_eval = 1;
            evaluated_at = (int)step;
            if (metrics) fprintf(metrics,
                    "{\"type\": \"eval\", \"step\": %lld, \"mlm_loss\": %.17g, \"mlm_acc\": %.6f, \"nsp_loss\": %.17g, "
                    "\"nsp_acc\": %.6f, \"masked_tokens\": %lld, \"sequences\": %lld}\n",
                    (long long)step, last_eval.mlm_loss_sum / (double)(last_eval.mlm_n ? last_eval.mlm_n : 1),
                    ratio(last_eval.mlm_hits, last_eval.mlm_n),
                    last_eval.nsp_loss_sum / (double)(last_eval.nsp_n ? last_eval.nsp_n : 1),
                    ratio(last_eval.nsp_hits, last_eval.nsp_n), (long long)last_eval.mlm_n, (long long)last_eval.sequences);
            if (metrics) fflush(metrics);
            if (talk) {
                printf("eval @ %-6lld | held-out mlm loss %.4f acc %5.1f%%", (long long)step,
                       last_eval.mlm_loss_sum / (double)(last_eval.mlm_n ? last_eval.mlm_n : 1),
                       100.0 * ratio(last_eval.mlm_hits, last_eval.mlm_n));
                if (cfg.next_sentence_prediction)
                    printf(" | nsp loss %.4f acc %3.0f%%", last_eval.nsp_loss_sum / (double)(last_eval.nsp_n ? last_eval.nsp_n : 1),
                           100.0 * ratio(last_eval.nsp_hits, last_eval.nsp_n));
                printf(" | %d batches, %lld masked tokens\n", (int)ev.n, (long long)last_eval.mlm_n);
                fflush(stdout);
            }
        }
        {   /* every rank stops at the same step: the flags of all of them */
            int flags = (g_stop != 0) | (o->max_time > 0 && dstp_mono_s() - t_start >= o->max_time && step < steps) << 1;
            if (dstp_comm_agree(comm, &flags, &err) != DSTP_OK) {
                fail_msg("%s", err.msg);
                goto done;
            }
            interrupted = (flags & 1) != 0;
            stopped_early = !interrupted && (flags & 2) != 0;
        }
        if (!o->no_checkpoint &&
            (interrupted || stopped_early || step == steps || (o->save_every > 0 && step % o->save_every == 0))) {
            rs.step = step;
            rs.samples = samples;
            rs.data_position = data_position;
            rs.seed = (int64_t)o->seed;
            rs.seq = mo.seq;
            rs.max_pred = mo.max_pred;
            rs.micro_batch = es.train_micro_batch_size_per_gpu;
            rs.holdout_every = lc.holdout_every;
            rs.world = world;
            snprintf(rs.data, sizeof rs.data, "%s", data_kind);
            free(cs);
            cs = client_state_json(&rs, &cfg);
            if (!cs) {
                fail_msg("out of memory");
                goto done;
            }
            if (lead) LIBCALL(dst_engine_save_checkpoint(engine, ckdir, NULL, cs, 1), DSTP_EXIT_FAILURE);
            saved_at_end = step == steps || interrupted || stopped_early;
            if (talk && !saved_at_end) printf("checkpoint: %s/global_step%lld\n", ckdir, (long long)step);
        }
        if (interrupted || stopped_early) break;
    }

    /* 8. The end: summary, the Hugging Face export, the plot. */
    {
        const double total = dstp_mono_s() - t_start;
        const int64_t done_steps = step - start_step;
        if (talk) {
            const char *saved_note = o->no_checkpoint ? "no checkpoint (--no-checkpoint)" : "checkpoint saved";
            if (interrupted)
                printf("interrupted (%s) at step %lld: %s\n", g_stop == SIGTERM ? "SIGTERM" : "SIGINT",
                       (long long)step, saved_note);
            else if (stopped_early)
                printf("time limit of %s reached at step %lld: %s\n",
                       duration(o->max_time, tbuf[0], sizeof tbuf[0]), (long long)step, saved_note);
            if (done_steps > 0) {
                char span[64];
                if (last_from == step) snprintf(span, sizeof span, "step %lld", (long long)step);
                else snprintf(span, sizeof span, "steps %lld-%lld", (long long)last_from, (long long)step);
                printf("done: %lld steps in %s (%.2f steps/s); mlm loss %.4f, accuracy %.1f%% (step %lld) -> "
                       "%.4f, %.1f%% (%s)",
                       (long long)done_steps, duration(total, tbuf[1], sizeof tbuf[1]), (double)done_steps / total,
                       first_loss, 100.0 * first_acc, (long long)first_step_seen, last_loss, 100.0 * last_acc, span);
                if (have_eval)
                    printf("; held-out %.4f, accuracy %.1f%% (step %d)",
                           last_eval.mlm_loss_sum / (double)(last_eval.mlm_n ? last_eval.mlm_n : 1),
                           100.0 * ratio(last_eval.mlm_hits, last_eval.mlm_n), evaluated_at);
                printf("\nloader: waited %.2f s of %s for batches (the next batch was ready %.1f%% of the time)\n", t_wait,
                       duration(total, tbuf[2], sizeof tbuf[2]), total > 0 ? 100.0 * (1.0 - t_wait / total) : 100.0);
            }
            if (pp && prof_steps > 0) {
                double sum = 0.0;
                int ph;
                for (ph = 0; ph < DSTP_PHASE_COUNT; ++ph) sum += prof_total[ph];
                printf("profile: %lld steps, ms per step:", (long long)prof_steps);
                for (ph = 0; ph < DSTP_PHASE_COUNT; ++ph)
                    printf("%s %s %.2f (%.1f%%)", ph ? "," : "", dstp_phase_name((dstp_phase)ph),
                           1e3 * prof_total[ph] / (double)prof_steps, sum > 0 ? 100.0 * prof_total[ph] / sum : 0.0);
                printf("\n");
                if (prof.per_call) dstp_profile_print_calls(&prof, prof_steps - 1, 16, stdout);
            }
            if (saved_at_end) printf("checkpoint: %s/global_step%lld (latest)\n", ckdir, (long long)step);
        }
    }
    if (metrics) fclose(metrics);
    metrics = NULL;
    if (!lead) export_dir = NULL;
    if (export_dir && !interrupted) {
        const dstp_status st = dstp_model_export_hf(model, export_dir, o->vocab, &err);
        if (st != DSTP_OK) {
            fail_msg("export: %s", err.msg);
            goto done;
        }
        if (talk) printf("hugging face: %s/ (BertForMaskedLM: model.safetensors, config.json, vocab.txt)\n", export_dir);
    }
    if (lead) {
        char svg[4096], perr[512];
        snprintf(path, sizeof path, "%s/metrics.jsonl", o->output);
        snprintf(svg, sizeof svg, "%s/metrics.svg", o->output);
        if (dstp_plot(path, svg, perr, sizeof perr) != 0) {
            fail_msg("plot: %s", perr);
            goto done;
        }
        if (talk) printf("metrics: %s, plot: %s\n", path, svg);
    }
    rc = interrupted ? DSTP_EXIT_INTERRUPTED : DSTP_EXIT_OK;

done:
    if (metrics) fclose(metrics);
    free(cs);
    eval_free(&ev);
    dstp_loader_destroy(loader);
    dstp_model_destroy(model);
    dst_engine_destroy(engine);
    dstp_comm_destroy(comm);
    dst_context_destroy(ctx);
    dstp_vocab_free(vocab);
    free(rank_ds);
    free(deferred.t);
    free(ds_text);
    dstp_launch_end(&launch);
    return rc;
}

/* ---- reading a trained model back -------------------------------------------------------------------------- */

/* The model of an engine checkpoint (its config from the client state) or of a Hugging Face folder. */
static int open_source(const dstp_source_options *src, int32_t seq, dst_context **ctx, dstp_model **model) {
    dstp_model_config cfg;
    dstp_model_options mo;
    dstp_error err;
    char path[8192], tag[256];
    int rc;
    if ((rc = make_context(src->backend, src->threads, 0, ctx)) != 0) return rc;
    memset(&mo, 0, sizeof mo);
    mo.dtype = DST_DTYPE_FP32;
    mo.max_batch = 1;
    mo.max_pred = 1;
    mo.seed = 1;
    if (src->hf) {
        int found = 0, total = 0;
        snprintf(path, sizeof path, "%s/config.json", src->hf);
        if (dstp_model_config_load(path, &cfg, &err) != DSTP_OK) {
            fail_msg("%s", err.msg);
            return DSTP_EXIT_CONFIG;
        }
        if (cfg.vocab_size == 0) {
            fail_msg("%s: key \"vocab_size\" is required here", path);
            return DSTP_EXIT_CONFIG;
        }
        mo.seq = seq;
        if (dstp_model_create(*ctx, &cfg, &mo, model, &err) != DSTP_OK) {
            fail_msg("%s", err.msg);
            return DSTP_EXIT_CONFIG;
        }
        snprintf(path, sizeof path, "%s/model.safetensors", src->hf);
        if (dstp_model_import_hf(*model, path, &found, &total, &err) != DSTP_OK) {
            fail_msg("%s", err.msg);
            return DSTP_EXIT_FAILURE;
        }
        return 0;
    }
    {
        dst_checkpoint_options peek;
        char client[65536];
        resume_state rs;
        dst_status st;
        if (src->tag) snprintf(tag, sizeof tag, "%s", src->tag);
        else if ((st = dst_checkpoint_latest_tag(src->checkpoint, tag, sizeof tag, NULL)) != DST_OK) {
            fail_msg("%s: %s", dst_status_string(st), dst_last_error());
            return DSTP_EXIT_FAILURE;
        }
        snprintf(path, sizeof path, "%s/%s/mp_rank_00_model_states.safetensors", src->checkpoint, tag);
        dst_checkpoint_options_default(&peek);
        peek.restore_rng = 0;
        st = dst_checkpoint_load_model(*ctx, NULL, 0, NULL, 0, NULL, path, &peek, client, sizeof client, NULL);
        if (st != DST_OK) {
            fail_msg("%s: %s", dst_status_string(st), dst_last_error());
            return DSTP_EXIT_FAILURE;
        }
        if (!parse_client_state(client, &rs, &cfg)) return DSTP_EXIT_FAILURE;
        mo.seq = seq > 0 ? seq : (int32_t)rs.seq;
        if (dstp_model_create(*ctx, &cfg, &mo, model, &err) != DSTP_OK) {
            fail_msg("%s", err.msg);
            return DSTP_EXIT_CONFIG;
        }
        if (dstp_model_load_engine_weights(*model, path, &err) != DSTP_OK) {
            fail_msg("%s", err.msg);
            return DSTP_EXIT_FAILURE;
        }
    }
    return 0;
}

int dstp_logits(const dstp_source_options *src, const int32_t *ids, const int32_t *types, int32_t len, const char *out) {
    dst_context *ctx = NULL;
    dstp_model *model = NULL;
    dstp_error err;
    float *logits = NULL;
    FILE *f = NULL;
    int rc = open_source(src, len, &ctx, &model);
    if (rc == 0) {
        const int32_t V = dstp_model_get_config(model)->vocab_size;
        logits = (float *)malloc((size_t)len * (size_t)V * sizeof *logits);
        rc = DSTP_EXIT_FAILURE;
        if (!logits) fail_msg("out of memory");
        else if (dstp_model_logits(model, ids, types, len, logits, &err) != DSTP_OK) fail_msg("%s", err.msg);
        else if (!(f = fopen(out, "wb"))) fail_msg("%s: cannot write: %s", out, strerror(errno));
        else if (fwrite(logits, sizeof *logits, (size_t)len * (size_t)V, f) != (size_t)len * (size_t)V || fclose(f) != 0)
            fail_msg("%s: cannot write: %s", out, strerror(errno)), f = NULL;
        else {
            f = NULL;
            printf("logits: %s, float32 [%d, %d] (little-endian, row-major)\n", out, (int)len, (int)V);
            rc = DSTP_EXIT_OK;
        }
        if (f) fclose(f);
    }
    free(logits);
    dstp_model_destroy(model);
    dst_context_destroy(ctx);
    return rc;
}

int dstp_export(const dstp_source_options *src, const char *out_dir, const char *vocab) {
    dst_context *ctx = NULL;
    dstp_model *model = NULL;
    dstp_error err;
    int rc = open_source(src, 0, &ctx, &model);
    if (rc == 0) {
        const dstp_status st = dstp_model_export_hf(model, out_dir, vocab, &err);
        if (st != DSTP_OK) {
            fail_msg("%s", err.msg);
            rc = st == DSTP_ERR_ARG ? DSTP_EXIT_CONFIG : DSTP_EXIT_FAILURE;
        } else {
            printf("hugging face: %s/ (BertForMaskedLM: model.safetensors, config.json%s)\n", out_dir,
                   vocab ? ", vocab.txt" : "");
        }
    }
    dstp_model_destroy(model);
    dst_context_destroy(ctx);
    return rc;
}
