// Lab variant 10 of the fused GELU GEMMs: the library's configuration with the identity (forward) and a product (backward) in the GELUs' place (kernels/dev/gemm_gelu_variants.cuh).
#include "kernels/cutlass/gemm_gelu_impl.cuh"
#include "kernels/dev/gemm_gelu_variants.cuh"

namespace lab {
using Variant10 = dst::cuda::gemm_gelu::Config<128, 256, 64, 2, 1, cutlass::gemm::KernelTmaWarpSpecializedCooperative,
                                  cutlass::epilogue::TmaWarpSpecializedCooperative, 1>;
DST_GEMM_GELU_DEFINE(variant10_fwd, variant10_bwd, variant10_ok, __half, Variant10, false)
}  // namespace lab
