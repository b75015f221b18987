// The lab's other configurations of the fused GELU GEMMs (kernels/dev/gemm_gelu_lab.cu), FP16, one
// per file (gemm_gelu_variant{1,...,5}.cu) so that they compile in parallel. Variant 0 is the library's.
#ifndef DST_KERNELS_DEV_GEMM_GELU_VARIANTS_CUH
#define DST_KERNELS_DEV_GEMM_GELU_VARIANTS_CUH

#include <cuda_runtime_api.h>

#include <cstdint>

#include "dstransformer/dstransformer.h"

namespace lab {
// The variants' names, for the table (index 1..kVariants).
constexpr int kVariants = 5;
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
LAB_VARIANT(4)
LAB_VARIANT(5)
#undef LAB_VARIANT
// The variants' launchers by number (index 0 unused: the library's are kernels/gemm_gelu.cuh's).
using FwdFn = decltype(&variant1_fwd);
using BwdFn = decltype(&variant1_bwd);
inline const FwdFn kFwd[kVariants + 1] = {nullptr, variant1_fwd, variant2_fwd, variant3_fwd, variant4_fwd, variant5_fwd};
inline const BwdFn kBwd[kVariants + 1] = {nullptr, variant1_bwd, variant2_bwd, variant3_bwd, variant4_bwd, variant5_bwd};
}  // namespace lab

#endif
