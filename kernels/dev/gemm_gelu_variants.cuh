// The lab's other configurations of the fused GELU GEMMs (kernels/dev/gemm_gelu_lab.cu), FP16, one
// per file (gemm_gelu_variant{1,2,3}.cu) so that they compile in parallel. Variant 0 is the library's.
#ifndef DST_KERNELS_DEV_GEMM_GELU_VARIANTS_CUH
#define DST_KERNELS_DEV_GEMM_GELU_VARIANTS_CUH

#include <cuda_runtime_api.h>

#include <cstdint>

#include "dstransformer/dstransformer.h"

namespace lab {
// The variants' names, for the table (index 1..kVariants).
constexpr int kVariants = 3;
extern const char *const kVariantNames[kVariants + 1];
// Forward (u = x·Wᵀ + b, y = GELU(u)) and backward (du = (dy·W)·GELU'(u)) of each variant, FP16, with
// the library's argument conventions (kernels/gemm_gelu.cuh).
#define LAB_VARIANT(v)                                                                                              \
    cudaError_t variant##v##_fwd(cudaStream_t s, dst_gelu form, const void *x, const void *w, const void *b, void *y, \
                                 void *u, int64_t n, int64_t k, int64_t m, int sms);                                 \
    cudaError_t variant##v##_bwd(cudaStream_t s, dst_gelu form, const void *dy, const void *w, const void *u,         \
                                 void *du, int64_t n, int64_t k, int64_t m, int sms);                             \
    bool variant##v##_ok(int kind, int64_t n, int64_t k, int64_t m);
LAB_VARIANT(1)
LAB_VARIANT(2)
LAB_VARIANT(3)
#undef LAB_VARIANT
}  // namespace lab

#endif
