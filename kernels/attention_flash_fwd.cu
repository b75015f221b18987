// Instantiations of the flash attention forward at the production tile shapes (one file per
// kernel family so that nvcc compiles them in parallel). See kernels/attention_flash_impl.cuh.
// On compute capability 9.0, when the library has its sm_90a objects (DST_WITH_SM90A), head dim 64
// with 16-byte rows runs on the wgmma forward instead (kernels/attention_flash_wgmma.cuh): the same
// results, computed on warpgroup MMAs.
#include "kernels/attention_flash_impl.cuh"

namespace dst {
namespace cuda {
namespace flash {

cudaError_t fwd(const Params &p, bool bf16, int D, cudaStream_t stream) {
#ifdef DST_WITH_SM90A
    if (wgmma_path(p, D)) return fwd_wgmma(p, bf16, stream);
#endif
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
