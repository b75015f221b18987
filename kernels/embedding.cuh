// Embedding kernels of the CUDA backend (dst_embedding_forward/backward): the lookup-and-sum, and a
// deterministic backward that scatter-adds into the word, position and token-type tables without
// floating-point atomics.
#ifndef DST_KERNELS_EMBEDDING_CUH
#define DST_KERNELS_EMBEDDING_CUH

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "dstransformer/dstransformer.h"  // defines: dst_dtype

namespace dst {
namespace cuda {

// out[t, :] = word[ids[t], :] + pos[t mod S, :] + type[types[t], :] (types nullptr: row 0), t < B·S,
// from word [V, H] and type [T, H]; an id or type outside its table contributes a zero row.
cudaError_t embedding_fwd(cudaStream_t stream, dst_dtype dt, const int32_t *ids, const int32_t *types,
                         const void *word, const void *pos, const void *type, void *out, int64_t B, int64_t S,
                         int64_t H, int64_t V, int64_t T);

// Workspace bytes of embedding_bwd for `tokens` tokens, V word rows (0: no word table), T type rows
// (0: no type table) of width H.
size_t embedding_bwd_workspace(dst_dtype dt, int64_t tokens, int64_t V, int64_t T, int64_t H);

// dword[v] = Σ_{ids[t]=v} dout[t], dpos[s] = Σ_b dout[b, s], dtype[k] = Σ_{types[t]=k} dout[t]
// (each may be nullptr); accumulate adds to the used rows, otherwise every row is written (unused
// rows 0). Word rows: a stable radix sort of (id, token) pairs (cub), then one block per distinct id
// sums its tokens' rows in increasing token order (full chunks of one id through partial sums).
// Types: the column sums of kernels/column_partial.cuh over the rows of each type (other rows read as
// zeros), chunks added in order. Positions: one thread per element sums over b in order.
// Deterministic: no floating-point atomics.
cudaError_t embedding_bwd(cudaStream_t stream, dst_dtype dt, const void *dout, const int32_t *ids,
                         const int32_t *types, void *dword, void *dpos, void *dtype, int64_t B, int64_t S, int64_t H,
                         int64_t V, int64_t P, int64_t T, bool accumulate, void *workspace, size_t workspace_bytes);

}  // namespace cuda
}  // namespace dst

#endif  // DST_KERNELS_EMBEDDING_CUH
