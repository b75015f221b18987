// Lab variant 14 of the fused GELU GEMMs: the library's backward configuration with 128×64 epilogue subtiles (CUTLASS's default: 128×32) (kernels/dev/gemm_gelu_variants.cuh).
#include "kernels/cutlass/gemm_gelu_impl.cuh"
#include "kernels/dev/gemm_gelu_variants.cuh"

namespace lab {
using Variant14 = dst::cuda::gemm_gelu::Config<128, 256, 64, 2, 1, cutlass::gemm::KernelTmaWarpSpecializedCooperative,
                                                cutlass::epilogue::TmaWarpSpecializedCooperative, 0, true,
                                                cute::Shape<cute::_128, cute::_64>>;
DST_GEMM_GELU_DEFINE(variant14_fwd, variant14_bwd, variant14_ok, __half, Variant14, false)
}  // namespace lab
