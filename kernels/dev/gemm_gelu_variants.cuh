// The lab's other configurations of the fused GELU GEMMs (kernels/dev/gemm_gelu_lab.cu), FP16, one
// per file (gemm_gelu_variant{1,...,16}.cu) so that they compile in parallel. Variant 0 is the library's.
#ifndef DST_KERNELS_DEV_GEMM_GELU_VARIANTS_CUH
#define DST_KERNELS_DEV_GEMM_GELU_VARIANTS_CUH

#include <cuda_runtime_api.h>

#include <cstdint>

#include "dstransformer/dstransformer.h"

namespace lab {
// The variants' names, for the table (index 1..kVariants).
constexpr int kVariants = 18;
extern const char *const kVariantNames[kVariants + 1];
// What each variant computes: 0 the GELUs, 1 the lab's stand-ins, 2 the GEMM alone (Config's kMath).
extern const int kVariantMath[kVariants + 1];
// Forward (u = x·Wᵀ + b, y = GELU(u)) and backward (du = (dy·W)·GELU'(u)) of each variant, FP16, with
// the library's argument conventions (kernels/gemm_gelu.cuh).
#define LAB_VARIANT(v)                                                                                              \
    cudaError_t variant##v##_fwd(cudaStream_t s, dst_gelu form, const void *x, const void *w, const void *b, void *y, \
                                 void *u, int64_t n, int64_t k, int64_t m, int sms);                                 \
    cudaError_t variant##v##_bwd(cudaStream_t s, dst_gelu form, const void *dy, const void *w, const void *u,         \
                                 void *du, int64_t n, int64_t k, int64_t m, int sms, float *partial);             \
    bool variant##v##_ok(int kind, int64_t n, int64_t k, int64_t m);
LAB_VARIANT(1)
LAB_VARIANT(2)
LAB_VARIANT(3)
LAB_VARIANT(4)
LAB_VARIANT(5)
LAB_VARIANT(6)
LAB_VARIANT(7)
LAB_VARIANT(8)
LAB_VARIANT(9)
LAB_VARIANT(10)
LAB_VARIANT(11)
LAB_VARIANT(12)
LAB_VARIANT(13)
LAB_VARIANT(14)
LAB_VARIANT(15)
LAB_VARIANT(16)
LAB_VARIANT(17)
LAB_VARIANT(18)
#undef LAB_VARIANT
// The variants' launchers by number (index 0 unused: the library's are kernels/gemm_gelu.cuh's).
using FwdFn = decltype(&variant1_fwd);
using BwdFn = decltype(&variant1_bwd);
inline const FwdFn kFwd[kVariants + 1] = {nullptr, variant1_fwd, variant2_fwd, variant3_fwd, variant4_fwd, variant5_fwd,
                                          variant6_fwd, variant7_fwd, variant8_fwd, variant9_fwd, variant10_fwd,
                                          variant11_fwd, variant12_fwd, variant13_fwd, variant14_fwd,
                                          variant15_fwd, variant16_fwd, variant17_fwd, variant18_fwd};
inline const BwdFn kBwd[kVariants + 1] = {nullptr, variant1_bwd, variant2_bwd, variant3_bwd, variant4_bwd, variant5_bwd,
                                          variant6_bwd, variant7_bwd, variant8_bwd, variant9_bwd, variant10_bwd,
                                          variant11_bwd, variant12_bwd, variant13_bwd, variant14_bwd,
                                          variant15_bwd, variant16_bwd, variant17_bwd, variant18_bwd};
}  // namespace lab

#endif
