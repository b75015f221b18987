// The CUDA backend: fills the Backend op table with the kernels of kernels/*.cu and cuBLASLt
// GEMMs. One backend object owns, for one device: a stream (its own non-blocking stream, or one the
// caller substitutes), a cuBLASLt handle and a workspace (grown on demand, or caller-owned).
// Every op is enqueued on the stream and returns without waiting, except copies to or from host
// memory (memcpy semantics, also for pinned buffers), all_nonzero and check_indices, which synchronize
// the stream. Checks of values in device memory that forward and backward need (key lengths, LayerNorm
// γ) are deferred: a kernel records a failure in mapped host memory and a later call reports it.
// Internal header; the C API creates the backend through make_cuda_backend() and exposes the extra
// methods below.
#ifndef DST_BACKEND_CUDA_CUDA_BACKEND_H
#define DST_BACKEND_CUDA_CUDA_BACKEND_H

#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "backend/backend.h"

namespace dst {

namespace cuda {
struct AttentionArgs;   // kernels/attention_args.h
struct DeferredCheck;   // kernels/checks.cuh
}  // namespace cuda
struct LtMatmul;        // backend/cuda/cublaslt_util.h

// The cuBLASLt workspace every GEMM is offered (cuBLAS's recommendation for Hopper).
constexpr size_t kGemmWorkspace = size_t(32) << 20;

class CudaBackend final : public Backend {
public:
    // Use make_cuda_backend().
    static dst_status create(int device, CudaBackend **out);
    ~CudaBackend() override;
    CudaBackend(const CudaBackend &) = delete;
    CudaBackend &operator=(const CudaBackend &) = delete;

    dst_backend kind() const override { return DST_BACKEND_CUDA; }

    dst_status alloc(size_t bytes, void **ptr) override;
    void free(void *ptr) override;
    dst_status zero(void *ptr, size_t bytes) override;
    dst_status copy(void *dst, const void *src, size_t bytes, CopyKind kind) override;
    dst_status synchronize() override;
    void set_num_threads(int threads) override { threads_ = threads > 0 ? threads : 0; }
    int num_threads() const override;  // host threads of the library's own host loops (initial weights)
    dst_status check_range_deferred(const int32_t *v, int64_t count, int32_t lo, int32_t hi, const char *what,
                                    const char *detail) override;
    dst_status check_nonzero_deferred(dst_dtype dt, const void *x, int64_t count, const char *what,
                                      const char *detail) override;
    dst_status check_indices_deferred(const int32_t *idx, int64_t count, int32_t lo, int32_t hi, bool distinct,
                                      const char *what) override;
    dst_status take_deferred_error(const char *fn) override;
    bool capturing() const override;

    dst_status linear_fwd(dst_dtype dt, const void *x, const void *w, const void *b, void *y, int64_t n,
                          int64_t k, int64_t m, const dst_gelu *gelu, void *pre_act) override;
    dst_status linear_fwd_add(dst_dtype dt, const void *x, const void *w, const void *b, const void *add, void *y,
                              int64_t n, int64_t k, int64_t m) override;
    dst_status linear_bwd_data(dst_dtype dt, const void *dy, const void *w, void *dx, int64_t n,
                               int64_t k, int64_t m, const void *add) override;
    dst_status linear_bwd_weight(dst_dtype dt, const void *dy, const void *x, void *dw, void *db,
                                 int64_t n, int64_t k, int64_t m, bool accumulate) override;

    dst_status layernorm_fwd(dst_dtype dt, const void *x, const void *gamma, const void *beta, void *y,
                             void *mean, void *rstd, int64_t n, int64_t h, double eps) override;
    dst_status layernorm_bwd(dst_dtype dt, const void *dy, const void *xy, bool invertible,
                             const void *gamma, const void *beta, const void *mean, const void *rstd,
                             const void *dresid, void *dx, void *dgamma, void *dbeta, int64_t n,
                             int64_t h, bool accumulate) override;
    dst_status layernorm_dropout_bwd(dst_dtype dt, const void *dy, const void *xy, bool invertible,
                                     const void *gamma, const void *beta, const void *mean, const void *rstd,
                                     const void *dresid, void *dx, void *dgamma, void *dbeta, int64_t n,
                                     int64_t h, bool accumulate, const DropoutSite &site, void *branch) override;
    dst_status layernorm_dropout_bwd_bias_grad(dst_dtype dt, const void *dy, const void *xy, bool invertible,
                                               const void *gamma, const void *beta, const void *mean,
                                               const void *rstd, const void *dresid, void *dx, void *dgamma,
                                               void *dbeta, int64_t n, int64_t h, bool accumulate,
                                               const DropoutSite &site, void *branch, void *branch_db) override;
    dst_status dropout_residual_layernorm_fwd(dst_dtype dt, const void *a, const void *residual, void *z,
                                              const void *gamma, const void *beta, void *y, void *mean, void *rstd,
                                              int64_t n, int64_t h, double eps, const DropoutSite &site) override;
    dst_status all_nonzero(dst_dtype dt, const void *x, int64_t count, bool *all_nonzero) override;

    dst_status gelu_fwd(dst_dtype dt, dst_gelu form, const void *u, void *g, int64_t count) override;
    dst_status gelu_bwd(dst_dtype dt, dst_gelu form, const void *dg, const void *u, void *du,
                        int64_t count) override;
    dst_status gelu_bwd_bias_grad(dst_dtype dt, dst_gelu form, const void *dg, const void *u, void *du, int64_t n,
                                  int64_t m, void *db, bool accumulate) override;
    dst_status linear_bwd_data_gelu(dst_dtype dt, dst_gelu form, const void *dy, const void *w, const void *u,
                                    void *dg, void *du, int64_t n, int64_t k, int64_t m, void *db,
                                    bool accumulate) override;
    dst_status dropout_residual_fwd(dst_dtype dt, const void *a, const void *residual, void *y,
                                    int64_t count, const DropoutSite &site) override;
    dst_status rng_take(uint32_t *counter, uint32_t *slot) override;
    dst_status dropout_bwd(dst_dtype dt, const void *dy, void *dx, int64_t count,
                           const DropoutSite &site) override;
    dst_status dropout_bwd_bias_grad(dst_dtype dt, const void *dy, void *dx, int64_t n, int64_t m,
                                     const DropoutSite &site, void *db, bool accumulate) override;
    dst_status add(dst_dtype dt, const void *a, const void *b, void *y, int64_t count) override;

    dst_status attention_fwd(dst_dtype dt, const AttentionParams &p, const void *qkv, void *ctx,
                             void *lse) override;
    dst_status attention_bwd(dst_dtype dt, const AttentionParams &p, const void *qkv, const void *ctx,
                             const void *dctx, const void *lse, void *dqkv) override;
    dst_status optim_step(const optim::StepArgs &a) override;
    dst_status scale_by(dst_dtype dt, void *x, int64_t count, const float *factor, float mult) override;
    dst_status convert(dst_dtype src_dt, const void *src, dst_dtype dst_dt, void *dst, int64_t count) override;

    dst_status check_indices(const int32_t *idx, int64_t count, int32_t lo, int32_t hi, bool distinct,
                             int64_t *first_bad, int64_t *first_repeat) override;
    dst_status embedding_fwd(dst_dtype dt, const int32_t *ids, const int32_t *types, const void *word,
                             const void *pos, const void *type, void *out, int64_t B, int64_t S, int64_t H,
                             int64_t V, int64_t T) override;
    dst_status embedding_bwd(dst_dtype dt, const void *dout, const int32_t *ids, const int32_t *types,
                             void *dword, void *dpos, void *dtype, int64_t B, int64_t S, int64_t H, int64_t V,
                             int64_t P, int64_t T, bool accumulate) override;
    dst_status packed_index(const int32_t *cu, int64_t B, int64_t S, int64_t N, int32_t *idx, int32_t *lens,
                            const char *what) override;
    dst_status gather_rows(dst_dtype dt, const void *src, const int32_t *idx, void *dst, int64_t n, int64_t m,
                           int64_t h) override;
    dst_status scatter_rows(dst_dtype dt, const void *src, const int32_t *idx, void *dst, int64_t n, int64_t m,
                            int64_t h, bool accumulate) override;
    dst_status tanh_fwd(dst_dtype dt, const void *u, void *y, int64_t count) override;
    dst_status tanh_bwd(dst_dtype dt, const void *dy, const void *u, void *du, int64_t count) override;
    dst_status linear_cross_entropy(dst_dtype dt, const CrossEntropyParams &p) override;
    // Scratch bytes of linear_cross_entropy (model_ops.cpp): the GEMM and column-sum region first,
    // then the selected rows, the [m, v] logits, the storage-type gradient, dh and the row results.
    static size_t cross_entropy_scratch(dst_dtype dt, const CrossEntropyParams &p, size_t gemm_region);
    size_t scratch_bytes(const ScratchNeeds &n) const override { return cuda_scratch_bytes(n); }
    void set_scratch(void *ptr, size_t bytes) override;

    // ---- CUDA-specific (the C API exposes these) ----------------------------------------------
    int device() const { return device_; }
    // The stream every op is enqueued on (a cudaStream_t).
    void *stream() const override { return stream_; }
    // Runs every later op on `cuda_stream` (a cudaStream_t the caller owns and keeps alive while
    // it is set); nullptr restores the backend's own stream. Waits for the work already queued on
    // the current stream first, so the workspace is never shared by two streams at once.
    dst_status set_stream(void *cuda_stream) override;
    // Bytes of the workspace in use now (owned or caller-owned).
    size_t workspace_bytes() const { return user_ws_ ? user_ws_bytes_ : own_ws_bytes_; }
    // Uses caller-owned device memory [ptr, ptr + bytes) as workspace (the caller keeps it alive and
    // untouched while set; ops needing more fail with DST_ERR_CAPACITY naming the size);
    // ptr == nullptr returns to the backend's own workspace, grown on demand. Frees the owned one.
    dst_status set_workspace(void *ptr, size_t bytes);
    // Lets fp32 GEMMs use TF32 tensor cores (default off: fp32 results then match the CPU to 1e-5).
    void set_allow_tf32(bool on) override { allow_tf32_ = on; }
    bool allow_tf32() const { return allow_tf32_; }
    // Stochastic mode: the attention backward adds its partial dQs in arrival order (not
    // bit-reproducible); off: in a fixed order, bit-identical from run to run.
    void set_stochastic(bool on) override { stochastic_ = on; }
    // The fused GELU GEMMs (kernels/gemm_gelu.cuh): linear_fwd with GELU and a pre-activation output,
    // and linear_bwd_data_gelu, as one CUTLASS kernel each where gemm_gelu_runs() takes the call (FP16
    // and BF16 on compute capability 9.0, in a build that found CUTLASS). On by default (faster than the
    // GEMM and the separate GELU pass on the H200: bench/RESULTS.md); DST_FUSED_GEMM=0 in the environment
    // turns them off for a backend created after it is set.
    // fused_gemm_built(): whether this build has them at all.
    // fused_gemm_calls(): how many calls they ran (for tests and benchmarks).
    void set_fused_gemm(bool on) { fused_gemm_ = on; }
    // Where the fused FC2 data gradient (linear_bwd_data_gelu) takes its bias gradient from: on (the
    // default), the kernel's epilogue sums each 128-row tile's columns and a small kernel adds the tiles
    // in order; off (DST_DGELU_TILE_SUMS=0 in the environment), column_sum's two passes over the stored
    // du, which give the unfused path's bits. Both are bit-reproducible; they sum in different orders.
    void set_dgelu_tile_sums(bool on) { dgelu_tile_sums_ = on; }
    // The LayerNorm backward in one pass (kernels/layernorm.cuh, layernorm_bwd's one_pass_split): 4 (the
    // default) or 2 warps per row where the one-pass form applies, 0 for the separate dx, γ/β and bias
    // passes. DST_LN_ONE_PASS=0, 2 or 4 in the environment sets it for a backend created after it is
    // set. The same γ/β and bias bits either way; 4 is ~1 % faster per layer step than the passes
    // (bench/RESULTS.md, 2026-12-05, H100).
    // layernorm_one_pass_calls(): how many calls took it (for tests and benchmarks).
    void set_layernorm_one_pass(int split) { ln_split_ = split == 2 || split == 4 ? split : 0; }
    int layernorm_one_pass() const { return ln_split_; }
    int64_t layernorm_one_pass_calls() const { return ln_one_pass_calls_; }
    bool fused_gemm() const { return fused_gemm_; }
    static bool fused_gemm_built();
    int64_t fused_gemm_calls() const { return fused_gemm_calls_; }
    // GEMM size classes whose candidate algorithms were timed (tune_class), and how many of them chose
    // another than the heuristic's first (for tests and benchmarks).
    int gemm_classes_timed() const { return classes_timed_; }
    int gemm_classes_changed() const { return classes_changed_; }

private:
    CudaBackend() = default;
    dst_status activate() const;  // device_ made current (cudaSetDevice when it is not)
    // A pointer to at least `bytes` of workspace (nullptr for 0 bytes); grows the owned one.
    dst_status workspace(size_t bytes, void **ptr);
    // One column-major cuBLASLt GEMM, strided-batched when batch > 1, k < batch:
    //   D_k = alpha·op(A_k)·op(B_k) (+ C_k when accumulate, C = D unless set) (+ bias[M] by the BIAS
    //   epilogue).
    // A, B and bias in the storage dtype; D in it, or in fp32 when d_fp32. Accumulation in fp32
    // (TF32 only when allowed), fp64 for FP64. The heuristic's choice is cached per problem.
    struct Gemm {
        cublasOperation_t ta, tb;
        int64_t M, N, K;
        const void *A;
        int64_t lda, sa;
        const void *B;
        int64_t ldb, sb;
        void *D;
        int64_t ldd, sd;
        int64_t batch = 1;
        float alpha = 1.0f;
        bool d_fp32 = false;
        bool accumulate = false;
        const void *bias = nullptr;
        const void *C = nullptr;  // with accumulate: the term added (same layout as D); nullptr: D itself
    };
    dst_status gemm(dst_dtype dt, const Gemm &g);
    // ---- attention (attention.cpp) ----
    // The kernels' description of a call; key_bias is set by set_key_bias.
    static cuda::AttentionArgs attention_args(const AttentionParams &p, bool deterministic);
    // Sets a->key_bias: the additive mask itself, or converted into `scratch` (key_bias_bytes).
    dst_status set_key_bias(dst_dtype dt, const AttentionParams &p, void *scratch, cuda::AttentionArgs *a);
    // Packed calls on the flash kernels: a->seq_start and a->key_len from p's key lengths, in ws.
    dst_status packed_spans(const AttentionParams &p, char *ws, size_t start, size_t rows, cuda::AttentionArgs *a);
public:
    // Scratch bytes of attention_bwd (the larger of the two attention ops) for this call.
    static size_t attention_scratch(dst_dtype dt, const AttentionParams &p, bool stochastic);
private:
    size_t gemm_workspace_bytes() const;

    int device_ = 0;
    int sm_count_ = 0;  // the device's multiprocessors
    int threads_ = 0;
    bool allow_tf32_ = false;
    bool fused_gemm_ = false;
    bool dgelu_tile_sums_ = true;
    int ln_split_ = 4;  // set_layernorm_one_pass
    int64_t ln_one_pass_calls_ = 0;
    int64_t fused_gemm_calls_ = 0;
    cudaStream_t own_stream_ = nullptr;
    cudaStream_t stream_ = nullptr;
    cublasLtHandle_t lt_ = nullptr;
    void *own_ws_ = nullptr;
    size_t own_ws_bytes_ = 0;
    void *user_ws_ = nullptr;
    size_t user_ws_bytes_ = 0;
    int *flag_ = nullptr;  // device int for all_nonzero
    // The deferred checks' failure slot (pinned host memory, mapped: check_dev_ is its device address)
    // and the descriptions of the last kDeferredKept checks, by id.
    static constexpr uint32_t kDeferredKept = 1024;
    enum class CheckKind { Nonzero, Range, Offsets, Repeat };
    struct DeferredWhat {
        uint32_t id = 0;
        CheckKind kind = CheckKind::Nonzero;
        int32_t lo = 0, hi = 0;
        std::string what, detail;
    };
    cuda::DeferredCheck *check_host_ = nullptr;
    cuda::DeferredCheck *check_dev_ = nullptr;
    std::array<DeferredWhat, kDeferredKept> checks_;
    uint32_t next_check_ = 1;
    dst_status note_check(CheckKind kind, int32_t lo, int32_t hi, const char *what, const char *detail, uint32_t *id);
    bool stochastic_ = false;
    // cuBLASLt algorithms of the GEMMs, by problem (same problem: same algorithm: lt_problems_, emptied
    // when it reaches kLtAlgosKept problems), and the choice per size class (choose_algo; the list keeps
    // its newest kLtAlgosKept classes, so a problem dropped from lt_problems_ finds its class again).
    static constexpr int kLtKey = 21;  // the problem's description (gemm)
    // A class's tuning candidates: the heuristic's first algorithm and the others it offers of the same
    // kernel family (same algorithm id, no split-K), which compute every output element in the same
    // order and so give the same bits (tune_class times them and checks that).
    static constexpr int kTuneCandidates = 8;
    struct LtAlgoEntry {
        int64_t key[kLtKey];
        cublasLtMatmulAlgo_t algo;
        size_t ws;
        int candidates = 0;  // class entries: how many of cand[] are still to be timed (0: settled)
        cublasLtMatmulAlgo_t cand[kTuneCandidates];
    };
    static constexpr size_t kLtAlgosKept = 1024;
    std::vector<LtAlgoEntry> lt_classes_;
    // A problem seen before: its descriptors (the matmul with its epilogue, the three layouts), kept so
    // that a repeated GEMM makes no descriptor calls but the bias pointer's, and its algorithm.
    struct LtKeyHash {
        size_t operator()(const std::array<int64_t, kLtKey> &k) const;
    };
    struct LtProblem {
        std::unique_ptr<LtMatmul> mm;
        cublasLtMatmulAlgo_t algo;
        size_t ws = 0;
    };
    std::unordered_map<std::array<int64_t, kLtKey>, LtProblem, LtKeyHash> lt_problems_;
    bool gemm_tuning_ = true;  // DST_GEMM_TUNE=0 turns the timing of candidates off
    int classes_timed_ = 0, classes_changed_ = 0;
    cudaEvent_t tune_events_[2 * kTuneCandidates] = {};
    dst_status choose_algo(LtMatmul &mm, cudaDataType_t type, cudaDataType_t d_type, const Gemm &g, size_t ws_bytes,
                           void *ws_ptr, uint32_t al_a, uint32_t al_b, uint32_t al_d,
                           const std::array<int64_t, kLtKey> &key, cublasLtMatmulAlgo_t *algo, size_t *ws);
    // Times a class's candidates on this call's problem (in place: the call writes D, β = 0) and keeps
    // the fastest whose output has the first candidate's bits.
    dst_status tune_class(LtMatmul &mm, const Gemm &g, bool d_fp32, void *ws_ptr, size_t ws_bytes, LtAlgoEntry *cls);
};

// Creates a CUDA backend on `device` (0-based). DST_ERR_UNSUPPORTED when no GPU is usable,
// DST_ERR_INVALID_ARGUMENT for a device out of range; *out is nullptr on failure.
dst_status make_cuda_backend(int device, Backend **out);
// Number of usable CUDA devices; any CUDA error (no driver, no device) counts as 0. Never fails
// unless `count` is nullptr.
dst_status cuda_device_count(int *count);

}  // namespace dst

#endif  // DST_BACKEND_CUDA_CUDA_BACKEND_H
