// Lab variant 2 of the fused GELU GEMMs: 128×256×64 tiles, no cluster (no multicast), cooperative (kernels/dev/gemm_gelu_variants.cuh).
#include "kernels/cutlass/gemm_gelu_impl.cuh"
#include "kernels/dev/gemm_gelu_variants.cuh"

namespace lab {
using Variant2 = dst::cuda::gemm_gelu::Config<128, 256, 64, 1, 1>;
DST_GEMM_GELU_DEFINE(variant2_fwd, variant2_bwd, variant2_ok, __half, Variant2, false)
}  // namespace lab
