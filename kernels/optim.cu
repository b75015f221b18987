// Multi-tensor optimizer kernels: one block per chunk of the tensor table (kernels/optim_args.h), so a
// step is a fixed handful of launches for any number of tensors:
//   norm_kernel       Σ g² per chunk (double, fixed-order block sum)
//   finalize_kernel   one block: Σ of the partials, then finalize_step (overflow, skip, loss scaler,
//                     clip factor, lr schedule) and the step counts, all on the device
//   lamb_kernel       LAMB: moments, and Σ p², Σ u² per chunk
//   lamb_ratio_kernel LAMB: one thread per tensor, its trust ratio from its chunks, in chunk order
//   update_kernel     Adam/AdamW/LAMB element updates, fp32 masters, the 16-bit copy, zeroed grads
// Later kernels read the skip decision from the device state, so nothing waits for the host. The
// element and scalar math is kernels/optim_math.h, shared with the CPU twin (src/backend/cpu/optim.cpp).
// Parameters and gradients are FP32, FP16 or BF16, switched per tensor at run time (one instantiation).
// The arguments are __grid_constant__: the kernels index the groups' hyperparameters at run time,
// which would otherwise give every thread a local copy of the whole argument block.
#include "kernels/optim.cuh"

#include "kernels/dispatch.cuh"
#include "kernels/optim_math.h"

namespace dst {
namespace cuda {
namespace {

using optim::Chunk;
using optim::GroupParams;
using optim::StepArgs;
using optim::TensorDesc;
using optim::TrainState;

constexpr int kThreads = 256;

// ================================ kernels ========================================================

__device__ __forceinline__ float load_f(const void *p, int32_t dt, int64_t i) {
    if (dt == DST_DTYPE_FP16) return __half2float(static_cast<const __half *>(p)[i]);
    if (dt == DST_DTYPE_BF16) return __bfloat162float(static_cast<const __nv_bfloat16 *>(p)[i]);
    return static_cast<const float *>(p)[i];
}

__device__ __forceinline__ void store_f(void *p, int32_t dt, int64_t i, float v) {
    if (dt == DST_DTYPE_FP16)
        static_cast<__half *>(p)[i] = __float2half_rn(v);
    else if (dt == DST_DTYPE_BF16)
        static_cast<__nv_bfloat16 *>(p)[i] = __float2bfloat16_rn(v);
    else
        static_cast<float *>(p)[i] = v;
}

__device__ __forceinline__ float master_of(const TensorDesc &t, int64_t i) {
    return t.master ? t.master[i] : static_cast<const float *>(t.param)[i];
}

__device__ __forceinline__ void store_master(const TensorDesc &t, int64_t i, float p) {
    if (t.master) t.master[i] = p;
    store_f(t.param, t.param_dtype, i, p);
}

__device__ void zero_grad_chunk(const TensorDesc &t, const Chunk &c) {
    for (int64_t i = c.begin + threadIdx.x; i < c.end; i += blockDim.x) store_f(t.grad, t.grad_dtype, i, 0.0f);
}

__global__ void norm_kernel(__grid_constant__ const StepArgs a) {
    __shared__ double scratch[33];
    const Chunk c = a.chunks[blockIdx.x];
    const TensorDesc t = a.tensors[c.tensor];
    double s = 0.0;
    for (int64_t i = c.begin + threadIdx.x; i < c.end; i += blockDim.x) {
        const double g = load_f(t.grad, t.grad_dtype, i);
        s += g * g;
    }
    s = block_sum(s, scratch);
    if (threadIdx.x == 0) a.partials[blockIdx.x] = s;
}

__global__ void finalize_kernel(__grid_constant__ const StepArgs a) {
    __shared__ double scratch[33];
    __shared__ int skip;
    double s = 0.0;
    if (a.compute_norm)
        for (int c = threadIdx.x; c < a.num_chunks; c += blockDim.x) s += a.partials[c];
    s = block_sum(s, scratch);
    if (threadIdx.x == 0) skip = optim::finalize_step(a, s, *a.state) ? 1 : 0;
    __syncthreads();
    if (skip) return;
    for (int t = threadIdx.x; t < a.num_tensors; t += blockDim.x) *a.tensors[t].step += 1;
}

__global__ void lamb_kernel(__grid_constant__ const StepArgs a) {
    __shared__ double scratch[33];
    const TrainState &st = *a.state;
    const Chunk c = a.chunks[blockIdx.x];
    const TensorDesc t = a.tensors[c.tensor];
    if (st.skipped) {
        if (a.zero_grads) zero_grad_chunk(t, c);
        return;
    }
    const GroupParams gp = a.groups[t.group];
    const float inv = st.inv_scale;
    double sp = 0.0, su = 0.0;
    for (int64_t i = c.begin + threadIdx.x; i < c.end; i += blockDim.x) {
        const float g = load_f(t.grad, t.grad_dtype, i) * inv;
        const float p = master_of(t, i);
        float m = t.exp_avg[i], v = t.exp_avg_sq[i];
        optim::lamb_moments(gp, g, m, v);
        t.exp_avg[i] = m;
        t.exp_avg_sq[i] = v;
        const float u = optim::lamb_direction(gp, a.eps_inside_sqrt, m, v, p);
        sp += static_cast<double>(p) * p;
        su += static_cast<double>(u) * u;
        if (a.zero_grads) store_f(t.grad, t.grad_dtype, i, 0.0f);
    }
    sp = block_sum(sp, scratch);
    su = block_sum(su, scratch);
    if (threadIdx.x == 0) {
        a.partials[a.num_chunks + blockIdx.x] = sp;
        a.partials[2 * static_cast<int64_t>(a.num_chunks) + blockIdx.x] = su;
    }
}

__global__ void lamb_ratio_kernel(__grid_constant__ const StepArgs a) {
    const int t = blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= a.num_tensors || a.state->skipped) return;
    const TensorDesc d = a.tensors[t];
    const double *p2 = a.partials + a.num_chunks, *u2 = a.partials + 2 * static_cast<int64_t>(a.num_chunks);
    double sp = 0.0, su = 0.0;
    for (int c = d.first_chunk; c < d.first_chunk + d.num_chunks; ++c) {
        sp += p2[c];
        su += u2[c];
    }
    *d.lamb_coeff = optim::lamb_ratio(sp, su, a.max_coeff, a.min_coeff);
}

__global__ void update_kernel(__grid_constant__ const StepArgs a) {
    const TrainState &st = *a.state;
    const Chunk c = a.chunks[blockIdx.x];
    const TensorDesc t = a.tensors[c.tensor];
    const bool lamb = a.rule == optim::kRuleLamb;
    if (st.skipped) {
        if (a.zero_grads && !lamb) zero_grad_chunk(t, c);
        return;
    }
    const GroupParams gp = a.groups[t.group];
    const float lr = st.lr[t.group];
    const int64_t step = *t.step;
    if (lamb) {
        const float k = optim::lamb_step_size(gp, lr, step, a.bias_correction) * *t.lamb_coeff;
        for (int64_t i = c.begin + threadIdx.x; i < c.end; i += blockDim.x) {
            const float p = master_of(t, i);
            const float u = optim::lamb_direction(gp, a.eps_inside_sqrt, t.exp_avg[i], t.exp_avg_sq[i], p);
            store_master(t, i, p - k * u);
        }
        return;
    }
    const float bc1 = optim::bias_correction(gp.beta1, step, a.bias_correction);
    const float bc2 = optim::bias_correction(gp.beta2, step, a.bias_correction);
    const float inv = st.inv_scale;
    for (int64_t i = c.begin + threadIdx.x; i < c.end; i += blockDim.x) {
        const float g = load_f(t.grad, t.grad_dtype, i) * inv;
        float m = t.exp_avg[i], v = t.exp_avg_sq[i];
        const float p = optim::adam_element(a.rule, gp, lr, bc1, bc2, g, master_of(t, i), m, v);
        t.exp_avg[i] = m;
        t.exp_avg_sq[i] = v;
        store_master(t, i, p);
        if (a.zero_grads) store_f(t.grad, t.grad_dtype, i, 0.0f);
    }
}

template <typename T>
__global__ void scale_kernel(T *x, int64_t count, const float *factor, float mult) {
    using C = compute_t<T>;
    const C f = static_cast<C>(*factor * mult);
    for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < count; i += int64_t(gridDim.x) * blockDim.x)
        x[i] = to_storage<T>(to_compute(x[i]) * f);
}

// Any floating dtype as double (exact) and back (one rounding: double holds every source exactly).
__device__ __forceinline__ double load_any(const void *p, int32_t dt, int64_t i) {
    if (dt == DST_DTYPE_FP64) return static_cast<const double *>(p)[i];
    return load_f(p, dt, i);
}

__device__ __forceinline__ void store_any(void *p, int32_t dt, int64_t i, double v) {
    if (dt == DST_DTYPE_FP64)
        static_cast<double *>(p)[i] = v;
    else if (dt == DST_DTYPE_FP16)
        static_cast<__half *>(p)[i] = __double2half(v);
    else if (dt == DST_DTYPE_BF16)
        static_cast<__nv_bfloat16 *>(p)[i] = __double2bfloat16(v);
    else
        static_cast<float *>(p)[i] = static_cast<float>(v);
}

__global__ void convert_kernel(const void *src, int32_t src_dt, void *dst, int32_t dst_dt, int64_t count) {
    for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < count; i += int64_t(gridDim.x) * blockDim.x)
        store_any(dst, dst_dt, i, load_any(src, src_dt, i));
}

}  // namespace

// ================================ launchers ======================================================

cudaError_t optim_step(cudaStream_t stream, const StepArgs &a) {
    const unsigned nc = static_cast<unsigned>(a.num_chunks);
    if (a.compute_norm && nc > 0) {
        norm_kernel<<<nc, kThreads, 0, stream>>>(a);
        DST_KERNEL_CHECK(cudaGetLastError());
    }
    finalize_kernel<<<1, kThreads, 0, stream>>>(a);
    DST_KERNEL_CHECK(cudaGetLastError());
    if (nc == 0) return cudaSuccess;
    if (a.rule == optim::kRuleLamb) {
        lamb_kernel<<<nc, kThreads, 0, stream>>>(a);
        DST_KERNEL_CHECK(cudaGetLastError());
        lamb_ratio_kernel<<<grid_blocks(a.num_tensors, kThreads), kThreads, 0, stream>>>(a);
        DST_KERNEL_CHECK(cudaGetLastError());
    }
    update_kernel<<<nc, kThreads, 0, stream>>>(a);
    return cudaGetLastError();
}

cudaError_t scale_by(cudaStream_t stream, dst_dtype dt, void *x, int64_t count, const float *factor, float mult) {
    if (count <= 0) return cudaSuccess;
    return dispatch_dtype(dt, [&](auto tag) {
        using T = decltype(tag);
        scale_kernel<T><<<grid_blocks(count, kThreads), kThreads, 0, stream>>>(static_cast<T *>(x), count, factor,
                                                                                mult);
        return cudaGetLastError();
    });
}

cudaError_t convert(cudaStream_t stream, dst_dtype src_dt, const void *src, dst_dtype dst_dt, void *dst,
                    int64_t count) {
    if (count <= 0) return cudaSuccess;
    convert_kernel<<<grid_blocks(count, kThreads), kThreads, 0, stream>>>(src, src_dt, dst, dst_dt, count);
    return cudaGetLastError();
}

}  // namespace cuda
}  // namespace dst
