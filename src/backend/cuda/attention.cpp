// Attention ops of the CUDA backend: FP16 and BF16 run the tensor-core flash kernels
// (kernels/attention_flash.cuh) for heads of up to kFlashMaxHeadDim, and the generic SIMT kernels
// (kernels/attention.cuh) for wider heads; FP32 and FP64 always run the SIMT kernels.
// Both take one description of the call, cuda::AttentionArgs, filled here once. Scratch (from the
// region set_scratch gave): the additive mask converted to the compute type when it is in another
// dtype, then the backward's row sums D (and, in stochastic mode, the fp32 dQ accumulator).
#include <cstdint>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_check.h"
#include "core/error.h"
#include "kernels/attention.cuh"
#include "kernels/attention_flash.cuh"
#include "kernels/dispatch.cuh"

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
    a.threshold = p.dropout.threshold;
    a.drop_scale = p.dropout.scale;
    a.deterministic = deterministic;
    return a;
}

size_t CudaBackend::attention_scratch(dst_dtype dt, const AttentionParams &p, bool stochastic) {
    const cuda::AttentionArgs a = attention_args(p, !stochastic);
    const size_t bwd =
        use_flash(dt, p) ? cuda::flash_attention_bwd_workspace(a) : cuda::attention_bwd_workspace(dt, a);
    return key_bias_bytes(dt, p) + align256(bwd);
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

dst_status CudaBackend::attention_fwd(dst_dtype dt, const AttentionParams &p, const void *qkv, void *ctx,
                                      void *lse) {
    DST_TRY(activate());
    DST_TRY(check_mask(p));
    if (p.batch <= 0 || p.seq <= 0 || p.heads <= 0) return DST_OK;
    const size_t bias_bytes = key_bias_bytes(dt, p);
    void *ws = nullptr;
    DST_TRY(workspace(bias_bytes, &ws));
    cuda::AttentionArgs a = attention_args(p, !stochastic_);
    DST_TRY(set_key_bias(dt, p, ws, &a));
    if (!use_flash(dt, p)) {
        DST_CUDA_CHECK(cuda::attention_fwd(stream_, dt, a, qkv, ctx, lse));
        return DST_OK;
    }
    DST_TRY(check_flash(a));
    DST_CUDA_CHECK(cuda::flash_attention_fwd(stream_, dt == DST_DTYPE_BF16, a, qkv, ctx, static_cast<float *>(lse)));
    return DST_OK;
}

dst_status CudaBackend::attention_bwd(dst_dtype dt, const AttentionParams &p, const void *qkv, const void *ctx,
                                      const void *dctx, const void *lse, void *dqkv) {
    DST_TRY(activate());
    DST_TRY(check_mask(p));
    if (p.batch <= 0 || p.seq <= 0 || p.heads <= 0) return DST_OK;
    if (!lse) return set_error(DST_ERR_INVALID_ARGUMENT, "cuda backend: attention_bwd needs the forward's lse");
    const size_t bias_bytes = key_bias_bytes(dt, p);
    char *ws = nullptr;
    DST_TRY(workspace(attention_scratch(dt, p, stochastic_), reinterpret_cast<void **>(&ws)));
    cuda::AttentionArgs a = attention_args(p, !stochastic_);
    DST_TRY(set_key_bias(dt, p, ws, &a));
    if (!use_flash(dt, p)) {
        DST_CUDA_CHECK(cuda::attention_bwd(stream_, dt, a, qkv, ctx, dctx, lse, dqkv, ws + bias_bytes));
        return DST_OK;
    }
    DST_TRY(check_flash(a));
    DST_CUDA_CHECK(cuda::flash_attention_bwd(stream_, dt == DST_DTYPE_BF16, a, qkv, ctx, dctx,
                                             static_cast<const float *>(lse), dqkv, ws + bias_bytes));
    return DST_OK;
}

}  // namespace dst
