// Lab variant 15 of the fused GELU GEMMs: the library's backward configuration with 128×128 epilogue subtiles (kernels/dev/gemm_gelu_variants.cuh).
#include "kernels/cutlass/gemm_gelu_impl.cuh"
#include "kernels/dev/gemm_gelu_variants.cuh"

namespace lab {
using Variant15 = dst::cuda::gemm_gelu::Config<128, 256, 64, 2, 1, cutlass::gemm::KernelTmaWarpSpecializedCooperative,
                                                cutlass::epilogue::TmaWarpSpecializedCooperative, 0, true,
                                                cute::Shape<cute::_128, cute::_128>>;
DST_GEMM_GELU_DEFINE(variant15_fwd, variant15_bwd, variant15_ok, __half, Variant15, false)
}  // namespace lab
