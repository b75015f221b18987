// Attention ops of the CUDA backend: FP16 and BF16 run the tensor-core flash kernels
// (kernels/attention_flash.cuh) for heads of up to kFlashMaxHeadDim, and the generic SIMT kernels
// (kernels/attention.cuh) for wider heads; FP32 and FP64 always run the SIMT kernels.
// Both take one description of the call, cuda::AttentionArgs, filled here once. Scratch (from the
// region set_scratch gave): the additive mask converted to the compute type when it is in another
// dtype, then the backward's row sums D (and, in stochastic mode, the fp32 dQ accumulator).
// Packed calls (AttentionParams::packed_tokens): the flash kernels run on the packed rows themselves
// (their spans, from the key lengths, after the kernels' scratch); the generic kernels on a padded
// copy after that: qkv (and in backward ctx, dctx) scattered into zeroed [B·S] rows, ctx (dqkv)
// gathered back. Either way the packed rows get the padded layout's results.
#include <cstdint>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_check.h"
#include "core/dtype.h"
#include "core/error.h"
#include "kernels/attention.cuh"
#include "kernels/attention_flash.cuh"
#include "kernels/dispatch.cuh"
#include "kernels/rows.cuh"

namespace dst {

namespace {

size_t align256(size_t v) { return (v + 255) / 256 * 256; }

// Whether the call runs the tensor-core kernels (else the generic ones).
bool use_flash(dst_dtype dt, const AttentionParams &p) {
    return (dt == DST_DTYPE_FP16 || dt == DST_DTYPE_BF16) && p.head_dim <= cuda::kFlashMaxHeadDim;
}

bool mask_in_compute_type(dst_dtype dt, dst_dtype mask_dtype) {
    return dt == DST_DTYPE_FP64 ? mask_dtype == DST_DTYPE_FP64 : mask_dtype == DST_DTYPE_FP32;
}

// Bytes of the additive mask converted to the compute type (0: used as it is).
size_t key_bias_bytes(dst_dtype dt, const AttentionParams &p) {
    if (p.mask_kind != DST_MASK_ADDITIVE || mask_in_compute_type(dt, p.mask_dtype)) return 0;
    return align256(size_t(p.batch * p.seq) * cuda::compute_size(dt));
}

dst_status check_mask(const AttentionParams &p) {
    if (p.mask_kind == DST_MASK_NONE) return DST_OK;
    if (!p.mask) return set_error(DST_ERR_INVALID_ARGUMENT, "cuda backend: attention mask is NULL");
    if (p.mask_kind == DST_MASK_KEY_LENGTHS && p.mask_dtype != DST_DTYPE_INT32)
        return set_error(DST_ERR_INVALID_ARGUMENT, "cuda backend: key lengths must be int32");
    if (p.mask_kind == DST_MASK_ADDITIVE && p.mask_dtype == DST_DTYPE_INT32)
        return set_error(DST_ERR_INVALID_ARGUMENT, "cuda backend: an additive mask cannot be int32");
    return DST_OK;
}

dst_status check_flash(const cuda::AttentionArgs &a) {
    const char *why = nullptr;
    if (!cuda::flash_attention_supported(a, &why))
        return set_error(DST_ERR_UNSUPPORTED, "cuda backend: attention: %s (batch %lld, seq %lld, heads %lld, head_dim %lld)",
                         why, static_cast<long long>(a.batch), static_cast<long long>(a.seq),
                         static_cast<long long>(a.heads), static_cast<long long>(a.head_dim));
    return DST_OK;
}

}  // namespace

cuda::AttentionArgs CudaBackend::attention_args(const AttentionParams &p, bool deterministic) {
    cuda::AttentionArgs a;
    a.batch = p.batch;
    a.seq = p.seq;
    a.heads = p.heads;
    a.head_dim = p.head_dim;
    a.hidden = p.hidden;
    a.scale = p.scale;
    a.causal = p.causal;
    if (p.mask_kind == DST_MASK_KEY_LENGTHS) a.key_len = static_cast<const int32_t *>(p.mask);
    a.seed = p.dropout.seed;
    a.offset = p.dropout.offset;
    a.offset_hi = p.dropout.offset_hi;
    a.threshold = p.dropout.threshold;
    a.drop_scale = p.dropout.scale;
    a.deterministic = deterministic;
    return a;
}

namespace {

// What a packed call keeps after the kernels' scratch (from `at` on): the spans (flash kernels), or the
// padded copies of qkv, ctx, dctx and dqkv over B·S rows (generic kernels).
struct Staging {
    size_t start = 0, rows_of = 0, qkv = 0, ctx = 0, dctx = 0, dqkv = 0, end = 0;
    Staging(dst_dtype dt, const AttentionParams &p, size_t at) {
        if (p.packed_tokens <= 0) {
            end = at;
            return;
        }
        if (use_flash(dt, p)) {
            start = at;
            rows_of = start + align256(size_t(p.batch) * 4);
            end = rows_of + align256(size_t(p.batch) * 4);
            return;
        }
        const size_t row = size_t(p.hidden) * dtype_size(dt), rows = size_t(p.batch * p.seq);
        qkv = at;
        ctx = qkv + align256(3 * rows * row);
        dctx = ctx + align256(rows * row);
        dqkv = dctx + align256(rows * row);
        end = dqkv + align256(3 * rows * row);
    }
};

AttentionParams padded_view(const AttentionParams &p) {
    AttentionParams q = p;
    q.rows = nullptr;
    q.packed_tokens = 0;
    return q;
}

}  // namespace

// The kernels' scratch (padded layout), then a packed call's staging.
size_t CudaBackend::attention_scratch(dst_dtype dt, const AttentionParams &p, bool stochastic) {
    const cuda::AttentionArgs a = attention_args(p, !stochastic);
    const size_t bwd =
        use_flash(dt, p) ? cuda::flash_attention_bwd_workspace(a) : cuda::attention_bwd_workspace(dt, a);
    return Staging(dt, p, key_bias_bytes(dt, p) + align256(bwd)).end;
}

dst_status CudaBackend::set_key_bias(dst_dtype dt, const AttentionParams &p, void *scratch, cuda::AttentionArgs *a) {
    if (key_bias_bytes(dt, p) > 0) {
        DST_CUDA_CHECK(cuda::attention_key_bias(stream_, dt, p.mask_dtype, p.mask, scratch, p.batch * p.seq));
        a->key_bias = scratch;
    } else if (p.mask_kind == DST_MASK_ADDITIVE) {
        a->key_bias = p.mask;
    }
    return DST_OK;
}

// The flash kernels' packed layout: spans from the key lengths into the scratch at `start`/`rows`.
dst_status CudaBackend::packed_spans(const AttentionParams &p, char *ws, size_t start, size_t rows,
                                     cuda::AttentionArgs *a) {
    int32_t *st = reinterpret_cast<int32_t *>(ws + start), *rw = reinterpret_cast<int32_t *>(ws + rows);
    DST_CUDA_CHECK(cuda::flash_packed_spans(stream_, static_cast<const int32_t *>(p.mask), p.batch, p.seq,
                                            p.packed_tokens, st, rw));
    a->seq_start = st;
    a->key_len = rw;
    return DST_OK;
}

dst_status CudaBackend::attention_fwd(dst_dtype dt, const AttentionParams &p, const void *qkv, void *ctx,
                                      void *lse) {
    DST_TRY(activate());
    DST_TRY(check_mask(p));
    if (p.batch <= 0 || p.seq <= 0 || p.heads <= 0) return DST_OK;
    const bool packed = p.packed_tokens > 0;
    const size_t bias_bytes = key_bias_bytes(dt, p);
    const AttentionParams pp = padded_view(p);
    const Staging st(dt, p, attention_scratch(dt, pp, stochastic_));  // st.end: attention_scratch(dt, p, …)
    char *ws = nullptr;
    DST_TRY(workspace(packed ? st.end : bias_bytes, reinterpret_cast<void **>(&ws)));
    const int64_t rows = p.batch * p.seq, H = p.hidden;
    const bool flash = use_flash(dt, pp), staged = packed && !flash;
    cuda::AttentionArgs a = attention_args(pp, !stochastic_);
    void *kctx = ctx;
    if (staged) {
        DST_CUDA_CHECK(cuda::scatter_rows(stream_, dt, qkv, p.rows, ws + st.qkv, rows, p.packed_tokens, 3 * H, false));
        qkv = ws + st.qkv;
        kctx = ws + st.ctx;
    } else if (packed) {
        DST_TRY(packed_spans(p, ws, st.start, st.rows_of, &a));
    }
    DST_TRY(set_key_bias(dt, pp, ws, &a));
    if (!flash) {
        DST_CUDA_CHECK(cuda::attention_fwd(stream_, dt, a, qkv, kctx, lse));
    } else {
        DST_TRY(check_flash(a));
        DST_CUDA_CHECK(
            cuda::flash_attention_fwd(stream_, dt == DST_DTYPE_BF16, a, qkv, kctx, static_cast<float *>(lse)));
    }
    if (staged) DST_CUDA_CHECK(cuda::gather_rows(stream_, dt, kctx, p.rows, ctx, rows, p.packed_tokens, H));
    return DST_OK;
}

dst_status CudaBackend::attention_bwd(dst_dtype dt, const AttentionParams &p, const void *qkv, const void *ctx,
                                      const void *dctx, const void *lse, void *dqkv) {
    DST_TRY(activate());
    DST_TRY(check_mask(p));
    if (p.batch <= 0 || p.seq <= 0 || p.heads <= 0) return DST_OK;
    if (!lse) return set_error(DST_ERR_INVALID_ARGUMENT, "cuda backend: attention_bwd needs the forward's lse");
    const bool packed = p.packed_tokens > 0;
    const size_t bias_bytes = key_bias_bytes(dt, p);
    const AttentionParams pp = padded_view(p);
    const Staging st(dt, p, attention_scratch(dt, pp, stochastic_));  // st.end: attention_scratch(dt, p, …)
    char *ws = nullptr;
    DST_TRY(workspace(st.end, reinterpret_cast<void **>(&ws)));
    const int64_t rows = p.batch * p.seq, H = p.hidden, N = p.packed_tokens;
    const bool flash = use_flash(dt, pp), staged = packed && !flash;
    cuda::AttentionArgs a = attention_args(pp, !stochastic_);
    void *kdqkv = dqkv;
    if (packed && flash) DST_TRY(packed_spans(p, ws, st.start, st.rows_of, &a));
    if (staged) {
        DST_CUDA_CHECK(cuda::scatter_rows(stream_, dt, qkv, p.rows, ws + st.qkv, rows, N, 3 * H, false));
        DST_CUDA_CHECK(cuda::scatter_rows(stream_, dt, ctx, p.rows, ws + st.ctx, rows, N, H, false));
        DST_CUDA_CHECK(cuda::scatter_rows(stream_, dt, dctx, p.rows, ws + st.dctx, rows, N, H, false));
        qkv = ws + st.qkv;
        ctx = ws + st.ctx;
        dctx = ws + st.dctx;
        kdqkv = ws + st.dqkv;
    }
    DST_TRY(set_key_bias(dt, pp, ws, &a));
    if (!flash) {
        DST_CUDA_CHECK(cuda::attention_bwd(stream_, dt, a, qkv, ctx, dctx, lse, kdqkv, ws + bias_bytes));
    } else {
        DST_TRY(check_flash(a));
        DST_CUDA_CHECK(cuda::flash_attention_bwd(stream_, dt == DST_DTYPE_BF16, a, qkv, ctx, dctx,
                                                 static_cast<const float *>(lse), kdqkv, ws + bias_bytes));
    }
    if (staged) DST_CUDA_CHECK(cuda::gather_rows(stream_, dt, kdqkv, p.rows, dqkv, rows, N, 3 * H));
    return DST_OK;
}

}  // namespace dst
