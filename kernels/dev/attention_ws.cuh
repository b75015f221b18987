// The attention lab's w8 (kernels/dev/attention_lab.cu): the wgmma forward warp-specialised, sm_90a only.
#ifndef DST_KERNELS_DEV_ATTENTION_WS_CUH
#define DST_KERNELS_DEV_ATTENTION_WS_CUH

#include <cuda.h>  // CUtensorMap (the encoder is fetched through the runtime: no libcuda link)
#include <cudaTypedefs.h>

#include "kernels/attention_flash_wgmma.cuh"

namespace dst {
namespace cuda {
// ---- w8: the forward warp-specialised (written 2026-12-04 without a GPU; not yet run) ------------
// A block of three warpgroups owns 128 query rows of one (batch, head): warpgroup 0 is the producer
// (one thread issues the TMA loads of every K and V tile, in perm16 order as above, into kStages
// stages, each with a full and an empty mbarrier; the warpgroup gives most of its registers away),
// warpgroups 1 and 2 are consumers of 64 rows each, running w1's arithmetic (fwd_tile, fwd_store, the
// same products) with the next tile's S = Q·Kᵀ issued before this tile's softmax, so the tensor
// cores work while the softmax and the dropout run (FlashAttention-3's intra-warpgroup overlap).
// The bits are w1's: the lab compares them. Calls it cannot take (head dim ≠ 64, packed rows, S not a
// multiple of 16, unaligned rows) run w1.
namespace ws {

constexpr int kStages = 3;
constexpr size_t kTile = 8192;  // 64 rows × 128 bytes
constexpr size_t kSmem = 1024 + 2 * kTile + 2 * kStages * kTile + 4 * kStages * 8;

struct Maps {
    CUtensorMap row0, row2;  // qkv as (columns, x0, x2 + 2·x3, 16-row group) at row 0 and at row 2
};

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
// from the driver once.
inline cudaError_t make_maps(Maps &maps, const void *qkv, int64_t rows, int64_t ld) {
    static PFN_cuTensorMapEncodeTiled_v12000 encode = nullptr;
    if (!encode) {
        void *fn = nullptr;
        cudaDriverEntryPointQueryResult q{};
        const cudaError_t e = cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &q);
        if (e != cudaSuccess || !fn || q != cudaDriverEntryPointSuccess) return cudaErrorNotSupported;
        encode = reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn);
    }
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

// Each consumer warp's lane 0 arrives once its warp is done with a stage (8 arrivals per phase).
__device__ __forceinline__ void release(uint32_t bar) {
    __syncwarp();
    if ((threadIdx.x & 31) == 0) mbar_arrive(bar);
}

template <typename T>
__global__ void __launch_bounds__(384, 1) flash_fwd_ws_kernel(const __grid_constant__ Maps maps, const flash::Params p) {
    using namespace flash;
    DST_GRID_DEPENDENCY();
    constexpr int NS = kStages, NT = 8, DT = 8, NG = 4;
    extern __shared__ __align__(16) unsigned char smem_raw[];
    const uint32_t base = (smem_addr(smem_raw) + 1023u) & ~1023u;
    const uint32_t sQ = base, sK = base + uint32_t(2 * kTile), sV = sK + uint32_t(NS * kTile);
    const uint32_t bars = sV + uint32_t(NS * kTile);  // kfull[NS], kempty[NS], vfull[NS], vempty[NS]
    auto kfull = [&](int st) { return bars + 8u * uint32_t(st); };
    auto kempty = [&](int st) { return bars + 8u * uint32_t(NS + st); };
    auto vfull = [&](int st) { return bars + 8u * uint32_t(2 * NS + st); };
    auto vempty = [&](int st) { return bars + 8u * uint32_t(3 * NS + st); };
    if (threadIdx.x < NS) {
        mbar_init(kfull(threadIdx.x), 1);
        mbar_init(vfull(threadIdx.x), 1);
        mbar_init(kempty(threadIdx.x), 8);
        mbar_init(vempty(threadIdx.x), 8);
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    __syncthreads();

    const int m_block = blockIdx.x % p.m_blocks, bh = blockIdx.x / p.m_blocks;
    const int b = bh / p.heads, h = bh % p.heads, S = p.seq;
    const int q0 = m_block * 128;
    const int kv_len = key_limit(p, b);
    // Warp-uniform for the compiler too (a shuffle's result is), so that the products' branches do
    // not make ptxas serialise the warpgroup MMAs.
    const int n_blk = __shfl_sync(0xffffffffu, ((p.causal ? min(kv_len, q0 + 128) : kv_len) + 63) / 64, 0);
    const int wgi = __shfl_sync(0xffffffffu, int(threadIdx.x / 128), 0);
    if (wgi == 0) {  // the producer
        asm volatile("setmaxnreg.dec.sync.aligned.u32 40;\n" ::: "memory");
        if (threadIdx.x == 0)
            for (int nb = 0; nb < n_blk; ++nb) {
                const int st = nb % NS, use = nb / NS, group0 = (b * S + nb * 64) / 16;
                if (use > 0) mbar_wait(kempty(st), uint32_t(use - 1) & 1u);
                mbar_expect(kfull(st), uint32_t(kTile));
                tma_tile(maps, sK + uint32_t(st * kTile), p.hidden + h * 64, group0, kfull(st));
                if (use > 0) mbar_wait(vempty(st), uint32_t(use - 1) & 1u);
                mbar_expect(vfull(st), uint32_t(kTile));
                tma_tile(maps, sV + uint32_t(st * kTile), 2 * p.hidden + h * 64, group0, vfull(st));
            }
        return;
    }
    asm volatile("setmaxnreg.inc.sync.aligned.u32 232;\n" ::: "memory");
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
    const int n_mine = __shfl_sync(0xffffffffu, p.causal ? (min(kv_len, q0c + 64) + 63) / 64 : n_blk, 0);
    const uint64_t dq = wg::desc_sw128(sq);
    float o[DT][4], s[NT][4], sn[NT][4];
    uint32_t a[NG][4];
    zero(o);
    auto issue_s = [&](float (&acc)[NT][4], int nb) {
        const int st = nb % NS;
        mbar_wait(kfull(st), uint32_t(nb / NS) & 1u);
        const uint64_t dk = wg::desc_sw128(sK + uint32_t(st * kTile));
        wg::fence_regs(acc);
        wg::wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < 4; ++kk) wg::wgmma_ss<T, 64>(acc, dq + 2 * kk, dk + 2 * kk, kk > 0);
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
        const uint64_t dv = wg::desc_sw128(sV + uint32_t(st * kTile));
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
        fwd_tile<NT, DT, true>(p, w, (nb + 1) * 64, nxt, o);
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
    for (int nb = n_mine; nb < n_blk; ++nb) {  // causal: the tiles only the other warpgroup needs
        const int st = nb % NS;
        mbar_wait(kfull(st), uint32_t(nb / NS) & 1u);
        release(kempty(st));
        mbar_wait(vfull(st), uint32_t(nb / NS) & 1u);
        release(vempty(st));
    }
    fwd_store(p, w, static_cast<T *>(p.ctx) + int64_t(b) * S * p.hidden + int64_t(h) * 64, 64, o);
}

// w8's launch: the two tensor maps of the call, or w1 where w8 does not apply.
template <typename T>
cudaError_t launch(flash::Params p, cudaStream_t stream) {
    const int64_t rows = int64_t(p.batch) * p.seq;
    if (p.head_dim != 64 || !p.vec16 || p.seq_start || p.seq % 16 != 0)
        return flash::launch_fwd_wgmma<T, 64, 3>(p, stream);
    Maps maps;
    const cudaError_t e0 = make_maps(maps, p.qkv, rows, 3 * int64_t(p.hidden));
    if (e0 != cudaSuccess) return e0;
    p.m_blocks = static_cast<int>((p.seq + 127) / 128);
    cudaError_t e = flash::allow_smem(flash_fwd_ws_kernel<T>, kSmem);
    if (e != cudaSuccess) return e;
    flash_fwd_ws_kernel<T><<<static_cast<unsigned>(p.m_blocks * int64_t(p.batch) * p.heads), 384, kSmem, stream>>>(maps, p);
    return cudaGetLastError();
}

}  // namespace ws

}  // namespace cuda
}  // namespace dst

#endif  // DST_KERNELS_DEV_ATTENTION_WS_CUH
