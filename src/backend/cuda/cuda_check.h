// Check macros of the CUDA backend's glue: DST_CHECK_GEN(expr, ok, to_string, to_status) evaluates a
// library call once and, when the result is not `ok`, records "<statement> failed: <reason>
// (file:line, function)" with dst::set_error and returns the mapped dst_status from the enclosing
// function. DST_CUDA_CHECK is its CUDA runtime form; the kernel launchers of kernels/ return a
// cudaError_t, so `DST_CUDA_CHECK(cuda::gelu_fwd(...))` names the launcher in the message. Nothing in
// the backend exits, aborts or prints.
#ifndef DST_BACKEND_CUDA_CUDA_CHECK_H
#define DST_BACKEND_CUDA_CUDA_CHECK_H

#include <cuda_runtime_api.h>

#include "core/error.h"  // defines: dst::set_error

#define DST_CHECK_GEN(expr, ok, to_string, to_status)                                            \
    do {                                                                                         \
        const auto dst_check_r_ = (expr);                                                        \
        if (dst_check_r_ != (ok)) {                                                              \
            return ::dst::set_error(to_status(dst_check_r_), "%s failed: %s (%s:%d, %s)", #expr, \
                                    to_string(dst_check_r_), __FILE__, __LINE__, __func__);      \
        }                                                                                        \
    } while (0)

#define DST_CUDA_CHECK(expr) DST_CHECK_GEN(expr, cudaSuccess, cudaGetErrorString, ::dst::cuda::cuda_error_status)

namespace dst {
namespace cuda {

// Maps a CUDA runtime error onto a status and clears the thread's last-error slot, so that a failed
// allocation is not reported again by the next launch check.
inline dst_status cuda_error_status(cudaError_t e) {
    (void)cudaGetLastError();
    return e == cudaErrorMemoryAllocation ? DST_ERR_OUT_OF_MEMORY : DST_ERR_BACKEND;
}

}  // namespace cuda
}  // namespace dst

#endif  // DST_BACKEND_CUDA_CUDA_CHECK_H
