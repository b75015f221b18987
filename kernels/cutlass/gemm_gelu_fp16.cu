// The fused GELU GEMMs (kernels/cutlass/gemm_gelu_impl.cuh) for fp16 in the library's configurations
// (the forward kinds ForwardConfig, the backward DefaultConfig): one file per storage type, so that the
// two compile in parallel (each takes tens of seconds).
#include "kernels/cutlass/gemm_gelu_impl.cuh"

namespace dst {
namespace cuda {
namespace gemm_gelu {

DST_GEMM_GELU_DEFINE_FWD(bias_gelu_fp16, __half, ForwardConfig, true)
DST_GEMM_GELU_DEFINE_BWD(dgelu_fp16, __half, DefaultConfig, true)
DST_GEMM_GELU_DEFINE_OK(implementable_fp16, __half, ForwardConfig, DefaultConfig)

}  // namespace gemm_gelu
}  // namespace cuda
}  // namespace dst
