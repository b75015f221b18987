// Lab variant 11 of the fused GELU GEMMs: 64×256×64 tiles, no cluster, ping-pong (each warpgroup a 64×256 tile; its epilogue beside the other's main loop) (kernels/dev/gemm_gelu_variants.cuh).
#include "kernels/cutlass/gemm_gelu_impl.cuh"
#include "kernels/dev/gemm_gelu_variants.cuh"

namespace lab {
using Variant11 = dst::cuda::gemm_gelu::Config<64, 256, 64, 1, 1, cutlass::gemm::KernelTmaWarpSpecializedPingpong,
                                  cutlass::epilogue::TmaWarpSpecialized>;
DST_GEMM_GELU_DEFINE(variant11_fwd, variant11_bwd, variant11_ok, __half, Variant11, false)
}  // namespace lab
