// Lab variant 9 of the fused GELU GEMMs: variant 3's GEMM alone (D = acc) (kernels/dev/gemm_gelu_variants.cuh).
#include "kernels/cutlass/gemm_gelu_impl.cuh"
#include "kernels/dev/gemm_gelu_variants.cuh"

namespace lab {
using Variant9 = dst::cuda::gemm_gelu::Config<128, 128, 64, 2, 1, cutlass::gemm::KernelTmaWarpSpecializedPingpong,
                                  cutlass::epilogue::TmaWarpSpecialized, 2>;
DST_GEMM_GELU_DEFINE(variant9_fwd, variant9_bwd, variant9_ok, __half, Variant9, false)
}  // namespace lab
