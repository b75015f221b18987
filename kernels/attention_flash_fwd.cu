// Instantiations of the flash attention forward at the production tile shapes (one file per
// kernel family so that nvcc compiles them in parallel). See kernels/attention_flash_impl.cuh.
#include "kernels/attention_flash_impl.cuh"

namespace dst {
namespace cuda {
namespace flash {

cudaError_t fwd(const Params &p, bool bf16, int D, cudaStream_t stream) {
    return dispatch(bf16, D, [&](auto tag, auto dim) {
        using T = decltype(tag);
        constexpr int kD = decltype(dim)::value;
        using Ti = Tiles<kD>;
        return launch_fwd<T, kD, Ti::kFwdBN, Ti::kFwdNW, Ti::kFwdMB>(p, stream);
    });
}

}  // namespace flash
}  // namespace cuda
}  // namespace dst
