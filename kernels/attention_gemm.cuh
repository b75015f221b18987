// Kernels of the tensor-core attention path (FP16, BF16, FP32) of the CUDA backend. The GEMMs
// (Q·Kᵀ, P̃·V, dctx·Vᵀ, P̃ᵀ·dctx, dS·K, dSᵀ·Q) are strided-batched cuBLASLt matmuls over packed
// per-head buffers [B·heads, S, d], orchestrated by src/backend/cuda/attention_path.cpp; this file
// has the glue around them: pack/unpack between the layer layout and the per-head layout, and the
// row-wise softmax forward/backward (fp32 math, dropout with the element index
// ((b·heads + h)·S + i)·S + j of kernels/philox.h). The generic kernels of attention.cuh stay the
// path for FP64 and for shapes this path does not take (see attention_path.cpp).
#ifndef DST_KERNELS_ATTENTION_GEMM_CUH
#define DST_KERNELS_ATTENTION_GEMM_CUH

#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/attention.cuh"          // defines: AttentionLaunch
#include "dstransformer/dstransformer.h"  // defines: dst_status, dst_dtype

namespace dst {
namespace cuda {

// Longest sequence the softmax kernels hold in registers (one warp per row).
constexpr int64_t kAttentionGemmMaxSeq = 1024;

// [B, S, nblk·H] (block k, head h at columns k·H + h·d …) → [nblk][B·heads][S][d]; and back.
// Needs d·sizeof(T) and H·sizeof(T) multiples of 16 and 16-byte aligned pointers.
dst_status attention_pack(cudaStream_t stream, const AttentionLaunch &a, int nblk, const void *src,
                          void *dst);
dst_status attention_unpack(cudaStream_t stream, const AttentionLaunch &a, int nblk, const void *src,
                            void *dst);

// Row-wise softmax over fp32 raw scores q·k [B·heads, S, S] (ld S): applies scale, mask, causal,
// writes P (storage dtype, [B·heads, S, S]) to probs and lse (fp32) when non-null, and
// P̃ = dropout(P) (storage dtype, row stride ldp elements) to ptilde. ptilde may alias scores (each
// row is read completely before it is written).
dst_status attention_softmax_fwd(cudaStream_t stream, const AttentionLaunch &a, const float *scores,
                                 void *ptilde, int64_t ldp, void *probs, float *lse);

// Row-wise softmax gradient: P from probs (storage dtype, ld S) when non-null, else recomputed from
// the fp32 raw scores (ld S) and lse; dp holds dctx·Vᵀ (fp32, ld S). Writes P̃ to ptilde (ld ldp)
// and dS = P ∘ (dP̃·keep·scale_drop − D), D_i = dctx_i·ctx_i, to ds (ld lds), both in the storage
// dtype. ptilde may alias scores and ds may alias dp.
dst_status attention_softmax_bwd(cudaStream_t stream, const AttentionLaunch &a, const float *scores,
                                 const void *probs, const float *lse, const float *dp, const void *ctx,
                                 const void *dctx, void *ptilde, int64_t ldp, void *ds, int64_t lds);

}  // namespace cuda
}  // namespace dst

#endif  // DST_KERNELS_ATTENTION_GEMM_CUH
