// Bias kernels of the CUDA backend: deterministic column sums (the bias gradient of a linear
// layer, db[m] = Σ_n dy[n, m]) and the row broadcast of a bias vector (y[i, :] = b) that the FP64
// GEMM path uses in place of a cuBLASLt bias epilogue.
#ifndef DST_KERNELS_BIAS_CUH
#define DST_KERNELS_BIAS_CUH

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "dstransformer/dstransformer.h"  // defines: dst_dtype

namespace dst {
namespace cuda {

// Workspace bytes that column_sum needs for an [n, m] matrix.
size_t column_sum_workspace(dst_dtype dt, int64_t n, int64_t m);
// db[j] = Σ_i dy[i, j] (accumulate: db += …), dy [n, m] row-major. Two passes with a fixed order
// (per-chunk partial sums into `workspace`, then one ordered sum per column): no atomics, so the
// result is bit-identical from run to run. n == 0 writes zeros (or leaves db when accumulating).
cudaError_t column_sum(cudaStream_t stream, dst_dtype dt, const void *dy, void *db, int64_t n, int64_t m,
                      bool accumulate, void *workspace);
// column_sum's second pass alone, for a kernel that wrote its partial sums itself
// (kernels/column_partial.cuh) into `partial` (column_sum_workspace bytes).
cudaError_t column_sum_finalize(cudaStream_t stream, dst_dtype dt, const void *partial, void *db, int64_t n,
                               int64_t m, bool accumulate);
// The same second pass over `chunks` rows of partial sums of another layout: chunk c's sum of column j
// at partial[c · ld + j] (ld ≥ m), added in chunk order as column_sum_finalize adds its own
// (gemm_dgelu's per-tile partials, kernels/gemm_gelu.cuh). chunks == 0 writes zeros (or leaves db
// when accumulating).
cudaError_t column_sum_finalize_chunks(cudaStream_t stream, dst_dtype dt, const void *partial, int64_t ld,
                                      int64_t chunks, void *db, int64_t m, bool accumulate);
// y[i, j] = b[j] for i < n, j < m.
cudaError_t bias_broadcast(cudaStream_t stream, dst_dtype dt, const void *b, void *y, int64_t n,
                          int64_t m);

}  // namespace cuda
}  // namespace dst

#endif  // DST_KERNELS_BIAS_CUH
