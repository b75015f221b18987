// Deferred argument checks of the CUDA backend: a kernel checks values the host cannot read without
// waiting for the device (key lengths, LayerNorm γ), and records the first failure in a slot of host
// memory mapped into the device. The host reads the slot later, at the start of a following call,
// without synchronising, so forward and backward never wait for the device and can be captured in a
// CUDA graph (a replay checks again).
#ifndef DST_KERNELS_CHECKS_CUH
#define DST_KERNELS_CHECKS_CUH

#include <cuda_runtime_api.h>

#include <cstdint>

#include "dstransformer/dstransformer.h"  // defines: dst_dtype

namespace dst {
namespace cuda {

// One failure record. A kernel fills it only while `state` is 0 (the first failure is kept until the
// host takes it): index, value and id first, then a system-wide fence, then state = 1.
struct DeferredCheck {
    int32_t state;  // 0 empty, 1 holds a failure
    uint32_t id;    // which check failed (the host keeps its description under this id)
    int64_t index;  // the first failing element
    double value;   // its value
};

#if defined(__CUDACC__)
// Fills the slot unless it still holds an earlier failure: the fields first, then a system-wide fence,
// then state = 1. One thread calls it; kernels on one stream run in order, so no two write at once.
__device__ __forceinline__ void record_failure(DeferredCheck *slot, uint32_t id, int64_t index, double value) {
    volatile DeferredCheck *s = slot;
    if (s->state != 0) return;  // an earlier failure is still waiting for the host
    s->id = id;
    s->index = index;
    s->value = value;
    __threadfence_system();
    s->state = 1;
}
#endif

// Checks lo <= v[i] <= hi for i < count. Asynchronous; `slot` is a device pointer to mapped host memory.
cudaError_t check_range_deferred(cudaStream_t stream, const int32_t *v, int64_t count, int32_t lo, int32_t hi,
                                 DeferredCheck *slot, uint32_t id);
// Checks packed-sequence offsets: 0 = cu[0], cu[B] = n, and 1 <= cu[b+1] - cu[b] <= s for b < B. A
// failure records index b and value cu[b+1] - cu[b] (the first failing b).
cudaError_t check_offsets_deferred(cudaStream_t stream, const int32_t *cu, int64_t B, int64_t n, int64_t s,
                                   DeferredCheck *slot, uint32_t id);
// Checks x[i] != 0 for i < count (floating dtypes).
cudaError_t check_nonzero_deferred(cudaStream_t stream, dst_dtype dt, const void *x, int64_t count,
                                   DeferredCheck *slot, uint32_t id);

}  // namespace cuda
}  // namespace dst

#endif
