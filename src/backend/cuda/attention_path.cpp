// The tensor-core attention path of the CUDA backend (FP16, BF16, FP32): strided-batched cuBLASLt
// GEMMs over per-head buffers, with the glue kernels of kernels/attention_gemm.cuh.
//
// Forward:  pack qkv → Q, K, V [B·heads, S, d]; X = Q·Kᵀ (fp32, [B·heads, S, S]); softmax rows
//           (scale, mask, causal, fp32) → probs/lse when asked, P̃ = dropout(P) in the storage dtype
//           written over X (row stride 4S bytes); C = P̃·V; unpack C → ctx [B, S, H].
// Backward: pack Q, K, V, dctx; X = Q·Kᵀ (only without probs); Y = dctx·Vᵀ (fp32); softmax-grad
//           rows → P̃ over X, dS = P∘(dP̃·keep·scale_drop − D) over Y (storage dtype);
//           dV = P̃ᵀ·dctx, dQ = scale·dS·K, dK = scale·dSᵀ·Q; unpack → dqkv [B, S, 3H].
// Precision: scores and dP̃ stay fp32 until the softmax; P̃ and dS are rounded once to the storage
// dtype before their GEMMs (fp32 accumulation), the one extra rounding against the reference.
// Determinism: fixed algorithms (heuristic cached per problem), fixed workspace, no atomics.
//
// Which calls take it (attention_gemm_bytes): dtype FP16/BF16/FP32, head_dim a multiple of 8 and
// ≤ 256, H·sizeof(T) a multiple of 16, 1 ≤ S ≤ 1024 (softmax rows in registers), 16-byte aligned
// tensors, and the S×S buffers within kMaxBytes (4 GiB) — and, with a caller-owned workspace, room
// for them there. Otherwise the generic kernels of kernels/attention.cu run.
// Workspace (after the cuBLASLt part and the converted mask): forward X + 4·P (Q, K, V, C),
// backward 2·X + 7·P (Q, K, V, dctx, dQ, dK, dV), with P = B·heads·S·d·sizeof(T) and
// X = B·heads·S²·4 bytes (BERT-Large fp16, B=16 S=512: X = 256 MiB, P = 16 MiB, backward 624 MiB,
// forward 320 MiB; B=64 S=128: backward 240 MiB).
#include <cstdint>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cublaslt_util.h"
#include "core/error.h"
#include "kernels/attention.cuh"
#include "kernels/attention_gemm.cuh"
#include "kernels/dispatch.cuh"

namespace dst {

namespace {

constexpr size_t kMaxBytes = size_t(4) << 30;

size_t round256(size_t v) { return (v + 255) / 256 * 256; }

size_t elem_size(dst_dtype dt) { return dt == DST_DTYPE_FP32 ? 4 : 2; }

}  // namespace

size_t CudaBackend::attention_gemm_bytes(dst_dtype dt, const AttentionParams &p, bool backward, size_t extra,
                                         const void *const *ptrs, int nptrs) const {
    if (!attn_gemm_) return 0;
    if (dt != DST_DTYPE_FP16 && dt != DST_DTYPE_BF16 && dt != DST_DTYPE_FP32) return 0;
    const size_t es = elem_size(dt);
    const int64_t d = p.head_dim, S = p.seq, BH = p.batch * p.heads;
    if (d < 8 || d > 256 || d % 8 != 0 || p.hidden < p.heads * d || (p.hidden * es) % 16 != 0) return 0;
    if (S < 1 || S > cuda::kAttentionGemmMaxSeq || p.batch < 1 || p.heads < 1 || BH > 0x7fffffffLL) return 0;
    for (int k = 0; k < nptrs; ++k)
        if (pointer_alignment(ptrs[k]) < 16) return 0;
    const size_t P = size_t(BH) * S * d * es, X = round256(size_t(BH) * S * S * 4);
    const size_t bytes = backward ? 7 * P + 2 * X : 4 * P + X;
    if (bytes > kMaxBytes) return 0;
    if (user_ws_ && round256(gemm_workspace_bytes()) + extra + bytes > user_ws_bytes_) return 0;
    return bytes;
}

dst_status CudaBackend::attention_gemm_fwd(dst_dtype dt, const AttentionParams &p, size_t bias_bytes,
                                           const void *qkv, void *ctx, void *probs, void *lse) {
    cuda::AttentionLaunch l = attention_launch(dt, p);
    const size_t es = elem_size(dt), G = round256(gemm_workspace_bytes());
    const int64_t S = p.seq, d = p.head_dim, BH = p.batch * p.heads;
    const size_t P = size_t(BH) * S * d * es, X = round256(size_t(BH) * S * S * 4);
    char *ws = nullptr;
    DST_TRY(workspace(G + bias_bytes + 4 * P + X, reinterpret_cast<void **>(&ws)));
    char *bias = ws + G, *xs = bias + bias_bytes, *qp = xs + X, *kp = qp + P, *vp = kp + P, *cp = vp + P;
    DST_TRY(set_key_bias(dt, p, bias, &l));
    const int64_t sqk = S * d, sx = S * S, lx = S * 4 / static_cast<int64_t>(es);  // P̃ over X: ld lx
    DST_TRY(cuda::attention_pack(stream_, l, 3, qkv, qp));
    // X[j,i] (col-major S×S) = Σ_t K[j,t]·Q[i,t]: row-major scores[i][j].
    DST_TRY(gemm(dt, {CUBLAS_OP_T, CUBLAS_OP_N, S, S, d, kp, d, sqk, qp, d, sqk, xs, S, sx, BH, 1.0f, true}));
    DST_TRY(cuda::attention_softmax_fwd(stream_, l, reinterpret_cast<const float *>(xs), xs, lx, probs,
                                        static_cast<float *>(lse)));
    // C[t,i] = Σ_j V[j,t]·P̃[i,j]
    DST_TRY(gemm(dt, {CUBLAS_OP_N, CUBLAS_OP_N, d, S, S, vp, d, sqk, xs, lx, S * lx, cp, d, sqk, BH, 1.0f,
                              false}));
    return cuda::attention_unpack(stream_, l, 1, cp, ctx);
}

dst_status CudaBackend::attention_gemm_bwd(dst_dtype dt, const AttentionParams &p, size_t bias_bytes,
                                           const void *qkv, const void *ctx, const void *dctx, const void *probs,
                                           const void *lse, void *dqkv) {
    cuda::AttentionLaunch l = attention_launch(dt, p);
    const size_t es = elem_size(dt), G = round256(gemm_workspace_bytes());
    const int64_t S = p.seq, d = p.head_dim, BH = p.batch * p.heads;
    const size_t P = size_t(BH) * S * d * es, X = round256(size_t(BH) * S * S * 4);
    char *ws = nullptr;
    DST_TRY(workspace(G + bias_bytes + 7 * P + 2 * X, reinterpret_cast<void **>(&ws)));
    char *bias = ws + G, *xs = bias + bias_bytes, *ys = xs + X, *qp = ys + X, *kp = qp + P, *vp = kp + P,
         *op = vp + P, *dqp = op + P, *dkp = dqp + P, *dvp = dkp + P;
    DST_TRY(set_key_bias(dt, p, bias, &l));
    const int64_t sqk = S * d, sx = S * S, lx = S * 4 / static_cast<int64_t>(es);
    const float scale = static_cast<float>(p.scale);
    DST_TRY(cuda::attention_pack(stream_, l, 3, qkv, qp));
    DST_TRY(cuda::attention_pack(stream_, l, 1, dctx, op));
    if (!probs)  // X = raw scores (as in the forward)
        DST_TRY(gemm(dt, {CUBLAS_OP_T, CUBLAS_OP_N, S, S, d, kp, d, sqk, qp, d, sqk, xs, S, sx, BH, 1.0f,
                                  true}));
    // Y[j,i] = Σ_t V[j,t]·dctx[i,t]: row-major dP̃[i][j]
    DST_TRY(gemm(dt, {CUBLAS_OP_T, CUBLAS_OP_N, S, S, d, vp, d, sqk, op, d, sqk, ys, S, sx, BH, 1.0f, true}));
    DST_TRY(cuda::attention_softmax_bwd(stream_, l, reinterpret_cast<const float *>(xs), probs,
                                        static_cast<const float *>(lse), reinterpret_cast<const float *>(ys), ctx,
                                        dctx, xs, lx, ys, lx));
    // dV[t,j] = Σ_i dctx[i,t]·P̃[i,j]
    DST_TRY(gemm(dt, {CUBLAS_OP_N, CUBLAS_OP_T, d, S, S, op, d, sqk, xs, lx, S * lx, dvp, d, sqk, BH, 1.0f,
                              false}));
    // dQ[t,i] = scale·Σ_j K[j,t]·dS[i,j]
    DST_TRY(gemm(dt, {CUBLAS_OP_N, CUBLAS_OP_N, d, S, S, kp, d, sqk, ys, lx, S * lx, dqp, d, sqk, BH, scale,
                              false}));
    // dK[t,j] = scale·Σ_i Q[i,t]·dS[i,j]
    DST_TRY(gemm(dt, {CUBLAS_OP_N, CUBLAS_OP_T, d, S, S, qp, d, sqk, ys, lx, S * lx, dkp, d, sqk, BH, scale,
                              false}));
    return cuda::attention_unpack(stream_, l, 3, dqp, dqkv);
}

}  // namespace dst
