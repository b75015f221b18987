// Lab variant 3 of the fused GELU GEMMs: 128×128×64 tiles, clusters of 2 along M, ping-pong (each consumer warpgroup its own tile) (kernels/dev/gemm_gelu_variants.cuh).
#include "kernels/cutlass/gemm_gelu_impl.cuh"
#include "kernels/dev/gemm_gelu_variants.cuh"

namespace lab {
using Variant3 = dst::cuda::gemm_gelu::Config<128, 128, 64, 2, 1, cutlass::gemm::KernelTmaWarpSpecializedPingpong,
                                  cutlass::epilogue::TmaWarpSpecialized>;
DST_GEMM_GELU_DEFINE(variant3_fwd, variant3_bwd, variant3_ok, __half, Variant3, false)
}  // namespace lab
