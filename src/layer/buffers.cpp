#include "layer/buffers.h"

#include <algorithm>

#include "core/dtype.h"
#include "layer/config.h"

namespace dst {

static size_t align256(size_t n) { return (n + 255) & ~size_t(255); }

Plan make_plan(const dst_layer_config &cfg, int64_t B, int64_t S, bool training, int64_t packed_tokens) {
    const Dims dm = config_dims(cfg);
    const bool packed = packed_tokens > 0;
    const size_t N = static_cast<size_t>(packed ? packed_tokens : B * S);
    const size_t es = dtype_size(cfg.dtype), ss = stat_size(cfg.dtype);
    const size_t H = static_cast<size_t>(dm.H), I = static_cast<size_t>(dm.I);
    const size_t BhS = static_cast<size_t>(B) * static_cast<size_t>(dm.heads) * static_cast<size_t>(S);
    const bool pre = cfg.pre_layer_norm, inv = cfg.normalize_invertible;
    const bool gck = cfg.gelu_checkpoint;

    Plan p;
    auto set = [&](Slot s, size_t bytes, bool used, bool kept) {
        p.slot[s].bytes = bytes;
        p.slot[s].used = used;
        p.slot[s].kept = training && used && kept;
    };
    // x is the caller's buffer during forward; it is copied only when backward needs it.
    set(kSlotX, N * H * es, true, pre ? !inv : true);
    p.slot[kSlotX].used = p.slot[kSlotX].kept;
    set(kSlotLn1Out, N * H * es, pre, true);
    set(kSlotLn1Mean, N * ss, pre, !inv);
    set(kSlotLn1Rstd, N * ss, pre, true);
    set(kSlotQkv, N * 3 * H * es, true, true);
    set(kSlotCtx, N * H * es, true, true);
    // Backward recomputes P = exp(score − lse) and regenerates the dropout mask, so the row
    // statistics are all attention keeps; attn_dropout_checkpoint has nothing left to drop.
    set(kSlotLse, BhS * ss, training, true);
    set(kSlotResid, N * H * es, true, !inv);
    set(kSlotLn2Out, N * H * es, true, true);
    set(kSlotLn2Mean, N * ss, true, !inv);
    set(kSlotLn2Rstd, N * ss, true, true);
    // Inference passes FC1 no pre-activation (GELU applied to the GEMM's output in place, or in its
    // epilogue): u exists in training only.
    set(kSlotPreGelu, N * I * es, training, true);
    set(kSlotGelu, N * I * es, true, !gck);
    set(kSlotSum, N * H * es, !pre, !inv);
    set(kSlotOut, N * H * es, !pre && inv && training, true);
    set(kSlotLn3Mean, N * ss, !pre, !inv);
    set(kSlotLn3Rstd, N * ss, !pre, true);
    if (packed) {
        set(kSlotMask, static_cast<size_t>(B) * 4, training, true);  // inference reads them in kSlotPackWs
        set(kSlotRows, N * 4, training, true);
        set(kSlotPackWs, align256(static_cast<size_t>(B) * 4) + N * 4, true, false);
    } else {
        set(kSlotMask, static_cast<size_t>(B * S) * std::max<size_t>(4, es), training, true);
        set(kSlotRows, 0, false, false);
        set(kSlotPackWs, 0, false, false);
    }
    // Written only by a forward captured into a CUDA graph (Layer::run_forward), but kept by every
    // training forward with dropout, so that the saved size does not depend on how the call is made.
    set(kSlotRng, 4, training && (cfg.attn_dropout_ratio > 0.0f || cfg.hidden_dropout_ratio > 0.0f), true);
    set(kSlotTmpH, N * H * es, true, false);

    size_t saved = 0, ws = 0;
    for (int s = 0; s < kSlotCount; ++s) {
        if (!p.slot[s].used) continue;
        size_t &cursor = p.slot[s].kept ? saved : ws;
        p.offset[s] = cursor;
        cursor += align256(p.slot[s].bytes);
    }
    p.saved_bytes = saved;
    p.fwd_workspace = ws;

    const size_t temp_bytes[kTempCount] = {N * H * es, N * H * es, N * H * es, pre ? 0 : N * H * es,
                                           N * 3 * H * es, N * I * es};
    size_t bws = 0;
    for (int t = 0; t < kTempCount; ++t) {
        p.temp_offset[t] = bws;
        bws += align256(temp_bytes[t]);
    }
    p.bwd_workspace = training ? bws : 0;
    return p;
}

ScratchNeeds scratch_needs(const dst_layer_config &cfg, int64_t B, int64_t S, dst_mask_kind mask,
                           dst_dtype mask_dtype, int64_t packed_tokens) {
    const Dims dm = config_dims(cfg);
    ScratchNeeds n;
    n.dt = cfg.dtype;
    n.gemm = true;
    n.rows = packed_tokens > 0 ? packed_tokens : B * S;
    n.attn.packed_tokens = packed_tokens;
    n.ln_width = dm.H;
    n.colsum_width = std::max<int64_t>(3 * dm.H, dm.I);
    n.dgelu_width = dm.I;
    n.attention = true;
    n.attn.batch = B;
    n.attn.seq = S;
    n.attn.heads = dm.heads;
    n.attn.head_dim = dm.d;
    n.attn.hidden = dm.H;
    n.attn.causal = cfg.causal != 0;
    n.attn.mask_kind = mask;
    n.attn.mask_dtype = mask_dtype;
    n.stochastic = cfg.stochastic_mode != 0;
    return n;
}

size_t scratch_offset(const Plan &p) { return align256(std::max(p.fwd_workspace, p.bwd_workspace)); }

const char *slot_name(Slot s) {
    static const char *const names[kSlotCount] = {
        "x", "ln1_out", "ln1_mean", "ln1_rstd", "qkv", "ctx", "lse", "resid", "ln2_out",
        "ln2_mean", "ln2_rstd", "pre_gelu", "gelu", "sum", "out", "ln3_mean", "ln3_rstd", "mask", "rows",
        "pack_ws", "rng", "tmp_h"};
    return (s >= 0 && s < kSlotCount) ? names[s] : "?";
}

}  // namespace dst
