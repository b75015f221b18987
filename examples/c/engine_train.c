/*
 * engine_train.c — training a small stack of layers with the library's engine, configured by a
 * DeepSpeed-style JSON file, then saving a checkpoint halfway and resuming from it.
 *
 * Shows: dst_engine_create from a JSON config (Adam, a warm-up schedule, clipping, gradient
 * accumulation; fp16 with dynamic loss scaling in engine_train_cuda.json), registering layers with the
 * engine's optimizer, the per-micro-batch loop (forward, loss gradient, dst_engine_scale_loss_gradient,
 * backward accumulating, dst_engine_step), the engine's state, and dst_engine_save_checkpoint /
 * dst_engine_load_checkpoint with a client state. The task: map each input token x to 0.5·x with its
 * features reversed; the loss falls.
 *
 * The second run starts from other weights and loads the checkpoint saved at step 10: its losses for
 * steps 11–20 are the first run's, bit for bit (the checkpoint holds the weights, the fp32 moments,
 * the loss scaler, the schedule, the counters and the dropout RNG state).
 *
 * Usage:   engine_train CONFIG.json CHECKPOINT_DIR [cpu|cuda|auto]
 * Build and run (from a build tree):
 *   ninja engine_train && ./examples/engine_train ../examples/c/engine_train_cpu.json /tmp/ckpt cpu
 * Exits with 0 when the loss fell and the resumed run matched, 77 when CUDA was asked for and no GPU
 * is usable, 1 on any failure (printing dst_last_error()).
 */
#include <dstransformer/dstransformer.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CHECK(call)                                                                       \
    do {                                                                                  \
        dst_status st_ = (call);                                                          \
        if (st_ != DST_OK) {                                                              \
            fprintf(stderr, "%s failed: %s: %s\n", #call, dst_status_string(st_),         \
                    dst_last_error());                                                    \
            goto done;                                                                    \
        }                                                                                 \
    } while (0)

enum { LAYERS = 2, S = 16, H = 64, HEADS = 4, STEPS = 20, SAVE_AT = 10, MAX_MICRO = 64 };

/* ---- small host helpers ------------------------------------------------------------------------ */

/* A deterministic generator for the data (uniform in [-1, 1)). */
static float next_uniform(unsigned long long *state) {
    *state = *state * 6364136223846793005ULL + 1442695040888963407ULL;
    return (float)((*state >> 40) & 0xFFFFFF) / 8388608.0f - 1.0f;
}

/* IEEE binary16 <-> float on the host (round to nearest even), for FP16 layers. */
static unsigned short float_to_half(float f) {
    unsigned int x, sign, mant, r;
    int e;
    memcpy(&x, &f, sizeof x);
    sign = (x >> 16) & 0x8000u;
    e = (int)((x >> 23) & 0xFF) - 127 + 15;
    mant = x & 0x7FFFFFu;
    if (((x >> 23) & 0xFF) == 0xFF) return (unsigned short)(sign | 0x7C00u | (mant ? 0x200u : 0u));
    if (e >= 31) return (unsigned short)(sign | 0x7C00u);
    if (e <= 0) {
        if (e < -10) return (unsigned short)sign;
        mant |= 0x800000u;
        r = mant >> (14 - e);
        if (((mant >> (13 - e)) & 1u) && ((mant & ((1u << (13 - e)) - 1u)) || (r & 1u))) ++r;
        return (unsigned short)(sign | r);
    }
    r = ((unsigned)e << 10) | (mant >> 13);
    if ((mant & 0x1000u) && ((mant & 0x2FFFu) != 0)) ++r;
    return (unsigned short)(sign | r);
}

static float half_to_float(unsigned short h) {
    unsigned int sign = (unsigned)(h & 0x8000u) << 16, e = (h >> 10) & 0x1Fu, mant = h & 0x3FFu, x;
    float f;
    if (e == 0) {
        f = (float)mant / 16777216.0f;
        return sign ? -f : f;
    }
    x = e == 31 ? (sign | 0x7F800000u | (mant << 13)) : (sign | ((e + 112u) << 23) | (mant << 13));
    memcpy(&f, &x, sizeof f);
    return f;
}

/* The whole file as a NUL-terminated string (the caller frees it), or NULL. */
static char *read_file(const char *path) {
    FILE *f = fopen(path, "rb");
    char *text = NULL;
    long n;
    if (!f) return NULL;
    if (fseek(f, 0, SEEK_END) == 0 && (n = ftell(f)) >= 0 && fseek(f, 0, SEEK_SET) == 0) {
        text = malloc((size_t)n + 1);
        if (text && fread(text, 1, (size_t)n, f) != (size_t)n) {
            free(text);
            text = NULL;
        }
        if (text) text[n] = '\0';
    }
    fclose(f);
    return text;
}

/* ---- the trainer --------------------------------------------------------------------------------- */

typedef struct Trainer {
    dst_context *ctx;
    dst_engine *engine;
    dst_layer *layers[LAYERS];
    dst_dtype dt;
    int micro;                 /* sequences per micro-batch (from the resolved configuration) */
    size_t elem, count;        /* element size; elements of one activation */
    void *act[LAYERS + 1];     /* activations, in the context's memory */
    void *dy, *ga, *gb;        /* loss gradient and two buffers for the backward chain */
    unsigned char *host;       /* staging buffer in the layer dtype */
    float *x, *y;              /* host copies as float */
} Trainer;

static void trainer_free(Trainer *t) {
    int i;
    for (i = 0; i <= LAYERS; ++i) dst_free(t->ctx, t->act[i]);
    dst_free(t->ctx, t->dy);
    dst_free(t->ctx, t->ga);
    dst_free(t->ctx, t->gb);
    for (i = 0; i < LAYERS; ++i) dst_layer_destroy(t->layers[i]);
    dst_engine_destroy(t->engine);
    dst_context_destroy(t->ctx);
    free(t->host);
    free(t->x);
    free(t->y);
    memset(t, 0, sizeof *t);
}

static void to_float(const Trainer *t, float *dst) {
    size_t i;
    for (i = 0; i < t->count; ++i)
        dst[i] = t->dt == DST_DTYPE_FP16 ? half_to_float(((const unsigned short *)t->host)[i]) : ((const float *)t->host)[i];
}

static void from_float(const Trainer *t, const float *src) {
    size_t i;
    for (i = 0; i < t->count; ++i) {
        if (t->dt == DST_DTYPE_FP16)
            ((unsigned short *)t->host)[i] = float_to_half(src[i]);
        else
            ((float *)t->host)[i] = src[i];
    }
}

static dst_tensor activation(const Trainer *t, void *data) {
    dst_tensor v;
    memset(&v, 0, sizeof v);
    v.data = data;
    v.dtype = t->dt;
    v.ndim = 3;
    v.shape[0] = t->micro;
    v.shape[1] = S;
    v.shape[2] = H;
    return v;
}

/* A context, an engine from `config`, and LAYERS layers registered with it (weights seeded by `seed`). */
static int trainer_init(Trainer *t, dst_backend backend, const char *config, unsigned long long seed) {
    dst_engine_state st;
    dst_layer_config cfg;
    dst_optimizer *opt = NULL;
    dst_param_group no_decay;
    char prefix[32];
    int i, rc = 1;
    memset(t, 0, sizeof *t);
    CHECK(dst_context_create(backend, 0, &t->ctx));
    CHECK(dst_context_set_rng_state(t->ctx, 1234, 0));
    CHECK(dst_engine_create(t->ctx, config, 1, &t->engine));
    st.struct_size = sizeof st;
    CHECK(dst_engine_get_state(t->engine, &st));
    t->micro = st.train_micro_batch_size_per_gpu;
    if (t->micro > MAX_MICRO) {
        fprintf(stderr, "this example runs micro-batches of at most %d sequences\n", MAX_MICRO);
        goto done;
    }
    t->dt = st.fp16_enabled ? DST_DTYPE_FP16 : DST_DTYPE_FP32; /* the precision the config asks for */
    t->elem = dst_dtype_size(t->dt);
    t->count = (size_t)t->micro * S * H;

    /* Weights in group 0 (with weight decay), biases and LayerNorm parameters in group 1 (without). */
    CHECK(dst_engine_get_optimizer(t->engine, &opt));
    no_decay.struct_size = sizeof no_decay;
    CHECK(dst_optimizer_get_group(opt, 0, &no_decay));
    no_decay.weight_decay = 0.0f;
    CHECK(dst_optimizer_add_group(opt, &no_decay, NULL));
    CHECK(dst_layer_config_default(&cfg));
    cfg.hidden_size = H;
    cfg.heads = HEADS;
    cfg.dtype = t->dt;
    cfg.max_batch_tokens = (int64_t)t->micro * S;
    cfg.max_seq_len = S;
    cfg.num_hidden_layers = LAYERS;
    for (i = 0; i < LAYERS; ++i) {
        cfg.seed = seed + (unsigned long long)i;
        CHECK(dst_layer_create(t->ctx, &cfg, &t->layers[i]));
        snprintf(prefix, sizeof prefix, "encoder.layer.%d.", i);
        CHECK(dst_optimizer_add_layer(opt, t->layers[i], prefix, 0, 1));
    }
    for (i = 0; i <= LAYERS; ++i) CHECK(dst_malloc(t->ctx, t->count * t->elem, &t->act[i]));
    CHECK(dst_malloc(t->ctx, t->count * t->elem, &t->dy));
    CHECK(dst_malloc(t->ctx, t->count * t->elem, &t->ga));
    CHECK(dst_malloc(t->ctx, t->count * t->elem, &t->gb));
    t->host = malloc(t->count * 4);
    t->x = malloc(t->count * sizeof(float));
    t->y = malloc(t->count * sizeof(float));
    if (!t->host || !t->x || !t->y) {
        fprintf(stderr, "out of host memory\n");
        goto done;
    }
    CHECK(dst_engine_zero_grads(t->engine)); /* accumulation starts from zero */
    rc = 0;
done:
    return rc;
}

/* Micro-step k: data from a generator seeded with k, loss ½·mean((y − t)²), backward, dst_engine_step. */
static int micro_step(Trainer *t, long k, double *loss) {
    unsigned long long rng = 1000003ULL * (unsigned long long)(k + 1);
    dst_tensor in, out, go, gi;
    size_t i;
    int l, rc = 1;
    void *next;
    for (i = 0; i < t->count; ++i) t->x[i] = next_uniform(&rng);
    from_float(t, t->x);
    CHECK(dst_memcpy(t->ctx, t->act[0], t->host, t->count * t->elem, DST_COPY_HOST_TO_CONTEXT));
    for (l = 0; l < LAYERS; ++l) {
        in = activation(t, t->act[l]);
        out = activation(t, t->act[l + 1]);
        CHECK(dst_layer_forward(t->layers[l], NULL, &in, NULL, &out));
    }
    CHECK(dst_memcpy(t->ctx, t->host, t->act[LAYERS], t->count * t->elem, DST_COPY_CONTEXT_TO_HOST));
    to_float(t, t->y);
    *loss = 0.0;
    for (i = 0; i < t->count; ++i) {
        const size_t h = i % H, token = i - h;
        const float target = 0.5f * t->x[token + (H - 1 - h)];
        const float r = t->y[i] - target;
        *loss += 0.5 * (double)r * r / (double)t->count;
        t->y[i] = r / (float)t->count; /* dL/dy */
    }
    from_float(t, t->y);
    CHECK(dst_memcpy(t->ctx, t->dy, t->host, t->count * t->elem, DST_COPY_HOST_TO_CONTEXT));
    go = activation(t, t->dy);
    /* × loss scale / accumulation steps, on the device: the scale is never read back. */
    CHECK(dst_engine_scale_loss_gradient(t->engine, &go));
    next = t->ga;
    for (l = LAYERS - 1; l >= 0; --l) {
        gi = activation(t, next);
        CHECK(dst_layer_backward(t->layers[l], NULL, &go, &gi, DST_GRAD_ACCUMULATE));
        go = gi;
        next = next == t->ga ? t->gb : t->ga;
    }
    CHECK(dst_engine_step(t->engine));
    rc = 0;
done:
    return rc;
}

/* Trains until `steps` boundary steps; losses[s] receives the mean loss of boundary step s. */
static int train(Trainer *t, int steps, double *losses, const char *ckpt_dir, int save_at, int print) {
    dst_engine_state st;
    double loss, sum = 0.0;
    int n = 0, boundary = 0, rc = 1;
    float lr = 0.0f;
    st.struct_size = sizeof st;
    CHECK(dst_engine_get_state(t->engine, &st));
    while (st.global_steps < steps) {
        CHECK(dst_engine_get_lr(t->engine, 0, &lr));
        CHECK(dst_engine_is_boundary(t->engine, &boundary));
        if (micro_step(t, (long)st.micro_steps, &loss) != 0) goto done;
        sum += loss;
        ++n;
        CHECK(dst_engine_get_state(t->engine, &st)); /* a query: it waits for the device */
        if (!boundary) continue;
        losses[st.global_steps - 1] = sum / n;
        if (print)
            printf("step %2lld  loss %.6f  lr %.2e  loss scale %g%s\n", (long long)st.global_steps, sum / n, (double)lr,
                   (double)st.loss_scale, st.last_step_applied ? "" : "  (overflow: skipped)");
        sum = 0.0;
        n = 0;
        if (ckpt_dir && st.global_steps == save_at) {
            CHECK(dst_engine_save_checkpoint(t->engine, ckpt_dir, NULL, "{\"epoch\": 0, \"note\": \"halfway\"}", 1));
            printf("saved %s/global_step%d\n", ckpt_dir, save_at);
        }
    }
    rc = 0;
done:
    return rc;
}

int main(int argc, char **argv) {
    Trainer a, b;
    double first[STEPS], second[STEPS];
    char *config = NULL, client[128];
    dst_backend backend = DST_BACKEND_AUTO;
    int count = 0, s, rc = 1;
    memset(&a, 0, sizeof a);
    memset(&b, 0, sizeof b);
    if (argc < 3) {
        fprintf(stderr, "usage: %s CONFIG.json CHECKPOINT_DIR [cpu|cuda|auto]\n", argv[0]);
        return 2;
    }
    if (argc > 3 && strcmp(argv[3], "cpu") == 0) backend = DST_BACKEND_CPU;
    if (argc > 3 && strcmp(argv[3], "cuda") == 0) {
        backend = DST_BACKEND_CUDA;
        if (dst_cuda_device_count(&count) != DST_OK || count == 0) {
            printf("no CUDA device: skipped\n");
            return 77;
        }
    }
    config = read_file(argv[1]);
    if (!config) {
        fprintf(stderr, "cannot read %s\n", argv[1]);
        return 1;
    }

    /* 1. Train STEPS optimizer steps, saving a checkpoint at step SAVE_AT. */
    if (trainer_init(&a, backend, config, 7) != 0) goto done;
    printf("libdstransformer %s: %d layers (H=%d), micro-batch %d, %s\n", dst_version_string(), LAYERS, H, a.micro,
           a.dt == DST_DTYPE_FP16 ? "fp16 with dynamic loss scaling" : "fp32");
    if (train(&a, STEPS, first, argv[2], SAVE_AT, 1) != 0) goto done;
    if (!(first[STEPS - 1] < 0.8 * first[0])) {
        fprintf(stderr, "the loss did not fall: %.6f -> %.6f\n", first[0], first[STEPS - 1]);
        goto done;
    }
    printf("loss %.6f -> %.6f\n", first[0], first[STEPS - 1]);

    /* 2. Other weights, then the checkpoint: the last STEPS - SAVE_AT steps must repeat exactly. */
    if (trainer_init(&b, backend, config, 99) != 0) goto done;
    CHECK(dst_engine_load_checkpoint(b.engine, argv[2], NULL, NULL, client, sizeof client, NULL));
    printf("resumed from %s/latest, client state %s\n", argv[2], client);
    if (train(&b, STEPS, second, NULL, 0, 0) != 0) goto done;
    for (s = SAVE_AT; s < STEPS; ++s)
        if (second[s] != first[s]) {
            fprintf(stderr, "step %d: resumed loss %.9g differs from %.9g\n", s + 1, second[s], first[s]);
            goto done;
        }
    printf("resumed run: steps %d-%d identical to the first run\n", SAVE_AT + 1, STEPS);
    rc = 0;

done:
    trainer_free(&a);
    trainer_free(&b);
    free(config);
    return rc;
}
