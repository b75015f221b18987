// The graph dropout counter (kernels/philox.h, "graph dropout"): a uint32 in device memory that a
// training forward captured into a CUDA graph reads and advances as it runs, so that each replay of
// the graph draws its dropout masks under a new offset word.
#ifndef DST_KERNELS_RNG_CUH
#define DST_KERNELS_RNG_CUH

#include <cuda_runtime_api.h>

#include <cstdint>

namespace dst {
namespace cuda {

// Queues *slot = *counter, then *counter = *slot + 1 (wrapping), on `stream` (device memory, one
// thread: calls on one stream run in order, so no two take the same word).
cudaError_t rng_take(cudaStream_t stream, uint32_t *counter, uint32_t *slot);

}  // namespace cuda
}  // namespace dst

#endif  // DST_KERNELS_RNG_CUH
