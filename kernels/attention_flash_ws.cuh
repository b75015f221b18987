// The flash attention forward warp-specialised (sm_90a only; FlashAttention-3's structure): a producer
// warpgroup loads K and V by TMA, NC consumer warpgroups of 64 query rows each run the wgmma forward's
// arithmetic (kernels/attention_flash_wgmma.cuh: fwd_tile, fwd_store, the same products on the same
// tiles), so its results are that kernel's bit for bit (the lab compares them: kernels/dev).
//
// A block owns 64·NC query rows of one (batch, head). Warpgroup 0 is the producer: one thread issues
// the TMA loads of every K and V tile, in perm16 row order, into kStages stages, each with a full and
// an empty mbarrier; the warpgroup gives most of its registers to the consumers (setmaxnreg). Each
// consumer issues the next tile's S = Q·Kᵀ before this tile's P̃·V and softmaxes the next tile while
// that P̃·V runs; o's rescale waits until the P̃·V is done (fwd_tile's deferred form), so that no
// instruction touches a register an MMA in flight uses and ptxas keeps the MMAs asynchronous.
//
// The perm16 tile by TMA: cuTensorMapEncodeTiled requires every stride to be a multiple of the one
// before it times its dimension, which rules out one 5-D box in perm16 order; two 4-D maps over qkv
// (columns, x0, x2 + 2·x3, 16-row group), at rows 0 and 2, with boxes of (64, 2, 4, 1), put the 16 rows
// of a group in perm16 order in two 1 KB loads (docs/design-notes.md).
//
// The library runs NC 3, key tiles of 64 (the lab's w9) where ws::applies() holds; the lab also times
// w8 (NC 2) and w10 (NC 2, key tiles of 128: the bits of the wgmma forward at BN 128).
#ifndef DST_KERNELS_ATTENTION_FLASH_WS_CUH
#define DST_KERNELS_ATTENTION_FLASH_WS_CUH

#include <cuda.h>  // CUtensorMap (the encoder is fetched through the runtime: no libcuda link)
#include <cudaTypedefs.h>

#include "kernels/attention_flash_wgmma.cuh"

namespace dst {
namespace cuda {
namespace flash {
namespace ws {

constexpr int kStages = 3;
constexpr size_t kTile = 8192;  // 64 rows × 128 bytes
// NC consumer warpgroups of 64 query rows each, one producer warpgroup, key tiles of BN (64 or 128):
// w8 is NC 2 BN 64, w9 NC 3 BN 64, w10 NC 2 BN 128.
template <int NC, int BN>
constexpr size_t smem_bytes() { return 1024 + NC * kTile + 2 * kStages * (BN / 64) * kTile + 4 * kStages * 8; }
// The registers setmaxnreg moves from the producer to the consumers, within the block's launch_regs
// pool (ptxas allocates the consumers' code within the raised count: w10 spills at 232, not at 240).
constexpr int kProducerRegs = 24;
template <int NC>
constexpr int kConsumerRegs = NC == 2 ? 240 : 160;

struct Maps {
    CUtensorMap row0, row2;  // qkv as (columns, x0, x2 + 2·x3, 16-row group) at row 0 and at row 2
};

// The 64 rows from row 16·group0 on, columns col … col + 63, in perm16 order at dst (1024-aligned).
__device__ __forceinline__ void tma_tile(const Maps &m, uint32_t dst, int col, int group0, uint32_t bar) {
#pragma unroll
    for (int G = 0; G < 4; ++G)
#pragma unroll
        for (int x1 = 0; x1 < 2; ++x1)
            asm volatile(
                "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4, "
                "%5}], [%6];\n" ::"r"(dst + uint32_t(16 * G + 8 * x1) * 128u),
                "l"(reinterpret_cast<uint64_t>(x1 ? &m.row2 : &m.row0)), "r"(col), "r"(0), "r"(0), "r"(group0 + G), "r"(bar)
                : "memory");
}
// The two maps of qkv ([rows][ld] 16-bit elements, rows a multiple of 16); the encoder is fetched
// from the driver once per process.
inline cudaError_t make_maps(Maps &maps, const void *qkv, int64_t rows, int64_t ld) {
    static const PFN_cuTensorMapEncodeTiled_v12000 encode = [] {
        void *fn = nullptr;
        cudaDriverEntryPointQueryResult q{};
        const cudaError_t e = cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &q);
        return e == cudaSuccess && q == cudaDriverEntryPointSuccess ? reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn)
                                                                     : nullptr;
    }();
    if (!encode) return cudaErrorNotSupported;
    if (rows % 16 != 0) return cudaErrorInvalidValue;
    const cuuint64_t l = cuuint64_t(ld);
    for (int x1 = 0; x1 < 2; ++x1) {
        const cuuint64_t dims[4] = {l, 2, 4, cuuint64_t(rows / 16)};
        const cuuint64_t strides[3] = {l * 2, 4 * l * 2, 16 * l * 2};  // bytes
        const cuuint32_t box[4] = {64, 2, 4, 1}, estr[4] = {1, 1, 1, 1};
        void *at = const_cast<uint16_t *>(static_cast<const uint16_t *>(qkv)) + 2 * x1 * l;
        if (encode(x1 ? &maps.row2 : &maps.row0, CU_TENSOR_MAP_DATA_TYPE_UINT16, 4, at, dims, strides, box, estr,
                   CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
                   CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) != CUDA_SUCCESS)
            return cudaErrorInvalidValue;
    }
    return cudaSuccess;
}

// Each consumer warp's lane 0 arrives once its warp is done with a stage (4·NC arrivals per phase).
__device__ __forceinline__ void release(uint32_t bar) {
    __syncwarp();
    if ((threadIdx.x & 31) == 0) mbar_arrive(bar);
}

template <typename T, int NC, int BN>
__global__ void __launch_bounds__(128 * (NC + 1), 1) flash_fwd_ws_kernel(const __grid_constant__ Maps maps, const Params p) {
    static_assert(NC == 2 || NC == 3, "two or three consumer warpgroups");
    static_assert(BN == 64 || BN == 128, "key tiles of 64 or 128");
    static_assert(128 * kProducerRegs + 128 * NC * kConsumerRegs<NC> <= launch_regs(128 * (NC + 1)) * 128 * (NC + 1),
                  "setmaxnreg split beyond the block's registers");
    DST_GRID_DEPENDENCY();
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
    constexpr int NS = kStages, NT = BN / 8, DT = 8, NG = BN / 16;
    constexpr uint32_t kKV = uint32_t(BN / 64 * kTile);  // bytes of one K or V stage
    extern __shared__ __align__(16) unsigned char smem_raw[];
    const uint32_t base = (smem_addr(smem_raw) + 1023u) & ~1023u;
    const uint32_t sQ = base, sK = base + uint32_t(NC * kTile), sV = sK + NS * kKV;
    const uint32_t bars = sV + NS * kKV;  // kfull[NS], kempty[NS], vfull[NS], vempty[NS]
    auto kfull = [&](int st) { return bars + 8u * uint32_t(st); };
    auto kempty = [&](int st) { return bars + 8u * uint32_t(NS + st); };
    auto vfull = [&](int st) { return bars + 8u * uint32_t(2 * NS + st); };
    auto vempty = [&](int st) { return bars + 8u * uint32_t(3 * NS + st); };
    if (threadIdx.x < NS) {
        mbar_init(kfull(threadIdx.x), 1);
        mbar_init(vfull(threadIdx.x), 1);
        mbar_init(kempty(threadIdx.x), 4 * NC);
        mbar_init(vempty(threadIdx.x), 4 * NC);
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    __syncthreads();

    const int m_block = blockIdx.x % p.m_blocks, bh = blockIdx.x / p.m_blocks;
    const int b = bh / p.heads, h = bh % p.heads, S = p.seq;
    const int q0 = m_block * 64 * NC;
    const int kv_len = key_limit(p, b);
    // Warp-uniform for the compiler too (a shuffle's result is), so that the products' branches do
    // not make ptxas serialise the warpgroup MMAs.
    const int n_blk = __shfl_sync(0xffffffffu, ((p.causal ? min(kv_len, q0 + 64 * NC) : kv_len) + BN - 1) / BN, 0);
    const int wgi = __shfl_sync(0xffffffffu, int(threadIdx.x / 128), 0);
    if (wgi == 0) {  // the producer
        asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kProducerRegs) : "memory");
        if (threadIdx.x == 0)
            for (int nb = 0; nb < n_blk; ++nb) {
                const int st = nb % NS, use = nb / NS, group0 = (b * S + nb * BN) / 16;
                if (use > 0) mbar_wait(kempty(st), uint32_t(use - 1) & 1u);
                mbar_expect(kfull(st), kKV);
#pragma unroll
                for (int t = 0; t < BN / 64; ++t)
                    tma_tile(maps, sK + st * kKV + uint32_t(t * kTile), p.hidden + h * 64, group0 + 4 * t, kfull(st));
                if (use > 0) mbar_wait(vempty(st), uint32_t(use - 1) & 1u);
                mbar_expect(vfull(st), kKV);
#pragma unroll
                for (int t = 0; t < BN / 64; ++t)
                    tma_tile(maps, sV + st * kKV + uint32_t(t * kTile), 2 * p.hidden + h * 64, group0 + 4 * t, vfull(st));
            }
        return;
    }
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kConsumerRegs<NC>) : "memory");
    const int cw = wgi - 1, tid = threadIdx.x & 127, warp = tid >> 5, lane = threadIdx.x & 31;
    const int q0c = q0 + 64 * cw;
    const int64_t ld = 3 * int64_t(p.hidden);
    const T *gq = static_cast<const T *>(p.qkv) + int64_t(b) * S * ld + int64_t(h) * 64;
    const uint32_t sq = sQ + uint32_t(cw * kTile);
    {  // this warpgroup's Q rows (w1's copy)
        const int cchunk = tid & 7, crow = tid >> 3;
#pragma unroll
        for (int k = 0; k < 4; ++k) {
            const int r = 16 * k + crow, q = q0c + r;
            const bool ok = q < S;
            cp_async16(sq + sw128(r, cchunk), gq + (ok ? int64_t(q) * ld + cchunk * 8 : 0), ok ? 16 : 0);
        }
        cp_async_commit();
        cp_async_wait<0>();
        wg::fence_proxy_async();
        asm volatile("bar.sync %0, 128;\n" ::"r"(1 + cw) : "memory");
    }
    FwdRows w = fwd_rows(p, b, bh, q0c, warp * 16, lane);
    // Rows past the sequence (the last block's overhang) need no tile: such a warpgroup only frees the stages.
    const int n_mine =
        __shfl_sync(0xffffffffu, q0c >= S ? 0 : p.causal ? (min(kv_len, q0c + 64) + BN - 1) / BN : n_blk, 0);
    const uint64_t dq = wg::desc_sw128(sq);
    float o[DT][4], s[NT][4], sn[NT][4];
    uint32_t a[NG][4];
    zero(o);
    auto issue_s = [&](float (&acc)[NT][4], int nb) {
        const int st = nb % NS;
        mbar_wait(kfull(st), uint32_t(nb / NS) & 1u);
        const uint64_t dk = wg::desc_sw128(sK + st * kKV);
        wg::fence_regs(acc);
        wg::wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < 4; ++kk) wg::wgmma_ss<T, BN>(acc, dq + 2 * kk, dk + 2 * kk, kk > 0);
        wg::wgmma_commit();
    };
    // FlashAttention-3's order: while P̃·V of tile nb runs, the scores of tile nb + 1 (issued before
    // it) are softmaxed; o is rescaled and the A fragments rewritten only after that P̃·V is done, so
    // no other instruction writes a register an MMA in flight reads or writes.
    // P̃·V of tile nb is done: free its V stage; with rescale, apply the factors fwd_tile deferred
    // for tile nb + 1 (o holds the sums up to tile nb, relative to the maxima before it).
    auto drain_pv = [&](int nb, bool rescale) {
        wg::fence_regs(o);
        wg::fence_a(a);
        release(vempty(nb % NS));
        if (rescale && w.grew) {
#pragma unroll
            for (int dt = 0; dt < DT; ++dt)
#pragma unroll
                for (int e = 0; e < 4; ++e) o[dt][e] *= w.alpha[e >> 1];
        }
    };
    auto issue_pv = [&](int nb) {
        const int st = nb % NS;
        mbar_wait(vfull(st), uint32_t(nb / NS) & 1u);
        const uint64_t dv = wg::desc_sw128(sV + st * kKV);
        wg::fence_regs(o);
        wg::wgmma_fence();
#pragma unroll
        for (int G = 0; G < NG; ++G) wg::wgmma_rs_tb<T, 64>(o, a[G], dv + uint64_t(G) * (2048 >> 4), 1);
        wg::wgmma_commit();
    };
    // Tile nb's P̃ is in a; nxt receives tile nb + 1's scores (s and sn swap roles tile by tile). No
    // branch between an MMA's issue and its wait: ptxas then knows which group each wait retires.
    auto step_next = [&](float (&nxt)[NT][4], int nb) {
        issue_s(nxt, nb + 1);
        issue_pv(nb);
        wg::wgmma_wait<1>();  // the scores of nb + 1 (committed first)
        wg::fence_regs(nxt);
        release(kempty((nb + 1) % NS));
        fwd_tile<NT, DT, true>(p, w, (nb + 1) * BN, nxt, o);
        wg::wgmma_wait<0>();
        drain_pv(nb, true);
        to_a<T, NT>(a, nxt);
    };
    if (n_mine > 0) {
        issue_s(s, 0);
        wg::wgmma_wait<0>();
        wg::fence_regs(s);
        release(kempty(0));
        fwd_tile(p, w, 0, s, o);  // o is zero: nothing to defer
        to_a<T, NT>(a, s);
        int nb = 0;
        while (nb + 1 < n_mine) {
            step_next(sn, nb++);
            if (nb + 1 < n_mine) step_next(s, nb++);
        }
        issue_pv(nb);  // the last tile
        wg::wgmma_wait<0>();
        drain_pv(nb, false);
    }
    for (int nb = n_mine; nb < n_blk; ++nb) {  // the tiles only the other warpgroups need
        const int st = nb % NS;
        mbar_wait(kfull(st), uint32_t(nb / NS) & 1u);
        release(kempty(st));
        mbar_wait(vfull(st), uint32_t(nb / NS) & 1u);
        release(vempty(st));
    }
    fwd_store(p, w, static_cast<T *>(p.ctx) + int64_t(b) * S * p.hidden + int64_t(h) * 64, 64, o);
#else
    (void)maps, (void)p;
    __trap();  // built for another target: launched only from sm_90a objects (the lab: DST_LAB_SM90A)
#endif
}

// The shortest sequence the library sends here: below it the wgmma forward's smaller blocks fill the
// GPU better (bench/RESULTS.md, 2026-12-04 fifth session).
constexpr int kMinSeq = 1024;

// Whether this kernel takes the call: head dim 64 with 16-byte rows, padded batches (the TMA loads
// 16-row groups of the flattened rows), and S a multiple of the key tile, so that no tile reaches
// into the next sequence's rows (the last one's overhang reads zeros).
inline bool applies(const Params &p, int BN = 64) {
    return p.head_dim == 64 && p.vec16 && p.seq_start == nullptr && p.seq % BN == 0;
}

// The call on NC consumer warpgroups and key tiles of BN, or on the wgmma forward (kFwdWgmmaBlocks<BN>
// blocks per SM) where it does not apply or the tensor maps cannot be made.
template <typename T, int NC, int BN>
cudaError_t launch(Params p, cudaStream_t stream) {
    Maps maps;
    if (!applies(p, BN) || make_maps(maps, p.qkv, int64_t(p.batch) * p.seq, 3 * int64_t(p.hidden)) != cudaSuccess)
        return launch_fwd_wgmma<T, BN, kFwdWgmmaBlocks<BN>, true>(p, stream);
    p.m_blocks = static_cast<int>((p.seq + 64 * NC - 1) / (64 * NC));
    const auto kernel = flash_fwd_ws_kernel<T, NC, BN>;
    const cudaError_t e = allow_smem(kernel, smem_bytes<NC, BN>());
    if (e != cudaSuccess) return e;
    return launch_dependent(kernel, static_cast<unsigned>(p.m_blocks * int64_t(p.batch) * p.heads), 128 * (NC + 1),
                            smem_bytes<NC, BN>(), stream, maps, p);
}

}  // namespace ws
}  // namespace flash
}  // namespace cuda
}  // namespace dst

#endif  // DST_KERNELS_ATTENTION_FLASH_WS_CUH
