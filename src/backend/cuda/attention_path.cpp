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
#include <cstring>

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


dst_status make_layout(cublasLtMatrixLayout_t *l, cudaDataType_t type, int64_t rows, int64_t cols, int64_t ld,
                       int64_t batch, int64_t stride) {
    DST_CUBLASLT_CHECK(cublasLtMatrixLayoutCreate(l, type, rows, cols, ld));
    const int32_t count = static_cast<int32_t>(batch);
    DST_CUBLASLT_CHECK(cublasLtMatrixLayoutSetAttribute(*l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof count));
    DST_CUBLASLT_CHECK(cublasLtMatrixLayoutSetAttribute(*l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride,
                                                        sizeof stride));
    return DST_OK;
}

cuda::AttentionLaunch launch_of(dst_dtype dt, const AttentionParams &p) {
    cuda::AttentionLaunch l;
    l.dt = dt;
    l.batch = p.batch;
    l.seq = p.seq;
    l.hidden = p.hidden;
    l.heads = p.heads;
    l.head_dim = p.head_dim;
    l.scale = p.scale;
    l.causal = p.causal;
    l.dropout = p.dropout;
    if (p.mask_kind == DST_MASK_KEY_LENGTHS) l.key_len = static_cast<const int32_t *>(p.mask);
    return l;
}

}  // namespace

// One column-major strided-batched GEMM D_k = alpha·op(A_k)·op(B_k), k < batch; A and B in the
// storage dtype, D in it or in fp32 (d_fp32), fp32 accumulation (no TF32 unless allowed).
struct CudaBackend::BatchedGemm {
    cublasOperation_t ta, tb;
    int64_t M, N, K;
    const void *A;
    int64_t lda, sa;
    const void *B;
    int64_t ldb, sb;
    void *D;
    int64_t ldd, sd;
    int64_t batch;
    float alpha;
    bool d_fp32;
};

dst_status CudaBackend::batched_gemm(dst_dtype dt, const BatchedGemm &g) {
    const cudaDataType_t type = dt == DST_DTYPE_FP16 ? CUDA_R_16F : dt == DST_DTYPE_BF16 ? CUDA_R_16BF : CUDA_R_32F;
    const cudaDataType_t dtype = g.d_fp32 ? CUDA_R_32F : type;
    const cublasComputeType_t compute =
        (dt == DST_DTYPE_FP32 && allow_tf32_) ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
    LtMatmul mm;
    DST_CUBLASLT_CHECK(cublasLtMatmulDescCreate(&mm.op, compute, CUDA_R_32F));
    const int32_t ta = g.ta, tb = g.tb;
    DST_CUBLASLT_CHECK(cublasLtMatmulDescSetAttribute(mm.op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
    DST_CUBLASLT_CHECK(cublasLtMatmulDescSetAttribute(mm.op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
    const bool an = g.ta == CUBLAS_OP_N, bn = g.tb == CUBLAS_OP_N;
    DST_TRY(make_layout(&mm.a, type, an ? g.M : g.K, an ? g.K : g.M, g.lda, g.batch, g.sa));
    DST_TRY(make_layout(&mm.b, type, bn ? g.K : g.N, bn ? g.N : g.K, g.ldb, g.batch, g.sb));
    DST_TRY(make_layout(&mm.d, dtype, g.M, g.N, g.ldd, g.batch, g.sd));

    const size_t ws_bytes = gemm_workspace_bytes();
    void *ws = nullptr;
    DST_TRY(workspace(ws_bytes, &ws));
    const uint32_t al_a = pointer_alignment(g.A), al_b = pointer_alignment(g.B), al_d = pointer_alignment(g.D);
    const int64_t key[20] = {static_cast<int64_t>(dt), ta, tb, g.M, g.N, g.K, g.lda, g.sa, g.ldb, g.sb,
                             g.ldd, g.sd, g.batch, g.d_fp32, al_a, al_b, al_d,
                             static_cast<int64_t>(ws_bytes), allow_tf32_, 0};
    const LtAlgoEntry *hit = nullptr;
    for (const LtAlgoEntry &e : lt_algos_)
        if (std::memcmp(e.key, key, sizeof key) == 0) hit = &e;
    if (!hit) {
        const uint64_t ws_limit = ws_bytes;
        DST_CUBLASLT_CHECK(cublasLtMatmulPreferenceCreate(&mm.pref));
        DST_CUBLASLT_CHECK(cublasLtMatmulPreferenceSetAttribute(mm.pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                                &ws_limit, sizeof ws_limit));
        DST_CUBLASLT_CHECK(cublasLtMatmulPreferenceSetAttribute(
            mm.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al_a, sizeof al_a));
        DST_CUBLASLT_CHECK(cublasLtMatmulPreferenceSetAttribute(
            mm.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &al_b, sizeof al_b));
        DST_CUBLASLT_CHECK(cublasLtMatmulPreferenceSetAttribute(
            mm.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al_d, sizeof al_d));
        DST_CUBLASLT_CHECK(cublasLtMatmulPreferenceSetAttribute(
            mm.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &al_d, sizeof al_d));
        cublasLtMatmulHeuristicResult_t heur{};
        int found = 0;
        DST_CUBLASLT_CHECK(
            cublasLtMatmulAlgoGetHeuristic(lt_, mm.op, mm.a, mm.b, mm.d, mm.d, mm.pref, 1, &heur, &found));
        if (found < 1)
            return set_error(DST_ERR_BACKEND,
                             "cuda backend: cuBLASLt has no algorithm for a batched %lldx%lldx%lld GEMM (dtype %d)",
                             static_cast<long long>(g.M), static_cast<long long>(g.N),
                             static_cast<long long>(g.K), static_cast<int>(dt));
        if (lt_algos_.size() >= 256) lt_algos_.clear();
        LtAlgoEntry e;
        std::memcpy(e.key, key, sizeof key);
        e.algo = heur.algo;
        e.ws = heur.workspaceSize;
        lt_algos_.push_back(e);
        hit = &lt_algos_.back();
    }
    const float beta = 0.0f;
    DST_CUBLASLT_CHECK(cublasLtMatmul(lt_, mm.op, &g.alpha, g.A, mm.a, g.B, mm.b, &beta, g.D, mm.d, g.D, mm.d,
                                      &hit->algo, ws, hit->ws, stream_));
    return DST_OK;
}

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
    cuda::AttentionLaunch l = launch_of(dt, p);
    const size_t es = elem_size(dt), G = round256(gemm_workspace_bytes());
    const int64_t S = p.seq, d = p.head_dim, BH = p.batch * p.heads;
    const size_t P = size_t(BH) * S * d * es, X = round256(size_t(BH) * S * S * 4);
    char *ws = nullptr;
    DST_TRY(workspace(G + bias_bytes + 4 * P + X, reinterpret_cast<void **>(&ws)));
    char *bias = ws + G, *xs = bias + bias_bytes, *qp = xs + X, *kp = qp + P, *vp = kp + P, *cp = vp + P;
    if (bias_bytes) {
        DST_TRY(cuda::attention_key_bias(stream_, dt, p.mask_dtype, p.mask, bias, p.batch * S));
        l.key_bias = bias;
    } else if (p.mask_kind == DST_MASK_ADDITIVE) {
        l.key_bias = p.mask;
    }
    const int64_t sqk = S * d, sx = S * S, lx = S * 4 / static_cast<int64_t>(es);  // P̃ over X: ld lx
    DST_TRY(cuda::attention_pack(stream_, l, 3, qkv, qp));
    // X[j,i] (col-major S×S) = Σ_t K[j,t]·Q[i,t]: row-major scores[i][j].
    DST_TRY(batched_gemm(dt, {CUBLAS_OP_T, CUBLAS_OP_N, S, S, d, kp, d, sqk, qp, d, sqk, xs, S, sx, BH, 1.0f, true}));
    DST_TRY(cuda::attention_softmax_fwd(stream_, l, reinterpret_cast<const float *>(xs), xs, lx, probs,
                                        static_cast<float *>(lse)));
    // C[t,i] = Σ_j V[j,t]·P̃[i,j]
    DST_TRY(batched_gemm(dt, {CUBLAS_OP_N, CUBLAS_OP_N, d, S, S, vp, d, sqk, xs, lx, S * lx, cp, d, sqk, BH, 1.0f,
                              false}));
    return cuda::attention_unpack(stream_, l, 1, cp, ctx);
}

dst_status CudaBackend::attention_gemm_bwd(dst_dtype dt, const AttentionParams &p, size_t bias_bytes,
                                           const void *qkv, const void *ctx, const void *dctx, const void *probs,
                                           const void *lse, void *dqkv) {
    cuda::AttentionLaunch l = launch_of(dt, p);
    const size_t es = elem_size(dt), G = round256(gemm_workspace_bytes());
    const int64_t S = p.seq, d = p.head_dim, BH = p.batch * p.heads;
    const size_t P = size_t(BH) * S * d * es, X = round256(size_t(BH) * S * S * 4);
    char *ws = nullptr;
    DST_TRY(workspace(G + bias_bytes + 7 * P + 2 * X, reinterpret_cast<void **>(&ws)));
    char *bias = ws + G, *xs = bias + bias_bytes, *ys = xs + X, *qp = ys + X, *kp = qp + P, *vp = kp + P,
         *op = vp + P, *dqp = op + P, *dkp = dqp + P, *dvp = dkp + P;
    if (bias_bytes) {
        DST_TRY(cuda::attention_key_bias(stream_, dt, p.mask_dtype, p.mask, bias, p.batch * S));
        l.key_bias = bias;
    } else if (p.mask_kind == DST_MASK_ADDITIVE) {
        l.key_bias = p.mask;
    }
    const int64_t sqk = S * d, sx = S * S, lx = S * 4 / static_cast<int64_t>(es);
    const float scale = static_cast<float>(p.scale);
    DST_TRY(cuda::attention_pack(stream_, l, 3, qkv, qp));
    DST_TRY(cuda::attention_pack(stream_, l, 1, dctx, op));
    if (!probs)  // X = raw scores (as in the forward)
        DST_TRY(batched_gemm(dt, {CUBLAS_OP_T, CUBLAS_OP_N, S, S, d, kp, d, sqk, qp, d, sqk, xs, S, sx, BH, 1.0f,
                                  true}));
    // Y[j,i] = Σ_t V[j,t]·dctx[i,t]: row-major dP̃[i][j]
    DST_TRY(batched_gemm(dt, {CUBLAS_OP_T, CUBLAS_OP_N, S, S, d, vp, d, sqk, op, d, sqk, ys, S, sx, BH, 1.0f, true}));
    DST_TRY(cuda::attention_softmax_bwd(stream_, l, reinterpret_cast<const float *>(xs), probs,
                                        static_cast<const float *>(lse), reinterpret_cast<const float *>(ys), ctx,
                                        dctx, xs, lx, ys, lx));
    // dV[t,j] = Σ_i dctx[i,t]·P̃[i,j]
    DST_TRY(batched_gemm(dt, {CUBLAS_OP_N, CUBLAS_OP_T, d, S, S, op, d, sqk, xs, lx, S * lx, dvp, d, sqk, BH, 1.0f,
                              false}));
    // dQ[t,i] = scale·Σ_j K[j,t]·dS[i,j]
    DST_TRY(batched_gemm(dt, {CUBLAS_OP_N, CUBLAS_OP_N, d, S, S, kp, d, sqk, ys, lx, S * lx, dqp, d, sqk, BH, scale,
                              false}));
    // dK[t,j] = scale·Σ_i Q[i,t]·dS[i,j]
    DST_TRY(batched_gemm(dt, {CUBLAS_OP_N, CUBLAS_OP_T, d, S, S, qp, d, sqk, ys, lx, S * lx, dkp, d, sqk, BH, scale,
                              false}));
    return cuda::attention_unpack(stream_, l, 3, dqp, dqkv);
}

}  // namespace dst
