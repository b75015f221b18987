// Device code of the tensor-core (flash) attention for FP16 and BF16: the kernel templates behind
// kernels/attention_flash.cuh, included by the two instantiation files and by the kernel lab
// (kernels/dev/attention_lab.cu). Math and layouts: kernels/attention_args.h.
//
// Building blocks. Tiles of Q, K, V, dctx live in shared memory as [rows][D + 8] (D = head_dim
// rounded up to the kernel's 32/64/96/128; columns past head_dim are zero; the 16-byte pad makes
// every ldmatrix and 16-byte store conflict-free). Warps run mma.sync.m16n8k16 (fp32 accumulate)
// on fragments loaded with ldmatrix; the fp32 accumulators of one product become the A operand of
// the next in registers (P·V, P̃ᵀ·dctx, dSᵀ·Q, dS·K), so nothing S×S ever leaves a warp.
//
//   forward  (flash_fwd_kernel): a block owns BM queries of one (batch, head) and walks the key
//            tiles with an online softmax in the log2 domain; K of the next tile and V of this tile
//            load (cp.async) while the tensor cores work. Writes ctx and lse (natural log).
//   backward (flash_bwd_dkdv_kernel): a block owns BN keys and walks the query tiles computing the
//            transposed products Sᵀ = K·Qᵀ and dP̃ᵀ = V·dctxᵀ, so P̃ᵀ and dSᵀ are already the A
//            operands of dV += P̃ᵀ·dctx and dK += dSᵀ·Q. Deterministic mode stops there and
//            flash_bwd_dq_kernel (a block per BM queries, walking the key tiles) computes dQ = dS·K
//            with one writer per element; stochastic mode instead stages dS in shared memory and
//            adds dS·K into an fp32 buffer with atomics (flash_dq_convert_kernel finishes it).
//
// Dropout regenerates the Philox words of kernels/philox.h inside the kernels: one 4-word block
// covers 4 consecutive keys of one query row; when S % 4 == 0 the 32 lanes of a warp compute the 32
// blocks of a 16×8 tile once each and trade the keep bits with shuffles, otherwise every element
// draws its own block.
#ifndef DST_KERNELS_ATTENTION_FLASH_IMPL_CUH
#define DST_KERNELS_ATTENTION_FLASH_IMPL_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

#include <type_traits>

#include "kernels/attention_args.h"
#include "kernels/philox.h"

namespace dst {
namespace cuda {
namespace flash {

#define DST_FDEV __device__ __forceinline__

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

// ================================ the call, as the kernels see it ==============================

// Pointers and scalars of one call, derived once on the host from AttentionArgs (make_params).
struct Params {
    const void *qkv;
    void *ctx;           // forward output
    float *lse;          // [B, heads, S]; forward output (nullable), backward input
    const void *dctx;    // backward
    void *dqkv;          // backward output
    float *dsum;         // backward: D = rowsum(dctx ∘ ctx), [B, heads, S]
    float *dq_accum;     // stochastic backward: [B, heads, S, D] fp32
    const void *ctx_in;  // backward: the forward's ctx
    const float *key_bias;
    const int32_t *key_len;
    int batch, seq, heads, head_dim, hidden;
    int m_blocks;        // query tiles per (batch, head) of the kernel being launched
    float scale, scale_log2;
    bool causal;
    bool vec16;          // every tensor row and head slice is 16-byte aligned: cp.async tiles
    bool dropout, aligned4;
    uint64_t seed, offset;
    uint32_t threshold;
    float drop_scale;
};

// The head dim the kernels are built for: head_dim rounded up to 32, 64, 96 or 128.
inline int padded_head_dim(int64_t d) { return d <= 32 ? 32 : d <= 64 ? 64 : d <= 96 ? 96 : 128; }

// The scalars of a call (pointers are set by the caller).
inline Params make_params(const AttentionArgs &a) {
    Params p{};
    p.batch = static_cast<int>(a.batch);
    p.seq = static_cast<int>(a.seq);
    p.heads = static_cast<int>(a.heads);
    p.head_dim = static_cast<int>(a.head_dim);
    p.hidden = static_cast<int>(a.hidden);
    p.scale = static_cast<float>(a.scale);
    p.scale_log2 = static_cast<float>(a.scale * 1.4426950408889634);
    p.causal = a.causal;
    p.key_bias = static_cast<const float *>(a.key_bias);
    p.key_len = a.key_len;
    p.dropout = a.threshold != 0;
    p.aligned4 = a.seq % 4 == 0;
    p.seed = a.seed;
    p.offset = a.offset;
    p.threshold = a.threshold;
    p.drop_scale = p.dropout ? static_cast<float>(a.drop_scale) : 1.0f;
    p.vec16 = a.head_dim % 8 == 0 && a.hidden % 8 == 0;  // and 16-byte aligned tensors: the caller checks
    return p;
}

// ================================ PTX wrappers ===================================================

DST_FDEV uint32_t smem_addr(const void *p) { return static_cast<uint32_t>(__cvta_generic_to_shared(p)); }

DST_FDEV void ldsm_x4(uint32_t (&r)[4], uint32_t addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}
DST_FDEV void ldsm_x4_t(uint32_t (&r)[4], uint32_t addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}

// 16-byte global → shared copy; src_bytes 0 fills the 16 bytes with zeros.
DST_FDEV void cp_async16(uint32_t dst, const void *src, int src_bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes));
}
DST_FDEV void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
DST_FDEV void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

// c += a·b, m16n8k16, fp32 accumulators.
template <typename T>
DST_FDEV void mma(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1);
template <>
DST_FDEV void mma<__half>(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
template <>
DST_FDEV void mma<__nv_bfloat16>(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Two floats → one register of two 16-bit values (round to nearest even), low half first.
template <typename T>
DST_FDEV uint32_t pack2(float lo, float hi);
template <>
DST_FDEV uint32_t pack2<__half>(float lo, float hi) {
    __half2 v = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<uint32_t *>(&v);
}
template <>
DST_FDEV uint32_t pack2<__nv_bfloat16>(float lo, float hi) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t *>(&v);
}

DST_FDEV uint32_t bits16(__half v) { return __half_as_ushort(v); }
DST_FDEV uint32_t bits16(__nv_bfloat16 v) { return __bfloat16_as_ushort(v); }
DST_FDEV float to_float(__half v) { return __half2float(v); }
DST_FDEV float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }
template <typename T>
DST_FDEV T from_float(float v);
template <>
DST_FDEV __half from_float<__half>(float v) { return __float2half_rn(v); }
template <>
DST_FDEV __nv_bfloat16 from_float<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }

// ================================ tiles ==========================================================

// Rows [row0, row0 + R) (rows ≥ nrows are zero) and columns [0, D) (columns ≥ d are zero) of a
// row-major matrix with row stride ld elements, into a shared tile [R][D + 8]. With vec16 the
// copy is asynchronous (cp.async; the caller commits and waits), otherwise synchronous.
template <typename T, int R, int D, int NT>
DST_FDEV void load_tile(T *tile, const T *src, int64_t ld, int row0, int nrows, int d, bool vec16) {
    constexpr int kChunks = D / 8, kLds = D + 8;
    if (vec16) {
        for (int c = threadIdx.x; c < R * kChunks; c += NT) {
            const int r = c / kChunks, k = (c % kChunks) * 8;
            const bool ok = row0 + r < nrows && k < d;
            const T *g = ok ? src + int64_t(row0 + r) * ld + k : src;
            cp_async16(smem_addr(tile + r * kLds + k), g, ok ? 16 : 0);
        }
    } else {
        for (int c = threadIdx.x; c < R * kChunks; c += NT) {
            const int r = c / kChunks, k = (c % kChunks) * 8;
            uint32_t w[4];
#pragma unroll
            for (int e = 0; e < 8; e += 2) {
                const bool ok0 = row0 + r < nrows && k + e < d, ok1 = row0 + r < nrows && k + e + 1 < d;
                const uint32_t lo = ok0 ? bits16(src[int64_t(row0 + r) * ld + k + e]) : 0u;
                const uint32_t hi = ok1 ? bits16(src[int64_t(row0 + r) * ld + k + e + 1]) : 0u;
                w[e / 2] = lo | hi << 16;
            }
            *reinterpret_cast<uint4 *>(tile + r * kLds + k) = make_uint4(w[0], w[1], w[2], w[3]);
        }
    }
}

// acc[MT][NT][4] += A·Bᵀ over K columns: A = rows a_row0 … + 16·MT of sA ([m][k]), B = rows
// b_row0 … + 8·NT of sB ([n][k]); both tiles have row stride LDS.
template <typename T, int MT, int NT, int K, int LDS>
DST_FDEV void mma_abt(float (&acc)[MT][NT][4], const T *sA, int a_row0, const T *sB, int b_row0) {
    static_assert(NT % 2 == 0 && K % 16 == 0, "n in pairs of 8, k in steps of 16");
    const int lane = threadIdx.x & 31;
#pragma unroll
    for (int kk = 0; kk < K / 16; ++kk) {
        uint32_t a[MT][4];
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
            ldsm_x4(a[mt], smem_addr(sA + (a_row0 + mt * 16 + (lane & 15)) * LDS + kk * 16 + (lane >> 4) * 8));
#pragma unroll
        for (int np = 0; np < NT / 2; ++np) {
            uint32_t b[4];
            ldsm_x4(b, smem_addr(sB + (b_row0 + np * 16 + (lane >> 4) * 8 + (lane & 7)) * LDS + kk * 16 +
                                 ((lane >> 3) & 1) * 8));
#pragma unroll
            for (int mt = 0; mt < MT; ++mt) {
                mma<T>(acc[mt][2 * np], a[mt], b[0], b[1]);
                mma<T>(acc[mt][2 * np + 1], a[mt], b[2], b[3]);
            }
        }
    }
}

// acc[MT][DT][4] += A·B with A from registers (fragments [MT][K/16][4]) and B = rows b_row0 …
// b_row0 + K of sB stored [k][n] (n = DT·8 columns), row stride LDS.
template <typename T, int MT, int DT, int K, int LDS>
DST_FDEV void mma_rb(float (&acc)[MT][DT][4], const uint32_t (&a)[MT][K / 16][4], const T *sB, int b_row0) {
    static_assert(DT % 2 == 0, "n in pairs of 8");
    const int lane = threadIdx.x & 31;
#pragma unroll
    for (int kk = 0; kk < K / 16; ++kk) {
#pragma unroll
        for (int dp = 0; dp < DT / 2; ++dp) {
            uint32_t b[4];
            ldsm_x4_t(b, smem_addr(sB + (b_row0 + kk * 16 + ((lane >> 3) & 1) * 8 + (lane & 7)) * LDS + dp * 16 +
                                   (lane >> 4) * 8));
#pragma unroll
            for (int mt = 0; mt < MT; ++mt) {
                mma<T>(acc[mt][2 * dp], a[mt][kk], b[0], b[1]);
                mma<T>(acc[mt][2 * dp + 1], a[mt][kk], b[2], b[3]);
            }
        }
    }
}

// fp32 accumulators of an m×n product → the A fragments (m × k=n) of the next product.
template <typename T, int MT, int NT>
DST_FDEV void to_a(uint32_t (&a)[MT][NT / 2][4], const float (&c)[MT][NT][4]) {
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int kk = 0; kk < NT / 2; ++kk) {
            a[mt][kk][0] = pack2<T>(c[mt][2 * kk][0], c[mt][2 * kk][1]);
            a[mt][kk][1] = pack2<T>(c[mt][2 * kk][2], c[mt][2 * kk][3]);
            a[mt][kk][2] = pack2<T>(c[mt][2 * kk + 1][0], c[mt][2 * kk + 1][1]);
            a[mt][kk][3] = pack2<T>(c[mt][2 * kk + 1][2], c[mt][2 * kk + 1][3]);
        }
}

template <int MT, int NT>
DST_FDEV void zero(float (&c)[MT][NT][4]) {
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e) c[mt][nt][e] = 0.0f;
}

// ================================ dropout ========================================================

DST_FDEV uint32_t keep_bits4(const Params &p, uint64_t e) {
    const Philox4 r = philox_dropout_block(p.seed, p.offset, e >> 2);
    return uint32_t(r.v[0] >= p.threshold) | uint32_t(r.v[1] >= p.threshold) << 1 |
           uint32_t(r.v[2] >= p.threshold) << 2 | uint32_t(r.v[3] >= p.threshold) << 3;
}
DST_FDEV uint32_t keep_one(const Params &p, uint64_t e) {
    return philox_dropout_keep(p.seed, p.offset, e, p.threshold) ? 1u : 0u;
}

// Keep bits of this lane's four elements of a 16×8 accumulator tile whose rows are queries
// i0 … i0+15 and columns keys j0 … j0+7 (row_base = (b·heads + h)·S): bit 0 (i0+g, j0+2t),
// bit 1 (i0+g, j0+2t+1), bit 2 (i0+g+8, j0+2t), bit 3 (i0+g+8, j0+2t+1), g = lane/4, t = lane%4.
DST_FDEV uint32_t keep_q_rows(const Params &p, uint64_t row_base, int i0, int j0) {
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const uint64_t S = uint64_t(p.seq);
    if (p.aligned4) {
        // Lane (g, t) draws the block of row i0 + g + 8·(t&1), keys j0 + 4·(t>>1) … +3.
        const uint64_t e = (row_base + uint64_t(i0 + g + 8 * (t & 1))) * S + uint64_t(j0 + 4 * (t >> 1));
        const uint32_t own = keep_bits4(p, e);
        const uint32_t other = __shfl_xor_sync(0xffffffffu, own, 1);
        const uint32_t top = (t & 1) ? other : own, bottom = (t & 1) ? own : other;
        const int sh = 2 * (t & 1);
        return ((top >> sh) & 3u) | (((bottom >> sh) & 3u) << 2);
    }
    const uint64_t e0 = (row_base + uint64_t(i0 + g)) * S + uint64_t(j0 + 2 * t), e8 = e0 + 8 * S;
    return keep_one(p, e0) | keep_one(p, e0 + 1) << 1 | keep_one(p, e8) << 2 | keep_one(p, e8 + 1) << 3;
}

// The same for a transposed tile: rows are keys j0 … j0+15, columns queries i0 … i0+7; bit 0
// (key j0+g, query i0+2t), bit 1 (j0+g, i0+2t+1), bit 2 (j0+g+8, i0+2t), bit 3 (j0+g+8, i0+2t+1).
DST_FDEV uint32_t keep_k_rows(const Params &p, uint64_t row_base, int j0, int i0) {
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const uint64_t S = uint64_t(p.seq);
    if (p.aligned4) {
        // Lane (g, t) draws the block of query i0 + 2t + (g&1), keys j0 + 4·(g>>1) … +3; the block
        // (query i0 + x, keys j0 + 4q …) lives in lane 4·(2q + (x&1)) + (x>>1).
        const uint64_t e = (row_base + uint64_t(i0 + 2 * t + (g & 1))) * S + uint64_t(j0 + 4 * (g >> 1));
        const uint32_t own = keep_bits4(p, e);
        const int q = g >> 2, w = g & 3;
        const uint32_t b0 = __shfl_sync(0xffffffffu, own, 4 * (2 * q) + t);
        const uint32_t b1 = __shfl_sync(0xffffffffu, own, 4 * (2 * q + 1) + t);
        const uint32_t b2 = __shfl_sync(0xffffffffu, own, 4 * (4 + 2 * q) + t);
        const uint32_t b3 = __shfl_sync(0xffffffffu, own, 4 * (5 + 2 * q) + t);
        return ((b0 >> w) & 1u) | ((b1 >> w) & 1u) << 1 | ((b2 >> w) & 1u) << 2 | ((b3 >> w) & 1u) << 3;
    }
    const uint64_t e0 = (row_base + uint64_t(i0 + 2 * t)) * S + uint64_t(j0 + g);
    return keep_one(p, e0) | keep_one(p, e0 + S) << 1 | keep_one(p, e0 + 8) << 2 | keep_one(p, e0 + S + 8) << 3;
}

// Keep bits of NT consecutive 16×8 tiles along the columns (tile nt at bits 4·nt … 4·nt+3);
// all ones without dropout. Unrolled by two only: two Philox chains in flight, not NT.
template <int NT, bool kKeyRows>
DST_FDEV uint32_t keep_tiles(const Params &p, uint64_t row_base, int r0, int c0) {
    static_assert(NT <= 8, "4 bits per tile in 32 bits");
    if (!p.dropout) return 0xffffffffu;
    uint32_t bits = 0;
#pragma unroll 2
    for (int nt = 0; nt < NT; ++nt)
        bits |= (kKeyRows ? keep_k_rows(p, row_base, r0, c0 + nt * 8) : keep_q_rows(p, row_base, r0, c0 + nt * 8))
                << (4 * nt);
    return bits;
}

// ================================ small helpers ==================================================

DST_FDEV float quad_max(float v) {
    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 1));
    return fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 2));
}
DST_FDEV float quad_sum(float v) {
    v += __shfl_xor_sync(0xffffffffu, v, 1);
    return v + __shfl_xor_sync(0xffffffffu, v, 2);
}

DST_FDEV int key_limit(const Params &p, int b) {
    if (!p.key_len) return p.seq;
    const int len = p.key_len[b];
    return len < 0 ? 0 : (len > p.seq ? p.seq : len);
}

// Scaled score in the log2 domain of (query i, key j), −inf where the key is hidden.
DST_FDEV float score2(const Params &p, float dot, float bias2, int i, int j, int kv_len) {
    if (j >= kv_len || (p.causal && j > i)) return -INFINITY;
    return fmaf(dot, p.scale_log2, bias2);
}

DST_FDEV float bias2_at(const Params &p, int b, int j) {
    return (p.key_bias && j < p.seq) ? p.key_bias[int64_t(b) * p.seq + j] * kLog2e : 0.0f;
}

// Stores two adjacent columns (c, c+1) of row `row` (elements) when they are below d.
template <typename T>
DST_FDEV void store2(T *row, int c, int d, float v0, float v1) {
    if (c + 1 < d && ((reinterpret_cast<uintptr_t>(row + c) & 3) == 0)) {
        *reinterpret_cast<uint32_t *>(row + c) = pack2<T>(v0, v1);
    } else {
        if (c < d) row[c] = from_float<T>(v0);
        if (c + 1 < d) row[c + 1] = from_float<T>(v1);
    }
}

// Softmax backward of one score element (both backward kernels): P = exp2(x − lse2), P̃ = P·keep·σ,
// dS = P·(dP̃·keep·σ − D), from the log2-domain score x, the row's lse2 and D, and dP̃ = dctx·v.
DST_FDEV float softmax_grad(const Params &p, float x, float lse2, float dp, bool kept, float D, float *ptilde) {
    const float pr = exp2f(x - lse2);
    *ptilde = kept ? pr * p.drop_scale : 0.0f;
    return pr * ((kept ? dp * p.drop_scale : 0.0f) - D);
}

// One (batch, head) and query tile of a forward or dQ block: where its rows are, and which key
// tiles it visits (up to the key length, and the diagonal when causal).
template <typename T>
struct QueryBlock {
    int b, h, q0, kv_len, n_blocks;
    int64_t ld;           // qkv row stride (3H)
    const T *gq, *gk, *gv;
    uint64_t row_base;    // (b·heads + h)·S: dropout element rows
    DST_FDEV QueryBlock(const Params &p, int BM, int BN) {
        const int m_block = blockIdx.x % p.m_blocks, bh = blockIdx.x / p.m_blocks;
        b = bh / p.heads;
        h = bh % p.heads;
        q0 = m_block * BM;
        ld = 3 * int64_t(p.hidden);
        gq = static_cast<const T *>(p.qkv) + int64_t(b) * p.seq * ld + int64_t(h) * p.head_dim;
        gk = gq + p.hidden;
        gv = gq + 2 * p.hidden;
        kv_len = key_limit(p, b);
        const int n_end = p.causal ? min(kv_len, q0 + BM) : kv_len;
        n_blocks = (n_end + BN - 1) / BN;
        row_base = uint64_t(bh) * uint64_t(p.seq);
    }
};

// Key tile nb (K then V, BN rows each) into stage st of a two-stage [K | V] buffer.
template <typename T, int BN, int D, int NT>
DST_FDEV void stage_kv(T *sKV0, int st, int nb, const QueryBlock<T> &qb, const Params &p) {
    T *kv = sKV0 + st * 2 * BN * (D + 8);
    load_tile<T, BN, D, NT>(kv, qb.gk, qb.ld, nb * BN, p.seq, p.head_dim, p.vec16);
    load_tile<T, BN, D, NT>(kv + BN * (D + 8), qb.gv, qb.ld, nb * BN, p.seq, p.head_dim, p.vec16);
}

// The additive mask (log2 domain) of this lane's key columns k0 + 8·nt + 2t (+1).
template <int NT>
DST_FDEV void key_bias2(const Params &p, int b, int k0, float (&bias2)[NT][2]) {
    const int t = threadIdx.x & 3;
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
        const int j = k0 + nt * 8 + 2 * t;
        bias2[nt][0] = bias2_at(p, b, j);
        bias2[nt][1] = bias2_at(p, b, j + 1);
    }
}

// ================================ forward ========================================================

// BM queries per block (NW warps of 16·MT rows), BN keys per tile, head dim padded to D.
template <typename T, int D, int BM, int BN, int NW>
struct FwdTraits {
    static constexpr int kThreads = NW * 32, kMT = BM / (16 * NW), kNT = BN / 8, kDT = D / 8, kLds = D + 8;
    static constexpr size_t kSmem = size_t(BM + 4 * BN) * kLds * sizeof(T);  // Q, two stages of K | V
    static_assert(BM % (16 * NW) == 0 && BN % 16 == 0 && D % 16 == 0, "tile shape");
};

template <typename T, int D, int BM, int BN, int NW, int MB>
__global__ void __launch_bounds__(NW * 32, MB) flash_fwd_kernel(const Params p) {
    using Tr = FwdTraits<T, D, BM, BN, NW>;
    constexpr int MT = Tr::kMT, NT = Tr::kNT, DT = Tr::kDT, LDS = Tr::kLds, kKeepNT = NT < 8 ? NT : 8;
    extern __shared__ __align__(16) unsigned char smem_raw[];
    T *sQ = reinterpret_cast<T *>(smem_raw), *sKV0 = sQ + BM * LDS;  // two stages of [K | V]

    const QueryBlock<T> qb(p, BM, BN);
    const int b = qb.b, h = qb.h, S = p.seq, d = p.head_dim, q0 = qb.q0, kv_len = qb.kv_len, n_blocks = qb.n_blocks;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    const int wrow = warp * MT * 16;
    const uint64_t row_base = qb.row_base;

    load_tile<T, BM, D, Tr::kThreads>(sQ, qb.gq, qb.ld, q0, S, d, p.vec16);
    if (n_blocks > 0) stage_kv<T, BN, D, Tr::kThreads>(sKV0, 0, 0, qb, p);
    cp_async_commit();

    float o[MT][DT][4];
    zero(o);
    float m[MT][2], l[MT][2];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) m[mt][0] = m[mt][1] = -INFINITY, l[mt][0] = l[mt][1] = 0.0f;

    for (int nb = 0; nb < n_blocks; ++nb) {
        const int k0 = nb * BN, st = nb & 1;
        cp_async_wait<0>();
        __syncthreads();  // this tile visible; every warp is done with the other stage
        if (nb + 1 < n_blocks) stage_kv<T, BN, D, Tr::kThreads>(sKV0, st ^ 1, nb + 1, qb, p);
        cp_async_commit();
        const T *sK = sKV0 + st * 2 * BN * LDS, *sV = sK + BN * LDS;

        float s[MT][NT][4];
        zero(s);
        mma_abt<T, MT, NT, D, LDS>(s, sQ, wrow, sK, 0);

        // Scores in the log2 domain, masked where needed (uniform per tile).
        const bool edge = k0 + BN > kv_len || (p.causal && k0 + BN - 1 > q0 + wrow);
        float bias2[NT][2];
        key_bias2<NT>(p, b, k0, bias2);
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
            for (int r = 0; r < 2; ++r) {
                const int i = q0 + wrow + mt * 16 + g + 8 * r;
                float mx = -INFINITY;
#pragma unroll
                for (int nt = 0; nt < NT; ++nt)
#pragma unroll
                    for (int c = 0; c < 2; ++c) {
                        float &v = s[mt][nt][2 * r + c];
                        v = edge ? score2(p, v, bias2[nt][c], i, k0 + nt * 8 + 2 * t + c, kv_len)
                                 : fmaf(v, p.scale_log2, bias2[nt][c]);
                        mx = fmaxf(mx, v);
                    }
                const float m_new = fmaxf(m[mt][r], quad_max(mx));
                const float ref = m_new == -INFINITY ? 0.0f : m_new;  // every key so far hidden
                const float alpha = exp2f(m[mt][r] - ref);
                m[mt][r] = m_new;
                float sum = 0.0f;
#pragma unroll
                for (int nt = 0; nt < NT; ++nt)
#pragma unroll
                    for (int c = 0; c < 2; ++c) {
                        float &v = s[mt][nt][2 * r + c];
                        v = exp2f(v - ref);
                        sum += v;
                    }
                l[mt][r] = l[mt][r] * alpha + sum;
#pragma unroll
                for (int dt = 0; dt < DT; ++dt) o[mt][dt][2 * r] *= alpha, o[mt][dt][2 * r + 1] *= alpha;
            }
            if (p.dropout) {
#pragma unroll
                for (int n8 = 0; n8 < NT; n8 += kKeepNT) {
                    const uint32_t keep = keep_tiles<kKeepNT, false>(p, row_base, q0 + wrow + mt * 16, k0 + n8 * 8);
#pragma unroll
                    for (int nn = 0; nn < kKeepNT; ++nn)
#pragma unroll
                        for (int e = 0; e < 4; ++e)
                            if (!((keep >> (4 * nn + e)) & 1u)) s[mt][n8 + nn][e] = 0.0f;
                }
            }
        }
        uint32_t a[MT][NT / 2][4];
        to_a<T, MT, NT>(a, s);
        mma_rb<T, MT, DT, BN, LDS>(o, a, sV, 0);
    }
    cp_async_wait<0>();  // Q is still in flight when no key tile was visible

    // ctx = o·(1/(1−p))/l; lse = (m + log2 l)·ln 2.
    T *gctx = static_cast<T *>(p.ctx) + int64_t(b) * S * p.hidden + int64_t(h) * d;
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            const float lt = quad_sum(l[mt][r]);
            const int i = q0 + wrow + mt * 16 + g + 8 * r;
            if (i >= S) continue;
            const float inv = lt > 0.0f ? p.drop_scale / lt : 0.0f;
            T *row = gctx + int64_t(i) * p.hidden;
#pragma unroll
            for (int dt = 0; dt < DT; ++dt)
                store2(row, dt * 8 + 2 * t, d, o[mt][dt][2 * r] * inv, o[mt][dt][2 * r + 1] * inv);
            if (p.lse && t == 0)
                p.lse[row_base + i] = lt > 0.0f ? (m[mt][r] + log2f(lt)) * kLn2 : -INFINITY;
        }
}

// ================================ backward =======================================================

// D[bh, i] = Σ_c dctx[b, i, h, c]·ctx[b, i, h, c]; one thread per (token, head).
template <typename T>
__global__ void flash_rowdot_kernel(const Params p) {
    const int64_t total = int64_t(p.batch) * p.seq * p.heads;
    for (int64_t x = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; x < total; x += int64_t(gridDim.x) * blockDim.x) {
        const int h = int(x % p.heads);
        const int64_t tok = x / p.heads, b = tok / p.seq, i = tok % p.seq;
        const T *go = static_cast<const T *>(p.dctx) + tok * p.hidden + int64_t(h) * p.head_dim;
        const T *oo = static_cast<const T *>(p.ctx_in) + tok * p.hidden + int64_t(h) * p.head_dim;
        float s = 0.0f;
        for (int c = 0; c < p.head_dim; ++c) s = fmaf(to_float(go[c]), to_float(oo[c]), s);
        p.dsum[(b * p.heads + h) * p.seq + i] = s;
    }
}

// BN keys per block (NW warps of 16·MT keys), BM queries per tile.
template <typename T, int D, int BM, int BN, int NW>
struct BwdKvTraits {
    static constexpr int kThreads = NW * 32, kMT = BN / (16 * NW), kNT = BM / 8, kDT = D / 8, kLds = D + 8;
    static constexpr int kLdsS = BM + 8;  // staged dS (stochastic): [BN][BM + 8]
    // Stochastic dQ of a query tile: kQW warps of 16·kQMT query rows (the others wait).
    static constexpr int kQW = BM / 16 < NW ? BM / 16 : NW, kQMT = BM / (16 * kQW);
    static constexpr size_t smem(bool atomic_dq) {
        return size_t(2 * BN + 4 * BM) * kLds * sizeof(T) + (atomic_dq ? size_t(BN) * kLdsS * sizeof(T) : 0) +
               size_t(4 * BM) * sizeof(float);
    }
    static_assert(BN % (16 * NW) == 0 && BM % 16 == 0 && BM % (16 * kQW) == 0 && D % 16 == 0, "tile shape");
};

// Stochastic backward: dQ rows qrow … qrow + 16·QMT of a query tile += dS·K, dS staged in sS as
// [key][query] (row stride LDSS), K in sK; fp32 atomics into dq_accum + acc0 (row width D).
template <typename T, int D, int BN, int LDS, int LDSS, int QMT>
DST_FDEV void atomic_dq_tile(const Params &p, const T *sS, const T *sK, int qrow, int64_t acc0, int rows_left) {
    constexpr int DT = D / 8;
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    float dq[QMT][DT][4];
    zero(dq);
#pragma unroll
    for (int kk = 0; kk < BN / 16; ++kk) {
        uint32_t af[QMT][1][4];
#pragma unroll
        for (int mt = 0; mt < QMT; ++mt)  // A = dS [query][key], stored [key][query]: transposed loads
            ldsm_x4_t(af[mt][0], smem_addr(sS + (kk * 16 + (lane >> 4) * 8 + (lane & 7)) * LDSS + qrow + mt * 16 +
                                           ((lane >> 3) & 1) * 8));
        mma_rb<T, QMT, DT, 16, LDS>(dq, af, sK, kk * 16);
    }
    float *acc = p.dq_accum + acc0;
#pragma unroll
    for (int mt = 0; mt < QMT; ++mt)
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            const int il = qrow + mt * 16 + g + 8 * r;
            if (il >= rows_left) continue;
#pragma unroll
            for (int dt = 0; dt < DT; ++dt) {
                atomicAdd(acc + il * D + dt * 8 + 2 * t, dq[mt][dt][2 * r]);
                atomicAdd(acc + il * D + dt * 8 + 2 * t + 1, dq[mt][dt][2 * r + 1]);
            }
        }
}

template <typename T, int D, int BM, int BN, int NW, int MB, bool kAtomicDq>
__global__ void __launch_bounds__(NW * 32, MB) flash_bwd_dkdv_kernel(const Params p) {
    using Tr = BwdKvTraits<T, D, BM, BN, NW>;
    constexpr int MT = Tr::kMT, NT = Tr::kNT, DT = Tr::kDT, LDS = Tr::kLds, LDSS = Tr::kLdsS;
    constexpr int kKeepNT = NT < 8 ? NT : 8;
    extern __shared__ __align__(16) unsigned char smem_raw[];
    T *sK = reinterpret_cast<T *>(smem_raw), *sV = sK + BN * LDS;
    T *sQ0 = sV + BN * LDS;  // two stages of [Q | dctx], each 2·BM rows
    float *sStat = reinterpret_cast<float *>(sQ0 + 4 * BM * LDS);  // two stages of [lse2 | D], each 2·BM
    T *sS = reinterpret_cast<T *>(sStat + 4 * BM);                   // stochastic: staged dS [BN][BM + 8]

    const int n_block = blockIdx.x % p.m_blocks, bh = blockIdx.x / p.m_blocks;
    const int b = bh / p.heads, h = bh % p.heads, S = p.seq, d = p.head_dim;
    const int k0 = n_block * BN;
    const int64_t ld = 3 * int64_t(p.hidden);
    const T *gq = static_cast<const T *>(p.qkv) + int64_t(b) * S * ld + int64_t(h) * d;
    const T *gk = gq + p.hidden, *gv = gq + 2 * p.hidden;
    const T *gdo = static_cast<const T *>(p.dctx) + int64_t(b) * S * p.hidden + int64_t(h) * d;
    const int kv_len = key_limit(p, b);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    const int wrow = warp * MT * 16;
    const uint64_t row_base = uint64_t(bh) * uint64_t(S);
    const float *lse = p.lse + row_base, *dsum = p.dsum + row_base;

    float dk[MT][DT][4], dv[MT][DT][4];
    zero(dk);
    zero(dv);
    // Query tiles that see these keys: all, or from the diagonal on when causal; none past the length.
    const int m_first = k0 < kv_len ? (p.causal ? k0 / BM : 0) : 0;
    const int m_end = k0 < kv_len ? (S + BM - 1) / BM : 0;

    auto stage = [&](int mb, int st) {  // Q, dctx and the row statistics of query tile mb
        T *q = sQ0 + st * 2 * BM * LDS;
        load_tile<T, BM, D, Tr::kThreads>(q, gq, ld, mb * BM, S, d, p.vec16);
        load_tile<T, BM, D, Tr::kThreads>(q + BM * LDS, gdo, p.hidden, mb * BM, S, d, p.vec16);
        float *st2 = sStat + st * 2 * BM;
        for (int r = threadIdx.x; r < BM; r += Tr::kThreads) {
            const int i = mb * BM + r;
            const float ls = i < S ? lse[i] : -INFINITY;
            // Rows past S or with every key hidden get P = 0: exp2(x − inf).
            st2[r] = ls == -INFINITY ? INFINITY : ls * kLog2e;
            st2[BM + r] = i < S ? dsum[i] : 0.0f;
        }
    };

    if (m_first < m_end) {
        load_tile<T, BN, D, Tr::kThreads>(sK, gk, ld, k0, S, d, p.vec16);
        load_tile<T, BN, D, Tr::kThreads>(sV, gv, ld, k0, S, d, p.vec16);
        stage(m_first, 0);
        cp_async_commit();
    }
    // Bias of this thread's key rows (fixed for the block).
    float kb2[MT][2];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int r = 0; r < 2; ++r) kb2[mt][r] = bias2_at(p, b, k0 + wrow + mt * 16 + g + 8 * r);

    for (int mb = m_first; mb < m_end; ++mb) {
        const int st = (mb - m_first) & 1, i0 = mb * BM;
        cp_async_wait<0>();
        __syncthreads();  // this stage visible; the other stage is free
        if (mb + 1 < m_end) stage(mb + 1, st ^ 1);
        cp_async_commit();
        const T *sQ = sQ0 + st * 2 * BM * LDS, *sdO = sQ + BM * LDS;
        const float *sL = sStat + st * 2 * BM, *sD = sL + BM;

        float s[MT][NT][4], dp[MT][NT][4];
        zero(s);
        zero(dp);
        mma_abt<T, MT, NT, D, LDS>(s, sK, wrow, sQ, 0);   // Sᵀ = K·Qᵀ
        mma_abt<T, MT, NT, D, LDS>(dp, sV, wrow, sdO, 0); // dP̃ᵀ = V·dctxᵀ
        // Queries past S need no mask: their lse2 of +inf gives P = 0.
        const bool edge = k0 + BN > kv_len || (p.causal && k0 + BN - 1 > i0);
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
            uint32_t keep = 0;
#pragma unroll
            for (int nt = 0; nt < NT; ++nt) {
                if (nt % kKeepNT == 0) keep = keep_tiles<kKeepNT, true>(p, row_base, k0 + wrow + mt * 16, i0 + nt * 8);
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const int r = e >> 1, c = e & 1;
                    const int j = k0 + wrow + mt * 16 + g + 8 * r, il = nt * 8 + 2 * t + c;
                    const float x = edge ? score2(p, s[mt][nt][e], kb2[mt][r], i0 + il, j, kv_len)
                                         : fmaf(s[mt][nt][e], p.scale_log2, kb2[mt][r]);
                    const bool kept = (keep >> (4 * (nt % kKeepNT) + e)) & 1u;
                    dp[mt][nt][e] = softmax_grad(p, x, sL[il], dp[mt][nt][e], kept, sD[il], &s[mt][nt][e]);  // dSᵀ, P̃ᵀ
                }
            }
        }
        uint32_t a[MT][NT / 2][4];
        to_a<T, MT, NT>(a, s);
        mma_rb<T, MT, DT, BM, LDS>(dv, a, sdO, 0);  // dV += P̃ᵀ·dctx
        to_a<T, MT, NT>(a, dp);
        mma_rb<T, MT, DT, BM, LDS>(dk, a, sQ, 0);   // dK += dSᵀ·Q

        if constexpr (kAtomicDq) {
            // Stochastic: dQ(tile) += dS·K through shared memory and fp32 atomics.
#pragma unroll
            for (int mt = 0; mt < MT; ++mt)
#pragma unroll
                for (int nt = 0; nt < NT; ++nt) {
                    const int jr = wrow + mt * 16 + g, ic = nt * 8 + 2 * t;
                    *reinterpret_cast<uint32_t *>(sS + jr * LDSS + ic) = pack2<T>(dp[mt][nt][0], dp[mt][nt][1]);
                    *reinterpret_cast<uint32_t *>(sS + (jr + 8) * LDSS + ic) = pack2<T>(dp[mt][nt][2], dp[mt][nt][3]);
                }
            __syncthreads();
            if (warp < Tr::kQW) atomic_dq_tile<T, D, BN, LDS, LDSS, Tr::kQMT>(p, sS, sK, warp * Tr::kQMT * 16,
                                                                        (row_base + i0) * D, S - i0);
            __syncthreads();  // sS is rewritten by the next tile
        }
    }

    // dK = scale·Σ dSᵀ·Q, dV = Σ P̃ᵀ·dctx; keys past the length keep zeros.
    T *gdk = static_cast<T *>(p.dqkv) + int64_t(b) * S * ld + int64_t(h) * d + p.hidden;
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            const int j = k0 + wrow + mt * 16 + g + 8 * r;
            if (j >= S) continue;
            T *row = gdk + int64_t(j) * ld;
#pragma unroll
            for (int dt = 0; dt < DT; ++dt) {
                store2(row, dt * 8 + 2 * t, d, dk[mt][dt][2 * r] * p.scale, dk[mt][dt][2 * r + 1] * p.scale);
                store2(row + p.hidden, dt * 8 + 2 * t, d, dv[mt][dt][2 * r], dv[mt][dt][2 * r + 1]);
            }
        }
}

// BM queries per block (NW warps of 16·MT queries), BN keys per tile.
template <typename T, int D, int BM, int BN, int NW>
struct BwdQTraits {
    static constexpr int kThreads = NW * 32, kMT = BM / (16 * NW), kNT = BN / 8, kDT = D / 8, kLds = D + 8;
    static constexpr size_t kSmem = size_t(2 * BM + 4 * BN) * kLds * sizeof(T);
    static_assert(BM % (16 * NW) == 0 && BN % 16 == 0 && D % 16 == 0, "tile shape");
};

template <typename T, int D, int BM, int BN, int NW, int MB>
__global__ void __launch_bounds__(NW * 32, MB) flash_bwd_dq_kernel(const Params p) {
    using Tr = BwdQTraits<T, D, BM, BN, NW>;
    constexpr int MT = Tr::kMT, NT = Tr::kNT, DT = Tr::kDT, LDS = Tr::kLds, kKeepNT = NT < 8 ? NT : 8;
    extern __shared__ __align__(16) unsigned char smem_raw[];
    T *sQ = reinterpret_cast<T *>(smem_raw), *sdO = sQ + BM * LDS, *sKV0 = sdO + BM * LDS;  // 2 × [K | V]

    const QueryBlock<T> qb(p, BM, BN);
    const int b = qb.b, h = qb.h, S = p.seq, d = p.head_dim, q0 = qb.q0, kv_len = qb.kv_len, n_blocks = qb.n_blocks;
    const int64_t ld = qb.ld;
    const T *gdo = static_cast<const T *>(p.dctx) + int64_t(b) * S * p.hidden + int64_t(h) * d;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    const int wrow = warp * MT * 16;
    const uint64_t row_base = qb.row_base;

    load_tile<T, BM, D, Tr::kThreads>(sQ, qb.gq, ld, q0, S, d, p.vec16);
    load_tile<T, BM, D, Tr::kThreads>(sdO, gdo, p.hidden, q0, S, d, p.vec16);
    if (n_blocks > 0) stage_kv<T, BN, D, Tr::kThreads>(sKV0, 0, 0, qb, p);
    cp_async_commit();

    float l2[MT][2], dsm[MT][2];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            const int i = q0 + wrow + mt * 16 + g + 8 * r;
            const float ls = i < S ? p.lse[row_base + i] : -INFINITY;
            l2[mt][r] = ls == -INFINITY ? INFINITY : ls * kLog2e;
            dsm[mt][r] = i < S ? p.dsum[row_base + i] : 0.0f;
        }
    float dq[MT][DT][4];
    zero(dq);

    for (int nb = 0; nb < n_blocks; ++nb) {
        const int st = nb & 1, k0 = nb * BN;
        cp_async_wait<0>();
        __syncthreads();
        if (nb + 1 < n_blocks) stage_kv<T, BN, D, Tr::kThreads>(sKV0, st ^ 1, nb + 1, qb, p);
        cp_async_commit();
        const T *sK = sKV0 + st * 2 * BN * LDS, *sV = sK + BN * LDS;

        float s[MT][NT][4], dp[MT][NT][4];
        zero(s);
        zero(dp);
        mma_abt<T, MT, NT, D, LDS>(s, sQ, wrow, sK, 0);    // S = Q·Kᵀ
        mma_abt<T, MT, NT, D, LDS>(dp, sdO, wrow, sV, 0);  // dP̃ = dctx·Vᵀ
        const bool edge = k0 + BN > kv_len || (p.causal && k0 + BN - 1 > q0 + wrow);
        float bias2[NT][2];
        key_bias2<NT>(p, b, k0, bias2);
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
            uint32_t keep = 0;
#pragma unroll
            for (int nt = 0; nt < NT; ++nt) {
                if (nt % kKeepNT == 0) keep = keep_tiles<kKeepNT, false>(p, row_base, q0 + wrow + mt * 16, k0 + nt * 8);
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const int r = e >> 1, c = e & 1;
                    const int i = q0 + wrow + mt * 16 + g + 8 * r, j = k0 + nt * 8 + 2 * t + c;
                    const float x = edge ? score2(p, s[mt][nt][e], bias2[nt][c], i, j, kv_len)
                                         : fmaf(s[mt][nt][e], p.scale_log2, bias2[nt][c]);
                    const bool kept = (keep >> (4 * (nt % kKeepNT) + e)) & 1u;
                    float ptilde;  // P̃ is not needed here
                    dp[mt][nt][e] = softmax_grad(p, x, l2[mt][r], dp[mt][nt][e], kept, dsm[mt][r], &ptilde);  // dS
                }
            }
        }
        uint32_t a[MT][NT / 2][4];
        to_a<T, MT, NT>(a, dp);
        mma_rb<T, MT, DT, BN, LDS>(dq, a, sK, 0);  // dQ += dS·K
    }
    cp_async_wait<0>();  // Q and dctx are still in flight when no key tile was visible

    T *gdq = static_cast<T *>(p.dqkv) + int64_t(b) * S * ld + int64_t(h) * d;
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            const int i = q0 + wrow + mt * 16 + g + 8 * r;
            if (i >= S) continue;
#pragma unroll
            for (int dt = 0; dt < DT; ++dt)
                store2(gdq + int64_t(i) * ld, dt * 8 + 2 * t, d, dq[mt][dt][2 * r] * p.scale,
                       dq[mt][dt][2 * r + 1] * p.scale);
        }
}

// Stochastic backward: dqkv's Q columns = scale·dq_accum (row width D, the padded head dim).
template <typename T, int D>
__global__ void flash_dq_convert_kernel(const Params p) {
    const int64_t total = int64_t(p.batch) * p.heads * p.seq * p.head_dim;
    const int64_t ld = 3 * int64_t(p.hidden);
    for (int64_t x = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; x < total; x += int64_t(gridDim.x) * blockDim.x) {
        const int c = int(x % p.head_dim);
        const int64_t row = x / p.head_dim;  // (b·heads + h)·S + i
        const int64_t i = row % p.seq, bh = row / p.seq, b = bh / p.heads, h = bh % p.heads;
        static_cast<T *>(p.dqkv)[(b * p.seq + i) * ld + h * p.head_dim + c] =
            from_float<T>(p.dq_accum[row * D + c] * p.scale);
    }
}

// ================================ tile shapes and launches ======================================

// Tile shapes per padded head dim D (HABITS 13): forward BM queries × BN keys on NW warps;
// backward dK/dV BN keys per block × BM queries per tile; backward dQ BM queries × BN keys; MB is
// the blocks per SM the register budget is capped for (__launch_bounds__). Chosen from the lab
// (kernels/dev/attention_lab.cu, fp16, d = 64, 8×2048, 16 heads, dropout 0.1; H200, 2026-12-01):
// forward v7 81.5 TFLOP/s (v1 51.6), dK/dV v6 115.8 (v1 106.7), dQ v6 106.8 (v1 102.4). The wider
// head dims keep the shapes with a looser register cap (more accumulators per thread).
template <int D>
struct Tiles {
    static constexpr int kFwdBM = 64, kFwdBN = 64, kFwdNW = 4, kFwdMB = D <= 64 ? 4 : 3;
    static constexpr int kKvBM = 32, kKvBN = 64, kKvNW = 4, kKvMB = D <= 64 ? 3 : 2;
    static constexpr int kQBM = 64, kQBN = 32, kQNW = 4, kQMB = D <= 64 ? 4 : 3;
};

// A block needing more than the default 48 KB of shared memory must say so first.
template <typename K>
cudaError_t allow_smem(K kernel, size_t bytes) {
    if (bytes <= 48 * 1024) return cudaSuccess;
    return cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes));
}

inline int64_t blocks_of(const Params &p, int tile) {
    return int64_t((p.seq + tile - 1) / tile) * p.batch * p.heads;
}

template <typename T, int D, int BM, int BN, int NW, int MB>
cudaError_t launch_fwd(Params p, cudaStream_t stream) {
    using Tr = FwdTraits<T, D, BM, BN, NW>;
    p.m_blocks = (p.seq + BM - 1) / BM;
    const auto kernel = flash_fwd_kernel<T, D, BM, BN, NW, MB>;
    cudaError_t e = allow_smem(kernel, Tr::kSmem);
    if (e != cudaSuccess) return e;
    kernel<<<static_cast<unsigned>(blocks_of(p, BM)), Tr::kThreads, Tr::kSmem, stream>>>(p);
    return cudaGetLastError();
}

template <typename T, int D, int BM, int BN, int NW, int MB>
cudaError_t launch_bwd_dkdv(Params p, cudaStream_t stream) {
    using Tr = BwdKvTraits<T, D, BM, BN, NW>;
    p.m_blocks = (p.seq + BN - 1) / BN;
    const bool atomic = p.dq_accum != nullptr;
    const auto kernel = atomic ? flash_bwd_dkdv_kernel<T, D, BM, BN, NW, MB, true>
                                : flash_bwd_dkdv_kernel<T, D, BM, BN, NW, MB, false>;
    const size_t smem = Tr::smem(atomic);
    cudaError_t e = allow_smem(kernel, smem);
    if (e != cudaSuccess) return e;
    kernel<<<static_cast<unsigned>(blocks_of(p, BN)), Tr::kThreads, smem, stream>>>(p);
    return cudaGetLastError();
}

template <typename T, int D, int BM, int BN, int NW, int MB>
cudaError_t launch_bwd_dq(Params p, cudaStream_t stream) {
    using Tr = BwdQTraits<T, D, BM, BN, NW>;
    p.m_blocks = (p.seq + BM - 1) / BM;
    const auto kernel = flash_bwd_dq_kernel<T, D, BM, BN, NW, MB>;
    cudaError_t e = allow_smem(kernel, Tr::kSmem);
    if (e != cudaSuccess) return e;
    kernel<<<static_cast<unsigned>(blocks_of(p, BM)), Tr::kThreads, Tr::kSmem, stream>>>(p);
    return cudaGetLastError();
}

// The production shapes, one function per kernel family and file (attention_flash_fwd.cu,
// attention_flash_dkdv.cu, attention_flash_dq.cu); D is the padded head dim (32, 64, 96, 128).
cudaError_t fwd(const Params &p, bool bf16, int D, cudaStream_t stream);
cudaError_t bwd_dkdv(const Params &p, bool bf16, int D, cudaStream_t stream);
cudaError_t bwd_dq(const Params &p, bool bf16, int D, cudaStream_t stream);

// Calls f(T{}, std::integral_constant<int, D>{}) for the storage type and padded head dim.
template <typename F>
cudaError_t dispatch(bool bf16, int D, F &&f) {
    auto by_dim = [&](auto tag) -> cudaError_t {
        switch (D) {
            case 32: return f(tag, std::integral_constant<int, 32>{});
            case 64: return f(tag, std::integral_constant<int, 64>{});
            case 96: return f(tag, std::integral_constant<int, 96>{});
            case 128: return f(tag, std::integral_constant<int, 128>{});
            default: return cudaErrorInvalidValue;
        }
    };
    return bf16 ? by_dim(__nv_bfloat16{}) : by_dim(__half{});
}

#undef DST_FDEV

}  // namespace flash
}  // namespace cuda
}  // namespace dst

#endif  // DST_KERNELS_ATTENTION_FLASH_IMPL_CUH
