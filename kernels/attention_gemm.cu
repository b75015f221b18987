// Glue kernels of the tensor-core attention path (see attention_gemm.cuh): pack/unpack between
// [B, S, nblk·H] and [nblk][B·heads][S][d] in 16-byte units, and the row-wise softmax forward and
// backward. Softmax: one warp per row of S ≤ kAttentionGemmMaxSeq keys; lane l owns the chunks of
// four consecutive keys 4·(l + 32·c) … +3 (c < NCH), held in registers, so one Philox block serves
// a chunk when S % 4 == 0 (element groups e >> 2 align with the chunks) and loads/stores are
// vectors. Math in fp32 with accurate expf/logf, the rules of backend.h: P = exp(s − lse),
// fully masked rows give P = 0 and lse = −inf.
#include "kernels/attention_gemm.cuh"

#include <type_traits>

#include "kernels/dispatch.cuh"
#include "kernels/philox.h"

namespace dst {
namespace cuda {
namespace {

struct SmArgs {
    int64_t seq, heads, hidden, head_dim;
    float scale;
    bool causal;
    const float *key_bias;   // [B, S] or nullptr
    const int32_t *key_len;  // [B] or nullptr
    uint64_t seed, offset;
    uint32_t threshold;      // 0: no dropout
    float dscale;
};

template <typename T>
struct alignas(4 * sizeof(T)) Vec4 {
    T v[4];
};

__device__ __forceinline__ float to_f(float v) { return v; }
__device__ __forceinline__ float to_f(__half v) { return __half2float(v); }
__device__ __forceinline__ float to_f(__nv_bfloat16 v) { return __bfloat162float(v); }

// Four consecutive values from p (n valid; vec: 4·sizeof(X)-aligned and all four valid).
template <typename X>
__device__ __forceinline__ void load4(const X *p, bool vec, int64_t n, float (&out)[4]) {
    if (vec) {
        const Vec4<X> t = *reinterpret_cast<const Vec4<X> *>(p);
#pragma unroll
        for (int u = 0; u < 4; ++u) out[u] = to_f(t.v[u]);
    } else {
#pragma unroll
        for (int u = 0; u < 4; ++u) out[u] = u < n ? to_f(p[u]) : 0.0f;
    }
}

template <typename T>
__device__ __forceinline__ void store4(T *p, bool vec, int64_t n, const float (&in)[4]) {
    if (vec) {
        Vec4<T> t;
#pragma unroll
        for (int u = 0; u < 4; ++u) t.v[u] = to_storage<T>(in[u]);
        *reinterpret_cast<Vec4<T> *>(p) = t;
    } else {
#pragma unroll
        for (int u = 0; u < 4; ++u)
            if (u < n) p[u] = to_storage<T>(in[u]);
    }
}

// Keep flags of elements e0 … e0+3 (aligned: e0 % 4 == 0, one Philox block).
__device__ __forceinline__ void keep4(const SmArgs &a, uint64_t e0, bool aligned, bool (&k)[4]) {
    if (aligned) {
        const Philox4 r = philox_dropout_block(a.seed, a.offset, e0 >> 2);
#pragma unroll
        for (int u = 0; u < 4; ++u) k[u] = r.v[u] >= a.threshold;
    } else {
#pragma unroll
        for (int u = 0; u < 4; ++u) k[u] = philox_dropout_keep(a.seed, a.offset, e0 + u, a.threshold);
    }
}

__device__ __forceinline__ float warp_max_f(float v) {
    for (int off = 16; off > 0; off >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, off));
    return v;
}

__device__ __forceinline__ int64_t kv_limit(const SmArgs &a, int64_t b) {
    if (!a.key_len) return a.seq;
    const int64_t len = a.key_len[b];
    return len < 0 ? 0 : (len > a.seq ? a.seq : len);
}

// Scaled, masked score; −inf where key j of query i is not visible (or past the row).
__device__ __forceinline__ float masked(const SmArgs &a, float raw, int64_t b, int64_t i, int64_t j,
                                       int64_t kvl) {
    if (j >= kvl || (a.causal && j > i)) return -INFINITY;
    float v = a.scale * raw;
    if (a.key_bias) v += a.key_bias[b * a.seq + j];
    return v;
}

template <typename T, int NCH>
__global__ void __launch_bounds__(128)
    softmax_fwd_kernel(const SmArgs a, int64_t rows, const float *scores, T *ptilde, int64_t ldp, T *probs,
                       float *lse) {
    const int lane = threadIdx.x & 31;
    const int64_t row = int64_t(blockIdx.x) * 4 + (threadIdx.x >> 5);
    if (row >= rows) return;
    const int64_t S = a.seq, bh = row / S, i = row - bh * S, b = bh / a.heads;
    const int64_t kvl = kv_limit(a, b);
    const bool vec = (S & 3) == 0;
    float v[NCH][4];
    float mx = -INFINITY;
#pragma unroll
    for (int c = 0; c < NCH; ++c) {
        const int64_t j0 = 4 * (lane + 32 * c);
        float raw[4] = {0.f, 0.f, 0.f, 0.f};
        if (j0 < S) load4(scores + row * S + j0, vec, S - j0, raw);
#pragma unroll
        for (int u = 0; u < 4; ++u) {
            v[c][u] = masked(a, raw[u], b, i, j0 + u, kvl);
            mx = fmaxf(mx, v[c][u]);
        }
    }
    mx = warp_max_f(mx);
    float l = -INFINITY;
    if (mx != -INFINITY) {
        float sum = 0.f;
#pragma unroll
        for (int c = 0; c < NCH; ++c)
#pragma unroll
            for (int u = 0; u < 4; ++u) sum += expf(v[c][u] - mx);
        l = mx + logf(warp_sum(sum));
    }
    if (lse && lane == 0) lse[row] = l;
    __syncwarp();  // every lane has read its part of the row (ptilde may alias scores)
#pragma unroll
    for (int c = 0; c < NCH; ++c) {
        const int64_t j0 = 4 * (lane + 32 * c);
        if (j0 >= S) break;
        float p[4];
#pragma unroll
        for (int u = 0; u < 4; ++u) p[u] = l == -INFINITY ? 0.f : expf(v[c][u] - l);
        if (probs) store4(probs + row * S + j0, vec, S - j0, p);
        if (a.threshold != 0u) {
            bool k[4];
            keep4(a, static_cast<uint64_t>(row * S + j0), vec, k);
#pragma unroll
            for (int u = 0; u < 4; ++u) p[u] = k[u] ? p[u] * a.dscale : 0.f;
        }
        store4(ptilde + row * ldp + j0, vec, S - j0, p);
    }
}

template <typename T, int NCH>
__global__ void __launch_bounds__(128)
    softmax_bwd_kernel(const SmArgs a, int64_t rows, const float *scores, const T *probs, const float *lse,
                       const float *dp, const T *ctx, const T *dctx, T *ptilde, int64_t ldp, T *ds,
                       int64_t lds) {
    const int lane = threadIdx.x & 31;
    const int64_t row = int64_t(blockIdx.x) * 4 + (threadIdx.x >> 5);
    if (row >= rows) return;
    const int64_t S = a.seq, bh = row / S, i = row - bh * S, b = bh / a.heads, h = bh - b * a.heads;
    const int64_t kvl = kv_limit(a, b);
    const bool vec = (S & 3) == 0;

    const int64_t base = (b * S + i) * a.hidden + h * a.head_dim;
    float D = 0.f;
    for (int64_t t = lane; t < a.head_dim; t += 32) D = fmaf(to_f(dctx[base + t]), to_f(ctx[base + t]), D);
    D = warp_sum(D);

    const float l = probs ? 0.f : lse[row];
    float pv[NCH][4], dv[NCH][4];
#pragma unroll
    for (int c = 0; c < NCH; ++c) {
        const int64_t j0 = 4 * (lane + 32 * c);
#pragma unroll
        for (int u = 0; u < 4; ++u) pv[c][u] = dv[c][u] = 0.f;
        if (j0 >= S) continue;
        load4(dp + row * S + j0, vec, S - j0, dv[c]);
        if (probs) {
            load4(probs + row * S + j0, vec, S - j0, pv[c]);
        } else {
            float raw[4];
            load4(scores + row * S + j0, vec, S - j0, raw);
#pragma unroll
            for (int u = 0; u < 4; ++u) {
                const float s = masked(a, raw[u], b, i, j0 + u, kvl);
                pv[c][u] = (s == -INFINITY || l == -INFINITY) ? 0.f : expf(s - l);
            }
        }
    }
    __syncwarp();  // the row is read before any lane writes (ptilde/ds may alias scores/dp)
#pragma unroll
    for (int c = 0; c < NCH; ++c) {
        const int64_t j0 = 4 * (lane + 32 * c);
        if (j0 >= S) break;
        bool k[4] = {true, true, true, true};
        if (a.threshold != 0u) keep4(a, static_cast<uint64_t>(row * S + j0), vec, k);
        float pt[4], g[4];
#pragma unroll
        for (int u = 0; u < 4; ++u) {
            const float f = a.threshold != 0u ? (k[u] ? a.dscale : 0.f) : 1.f;
            pt[u] = pv[c][u] * f;
            g[u] = pv[c][u] * (dv[c][u] * f - D);
        }
        store4(ptilde + row * ldp + j0, vec, S - j0, pt);
        store4(ds + row * lds + j0, vec, S - j0, g);
    }
}

// dst/src in 16-byte units; t walks the packed layout [nblk][B·heads][S][U].
__global__ void pack_kernel(const uint4 *__restrict__ src, uint4 *__restrict__ dst, int64_t total, int64_t U,
                            int64_t S, int64_t BH, int64_t heads, int64_t HU, int nblk, bool unpack) {
    for (int64_t t = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; t < total;
         t += int64_t(gridDim.x) * blockDim.x) {
        const int64_t u = t % U;
        int64_t r = t / U;
        const int64_t i = r % S;
        r /= S;
        const int64_t bh = r % BH, k = r / BH, b = bh / heads, h = bh - b * heads;
        const int64_t s = ((b * S + i) * nblk + k) * HU + h * U + u;
        if (unpack) dst[s] = src[t];
        else dst[t] = src[s];
    }
}

dst_status pack_impl(cudaStream_t stream, const AttentionLaunch &a, int nblk, const void *src, void *dst,
                     bool unpack) {
    const int64_t es = a.dt == DST_DTYPE_FP32 ? 4 : 2;
    const int64_t U = a.head_dim * es / 16, HU = a.hidden * es / 16, BH = a.batch * a.heads;
    const int64_t total = nblk * BH * a.seq * U;
    if (total <= 0) return DST_OK;
    pack_kernel<<<grid_blocks(total, 256, 1 << 20), 256, 0, stream>>>(
        static_cast<const uint4 *>(src), static_cast<uint4 *>(dst), total, U, a.seq, BH, a.heads, HU, nblk,
        unpack);
    DST_CUDA_LAUNCH_CHECK();
    return DST_OK;
}

SmArgs make_sm_args(const AttentionLaunch &l) {
    SmArgs a;
    a.seq = l.seq;
    a.heads = l.heads;
    a.hidden = l.hidden;
    a.head_dim = l.head_dim;
    a.scale = static_cast<float>(l.scale);
    a.causal = l.causal;
    a.key_bias = static_cast<const float *>(l.key_bias);
    a.key_len = l.key_len;
    a.seed = l.dropout.seed;
    a.offset = l.dropout.offset;
    a.threshold = l.dropout.threshold;
    a.dscale = static_cast<float>(l.dropout.scale);
    return a;
}

// Calls f(std::integral_constant<int, NCH>) with the chunks per lane that cover S.
template <typename F>
dst_status dispatch_chunks(int64_t S, F &&f) {
    if (S <= 128) return f(std::integral_constant<int, 1>{});
    if (S <= 256) return f(std::integral_constant<int, 2>{});
    if (S <= 512) return f(std::integral_constant<int, 4>{});
    if (S <= kAttentionGemmMaxSeq) return f(std::integral_constant<int, 8>{});
    return set_error(DST_ERR_UNSUPPORTED, "cuda backend: attention softmax supports S ≤ %lld, got %lld",
                     static_cast<long long>(kAttentionGemmMaxSeq), static_cast<long long>(S));
}

// Calls f(T{}) for the storage types of this path.
template <typename F>
dst_status dispatch_gemm_dtype(dst_dtype dt, F &&f) {
    switch (dt) {
        case DST_DTYPE_FP32: return f(float{});
        case DST_DTYPE_FP16: return f(__half{});
        case DST_DTYPE_BF16: return f(__nv_bfloat16{});
        default: break;
    }
    return set_error(DST_ERR_INVALID_ARGUMENT, "cuda backend: attention (GEMM path): unsupported dtype %d",
                     static_cast<int>(dt));
}

}  // namespace

dst_status attention_pack(cudaStream_t stream, const AttentionLaunch &a, int nblk, const void *src,
                          void *dst) {
    return pack_impl(stream, a, nblk, src, dst, false);
}

dst_status attention_unpack(cudaStream_t stream, const AttentionLaunch &a, int nblk, const void *src,
                            void *dst) {
    return pack_impl(stream, a, nblk, src, dst, true);
}

dst_status attention_softmax_fwd(cudaStream_t stream, const AttentionLaunch &l, const float *scores,
                                 void *ptilde, int64_t ldp, void *probs, float *lse) {
    const int64_t rows = l.batch * l.heads * l.seq;
    if (rows <= 0) return DST_OK;
    return dispatch_gemm_dtype(l.dt, [&](auto tag) {
        using T = decltype(tag);
        return dispatch_chunks(l.seq, [&](auto nch) {
            constexpr int NCH = decltype(nch)::value;
            softmax_fwd_kernel<T, NCH><<<static_cast<unsigned>((rows + 3) / 4), 128, 0, stream>>>(
                make_sm_args(l), rows, scores, static_cast<T *>(ptilde), ldp, static_cast<T *>(probs), lse);
            DST_CUDA_LAUNCH_CHECK();
            return DST_OK;
        });
    });
}

dst_status attention_softmax_bwd(cudaStream_t stream, const AttentionLaunch &l, const float *scores,
                                 const void *probs, const float *lse, const float *dp, const void *ctx,
                                 const void *dctx, void *ptilde, int64_t ldp, void *ds, int64_t lds) {
    const int64_t rows = l.batch * l.heads * l.seq;
    if (rows <= 0) return DST_OK;
    return dispatch_gemm_dtype(l.dt, [&](auto tag) {
        using T = decltype(tag);
        return dispatch_chunks(l.seq, [&](auto nch) {
            constexpr int NCH = decltype(nch)::value;
            softmax_bwd_kernel<T, NCH><<<static_cast<unsigned>((rows + 3) / 4), 128, 0, stream>>>(
                make_sm_args(l), rows, scores, static_cast<const T *>(probs), lse, dp,
                static_cast<const T *>(ctx), static_cast<const T *>(dctx), static_cast<T *>(ptilde), ldp,
                static_cast<T *>(ds), lds);
            DST_CUDA_LAUNCH_CHECK();
            return DST_OK;
        });
    });
}

}  // namespace cuda
}  // namespace dst
