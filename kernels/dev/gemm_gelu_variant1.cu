// Lab variant 1 of the fused GELU GEMMs: 128×128×64 tiles, clusters of 2 along M, cooperative (kernels/dev/gemm_gelu_variants.cuh).
#include "kernels/cutlass/gemm_gelu_impl.cuh"
#include "kernels/dev/gemm_gelu_variants.cuh"

namespace lab {
using Variant1 = dst::cuda::gemm_gelu::Config<128, 128, 64, 2, 1>;
DST_GEMM_GELU_DEFINE(variant1_fwd, variant1_bwd, variant1_ok, __half, Variant1, false)
const char *const kVariantNames[kVariants + 1] = {
    "library: fwd 128x128x64 ping-pong; bwd 128x256x64 cluster 2x1 (1x1 where pairs cost a round)", "128x128x64, cluster 2x1, cooperative",
    "128x256x64, cluster 1x1, cooperative",           "128x128x64, cluster 2x1, ping-pong",
    "256x128x64, cluster 1x2, cooperative",           "128x256x64, cluster 1x2, cooperative",
    "128x128x64, cluster 1x1, cooperative",
    "128x128x64, cluster 1x2, cooperative",
    "128x128x64, cluster 1x1, ping-pong (library fwd)",
    "128x128x64, cluster 2x1, ping-pong: GEMM alone",
    "128x256x64, cluster 2x1, cooperative: identity",
    "64x256x64, cluster 1x1, ping-pong",
    "64x256x64, cluster 2x1, ping-pong",
    "128x256x64, cluster 2x1, cooperative: GEMM alone",
    "128x256x64, cluster 2x1, coop., subtiles 128x64",
    "128x256x64, cluster 2x1, coop., subtiles 128x128",
    "128x256x64, cluster 1x1, coop., subtiles 128x64",
    "128x128x64, cluster 1x1, ping-pong, subtiles 64x64",
    "128x128x64, cluster 1x1, ping-pong, subtiles 64x128"};
// What each computes (Config's kMath): 0 the GELUs (checked against the library), 1 the stand-ins (u
// checked), 2 the GEMM alone (not checked).
const int kVariantMath[kVariants + 1] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 2, 1, 0, 0, 2, 0, 0, 0, 0, 0};
}  // namespace lab
