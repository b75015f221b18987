// Programmatic dependent launch (compute capability 9.0+): a kernel launched by launch_dependent may
// be scheduled while the kernel before it in the stream is still draining, and waits for it on the
// device (griddepcontrol.wait) instead of the stream waiting on the host side of the boundary. On the
// H200 a plain boundary between two dependent kernels costs about 1.5–2 µs and this takes ~1.5 µs of
// it off (kernels/dev/launch_lab.cu, bench/RESULTS.md).
//
// The rule, for every kernel launched through launch_dependent: its first statement is
// DST_GRID_DEPENDENCY() (nothing of the previous kernel's output is read, and nothing it may still read
// is written, before the wait). The macro also lets the kernel's own dependents launch early; the
// dependents still wait for this grid's completion and memory, so where a kernel triggers changes
// only when the next one is scheduled, never what it reads.
// Off (plain <<<>>> launches) below compute capability 9.0 and when the environment sets DST_PDL=0.
#ifndef DST_KERNELS_LAUNCH_CUH
#define DST_KERNELS_LAUNCH_CUH

#include <cuda_runtime.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <utility>

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define DST_GRID_DEPENDENCY()                                        \
    do {                                                             \
        asm volatile("griddepcontrol.wait;" ::: "memory");           \
        asm volatile("griddepcontrol.launch_dependents;" ::: "memory"); \
    } while (0)
#else
#define DST_GRID_DEPENDENCY() \
    do {                      \
    } while (0)
#endif

namespace dst {
namespace cuda {

// Whether the current device has compute capability 9.0 exactly: the only one the library's sm_90a
// objects (wgmma, TMA; kernels/sm90, kernels/cutlass) run on. False when the runtime cannot say.
inline bool current_device_is_sm90() {
    int dev = 0, major = 0, minor = 0;
    if (cudaGetDevice(&dev) != cudaSuccess) return false;
    if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) != cudaSuccess)
        return false;
    return major == 9 && minor == 0;
}

// Whether launch_dependent uses the attribute on the current device (cached per device; the
// environment is read once).
inline bool dependent_launch_enabled() {
    static const bool env_off = [] {
        const char *v = std::getenv("DST_PDL");
        return v != nullptr && std::strcmp(v, "0") == 0;
    }();
    if (env_off) return false;
    constexpr int kDevices = 64;
    static std::atomic<signed char> state[kDevices];  // 0 unknown, 1 on, -1 off
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= kDevices) return false;
    signed char s = state[dev].load(std::memory_order_relaxed);
    if (s == 0) {
        int major = 0;
        s = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) == cudaSuccess && major >= 9 ? 1 : -1;
        state[dev].store(s, std::memory_order_relaxed);
    }
    return s > 0;
}

// kernel<<<grid, block, smem, stream>>>(args...), as a programmatic dependent of the stream's previous
// kernel where dependent_launch_enabled(). The kernel must begin with DST_GRID_DEPENDENCY().
template <typename... P, typename... A>
cudaError_t launch_dependent(void (*kernel)(P...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                             A &&...args) {
    if (!dependent_launch_enabled()) {
        kernel<<<grid, block, smem, stream>>>(std::forward<A>(args)...);
        return cudaGetLastError();
    }
    cudaLaunchConfig_t cfg{};
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = stream;
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = attr;
    cfg.numAttrs = 1;
    return cudaLaunchKernelEx(&cfg, kernel, std::forward<A>(args)...);
}

}  // namespace cuda
}  // namespace dst

#endif  // DST_KERNELS_LAUNCH_CUH
