// Row kernels of the CUDA backend's model ops: the index check behind every op that takes int32
// indices (range and, optionally, distinctness, answered with integer atomics whose result does not
// depend on their order), and the row gather/scatter (dst_gather_rows, dst_scatter_rows, the
// selected rows of the fused cross-entropy).
#ifndef DST_KERNELS_ROWS_CUH
#define DST_KERNELS_ROWS_CUH

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "dstransformer/dstransformer.h"  // defines: dst_dtype
#include "kernels/checks.cuh"              // defines: DeferredCheck

namespace dst {
namespace cuda {

// Workspace bytes of check_indices: two result words, and a mark per value of [lo, hi) when distinct.
size_t check_indices_workspace(int64_t range, bool distinct);
// result[0] = the smallest i with idx[i] ∉ [lo, hi), result[1] = (distinct) the smallest i whose value
// occurs more than once; INT32_MAX for none. `result` points into `workspace` (its first 8 bytes);
// the caller copies it back. Asynchronous.
cudaError_t check_indices(cudaStream_t stream, const int32_t *idx, int64_t count, int32_t lo, int32_t hi,
                         bool distinct, void *workspace);
// check_indices, then one thread records the first failure in the deferred-check slot (checks.cuh):
// an index out of range as check `range_id`, else (distinct) a repeated one as `repeat_id`, with the
// element's index and value. Nothing waits; the same workspace as check_indices.
cudaError_t check_indices_deferred(cudaStream_t stream, const int32_t *idx, int64_t count, int32_t lo, int32_t hi,
                                  bool distinct, void *workspace, DeferredCheck *slot, uint32_t range_id,
                                  uint32_t repeat_id);
// Packed sequences (offsets cu[0..B] over n rows): idx[r] = b*s + (r - cu[b]) for the b with
// cu[b] <= r < cu[b+1], and lens[b] = cu[b+1] - cu[b]; both clamped into range (idx in [0, B*s), lens in
// 0..s) whatever the offsets hold, which check_offsets_deferred (kernels/checks.cuh) verifies.
cudaError_t packed_index(cudaStream_t stream, const int32_t *cu, int64_t B, int64_t s, int64_t n, int32_t *idx,
                         int32_t *lens);
// dst[i, :] = src[idx[i], :] for i < m (rows of h elements) from src [n, h]; an index outside [0, n)
// gives a row of zeros.
cudaError_t gather_rows(cudaStream_t stream, dst_dtype dt, const void *src, const int32_t *idx, void *dst, int64_t n,
                       int64_t m, int64_t h);
// dst[idx[i], :] (+)= src[i, :], idx distinct; without accumulate every other row of dst [n, h] is zeroed
// first. An index outside [0, n) is skipped (repeated ones race, but stay inside dst).
cudaError_t scatter_rows(cudaStream_t stream, dst_dtype dt, const void *src, const int32_t *idx, void *dst, int64_t n,
                        int64_t m, int64_t h, bool accumulate);

}  // namespace cuda
}  // namespace dst

#endif  // DST_KERNELS_ROWS_CUH
