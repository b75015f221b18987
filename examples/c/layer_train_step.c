/*
 * layer_train_step.c — one training step of a Transformer layer through the C API, on the CPU.
 *
 * Shows: creating a CPU context and a Pre-LN layer (H = 64, 4 heads), a padded batch described by key
 * lengths, a training forward, the gradient of a simple loss, backward, and reading two parameter
 * gradients by name.
 *
 * Build and run (from a build tree): ninja layer_train_step && ./examples/layer_train_step
 * Against an installed library:     cc -std=c99 layer_train_step.c $(pkg-config --cflags --libs dstransformer) -lm
 *
 * Exits with status 1 and prints dst_last_error() when any call fails.
 */
#include <dstransformer/dstransformer.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

/* Prints the failing call and the library's message, then jumps to the cleanup. */
#define CHECK(call)                                                                        \
    do {                                                                                   \
        dst_status st_ = (call);                                                           \
        if (st_ != DST_OK) {                                                               \
            fprintf(stderr, "%s failed: %s: %s\n", #call, dst_status_string(st_),          \
                    dst_last_error());                                                     \
            goto done;                                                                     \
        }                                                                                  \
    } while (0)

/* A small deterministic generator for the example's data (uniform in [-1, 1)). */
static float next_uniform(unsigned long long *state) {
    *state = *state * 6364136223846793005ULL + 1442695040888963407ULL;
    return (float)((*state >> 40) & 0xFFFFFF) / 8388608.0f - 1.0f;
}

static double norm2(const float *v, size_t n) {
    double s = 0.0;
    size_t i;
    for (i = 0; i < n; ++i) s += (double)v[i] * v[i];
    return sqrt(s);
}

int main(void) {
    enum { B = 2, S = 16, H = 64, HEADS = 4 };
    const size_t n = (size_t)B * S * H;
    int rc = 1;
    size_t i;
    unsigned long long rng = 2024;
    dst_context *ctx = NULL;
    dst_layer *layer = NULL;
    dst_layer_config cfg;
    dst_param_info qkvw_info, nw_info;
    float *x = NULL, *y = NULL, *dy = NULL, *dx = NULL, *g_qkvw = NULL, *g_nw = NULL;
    int32_t lengths[B] = {16, 11}; /* the second sequence has 5 padded positions */
    dst_tensor tx, ty, tdy, tdx;
    dst_mask mask;
    double loss = 0.0;

    /* 1. A CPU context with a fixed dropout stream. */
    CHECK(dst_context_create(DST_BACKEND_CPU, 0, &ctx));
    CHECK(dst_context_set_rng_state(ctx, 42, 0));

    /* 2. A Pre-LN layer: defaults, then the fields we need. */
    CHECK(dst_layer_config_default(&cfg));
    cfg.hidden_size = H;
    cfg.heads = HEADS;
    cfg.pre_layer_norm = 1;
    cfg.max_batch_tokens = B * S;
    cfg.max_seq_len = S;
    cfg.num_hidden_layers = 12;
    CHECK(dst_layer_create(ctx, &cfg, &layer));

    /* 3. Input [B, S, H] in fp32 (the layer dtype) and a key-length mask. */
    x = malloc(n * sizeof *x);
    y = malloc(n * sizeof *y);
    dy = malloc(n * sizeof *dy);
    dx = malloc(n * sizeof *dx);
    if (!x || !y || !dy || !dx) {
        fprintf(stderr, "out of host memory\n");
        goto done;
    }
    for (i = 0; i < n; ++i) x[i] = next_uniform(&rng);
    tx.data = x;
    tx.dtype = DST_DTYPE_FP32;
    tx.ndim = 3;
    tx.shape[0] = B;
    tx.shape[1] = S;
    tx.shape[2] = H;
    tx.shape[3] = 0;
    ty = tx;
    ty.data = y;
    tdy = tx;
    tdy.data = dy;
    tdx = tx;
    tdx.data = dx;
    mask.kind = DST_MASK_KEY_LENGTHS;
    mask.tensor.data = lengths;
    mask.tensor.dtype = DST_DTYPE_INT32;
    mask.tensor.ndim = 1;
    mask.tensor.shape[0] = B;
    mask.tensor.shape[1] = mask.tensor.shape[2] = mask.tensor.shape[3] = 0;

    /* 4. Training forward (dropout on; activations kept in the layer's default saved object). */
    CHECK(dst_layer_forward(layer, NULL, &tx, &mask, &ty));

    /* 5. Loss L = ½‖y‖² over the real (unpadded) tokens, so dL/dy = y there and 0 on padding. */
    for (i = 0; i < n; ++i) {
        const size_t token = i / H, b = token / S, s = token % S;
        const int real = (int32_t)s < lengths[b];
        dy[i] = real ? y[i] : 0.0f;
        loss += real ? 0.5 * (double)y[i] * y[i] : 0.0;
    }

    /* 6. Backward: dX and the 12 parameter gradients. */
    CHECK(dst_layer_backward(layer, NULL, &tdy, &tdx, DST_GRAD_WRITE));

    /* 7. Read two gradients by name (the names DeepSpeed checkpoints use, prefixes allowed). */
    CHECK(dst_layer_param_info(layer, DST_PARAM_ATTN_QKVW, &qkvw_info));
    CHECK(dst_layer_param_info(layer, DST_PARAM_ATTN_NW, &nw_info));
    g_qkvw = malloc((size_t)qkvw_info.numel * sizeof *g_qkvw);
    g_nw = malloc((size_t)nw_info.numel * sizeof *g_nw);
    if (!g_qkvw || !g_nw) {
        fprintf(stderr, "out of host memory\n");
        goto done;
    }
    CHECK(dst_layer_get_grad(layer, "bert.encoder.layer.0.attn_qkvw", g_qkvw, DST_DTYPE_FP32, (size_t)qkvw_info.numel));
    CHECK(dst_layer_get_grad(layer, "attn_nw", g_nw, DST_DTYPE_FP32, (size_t)nw_info.numel));

    printf("libdstransformer %s: loss %.6f\n", dst_version_string(), loss);
    printf("  |dL/dx|         = %.6g\n", norm2(dx, n));
    printf("  |dL/d attn_qkvw| = %.6g  (%lld x %lld)\n", norm2(g_qkvw, (size_t)qkvw_info.numel),
           (long long)qkvw_info.shape[0], (long long)qkvw_info.shape[1]);
    printf("  |dL/d attn_nw|   = %.6g  (%lld)\n", norm2(g_nw, (size_t)nw_info.numel), (long long)nw_info.shape[0]);
    if (!(norm2(g_qkvw, (size_t)qkvw_info.numel) > 0.0) || !(norm2(g_nw, (size_t)nw_info.numel) > 0.0)) {
        fprintf(stderr, "unexpected: a gradient is zero or NaN\n");
        goto done;
    }
    rc = 0;

done:
    free(g_nw);
    free(g_qkvw);
    free(dx);
    free(dy);
    free(y);
    free(x);
    dst_layer_destroy(layer);
    dst_context_destroy(ctx);
    return rc;
}
