// Fused attention, forward and backward, over qkv [B, S, 3H] (head h uses columns h·d … h·d+d−1 of
// the Q, K and V blocks) — the generic SIMT path: FP32 and FP64 layers at any head_dim, and FP16 and
// BF16 layers whose heads are wider than the tensor-core kernels run (head_dim > 128); any S.
//
// Work split. A block of 256 threads owns one (batch·head, tile of kBlock rows). Thread t is
// (r, c) = (t / 16, t % 16); in a kBlock×kBlock score tile it owns rows r + 16·ii and keys
// c + 16·jj (ii, jj < kBlock/16); in a kBlock×DMAX output tile it owns rows r + 16·kk and head-dim
// columns c + 16·e (e < DMAX/16). Tiles live in shared memory in the compute type with rows padded
// by one element (no bank conflicts on column walks). DMAX ∈ {32, 64, 128} is the head_dim rounded
// up; columns past head_dim are zero.
//
// Wide heads (head_dim > 128, DMAX = 128): the grid's z dimension splits the head's columns into
// chunks of 128, and block z owns the output columns 128·z … 128·z + 127 (of ctx, dK/dV or dQ). The
// score-side dot products (q·k, dctx·v) still run over the whole head: they walk the columns in
// 128-wide chunks through the same shared tiles (wide_dots), in the same order in every block, so
// every chunk's block sees bit-identical scores. The score work is repeated once per chunk; these
// heads are rare (DeepSpeed's tests use 800) and correctness, not speed, is the aim.
//
// Forward (attention_fwd_kernel): online softmax over key tiles — running max m, running sum l of
// exp(s − m) (before dropout), accumulator Σ dropout(exp(s − m))·v rescaled when m grows; at the
// end ctx = acc / l and lse = m + log l. Fully masked rows (l = 0) give ctx = 0 and lse = −inf.
// Dropout keeps element ((b·heads + h)·S + i)·S + j per kernels/philox.h, scaled by 1/(1−p).
//
// Backward, with P recomputed as exp(s − lse), P̃ = dropout(P),
// dP̃ = dctx·vᵀ, dP = dropout'(dP̃), D_i = dctx_i·ctx_i (= Σ_j P̃_ij dP̃_ij), dS = P ∘ (dP − D):
//   attention_bwd_dkdv_kernel owns a key tile and walks the query tiles: dV = Σ_i P̃ᵀ dctx,
//   dK = scale · Σ_i dSᵀ q;  attention_bwd_dq_kernel owns a query tile and walks the key tiles:
//   dQ = scale · Σ_j dS k. Each output element has exactly one writer: no atomics, deterministic.
#include "kernels/attention.cuh"

#include <type_traits>

#include "kernels/dispatch.cuh"
#include "kernels/philox.h"

namespace dst {
namespace cuda {
namespace {

// ================================ traits =========================================================

// Tile sizes per (compute type, DMAX). Shared memory: forward 2 row tiles + 1 score tile, backward
// 4 row tiles + 2 score tiles; every choice stays ≤ 99 KB (the opt-in limit of sm_86/sm_89) and
// holds at most 32 accumulators per thread. Measured on the H200 (2026-11-29, fp16, d = 64, 16
// heads, dropout 0.1, additive mask): B=16 S=512 forward 1.26 ms (13.6 TFLOP/s), backward 5.43 ms
// (7.9 TFLOP/s counting 2.5× the forward's FLOPs); B=64 S=128 0.36 / 1.54 ms. CUDA-core FMA bound,
// ptxas: 121–160 registers, no spills. FP16/BF16 take the tensor-core kernels of
// kernels/attention_flash.cuh; these kernels serve FP32 and FP64.
template <typename C, int DMAX>
struct AttnTraits {
    static constexpr bool kDouble = std::is_same<C, double>::value;
    static constexpr int kThreads = 256;
    static constexpr int kBlockFwd = kDouble ? (DMAX >= 128 ? 16 : 32) : (DMAX >= 128 ? 32 : 64);
    static constexpr int kBlockBwd = kDouble ? (DMAX >= 128 ? 16 : 32) : (DMAX >= 64 ? 32 : 64);
    static constexpr int kLd = DMAX + 1;  // padded row of a [block][DMAX] tile
    static constexpr size_t fwd_smem() {
        return (2 * kBlockFwd * kLd + kBlockFwd * (kBlockFwd + 1)) * sizeof(C);
    }
    static constexpr size_t bwd_smem() {
        return (4 * kBlockBwd * kLd + 2 * kBlockBwd * (kBlockBwd + 1)) * sizeof(C);
    }
    static_assert(DMAX % 16 == 0 && kBlockFwd % 16 == 0 && kBlockBwd % 16 == 0, "16×16 thread grid");
    static_assert(fwd_smem() <= 101376 && bwd_smem() <= 101376, "fits sm_86 shared memory");
};

// Scalars and pointers every attention kernel reads (by value).
template <typename C>
struct KArgs {
    int64_t seq, hidden, heads, head_dim;
    C scale;
    bool causal;
    const C *key_bias;       // [B, S] or nullptr
    const int32_t *key_len;  // [B] or nullptr
    uint64_t seed, offset;
    const uint32_t *offset_hi;  // AttentionArgs::offset_hi
    uint32_t threshold;      // 0: no dropout
    C dscale;                // 1/(1−p)
};

// ================================ kernels ========================================================

// rows [row0, row0 + BL) of a [nrows, ld] matrix (head columns 0..d−1) → tile [BL][DMAX+1].
template <typename T, int DMAX, int BL>
__device__ __forceinline__ void load_tile(compute_t<T> *tile, const T *src, int64_t ld, int64_t row0,
                                          int64_t nrows, int64_t d) {
    for (int idx = threadIdx.x; idx < BL * DMAX; idx += 256) {
        const int rr = idx / DMAX, cc = idx % DMAX;
        const int64_t row = row0 + rr;
        compute_t<T> v = 0;
        if (row < nrows && cc < d) v = to_compute(src[row * ld + cc]);
        tile[rr * (DMAX + 1) + cc] = v;
    }
}

template <typename C, int R>
__device__ __forceinline__ void zero_tile(C (&s)[R][R]) {
#pragma unroll
    for (int ii = 0; ii < R; ++ii)
#pragma unroll
        for (int jj = 0; jj < R; ++jj) s[ii][jj] = 0;
}

// s[ii][jj] += A[r + 16ii] · B[c + 16jj] over the first d columns (tiles of row length LD).
template <typename C, int R, int LD>
__device__ __forceinline__ void dot_tile_acc(const C *A, const C *B, int d, int r, int c, C (&s)[R][R]) {
#pragma unroll 2
    for (int k = 0; k < d; ++k) {
        C a[R], b[R];
#pragma unroll
        for (int ii = 0; ii < R; ++ii) a[ii] = A[(r + 16 * ii) * LD + k];
#pragma unroll
        for (int jj = 0; jj < R; ++jj) b[jj] = B[(c + 16 * jj) * LD + k];
#pragma unroll
        for (int ii = 0; ii < R; ++ii)
#pragma unroll
            for (int jj = 0; jj < R; ++jj) s[ii][jj] = dfma(a[ii], b[jj], s[ii][jj]);
    }
}

// s[ii][jj] = A[r + 16ii] · B[c + 16jj] over the first d columns (tiles of row length LD).
template <typename C, int R, int LD>
__device__ __forceinline__ void dot_tile(const C *A, const C *B, int d, int r, int c, C (&s)[R][R]) {
    zero_tile(s);
    dot_tile_acc<C, R, LD>(A, B, d, r, c, s);
}

// Rows row0 … row0 + BL − 1 of a [S, ld] matrix, starting at the head's column 0.
template <typename T>
struct RowTile {
    const T *src;
    int64_t ld, row0;
};

// Wide heads: out[p] = A_p · B_pᵀ over all d head columns for NP pairs of row tiles, walking the
// columns in DMAX-wide chunks through the shared tiles As[p], Bs[p] (their contents afterwards: the
// last chunk). Starts with a barrier, so callers may still be reading those tiles.
template <typename T, int DMAX, int BL, int R, int NP>
__device__ __forceinline__ void wide_dots(compute_t<T> *const (&As)[NP], const RowTile<T> (&A)[NP],
                                          compute_t<T> *const (&Bs)[NP], const RowTile<T> (&B)[NP],
                                          int64_t S, int64_t d, int r, int c, compute_t<T> (&out)[NP][R][R]) {
    using C = compute_t<T>;
#pragma unroll
    for (int p = 0; p < NP; ++p) zero_tile(out[p]);
    for (int64_t k0 = 0; k0 < d; k0 += DMAX) {
        const int64_t w = d - k0 < DMAX ? d - k0 : DMAX;
        __syncthreads();
#pragma unroll
        for (int p = 0; p < NP; ++p) {
            load_tile<T, DMAX, BL>(As[p], A[p].src + k0, A[p].ld, A[p].row0, S, w);
            load_tile<T, DMAX, BL>(Bs[p], B[p].src + k0, B[p].ld, B[p].row0, S, w);
        }
        __syncthreads();
#pragma unroll
        for (int p = 0; p < NP; ++p) dot_tile_acc<C, R, DMAX + 1>(As[p], Bs[p], static_cast<int>(w), r, c, out[p]);
    }
}

// Reductions over the 16 lanes that share r (lanes c = 0..15 of one half warp).
template <typename C>
__device__ __forceinline__ C half_warp_max(C v) {
    for (int off = 8; off > 0; off >>= 1) v = dmax(v, __shfl_xor_sync(0xffffffffu, v, off));
    return v;
}
template <typename C>
__device__ __forceinline__ C half_warp_sum(C v) {
    for (int off = 8; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
    return v;
}

template <typename C>
__device__ __forceinline__ int64_t key_limit(const KArgs<C> &a, int64_t b) {
    if (!a.key_len) return a.seq;
    const int64_t len = a.key_len[b];
    return len < 0 ? 0 : (len > a.seq ? a.seq : len);
}

// Scaled, masked score of (i, j) from the raw dot product; −inf where the key is not visible.
template <typename C>
__device__ __forceinline__ C masked_score(const KArgs<C> &a, C dot, int64_t b, int64_t i, int64_t j,
                                          int64_t kv_limit) {
    if (j >= kv_limit || (a.causal && j > i)) return neg_inf<C>();
    C v = a.scale * dot;
    if (a.key_bias) v += a.key_bias[b * a.seq + j];
    return v;
}

template <typename C>
__device__ __forceinline__ bool dropout_keep(const KArgs<C> &a, uint64_t offset, int64_t bh, int64_t i, int64_t j) {
    const uint64_t e = (static_cast<uint64_t>(bh) * a.seq + i) * a.seq + j;
    return philox_dropout_keep(a.seed, offset, e, a.threshold);
}

template <typename T, int DMAX>
__global__ void __launch_bounds__(256)
    attention_fwd_kernel(const KArgs<compute_t<T>> a, const T *__restrict__ qkv, T *__restrict__ ctx,
                         compute_t<T> *__restrict__ lse) {
    using C = compute_t<T>;
    using Tr = AttnTraits<C, DMAX>;
    constexpr int BL = Tr::kBlockFwd, R = BL / 16, NC = DMAX / 16, LD = Tr::kLd, LDP = BL + 1;
    extern __shared__ __align__(16) unsigned char smem_raw[];
    C *Qs = reinterpret_cast<C *>(smem_raw);
    C *KVs = Qs + BL * LD;
    C *Ps = KVs + BL * LD;

    const int r = threadIdx.x / 16, c = threadIdx.x % 16;
    const uint64_t drop_off = a.threshold ? dropout_offset(a.offset, a.offset_hi) : 0;  // as this run draws
    const int64_t bh = blockIdx.x, b = bh / a.heads, h = bh % a.heads;
    const int64_t S = a.seq, H = a.hidden, d = a.head_dim, ld3 = 3 * H;
    const int64_t i0 = int64_t(blockIdx.y) * BL;
    const T *qb = qkv + b * S * ld3 + h * d;
    const bool wide = d > DMAX;
    const int64_t col0 = int64_t(blockIdx.z) * DMAX;                 // this block's ctx columns
    const int64_t ncol = d - col0 < DMAX ? d - col0 : int64_t(DMAX);  // … of which valid

    if (!wide) load_tile<T, DMAX, BL>(Qs, qb, ld3, i0, S, d);
    const int64_t kv_limit = key_limit(a, b);
    const int64_t kv_end = a.causal ? (kv_limit < i0 + BL ? kv_limit : i0 + BL) : kv_limit;

    C m[R], l[R], acc[R][NC];
#pragma unroll
    for (int ii = 0; ii < R; ++ii) {
        m[ii] = neg_inf<C>();
        l[ii] = 0;
#pragma unroll
        for (int e = 0; e < NC; ++e) acc[ii][e] = 0;
    }

    for (int64_t j0 = 0; j0 < kv_end; j0 += BL) {
        C s[R][R];
        if (wide) {  // barriers inside: the previous tile's P·V is done with KVs and Ps
            C out[1][R][R];
            wide_dots<T, DMAX, BL, R, 1>({Qs}, {RowTile<T>{qb, ld3, i0}}, {KVs}, {RowTile<T>{qb + H, ld3, j0}}, S,
                                         d, r, c, out);
#pragma unroll
            for (int ii = 0; ii < R; ++ii)
#pragma unroll
                for (int jj = 0; jj < R; ++jj) s[ii][jj] = out[0][ii][jj];
        } else {
            __syncthreads();  // previous tile's P·V is done with KVs and Ps
            load_tile<T, DMAX, BL>(KVs, qb + H, ld3, j0, S, d);
            __syncthreads();
            dot_tile<C, R, LD>(Qs, KVs, static_cast<int>(d), r, c, s);
        }
#pragma unroll
        for (int ii = 0; ii < R; ++ii) {
            const int64_t i = i0 + r + 16 * ii;
            C mx = neg_inf<C>();
#pragma unroll
            for (int jj = 0; jj < R; ++jj) {
                s[ii][jj] = masked_score(a, s[ii][jj], b, i, j0 + c + 16 * jj, kv_limit);
                mx = dmax(mx, s[ii][jj]);
            }
            const C m_new = dmax(m[ii], half_warp_max(mx));
            const C ref = m_new == neg_inf<C>() ? C(0) : m_new;  // all masked so far: keep 0
            const C alpha = dexp(m[ii] - ref);
            C sum = 0;
#pragma unroll
            for (int jj = 0; jj < R; ++jj) {
                const int64_t j = j0 + c + 16 * jj;
                C p = dexp(s[ii][jj] - ref);
                sum += p;
                if (a.threshold != 0u && p != C(0)) p = dropout_keep(a, drop_off, bh, i, j) ? p * a.dscale : C(0);
                Ps[(r + 16 * ii) * LDP + c + 16 * jj] = p;
            }
            l[ii] = l[ii] * alpha + half_warp_sum(sum);
            m[ii] = m_new;
#pragma unroll
            for (int e = 0; e < NC; ++e) acc[ii][e] *= alpha;
        }
        __syncthreads();  // K no longer needed, P visible
        load_tile<T, DMAX, BL>(KVs, qb + 2 * H + col0, ld3, j0, S, ncol);
        __syncthreads();
        const int jn = static_cast<int>(kv_end - j0 < BL ? kv_end - j0 : BL);
        for (int jl = 0; jl < jn; ++jl) {
            C v[NC];
#pragma unroll
            for (int e = 0; e < NC; ++e) v[e] = KVs[jl * LD + c + 16 * e];
#pragma unroll
            for (int ii = 0; ii < R; ++ii) {
                const C p = Ps[(r + 16 * ii) * LDP + jl];
#pragma unroll
                for (int e = 0; e < NC; ++e) acc[ii][e] = dfma(p, v[e], acc[ii][e]);
            }
        }
    }

#pragma unroll
    for (int ii = 0; ii < R; ++ii) {
        const int64_t i = i0 + r + 16 * ii;
        if (i >= S) continue;
        const C inv = l[ii] > C(0) ? C(1) / l[ii] : C(0);
        T *out = ctx + (b * S + i) * H + h * d + col0;
#pragma unroll
        for (int e = 0; e < NC; ++e) {
            const int col = c + 16 * e;
            if (col < ncol) out[col] = to_storage<T>(acc[ii][e] * inv);
        }
        if (lse && c == 0 && blockIdx.z == 0) lse[bh * S + i] = l[ii] > C(0) ? m[ii] + dlog(l[ii]) : neg_inf<C>();
    }
}

// D[bh, i] = dctx_i · ctx_i over the head's d columns; one thread per (b, i, h).
template <typename T>
__global__ void attention_rowdot_kernel(const KArgs<compute_t<T>> a, const T *__restrict__ dctx,
                                        const T *__restrict__ ctx, compute_t<T> *__restrict__ dvec,
                                        int64_t batch) {
    using C = compute_t<T>;
    const int64_t total = batch * a.seq * a.heads;
    for (int64_t t = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; t < total;
         t += int64_t(gridDim.x) * blockDim.x) {
        const int64_t h = t % a.heads, bi = t / a.heads, b = bi / a.seq, i = bi % a.seq;
        const int64_t base = bi * a.hidden + h * a.head_dim;
        C s = 0;
        for (int64_t k = 0; k < a.head_dim; ++k) s = dfma(to_compute(dctx[base + k]), to_compute(ctx[base + k]), s);
        dvec[(b * a.heads + h) * a.seq + i] = s;
    }
}

// Softmax gradient of one score tile (rows i0 + r + 16ii, keys j0 + c + 16jj): writes P̃ to Ps
// (when non-null) and dS = P ∘ (dropout'(dP̃) − D) to dSs.
template <typename T, int R, int LDP>
__device__ __forceinline__ void grad_tile(const KArgs<compute_t<T>> &a, uint64_t drop_off, int64_t bh,
                                          int64_t b, int64_t i0, int64_t j0, int r, int c,
                                          int64_t kv_limit, const compute_t<T> (&s)[R][R],
                                          const compute_t<T> (&dp)[R][R], const compute_t<T> (&lse_r)[R],
                                          const compute_t<T> (&d_r)[R], compute_t<T> *Ps,
                                          compute_t<T> *dSs) {
    using C = compute_t<T>;
    const int64_t S = a.seq;
#pragma unroll
    for (int ii = 0; ii < R; ++ii) {
        const int64_t i = i0 + r + 16 * ii;
#pragma unroll
        for (int jj = 0; jj < R; ++jj) {
            const int64_t j = j0 + c + 16 * jj;
            C pd = 0, ds = 0;
            if (i < S && j < kv_limit && !(a.causal && j > i)) {
                C p = 0;
                if (lse_r[ii] != neg_inf<C>()) {
                    const C v = masked_score(a, s[ii][jj], b, i, j, kv_limit);
                    p = v == neg_inf<C>() ? C(0) : dexp(v - lse_r[ii]);
                }
                C dpd = dp[ii][jj];
                pd = p;
                if (a.threshold != 0u) {
                    const bool keep = dropout_keep(a, drop_off, bh, i, j);
                    pd = keep ? p * a.dscale : C(0);
                    dpd = keep ? dpd * a.dscale : C(0);
                }
                ds = p * (dpd - d_r[ii]);
            }
            if (Ps) Ps[(r + 16 * ii) * LDP + c + 16 * jj] = pd;
            dSs[(r + 16 * ii) * LDP + c + 16 * jj] = ds;
        }
    }
}

template <typename C, int R>
__device__ __forceinline__ void load_row_stats(const KArgs<C> &a, const C *lse, const C *dvec, int64_t bh,
                                               int64_t i0, int r, C (&lse_r)[R], C (&d_r)[R]) {
#pragma unroll
    for (int ii = 0; ii < R; ++ii) {
        const int64_t i = i0 + r + 16 * ii;
        lse_r[ii] = (i < a.seq && lse) ? lse[bh * a.seq + i] : C(0);
        d_r[ii] = i < a.seq ? dvec[bh * a.seq + i] : C(0);
    }
}

template <typename T, int DMAX>
__global__ void __launch_bounds__(256)
    attention_bwd_dkdv_kernel(const KArgs<compute_t<T>> a, const T *__restrict__ qkv,
                              const T *__restrict__ dctx, const compute_t<T> *__restrict__ lse,
                              const compute_t<T> *__restrict__ dvec, T *__restrict__ dqkv) {
    using C = compute_t<T>;
    using Tr = AttnTraits<C, DMAX>;
    constexpr int BL = Tr::kBlockBwd, R = BL / 16, NC = DMAX / 16, LD = Tr::kLd, LDP = BL + 1;
    extern __shared__ __align__(16) unsigned char smem_raw[];
    C *Ks = reinterpret_cast<C *>(smem_raw);
    C *Vs = Ks + BL * LD;
    C *Qs = Vs + BL * LD;
    C *dOs = Qs + BL * LD;
    C *Ps = dOs + BL * LD;
    C *dSs = Ps + BL * LDP;

    const int r = threadIdx.x / 16, c = threadIdx.x % 16;
    const uint64_t drop_off = a.threshold ? dropout_offset(a.offset, a.offset_hi) : 0;  // as this run draws
    const int64_t bh = blockIdx.x, b = bh / a.heads, h = bh % a.heads;
    const int64_t S = a.seq, H = a.hidden, d = a.head_dim, ld3 = 3 * H;
    const int64_t j0 = int64_t(blockIdx.y) * BL;
    const T *qb = qkv + b * S * ld3 + h * d;
    const T *ob = dctx + b * S * H + h * d;
    const int64_t kv_limit = key_limit(a, b);
    const bool wide = d > DMAX;
    const int64_t col0 = int64_t(blockIdx.z) * DMAX;                 // this block's dK/dV columns
    const int64_t ncol = d - col0 < DMAX ? d - col0 : int64_t(DMAX);  // … of which valid

    C dk[R][NC], dv[R][NC];
#pragma unroll
    for (int kk = 0; kk < R; ++kk)
#pragma unroll
        for (int e = 0; e < NC; ++e) dk[kk][e] = dv[kk][e] = 0;

    if (j0 < kv_limit) {  // keys past the length get zero gradients
        if (!wide) {
            load_tile<T, DMAX, BL>(Ks, qb + H, ld3, j0, S, d);
            load_tile<T, DMAX, BL>(Vs, qb + 2 * H, ld3, j0, S, d);
        }
        for (int64_t i0 = a.causal ? j0 : 0; i0 < S; i0 += BL) {
            C lse_r[R], d_r[R], s[R][R], dp[R][R];
            if (wide) {  // barriers inside: the previous accumulation is done with Qs, dOs, Ps, dSs
                C out[2][R][R];
                wide_dots<T, DMAX, BL, R, 2>({Qs, dOs}, {RowTile<T>{qb, ld3, i0}, RowTile<T>{ob, H, i0}}, {Ks, Vs},
                                             {RowTile<T>{qb + H, ld3, j0}, RowTile<T>{qb + 2 * H, ld3, j0}}, S, d,
                                             r, c, out);
#pragma unroll
                for (int ii = 0; ii < R; ++ii)
#pragma unroll
                    for (int jj = 0; jj < R; ++jj) s[ii][jj] = out[0][ii][jj], dp[ii][jj] = out[1][ii][jj];
                __syncthreads();  // the dots are done with Qs and dOs: load this block's columns
                load_tile<T, DMAX, BL>(Qs, qb + col0, ld3, i0, S, ncol);
                load_tile<T, DMAX, BL>(dOs, ob + col0, H, i0, S, ncol);
            } else {
                __syncthreads();  // previous accumulation is done with Qs, dOs, Ps, dSs
                load_tile<T, DMAX, BL>(Qs, qb, ld3, i0, S, d);
                load_tile<T, DMAX, BL>(dOs, ob, H, i0, S, d);
                __syncthreads();
                dot_tile<C, R, LD>(Qs, Ks, static_cast<int>(d), r, c, s);
                dot_tile<C, R, LD>(dOs, Vs, static_cast<int>(d), r, c, dp);
            }
            load_row_stats(a, lse, dvec, bh, i0, r, lse_r, d_r);
            grad_tile<T, R, LDP>(a, drop_off, bh, b, i0, j0, r, c, kv_limit, s, dp, lse_r, d_r, Ps, dSs);
            __syncthreads();
            const int in = static_cast<int>(S - i0 < BL ? S - i0 : BL);
            for (int il = 0; il < in; ++il) {
                C qv[NC], ov[NC];
#pragma unroll
                for (int e = 0; e < NC; ++e) {
                    qv[e] = Qs[il * LD + c + 16 * e];
                    ov[e] = dOs[il * LD + c + 16 * e];
                }
#pragma unroll
                for (int kk = 0; kk < R; ++kk) {
                    const C pk = Ps[il * LDP + r + 16 * kk], dsk = dSs[il * LDP + r + 16 * kk];
#pragma unroll
                    for (int e = 0; e < NC; ++e) {
                        dv[kk][e] = dfma(pk, ov[e], dv[kk][e]);
                        dk[kk][e] = dfma(dsk, qv[e], dk[kk][e]);
                    }
                }
            }
        }
    }

#pragma unroll
    for (int kk = 0; kk < R; ++kk) {
        const int64_t j = j0 + r + 16 * kk;
        if (j >= S) continue;
        T *out = dqkv + (b * S + j) * ld3 + h * d + col0;
#pragma unroll
        for (int e = 0; e < NC; ++e) {
            const int col = c + 16 * e;
            if (col < ncol) {
                out[H + col] = to_storage<T>(dk[kk][e] * a.scale);
                out[2 * H + col] = to_storage<T>(dv[kk][e]);
            }
        }
    }
}

template <typename T, int DMAX>
__global__ void __launch_bounds__(256)
    attention_bwd_dq_kernel(const KArgs<compute_t<T>> a, const T *__restrict__ qkv,
                            const T *__restrict__ dctx, const compute_t<T> *__restrict__ lse,
                            const compute_t<T> *__restrict__ dvec, T *__restrict__ dqkv) {
    using C = compute_t<T>;
    using Tr = AttnTraits<C, DMAX>;
    constexpr int BL = Tr::kBlockBwd, R = BL / 16, NC = DMAX / 16, LD = Tr::kLd, LDP = BL + 1;
    extern __shared__ __align__(16) unsigned char smem_raw[];
    C *Qs = reinterpret_cast<C *>(smem_raw);
    C *dOs = Qs + BL * LD;
    C *Ks = dOs + BL * LD;
    C *Vs = Ks + BL * LD;
    C *dSs = Vs + BL * LD;

    const int r = threadIdx.x / 16, c = threadIdx.x % 16;
    const uint64_t drop_off = a.threshold ? dropout_offset(a.offset, a.offset_hi) : 0;  // as this run draws
    const int64_t bh = blockIdx.x, b = bh / a.heads, h = bh % a.heads;
    const int64_t S = a.seq, H = a.hidden, d = a.head_dim, ld3 = 3 * H;
    const int64_t i0 = int64_t(blockIdx.y) * BL;
    const T *qb = qkv + b * S * ld3 + h * d;
    const int64_t kv_limit = key_limit(a, b);
    const int64_t kv_end = a.causal ? (kv_limit < i0 + BL ? kv_limit : i0 + BL) : kv_limit;
    const T *ob = dctx + b * S * H + h * d;
    const bool wide = d > DMAX;
    const int64_t col0 = int64_t(blockIdx.z) * DMAX;                 // this block's dQ columns
    const int64_t ncol = d - col0 < DMAX ? d - col0 : int64_t(DMAX);  // … of which valid

    if (!wide) {
        load_tile<T, DMAX, BL>(Qs, qb, ld3, i0, S, d);
        load_tile<T, DMAX, BL>(dOs, ob, H, i0, S, d);
    }
    C lse_r[R], d_r[R];
    load_row_stats(a, lse, dvec, bh, i0, r, lse_r, d_r);
    C dq[R][NC];
#pragma unroll
    for (int ii = 0; ii < R; ++ii)
#pragma unroll
        for (int e = 0; e < NC; ++e) dq[ii][e] = 0;

    for (int64_t j0 = 0; j0 < kv_end; j0 += BL) {
        C s[R][R], dp[R][R];
        if (wide) {  // barriers inside: the previous accumulation is done with Ks and dSs
            C out[2][R][R];
            wide_dots<T, DMAX, BL, R, 2>({Qs, dOs}, {RowTile<T>{qb, ld3, i0}, RowTile<T>{ob, H, i0}}, {Ks, Vs},
                                         {RowTile<T>{qb + H, ld3, j0}, RowTile<T>{qb + 2 * H, ld3, j0}}, S, d, r,
                                         c, out);
#pragma unroll
            for (int ii = 0; ii < R; ++ii)
#pragma unroll
                for (int jj = 0; jj < R; ++jj) s[ii][jj] = out[0][ii][jj], dp[ii][jj] = out[1][ii][jj];
            __syncthreads();  // the dots are done with Ks: load this block's columns of K
            load_tile<T, DMAX, BL>(Ks, qb + H + col0, ld3, j0, S, ncol);
        } else {
            __syncthreads();  // previous accumulation is done with Ks and dSs
            load_tile<T, DMAX, BL>(Ks, qb + H, ld3, j0, S, d);
            load_tile<T, DMAX, BL>(Vs, qb + 2 * H, ld3, j0, S, d);
            __syncthreads();
            dot_tile<C, R, LD>(Qs, Ks, static_cast<int>(d), r, c, s);
            dot_tile<C, R, LD>(dOs, Vs, static_cast<int>(d), r, c, dp);
        }
        grad_tile<T, R, LDP>(a, drop_off, bh, b, i0, j0, r, c, kv_limit, s, dp, lse_r, d_r, nullptr, dSs);
        __syncthreads();
        const int jn = static_cast<int>(kv_end - j0 < BL ? kv_end - j0 : BL);
        for (int jl = 0; jl < jn; ++jl) {
            C kv[NC];
#pragma unroll
            for (int e = 0; e < NC; ++e) kv[e] = Ks[jl * LD + c + 16 * e];
#pragma unroll
            for (int ii = 0; ii < R; ++ii) {
                const C ds = dSs[(r + 16 * ii) * LDP + jl];
#pragma unroll
                for (int e = 0; e < NC; ++e) dq[ii][e] = dfma(ds, kv[e], dq[ii][e]);
            }
        }
    }

#pragma unroll
    for (int ii = 0; ii < R; ++ii) {
        const int64_t i = i0 + r + 16 * ii;
        if (i >= S) continue;
        T *out = dqkv + (b * S + i) * ld3 + h * d + col0;
#pragma unroll
        for (int e = 0; e < NC; ++e) {
            const int col = c + 16 * e;
            if (col < ncol) out[col] = to_storage<T>(dq[ii][e] * a.scale);
        }
    }
}

template <typename M, typename C>
__global__ void key_bias_kernel(const M *__restrict__ mask, C *__restrict__ out, int64_t count) {
    for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < count;
         i += int64_t(gridDim.x) * blockDim.x)
        out[i] = static_cast<C>(to_compute(mask[i]));
}

// ================================ launch helpers =================================================

template <typename T>
KArgs<compute_t<T>> make_args(const AttentionArgs &l) {
    using C = compute_t<T>;
    KArgs<C> a;
    a.seq = l.seq;
    a.hidden = l.hidden;
    a.heads = l.heads;
    a.head_dim = l.head_dim;
    a.scale = static_cast<C>(l.scale);
    a.causal = l.causal;
    a.key_bias = static_cast<const C *>(l.key_bias);
    a.key_len = l.key_len;
    a.seed = l.seed;
    a.offset = l.offset;
    a.offset_hi = l.offset_hi;
    a.threshold = l.threshold;
    a.dscale = static_cast<C>(l.drop_scale);
    return a;
}

// Raises the kernel's dynamic shared-memory limit when it needs more than the default 48 KB.
template <typename K>
cudaError_t prepare_smem(K kernel, size_t bytes) {
    if (bytes <= 48 * 1024) return cudaSuccess;
    int dev = 0, optin = 0;
    DST_KERNEL_CHECK(cudaGetDevice(&dev));
    DST_KERNEL_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
    if (bytes > static_cast<size_t>(optin)) return cudaErrorInvalidConfiguration;  // more than the GPU allows
    DST_KERNEL_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        static_cast<int>(bytes)));
    return cudaSuccess;
}

// Calls f(std::integral_constant<int, DMAX>) with head_dim rounded up to 32, 64 or 128; wider heads
// run in 128-column chunks (DMAX = 128).
template <typename F>
cudaError_t dispatch_head_dim(int64_t d, F &&f) {
    if (d >= 1 && d <= 32) return f(std::integral_constant<int, 32>{});
    if (d > 32 && d <= 64) return f(std::integral_constant<int, 64>{});
    if (d > 64) return f(std::integral_constant<int, 128>{});
    return cudaErrorInvalidValue;
}

// Grid of a kernel with `block` rows per tile: (batch·heads, row tiles, column chunks of DMAX).
cudaError_t make_grid(const AttentionArgs &l, int block, int dmax, dim3 *grid) {
    const int64_t bh = l.batch * l.heads, tiles = (l.seq + block - 1) / block,
                  chunks = (l.head_dim + dmax - 1) / dmax;
    if (bh > 0x7fffffffLL || tiles > 65535 || chunks > 65535) return cudaErrorInvalidConfiguration;
    *grid = dim3(static_cast<unsigned>(bh), static_cast<unsigned>(tiles), static_cast<unsigned>(chunks));
    return cudaSuccess;
}

}  // namespace

// ================================ launchers ======================================================

cudaError_t attention_key_bias(cudaStream_t stream, dst_dtype dt, dst_dtype mask_dtype, const void *mask,
                              void *out, int64_t count) {
    if (count <= 0) return cudaSuccess;
    return dispatch_dtype(dt, [&](auto tag) {
        using C = compute_t<decltype(tag)>;
        return dispatch_dtype(mask_dtype, [&](auto mtag) {
            using M = decltype(mtag);
            key_bias_kernel<M, C><<<grid_blocks(count, 256), 256, 0, stream>>>(
                static_cast<const M *>(mask), static_cast<C *>(out), count);
            DST_KERNEL_CHECK(cudaGetLastError());
            return cudaSuccess;
        });
    });
}

cudaError_t attention_fwd(cudaStream_t stream, dst_dtype dt, const AttentionArgs &l, const void *qkv, void *ctx,
                         void *lse) {
    if (l.batch <= 0 || l.seq <= 0 || l.heads <= 0) return cudaSuccess;
    return dispatch_dtype(dt, [&](auto tag) {
        using T = decltype(tag);
        using C = compute_t<T>;
        return dispatch_head_dim(l.head_dim, [&](auto dmax) {
            constexpr int DMAX = decltype(dmax)::value;
            using Tr = AttnTraits<C, DMAX>;
            dim3 grid;
            DST_KERNEL_CHECK(make_grid(l, Tr::kBlockFwd, DMAX, &grid));
            const auto kernel = attention_fwd_kernel<T, DMAX>;
            DST_KERNEL_CHECK(prepare_smem(kernel, Tr::fwd_smem()));
            kernel<<<grid, Tr::kThreads, Tr::fwd_smem(), stream>>>(
                make_args<T>(l), static_cast<const T *>(qkv), static_cast<T *>(ctx), static_cast<C *>(lse));
            DST_KERNEL_CHECK(cudaGetLastError());
            return cudaSuccess;
        });
    });
}

size_t attention_bwd_workspace(dst_dtype dt, const AttentionArgs &l) {
    return static_cast<size_t>(l.batch * l.heads * l.seq) * compute_size(dt);
}

cudaError_t attention_bwd(cudaStream_t stream, dst_dtype dt, const AttentionArgs &l, const void *qkv,
                         const void *ctx, const void *dctx, const void *lse, void *dqkv, void *workspace) {
    if (l.batch <= 0 || l.seq <= 0 || l.heads <= 0) return cudaSuccess;
    if (!lse) return cudaErrorInvalidValue;
    return dispatch_dtype(dt, [&](auto tag) {
        using T = decltype(tag);
        using C = compute_t<T>;
        return dispatch_head_dim(l.head_dim, [&](auto dmax) {
            constexpr int DMAX = decltype(dmax)::value;
            using Tr = AttnTraits<C, DMAX>;
            dim3 grid;
            DST_KERNEL_CHECK(make_grid(l, Tr::kBlockBwd, DMAX, &grid));
            const KArgs<C> a = make_args<T>(l);
            C *dvec = static_cast<C *>(workspace);
            attention_rowdot_kernel<T><<<grid_blocks(l.batch * l.seq * l.heads, 256), 256, 0, stream>>>(
                a, static_cast<const T *>(dctx), static_cast<const T *>(ctx), dvec, l.batch);
            DST_KERNEL_CHECK(cudaGetLastError());

            const auto dkdv = attention_bwd_dkdv_kernel<T, DMAX>;
            DST_KERNEL_CHECK(prepare_smem(dkdv, Tr::bwd_smem()));
            dkdv<<<grid, Tr::kThreads, Tr::bwd_smem(), stream>>>(a, static_cast<const T *>(qkv),
                                                                 static_cast<const T *>(dctx),
                                                                 static_cast<const C *>(lse), dvec,
                                                                 static_cast<T *>(dqkv));
            DST_KERNEL_CHECK(cudaGetLastError());
            const auto dq = attention_bwd_dq_kernel<T, DMAX>;
            DST_KERNEL_CHECK(prepare_smem(dq, Tr::bwd_smem()));
            dq<<<grid, Tr::kThreads, Tr::bwd_smem(), stream>>>(a, static_cast<const T *>(qkv),
                                                               static_cast<const T *>(dctx),
                                                               static_cast<const C *>(lse), dvec,
                                                               static_cast<T *>(dqkv));
            DST_KERNEL_CHECK(cudaGetLastError());
            return cudaSuccess;
        });
    });
}

}  // namespace cuda
}  // namespace dst
