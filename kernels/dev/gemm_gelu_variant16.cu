// Lab variant 16 of the fused GELU GEMMs: the library's unclustered backward configuration (gemm_gelu_unclustered)
// with 128×64 epilogue subtiles (kernels/dev/gemm_gelu_variants.cuh). (128×16 subtiles do not compile:
// the backward's column-sum reduction needs a larger epilogue tile.)
#include "kernels/cutlass/gemm_gelu_impl.cuh"
#include "kernels/dev/gemm_gelu_variants.cuh"

namespace lab {
using Variant16 = dst::cuda::gemm_gelu::Config<128, 256, 64, 1, 1, cutlass::gemm::KernelTmaWarpSpecializedCooperative,
                                                cutlass::epilogue::TmaWarpSpecializedCooperative, 0, true,
                                                cute::Shape<cute::_128, cute::_64>>;
DST_GEMM_GELU_DEFINE(variant16_fwd, variant16_bwd, variant16_ok, __half, Variant16, false)
}  // namespace lab
