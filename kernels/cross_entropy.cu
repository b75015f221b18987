// Softmax cross-entropy over the logits of the selected rows.
//   count_kernel: one block counts the valid labels, those in [0, v) (an integer sum: exact).
//   ce_row_kernel: one block per row: (max, first argmax) by a fixed tree, Σ exp(z − max) by
//     block_sum, lse = max + log Σ; row loss lse − z[label] and hit; then the gradient row
//     g = (exp(z − lse) − [c = label])·grad_scale/count rounded to storage (0 for ignored rows).
//     The three passes read the row (and the bias) from shared memory when the row fits there: it is
//     copied in once by asynchronous 16-byte copies, and the passes keep the thread-to-element order
//     and the block reductions, so both forms give the same bits. From global memory instead, the
//     three passes over rows of BERT's 30 522 fp32 logits (120 KB) read them from DRAM three times.
//   ce_reduce_kernel: one block adds the row losses and hits in a fixed order and divides by count.
// Arithmetic in compute_t<T>; the logits are never rounded to the storage type.
#include "kernels/cross_entropy.cuh"

#include <cuda_pipeline.h>

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

// Elements of the compute type per 16-byte copy, and the shared memory of a row of v logits in
// ce_row_kernel's shared form: v elements placed so that the 16-byte aligned part of the global row
// lands on 16-byte aligned shared addresses (up to one copy's worth of padding in front).
template <typename C>
constexpr int64_t kCopyElems = 16 / sizeof(C);
template <typename C>
size_t ce_row_smem(int64_t v) {
    return static_cast<size_t>(v + kCopyElems<C>) * sizeof(C);
}

// Copies row zr[0, v) into shared memory, zs[c + pad] = zr[c] (+ b[c] when b), and returns pad: the
// 16-byte aligned middle by asynchronous copies (cp.async on sm_80+), the few elements before and after
// it by plain loads. Every thread of the block calls it; on return the row is in place (synchronised).
template <typename C, typename T>
__device__ int64_t ce_load_row(const C *zr, const T *__restrict__ b, int64_t v, C *zs) {
    constexpr int64_t E = kCopyElems<C>;
    const uintptr_t addr = reinterpret_cast<uintptr_t>(zr);
    int64_t head = static_cast<int64_t>((16 - addr % 16) % 16 / sizeof(C));  // zr is aligned to sizeof(C)
    if (head > v) head = v;
    const int64_t pad = (E - head) % E, vecs = (v - head) / E, tail = head + vecs * E;
    for (int64_t k = threadIdx.x; k < vecs; k += blockDim.x)
        __pipeline_memcpy_async(zs + pad + head + k * E, zr + head + k * E, 16);
    __pipeline_commit();
    for (int64_t c = threadIdx.x; c < head; c += blockDim.x) zs[pad + c] = zr[c];
    for (int64_t c = tail + threadIdx.x; c < v; c += blockDim.x) zs[pad + c] = zr[c];
    __pipeline_wait_prior(0);
    __syncthreads();
    if (b) {  // the same addition as the global form's logit(c)
        for (int64_t c = threadIdx.x; c < v; c += blockDim.x) zs[pad + c] = zs[pad + c] + to_compute(b[c]);
        __syncthreads();
    }
    return pad;
}

// kShared: the row in dynamic shared memory (ce_row_smem<C>(v) bytes), else read from z each pass.
template <typename T, bool kShared>
__global__ void __launch_bounds__(kThreads)
    ce_row_kernel(const compute_t<T> *z, const T *__restrict__ b, const int32_t *__restrict__ labels, int64_t v,
                  compute_t<T> grad_scale, const int32_t *__restrict__ count, T *g,
                  compute_t<T> *__restrict__ row_loss, int32_t *__restrict__ row_hit) {
    using C = compute_t<T>;
    extern __shared__ __align__(16) unsigned char ce_dyn[];
    __shared__ C sval[33];
    __shared__ int64_t sidx[33];
    const int64_t row = blockIdx.x;
    const C *zr = z + row * v;
    const int32_t y = labels[row];
    if (y < 0 || y >= v) {  // −1; a label outside [0, v) (a deferred check reports it) is ignored too
        if (threadIdx.x == 0) {
            row_loss[row] = C(0);
            row_hit[row] = 0;
        }
        if (g)
            for (int64_t c = threadIdx.x; c < v; c += blockDim.x) g[row * v + c] = to_storage<T>(C(0));
        return;
    }
    C *zs = reinterpret_cast<C *>(ce_dyn);
    int64_t pad = 0;
    if constexpr (kShared) pad = ce_load_row(zr, b, v, zs);
    auto logit = [&](int64_t c) {
        if constexpr (kShared)
            return zs[pad + c];
        else
            return zr[c] + (b ? to_compute(b[c]) : C(0));
    };
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
        // The shared form where the row fits in one block's shared memory (opt-in limit, less the static
        // part): a 30 522-wide fp32 row takes 120 KB of the H200's 227 KB.
        int dev = 0, optin = 0;
        DST_KERNEL_CHECK(cudaGetDevice(&dev));
        DST_KERNEL_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
        const size_t smem = ce_row_smem<C>(v), statics = 33 * (sizeof(C) + sizeof(int64_t));
        const auto args = [&](auto kernel, size_t bytes) {
            kernel<<<static_cast<unsigned>(m), kThreads, bytes, stream>>>(
                static_cast<const C *>(z), static_cast<const T *>(b), labels, v, static_cast<C>(grad_scale), count,
                static_cast<T *>(g), row_loss, row_hit);
        };
        if (smem + statics <= static_cast<size_t>(optin)) {
            DST_KERNEL_CHECK(cudaFuncSetAttribute(ce_row_kernel<T, true>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                  static_cast<int>(smem)));
            args(ce_row_kernel<T, true>, smem);
        } else {
            args(ce_row_kernel<T, false>, 0);
        }
        DST_KERNEL_CHECK(cudaGetLastError());
        ce_reduce_kernel<C><<<1, 1024, 0, stream>>>(row_loss, row_hit, m, count, static_cast<C *>(loss), counts);
        DST_KERNEL_CHECK(cudaGetLastError());
        return cudaSuccess;
    });
}

}  // namespace cuda
}  // namespace dst
