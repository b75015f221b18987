// The table of ops a backend implements. The layer's dataflow (src/layer/layer.cpp) is written once
// in terms of these ops; the CPU backend (src/backend/cpu) is the reference, the CUDA backend
// (src/backend/cuda) fills the same table with kernels and cuBLASLt.
//
// Conventions for every op:
//  - Pointers are in the backend's memory space. Matrices are dense and row-major.
//  - `dt` is the storage dtype of the layer (FP32, FP16, BF16 or FP64) and applies to every tensor
//    argument unless the comment says "stat": statistics (LayerNorm mean/rstd, attention row
//    log-sum-exp) are stored in the compute dtype, double for FP64 layers and float otherwise.
//  - Arithmetic is done in the compute dtype; results are rounded once to the storage dtype.
//  - Ops never validate shapes (the C API did); they return DST_OK or a status with a message set
//    through dst::set_error (launch or library failures).
//  - Gradient rule: ops that produce parameter gradients take `accumulate`: false writes, true adds.
//  - Deterministic: the same inputs give bit-identical outputs unless the backend was told
//    stochastic_mode (Backend::set_stochastic).
//  - Optional pointers (nullptr skips that input or output): the bias `b` of linear_fwd, `dw`/`db`
//    of linear_bwd_weight, `mean`/`rstd` of layernorm_fwd, `dresid`/`dgamma`/`dbeta` of
//    layernorm_bwd, `pre_act`, and `lse` of attention_fwd (attention_bwd needs it). Elementwise
//    outputs may alias their inputs; layernorm_bwd computes dγ/dβ before dx, so dx may alias dy or
//    dresid.
//  - Device scratch (the CUDA backend's cuBLASLt workspace, converted masks, attention and reduction
//    scratch) comes from the region given to set_scratch; scratch_bytes says how much the ops of a
//    layer call need. Nothing S×S is ever allocated.
//  - linear_fwd with GELU rounds u to the storage dtype (what pre_act receives) and applies GELU to
//    the rounded value, so a GELU recomputed from pre_act in backward equals the forward's output.
//    attention_bwd recomputes P = exp(score − lse) from the forward's lse (the CPU backend forms P
//    that way in forward too; the CUDA flash kernels normalise with a running maximum, equal up to
//    rounding). Dropout's scale is rounded to the compute dtype.
#ifndef DST_BACKEND_BACKEND_H
#define DST_BACKEND_BACKEND_H

#include <cstddef>
#include <cstdint>

#include "dstransformer/dstransformer.h"  // defines: dst_status, dst_dtype, dst_gelu, dst_mask_kind
#include "kernels/optim_args.h"            // defines: optim::StepArgs
#include "kernels/philox.h"                // defines: DropoutSite

namespace dst {

// Attention over a fused QKV activation.
// qkv: [B, S, 3H]; columns [0,H) are Q, [H,2H) K, [2H,3H) V; head h uses columns h·d … h·d+d−1 of
// each block. ctx: [B, S, H] with the same head layout (heads merged, ready for the output GEMM).
// scores[b,h,i,j] = scale · q_i·k_j + mask(b,j) (−inf where causal and j > i, or j ≥ len[b]);
// P = softmax_j(scores) (rows that are entirely −inf give P = 0); P̃ = dropout(P) with element index
// ((b·heads + h)·S + i)·S + j; ctx_i = Σ_j P̃_ij v_j.
struct AttentionParams {
    int64_t batch = 0, seq = 0, hidden = 0, heads = 0, head_dim = 0;
    double scale = 1.0;          // 1/sqrt(head_dim)
    bool causal = false;
    dst_mask_kind mask_kind = DST_MASK_NONE;
    const void *mask = nullptr;  // ADDITIVE: [B, S] of mask_dtype; KEY_LENGTHS: int32 [B]
    dst_dtype mask_dtype = DST_DTYPE_FP32;
    DropoutSite dropout;
    // Packed layout (packed_tokens > 0; dst_layer_forward_packed): qkv, ctx, dctx and dqkv hold
    // packed_tokens rows, sequence b being the len[b] rows after those of sequences 0..b−1, with
    // the mask KEY_LENGTHS len (so keys past a sequence are masked). rows[r] (int32, backend memory;
    // may be nullptr in scratch_bytes queries) is packed row r's padded place b·S + i. Indices stay
    // those of the padded [B, S] layout (lse, dropout elements); only the packed rows are computed
    // and written.
    const int32_t *rows = nullptr;
    int64_t packed_tokens = 0;
    int64_t tokens() const { return packed_tokens > 0 ? packed_tokens : batch * seq; }
};

// The fused linear + softmax cross-entropy of the MLM decoder and the NSP classifier
// (dst_linear_cross_entropy). Row i of the m selected rows is h_i = x[rows ? rows[i] : i] (x has n
// rows of length h); z_i = h_i·Wᵀ + b over v classes in the compute type (never rounded to storage);
// ℓ_i = logsumexp(z_i) − z_i[labels[i]] for labels[i] ≥ 0 (label −1: ignored); loss = Σℓ_i / count
// (0 when count = 0), written to `loss` (stat dtype); counts[0] = count, counts[1] = #valid rows
// whose first largest logit is the label (counts may be nullptr). With gradients:
// g_i = grad_scale·(softmax(z_i) − onehot)/count rounded to storage (0 for ignored rows);
// dx[rows[i]] = g_i·W with every other row of dx zero (dx is written); dw (+)= gᵀ·h; db (+)= Σ_i g_i.
struct CrossEntropyParams {
    const void *x = nullptr;
    const int32_t *rows = nullptr;  // distinct, in [0, n); nullptr: x is the m rows
    const void *w = nullptr;
    const void *b = nullptr;        // nullptr: no bias
    const int32_t *labels = nullptr;
    double grad_scale = 1.0;
    void *loss = nullptr;           // [1], stat dtype
    int32_t *counts = nullptr;      // [2] or nullptr
    void *dx = nullptr, *dw = nullptr, *db = nullptr;  // each may be nullptr
    int64_t n = 0, m = 0, v = 0, h = 0;
    bool accumulate = false;        // dw, db
};

// What the ops of one call need as device scratch (Backend::scratch_bytes). Every op uses the
// scratch from its start and ops run one after another, so the need is the largest single op's.
struct ScratchNeeds {
    dst_dtype dt = DST_DTYPE_FP32;
    bool gemm = false;           // linear ops (the GEMM library's workspace)
    int64_t rows = 0;            // token rows of the LayerNorms and bias gradients
    int64_t ln_width = 0;        // LayerNorm backward row length (0: none)
    int64_t colsum_width = 0;    // widest bias gradient (0: none)
    int64_t dgelu_width = 0;     // FC2's data gradient with GELU' (linear_bwd_data_gelu): its k (0: none)
    bool attention = false;      // attention fwd/bwd of shape `attn` (its mask kind and dtype count)
    AttentionParams attn;
    bool stochastic = false;     // attention backward in stochastic mode
    // Model ops (dst_embedding_backward, dst_scatter_rows, dst_linear_cross_entropy, …).
    bool index_check = false;    // check_indices (its result words)
    int64_t index_range = 0;     // … with a distinctness check over [0, index_range)
    int64_t emb_tokens = 0;      // embedding_bwd over emb_tokens tokens, emb_vocab word rows,
    int64_t emb_vocab = 0, emb_types = 0, emb_width = 0;  // emb_types type rows of emb_width
    bool cross_entropy = false;  // linear_cross_entropy of shape ce (its rows/dx/grads count)
    CrossEntropyParams ce;
};

// Scratch bytes the CUDA backend needs for `n` (0 in a build without CUDA): what
// dst_layer_config_workspace_bytes adds to a layer's own workspace.
size_t cuda_scratch_bytes(const ScratchNeeds &n);

enum class CopyKind { HostToDevice, DeviceToHost, DeviceToDevice };

class Backend {
public:
    virtual ~Backend() = default;
    virtual dst_backend kind() const = 0;

    // ---- memory -------------------------------------------------------------------------------
    // alloc returns DST_ERR_OUT_OF_MEMORY with a message when it fails; bytes == 0 gives nullptr.
    virtual dst_status alloc(size_t bytes, void **ptr) = 0;
    virtual void free(void *ptr) = 0;
    virtual dst_status zero(void *ptr, size_t bytes) = 0;
    virtual dst_status copy(void *dst, const void *src, size_t bytes, CopyKind kind) = 0;
    virtual dst_status synchronize() = 0;
    virtual void set_num_threads(int threads) = 0;  // host threads (CPU backend); 0 = default
    virtual int num_threads() const = 0;
    // Per-call modes, set by the layer before each forward/backward from its config.
    virtual void set_stochastic(bool on) { (void)on; }
    virtual void set_allow_tf32(bool on) { (void)on; }
    // The stream all work is queued on (CUDA: a cudaStream_t; NULL restores the backend's own).
    // The CPU backend has no streams and accepts only NULL.
    virtual dst_status set_stream(void *stream);
    virtual void *stream() const { return nullptr; }
    // Whether the stream is capturing a CUDA graph (false on backends without streams).
    virtual bool capturing() const { return false; }

    // ---- checks that do not wait for the device ---------------------------------------------------
    // Values in the backend's memory checked without the host waiting for them: lo <= v[i] <= hi
    // (check_range_deferred) or x[i] != 0 (check_nonzero_deferred, floating dtypes). `what` names the
    // call and the argument ("dst_layer_forward: key-length mask"); `detail` ends the message (may be
    // empty). This default, the CPU backend's, checks at once and returns the failure. The CUDA backend
    // queues a kernel and returns DST_OK; the failure is then returned, once, by take_deferred_error()
    // of a later call, the first one that starts after the device has run the check.
    virtual dst_status check_range_deferred(const int32_t *v, int64_t count, int32_t lo, int32_t hi,
                                            const char *what, const char *detail);
    virtual dst_status check_nonzero_deferred(dst_dtype dt, const void *x, int64_t count, const char *what,
                                              const char *detail);
    // DST_OK, or the failure of a deferred check that the device has finished (message from `fn`).
    virtual dst_status take_deferred_error(const char *fn) {
        (void)fn;
        return DST_OK;
    }
    // Device scratch the ops described by `n` need (0: none; the CPU backend needs none).
    virtual size_t scratch_bytes(const ScratchNeeds &n) const {
        (void)n;
        return 0;
    }
    // The ops that follow take their scratch from [ptr, ptr + bytes), which the caller keeps alive
    // and untouched by other work until they have run (stream order suffices); an op needing more
    // fails with DST_ERR_CAPACITY. nullptr: the backend's own scratch, grown on demand (tests).
    virtual void set_scratch(void *ptr, size_t bytes) {
        (void)ptr;
        (void)bytes;
    }

    // ---- GEMMs (nn.Linear convention, W is [m, k]) ---------------------------------------------
    // y[n,m] = x[n,k]·W[m,k]ᵀ + b[m]; with gelu != nullptr also u = that value is written to
    // pre_act (when pre_act != nullptr) and y = GELU(u) in the given form.
    virtual dst_status linear_fwd(dst_dtype dt, const void *x, const void *w, const void *b, void *y,
                                  int64_t n, int64_t k, int64_t m, const dst_gelu *gelu,
                                  void *pre_act) = 0;
    // y[n,m] = x[n,k]·W[m,k]ᵀ + b[m] + add[n,m] (add may not overlap y): the Pre-LN FFN output and its
    // residual when no dropout lies between them (inference, or a dropout ratio of 0). Backends round
    // once (the CPU backend, and CUDA's cuBLASLt epilogue with add as the C operand where the bias is
    // 16-byte aligned); this default runs linear_fwd into y, then adds add (two roundings).
    virtual dst_status linear_fwd_add(dst_dtype dt, const void *x, const void *w, const void *b, const void *add,
                                      void *y, int64_t n, int64_t k, int64_t m);
    // dx[n,k] = dy[n,m]·W[m,k] + add[n,k], one rounding (add nullptr: nothing added; add == dx
    // accumulates; otherwise add may not overlap dx). The residual branches of the layer's backward
    // pass their other gradient as `add` instead of copying it into dx first.
    virtual dst_status linear_bwd_data(dst_dtype dt, const void *dy, const void *w, void *dx, int64_t n,
                                       int64_t k, int64_t m, const void *add) = 0;
    // dW[m,k] = dy[n,m]ᵀ·x[n,k], db[m] = Σ_n dy[n,m]  (accumulate: +=)
    virtual dst_status linear_bwd_weight(dst_dtype dt, const void *dy, const void *x, void *dw, void *db,
                                         int64_t n, int64_t k, int64_t m, bool accumulate) = 0;

    // ---- LayerNorm over rows of length h --------------------------------------------------------
    // mean = Σx/h, var = Σ(x−mean)²/h, rstd = 1/sqrt(var + eps) (stats), y = γ·(x−mean)·rstd + β.
    virtual dst_status layernorm_fwd(dst_dtype dt, const void *x, const void *gamma, const void *beta,
                                     void *y, void *mean, void *rstd, int64_t n, int64_t h,
                                     double eps) = 0;
    // From the input (invertible == false: `xy` is x, x̂ = (x−mean)·rstd) or from the output
    // (invertible == true: `xy` is y, x̂ = (y−β)/γ, mean unused). g = γ·dy;
    // dx = rstd·(g − mean(g) − x̂·mean(g·x̂)) + dresid (dresid may be nullptr);
    // dγ = Σ_rows dy·x̂, dβ = Σ_rows dy (accumulate: +=).
    virtual dst_status layernorm_bwd(dst_dtype dt, const void *dy, const void *xy, bool invertible,
                                     const void *gamma, const void *beta, const void *mean,
                                     const void *rstd, const void *dresid, void *dx, void *dgamma,
                                     void *dbeta, int64_t n, int64_t h, bool accumulate) = 0;
    // layernorm_bwd, and the gradient of the dropout whose output fed the normalised sum: branch =
    // dropout'(dx) with `site` (element c of row r is r·h + c, or rows[r]·h + c with a row map of
    // row length h), from dx before its rounding, so the gradient stays in the compute type between
    // the two (one rounding each). branch may not overlap the inputs.
    virtual dst_status layernorm_dropout_bwd(dst_dtype dt, const void *dy, const void *xy, bool invertible,
                                             const void *gamma, const void *beta, const void *mean,
                                             const void *rstd, const void *dresid, void *dx, void *dgamma,
                                             void *dbeta, int64_t n, int64_t h, bool accumulate,
                                             const DropoutSite &site, void *branch) = 0;
    // layernorm_dropout_bwd, then branch_db[c] = Σ_r branch[r, c] over the branch as stored (accumulate:
    // +=): the bias gradient of the linear layer whose output the dropout took, which this default takes
    // from linear_bwd_weight and a backend may compute in the same pass (the same results: CUDA's
    // one-pass LayerNorm backward, its default, CudaBackend::set_layernorm_one_pass).
    virtual dst_status layernorm_dropout_bwd_bias_grad(dst_dtype dt, const void *dy, const void *xy, bool invertible,
                                                       const void *gamma, const void *beta, const void *mean,
                                                       const void *rstd, const void *dresid, void *dx, void *dgamma,
                                                       void *dbeta, int64_t n, int64_t h, bool accumulate,
                                                       const DropoutSite &site, void *branch, void *branch_db);
    // z = residual + dropout(a) over n rows of h (stored), then y = LayerNorm(z as stored) with its
    // statistics: the results of dropout_residual_fwd followed by layernorm_fwd, which this default
    // runs and a backend may compute in one pass. A row map of the site has row length h.
    virtual dst_status dropout_residual_layernorm_fwd(dst_dtype dt, const void *a, const void *residual, void *z,
                                                      const void *gamma, const void *beta, void *y, void *mean,
                                                      void *rstd, int64_t n, int64_t h, double eps,
                                                      const DropoutSite &site);
    // Sets *all_nonzero to whether every element of x[count] is non-zero (γ check for invertible LN).
    virtual dst_status all_nonzero(dst_dtype dt, const void *x, int64_t count, bool *all_nonzero) = 0;

    // ---- elementwise ------------------------------------------------------------------------------
    // g = GELU(u) over count elements.
    virtual dst_status gelu_fwd(dst_dtype dt, dst_gelu form, const void *u, void *g, int64_t count) = 0;
    // du = dg · GELU'(u).
    virtual dst_status gelu_bwd(dst_dtype dt, dst_gelu form, const void *dg, const void *u, void *du,
                                int64_t count) = 0;
    // gelu_bwd over [n, m], then db[j] = Σ_i du[i, j] over du as stored (accumulate: db +=): the bias
    // gradient of the GEMM whose output was u, which this default takes from linear_bwd_weight and a
    // backend may compute in the same pass (same results). du may alias dg.
    virtual dst_status gelu_bwd_bias_grad(dst_dtype dt, dst_gelu form, const void *dg, const void *u, void *du,
                                          int64_t n, int64_t m, void *db, bool accumulate);
    // The FC2 data gradient and GELU's backward: dg = dy[n,m]·W[m,k] (rounded to the storage type, as
    // linear_bwd_data stores it), du[n,k] = dg·GELU'(u[n,k]) and db[j] = Σ_i du[i, j] (accumulate: +=;
    // db may be nullptr). This default runs linear_bwd_data into `dg`, then gelu_bwd_bias_grad; a backend
    // may do it in one GEMM with the GELU' in its epilogue and leave `dg` unwritten. dg may alias du;
    // neither may overlap dy, w or u.
    virtual dst_status linear_bwd_data_gelu(dst_dtype dt, dst_gelu form, const void *dy, const void *w,
                                            const void *u, void *dg, void *du, int64_t n, int64_t k, int64_t m,
                                            void *db, bool accumulate);
    // The graph dropout counter (uint32, backend memory): *slot = *counter, then *counter = *slot + 1
    // (wrapping), queued like the other ops, so that a call captured into a CUDA graph takes a new
    // word at every replay (kernels/philox.h).
    virtual dst_status rng_take(uint32_t *counter, uint32_t *slot) = 0;
    // y = residual + dropout(a) over count elements (element index = position in the buffer).
    virtual dst_status dropout_residual_fwd(dst_dtype dt, const void *a, const void *residual, void *y,
                                            int64_t count, const DropoutSite &site) = 0;
    // dx = dropout'(dy) = dy·keep·scale (identity when the site is inactive).
    virtual dst_status dropout_bwd(dst_dtype dt, const void *dy, void *dx, int64_t count,
                                   const DropoutSite &site) = 0;
    // dropout_bwd over [n, m], then db[j] = Σ_i dx[i, j] over dx as stored (accumulate: db +=): the bias
    // gradient of the linear layer whose output the dropout took, which this default takes from
    // linear_bwd_weight and a backend may compute in the same pass (the same results). dx may alias dy.
    virtual dst_status dropout_bwd_bias_grad(dst_dtype dt, const void *dy, void *dx, int64_t n, int64_t m,
                                             const DropoutSite &site, void *db, bool accumulate);
    // y = a + b over count elements.
    virtual dst_status add(dst_dtype dt, const void *a, const void *b, void *y, int64_t count) = 0;

    // ---- attention (one fused op, nothing S×S in memory) ---------------------------------------------
    // Writes ctx. When lse != nullptr also writes the row log-sum-exp of the scores, [B, heads, S]
    // (stat), −inf for fully masked rows.
    virtual dst_status attention_fwd(dst_dtype dt, const AttentionParams &p, const void *qkv, void *ctx,
                                     void *lse) = 0;
    // Given dctx [B,S,H], writes dqkv [B,S,3H], recomputing P from qkv, the mask and the forward's
    // lse. ctx is the forward output (for Σ_j P̃·dP̃ = dctx·ctx).
    virtual dst_status attention_bwd(dst_dtype dt, const AttentionParams &p, const void *qkv,
                                     const void *ctx, const void *dctx, const void *lse, void *dqkv) = 0;

    // ---- training (optimizer steps, loss scaling) ------------------------------------------------
    // One optimizer step over the tensor table of `a`: the passes of kernels/optim_args.h (norm,
    // finalize, LAMB moments and ratios, update), reading and writing the device state a.state. It
    // never waits for the device: on CUDA it only enqueues kernels, so the step, the decision to skip
    // it and the loss scaler stay on the device. Math: kernels/optim_math.h.
    virtual dst_status optim_step(const optim::StepArgs &a) = 0;
    // x[i] ← x[i]·f with f = (*factor)·mult rounded to fp32, over count elements of dtype dt (any
    // floating dtype); `factor` is one float in the backend's memory (the device loss scale).
    virtual dst_status scale_by(dst_dtype dt, void *x, int64_t count, const float *factor, float mult) = 0;
    // dst[i] = src[i] between floating dtypes (round to nearest even when narrowing); no overlap.
    virtual dst_status convert(dst_dtype src_dt, const void *src, dst_dtype dst_dt, void *dst, int64_t count) = 0;

    // ---- model ops of BERT pre-training (around the layers) ---------------------------------------
    // Index check of an int32 vector in the backend's memory: *first_bad = the smallest i with
    // idx[i] ∉ [lo, hi), or −1; when `distinct`, *first_repeat = the smallest i whose value occurs
    // more than once, or −1 (first_repeat may be nullptr otherwise). Read on the host: the CUDA
    // backend waits for the answer.
    virtual dst_status check_indices(const int32_t *idx, int64_t count, int32_t lo, int32_t hi, bool distinct,
                                     int64_t *first_bad, int64_t *first_repeat) = 0;
    // The model ops' index check with its message: check_indices now, and a failure returned as
    // DST_ERR_INVALID_ARGUMENT "<what>[i] is v, expected a value in [lo, hi)" (or "... occurs more than
    // once"). `what` names the call and the tensor ("dst_gather_rows: index").
    dst_status check_index_values(const int32_t *idx, int64_t count, int32_t lo, int32_t hi, bool distinct,
                                  const char *what);
    // The same check without waiting for the device (dst_context_set_index_checks): this default, the
    // CPU backend's, is check_index_values; the CUDA backend queues the check and a failure is
    // returned by take_deferred_error() of a later call. Kernels that take indices stay within their
    // tensors for any index values, so the queued op is safe to run whatever the check finds.
    virtual dst_status check_indices_deferred(const int32_t *idx, int64_t count, int32_t lo, int32_t hi,
                                              bool distinct, const char *what) {
        return check_index_values(idx, count, lo, hi, distinct, what);
    }
    // out[b,s,:] = word[ids[b,s]] + pos[s] + type[types[b,s]] (types nullptr: type row 0), one rounding;
    // V and T are the rows of word and type (an id or type outside them contributes a zero row).
    virtual dst_status embedding_fwd(dst_dtype dt, const int32_t *ids, const int32_t *types, const void *word,
                                     const void *pos, const void *type, void *out, int64_t B, int64_t S, int64_t H,
                                     int64_t V, int64_t T) = 0;
    // dword[v] = Σ_{t: ids[t]=v} dout[t], dpos[s] = Σ_b dout[b,s], dtype[k] = Σ_{t: types[t]=k} dout[t],
    // each in token order in the compute type, rounded once (accumulate: old + sum on used rows;
    // write: every row, unused rows 0). Any of the three outputs may be nullptr.
    virtual dst_status embedding_bwd(dst_dtype dt, const void *dout, const int32_t *ids, const int32_t *types,
                                     void *dword, void *dpos, void *dtype, int64_t B, int64_t S, int64_t H,
                                     int64_t V, int64_t P, int64_t T, bool accumulate) = 0;
    // dst[i,:] = src[idx[i],:] for i < m, src [n, h] (an index outside it gives a zero row).
    virtual dst_status gather_rows(dst_dtype dt, const void *src, const int32_t *idx, void *dst, int64_t n,
                                   int64_t m, int64_t h) = 0;
    // dst[idx[i],:] (+)= src[i,:] for i < m, idx distinct; write: the other rows of dst [n, h] become 0
    // (an index outside [0, n) is skipped).
    virtual dst_status scatter_rows(dst_dtype dt, const void *src, const int32_t *idx, void *dst, int64_t n,
                                    int64_t m, int64_t h, bool accumulate) = 0;
    // Packed sequences: from offsets cu[0..B] (sequence b is rows cu[b] .. cu[b+1]-1 of N), idx[r] =
    // b·S + (r − cu[b]) (row r's place in the padded [B, S] layout) for r < N, and lens[b] = cu[b+1] −
    // cu[b]. The offsets must run 0 = cu[0] < … < cu[B] = N with every length in 1..S: the CPU backend
    // checks that now; the CUDA backend on the device, reported as a deferred check (`what` names the
    // call), with idx and lens clamped into range so that nothing reads or writes out of bounds.
    virtual dst_status packed_index(const int32_t *cu, int64_t B, int64_t S, int64_t N, int32_t *idx, int32_t *lens,
                                    const char *what) = 0;
    // y = tanh(u); du = dy·(1 − tanh(u)²) (outputs may alias inputs).
    virtual dst_status tanh_fwd(dst_dtype dt, const void *u, void *y, int64_t count) = 0;
    virtual dst_status tanh_bwd(dst_dtype dt, const void *dy, const void *u, void *du, int64_t count) = 0;
    // See CrossEntropyParams.
    virtual dst_status linear_cross_entropy(dst_dtype dt, const CrossEntropyParams &p) = 0;
};

// Backend factories. They return DST_ERR_UNSUPPORTED with a message where the backend is missing.
dst_status make_cpu_backend(Backend **out);
// Number of usable CUDA devices; 0 in a build without CUDA or on a machine without a GPU.
dst_status cuda_device_count(int *count);

}  // namespace dst

#endif  // DST_BACKEND_BACKEND_H
