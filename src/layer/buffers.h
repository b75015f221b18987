// Buffer bookkeeping of one layer call, in one table.
//
// Gradient rule: parameter gradients are written or accumulated (dst_grad_mode); activation
// gradients (dX and the temporaries below) are always written; the residual-stream gradient is
// added through the `dresid` input of the LayerNorm backward or an accumulating GEMM.
//
// A training forward keeps the "kept" slots in the caller's dst_saved object; every other slot it
// uses lives in the layer's workspace, which backward reuses for its temporaries. Inference keeps
// nothing. N = B·S tokens, or the packed call's token count (dst_layer_forward_packed: every token
// slot holds the packed rows only); "stat" slots are float (double for FP64 layers).
#ifndef DST_LAYER_BUFFERS_H
#define DST_LAYER_BUFFERS_H

#include <array>
#include <cstddef>
#include <cstdint>

#include "backend/backend.h"              // defines: ScratchNeeds
#include "dstransformer/dstransformer.h"  // defines: dst_layer_config

namespace dst {

enum Slot : int {
    kSlotX,        // (N, H)   layer input x: LN1 backward (Pre-LN), dWqkv (Post-LN)
    kSlotLn1Out,   // (N, H)   Pre-LN: h = LN1(x), input of the QKV GEMM
    kSlotLn1Mean,  // (N) stat Pre-LN: LN1 mean (not needed when normalize_invertible)
    kSlotLn1Rstd,  // (N) stat Pre-LN: LN1 1/σ
    kSlotQkv,      // (N, 3H)  fused Q|K|V
    kSlotCtx,      // (N, H)   attention context (heads merged)
    kSlotLse,      // (B, heads, S) stat row log-sum-exp of the scores (attention is fused: nothing
                   //          S×S is kept, with or without attn_dropout_checkpoint)
    kSlotResid,    // (N, H)   r = x + dropout(attn out): LN2 input
    kSlotLn2Out,   // (N, H)   h2 = LN2(r): FFN input
    kSlotLn2Mean,  // (N) stat
    kSlotLn2Rstd,  // (N) stat
    kSlotPreGelu,  // (N, I)   u = h2·Wiᵀ + bi
    kSlotGelu,     // (N, I)   g = GELU(u); recomputed in backward with gelu_checkpoint
    kSlotSum,      // (N, H)   Post-LN: z = h2 + dropout(FFN out), final LN input
    kSlotOut,      // (N, H)   Post-LN + normalize_invertible: the output y (final LN backward)
    kSlotLn3Mean,  // (N) stat Post-LN final LN
    kSlotLn3Rstd,  // (N) stat
    kSlotMask,     // (B, S) × max(4, dtype) bytes: copy of the attention mask for backward
                   //          (packed training: the key lengths, int32 [B])
    kSlotRows,     // (N) int32 packed training: each row's place b·S + i in the padded layout
    kSlotPackWs,   // packed, workspace: key lengths and row places as the call computes them,
                   //          before the saved object is touched (int32 [B], then [N])
    kSlotRng,      // uint32   training with dropout: the high word of the dropout offsets of a forward
                   //          captured into a CUDA graph, taken from the context's counter as it runs
    kSlotTmpH,     // (N, H)   workspace: projection outputs before dropout + residual
    kSlotCount
};

// Backward temporaries, all in the workspace.
enum Temp : int {
    kTmp1,      // (N, H)
    kTmp2,      // (N, H)
    kTmp3,      // (N, H)   dr, the residual-stream gradient after the attention LN
    kTmp5,      // (N, H)   Post-LN: dz
    kTmpQkv,    // (N, 3H)  dqkv
    kTmpI,      // (N, I)   recomputed g, then dg, then du (in place)
    kTempCount
};

struct SlotInfo {
    size_t bytes = 0;
    bool used = false;   // the call writes it
    bool kept = false;   // lives in the saved object (training only)
};

struct Plan {
    std::array<SlotInfo, kSlotCount> slot;
    std::array<size_t, kSlotCount> offset{};    // in the saved object (kept) or workspace (others)
    std::array<size_t, kTempCount> temp_offset{};
    size_t saved_bytes = 0;   // the saved object's size
    size_t fwd_workspace = 0;
    size_t bwd_workspace = 0;
};

// Lays out the buffers of a call with B sequences of length S, padded (packed_tokens 0) or packed
// into packed_tokens rows. `training` selects which slots are kept; backward temporaries are laid
// out from offset 0 of the workspace.
Plan make_plan(const dst_layer_config &cfg, int64_t B, int64_t S, bool training, int64_t packed_tokens = 0);

const char *slot_name(Slot s);

// What the ops of a call ask the backend for as scratch (Backend::scratch_bytes): GEMMs, the
// LayerNorm backward, bias gradients up to the widest projection, attention with this mask.
ScratchNeeds scratch_needs(const dst_layer_config &cfg, int64_t B, int64_t S, dst_mask_kind mask,
                           dst_dtype mask_dtype, int64_t packed_tokens = 0);

// Bytes of workspace a call needs: the plan's (the larger of forward and backward), then the
// backend's scratch from offset scratch_offset(p) on.
size_t scratch_offset(const Plan &p);

}  // namespace dst

#endif  // DST_LAYER_BUFFERS_H
