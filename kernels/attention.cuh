// Fused attention of the CUDA backend over a fused QKV activation (see AttentionParams in
// src/backend/backend.h for the math and layouts). Forward is flash-style (online softmax, nothing
// S×S in memory unless the probabilities are asked for); backward recomputes P from the row
// log-sum-exp (or reads a stored P) in two deterministic kernels, one owning dK/dV per key tile and
// one owning dQ per query tile, so no atomics are needed.
// Supported: any S ≥ 1, any number of heads, head_dim 1..kMaxHeadDim; softmax in the compute type
// (double for FP64, float otherwise).
#ifndef DST_KERNELS_ATTENTION_CUH
#define DST_KERNELS_ATTENTION_CUH

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "backend/backend.h"              // defines: DropoutSite
#include "dstransformer/dstransformer.h"  // defines: dst_status, dst_dtype

namespace dst {
namespace cuda {

constexpr int64_t kAttentionMaxHeadDim = 128;

// Everything the attention kernels need, filled once by the backend (habit: plain params struct).
struct AttentionLaunch {
    dst_dtype dt = DST_DTYPE_FP32;  // storage dtype of qkv, ctx, dctx, probs, dqkv
    int64_t batch = 0, seq = 0, hidden = 0, heads = 0, head_dim = 0;
    double scale = 1.0;             // applied to q·k before the mask
    bool causal = false;
    const void *key_bias = nullptr;    // compute type [B, S], added to the scores (additive mask)
    const int32_t *key_len = nullptr;  // int32 [B]: keys j ≥ len[b] are masked
    DropoutSite dropout;               // element index ((b·heads + h)·S + i)·S + j
};

// Converts an additive mask [count] of mask_dtype (FP32, FP16, BF16, FP64) to the compute type of
// dt (float or double) in `out`.
dst_status attention_key_bias(cudaStream_t stream, dst_dtype dt, dst_dtype mask_dtype, const void *mask,
                              void *out, int64_t count);

// ctx [B,S,H] = dropout(softmax(scale·QKᵀ + mask))·V; lse (compute type [B, heads, S], nullable)
// receives the row log-sum-exp, −inf for fully masked rows (whose ctx is 0).
dst_status attention_fwd(cudaStream_t stream, const AttentionLaunch &a, const void *qkv, void *ctx,
                         void *lse);

// probs [B, heads, S, S] = P (before dropout) from qkv, the mask and the forward's lse.
dst_status attention_probs(cudaStream_t stream, const AttentionLaunch &a, const void *qkv,
                           const void *lse, void *probs);

// Workspace bytes attention_bwd needs (the row sums D_i = dctx_i·ctx_i).
size_t attention_bwd_workspace(const AttentionLaunch &a);

// dqkv [B,S,3H] from dctx; P is read from probs when non-null, else recomputed from lse.
dst_status attention_bwd(cudaStream_t stream, const AttentionLaunch &a, const void *qkv, const void *ctx,
                         const void *dctx, const void *probs, const void *lse, void *dqkv,
                         void *workspace);

}  // namespace cuda
}  // namespace dst

#endif  // DST_KERNELS_ATTENTION_CUH
