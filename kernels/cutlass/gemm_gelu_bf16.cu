// The fused GELU GEMMs (kernels/cutlass/gemm_gelu_impl.cuh) for bf16 in the library's configurations
// (the forward kinds ForwardConfig, the backward DefaultConfig): one file per storage type, so that the
// two compile in parallel (each takes tens of seconds).
#include "kernels/cutlass/gemm_gelu_impl.cuh"

namespace dst {
namespace cuda {
namespace gemm_gelu {

DST_GEMM_GELU_DEFINE_FWD(bias_gelu_bf16, __nv_bfloat16, ForwardConfig, true)
DST_GEMM_GELU_DEFINE_BWD(dgelu_bf16, __nv_bfloat16, DefaultConfig, true)
DST_GEMM_GELU_DEFINE_OK(implementable_bf16, __nv_bfloat16, ForwardConfig, DefaultConfig)

}  // namespace gemm_gelu
}  // namespace cuda
}  // namespace dst
