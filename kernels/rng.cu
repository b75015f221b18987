// The graph dropout counter (rng.cuh).
#include "kernels/rng.cuh"

namespace dst {
namespace cuda {

namespace {

// A plain launch (no programmatic dependency): the kernels after it that read *slot start once it
// has finished, and it starts once the work before it has.
__global__ void rng_take_kernel(uint32_t *counter, uint32_t *slot) {
    const uint32_t word = *counter;
    *slot = word;
    *counter = word + 1u;
}

}  // namespace

cudaError_t rng_take(cudaStream_t stream, uint32_t *counter, uint32_t *slot) {
    rng_take_kernel<<<1, 1, 0, stream>>>(counter, slot);
    return cudaGetLastError();
}

}  // namespace cuda
}  // namespace dst
