// The fused GELU GEMMs' backward (kernels/cutlass/gemm_gelu_impl.cuh) for fp16 in the configuration
// without a cluster (SingleConfig), which gemm_gelu.cu takes where the library configuration's pairs of
// blocks would cost a round of tiles (gemm_gelu_unclustered; the forward kinds have no cluster). A file
// of its own, to compile in parallel.
#include "kernels/cutlass/gemm_gelu_impl.cuh"

namespace dst {
namespace cuda {
namespace gemm_gelu {

DST_GEMM_GELU_DEFINE_BWD(dgelu_fp16_single, __half, SingleConfig, true)
DST_GEMM_GELU_DEFINE_BWD_OK(dgelu_implementable_fp16_single, __half, SingleConfig)

}  // namespace gemm_gelu
}  // namespace cuda
}  // namespace dst
