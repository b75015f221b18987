// Lab variant 7 of the fused GELU GEMMs: 128×128×64 tiles, clusters of 2 along N, cooperative (kernels/dev/gemm_gelu_variants.cuh).
#include "kernels/cutlass/gemm_gelu_impl.cuh"
#include "kernels/dev/gemm_gelu_variants.cuh"

namespace lab {
using Variant7 = dst::cuda::gemm_gelu::Config<128, 128, 64, 1, 2>;
DST_GEMM_GELU_DEFINE(variant7_fwd, variant7_bwd, variant7_ok, __half, Variant7, false)
}  // namespace lab
