// The flash attention backward warp-specialised (sm_90a only, head dim 64, fp16/bf16; the lab's b15
// and b16): the wgmma backward's arithmetic (kernels/attention_flash_wgmma.cuh: bwd_tile, the same
// Sᵀ/dP̃ᵀ/dV/dK products on the same tiles) with its two consumer warpgroups decoupled, so that one
// can run its products while the other runs its softmax and dropout.
//
// A block owns 128 keys of one (batch, head) and walks its query tiles of 64 rows as the wgmma
// backward does (same tickets, same order). Warpgroups 0 and 1 (the consumers) own keys 0…63 and
// 64…127 of the block; warpgroup 2 (the writer) adds the partial dQ into the tile's accumulator.
// What changes against the wgmma backward (kDqWriter, b14):
//   - each consumer forms the partial dQ of its own 64 keys (wgmma m64n64k16 × 4, A = its dSᵀ rows
//     and B = its K rows, both MN-major in shared memory), so the only barrier between a step's dSᵀ
//     and its dQ product is the consumer's own (a named barrier of 128 threads); the writer adds the
//     two partials (consumer 0's + consumer 1's, in that order: deterministic) and then proceeds as
//     bwd_dq_write does (same order, turns, first/last roles);
//   - the Q/dctx tiles and their row statistics go through four stages with a full and an empty
//     mbarrier each instead of a block barrier per step: the consumers copy tile t + 2 (cp.async) at
//     step t, so either consumer can run up to a step ahead of the other;
//   - PP (b16): the consumers take turns to issue their Sᵀ/dP̃ᵀ products (two named barriers, as
//     FlashAttention-3's warp scheduler barriers), so that their products and their softmax phases
//     interleave instead of coinciding.
// The dQ partial sums over 64 keys in the MMA and then the two halves in fp32 (the wgmma backward sums
// 128 keys in the MMA): the bits differ from b11/b14 by rounding, not from run to run.
// Measured (H200, fp16, 16 heads, dropout 0.1, deterministic / stochastic ms; bench/RESULTS.md,
// 2026-12-04): 8×2048 b14 1.714 / 1.666, b15 1.714 / 1.695, b16 1.752 / 1.740; 2×8192 b14 6.24 /
// 6.17, b15 6.22 / 6.35, b16 6.39 / 6.46. Neither pays: the softmax and dropout phase is latency-
// bound, and ping-pong halves the warps that run it at a time. The lab keeps them; the library
// does not build them.
#ifndef DST_KERNELS_ATTENTION_FLASH_WS_BWD_CUH
#define DST_KERNELS_ATTENTION_FLASH_WS_BWD_CUH

#include "kernels/attention_flash_wgmma.cuh"

namespace dst {
namespace cuda {
namespace flash {

struct WsBwdTraits {
    static constexpr int kBM = 64, kBN = 128, kConsumers = 256, kThreads = 384, kRow = 128, kStages = 4, kLdq = 64 + 8;
    static constexpr size_t kKV = size_t(kBN) * kRow, kQ = size_t(kBM) * kRow;
    // Swizzled (1024-byte aligned): K, V, kStages × [Q | dctx], dSᵀ [BN][BM]; then kStages × [lse2 | D],
    // the dQ buffers [2 steps][2 consumers][BM][kLdq] fp32, the mbarriers and the ticket.
    static constexpr size_t kSw = 2 * kKV + 2 * kStages * kQ + kKV;
    static constexpr size_t kStat = size_t(2 * kStages * kBM) * sizeof(float);
    static constexpr size_t kDqb = 4 * size_t(kBM) * kLdq * sizeof(float);
    static constexpr int kBars = 2 * kStages + 4;  // stage full, stage empty, dQ full, dQ empty
    static constexpr size_t kSmem = 1024 + kSw + kStat + kDqb + 8 * kBars + 16;
    static constexpr int kWriterRegs = 40, kConsumerRegs = 232;
    static_assert(128 * kWriterRegs + kConsumers * kConsumerRegs <= launch_regs(kThreads) * kThreads,
                  "setmaxnreg split beyond the block's registers");
};

template <typename T, bool PP>
__global__ void __launch_bounds__(WsBwdTraits::kThreads, 1) flash_bwd_ws_kernel(const Params p) {
    DST_GRID_DEPENDENCY();
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
    using Tr = WsBwdTraits;
    constexpr int BM = Tr::kBM, BN = Tr::kBN, NS = Tr::kStages, NTQ = BM / 8, DT = 8, LDQ = Tr::kLdq;
    extern __shared__ __align__(16) unsigned char smem_raw[];
    const uint32_t base = (smem_addr(smem_raw) + 1023u) & ~1023u;
    unsigned char *const gen = smem_raw + (base - smem_addr(smem_raw));  // the same address, generic
    const uint32_t sK = base, sV = base + uint32_t(Tr::kKV), sQ0 = base + uint32_t(2 * Tr::kKV);
    const uint32_t sDs = sQ0 + uint32_t(2 * NS * Tr::kQ);  // dSᵀ [BN][BM], swizzled, rho16 rows
    unsigned char *const gDs = gen + (sDs - base);
    float *sStat = reinterpret_cast<float *>(gen + Tr::kSw);  // NS stages of [lse2 | D]
    float *sDq = sStat + 2 * NS * BM;                          // [step & 1][consumer][BM][LDQ]
    const uint32_t bars = smem_addr(sDq + 4 * BM * LDQ);
    auto full = [&](int st) { return bars + 8u * uint32_t(st); };
    auto empty = [&](int st) { return bars + 8u * uint32_t(NS + st); };
    auto dq_full = [&](int bf) { return bars + 8u * uint32_t(2 * NS + bf); };
    auto dq_empty = [&](int bf) { return bars + 8u * uint32_t(2 * NS + 2 + bf); };
    int *sTicket = reinterpret_cast<int *>(gen + Tr::kSw + Tr::kStat + Tr::kDqb + 8 * Tr::kBars);

    int *ticket = p.counters + int64_t(p.batch) * p.heads * p.q_tiles;
    if (threadIdx.x == 0) {
        *sTicket = atomicAdd(ticket, 1);
        for (int i = 0; i < NS; ++i) {
            mbar_init(full(i), Tr::kConsumers);   // every consumer's copies of the stage complete
            mbar_init(empty(i), Tr::kConsumers);  // every consumer done with the stage
        }
        for (int i = 0; i < 2; ++i) {
            mbar_init(dq_full(i), Tr::kConsumers);  // both partials written
            mbar_init(dq_empty(i), 128);            // the writer done reading them
        }
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
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
    const bool writer = threadIdx.x >= Tr::kConsumers;

    if (k0 >= kv_len) {  // keys past the length: zero dK and dV (and, with no key at all, dQ)
        if (writer) return;
        for (int x = threadIdx.x; x < BN * 64; x += Tr::kConsumers) {
            const int j = k0 + x / 64, c = x % 64;
            if (j < q_rows) gdq[int64_t(j) * ld + p.hidden + c] = gdq[int64_t(j) * ld + 2 * p.hidden + c] = from_float<T>(0.0f);
        }
        if (jb == 0)
            for (int64_t x = threadIdx.x; x < int64_t(q_rows) * 64; x += Tr::kConsumers)
                gdq[(x / 64) * ld + x % 64] = from_float<T>(0.0f);
        return;
    }
    const int nk = (kv_len + BN - 1) / BN;
    const int nq = bwd_q_tiles(p, q_rows, BM), m_first = p.causal ? k0 / BM : 0, n_steps = nq - m_first;
    auto tile_at = [&](int step) { return p.causal || !p.dq_order ? m_first + step : (jb + step) % nq; };

    if (writer) {  // the registers go to the consumers
        asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(Tr::kWriterRegs) : "memory");
        const int wt = threadIdx.x - Tr::kConsumers;
        for (int step = 0; step < n_steps; ++step) {
            const int bf = step & 1;
            mbar_wait_bounded(dq_full(bf), (step >> 1) & 1);
            const float *buf = sDq + 2 * bf * BM * LDQ;
            bwd_dq_write<T, true>(p, buf, buf + BM * LDQ, LDQ, wt, bh, jb, BN, tile_at(step), BM, nk, gdq, ld,
                                  q_rows, dq_empty(bf));
        }
        return;
    }
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(Tr::kConsumerRegs) : "memory");

    const float *lse2 = p.lse2 + uint64_t(bh) * uint64_t(S), *dsum = p.dsum + uint64_t(bh) * uint64_t(S);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, wgi = warp >> 2, wrow = (warp & 3) * 16;
    const int g = lane >> 2, t = lane & 3;
    // Copies: consumer thread x owns 16-byte chunk x & 7 of rows (x >> 3) + 32·k.
    constexpr int CR = Tr::kConsumers / 8;
    const int cchunk = threadIdx.x & 7, crow = threadIdx.x >> 3;
    auto stage = [&](int mb, int st) {  // Q, dctx and the row statistics of query tile mb into stage st
        const uint32_t q = sQ0 + uint32_t(2 * st) * uint32_t(Tr::kQ), o = q + uint32_t(Tr::kQ);
#pragma unroll
        for (int k = 0; k < BM / CR; ++k) {
            const int r = CR * k + crow, i = mb * BM + r;
            const bool ok = i < q_rows;
            cp_async16(q + sw128(r, cchunk), gq + (ok ? int64_t(i) * ld + cchunk * 8 : 0), ok ? 16 : 0);
            cp_async16(o + sw128(r, cchunk), gdo + (ok ? int64_t(i) * p.hidden + cchunk * 8 : 0), ok ? 16 : 0);
        }
        bwd_stage_stats<BM, Tr::kConsumers>(sStat + st * 2 * BM, lse2, dsum, mb * BM, q_rows);
    };
    {  // K and V (swizzled, rho16 rows)
        const int srow = (crow & ~15) + rho16_inv(crow & 15);
#pragma unroll
        for (int k = 0; k < BN / CR; ++k) {
            const int j = k0 + CR * k + crow;
            const bool ok = j < q_rows;
            const int64_t off = ok ? int64_t(j) * ld + cchunk * 8 : 0;
            const uint32_t o = sw128(CR * k + srow, cchunk);
            cp_async16(sK + o, gk + off, ok ? 16 : 0);
            cp_async16(sV + o, gv + off, ok ? 16 : 0);
        }
    }
    stage(tile_at(0), 0);
    if (n_steps > 1) stage(tile_at(1), 1);
    cp_async_commit();
    cp_async_wait<0>();
    wg::fence_proxy_async();  // this thread's cp.async writes, visible to the async proxy
    asm volatile("bar.sync 1, %0;\n" ::"n"(Tr::kConsumers) : "memory");  // K, V, stages 0 and 1: everyone's

    const int k0w = k0 + 64 * wgi;  // this warpgroup's first key
    const BwdKeys keys = bwd_keys(p, b, bh, k0w, wrow, kv_len);
    const uint32_t wg_rows = uint32_t(wgi * 64 * Tr::kRow);  // this warpgroup's 64 rows of K, V and dSᵀ
    const uint64_t dk_desc = wg::desc_sw128(sK + wg_rows), dv_desc = wg::desc_sw128(sV + wg_rows);
    float dk[DT][4], dv[DT][4];
    zero(dk);
    zero(dv);
    // PP: warpgroup w issues its Sᵀ/dP̃ᵀ products after bar.sync 5 + w and then lets the other go
    // (bar.arrive 5 + (1 − w)); warpgroup 0 goes first.
    if (PP && wgi == 1) asm volatile("bar.arrive 5, %0;\n" ::"n"(Tr::kConsumers) : "memory");

    for (int step = 0; step < n_steps; ++step) {
        const int st = step & (NS - 1), i0 = tile_at(step) * BM;
        // Stage step + 1 (copied at step − 1) complete: publish it. Then copy tile step + 2 into the
        // stage step − 2 left, once both consumers are done with it.
        if (step >= 1 && step + 1 < n_steps) {
            cp_async_wait<0>();
            wg::fence_proxy_async();
            mbar_arrive(full((step + 1) & (NS - 1)));
        }
        if (step + 2 < n_steps) {
            const int t2 = step + 2;
            if (t2 >= NS) mbar_wait(empty(t2 & (NS - 1)), ((t2 / NS) - 1) & 1);
            stage(tile_at(t2), t2 & (NS - 1));
            cp_async_commit();
        }
        if (step >= 2) mbar_wait(full(st), ((step - 2) / NS) & 1);
        const uint32_t sq = sQ0 + uint32_t(2 * st) * uint32_t(Tr::kQ), sdo = sq + uint32_t(Tr::kQ);
        const uint64_t dq_desc = wg::desc_sw128(sq), do_desc = wg::desc_sw128(sdo);
        const float *sL = sStat + st * 2 * BM, *sD = sL + BM;

        // Sᵀ = K·Qᵀ, dP̃ᵀ = V·dctxᵀ: four k16 steps along the head dim each.
        float s[NTQ][4], dp[NTQ][4];
        if constexpr (PP) {
            if (wgi == 0) asm volatile("bar.sync 5, %0;\n" ::"n"(Tr::kConsumers) : "memory");
            else asm volatile("bar.sync 6, %0;\n" ::"n"(Tr::kConsumers) : "memory");
        }
        wg::fence_regs(s);
        wg::fence_regs(dp);
        wg::wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < 4; ++kk) wg::wgmma_ss<T, BM>(s, dk_desc + 2 * kk, dq_desc + 2 * kk, kk > 0);
#pragma unroll
        for (int kk = 0; kk < 4; ++kk) wg::wgmma_ss<T, BM>(dp, dv_desc + 2 * kk, do_desc + 2 * kk, kk > 0);
        wg::wgmma_commit();
        if constexpr (PP) {
            if (wgi == 0) asm volatile("bar.arrive 6, %0;\n" ::"n"(Tr::kConsumers) : "memory");
            else if (step + 1 < n_steps) asm volatile("bar.arrive 5, %0;\n" ::"n"(Tr::kConsumers) : "memory");
        }
        wg::wgmma_wait<0>();
        wg::fence_regs(s);
        wg::fence_regs(dp);

        bwd_tile(p, keys, k0w, wrow, i0, sL, sD, s, dp);

        // The A fragments of P̃ᵀ/σ and dSᵀ; dSᵀ to this warpgroup's rows of sDs, swizzled, in the
        // accumulator's row order (K's rho16 order: the product pairs each key with its K row).
        uint32_t ap[NTQ / 2][4], as[NTQ / 2][4];
        to_a<T, NTQ>(ap, s);
        to_a<T, NTQ>(as, dp);
        {
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
        // This warpgroup's dSᵀ visible (its own barrier: the other warpgroup's rows are not read).
        if (wgi == 0) asm volatile("bar.sync 3, 128;\n" ::: "memory");
        else asm volatile("bar.sync 4, 128;\n" ::: "memory");

        // Partial dQ of the tile over this warpgroup's 64 keys: m64n64k16 × 4, A = dSᵀ rows and B = K
        // rows of the warpgroup, both MN-major.
        float dqp[DT][4];
        wg::fence_regs(dqp);
        wg::wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < 4; ++kk)
            wg::wgmma_ss_tt<T, 64>(dqp, wg::desc_sw128(sDs + wg_rows + uint32_t(kk) * 2048u),
                                   wg::desc_sw128(sK + wg_rows + uint32_t(kk) * 2048u), kk > 0);
        wg::wgmma_commit();
        wg::wgmma_wait<0>();
        wg::fence_regs(dqp);
        wg::fence_regs(dv);
        wg::fence_regs(dk);
        wg::fence_a(ap);  // the A registers stay untouched until the MMAs reading them are done
        wg::fence_a(as);
        mbar_arrive(empty(st));  // every MMA and load of this stage done

        // To buffer step & 1 (this consumer's half) once the writer is done with its use two steps ago.
        const int bf = step & 1;
        if (step >= 2) mbar_wait(dq_empty(bf), ((step >> 1) - 1) & 1);
        float *buf = sDq + (2 * bf + wgi) * BM * LDQ + (wrow + g) * LDQ + 2 * t;
#pragma unroll
        for (int nt = 0; nt < DT; ++nt) {
            *reinterpret_cast<float2 *>(buf + nt * 8) = make_float2(dqp[nt][0], dqp[nt][1]);
            *reinterpret_cast<float2 *>(buf + 8 * LDQ + nt * 8) = make_float2(dqp[nt][2], dqp[nt][3]);
        }
        mbar_arrive(dq_full(bf));
    }
    cp_async_wait<0>();
    bwd_store_kv(p, keys, gdq, ld, dk, dv);
#else
    (void)p;
    __trap();  // built for another target: launched only from sm_90a objects (the lab: DST_LAB_SM90A)
#endif
}

// Head dim 64 and 16-byte aligned rows only (else cudaErrorInvalidValue). The prologue (bwd_prologue)
// must have run; order as in launch_bwd.
template <typename T, bool PP>
cudaError_t launch_bwd_ws(Params p, cudaStream_t stream, int order = -1) {
    using Tr = WsBwdTraits;
    if (p.head_dim != 64 || !p.vec16) return cudaErrorInvalidValue;
    p.m_blocks = static_cast<int>(tiles_of(p.seq, Tr::kBN));
    p.q_tiles = static_cast<int>(tiles_of(p.seq, Tr::kBM));
    const auto kernel = flash_bwd_ws_kernel<T, PP>;
    cudaError_t e = allow_smem(kernel, Tr::kSmem);
    if (e == cudaSuccess) e = resolve_dq_order(kernel, Tr::kThreads, Tr::kSmem, p, order);
    if (e != cudaSuccess) return e;
    e = launch_dependent(kernel, static_cast<unsigned>(p.m_blocks * int64_t(p.batch) * p.heads), Tr::kThreads,
                         Tr::kSmem, stream, p);
    return e != cudaSuccess ? e : bwd_dq_convert<T, 64>(p, stream);
}

}  // namespace flash
}  // namespace cuda
}  // namespace dst

#endif  // DST_KERNELS_ATTENTION_FLASH_WS_BWD_CUH
