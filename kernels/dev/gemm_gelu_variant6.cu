// Lab variant 6 of the fused GELU GEMMs: 128×128×64 tiles, no cluster, cooperative (kernels/dev/gemm_gelu_variants.cuh).
#include "kernels/cutlass/gemm_gelu_impl.cuh"
#include "kernels/dev/gemm_gelu_variants.cuh"

namespace lab {
using Variant6 = dst::cuda::gemm_gelu::Config<128, 128, 64, 1, 1>;
DST_GEMM_GELU_DEFINE(variant6_fwd, variant6_bwd, variant6_ok, __half, Variant6, false)
}  // namespace lab
