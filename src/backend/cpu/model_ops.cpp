// The model ops of BERT pre-training around the layers, the CPU twins (the spec of the CUDA kernels):
//   check_indices   idx ∈ [lo, hi) (and distinct), first offending element;
//   embedding_fwd   out[t] = word[ids[t]] + pos[s] + type[types[t]];
//   embedding_bwd   per-table sums in token order: a stable counting sort groups the tokens of each
//                   word (and type) row, each row is summed in increasing token index, then rounded;
//   gather_rows / scatter_rows, tanh_fwd / tanh_bwd;
//   linear_cross_entropy  logits for the selected rows only (CBLAS GEMM in the compute type), row
//                   log-sum-exp, argmax, mean loss; g = grad_scale·(softmax − onehot)/count rounded
//                   to storage, then dx = g·W, dW (+)= gᵀ·h, db (+)= Σ g.
// Arithmetic in compute_t<T> (double for fp64, float otherwise); one rounding on store. Parallel loops
// split over independent rows; every sum has a fixed order. The math: docs/ops/model-ops.md.
#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>
#include <vector>

#include "backend/cpu/convert.h"
#include "backend/cpu/cpu_backend.h"
#include "core/dtype.h"

namespace dst {
namespace {

using cpu::compute_t;
using cpu::load;
using cpu::store;

void gemm_c(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int64_t M, int64_t N, int64_t K, const float *A, int64_t lda,
            const float *B, int64_t ldb, float *C, int64_t ldc) {
    cblas_sgemm(CblasRowMajor, ta, tb, (blasint)M, (blasint)N, (blasint)K, 1.0f, A, (blasint)lda, B, (blasint)ldb,
                0.0f, C, (blasint)ldc);
}
void gemm_c(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int64_t M, int64_t N, int64_t K, const double *A, int64_t lda,
            const double *B, int64_t ldb, double *C, int64_t ldc) {
    cblas_dgemm(CblasRowMajor, ta, tb, (blasint)M, (blasint)N, (blasint)K, 1.0, A, (blasint)lda, B, (blasint)ldb,
                0.0, C, (blasint)ldc);
}

// Tokens grouped by their row in a table of `rows` rows, each group in increasing token order
// (a stable counting sort): tokens of row r are order[start[r] .. start[r+1]).
struct Groups {
    std::vector<int64_t> start, order;
};
Groups group_tokens(const int32_t *key, int64_t count, int64_t rows) {
    Groups g;
    g.start.assign(static_cast<size_t>(rows + 1), 0);
    for (int64_t t = 0; t < count; ++t) ++g.start[static_cast<size_t>(key ? key[t] : 0) + 1];
    for (int64_t r = 0; r < rows; ++r) g.start[r + 1] += g.start[r];
    std::vector<int64_t> next(g.start.begin(), g.start.end() - 1);
    g.order.resize(static_cast<size_t>(count));
    for (int64_t t = 0; t < count; ++t) g.order[static_cast<size_t>(next[key ? key[t] : 0]++)] = t;
    return g;
}

// table[r,:] = Σ_{t in group r} dout[t,:] in group order (accumulate: old + sum on used rows only;
// write: unused rows 0).
template <typename T>
void grouped_row_sums(const void *dout, const Groups &g, void *table, int64_t rows, int64_t H, bool accumulate,
                      int nt) {
    using C = compute_t<T>;
#pragma omp parallel for num_threads(nt) schedule(dynamic, 16)
    for (int64_t r = 0; r < rows; ++r) {
        const int64_t b = g.start[r], e = g.start[r + 1];
        if (b == e) {
            if (!accumulate)
                for (int64_t j = 0; j < H; ++j) store<T>(table, r * H + j, C(0));
            continue;
        }
        std::vector<C> acc(static_cast<size_t>(H), C(0));
        for (int64_t i = b; i < e; ++i) {
            const int64_t t = g.order[static_cast<size_t>(i)];
            for (int64_t j = 0; j < H; ++j) acc[j] += load<T>(dout, t * H + j);
        }
        for (int64_t j = 0; j < H; ++j)
            store<T>(table, r * H + j, accumulate ? load<T>(table, r * H + j) + acc[j] : acc[j]);
    }
}

template <typename T>
dst_status embedding_bwd_t(const void *dout, const int32_t *ids, const int32_t *types, void *dword, void *dpos,
                           void *dtype, int64_t B, int64_t S, int64_t H, int64_t V, int64_t P, int64_t T_rows,
                           bool accumulate, int nt) {
    using C = compute_t<T>;
    const int64_t N = B * S;
    if (dword) grouped_row_sums<T>(dout, group_tokens(ids, N, V), dword, V, H, accumulate, nt);
    if (dtype) grouped_row_sums<T>(dout, group_tokens(types, N, T_rows), dtype, T_rows, H, accumulate, nt);
    if (dpos) {
#pragma omp parallel for num_threads(nt) schedule(static)
        for (int64_t s = 0; s < P; ++s) {
            if (s >= S) {
                if (!accumulate)
                    for (int64_t j = 0; j < H; ++j) store<T>(dpos, s * H + j, C(0));
                continue;
            }
            for (int64_t j = 0; j < H; ++j) {
                C acc = 0;
                for (int64_t b = 0; b < B; ++b) acc += load<T>(dout, (b * S + s) * H + j);
                store<T>(dpos, s * H + j, accumulate ? load<T>(dpos, s * H + j) + acc : acc);
            }
        }
    }
    return DST_OK;
}

template <typename T>
dst_status linear_cross_entropy_t(const CrossEntropyParams &p, int nt) {
    using C = compute_t<T>;
    const int64_t M = p.m, V = p.v, H = p.h;
    // Selected rows and W in the compute type.
    std::vector<C> hx(static_cast<size_t>(M * H)), wc(static_cast<size_t>(V * H));
#pragma omp parallel for num_threads(nt) schedule(static)
    for (int64_t i = 0; i < M; ++i) {
        const int64_t r = p.rows ? p.rows[i] : i;
        for (int64_t j = 0; j < H; ++j) hx[i * H + j] = load<T>(p.x, r * H + j);
    }
#pragma omp parallel for num_threads(nt) schedule(static)
    for (int64_t i = 0; i < V * H; ++i) wc[i] = load<T>(p.w, i);
    // z = h·Wᵀ + b, never rounded to storage.
    std::vector<C> z(static_cast<size_t>(M * V), C(0));
    if (M > 0 && H > 0) gemm_c(CblasNoTrans, CblasTrans, M, V, H, hx.data(), H, wc.data(), H, z.data(), V);
    int64_t count = 0;
    for (int64_t i = 0; i < M; ++i) count += p.labels[i] >= 0;
    std::vector<C> row_loss(static_cast<size_t>(M), C(0));
    std::vector<int32_t> row_hit(static_cast<size_t>(M), 0);
    const bool grads = p.dx || p.dw || p.db;
    // g, rounded to storage and kept in the compute type for the GEMMs that follow.
    std::vector<C> g(grads ? static_cast<size_t>(M * V) : 0, C(0));
    const C scale = count > 0 ? C(p.grad_scale) / C(count) : C(0);
#pragma omp parallel for num_threads(nt) schedule(static)
    for (int64_t i = 0; i < M; ++i) {
        C *zi = &z[static_cast<size_t>(i * V)];
        if (p.b)
            for (int64_t c = 0; c < V; ++c) zi[c] += load<T>(p.b, c);
        const int32_t y = p.labels[i];
        if (y < 0) continue;  // ignored row: no loss, g = 0
        C mx = zi[0];
        int64_t arg = 0;
        for (int64_t c = 1; c < V; ++c)
            if (zi[c] > mx) { mx = zi[c]; arg = c; }
        C se = 0;
        for (int64_t c = 0; c < V; ++c) se += std::exp(zi[c] - mx);
        const C lse = mx + std::log(se);
        row_loss[i] = lse - zi[y];
        row_hit[i] = arg == y;
        if (grads)
            for (int64_t c = 0; c < V; ++c) {
                const C pc = std::exp(zi[c] - lse) - (c == y ? C(1) : C(0));
                g[static_cast<size_t>(i * V + c)] = static_cast<C>(T(pc * scale));
            }
    }
    C total = 0;
    int32_t hits = 0;
    for (int64_t i = 0; i < M; ++i) {
        total += row_loss[i];
        hits += row_hit[i];
    }
    static_cast<C *>(p.loss)[0] = count > 0 ? total / C(count) : C(0);
    if (p.counts) {
        p.counts[0] = static_cast<int32_t>(count);
        p.counts[1] = hits;
    }
    if (!grads) return DST_OK;
    if (p.dx) {
        // dh = g·W [M, H], written to the selected rows; the other rows of dx are 0.
        std::vector<C> dh(static_cast<size_t>(M * H), C(0));
        if (M > 0 && V > 0) gemm_c(CblasNoTrans, CblasNoTrans, M, H, V, g.data(), V, wc.data(), H, dh.data(), H);
        if (p.rows)
            for (int64_t i = 0; i < p.n * H; ++i) store<T>(p.dx, i, C(0));
#pragma omp parallel for num_threads(nt) schedule(static)
        for (int64_t i = 0; i < M; ++i) {
            const int64_t r = p.rows ? p.rows[i] : i;
            for (int64_t j = 0; j < H; ++j) store<T>(p.dx, r * H + j, dh[i * H + j]);
        }
    }
    if (p.dw) {
        // dW = gᵀ·h [V, H].
        std::vector<C> dw(static_cast<size_t>(V * H), C(0));
        if (M > 0) gemm_c(CblasTrans, CblasNoTrans, V, H, M, g.data(), V, hx.data(), H, dw.data(), H);
#pragma omp parallel for num_threads(nt) schedule(static)
        for (int64_t i = 0; i < V * H; ++i) store<T>(p.dw, i, p.accumulate ? load<T>(p.dw, i) + dw[i] : dw[i]);
    }
    if (p.db) {
#pragma omp parallel for num_threads(nt) schedule(static)
        for (int64_t c = 0; c < V; ++c) {
            C acc = 0;
            for (int64_t i = 0; i < M; ++i) acc += g[static_cast<size_t>(i * V + c)];
            store<T>(p.db, c, p.accumulate ? load<T>(p.db, c) + acc : acc);
        }
    }
    return DST_OK;
}

}  // namespace

dst_status CpuBackend::check_indices(const int32_t *idx, int64_t count, int32_t lo, int32_t hi, bool distinct,
                                     int64_t *first_bad, int64_t *first_repeat) {
    *first_bad = -1;
    if (first_repeat) *first_repeat = -1;
    for (int64_t i = 0; i < count; ++i)
        if (idx[i] < lo || idx[i] >= hi) {
            *first_bad = i;
            return DST_OK;
        }
    if (!distinct || !first_repeat) return DST_OK;
    try {
        std::vector<int32_t> seen(static_cast<size_t>(int64_t(hi) - lo), 0);
        for (int64_t i = 0; i < count; ++i) ++seen[static_cast<size_t>(idx[i] - lo)];
        for (int64_t i = 0; i < count; ++i)
            if (seen[static_cast<size_t>(idx[i] - lo)] > 1) {
                *first_repeat = i;
                break;
            }
    } catch (const std::bad_alloc &) {
        return set_error(DST_ERR_OUT_OF_MEMORY, "cpu backend: check_indices: out of host memory");
    }
    return DST_OK;
}

dst_status CpuBackend::embedding_fwd(dst_dtype dt, const int32_t *ids, const int32_t *types, const void *word,
                                     const void *pos, const void *type, void *out, int64_t B, int64_t S, int64_t H,
                                     int64_t V, int64_t T_rows) {
    const int nt = num_threads();
    return cpu::dispatch(dt, "embedding_fwd", [&](auto tag) {
        using T = decltype(tag);
        using C = compute_t<T>;
#pragma omp parallel for num_threads(nt) schedule(static)
        for (int64_t t = 0; t < B * S; ++t) {
            const int64_t v = ids[t], s = t % S, k = types ? types[t] : 0;
            const bool vok = v >= 0 && v < V, kok = k >= 0 && k < T_rows;  // else a zero row (see backend.h)
            for (int64_t j = 0; j < H; ++j)
                store<T>(out, t * H + j, (vok ? load<T>(word, v * H + j) : C(0)) + load<T>(pos, s * H + j) +
                                             (kok ? load<T>(type, k * H + j) : C(0)));
        }
        return DST_OK;
    });
}

dst_status CpuBackend::embedding_bwd(dst_dtype dt, const void *dout, const int32_t *ids, const int32_t *types,
                                     void *dword, void *dpos, void *dtype, int64_t B, int64_t S, int64_t H,
                                     int64_t V, int64_t P, int64_t T, bool accumulate) {
    const int nt = num_threads();
    return cpu::dispatch(dt, "embedding_bwd", [&](auto tag) {
        return embedding_bwd_t<decltype(tag)>(dout, ids, types, dword, dpos, dtype, B, S, H, V, P, T, accumulate,
                                              nt);
    });
}

dst_status CpuBackend::packed_index(const int32_t *cu, int64_t B, int64_t S, int64_t N, int32_t *idx,
                                    int32_t *lens, const char *what) {
    if (cu[0] != 0 || cu[B] != N)
        return set_error(DST_ERR_INVALID_ARGUMENT,
                         "%s runs from %d to %d, expected from 0 to N = %lld (the input's rows)", what,
                         (int)cu[0], (int)cu[B], (long long)N);
    for (int64_t b = 0; b < B; ++b) {
        const int64_t len = int64_t(cu[b + 1]) - cu[b];
        if (len < 1 || len > S)
            return set_error(DST_ERR_INVALID_ARGUMENT,
                             "%s: sequence %lld has length %lld (cu_seqlens[%lld] = %d, cu_seqlens[%lld] = %d), "
                             "expected 1..max_seqlen = %lld", what, (long long)b, (long long)len, (long long)b,
                             (int)cu[b], (long long)(b + 1), (int)cu[b + 1], (long long)S);
    }
    for (int64_t b = 0; b < B; ++b) {
        lens[b] = cu[b + 1] - cu[b];
        for (int32_t r = cu[b]; r < cu[b + 1]; ++r) idx[r] = static_cast<int32_t>(b * S + (r - cu[b]));
    }
    return DST_OK;
}

dst_status CpuBackend::gather_rows(dst_dtype dt, const void *src, const int32_t *idx, void *dst, int64_t n,
                                   int64_t m, int64_t h) {
    const size_t row = static_cast<size_t>(h) * dtype_size(dt);
    for (int64_t i = 0; i < m; ++i) {
        char *d = static_cast<char *>(dst) + i * row;
        if (idx[i] >= 0 && idx[i] < n) std::memcpy(d, static_cast<const char *>(src) + idx[i] * row, row);
        else std::memset(d, 0, row);  // all-zero bytes are 0 in every floating dtype
    }
    return DST_OK;
}

dst_status CpuBackend::scatter_rows(dst_dtype dt, const void *src, const int32_t *idx, void *dst, int64_t n,
                                    int64_t m, int64_t h, bool accumulate) {
    return cpu::dispatch(dt, "scatter_rows", [&](auto tag) {
        using T = decltype(tag);
        using C = compute_t<T>;
        if (!accumulate)
            for (int64_t i = 0; i < n * h; ++i) store<T>(dst, i, C(0));
        for (int64_t i = 0; i < m; ++i)
            for (int64_t j = 0; idx[i] >= 0 && idx[i] < n && j < h; ++j) {
                const int64_t o = int64_t(idx[i]) * h + j;
                store<T>(dst, o, accumulate ? load<T>(dst, o) + load<T>(src, i * h + j) : load<T>(src, i * h + j));
            }
        return DST_OK;
    });
}

dst_status CpuBackend::tanh_fwd(dst_dtype dt, const void *u, void *y, int64_t count) {
    const int nt = num_threads();
    return cpu::dispatch(dt, "tanh_fwd", [&](auto tag) {
        using T = decltype(tag);
#pragma omp parallel for num_threads(nt) schedule(static)
        for (int64_t i = 0; i < count; ++i) store<T>(y, i, std::tanh(load<T>(u, i)));
        return DST_OK;
    });
}

dst_status CpuBackend::tanh_bwd(dst_dtype dt, const void *dy, const void *u, void *du, int64_t count) {
    const int nt = num_threads();
    return cpu::dispatch(dt, "tanh_bwd", [&](auto tag) {
        using T = decltype(tag);
        using C = compute_t<T>;
#pragma omp parallel for num_threads(nt) schedule(static)
        for (int64_t i = 0; i < count; ++i) {
            const C t = std::tanh(load<T>(u, i));
            store<T>(du, i, load<T>(dy, i) * (C(1) - t * t));
        }
        return DST_OK;
    });
}

dst_status CpuBackend::linear_cross_entropy(dst_dtype dt, const CrossEntropyParams &p) {
    const int nt = num_threads();
    return cpu::dispatch(dt, "linear_cross_entropy",
                         [&](auto tag) { return linear_cross_entropy_t<decltype(tag)>(p, nt); });
}

}  // namespace dst
