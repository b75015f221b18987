// Lab only (sm_90a, DST_LAB_SM90A): the flash attention forward on warpgroup MMAs (wgmma), head dim
// 64, fp16/bf16, every mask and dropout mode of the production forward (flash_fwd_kernel), with its
// results: the same softmax, dropout and store code on the same accumulator layout.
//
// One warpgroup (4 warps, 128 threads) per block of 64 query rows; warp w owns rows 16w … 16w + 15,
// as in the production kernel. Per key tile of BN keys (double-buffered, cp.async):
//   S = Q·Kᵀ   wgmma m64nBNk16 × 4, A = Q and B = K from shared memory (K-major descriptors)
//   softmax, masks, dropout on the fp32 accumulators in registers (the production code's layout)
//   O += P̃·V   wgmma m64n64k16 × BN/16, A = P̃ from registers (the m16n8k16 A fragments), B = V from
//              shared memory, MN-major (imm-trans-b)
// Shared tiles are rows of 128 bytes (64 elements), 128-byte swizzled (16-byte chunk c of row r at
// chunk c ^ (r & 7)), 1024-byte aligned. K and V rows are stored in perm16 order (row 16G + n holds
// key 16G + perm16(n)), so that column n of S, and row n of the P̃·V product's K dimension, is the
// key the production kernel has there: a lane's four columns of a row are one Philox group.
// Not yet run on a GPU (written 2026-12-02 without device time): the lab checks it against the fp64
// reference like every numbered version before any timing means anything.
#ifndef DST_KERNELS_DEV_ATTENTION_WGMMA_CUH
#define DST_KERNELS_DEV_ATTENTION_WGMMA_CUH

#include "kernels/attention_flash_impl.cuh"
#include "kernels/dev/wgmma_ops.cuh"

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
    const int kv_len = key_limit(p, b);
    const int n_end = p.causal ? min(kv_len, q0 + BM) : kv_len;
    const int n_blocks = (n_end + BN - 1) / BN;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    const int wrow = warp * 16;
    const int i0 = q0 + wrow + g, i1 = i0 + 8;
    const uint64_t row_base = uint64_t(bh) * uint64_t(S);

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

    const uint64_t grp0 = (row_base + uint64_t(i0)) * uint64_t(S / 4) + uint64_t(t);
    const uint64_t grp1 = grp0 + 2 * uint64_t(S);
    const bool has_bias = p.key_bias != nullptr;
    const float cexp = has_bias ? 1.0f : p.scale_log2;
    const uint64_t dq = wg::desc_sw128(sQ);

    float o[DT][4];
    zero(o);
    float m2[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};

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

        if (has_bias) {
#pragma unroll
            for (int G = 0; G < NG; ++G) {
                const int j = k0 + G * 16 + 4 * t;
                float b4[4];
#pragma unroll
                for (int x = 0; x < 4; ++x) b4[x] = j + x < S ? bias2_at(p, b, j + x) : 0.0f;
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    s[2 * G][e] = fmaf(s[2 * G][e], p.scale_log2, b4[e & 1]);
                    s[2 * G + 1][e] = fmaf(s[2 * G + 1][e], p.scale_log2, b4[2 + (e & 1)]);
                }
            }
        }
        if (k0 + BN > kv_len || (p.causal && k0 + BN - 1 > q0 + wrow)) {
#pragma unroll
            for (int nt = 0; nt < NT; ++nt)
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const int j = k0 + 16 * (nt >> 1) + 4 * t + 2 * (nt & 1) + (e & 1), i = e < 2 ? i0 : i1;
                    if (j >= kv_len || (p.causal && j > i)) s[nt][e] = -INFINITY;
                }
        }

        float alpha[2], neg[2];
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            float mx = -INFINITY;
#pragma unroll
            for (int nt = 0; nt < NT; ++nt) mx = fmaxf(mx, fmaxf(s[nt][2 * r], s[nt][2 * r + 1]));
            const float m_new = fmaxf(m2[r], quad_max(mx) * cexp);
            const float ref = m_new == -INFINITY ? 0.0f : m_new;
            alpha[r] = fast_exp2(m2[r] - ref);
            m2[r] = m_new;
            neg[r] = -ref;
        }
        float sum[2] = {0.0f, 0.0f};
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const float v = fast_exp2(fmaf(s[nt][e], cexp, neg[e >> 1]));
                sum[e >> 1] += v;
                s[nt][e] = v;
            }
        l[0] = fmaf(l[0], alpha[0], sum[0]);
        l[1] = fmaf(l[1], alpha[1], sum[1]);
#pragma unroll
        for (int dt = 0; dt < DT; ++dt)
#pragma unroll
            for (int e = 0; e < 4; ++e) o[dt][e] *= alpha[e >> 1];

        auto drop = [&](int G, int r, const uint4 &w) {
            if (w.x < p.threshold) s[2 * G][2 * r] = 0.0f;
            if (w.y < p.threshold) s[2 * G][2 * r + 1] = 0.0f;
            if (w.z < p.threshold) s[2 * G + 1][2 * r] = 0.0f;
            if (w.w < p.threshold) s[2 * G + 1][2 * r + 1] = 0.0f;
        };
        if (p.dropout && p.aligned4) {
#pragma unroll
            for (int G = 0; G < NG; ++G)
#pragma unroll
                for (int r = 0; r < 2; ++r) drop(G, r, philox_group(p, (r ? grp1 : grp0) + uint64_t(k0 / 4 + 4 * G)));
        } else if (p.dropout) {
#pragma unroll
            for (int G = 0; G < NG; ++G)
#pragma unroll
                for (int r = 0; r < 2; ++r) {
                    const uint64_t e0 = (row_base + uint64_t(r ? i1 : i0)) * uint64_t(S) + uint64_t(k0 + 16 * G + 4 * t);
                    drop(G, r, make_uint4(philox_word(p, e0), philox_word(p, e0 + 1), philox_word(p, e0 + 2),
                                          philox_word(p, e0 + 3)));
                }
        }

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

    T *gctx = static_cast<T *>(p.ctx) + int64_t(b) * S * p.hidden + int64_t(h) * 64;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        const float lt = quad_sum(l[r]);
        const int i = r ? i1 : i0;
        if (i >= S) continue;
        const float inv = lt > 0.0f ? p.drop_scale / lt : 0.0f;
        T *row = gctx + int64_t(i) * p.hidden;
#pragma unroll
        for (int dt = 0; dt < DT; ++dt) store2(row, dt * 8 + 2 * t, 64, o[dt][2 * r] * inv, o[dt][2 * r + 1] * inv);
        if (p.lse && t == 0) p.lse[row_base + i] = lt > 0.0f ? (m2[r] + log2f(lt)) * kLn2 : -INFINITY;
    }
#else
    (void)p;
    __trap();  // built for another target: the lab lists this version only with DST_LAB_SM90A
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
#endif  // DST_KERNELS_DEV_ATTENTION_WGMMA_CUH
