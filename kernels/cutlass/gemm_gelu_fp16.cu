// The fused GELU GEMMs (kernels/cutlass/gemm_gelu_impl.cuh) for fp16 in the library's configuration:
// one file per storage type, so that the two compile in parallel (each takes tens of seconds).
#include "kernels/cutlass/gemm_gelu_impl.cuh"

namespace dst {
namespace cuda {
namespace gemm_gelu {

DST_GEMM_GELU_DEFINE(bias_gelu_fp16, dgelu_fp16, implementable_fp16, __half, DefaultConfig, true)

}  // namespace gemm_gelu
}  // namespace cuda
}  // namespace dst
