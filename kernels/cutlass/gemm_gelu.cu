// kernels/gemm_gelu.cuh's entry points: which calls the fused GELU GEMMs take, and the dtype dispatch
// to the per-type files of this folder.
#include "kernels/gemm_gelu.cuh"

#include "kernels/launch.cuh"

#include <cstdint>

namespace dst {
namespace cuda {
namespace gemm_gelu {

cudaError_t bias_gelu_fp16(cudaStream_t, dst_gelu, const void *, const void *, const void *, void *, void *, int64_t,
                           int64_t, int64_t, int);
cudaError_t bias_gelu_bf16(cudaStream_t, dst_gelu, const void *, const void *, const void *, void *, void *, int64_t,
                           int64_t, int64_t, int);
cudaError_t dgelu_fp16(cudaStream_t, dst_gelu, const void *, const void *, const void *, void *, int64_t, int64_t,
                       int64_t, int, float *);
cudaError_t dgelu_bf16(cudaStream_t, dst_gelu, const void *, const void *, const void *, void *, int64_t, int64_t,
                       int64_t, int, float *);
bool implementable_fp16(int kind, int64_t n, int64_t k, int64_t m);
bool implementable_bf16(int kind, int64_t n, int64_t k, int64_t m);
// The backward without a cluster (gemm_gelu_*_single.cu).
cudaError_t dgelu_fp16_single(cudaStream_t, dst_gelu, const void *, const void *, const void *, void *, int64_t,
                              int64_t, int64_t, int, float *);
cudaError_t dgelu_bf16_single(cudaStream_t, dst_gelu, const void *, const void *, const void *, void *, int64_t,
                              int64_t, int64_t, int, float *);
bool dgelu_implementable_fp16_single(int64_t n, int64_t k, int64_t m);
bool dgelu_implementable_bf16_single(int64_t n, int64_t k, int64_t m);

}  // namespace gemm_gelu

bool gemm_gelu_shape_ok(dst_dtype dt, GemmGeluKind kind, int64_t n, int64_t k, int64_t m) {
    if (dt != DST_DTYPE_FP16 && dt != DST_DTYPE_BF16) return false;
    // Rows: any count (TMA clips the last tile). k and m are row lengths: 16-byte strides for TMA.
    if (n <= 0 || n >= (int64_t(1) << 31)) return false;
    for (const int64_t d : {k, m})
        if (d <= 0 || d % 8 != 0 || d >= (int64_t(1) << 31)) return false;
    const bool fp16 = dt == DST_DTYPE_FP16;
    if (!(fp16 ? gemm_gelu::implementable_fp16(kind, n, k, m) : gemm_gelu::implementable_bf16(kind, n, k, m)))
        return false;
    // The backward's second configuration (a call may take either: gemm_gelu_unclustered).
    return kind != kGeluBackward || (fp16 ? gemm_gelu::dgelu_implementable_fp16_single(n, k, m)
                                          : gemm_gelu::dgelu_implementable_bf16_single(n, k, m));
}

bool gemm_gelu_runs(dst_dtype dt, GemmGeluKind kind, int64_t n, int64_t k, int64_t m, const void *const *ptrs,
                    int nptrs) {
    for (int i = 0; i < nptrs; ++i)
        if (!ptrs[i] || reinterpret_cast<uintptr_t>(ptrs[i]) % 16 != 0) return false;
    return gemm_gelu_shape_ok(dt, kind, n, k, m) && current_device_is_sm90();
}

cudaError_t gemm_bias_gelu(cudaStream_t stream, dst_dtype dt, dst_gelu form, const void *x, const void *w,
                           const void *b, void *y, void *u, int64_t n, int64_t k, int64_t m, int sm_count) {
    if ((dt != DST_DTYPE_FP16 && dt != DST_DTYPE_BF16) || u == y) return cudaErrorInvalidValue;
    auto *launch = dt == DST_DTYPE_FP16 ? gemm_gelu::bias_gelu_fp16 : gemm_gelu::bias_gelu_bf16;
    return launch(stream, form, x, w, b, y, u, n, k, m, sm_count);
}

cudaError_t gemm_dgelu(cudaStream_t stream, dst_dtype dt, dst_gelu form, const void *dy, const void *w,
                       const void *u, void *du, int64_t n, int64_t k, int64_t m, int sm_count, float *partial) {
    if (dt != DST_DTYPE_FP16 && dt != DST_DTYPE_BF16) return cudaErrorInvalidValue;
    if (partial && reinterpret_cast<uintptr_t>(partial) % 16 != 0) return cudaErrorInvalidValue;
    auto *launch = gemm_gelu_unclustered(n, k, sm_count)
                       ? (dt == DST_DTYPE_FP16 ? gemm_gelu::dgelu_fp16_single : gemm_gelu::dgelu_bf16_single)
                       : (dt == DST_DTYPE_FP16 ? gemm_gelu::dgelu_fp16 : gemm_gelu::dgelu_bf16);
    return launch(stream, form, dy, w, u, du, n, k, m, sm_count, partial);
}

}  // namespace cuda
}  // namespace dst
