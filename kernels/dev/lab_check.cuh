// The labs' (kernels/dev/*.cu) checks of CUDA and cuBLASLt calls: a failed call prints where and what
// failed and ends the lab (exit status 1). Lab programs only: the library returns its errors.
#ifndef DST_KERNELS_DEV_LAB_CHECK_CUH
#define DST_KERNELS_DEV_LAB_CHECK_CUH

#include <cuda_runtime_api.h>

#include <cstdio>
#include <cstdlib>

// Where and what failed, then the lab's end.
[[noreturn]] inline void lab_fail(const char *file, int line, const char *call, const char *what, int code) {
    std::fprintf(stderr, "%s:%d: %s: %s (%d)\n", file, line, call, what, code);
    std::exit(1);
}

#define LAB_CUDA(x)                                                                              \
    do {                                                                                         \
        const cudaError_t e_ = (x);                                                              \
        if (e_ != cudaSuccess) lab_fail(__FILE__, __LINE__, #x, cudaGetErrorString(e_), int(e_)); \
    } while (0)
// For a file that includes cublasLt.h (or cublas_v2.h) before this header.
#define LAB_LT(x)                                                                                \
    do {                                                                                         \
        const cublasStatus_t s_ = (x);                                                           \
        if (s_ != CUBLAS_STATUS_SUCCESS) lab_fail(__FILE__, __LINE__, #x, "cuBLAS status", int(s_));  \
    } while (0)

// Milliseconds between events recorded on stream s before and after `enqueue()` puts its work there.
template <typename F>
float lab_event_ms(cudaStream_t s, F &&enqueue) {
    cudaEvent_t a, b;
    LAB_CUDA(cudaEventCreate(&a));
    LAB_CUDA(cudaEventCreate(&b));
    LAB_CUDA(cudaEventRecord(a, s));
    enqueue();
    LAB_CUDA(cudaEventRecord(b, s));
    LAB_CUDA(cudaEventSynchronize(b));
    float ms = 0;
    LAB_CUDA(cudaEventElapsedTime(&ms, a, b));
    LAB_CUDA(cudaEventDestroy(a));
    LAB_CUDA(cudaEventDestroy(b));
    return ms;
}

#endif  // DST_KERNELS_DEV_LAB_CHECK_CUH
