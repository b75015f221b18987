// Row kernels: the index check (check_init_kernel, check_range_kernel, check_repeat_kernel, and
// check_record_kernel for the deferred form) and the row gather/scatter. The check's results are
// minima of element indices taken with atomicMin on int32, and the distinctness marks are atomicAdd
// counts: integer atomics, so the answer is the same whatever order the threads run in. Gather and
// scatter copy or add whole rows, a block per row (16-byte accesses where rows and buffers allow);
// scatter indices are distinct (checked by the caller), so no two threads write one element. Indices
// outside the rows are skipped, never followed.
#include "kernels/rows.cuh"

#include <climits>

#include "kernels/dispatch.cuh"

namespace dst {
namespace cuda {
namespace {

constexpr int kThreads = 256;

// ================================ kernels ========================================================

__global__ void check_init_kernel(int32_t *result) {
    if (threadIdx.x < 2) result[threadIdx.x] = INT_MAX;
}

__global__ void check_range_kernel(const int32_t *__restrict__ idx, int64_t count, int32_t lo, int32_t hi,
                                   int32_t *result, int32_t *marks) {
    for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < count;
         i += int64_t(gridDim.x) * blockDim.x) {
        const int32_t v = idx[i];
        if (v < lo || v >= hi) atomicMin(&result[0], static_cast<int32_t>(i));
        else if (marks) atomicAdd(&marks[v - lo], 1);
    }
}

__global__ void check_repeat_kernel(const int32_t *__restrict__ idx, int64_t count, int32_t lo, int32_t hi,
                                    int32_t *result, const int32_t *__restrict__ marks) {
    for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < count;
         i += int64_t(gridDim.x) * blockDim.x) {
        const int32_t v = idx[i];
        if (v >= lo && v < hi && marks[v - lo] > 1) atomicMin(&result[1], static_cast<int32_t>(i));
    }
}

// The first failure of check_range_kernel / check_repeat_kernel into the deferred-check slot.
__global__ void check_record_kernel(const int32_t *__restrict__ idx, const int32_t *__restrict__ result,
                                    DeferredCheck *slot, uint32_t range_id, uint32_t repeat_id) {
    if (threadIdx.x != 0) return;
    const int32_t bad = result[0], repeat = result[1];
    const int32_t at = bad != INT_MAX ? bad : repeat;
    if (at == INT_MAX) return;
    record_failure(slot, bad != INT_MAX ? range_id : repeat_id, at, static_cast<double>(idx[at]));
}

__global__ void packed_index_kernel(const int32_t *__restrict__ cu, int64_t B, int64_t s, int64_t n,
                                    int32_t *__restrict__ idx, int32_t *__restrict__ lens) {
    const int64_t total = n > B ? n : B;
    for (int64_t t = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; t < total; t += int64_t(gridDim.x) * blockDim.x) {
        if (t < B) {
            const int64_t len = int64_t(cu[t + 1]) - cu[t];
            lens[t] = static_cast<int32_t>(len < 0 ? 0 : (len > s ? s : len));
        }
        if (t < n) {
            int64_t lo = 0, hi = B - 1;  // the last b with cu[b] <= t (b = 0 when none)
            while (lo < hi) {
                const int64_t mid = (lo + hi + 1) / 2;
                if (cu[mid] <= t) lo = mid;
                else hi = mid - 1;
            }
            int64_t pos = t - cu[lo];
            pos = pos < 0 ? 0 : (pos >= s ? s - 1 : pos);
            idx[t] = static_cast<int32_t>(lo * s + pos);
        }
    }
}

// Row copies: blocks take rows (grid-stride), threads a row's elements; with `V` = uint4, 16 bytes a
// thread (rows of a multiple of 16 bytes on 16-byte aligned buffers), else one element.
// An index outside [0, n) reads as a zero row (gather) or is skipped (scatter): the kernels stay
// inside their tensors whatever the indices hold (a deferred index check reports them later).
template <typename V>
__global__ void gather_rows_kernel(const V *__restrict__ src, const int32_t *__restrict__ idx, V *__restrict__ dst,
                                   int64_t n, int64_t m, int64_t h) {
    for (int64_t i = blockIdx.x; i < m; i += gridDim.x) {
        const int64_t r = idx[i];
        V *d = dst + i * h;
        if (r < 0 || r >= n) {
            for (int64_t j = threadIdx.x; j < h; j += blockDim.x) d[j] = V{};
            continue;
        }
        const V *s = src + r * h;
        for (int64_t j = threadIdx.x; j < h; j += blockDim.x) d[j] = s[j];
    }
}

template <typename V>
__global__ void scatter_rows_kernel(const V *__restrict__ src, const int32_t *__restrict__ idx, V *__restrict__ dst,
                                    int64_t n, int64_t m, int64_t h) {
    for (int64_t i = blockIdx.x; i < m; i += gridDim.x) {
        const int64_t r = idx[i];
        if (r < 0 || r >= n) continue;
        const V *s = src + i * h;
        V *d = dst + r * h;
        for (int64_t j = threadIdx.x; j < h; j += blockDim.x) d[j] = s[j];
    }
}

template <typename T>
__global__ void scatter_add_rows_kernel(const T *__restrict__ src, const int32_t *__restrict__ idx, T *dst, int64_t n,
                                        int64_t m, int64_t h) {
    for (int64_t i = blockIdx.x; i < m; i += gridDim.x) {
        const int64_t r = idx[i];
        if (r < 0 || r >= n) continue;
        const T *s = src + i * h;
        T *d = dst + r * h;
        for (int64_t j = threadIdx.x; j < h; j += blockDim.x) d[j] = to_storage<T>(to_compute(d[j]) + to_compute(s[j]));
    }
}

bool rows_vec16(const void *a, const void *b, int64_t h, size_t es) {
    return (static_cast<size_t>(h) * es) % 16 == 0 && reinterpret_cast<uintptr_t>(a) % 16 == 0 &&
           reinterpret_cast<uintptr_t>(b) % 16 == 0;
}

unsigned row_blocks(int64_t m) { return static_cast<unsigned>(m < 65536 ? m : 65536); }

}  // namespace

// ================================ launchers ======================================================

size_t check_indices_workspace(int64_t range, bool distinct) {
    return 256 + (distinct && range > 0 ? static_cast<size_t>(range) * sizeof(int32_t) : 0);
}

cudaError_t check_indices(cudaStream_t stream, const int32_t *idx, int64_t count, int32_t lo, int32_t hi,
                         bool distinct, void *workspace) {
    int32_t *result = static_cast<int32_t *>(workspace);
    int32_t *marks = distinct ? reinterpret_cast<int32_t *>(static_cast<char *>(workspace) + 256) : nullptr;
    check_init_kernel<<<1, 32, 0, stream>>>(result);
    DST_KERNEL_CHECK(cudaGetLastError());
    if (count <= 0) return cudaSuccess;
    if (marks) DST_KERNEL_CHECK(cudaMemsetAsync(marks, 0, static_cast<size_t>(int64_t(hi) - lo) * sizeof(int32_t), stream));
    const unsigned blocks = grid_blocks(count, kThreads);
    check_range_kernel<<<blocks, kThreads, 0, stream>>>(idx, count, lo, hi, result, marks);
    DST_KERNEL_CHECK(cudaGetLastError());
    if (marks) {
        check_repeat_kernel<<<blocks, kThreads, 0, stream>>>(idx, count, lo, hi, result, marks);
        DST_KERNEL_CHECK(cudaGetLastError());
    }
    return cudaSuccess;
}

cudaError_t check_indices_deferred(cudaStream_t stream, const int32_t *idx, int64_t count, int32_t lo, int32_t hi,
                                  bool distinct, void *workspace, DeferredCheck *slot, uint32_t range_id,
                                  uint32_t repeat_id) {
    if (count <= 0) return cudaSuccess;
    DST_KERNEL_CHECK(check_indices(stream, idx, count, lo, hi, distinct, workspace));
    check_record_kernel<<<1, 32, 0, stream>>>(idx, static_cast<const int32_t *>(workspace), slot, range_id, repeat_id);
    return cudaGetLastError();
}

cudaError_t packed_index(cudaStream_t stream, const int32_t *cu, int64_t B, int64_t s, int64_t n, int32_t *idx,
                         int32_t *lens) {
    const int64_t total = n > B ? n : B;
    if (total <= 0) return cudaSuccess;
    packed_index_kernel<<<grid_blocks(total, kThreads), kThreads, 0, stream>>>(cu, B, s, n, idx, lens);
    return cudaGetLastError();
}

cudaError_t gather_rows(cudaStream_t stream, dst_dtype dt, const void *src, const int32_t *idx, void *dst, int64_t n,
                       int64_t m, int64_t h) {
    if (m <= 0 || h <= 0) return cudaSuccess;
    return dispatch_dtype(dt, [&](auto tag) {
        using T = decltype(tag);
        if (rows_vec16(src, dst, h, sizeof(T))) {
            const int64_t hv = h * int64_t(sizeof(T)) / 16;
            gather_rows_kernel<uint4><<<row_blocks(m), kThreads / 2, 0, stream>>>(
                static_cast<const uint4 *>(src), idx, static_cast<uint4 *>(dst), n, m, hv);
        } else {
            gather_rows_kernel<T><<<row_blocks(m), kThreads, 0, stream>>>(static_cast<const T *>(src), idx,
                                                                           static_cast<T *>(dst), n, m, h);
        }
        DST_KERNEL_CHECK(cudaGetLastError());
        return cudaSuccess;
    });
}

cudaError_t scatter_rows(cudaStream_t stream, dst_dtype dt, const void *src, const int32_t *idx, void *dst, int64_t n,
                        int64_t m, int64_t h, bool accumulate) {
    if (h <= 0) return cudaSuccess;
    if (!accumulate && n > 0)
        DST_KERNEL_CHECK(cudaMemsetAsync(dst, 0, static_cast<size_t>(n * h) * (dt == DST_DTYPE_FP64 ? 8 : dt == DST_DTYPE_FP32 ? 4 : 2), stream));
    if (m <= 0) return cudaSuccess;
    return dispatch_dtype(dt, [&](auto tag) {
        using T = decltype(tag);
        if (accumulate) {
            scatter_add_rows_kernel<T><<<row_blocks(m), kThreads, 0, stream>>>(static_cast<const T *>(src), idx,
                                                                                static_cast<T *>(dst), n, m, h);
        } else if (rows_vec16(src, dst, h, sizeof(T))) {
            const int64_t hv = h * int64_t(sizeof(T)) / 16;
            scatter_rows_kernel<uint4><<<row_blocks(m), kThreads / 2, 0, stream>>>(
                static_cast<const uint4 *>(src), idx, static_cast<uint4 *>(dst), n, m, hv);
        } else {
            scatter_rows_kernel<T><<<row_blocks(m), kThreads, 0, stream>>>(static_cast<const T *>(src), idx,
                                                                            static_cast<T *>(dst), n, m, h);
        }
        DST_KERNEL_CHECK(cudaGetLastError());
        return cudaSuccess;
    });
}

}  // namespace cuda
}  // namespace dst
