/*
 * bench_layer: times one libdstransformer layer (forward+backward and inference) for BERT-Large
 * shapes and reports the activation bytes a training forward keeps, per sample and layer, for each
 * memory-switch combination. Uses only the public C API; timings use host clocks around
 * dst_context_synchronize(), median of R repetitions of N iterations.
 *
 *   bench_layer [--backend cuda|cpu] [--quick] [--shapes BxS,...] [--json FILE]
 *
 * "host us/step" is the host's own work per step: the calling thread's CPU time for the first three
 * steps after a synchronisation (the device's queue far from full, so no launch waits), divided by
 * three, median over the repetitions. Where it approaches the step's time (small batches), the host's
 * launches bound the layer.
 *
 * Ratios against PyTorch come from bench/compare_torch.py, which runs in the same process as the
 * baselines; this program gives the library's own view and works without Python.
 */
#define _POSIX_C_SOURCE 199309L
#include <dstransformer/dstransformer.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define CHECK(call)                                                                          \
    do {                                                                                     \
        dst_status s_ = (call);                                                              \
        if (s_ != DST_OK) {                                                                  \
            fprintf(stderr, "%s failed: %s: %s\n", #call, dst_status_string(s_), dst_last_error()); \
            exit(1);                                                                         \
        }                                                                                    \
    } while (0)

static double clock_ms(clockid_t id) {
    struct timespec t;
    clock_gettime(id, &t);
    return t.tv_sec * 1e3 + t.tv_nsec * 1e-6;
}

static double now_ms(void) { return clock_ms(CLOCK_MONOTONIC); }

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

typedef struct {
    dst_context *ctx;
    dst_layer *layer;
    dst_tensor x, y, dy, dx;
    dst_mask mask;
    int training;
} bench_case;

static void run_once(bench_case *c) {
    CHECK(dst_layer_forward(c->layer, NULL, &c->x, &c->mask, &c->y));
    if (c->training) CHECK(dst_layer_backward(c->layer, NULL, &c->dy, &c->dx, DST_GRAD_WRITE));
}

/* Median ms per step over `reps` runs of `iters` steps; *host_us: median thread CPU µs per step of a
 * run's first three steps. */
static double time_case(bench_case *c, int reps, int iters, double *host_us) {
    double t[16], h[16];
    int r, i;
    for (i = 0; i < 2; ++i) run_once(c);
    CHECK(dst_context_synchronize(c->ctx));
    for (r = 0; r < reps; ++r) {
        double t0 = now_ms(), c0 = clock_ms(CLOCK_THREAD_CPUTIME_ID);
        for (i = 0; i < 3 && i < iters; ++i) run_once(c);
        h[r] = (clock_ms(CLOCK_THREAD_CPUTIME_ID) - c0) * 1e3 / i;
        for (; i < iters; ++i) run_once(c);
        CHECK(dst_context_synchronize(c->ctx));
        t[r] = (now_ms() - t0) / iters;
    }
    qsort(t, (size_t)reps, sizeof t[0], cmp_double);
    qsort(h, (size_t)reps, sizeof h[0], cmp_double);
    *host_us = h[reps / 2];
    return t[reps / 2];
}

static void *device_random(dst_context *ctx, size_t n, dst_dtype dt, unsigned *seed) {
    size_t es = dst_dtype_size(dt), i;
    float *f = malloc(n * sizeof(float));
    void *host = malloc(n * es), *dev = NULL;
    for (i = 0; i < n; ++i) {
        *seed = *seed * 1664525u + 1013904223u;
        f[i] = ((float)(*seed >> 8) / 16777216.0f) * 2.0f - 1.0f;
    }
    /* fp32 is written as is; 16-bit types by truncating the fp32 mantissa (fine for benchmark data). */
    for (i = 0; i < n; ++i) {
        unsigned bits;
        memcpy(&bits, &f[i], 4);
        if (dt == DST_DTYPE_FP32) ((float *)host)[i] = f[i];
        else if (dt == DST_DTYPE_BF16) ((unsigned short *)host)[i] = (unsigned short)(bits >> 16);
        else if (dt == DST_DTYPE_FP16) {
            /* |f| < 1: exponent fits; build an fp16 with 10 mantissa bits. */
            unsigned sign = (bits >> 16) & 0x8000u;
            int e = (int)((bits >> 23) & 0xFF) - 127 + 15;
            unsigned h = e <= 0 ? sign : sign | ((unsigned)e << 10) | ((bits >> 13) & 0x3FFu);
            ((unsigned short *)host)[i] = (unsigned short)h;
        } else ((double *)host)[i] = f[i];
    }
    CHECK(dst_malloc(ctx, n * es, &dev));
    CHECK(dst_memcpy(ctx, dev, host, n * es, DST_COPY_HOST_TO_CONTEXT));
    free(f);
    free(host);
    return dev;
}

static dst_tensor act(void *p, dst_dtype dt, int64_t B, int64_t S, int64_t H) {
    dst_tensor t;
    memset(&t, 0, sizeof t);
    t.data = p;
    t.dtype = dt;
    t.ndim = 3;
    t.shape[0] = B;
    t.shape[1] = S;
    t.shape[2] = H;
    return t;
}

int main(int argc, char **argv) {
    const char *json = NULL;
    dst_backend backend = DST_BACKEND_AUTO;
    int quick = 0, i, nshapes = 2;
    int64_t shapes[8][2] = {{64, 128}, {16, 512}};
    for (i = 1; i < argc; ++i) {
        if (!strcmp(argv[i], "--quick")) quick = 1;
        else if (!strcmp(argv[i], "--shapes") && i + 1 < argc) {
            const char *p = argv[++i];
            nshapes = 0;
            while (*p) {
                long long b = 0, s = 0;
                int used = 0;
                if (nshapes == 8 || sscanf(p, "%lldx%lld%n", &b, &s, &used) != 2 || b < 1 || s < 1) {
                    fprintf(stderr, "--shapes: expected up to 8 comma-separated BxS with B, S >= 1, got '%s'\n",
                            argv[i]);
                    return 2;
                }
                shapes[nshapes][0] = b;
                shapes[nshapes][1] = s;
                ++nshapes;
                p += used;
                if (*p == ',') ++p;
                else if (*p) {
                    fprintf(stderr, "--shapes: expected ',' after '%lldx%lld' in '%s'\n", b, s, argv[i]);
                    return 2;
                }
            }
            if (nshapes == 0) {
                fprintf(stderr, "--shapes: expected at least one BxS\n");
                return 2;
            }
        }
        else if (!strcmp(argv[i], "--json") && i + 1 < argc) json = argv[++i];
        else if (!strcmp(argv[i], "--backend") && i + 1 < argc) {
            ++i;
            backend = !strcmp(argv[i], "cpu") ? DST_BACKEND_CPU : DST_BACKEND_CUDA;
        } else {
            fprintf(stderr, "usage: %s [--backend cuda|cpu] [--quick] [--shapes BxS,...] [--json FILE]\n", argv[0]);
            return 2;
        }
    }
    dst_context *ctx;
    CHECK(dst_context_create(backend, 0, &ctx));
    CHECK(dst_context_get_backend(ctx, &backend));
    const int on_gpu = backend == DST_BACKEND_CUDA;
    /* BERT-Large on a GPU; a BERT-Base-sized layer with small batches on the CPU reference. */
    const int64_t H = on_gpu ? 1024 : 768, heads = on_gpu ? 16 : 12, I = 4 * H;
    if (!on_gpu && nshapes == 2 && shapes[0][0] == 64 && shapes[1][0] == 16) { /* the defaults, made small */
        shapes[0][0] = 2;
        shapes[1][0] = 1;
    }
    const dst_dtype dtypes[3] = {DST_DTYPE_FP16, DST_DTYPE_BF16, DST_DTYPE_FP32};
    const int ndt = on_gpu ? (quick ? 1 : 2) : 1;
    const int reps = quick ? 3 : 7, iters = on_gpu ? (quick ? 5 : 20) : 1;
    FILE *jf = json ? fopen(json, "w") : NULL;
    if (json && !jf) {
        perror(json);
        return 1;
    }
    printf("libdstransformer %s, backend %s, H=%lld heads=%lld I=%lld, dropout 0.1, padding mask\n",
           dst_version_string(), on_gpu ? "cuda" : "cpu", (long long)H, (long long)heads, (long long)I);
    printf("%-5s %4s %5s  %14s %14s %12s %14s %14s\n", "dtype", "B", "S", "fwd+bwd ms/lyr", "infer ms/lyr",
           "tokens/s", "host us/step", "host us/infer");
    if (jf) fprintf(jf, "{\"backend\": \"%s\", \"timings\": [", on_gpu ? "cuda" : "cpu");
    int first = 1, d, k;
    for (d = 0; d < ndt; ++d) {
        dst_dtype dt = on_gpu ? dtypes[d] : dtypes[2];
        for (k = 0; k < nshapes; ++k) {
            const int64_t B = shapes[k][0], S = shapes[k][1];
            dst_layer_config cfg;
            bench_case c;
            unsigned seed = 12345u;
            memset(&c, 0, sizeof c);
            CHECK(dst_layer_config_default(&cfg));
            cfg.hidden_size = (int32_t)H;
            cfg.heads = (int32_t)heads;
            cfg.intermediate_size = (int32_t)I;
            cfg.dtype = dt;
            cfg.max_batch_tokens = B * S;
            cfg.max_seq_len = (int32_t)S;
            c.ctx = ctx;
            CHECK(dst_layer_create(ctx, &cfg, &c.layer));
            size_t n = (size_t)(B * S * H);
            c.x = act(device_random(ctx, n, dt, &seed), dt, B, S, H);
            c.dy = act(device_random(ctx, n, dt, &seed), dt, B, S, H);
            void *py, *pdx, *pm;
            CHECK(dst_malloc(ctx, n * dst_dtype_size(dt), &py));
            CHECK(dst_malloc(ctx, n * dst_dtype_size(dt), &pdx));
            c.y = act(py, dt, B, S, H);
            c.dx = act(pdx, dt, B, S, H);
            int32_t *len = malloc((size_t)B * sizeof(int32_t));
            int64_t b;
            for (b = 0; b < B; ++b) len[b] = (int32_t)(b < B / 2 ? S : S - S / 4);
            CHECK(dst_malloc(ctx, (size_t)B * 4, &pm));
            CHECK(dst_memcpy(ctx, pm, len, (size_t)B * 4, DST_COPY_HOST_TO_CONTEXT));
            free(len);
            c.mask.kind = DST_MASK_KEY_LENGTHS;
            c.mask.tensor.data = pm;
            c.mask.tensor.dtype = DST_DTYPE_INT32;
            c.mask.tensor.ndim = 1;
            c.mask.tensor.shape[0] = B;
            c.training = 1;
            double h_train, h_inf;
            double t_train = time_case(&c, reps, iters, &h_train);
            CHECK(dst_layer_set_training(c.layer, 0));
            c.training = 0;
            double t_inf = time_case(&c, reps, iters, &h_inf);
            printf("%-5s %4lld %5lld  %14.3f %14.3f %12.0f %14.1f %14.1f\n", dst_dtype_string(dt), (long long)B,
                   (long long)S, t_train, t_inf, (double)(B * S) / (t_train * 1e-3), h_train, h_inf);
            if (jf)
                fprintf(jf,
                        "%s{\"dtype\": \"%s\", \"B\": %lld, \"S\": %lld, \"train_ms\": %.4f, \"infer_ms\": %.4f, "
                        "\"host_train_us\": %.2f, \"host_infer_us\": %.2f}",
                        first ? "" : ", ", dst_dtype_string(dt), (long long)B, (long long)S, t_train, t_inf, h_train,
                        h_inf);
            first = 0;
            dst_free(ctx, c.x.data);
            dst_free(ctx, c.dy.data);
            dst_free(ctx, py);
            dst_free(ctx, pdx);
            dst_free(ctx, pm);
            dst_layer_destroy(c.layer);
        }
    }
    /* Saved activations per sample per layer, fp16, for each memory-switch combination. */
    static const char *names[5] = {"none", "attn_dropout_checkpoint", "normalize_invertible", "gelu_checkpoint",
                                   "all three"};
    printf("\nsaved activations, MB per sample per layer (fp16, H=1024, 16 heads, I=4096)\n%-24s %8s %8s\n", "switches",
           "S=128", "S=512");
    if (jf) fprintf(jf, "], \"saved_MB_per_sample_layer\": {");
    for (k = 0; k < 5; ++k) {
        dst_layer_config cfg;
        size_t s128, s512;
        CHECK(dst_layer_config_default(&cfg));
        cfg.dtype = DST_DTYPE_FP16;
        cfg.attn_dropout_checkpoint = k == 1 || k == 4;
        cfg.normalize_invertible = k == 2 || k == 4;
        cfg.gelu_checkpoint = k == 3 || k == 4;
        CHECK(dst_layer_config_saved_bytes(&cfg, 1, 128, &s128));
        CHECK(dst_layer_config_saved_bytes(&cfg, 1, 512, &s512));
        printf("%-24s %8.2f %8.2f\n", names[k], s128 / 1e6, s512 / 1e6);
        if (jf) fprintf(jf, "%s\"%s\": [%.4f, %.4f]", k ? ", " : "", names[k], s128 / 1e6, s512 / 1e6);
    }
    if (jf) {
        fprintf(jf, "}}\n");
        fclose(jf);
    }
    dst_context_destroy(ctx);
    return 0;
}
