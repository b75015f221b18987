/*
 * BERT for pre-training on the library's public API. One micro-batch, with N = B·S tokens and M masked
 * tokens (docs/pretrain.md draws the same picture):
 *
 *   e   = embedding_forward(ids, types; word, position, type)            [N, H]
 *   x0  = dropout(layernorm(e; γ_e, β_e), p_hidden)                        (in place)
 *   h   = L × dst_layer_forward(x, key lengths)                            (Pre-LN or Post-LN layers)
 *   h   = layernorm(h; γ_f, β_f)                                           (Pre-LN only: the final LN)
 *   t   = layernorm(GELU(gather(h, masked rows)·W_tᵀ + b_t))               [M, H], the MLM transform
 *   mlm = linear_cross_entropy(t, word, b_dec, labels)                     decoder tied to the word table
 *   nsp = linear_cross_entropy(tanh(h[CLS]·W_pᵀ + b_p), W_n, b_n, next)    (with the NSP head)
 *
 * and backward in reverse, every parameter gradient accumulated (DST_GRAD_ACCUMULATE), so that
 * micro-batches add up and the tied word table collects the decoder's and the embedding's parts; or, in
 * the first micro-batch of a step when the engine leaves the gradients at its boundaries, written
 * (DST_GRAD_WRITE) by its first contribution and accumulated after.
 */
#include "model.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

void dstp_seterr(dstp_error *err, const char *fmt, ...);

/* A library call: on failure the message names the call, the status and the library's reason. */
#define LIB(call)                                                                                           \
    do {                                                                                                    \
        const double t0_ = call_begin();                                                                    \
        const dst_status st_ = (call);                                                                      \
        call_end(t0_, #call, __LINE__);                                                                     \
        if (st_ != DST_OK) {                                                                                \
            dstp_seterr(err, "%s: %s: %s", lib_name(#call), dst_status_string(st_), dst_last_error());     \
            return DSTP_ERR_STATE;                                                                          \
        }                                                                                                   \
    } while (0)

/* The profile whose per-call timing is on (dstp_model_set_profile; one per process), else NULL. A failed
 * synchronisation here is left to the next library call, which reports the context's error. */
static dstp_profile *s_call_profile;

static double call_begin(void) {
    if (!s_call_profile) return 0.0;
    (void)dst_context_synchronize(s_call_profile->ctx);
    return dstp_mono_s();
}

static void call_end(double t0, const char *call, int line) {
    dstp_profile *p = s_call_profile;
    dstp_call_site *site = NULL;
    int k;
    if (!p) return;
    (void)dst_context_synchronize(p->ctx);
    for (k = 0; k < p->num_sites && !site; ++k)
        if (p->sites[k].line == line && p->sites[k].call == call) site = &p->sites[k];
    if (!site && p->num_sites < DSTP_PROFILE_SITES) {
        site = &p->sites[p->num_sites++];
        site->call = call;
        site->line = line;
    }
    if (!site) return;
    site->seconds += dstp_mono_s() - t0;
    ++site->count;
}

/* "dst_layer_forward(...)" -> "dst_layer_forward" */
static const char *lib_name(const char *call) {
    static char buf[64];
    size_t n = strcspn(call, "(");
    if (n >= sizeof buf) n = sizeof buf - 1;
    memcpy(buf, call, n);
    buf[n] = '\0';
    return buf;
}

enum { MAX_PARAMS = 24 };

typedef enum init_kind { INIT_NORMAL, INIT_ZERO, INIT_ONE } init_kind;

/* A tensor the program owns (embeddings, heads, LayerNorms) and its gradient, in context memory. */
typedef struct param {
    const char *name;   /* Hugging Face's name (bing_bert's for the final LayerNorm) */
    int32_t ndim;
    int64_t shape[2];
    int decay;          /* group 0 (weight decay) or group 1 (none) */
    init_kind init;
    void *data, *grad;
    size_t bytes;
} param;

/* Indices of the program's parameters in m->p. */
enum {
    P_WORD, P_POS, P_TYPE, P_EMB_LN_W, P_EMB_LN_B, P_FIN_LN_W, P_FIN_LN_B, P_T_W, P_T_B, P_T_LN_W, P_T_LN_B,
    P_DEC_B, P_POOL_W, P_POOL_B, P_NSP_W, P_NSP_B, P_COUNT
};

struct dstp_model {
    dst_context *ctx;
    dstp_model_config cfg;
    dstp_model_options opt;
    dst_dtype dt, sdt; /* storage, and statistics/loss (fp64 for fp64 data, else fp32) */
    size_t esz;
    int64_t V, H, I, L, P, T;
    dst_layer **layers;
    param p[P_COUNT];
    int present[P_COUNT];  /* Pre-LN has the final LN, NSP the pooler and classifier */
    /* activations and their gradients, [max_batch·seq, H] unless noted */
    /* The batch's int32 arrays: regions of one context block, filled from one host staging block by
     * one copy per micro-batch (each dst_memcpy waits for the copy, so nine copies were nine waits). */
    void *ids, *types, *lengths, *rows, *labels, *cls_rows, *nsp_labels; /* int32 */
    void *emb, *x0, *act[2], *fin, *stats_emb, *stats_fin;               /* stats: fp32 [2, N] */
    void *hm, *t_pre, *t_g, *t_ln, *stats_t;                             /* [M_max, H], stats [2, M_max] */
    void *cls, *p_pre, *pooled;                                          /* [max_batch, H] */
    void *loss, *counts;                                                 /* fp32 [2], int32 [4] */
    void *g_t, *g_t2, *g_hm, *g_pooled, *g_cls, *g_seq, *g_a, *g_b;
    void *cu, *places;   /* packed layers: int32 offsets [B + 1], each real token's row b·S + i [N] */
    int64_t real;        /* the batch's real tokens (the packed rows) */
    void *enc_out;       /* the last layer's output in the padded layout */
    int packed;          /* this batch's layers run packed (opt.layers) */
    void *batch_dev;      /* the block holding ids … places */
    int32_t *batch_host;  /* its host staging copy */
    size_t batch_ints;    /* its size, in int32 */
    int32_t *h_ids, *h_types, *h_lengths, *h_rows, *h_labels, *h_cls_rows, *h_nsp, *h_cu, *h_places; /* regions */
    dstp_profile *prof;                                                  /* NULL: not profiling */
};

/* ---- host helpers --------------------------------------------------------------------------------- */

static uint16_t f32_to_f16(float f) {
    uint32_t x, sign, mant;
    int e;
    memcpy(&x, &f, sizeof x);
    sign = (x >> 16) & 0x8000u;
    mant = x & 0x7FFFFFu;
    e = (int)((x >> 23) & 0xFF) - 127 + 15;
    if (((x >> 23) & 0xFF) == 0xFF) return (uint16_t)(sign | 0x7C00u | (mant ? 0x200u : 0u));
    if (e >= 31) return (uint16_t)(sign | 0x7C00u);
    if (e <= 0) {
        uint32_t r, shift;
        if (e < -10) return (uint16_t)sign;
        mant |= 0x800000u;
        shift = (uint32_t)(14 - e);
        r = mant >> shift;
        if ((mant >> (shift - 1)) & 1u && ((mant & ((1u << (shift - 1)) - 1u)) || (r & 1u))) ++r;
        return (uint16_t)(sign | r);
    }
    {
        uint32_t r = ((uint32_t)e << 10) | (mant >> 13);
        const uint32_t rest = mant & 0x1FFFu;
        if (rest > 0x1000u || (rest == 0x1000u && (r & 1u))) ++r;
        return (uint16_t)(sign | r);
    }
}

static uint16_t f32_to_bf16(float f) {
    uint32_t x;
    memcpy(&x, &f, sizeof x);
    if ((x & 0x7F800000u) == 0x7F800000u && (x & 0x7FFFFFu)) return (uint16_t)((x >> 16) | 0x40u);
    x += 0x7FFFu + ((x >> 16) & 1u);
    return (uint16_t)(x >> 16);
}

static float f16_to_f32(uint16_t h) {
    const uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1Fu, mant = h & 0x3FFu;
    uint32_t x;
    float f;
    if (e == 0) {
        f = (float)mant / 16777216.0f;
        return sign ? -f : f;
    }
    x = e == 31 ? (sign | 0x7F800000u | (mant << 13)) : (sign | ((e + 112u) << 23) | (mant << 13));
    memcpy(&f, &x, sizeof f);
    return f;
}

static float bf16_to_f32(uint16_t b) {
    const uint32_t x = (uint32_t)b << 16;
    float f;
    memcpy(&f, &x, sizeof f);
    return f;
}

/* Host values (float) into a buffer of dtype dt. */
static void pack(dst_dtype dt, const float *src, void *dst, size_t n) {
    size_t i;
    for (i = 0; i < n; ++i) {
        switch (dt) {
        case DST_DTYPE_FP16: ((uint16_t *)dst)[i] = f32_to_f16(src[i]); break;
        case DST_DTYPE_BF16: ((uint16_t *)dst)[i] = f32_to_bf16(src[i]); break;
        case DST_DTYPE_FP64: ((double *)dst)[i] = src[i]; break;
        default: ((float *)dst)[i] = src[i]; break;
        }
    }
}

static float unpack1(dst_dtype dt, const void *src, size_t i) {
    switch (dt) {
    case DST_DTYPE_FP16: return f16_to_f32(((const uint16_t *)src)[i]);
    case DST_DTYPE_BF16: return bf16_to_f32(((const uint16_t *)src)[i]);
    case DST_DTYPE_FP64: return (float)((const double *)src)[i];
    default: return ((const float *)src)[i];
    }
}

static dst_tensor view(void *data, dst_dtype dt, int ndim, int64_t d0, int64_t d1, int64_t d2) {
    dst_tensor t;
    memset(&t, 0, sizeof t);
    t.data = data;
    t.dtype = dt;
    t.ndim = ndim;
    t.shape[0] = d0;
    t.shape[1] = d1;
    t.shape[2] = d2;
    return t;
}

static dst_tensor pview(const dstp_model *m, const param *p, int grad) {
    return view(grad ? p->grad : p->data, m->dt, p->ndim, p->shape[0], p->shape[1], 0);
}

static dstp_status zero_bytes(dstp_model *m, void *dst, size_t n, dstp_error *err);

/* ---- creation ----------------------------------------------------------------------------------------- */

static void def(dstp_model *m, int i, const char *name, int ndim, int64_t d0, int64_t d1, int decay, init_kind init) {
    param *p = &m->p[i];
    p->name = name;
    p->ndim = ndim;
    p->shape[0] = d0;
    p->shape[1] = ndim > 1 ? d1 : 0;
    p->decay = decay;
    p->init = init;
    p->bytes = (size_t)d0 * (size_t)(ndim > 1 ? d1 : 1) * m->esz;
    m->present[i] = 1;
}

static dstp_status alloc(dstp_model *m, size_t bytes, void **out, dstp_error *err) {
    LIB(dst_malloc(m->ctx, bytes, out));
    return DSTP_OK;
}

/* Initial values of one parameter: Box-Muller normals from splitmix64 (seed, parameter index). */
static dstp_status init_param(dstp_model *m, int i, dstp_error *err) {
    param *p = &m->p[i];
    const size_t n = p->bytes / m->esz;
    float *v = (float *)malloc(n * sizeof *v);
    void *packed = malloc(p->bytes);
    size_t k;
    dstp_rng rng;
    if (!v || !packed) {
        free(v);
        free(packed);
        dstp_seterr(err, "model: out of host memory");
        return DSTP_ERR_NOMEM;
    }
    dstp_rng_seed(&rng, m->opt.seed, 0x1A17ull + (uint64_t)i);
    for (k = 0; k < n; ++k) {
        if (p->init == INIT_NORMAL) {
            const double u1 = dstp_rng_uniform(&rng), u2 = dstp_rng_uniform(&rng);
            v[k] = (float)((double)m->cfg.initializer_range * sqrt(-2.0 * log(1.0 - u1)) * cos(6.283185307179586 * u2));
        } else {
            v[k] = p->init == INIT_ONE ? 1.0f : 0.0f;
        }
    }
    if (i == P_WORD && m->cfg.pad_token_id < m->V) /* Hugging Face zeroes the padding row */
        memset(v + (size_t)m->cfg.pad_token_id * (size_t)m->H, 0, (size_t)m->H * sizeof *v);
    pack(m->dt, v, packed, n);
    free(v);
    if (dst_memcpy(m->ctx, p->data, packed, p->bytes, DST_COPY_HOST_TO_CONTEXT) != DST_OK) {
        dstp_seterr(err, "dst_memcpy: %s", dst_last_error());
        free(packed);
        return DSTP_ERR_STATE;
    }
    free(packed);
    return DSTP_OK;
}

const dstp_model_config *dstp_model_get_config(const dstp_model *m) { return &m->cfg; }

int64_t dstp_model_num_parameters(const dstp_model *m) {
    int64_t n = 0;
    int i, l;
    for (i = 0; i < P_COUNT; ++i)
        if (m->present[i]) n += (int64_t)(m->p[i].bytes / m->esz);
    for (l = 0; l < m->L; ++l) {
        int q;
        for (q = 0; q < DST_PARAM_COUNT; ++q) {
            dst_param_info info;
            if (dst_layer_param_info(m->layers[l], (dst_param)q, &info) == DST_OK) n += info.numel;
        }
    }
    return n;
}

void dstp_model_destroy(dstp_model *m) {
    int i;
    if (!m) return;  /* before the addresses below are taken */
    void **bufs[] = {&m->batch_dev, &m->emb, &m->x0,    &m->act[0],  &m->act[1], &m->fin,   &m->stats_emb,
                     &m->stats_fin, &m->hm,  &m->t_pre, &m->t_g,     &m->t_ln,   &m->stats_t, &m->cls,
                     &m->p_pre,  &m->pooled, &m->loss, &m->counts, &m->g_t,    &m->g_t2,   &m->g_hm,
                     &m->g_pooled, &m->g_cls, &m->g_seq, &m->g_a,  &m->g_b};
    for (i = 0; i < (int)(sizeof bufs / sizeof bufs[0]); ++i) dst_free(m->ctx, *bufs[i]);
    for (i = 0; i < P_COUNT; ++i) {
        dst_free(m->ctx, m->p[i].data);
        dst_free(m->ctx, m->p[i].grad);
    }
    for (i = 0; m->layers && i < m->L; ++i) dst_layer_destroy(m->layers[i]);
    free(m->layers);
    free(m->batch_host);
    free(m);
}

static dstp_status create(dstp_model *m, dstp_error *err) {
    const dstp_model_config *c = &m->cfg;
    const int64_t B = m->opt.max_batch, S = m->opt.seq, N = B * S, H = m->H, Mx = B * m->opt.max_pred;
    const size_t act = (size_t)N * (size_t)H * m->esz, rows = (size_t)Mx * (size_t)H * m->esz;
    const size_t cls = (size_t)B * (size_t)H * m->esz;
    dst_layer_config lc;
    int i;
    def(m, P_WORD, "bert.embeddings.word_embeddings.weight", 2, m->V, H, 1, INIT_NORMAL);
    def(m, P_POS, "bert.embeddings.position_embeddings.weight", 2, m->P, H, 1, INIT_NORMAL);
    def(m, P_TYPE, "bert.embeddings.token_type_embeddings.weight", 2, m->T, H, 1, INIT_NORMAL);
    def(m, P_EMB_LN_W, "bert.embeddings.LayerNorm.weight", 1, H, 0, 0, INIT_ONE);
    def(m, P_EMB_LN_B, "bert.embeddings.LayerNorm.bias", 1, H, 0, 0, INIT_ZERO);
    if (c->pre_layer_norm) {
        def(m, P_FIN_LN_W, "bert.encoder.FinalLayerNorm.weight", 1, H, 0, 0, INIT_ONE);
        def(m, P_FIN_LN_B, "bert.encoder.FinalLayerNorm.bias", 1, H, 0, 0, INIT_ZERO);
    }
    def(m, P_T_W, "cls.predictions.transform.dense.weight", 2, H, H, 1, INIT_NORMAL);
    def(m, P_T_B, "cls.predictions.transform.dense.bias", 1, H, 0, 0, INIT_ZERO);
    def(m, P_T_LN_W, "cls.predictions.transform.LayerNorm.weight", 1, H, 0, 0, INIT_ONE);
    def(m, P_T_LN_B, "cls.predictions.transform.LayerNorm.bias", 1, H, 0, 0, INIT_ZERO);
    def(m, P_DEC_B, "cls.predictions.bias", 1, m->V, 0, 0, INIT_ZERO);
    if (c->next_sentence_prediction) {
        def(m, P_POOL_W, "bert.pooler.dense.weight", 2, H, H, 1, INIT_NORMAL);
        def(m, P_POOL_B, "bert.pooler.dense.bias", 1, H, 0, 0, INIT_ZERO);
        def(m, P_NSP_W, "cls.seq_relationship.weight", 2, 2, H, 1, INIT_NORMAL);
        def(m, P_NSP_B, "cls.seq_relationship.bias", 1, 2, 0, 0, INIT_ZERO);
    }
    for (i = 0; i < P_COUNT; ++i) {
        if (!m->present[i]) continue;
        if (alloc(m, m->p[i].bytes, &m->p[i].data, err) || alloc(m, m->p[i].bytes, &m->p[i].grad, err) ||
            init_param(m, i, err))
            return DSTP_ERR_STATE;
    }

    /* The layers: DeepSpeed's config fields from the model configuration. */
    LIB(dst_layer_config_default(&lc));
    lc.hidden_size = (int32_t)H;
    lc.heads = c->num_attention_heads;
    lc.intermediate_size = c->intermediate_size;
    lc.attn_dropout_ratio = c->attention_probs_dropout_prob;
    lc.hidden_dropout_ratio = c->hidden_dropout_prob;
    lc.num_hidden_layers = c->num_hidden_layers;
    lc.initializer_range = c->initializer_range;
    lc.layer_norm_eps = c->layer_norm_eps;
    lc.pre_layer_norm = c->pre_layer_norm;
    lc.normalize_invertible = c->normalize_invertible;
    lc.gelu_checkpoint = c->gelu_checkpoint;
    lc.attn_dropout_checkpoint = c->attn_dropout_checkpoint;
    lc.dtype = m->dt;
    lc.max_batch_tokens = N;
    lc.max_seq_len = (int32_t)S;
    lc.gelu = c->gelu_tanh ? DST_GELU_TANH : DST_GELU_ERF;
    m->layers = (dst_layer **)calloc((size_t)m->L, sizeof *m->layers);
    if (!m->layers) {
        dstp_seterr(err, "model: out of host memory");
        return DSTP_ERR_NOMEM;
    }
    for (i = 0; i < m->L; ++i) {
        lc.seed = m->opt.seed * 1000u + (uint64_t)i;
        LIB(dst_layer_create(m->ctx, &lc, &m->layers[i]));
    }

    /* The batch block: each region starts on 256 bytes (64 int32). */
    {
        const size_t sizes[9] = {(size_t)N, (size_t)N, (size_t)B, (size_t)B, (size_t)Mx, (size_t)Mx, (size_t)B,
                                 (size_t)B + 1, (size_t)N};
        size_t at[9], total = 0;
        for (i = 0; i < 9; ++i) {
            at[i] = total;
            total += (sizes[i] + 63) / 64 * 64;
        }
        m->batch_ints = total;
        m->batch_host = (int32_t *)calloc(total, sizeof(int32_t));
        if (!m->batch_host) {
            dstp_seterr(err, "model: out of host memory");
            return DSTP_ERR_NOMEM;
        }
        if (alloc(m, total * sizeof(int32_t), &m->batch_dev, err)) return DSTP_ERR_STATE;
        {
            int32_t *const d = (int32_t *)m->batch_dev, *const h = m->batch_host;
            m->ids = d + at[0], m->h_ids = h + at[0];
            m->types = d + at[1], m->h_types = h + at[1];
            m->lengths = d + at[2], m->h_lengths = h + at[2];
            m->nsp_labels = d + at[3], m->h_nsp = h + at[3];
            m->rows = d + at[4], m->h_rows = h + at[4];
            m->labels = d + at[5], m->h_labels = h + at[5];
            m->cls_rows = d + at[6], m->h_cls_rows = h + at[6];
            m->cu = d + at[7], m->h_cu = h + at[7];
            m->places = d + at[8], m->h_places = h + at[8];
        }
    }
    /* Activations. */
    if (alloc(m, act, &m->emb, err) || alloc(m, act, &m->x0, err) ||
        alloc(m, act, &m->act[0], err) || alloc(m, act, &m->act[1], err) || alloc(m, act, &m->fin, err) ||
        alloc(m, (size_t)(2 * N) * 8, &m->stats_emb, err) || alloc(m, (size_t)(2 * N) * 8, &m->stats_fin, err) ||
        alloc(m, rows, &m->hm, err) || alloc(m, rows, &m->t_pre, err) || alloc(m, rows, &m->t_g, err) ||
        alloc(m, rows, &m->t_ln, err) || alloc(m, (size_t)(2 * Mx) * 8, &m->stats_t, err) ||
        alloc(m, cls, &m->cls, err) || alloc(m, cls, &m->p_pre, err) || alloc(m, cls, &m->pooled, err) ||
        alloc(m, 16, &m->loss, err) || alloc(m, 16, &m->counts, err) || alloc(m, rows, &m->g_t, err) ||
        alloc(m, rows, &m->g_t2, err) || alloc(m, rows, &m->g_hm, err) || alloc(m, cls, &m->g_pooled, err) ||
        alloc(m, cls, &m->g_cls, err) || alloc(m, act, &m->g_seq, err) || alloc(m, act, &m->g_a, err) ||
        alloc(m, act, &m->g_b, err))
        return DSTP_ERR_STATE;
    return DSTP_OK;
}

dstp_status dstp_model_create(dst_context *ctx, const dstp_model_config *cfg, const dstp_model_options *opt,
                              dstp_model **out, dstp_error *err) {
    dstp_model *m;
    dstp_status st;
    if (opt->seq < 2 || opt->seq > cfg->max_position_embeddings) {
        dstp_seterr(err, "model: the sequence length %d must be in [2, max_position_embeddings = %d]", (int)opt->seq,
                    (int)cfg->max_position_embeddings);
        return DSTP_ERR_ARG;
    }
    if (opt->max_batch < 1 || opt->max_pred < 1 || cfg->vocab_size < 1) {
        dstp_seterr(err, "model: batch %d, max_pred %d and vocab_size %d must be >= 1", (int)opt->max_batch,
                    (int)opt->max_pred, (int)cfg->vocab_size);
        return DSTP_ERR_ARG;
    }
    m = (dstp_model *)calloc(1, sizeof *m);
    if (!m) {
        dstp_seterr(err, "model: out of host memory");
        return DSTP_ERR_NOMEM;
    }
    m->ctx = ctx;
    m->cfg = *cfg;
    m->opt = *opt;
    m->dt = opt->dtype;
    m->sdt = opt->dtype == DST_DTYPE_FP64 ? DST_DTYPE_FP64 : DST_DTYPE_FP32;
    m->esz = dst_dtype_size(opt->dtype);
    m->V = cfg->vocab_size;
    m->H = cfg->hidden_size;
    m->I = cfg->intermediate_size;
    m->L = cfg->num_hidden_layers;
    m->P = cfg->max_position_embeddings;
    m->T = cfg->type_vocab_size;
    st = create(m, err);
    if (st != DSTP_OK) {
        dstp_model_destroy(m);
        return st;
    }
    *out = m;
    return DSTP_OK;
}

int dstp_model_tensors(const dstp_model *m, dstp_model_tensor *out, int cap) {
    int n = 0, i, l, q;
    for (i = 0; i < P_COUNT; ++i) {
        if (!m->present[i]) continue;
        if (n < cap) {
            snprintf(out[n].name, sizeof out[n].name, "%s", m->p[i].name);
            out[n].param = pview(m, &m->p[i], 0);
            out[n].grad = pview(m, &m->p[i], 1);
        }
        ++n;
    }
    for (l = 0; l < m->L; ++l) {
        void *pa = NULL, *ga = NULL;
        dst_layer_param_arena(m->layers[l], &pa);
        dst_layer_grad_arena(m->layers[l], &ga);
        for (q = 0; q < DST_PARAM_COUNT; ++q) {
            dst_param_info info;
            if (dst_layer_param_info(m->layers[l], (dst_param)q, &info) != DST_OK) continue;
            if (n < cap) {
                snprintf(out[n].name, sizeof out[n].name, "bert.encoder.layer.%d.%s", l, info.name);
                out[n].param = view((char *)pa + info.offset_bytes, m->dt, info.ndim, info.shape[0], info.shape[1], 0);
                out[n].grad = view((char *)ga + info.offset_bytes, m->dt, info.ndim, info.shape[0], info.shape[1], 0);
            }
            ++n;
        }
    }
    return n;
}

dstp_status dstp_model_zero_grads(dstp_model *m, dstp_error *err) {
    int i;
    for (i = 0; i < P_COUNT; ++i)
        if (m->present[i] && zero_bytes(m, m->p[i].grad, m->p[i].bytes, err) != DSTP_OK) return DSTP_ERR_STATE;
    for (i = 0; i < m->L; ++i) LIB(dst_layer_zero_grads(m->layers[i]));
    return DSTP_OK;
}

dstp_status dstp_model_register(dstp_model *m, dst_engine *engine, dstp_error *err) {
    dst_optimizer *opt = NULL;
    dst_param_group g;
    int i, group = 0;
    char prefix[64];
    LIB(dst_engine_get_optimizer(engine, &opt));
    LIB(dst_param_group_default(&g));
    LIB(dst_optimizer_get_group(opt, 0, &g));
    g.weight_decay = 0.0f;
    LIB(dst_optimizer_add_group(opt, &g, &group));
    /* In the order of the model's named_parameters(): embeddings, layers, final LN, heads. */
    for (i = 0; i <= P_EMB_LN_B; ++i) {
        const dst_tensor pv = pview(m, &m->p[i], 0), gv = pview(m, &m->p[i], 1);
        LIB(dst_optimizer_add_tensor(opt, m->p[i].decay ? 0 : group, m->p[i].name, &pv, &gv));
    }
    for (i = 0; i < m->L; ++i) {
        snprintf(prefix, sizeof prefix, "bert.encoder.layer.%d.", i);
        LIB(dst_optimizer_add_layer(opt, m->layers[i], prefix, 0, group));
    }
    for (i = P_EMB_LN_B + 1; i < P_COUNT; ++i) {
        dst_tensor pv, gv;
        if (!m->present[i]) continue;
        pv = pview(m, &m->p[i], 0);
        gv = pview(m, &m->p[i], 1);
        LIB(dst_optimizer_add_tensor(opt, m->p[i].decay ? 0 : group, m->p[i].name, &pv, &gv));
    }
    LIB(dst_engine_zero_grads(engine));
    return DSTP_OK;
}

/* ---- forward and backward ----------------------------------------------------------------------------- */

static dstp_status upload_batch_block(dstp_model *m, dstp_error *err) {
    LIB(dst_memcpy(m->ctx, m->batch_dev, m->batch_host, m->batch_ints * sizeof(int32_t), DST_COPY_HOST_TO_CONTEXT));
    return DSTP_OK;
}

/* ---- profiling ------------------------------------------------------------------------------------ */

dstp_status dstp_profile_start(dstp_profile *p, dst_context *ctx, dstp_error *err) {
    memset(p, 0, sizeof *p);
    p->ctx = ctx;
    LIB(dst_context_synchronize(ctx));
    p->mark = dstp_mono_s();
    return DSTP_OK;
}

dstp_status dstp_profile_lap(dstp_profile *p, dstp_phase phase, dstp_error *err) {
    double t;
    if (!p) return DSTP_OK;
    if ((int)phase < 0 || phase >= DSTP_PHASE_COUNT) {
        dstp_seterr(err, "profile: phase %d, expected 0..%d", (int)phase, DSTP_PHASE_COUNT - 1);
        return DSTP_ERR_ARG;
    }
    LIB(dst_context_synchronize(p->ctx));
    t = dstp_mono_s();
    p->seconds[phase] += t - p->mark;
    p->mark = t;
    return DSTP_OK;
}

const char *dstp_phase_name(dstp_phase phase) {
    static const char *const names[DSTP_PHASE_COUNT] = {"data", "embeddings_head", "layers", "comm", "optimizer", "other"};
    return (int)phase >= 0 && phase < DSTP_PHASE_COUNT ? names[phase] : "?";
}

void dstp_model_set_profile(dstp_model *m, dstp_profile *p) {
    m->prof = p;
    s_call_profile = p && p->per_call ? p : NULL;
}

void dstp_profile_reset_calls(dstp_profile *p) {
    int k;
    for (k = 0; k < p->num_sites; ++k) p->sites[k].seconds = 0.0, p->sites[k].count = 0;
}

void dstp_profile_print_calls(const dstp_profile *p, long long steps, int top, FILE *f) {
    int order[DSTP_PROFILE_SITES], n = p->num_sites, i, j;
    double sum = 0.0;
    if (steps <= 0 || n == 0) return;
    for (i = 0; i < n; ++i) order[i] = i, sum += p->sites[i].seconds;
    for (i = 1; i < n; ++i) /* insertion sort, costliest first */
        for (j = i; j > 0 && p->sites[order[j]].seconds > p->sites[order[j - 1]].seconds; --j) {
            const int t = order[j];
            order[j] = order[j - 1];
            order[j - 1] = t;
        }
    fprintf(f, "profile calls: %d sites, %.2f ms per step in all over steps 2-%lld (each call synchronised before and "
            "after):\n", n, 1e3 * sum / (double)steps, steps + 1);
    for (i = 0; i < n && i < top; ++i) {
        const dstp_call_site *s = &p->sites[order[i]];
        fprintf(f, "  %9.3f ms/step %7.1f calls/step  %s (model.c:%d)\n", 1e3 * s->seconds / (double)steps,
                (double)s->count / (double)steps, lib_name(s->call), s->line);
    }
}

#define LAP(phase)                                                                                          \
    do {                                                                                                    \
        if (dstp_profile_lap(m->prof, (phase), err) != DSTP_OK) return DSTP_ERR_STATE;                      \
    } while (0)

/* The batch into context memory; the [CLS] rows are b·S. */
static dstp_status upload(dstp_model *m, const dstp_batch *b, dstp_error *err) {
    const size_t N = (size_t)b->batch * (size_t)b->seq;
    int32_t i;
    if (b->batch < 1 || b->batch > m->opt.max_batch || b->seq != m->opt.seq || b->nrows > m->opt.max_batch * m->opt.max_pred) {
        dstp_seterr(err, "model: a batch of %d sequences of %d with %d masked tokens does not fit the model's %d x %d (max_pred %d)",
                    (int)b->batch, (int)b->seq, (int)b->nrows, (int)m->opt.max_batch, (int)m->opt.seq, (int)m->opt.max_pred);
        return DSTP_ERR_ARG;
    }
    for (i = 0; i < b->batch; ++i)
        if (b->lengths[i] < 1 || b->lengths[i] > b->seq) {
            dstp_seterr(err, "model: sequence %d of the batch has length %d (expected 1..%d)", (int)i, (int)b->lengths[i],
                        (int)b->seq);
            return DSTP_ERR_ARG;
        }
    memcpy(m->h_ids, b->ids, N * sizeof(int32_t));
    memcpy(m->h_types, b->types, N * sizeof(int32_t));
    memcpy(m->h_lengths, b->lengths, (size_t)b->batch * sizeof(int32_t));
    memcpy(m->h_nsp, b->nsp, (size_t)b->batch * sizeof(int32_t));
    if (b->nrows > 0) {
        memcpy(m->h_rows, b->rows, (size_t)b->nrows * sizeof(int32_t));
        memcpy(m->h_labels, b->labels, (size_t)b->nrows * sizeof(int32_t));
    }
    for (i = 0; i < b->batch; ++i) m->h_cls_rows[i] = i * b->seq;
    /* Packed layers: the offsets of the real tokens, and each one's padded row. */
    m->real = 0;
    m->h_cu[0] = 0;
    for (i = 0; i < b->batch; ++i) m->h_cu[i + 1] = m->h_cu[i] + b->lengths[i];
    for (i = 0; i < b->batch; ++i) {
        int32_t s;
        for (s = 0; s < b->lengths[i]; ++s) m->h_places[m->real++] = i * b->seq + s;
    }
    m->packed = m->opt.layers == DSTP_LAYERS_PACKED ||
                (m->opt.layers == DSTP_LAYERS_AUTO && m->real * 10 <= (int64_t)b->batch * b->seq * 9);
    return upload_batch_block(m, err);
}

/* Writes zeros into n bytes of context memory (a gradient no op wrote). */
static dstp_status zero_bytes(dstp_model *m, void *dst, size_t n, dstp_error *err) {
    void *z = calloc(1, n);
    dst_status st;
    if (!z) {
        dstp_seterr(err, "model: out of host memory");
        return DSTP_ERR_NOMEM;
    }
    st = dst_memcpy(m->ctx, dst, z, n, DST_COPY_HOST_TO_CONTEXT);
    free(z);
    if (st != DST_OK) {
        dstp_seterr(err, "dst_memcpy: %s", dst_last_error());
        return DSTP_ERR_STATE;
    }
    return DSTP_OK;
}

/* The loss a cross-entropy call wrote at byte `at` of the loss buffer (fp32, or fp64 for fp64 data). */
static double loss_at(const dstp_model *m, const unsigned char *buf, size_t at) {
    if (m->sdt == DST_DTYPE_FP64) {
        double d;
        memcpy(&d, buf + at, sizeof d);
        return d;
    } else {
        float f;
        memcpy(&f, buf + at, sizeof f);
        return f;
    }
}

static dstp_status read_results(dstp_model *m, const dstp_batch *b, int mlm, int nsp, dstp_result *r, dstp_error *err) {
    unsigned char loss[16];
    int32_t counts[4] = {0, 0, 0, 0};
    int32_t i;
    LIB(dst_memcpy(m->ctx, loss, m->loss, sizeof loss, DST_COPY_CONTEXT_TO_HOST));
    LIB(dst_memcpy(m->ctx, counts, m->counts, sizeof counts, DST_COPY_CONTEXT_TO_HOST));
    memset(r, 0, sizeof *r);
    if (mlm) {
        r->mlm_loss = loss_at(m, loss, 0);
        r->mlm_n = counts[0];
        r->mlm_hits = counts[1];
    }
    if (nsp) {
        r->nsp_loss = loss_at(m, loss, 8);
        r->nsp_n = counts[2];
        r->nsp_hits = counts[3];
    }
    r->sequences = b->batch;
    for (i = 0; i < b->batch; ++i) r->tokens += b->lengths[i];
    return DSTP_OK;
}

/* Forward through the encoder; *seq receives the sequence output [N, H]. */
static dstp_status encode(dstp_model *m, const dstp_batch *b, int train, uint64_t *drop_seed, uint64_t *drop_off,
                          void **seq, dstp_error *err) {
    const int64_t B = b->batch, S = b->seq, N = B * S, H = m->H;
    const dst_tensor ids = view(m->ids, DST_DTYPE_INT32, 2, B, S, 0), types = view(m->types, DST_DTYPE_INT32, 2, B, S, 0);
    const dst_tensor word = pview(m, &m->p[P_WORD], 0), pos = pview(m, &m->p[P_POS], 0), type = pview(m, &m->p[P_TYPE], 0);
    const dst_tensor lnw = pview(m, &m->p[P_EMB_LN_W], 0), lnb = pview(m, &m->p[P_EMB_LN_B], 0);
    dst_tensor e = view(m->emb, m->dt, 3, B, S, H), x0 = view(m->x0, m->dt, 3, B, S, H);
    dst_tensor st = view(m->stats_emb, m->sdt, 2, 2, N, 0);
    dst_mask mask;
    void *in = m->x0;
    int l;
    LIB(dst_embedding_forward(m->ctx, &ids, &types, &word, &pos, &type, &e));
    LIB(dst_layernorm_forward(m->ctx, &e, &lnw, &lnb, m->cfg.layer_norm_eps, &x0, train ? &st : NULL));
    if (train) LIB(dst_dropout_forward(m->ctx, &x0, m->cfg.hidden_dropout_prob, &x0, drop_seed, drop_off));
    if (train) LAP(DSTP_PHASE_EMBED_HEAD);
    memset(&mask, 0, sizeof mask);
    mask.kind = DST_MASK_KEY_LENGTHS;
    mask.tensor = view(m->lengths, DST_DTYPE_INT32, 1, B, 0, 0);
    if (m->packed) { /* the real tokens into act[1]; x0 is free again after this */
        const dst_tensor places = view(m->places, DST_DTYPE_INT32, 1, m->real, 0, 0), xp = view(m->x0, m->dt, 2, N, H, 0);
        dst_tensor xs = view(m->act[1], m->dt, 2, m->real, H, 0);
        LIB(dst_gather_rows(m->ctx, &xp, &places, &xs));
        in = m->act[1];
    }
    for (l = 0; l < m->L; ++l) {
        LIB(dst_layer_set_training(m->layers[l], train));
        if (!m->packed) {
            const dst_tensor x = view(in, m->dt, 3, B, S, H);
            dst_tensor y = view(m->act[l % 2], m->dt, 3, B, S, H);
            LIB(dst_layer_forward(m->layers[l], NULL, &x, &mask, &y));
        } else {
            const dst_tensor x = view(in, m->dt, 2, m->real, H, 0), cu = view(m->cu, DST_DTYPE_INT32, 1, B + 1, 0, 0);
            dst_tensor y = view(m->act[l % 2], m->dt, 2, m->real, H, 0);
            LIB(dst_layer_forward_packed(m->layers[l], NULL, &x, &cu, S, &y));
        }
        in = m->act[l % 2];
    }
    if (m->packed) { /* back to the padded layout (padding rows zero), in x0 */
        const dst_tensor places = view(m->places, DST_DTYPE_INT32, 1, m->real, 0, 0);
        const dst_tensor ys = view(in, m->dt, 2, m->real, H, 0);
        dst_tensor yp = view(m->x0, m->dt, 2, N, H, 0);
        LIB(dst_scatter_rows(m->ctx, &ys, &places, &yp, DST_GRAD_WRITE));
        in = m->x0;
    }
    m->enc_out = in;
    if (train) LAP(DSTP_PHASE_LAYERS);
    if (m->cfg.pre_layer_norm) {
        const dst_tensor x = view(in, m->dt, 3, B, S, H), w = pview(m, &m->p[P_FIN_LN_W], 0), bb = pview(m, &m->p[P_FIN_LN_B], 0);
        dst_tensor y = view(m->fin, m->dt, 3, B, S, H), fs = view(m->stats_fin, m->sdt, 2, 2, N, 0);
        LIB(dst_layernorm_forward(m->ctx, &x, &w, &bb, m->cfg.layer_norm_eps, &y, train ? &fs : NULL));
        in = m->fin;
    }
    *seq = in;
    return DSTP_OK;
}

/* The heads on the sequence output, forward (and, when train, the fused loss gradients). */
static dstp_status heads(dstp_model *m, const dstp_batch *b, void *seq, int train, float gs, dst_grad_mode acc,
                         dstp_error *err) {
    const int64_t B = b->batch, N = B * b->seq, H = m->H, M = b->nrows;
    const dst_tensor h = view(seq, m->dt, 2, N, H, 0);
    if (M > 0) {
        const dst_tensor rows = view(m->rows, DST_DTYPE_INT32, 1, M, 0, 0), labels = view(m->labels, DST_DTYPE_INT32, 1, M, 0, 0);
        const dst_tensor tw = pview(m, &m->p[P_T_W], 0), tb = pview(m, &m->p[P_T_B], 0);
        const dst_tensor lw = pview(m, &m->p[P_T_LN_W], 0), lb = pview(m, &m->p[P_T_LN_B], 0);
        const dst_tensor word = pview(m, &m->p[P_WORD], 0), db = pview(m, &m->p[P_DEC_B], 0);
        dst_tensor dword = pview(m, &m->p[P_WORD], 1), ddb = pview(m, &m->p[P_DEC_B], 1);
        dst_tensor hm = view(m->hm, m->dt, 2, M, H, 0), tp = view(m->t_pre, m->dt, 2, M, H, 0);
        dst_tensor tg = view(m->t_g, m->dt, 2, M, H, 0), tl = view(m->t_ln, m->dt, 2, M, H, 0);
        dst_tensor ts = view(m->stats_t, m->sdt, 2, 2, M, 0);
        dst_tensor loss = view(m->loss, m->sdt, 1, 1, 0, 0), counts = view(m->counts, DST_DTYPE_INT32, 1, 2, 0, 0);
        dst_tensor dtl = view(m->g_t, m->dt, 2, M, H, 0);
        LIB(dst_gather_rows(m->ctx, &h, &rows, &hm));
        LIB(dst_dense_forward(m->ctx, &hm, &tw, &tb, m->cfg.gelu_tanh ? DST_ACTIVATION_GELU_TANH : DST_ACTIVATION_GELU_ERF,
                              &tg, &tp));
        LIB(dst_layernorm_forward(m->ctx, &tg, &lw, &lb, m->cfg.layer_norm_eps, &tl, train ? &ts : NULL));
        LIB(dst_linear_cross_entropy(m->ctx, &tl, NULL, &word, &db, &labels, gs, &loss, &counts, train ? &dtl : NULL,
                                     train ? &dword : NULL, train ? &ddb : NULL, acc));
    }
    if (m->cfg.next_sentence_prediction) {
        const dst_tensor crow = view(m->cls_rows, DST_DTYPE_INT32, 1, B, 0, 0), nl = view(m->nsp_labels, DST_DTYPE_INT32, 1, B, 0, 0);
        const dst_tensor pw = pview(m, &m->p[P_POOL_W], 0), pb = pview(m, &m->p[P_POOL_B], 0);
        const dst_tensor nw = pview(m, &m->p[P_NSP_W], 0), nb = pview(m, &m->p[P_NSP_B], 0);
        dst_tensor dnw = pview(m, &m->p[P_NSP_W], 1), dnb = pview(m, &m->p[P_NSP_B], 1);
        dst_tensor cls = view(m->cls, m->dt, 2, B, H, 0), pp = view(m->p_pre, m->dt, 2, B, H, 0);
        dst_tensor pooled = view(m->pooled, m->dt, 2, B, H, 0), dpooled = view(m->g_pooled, m->dt, 2, B, H, 0);
        dst_tensor loss = view((char *)m->loss + 8, m->sdt, 1, 1, 0, 0);
        dst_tensor counts = view((char *)m->counts + 8, DST_DTYPE_INT32, 1, 2, 0, 0);
        LIB(dst_gather_rows(m->ctx, &h, &crow, &cls));
        LIB(dst_dense_forward(m->ctx, &cls, &pw, &pb, DST_ACTIVATION_TANH, &pooled, &pp));
        LIB(dst_linear_cross_entropy(m->ctx, &pooled, NULL, &nw, &nb, &nl, gs, &loss, &counts, train ? &dpooled : NULL,
                                     train ? &dnw : NULL, train ? &dnb : NULL, acc));
    }
    return DSTP_OK;
}

/* The gradients of the program's parameters in `which` (those present) to the hook. */
static dstp_status bucket(dstp_model *m, const dstp_grad_hook *hook, const int *which, int n, dstp_error *err) {
    dst_tensor g[P_COUNT];
    int k, c = 0;
    if (!hook || !hook->ready) return DSTP_OK;
    for (k = 0; k < n; ++k)
        if (m->present[which[k]]) g[c++] = pview(m, &m->p[which[k]], 1);
    return c ? hook->ready(hook->user, g, c, err) : DSTP_OK;
}

/* Layer l's gradient arena, as one tensor, to the hook. */
static dstp_status layer_bucket(dstp_model *m, const dstp_grad_hook *hook, int l, dstp_error *err) {
    void *ga = NULL;
    size_t bytes = 0;
    dst_tensor g;
    if (!hook || !hook->ready) return DSTP_OK;
    LIB(dst_layer_grad_arena(m->layers[l], &ga));
    LIB(dst_layer_arena_bytes(m->layers[l], &bytes));
    g = view(ga, m->dt, 1, (int64_t)(bytes / m->esz), 0, 0);
    return hook->ready(hook->user, &g, 1, err);
}

/* The backward's three gradient buffers: the one just written becomes the next input. */
static void rotate(void **dout, void *spare[2]) {
    void *t = *dout;
    *dout = spare[0];
    spare[0] = spare[1];
    spare[1] = t;
}

dstp_status dstp_model_train(dstp_model *m, const dstp_batch *b, float gs, int write, const dstp_grad_hook *hook,
                             dstp_result *r, dstp_error *err) {
    static const int heads_done[] = {P_T_W, P_T_B, P_T_LN_W, P_T_LN_B, P_DEC_B, P_POOL_W, P_POOL_B, P_NSP_W, P_NSP_B};
    static const int final_done[] = {P_FIN_LN_W, P_FIN_LN_B};
    static const int embed_done[] = {P_WORD, P_POS, P_TYPE, P_EMB_LN_W, P_EMB_LN_B};
    const int64_t B = b->batch, S = b->seq, N = B * S, H = m->H, M = b->nrows;
    /* The mode of each parameter gradient's first contribution in this micro-batch (the tied word table's
     * second one, in the embedding backward, always adds). */
    const dst_grad_mode acc = write ? DST_GRAD_WRITE : DST_GRAD_ACCUMULATE;
    const size_t act = (size_t)N * (size_t)H * m->esz;
    uint64_t dseed = 0, doff = 0;
    void *seq = NULL, *dout, *spare[2];
    int l;
    dst_tensor gseq = view(m->g_seq, m->dt, 2, N, H, 0);
    if (upload(m, b, err)) return DSTP_ERR_ARG;
    LAP(DSTP_PHASE_DATA);
    if (encode(m, b, 1, &dseed, &doff, &seq, err) || heads(m, b, seq, 1, gs, acc, err)) return DSTP_ERR_STATE;

    /* Heads backward into g_seq [N, H]: the MLM rows written, the [CLS] rows added. */
    if (M > 0) {
        const dst_tensor rows = view(m->rows, DST_DTYPE_INT32, 1, M, 0, 0);
        const dst_tensor tw = pview(m, &m->p[P_T_W], 0), lw = pview(m, &m->p[P_T_LN_W], 0), lb = pview(m, &m->p[P_T_LN_B], 0);
        dst_tensor dtw = pview(m, &m->p[P_T_W], 1), dtb = pview(m, &m->p[P_T_B], 1);
        dst_tensor dlw = pview(m, &m->p[P_T_LN_W], 1), dlb = pview(m, &m->p[P_T_LN_B], 1);
        const dst_tensor hm = view(m->hm, m->dt, 2, M, H, 0), tp = view(m->t_pre, m->dt, 2, M, H, 0);
        const dst_tensor tg = view(m->t_g, m->dt, 2, M, H, 0), ts = view(m->stats_t, m->sdt, 2, 2, M, 0);
        dst_tensor dtl = view(m->g_t, m->dt, 2, M, H, 0), dtg = view(m->g_t2, m->dt, 2, M, H, 0);
        dst_tensor dhm = view(m->g_hm, m->dt, 2, M, H, 0);
        LIB(dst_layernorm_backward(m->ctx, &dtl, &tg, &lw, &lb, &ts, &dtg, &dlw, &dlb, acc));
        LIB(dst_dense_backward(m->ctx, &dtg, &hm, &tw, &tp, m->cfg.gelu_tanh ? DST_ACTIVATION_GELU_TANH : DST_ACTIVATION_GELU_ERF,
                               &dhm, &dtw, &dtb, acc));
        LIB(dst_scatter_rows(m->ctx, &dhm, &rows, &gseq, DST_GRAD_WRITE));
    } else {
        static const int mlm[] = {P_T_W, P_T_B, P_T_LN_W, P_T_LN_B, P_DEC_B};
        int k;
        if (zero_bytes(m, m->g_seq, act, err)) return DSTP_ERR_STATE;
        /* No masked token: the MLM head contributes nothing, and in write mode nothing wrote its gradients. */
        for (k = 0; write && k < (int)(sizeof mlm / sizeof mlm[0]); ++k)
            if (zero_bytes(m, m->p[mlm[k]].grad, m->p[mlm[k]].bytes, err)) return DSTP_ERR_STATE;
    }
    if (m->cfg.next_sentence_prediction) {
        const dst_tensor crow = view(m->cls_rows, DST_DTYPE_INT32, 1, B, 0, 0), pw = pview(m, &m->p[P_POOL_W], 0);
        const dst_tensor cls = view(m->cls, m->dt, 2, B, H, 0), pp = view(m->p_pre, m->dt, 2, B, H, 0);
        const dst_tensor dpooled = view(m->g_pooled, m->dt, 2, B, H, 0);
        dst_tensor dpw = pview(m, &m->p[P_POOL_W], 1), dpb = pview(m, &m->p[P_POOL_B], 1);
        dst_tensor dcls = view(m->g_cls, m->dt, 2, B, H, 0);
        LIB(dst_dense_backward(m->ctx, &dpooled, &cls, &pw, &pp, DST_ACTIVATION_TANH, &dcls, &dpw, &dpb, acc));
        LIB(dst_scatter_rows(m->ctx, &dcls, &crow, &gseq, DST_GRAD_ACCUMULATE)); /* onto the MLM rows */
    }
    if (bucket(m, hook, heads_done, (int)(sizeof heads_done / sizeof heads_done[0]), err)) return DSTP_ERR_STATE;

    /* Final LayerNorm (Pre-LN), then the layers in reverse; gradients rotate through three buffers. */
    dout = m->g_seq;
    spare[0] = m->g_a;
    spare[1] = m->g_b;
    if (m->cfg.pre_layer_norm) {
        const dst_tensor dy = view(m->g_seq, m->dt, 3, B, S, H), x = view(m->enc_out, m->dt, 3, B, S, H);
        const dst_tensor w = pview(m, &m->p[P_FIN_LN_W], 0), bb = pview(m, &m->p[P_FIN_LN_B], 0);
        const dst_tensor fs = view(m->stats_fin, m->sdt, 2, 2, N, 0);
        dst_tensor dx = view(m->g_a, m->dt, 3, B, S, H), dw = pview(m, &m->p[P_FIN_LN_W], 1), db = pview(m, &m->p[P_FIN_LN_B], 1);
        LIB(dst_layernorm_backward(m->ctx, &dy, &x, &w, &bb, &fs, &dx, &dw, &db, acc));
        dout = m->g_a;
        spare[0] = m->g_b;
        spare[1] = m->g_seq;
        if (bucket(m, hook, final_done, 2, err)) return DSTP_ERR_STATE;
    }
    LAP(DSTP_PHASE_EMBED_HEAD);
    if (m->packed) { /* the real tokens' gradients */
        const dst_tensor places = view(m->places, DST_DTYPE_INT32, 1, m->real, 0, 0), gp = view(dout, m->dt, 2, N, H, 0);
        dst_tensor gs = view(spare[0], m->dt, 2, m->real, H, 0);
        LIB(dst_gather_rows(m->ctx, &gp, &places, &gs));
        rotate(&dout, spare);
    }
    for (l = m->L - 1; l >= 0; --l) {
        if (!m->packed) {
            const dst_tensor dy = view(dout, m->dt, 3, B, S, H);
            dst_tensor dx = view(spare[0], m->dt, 3, B, S, H);
            LIB(dst_layer_backward(m->layers[l], NULL, &dy, &dx, acc));
        } else {
            const dst_tensor dy = view(dout, m->dt, 2, m->real, H, 0);
            dst_tensor dx = view(spare[0], m->dt, 2, m->real, H, 0);
            LIB(dst_layer_backward_packed(m->layers[l], NULL, &dy, &dx, acc));
        }
        if (layer_bucket(m, hook, l, err)) return DSTP_ERR_STATE;
        rotate(&dout, spare);
    }
    if (m->packed) { /* dx0 in the padded layout, padding rows zero */
        const dst_tensor places = view(m->places, DST_DTYPE_INT32, 1, m->real, 0, 0);
        const dst_tensor gs = view(dout, m->dt, 2, m->real, H, 0);
        dst_tensor gp = view(spare[0], m->dt, 2, N, H, 0);
        LIB(dst_scatter_rows(m->ctx, &gs, &places, &gp, DST_GRAD_WRITE));
        rotate(&dout, spare);
    }
    LAP(DSTP_PHASE_LAYERS);

    /* Embedding dropout (in place), LayerNorm and the tables. */
    {
        const dst_tensor ids = view(m->ids, DST_DTYPE_INT32, 2, B, S, 0), types = view(m->types, DST_DTYPE_INT32, 2, B, S, 0);
        const dst_tensor e = view(m->emb, m->dt, 3, B, S, H), es = view(m->stats_emb, m->sdt, 2, 2, N, 0);
        const dst_tensor lnw = pview(m, &m->p[P_EMB_LN_W], 0), lnb = pview(m, &m->p[P_EMB_LN_B], 0);
        dst_tensor dx0 = view(dout, m->dt, 3, B, S, H), de = view(spare[0], m->dt, 3, B, S, H);
        dst_tensor dlnw = pview(m, &m->p[P_EMB_LN_W], 1), dlnb = pview(m, &m->p[P_EMB_LN_B], 1);
        dst_tensor dword = pview(m, &m->p[P_WORD], 1), dpos = pview(m, &m->p[P_POS], 1), dtype = pview(m, &m->p[P_TYPE], 1);
        LIB(dst_dropout_backward(m->ctx, &dx0, m->cfg.hidden_dropout_prob, dseed, doff, &dx0));
        LIB(dst_layernorm_backward(m->ctx, &dx0, &e, &lnw, &lnb, &es, &de, &dlnw, &dlnb, acc));
        if (write && M > 0) { /* the decoder wrote the word table: its rows add, the other two tables are written */
            LIB(dst_embedding_backward(m->ctx, &de, &ids, &types, NULL, &dpos, &dtype, DST_GRAD_WRITE));
            LIB(dst_embedding_backward(m->ctx, &de, &ids, &types, &dword, NULL, NULL, DST_GRAD_ACCUMULATE));
        } else {
            LIB(dst_embedding_backward(m->ctx, &de, &ids, &types, &dword, &dpos, &dtype, acc));
        }
    }
    if (bucket(m, hook, embed_done, (int)(sizeof embed_done / sizeof embed_done[0]), err)) return DSTP_ERR_STATE;
    {
        const dstp_status st = read_results(m, b, M > 0, m->cfg.next_sentence_prediction, r, err);
        if (st != DSTP_OK) return st;
    }
    LAP(DSTP_PHASE_EMBED_HEAD);
    return DSTP_OK;
}

dstp_status dstp_model_evaluate(dstp_model *m, const dstp_batch *b, dstp_result *r, dstp_error *err) {
    void *seq = NULL;
    if (upload(m, b, err)) return DSTP_ERR_ARG;
    if (encode(m, b, 0, NULL, NULL, &seq, err) || heads(m, b, seq, 0, 1.0f, DST_GRAD_ACCUMULATE, err))
        return DSTP_ERR_STATE;
    return read_results(m, b, b->nrows > 0, m->cfg.next_sentence_prediction, r, err);
}

dstp_status dstp_model_logits(dstp_model *m, const int32_t *ids, const int32_t *types, int32_t len, float *logits,
                              dstp_error *err) {
    const int64_t S = m->opt.seq, H = m->H, V = m->V;
    dstp_batch b;
    int32_t *host = (int32_t *)calloc((size_t)(2 * S + 2), sizeof(int32_t));
    void *z = NULL, *seq = NULL, *hostz = NULL;
    dstp_status st = DSTP_OK;
    int64_t i;
    if (!host) {
        dstp_seterr(err, "model: out of host memory");
        return DSTP_ERR_NOMEM;
    }
    if (len < 1 || len > S) {
        free(host);
        dstp_seterr(err, "logits: %d tokens, expected 1..%d (the model's sequence length)", (int)len, (int)S);
        return DSTP_ERR_ARG;
    }
    memset(&b, 0, sizeof b);
    b.batch = 1;
    b.seq = (int32_t)S;
    b.ids = host;
    b.types = host + S;
    b.lengths = host + 2 * S;
    b.nsp = host + 2 * S + 1;
    memcpy(b.ids, ids, (size_t)len * sizeof *ids);
    if (types) memcpy(b.types, types, (size_t)len * sizeof *types);
    b.lengths[0] = len;
    st = upload(m, &b, err);
    if (st == DSTP_OK) st = encode(m, &b, 0, NULL, NULL, &seq, err);
    if (st == DSTP_OK && dst_malloc(m->ctx, (size_t)len * (size_t)V * m->esz, &z) != DST_OK) {
        dstp_seterr(err, "dst_malloc: %s", dst_last_error());
        st = DSTP_ERR_NOMEM;
    }
    if (st == DSTP_OK && !(hostz = malloc((size_t)len * (size_t)V * m->esz))) st = DSTP_ERR_NOMEM;
    if (st == DSTP_OK) {
        /* The transform of the first len rows (the real tokens), then the tied decoder over the vocabulary. */
        const dst_tensor h = view(seq, m->dt, 2, len, H, 0);
        const dst_tensor tw = pview(m, &m->p[P_T_W], 0), tb = pview(m, &m->p[P_T_B], 0);
        const dst_tensor lw = pview(m, &m->p[P_T_LN_W], 0), lb = pview(m, &m->p[P_T_LN_B], 0);
        const dst_tensor word = pview(m, &m->p[P_WORD], 0), db = pview(m, &m->p[P_DEC_B], 0);
        dst_tensor tg = view(m->g_a, m->dt, 2, len, H, 0), tl = view(m->g_b, m->dt, 2, len, H, 0);
        dst_tensor out = view(z, m->dt, 2, len, V, 0);
        dst_status ls = dst_dense_forward(m->ctx, &h, &tw, &tb,
                                          m->cfg.gelu_tanh ? DST_ACTIVATION_GELU_TANH : DST_ACTIVATION_GELU_ERF, &tg, NULL);
        if (ls == DST_OK) ls = dst_layernorm_forward(m->ctx, &tg, &lw, &lb, m->cfg.layer_norm_eps, &tl, NULL);
        if (ls == DST_OK) ls = dst_dense_forward(m->ctx, &tl, &word, &db, DST_ACTIVATION_NONE, &out, NULL);
        if (ls == DST_OK) ls = dst_memcpy(m->ctx, hostz, z, (size_t)len * (size_t)V * m->esz, DST_COPY_CONTEXT_TO_HOST);
        if (ls != DST_OK) {
            dstp_seterr(err, "logits: %s: %s", dst_status_string(ls), dst_last_error());
            st = DSTP_ERR_STATE;
        }
    }
    if (st == DSTP_OK)
        for (i = 0; i < len * V; ++i) logits[i] = unpack1(m->dt, hostz, (size_t)i);
    if (st == DSTP_ERR_NOMEM && !err->msg[0]) dstp_seterr(err, "model: out of memory");
    dst_free(m->ctx, z);
    free(hostz);
    free(host);
    return st;
}

/* ---- Hugging Face and engine files ------------------------------------------------------------------------ */

/* The named tensors of the program's parameters under `prefix` + their names without "bert." (the
 * BertModel spelling when prefix is ""), for the parameters in `which`. */
typedef struct named_set {
    dst_named_tensor t[P_COUNT + 4];
    char names[P_COUNT + 4][96];
    int index[P_COUNT + 4];
    int n;
} named_set;

static void add_named(named_set *s, const dstp_model *m, int i, const char *name, int required) {
    snprintf(s->names[s->n], sizeof s->names[0], "%s", name);
    memset(&s->t[s->n], 0, sizeof s->t[0]);
    s->t[s->n].name = s->names[s->n];
    s->t[s->n].tensor = pview(m, &m->p[i], 0);
    s->t[s->n].required = required;
    s->index[s->n] = i;
    ++s->n;
}

/* Hugging Face BertForMaskedLM's tensors (with `bert_prefix` 0: BertModel's names for the encoder part). */
static void hf_set(named_set *s, const dstp_model *m, int bert_prefix, int for_save) {
    static const int enc[] = {P_WORD, P_POS, P_TYPE, P_EMB_LN_W, P_EMB_LN_B};
    static const int head[] = {P_T_W, P_T_B, P_T_LN_W, P_T_LN_B, P_DEC_B};
    size_t k;
    char name[96];
    s->n = 0;
    for (k = 0; k < sizeof enc / sizeof enc[0]; ++k) {
        const char *n = m->p[enc[k]].name;
        add_named(s, m, enc[k], bert_prefix ? n : n + 5, 1);
    }
    for (k = 0; k < sizeof head / sizeof head[0]; ++k) add_named(s, m, head[k], m->p[head[k]].name, 0);
    if (for_save) { /* the tied copies, as in the module's state_dict */
        snprintf(name, sizeof name, "cls.predictions.decoder.weight");
        add_named(s, m, P_WORD, name, 0);
        snprintf(name, sizeof name, "cls.predictions.decoder.bias");
        add_named(s, m, P_DEC_B, name, 0);
    } else if (m->cfg.next_sentence_prediction) {
        add_named(s, m, P_POOL_W, bert_prefix ? m->p[P_POOL_W].name : m->p[P_POOL_W].name + 5, 0);
        add_named(s, m, P_POOL_B, bert_prefix ? m->p[P_POOL_B].name : m->p[P_POOL_B].name + 5, 0);
        add_named(s, m, P_NSP_W, m->p[P_NSP_W].name, 0);
        add_named(s, m, P_NSP_B, m->p[P_NSP_B].name, 0);
    }
}

dstp_status dstp_model_import_hf(dstp_model *m, const char *path, int *heads_found, int *heads_total, dstp_error *err) {
    named_set s;
    dst_checkpoint_options o;
    int32_t found[P_COUNT + 4];
    dst_status st;
    char first[512];
    int k;
    if (m->cfg.pre_layer_norm) {
        dstp_seterr(err, "%s: Hugging Face BERT weights are Post-LN; this model is Pre-LN (\"pre_layer_norm\": true)", path);
        return DSTP_ERR_ARG;
    }
    LIB(dst_checkpoint_options_default(&o));
    o.layout = DST_LAYOUT_HF_BERT;
    o.restore_rng = 0;
    hf_set(&s, m, 1, 0); /* BertForPreTraining / BertForMaskedLM: "bert.embeddings..." */
    st = dst_checkpoint_load_model(m->ctx, m->layers, (int)m->L, s.t, s.n, found, path, &o, NULL, 0, NULL);
    if (st == DST_ERR_FORMAT) { /* a bare BertModel: "embeddings...", "encoder.layer..." */
        snprintf(first, sizeof first, "%s", dst_last_error());
        hf_set(&s, m, 0, 0);
        st = dst_checkpoint_load_model(m->ctx, m->layers, (int)m->L, s.t, s.n, found, path, &o, NULL, 0, NULL);
        if (st != DST_OK) {
            dstp_seterr(err, "%s: %s", dst_status_string(st), first);
            return DSTP_ERR_FORMAT;
        }
    }
    if (st != DST_OK) {
        dstp_seterr(err, "%s: %s", dst_status_string(st), dst_last_error());
        return st == DST_ERR_IO ? DSTP_ERR_IO : DSTP_ERR_FORMAT;
    }
    *heads_found = 0;
    *heads_total = 0;
    for (k = 0; k < s.n; ++k)
        if (!s.t[k].required) {
            ++*heads_total;
            *heads_found += found[k];
        }
    return DSTP_OK;
}

static dstp_status write_text(const char *path, const char *what, const dstp_model_config *c, const char *copy_from,
                              dstp_error *err) {
    FILE *f = fopen(path, "wb");
    if (!f) {
        dstp_seterr(err, "%s: cannot write: %s", path, strerror(errno));
        return DSTP_ERR_IO;
    }
    if (c) dstp_model_config_write(f, c, 1);
    if (copy_from) {
        FILE *in = fopen(copy_from, "rb");
        char buf[65536];
        size_t n;
        if (!in) {
            fclose(f);
            dstp_seterr(err, "%s: cannot read: %s", copy_from, strerror(errno));
            return DSTP_ERR_IO;
        }
        while ((n = fread(buf, 1, sizeof buf, in)) > 0) fwrite(buf, 1, n, f);
        fclose(in);
    }
    if (fclose(f) != 0) {
        dstp_seterr(err, "%s: cannot write %s: %s", path, what, strerror(errno));
        return DSTP_ERR_IO;
    }
    return DSTP_OK;
}

dstp_status dstp_model_export_hf(dstp_model *m, const char *dir, const char *vocab, dstp_error *err) {
    named_set s;
    dst_checkpoint_options o;
    char path[4096];
    if (m->cfg.pre_layer_norm) {
        dstp_seterr(err, "%s: a Hugging Face BertForMaskedLM is Post-LN; this model is Pre-LN (\"pre_layer_norm\": true), "
                         "so it has no Hugging Face form (its engine checkpoints hold it)", dir);
        return DSTP_ERR_ARG;
    }
    if (mkdir(dir, 0777) != 0 && errno != EEXIST) {
        dstp_seterr(err, "%s: cannot create the folder: %s", dir, strerror(errno));
        return DSTP_ERR_IO;
    }
    LIB(dst_checkpoint_options_default(&o));
    o.layout = DST_LAYOUT_HF_BERT;
    o.prefix = "bert.encoder.";
    o.save_dtype = DST_DTYPE_FP32;
    hf_set(&s, m, 1, 1);
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    LIB(dst_checkpoint_save_model(m->ctx, m->layers, (int)m->L, s.t, s.n, path, &o));
    snprintf(path, sizeof path, "%s/config.json", dir);
    if (write_text(path, "the configuration", &m->cfg, NULL, err)) return DSTP_ERR_IO;
    if (vocab) {
        snprintf(path, sizeof path, "%s/vocab.txt", dir);
        if (write_text(path, "the vocabulary", NULL, vocab, err)) return DSTP_ERR_IO;
    }
    return DSTP_OK;
}

dstp_status dstp_model_load_engine_weights(dstp_model *m, const char *path, dstp_error *err) {
    named_set s;
    dst_checkpoint_options o;
    int i;
    LIB(dst_checkpoint_options_default(&o));
    o.layout = DST_LAYOUT_DEEPSPEED; /* the engine stores a layer as bert.encoder.layer.<i>.attn_qkvw ... */
    o.prefix = "bert.encoder.";
    o.restore_rng = 0;
    s.n = 0;
    for (i = 0; i < P_COUNT; ++i)
        if (m->present[i]) add_named(&s, m, i, m->p[i].name, 1);
    LIB(dst_checkpoint_load_model(m->ctx, m->layers, (int)m->L, s.t, s.n, NULL, path, &o, NULL, 0, NULL));
    return DSTP_OK;
}
