// Lab variant 5 of the fused GELU GEMMs: 128×256×64 tiles, clusters of 2 along N (the A tile multicast), cooperative (kernels/dev/gemm_gelu_variants.cuh).
#include "kernels/cutlass/gemm_gelu_impl.cuh"
#include "kernels/dev/gemm_gelu_variants.cuh"

namespace lab {
using Variant5 = dst::cuda::gemm_gelu::Config<128, 256, 64, 1, 2>;
DST_GEMM_GELU_DEFINE(variant5_fwd, variant5_bwd, variant5_ok, __half, Variant5, false)
}  // namespace lab
