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

// Four consecutive elements i..i+3 (i a multiple of 4) of a runtime-dtype array, loaded and stored
// as one 8-byte (16-bit types) or 16-byte (fp32) access; each element is rounded as store_f rounds it.
__device__ __forceinline__ float4 load4(const void *p, int32_t dt, int64_t i) {
    if (dt == DST_DTYPE_FP32) return reinterpret_cast<const float4 *>(p)[i / 4];
    const uint2 r = reinterpret_cast<const uint2 *>(p)[i / 4];
    float2 a, b;
    if (dt == DST_DTYPE_FP16) {
        a = __half22float2(*reinterpret_cast<const __half2 *>(&r.x));
        b = __half22float2(*reinterpret_cast<const __half2 *>(&r.y));
    } else {
        a = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162 *>(&r.x));
        b = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162 *>(&r.y));
    }
    return make_float4(a.x, a.y, b.x, b.y);
}

__device__ __forceinline__ void store4(void *p, int32_t dt, int64_t i, float4 v) {
    if (dt == DST_DTYPE_FP32) {
        reinterpret_cast<float4 *>(p)[i / 4] = v;
        return;
    }
    uint2 r;
    if (dt == DST_DTYPE_FP16) {
        *reinterpret_cast<__half2 *>(&r.x) = __floats2half2_rn(v.x, v.y);
        *reinterpret_cast<__half2 *>(&r.y) = __floats2half2_rn(v.z, v.w);
    } else {
        *reinterpret_cast<__nv_bfloat162 *>(&r.x) = __floats2bfloat162_rn(v.x, v.y);
        *reinterpret_cast<__nv_bfloat162 *>(&r.y) = __floats2bfloat162_rn(v.z, v.w);
    }
    reinterpret_cast<uint2 *>(p)[i / 4] = r;
}

__device__ __forceinline__ bool aligned4(const void *p, int32_t dt) {
    const uintptr_t bytes = dt == DST_DTYPE_FP32 ? 16 : 8;
    return reinterpret_cast<uintptr_t>(p) % bytes == 0;
}

// Whether a chunk of t can take the 4-wide path: every array it touches aligned for 4 elements (the
// chunk's begin is a multiple of kChunk from the tensor's first element, so a multiple of 4).
__device__ __forceinline__ bool vector_ok(const TensorDesc &t, bool moments) {
    static_assert(optim::kChunk % 4 == 0, "chunks must start on 4-element boundaries");
    bool ok = aligned4(t.grad, t.grad_dtype) && aligned4(t.param, t.param_dtype);
    if (t.master) ok = ok && aligned4(t.master, DST_DTYPE_FP32);
    if (moments) ok = ok && aligned4(t.exp_avg, DST_DTYPE_FP32) && aligned4(t.exp_avg_sq, DST_DTYPE_FP32);
    return ok;
}

// Calls f4(i) for the 4-element groups [i, i+4) of chunk c (when `vec`), then f1(i) for the elements
// left; the threads of the block share both loops.
template <typename F4, typename F1>
__device__ __forceinline__ void for_chunk(const Chunk &c, bool vec, F4 &&f4, F1 &&f1) {
    int64_t i0 = c.begin;
    if (vec) {
        const int64_t end4 = c.begin + (c.end - c.begin) / 4 * 4;
        for (int64_t i = c.begin + 4 * int64_t(threadIdx.x); i < end4; i += 4 * int64_t(blockDim.x)) f4(i);
        i0 = end4;
    }
    for (int64_t i = i0 + threadIdx.x; i < c.end; i += blockDim.x) f1(i);
}

__device__ __forceinline__ float master_of(const TensorDesc &t, int64_t i) {
    return t.master ? t.master[i] : static_cast<const float *>(t.param)[i];
}

__device__ __forceinline__ void store_master(const TensorDesc &t, int64_t i, float p) {
    if (t.master) t.master[i] = p;
    store_f(t.param, t.param_dtype, i, p);
}

__device__ void zero_grad_chunk(const TensorDesc &t, const Chunk &c) {
    const bool vec = aligned4(t.grad, t.grad_dtype);
    for_chunk(
        c, vec, [&](int64_t i) { store4(t.grad, t.grad_dtype, i, make_float4(0.0f, 0.0f, 0.0f, 0.0f)); },
        [&](int64_t i) { store_f(t.grad, t.grad_dtype, i, 0.0f); });
}

__global__ void norm_kernel(__grid_constant__ const StepArgs a) {
    __shared__ double scratch[33];
    const Chunk c = a.chunks[blockIdx.x];
    const TensorDesc t = a.tensors[c.tensor];
    double s = 0.0;
    for_chunk(
        c, aligned4(t.grad, t.grad_dtype),
        [&](int64_t i) {
            const float4 g = load4(t.grad, t.grad_dtype, i);
            s += double(g.x) * g.x + double(g.y) * g.y + double(g.z) * g.z + double(g.w) * g.w;
        },
        [&](int64_t i) {
            const double g = load_f(t.grad, t.grad_dtype, i);
            s += g * g;
        });
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
    // The element math is the same on both paths (one adam_element per element, in its own registers),
    // so the 4-wide path changes the memory accesses only, never a result.
    for_chunk(
        c, vector_ok(t, true),
        [&](int64_t i) {
            const float4 g4 = load4(t.grad, t.grad_dtype, i);
            float4 p4 = t.master ? reinterpret_cast<const float4 *>(t.master)[i / 4] : load4(t.param, DST_DTYPE_FP32, i);
            float4 m4 = reinterpret_cast<const float4 *>(t.exp_avg)[i / 4];
            float4 v4 = reinterpret_cast<const float4 *>(t.exp_avg_sq)[i / 4];
            p4.x = optim::adam_element(a.rule, gp, lr, bc1, bc2, g4.x * inv, p4.x, m4.x, v4.x);
            p4.y = optim::adam_element(a.rule, gp, lr, bc1, bc2, g4.y * inv, p4.y, m4.y, v4.y);
            p4.z = optim::adam_element(a.rule, gp, lr, bc1, bc2, g4.z * inv, p4.z, m4.z, v4.z);
            p4.w = optim::adam_element(a.rule, gp, lr, bc1, bc2, g4.w * inv, p4.w, m4.w, v4.w);
            reinterpret_cast<float4 *>(t.exp_avg)[i / 4] = m4;
            reinterpret_cast<float4 *>(t.exp_avg_sq)[i / 4] = v4;
            if (t.master) reinterpret_cast<float4 *>(t.master)[i / 4] = p4;
            store4(t.param, t.param_dtype, i, p4);
            if (a.zero_grads) store4(t.grad, t.grad_dtype, i, make_float4(0.0f, 0.0f, 0.0f, 0.0f));
        },
        [&](int64_t i) {
            const float g = load_f(t.grad, t.grad_dtype, i) * inv;
            float m = t.exp_avg[i], v = t.exp_avg_sq[i];
            const float p = optim::adam_element(a.rule, gp, lr, bc1, bc2, g, master_of(t, i), m, v);
            t.exp_avg[i] = m;
            t.exp_avg_sq[i] = v;
            store_master(t, i, p);
            if (a.zero_grads) store_f(t.grad, t.grad_dtype, i, 0.0f);
        });
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
