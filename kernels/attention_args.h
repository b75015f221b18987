// The one description of an attention call that every attention kernel of the CUDA backend takes
// (by value), filled once by the backend (src/backend/cuda) from the op's AttentionParams. Plain
// C++ (no CUDA types), so the backend's host code, the kernels and the kernel lab share it.
//
// Math (src/backend/backend.h, AttentionParams): for batch b, head h, query i and key j,
//   s_ij = scale·q_i·k_j + key_bias[b, j]   (−inf where j ≥ key_len[b], or causal and j > i)
//   lse_i = log Σ_j exp(s_ij) (−inf for a row with every key masked), P_ij = exp(s_ij − lse_i),
//   P̃_ij = P_ij·keep_ij/(1−p) with keep_ij from Philox element ((b·heads + h)·S + i)·S + j
//   (kernels/philox.h), ctx_i = Σ_j P̃_ij v_j.
// Layouts: qkv [B, S, 3H] (Q, K, V blocks of H columns; head h at columns h·d … h·d+d−1 of each
// block), ctx/dctx [B, S, H], dqkv like qkv, or the packed rows of seq_start; lse and the backward's
// row sums D [B, heads, S] in the compute type (float; double for FP64 layers).
#ifndef DST_KERNELS_ATTENTION_ARGS_H
#define DST_KERNELS_ATTENTION_ARGS_H

#include <stddef.h>
#include <stdint.h>

namespace dst {
namespace cuda {

struct AttentionArgs {
    // ---- shape ----
    int64_t batch = 0, seq = 0, heads = 0, head_dim = 0, hidden = 0;
    // ---- scores ----
    double scale = 1.0;             // 1/sqrt(head_dim), applied to q·k before the mask
    bool causal = false;
    const void *key_bias = nullptr;    // compute type [B, S] (additive mask), or nullptr
    const int32_t *key_len = nullptr;  // int32 [B] (keys j ≥ len[b] are masked), or nullptr
    // ---- packed layout (flash kernels): sequence b is rows seq_start[b] … + key_len[b] − 1 of qkv,
    // ctx, dctx and dqkv (key_len required, each start + length within the buffers); rows past a
    // sequence are neither read nor written. nullptr: the padded [B, S] layout.
    const int32_t *seq_start = nullptr;
    // ---- dropout of the probabilities (threshold 0: none) ----
    uint64_t seed = 0, offset = 0;
    // nullptr, or device memory holding the offset's high word, read as the kernels run (offset < 2^32
    // then; kernels/philox.h, dropout_offset): a call captured into a CUDA graph draws new masks per replay
    const uint32_t *offset_hi = nullptr;
    uint32_t threshold = 0;
    double drop_scale = 1.0;        // 1/(1−p)
    // ---- backward ----
    bool deterministic = true;      // false (stochastic_mode): dQ by float atomics, one pass fewer
};

}  // namespace cuda
}  // namespace dst

#endif  // DST_KERNELS_ATTENTION_ARGS_H
