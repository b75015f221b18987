// Lab variant 13 of the fused GELU GEMMs: the library's backward configuration (its forward's until the twenty-fourth session), the GEMM alone (D = x·Wᵀ, no visitor tree): the floor of its main loop (kernels/dev/gemm_gelu_variants.cuh).
#include "kernels/cutlass/gemm_gelu_impl.cuh"
#include "kernels/dev/gemm_gelu_variants.cuh"

namespace lab {
using Variant13 = dst::cuda::gemm_gelu::Config<128, 256, 64, 2, 1, cutlass::gemm::KernelTmaWarpSpecializedCooperative,
                                                cutlass::epilogue::TmaWarpSpecializedCooperative, 2>;
DST_GEMM_GELU_DEFINE(variant13_fwd, variant13_bwd, variant13_ok, __half, Variant13, false)
}  // namespace lab
