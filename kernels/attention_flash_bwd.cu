// Instantiations of the flash attention backward at the production tile shapes (one file per
// kernel family so that nvcc compiles them in parallel). See kernels/attention_flash_impl.cuh.
#include "kernels/attention_flash_impl.cuh"

namespace dst {
namespace cuda {
namespace flash {

cudaError_t bwd(const Params &p, bool bf16, int D, cudaStream_t stream) {
    return dispatch(bf16, D, [&](auto tag, auto dim) {
        using T = decltype(tag);
        constexpr int kD = decltype(dim)::value;
        using Ti = Tiles<kD>;
        return launch_bwd<T, kD, Ti::kBwdBM, Ti::kBwdNW, Ti::kBwdMB>(p, stream);
    });
}

}  // namespace flash
}  // namespace cuda
}  // namespace dst
