// Generic (SIMT) fused attention of the CUDA backend, for FP32 and FP64 layers, and for FP16 and BF16
// layers whose heads are wider than the tensor-core kernels of kernels/attention_flash.cuh run
// (kFlashMaxHeadDim). Forward is flash-style (online softmax, nothing S×S in memory); backward
// recomputes P from the row log-sum-exp in two deterministic kernels, one owning dK/dV per key tile
// and one owning dQ per query tile, so no atomics are needed. Supported: any S ≥ 1, any number of
// heads, any head_dim ≥ 1 (heads wider than 128 run in 128-column chunks, the score products
// repeated per chunk); softmax in the compute type (double for FP64, float otherwise). Math and
// layouts: kernels/attention_args.h.
#ifndef DST_KERNELS_ATTENTION_CUH
#define DST_KERNELS_ATTENTION_CUH

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "dstransformer/dstransformer.h"  // defines: dst_dtype
#include "kernels/attention_args.h"       // defines: AttentionArgs

namespace dst {
namespace cuda {

// Converts an additive mask [count] of mask_dtype (FP32, FP16, BF16, FP64) to the compute type of
// dt (float or double) in `out`.
cudaError_t attention_key_bias(cudaStream_t stream, dst_dtype dt, dst_dtype mask_dtype, const void *mask,
                              void *out, int64_t count);

// ctx [B,S,H] = dropout(softmax(scale·QKᵀ + mask))·V; lse (compute type [B, heads, S], nullable)
// receives the row log-sum-exp, −inf for fully masked rows (whose ctx is 0). a.key_bias is in the
// compute type of dt.
cudaError_t attention_fwd(cudaStream_t stream, dst_dtype dt, const AttentionArgs &a, const void *qkv, void *ctx,
                         void *lse);

// Workspace bytes attention_bwd needs (the row sums D_i = dctx_i·ctx_i).
size_t attention_bwd_workspace(dst_dtype dt, const AttentionArgs &a);

// dqkv [B,S,3H] from dctx, P recomputed from lse.
cudaError_t attention_bwd(cudaStream_t stream, dst_dtype dt, const AttentionArgs &a, const void *qkv,
                         const void *ctx, const void *dctx, const void *lse, void *dqkv, void *workspace);

}  // namespace cuda
}  // namespace dst

#endif  // DST_KERNELS_ATTENTION_CUH
