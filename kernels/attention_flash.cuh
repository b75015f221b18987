// Tensor-core (flash) attention for FP16 and BF16 layers: forward and backward with nothing S×S in
// memory (kernels/attention_flash_impl.cuh has the kernels and how they work; the math and the
// layouts are in kernels/attention_args.h).
// Runs any S ≥ 1, any batch and head count (batch·heads·tiles < 2^31) and head_dim 1 … 128; the
// kernels are built for head dims 32, 64, 96 and 128 and a head_dim in between runs on the next
// one up with zero padding. Fast path when head_dim, hidden and the tensor addresses allow
// 16-byte copies (head_dim % 8 == 0, hidden % 8 == 0, 16-byte aligned pointers); otherwise the same
// kernels load element by element.
// Launchers return cudaSuccess or the CUDA error of the failed launch; invalid arguments
// (unsupported dtype or head_dim) give cudaErrorInvalidValue. Every launch goes to `stream`.
#ifndef DST_KERNELS_ATTENTION_FLASH_CUH
#define DST_KERNELS_ATTENTION_FLASH_CUH

#include <cuda_runtime_api.h>

#include <stddef.h>
#include <stdint.h>

#include "kernels/attention_args.h"

namespace dst {
namespace cuda {

constexpr int64_t kFlashMaxHeadDim = 128;

// Whether the flash kernels run this call (head_dim and grid limits); `why` (nullable) gets the
// reason when not.
bool flash_attention_supported(const AttentionArgs &a, const char **why);

// Workspace bytes of flash_attention_bwd (both modes): the row sums D and lse·log2 e, the fp32 dQ
// accumulator [B, heads, S, padded head_dim] and the dQ reduction's counters.
size_t flash_attention_bwd_workspace(const AttentionArgs &a);

// The packed layout's spans (AttentionArgs::seq_start) from the key lengths of B sequences packed into
// n rows: start[b] = Σ_{c<b} len[c] and rows[b] = len[b], each length clamped into 0 … S and every
// span into the n rows, so that a bad length cannot make a kernel touch a row outside them.
cudaError_t flash_packed_spans(cudaStream_t stream, const int32_t *len, int64_t B, int64_t S, int64_t n,
                               int32_t *start, int32_t *rows);

// ctx [B, S, H] and, when lse != nullptr, lse [B, heads, S] (natural log, −inf for rows whose keys
// are all hidden). bf16 selects BF16 storage, else FP16.
cudaError_t flash_attention_fwd(cudaStream_t stream, bool bf16, const AttentionArgs &a, const void *qkv, void *ctx,
                                float *lse);

// dqkv [B, S, 3H] from dctx, the forward's ctx and lse; `workspace` holds
// flash_attention_bwd_workspace(a) bytes, 16-byte aligned. a.deterministic: dQ is summed over the
// key blocks in a fixed order (bit-identical from run to run); otherwise in arrival order.
cudaError_t flash_attention_bwd(cudaStream_t stream, bool bf16, const AttentionArgs &a, const void *qkv,
                                const void *ctx, const void *dctx, const float *lse, void *dqkv, void *workspace);

}  // namespace cuda
}  // namespace dst

#endif  // DST_KERNELS_ATTENTION_FLASH_CUH
