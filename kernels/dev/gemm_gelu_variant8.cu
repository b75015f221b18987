// Lab variant 8 of the fused GELU GEMMs: 128×128×64 tiles, no cluster, ping-pong (one warpgroup's epilogue beside the other's main loop): the library's forward configuration (ForwardConfig), a control for the timings (kernels/dev/gemm_gelu_variants.cuh).
#include "kernels/cutlass/gemm_gelu_impl.cuh"
#include "kernels/dev/gemm_gelu_variants.cuh"

namespace lab {
using Variant8 = dst::cuda::gemm_gelu::Config<128, 128, 64, 1, 1, cutlass::gemm::KernelTmaWarpSpecializedPingpong,
                                  cutlass::epilogue::TmaWarpSpecialized>;
DST_GEMM_GELU_DEFINE(variant8_fwd, variant8_bwd, variant8_ok, __half, Variant8, false)
}  // namespace lab
