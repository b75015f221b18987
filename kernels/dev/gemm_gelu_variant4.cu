// Lab variant 4 of the fused GELU GEMMs: 256×128×64 tiles, clusters of 2 along N, cooperative (each consumer warpgroup 128 rows) (kernels/dev/gemm_gelu_variants.cuh).
#include "kernels/cutlass/gemm_gelu_impl.cuh"
#include "kernels/dev/gemm_gelu_variants.cuh"

namespace lab {
using Variant4 = dst::cuda::gemm_gelu::Config<256, 128, 64, 1, 2>;
DST_GEMM_GELU_DEFINE(variant4_fwd, variant4_bwd, variant4_ok, __half, Variant4, false)
}  // namespace lab
