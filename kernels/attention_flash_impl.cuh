// Device code of the tensor-core (flash) attention for FP16 and BF16: the kernel templates behind
// kernels/attention_flash.cuh, included by the instantiation files and by the kernel lab
// (kernels/dev/attention_lab.cu). Math and layouts: kernels/attention_args.h.
//
// Building blocks. Tiles of Q, K, V, dctx live in shared memory as [rows][D + 8] (D = head_dim
// rounded up to 32/64/96/128; columns past head_dim are zero; the 16-byte pad makes every ldmatrix
// conflict-free). Warps run mma.sync.m16n8k16 (fp32 accumulate) on fragments loaded with
// ldmatrix; the fp32 accumulators of one product become the A operand of the next in registers.
//
//   forward  (flash_fwd_kernel): a block owns 16·NW queries of one (batch, head), one warp per 16
//            rows, and walks the key tiles with an online softmax in the log2 domain; the next K
//            and V tiles load (cp.async) while the tensor cores work. Writes ctx and lse.
//   backward (flash_bwd_kernel): one kernel. A block owns 16·NW keys (a warp per 16) and walks
//            the query tiles computing the transposed products Sᵀ = K·Qᵀ and dP̃ᵀ = V·dctxᵀ, so
//            P̃ᵀ and dSᵀ are the register A operands of dV += P̃ᵀ·dctx and dK += dSᵀ·Q; dSᵀ also
//            goes to shared memory, the block multiplies it by its K tile and adds the partial dQ of
//            the query tile into an fp32 accumulator in global memory (below).
//
// The dQ reduction. Several key blocks add into one query tile's dQ. Deterministic mode fixes
// the order: the key blocks of a tile add in ascending key order, each waiting for a per-tile
// counter to reach its rank (the first stores, the middle ones add with red.global, the last
// reads the sum, adds its own and writes dQ in the layer dtype). A block releases the counter
// after its next barrier, with one thread, while its next products run (DqOwed), not with a fence
// in every thread. Blocks take their work items from a ticket counter in that order, so a block
// only ever waits for blocks that started before it: no deadlock whatever the hardware's block
// order. Stochastic mode adds in any order, with no counter at all (the accumulator zeroed
// first), and a small kernel (bwd_dq_convert) writes dQ from the accumulator afterwards.
//
// Dropout regenerates the Philox words of kernels/philox.h inside the kernels (one 4-word block
// covers 4 consecutive keys of one query row). The key columns of every 16-key group are
// permuted (perm16: the K and V rows feeding the products are read in that order, which the
// products do not see), so that in the forward each lane's four columns of a row are exactly one
// Philox block, and in the backward (keys as rows) each lane holds half a block that it trades
// with one neighbour. When S % 4 != 0 blocks straddle rows and every element draws its own.
// The first Philox round's products of the (uniform) offset words are folded into constants on
// the host (philox_round0 below).
#ifndef DST_KERNELS_ATTENTION_FLASH_IMPL_CUH
#define DST_KERNELS_ATTENTION_FLASH_IMPL_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

#include <type_traits>

#include "kernels/attention_args.h"
#include "kernels/philox.h"
#include "kernels/launch.cuh"

namespace dst {
namespace cuda {
namespace flash {

#define DST_FDEV __device__ __forceinline__
#define DST_FHD __host__ __device__ __forceinline__  // also callable on the host (tests/cuda/test_cuda_philox.cu)

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;
constexpr uint32_t kPhiloxM0 = 0xD2511F53u, kPhiloxM1 = 0xCD9E8D57u;
constexpr uint32_t kPhiloxW0 = 0x9E3779B9u, kPhiloxW1 = 0xBB67AE85u;

// ================================ the call, as the kernels see it ==============================

// Pointers and scalars of one call, derived once on the host from AttentionArgs (make_params).
struct Params {
    const void *qkv;
    void *ctx;            // forward output
    float *lse;           // [B, heads, S]; forward output (nullable), backward input
    const void *dctx;     // backward
    const void *ctx_in;   // backward: the forward's ctx
    void *dqkv;           // backward output
    float *dsum;          // backward scratch: D = rowsum(dctx ∘ ctx), [B, heads, S]
    float *lse2;          // backward scratch: lse·log2(e) (+inf for rows with every key hidden)
    float *dq_accum;      // backward scratch: [B, heads, S, D] fp32
    int *counters;        // backward scratch: [B·heads·q_tiles] per-tile counters, then the ticket
    const float *key_bias;
    const int32_t *key_len;
    const int32_t *seq_start;  // packed layout (AttentionArgs::seq_start), or nullptr
    int batch, seq, heads, head_dim, hidden;
    int m_blocks;         // forward: query tiles per (batch, head); backward: key tiles
    int q_tiles;          // backward: query tiles per (batch, head)
    float scale, scale_log2;
    bool causal;
    bool vec16;           // every tensor row and head slice is 16-byte aligned: cp.async tiles
    bool dropout, aligned4;
    bool deterministic;   // backward: dQ added in a fixed order
    bool dq_order;        // backward: that order follows each block's steps (false: ascending key blocks)
    uint64_t seed, offset;
    const uint32_t *offset_hi;  // AttentionArgs::offset_hi: the offset's high word, read as the kernel runs
    uint32_t threshold;
    float drop_scale;
    // Philox (kernels/philox.h) with the offset words of the counter folded in: round r uses the
    // keys (key0[r], key1[r]); round 0 of group (lo, hi) is (hi ^ r0a, r0b, mulhi(M0, lo) ^ r0c,
    // M0·lo).
    uint32_t key0[10], key1[10];
    uint32_t r0a, r0b, r0c;
    // grp32: every group a kernel of the call draws (tile overhangs included) is below 2^32, so the
    // group's high word is 0 and round 1's first product M0·r0a is uniform: r1h = mulhi(M0, r0a) ^
    // key1[1], r1l = M0·r0a, r1b = r0b ^ key0[1] (philox_group_m0).
    bool grp32;
    uint32_t r1h, r1l, r1b;
};

// The head dim the kernels are built for: head_dim rounded up to 32, 64, 96 or 128.
inline int padded_head_dim(int64_t d) { return d <= 32 ? 32 : d <= 64 ? 64 : d <= 96 ? 96 : 128; }

// Round 0 of the dropout stream's Philox with the (uniform) offset words: what every group shares.
inline void philox_round0(Params &p) {
    uint32_t k0 = static_cast<uint32_t>(p.seed), k1 = static_cast<uint32_t>(p.seed >> 32);
    for (int r = 0; r < 10; ++r) {
        p.key0[r] = k0;
        p.key1[r] = k1;
        k0 += kPhiloxW0;
        k1 += kPhiloxW1;
    }
    const uint32_t off_lo = static_cast<uint32_t>(p.offset), off_hi = static_cast<uint32_t>(p.offset >> 32);
    uint32_t hi1, lo1;
    philox_mulhilo(kPhiloxM1, off_lo, hi1, lo1);
    p.r0a = hi1 ^ p.key0[0];
    p.r0b = lo1;
    p.r0c = off_hi ^ p.key1[0];
    uint32_t hia, loa;
    philox_mulhilo(kPhiloxM0, p.r0a, hia, loa);
    p.r1h = hia ^ p.key1[1];
    p.r1l = loa;
    p.r1b = p.r0b ^ p.key0[1];
    // The largest group a kernel draws: rows up to a tile (≤ 128) past the last of B·heads·S, keys up
    // to a tile (≤ 128) past S; group = row·S/4 + key/4.
    const uint64_t rows = uint64_t(p.batch) * uint64_t(p.heads) * uint64_t(p.seq) + 128;
    const uint64_t quarter = uint64_t(p.seq) / 4;
    p.grp32 = rows <= (uint64_t(1) << 32) && rows * quarter + quarter + 64 <= 0xFFFFFFFFull;
}

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
    p.seq_start = a.seq_start;
    p.dropout = a.threshold != 0;
    p.aligned4 = a.seq % 4 == 0;
    p.deterministic = a.deterministic;
    p.seed = a.seed;
    p.offset = a.offset;
    p.offset_hi = a.offset_hi;
    p.threshold = a.threshold;
    p.drop_scale = p.dropout ? static_cast<float>(a.drop_scale) : 1.0f;
    p.vec16 = a.head_dim % 8 == 0 && a.hidden % 8 == 0;  // and 16-byte aligned tensors: the caller checks
    philox_round0(p);
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
// 4-byte global → shared copy.
DST_FDEV void cp_async4(uint32_t dst, const void *src) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(dst), "l"(src));
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

// 2^x with one MUFU.EX2 (ex2.approx.ftz: the approximation exp2f uses, without exp2f's denormal
// scaling; results below 2^−126 flush to 0, far under any 16-bit output's resolution). 2^−inf = 0.
DST_FDEV float fast_exp2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}

// Ordering of the dQ reduction: a gpu-scope acquire load, a release store, an fp32 pair add.
DST_FDEV int ld_acquire(const int *p) {
    int v;
    asm volatile("ld.acquire.gpu.global.b32 %0, [%1];\n" : "=r"(v) : "l"(p) : "memory");
    return v;
}
DST_FDEV void st_release(int *p, int v) {
    asm volatile("st.release.gpu.global.b32 [%0], %1;\n" ::"l"(p), "r"(v) : "memory");
}
// Spins until *cnt == want. The turn always comes (see flash_bwd_kernel); a wait of tens of
// seconds means a broken invariant (for example another program holding SMs that the launch counted
// on), and the kernel then traps instead of hanging the caller forever.
DST_FDEV void wait_turn(const int *cnt, int want) {
    for (uint32_t spins = 0; ld_acquire(cnt) != want; ++spins) {
        if (spins > (1u << 28)) __trap();
        __nanosleep(64);
    }
}
DST_FDEV void red_add4(float *p, float4 v) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("red.global.add.v4.f32 [%0], {%1, %2, %3, %4};\n" ::"l"(p), "f"(v.x), "f"(v.y), "f"(v.z), "f"(v.w) : "memory");
#else
    atomicAdd(p, v.x);
    atomicAdd(p + 1, v.y);
    atomicAdd(p + 2, v.z);
    atomicAdd(p + 3, v.w);
#endif
}
DST_FDEV void red_add2(float *p, float a, float b) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("red.global.add.v2.f32 [%0], {%1, %2};\n" ::"l"(p), "f"(a), "f"(b) : "memory");
#else
    atomicAdd(p, a);
    atomicAdd(p + 1, b);
#endif
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

// A thread's share of copying row tiles [R][D + 8] of one or two row-major matrices (the same
// row stride) with cp.async, for tiles whose rows are all 16-byte aligned (vec16) when NT is a
// multiple of D/8: the thread then owns one 16-byte column and every (NT·8/D)-th row, so a tile
// costs one address per row step instead of the generic loop's indexing. Other shapes and
// unaligned tensors take load_tile. Set up once per kernel; copy() per tile.
template <typename T, int R, int D, int NT>
struct RowCopy {
    static constexpr int kChunks = D / 8, kLds = D + 8;
    static constexpr bool kFast = NT % kChunks == 0;
    static constexpr int kStep = kFast ? NT / kChunks : 1, kPer = (R + kStep - 1) / kStep;
    const T *src0, *src1;  // matrices (row 0, column 0 of this head)
    int64_t ld;
    int r0, col, d;
    bool fast;
    DST_FDEV RowCopy(const T *a, const T *b, int64_t ld_, int d_, bool vec16)
        : src0(a), src1(b), ld(ld_), r0(int(threadIdx.x) / kChunks), col((int(threadIdx.x) % kChunks) * 8), d(d_),
          fast(kFast && vec16) {}
    // Rows row0 … row0 + R − 1 (rows ≥ nrows and columns ≥ d are zero) of the first matrix into
    // t0 and, when t1 is given, of the second into t1.
    DST_FDEV void copy(T *t0, T *t1, int row0, int nrows) const {
        if (!fast) {
            load_tile<T, R, D, NT>(t0, src0, ld, row0, nrows, d, false);
            if (t1) load_tile<T, R, D, NT>(t1, src1, ld, row0, nrows, d, false);
            return;
        }
        const int64_t off = int64_t(row0 + r0) * ld + col;
        const uint32_t s0 = smem_addr(t0 + r0 * kLds + col), s1 = t1 ? smem_addr(t1 + r0 * kLds + col) : 0u;
#pragma unroll
        for (int k = 0; k < kPer; ++k) {
            if (kPer * kStep != R && r0 + k * kStep >= R) break;
            const bool ok = col < d && row0 + r0 + k * kStep < nrows;
            const int64_t o = ok ? off + int64_t(k * kStep) * ld : 0;
            cp_async16(s0 + uint32_t(k * kStep * kLds * sizeof(T)), src0 + o, ok ? 16 : 0);
            if (t1) cp_async16(s1 + uint32_t(k * kStep * kLds * sizeof(T)), src1 + o, ok ? 16 : 0);
        }
    }
};

// Column n (0…15) of a 16-key group holds key perm16(n) of the group: lane (g, t) of an m16n8
// accumulator pair then holds keys 4t … 4t+3 (columns 2t, 2t+1 of the first n8 tile, 2t, 2t+1 of
// the second).
DST_FDEV int perm16(int n) { return 4 * ((n & 7) >> 1) + 2 * (n >> 3) + (n & 1); }
// Row r (0…15) of a warp's 16-key block in the backward holds key rho16(r): lane g holds keys
// 2g (row g) and 2g + 1 (row g + 8), half of the Philox block g/2.
DST_FDEV int rho16(int r) { return 2 * (r & 7) + (r >> 3); }

// acc[MT][DT][4] += A·B with A from registers (fragments [MT][K/16][4]) and B = rows b_row0 …
// b_row0 + K of sB stored [k][n] (n = DT·8 columns from column n0), row stride LDS.
template <typename T, int MT, int DT, int K, int LDS>
DST_FDEV void mma_rb(float (&acc)[MT][DT][4], const uint32_t (&a)[MT][K / 16][4], const T *sB, int b_row0, int n0 = 0) {
    static_assert(DT % 2 == 0, "n in pairs of 8");
    const int lane = threadIdx.x & 31;
#pragma unroll
    for (int kk = 0; kk < K / 16; ++kk) {
#pragma unroll
        for (int dp = 0; dp < DT / 2; ++dp) {
            uint32_t b[4];
            ldsm_x4_t(b, smem_addr(sB + (b_row0 + kk * 16 + ((lane >> 3) & 1) * 8 + (lane & 7)) * LDS + n0 + dp * 16 +
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
template <typename T, int NT>
DST_FDEV void to_a(uint32_t (&a)[NT / 2][4], const float (&c)[NT][4]) {
#pragma unroll
    for (int kk = 0; kk < NT / 2; ++kk) {
        a[kk][0] = pack2<T>(c[2 * kk][0], c[2 * kk][1]);
        a[kk][1] = pack2<T>(c[2 * kk][2], c[2 * kk][3]);
        a[kk][2] = pack2<T>(c[2 * kk + 1][0], c[2 * kk + 1][1]);
        a[kk][3] = pack2<T>(c[2 * kk + 1][2], c[2 * kk + 1][3]);
    }
}

template <int NT>
DST_FDEV void zero(float (&c)[NT][4]) {
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) c[nt][e] = 0.0f;
}

// ================================ dropout ========================================================

// Rounds kFirst … 9 of the dropout stream's Philox on the state (c0, c1, c2, c3), the keys of p.
template <int kFirst>
DST_FHD uint4 philox_rounds(const Params &p, uint32_t c0, uint32_t c1, uint32_t c2, uint32_t c3) {
#if defined(__CUDA_ARCH__)  // host compilers (the host twin of the tests) know no unroll pragma
#pragma unroll
#endif
    for (int r = kFirst; r < 10; ++r) {
        const uint64_t a = uint64_t(kPhiloxM0) * c0, b = uint64_t(kPhiloxM1) * c2;
        const uint32_t n0 = uint32_t(b >> 32) ^ c1 ^ p.key0[r], n2 = uint32_t(a >> 32) ^ c3 ^ p.key1[r];
        c1 = uint32_t(b);
        c3 = uint32_t(a);
        c0 = n0;
        c2 = n2;
    }
    return make_uint4(c0, c1, c2, c3);
}
// Round 0's word r0c as the kernel runs: the Params' own, or with offset_hi the offset's high word read
// from memory (the only round-0 word the high word enters). Read once per tile by the callers below.
DST_FHD uint32_t philox_r0c(const Params &p) { return p.offset_hi ? *p.offset_hi ^ p.key1[0] : p.r0c; }
// The four words of dropout group (lo, hi) = element >> 2 (kernels/philox.h, philox_dropout_block);
// r0c = philox_r0c(p).
DST_FHD uint4 philox_group(const Params &p, uint32_t r0c, uint32_t lo, uint32_t hi) {
    const uint64_t m0 = uint64_t(kPhiloxM0) * lo;
    const uint32_t c0 = hi ^ p.r0a, c1 = p.r0b, c2 = uint32_t(m0 >> 32) ^ r0c, c3 = uint32_t(m0);
    return philox_rounds<1>(p, c0, c1, c2, c3);
}
DST_FHD uint4 philox_group(const Params &p, uint32_t r0c, uint64_t group) {
    return philox_group(p, r0c, uint32_t(group), uint32_t(group >> 32));
}
// The same words when p.grp32 (the group's high word 0), from m0 = M0·group (the 64-bit product,
// which callers walking groups at a fixed stride form by additions): round 0 needs no multiply and
// round 1 one, 17 wide multiplies per group instead of 19.
DST_FHD uint4 philox_group_m0(const Params &p, uint32_t r0c, uint64_t m0) {
    const uint32_t c3r0 = uint32_t(m0);
    const uint64_t b1 = uint64_t(kPhiloxM1) * (uint32_t(m0 >> 32) ^ r0c);
    const uint32_t c0 = uint32_t(b1 >> 32) ^ p.r1b, c1 = uint32_t(b1), c2 = c3r0 ^ p.r1h, c3 = p.r1l;
    return philox_rounds<2>(p, c0, c1, c2, c3);
}
#if defined(DST_LAB_DROP_BITS)
// The attention lab's timing control only (kernels/dev/lab.sh LAB_DEFS=-DDST_LAB_DROP_BITS=16 or 8;
// never defined for the library): one Philox word serves 32 / DST_LAB_DROP_BITS elements, as a
// mapping with 16- or 8-bit thresholds would. Slot k of each word moves to the top bits, so the keep
// test against p.threshold is unchanged; the dropped set is not the library's (timed, not checked).
constexpr int kLabDropSlots = 32 / DST_LAB_DROP_BITS;
DST_FDEV uint4 lab_drop_slot(const uint4 &w, int k) {
    const int sh = 32 - DST_LAB_DROP_BITS * (k + 1);
    const uint32_t keep = ~((1u << (32 - DST_LAB_DROP_BITS)) - 1u);
    return make_uint4((w.x << sh) & keep, (w.y << sh) & keep, (w.z << sh) & keep, (w.w << sh) & keep);
}
#endif
// The word of one element (any alignment).
DST_FDEV uint32_t philox_word(const Params &p, uint32_t r0c, uint64_t e) {
    const uint4 r = philox_group(p, r0c, e >> 2);
    const uint32_t k = uint32_t(e & 3);
    return k == 0 ? r.x : k == 1 ? r.y : k == 2 ? r.z : r.w;
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

// Sequence b in the token buffers: its first row (b·S, or its packed start) and its rows (S, or its
// length: packed rows past it belong to the next sequence and are neither read nor written).
DST_FDEV int64_t seq_row0(const Params &p, int b) { return p.seq_start ? int64_t(p.seq_start[b]) : int64_t(b) * p.seq; }
DST_FDEV int seq_rows(const Params &p, int b) { return p.seq_start ? key_limit(p, b) : p.seq; }
// The query tiles of BM rows a backward key block visits: all q_tiles in the padded layout (rows past a
// key length are output rows too), those of the sequence's q_rows rows in the packed one. Tiles are at
// least as many as key blocks either way (BM ≤ BN), which the dQ ranks of bwd_dq_add rely on.
DST_FDEV int bwd_q_tiles(const Params &p, int q_rows, int BM) { return p.seq_start ? (q_rows + BM - 1) / BM : p.q_tiles; }
// The query tile a backward block (key block jb) visits at a step: from m_first (the diagonal when
// causal, else 0) on, or, when the dQ order follows the steps, all nq tiles starting at its own index
// (so that in lockstep every block adds into a tile one step after the block before it in that
// tile's order).
DST_FDEV int bwd_tile_at(const Params &p, int m_first, int jb, int nq, int step) {
    return p.causal || !p.dq_order ? m_first + step : (jb + step) % nq;
}

// The additive mask of key j in the log2 domain (0 without one; j < S).
DST_FDEV float bias2_at(const Params &p, int b, int j) {
    return p.key_bias ? p.key_bias[int64_t(b) * p.seq + j] * kLog2e : 0.0f;
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

// ================================ forward ========================================================

// A warp's view of one query tile in the forward (the mma.sync kernel below and the wgmma kernel of
// kernels/attention_flash_wgmma.cuh both keep their accumulators in this m16n8 layout): the lane's
// rows i0 and i1 = i0 + 8 (accumulator elements 0, 1 and 2, 3), the running max m2 (log2 domain) and
// row sum l, and the Philox groups of its rows at key 0.
struct FwdRows {
    int b, q0, wrow, i0, t, kv_len;  // i1 = i0 + 8
    int q_rows;                      // the sequence's rows (seq_rows)
    uint64_t row_base, grp0;         // grp1 = grp0 + 2S
    bool has_bias;
    float cexp;  // s is scaled with the mask added (1), or raw (scale·log2 e)
    float m2[2], l[2];
    float alpha[2];  // fwd_tile<…, true>: the factors o still has to be scaled by, when grew
    bool grew;
};

DST_FDEV FwdRows fwd_rows(const Params &p, int b, int bh, int q0, int wrow, int lane) {
    FwdRows r;
    r.b = b;
    r.q0 = q0;
    r.wrow = wrow;
    r.t = lane & 3;
    r.i0 = q0 + wrow + (lane >> 2);
    r.kv_len = key_limit(p, b);
    r.q_rows = seq_rows(p, b);
    r.row_base = uint64_t(bh) * uint64_t(p.seq);
    // Dropout groups of this lane's rows at key 0 (aligned4: (row_base + i)·S/4 + t).
    r.grp0 = (r.row_base + uint64_t(r.i0)) * uint64_t(p.seq / 4) + uint64_t(r.t);
    r.has_bias = p.key_bias != nullptr;
    r.cexp = r.has_bias ? 1.0f : p.scale_log2;
    r.m2[0] = r.m2[1] = -INFINITY;
    r.l[0] = r.l[1] = 0.0f;
    return r;
}

// One key tile k0 … k0 + BN − 1 of the forward on S = Q·Kᵀ in s (columns in perm16 order): the additive
// mask, the keys past the length and causal, the online softmax (o rescaled, m2 and l updated) and
// dropout. On return s holds P̃ (unnormalised, dropped entries zero), ready to become the A operand
// of O += P̃·V.
// kDeferRescale: o is left alone (a warpgroup MMA may still be adding into it); the factors go to
// w.alpha and w.grew for the caller to apply (kernels/dev/attention_lab.cu, w8).
template <int NT, int DT, bool kDeferRescale = false>
DST_FDEV void fwd_tile(const Params &p, FwdRows &w, int k0, float (&s)[NT][4], float (&o)[DT][4]) {
    constexpr int BN = NT * 8, NG = BN / 16;
    const int S = p.seq, t = w.t;
    // Element (nt, e) is row e/2 (i0 or i1) and key k0 + 16·(nt/2) + 4t + 2·(nt%2) + e%2.
    if (w.has_bias) {  // s ← s·scale·log2(e) + mask·log2(e)
#pragma unroll
        for (int G = 0; G < NG; ++G) {
            const int j = k0 + G * 16 + 4 * t;
            float b4[4];
#pragma unroll
            for (int x = 0; x < 4; ++x) b4[x] = j + x < S ? bias2_at(p, w.b, j + x) : 0.0f;
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                s[2 * G][e] = fmaf(s[2 * G][e], p.scale_log2, b4[e & 1]);
                s[2 * G + 1][e] = fmaf(s[2 * G + 1][e], p.scale_log2, b4[2 + (e & 1)]);
            }
        }
    }
    if (k0 + BN > w.kv_len || (p.causal && k0 + BN - 1 > w.q0 + w.wrow)) {  // uniform per warp
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int j = k0 + 16 * (nt >> 1) + 4 * t + 2 * (nt & 1) + (e & 1), i = w.i0 + (e < 2 ? 0 : 8);
                if (j >= w.kv_len || (p.causal && j > i)) s[nt][e] = -INFINITY;
            }
    }

    // Online softmax in the log2 domain (m2: running max of the scaled scores).
    float alpha[2], neg[2];
    bool grew = false;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        float mx = -INFINITY;
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) mx = fmaxf(mx, fmaxf(s[nt][2 * r], s[nt][2 * r + 1]));
        const float m_new = fmaxf(w.m2[r], quad_max(mx) * w.cexp);
        const float ref = m_new == -INFINITY ? 0.0f : m_new;  // every key so far hidden
        grew |= m_new > w.m2[r];
        alpha[r] = fast_exp2(w.m2[r] - ref);
        w.m2[r] = m_new;
        neg[r] = -ref;
    }
    float sum[2] = {0.0f, 0.0f};
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const float v = fast_exp2(fmaf(s[nt][e], w.cexp, neg[e >> 1]));
            sum[e >> 1] += v;
            s[nt][e] = v;
        }
    w.l[0] = fmaf(w.l[0], alpha[0], sum[0]);
    w.l[1] = fmaf(w.l[1], alpha[1], sum[1]);
    if constexpr (kDeferRescale) {
        w.alpha[0] = alpha[0];
        w.alpha[1] = alpha[1];
        w.grew = __any_sync(0xffffffffu, grew);
    } else if (__any_sync(0xffffffffu, grew)) {  // after the first tiles the maxima seldom move (else alpha = 1)
#pragma unroll
        for (int dt = 0; dt < DT; ++dt)
#pragma unroll
            for (int e = 0; e < 4; ++e) o[dt][e] *= alpha[e >> 1];
    }

    // Dropout: word x of this lane's block of row r in group G is key offset x, element
    // (2G + x/2, 2r + x%2). One branch per mode outside the unrolled loops, so that the
    // Philox chains of a tile are one straight block the scheduler can interleave.
    auto drop = [&](int G, int r, const uint4 &wd) {
        if (wd.x < p.threshold) s[2 * G][2 * r] = 0.0f;
        if (wd.y < p.threshold) s[2 * G][2 * r + 1] = 0.0f;
        if (wd.z < p.threshold) s[2 * G + 1][2 * r] = 0.0f;
        if (wd.w < p.threshold) s[2 * G + 1][2 * r + 1] = 0.0f;
    };
    const uint32_t r0c = p.dropout ? philox_r0c(p) : 0u;
    if (p.dropout && p.aligned4 && p.grp32) {  // M0·group by additions: the tile's, the row's, G's
        const uint64_t mt = uint64_t(kPhiloxM0) * uint32_t(w.grp0 + uint64_t(k0 / 4));
        const uint64_t mr = uint64_t(kPhiloxM0) * uint32_t(2 * S);
#if defined(DST_LAB_DROP_BITS)
        uint4 wd = make_uint4(0u, 0u, 0u, 0u);
#pragma unroll
        for (int G = 0; G < NG; ++G)
#pragma unroll
            for (int r = 0; r < 2; ++r) {
                const int slot = (2 * G + r) % kLabDropSlots;
                if (slot == 0) wd = philox_group_m0(p, r0c, mt + (r ? mr : 0) + uint64_t(kPhiloxM0) * uint64_t(4 * G));
                drop(G, r, lab_drop_slot(wd, slot));
            }
#else
#pragma unroll
        for (int G = 0; G < NG; ++G)
#pragma unroll
            for (int r = 0; r < 2; ++r)
                drop(G, r, philox_group_m0(p, r0c, mt + (r ? mr : 0) + uint64_t(kPhiloxM0) * uint64_t(4 * G)));
#endif
    } else if (p.dropout && p.aligned4) {
#pragma unroll
        for (int G = 0; G < NG; ++G)
#pragma unroll
            for (int r = 0; r < 2; ++r)
                drop(G, r, philox_group(p, r0c, w.grp0 + (r ? 2 * uint64_t(S) : 0) + uint64_t(k0 / 4 + 4 * G)));
    } else if (p.dropout) {
#pragma unroll
        for (int G = 0; G < NG; ++G)
#pragma unroll
            for (int r = 0; r < 2; ++r) {
                const uint64_t e0 = (w.row_base + uint64_t(w.i0 + 8 * r)) * uint64_t(S) + uint64_t(k0 + 16 * G + 4 * t);
                drop(G, r, make_uint4(philox_word(p, r0c, e0), philox_word(p, r0c, e0 + 1),
                                      philox_word(p, r0c, e0 + 2), philox_word(p, r0c, e0 + 3)));
            }
    }
}

// The forward's end: ctx = o·(1/(1−p))/l for the lane's rows of the sequence (columns below d of the head at
// gctx, the row stride p.hidden), lse = (m2 + log2 l)·ln 2 when p.lse.
template <typename T, int DT>
DST_FDEV void fwd_store(const Params &p, const FwdRows &w, T *gctx, int d, const float (&o)[DT][4]) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        const float lt = quad_sum(w.l[r]);
        const int i = w.i0 + 8 * r;
        if (i >= w.q_rows) continue;
        const float inv = lt > 0.0f ? p.drop_scale / lt : 0.0f;
        T *row = gctx + int64_t(i) * p.hidden;
#pragma unroll
        for (int dt = 0; dt < DT; ++dt) store2(row, dt * 8 + 2 * w.t, d, o[dt][2 * r] * inv, o[dt][2 * r + 1] * inv);
        if (p.lse && w.t == 0) p.lse[w.row_base + i] = lt > 0.0f ? (w.m2[r] + log2f(lt)) * kLn2 : -INFINITY;
    }
}

// 16·NW queries per block (a warp per 16 rows), BN keys per tile, head dim padded to D.
template <typename T, int D, int BN, int NW>
struct FwdTraits {
    static constexpr int kBM = 16 * NW, kThreads = NW * 32, kLds = D + 8;
    static constexpr size_t kSmem = size_t(kBM + 4 * BN) * kLds * sizeof(T);  // Q, two stages of K | V
    static_assert(BN % 16 == 0 && D % 16 == 0, "tile shape");
};

template <typename T, int D, int BN, int NW, int MB>
__global__ void __launch_bounds__(NW * 32, MB) flash_fwd_kernel(const Params p) {
    DST_GRID_DEPENDENCY();
    using Tr = FwdTraits<T, D, BN, NW>;
    constexpr int BM = Tr::kBM, NT = BN / 8, NG = BN / 16, DT = D / 8, KD = D / 16, LDS = Tr::kLds;
    extern __shared__ __align__(16) unsigned char smem_raw[];
    T *sQ = reinterpret_cast<T *>(smem_raw), *sKV0 = sQ + BM * LDS;  // two stages of [K | V]

    const int m_block = blockIdx.x % p.m_blocks, bh = blockIdx.x / p.m_blocks;
    const int b = bh / p.heads, h = bh % p.heads, d = p.head_dim;
    const int q0 = m_block * BM, q_rows = seq_rows(p, b);
    if (q0 >= q_rows) return;  // packed: a tile past the sequence
    const int64_t ld = 3 * int64_t(p.hidden);
    const T *gq = static_cast<const T *>(p.qkv) + seq_row0(p, b) * ld + int64_t(h) * d;
    const T *gk = gq + p.hidden, *gv = gq + 2 * p.hidden;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    FwdRows w = fwd_rows(p, b, bh, q0, warp * 16, lane);
    const int wrow = w.wrow;
    const int n_end = p.causal ? min(w.kv_len, q0 + BM) : w.kv_len;
    const int n_blocks = (n_end + BN - 1) / BN;
    // Shared-memory rows a lane addresses in ldmatrix: K (B of S = Q·Kᵀ, rows n) and V (B of P·V,
    // rows k), both in perm16 order.
    const int krow = perm16((lane >> 4) * 8 + (lane & 7)), vrow = perm16(((lane >> 3) & 1) * 8 + (lane & 7));

    const RowCopy<T, BN, D, Tr::kThreads> kv_copy(gk, gv, ld, d, p.vec16);
    auto stage_kv = [&](int nb, int st) {
        T *kv = sKV0 + st * 2 * BN * LDS;
        kv_copy.copy(kv, kv + BN * LDS, nb * BN, q_rows);
    };
    RowCopy<T, BM, D, Tr::kThreads>(gq, gq, ld, d, p.vec16).copy(sQ, nullptr, q0, q_rows);
    if (n_blocks > 0) stage_kv(0, 0);
    cp_async_commit();

    uint32_t qf[KD][4];
    float o[DT][4];
    zero(o);

    for (int nb = 0; nb < n_blocks; ++nb) {
        const int k0 = nb * BN, st = nb & 1;
        cp_async_wait<0>();
        __syncthreads();  // this tile visible; every warp is done with the other stage
        if (nb == 0) {
#pragma unroll
            for (int kk = 0; kk < KD; ++kk)
                ldsm_x4(qf[kk], smem_addr(sQ + (wrow + (lane & 15)) * LDS + kk * 16 + (lane >> 4) * 8));
        }
        if (nb + 1 < n_blocks) stage_kv(nb + 1, st ^ 1);
        cp_async_commit();
        const T *sK = sKV0 + st * 2 * BN * LDS, *sV = sK + BN * LDS;

        // S = Q·Kᵀ (columns in perm16 order).
        float s[NT][4];
        zero(s);
#pragma unroll
        for (int kk = 0; kk < KD; ++kk)
#pragma unroll
            for (int G = 0; G < NG; ++G) {
                uint32_t bf[4];
                ldsm_x4(bf, smem_addr(sK + (G * 16 + krow) * LDS + kk * 16 + ((lane >> 3) & 1) * 8));
                mma<T>(s[2 * G], qf[kk], bf[0], bf[1]);
                mma<T>(s[2 * G + 1], qf[kk], bf[2], bf[3]);
            }

        fwd_tile(p, w, k0, s, o);

        // O += P̃·V (V rows in the same perm16 order as the columns of P̃).
        uint32_t a[NG][4];
        to_a<T, NT>(a, s);
#pragma unroll
        for (int G = 0; G < NG; ++G)
#pragma unroll
            for (int dp = 0; dp < DT / 2; ++dp) {
                uint32_t bf[4];
                ldsm_x4_t(bf, smem_addr(sV + (G * 16 + vrow) * LDS + dp * 16 + (lane >> 4) * 8));
                mma<T>(o[2 * dp], a[G], bf[0], bf[1]);
                mma<T>(o[2 * dp + 1], a[G], bf[2], bf[3]);
            }
    }
    cp_async_wait<0>();  // Q is still in flight when no key tile was visible

    fwd_store(p, w, static_cast<T *>(p.ctx) + seq_row0(p, b) * p.hidden + int64_t(h) * d, d, o);
}

// ================================ backward =======================================================

// D[bh, i] = Σ_c dctx[b, i, h, c]·ctx[b, i, h, c] and lse2[bh, i] = lse·log2(e) (+inf for −inf:
// P = exp2(x − lse2) is then 0); one thread per (token, head).
template <typename T>
__global__ void flash_rowdot_kernel(const Params p) {
    DST_GRID_DEPENDENCY();
    const int64_t total = int64_t(p.batch) * p.seq * p.heads;
    for (int64_t x = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; x < total; x += int64_t(gridDim.x) * blockDim.x) {
        const int h = int(x % p.heads);
        const int64_t tok = x / p.heads, b = tok / p.seq, i = tok % p.seq;
        const int64_t row = (b * p.heads + h) * p.seq + i;
        if (i >= seq_rows(p, int(b))) {  // packed: past the sequence, P = 0
            p.dsum[row] = 0.0f;
            p.lse2[row] = INFINITY;
            continue;
        }
        const int64_t at = (seq_row0(p, int(b)) + i) * p.hidden + int64_t(h) * p.head_dim;
        const T *go = static_cast<const T *>(p.dctx) + at;
        const T *oo = static_cast<const T *>(p.ctx_in) + at;
        float s = 0.0f;
        for (int c = 0; c < p.head_dim; ++c) s = fmaf(to_float(go[c]), to_float(oo[c]), s);
        p.dsum[row] = s;
        const float ls = p.lse[row];
        p.lse2[row] = ls == -INFINITY ? INFINITY : ls * kLog2e;
    }
}

// The same with 16-byte accesses: G = head_dim / 8 consecutive lanes per (token, head) row, each
// reading 8 elements of dctx and ctx, then a fixed xor-shuffle tree (deterministic). One thread
// per 8 elements, no grid-stride loop, so that every lane of a warp reaches the shuffles.
template <typename T, int G>
__global__ void flash_rowdot_vec_kernel(const Params p) {
    DST_GRID_DEPENDENCY();
    const int64_t total = int64_t(p.batch) * p.seq * p.heads * G;
    const int64_t x = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
    const bool active = x < total;
    const int64_t r = x / G;  // (token, head), head fastest
    const int c = int(x % G);
    const int h = int(r % p.heads);
    const int64_t tok = r / p.heads, b = tok / p.seq, i = tok % p.seq;
    const bool in_seq = active && i < seq_rows(p, int(b));  // packed: rows past the sequence get P = 0
    float s = 0.0f;
    if (in_seq) {
        const int64_t off = (seq_row0(p, int(b)) + i) * p.hidden + int64_t(h) * p.head_dim + c * 8;
        const uint4 gv = *reinterpret_cast<const uint4 *>(static_cast<const T *>(p.dctx) + off);
        const uint4 ov = *reinterpret_cast<const uint4 *>(static_cast<const T *>(p.ctx_in) + off);
        const T *g8 = reinterpret_cast<const T *>(&gv), *o8 = reinterpret_cast<const T *>(&ov);
#pragma unroll
        for (int k = 0; k < 8; ++k) s = fmaf(to_float(g8[k]), to_float(o8[k]), s);
    }
#pragma unroll
    for (int o = G / 2; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    if (active && c == 0) {
        const int64_t row = (b * p.heads + h) * p.seq + i;
        p.dsum[row] = in_seq ? s : 0.0f;
        const float ls = in_seq ? p.lse[row] : -INFINITY;
        p.lse2[row] = ls == -INFINITY ? INFINITY : ls * kLog2e;
    }
}

// The vector form's launch when the shapes allow it (head_dim / 8 a power of two up to 32, rows and
// pointers 16-byte aligned), its status in *err; false: nothing launched, the caller launches the scalar form.
template <typename T>
bool launch_rowdot_vec(const Params &p, cudaStream_t stream, cudaError_t *err) {
    const int g = p.head_dim / 8;
    const bool ok = p.head_dim % 8 == 0 && p.hidden % 8 == 0 && g >= 1 && g <= 32 && (g & (g - 1)) == 0 &&
                    reinterpret_cast<uintptr_t>(p.dctx) % 16 == 0 && reinterpret_cast<uintptr_t>(p.ctx_in) % 16 == 0;
    if (!ok) return false;
    const int64_t total = int64_t(p.batch) * p.seq * p.heads * g;
    const unsigned grid = static_cast<unsigned>((total + 255) / 256);
    cudaError_t e = cudaSuccess;
    switch (g) {
        case 1: e = launch_dependent(flash_rowdot_vec_kernel<T, 1>, grid, 256, 0, stream, p); break;
        case 2: e = launch_dependent(flash_rowdot_vec_kernel<T, 2>, grid, 256, 0, stream, p); break;
        case 4: e = launch_dependent(flash_rowdot_vec_kernel<T, 4>, grid, 256, 0, stream, p); break;
        case 8: e = launch_dependent(flash_rowdot_vec_kernel<T, 8>, grid, 256, 0, stream, p); break;
        case 16: e = launch_dependent(flash_rowdot_vec_kernel<T, 16>, grid, 256, 0, stream, p); break;
        default: e = launch_dependent(flash_rowdot_vec_kernel<T, 32>, grid, 256, 0, stream, p); break;
    }
    *err = e;
    return true;
}

// A warp's 16 keys k0 + wrow … in the backward (the mma.sync kernel below and the wgmma kernel of
// kernels/attention_flash_wgmma.cuh keep Sᵀ in this m16n8 layout): the lane's keys kj0 = k0 + wrow + 2g
// (accumulator elements 0, 1) and kj1 = kj0 + 1 (elements 2, 3), i.e. row r of the warp's 16 is key
// rho16(r); their additive mask over scale (−inf past the length), and the lane's Philox block.
struct BwdKeys {
    int kj0, kj1, t;
    bool key_edge;  // the mask or the length touches these keys (uniform per warp)
    float kbs[2];
    int hh;           // which half of its Philox block this lane holds
    uint32_t kgroup;  // the block's group within a query row
    uint64_t row_base;
    int rows;         // the sequence's rows (seq_rows)
};

DST_FDEV BwdKeys bwd_keys(const Params &p, int b, int bh, int k0, int wrow, int kv_len) {
    const int lane = threadIdx.x & 31, g = lane >> 2;
    BwdKeys k;
    k.t = lane & 3;
    k.kj0 = k0 + wrow + 2 * g;
    k.kj1 = k.kj0 + 1;
    const bool has_bias = p.key_bias != nullptr;
    const int S = p.seq;
    k.kbs[0] = k.kj0 >= kv_len ? -INFINITY : (has_bias ? p.key_bias[int64_t(b) * S + k.kj0] / p.scale : 0.0f);
    k.kbs[1] = k.kj1 >= kv_len ? -INFINITY : (has_bias ? p.key_bias[int64_t(b) * S + k.kj1] / p.scale : 0.0f);
    k.key_edge = has_bias || k0 + wrow + 16 > kv_len;
    k.hh = g & 1;
    k.kgroup = uint32_t((k0 + wrow) / 4 + (g >> 1));
    k.row_base = uint64_t(bh) * uint64_t(S);
    k.rows = seq_rows(p, b);
    return k;
}

// One query tile i0 … of the backward on Sᵀ = K·Qᵀ (s) and dP̃ᵀ = V·dctxᵀ (dp), NTQ column blocks of 8
// queries: the masks, then s ← P̃ᵀ/σ = P·keep and dp ← dSᵀ = P·(dP̃·keep·σ − D), with P = exp2(s·scale·log2 e
// − lse2); sL, sD: the tile's lse2 and D (shared memory). k0 + wrow: the warp's first key.
template <int NTQ>
DST_FDEV void bwd_tile(const Params &p, const BwdKeys &k, int k0, int wrow, int i0, const float *sL, const float *sD,
                       float (&s)[NTQ][4], float (&dp)[NTQ][4]) {
    const int t = k.t, S = p.seq;
    // Element (nt, e): key kj0 (e < 2) or kj1, query i0 + 8nt + 2t + e%2. Masks first, on the raw
    // scores (uniform conditions, so the common tile skips them): the additive mask and the keys
    // past the length through kbs, causal per element.
    if (k.key_edge) {
#pragma unroll
        for (int nt = 0; nt < NTQ; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e) s[nt][e] += k.kbs[e >> 1];
    }
    if (p.causal && k0 + wrow + 15 > i0) {
#pragma unroll
        for (int nt = 0; nt < NTQ; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e)
                if ((e < 2 ? k.kj0 : k.kj1) > i0 + nt * 8 + 2 * t + (e & 1)) s[nt][e] = -INFINITY;
    }
    // w: the keep words of the elements.
    auto grad = [&](int nt, const uint32_t (&w)[4]) {
        const float2 lq = *reinterpret_cast<const float2 *>(sL + nt * 8 + 2 * t);
        const float2 dd = *reinterpret_cast<const float2 *>(sD + nt * 8 + 2 * t);
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const float pr = fast_exp2(fmaf(s[nt][e], p.scale_log2, (e & 1) ? -lq.y : -lq.x));
            const bool kept = w[e] >= p.threshold;
            dp[nt][e] = pr * fmaf(kept ? dp[nt][e] : 0.0f, p.drop_scale, (e & 1) ? -dd.y : -dd.x);  // dSᵀ
            s[nt][e] = kept ? pr : 0.0f;                                                          // P̃ᵀ/σ
        }
    };
    const uint32_t r0c = p.dropout ? philox_r0c(p) : 0u;
    if (p.dropout && p.aligned4) {
        // This lane draws the block of query 2t + hh (its keys are words 2hh, 2hh + 1) and
        // trades the other two words with lane ^ 4, which holds the block's other keys. With grp32
        // the groups of a lane's queries i0 + 8nt + 2t + hh are 2S apart: M0·group by additions.
        const int hh = k.hh;
        const uint64_t g0 = (k.row_base + uint64_t(i0 + 2 * t + hh)) * uint64_t(S / 4) + k.kgroup;
        auto each = [&](auto &&words) {  // words(nt): the Philox words of this lane's group nt
#pragma unroll
            for (int nt = 0; nt < NTQ; ++nt) {
                const uint4 r = words(nt);
                const uint32_t mine0 = hh ? r.z : r.x, mine1 = hh ? r.w : r.y;
                const uint32_t got0 = __shfl_xor_sync(0xffffffffu, hh ? r.x : r.z, 4);
                const uint32_t got1 = __shfl_xor_sync(0xffffffffu, hh ? r.y : r.w, 4);
                // element e = 2x + y is key 2g + x, query 2t + y; the own block is y == hh.
                const uint32_t w[4] = {hh ? got0 : mine0, hh ? mine0 : got0, hh ? got1 : mine1, hh ? mine1 : got1};
                grad(nt, w);
            }
        };
        if (p.grp32) {
            const uint64_t mstep = uint64_t(kPhiloxM0) * uint32_t(2 * S);
            uint64_t m0 = uint64_t(kPhiloxM0) * uint32_t(g0);
#if defined(DST_LAB_DROP_BITS)
            uint4 wd = make_uint4(0u, 0u, 0u, 0u);
            each([&](int nt) {
                if (nt % kLabDropSlots == 0) {
                    wd = philox_group_m0(p, r0c, m0);
                    m0 += mstep;
                }
                return lab_drop_slot(wd, nt % kLabDropSlots);
            });
#else
            each([&](int) {
                const uint4 r = philox_group_m0(p, r0c, m0);
                m0 += mstep;
                return r;
            });
#endif
        } else {
            each([&](int nt) { return philox_group(p, r0c, g0 + uint64_t(nt) * uint64_t(2 * S)); });
        }
    } else if (p.dropout) {
#pragma unroll
        for (int nt = 0; nt < NTQ; ++nt) {
            const uint64_t e00 = (k.row_base + uint64_t(i0 + nt * 8 + 2 * t)) * uint64_t(S) + uint64_t(k.kj0);
            const uint32_t w[4] = {philox_word(p, r0c, e00), philox_word(p, r0c, e00 + uint64_t(S)),
                                   philox_word(p, r0c, e00 + 1), philox_word(p, r0c, e00 + uint64_t(S) + 1)};
            grad(nt, w);
        }
    } else {
        const uint32_t w[4] = {0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu};
#pragma unroll
        for (int nt = 0; nt < NTQ; ++nt) grad(nt, w);
    }
}

// The row statistics of query tile i0 … i0 + BM − 1 into st2 ([lse2 | D], BM each; cp.async), by threads
// threadIdx.x < NT; rows past the sequence get lse2 = +inf and D = 0 (P = 0 there).
template <int BM, int NT>
DST_FDEV void bwd_stage_stats(float *st2, const float *lse2, const float *dsum, int i0, int q_rows) {
    for (int r = threadIdx.x; r < BM; r += NT) {
        const int i = i0 + r;
        if (i < q_rows) {
            cp_async4(smem_addr(st2 + r), lse2 + i);
            cp_async4(smem_addr(st2 + BM + r), dsum + i);
        } else {
            st2[r] = INFINITY;
            st2[BM + r] = 0.0f;
        }
    }
}

// The partial dQ of a tile by mma.sync: dqp = this warp's rows 16·wm …, columns wn·DQT·8 … of dS·K,
// with dSᵀ in sS ([BN][LDSS], key order) and K in sK ([BN][LDS]), a reduction over the BN keys.
template <typename T, int BN, int DQT, int LDS, int LDSS>
DST_FDEV void bwd_dq_product(float (&dqp)[1][DQT][4], const T *sS, const T *sK, int lane, int wm, int wn) {
    zero(dqp[0]);
#pragma unroll
    for (int kk = 0; kk < BN / 16; ++kk) {
        uint32_t af[1][1][4];
        ldsm_x4_t(af[0][0],
                  smem_addr(sS + (kk * 16 + (lane >> 4) * 8 + (lane & 7)) * LDSS + wm * 16 + ((lane >> 3) & 1) * 8));
        mma_rb<T, 1, DQT, 16, LDS>(dqp, af, sK, kk * 16, wn * DQT * 8);
    }
}

// A counter release a block owes after its deterministic dQ add (bwd_dq_add): thread 0 publishes it
// (dq_publish) after the block's next barrier, so that the red.global adds of every thread come
// before it (bar.sync, then one gpu-scope release: the pattern of cooperative groups' grid barrier)
// and have had the next step's products to drain. cnt == nullptr: nothing owed.
struct DqOwed {
    int *cnt = nullptr;
    int value = 0;
};
// Thread 0 releases what the block owes. Call it after a __syncthreads that follows the adds.
DST_FDEV void dq_publish(DqOwed &owed) {
    if (owed.cnt && threadIdx.x == 0) st_release(owed.cnt, owed.value);
    owed.cnt = nullptr;
}

// A key block's place in the deterministic dQ order of query tile mb (see bwd_dq_add; nq: the query
// tiles, p.q_tiles): the tile's counter, this block's rank among the key blocks 0 … jmax that add into it (ascending key blocks,
// or the order of the steps at which they visit the tile), and whether it is the first or the last.
struct DqTurn {
    int *cnt;
    int rank;
    bool first, last;
};
DST_FDEV DqTurn dq_turn(const Params &p, int bh, int jb, int mb, int nk, int nq, int BM, int BN) {
    const int jmax = p.causal ? min(nk - 1, ((mb + 1) * BM - 1) / BN) : nk - 1;
    const int rank = !p.dq_order ? jb
                     : p.causal  ? jmax - jb
                     : jb <= mb  ? max(0, min(mb, nk - 1) - jb)
                                 : min(mb + 1, nk) + (nk - 1 - jb);
    return {p.counters + int64_t(bh) * nq + mb, rank, rank == 0, rank == jmax};
}

// Adds a block's partial dQ of query tile mb (dqp: this warp's rows 16·wm …, columns wn·DQT·8 … of the
// BM × D tile) into the tile's accumulator (see the header).
//   deterministic: the key blocks 0 … jmax add into tile mb in a fixed order; this block's (jb, BN keys)
//     rank among them is ascending key blocks, or the order of the steps at which they visit the tile
//     (causal: descending key blocks; otherwise by distance (mb − jb) mod nq). The block waits for its
//     turn, adds (the first stores), and the last writes dQ; the others leave the turn's release in
//     `owed` for dq_publish.
//   stochastic: every block adds in arrival order (the accumulator starts at zero) and bwd_dq_convert
//     writes dQ after the kernel.
// gdq: dQ of this (batch, head), row stride ld; q_rows: the sequence's rows (seq_rows; dQ is written
// below it). Every thread of the block calls it.
template <typename T, int D, int DQT>
DST_FDEV void bwd_dq_add(const Params &p, const float (&dqp)[1][DQT][4], int bh, int jb, int BN, int mb, int BM,
                         int nk, int wm, int wn, T *gdq, int64_t ld, int q_rows, DqOwed &owed) {
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3, S = p.seq, d = p.head_dim, nq = p.q_tiles;
    const int i0 = mb * BM;
    const uint64_t row_base = uint64_t(bh) * uint64_t(S);
    float *acc = p.dq_accum + (row_base + uint64_t(i0 + wm * 16)) * uint64_t(D) + wn * DQT * 8;
    const int rows_left = q_rows - (i0 + wm * 16), dlim = d - wn * DQT * 8;  // rows of the sequence only
    // f(r, dt, accumulator pair, output row, column, the pair's two values) over this lane's pairs.
    T *gout = gdq + int64_t(i0 + wm * 16) * ld + wn * DQT * 8;
    auto each = [&](auto &&f) {
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            const int il = g + 8 * r;
            if (il >= rows_left) continue;
#pragma unroll
            for (int dt = 0; dt < DQT; ++dt)
                f(r, dt, acc + int64_t(il) * D + dt * 8 + 2 * t, gout + int64_t(il) * ld, dt * 8 + 2 * t,
                  dqp[0][dt][2 * r], dqp[0][dt][2 * r + 1]);
        }
    };
    if (!p.deterministic) {
        each([](int, int, float *pa, T *, int, float v0, float v1) { red_add2(pa, v0, v1); });
        return;
    }
    const DqTurn turn = dq_turn(p, bh, jb, mb, nk, nq, BM, BN);
    const bool first = turn.first, last = turn.last;
    if (!first) {
        if (threadIdx.x == 0) wait_turn(turn.cnt, turn.rank);
        __syncthreads();
    }
    if (first && last) {
        each([&](int, int, float *, T *row, int c, float v0, float v1) { store2(row, c, dlim, v0 * p.scale, v1 * p.scale); });
    } else if (last) {  // the previous sum + own: every load first, then the stores (one L2 round trip)
        float2 prev[2][DQT];
        each([&](int r, int dt, float *pa, T *, int, float, float) { prev[r][dt] = __ldcg(reinterpret_cast<const float2 *>(pa)); });
        each([&](int r, int dt, float *, T *row, int c, float v0, float v1) {
            store2(row, c, dlim, (prev[r][dt].x + v0) * p.scale, (prev[r][dt].y + v1) * p.scale);
        });
    } else if (first) {
        each([](int, int, float *pa, T *, int, float v0, float v1) { __stcg(reinterpret_cast<float2 *>(pa), make_float2(v0, v1)); });
    } else {
        each([](int, int, float *pa, T *, int, float v0, float v1) { red_add2(pa, v0, v1); });
    }
    if (!last) owed = DqOwed{turn.cnt, turn.rank + 1};
}

// Stochastic mode's dQ after the backward kernel: dQ = scale · accumulator, rows of the sequences only.
// One thread per 4 columns of a (batch, head, query) row.
template <typename T, int D>
__global__ void flash_dq_convert_kernel(const Params p) {
    DST_GRID_DEPENDENCY();
    constexpr int C4 = D / 4;
    const int64_t total = int64_t(p.batch) * p.heads * p.seq * C4;
    const int64_t ld = 3 * int64_t(p.hidden);
    for (int64_t x = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; x < total; x += int64_t(gridDim.x) * blockDim.x) {
        const int c = int(x % C4) * 4;
        const int64_t row = x / C4;  // (b·heads + h)·S + i
        const int i = int(row % p.seq), bh = int(row / p.seq), b = bh / p.heads, h = bh % p.heads;
        if (i >= seq_rows(p, b) || c >= p.head_dim) continue;
        const float4 v = __ldcg(reinterpret_cast<const float4 *>(p.dq_accum + row * D + c));
        T *out = static_cast<T *>(p.dqkv) + (seq_row0(p, b) + i) * ld + int64_t(h) * p.head_dim;
        store2(out, c, p.head_dim, v.x * p.scale, v.y * p.scale);
        store2(out, c + 2, p.head_dim, v.z * p.scale, v.w * p.scale);
    }
}

// After a stochastic backward kernel (nothing to do in deterministic mode).
template <typename T, int D>
cudaError_t bwd_dq_convert(const Params &p, cudaStream_t stream) {
    if (p.deterministic) return cudaSuccess;
    const int64_t total = int64_t(p.batch) * p.heads * p.seq * (D / 4);
    const int64_t blocks = (total + 255) / 256;
    const unsigned grid = static_cast<unsigned>(blocks < 65536 ? blocks : 65536);
    return launch_dependent(flash_dq_convert_kernel<T, D>, grid, 256, 0, stream, p);
}

// The backward's end: dK = scale·Σ dSᵀ·Q and dV = σ·Σ (P̃ᵀ/σ)·dctx of the lane's keys kj0 (elements 0, 1)
// and kj1 (2, 3) of the sequence, into dqkv's K and V columns (gdq: the head's Q column of row 0).
template <typename T, int DT>
DST_FDEV void bwd_store_kv(const Params &p, const BwdKeys &k, T *gdq, int64_t ld, const float (&dk)[DT][4],
                           const float (&dv)[DT][4]) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        const int j = r ? k.kj1 : k.kj0;
        if (j >= k.rows) continue;
        T *row = gdq + int64_t(j) * ld + p.hidden;
#pragma unroll
        for (int dt = 0; dt < DT; ++dt) {
            store2(row, dt * 8 + 2 * k.t, p.head_dim, dk[dt][2 * r] * p.scale, dk[dt][2 * r + 1] * p.scale);
            store2(row + p.hidden, dt * 8 + 2 * k.t, p.head_dim, dv[dt][2 * r] * p.drop_scale,
                   dv[dt][2 * r + 1] * p.drop_scale);
        }
    }
}

// 16·NW keys per block (a warp per 16), BM queries per step. The dQ product of a step splits the
// [BM][D] tile over the warps as WM (rows of 16) × WN (column blocks of kDqT n8 tiles).
template <typename T, int D, int BM, int NW>
struct BwdTraits {
    static constexpr int kBN = 16 * NW, kThreads = NW * 32, kLds = D + 8, kLdsS = BM + 8;
    static constexpr int kWM = BM / 16, kWN = NW / kWM, kDqT = D / 8 / kWN;
    static constexpr size_t kSmem = size_t(2 * kBN + 4 * BM) * kLds * sizeof(T)  // K, V, 2 × [Q | dctx]
                                    + size_t(4 * BM) * sizeof(float)                // 2 × [lse2 | D]
                                    + size_t(kBN) * kLdsS * sizeof(T)               // dSᵀ [key][query]
                                    + 16;                                           // the ticket
    static_assert(BM % 16 == 0 && BM <= kBN && D % 16 == 0 && NW % kWM == 0 && (D / 8) % kWN == 0 && kDqT % 2 == 0,
                  "tile shape");
};

template <typename T, int D, int BM, int NW, int MB>
__global__ void __launch_bounds__(NW * 32, MB) flash_bwd_kernel(const Params p) {
    DST_GRID_DEPENDENCY();
    using Tr = BwdTraits<T, D, BM, NW>;
    constexpr int BN = Tr::kBN, NTQ = BM / 8, KD = D / 16, DT = D / 8, LDS = Tr::kLds, LDSS = Tr::kLdsS;
    constexpr int DQT = Tr::kDqT;
    extern __shared__ __align__(16) unsigned char smem_raw[];
    T *sK = reinterpret_cast<T *>(smem_raw), *sV = sK + BN * LDS;
    T *sQ0 = sV + BN * LDS;                                          // 2 stages of [Q | dctx], BM rows each
    float *sStat = reinterpret_cast<float *>(sQ0 + 4 * BM * LDS);   // 2 stages of [lse2 | D]
    T *sS = reinterpret_cast<T *>(sStat + 4 * BM);                   // dSᵀ [BN][BM + 8]
    int *sTicket = reinterpret_cast<int *>(sS + BN * LDSS);

    // The work item: the ticket order is the dQ order (key blocks of a (batch, head) ascending).
    int *ticket = p.counters + int64_t(p.batch) * p.heads * p.q_tiles;
    if (threadIdx.x == 0) *sTicket = atomicAdd(ticket, 1);
    __syncthreads();
    const int item = *sTicket;
    const int jb = item % p.m_blocks, bh = item / p.m_blocks;
    const int b = bh / p.heads, h = bh % p.heads, S = p.seq, d = p.head_dim;
    const int k0 = jb * BN, q_rows = seq_rows(p, b);
    const int64_t ld = 3 * int64_t(p.hidden), row0 = seq_row0(p, b);
    const T *gq = static_cast<const T *>(p.qkv) + row0 * ld + int64_t(h) * d;
    const T *gk = gq + p.hidden, *gv = gq + 2 * p.hidden;
    const T *gdo = static_cast<const T *>(p.dctx) + row0 * p.hidden + int64_t(h) * d;
    T *gdq = static_cast<T *>(p.dqkv) + row0 * ld + int64_t(h) * d;
    const int kv_len = key_limit(p, b);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    const int wrow = warp * 16;
    const uint64_t row_base = uint64_t(bh) * uint64_t(S);

    if (k0 >= kv_len) {  // keys past the length: zero dK and dV (and, with no key at all, dQ)
        for (int x = threadIdx.x; x < BN * d; x += Tr::kThreads) {
            const int j = k0 + x / d, c = x % d;
            if (j < q_rows) gdq[int64_t(j) * ld + p.hidden + c] = gdq[int64_t(j) * ld + 2 * p.hidden + c] = from_float<T>(0.0f);
        }
        if (jb == 0)
            for (int64_t x = threadIdx.x; x < int64_t(q_rows) * d; x += Tr::kThreads)
                gdq[(x / d) * ld + x % d] = from_float<T>(0.0f);
        return;
    }
    const int nk = (kv_len + BN - 1) / BN;  // key blocks that add into each query tile (non-causal)
    // The query tiles this block visits, in order (bwd_tile_at).
    const int nq = bwd_q_tiles(p, q_rows, BM), m_first = p.causal ? k0 / BM : 0, n_steps = nq - m_first;
    auto tile_at = [&](int step) { return bwd_tile_at(p, m_first, jb, nq, step); };
    const float *lse2 = p.lse2 + row_base, *dsum = p.dsum + row_base;

    const RowCopy<T, BM, D, Tr::kThreads> q_copy(gq, gq, ld, d, p.vec16), do_copy(gdo, gdo, p.hidden, d, p.vec16);
    auto stage = [&](int mb, int st) {  // Q, dctx and the row statistics of query tile mb
        T *q = sQ0 + st * 2 * BM * LDS;
        q_copy.copy(q, nullptr, mb * BM, q_rows);
        do_copy.copy(q + BM * LDS, nullptr, mb * BM, q_rows);
        bwd_stage_stats<BM, Tr::kThreads>(sStat + st * 2 * BM, lse2, dsum, mb * BM, q_rows);
    };
    RowCopy<T, BN, D, Tr::kThreads>(gk, gv, ld, d, p.vec16).copy(sK, sV, k0, q_rows);
    stage(tile_at(0), 0);
    cp_async_commit();

    const BwdKeys keys = bwd_keys(p, b, bh, k0, wrow, kv_len);
    const int arow = wrow + rho16(lane & 15);  // K and V rows this lane addresses as A operands

    float dk[1][DT][4], dv[1][DT][4];
    zero(dk[0]);
    zero(dv[0]);
    // K and V A fragments of this warp's keys, kept in registers when the head is narrow (wide heads
    // reload them from shared memory each step: registers go to the dK and dV accumulators).
    constexpr bool kCacheKV = D <= 64;
    uint32_t kf[kCacheKV ? KD : 1][4], vf[kCacheKV ? KD : 1][4];
    const int wm = warp % Tr::kWM, wn = warp / Tr::kWM;  // this warp's [16][DQT·8] block of the dQ tile

    DqOwed owed;
    for (int step = 0; step < n_steps; ++step) {
        const int mb = tile_at(step), st = step & 1, i0 = mb * BM;
        cp_async_wait<0>();
        __syncthreads();  // this stage visible; the other stage and sS are free; the last step's dQ adds done
        dq_publish(owed);
        if (kCacheKV && step == 0) {
#pragma unroll
            for (int kk = 0; kk < (kCacheKV ? KD : 1); ++kk) {
                ldsm_x4(kf[kk], smem_addr(sK + arow * LDS + kk * 16 + (lane >> 4) * 8));
                ldsm_x4(vf[kk], smem_addr(sV + arow * LDS + kk * 16 + (lane >> 4) * 8));
            }
        }
        if (step + 1 < n_steps) stage(tile_at(step + 1), st ^ 1);
        cp_async_commit();
        const T *sQ = sQ0 + st * 2 * BM * LDS, *sdO = sQ + BM * LDS;
        const float *sL = sStat + st * 2 * BM, *sD = sL + BM;

        // Sᵀ = K·Qᵀ and dP̃ᵀ = V·dctxᵀ (rows: this warp's keys in rho16 order; columns: queries).
        float s[NTQ][4], dp[NTQ][4];
        zero(s);
        zero(dp);
#pragma unroll
        for (int kk = 0; kk < KD; ++kk) {
            uint32_t ka[4], va[4];
            if constexpr (kCacheKV) {
#pragma unroll
                for (int x = 0; x < 4; ++x) ka[x] = kf[kk][x], va[x] = vf[kk][x];
            } else {
                ldsm_x4(ka, smem_addr(sK + arow * LDS + kk * 16 + (lane >> 4) * 8));
                ldsm_x4(va, smem_addr(sV + arow * LDS + kk * 16 + (lane >> 4) * 8));
            }
#pragma unroll
            for (int np = 0; np < NTQ / 2; ++np) {
                const int brow = np * 16 + (lane >> 4) * 8 + (lane & 7), bcol = kk * 16 + ((lane >> 3) & 1) * 8;
                uint32_t bq[4], bo[4];
                ldsm_x4(bq, smem_addr(sQ + brow * LDS + bcol));
                ldsm_x4(bo, smem_addr(sdO + brow * LDS + bcol));
                mma<T>(s[2 * np], ka, bq[0], bq[1]);
                mma<T>(s[2 * np + 1], ka, bq[2], bq[3]);
                mma<T>(dp[2 * np], va, bo[0], bo[1]);
                mma<T>(dp[2 * np + 1], va, bo[2], bo[3]);
            }
        }

        bwd_tile(p, keys, k0, wrow, i0, sL, sD, s, dp);

        // dV·(1/σ) += (P̃ᵀ/σ)·dctx, dK += dSᵀ·Q; dSᵀ to shared memory for the dQ product.
        uint32_t a[1][NTQ / 2][4];
        to_a<T, NTQ>(a[0], s);
        mma_rb<T, 1, DT, BM, LDS>(dv, a, sdO, 0);
        to_a<T, NTQ>(a[0], dp);
        mma_rb<T, 1, DT, BM, LDS>(dk, a, sQ, 0);
#pragma unroll
        for (int kk = 0; kk < NTQ / 2; ++kk) {
            T *r0 = sS + (wrow + 2 * g) * LDSS + kk * 16 + 2 * t, *r1 = r0 + LDSS;
            *reinterpret_cast<uint32_t *>(r0) = a[0][kk][0];
            *reinterpret_cast<uint32_t *>(r1) = a[0][kk][1];
            *reinterpret_cast<uint32_t *>(r0 + 8) = a[0][kk][2];
            *reinterpret_cast<uint32_t *>(r1 + 8) = a[0][kk][3];
        }
        __syncthreads();  // dSᵀ of every warp visible

        // Partial dQ of the tile: rows 16·wm …, columns wn·DQT·8 … of dS·K (reduction over BN keys).
        float dqp[1][DQT][4];
        bwd_dq_product<T, BN, DQT, LDS, LDSS>(dqp, sS, sK, lane, wm, wn);

        bwd_dq_add<T, D, DQT>(p, dqp, bh, jb, BN, mb, BM, nk, wm, wn, gdq, ld, q_rows, owed);
    }
    if (owed.cnt) {  // uniform: every thread holds the same
        __syncthreads();
        dq_publish(owed);
    }

    bwd_store_kv(p, keys, gdq, ld, dk[0], dv[0]);
}

// ================================ tile shapes and launches ======================================

// Tile shapes per padded head dim D, in one place: forward 16·kFwdNW queries × kFwdBN keys;
// backward 16·kBwdNW keys per block × kBwdBM queries per step; kFwdMB/kBwdMB are the blocks per
// SM the register budget is capped for (__launch_bounds__). Chosen in the lab
// (kernels/dev/attention_lab.cu; H200, fp16, d = 64, 8×2048, dropout 0.1, 2026-12-01): forward f1
// 1.084 ms (f2–f5 1.110–1.180), backward b4 2.992 ms deterministic (b1 3.232, b2–b5 3.97–4.43).
// Wide heads keep smaller backward blocks: their dK and dV accumulators double.
template <int D>
struct Tiles {
    static constexpr int kFwdBN = 64, kFwdNW = 4, kFwdMB = D <= 64 ? 4 : 2;
    static constexpr int kBwdBM = D <= 64 ? 64 : 32, kBwdNW = D <= 64 ? 8 : 4, kBwdMB = D <= 64 ? 1 : 2;
};

// A block needing more than the default 48 KB of shared memory must say so first.
template <typename K>
cudaError_t allow_smem(K kernel, size_t bytes) {
    if (bytes <= 48 * 1024) return cudaSuccess;
    return cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes));
}

inline int64_t tiles_of(int64_t n, int tile) { return (n + tile - 1) / tile; }

template <typename T, int D, int BN, int NW, int MB>
cudaError_t launch_fwd(Params p, cudaStream_t stream) {
    using Tr = FwdTraits<T, D, BN, NW>;
    p.m_blocks = static_cast<int>(tiles_of(p.seq, Tr::kBM));
    const auto kernel = flash_fwd_kernel<T, D, BN, NW, MB>;
    cudaError_t e = allow_smem(kernel, Tr::kSmem);
    if (e != cudaSuccess) return e;
    return launch_dependent(kernel, static_cast<unsigned>(p.m_blocks * int64_t(p.batch) * p.heads), Tr::kThreads,
                            Tr::kSmem, stream, p);
}

// Sets p.dq_order for a backward kernel from `order` (1 the step order, 0 ascending key blocks, −1 the
// step order when it is safe). The step order makes the blocks of one (batch, head) wait on each other
// in a cycle, so it needs all of them resident at once; otherwise the ascending order, which only
// waits on blocks that started earlier.
template <typename K>
cudaError_t resolve_dq_order(K kernel, int threads, size_t smem, Params &p, int order) {
    if (order < 0) {
        int per_sm = 0, sms = 0, dev = 0;
        cudaError_t e = cudaGetDevice(&dev);
        if (e == cudaSuccess) e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
        if (e == cudaSuccess) e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, smem);
        if (e != cudaSuccess) return e;
        order = int64_t(p.m_blocks) <= int64_t(per_sm) * sms;
    }
    p.dq_order = order != 0;
    return cudaSuccess;
}

// The backward's per-tile counters and ticket (p.counters) must be zero, and in stochastic mode
// the dQ accumulator too (bwd_prologue does both); in stochastic mode bwd_dq_convert runs after it. order: the deterministic dQ order, 1 the step
// order, 0 ascending key blocks, −1 (production) the step order when every block of a (batch,
// head) can be resident at once.
template <typename T, int D, int BM, int NW, int MB>
cudaError_t launch_bwd(Params p, cudaStream_t stream, int order = -1) {
    using Tr = BwdTraits<T, D, BM, NW>;
    p.m_blocks = static_cast<int>(tiles_of(p.seq, Tr::kBN));
    p.q_tiles = static_cast<int>(tiles_of(p.seq, BM));
    const auto kernel = flash_bwd_kernel<T, D, BM, NW, MB>;
    cudaError_t e = allow_smem(kernel, Tr::kSmem);
    if (e == cudaSuccess) e = resolve_dq_order(kernel, Tr::kThreads, Tr::kSmem, p, order);
    if (e != cudaSuccess) return e;
    e = launch_dependent(kernel, static_cast<unsigned>(p.m_blocks * int64_t(p.batch) * p.heads), Tr::kThreads,
                         Tr::kSmem, stream, p);
    return e != cudaSuccess ? e : bwd_dq_convert<T, D>(p, stream);
}

// The backward's scratch, in order: D and lse2 ([B, heads, S] floats each), the dQ accumulator
// ([B, heads, S, padded head_dim] floats), the counters (ints). Offsets in bytes.
struct BwdScratch {
    size_t dsum, lse2, dq, counters, total;
    explicit BwdScratch(const AttentionArgs &a) {
        auto align256 = [](size_t v) { return (v + 255) / 256 * 256; };
        const size_t rows = size_t(a.batch) * size_t(a.heads) * size_t(a.seq);
        const size_t n_counters = size_t(a.batch * a.heads * tiles_of(a.seq, 16) + 1);  // tiles ≥ 16 rows, ticket
        dsum = 0;
        lse2 = align256(rows * sizeof(float));
        dq = lse2 + align256(rows * sizeof(float));
        counters = dq + align256(rows * size_t(padded_head_dim(a.head_dim)) * sizeof(float));
        total = counters + align256(n_counters * sizeof(int));
    }
    // Points the backward's scratch pointers of p into `workspace` (16-byte aligned).
    void bind(Params &p, void *workspace) const {
        char *base = static_cast<char *>(workspace);
        p.dsum = reinterpret_cast<float *>(base + dsum);
        p.lse2 = reinterpret_cast<float *>(base + lse2);
        p.dq_accum = reinterpret_cast<float *>(base + dq);
        p.counters = reinterpret_cast<int *>(base + counters);
    }
};

// What every backward launch needs first: D and lse2, zeroed counters (and in stochastic mode a
// zeroed dQ accumulator). p has its pointers and scratch bound.
template <typename T>
cudaError_t bwd_prologue(const Params &p, const BwdScratch &ws, cudaStream_t stream) {
    const int64_t rows = int64_t(p.batch) * p.heads * p.seq;
    const unsigned grid = static_cast<unsigned>(rows / 256 + 1 < 65536 ? rows / 256 + 1 : 65536);
    cudaError_t e = cudaSuccess;
    if (!launch_rowdot_vec<T>(p, stream, &e)) e = launch_dependent(flash_rowdot_kernel<T>, grid, 256, 0, stream, p);
    if (e == cudaSuccess) e = cudaMemsetAsync(p.counters, 0, ws.total - ws.counters, stream);
    if (e == cudaSuccess && !p.deterministic) e = cudaMemsetAsync(p.dq_accum, 0, ws.counters - ws.dq, stream);
    return e;
}

// The production shapes, one function per kernel family and file (attention_flash_fwd.cu,
// attention_flash_bwd.cu); D is the padded head dim (32, 64, 96, 128).
cudaError_t fwd(const Params &p, bool bf16, int D, cudaStream_t stream);
cudaError_t bwd(const Params &p, bool bf16, int D, cudaStream_t stream);

#ifdef DST_WITH_SM90A
// The wgmma kernels (kernels/sm90/attention_flash_wgmma.cu, compiled for sm_90a only): head_dim 64,
// 16-byte rows; bwd_wgmma after bwd_prologue.
cudaError_t fwd_wgmma(const Params &p, bool bf16, cudaStream_t stream);
cudaError_t bwd_wgmma(const Params &p, bool bf16, cudaStream_t stream);

// Whether fwd_wgmma and bwd_wgmma run this call: a compute capability 9.0 device (the only one the
// sm_90a objects run on), head_dim 64 and 16-byte rows.
inline bool wgmma_runs(const Params &p) {
    return p.head_dim == 64 && p.vec16 && current_device_is_sm90();
}
#endif
// Warpgroups per block of the wgmma backward (64 keys each; kernels/sm90/attention_flash_wgmma.cu).
constexpr int kWgBwdWarpgroups = 2;

// Whether the forward and backward of this call (padded head dim D) run on the wgmma kernels: the one
// test flash::fwd, flash::bwd and bwd_key_block share.
inline bool wgmma_path(const Params &p, int D) {
#ifdef DST_WITH_SM90A
    return D == 64 && wgmma_runs(p);
#else
    (void)p, (void)D;
    return false;
#endif
}

// Keys per block of the backward kernel that runs this call (p with its final vec16). When S fits in
// one, every (batch, head) is one block: the deterministic dQ order waits for nobody and stores dQ
// directly, which stochastic mode then takes too (no zeroed accumulator, no conversion pass).
inline int bwd_key_block(const Params &p, int D) {
    if (wgmma_path(p, D)) return 64 * kWgBwdWarpgroups;
    return D <= 64 ? 16 * Tiles<64>::kBwdNW : 16 * Tiles<128>::kBwdNW;
}

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
#undef DST_FHD

}  // namespace flash
}  // namespace cuda
}  // namespace dst

#endif  // DST_KERNELS_ATTENTION_FLASH_IMPL_CUH
