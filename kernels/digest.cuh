// An order-independent 64-bit digest of a matrix's bits, for comparing two GEMM algorithms' outputs on
// the device (the CUDA backend's algorithm tuning): Σ over elements of a mix of (bits, row, column),
// modulo 2^64. Integer sums do not depend on the order of the additions, so the digest is
// deterministic; two outputs with equal digests have, with overwhelming probability, equal bits.
#ifndef DST_KERNELS_DIGEST_CUH
#define DST_KERNELS_DIGEST_CUH

#include <cuda_runtime_api.h>

#include <cstdint>

namespace dst {
namespace cuda {

// *out = digest of the rows × cols column-major matrix at `d` (leading dimension ld ≥ rows, elements of
// elem_bytes = 2 or 4 bytes). `out` is device memory; it is overwritten.
cudaError_t matrix_digest(cudaStream_t stream, const void *d, int64_t rows, int64_t cols, int64_t ld, int elem_bytes,
                          unsigned long long *out);

}  // namespace cuda
}  // namespace dst

#endif  // DST_KERNELS_DIGEST_CUH
