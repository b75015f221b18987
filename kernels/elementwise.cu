// Elementwise kernels: GELU (erf: x·Φ(x); tanh: 0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³)))) and
// their derivatives, tanh and its derivative (the pooler of BERT), residual + dropout, dropout
// backward, add, any-zero (the all_nonzero op).
// Arithmetic in compute_t<T> (double for FP64, float otherwise), one rounding on store; the erf-form
// GELU of the 16-bit types through cdf16 (kernels/gelu_math.cuh).
// Outputs may alias their inputs (each element is read before it is written, by the same thread).
// Dropout: each thread owns whole Philox groups of 4 consecutive elements (e >> 2), so one Philox call
// gives the keep decisions of all four, bit-identical with the CPU backend (kernels/philox.h).
#include "kernels/elementwise.cuh"

#include <type_traits>

#include "kernels/bias.cuh"
#include "kernels/column_partial.cuh"
#include "kernels/dispatch.cuh"
#include "kernels/gelu_math.cuh"
#include "kernels/launch.cuh"
#include "kernels/philox.h"

namespace dst {
namespace cuda {
namespace {

constexpr int kThreads = 256;

// ================================ kernels ========================================================

// The maps, as functors on the compute type: y = op(a) or y = op(a, b). `low`: see gelu_value.
struct GeluFwd {
    dst_gelu form;
    bool low;
    template <typename C>
    __device__ C operator()(C u, C) const { return gelu_value(u, form, low); }
};
struct GeluBwd {  // a = dg, b = u
    dst_gelu form;
    bool low;
    template <typename C>
    __device__ C operator()(C dg, C u) const { return dg * gelu_grad(u, form, low); }
};
struct TanhFwd {
    template <typename C>
    __device__ C operator()(C u, C) const { return dtanh(u); }
};
struct TanhBwd {  // a = dy, b = u
    template <typename C>
    __device__ C operator()(C dy, C u) const {
        const C t = dtanh(u);
        return dy * (C(1) - t * t);
    }
};
struct Add {
    template <typename C>
    __device__ C operator()(C a, C b) const { return a + b; }
};

// y[i] = op(a[i], b[i]) (b may be null: op's second argument is then 0). With `vec`, thread i of the
// grid computes 16-byte vector i (one per thread: the grid covers them all) and the first
// count mod kVec<T> threads the elements after the last vector; otherwise a grid-stride loop over the
// elements. Each element is computed as by the scalar form, so the path changes no result.
template <typename T, typename Op>
__global__ void map_kernel(const T *a, const T *b, T *y, int64_t count, bool vec, Op op) {
    DST_GRID_DEPENDENCY();
    using C = compute_t<T>;
    constexpr int V = kVec<T>;
    const int64_t tid = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
    if (vec) {
        const int64_t nvec = count / V;
        if (tid < nvec) {
            const Vec<T> va = reinterpret_cast<const Vec<T> *>(a)[tid];
            Vec<T> vb{}, out;
            if (b) vb = reinterpret_cast<const Vec<T> *>(b)[tid];
#pragma unroll
            for (int k = 0; k < V; ++k)
                out.v[k] = to_storage<T>(op(to_compute(va.v[k]), b ? to_compute(vb.v[k]) : C(0)));
            reinterpret_cast<Vec<T> *>(y)[tid] = out;
        }
        const int64_t e = nvec * V + tid;
        if (e < count) y[e] = to_storage<T>(op(to_compute(a[e]), b ? to_compute(b[e]) : C(0)));
        return;
    }
    const int64_t stride = int64_t(gridDim.x) * blockDim.x;
    for (int64_t i = tid; i < count; i += stride)
        y[i] = to_storage<T>(op(to_compute(a[i]), b ? to_compute(b[i]) : C(0)));
}

// du = dg·GELU'(u) over [n, m] (m a multiple of kVec<T>, every pointer 16-byte aligned), the values of
// map_kernel's GeluBwd, written, and column_sum's partial sums of du as stored (column_partial.cuh):
// block (column tile, row chunk). du may alias dg (each vector is read before it is written).
template <typename T>
__global__ void __launch_bounds__(colsum::kTileThreads *colsum::kRowLanes)
    gelu_bwd_partial_kernel(const T *dg, const T *u, T *du, int64_t n, int64_t m, int64_t R,
                            compute_t<T> *__restrict__ partial, GeluBwd op) {
    DST_GRID_DEPENDENCY();
    __shared__ compute_t<T> red[colsum::partial_smem<T>() / sizeof(compute_t<T>)];
    colsum::partial_vec<T>(n, m, R, partial, red, [&](int64_t r, int64_t c) {
        const int64_t i = r * m + c;
        const Vec<T> a = *reinterpret_cast<const Vec<T> *>(dg + i), b = *reinterpret_cast<const Vec<T> *>(u + i);
        Vec<T> out;
#pragma unroll
        for (int k = 0; k < kVec<T>; ++k) out.v[k] = to_storage<T>(op(to_compute(a.v[k]), to_compute(b.v[k])));
        *reinterpret_cast<Vec<T> *>(du + i) = out;
        return out;
    });
}

// mode 0: y = residual + keep·scale·a; mode 1 (residual == nullptr): y = keep·scale·a.
// With `quad`, a whole group of four goes through one access of 4·sizeof(T) bytes per tensor.
template <typename T>
struct alignas(4 * sizeof(T)) Quad {
    T v[4];
};

// One group of four elements at `at` (a multiple of 4) through one access of 4·sizeof(T) bytes per
// tensor: y = residual + keep·scale·a with the keep words of r (threshold 0: no dropout).
template <typename T>
__device__ __forceinline__ void dropout_quad(const T *a, const T *residual, T *y, int64_t at, const Philox4 &r,
                                             uint32_t threshold, compute_t<T> scale) {
    using C = compute_t<T>;
    const Quad<T> va = *reinterpret_cast<const Quad<T> *>(a + at);
    Quad<T> vr{}, out;
    if (residual) vr = *reinterpret_cast<const Quad<T> *>(residual + at);
#pragma unroll
    for (int k = 0; k < 4; ++k) {
        C v = to_compute(va.v[k]);
        if (threshold != 0u) v = r.v[k] >= threshold ? dmul_rn(v, scale) : C(0);
        if (residual) v = to_compute(vr.v[k]) + v;
        out.v[k] = to_storage<T>(v);
    }
    *reinterpret_cast<Quad<T> *>(y + at) = out;
}

template <typename T>
__global__ void dropout_kernel(const T *a, const T *residual, T *y,
                               int64_t count, uint64_t seed, uint64_t offset0, const uint32_t *offset_hi,
                               uint32_t threshold, compute_t<T> scale, bool quad) {
    DST_GRID_DEPENDENCY();
    const uint64_t offset = dropout_offset(offset0, offset_hi);
    using C = compute_t<T>;
    const int64_t groups = (count + 3) / 4;
    for (int64_t grp = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; grp < groups;
         grp += int64_t(gridDim.x) * blockDim.x) {
        Philox4 r{{0u, 0u, 0u, 0u}};
        if (threshold != 0u) r = philox_dropout_block(seed, offset, static_cast<uint64_t>(grp));
        if (quad && grp * 4 + 4 <= count) {
            dropout_quad(a, residual, y, grp * 4, r, threshold, scale);
            continue;
        }
#pragma unroll
        for (int k = 0; k < 4; ++k) {
            const int64_t e = grp * 4 + k;
            if (e >= count) break;
            C v = to_compute(a[e]);
            if (threshold != 0u) v = r.v[k] >= threshold ? dmul_rn(v, scale) : C(0);
            if (residual) v = to_compute(residual[e]) + v;
            y[e] = to_storage<T>(v);
        }
    }
}

// The same with a row map (packed layer calls, kernels/philox.h): buffer element r·L + c is element
// rows[r]·L + c of the site. Blocks take rows, threads a row's groups of four (L a multiple of 4 and
// `quad`: one Philox group and one access per tensor each) or its elements (each its own group).
template <typename T>
__global__ void dropout_rows_kernel(const T *a, const T *residual, T *y, int64_t nrows, const int32_t *rows,
                                    int64_t L, uint64_t seed, uint64_t offset0, const uint32_t *offset_hi,
                                    uint32_t threshold, compute_t<T> scale, bool quad) {
    DST_GRID_DEPENDENCY();
    const uint64_t offset = dropout_offset(offset0, offset_hi);
    using C = compute_t<T>;
    for (int64_t r = blockIdx.x; r < nrows; r += gridDim.x) {
        const int64_t base = r * L;
        const uint64_t pbase = uint64_t(rows[r]) * uint64_t(L);
        if (quad) {
            for (int64_t c = 4 * int64_t(threadIdx.x); c < L; c += 4 * int64_t(blockDim.x))
                dropout_quad(a, residual, y, base + c, philox_dropout_block(seed, offset, (pbase + uint64_t(c)) >> 2),
                             threshold, scale);
            continue;
        }
        for (int64_t c = threadIdx.x; c < L; c += blockDim.x) {
            const int64_t e = base + c;
            C v = philox_dropout_keep(seed, offset, pbase + uint64_t(c), threshold) ? dmul_rn(to_compute(a[e]), scale) : C(0);
            if (residual) v = to_compute(residual[e]) + v;
            y[e] = to_storage<T>(v);
        }
    }
}

// The keep words of site elements pe … pe + 4·G − 1 (pe a multiple of 4): G Philox groups, drawn only
// for an active site (threshold ≠ 0; zeros otherwise). Element pe + k is kept iff r[k / 4].v[k % 4] ≥
// threshold.
template <int G>
__device__ __forceinline__ void dropout_words(uint64_t seed, uint64_t offset, uint64_t pe, uint32_t threshold,
                                              Philox4 (&r)[G]) {
#pragma unroll
    for (int g = 0; g < G; ++g)
        r[g] = threshold != 0u ? philox_dropout_block(seed, offset, (pe >> 2) + uint64_t(g)) : Philox4{{0u, 0u, 0u, 0u}};
}

// Dropout (+ residual) over 16-byte vectors (fp32, fp16, bf16; every pointer 16-byte aligned): thread
// i of the grid takes vector i, elements e = i·V … i·V + V − 1 of the buffer, which are elements
// pe … of the site (pe = e, or with a row map rows[e / L]·L + e mod L, L a multiple of V), i.e. its
// V/4 Philox groups pe/4 …; the first count mod V threads after the vectors take one element each.
// The keep decisions and the arithmetic are those of dropout_kernel: the same results.
template <typename T>
__global__ void dropout_vec_kernel(const T *a, const T *residual, T *y, int64_t count, const int32_t *rows,
                                   int64_t L, uint64_t seed, uint64_t offset0, const uint32_t *offset_hi,
                                   uint32_t threshold, compute_t<T> scale) {
    DST_GRID_DEPENDENCY();
    const uint64_t offset = dropout_offset(offset0, offset_hi);
    using C = compute_t<T>;
    constexpr int V = kVec<T>, G = V / 4;
    static_assert(V % 4 == 0, "whole Philox groups per vector");
    const int64_t tid = blockIdx.x * int64_t(blockDim.x) + threadIdx.x, nvec = count / V;
    if (tid < nvec) {
        const int64_t e = tid * V;
        const uint64_t pe = rows ? uint64_t(rows[e / L]) * uint64_t(L) + uint64_t(e % L) : uint64_t(e);
        const Vec<T> va = reinterpret_cast<const Vec<T> *>(a)[tid];
        Vec<T> vr{}, out;
        if (residual) vr = reinterpret_cast<const Vec<T> *>(residual)[tid];
        Philox4 r[G];
        dropout_words<G>(seed, offset, pe, threshold, r);
#pragma unroll
        for (int k = 0; k < V; ++k) {
            C v = to_compute(va.v[k]);
            if (threshold != 0u) v = r[k / 4].v[k % 4] >= threshold ? dmul_rn(v, scale) : C(0);
            if (residual) v = to_compute(vr.v[k]) + v;
            out.v[k] = to_storage<T>(v);
        }
        reinterpret_cast<Vec<T> *>(y)[tid] = out;
    }
    const int64_t e = nvec * V + tid;  // the tail (only without a row map: count is then rows·L)
    if (e < count) {
        C v = to_compute(a[e]);
        if (threshold != 0u) v = philox_dropout_keep(seed, offset, uint64_t(e), threshold) ? dmul_rn(v, scale) : C(0);
        if (residual) v = to_compute(residual[e]) + v;
        y[e] = to_storage<T>(v);
    }
}

// dx = dropout'(dy) over [n, m] with the column partial sums of dx as stored (colsum::partial_vec): the
// keep decisions and arithmetic of dropout_vec_kernel (element c of row r is element r·m + c of the
// site, or rows[r]·m + c with a row map of row length m), the sums in column_sum's order.
template <typename T>
__global__ void __launch_bounds__(colsum::kTileThreads *colsum::kRowLanes)
    dropout_bwd_partial_kernel(const T *dy, T *dx, int64_t n, int64_t m, int64_t R, const int32_t *rows,
                               uint64_t seed, uint64_t offset0, const uint32_t *offset_hi, uint32_t threshold,
                               compute_t<T> scale, compute_t<T> *__restrict__ partial) {
    DST_GRID_DEPENDENCY();
    const uint64_t offset = dropout_offset(offset0, offset_hi);
    using C = compute_t<T>;
    constexpr int V = kVec<T>, G = V / 4;
    static_assert(V % 4 == 0, "whole Philox groups per vector");
    __shared__ C red[colsum::partial_smem<T>() / sizeof(C)];
    colsum::partial_vec<T>(n, m, R, partial, red, [&](int64_t r, int64_t c) {
        const int64_t i = r * m + c;
        const uint64_t pe = (rows ? uint64_t(rows[r]) : uint64_t(r)) * uint64_t(m) + uint64_t(c);
        const Vec<T> va = *reinterpret_cast<const Vec<T> *>(dy + i);
        Philox4 q[G];
        dropout_words<G>(seed, offset, pe, threshold, q);
        Vec<T> out;
#pragma unroll
        for (int k = 0; k < V; ++k) {
            C v = to_compute(va.v[k]);
            if (threshold != 0u) v = q[k / 4].v[k % 4] >= threshold ? dmul_rn(v, scale) : C(0);
            out.v[k] = to_storage<T>(v);
        }
        *reinterpret_cast<Vec<T> *>(dx + i) = out;
        return out;
    });
}

// Every thread that sees a zero writes 1 (the same value: the result does not depend on order).
template <typename T>
__global__ void any_zero_kernel(const T *x, int64_t count, int *any_zero) {
    for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < count;
         i += int64_t(gridDim.x) * blockDim.x)
        if (to_compute(x[i]) == compute_t<T>(0)) *any_zero = 1;
}

}  // namespace

// ================================ launchers ======================================================

namespace {
template <typename Op>
cudaError_t launch_map(cudaStream_t stream, dst_dtype dt, const void *a, const void *b, void *y, int64_t count,
                       Op op) {
    if (count <= 0) return cudaSuccess;
    const bool vec = aligned16(a) && aligned16(y) && (!b || aligned16(b));
    return dispatch_dtype(dt, [&](auto tag) {
        using T = decltype(tag);
        // The vector path has a thread per vector (at least one per tail element); the scalar path loops.
        const int64_t nvec = count / kVec<T>, work = nvec > count % kVec<T> ? nvec : count % kVec<T>;
        const unsigned blocks = vec ? static_cast<unsigned>((work + kThreads - 1) / kThreads) : grid_blocks(count, kThreads);
        DST_KERNEL_CHECK(launch_dependent(map_kernel<T, Op>, blocks, kThreads, 0, stream, static_cast<const T *>(a),
                                          static_cast<const T *>(b), static_cast<T *>(y), count, vec, op));
        return cudaSuccess;
    });
}
}  // namespace

cudaError_t gelu_fwd(cudaStream_t stream, dst_dtype dt, dst_gelu form, const void *u, void *g,
                    int64_t count) {
    return launch_map(stream, dt, u, nullptr, g, count, GeluFwd{form, is_16bit(dt)});
}

cudaError_t gelu_bwd(cudaStream_t stream, dst_dtype dt, dst_gelu form, const void *dg, const void *u,
                    void *du, int64_t count) {
    return launch_map(stream, dt, dg, u, du, count, GeluBwd{form, is_16bit(dt)});
}

cudaError_t gelu_bwd_bias_grad(cudaStream_t stream, dst_dtype dt, dst_gelu form, const void *dg, const void *u,
                              void *du, int64_t n, int64_t m, void *db, bool accumulate, void *workspace) {
    if (m <= 0) return cudaSuccess;
    const GeluBwd op{form, is_16bit(dt)};
    return dispatch_dtype(dt, [&](auto tag) {
        using T = decltype(tag);
        const bool vec = aligned16(dg) && aligned16(u) && aligned16(du) && m % kVec<T> == 0;
        if (!vec) {  // the two passes it fuses: the same results
            const cudaError_t e = launch_map(stream, dt, dg, u, du, n * m, op);
            return e != cudaSuccess ? e : column_sum(stream, dt, du, db, n, m, accumulate, workspace);
        }
        if (colsum::chunk_count(n) > 0) {
            DST_KERNEL_CHECK(launch_dependent(gelu_bwd_partial_kernel<T>, colsum::partial_grid<T>(n, m, true),
                                              colsum::partial_block(), 0, stream, static_cast<const T *>(dg),
                                              static_cast<const T *>(u), static_cast<T *>(du), n, m,
                                              colsum::rows_per_chunk(n), static_cast<compute_t<T> *>(workspace),
                                              op));
        }
        return column_sum_finalize(stream, dt, workspace, db, n, m, accumulate);
    });
}

cudaError_t tanh_fwd(cudaStream_t stream, dst_dtype dt, const void *u, void *y, int64_t count) {
    return launch_map(stream, dt, u, nullptr, y, count, TanhFwd{});
}

cudaError_t tanh_bwd(cudaStream_t stream, dst_dtype dt, const void *dy, const void *u, void *du, int64_t count) {
    return launch_map(stream, dt, dy, u, du, count, TanhBwd{});
}

namespace {
cudaError_t launch_dropout(cudaStream_t stream, dst_dtype dt, const void *a, const void *residual, void *y,
                           int64_t count, const DropoutSite &site) {
    if (count <= 0) return cudaSuccess;
    const int64_t groups = (count + 3) / 4;
    return dispatch_dtype(dt, [&](auto tag) {
        using T = decltype(tag);
        using C = compute_t<T>;
        const uintptr_t q = 4 * sizeof(T);
        const bool quad = sizeof(T) <= 4 && reinterpret_cast<uintptr_t>(a) % q == 0 &&
                          reinterpret_cast<uintptr_t>(y) % q == 0 &&
                          (!residual || reinterpret_cast<uintptr_t>(residual) % q == 0);
        const bool rows = site.rows && site.active();
        const bool vec = sizeof(T) <= 4 && aligned16(a) && aligned16(y) && (!residual || aligned16(residual)) &&
                         (!rows || site.row_len % kVec<T> == 0);
        if constexpr (sizeof(T) <= 4) {
            if (vec) {  // 16-byte accesses (the other kernels: 4 elements, or 1, per access)
                const int64_t nvec = count / kVec<T>, work = nvec > count % kVec<T> ? nvec : count % kVec<T>;
                DST_KERNEL_CHECK(launch_dependent(
                    dropout_vec_kernel<T>, static_cast<unsigned>((work + kThreads - 1) / kThreads), kThreads, 0,
                    stream, static_cast<const T *>(a), static_cast<const T *>(residual), static_cast<T *>(y), count,
                    rows ? site.rows : nullptr, rows ? site.row_len : int64_t(1), site.seed, site.offset,
                    site.offset_hi, site.threshold, static_cast<C>(site.scale)));
                return cudaSuccess;
            }
        }
        if (rows) {
            const int64_t nrows = count / site.row_len;
            DST_KERNEL_CHECK(launch_dependent(
                dropout_rows_kernel<T>, static_cast<unsigned>(nrows < 65536 ? nrows : 65536), kThreads, 0, stream,
                static_cast<const T *>(a), static_cast<const T *>(residual), static_cast<T *>(y), nrows, site.rows,
                site.row_len, site.seed, site.offset, site.offset_hi, site.threshold, static_cast<C>(site.scale),
                quad && site.row_len % 4 == 0));
        } else {
            DST_KERNEL_CHECK(launch_dependent(dropout_kernel<T>, grid_blocks(groups, kThreads), kThreads, 0, stream,
                                              static_cast<const T *>(a), static_cast<const T *>(residual),
                                              static_cast<T *>(y), count, site.seed, site.offset, site.offset_hi,
                                              site.threshold, static_cast<C>(site.scale), quad));
        }
        return cudaSuccess;
    });
}
}  // namespace

cudaError_t dropout_residual_fwd(cudaStream_t stream, dst_dtype dt, const void *a, const void *residual,
                                void *y, int64_t count, const DropoutSite &site) {
    return launch_dropout(stream, dt, a, residual, y, count, site);
}

cudaError_t dropout_bwd(cudaStream_t stream, dst_dtype dt, const void *dy, void *dx, int64_t count,
                       const DropoutSite &site) {
    return launch_dropout(stream, dt, dy, nullptr, dx, count, site);
}

cudaError_t dropout_bwd_bias_grad(cudaStream_t stream, dst_dtype dt, const void *dy, void *dx, int64_t n, int64_t m,
                                 const DropoutSite &site, void *db, bool accumulate, void *workspace) {
    if (m <= 0) return cudaSuccess;
    return dispatch_dtype(dt, [&](auto tag) {
        using T = decltype(tag);
        using C = compute_t<T>;
        const bool rows = site.rows && site.active();
        if constexpr (sizeof(T) <= 4) {  // whole Philox groups per 16-byte vector
            if (aligned16(dy) && aligned16(dx) && m % kVec<T> == 0 && (!rows || site.row_len == m)) {
                if (colsum::chunk_count(n) > 0)
                    DST_KERNEL_CHECK(launch_dependent(
                        dropout_bwd_partial_kernel<T>, colsum::partial_grid<T>(n, m, true), colsum::partial_block(), 0,
                        stream, static_cast<const T *>(dy), static_cast<T *>(dx), n, m, colsum::rows_per_chunk(n),
                        rows ? site.rows : nullptr, site.seed, site.offset, site.offset_hi, site.threshold,
                        static_cast<C>(site.scale), static_cast<C *>(workspace)));
                return column_sum_finalize(stream, dt, workspace, db, n, m, accumulate);
            }
        }
        // The two passes it fuses: the same results.
        const cudaError_t e = launch_dropout(stream, dt, dy, nullptr, dx, n * m, site);
        return e != cudaSuccess ? e : column_sum(stream, dt, dx, db, n, m, accumulate, workspace);
    });
}

cudaError_t add(cudaStream_t stream, dst_dtype dt, const void *a, const void *b, void *y, int64_t count) {
    return launch_map(stream, dt, a, b, y, count, Add{});
}

cudaError_t any_zero(cudaStream_t stream, dst_dtype dt, const void *x, int64_t count, int *flag) {
    DST_KERNEL_CHECK(cudaMemsetAsync(flag, 0, sizeof(int), stream));
    if (count <= 0) return cudaSuccess;
    return dispatch_dtype(dt, [&](auto tag) {
        using T = decltype(tag);
        any_zero_kernel<T><<<grid_blocks(count, kThreads), kThreads, 0, stream>>>(
            static_cast<const T *>(x), count, flag);
        DST_KERNEL_CHECK(cudaGetLastError());
        return cudaSuccess;
    });
}

}  // namespace cuda
}  // namespace dst
