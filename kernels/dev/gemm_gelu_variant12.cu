// Lab variant 12 of the fused GELU GEMMs: 64×256×64 tiles, clusters of 2 along M, ping-pong (kernels/dev/gemm_gelu_variants.cuh).
#include "kernels/cutlass/gemm_gelu_impl.cuh"
#include "kernels/dev/gemm_gelu_variants.cuh"

namespace lab {
using Variant12 = dst::cuda::gemm_gelu::Config<64, 256, 64, 2, 1, cutlass::gemm::KernelTmaWarpSpecializedPingpong,
                                  cutlass::epilogue::TmaWarpSpecialized>;
DST_GEMM_GELU_DEFINE(variant12_fwd, variant12_bwd, variant12_ok, __half, Variant12, false)
}  // namespace lab
