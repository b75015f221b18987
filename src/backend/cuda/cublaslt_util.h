// cuBLASLt helpers of the CUDA backend's GEMMs (cuda_backend.cpp): the status mapping and check macro, pointer alignment for the heuristic, and an owner of the
// descriptors of one matmul call.
#ifndef DST_BACKEND_CUDA_CUBLASLT_UTIL_H
#define DST_BACKEND_CUDA_CUBLASLT_UTIL_H

#include <cublasLt.h>

#include <cstdint>

#include "backend/cuda/cuda_check.h"  // defines: DST_CHECK_GEN

namespace dst {

inline dst_status lt_status(cublasStatus_t s) {
    return s == CUBLAS_STATUS_ALLOC_FAILED ? DST_ERR_OUT_OF_MEMORY : DST_ERR_BACKEND;
}

#define DST_CUBLASLT_CHECK(expr) DST_CHECK_GEN(expr, CUBLAS_STATUS_SUCCESS, cublasLtGetStatusString, lt_status)

// Largest power of two (≤ 256) dividing the address: what cuBLASLt may assume about a pointer.
inline uint32_t pointer_alignment(const void *p) {
    const uintptr_t u = reinterpret_cast<uintptr_t>(p);
    if (u == 0) return 256;
    const uintptr_t low = u & (~u + 1);
    return low >= 256 ? 256u : static_cast<uint32_t>(low);
}

// Owner of the cuBLASLt descriptors of one GEMM call.
struct LtMatmul {
    cublasLtMatmulDesc_t op = nullptr;
    cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
    cublasLtMatmulPreference_t pref = nullptr;
    LtMatmul() = default;
    LtMatmul(const LtMatmul &) = delete;
    LtMatmul &operator=(const LtMatmul &) = delete;
    ~LtMatmul() {
        if (pref) cublasLtMatmulPreferenceDestroy(pref);
        if (d) cublasLtMatrixLayoutDestroy(d);
        if (b) cublasLtMatrixLayoutDestroy(b);
        if (a) cublasLtMatrixLayoutDestroy(a);
        if (op) cublasLtMatmulDescDestroy(op);
    }
};

}  // namespace dst

#endif  // DST_BACKEND_CUDA_CUBLASLT_UTIL_H
