// The flash attention forward on warpgroup MMAs (wgmma, sm_90a only), head dim 64, fp16/bf16, every
// mask and dropout mode of the mma.sync forward (flash_fwd_kernel in kernels/attention_flash_impl.cuh),
// with its results: the same softmax, dropout and store code on the same accumulator layout. The
// library runs it on compute capability 9.0 devices for head_dim 64 with 16-byte rows
// (kernels/sm90/attention_flash_fwd_wgmma.cu, built only when CMAKE_CUDA_ARCHITECTURES lists 90); the
// lab (kernels/dev) times it as w1–w3 next to the mma.sync versions.
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

// Inverse of perm16: the row n (0…15) of a 16-key group that holds key x.
DST_WGA_DEV int perm16_inv(int x) { return 8 * ((x >> 1) & 1) + 2 * (x >> 2) + (x & 1); }

// Byte offset of 16-byte chunk c of row r in a 128-byte-swizzled tile.
DST_WGA_DEV uint32_t sw128(int r, int c) { return uint32_t(r) * 128u + (uint32_t(c ^ (r & 7)) << 4); }

template <typename T, int BN, int MB>
__global__ void __launch_bounds__(128, MB) flash_fwd_wgmma_kernel(const Params p) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
    using Tr = WgTraits<BN>;
    constexpr int BM = Tr::kBM, NT = BN / 8, NG = BN / 16, DT = 8;
    extern __shared__ __align__(16) unsigned char smem_raw[];
    const uint32_t base = (smem_addr(smem_raw) + 1023u) & ~1023u;
    const uint32_t sQ = base, sKV0 = base + uint32_t(Tr::kQ);  // stage st: K at sKV0 + 2·st·kTile, V after it

    const int m_block = blockIdx.x % p.m_blocks, bh = blockIdx.x / p.m_blocks;
    const int b = bh / p.heads, h = bh % p.heads, S = p.seq;
    const int q0 = m_block * BM;
    const int64_t ld = 3 * int64_t(p.hidden);
    const T *gq = static_cast<const T *>(p.qkv) + int64_t(b) * S * ld + int64_t(h) * 64;
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
            const bool ok = key < S;
            const int64_t off = ok ? int64_t(key) * ld + cchunk * 8 : 0;
            const uint32_t o = sw128(16 * k + kv_row, cchunk);
            cp_async16(sk + o, gk + off, ok ? 16 : 0);
            cp_async16(sv + o, gv + off, ok ? 16 : 0);
        }
    };
#pragma unroll
    for (int k = 0; k < BM / 16; ++k) {
        const int r = 16 * k + crow, q = q0 + r;
        const bool ok = q < S;
        cp_async16(sQ + sw128(r, cchunk), gq + (ok ? int64_t(q) * ld + cchunk * 8 : 0), ok ? 16 : 0);
    }
    if (n_blocks > 0) stage_kv(0, 0);
    cp_async_commit();

    const uint64_t dq = wg::desc_sw128(sQ);

    float o[DT][4];
    zero(o);

    for (int nb = 0; nb < n_blocks; ++nb) {
        const int k0 = nb * BN, st = nb & 1;
        cp_async_wait<0>();
        wg::fence_proxy_async();  // this thread's cp.async writes, visible to the async proxy
        __syncthreads();          // everyone's; and every MMA of the other stage has completed
        if (nb + 1 < n_blocks) stage_kv(nb + 1, st ^ 1);
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

    fwd_store(p, w, static_cast<T *>(p.ctx) + int64_t(b) * S * p.hidden + int64_t(h) * 64, 64, o);
#else
    (void)p;
    __trap();  // built for another target: the library launches it only from its sm_90a object, the lab only
               // with DST_LAB_SM90A
#endif
}

// Head dim 64 and 16-byte aligned rows only (else cudaErrorInvalidValue).
template <typename T, int BN, int MB>
cudaError_t launch_fwd_wgmma(Params p, cudaStream_t stream) {
    using Tr = WgTraits<BN>;
    if (p.head_dim != 64 || !p.vec16) return cudaErrorInvalidValue;
    p.m_blocks = static_cast<int>(tiles_of(p.seq, Tr::kBM));
    const auto kernel = flash_fwd_wgmma_kernel<T, BN, MB>;
    cudaError_t e = allow_smem(kernel, Tr::kSmem);
    if (e != cudaSuccess) return e;
    kernel<<<static_cast<unsigned>(p.m_blocks * int64_t(p.batch) * p.heads), Tr::kThreads, Tr::kSmem, stream>>>(p);
    return cudaGetLastError();
}

}  // namespace flash
}  // namespace cuda
}  // namespace dst

#undef DST_WGA_DEV
#endif  // DST_KERNELS_ATTENTION_FLASH_WGMMA_CUH
