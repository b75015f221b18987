// The flash attention forward on warpgroup MMAs (wgmma, sm_90a only), head dim 64, fp16/bf16, every
// mask and dropout mode of the mma.sync forward (flash_fwd_kernel in kernels/attention_flash_impl.cuh),
// with its results: the same softmax, dropout and store code on the same accumulator layout. The
// library runs it on compute capability 9.0 devices for head_dim 64 with 16-byte rows
// (kernels/sm90/attention_flash_wgmma.cu, built only when CMAKE_CUDA_ARCHITECTURES lists 90), and the
// backward below likewise; the lab (kernels/dev) times them as w1–w3, b6 and b8 next to the mma.sync
// versions.
//
// One warpgroup (4 warps, 128 threads) per block of 64 query rows; warp w owns rows 16w … 16w + 15,
// as in the mma.sync kernel. Per key tile of BN keys (double-buffered, cp.async):
//   S = Q·Kᵀ   wgmma m64nBNk16 × 4, A = Q and B = K from shared memory (K-major descriptors)
//   softmax, masks, dropout on the fp32 accumulators in registers (the mma.sync kernel's layout)
//   O += P̃·V   wgmma m64n64k16 × BN/16, A = P̃ from registers (the m16n8k16 A fragments), B = V from
//              shared memory, MN-major (imm-trans-b)
// Shared tiles are rows of 128 bytes (64 elements), 128-byte swizzled (16-byte chunk c of row r at
// chunk c ^ (r & 7)), 1024-byte aligned. K and V rows are stored in perm16 order (row 16G + n holds
// key 16G + perm16(n)), so that column n of S, and row n of the P̃·V product's K dimension, is the
// key the mma.sync kernel has there: a lane's four columns of a row are one Philox group.
// Measured in the lab (H200, fp16, 8×2048, 16 heads, dropout 0.1): w1 (BN 64, 3 blocks/SM) 0.896 ms
// against 1.080 for the mma.sync forward; BN 128 (w2, w3) gains nothing more (bench/RESULTS.md).
#ifndef DST_KERNELS_ATTENTION_FLASH_WGMMA_CUH
#define DST_KERNELS_ATTENTION_FLASH_WGMMA_CUH

#include "kernels/attention_flash_impl.cuh"
#include "kernels/wgmma_ops.cuh"

#define DST_WGA_DEV __device__ __forceinline__

namespace dst {
namespace cuda {
namespace flash {

template <int BN>
struct WgTraits {
    static constexpr int kBM = 64, kThreads = 128, kRow = 128;  // bytes per tile row (64 × 16 bit)
    static constexpr size_t kQ = size_t(kBM) * kRow, kTile = size_t(BN) * kRow;
    static constexpr size_t kSmem = 1024 + kQ + 4 * kTile;  // alignment slack, Q, two stages of K | V
    static_assert(BN % 64 == 0, "key tiles of 64 or 128");
};

// The registers per thread a block of `threads` threads (__launch_bounds__(threads, 1)) holds from its
// launch: the 64 K register file over its threads, in steps of 8 (ptxas gives a kernel that uses
// setmaxnreg this count). setmaxnreg moves registers only within that pool: a warpgroup's .inc waits
// until others' .dec have freed enough, forever if they never can, so every split is checked at
// compile time against it (a 384-thread block holds 168 × 384 = 64 512, not 65 536).
__host__ __device__ constexpr int launch_regs(int threads) { return (65536 / threads) & ~7; }

// Shared-memory mbarriers (the warp-specialised kernels).
__device__ __forceinline__ void mbar_init(uint32_t a, uint32_t n) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(a), "r"(n) : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint32_t a) {
    asm volatile("{\n .reg .b64 st;\n mbarrier.arrive.shared::cta.b64 st, [%0];\n}\n" ::"r"(a) : "memory");
}
__device__ __forceinline__ void mbar_expect(uint32_t a, uint32_t bytes) {
    asm volatile("{\n .reg .b64 st;\n mbarrier.arrive.expect_tx.shared::cta.b64 st, [%0], %1;\n}\n" ::"r"(a), "r"(bytes)
                 : "memory");
}
__device__ __forceinline__ void mbar_wait(uint32_t a, uint32_t parity) {
    asm volatile(
        "{\n .reg .pred P;\n WAIT:\n mbarrier.try_wait.parity.shared::cta.b64 P, [%0], %1;\n @!P bra WAIT;\n}\n" ::"r"(a),
        "r"(parity)
        : "memory");
}
// mbar_wait that traps after 2^28 failed tries (a broken protocol: seconds at the least) instead of
// hanging the caller, as wait_turn does. The writer-warpgroup backward's writer waits with it; its
// consumers wait only for the writer, which then either arrives or has trapped (in the consumers'
// code, at 240 registers, the counter costs 64 bytes of spills).
__device__ __forceinline__ void mbar_wait_bounded(uint32_t a, uint32_t parity) {
    for (uint32_t tries = 0;; ++tries) {
        uint32_t done;
        asm volatile(
            "{\n .reg .pred P;\n mbarrier.try_wait.parity.shared::cta.b64 P, [%1], %2;\n selp.u32 %0, 1, 0, P;\n}\n"
            : "=r"(done)
            : "r"(a), "r"(parity)
            : "memory");
        if (done) return;
        if (tries > (1u << 28)) __trap();
    }
}
// Bulk (TMA) reduction: `bytes` (a multiple of 16) of fp32 in shared memory at s added into global
// memory at g by the async proxy, in a bulk group of its own; bulk_wait_read waits until this
// thread's bulk groups have read their shared memory, bulk_wait until they are complete. A
// generic-proxy write to that shared memory needs wg::fence_proxy_async before a bulk operation of
// this thread reads it.
__device__ __forceinline__ void bulk_reduce_add_f32(float *g, uint32_t s, uint32_t bytes) {
    asm volatile(
        "cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;\n cp.async.bulk.commit_group;\n" ::"l"(g),
        "r"(s), "r"(bytes)
        : "memory");
}
__device__ __forceinline__ void bulk_wait_read() { asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory"); }
__device__ __forceinline__ void bulk_wait() { asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory"); }
// Inverse of perm16: the row n (0…15) of a 16-key group that holds key x.
DST_WGA_DEV int perm16_inv(int x) { return 8 * ((x >> 1) & 1) + 2 * (x >> 2) + (x & 1); }

// Byte offset of 16-byte chunk c of row r in a 128-byte-swizzled tile.
DST_WGA_DEV uint32_t sw128(int r, int c) { return uint32_t(r) * 128u + (uint32_t(c ^ (r & 7)) << 4); }

// EAGER2: an item of two key tiles (S ≤ 2·BN) issues both tiles' copies before its first product,
// the second in a copy group of its own, instead of the second during the first tile's products.
template <typename T, int BN, int MB, bool EAGER2 = false>
__global__ void __launch_bounds__(128, MB) flash_fwd_wgmma_kernel(const Params p) {
    DST_GRID_DEPENDENCY();
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
    using Tr = WgTraits<BN>;
    constexpr int BM = Tr::kBM, NT = BN / 8, NG = BN / 16, DT = 8;
    extern __shared__ __align__(16) unsigned char smem_raw[];
    const uint32_t base = (smem_addr(smem_raw) + 1023u) & ~1023u;
    const uint32_t sQ = base, sKV0 = base + uint32_t(Tr::kQ);  // stage st: K at sKV0 + 2·st·kTile, V after it

    const int m_block = blockIdx.x % p.m_blocks, bh = blockIdx.x / p.m_blocks;
    const int b = bh / p.heads, h = bh % p.heads;
    const int q0 = m_block * BM, q_rows = seq_rows(p, b);
    if (q0 >= q_rows) return;  // packed: a tile past the sequence
    const int64_t ld = 3 * int64_t(p.hidden);
    const T *gq = static_cast<const T *>(p.qkv) + seq_row0(p, b) * ld + int64_t(h) * 64;
    const T *gk = gq + p.hidden, *gv = gq + 2 * p.hidden;
    const int warp = threadIdx.x >> 5;
    FwdRows w = fwd_rows(p, b, bh, q0, warp * 16, threadIdx.x & 31);
    const int n_end = p.causal ? min(w.kv_len, q0 + BM) : w.kv_len;
    const int n_blocks = (n_end + BN - 1) / BN;

    // Copies: thread x owns 16-byte chunk x & 7 of rows x >> 3, (x >> 3) + 16, …; a key row jl of a
    // tile goes to shared row 16·(jl / 16) + perm16_inv(jl % 16), and since jl % 16 = x >> 3 for all
    // of this thread's rows, the row inside each 16-group (and the swizzle) is fixed per thread.
    const int cchunk = threadIdx.x & 7, crow = threadIdx.x >> 3;  // crow 0…15
    const int kv_row = perm16_inv(crow);
    auto stage_kv = [&](int nb, int st) {
        const uint32_t sk = sKV0 + uint32_t(2 * st) * uint32_t(Tr::kTile), sv = sk + uint32_t(Tr::kTile);
#pragma unroll
        for (int k = 0; k < BN / 16; ++k) {
            const int key = nb * BN + 16 * k + crow;
            const bool ok = key < q_rows;
            const int64_t off = ok ? int64_t(key) * ld + cchunk * 8 : 0;
            const uint32_t o = sw128(16 * k + kv_row, cchunk);
            cp_async16(sk + o, gk + off, ok ? 16 : 0);
            cp_async16(sv + o, gv + off, ok ? 16 : 0);
        }
    };
#pragma unroll
    for (int k = 0; k < BM / 16; ++k) {
        const int r = 16 * k + crow, q = q0 + r;
        const bool ok = q < q_rows;
        cp_async16(sQ + sw128(r, cchunk), gq + (ok ? int64_t(q) * ld + cchunk * 8 : 0), ok ? 16 : 0);
    }
    if (n_blocks > 0) stage_kv(0, 0);
    cp_async_commit();
    const bool both = EAGER2 && n_blocks == 2;
    if (both) {
        stage_kv(1, 1);
        cp_async_commit();
    }

    const uint64_t dq = wg::desc_sw128(sQ);

    float o[DT][4];
    zero(o);

    for (int nb = 0; nb < n_blocks; ++nb) {
        const int k0 = nb * BN, st = nb & 1;
        if (both && nb == 0)
            cp_async_wait<1>();
        else
            cp_async_wait<0>();
        wg::fence_proxy_async();  // this thread's cp.async writes, visible to the async proxy
        __syncthreads();          // everyone's; and every MMA of the other stage has completed
        if (!both && nb + 1 < n_blocks) stage_kv(nb + 1, st ^ 1);
        cp_async_commit();
        const uint32_t sk = sKV0 + uint32_t(2 * st) * uint32_t(Tr::kTile), sv = sk + uint32_t(Tr::kTile);
        const uint64_t dk = wg::desc_sw128(sk), dv = wg::desc_sw128(sv);

        // S = Q·Kᵀ: four k16 steps along the head dim (32 bytes each inside the 128-byte rows).
        float s[NT][4];
        wg::fence_regs(s);
        wg::wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < 4; ++kk) wg::wgmma_ss<T, BN>(s, dq + 2 * kk, dk + 2 * kk, kk > 0);
        wg::wgmma_commit();
        wg::wgmma_wait<0>();
        wg::fence_regs(s);

        fwd_tile(p, w, k0, s, o);

        // O += P̃·V: k16 step G covers keys (rows of V) 16G … 16G + 15, 2048 bytes apart.
        uint32_t a[NG][4];
        to_a<T, NT>(a, s);
        wg::fence_regs(o);
        wg::wgmma_fence();
#pragma unroll
        for (int G = 0; G < NG; ++G) wg::wgmma_rs_tb<T, 64>(o, a[G], dv + uint64_t(G) * (2048 >> 4), 1);
        wg::wgmma_commit();
        wg::wgmma_wait<0>();
        wg::fence_regs(o);
    }
    cp_async_wait<0>();

    fwd_store(p, w, static_cast<T *>(p.ctx) + seq_row0(p, b) * p.hidden + int64_t(h) * 64, 64, o);
#else
    (void)p;
    __trap();  // built for another target: the library launches it only from its sm_90a object, the lab only
               // with DST_LAB_SM90A
#endif
}

// The library's blocks per SM for the wgmma forward with key tiles of BN: 64 at 4 (the lab's w11: 128
// registers; w1's 3 at 168 registers gave the same bits, 7-12 % slower at S = 128), 128 at 2.
template <int BN>
constexpr int kFwdWgmmaBlocks = BN == 64 ? 4 : 2;

// Head dim 64 and 16-byte aligned rows only (else cudaErrorInvalidValue).
template <typename T, int BN, int MB, bool EAGER2 = false>
cudaError_t launch_fwd_wgmma(Params p, cudaStream_t stream) {
    using Tr = WgTraits<BN>;
    if (p.head_dim != 64 || !p.vec16) return cudaErrorInvalidValue;
    p.m_blocks = static_cast<int>(tiles_of(p.seq, Tr::kBM));
    const auto kernel = flash_fwd_wgmma_kernel<T, BN, MB, EAGER2>;
    cudaError_t e = allow_smem(kernel, Tr::kSmem);
    if (e != cudaSuccess) return e;
    return launch_dependent(kernel, static_cast<unsigned>(p.m_blocks * int64_t(p.batch) * p.heads), Tr::kThreads,
                            Tr::kSmem, stream, p);
}

// ================================ backward =======================================================
//
// The backward of flash_bwd_kernel (kernels/attention_flash_impl.cuh) with its four key-row products
// on warpgroup MMAs: a block of WGS warpgroups owns 64·WGS keys (warpgroup g keys 64g …, its warp w
// keys 64g + 16w …) and walks the query tiles of BM rows, the Q and dctx tiles shared by its
// warpgroups; per tile
//   Sᵀ = K·Qᵀ and dP̃ᵀ = V·dctxᵀ   wgmma m64nBMk16 × 4 each, A = K / V and B = Q / dctx from shared
//                                 memory (K-major)
//   P̃ᵀ, dSᵀ (bwd_tile)           the mma.sync kernel's code on the same accumulator layout
//   dV += P̃ᵀ·dctx, dK += dSᵀ·Q   wgmma m64n64k16 × BM/16 each, A from registers, B = dctx / Q
//                                 MN-major (imm-trans-b), issued together, then
//   dQ partial = dS·K             over the block's 64·WGS keys (DQM below): the library's kDqWgmma
//                                 on wgmma m64n(64/WGS)k16 per warpgroup, A = dSᵀ and B = K both
//                                 MN-major in shared memory; then bwd_dq_add (kDqWgmma) or, with
//                                 a writer warpgroup, its adds while the consumers go on (kDqWriter)
// Two warpgroups (b8) halve what the dQ reduction moves and waits for per key (one partial per 128
// keys, and at S ≤ 128 a (batch, head) is one block that stores dQ directly), at the same 8 warps
// per SM as two blocks of one (b6). The dQ product on wgmma (b11) took 5 % off b8 at 8×2048; what
// dQ still costs is its adds and their order (the lab's b8n), not the product. Handing the adds to
// a writer warpgroup (b14) took 9 % off b11 at 8×2048 and 14 % at 2×8192 with dropout (deterministic),
// but costs at S ≤ 512 and without dropout, where the library keeps b11 for the deterministic
// backward; in stochastic mode, its adds as bulk reductions, b14 is the faster from S = 512 on.
// K and V rows are stored in rho16 order within each 16 keys (row r holds key rho16(r)), so that the
// accumulator rows of lane g are keys 2g and 2g + 1, the layout bwd_tile and the Philox pairing assume.
// How the backward forms a tile's partial dQ: kDqMma, mma.sync over dSᵀ and a padded copy of K (b8);
// kDqWgmma, warpgroup MMAs with both operands MN-major in shared memory (dSᵀ written swizzled in the
// accumulator's rho16 row order, B the swizzled K tile itself; b11); kDqNone, no dQ at all (the
// lab's timing control b8n: b8's copies and shared memory without the product and its adds);
// kDqWriter, kDqWgmma with the adds made by a third warpgroup (b14; the library's from S = 1024 with
// dropout, and stochastic from S = 512, kernels/sm90/attention_flash_wgmma.cu): the consumers leave
// each partial in one of two shared buffers and go on, the writer waits for its turn and adds; same
// order, roles and arithmetic as bwd_dq_add.
// The lab's timing controls on b14 (their dQ is not the result): kDqWriterNoAdd (b14a, the writer
// makes no global adds) and kDqWriterNoMma (b14q, no dQ product: the writer adds zeros).
// kDqWriter3, kDqWriter4: b14 with three or four dQ buffers instead of two (the lab's b14b3, b14b4):
// the consumers may run that many steps ahead of the writer's turns.
enum : int {
    kDqNone = 0,
    kDqMma = 1,
    kDqWgmma = 2,
    kDqWriter = 3,
    kDqWriterNoAdd = 4,
    kDqWriterNoMma = 5,
    kDqWriter3 = 6,
    kDqWriter4 = 7
};

template <int BM, int WGS, int DQM = kDqMma>
struct WgBwdTraits {
    static constexpr int kBN = 64 * WGS, kThreads = 128 * WGS, kRow = 128, kLds = 64 + 8, kLdsS = BM + 8;
    static constexpr size_t kKV = size_t(kBN) * kRow, kQ = size_t(BM) * kRow;
    // Swizzled region (1024-byte aligned): K, V, two stages of [Q | dctx] (kDqWgmma, kDqWriter: then
    // dSᵀ [kBN][BM]); then (kDqNone, kDqMma) K padded, the row statistics (two stages of [lse2 | D]),
    // (kDqNone, kDqMma) dSᵀ padded, (kDqWriter) the dQ buffers and their mbarriers, and the ticket.
    static constexpr bool kPadded = DQM < kDqWgmma, kWriter = DQM >= kDqWriter;
    static constexpr int kBlockThreads = kThreads + (kWriter ? 128 : 0), kLdq = 64 + 8;
    static constexpr int kDqBufs = DQM == kDqWriter3 ? 3 : DQM == kDqWriter4 ? 4 : 2;
    static constexpr size_t kDs = kPadded ? 0 : size_t(kBN) * kRow;
    static constexpr size_t kSw = 2 * kKV + 4 * kQ + kDs;
    static constexpr size_t kKp = kPadded ? size_t(kBN) * kLds * 2 : 0, kSp = kPadded ? size_t(kBN) * kLdsS * 2 : 0;
    // kDqWriter: kDqBufs fp32 dQ buffers [BM][64 + 8] and their full/empty mbarriers.
    static constexpr size_t kDqb = kWriter ? kDqBufs * (size_t(BM) * kLdq * sizeof(float) + 16) : 0;
    static constexpr size_t kSmem = 1024 + kSw + kKp + size_t(4 * BM) * sizeof(float) + kSp + kDqb + 16;
    static_assert(BM == 64, "query tiles of 64 rows (the generated m64nBMk16 shapes)");
    static_assert(WGS == 1 || WGS == 2, "one or two warpgroups");
};

// Inverse of rho16: the row (0…15) of a 16-key group that holds key x.
DST_WGA_DEV int rho16_inv(int x) { return (x >> 1) + 8 * (x & 1); }

// A deterministic dQ add of four columns c … c + 3 (below lim) of one row, by the adder's role in the
// tile's order: the only one writes v·scale as dQ, the last adds the accumulator's sum and writes
// dQ, the first stores into the accumulator, a middle one adds into it (acc, out: the row's
// accumulator and dQ, at column 0).
template <typename T>
DST_WGA_DEV void dq_put4(bool first, bool last, float *acc, T *out, int c, int lim, float4 v, float sc) {
    if (first && last) {
        store2(out, c, lim, v.x * sc, v.y * sc);
        store2(out, c + 2, lim, v.z * sc, v.w * sc);
    } else if (last) {
        const float4 q = __ldcg(reinterpret_cast<const float4 *>(acc + c));
        store2(out, c, lim, (q.x + v.x) * sc, (q.y + v.y) * sc);
        store2(out, c + 2, lim, (q.z + v.z) * sc, (q.w + v.w) * sc);
    } else if (first) {
        __stcg(reinterpret_cast<float4 *>(acc + c), v);
    } else {
        red_add4(acc + c, v);
    }
}

// kDqWriter's writer warpgroup, thread wt of 128: adds the partial dQ of query tile mb, left by the
// consumers in buf ([BM = 64][ldq] fp32), into the tile's accumulator exactly as bwd_dq_add does (the
// same order, turns, first/last roles and arithmetic), then arrives on `empty` (buf may be
// rewritten). Thread wt owns row wt % 64, columns 32·(wt / 64) … + 31. The turn's release follows a
// barrier of the writer warpgroup (named barrier 2), as dq_publish's follows the block's.
// In stochastic mode the adds are bulk reductions (cp.reduce.async.bulk), one per row of 256 bytes
// issued by writer threads 0…63, instead of the threads' red.global adds: 4–14 % off the backward
// at S ≥ 512 (the lab's b19 against b14, 2026-12-04). The deterministic order keeps red.global: a
// turn may pass only once its adds are complete, and waiting for bulk reductions to complete made
// the chain of turns slower (b19, and b20 with one reduction per 16 KB tile).
template <typename T>
DST_WGA_DEV void bwd_dq_write(const Params &p, const float *buf, int ldq, int wt, int bh, int jb, int BN, int mb,
                              int BM, int nk, T *gdq, int64_t ld, int q_rows, uint32_t empty) {
    const int r = wt & 63, c0 = (wt >> 6) * 32, i = mb * BM + r;
    const bool ok = i < q_rows;
    const float *src = buf + r * ldq + c0;
    float *acc = p.dq_accum + (uint64_t(bh) * uint64_t(p.seq) + uint64_t(i)) * 64u + c0;
    T *out = gdq + int64_t(i) * ld + c0;
    auto wsync = [] { asm volatile("bar.sync 2, 128;\n" ::: "memory"); };
    if (!p.deterministic) {
        if (ok && wt < 64) {  // c0 = 0: src and acc at the start of row r
            wg::fence_proxy_async();  // the consumers' stores to buf (acquired through the full barrier),
                                      // visible to the async proxy
            bulk_reduce_add_f32(acc, smem_addr(src), 64 * sizeof(float));
            bulk_wait_read();  // buf read: it may be rewritten
        }
        mbar_arrive(empty);
        return;
    }
    const DqTurn turn = dq_turn(p, bh, jb, mb, nk, p.q_tiles, BM, BN);
    const bool first = turn.first, last = turn.last;
    if (!first) {
        if (wt == 0) wait_turn(turn.cnt, turn.rank);
        wsync();
    }
    if (ok) {
        const float sc = p.scale;
#pragma unroll 2
        for (int c = 0; c < 32; c += 4)
            dq_put4(first, last, acc, out, c, 64 - c0, *reinterpret_cast<const float4 *>(src + c), sc);
    }
    mbar_arrive(empty);
    if (!last) {
        wsync();
        if (wt == 0) st_release(turn.cnt, turn.rank + 1);
    }
}

// DQM: how the partial dQ is formed (kDqMma, kDqWgmma), or kDqNone (the lab's timing control b8n:
// the product and its adds left out, so that the difference to b8 is what they cost; dQ is then not
// written).
// EAGER2: a block with two query tiles to walk (S ≤ 2·BM) issues both tiles' copies with its K and V,
// the second in a copy group of its own, as the forward's EAGER2 does with two key tiles.
template <typename T, int BM, int MB, int WGS, int DQM = kDqMma, bool EAGER2 = false>
__global__ void __launch_bounds__(128 * WGS + (DQM >= kDqWriter ? 128 : 0), MB) flash_bwd_wgmma_kernel(const Params p) {
    DST_GRID_DEPENDENCY();
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
    using Tr = WgBwdTraits<BM, WGS, DQM>;
    using Dq = BwdTraits<T, 64, BM, 4 * WGS>;  // the dQ product's split over the warps
    constexpr int BN = Tr::kBN, NTQ = BM / 8, DT = 8, LDS = Tr::kLds, LDSS = Tr::kLdsS, DQT = Dq::kDqT;
    extern __shared__ __align__(16) unsigned char smem_raw[];
    const uint32_t base = (smem_addr(smem_raw) + 1023u) & ~1023u;
    unsigned char *const gen = smem_raw + (base - smem_addr(smem_raw));  // the same address, generic
    const uint32_t sK = base, sV = base + uint32_t(Tr::kKV), sQ0 = base + uint32_t(2 * Tr::kKV);
    T *sKp = reinterpret_cast<T *>(gen + Tr::kSw);                          // K [BN][64 + 8], key order
    float *sStat = reinterpret_cast<float *>(gen + Tr::kSw + Tr::kKp);     // 2 stages of [lse2 | D]
    T *sS = reinterpret_cast<T *>(sStat + 4 * BM);                          // dSᵀ [BN][BM + 8]
    float *sDq = reinterpret_cast<float *>(reinterpret_cast<unsigned char *>(sS) + Tr::kSp);  // kDqWriter
    // The buffers' mbarriers: full 0 … NB − 1, then empty 0 … NB − 1 (NB = Tr::kDqBufs).
    constexpr int NB = Tr::kDqBufs;
    constexpr uint32_t kEmpty = 8 * NB;  // the empty barriers' offset from dq_bar
    const uint32_t dq_bar = smem_addr(sDq + NB * BM * Tr::kLdq);
    int *sTicket = reinterpret_cast<int *>(reinterpret_cast<unsigned char *>(sDq) + Tr::kDqb);
    const uint32_t sDs = sQ0 + uint32_t(4 * Tr::kQ);  // kDqWgmma: dSᵀ [BN][BM], swizzled, rho16 rows
    unsigned char *const gDs = gen + 2 * Tr::kKV + 4 * Tr::kQ;

    int *ticket = p.counters + int64_t(p.batch) * p.heads * p.q_tiles;
    if (threadIdx.x == 0) {
        *sTicket = atomicAdd(ticket, 1);
        if constexpr (Tr::kWriter) {
            for (int i = 0; i < NB; ++i) {
                mbar_init(dq_bar + 8 * i, Tr::kThreads);  // every consumer thread's partial written
                mbar_init(dq_bar + kEmpty + 8 * i, 128);         // every writer thread done reading
            }
            asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
        }
    }
    __syncthreads();
    const int item = *sTicket;
    const int jb = item % p.m_blocks, bh = item / p.m_blocks;
    const int b = bh / p.heads, h = bh % p.heads, S = p.seq;
    const int k0 = jb * BN, q_rows = seq_rows(p, b);
    const int64_t ld = 3 * int64_t(p.hidden), row0 = seq_row0(p, b);
    const T *gq = static_cast<const T *>(p.qkv) + row0 * ld + int64_t(h) * 64;
    const T *gk = gq + p.hidden, *gv = gq + 2 * p.hidden;
    const T *gdo = static_cast<const T *>(p.dctx) + row0 * p.hidden + int64_t(h) * 64;
    T *gdq = static_cast<T *>(p.dqkv) + row0 * ld + int64_t(h) * 64;
    const int kv_len = key_limit(p, b);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, wgi = warp >> 2, wrow = (warp & 3) * 16;
    const int k0w = k0 + 64 * wgi;  // this warpgroup's first key
    const uint64_t row_base = uint64_t(bh) * uint64_t(S);

    if (k0 >= kv_len) {  // keys past the length: zero dK and dV (and, with no key at all, dQ)
        if constexpr (Tr::kWriter)
            if (threadIdx.x >= Tr::kThreads) return;  // the writer warpgroup
        for (int x = threadIdx.x; x < BN * 64; x += Tr::kThreads) {
            const int j = k0 + x / 64, c = x % 64;
            if (j < q_rows) gdq[int64_t(j) * ld + p.hidden + c] = gdq[int64_t(j) * ld + 2 * p.hidden + c] = from_float<T>(0.0f);
        }
        if (jb == 0)
            for (int64_t x = threadIdx.x; x < int64_t(q_rows) * 64; x += Tr::kThreads)
                gdq[(x / 64) * ld + x % 64] = from_float<T>(0.0f);
        return;
    }
    const int nk = (kv_len + BN - 1) / BN;
    const int nq = bwd_q_tiles(p, q_rows, BM), m_first = p.causal ? k0 / BM : 0, n_steps = nq - m_first;
    auto tile_at = [&](int step) { return bwd_tile_at(p, m_first, jb, nq, step); };
    const float *lse2 = p.lse2 + row_base, *dsum = p.dsum + row_base;
    // The consumers' barrier: the whole block, or with a writer warpgroup the 256 consumer threads.
    auto csync = [] {
        if constexpr (Tr::kWriter)
            asm volatile("bar.sync 1, %0;\n" ::"n"(Tr::kThreads) : "memory");
        else
            __syncthreads();
    };
    if constexpr (Tr::kWriter) {
        constexpr int kWriterRegs = 40, kConsumerRegs = 232;  // 24 / 240: the writer spills
        static_assert(128 * kWriterRegs + Tr::kThreads * kConsumerRegs <= launch_regs(Tr::kBlockThreads) * Tr::kBlockThreads,
                      "setmaxnreg split beyond the block's registers");
        if (threadIdx.x >= Tr::kThreads) {  // the writer: the registers go to the consumers
            asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kWriterRegs) : "memory");
            for (int step = 0; step < n_steps; ++step) {
                const int u = NB == 2 ? step >> 1 : step / NB, bf = NB == 2 ? step & 1 : step % NB;  // use u of buffer bf
                mbar_wait_bounded(dq_bar + 8 * bf, u & 1);
                if constexpr (DQM == kDqWriterNoAdd)
                    mbar_arrive(dq_bar + kEmpty + 8 * bf);
                else
                    bwd_dq_write<T>(p, sDq + bf * BM * Tr::kLdq, Tr::kLdq, threadIdx.x - Tr::kThreads, bh, jb, BN,
                                    tile_at(step), BM, nk, gdq, ld, q_rows, dq_bar + kEmpty + 8 * bf);
            }
            if (!p.deterministic) bulk_wait();  // the stochastic adds complete before the block ends
            return;
        }
        asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kConsumerRegs) : "memory");
    }

    // Copies: thread x owns 16-byte chunk x & 7 of rows (x >> 3) + CR·k, CR = threads / 8 (a multiple
    // of 16, so a thread's row inside each 16-row group is fixed).
    constexpr int CR = Tr::kThreads / 8;
    const int cchunk = threadIdx.x & 7, crow = threadIdx.x >> 3;  // crow 0 … CR − 1
    auto stage = [&](int mb, int st) {  // Q, dctx and the row statistics of query tile mb
        const uint32_t q = sQ0 + uint32_t(2 * st) * uint32_t(Tr::kQ), o = q + uint32_t(Tr::kQ);
#pragma unroll
        for (int k = 0; k < BM / CR; ++k) {
            const int r = CR * k + crow, i = mb * BM + r;
            const bool ok = i < q_rows;
            cp_async16(q + sw128(r, cchunk), gq + (ok ? int64_t(i) * ld + cchunk * 8 : 0), ok ? 16 : 0);
            cp_async16(o + sw128(r, cchunk), gdo + (ok ? int64_t(i) * p.hidden + cchunk * 8 : 0), ok ? 16 : 0);
        }
        bwd_stage_stats<BM, Tr::kThreads>(sStat + st * 2 * BM, lse2, dsum, mb * BM, q_rows);
    };
    {  // K (swizzled, rho16 rows, and padded in key order) and V (swizzled, rho16 rows)
        const int srow = (crow & ~15) + rho16_inv(crow & 15);
#pragma unroll
        for (int k = 0; k < BN / CR; ++k) {
            const int jl = CR * k + crow, j = k0 + jl;
            const bool ok = j < q_rows;
            const int64_t off = ok ? int64_t(j) * ld + cchunk * 8 : 0;
            const uint32_t o = sw128(CR * k + srow, cchunk);
            cp_async16(sK + o, gk + off, ok ? 16 : 0);
            cp_async16(sV + o, gv + off, ok ? 16 : 0);
            if constexpr (Tr::kPadded) cp_async16(smem_addr(sKp + jl * LDS + cchunk * 8), gk + off, ok ? 16 : 0);
        }
    }
    stage(tile_at(0), 0);
    cp_async_commit();
    const bool both = EAGER2 && n_steps == 2;
    if (both) {
        stage(tile_at(1), 1);
        cp_async_commit();
    }

    const BwdKeys keys = bwd_keys(p, b, bh, k0w, wrow, kv_len);
    // This warpgroup's 64 rows of K and V (8 KB apart, 1024-byte aligned).
    const uint32_t wg_rows = uint32_t(wgi * 64 * Tr::kRow);
    const uint64_t dk_desc = wg::desc_sw128(sK + wg_rows), dv_desc = wg::desc_sw128(sV + wg_rows);
    float dk[DT][4], dv[DT][4];
    zero(dk);
    zero(dv);
    const int wm = warp % Dq::kWM, wn = warp / Dq::kWM;  // this warp's [16][DQT·8] block of the dQ tile
    const int g = lane >> 2, t = lane & 3;

    // The partial dQ of step `step` to the writer's buffer step % NB, once the writer is done with its
    // use NB steps before.
    auto to_writer = [&](const float (&d)[DQT][4], int step) {
        const int u = NB == 2 ? step >> 1 : step / NB, bf = NB == 2 ? step & 1 : step % NB;  // use u of buffer bf
        if (u > 0) mbar_wait(dq_bar + kEmpty + 8 * bf, (u - 1) & 1);
        float *buf = sDq + bf * BM * Tr::kLdq + (16 * wm + g) * Tr::kLdq + wn * DQT * 8 + 2 * t;
#pragma unroll
        for (int nt = 0; nt < DQT; ++nt) {
            *reinterpret_cast<float2 *>(buf + nt * 8) = make_float2(d[nt][0], d[nt][1]);
            *reinterpret_cast<float2 *>(buf + 8 * Tr::kLdq + nt * 8) = make_float2(d[nt][2], d[nt][3]);
        }
        mbar_arrive(dq_bar + 8 * bf);
    };
    DqOwed owed;
    for (int step = 0; step < n_steps; ++step) {
        const int mb = tile_at(step), st = step & 1, i0 = mb * BM;
        if (both && step == 0)
            cp_async_wait<1>();
        else
            cp_async_wait<0>();
        wg::fence_proxy_async();  // this thread's cp.async writes, visible to the async proxy
        csync();                  // everyone's; every MMA of the other stage has completed; sS is free; the
                                  // last step's dQ adds are done (released below, while the MMAs run)
        if (!both && step + 1 < n_steps) stage(tile_at(step + 1), st ^ 1);
        cp_async_commit();
        const uint32_t sq = sQ0 + uint32_t(2 * st) * uint32_t(Tr::kQ), sdo = sq + uint32_t(Tr::kQ);
        const uint64_t dq_desc = wg::desc_sw128(sq), do_desc = wg::desc_sw128(sdo);
        const float *sL = sStat + st * 2 * BM, *sD = sL + BM;

        // Sᵀ = K·Qᵀ, dP̃ᵀ = V·dctxᵀ: four k16 steps along the head dim each.
        float s[NTQ][4], dp[NTQ][4];
        wg::fence_regs(s);
        wg::fence_regs(dp);
        wg::wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < 4; ++kk) wg::wgmma_ss<T, BM>(s, dk_desc + 2 * kk, dq_desc + 2 * kk, kk > 0);
#pragma unroll
        for (int kk = 0; kk < 4; ++kk) wg::wgmma_ss<T, BM>(dp, dv_desc + 2 * kk, do_desc + 2 * kk, kk > 0);
        wg::wgmma_commit();
        dq_publish(owed);
        wg::wgmma_wait<0>();
        wg::fence_regs(s);
        wg::fence_regs(dp);

        bwd_tile(p, keys, k0w, wrow, i0, sL, sD, s, dp);

        // The A fragments of P̃ᵀ/σ and dSᵀ; dSᵀ to shared memory for the dQ product: kDqWgmma swizzled
        // in the accumulator's row order (row wrow + g holds key 2g, row wrow + g + 8 key 2g + 1: K's
        // rho16 order, so that the product pairs each key with its K row), otherwise in key order.
        uint32_t ap[NTQ / 2][4], as[NTQ / 2][4];
        to_a<T, NTQ>(ap, s);
        to_a<T, NTQ>(as, dp);
        if constexpr (DQM >= kDqWgmma) {
            // Query 16·kk + 2t is 16-byte chunk 2·kk, byte 4t; both rows have (row & 7) = g.
            unsigned char *r0 = gDs + (64 * wgi + wrow + g) * Tr::kRow + 4 * t, *r1 = r0 + 8 * Tr::kRow;
#pragma unroll
            for (int kk = 0; kk < NTQ / 2; ++kk) {
                const int c0 = ((2 * kk) ^ g) << 4, c1 = ((2 * kk + 1) ^ g) << 4;
                *reinterpret_cast<uint32_t *>(r0 + c0) = as[kk][0];
                *reinterpret_cast<uint32_t *>(r1 + c0) = as[kk][1];
                *reinterpret_cast<uint32_t *>(r0 + c1) = as[kk][2];
                *reinterpret_cast<uint32_t *>(r1 + c1) = as[kk][3];
            }
            wg::fence_proxy_async();  // for the dQ MMAs (async proxy), after the barrier below
        } else {
#pragma unroll
            for (int kk = 0; kk < NTQ / 2; ++kk) {
                T *r0 = sS + (64 * wgi + wrow + 2 * g) * LDSS + kk * 16 + 2 * t, *r1 = r0 + LDSS;
                *reinterpret_cast<uint32_t *>(r0) = as[kk][0];
                *reinterpret_cast<uint32_t *>(r1) = as[kk][1];
                *reinterpret_cast<uint32_t *>(r0 + 8) = as[kk][2];
                *reinterpret_cast<uint32_t *>(r1 + 8) = as[kk][3];
            }
        }

        // dV·(1/σ) += (P̃ᵀ/σ)·dctx and dK += dSᵀ·Q: k16 step G covers queries 16G …, 2048 bytes apart.
        wg::fence_regs(dv);
        wg::fence_regs(dk);
        wg::wgmma_fence();
#pragma unroll
        for (int G = 0; G < NTQ / 2; ++G) wg::wgmma_rs_tb<T, 64>(dv, ap[G], do_desc + uint64_t(G) * (2048 >> 4), 1);
#pragma unroll
        for (int G = 0; G < NTQ / 2; ++G) wg::wgmma_rs_tb<T, 64>(dk, as[G], dq_desc + uint64_t(G) * (2048 >> 4), 1);
        wg::wgmma_commit();
        csync();  // dSᵀ of every warp visible

        // Partial dQ of the tile: rows 16·wm …, columns wn·DQT·8 … of dS·K.
        if constexpr (DQM == kDqMma) {  // mma.sync, while the dV and dK MMAs run
            float dqp[1][DQT][4];
            bwd_dq_product<T, BN, DQT, LDS, LDSS>(dqp, sS, sKp, lane, wm, wn);
            bwd_dq_add<T, 64, DQT>(p, dqp, bh, jb, BN, mb, BM, nk, wm, wn, gdq, ld, q_rows, owed);
        } else if constexpr (DQM >= kDqWgmma) {
            // Warpgroup wgi: m64n(DQT·8)k16 per 16 keys, A = dSᵀ rows (MN-major), B = the K tile's
            // columns wn·DQT·8 … (MN-major: the swizzle is of the address, so a column offset inside
            // the 128-byte rows is a start-address offset). Its accumulator is bwd_dq_add's layout
            // (warp w of the warpgroup rows 16w …, wm = w, wn = wgi).
            static_assert(Dq::kWM == 4 && Dq::kWN == WGS, "one column block of dQ per warpgroup");
            float dqp[1][DQT][4];
            zero(dqp[0]);
            if constexpr (DQM != kDqWriterNoMma) {
                wg::fence_regs(dqp[0]);
                wg::wgmma_fence();
#pragma unroll
                for (int kk = 0; kk < BN / 16; ++kk)
                    wg::wgmma_ss_tt<T, DQT * 8>(dqp[0], wg::desc_sw128(sDs + uint32_t(kk) * 2048u),
                                                wg::desc_sw128(sK + uint32_t(kk) * 2048u + uint32_t(wn * DQT * 16)),
                                                kk > 0);
                wg::wgmma_commit();
            }
            wg::wgmma_wait<0>();
            wg::fence_regs(dqp[0]);
            if constexpr (Tr::kWriter)  // to buffer step % NB once the writer is done with its last use
                to_writer(dqp[0], step);
            else
                bwd_dq_add<T, 64, DQT>(p, dqp, bh, jb, BN, mb, BM, nk, wm, wn, gdq, ld, q_rows, owed);
        }
        wg::wgmma_wait<0>();
        wg::fence_regs(dv);
        wg::fence_regs(dk);
        wg::fence_a(ap);  // the A registers stay untouched until the MMAs reading them are done
        wg::fence_a(as);
    }
    cp_async_wait<0>();
    if (owed.cnt) {  // uniform: every thread holds the same (never with a writer)
        csync();
        dq_publish(owed);
    }

    bwd_store_kv(p, keys, gdq, ld, dk, dv);
#else
    (void)p;
    __trap();  // built for another target: launched only from sm_90a objects (the lab: DST_LAB_SM90A)
#endif
}

// Head dim 64 and 16-byte aligned rows only (else cudaErrorInvalidValue). The prologue (bwd_prologue)
// must have run; order as in launch_bwd.
template <typename T, int BM, int MB, int WGS, int DQM = kDqMma, bool EAGER2 = false>
cudaError_t launch_bwd_wgmma(Params p, cudaStream_t stream, int order = -1) {
    using Tr = WgBwdTraits<BM, WGS, DQM>;
    if (p.head_dim != 64 || !p.vec16) return cudaErrorInvalidValue;
    p.m_blocks = static_cast<int>(tiles_of(p.seq, Tr::kBN));
    p.q_tiles = static_cast<int>(tiles_of(p.seq, BM));
    const auto kernel = flash_bwd_wgmma_kernel<T, BM, MB, WGS, DQM, EAGER2>;
    cudaError_t e = allow_smem(kernel, Tr::kSmem);
    if (e == cudaSuccess) e = resolve_dq_order(kernel, Tr::kBlockThreads, Tr::kSmem, p, order);
    if (e != cudaSuccess) return e;
    e = launch_dependent(kernel, static_cast<unsigned>(p.m_blocks * int64_t(p.batch) * p.heads), Tr::kBlockThreads,
                         Tr::kSmem, stream, p);
    return e != cudaSuccess ? e : bwd_dq_convert<T, 64>(p, stream);
}

}  // namespace flash
}  // namespace cuda
}  // namespace dst

#undef DST_WGA_DEV
#endif  // DST_KERNELS_ATTENTION_FLASH_WGMMA_CUH
