// Lab variant 18 of the fused GELU GEMMs: variant 8 (128×128×64 tiles, no cluster, ping-pong) with 64×128 epilogue subtiles (CUTLASS's default there: 64×32) (kernels/dev/gemm_gelu_variants.cuh).
#include "kernels/cutlass/gemm_gelu_impl.cuh"
#include "kernels/dev/gemm_gelu_variants.cuh"

namespace lab {
using Variant18 = dst::cuda::gemm_gelu::Config<128, 128, 64, 1, 1, cutlass::gemm::KernelTmaWarpSpecializedPingpong,
                                                cutlass::epilogue::TmaWarpSpecialized, 0, false,
                                                cute::Shape<cute::_64, cute::_128>>;
DST_GEMM_GELU_DEFINE(variant18_fwd, variant18_bwd, variant18_ok, __half, Variant18, false)
}  // namespace lab
