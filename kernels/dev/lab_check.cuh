// The labs' (kernels/dev/*.cu) checks of CUDA and cuBLASLt calls: a failed call prints where and what
// failed and ends the lab (exit status 1). Lab programs only: the library returns its errors.
#ifndef DST_KERNELS_DEV_LAB_CHECK_CUH
#define DST_KERNELS_DEV_LAB_CHECK_CUH

#include <cuda_runtime_api.h>

#include <cstdio>
#include <cstdlib>

#define LAB_CUDA(x)                                                                                   \
    do {                                                                                              \
        const cudaError_t e_ = (x);                                                                   \
        if (e_ != cudaSuccess) {                                                                      \
            std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_));  \
            std::exit(1);                                                                             \
        }                                                                                             \
    } while (0)
// For a file that includes cublasLt.h (or cublas_v2.h) before this header.
#define LAB_LT(x)                                                                                     \
    do {                                                                                              \
        const cublasStatus_t s_ = (x);                                                                \
        if (s_ != CUBLAS_STATUS_SUCCESS) {                                                            \
            std::fprintf(stderr, "%s:%d: %s: cuBLAS status %d\n", __FILE__, __LINE__, #x, int(s_));   \
            std::exit(1);                                                                             \
        }                                                                                             \
    } while (0)

#endif  // DST_KERNELS_DEV_LAB_CHECK_CUH
