// LayerNorm forward and backward.
//   layernorm_fwd_kernel: one block per row; two passes over the row (mean, then the centred sum of
//     squares: population variance, no cancellation), block sums in a fixed tree.
//   layernorm_bwd_dx_kernel: one block per row; Σg and Σg·x̂ in one pass, dx in a second (each
//     thread reads its elements before writing them, so dx may alias dy or dresid).
//   layernorm_param_partial_kernel + layernorm_param_finalize_kernel: dγ and dβ as column sums of
//     dy·x̂ and dy, in the same two-pass, fixed-order scheme as kernels/bias.cu (the partials with
//     16-byte accesses where rows and buffers allow, in the same order).
//   The *_warp_kernel forms: one warp per row when h = 32·VPL·kVec<T> (VPL = 1, 2, 4, 8: h = 256 …
//     2048 in 16-bit types, 128 … 1024 in fp32, 64 … 512 in fp64) and the tensors are 16-byte
//     aligned: the row stays in registers between the passes (one read of x, one write of y; dy, x
//     or y read once in the backward), 16-byte accesses, warp sums in a fixed tree. The same
//     formulas; only the order of the row sums differs from the block form.
// Arithmetic in compute_t<T>; one rounding on store.
#include "kernels/layernorm.cuh"

#include "kernels/bias.cuh"

#include "kernels/column_partial.cuh"
#include "kernels/dispatch.cuh"
#include "kernels/launch.cuh"
#include "kernels/elementwise.cuh"
#include "kernels/philox.h"

#include <type_traits>

namespace dst {
namespace cuda {
namespace {

// The γ/β partial sums use the column sums' tiling and chunking (kernels/column_partial.cuh).
using colsum::chunk_count;
using colsum::kRowLanes;
constexpr int kTileCols = colsum::kTileThreads;

int row_threads(int64_t h) { return h <= 128 ? 32 : (h <= 1024 ? 128 : 256); }

// ================================ kernels ========================================================

template <typename T>
__global__ void layernorm_fwd_kernel(const T *x, const T *__restrict__ gamma,
                                     const T *__restrict__ beta, T *y,
                                     compute_t<T> *__restrict__ mean, compute_t<T> *__restrict__ rstd,
                                     int64_t h, compute_t<T> eps) {
    DST_GRID_DEPENDENCY();
    using C = compute_t<T>;
    __shared__ C scratch[33];
    const int64_t row = blockIdx.x;
    const T *xr = x + row * h;
    C s = 0;
    for (int64_t c = threadIdx.x; c < h; c += blockDim.x) s += to_compute(xr[c]);
    const C mu = block_sum(s, scratch) / C(h);
    C q = 0;
    for (int64_t c = threadIdx.x; c < h; c += blockDim.x) {
        const C d = to_compute(xr[c]) - mu;
        q += d * d;
    }
    const C var = block_sum(q, scratch) / C(h);
    const C rs = C(1) / dsqrt(var + eps);
    T *yr = y + row * h;
    for (int64_t c = threadIdx.x; c < h; c += blockDim.x)
        yr[c] = to_storage<T>(to_compute(gamma[c]) * ((to_compute(xr[c]) - mu) * rs) +
                              to_compute(beta[c]));
    if (threadIdx.x == 0) {
        if (mean) mean[row] = mu;
        if (rstd) rstd[row] = rs;
    }
}

// The keep words of the V/4 Philox groups of vector vi of row `row` at a dropout site whose rows are
// the LayerNorm's rows (element c of row r is site element (rows ? rows[r] : r)·h + c).
template <typename T>
struct RowDropout {
    static constexpr int G = kVec<T> / 4;
    Philox4 r[G > 0 ? G : 1];
    __device__ __forceinline__ RowDropout(const DropoutSite &site, int64_t row, int64_t h, int64_t vi) {
        const uint64_t pe = (site.rows ? uint64_t(site.rows[row]) : uint64_t(row)) * uint64_t(h) + uint64_t(vi) * kVec<T>;
        const uint64_t offset = site.offset_now();
#pragma unroll
        for (int g = 0; g < G; ++g) r[g] = philox_dropout_block(site.seed, offset, (pe >> 2) + uint64_t(g));
    }
    __device__ __forceinline__ bool keep(int k, uint32_t threshold) const { return r[k / 4].v[k % 4] >= threshold; }
};

// x = residual + dropout(a) (`drop`: a, residual and the site; z receives x in the storage dtype) or
// x read from memory, then the LayerNorm of x as stored. With `drop` the results are those of
// dropout_residual_fwd followed by layernorm_fwd (the same roundings in the same order).
template <typename T>
struct LnFwdDrop {
    const T *a, *residual;
    T *z;
    DropoutSite site;
};

template <typename T, int VPL, bool kDrop>
__global__ void layernorm_fwd_warp_kernel(const T *x, const T *__restrict__ gamma, const T *__restrict__ beta, T *y,
                                          compute_t<T> *__restrict__ mean, compute_t<T> *__restrict__ rstd, int64_t n,
                                          int64_t h, compute_t<T> eps, LnFwdDrop<T> drop) {
    DST_GRID_DEPENDENCY();
    using C = compute_t<T>;
    constexpr int V = kVec<T>;
    const int lane = threadIdx.x & 31;
    const int64_t row = blockIdx.x * int64_t(blockDim.x >> 5) + (threadIdx.x >> 5);
    if (row >= n) return;  // the whole warp
    C v[VPL][V];
    C s = 0;
#pragma unroll
    for (int j = 0; j < VPL; ++j) {
        const int64_t vi = lane + 32 * j;
        if constexpr (kDrop) {
            const Vec<T> av = reinterpret_cast<const Vec<T> *>(drop.a + row * h)[vi];
            const Vec<T> rv = reinterpret_cast<const Vec<T> *>(drop.residual + row * h)[vi];
            const uint32_t thr = drop.site.threshold;
            const C scale = C(drop.site.scale);
            Vec<T> zv;
            if (thr != 0u) {
                const RowDropout<T> rd(drop.site, row, h, vi);
#pragma unroll
                for (int k = 0; k < V; ++k) {  // as dropout_vec_kernel: a·scale rounded, then + residual
                    const C v = rd.keep(k, thr) ? dmul_rn(to_compute(av.v[k]), scale) : C(0);
                    zv.v[k] = to_storage<T>(to_compute(rv.v[k]) + v);
                }
            } else {
#pragma unroll
                for (int k = 0; k < V; ++k) zv.v[k] = to_storage<T>(to_compute(rv.v[k]) + to_compute(av.v[k]));
            }
            reinterpret_cast<Vec<T> *>(drop.z + row * h)[vi] = zv;
#pragma unroll
            for (int k = 0; k < V; ++k) {
                v[j][k] = to_compute(zv.v[k]);
                s += v[j][k];
            }
        } else {
            const Vec<T> t = reinterpret_cast<const Vec<T> *>(x + row * h)[vi];
#pragma unroll
            for (int k = 0; k < V; ++k) {
                v[j][k] = to_compute(t.v[k]);
                s += v[j][k];
            }
        }
    }
    const C mu = warp_sum(s) / C(h);
    C q = 0;
#pragma unroll
    for (int j = 0; j < VPL; ++j)
#pragma unroll
        for (int k = 0; k < V; ++k) {
            const C d = v[j][k] - mu;
            q += d * d;
        }
    const C rs = C(1) / dsqrt(warp_sum(q) / C(h) + eps);
    Vec<T> *yr = reinterpret_cast<Vec<T> *>(y + row * h);
#pragma unroll
    for (int j = 0; j < VPL; ++j) {
        const Vec<T> g = reinterpret_cast<const Vec<T> *>(gamma)[lane + 32 * j];
        const Vec<T> b = reinterpret_cast<const Vec<T> *>(beta)[lane + 32 * j];
        Vec<T> o;
#pragma unroll
        for (int k = 0; k < V; ++k)
            o.v[k] = to_storage<T>(to_compute(g.v[k]) * ((v[j][k] - mu) * rs) + to_compute(b.v[k]));
        yr[lane + 32 * j] = o;
    }
    if (lane == 0) {
        if (mean) mean[row] = mu;
        if (rstd) rstd[row] = rs;
    }
}

// x̂ of element (row, c): from the input and stats, or from the output and γ, β.
template <typename T>
__device__ __forceinline__ compute_t<T> xhat(const T *xy, const T *gamma, const T *beta, bool invertible,
                                             compute_t<T> mu, compute_t<T> rs, int64_t idx, int64_t c) {
    const compute_t<T> v = to_compute(xy[idx]);
    if (invertible) return (v - to_compute(beta[c])) / to_compute(gamma[c]);
    return (v - mu) * rs;
}

// The branch gradient of layernorm_bwd with a dropout site: branch = dropout'(dx) from dx before its
// rounding (out == nullptr: none).
template <typename T>
struct LnBwdBranch {
    T *out;
    DropoutSite site;
};

template <typename T>
__global__ void layernorm_bwd_dx_kernel(const T *dy, const T *__restrict__ xy,
                                        bool invertible, const T *__restrict__ gamma,
                                        const T *__restrict__ beta, const compute_t<T> *__restrict__ mean,
                                        const compute_t<T> *__restrict__ rstd, const T *dresid, T *dx,
                                        int64_t h, LnBwdBranch<T> branch) {
    DST_GRID_DEPENDENCY();
    using C = compute_t<T>;
    __shared__ C scratch[33];
    const int64_t row = blockIdx.x, base = row * h;
    const C rs = rstd[row];
    const C mu = invertible ? C(0) : mean[row];
    C sg = 0, sgx = 0;
    for (int64_t c = threadIdx.x; c < h; c += blockDim.x) {
        const C g = to_compute(gamma[c]) * to_compute(dy[base + c]);
        sg += g;
        sgx += g * xhat(xy, gamma, beta, invertible, mu, rs, base + c, c);
    }
    const C mg = block_sum(sg, scratch) / C(h);
    const C mgx = block_sum(sgx, scratch) / C(h);
    for (int64_t c = threadIdx.x; c < h; c += blockDim.x) {
        const C g = to_compute(gamma[c]) * to_compute(dy[base + c]);
        C v = rs * (g - mg - xhat(xy, gamma, beta, invertible, mu, rs, base + c, c) * mgx);
        if (dresid) v += to_compute(dresid[base + c]);
        if (branch.out) {
            const DropoutSite &st = branch.site;
            const uint64_t pe = (st.rows ? uint64_t(st.rows[row]) : uint64_t(row)) * uint64_t(h) + uint64_t(c);
            const bool keep = st.threshold == 0u || philox_dropout_keep(st.seed, st.offset_now(), pe, st.threshold);
            branch.out[base + c] = to_storage<T>(st.threshold == 0u ? v : keep ? v * C(st.scale) : C(0));
        }
        dx[base + c] = to_storage<T>(v);
    }
}

// Vector vi of row `row` of dx from its values before rounding, and with kBranch the branch gradient
// dropout'(dx) from the same values; with kSums the branch as stored is also added to bsum[0 … V − 1]
// (the bias gradient's column sums). The warp and split forms' one store.
template <typename T, bool kBranch, bool kSums = false>
__device__ __forceinline__ void ln_bwd_store_vec(const compute_t<T> (&val)[kVec<T>], const LnBwdBranch<T> &branch,
                                                 int64_t row, int64_t h, int64_t base, int64_t vi, T *dx,
                                                 compute_t<T> *bsum = nullptr) {
    using C = compute_t<T>;
    constexpr int V = kVec<T>;
    Vec<T> o, ob;
#pragma unroll
    for (int k = 0; k < V; ++k) o.v[k] = to_storage<T>(val[k]);
    if constexpr (kBranch) {
        const uint32_t thr = branch.site.threshold;
        const C scale = C(branch.site.scale);
        if (thr != 0u) {
            const RowDropout<T> rd(branch.site, row, h, vi);
#pragma unroll
            for (int k = 0; k < V; ++k) ob.v[k] = to_storage<T>(rd.keep(k, thr) ? val[k] * scale : C(0));
        } else {
            ob = o;
        }
        reinterpret_cast<Vec<T> *>(branch.out + base)[vi] = ob;
        if constexpr (kSums)
#pragma unroll
            for (int k = 0; k < V; ++k) bsum[k] += to_compute(ob.v[k]);
    }
    reinterpret_cast<Vec<T> *>(dx + base)[vi] = o;
}

template <typename T, int VPL, bool kBranch>
__global__ void layernorm_bwd_dx_warp_kernel(const T *dy, const T *__restrict__ xy, bool invertible,
                                             const T *__restrict__ gamma, const T *__restrict__ beta,
                                             const compute_t<T> *__restrict__ mean,
                                             const compute_t<T> *__restrict__ rstd, const T *dresid, T *dx,
                                             int64_t n, int64_t h, LnBwdBranch<T> branch) {
    DST_GRID_DEPENDENCY();
    using C = compute_t<T>;
    constexpr int V = kVec<T>;
    const int lane = threadIdx.x & 31;
    const int64_t row = blockIdx.x * int64_t(blockDim.x >> 5) + (threadIdx.x >> 5);
    if (row >= n) return;  // the whole warp
    const int64_t base = row * h;
    const C rs = rstd[row];
    const C mu = invertible ? C(0) : mean[row];
    C g[VPL][V], xh[VPL][V];
    C sg = 0, sgx = 0;
#pragma unroll
    for (int j = 0; j < VPL; ++j) {
        const int64_t vi = lane + 32 * j;
        const Vec<T> d = reinterpret_cast<const Vec<T> *>(dy + base)[vi];
        const Vec<T> xv = reinterpret_cast<const Vec<T> *>(xy + base)[vi];
        const Vec<T> gm = reinterpret_cast<const Vec<T> *>(gamma)[vi];
        Vec<T> bt{};
        if (invertible) bt = reinterpret_cast<const Vec<T> *>(beta)[vi];
#pragma unroll
        for (int k = 0; k < V; ++k) {
            const C gk = to_compute(gm.v[k]);
            g[j][k] = gk * to_compute(d.v[k]);
            const C val = to_compute(xv.v[k]);
            xh[j][k] = invertible ? (val - to_compute(bt.v[k])) / gk : (val - mu) * rs;
            sg += g[j][k];
            sgx += g[j][k] * xh[j][k];
        }
    }
    const C mg = warp_sum(sg) / C(h);
    const C mgx = warp_sum(sgx) / C(h);
#pragma unroll
    for (int j = 0; j < VPL; ++j) {
        const int64_t vi = lane + 32 * j;
        Vec<T> r{};
        if (dresid) r = reinterpret_cast<const Vec<T> *>(dresid + base)[vi];
        C val[V];
#pragma unroll
        for (int k = 0; k < V; ++k) {
            val[k] = rs * (g[j][k] - mg - xh[j][k] * mgx);
            if (dresid) val[k] += to_compute(r.v[k]);
        }
        ln_bwd_store_vec<T, kBranch>(val, branch, row, h, base, vi, dx);
    }
}

// partial[0][chunk][c] = Σ_{rows of chunk} dy·x̂, partial[1][chunk][c] = Σ dy. Block: 32 lanes × 8 row
// lanes; lane x takes the V columns x·V … of the block's 32·V (V = 1, or kVec<T> with 16-byte accesses
// when h is a multiple of it and dy, xy — and γ, β when invertible — are 16-byte aligned), row lane y
// the rows r0 + y, r0 + y + 8, … of the chunk; the row lanes are then added in order. The summation
// order of a column is the same for both V.
template <typename T, int V>
struct Cols {  // V consecutive elements at p[i·V …]: one 16-byte access, or one element
    compute_t<T> v[V];
    __device__ __forceinline__ explicit Cols(const T *p, int64_t i) {
        if constexpr (V == 1) {
            v[0] = to_compute(p[i]);
        } else {
            static_assert(V == kVec<T>, "a whole vector");
            const Vec<T> x = reinterpret_cast<const Vec<T> *>(p)[i];
#pragma unroll
            for (int k = 0; k < V; ++k) v[k] = to_compute(x.v[k]);
        }
    }
};

template <typename T, int V>
__global__ void layernorm_param_partial_kernel(const T *__restrict__ dy, const T *__restrict__ xy,
                                               bool invertible, const T *__restrict__ gamma,
                                               const T *__restrict__ beta,
                                               const compute_t<T> *__restrict__ mean,
                                               const compute_t<T> *__restrict__ rstd,
                                               compute_t<T> *__restrict__ partial, int64_t n, int64_t h,
                                               int64_t chunks, int64_t rows_per_chunk) {
    DST_GRID_DEPENDENCY();
    using C = compute_t<T>;
    __shared__ C red[2][V][kRowLanes][kTileCols + 1];
    const int64_t vi = blockIdx.x * int64_t(kTileCols) + threadIdx.x, c0 = vi * V;
    const int64_t r0 = blockIdx.y * rows_per_chunk;
    const int64_t r1 = r0 + rows_per_chunk < n ? r0 + rows_per_chunk : n;
    C sg[V] = {}, sb[V] = {};
    if (c0 < h) {
        C gm[V] = {}, bt[V] = {};
        if (invertible) {
            const Cols<T, V> g(gamma, vi), b(beta, vi);
#pragma unroll
            for (int k = 0; k < V; ++k) gm[k] = g.v[k], bt[k] = b.v[k];
        }
        for (int64_t r = r0 + threadIdx.y; r < r1; r += kRowLanes) {
            const Cols<T, V> d(dy + r * h, vi), x(xy + r * h, vi);
            const C mu = invertible ? C(0) : mean[r], rs = rstd[r];
#pragma unroll
            for (int k = 0; k < V; ++k) {
                // one fma, written out: the split form computes the same, so both give the same bits
                // whatever ptxas would contract (the 16-bit and fp64 kernels' SASS is as before)
                sg[k] = fma(d.v[k], invertible ? (x.v[k] - bt[k]) / gm[k] : (x.v[k] - mu) * rs, sg[k]);
                sb[k] += d.v[k];
            }
        }
    }
#pragma unroll
    for (int k = 0; k < V; ++k) {
        red[0][k][threadIdx.y][threadIdx.x] = sg[k];
        red[1][k][threadIdx.y][threadIdx.x] = sb[k];
    }
    __syncthreads();
    if (threadIdx.y == 0 && c0 < h) {
#pragma unroll
        for (int k = 0; k < V; ++k) {
            C tg = red[0][k][0][threadIdx.x], tb = red[1][k][0][threadIdx.x];
            for (int j = 1; j < kRowLanes; ++j) {
                tg += red[0][k][j][threadIdx.x];
                tb += red[1][k][j][threadIdx.x];
            }
            partial[blockIdx.y * h + c0 + k] = tg;
            partial[(chunks + blockIdx.y) * h + c0 + k] = tb;
        }
    }
}

// Block (32 columns × 8 chunk lanes): lane k adds chunks k, k + 8, … in order, then the lanes in order.
template <typename T>
__global__ void layernorm_param_finalize_kernel(const compute_t<T> *__restrict__ partial, T *dgamma,
                                                T *dbeta, int64_t h, int64_t chunks, bool accumulate) {
    DST_GRID_DEPENDENCY();
    using C = compute_t<T>;
    __shared__ C red[2][kRowLanes][kTileCols + 1];
    const int64_t c = blockIdx.x * int64_t(kTileCols) + threadIdx.x;
    C tg = 0, tb = 0;
    if (c < h)
        for (int64_t k = threadIdx.y; k < chunks; k += kRowLanes) {
            tg += partial[k * h + c];
            tb += partial[(chunks + k) * h + c];
        }
    red[0][threadIdx.y][threadIdx.x] = tg;
    red[1][threadIdx.y][threadIdx.x] = tb;
    __syncthreads();
    if (threadIdx.y == 0 && c < h) {
        tg = red[0][0][threadIdx.x];
        tb = red[1][0][threadIdx.x];
        for (int k = 1; k < kRowLanes; ++k) {
            tg += red[0][k][threadIdx.x];
            tb += red[1][k][threadIdx.x];
        }
        if (dgamma) dgamma[c] = to_storage<T>(accumulate ? to_compute(dgamma[c]) + tg : tg);
        if (dbeta) dbeta[c] = to_storage<T>(accumulate ? to_compute(dbeta[c]) + tb : tb);
    }
}

// The row lanes' column sums of a block into its chunk's partial row, added in row-lane order (the order
// of layernorm_param_partial_kernel and column_partial's lane reduction): row lane y's lane `lane` holds
// the sums of the columns of vectors vi0 + lane + 32·j of the row (J vectors of V). `red` holds
// kRowLanes·h words; element (vector v, column k) of lane y goes to y·h + k·(h/V) + v, so that a
// warp's stores are consecutive words. Every thread of the block calls it.
template <typename C, int J, int V>
__device__ __forceinline__ void flush_lane_sums(const C (&a)[J][V], C *red, C *out, int64_t h, int y, int64_t vi0) {
    const int lane = threadIdx.x & 31;
    const int64_t nv = h / V;
#pragma unroll
    for (int j = 0; j < J; ++j)
#pragma unroll
        for (int k = 0; k < V; ++k) red[y * h + k * nv + vi0 + lane + 32 * j] = a[j][k];
    __syncthreads();
    for (int64_t i = threadIdx.x; i < h; i += blockDim.x) {
        C t = red[i];
        for (int w = 1; w < kRowLanes; ++w) t += red[w * h + i];
        out[int64_t(blockIdx.x) * h + (i % nv) * V + i / nv] = t;
    }
    __syncthreads();
}

// The one-pass backward (the split form, kernels/dev/layernorm_lab.cu's v4 and v5): dx, the branch, and
// the column partial sums of dy·x̂, dy and the stored branch from one read of dy, x and dresid (x̂ from
// the input and its statistics; normalize_invertible's x̂ = (y − β)/γ takes the separate passes).
// A block per row chunk of kernels/column_partial.cuh (chunk_count(n) blocks, rows_per_chunk rows
// each); its kRowLanes row lanes take rows r0 + y, r0 + y + kRowLanes, … in order, as the column sums'
// lanes do, each row split over kSplit warps (warp kSplit·y + q takes the q-th of its kSplit equal
// parts: 32·VPL/kSplit vectors, lane l the vectors q·32·HV + l + 32·j). A row's two sums are the parts'
// warp sums added in part order, met in shared memory behind a named barrier per row lane (two slots,
// alternating rows). The column sums stay in registers (HV·kVec<T> columns per thread) until the
// block adds its row lanes in order into the chunk's partial row: the bits of the γ/β partial pass
// (explicit fma for dy·x̂, as that kernel's contraction) and of column_sum over the stored branch.
// One block per SM at BERT sizes (the grid is the chunk count), so the block's size is what puts warps
// in flight: 8·kSplit warps, at 1/kSplit of the warp form's registers per row.
template <typename T, int VPL, bool kBranch, int kSplit>
__global__ void __launch_bounds__(32 * kSplit * kRowLanes, 1)
    layernorm_bwd_split_kernel(const T *dy, const T *__restrict__ x, const T *__restrict__ gamma,
                               const compute_t<T> *__restrict__ mean,
                               const compute_t<T> *__restrict__ rstd, const T *dresid, T *dx, int64_t n, int64_t h,
                               int64_t R, int64_t chunks, LnBwdBranch<T> branch, compute_t<T> *__restrict__ partial,
                               compute_t<T> *__restrict__ bias_partial) {
    DST_GRID_DEPENDENCY();
    using C = compute_t<T>;
    constexpr int V = kVec<T>, HV = VPL / kSplit, W = 32 * VPL * V;  // W: the row length h
    static_assert(VPL % kSplit == 0, "kSplit parts of whole vectors per lane");
    __shared__ C red[kRowLanes * W];
    __shared__ C part[kRowLanes][2][kSplit][2];  // [row lane][slot][part][Σg, Σg·x̂]
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, y = warp / kSplit, q = warp % kSplit;
    const int64_t vi0 = int64_t(q) * 32 * HV;
    const int64_t r0 = int64_t(blockIdx.x) * R, r1 = r0 + R < n ? r0 + R : n;
    C sgam[HV][V], sbet[HV][V], sbr[HV][V];
#pragma unroll
    for (int j = 0; j < HV; ++j)
#pragma unroll
        for (int k = 0; k < V; ++k) sgam[j][k] = sbet[j][k] = sbr[j][k] = C(0);
    int slot = 0;
    for (int64_t row = r0 + y; row < r1; row += kRowLanes, slot ^= 1) {
        const int64_t base = row * h;
        Vec<T> d[HV], xv[HV], rv[HV];
#pragma unroll
        for (int j = 0; j < HV; ++j) {
            const int64_t vi = vi0 + lane + 32 * j;
            d[j] = reinterpret_cast<const Vec<T> *>(dy + base)[vi];
            xv[j] = reinterpret_cast<const Vec<T> *>(x + base)[vi];
            if (dresid) rv[j] = reinterpret_cast<const Vec<T> *>(dresid + base)[vi];
        }
        const C rs = rstd[row], mu = mean[row];
        C sg = 0, sgx = 0;
#pragma unroll
        for (int j = 0; j < HV; ++j) {
            const Vec<T> gm = reinterpret_cast<const Vec<T> *>(gamma)[vi0 + lane + 32 * j];
#pragma unroll
            for (int k = 0; k < V; ++k) {
                const C dk = to_compute(d[j].v[k]), g = to_compute(gm.v[k]) * dk;
                const C xh = (to_compute(xv[j].v[k]) - mu) * rs;
                sg += g;
                sgx += g * xh;
                sgam[j][k] = fma(dk, xh, sgam[j][k]);
                sbet[j][k] += dk;
            }
        }
        sg = warp_sum(sg);
        sgx = warp_sum(sgx);
        if (lane == 0) part[y][slot][q][0] = sg, part[y][slot][q][1] = sgx;
        asm volatile("bar.sync %0, %1;" ::"r"(1 + y), "r"(32 * kSplit) : "memory");
        C tg = part[y][slot][0][0], tgx = part[y][slot][0][1];
#pragma unroll
        for (int i = 1; i < kSplit; ++i) tg += part[y][slot][i][0], tgx += part[y][slot][i][1];
        const C mg = tg / C(h), mgx = tgx / C(h);
#pragma unroll
        for (int j = 0; j < HV; ++j) {
            const int64_t vi = vi0 + lane + 32 * j;
            const Vec<T> gm = reinterpret_cast<const Vec<T> *>(gamma)[vi];  // again, from L1
            C val[V];
#pragma unroll
            for (int k = 0; k < V; ++k) {
                const C g = to_compute(gm.v[k]) * to_compute(d[j].v[k]);
                const C xh = (to_compute(xv[j].v[k]) - mu) * rs;
                val[k] = rs * (g - mg - xh * mgx);
                if (dresid) val[k] += to_compute(rv[j].v[k]);
            }
            ln_bwd_store_vec<T, kBranch, true>(val, branch, row, h, base, vi, dx, sbr[j]);
        }
    }
    flush_lane_sums(sgam, red, partial, h, y, vi0);
    flush_lane_sums(sbet, red, partial + chunks * h, h, y, vi0);
    if (kBranch && bias_partial) flush_lane_sums(sbr, red, bias_partial, h, y, vi0);
}

// Rows of 32·VPL vectors per warp, for the warp forms (0: the block form).
template <typename T>
int warp_vpl(int64_t h) {
    const int64_t per = 32 * int64_t(kVec<T>);
    if (h % per != 0) return 0;
    const int64_t vpl = h / per;
    return vpl == 1 || vpl == 2 || vpl == 4 || vpl == 8 ? static_cast<int>(vpl) : 0;
}

constexpr int kWarpRows = 4;  // rows (warps) per block of the warp forms

}  // namespace

// ================================ launchers ======================================================

namespace {
// The warp forms of the forward, with or without the dropout + residual prologue.
template <typename T, bool kDrop>
cudaError_t launch_fwd_warp(cudaStream_t stream, int vpl, const T *x, const T *gamma, const T *beta, T *y,
                            compute_t<T> *mean, compute_t<T> *rstd, int64_t n, int64_t h, double eps,
                            const LnFwdDrop<T> &drop) {
    const unsigned grid = static_cast<unsigned>((n + kWarpRows - 1) / kWarpRows);
    auto k = vpl == 1   ? layernorm_fwd_warp_kernel<T, 1, kDrop>
             : vpl == 2 ? layernorm_fwd_warp_kernel<T, 2, kDrop>
             : vpl == 4 ? layernorm_fwd_warp_kernel<T, 4, kDrop>
                        : layernorm_fwd_warp_kernel<T, 8, kDrop>;
    return launch_dependent(k, grid, 32 * kWarpRows, 0, stream, x, gamma, beta, y, mean, rstd, n, h,
                            static_cast<compute_t<T>>(eps), drop);
}
}  // namespace

cudaError_t layernorm_fwd(cudaStream_t stream, dst_dtype dt, const void *x, const void *gamma,
                         const void *beta, void *y, void *mean, void *rstd, int64_t n, int64_t h,
                         double eps) {
    if (n <= 0 || h <= 0) return cudaSuccess;
    return dispatch_dtype(dt, [&](auto tag) {
        using T = decltype(tag);
        using C = compute_t<T>;
        const int vpl = aligned16(x) && aligned16(gamma) && aligned16(beta) && aligned16(y) ? warp_vpl<T>(h) : 0;
        if (vpl)
            return launch_fwd_warp<T, false>(stream, vpl, static_cast<const T *>(x), static_cast<const T *>(gamma),
                                             static_cast<const T *>(beta), static_cast<T *>(y), static_cast<C *>(mean),
                                             static_cast<C *>(rstd), n, h, eps, LnFwdDrop<T>{});
        DST_KERNEL_CHECK(launch_dependent(layernorm_fwd_kernel<T>, static_cast<unsigned>(n), row_threads(h), 0, stream,
                                          static_cast<const T *>(x), static_cast<const T *>(gamma),
                                          static_cast<const T *>(beta), static_cast<T *>(y), static_cast<C *>(mean),
                                          static_cast<C *>(rstd), h, static_cast<C>(eps)));
        return cudaSuccess;
    });
}

cudaError_t dropout_residual_layernorm_fwd(cudaStream_t stream, dst_dtype dt, const void *a, const void *residual,
                                           void *z, const void *gamma, const void *beta, void *y, void *mean,
                                           void *rstd, int64_t n, int64_t h, double eps, const DropoutSite &site) {
    if (n <= 0 || h <= 0) return cudaSuccess;
    return dispatch_dtype(dt, [&](auto tag) {
        using T = decltype(tag);
        using C = compute_t<T>;
        if constexpr (sizeof(T) <= 4) {  // whole Philox groups per 16-byte vector
            const bool map_ok = !site.rows || site.row_len == h;
            const int vpl = map_ok && aligned16(a) && aligned16(residual) && aligned16(z) && aligned16(gamma) &&
                                    aligned16(beta) && aligned16(y)
                                ? warp_vpl<T>(h)
                                : 0;
            if (vpl)
                return launch_fwd_warp<T, true>(stream, vpl, nullptr, static_cast<const T *>(gamma),
                                                static_cast<const T *>(beta), static_cast<T *>(y),
                                                static_cast<C *>(mean), static_cast<C *>(rstd), n, h, eps,
                                                LnFwdDrop<T>{static_cast<const T *>(a), static_cast<const T *>(residual),
                                                             static_cast<T *>(z), site});
        }
        DST_KERNEL_CHECK(dropout_residual_fwd(stream, dt, a, residual, z, n * h, site));
        return layernorm_fwd(stream, dt, z, gamma, beta, y, mean, rstd, n, h, eps);
    });
}

size_t layernorm_bwd_workspace(dst_dtype dt, int64_t n, int64_t h, bool branch_sums) {
    return static_cast<size_t>((branch_sums ? 3 : 2) * chunk_count(n) * h) * compute_size(dt);
}

cudaError_t layernorm_bwd(cudaStream_t stream, dst_dtype dt, const void *dy, const void *xy,
                         bool invertible, const void *gamma, const void *beta, const void *mean,
                         const void *rstd, const void *dresid, void *dx, void *dgamma, void *dbeta,
                         int64_t n, int64_t h, bool accumulate, void *workspace, const DropoutSite *branch_site,
                         void *branch_out, void *branch_db, int one_pass_split, bool *one_pass_ran) {
    if (one_pass_ran) *one_pass_ran = false;
    if (h <= 0) return cudaSuccess;
    const int64_t chunks = chunk_count(n);
    const int64_t rows_per_chunk = colsum::rows_per_chunk(n);
    bool ran = false;  // the one-pass form ran (and took the branch's column sums, when asked)
    const cudaError_t e = dispatch_dtype(dt, [&](auto tag) {
        using T = decltype(tag);
        using C = compute_t<T>;
        const T *dy_t = static_cast<const T *>(dy), *xy_t = static_cast<const T *>(xy);
        const T *g_t = static_cast<const T *>(gamma), *b_t = static_cast<const T *>(beta);
        const C *mean_c = static_cast<const C *>(mean), *rstd_c = static_cast<const C *>(rstd);
        const bool branch = branch_out != nullptr;
        const LnBwdBranch<T> br{static_cast<T *>(branch_out), branch ? *branch_site : DropoutSite{}};
        const int vpl = aligned16(dy) && aligned16(xy) && aligned16(gamma) && (!invertible || aligned16(beta)) &&
                                aligned16(dx) && (!dresid || aligned16(dresid)) &&
                                (!branch || (sizeof(T) <= 4 && aligned16(branch_out) &&
                                             (!br.site.rows || br.site.row_len == h)))
                            ? warp_vpl<T>(h)
                            : 0;
        // The one-pass form: 16-bit and fp32 rows of 2 or 4 vectors per lane, with the γ/β sums.
        if constexpr (sizeof(T) <= 4) {
            const int split = (vpl == 2 || vpl == 4) && one_pass_split > 0 ? (one_pass_split == 4 && vpl == 4 ? 4 : 2)
                                                                             : 0;
            if (split && !invertible && n > 0 && dx && (dgamma || dbeta)) {
                C *partial = static_cast<C *>(workspace);
                C *bias_partial = branch && branch_db ? partial + 2 * chunks * h : nullptr;
                auto pick = [&](auto vpl_c, auto split_c) {
                    constexpr int P = decltype(vpl_c)::value, S = decltype(split_c)::value;
                    return branch ? layernorm_bwd_split_kernel<T, P, true, S> : layernorm_bwd_split_kernel<T, P, false, S>;
                };
                using I2 = std::integral_constant<int, 2>;
                using I4 = std::integral_constant<int, 4>;
                auto k = vpl == 2 ? pick(I2{}, I2{}) : split == 2 ? pick(I4{}, I2{}) : pick(I4{}, I4{});
                DST_KERNEL_CHECK(launch_dependent(k, static_cast<unsigned>(chunks), 32 * split * kRowLanes, 0, stream,
                                                  dy_t, xy_t, g_t, mean_c, rstd_c, static_cast<const T *>(dresid),
                                                  static_cast<T *>(dx), n, h,
                                                  rows_per_chunk, chunks, br, partial, bias_partial));
                DST_KERNEL_CHECK(launch_dependent(layernorm_param_finalize_kernel<T>,
                                                  static_cast<unsigned>((h + kTileCols - 1) / kTileCols),
                                                  dim3(kTileCols, kRowLanes), 0, stream,
                                                  static_cast<const C *>(partial), static_cast<T *>(dgamma),
                                                  static_cast<T *>(dbeta), h, chunks, accumulate));
                if (bias_partial)
                    DST_KERNEL_CHECK(column_sum_finalize(stream, dt, bias_partial, branch_db, n, h, accumulate));
                ran = true;
                return cudaSuccess;
            }
        }
        // γ/β gradients first: dx may alias dy or dresid (stream order makes the reads come first).
        if (dgamma || dbeta) {
            C *partial = static_cast<C *>(workspace);
            const bool vec = h % kVec<T> == 0 && aligned16(dy) && aligned16(xy) &&
                             (!invertible || (aligned16(gamma) && aligned16(beta)));
            if (chunks > 0) {
                const int64_t cols = int64_t(kTileCols) * (vec ? kVec<T> : 1);
                const dim3 grid(static_cast<unsigned>((h + cols - 1) / cols), static_cast<unsigned>(chunks));
                auto k = vec ? layernorm_param_partial_kernel<T, kVec<T>> : layernorm_param_partial_kernel<T, 1>;
                DST_KERNEL_CHECK(launch_dependent(k, grid, dim3(kTileCols, kRowLanes), 0, stream, dy_t, xy_t,
                                                  invertible, g_t, b_t, mean_c, rstd_c, partial, n, h, chunks,
                                                  rows_per_chunk));
            }
            DST_KERNEL_CHECK(launch_dependent(layernorm_param_finalize_kernel<T>,
                                              static_cast<unsigned>((h + kTileCols - 1) / kTileCols),
                                              dim3(kTileCols, kRowLanes), 0, stream, static_cast<const C *>(partial),
                                              static_cast<T *>(dgamma), static_cast<T *>(dbeta), h, chunks,
                                              accumulate));
        }
        if (n > 0 && dx && vpl) {
            const unsigned grid = static_cast<unsigned>((n + kWarpRows - 1) / kWarpRows);
            auto pick = [&](auto flag) {
                constexpr bool kB = decltype(flag)::value;
                return vpl == 1   ? layernorm_bwd_dx_warp_kernel<T, 1, kB>
                       : vpl == 2 ? layernorm_bwd_dx_warp_kernel<T, 2, kB>
                       : vpl == 4 ? layernorm_bwd_dx_warp_kernel<T, 4, kB>
                                  : layernorm_bwd_dx_warp_kernel<T, 8, kB>;
            };
            auto k = branch ? pick(std::true_type{}) : pick(std::false_type{});
            DST_KERNEL_CHECK(launch_dependent(k, grid, 32 * kWarpRows, 0, stream, dy_t, xy_t, invertible, g_t, b_t,
                                              mean_c, rstd_c, static_cast<const T *>(dresid), static_cast<T *>(dx), n,
                                              h, br));
        } else if (n > 0 && dx) {
            DST_KERNEL_CHECK(launch_dependent(layernorm_bwd_dx_kernel<T>, static_cast<unsigned>(n), row_threads(h), 0,
                                              stream, dy_t, xy_t, invertible, g_t, b_t, mean_c, rstd_c,
                                              static_cast<const T *>(dresid), static_cast<T *>(dx), h, br));
        }
        return cudaSuccess;
    });
    if (one_pass_ran) *one_pass_ran = ran;
    if (e != cudaSuccess || !branch_out || !branch_db || ran) return e;
    // The separate passes: the branch's column sums after the rest (the workspace's γ/β partials have
    // been read by then, in stream order).
    return column_sum(stream, dt, branch_out, branch_db, n, h, accumulate, workspace);
}

}  // namespace cuda
}  // namespace dst
