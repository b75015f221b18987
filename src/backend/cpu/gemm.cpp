// Linear layers in the nn.Linear convention (W is [m, k], row-major):
//   forward      y[n,m]  = x[n,k]·Wᵀ + b[m], optionally u = that value saved and y = GELU(u), or
//                y = x·Wᵀ + b + add[n,m] (linear_fwd_add; the sum in the compute type, one rounding);
//   backward dx  dx[n,k] = dy[n,m]·W;
//   backward dW  dW[m,k] = dyᵀ·x, db[m] = Σ_n dy[n,m] (fixed row order, parallel over columns).
// fp64/fp32 call cblas_dgemm/cblas_sgemm on the buffers themselves; fp16/bf16 convert operands to
// float scratch, call sgemm and round the result once. accumulate adds into dx/dW/db.
#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>
#include <vector>

#include "backend/cpu/convert.h"
#include "backend/cpu/cpu_backend.h"

namespace dst {
namespace {

using cpu::compute_t;

void gemm(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int64_t M, int64_t N, int64_t K, const float *A,
          int64_t lda, const float *B, int64_t ldb, float beta, float *C, int64_t ldc) {
    cblas_sgemm(CblasRowMajor, ta, tb, (blasint)M, (blasint)N, (blasint)K, 1.0f, A, (blasint)lda, B,
                (blasint)ldb, beta, C, (blasint)ldc);
}
void gemm(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int64_t M, int64_t N, int64_t K, const double *A,
          int64_t lda, const double *B, int64_t ldb, double beta, double *C, int64_t ldc) {
    cblas_dgemm(CblasRowMajor, ta, tb, (blasint)M, (blasint)N, (blasint)K, 1.0, A, (blasint)lda, B,
                (blasint)ldb, beta, C, (blasint)ldc);
}

// A compute-type view of a storage buffer: the buffer itself for fp32/fp64, else a converted copy.
template <typename T>
const compute_t<T> *operand(const void *p, int64_t count, std::vector<compute_t<T>> &tmp, int nt) {
    if (std::is_same<T, compute_t<T>>::value) return static_cast<const compute_t<T> *>(p);
    tmp.resize(static_cast<size_t>(count));
    compute_t<T> *t = tmp.data();
#pragma omp parallel for num_threads(nt) schedule(static)
    for (int64_t i = 0; i < count; ++i) t[i] = cpu::load<T>(p, i);
    return t;
}

// out[M,N] (+)= op(A)·op(B) into the storage buffer `out`. With accumulate the old value is added
// (beta = 1 for fp32/fp64; read, add, round once for fp16/bf16).
template <typename T>
void gemm_into(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int64_t M, int64_t N, int64_t K,
               const compute_t<T> *A, int64_t lda, const compute_t<T> *B, int64_t ldb, void *out,
               bool accumulate, int nt) {
    using C = compute_t<T>;
    if (M == 0 || N == 0) return;
    if (std::is_same<T, C>::value) {
        C *o = static_cast<C *>(out);
        if (K == 0) {
            if (!accumulate) std::fill(o, o + M * N, C(0));
            return;
        }
        gemm(ta, tb, M, N, K, A, lda, B, ldb, accumulate ? C(1) : C(0), o, N);
        return;
    }
    std::vector<C> tmp(static_cast<size_t>(M * N), C(0));
    if (K > 0) gemm(ta, tb, M, N, K, A, lda, B, ldb, C(0), tmp.data(), N);
    const C *t = tmp.data();
#pragma omp parallel for num_threads(nt) schedule(static)
    for (int64_t i = 0; i < M * N; ++i)
        cpu::store<T>(out, i, accumulate ? cpu::load<T>(out, i) + t[i] : t[i]);
}

template <typename T>
dst_status linear_fwd_t(const void *x, const void *w, const void *b, void *y, int64_t n, int64_t k,
                        int64_t m, const dst_gelu *gelu, void *pre_act, int nt, const void *add = nullptr) {
    using C = compute_t<T>;
    if (n == 0 || m == 0) return DST_OK;
    std::vector<C> tx, tw, ty;
    const C *X = operand<T>(x, n * k, tx, nt);
    const C *W = operand<T>(w, m * k, tw, nt);
    C *out;
    if (std::is_same<T, C>::value) {
        out = static_cast<C *>(y);
    } else {
        ty.resize(static_cast<size_t>(n * m));
        out = ty.data();
    }
    if (k > 0) gemm(CblasNoTrans, CblasTrans, n, m, k, X, k, W, k, C(0), out, m);
    else std::fill(out, out + n * m, C(0));
    // Epilogue: u = acc + b rounded to storage; y = GELU(rounded u), so that recomputing GELU from
    // the saved pre-activation (gelu_checkpoint) gives exactly the forward's y.
#pragma omp parallel for num_threads(nt) schedule(static)
    for (int64_t r = 0; r < n; ++r) {
        for (int64_t j = 0; j < m; ++j) {
            const int64_t i = r * m + j;
            const T u = T(out[i] + (b ? cpu::load<T>(b, j) : C(0)) + (add ? cpu::load<T>(add, i) : C(0)));
            if (gelu) {
                if (pre_act) static_cast<T *>(pre_act)[i] = u;
                cpu::store<T>(y, i, cpu::gelu_value<C>(*gelu, static_cast<C>(u)));
            } else {
                static_cast<T *>(y)[i] = u;
            }
        }
    }
    return DST_OK;
}

template <typename T>
dst_status linear_bwd_weight_t(const void *dy, const void *x, void *dw, void *db, int64_t n, int64_t k,
                               int64_t m, bool accumulate, int nt) {
    using C = compute_t<T>;
    std::vector<C> tdy, tx;
    const C *DY = operand<T>(dy, n * m, tdy, nt);
    if (dw) {
        const C *X = operand<T>(x, n * k, tx, nt);
        gemm_into<T>(CblasTrans, CblasNoTrans, m, k, n, DY, m, X, k, dw, accumulate, nt);
    }
    if (db) {
        // Column sums in row order, columns split into blocks of 64 across threads.
        const int64_t blocks = (m + 63) / 64;
#pragma omp parallel for num_threads(nt) schedule(static)
        for (int64_t blk = 0; blk < blocks; ++blk) {
            C acc[64] = {};
            const int64_t j0 = blk * 64, j1 = std::min(m, j0 + 64);
            for (int64_t r = 0; r < n; ++r)
                for (int64_t j = j0; j < j1; ++j) acc[j - j0] += DY[r * m + j];
            for (int64_t j = j0; j < j1; ++j)
                cpu::store<T>(db, j, accumulate ? cpu::load<T>(db, j) + acc[j - j0] : acc[j - j0]);
        }
    }
    return DST_OK;
}

}  // namespace

dst_status CpuBackend::linear_fwd(dst_dtype dt, const void *x, const void *w, const void *b, void *y,
                                  int64_t n, int64_t k, int64_t m, const dst_gelu *gelu,
                                  void *pre_act) {
    const int nt = num_threads();
    return cpu::dispatch(dt, "linear_fwd", [&](auto tag) {
        return linear_fwd_t<decltype(tag)>(x, w, b, y, n, k, m, gelu, pre_act, nt);
    });
}

dst_status CpuBackend::linear_fwd_add(dst_dtype dt, const void *x, const void *w, const void *b, const void *add,
                                      void *y, int64_t n, int64_t k, int64_t m) {
    const int nt = num_threads();
    return cpu::dispatch(dt, "linear_fwd_add", [&](auto tag) {
        return linear_fwd_t<decltype(tag)>(x, w, b, y, n, k, m, nullptr, nullptr, nt, add);
    });
}

dst_status CpuBackend::linear_bwd_data(dst_dtype dt, const void *dy, const void *w, void *dx, int64_t n,
                                       int64_t k, int64_t m, const void *add) {
    const int nt = num_threads();
    return cpu::dispatch(dt, "linear_bwd_data", [&](auto tag) {
        using T = decltype(tag);
        // The added term goes into dx first (exact: same dtype), then the product accumulates onto it.
        if (add && add != dx) std::memcpy(dx, add, static_cast<size_t>(n * k) * sizeof(T));
        const bool accumulate = add != nullptr;
        std::vector<compute_t<T>> tdy, tw;
        const auto *DY = operand<T>(dy, n * m, tdy, nt);
        const auto *W = operand<T>(w, m * k, tw, nt);
        gemm_into<T>(CblasNoTrans, CblasNoTrans, n, k, m, DY, m, W, k, dx, accumulate, nt);
        return DST_OK;
    });
}

dst_status CpuBackend::linear_bwd_weight(dst_dtype dt, const void *dy, const void *x, void *dw, void *db,
                                         int64_t n, int64_t k, int64_t m, bool accumulate) {
    const int nt = num_threads();
    return cpu::dispatch(dt, "linear_bwd_weight", [&](auto tag) {
        return linear_bwd_weight_t<decltype(tag)>(dy, x, dw, db, n, k, m, accumulate, nt);
    });
}

}  // namespace dst
