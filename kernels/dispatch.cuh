// Shared by the CUDA kernel families (kernels/ includes nothing of src/: launchers report with a
// cudaError_t, which the backend turns into a status and a message naming the launcher):
//  1. DST_KERNEL_CHECK(expr): returns the cudaError_t of a failed runtime call from the enclosing
//     launcher. Launchers end with `return cudaGetLastError();` (the launch's own error).
//  2. Dtype dispatch (device compilation only): the storage types float, __half, __nv_bfloat16 and
//     double; their compute type compute_t<T> (double for double, float otherwise); to_compute()/
//     to_storage<T>() conversions (round to nearest even; host and device); math overloads on the
//     compute type (no fast-math intrinsics: results must track the CPU reference); and
//     dispatch_dtype(dt, f), which calls f(T{}) with the storage type of a runtime dst_dtype
//     (cudaErrorInvalidValue for others):
//
//         return dispatch_dtype(dt, [&](auto tag) {
//             using T = decltype(tag);
//             my_kernel<T><<<grid, block, 0, stream>>>(...);
//             return cudaGetLastError();
//         });
#ifndef DST_KERNELS_DISPATCH_CUH
#define DST_KERNELS_DISPATCH_CUH

#include <cuda_runtime_api.h>

#include <cstdint>

#include "dstransformer/dstransformer.h"  // defines: dst_dtype

#define DST_KERNEL_CHECK(expr)                         \
    do {                                               \
        const cudaError_t dst_kernel_e_ = (expr);      \
        if (dst_kernel_e_ != cudaSuccess) return dst_kernel_e_; \
    } while (0)

namespace dst {
namespace cuda {

// Bytes of the compute type of a storage dtype (stats, softmax, reductions).
inline size_t compute_size(dst_dtype dt) { return dt == DST_DTYPE_FP64 ? 8 : 4; }
// The 16-bit storage types (fp32 arithmetic, one rounding to 8 or 11 significant bits on store).
inline bool is_16bit(dst_dtype dt) { return dt == DST_DTYPE_FP16 || dt == DST_DTYPE_BF16; }

// Blocks for a grid-stride loop over `work` items with `threads` per block.
inline unsigned grid_blocks(int64_t work, int threads, int64_t cap = 65536) {
    int64_t blocks = (work + threads - 1) / threads;
    if (blocks < 1) blocks = 1;
    return static_cast<unsigned>(blocks < cap ? blocks : cap);
}

}  // namespace cuda
}  // namespace dst

// ---- dtype dispatch (nvcc only) ------------------------------------------------------------------
#if defined(__CUDACC__)
#include <cuda_bf16.h>
#include <cuda_fp16.h>

namespace dst {
namespace cuda {

template <typename T>
struct ComputeOf {
    using type = float;
};
template <>
struct ComputeOf<double> {
    using type = double;
};
template <typename T>
using compute_t = typename ComputeOf<T>::type;

#define DST_DEV __device__ __forceinline__
// The conversions also on the host (labs and tests fill and read device buffers with them; a host
// call of a __device__-only function compiles to a stub that ends the program without a message).
#define DST_CONV __host__ __device__ __forceinline__

DST_CONV float to_compute(float v) { return v; }
DST_CONV double to_compute(double v) { return v; }
DST_CONV float to_compute(__half v) { return __half2float(v); }
DST_CONV float to_compute(__nv_bfloat16 v) { return __bfloat162float(v); }

template <typename T>
DST_CONV T to_storage(compute_t<T> v);
template <>
DST_CONV float to_storage<float>(float v) { return v; }
template <>
DST_CONV double to_storage<double>(double v) { return v; }
template <>
DST_CONV __half to_storage<__half>(float v) { return __float2half_rn(v); }
template <>
DST_CONV __nv_bfloat16 to_storage<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }

// Accurate math on the compute type (the library is never built with --use_fast_math).
DST_DEV float dexp(float x) { return expf(x); }
DST_DEV double dexp(double x) { return exp(x); }
DST_DEV float dlog(float x) { return logf(x); }
DST_DEV double dlog(double x) { return log(x); }
DST_DEV float dsqrt(float x) { return sqrtf(x); }
DST_DEV double dsqrt(double x) { return sqrt(x); }
DST_DEV float derf(float x) { return erff(x); }
DST_DEV double derf(double x) { return erf(x); }
DST_DEV float dtanh(float x) { return tanhf(x); }
DST_DEV double dtanh(double x) { return tanh(x); }
DST_DEV float dfma(float a, float b, float c) { return fmaf(a, b, c); }
DST_DEV double dfma(double a, double b, double c) { return fma(a, b, c); }
// A product rounded on its own (never contracted into an FMA with a following add): the dropout
// scale, so that every kernel that drops and adds gives the same bits.
DST_DEV float dmul_rn(float a, float b) { return __fmul_rn(a, b); }
DST_DEV double dmul_rn(double a, double b) { return __dmul_rn(a, b); }
// 2^x by the hardware's approximation (within a few fp32 ulps; subnormal results flushed to 0):
// for arithmetic whose result is rounded to a 16-bit type (cdf16).
DST_DEV float ex2_approx(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}
// 1/x by the hardware's approximation, for x ≥ 1 (cdf16's 1 + z/2), infinity and NaN included: the bits
// of __fdividef(1.0f, x) there, without the range test and rescaling that __fdividef adds around the
// reciprocal for subnormal x (four instructions per call).
DST_DEV float rcp_approx(float x) {
    float y;
    asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}
DST_DEV float dmax(float a, float b) { return fmaxf(a, b); }
DST_DEV double dmax(double a, double b) { return fmax(a, b); }

template <typename C>
DST_DEV C neg_inf() {
    return static_cast<C>(-INFINITY);
}

// Sum over the 32 lanes of a warp, the same tree on every call (deterministic).
template <typename C>
DST_DEV C warp_sum(C v) {
    for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
    return v;
}

// 16-byte vectors of a storage type (kVec<T> elements), loaded and stored whole; a kernel takes its
// vector path only when every pointer it touches is 16-byte aligned (aligned16).
template <typename T>
constexpr int kVec = static_cast<int>(16 / sizeof(T));
template <typename T>
struct alignas(16) Vec {
    T v[kVec<T>];
};
inline bool aligned_to(const void *p, size_t bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; }
inline bool aligned16(const void *p) { return aligned_to(p, 16); }

// Sum over a block whose size is a multiple of 32 (at most 1024); `scratch` holds 33 values.
// Every thread gets the result. Fixed order: deterministic.
template <typename C>
__device__ C block_sum(C v, C *scratch) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    __syncthreads();  // scratch may still be read by a previous call
    v = warp_sum(v);
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    if (warp == 0) {
        C t = lane < warps ? scratch[lane] : C(0);
        t = warp_sum(t);
        if (lane == 0) scratch[32] = t;
    }
    __syncthreads();
    return scratch[32];
}

#undef DST_DEV

// Calls f(T{}) with the storage type of dt and returns its error.
template <typename F>
cudaError_t dispatch_dtype(dst_dtype dt, F &&f) {
    switch (dt) {
        case DST_DTYPE_FP32: return f(float{});
        case DST_DTYPE_FP16: return f(__half{});
        case DST_DTYPE_BF16: return f(__nv_bfloat16{});
        case DST_DTYPE_FP64: return f(double{});
        default: break;
    }
    return cudaErrorInvalidValue;
}

}  // namespace cuda
}  // namespace dst
#endif  // __CUDACC__

#endif  // DST_KERNELS_DISPATCH_CUH
