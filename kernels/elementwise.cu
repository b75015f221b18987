// Elementwise kernels: GELU (erf: x·Φ(x); tanh: 0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³)))) and
// their derivatives, tanh and its derivative (the pooler of BERT), residual + dropout, dropout
// backward, add, any-zero (the all_nonzero op).
// Arithmetic in compute_t<T> (double for FP64, float otherwise), one rounding on store.
// Outputs may alias their inputs (each element is read before it is written, by the same thread).
// Dropout: each thread owns one Philox group of 4 consecutive elements (e >> 2), so one Philox call
// gives the keep decisions of all four, bit-identical with the CPU backend (kernels/philox.h).
#include "kernels/elementwise.cuh"

#include "kernels/dispatch.cuh"
#include "kernels/philox.h"

namespace dst {
namespace cuda {
namespace {

constexpr int kThreads = 256;

// ================================ kernels ========================================================

template <typename C>
__device__ __forceinline__ C gelu_value(C x, dst_gelu form) {
    if (form == DST_GELU_TANH) {
        const C k0 = C(0.7978845608028654), k1 = C(0.044715);
        return C(0.5) * x * (C(1) + dtanh(k0 * (x + k1 * x * x * x)));
    }
    return C(0.5) * x * (C(1) + derf(x * C(0.7071067811865476)));
}

template <typename C>
__device__ __forceinline__ C gelu_grad(C x, dst_gelu form) {
    if (form == DST_GELU_TANH) {
        const C k0 = C(0.7978845608028654), k1 = C(0.044715);
        const C t = dtanh(k0 * (x + k1 * x * x * x));
        return C(0.5) * (C(1) + t) + C(0.5) * x * (C(1) - t * t) * k0 * (C(1) + C(3) * k1 * x * x);
    }
    const C cdf = C(0.5) * (C(1) + derf(x * C(0.7071067811865476)));
    const C pdf = dexp(C(-0.5) * x * x) * C(0.3989422804014327);
    return cdf + x * pdf;
}

template <typename T>
__global__ void gelu_fwd_kernel(const T *u, T *g, int64_t count, dst_gelu form) {
    for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < count;
         i += int64_t(gridDim.x) * blockDim.x)
        g[i] = to_storage<T>(gelu_value(to_compute(u[i]), form));
}

template <typename T>
__global__ void gelu_bwd_kernel(const T *dg, const T *u, T *du, int64_t count,
                                dst_gelu form) {
    for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < count;
         i += int64_t(gridDim.x) * blockDim.x)
        du[i] = to_storage<T>(to_compute(dg[i]) * gelu_grad(to_compute(u[i]), form));
}

// y = tanh(u); du = dy·(1 − tanh(u)²).
template <typename T>
__global__ void tanh_fwd_kernel(const T *u, T *y, int64_t count) {
    for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < count;
         i += int64_t(gridDim.x) * blockDim.x)
        y[i] = to_storage<T>(dtanh(to_compute(u[i])));
}

template <typename T>
__global__ void tanh_bwd_kernel(const T *dy, const T *u, T *du, int64_t count) {
    using C = compute_t<T>;
    for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < count;
         i += int64_t(gridDim.x) * blockDim.x) {
        const C t = dtanh(to_compute(u[i]));
        du[i] = to_storage<T>(to_compute(dy[i]) * (C(1) - t * t));
    }
}

// mode 0: y = residual + keep·scale·a; mode 1 (residual == nullptr): y = keep·scale·a.
template <typename T>
__global__ void dropout_kernel(const T *a, const T *residual, T *y,
                               int64_t count, uint64_t seed, uint64_t offset, uint32_t threshold,
                               compute_t<T> scale) {
    using C = compute_t<T>;
    const int64_t groups = (count + 3) / 4;
    for (int64_t grp = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; grp < groups;
         grp += int64_t(gridDim.x) * blockDim.x) {
        Philox4 r{{0u, 0u, 0u, 0u}};
        if (threshold != 0u) r = philox_dropout_block(seed, offset, static_cast<uint64_t>(grp));
#pragma unroll
        for (int k = 0; k < 4; ++k) {
            const int64_t e = grp * 4 + k;
            if (e >= count) break;
            C v = to_compute(a[e]);
            if (threshold != 0u) v = r.v[k] >= threshold ? v * scale : C(0);
            if (residual) v = to_compute(residual[e]) + v;
            y[e] = to_storage<T>(v);
        }
    }
}

template <typename T>
__global__ void add_kernel(const T *a, const T *b, T *y, int64_t count) {
    for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < count;
         i += int64_t(gridDim.x) * blockDim.x)
        y[i] = to_storage<T>(to_compute(a[i]) + to_compute(b[i]));
}

// Every thread that sees a zero writes 1 (the same value: the result does not depend on order).
template <typename T>
__global__ void any_zero_kernel(const T *x, int64_t count, int *any_zero) {
    for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < count;
         i += int64_t(gridDim.x) * blockDim.x)
        if (to_compute(x[i]) == compute_t<T>(0)) *any_zero = 1;
}

}  // namespace

// ================================ launchers ======================================================

cudaError_t gelu_fwd(cudaStream_t stream, dst_dtype dt, dst_gelu form, const void *u, void *g,
                    int64_t count) {
    if (count <= 0) return cudaSuccess;
    return dispatch_dtype(dt, [&](auto tag) {
        using T = decltype(tag);
        gelu_fwd_kernel<T><<<grid_blocks(count, kThreads), kThreads, 0, stream>>>(
            static_cast<const T *>(u), static_cast<T *>(g), count, form);
        DST_KERNEL_CHECK(cudaGetLastError());
        return cudaSuccess;
    });
}

cudaError_t gelu_bwd(cudaStream_t stream, dst_dtype dt, dst_gelu form, const void *dg, const void *u,
                    void *du, int64_t count) {
    if (count <= 0) return cudaSuccess;
    return dispatch_dtype(dt, [&](auto tag) {
        using T = decltype(tag);
        gelu_bwd_kernel<T><<<grid_blocks(count, kThreads), kThreads, 0, stream>>>(
            static_cast<const T *>(dg), static_cast<const T *>(u), static_cast<T *>(du), count, form);
        DST_KERNEL_CHECK(cudaGetLastError());
        return cudaSuccess;
    });
}

cudaError_t tanh_fwd(cudaStream_t stream, dst_dtype dt, const void *u, void *y, int64_t count) {
    if (count <= 0) return cudaSuccess;
    return dispatch_dtype(dt, [&](auto tag) {
        using T = decltype(tag);
        tanh_fwd_kernel<T><<<grid_blocks(count, kThreads), kThreads, 0, stream>>>(static_cast<const T *>(u),
                                                                                static_cast<T *>(y), count);
        DST_KERNEL_CHECK(cudaGetLastError());
        return cudaSuccess;
    });
}

cudaError_t tanh_bwd(cudaStream_t stream, dst_dtype dt, const void *dy, const void *u, void *du, int64_t count) {
    if (count <= 0) return cudaSuccess;
    return dispatch_dtype(dt, [&](auto tag) {
        using T = decltype(tag);
        tanh_bwd_kernel<T><<<grid_blocks(count, kThreads), kThreads, 0, stream>>>(
            static_cast<const T *>(dy), static_cast<const T *>(u), static_cast<T *>(du), count);
        DST_KERNEL_CHECK(cudaGetLastError());
        return cudaSuccess;
    });
}

namespace {
cudaError_t launch_dropout(cudaStream_t stream, dst_dtype dt, const void *a, const void *residual, void *y,
                           int64_t count, const DropoutSite &site) {
    if (count <= 0) return cudaSuccess;
    const int64_t groups = (count + 3) / 4;
    return dispatch_dtype(dt, [&](auto tag) {
        using T = decltype(tag);
        using C = compute_t<T>;
        dropout_kernel<T><<<grid_blocks(groups, kThreads), kThreads, 0, stream>>>(
            static_cast<const T *>(a), static_cast<const T *>(residual), static_cast<T *>(y), count,
            site.seed, site.offset, site.threshold, static_cast<C>(site.scale));
        DST_KERNEL_CHECK(cudaGetLastError());
        return cudaSuccess;
    });
}
}  // namespace

cudaError_t dropout_residual_fwd(cudaStream_t stream, dst_dtype dt, const void *a, const void *residual,
                                void *y, int64_t count, const DropoutSite &site) {
    return launch_dropout(stream, dt, a, residual, y, count, site);
}

cudaError_t dropout_bwd(cudaStream_t stream, dst_dtype dt, const void *dy, void *dx, int64_t count,
                       const DropoutSite &site) {
    return launch_dropout(stream, dt, dy, nullptr, dx, count, site);
}

cudaError_t add(cudaStream_t stream, dst_dtype dt, const void *a, const void *b, void *y, int64_t count) {
    if (count <= 0) return cudaSuccess;
    return dispatch_dtype(dt, [&](auto tag) {
        using T = decltype(tag);
        add_kernel<T><<<grid_blocks(count, kThreads), kThreads, 0, stream>>>(
            static_cast<const T *>(a), static_cast<const T *>(b), static_cast<T *>(y), count);
        DST_KERNEL_CHECK(cudaGetLastError());
        return cudaSuccess;
    });
}

cudaError_t any_zero(cudaStream_t stream, dst_dtype dt, const void *x, int64_t count, int *flag) {
    DST_KERNEL_CHECK(cudaMemsetAsync(flag, 0, sizeof(int), stream));
    if (count <= 0) return cudaSuccess;
    return dispatch_dtype(dt, [&](auto tag) {
        using T = decltype(tag);
        any_zero_kernel<T><<<grid_blocks(count, kThreads), kThreads, 0, stream>>>(
            static_cast<const T *>(x), count, flag);
        DST_KERNEL_CHECK(cudaGetLastError());
        return cudaSuccess;
    });
}

}  // namespace cuda
}  // namespace dst
