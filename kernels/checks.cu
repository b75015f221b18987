// Deferred checks: one block walks the values (key lengths and γ vectors are short), finds the first
// failing index with an integer atomicMin in shared memory (order-independent), and its thread 0 fills
// the mapped slot when the slot is empty. Kernels on one stream run in order, so no two checks of a
// context write its slot at once.
#include "kernels/checks.cuh"

#include "kernels/dispatch.cuh"

namespace dst {
namespace cuda {
namespace {

constexpr int kThreads = 256;

__device__ __forceinline__ double as_double(int32_t v) { return static_cast<double>(v); }
template <typename T> __device__ __forceinline__ double as_double(T v) { return static_cast<double>(to_compute(v)); }

template <typename T, typename Fails>
__device__ void find_and_record(const T *v, int64_t count, Fails fails, DeferredCheck *slot, uint32_t id) {
    __shared__ unsigned long long first;
    if (threadIdx.x == 0) first = ~0ull;
    __syncthreads();
    for (int64_t i = threadIdx.x; i < count; i += blockDim.x)
        if (fails(v[i])) {
            atomicMin(&first, static_cast<unsigned long long>(i));
            break;
        }
    __syncthreads();
    if (threadIdx.x != 0 || first == ~0ull) return;
    record_failure(slot, id, static_cast<int64_t>(first), as_double(v[first]));
}

__global__ void check_range_kernel(const int32_t *v, int64_t count, int32_t lo, int32_t hi, DeferredCheck *slot,
                                   uint32_t id) {
    find_and_record(v, count, [=](int32_t x) { return x < lo || x > hi; }, slot, id);
}

template <typename T>
__global__ void check_nonzero_kernel(const T *x, int64_t count, DeferredCheck *slot, uint32_t id) {
    find_and_record(x, count, [](T e) { return to_compute(e) == compute_t<T>(0); }, slot, id);
}

__global__ void check_offsets_kernel(const int32_t *cu, int64_t B, int64_t n, int64_t s, DeferredCheck *slot,
                                     uint32_t id) {
    __shared__ unsigned long long first;
    if (threadIdx.x == 0) first = ~0ull;
    __syncthreads();
    for (int64_t b = threadIdx.x; b < B; b += blockDim.x) {
        const int64_t len = int64_t(cu[b + 1]) - cu[b];
        if (len < 1 || len > s || (b == 0 && cu[0] != 0) || (b == B - 1 && cu[B] != n)) {
            atomicMin(&first, static_cast<unsigned long long>(b));
            break;
        }
    }
    __syncthreads();
    if (threadIdx.x != 0 || first == ~0ull) return;
    record_failure(slot, id, static_cast<int64_t>(first), static_cast<double>(int64_t(cu[first + 1]) - cu[first]));
}

}  // namespace

cudaError_t check_offsets_deferred(cudaStream_t stream, const int32_t *cu, int64_t B, int64_t n, int64_t s,
                                   DeferredCheck *slot, uint32_t id) {
    if (B <= 0) return cudaSuccess;
    check_offsets_kernel<<<1, kThreads, 0, stream>>>(cu, B, n, s, slot, id);
    return cudaGetLastError();
}

cudaError_t check_range_deferred(cudaStream_t stream, const int32_t *v, int64_t count, int32_t lo, int32_t hi,
                                 DeferredCheck *slot, uint32_t id) {
    if (count <= 0) return cudaSuccess;
    check_range_kernel<<<1, kThreads, 0, stream>>>(v, count, lo, hi, slot, id);
    return cudaGetLastError();
}

cudaError_t check_nonzero_deferred(cudaStream_t stream, dst_dtype dt, const void *x, int64_t count,
                                   DeferredCheck *slot, uint32_t id) {
    if (count <= 0) return cudaSuccess;
    return dispatch_dtype(dt, [&](auto tag) {
        using T = decltype(tag);
        check_nonzero_kernel<T><<<1, kThreads, 0, stream>>>(static_cast<const T *>(x), count, slot, id);
        return cudaGetLastError();
    });
}

}  // namespace cuda
}  // namespace dst
