// The layer's dataflow (docs/api.md, "What a layer computes"), written once over the Backend op table:
// two functions for forward (Pre-LN, Post-LN) and two for backward. Buffers come from the plan in
// layer/buffers.h.
#include "layer/layer.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <vector>

#include "core/dtype.h"     // defines: dtype_size, stat_size, convert_host
#include "core/error.h"     // defines: set_error, DST_TRY
#include "kernels/philox.h" // defines: philox4x32_10, dropout_threshold

namespace dst {

// ---- parameter names and layout -----------------------------------------------------------------

static const char *const kParamNames[DST_PARAM_COUNT] = {
    "attn_qkvw", "attn_qkvb", "attn_ow", "attn_ob", "attn_nw", "attn_nb",
    "inter_w",   "inter_b",   "output_w", "output_b", "norm_w", "norm_b"};

const char *param_name(int p) { return (p >= 0 && p < DST_PARAM_COUNT) ? kParamNames[p] : nullptr; }

int param_lookup(const char *name) {
    if (!name) return -1;
    const char *dot = std::strrchr(name, '.');
    const char *base = dot ? dot + 1 : name;
    for (int p = 0; p < DST_PARAM_COUNT; ++p)
        if (std::strcmp(base, kParamNames[p]) == 0) return p;
    return -1;
}

void Layer::param_shape(int p, int32_t *ndim, int64_t shape[2]) const {
    const int64_t H = dims_.H, I = dims_.I;
    int64_t r = 0, c = 0;
    switch (p) {
    case DST_PARAM_ATTN_QKVW: r = 3 * H; c = H; break;
    case DST_PARAM_ATTN_QKVB: r = 3 * H; break;
    case DST_PARAM_ATTN_OW: r = H; c = H; break;
    case DST_PARAM_INTER_W: r = I; c = H; break;
    case DST_PARAM_INTER_B: r = I; break;
    case DST_PARAM_OUTPUT_W: r = H; c = I; break;
    default: r = H; break;  // the [H] biases and LayerNorm γ/β
    }
    *ndim = c ? 2 : 1;
    shape[0] = r;
    shape[1] = c ? c : 0;
}

// ---- creation, arenas ---------------------------------------------------------------------------

dst_status Layer::create(std::shared_ptr<Context> ctx, const dst_layer_config &cfg, Layer **out) {
    std::unique_ptr<Layer> L(new Layer());
    L->ctx_ = std::move(ctx);
    L->cfg_ = cfg;
    L->dims_ = config_dims(cfg);
    L->cfg_.intermediate_size = static_cast<int32_t>(L->dims_.I);
    L->training_ = cfg.training != 0;
    L->default_saved_.layer = L.get();
    const size_t es = dtype_size(cfg.dtype);
    size_t off = 0;
    for (int p = 0; p < DST_PARAM_COUNT; ++p) {
        int32_t nd;
        int64_t sh[2];
        L->param_shape(p, &nd, sh);
        L->numel_[p] = nd == 2 ? sh[0] * sh[1] : sh[0];
        L->offset_[p] = off;
        off += (static_cast<size_t>(L->numel_[p]) * es + 255) & ~size_t(255);
    }
    L->arena_bytes_ = off;
    Backend &be = *L->ctx_->backend;
    DST_TRY(be.alloc(off, &L->params_));
    DST_TRY(be.alloc(off, &L->grads_));
    DST_TRY(be.zero(L->grads_, off));
    DST_TRY(L->init_params());
    L->id_ = L->ctx_->next_layer_id++;
    *out = L.release();
    return DST_OK;
}

Layer::~Layer() {
    for (Saved *s : saved_objects_) {
        s->release();
        s->layer = nullptr;
    }
    default_saved_.release();
    Backend &be = *ctx_->backend;
    if (own_params_) be.free(params_);
    if (own_grads_) be.free(grads_);
}

// Weights ~ N(0, σ) from the Philox "init" stream keyed by cfg.seed: element e of parameter p uses
// counter {e_lo, e_hi, p, 'INIT'}; words 0 and 1 feed one Box–Muller draw in double. Computed on
// the host (OpenMP blocks on the context's host threads: each element is a function of its index alone) and copied, so every backend
// starts from bit-identical weights.
dst_status Layer::init_params() {
    const double range = cfg_.initializer_range;
    const double out_std =
        cfg_.adjust_init_range ? range / std::sqrt(2.0 * cfg_.num_hidden_layers) : range;
    const uint32_t k0 = static_cast<uint32_t>(cfg_.seed), k1 = static_cast<uint32_t>(cfg_.seed >> 32);
    const size_t es = dtype_size(cfg_.dtype);
    std::vector<char> conv;
    for (int p = 0; p < DST_PARAM_COUNT; ++p) {
        const size_t n = static_cast<size_t>(numel_[p]);
        double sigma = -1.0, fill = 0.0;
        if (p == DST_PARAM_ATTN_QKVW || p == DST_PARAM_INTER_W) sigma = range;
        if (p == DST_PARAM_ATTN_OW || p == DST_PARAM_OUTPUT_W) sigma = out_std;
        if (p == DST_PARAM_ATTN_NW || p == DST_PARAM_NORM_W) fill = 1.0;
        conv.resize(n * es);
        char *out = conv.data();
        const uint32_t pid = static_cast<uint32_t>(p);
        const int64_t blocks = static_cast<int64_t>((n + 1023) / 1024);
        const int nt = backend().num_threads();
#pragma omp parallel for num_threads(nt) schedule(static) if (blocks > 64)
        for (int64_t blk = 0; blk < blocks; ++blk) {
            double host[1024];
            const size_t c = static_cast<size_t>(blk) * 1024, m = std::min<size_t>(1024, n - c);
            for (size_t i = 0; i < m; ++i) {
                const uint64_t e = c + i;
                if (sigma < 0.0) {
                    host[i] = fill;
                    continue;
                }
                Philox4 ctr{{static_cast<uint32_t>(e), static_cast<uint32_t>(e >> 32), pid, 0x494E4954u}};
                const Philox4 r = philox4x32_10(ctr, k0, k1);
                const double u1 = (static_cast<double>(r.v[0]) + 0.5) / 4294967296.0;
                const double u2 = static_cast<double>(r.v[1]) / 4294967296.0;
                host[i] = sigma * std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
            }
            convert_host(host, DST_DTYPE_FP64, out + c * es, cfg_.dtype, m);
        }
        DST_TRY(backend().copy(param(p), conv.data(), conv.size(), CopyKind::HostToDevice));
    }
    return backend().synchronize();
}

dst_status Layer::bind_params(void *data, bool copy_current) {
    if (data == params_) return DST_OK;  // the caller's bound arena again (the C API refuses our own)
    if (copy_current) DST_TRY(backend().copy(data, params_, arena_bytes_, CopyKind::DeviceToDevice));
    if (own_params_) backend().free(params_);
    params_ = data;
    own_params_ = false;
    return DST_OK;
}

dst_status Layer::bind_grads(void *data) {
    if (data == grads_) return DST_OK;
    if (own_grads_) backend().free(grads_);
    grads_ = data;
    own_grads_ = false;
    return DST_OK;
}

dst_status Layer::zero_grads() { return backend().zero(grads_, arena_bytes_); }

// ---- saved activations --------------------------------------------------------------------------

void Saved::release() {
    if (mem && layer) layer->backend().free(mem);
    mem = nullptr;
    capacity = 0;
    bytes = 0;
    valid = false;
    packed = false;
    packed_n = 0;
    rng_offset_hi = nullptr;
}

dst_status Layer::new_saved(Saved **out) {
    std::unique_ptr<Saved> s(new Saved());
    s->layer = this;
    saved_objects_.insert(s.get());
    *out = s.release();
    return DST_OK;
}

void Layer::delete_saved(Saved *s) {
    saved_objects_.erase(s);
    delete s;
}

// ---- helpers ------------------------------------------------------------------------------------

DropoutSite Layer::site(uint64_t seed, uint64_t offset, const uint32_t *offset_hi, float ratio) const {
    DropoutSite d;
    d.seed = seed;
    d.offset = offset;
    d.offset_hi = offset_hi;
    d.threshold = dropout_threshold(static_cast<double>(ratio));
    d.scale = d.threshold ? 1.0 / (1.0 - static_cast<double>(ratio)) : 1.0;
    return d;
}

AttentionParams Layer::attention_params(int64_t B, int64_t S) const {
    AttentionParams ap;
    ap.batch = B;
    ap.seq = S;
    ap.hidden = dims_.H;
    ap.heads = dims_.heads;
    ap.head_dim = dims_.d;
    ap.scale = 1.0 / std::sqrt(static_cast<double>(dims_.d));
    ap.causal = cfg_.causal != 0;
    return ap;
}

// The context's workspace for a call: the plan's buffers, then the backend's scratch, handed to it.
dst_status Layer::workspace(const Plan &p, int64_t B, int64_t S, dst_mask_kind mask, dst_dtype mask_dtype,
                            int64_t packed_tokens, char **ws) {
    Backend &be = backend();
    const size_t base = scratch_offset(p);
    const size_t scratch = be.scratch_bytes(scratch_needs(cfg_, B, S, mask, mask_dtype, packed_tokens));
    DST_TRY(ctx_->ensure_workspace(base + scratch, ws));
    be.set_scratch(scratch ? *ws + base : nullptr, scratch);
    return DST_OK;
}

static size_t align256(size_t n) { return (n + 255) & ~size_t(255); }

// Pointer to slot s of a plan: in the saved object when kept, else in the workspace.
static void *at(const Plan &p, char *sv, char *ws, Slot s) {
    if (!p.slot[s].used) return nullptr;
    return (p.slot[s].kept ? sv : ws) + p.offset[s];
}
static void *tmp(const Plan &p, char *ws, Temp t) { return ws + p.temp_offset[t]; }

// ---- forward ------------------------------------------------------------------------------------

dst_status Layer::forward(Saved *saved, const void *x, int64_t B, int64_t S, const MaskArg &mask, void *y) {
    return run_forward(saved, x, B, S, mask, nullptr, 0, y);
}

// Packed sequences: the dataflow on the N rows themselves. packed_index gives each row its padded
// place b·S + i (the dropout elements and attention indices of the padded layout) and the key
// lengths; the GEMMs and elementwise ops run on the N rows, attention in the packed layout.
dst_status Layer::forward_packed(Saved *saved, const void *x, int64_t N, const int32_t *cu, int64_t B, int64_t S,
                                 void *y) {
    MaskArg m;
    m.kind = DST_MASK_KEY_LENGTHS;
    m.dtype = DST_DTYPE_INT32;
    return run_forward(saved, x, B, S, m, cu, N, y);
}

dst_status Layer::run_forward(Saved *saved, const void *x, int64_t B, int64_t S, const MaskArg &mask,
                              const int32_t *cu, int64_t packed_n, void *y) {
    const bool train = training_, packed = cu != nullptr;
    const char *fn = packed ? "dst_layer_forward_packed" : "dst_layer_forward";
    Backend &be = backend();
    // Dropout offsets: taken on the host (kRngOffsetsPerForward consecutive ones), or, while the stream
    // captures a CUDA graph, from the graph dropout stream, whose offset word each run of the call takes
    // from the context's counter on the device (kernels/philox.h), so that replays draw new masks.
    const bool dropout = train && (cfg_.attn_dropout_ratio > 0.0f || cfg_.hidden_dropout_ratio > 0.0f);
    const bool graph_rng = dropout && (be.capturing() || ctx_->graph_rng_eager);
    // A host counter that cannot hold the offsets is exhausted rather than wrapped (which would repeat
    // earlier masks).
    if (train && !graph_rng && ctx_->rng_offset > UINT64_MAX - kRngOffsetsPerForward)
        return set_error(DST_ERR_STATE,
                         "%s: the context's RNG offset %llu leaves fewer than the %llu offsets a "
                         "training forward takes before 2^64 - 1; the dropout stream of this seed is exhausted: "
                         "start a new one with dst_context_set_rng_state",
                         fn, (unsigned long long)ctx_->rng_offset, (unsigned long long)kRngOffsetsPerForward);
    if (dropout) DST_TRY(ctx_->ensure_graph_rng(fn));
    const int64_t tokens = packed ? packed_n : B * S;
    const Plan p = make_plan(cfg_, B, S, train, packed ? packed_n : 0);
    be.set_stochastic(cfg_.stochastic_mode != 0);
    be.set_allow_tf32(cfg_.allow_tf32 != 0);
    const size_t N = static_cast<size_t>(tokens);
    const size_t row = static_cast<size_t>(dims_.H) * dtype_size(cfg_.dtype);

    // Allocate everything before writing anything the caller owns. While the stream captures a CUDA
    // graph no allocation is possible: a saved object that would have to grow is refused here, and a
    // workspace that would have to grow by workspace(), both before the call queues anything (a node
    // left in the caller's capture by a refused call would run at every replay).
    if (train && saved->capacity < p.saved_bytes && be.capturing())
        return set_error(DST_ERR_STATE,
                         "%s: the saved activations need %zu bytes (this object holds %zu), which must be allocated, "
                         "but the stream is capturing a CUDA graph: make the same call with this saved object once "
                         "before capturing", fn, p.saved_bytes, saved->capacity);
    char *ws = nullptr;
    DST_TRY(workspace(p, B, S, mask.kind, mask.dtype, packed ? packed_n : 0, &ws));
    int32_t *lens = nullptr, *places = nullptr;
    if (packed) {  // into the workspace first: the CPU backend checks the offsets here
        lens = static_cast<int32_t *>(at(p, nullptr, ws, kSlotPackWs));
        places = lens + align256(static_cast<size_t>(B) * 4) / 4;
        DST_TRY(be.packed_index(cu, B, S, packed_n, places, lens, "dst_layer_forward_packed: cu_seqlens"));
    } else if (mask.kind == DST_MASK_KEY_LENGTHS) {
        // Values 1..S. The CPU backend checks them now; the CUDA backend on the device, without waiting
        // (a bad value is reported by a later call: dst_layer_forward's documentation).
        char what[96], detail[64];
        std::snprintf(what, sizeof what, "%s: key-length mask", fn);
        std::snprintf(detail, sizeof detail, " (S = %lld)", (long long)S);
        DST_TRY(be.check_range_deferred(static_cast<const int32_t *>(mask.data), B, 1, static_cast<int32_t>(S),
                                        what, detail));
    }
    char *sv = nullptr;
    if (train) {
        if (saved->capacity < p.saved_bytes) {
            void *m = nullptr;
            DST_TRY(be.alloc(p.saved_bytes, &m));
            saved->release();
            saved->mem = m;
            saved->capacity = p.saved_bytes;
        }
        sv = static_cast<char *>(saved->mem);
    } else {
        // Inference records nothing: a saved object it was handed no longer matches a forward.
        saved->valid = false;
    }

    AttentionParams ap = attention_params(B, S);
    ap.mask_kind = mask.kind;
    ap.mask = mask.data;
    ap.mask_dtype = mask.dtype;
    DropoutSite d0, d1, d2;
    uint64_t seed = 0, first = 0;
    uint32_t *offset_hi = nullptr;
    if (train) {
        if (graph_rng) {  // offsets {k, word}: k = 0, 1, 2 and the word this run takes
            offset_hi = static_cast<uint32_t *>(at(p, sv, ws, kSlotRng));
            DST_TRY(be.rng_take(ctx_->graph_rng, offset_hi));
            seed = graph_dropout_seed(ctx_->rng_seed);
        } else {
            seed = ctx_->rng_seed;
            first = ctx_->take_offsets(kRngOffsetsPerForward);
        }
        d0 = site(seed, first + 0, offset_hi, cfg_.attn_dropout_ratio);
        d1 = site(seed, first + 1, offset_hi, cfg_.hidden_dropout_ratio);
        d2 = site(seed, first + 2, offset_hi, cfg_.hidden_dropout_ratio);
        if (mask.kind != DST_MASK_NONE && !packed) {
            const size_t mbytes = (mask.kind == DST_MASK_KEY_LENGTHS ? static_cast<size_t>(B)
                                                                     : N) * dtype_size(mask.dtype);
            void *mcopy = at(p, sv, ws, kSlotMask);
            DST_TRY(be.copy(mcopy, mask.data, mbytes, CopyKind::DeviceToDevice));
            ap.mask = mcopy;
        }
        if (p.slot[kSlotX].kept) {
            void *xs = at(p, sv, ws, kSlotX);
            DST_TRY(be.copy(xs, x, N * row, CopyKind::DeviceToDevice));
            x = xs;
        }
    }
    if (packed) {  // training keeps them with the saved activations; inference reads them where they are
        void *kl = lens, *rw = places;
        if (train) {
            kl = at(p, sv, ws, kSlotMask);
            rw = at(p, sv, ws, kSlotRows);
            DST_TRY(be.copy(kl, lens, static_cast<size_t>(B) * 4, CopyKind::DeviceToDevice));
            DST_TRY(be.copy(rw, places, N * 4, CopyKind::DeviceToDevice));
        }
        pack(ap, d1, d2, kl, rw, packed_n);
    }
    ap.dropout = d0;
    if (cfg_.pre_layer_norm)
        DST_TRY(forward_pre_ln(p, sv, ws, x, ap, d1, d2, y));
    else
        DST_TRY(forward_post_ln(p, sv, ws, x, ap, d1, d2, y));

    if (train) {
        saved->valid = true;
        saved->packed = packed;
        saved->packed_n = packed ? packed_n : 0;
        saved->B = B;
        saved->S = S;
        saved->rng_seed = seed;
        saved->rng_offset = first;
        saved->rng_offset_hi = offset_hi;
        saved->mask_kind = mask.kind;
        saved->mask_dtype = mask.dtype;
        saved->bytes = p.saved_bytes;
    }
    return DST_OK;
}

// A packed call's attention and hidden dropout sites: the key lengths, the rows' padded places.
void Layer::pack(AttentionParams &ap, DropoutSite &d1, DropoutSite &d2, void *lens, void *rows,
                 int64_t packed_n) const {
    ap.mask_kind = DST_MASK_KEY_LENGTHS;
    ap.mask_dtype = DST_DTYPE_INT32;
    ap.mask = lens;
    ap.rows = static_cast<const int32_t *>(rows);
    ap.packed_tokens = packed_n;
    for (DropoutSite *d : {&d1, &d2}) {
        d->rows = ap.rows;
        d->row_len = dims_.H;
    }
}

// A residual branch's end: z = residual + dropout(a·Wᵀ + b), y = LN(z). With the dropout inactive
// (inference, or a ratio of 0) the residual is the GEMM's added term (linear_fwd_add: one rounding)
// and the LayerNorm a plain one, which reads z alone; otherwise the GEMM writes t and one pass adds,
// drops and normalises (dropout_residual_layernorm_fwd).
dst_status Layer::branch_residual_layernorm(const void *a, int w, int b, int64_t k, const void *residual, void *t,
                                            void *z, int nw, int nb, void *y, void *mean, void *rstd, int64_t N,
                                            const DropoutSite &d) {
    Backend &be = backend();
    const dst_dtype dt = cfg_.dtype;
    const int64_t H = dims_.H;
    if (!d.active()) {
        DST_TRY(be.linear_fwd_add(dt, a, param(w), param(b), residual, z, N, k, H));
        return be.layernorm_fwd(dt, z, param(nw), param(nb), y, mean, rstd, N, H, cfg_.layer_norm_eps);
    }
    DST_TRY(be.linear_fwd(dt, a, param(w), param(b), t, N, k, H, nullptr, nullptr));
    return be.dropout_residual_layernorm_fwd(dt, t, residual, z, param(nw), param(nb), y, mean, rstd, N, H,
                                             cfg_.layer_norm_eps, d);
}

// h = LN1(x); qkv = h·Wqkvᵀ + b; ctx = attention(qkv); r = x + dropout(ctx·Woᵀ + bo);
// h2 = LN2(r); g = GELU(h2·Wiᵀ + bi); y = r + dropout(g·Woutᵀ + bout).
dst_status Layer::forward_pre_ln(const Plan &p, char *sv, char *ws, const void *x, const AttentionParams &ap,
                                 const DropoutSite &d1, const DropoutSite &d2, void *y) {
    Backend &be = backend();
    const dst_dtype dt = cfg_.dtype;
    const int64_t N = ap.tokens(), H = dims_.H, I = dims_.I;
    const double eps = cfg_.layer_norm_eps;
    void *h = at(p, sv, ws, kSlotLn1Out), *qkv = at(p, sv, ws, kSlotQkv), *ctx = at(p, sv, ws, kSlotCtx);
    void *r = at(p, sv, ws, kSlotResid), *h2 = at(p, sv, ws, kSlotLn2Out);
    void *u = at(p, sv, ws, kSlotPreGelu), *g = at(p, sv, ws, kSlotGelu), *t = at(p, sv, ws, kSlotTmpH);
    const dst_gelu act = cfg_.gelu;

    DST_TRY(be.layernorm_fwd(dt, x, param(DST_PARAM_NORM_W), param(DST_PARAM_NORM_B), h,
                             at(p, sv, ws, kSlotLn1Mean), at(p, sv, ws, kSlotLn1Rstd), N, H, eps));
    DST_TRY(be.linear_fwd(dt, h, param(DST_PARAM_ATTN_QKVW), param(DST_PARAM_ATTN_QKVB), qkv, N, H, 3 * H,
                          nullptr, nullptr));
    DST_TRY(be.attention_fwd(dt, ap, qkv, ctx, at(p, sv, ws, kSlotLse)));
    DST_TRY(branch_residual_layernorm(ctx, DST_PARAM_ATTN_OW, DST_PARAM_ATTN_OB, H, x, t, r, DST_PARAM_ATTN_NW,
                                      DST_PARAM_ATTN_NB, h2, at(p, sv, ws, kSlotLn2Mean),
                                      at(p, sv, ws, kSlotLn2Rstd), N, d1));
    // Inference keeps no pre-activation (a backend may then skip storing it).
    DST_TRY(be.linear_fwd(dt, h2, param(DST_PARAM_INTER_W), param(DST_PARAM_INTER_B), g, N, H, I, &act,
                          training_ ? u : nullptr));
    // No dropout on this branch (inference, or a ratio of 0): the residual is the GEMM's added term.
    if (!d2.active())
        return be.linear_fwd_add(dt, g, param(DST_PARAM_OUTPUT_W), param(DST_PARAM_OUTPUT_B), r, y, N, I, H);
    DST_TRY(be.linear_fwd(dt, g, param(DST_PARAM_OUTPUT_W), param(DST_PARAM_OUTPUT_B), t, N, I, H, nullptr,
                          nullptr));
    return be.dropout_residual_fwd(dt, t, r, y, N * H, d2);
}

// qkv = x·Wqkvᵀ + b; ctx = attention(qkv); r = x + dropout(ctx·Woᵀ + bo); h2 = LN2(r);
// z = h2 + dropout(GELU(h2·Wiᵀ + bi)·Woutᵀ + bout); y = LN(z).
dst_status Layer::forward_post_ln(const Plan &p, char *sv, char *ws, const void *x, const AttentionParams &ap,
                                  const DropoutSite &d1, const DropoutSite &d2, void *y) {
    Backend &be = backend();
    const dst_dtype dt = cfg_.dtype;
    const int64_t N = ap.tokens(), H = dims_.H, I = dims_.I;
    void *qkv = at(p, sv, ws, kSlotQkv), *ctx = at(p, sv, ws, kSlotCtx);
    void *r = at(p, sv, ws, kSlotResid), *h2 = at(p, sv, ws, kSlotLn2Out);
    void *u = at(p, sv, ws, kSlotPreGelu), *g = at(p, sv, ws, kSlotGelu), *t = at(p, sv, ws, kSlotTmpH);
    void *z = at(p, sv, ws, kSlotSum);
    const dst_gelu act = cfg_.gelu;

    DST_TRY(be.linear_fwd(dt, x, param(DST_PARAM_ATTN_QKVW), param(DST_PARAM_ATTN_QKVB), qkv, N, H, 3 * H,
                          nullptr, nullptr));
    DST_TRY(be.attention_fwd(dt, ap, qkv, ctx, at(p, sv, ws, kSlotLse)));
    DST_TRY(branch_residual_layernorm(ctx, DST_PARAM_ATTN_OW, DST_PARAM_ATTN_OB, H, x, t, r, DST_PARAM_ATTN_NW,
                                      DST_PARAM_ATTN_NB, h2, at(p, sv, ws, kSlotLn2Mean),
                                      at(p, sv, ws, kSlotLn2Rstd), N, d1));
    // Inference keeps no pre-activation (a backend may then skip storing it).
    DST_TRY(be.linear_fwd(dt, h2, param(DST_PARAM_INTER_W), param(DST_PARAM_INTER_B), g, N, H, I, &act,
                          training_ ? u : nullptr));
    DST_TRY(branch_residual_layernorm(g, DST_PARAM_OUTPUT_W, DST_PARAM_OUTPUT_B, I, h2, t, z, DST_PARAM_NORM_W,
                                      DST_PARAM_NORM_B, y, at(p, sv, ws, kSlotLn3Mean), at(p, sv, ws, kSlotLn3Rstd),
                                      N, d2));
    if (p.slot[kSlotOut].used)
        DST_TRY(be.copy(at(p, sv, ws, kSlotOut), y, static_cast<size_t>(N * H) * dtype_size(dt),
                        CopyKind::DeviceToDevice));
    return DST_OK;
}

dst_status Layer::check_capture(const char *fn) const {
    const bool dropout = cfg_.attn_dropout_ratio > 0.0f || cfg_.hidden_dropout_ratio > 0.0f;
    if (!training_ || !dropout || ctx_->graph_rng || !ctx_->backend->capturing()) return DST_OK;
    return ctx_->ensure_graph_rng(fn);  // refuses while capturing, naming fn
}

dst_status Layer::backward_packed(Saved *saved, const void *dy, void *dx, bool accumulate) {
    return backward(saved, dy, dx, accumulate);
}

// ---- backward -----------------------------------------------------------------------------------

dst_status Layer::backward(Saved *saved, const void *dy, void *dx, bool accumulate) {
    const int64_t packed_n = saved->packed ? saved->packed_n : 0;
    const Plan p = make_plan(cfg_, saved->B, saved->S, true, packed_n);
    Backend &be = backend();
    be.set_stochastic(cfg_.stochastic_mode != 0);
    be.set_allow_tf32(cfg_.allow_tf32 != 0);
    // The workspace first: a growth refused while the stream captures a CUDA graph then leaves nothing
    // queued in the capture.
    char *ws = nullptr;
    DST_TRY(workspace(p, saved->B, saved->S, saved->mask_kind, saved->mask_dtype, packed_n, &ws));
    if (cfg_.normalize_invertible) {
        // x̂ = (y − β)/γ needs every γ non-zero: checked before anything is written (the CPU backend),
        // or on the device without waiting (CUDA: a zero is reported by a later call).
        for (int gp : {DST_PARAM_ATTN_NW, DST_PARAM_NORM_W}) {
            char what[64];
            std::snprintf(what, sizeof what, "dst_layer_backward: parameter %s", param_name(gp));
            DST_TRY(be.check_nonzero_deferred(cfg_.dtype, param(gp), dims_.H, what,
                                              "; normalize_invertible recovers the LayerNorm input as "
                                              "(y - beta)/gamma and needs every gamma non-zero"));
        }
    }
    char *sv = static_cast<char *>(saved->mem);

    AttentionParams ap = attention_params(saved->B, saved->S);
    ap.mask_kind = saved->mask_kind;
    ap.mask = saved->mask_kind != DST_MASK_NONE ? at(p, sv, ws, kSlotMask) : nullptr;
    ap.mask_dtype = saved->mask_dtype;
    const uint32_t *hi = saved->rng_offset_hi;
    ap.dropout = site(saved->rng_seed, saved->rng_offset + 0, hi, cfg_.attn_dropout_ratio);
    DropoutSite d1 = site(saved->rng_seed, saved->rng_offset + 1, hi, cfg_.hidden_dropout_ratio);
    DropoutSite d2 = site(saved->rng_seed, saved->rng_offset + 2, hi, cfg_.hidden_dropout_ratio);
    if (saved->packed) pack(ap, d1, d2, at(p, sv, ws, kSlotMask), at(p, sv, ws, kSlotRows), packed_n);
    if (cfg_.pre_layer_norm) return backward_pre_ln(p, sv, ws, ap, d1, d2, dy, dx, accumulate);
    return backward_post_ln(p, sv, ws, ap, d1, d2, dy, dx, accumulate);
}

// FFN, from d_o = dropout'(dout) (the caller's, in kTmp1, which also took dbout): dWout; dg = d_o·Wout and
// du = dg·GELU'(u) in place, in kTmpI (the fused backend op never stores dg), with dbi; dWi.
dst_status Layer::backward_ffn(const Plan &p, char *sv, char *ws, int64_t N, bool acc) {
    Backend &be = backend();
    const dst_dtype dt = cfg_.dtype;
    const int64_t H = dims_.H, I = dims_.I;
    void *t1 = tmp(p, ws, kTmp1), *du = tmp(p, ws, kTmpI);
    void *u = at(p, sv, ws, kSlotPreGelu);
    void *g = at(p, sv, ws, kSlotGelu);
    if (!p.slot[kSlotGelu].kept) {  // gelu_checkpoint: recompute g into the buffer du takes next
        DST_TRY(be.gelu_fwd(dt, cfg_.gelu, u, du, N * I));
        g = du;
    }
    DST_TRY(be.linear_bwd_weight(dt, t1, g, grad(DST_PARAM_OUTPUT_W), nullptr, N, I, H, acc));
    DST_TRY(be.linear_bwd_data_gelu(dt, cfg_.gelu, t1, param(DST_PARAM_OUTPUT_W), u, du, du, N, I, H,
                                    grad(DST_PARAM_INTER_B), acc));
    return be.linear_bwd_weight(dt, du, at(p, sv, ws, kSlotLn2Out), grad(DST_PARAM_INTER_W), nullptr, N, H, I, acc);
}

// Attention, from da = dropout'(dr) (the caller's, in kTmp1, which also took dbo): dWo; dctx = da·Wo; dqkv
// (left in kTmpQkv); dWqkv, dbqkv from the QKV GEMM's input `qkv_in`.
dst_status Layer::backward_attention(const Plan &p, char *sv, char *ws, const AttentionParams &ap,
                                     const void *qkv_in, bool acc) {
    Backend &be = backend();
    const dst_dtype dt = cfg_.dtype;
    const int64_t N = ap.tokens(), H = dims_.H;
    void *t1 = tmp(p, ws, kTmp1), *t2 = tmp(p, ws, kTmp2), *dqkv = tmp(p, ws, kTmpQkv);
    DST_TRY(be.linear_bwd_weight(dt, t1, at(p, sv, ws, kSlotCtx), grad(DST_PARAM_ATTN_OW), nullptr, N, H, H, acc));
    DST_TRY(be.linear_bwd_data(dt, t1, param(DST_PARAM_ATTN_OW), t2, N, H, H, nullptr));
    DST_TRY(be.attention_bwd(dt, ap, at(p, sv, ws, kSlotQkv), at(p, sv, ws, kSlotCtx), t2, at(p, sv, ws, kSlotLse),
                             dqkv));
    return be.linear_bwd_weight(dt, dqkv, qkv_in, grad(DST_PARAM_ATTN_QKVW), grad(DST_PARAM_ATTN_QKVB), N, H,
                                3 * H, acc);
}

// The attention LayerNorm (LN2) backward, both orders: dr (kTmp3) = LN2'(dh2) + dresid (dresid may be
// nullptr), and da = dropout'(dr) (kTmp1) for backward_attention, with dbo = Σ da.
dst_status Layer::backward_attention_ln(const Plan &p, char *sv, char *ws, const void *dh2, const void *dresid,
                                        const DropoutSite &d1, int64_t N, bool acc) {
    const bool inv = cfg_.normalize_invertible;
    return backend().layernorm_dropout_bwd_bias_grad(
        cfg_.dtype, dh2, inv ? at(p, sv, ws, kSlotLn2Out) : at(p, sv, ws, kSlotResid), inv, param(DST_PARAM_ATTN_NW),
        param(DST_PARAM_ATTN_NB), at(p, sv, ws, kSlotLn2Mean), at(p, sv, ws, kSlotLn2Rstd), dresid,
        tmp(p, ws, kTmp3), grad(DST_PARAM_ATTN_NW), grad(DST_PARAM_ATTN_NB), N, dims_.H, acc, d1, tmp(p, ws, kTmp1),
        grad(DST_PARAM_ATTN_OB));
}

dst_status Layer::backward_pre_ln(const Plan &p, char *sv, char *ws, const AttentionParams &ap,
                                  const DropoutSite &d1, const DropoutSite &d2, const void *dy, void *dx,
                                  bool acc) {
    Backend &be = backend();
    const dst_dtype dt = cfg_.dtype;
    const int64_t N = ap.tokens(), H = dims_.H, I = dims_.I;
    const bool inv = cfg_.normalize_invertible;
    void *t1 = tmp(p, ws, kTmp1), *t2 = tmp(p, ws, kTmp2), *dr = tmp(p, ws, kTmp3);
    void *h = at(p, sv, ws, kSlotLn1Out);

    // FFN from dropout'(dy) (with dbout), then dh2 = du·Wi.
    DST_TRY(be.dropout_bwd_bias_grad(dt, dy, t1, N, H, d2, grad(DST_PARAM_OUTPUT_B), acc));
    DST_TRY(backward_ffn(p, sv, ws, N, acc));
    DST_TRY(be.linear_bwd_data(dt, tmp(p, ws, kTmpI), param(DST_PARAM_INTER_W), t2, N, H, I, nullptr));
    // Attention LN: dr = LN2'(dh2) + dy (residual stream), and dropout'(dr) into t1.
    DST_TRY(backward_attention_ln(p, sv, ws, t2, dy, d1, N, acc));
    // Attention, whose QKV GEMM read h = LN1(x); dh = dqkv·Wqkv.
    DST_TRY(backward_attention(p, sv, ws, ap, h, acc));
    DST_TRY(be.linear_bwd_data(dt, tmp(p, ws, kTmpQkv), param(DST_PARAM_ATTN_QKVW), t1, N, H, 3 * H, nullptr));
    // Input LN: dx = LN1'(dh) + dr.
    return be.layernorm_bwd(dt, t1, inv ? h : at(p, sv, ws, kSlotX), inv, param(DST_PARAM_NORM_W),
                            param(DST_PARAM_NORM_B), at(p, sv, ws, kSlotLn1Mean), at(p, sv, ws, kSlotLn1Rstd), dr,
                            dx, grad(DST_PARAM_NORM_W), grad(DST_PARAM_NORM_B), N, H, acc);
}

dst_status Layer::backward_post_ln(const Plan &p, char *sv, char *ws, const AttentionParams &ap,
                                   const DropoutSite &d1, const DropoutSite &d2, const void *dy, void *dx,
                                   bool acc) {
    Backend &be = backend();
    const dst_dtype dt = cfg_.dtype;
    const int64_t N = ap.tokens(), H = dims_.H, I = dims_.I;
    const bool inv = cfg_.normalize_invertible;
    void *t1 = tmp(p, ws, kTmp1), *t2 = tmp(p, ws, kTmp2), *dr = tmp(p, ws, kTmp3), *dz = tmp(p, ws, kTmp5);

    // Final LN: dz = LN'(dy), and dropout'(dz) into t1 for the FFN (with dbout).
    DST_TRY(be.layernorm_dropout_bwd_bias_grad(dt, dy, inv ? at(p, sv, ws, kSlotOut) : at(p, sv, ws, kSlotSum), inv,
                                               param(DST_PARAM_NORM_W), param(DST_PARAM_NORM_B),
                                               at(p, sv, ws, kSlotLn3Mean), at(p, sv, ws, kSlotLn3Rstd), nullptr, dz,
                                               grad(DST_PARAM_NORM_W), grad(DST_PARAM_NORM_B), N, H, acc, d2, t1,
                                               grad(DST_PARAM_OUTPUT_B)));
    // FFN, then dh2 = du·Wi + dz (the residual around the FFN).
    DST_TRY(backward_ffn(p, sv, ws, N, acc));
    DST_TRY(be.linear_bwd_data(dt, tmp(p, ws, kTmpI), param(DST_PARAM_INTER_W), t2, N, H, I, dz));
    // Attention LN: dr = LN2'(dh2), and dropout'(dr) into t1.
    DST_TRY(backward_attention_ln(p, sv, ws, t2, nullptr, d1, N, acc));
    // Attention, whose QKV GEMM read x directly; dx = dqkv·Wqkv + dr.
    DST_TRY(backward_attention(p, sv, ws, ap, at(p, sv, ws, kSlotX), acc));
    return be.linear_bwd_data(dt, tmp(p, ws, kTmpQkv), param(DST_PARAM_ATTN_QKVW), dx, N, H, 3 * H, dr);
}

}  // namespace dst
