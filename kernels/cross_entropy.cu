// Softmax cross-entropy over the logits of the selected rows.
//   count_kernel: one block counts the valid labels, those in [0, v) (an integer sum: exact).
//   ce_row_kernel: one block per row: (max, first argmax) by a fixed tree, Σ exp(z − max) by
//     block_sum, lse = max + log Σ; row loss lse − z[label] and hit; then the gradient row
//     g = (exp(z − lse) − [c = label])·grad_scale/count rounded to storage (0 for ignored rows).
//   ce_row_reg_kernel: the same row in registers, for fp32 arithmetic, an even v up to 2·K·1024 and
//     pair-aligned tensors: 1024 threads per row, thread t holding the pairs 2t + 2048k (k < K) with
//     the bias added once, so the row is read from memory once and its three passes run on registers.
//     ce_row_kernel reads it three times, from DRAM where the rows in flight exceed the L2 (BERT's
//     ~1 200 masked rows × 30 522 fp32 logits, 147 MB: 490 MB of traffic, 281 against 141 µs on the
//     H200). The sums run in another order than ce_row_kernel's
//     (per-thread partials of at most 2K terms, then a 1024-thread tree): fixed for a shape, not the
//     same bits as the other form. (A shared-memory copy of the row with ce_row_kernel's order, one
//     256-thread block per SM, was slower than the global form: 335 against 281 µs for BERT's rows.)
//   ce_reduce_kernel: one block adds the row losses and hits in a fixed order and divides by count.
// Arithmetic in compute_t<T>; the logits are never rounded to the storage type.
#include "kernels/cross_entropy.cuh"

#include <type_traits>

#include "kernels/dispatch.cuh"

namespace dst {
namespace cuda {
namespace {

constexpr int kThreads = 256;

size_t align256(size_t v) { return (v + 255) / 256 * 256; }

// ================================ kernels ========================================================

__global__ void count_kernel(const int32_t *__restrict__ labels, int64_t m, int64_t v, int32_t *count) {
    __shared__ int32_t scratch[33];
    int32_t c = 0;
    for (int64_t i = threadIdx.x; i < m; i += blockDim.x) c += labels[i] >= 0 && labels[i] < v;
    c = block_sum(c, scratch);
    if (threadIdx.x == 0) *count = c;
}

// Largest value and its smallest index over the block (every thread gets them).
template <typename C>
__device__ void block_argmax(C &val, int64_t &idx, C *sval, int64_t *sidx) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    for (int off = 16; off > 0; off >>= 1) {
        const C ov = __shfl_xor_sync(0xffffffffu, val, off);
        const int64_t oi = __shfl_xor_sync(0xffffffffu, idx, off);
        if (ov > val || (ov == val && oi < idx)) {
            val = ov;
            idx = oi;
        }
    }
    __syncthreads();
    if (lane == 0) {
        sval[warp] = val;
        sidx[warp] = idx;
    }
    __syncthreads();
    if (warp == 0) {
        C v = lane < warps ? sval[lane] : neg_inf<C>();
        int64_t i = lane < warps ? sidx[lane] : INT64_MAX;
        for (int off = 16; off > 0; off >>= 1) {
            const C ov = __shfl_xor_sync(0xffffffffu, v, off);
            const int64_t oi = __shfl_xor_sync(0xffffffffu, i, off);
            if (ov > v || (ov == v && oi < i)) {
                v = ov;
                i = oi;
            }
        }
        if (lane == 0) {
            sval[32] = v;
            sidx[32] = i;
        }
    }
    __syncthreads();
    val = sval[32];
    idx = sidx[32];
}

template <typename T>
__global__ void ce_row_kernel(const compute_t<T> *z, const T *__restrict__ b, const int32_t *__restrict__ labels,
                              int64_t v, compute_t<T> grad_scale, const int32_t *__restrict__ count, T *g,
                              compute_t<T> *__restrict__ row_loss, int32_t *__restrict__ row_hit) {
    using C = compute_t<T>;
    __shared__ C sval[33];
    __shared__ int64_t sidx[33];
    const int64_t row = blockIdx.x;
    const C *zr = z + row * v;
    const int32_t y = labels[row];
    auto logit = [&](int64_t c) { return zr[c] + (b ? to_compute(b[c]) : C(0)); };
    if (y < 0 || y >= v) {  // −1; a label outside [0, v) (a deferred check reports it) is ignored too
        if (threadIdx.x == 0) {
            row_loss[row] = C(0);
            row_hit[row] = 0;
        }
        if (g)
            for (int64_t c = threadIdx.x; c < v; c += blockDim.x) g[row * v + c] = to_storage<T>(C(0));
        return;
    }
    C mx = neg_inf<C>();
    int64_t arg = INT64_MAX;
    for (int64_t c = threadIdx.x; c < v; c += blockDim.x) {
        const C zc = logit(c);
        if (zc > mx) {  // strided visits in increasing c: the first of equal values stays
            mx = zc;
            arg = c;
        }
    }
    block_argmax(mx, arg, sval, sidx);
    C se = 0;
    for (int64_t c = threadIdx.x; c < v; c += blockDim.x) se += dexp(logit(c) - mx);
    se = block_sum(se, sval);
    const C lse = mx + dlog(se);
    if (threadIdx.x == 0) {
        row_loss[row] = lse - logit(y);
        row_hit[row] = arg == y;
    }
    if (!g) return;
    const int32_t n = *count;
    const C scale = n > 0 ? grad_scale / C(n) : C(0);
    __syncthreads();  // every thread has read its logits (g may alias z)
    for (int64_t c = threadIdx.x; c < v; c += blockDim.x) {
        const C pc = dexp(logit(c) - lse) - (c == y ? C(1) : C(0));
        g[row * v + c] = to_storage<T>(pc * scale);
    }
}

constexpr int kRegThreads = 1024;

// A pair of adjacent elements, loaded and stored as one access.
template <typename E>
struct alignas(2 * sizeof(E)) Pair {
    E x, y;
};

template <typename T, int K>
__global__ void __launch_bounds__(kRegThreads)
    ce_row_reg_kernel(const float *__restrict__ z, const T *__restrict__ b, const int32_t *__restrict__ labels,
                      int64_t v, float grad_scale, const int32_t *__restrict__ count, T *g,
                      float *__restrict__ row_loss, int32_t *__restrict__ row_hit) {
    __shared__ float sval[33];
    __shared__ int64_t sidx[33];
    const int64_t row = blockIdx.x;
    const int n = static_cast<int>(v);  // v ≤ 2·K·1024
    const int32_t y = labels[row];
    const float *zr = z + row * v;
    if (y < 0 || y >= n) {  // as ce_row_kernel
        if (threadIdx.x == 0) {
            row_loss[row] = 0.0f;
            row_hit[row] = 0;
        }
        if (g)
            for (int c = threadIdx.x; c < n; c += kRegThreads) g[row * v + c] = to_storage<T>(0.0f);
        return;
    }
    float x[2 * K];
    float mx = neg_inf<float>();
    int64_t arg = INT64_MAX;
#pragma unroll
    for (int k = 0; k < K; ++k) {
        const int c = 2 * (int(threadIdx.x) + k * kRegThreads);
        if (c < n) {  // n is even: c + 1 < n too
            const Pair<float> p = *reinterpret_cast<const Pair<float> *>(zr + c);
            float b0 = 0.0f, b1 = 0.0f;
            if (b) {
                const Pair<T> q = *reinterpret_cast<const Pair<T> *>(b + c);
                b0 = to_compute(q.x);
                b1 = to_compute(q.y);
            }
            x[2 * k] = p.x + b0;  // the logit as ce_row_kernel forms it
            x[2 * k + 1] = p.y + b1;
            if (x[2 * k] > mx) {  // increasing c within the thread: the first of equal values stays
                mx = x[2 * k];
                arg = c;
            }
            if (x[2 * k + 1] > mx) {
                mx = x[2 * k + 1];
                arg = c + 1;
            }
        }
    }
    block_argmax(mx, arg, sval, sidx);
    float se = 0.0f;
#pragma unroll
    for (int k = 0; k < K; ++k)
        if (2 * (int(threadIdx.x) + k * kRegThreads) < n) se += dexp(x[2 * k] - mx) + dexp(x[2 * k + 1] - mx);
    se = block_sum(se, sval);
    const float lse = mx + dlog(se);
    if (threadIdx.x == 0) {
        row_loss[row] = lse - (zr[y] + (b ? to_compute(b[y]) : 0.0f));
        row_hit[row] = arg == y;
    }
    if (!g) return;
    const int32_t cnt = *count;
    const float scale = cnt > 0 ? grad_scale / float(cnt) : 0.0f;
    __syncthreads();  // every thread has read its logits (g may alias z)
#pragma unroll
    for (int k = 0; k < K; ++k) {
        const int c = 2 * (int(threadIdx.x) + k * kRegThreads);
        if (c < n) {
            Pair<T> o;
            o.x = to_storage<T>((dexp(x[2 * k] - lse) - (c == y ? 1.0f : 0.0f)) * scale);
            o.y = to_storage<T>((dexp(x[2 * k + 1] - lse) - (c + 1 == y ? 1.0f : 0.0f)) * scale);
            *reinterpret_cast<Pair<T> *>(g + row * v + c) = o;
        }
    }
}

template <typename C>
__global__ void ce_reduce_kernel(const C *__restrict__ row_loss, const int32_t *__restrict__ row_hit, int64_t m,
                                 const int32_t *__restrict__ count, C *loss, int32_t *counts) {
    __shared__ C scratch[33];
    __shared__ int32_t iscratch[33];
    C s = 0;
    int32_t h = 0;
    for (int64_t i = threadIdx.x; i < m; i += blockDim.x) {
        s += row_loss[i];
        h += row_hit[i];
    }
    s = block_sum(s, scratch);
    h = block_sum(h, iscratch);
    if (threadIdx.x == 0) {
        const int32_t n = *count;
        loss[0] = n > 0 ? s / C(n) : C(0);
        if (counts) {
            counts[0] = n;
            counts[1] = h;
        }
    }
}

}  // namespace

// ================================ launchers ======================================================

size_t cross_entropy_workspace(dst_dtype dt, int64_t m) {
    return align256(static_cast<size_t>(m) * compute_size(dt)) + align256(static_cast<size_t>(m) * 4) + 256;
}

cudaError_t cross_entropy(cudaStream_t stream, dst_dtype dt, const void *z, const void *b, const int32_t *labels,
                         int64_t m, int64_t v, double grad_scale, void *g, void *loss, int32_t *counts,
                         void *workspace) {
    if (m <= 0 || v <= 0) return cudaErrorInvalidValue;
    return dispatch_dtype(dt, [&](auto tag) {
        using T = decltype(tag);
        using C = compute_t<T>;
        char *p = static_cast<char *>(workspace);
        C *row_loss = reinterpret_cast<C *>(p);
        p += align256(static_cast<size_t>(m) * sizeof(C));
        int32_t *row_hit = reinterpret_cast<int32_t *>(p);
        p += align256(static_cast<size_t>(m) * 4);
        int32_t *count = reinterpret_cast<int32_t *>(p);
        count_kernel<<<1, 1024, 0, stream>>>(labels, m, v, count);
        DST_KERNEL_CHECK(cudaGetLastError());
        // The register form where it applies (fp32 arithmetic, v even and at most 32 768, every row and the
        // bias pair-aligned), K the fewest pairs per thread that hold the row.
        const bool pairs = v % 2 == 0 && aligned_to(z, 2 * sizeof(C)) && (!b || aligned_to(b, 2 * sizeof(T))) &&
                           (!g || aligned_to(g, 2 * sizeof(T)));
        int K = 0;
        if constexpr (std::is_same_v<C, float>)
            if (pairs)
                for (int k : {1, 2, 4, 8, 16})
                    if (K == 0 && v <= 2 * int64_t(k) * kRegThreads) K = k;
        const auto rows = [&](auto kernel, int threads) {
            kernel<<<static_cast<unsigned>(m), threads, 0, stream>>>(
                static_cast<const C *>(z), static_cast<const T *>(b), labels, v, static_cast<C>(grad_scale), count,
                static_cast<T *>(g), row_loss, row_hit);
        };
        if constexpr (std::is_same_v<C, float>) {
            switch (K) {
                case 1: rows(ce_row_reg_kernel<T, 1>, kRegThreads); break;
                case 2: rows(ce_row_reg_kernel<T, 2>, kRegThreads); break;
                case 4: rows(ce_row_reg_kernel<T, 4>, kRegThreads); break;
                case 8: rows(ce_row_reg_kernel<T, 8>, kRegThreads); break;
                case 16: rows(ce_row_reg_kernel<T, 16>, kRegThreads); break;
                default: break;
            }
        }
        if (K == 0) rows(ce_row_kernel<T>, kThreads);
        DST_KERNEL_CHECK(cudaGetLastError());
        ce_reduce_kernel<C><<<1, 1024, 0, stream>>>(row_loss, row_hit, m, count, static_cast<C *>(loss), counts);
        DST_KERNEL_CHECK(cudaGetLastError());
        return cudaSuccess;
    });
}

}  // namespace cuda
}  // namespace dst
