// Matrix digests (digest.cuh).
#include "kernels/digest.cuh"

namespace dst {
namespace cuda {

namespace {

__device__ __forceinline__ unsigned long long mix64(unsigned long long z) {  // splitmix64's finaliser
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

template <typename W>
__global__ void digest_kernel(const W *d, int64_t rows, int64_t cols, int64_t ld, unsigned long long *out) {
    const int64_t n = rows * cols;
    unsigned long long sum = 0;
    for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < n; e += int64_t(gridDim.x) * blockDim.x) {
        const int64_t c = e / rows, r = e - c * rows;
        sum += mix64(static_cast<unsigned long long>(d[c * ld + r]) ^ (static_cast<unsigned long long>(e) << 32) ^
                     0x9E3779B97F4A7C15ull);
    }
    for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
    if ((threadIdx.x & 31) == 0) atomicAdd(out, sum);
}

}  // namespace

cudaError_t matrix_digest(cudaStream_t stream, const void *d, int64_t rows, int64_t cols, int64_t ld, int elem_bytes,
                          unsigned long long *out) {
    cudaError_t e = cudaMemsetAsync(out, 0, sizeof *out, stream);
    if (e != cudaSuccess || rows <= 0 || cols <= 0) return e;
    const int64_t n = rows * cols, threads = 256;
    const int64_t blocks = (n + threads - 1) / threads < 1024 ? (n + threads - 1) / threads : 1024;
    if (elem_bytes == 4)
        digest_kernel<uint32_t><<<unsigned(blocks), unsigned(threads), 0, stream>>>(static_cast<const uint32_t *>(d),
                                                                                 rows, cols, ld, out);
    else
        digest_kernel<uint16_t><<<unsigned(blocks), unsigned(threads), 0, stream>>>(static_cast<const uint16_t *>(d),
                                                                                 rows, cols, ld, out);
    return cudaGetLastError();
}

}  // namespace cuda
}  // namespace dst
