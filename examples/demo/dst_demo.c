/*
 * dst_demo.c: the main demo of libdstransformer, written against the public C header only.
 *
 * What it shows:
 *   1. a context on the best available backend (DST_BACKEND_AUTO: CUDA when usable, else CPU), with
 *      every tensor in the context's memory (dst_malloc, dst_memcpy), so the same code runs on both;
 *   2. a stack of 4 BERT layers (H=256, 4 heads, I=1024, Pre-LN, dropout 0.1, up to 8 sequences of
 *      128 tokens) in FP32, run forward and backward on random input with a key-length padding mask,
 *      for the loss L = 1/2 ||y||^2 (so dL/dy = y);
 *   (a) gradients checked by finite differences on a small FP64 stack (2 layers, H=32, 2 heads,
 *       B=2, S=7, dropout on with a replayed RNG state): fails if a relative error exceeds 1e-6;
 *   (b) forward+backward throughput in tokens/s on this machine's backend;
 *   (c) the activation memory a training forward keeps, per sample and layer at S=128, for each
 *       combination of the memory switches.
 *
 * Run:   build/examples/demo/dst_demo [--quick] [--iters N] [--threads N]   (after ./run.sh test or a
 *        build; the test example_demo runs it with --quick)
 * Exit status 0 on success; on any failure the failing call, its status and dst_last_error().
 */
#define _POSIX_C_SOURCE 199309L /* clock_gettime */

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <dstransformer/dstransformer.h>

/* ---- error handling ------------------------------------------------------------------------- */

/* Evaluates a dst_* call; on failure prints it with its status and message and jumps to `fail`. */
#define TRY(call)                                                                                  \
    do {                                                                                           \
        dst_status try_status_ = (call);                                                           \
        if (try_status_ != DST_OK) {                                                               \
            report_failure(#call, try_status_, __LINE__);                                          \
            goto fail;                                                                             \
        }                                                                                          \
    } while (0)

static void report_failure(const char *call, dst_status status, int line)
{
    fflush(stdout); /* keep the order of the two streams when both go to one terminal or file */
    fprintf(stderr, "dst_demo: line %d: %s\n  -> %s: %s\n", line, call, dst_status_string(status),
            dst_last_error());
}

static void *xcalloc(size_t count, size_t size)
{
    void *p = calloc(count, size);
    if (p == NULL) fprintf(stderr, "dst_demo: out of host memory (%zu x %zu bytes)\n", count, size);
    return p;
}

/* ---- random numbers (splitmix64 + Box-Muller), independent of the library's RNG -------------- */

static uint64_t rng_state = 0x5eed1234abcdULL;

static uint64_t rng_next(void)
{
    uint64_t z = (rng_state += 0x9E3779B97F4A7C15ULL);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

static double rng_uniform(void) /* (0, 1) */
{
    return ((double)(rng_next() >> 11) + 0.5) / 9007199254740992.0;
}

static double rng_normal(void)
{
    const double two_pi = 6.283185307179586;
    return sqrt(-2.0 * log(rng_uniform())) * cos(two_pi * rng_uniform());
}

/* ---- FP32/FP64 host buffers ------------------------------------------------------------------ */

static double elem_get(const void *p, dst_dtype dt, size_t i)
{
    return dt == DST_DTYPE_FP64 ? ((const double *)p)[i] : (double)((const float *)p)[i];
}

static void elem_set(void *p, dst_dtype dt, size_t i, double v)
{
    if (dt == DST_DTYPE_FP64)
        ((double *)p)[i] = v;
    else
        ((float *)p)[i] = (float)v;
}

static dst_tensor tensor3(void *data, dst_dtype dt, int64_t b, int64_t s, int64_t h)
{
    dst_tensor t;
    memset(&t, 0, sizeof t);
    t.data = data;
    t.dtype = dt;
    t.ndim = 3;
    t.shape[0] = b;
    t.shape[1] = s;
    t.shape[2] = h;
    return t;
}

static double now_seconds(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* ---- a stack of layers ----------------------------------------------------------------------- */

#define MAX_LAYERS 8

/* Layers applied one after another, and the buffers one forward+backward needs. Tensors live in the
 * context's memory space (device memory on a GPU), allocated with dst_malloc and filled or read with
 * dst_memcpy: act[0] is the input, act[l+1] the output of layer l, grad[0/1] alternate as dY and dX,
 * lengths holds the key-length mask. `host` is a host staging buffer of one activation. */
typedef struct stack {
    dst_context *ctx;
    int n_layers;
    dst_layer *layer[MAX_LAYERS];
    dst_saved *saved[MAX_LAYERS]; /* one per layer: what its training forward keeps */
    dst_dtype dtype;
    int64_t hidden, max_tokens;
    void *act[MAX_LAYERS + 1];
    void *grad[2];
    int grad_input; /* which grad[] holds dL/dx after a backward */
    int32_t *lengths;
    dst_mask mask;
    void *host;
} stack;

static void stack_destroy(stack *st)
{
    int l;
    for (l = 0; l < st->n_layers; ++l) {
        dst_saved_destroy(st->saved[l]); /* before its layer */
        dst_layer_destroy(st->layer[l]);
    }
    if (st->ctx != NULL) {
        for (l = 0; l <= MAX_LAYERS; ++l) dst_free(st->ctx, st->act[l]);
        dst_free(st->ctx, st->grad[0]);
        dst_free(st->ctx, st->grad[1]);
        dst_free(st->ctx, st->lengths);
    }
    free(st->host);
    memset(st, 0, sizeof *st);
}

/* Creates n layers from configs[0..n-1] (same H, dtype and capacity) in ctx, and their buffers. */
static int stack_create(stack *st, dst_context *ctx, const dst_layer_config *configs, int n)
{
    int l;
    size_t bytes;
    memset(st, 0, sizeof *st);
    st->ctx = ctx;
    st->dtype = configs[0].dtype;
    st->hidden = configs[0].hidden_size;
    st->max_tokens = configs[0].max_batch_tokens;
    bytes = (size_t)(st->max_tokens * st->hidden) * dst_dtype_size(st->dtype);
    for (l = 0; l < n; ++l) {
        TRY(dst_layer_create(ctx, &configs[l], &st->layer[l]));
        st->n_layers = l + 1;
        TRY(dst_saved_create(st->layer[l], &st->saved[l]));
    }
    for (l = 0; l <= n; ++l) TRY(dst_malloc(ctx, bytes, &st->act[l]));
    TRY(dst_malloc(ctx, bytes, &st->grad[0]));
    TRY(dst_malloc(ctx, bytes, &st->grad[1]));
    TRY(dst_malloc(ctx, (size_t)st->max_tokens * sizeof(int32_t), (void **)&st->lengths));
    if ((st->host = xcalloc(bytes, 1)) == NULL) goto fail;
    return 0;
fail:
    stack_destroy(st);
    return 1;
}

static size_t stack_bytes(const stack *st, int64_t b, int64_t s)
{
    return (size_t)(b * s * st->hidden) * dst_dtype_size(st->dtype);
}

/* Copies the input [b, s, H] (host memory, layer dtype) in. */
static int stack_set_input(stack *st, int64_t b, int64_t s, const void *x)
{
    TRY(dst_memcpy(st->ctx, st->act[0], x, stack_bytes(st, b, s), DST_COPY_HOST_TO_CONTEXT));
    return 0;
fail:
    return 1;
}

/* Sets a key-length padding mask: sequence i has lengths[i] real tokens (the keys after them are
 * hidden from every query). */
static int stack_set_lengths(stack *st, const int32_t *lengths, int64_t b)
{
    TRY(dst_memcpy(st->ctx, st->lengths, lengths, (size_t)b * sizeof(int32_t), DST_COPY_HOST_TO_CONTEXT));
    memset(&st->mask, 0, sizeof st->mask);
    st->mask.kind = DST_MASK_KEY_LENGTHS;
    st->mask.tensor.data = st->lengths;
    st->mask.tensor.dtype = DST_DTYPE_INT32;
    st->mask.tensor.ndim = 1;
    st->mask.tensor.shape[0] = b;
    return 0;
fail:
    return 1;
}

/* y = layer[n-1](...layer[0](act[0])); the output is act[n]. */
static int stack_forward(stack *st, int64_t b, int64_t s)
{
    int l;
    for (l = 0; l < st->n_layers; ++l) {
        dst_tensor x = tensor3(st->act[l], st->dtype, b, s, st->hidden);
        dst_tensor y = tensor3(st->act[l + 1], st->dtype, b, s, st->hidden);
        TRY(dst_layer_forward(st->layer[l], st->saved[l], &x, &st->mask, &y));
    }
    return 0;
fail:
    return 1;
}

/* Copies a [b, s, H] tensor of the context to st->host. */
static int stack_read(stack *st, const void *src, int64_t b, int64_t s)
{
    TRY(dst_memcpy(st->ctx, st->host, src, stack_bytes(st, b, s), DST_COPY_CONTEXT_TO_HOST));
    return 0;
fail:
    return 1;
}

/* L = 1/2 ||y||^2 of the last forward. */
static int stack_loss(stack *st, int64_t b, int64_t s, double *loss)
{
    const size_t n = (size_t)(b * s * st->hidden);
    size_t i;
    if (stack_read(st, st->act[st->n_layers], b, s)) return 1;
    *loss = 0.0;
    for (i = 0; i < n; ++i) {
        const double y = elem_get(st->host, st->dtype, i);
        *loss += 0.5 * y * y;
    }
    return 0;
}

/* Backward of L = 1/2 ||y||^2 through the stack: dY = y; writes every layer's gradient arena and
 * leaves dL/dx in grad[grad_input]. */
static int stack_backward(stack *st, int64_t b, int64_t s)
{
    int l, cur = 0;
    TRY(dst_memcpy(st->ctx, st->grad[cur], st->act[st->n_layers], stack_bytes(st, b, s),
                   DST_COPY_CONTEXT_TO_CONTEXT));
    for (l = st->n_layers - 1; l >= 0; --l) {
        dst_tensor dy = tensor3(st->grad[cur], st->dtype, b, s, st->hidden);
        dst_tensor dx = tensor3(st->grad[1 - cur], st->dtype, b, s, st->hidden);
        TRY(dst_layer_backward(st->layer[l], st->saved[l], &dy, &dx, DST_GRAD_WRITE));
        cur = 1 - cur;
    }
    st->grad_input = cur;
    return 0;
fail:
    return 1;
}

static void fill_normal(void *p, dst_dtype dt, size_t n, double scale)
{
    size_t i;
    for (i = 0; i < n; ++i) elem_set(p, dt, i, scale * rng_normal());
}

/* ---- (a) finite-difference check ------------------------------------------------------------- */

#define FD_LAYERS 2
#define FD_B 2
#define FD_S 7
#define FD_H 32
#define FD_TOLERANCE 1e-6

typedef struct fd_run {
    dst_context *ctx;
    stack *st;
    uint64_t seed;
    int checked, failed;
    double worst;
} fd_run;

/* Loss of one training forward with the RNG state reset, so every run draws the same dropout masks. */
static int fd_loss(fd_run *r, double *loss)
{
    TRY(dst_context_set_rng_state(r->ctx, r->seed, 0));
    if (stack_forward(r->st, FD_B, FD_S) || stack_loss(r->st, FD_B, FD_S, loss)) return 1;
    return 0;
fail:
    return 1;
}

/* Numeric dL/dv at *v by the fourth-order central difference
 * (-L(v+2h) + 8 L(v+h) - 8 L(v-h) + L(v-2h)) / 12h. `apply` writes the perturbed value where the
 * library reads it (a parameter, or the input buffer). */
typedef int (*fd_apply)(void *where, double value);

static int fd_numeric(fd_run *r, fd_apply apply, void *where, double v0, double *out)
{
    const double h = 1e-3;
    const double steps[4] = {2.0, 1.0, -1.0, -2.0};
    const double weights[4] = {-1.0, 8.0, -8.0, 1.0};
    double sum = 0.0, loss;
    int k;
    for (k = 0; k < 4; ++k) {
        if (apply(where, v0 + steps[k] * h) || fd_loss(r, &loss)) return 1;
        sum += weights[k] * loss;
    }
    if (apply(where, v0)) return 1;
    *out = sum / (12.0 * h);
    return 0;
}

/* A parameter element to perturb: the library copies it in with dst_layer_set_param. */
typedef struct param_ref {
    dst_layer *layer;
    const char *name;
    double *values; /* host copy of the whole parameter */
    size_t count, index;
} param_ref;

static int apply_param(void *where, double value)
{
    param_ref *p = (param_ref *)where;
    p->values[p->index] = value;
    TRY(dst_layer_set_param(p->layer, p->name, p->values, DST_DTYPE_FP64, p->count));
    return 0;
fail:
    return 1;
}

/* An input element to perturb: the host copy is changed and copied in again. */
typedef struct input_ref {
    stack *st;
    double *x; /* host copy of the input [FD_B, FD_S, FD_H] */
    size_t index;
} input_ref;

static int apply_input(void *where, double value)
{
    input_ref *p = (input_ref *)where;
    p->x[p->index] = value;
    return stack_set_input(p->st, FD_B, FD_S, p->x);
}

static void fd_print(fd_run *r, const char *what, double analytic, double numeric)
{
    const double denom = fmax(fabs(analytic), fabs(numeric));
    const double rel = denom > 0.0 ? fabs(analytic - numeric) / denom : 0.0;
    const int ok = rel <= FD_TOLERANCE; /* NaN fails */
    printf("  %-28s %+.10e  %+.10e  %9.2e  %s\n", what, analytic, numeric, rel, ok ? "ok" : "FAIL");
    r->checked++;
    if (!ok) r->failed++;
    if (!(rel <= r->worst)) r->worst = rel;
}

/* Checks the element of largest |gradient| of parameter `name` of layer l among rows [r0, r1)
 * (rows of a [rows, cols] weight; a vector has cols = 1). */
static int fd_check_param(fd_run *r, int l, const char *name, int64_t r0, int64_t r1, const char *tag)
{
    dst_param id;
    dst_param_info info;
    double *grad = NULL, *values = NULL, numeric;
    param_ref ref;
    int64_t cols, i, best = -1;
    char label[64];

    TRY(dst_param_lookup(name, &id));
    TRY(dst_layer_param_info(r->st->layer[l], id, &info));
    cols = info.ndim == 2 ? info.shape[1] : 1;
    if ((grad = xcalloc((size_t)info.numel, sizeof(double))) == NULL) goto fail;
    if ((values = xcalloc((size_t)info.numel, sizeof(double))) == NULL) goto fail;
    TRY(dst_layer_get_grad(r->st->layer[l], name, grad, DST_DTYPE_FP64, (size_t)info.numel));
    TRY(dst_layer_get_param(r->st->layer[l], name, values, DST_DTYPE_FP64, (size_t)info.numel));
    for (i = r0 * cols; i < r1 * cols; ++i)
        if (best < 0 || fabs(grad[i]) > fabs(grad[best])) best = i;

    ref.layer = r->st->layer[l];
    ref.name = name;
    ref.values = values;
    ref.count = (size_t)info.numel;
    ref.index = (size_t)best;
    if (fd_numeric(r, apply_param, &ref, values[best], &numeric)) goto fail;
    if (info.ndim == 2)
        sprintf(label, "L%d.%s[%s%ld,%ld]", l, name, tag, (long)(best / cols - r0), (long)(best % cols));
    else
        sprintf(label, "L%d.%s[%s%ld]", l, name, tag, (long)(best - r0));
    fd_print(r, label, grad[best], numeric);
    free(grad);
    free(values);
    return 0;
fail:
    free(grad);
    free(values);
    return 1;
}

/* Gives the biases and LayerNorm parameters random values (they start at 0 and 1), so that the
 * check does not sit on a special point. */
static int randomize_vectors(dst_layer *layer, int64_t h, int64_t inter)
{
    static const char *const names[] = {"attn_qkvb", "attn_ob", "attn_nw", "attn_nb", "inter_b",
                                        "output_b",  "norm_w",  "norm_b"};
    double *v = xcalloc((size_t)(3 * h + inter), sizeof(double));
    size_t k;
    if (v == NULL) return 1;
    for (k = 0; k < sizeof names / sizeof names[0]; ++k) {
        const char *name = names[k];
        const int is_gamma = name[strlen(name) - 1] == 'w';
        const size_t n = !strcmp(name, "attn_qkvb") ? (size_t)(3 * h)
                       : !strcmp(name, "inter_b")   ? (size_t)inter
                                                    : (size_t)h;
        size_t i;
        for (i = 0; i < n; ++i) v[i] = is_gamma ? 1.0 + 0.2 * rng_normal() : 0.1 * rng_normal();
        TRY(dst_layer_set_param(layer, name, v, DST_DTYPE_FP64, n));
    }
    free(v);
    return 0;
fail:
    free(v);
    return 1;
}

static int finite_difference_check(void)
{
    static const char *const vectors[] = {"attn_ob", "attn_nw", "attn_nb", "inter_b",
                                          "output_b", "norm_w",  "norm_b"};
    dst_context *ctx = NULL;
    dst_layer_config cfg[FD_LAYERS];
    stack st;
    const int32_t lengths[FD_B] = {FD_S, 4};
    fd_run r;
    double loss, numeric, *dx = NULL;
    double x[FD_B * FD_S * FD_H];
    size_t i, best;
    int l, k, rc = 1;

    memset(&st, 0, sizeof st);
    memset(&r, 0, sizeof r);
    printf("\n(a) finite-difference check: FP64 on the CPU backend, %d Pre-LN layers, H=%d, 2 heads,\n"
           "    B=%d, S=%d, key lengths {%d, %d}, dropout 0.1 (same masks in every run),\n"
           "    layer 1 with all three memory switches; tolerance %.0e\n",
           FD_LAYERS, FD_H, FD_B, FD_S, lengths[0], lengths[1], FD_TOLERANCE);
    TRY(dst_context_create(DST_BACKEND_CPU, 0, &ctx));
    for (l = 0; l < FD_LAYERS; ++l) {
        TRY(dst_layer_config_default(&cfg[l]));
        cfg[l].hidden_size = FD_H;
        cfg[l].heads = 2;
        cfg[l].attn_dropout_ratio = 0.1f;
        cfg[l].hidden_dropout_ratio = 0.1f;
        cfg[l].num_hidden_layers = FD_LAYERS;
        cfg[l].initializer_range = 0.2f; /* larger than BERT's 0.02: a less linear regime */
        cfg[l].adjust_init_range = 0;
        cfg[l].pre_layer_norm = 1;
        cfg[l].dtype = DST_DTYPE_FP64;
        cfg[l].max_batch_tokens = FD_B * FD_S;
        cfg[l].max_seq_len = FD_S;
        cfg[l].seed = 7 + (uint64_t)l;
    }
    cfg[1].attn_dropout_checkpoint = 1;
    cfg[1].normalize_invertible = 1;
    cfg[1].gelu_checkpoint = 1;
    if (stack_create(&st, ctx, cfg, FD_LAYERS)) goto fail;
    for (l = 0; l < FD_LAYERS; ++l)
        if (randomize_vectors(st.layer[l], FD_H, 4 * FD_H)) goto fail;
    fill_normal(x, DST_DTYPE_FP64, FD_B * FD_S * FD_H, 1.0);
    if (stack_set_input(&st, FD_B, FD_S, x) || stack_set_lengths(&st, lengths, FD_B)) goto fail;

    r.ctx = ctx;
    r.st = &st;
    r.seed = 2024;
    if (fd_loss(&r, &loss) || stack_backward(&st, FD_B, FD_S)) goto fail;
    if ((dx = xcalloc(FD_B * FD_S * FD_H, sizeof *dx)) == NULL) goto fail;
    TRY(dst_memcpy(ctx, dx, st.grad[st.grad_input], sizeof x, DST_COPY_CONTEXT_TO_HOST));
    printf("    L = 1/2 ||y||^2 = %.12f\n\n", loss);
    printf("  %-28s %-17s  %-17s  %9s\n", "value", "analytic", "numeric", "rel.error");

    for (l = 0; l < FD_LAYERS; ++l) {
        /* qkvw: the largest entry of each of the Q, K and V blocks; qkvb: Q and V (the K bias has a
         * zero gradient in exact arithmetic: it shifts every score of a row by the same amount). */
        if (fd_check_param(&r, l, "attn_qkvw", 0, FD_H, "Q ") ||
            fd_check_param(&r, l, "attn_qkvw", FD_H, 2 * FD_H, "K ") ||
            fd_check_param(&r, l, "attn_qkvw", 2 * FD_H, 3 * FD_H, "V ") ||
            fd_check_param(&r, l, "attn_qkvb", 0, FD_H, "Q ") ||
            fd_check_param(&r, l, "attn_qkvb", 2 * FD_H, 3 * FD_H, "V ") ||
            fd_check_param(&r, l, "attn_ow", 0, FD_H, "") ||
            fd_check_param(&r, l, "inter_w", 0, 4 * FD_H, "") ||
            fd_check_param(&r, l, "output_w", 0, FD_H, ""))
            goto fail;
        for (k = 0; k < (int)(sizeof vectors / sizeof vectors[0]); ++k) {
            const int64_t n = !strcmp(vectors[k], "inter_b") ? 4 * FD_H : FD_H;
            if (fd_check_param(&r, l, vectors[k], 0, n, "")) goto fail;
        }
    }
    /* dL/dx: its largest entry, and an entry of a padded position of the second sequence (t >= 4):
     * padding hides keys, not queries, so those tokens still have gradients. */
    {
        size_t picks[2];
        best = 0;
        for (i = 1; i < (size_t)(FD_B * FD_S * FD_H); ++i)
            if (fabs(dx[i]) > fabs(dx[best])) best = i;
        picks[0] = best;
        picks[1] = (size_t)((1 * FD_S + 5) * FD_H + 3);
        for (k = 0; k < 2; ++k) {
            const size_t e = picks[k];
            input_ref ref;
            char label[64];
            ref.st = &st;
            ref.x = x;
            ref.index = e;
            if (fd_numeric(&r, apply_input, &ref, x[e], &numeric)) goto fail;
            sprintf(label, "dx[b%ld,t%ld,%ld]", (long)(e / (FD_S * FD_H)), (long)(e / FD_H % FD_S),
                    (long)(e % FD_H));
            fd_print(&r, label, dx[e], numeric);
        }
    }
    printf("\n    %d values checked, worst relative error %.2e: %s\n", r.checked, r.worst,
           r.failed ? "FAILED" : "ok");
    if (r.failed) {
        fprintf(stderr, "dst_demo: %d gradient(s) differ from finite differences by more than %.0e\n",
                r.failed, FD_TOLERANCE);
        goto fail;
    }
    rc = 0;
fail:
    free(dx);
    stack_destroy(&st);
    dst_context_destroy(ctx);
    return rc;
}

/* ---- (c) memory switches --------------------------------------------------------------------- */

static int memory_table(const dst_layer_config *base, int64_t seq)
{
    static const struct {
        const char *name;
        int attn, inv, gelu;
    } combos[] = {{"none", 0, 0, 0},
                  {"attn_dropout_checkpoint", 1, 0, 0},
                  {"normalize_invertible", 0, 1, 0},
                  {"gelu_checkpoint", 0, 0, 1},
                  {"all three", 1, 1, 1}};
    size_t k, bytes, none = 0;
    printf("\n(c) activations a training forward keeps, per sample and layer (H=%d, %d heads, I=%d, "
           "S=%ld, %s)\n\n",
           base->hidden_size, base->heads, base->intermediate_size, (long)seq,
           dst_dtype_string(base->dtype));
    printf("  %-26s %12s %10s\n", "memory switches", "KiB", "vs none");
    for (k = 0; k < sizeof combos / sizeof combos[0]; ++k) {
        dst_layer_config c = *base;
        c.attn_dropout_checkpoint = combos[k].attn;
        c.normalize_invertible = combos[k].inv;
        c.gelu_checkpoint = combos[k].gelu;
        TRY(dst_layer_config_saved_bytes(&c, 1, seq, &bytes));
        if (k == 0) none = bytes;
        printf("  %-26s %12.1f %9.1f%%\n", combos[k].name, (double)bytes / 1024.0,
               none ? 100.0 * (double)bytes / (double)none : 0.0);
    }
    return 0;
fail:
    return 1;
}

/* ---- main ------------------------------------------------------------------------------------ */

#define N_LAYERS 4

static void usage(FILE *f)
{
    fprintf(f, "usage: dst_demo [--quick] [--iters N] [--threads N]\n"
                "  --quick      smaller batch (2 x 64 tokens) and 2 timed iterations (used by ctest)\n"
                "  --iters N    timed forward+backward iterations (default 5)\n"
                "  --threads N  host threads of the CPU backend (default: all cores)\n");
}

int main(int argc, char **argv)
{
    dst_context *ctx = NULL;
    dst_backend backend = DST_BACKEND_AUTO;
    dst_layer_config cfg[N_LAYERS];
    stack st;
    int32_t *lengths = NULL, min_len = INT32_MAX;
    int64_t batch = 8, seq = 128, tokens, b;
    int iters = 5, threads = 0, quick = 0, devices = 0, i, l, rc = 1;
    size_t arena = 0, saved = 0, predicted = 0;
    double loss, dx_norm = 0.0, t0, seconds, flops;
    const char *backend_name;

    memset(&st, 0, sizeof st);
    for (i = 1; i < argc; ++i) {
        if (!strcmp(argv[i], "--quick")) {
            quick = 1;
        } else if (!strcmp(argv[i], "--iters") && i + 1 < argc) {
            iters = atoi(argv[++i]);
        } else if (!strcmp(argv[i], "--threads") && i + 1 < argc) {
            threads = atoi(argv[++i]);
        } else if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            usage(stdout);
            return 0;
        } else {
            usage(stderr);
            return 2;
        }
    }
    if (quick) {
        batch = 2;
        seq = 64;
        if (iters == 5) iters = 2;
    }
    if (iters < 1 || threads < 0) {
        usage(stderr);
        return 2;
    }
    tokens = batch * seq;

    printf("libdstransformer %s demo\n", dst_version_string());
    TRY(dst_cuda_device_count(&devices));
    TRY(dst_context_create(DST_BACKEND_AUTO, 0, &ctx));
    TRY(dst_context_get_backend(ctx, &backend));
    backend_name = backend == DST_BACKEND_CUDA ? "CUDA" : "CPU";
    if (backend == DST_BACKEND_CUDA)
        printf("backend: AUTO chose CUDA (device 0 of %d)\n", devices);
    else
        printf("backend: AUTO chose CPU, the reference backend (no usable CUDA device)\n");
    if (threads > 0) TRY(dst_context_set_num_threads(ctx, threads));
    TRY(dst_context_get_num_threads(ctx, &threads));
    TRY(dst_context_set_rng_state(ctx, 1234, 0));

    for (l = 0; l < N_LAYERS; ++l) {
        TRY(dst_layer_config_default(&cfg[l]));
        cfg[l].hidden_size = 256;
        cfg[l].heads = 4;
        cfg[l].intermediate_size = 1024;
        cfg[l].attn_dropout_ratio = 0.1f;
        cfg[l].hidden_dropout_ratio = 0.1f;
        cfg[l].num_hidden_layers = N_LAYERS;
        cfg[l].pre_layer_norm = 1;
        cfg[l].dtype = DST_DTYPE_FP32;
        cfg[l].max_batch_tokens = 8 * 128;
        cfg[l].max_seq_len = 128;
        cfg[l].seed = 42 + (uint64_t)l; /* one seed per layer: the same seed gives the same weights */
        TRY(dst_layer_config_validate(&cfg[l], backend));
    }
    if (stack_create(&st, ctx, cfg, N_LAYERS)) goto fail;
    TRY(dst_layer_arena_bytes(st.layer[0], &arena));
    printf("model: %d Pre-LN BERT layers, H=%d, %d heads, I=%d, dropout %.1f, %s, capacity %ld x %d tokens;\n"
           "       parameter arena %.2f MiB per layer",
           N_LAYERS, cfg[0].hidden_size, cfg[0].heads, cfg[0].intermediate_size,
           (double)cfg[0].attn_dropout_ratio, dst_dtype_string(cfg[0].dtype),
           (long)(cfg[0].max_batch_tokens / cfg[0].max_seq_len), cfg[0].max_seq_len,
           (double)arena / (1024.0 * 1024.0));
    if (backend == DST_BACKEND_CPU) printf("; %d host thread(s)", threads);
    printf("\n");

    /* Random input and a key-length padding mask: sequence b has lengths[b] real tokens. */
    if ((lengths = xcalloc((size_t)batch, sizeof *lengths)) == NULL) goto fail;
    for (b = 0; b < batch; ++b) {
        lengths[b] = b == 0 ? (int32_t)seq : (int32_t)(seq / 2 + (int64_t)(rng_next() % (uint64_t)(seq / 2 + 1)));
        if (lengths[b] < min_len) min_len = lengths[b];
    }
    fill_normal(st.host, st.dtype, (size_t)(tokens * st.hidden), 1.0);
    if (stack_set_input(&st, batch, seq, st.host) || stack_set_lengths(&st, lengths, batch)) goto fail;

    /* One training step's worth of compute: forward through the stack, then backward. */
    if (stack_forward(&st, batch, seq) || stack_loss(&st, batch, seq, &loss)) goto fail;
    if (stack_backward(&st, batch, seq) || stack_read(&st, st.grad[st.grad_input], batch, seq)) goto fail;
    for (i = 0; i < tokens * st.hidden; ++i) {
        const double g = elem_get(st.host, st.dtype, (size_t)i);
        dx_norm += g * g;
    }
    dx_norm = sqrt(dx_norm);
    TRY(dst_saved_bytes(st.saved[0], &saved));
    TRY(dst_layer_config_saved_bytes(&cfg[0], batch, seq, &predicted));
    printf("\nforward + backward, B=%ld, S=%ld, key lengths %d..%d:\n"
           "  L = 1/2 ||y||^2 = %.6e   ||dL/dx|| = %.6e\n"
           "  saved activations: %.1f KiB per layer (dst_layer_config_saved_bytes predicts %.1f KiB)\n",
           (long)batch, (long)seq, (int)min_len, (int)seq, loss, dx_norm, (double)saved / 1024.0,
           (double)predicted / 1024.0);
    if (!isfinite(loss) || !isfinite(dx_norm)) {
        fprintf(stderr, "dst_demo: the loss or the input gradient is not finite\n");
        goto fail;
    }
    if (saved != predicted) {
        fprintf(stderr, "dst_demo: dst_saved_bytes (%zu) differs from dst_layer_config_saved_bytes (%zu)\n",
                saved, predicted);
        goto fail;
    }

    if (finite_difference_check()) goto fail;

    /* (b) Throughput: every iteration is one training step of the whole stack (forward + backward). */
    printf("\n(b) throughput, measured on this machine's %s backend", backend_name);
    if (backend == DST_BACKEND_CPU) printf(" (%d thread(s))", threads);
    printf(", B=%ld, S=%ld, %d layers, forward + backward:\n", (long)batch, (long)seq, N_LAYERS);
    TRY(dst_context_synchronize(ctx));
    t0 = now_seconds();
    for (i = 0; i < iters; ++i)
        if (stack_forward(&st, batch, seq) || stack_backward(&st, batch, seq)) goto fail;
    TRY(dst_context_synchronize(ctx));
    seconds = now_seconds() - t0;
    /* Model FLOPs of one layer's forward: the four GEMMs, 2·N·(4H² + 2HI), and the two attention
     * products over the full S×S, 4·B·S²·H; backward is twice that. Padded keys count too. */
    {
        const double h = cfg[0].hidden_size, inter = cfg[0].intermediate_size;
        flops = 3.0 * N_LAYERS *
                (2.0 * (double)tokens * (4.0 * h * h + 2.0 * h * inter) +
                 4.0 * (double)batch * (double)seq * (double)seq * h);
    }
    printf("  %d iterations in %.3f s: %.1f ms per iteration, %.0f tokens/s (%.1f GFLOP/s of model FLOPs)\n",
           iters, seconds, 1e3 * seconds / iters, (double)(tokens * iters) / seconds,
           flops * iters / seconds * 1e-9);

    if (memory_table(&cfg[0], 128)) goto fail;

    printf("\ndemo ok\n");
    rc = 0;
fail:
    stack_destroy(&st);
    free(lengths);
    dst_context_destroy(ctx);
    return rc;
}
