// CUDA backend: memory, stream and workspace management, GEMMs through cuBLASLt, and the glue that
// maps the remaining ops of the table onto the launchers of kernels/*.cuh.
//
// GEMMs. Row-major y[n,m] = x[n,k]·W[m,k]ᵀ is, in cuBLASLt's column-major terms, D[m,n] =
// op(A)·op(B) with A = W viewed as k×m (transposed), B = x viewed as k×n; the bwd GEMMs are
// mapped the same way (comments at each call). Accumulation in fp32 (CUBLAS_COMPUTE_32F; TF32 only
// when set_allow_tf32(true)), FP64 in CUBLAS_COMPUTE_64F. The bias of linear_fwd uses the BIAS
// epilogue; for FP64 (and for a bias pointer under 16-byte alignment) the bias is broadcast into D
// first and the GEMM runs with beta = 1 — the same single rounding. The bias gradient of
// linear_bwd_weight comes from the ordered column-sum kernels (kernels/bias.cuh), not from cuBLASLt's
// BGRADB epilogue, which cost more than the sums on the H200 (docs/design-notes.md); gelu_bwd_bias_grad
// sums the columns of the gradient it writes. GELU (erf or tanh) runs as a separate elementwise kernel,
// since cuBLASLt's GELU epilogue is the tanh form only, except where the fused GELU GEMMs take the call:
// the FC1 forward with GELU and the FC2 data gradient with GELU' as CUTLASS kernels with those
// epilogues (kernels/gemm_gelu.cuh), where the build has them and the call fits; on by default,
// DST_FUSED_GEMM=0 in the environment (or set_fused_gemm(false)) keeps the separate kernels. The fused
// FC2 data gradient's bias gradient comes from its epilogue's per-tile column sums
// (set_dgelu_tile_sums).
// Determinism: cuBLASLt is bit-reproducible for a fixed problem, algorithm and workspace size; the
// workspace offered to it is a fixed size (kGemmWorkspace, or the caller's workspace if smaller),
// so the algorithm of a problem is always the same (chosen once per problem, then cached: choose_algo).
// Every reduction kernel is ordered.
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cublaslt_util.h"
#include "backend/cuda/cuda_check.h"

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>

#include <omp.h>

#include "core/error.h"
#include "kernels/bias.cuh"
#include "kernels/checks.cuh"
#include "kernels/digest.cuh"
#include "kernels/dispatch.cuh"
#include "kernels/elementwise.cuh"
#include "kernels/embedding.cuh"
#include "kernels/gemm_gelu.cuh"
#include "kernels/rows.cuh"
#include "kernels/layernorm.cuh"
#include "kernels/optim.cuh"
#include "kernels/rng.cuh"

namespace dst {

namespace {

constexpr size_t kWorkspaceGranule = size_t(1) << 20;

size_t align_up(size_t v, size_t a) { return (v + a - 1) / a * a; }

size_t storage_size(dst_dtype dt) {
    return dt == DST_DTYPE_FP64 ? 8 : (dt == DST_DTYPE_FP16 || dt == DST_DTYPE_BF16) ? 2 : 4;
}

}  // namespace

// ---- lifetime ----------------------------------------------------------------------------------

dst_status cuda_device_count(int *count) {
    if (!count) return set_error(DST_ERR_INVALID_ARGUMENT, "cuda_device_count: count is NULL");
    *count = 0;
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        (void)cudaGetLastError();  // no driver or no device: zero devices, not an error
        return DST_OK;
    }
    *count = n;
    return DST_OK;
}

dst_status CudaBackend::create(int device, CudaBackend **out) {
    *out = nullptr;
    int count = 0;
    DST_TRY(cuda_device_count(&count));
    if (count == 0) return set_error(DST_ERR_UNSUPPORTED, "cuda backend: no usable CUDA device");
    if (device < 0 || device >= count)
        return set_error(DST_ERR_INVALID_ARGUMENT, "cuda backend: device %d out of range (%d device%s)",
                         device, count, count == 1 ? "" : "s");
    std::unique_ptr<CudaBackend> be(new (std::nothrow) CudaBackend());
    if (!be) return set_error(DST_ERR_OUT_OF_MEMORY, "cuda backend: cannot allocate the backend");
    be->device_ = device;
    DST_CUDA_CHECK(cudaSetDevice(device));
    DST_CUDA_CHECK(cudaStreamCreateWithFlags(&be->own_stream_, cudaStreamNonBlocking));
    be->stream_ = be->own_stream_;
    DST_CUBLASLT_CHECK(cublasLtCreate(&be->lt_));
    {
        // The switches that default to on: off only when the variable is "0".
        auto on_unless_zero = [](const char *name) {
            const char *v = std::getenv(name);
            return !(v && std::strcmp(v, "0") == 0);
        };
        be->gemm_tuning_ = on_unless_zero("DST_GEMM_TUNE");
        be->fused_gemm_ = on_unless_zero("DST_FUSED_GEMM");
        be->dgelu_tile_sums_ = on_unless_zero("DST_DGELU_TILE_SUMS");
        const char *ln = std::getenv("DST_LN_ONE_PASS");
        if (ln) be->set_layernorm_one_pass(std::atoi(ln));
    }
    DST_CUDA_CHECK(cudaDeviceGetAttribute(&be->sm_count_, cudaDevAttrMultiProcessorCount, device));
    DST_CUDA_CHECK(cudaMalloc(reinterpret_cast<void **>(&be->flag_), sizeof(int)));
    DST_CUDA_CHECK(cudaHostAlloc(reinterpret_cast<void **>(&be->check_host_), sizeof(cuda::DeferredCheck),
                                 cudaHostAllocMapped | cudaHostAllocPortable));
    std::memset(be->check_host_, 0, sizeof(cuda::DeferredCheck));
    DST_CUDA_CHECK(cudaHostGetDevicePointer(reinterpret_cast<void **>(&be->check_dev_), be->check_host_, 0));
    *out = be.release();
    return DST_OK;
}

dst_status make_cuda_backend(int device, Backend **out) {
    if (!out) return set_error(DST_ERR_INVALID_ARGUMENT, "make_cuda_backend: out is NULL");
    *out = nullptr;
    CudaBackend *be = nullptr;
    DST_TRY(CudaBackend::create(device, &be));
    *out = be;
    return DST_OK;
}

// The default follows OpenMP (OMP_NUM_THREADS), as on the CPU backend.
int CudaBackend::num_threads() const {
    return threads_ > 0 ? threads_ : std::min(omp_get_max_threads(), DST_MAX_NUM_THREADS);
}

CudaBackend::~CudaBackend() {
    // Destructors cannot report: errors are dropped and the error slot cleared.
    if (cudaSetDevice(device_) == cudaSuccess) {
        if (stream_) (void)cudaStreamSynchronize(stream_);
        if (own_ws_) (void)cudaFree(own_ws_);
        if (flag_) (void)cudaFree(flag_);
        if (check_host_) (void)cudaFreeHost(check_host_);
        if (lt_) (void)cublasLtDestroy(lt_);
        for (cudaEvent_t e : tune_events_)
            if (e) (void)cudaEventDestroy(e);
        if (own_stream_) (void)cudaStreamDestroy(own_stream_);
    }
    (void)cudaGetLastError();
}

// The capture status of `s` in *st; false when CUDA cannot tell (the query failed: for the legacy
// default stream while another stream captures, cudaErrorStreamCaptureImplicit).
static bool capture_status(cudaStream_t s, cudaStreamCaptureStatus *st) {
    *st = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing(s, st) != cudaSuccess) {
        (void)cudaGetLastError();
        *st = cudaStreamCaptureStatusNone;  // CUDA may have written it
        return false;
    }
    return true;
}

bool CudaBackend::capturing() const {
    cudaStreamCaptureStatus st;
    return capture_status(stream_, &st) && st == cudaStreamCaptureStatusActive;
}

// ---- deferred checks ----------------------------------------------------------------------------

dst_status CudaBackend::note_check(CheckKind kind, int32_t lo, int32_t hi, const char *what, const char *detail,
                                   uint32_t *id) {
    *id = next_check_++;
    if (next_check_ == 0) next_check_ = 1;  // 0 never names a check
    DeferredWhat &w = checks_[*id % kDeferredKept];
    w.id = *id;
    w.kind = kind;
    w.lo = lo;
    w.hi = hi;
    try {
        w.what = what ? what : "";
        w.detail = detail ? detail : "";
    } catch (const std::bad_alloc &) {
        return set_error(DST_ERR_OUT_OF_MEMORY, "cuda backend: cannot keep the description of a check");
    }
    return DST_OK;
}

dst_status CudaBackend::check_range_deferred(const int32_t *v, int64_t count, int32_t lo, int32_t hi,
                                             const char *what, const char *detail) {
    DST_TRY(activate());
    uint32_t id = 0;
    DST_TRY(note_check(CheckKind::Range, lo, hi, what, detail, &id));
    DST_CUDA_CHECK(cuda::check_range_deferred(stream_, v, count, lo, hi, check_dev_, id));
    return DST_OK;
}

dst_status CudaBackend::check_nonzero_deferred(dst_dtype dt, const void *x, int64_t count, const char *what,
                                               const char *detail) {
    DST_TRY(activate());
    uint32_t id = 0;
    DST_TRY(note_check(CheckKind::Nonzero, 0, 0, what, detail, &id));
    DST_CUDA_CHECK(cuda::check_nonzero_deferred(stream_, dt, x, count, check_dev_, id));
    return DST_OK;
}

// Reads the mapped slot without waiting: a failure the device has recorded is reported once and the
// slot emptied for the next one. The kernel writes state last, after a system-wide fence.
dst_status CudaBackend::take_deferred_error(const char *fn) {
    volatile cuda::DeferredCheck *s = check_host_;
    if (!s || s->state == 0) return DST_OK;
    std::atomic_thread_fence(std::memory_order_acquire);
    const uint32_t id = s->id;
    const long long index = static_cast<long long>(s->index);
    const double value = s->value;
    s->state = 0;
    const DeferredWhat &w = checks_[id % kDeferredKept];
    static const char tail[] = " (checked on the device after that call had returned, so its results are not "
                               "meaningful)";
    if (w.id != id)
        return set_error(DST_ERR_INVALID_ARGUMENT, "%s: an earlier call's argument check #%u failed at index %lld%s",
                         fn, (unsigned)id, index, tail);
    if (w.kind == CheckKind::Offsets)
        return set_error(DST_ERR_INVALID_ARGUMENT,
                         "%s: an earlier call, %s: sequence %lld has length %.17g, or the offsets do not run from 0 "
                         "to N (expected 0 = cu_seqlens[0] < ... < cu_seqlens[B] = N with every length in 1..%d)%s",
                         fn, w.what.c_str(), index, value, (int)w.hi, tail);
    if (w.kind == CheckKind::Range)
        return set_error(DST_ERR_INVALID_ARGUMENT, "%s: an earlier call, %s value %.17g at index %lld is outside %d..%d%s%s",
                         fn, w.what.c_str(), value, index, (int)w.lo, (int)w.hi, w.detail.c_str(), tail);
    if (w.kind == CheckKind::Repeat)
        return set_error(DST_ERR_INVALID_ARGUMENT,
                         "%s: an earlier call, %s value %.17g at index %lld occurs more than once (must be distinct)%s%s",
                         fn, w.what.c_str(), value, index, w.detail.c_str(), tail);
    return set_error(DST_ERR_INVALID_ARGUMENT, "%s: an earlier call, %s has a zero element (index %lld)%s%s", fn,
                     w.what.c_str(), index, w.detail.c_str(), tail);
}

// Every op makes the context's device current first. cudaSetDevice is a driver call with locks even
// when the device is already current (each layer step makes ~40 such calls); the thread's current
// device is a cheap read, so the call is made only when it differs (as PyTorch's device guards do).
dst_status CudaBackend::activate() const {
    int current = -1;
    const cudaError_t query = cudaGetDevice(&current);
    if (query == cudaSuccess && current == device_) return DST_OK;
    if (query != cudaSuccess) (void)cudaGetLastError();  // not to be reported by a later launch's check
    DST_CUDA_CHECK(cudaSetDevice(device_));
    return DST_OK;
}

dst_status CudaBackend::set_stream(void *cuda_stream) {
    DST_TRY(activate());
    const cudaStream_t next = cuda_stream ? static_cast<cudaStream_t>(cuda_stream) : own_stream_;
    cudaStreamCaptureStatus next_st, old_st;
    const bool next_known = capture_status(next, &next_st), old_known = capture_status(stream_, &old_st);
    const bool next_in_capture = next_known && next_st != cudaStreamCaptureStatusNone;
    // Refuse a handle CUDA does not know, or one of another device, before switching to it. Not for a
    // stream in a CUDA graph capture: cudaStreamGetDevice is among the calls CUDA forbids then (it fails
    // and invalidates the capture); the capture shows the handle is a live stream, and a stream of
    // another device fails at the first launch (DST_ERR_BACKEND).
    if (cuda_stream && !next_in_capture) {
        int dev = -1;
        const cudaError_t e = cudaStreamGetDevice(next, &dev);
        if (e != cudaSuccess) {
            (void)cudaGetLastError();
            return set_error(DST_ERR_INVALID_ARGUMENT, "cuda backend: stream %p is not a valid CUDA stream (%s)",
                             cuda_stream, cudaGetErrorString(e));
        }
        if (dev != device_)
            return set_error(DST_ERR_INVALID_ARGUMENT,
                             "cuda backend: stream %p belongs to device %d, the context runs on device %d", cuda_stream,
                             dev, device_);
    }
    // The old stream's work finishes before later work on the new one can start, unless a CUDA graph
    // capture is under way on either stream (or CUDA cannot tell): waiting would end or fail it
    // (PyTorch's global capture mode forbids any wait while a stream captures), and captured work runs
    // only when the graph is launched, which the caller orders. So switching to a capturing stream, or
    // away from one, does not wait.
    if (next_known && old_known && next_st == cudaStreamCaptureStatusNone && old_st == cudaStreamCaptureStatusNone)
        DST_CUDA_CHECK(cudaStreamSynchronize(stream_));
    stream_ = next;
    return DST_OK;
}

dst_status CudaBackend::set_workspace(void *ptr, size_t bytes) {
    DST_TRY(activate());
    DST_CUDA_CHECK(cudaStreamSynchronize(stream_));
    if (own_ws_) {
        DST_CUDA_CHECK(cudaFree(own_ws_));
        own_ws_ = nullptr;
        own_ws_bytes_ = 0;
    }
    user_ws_ = ptr;
    user_ws_bytes_ = ptr ? bytes : 0;
    return DST_OK;
}

dst_status CudaBackend::workspace(size_t bytes, void **ptr) {
    *ptr = nullptr;
    if (bytes == 0) return DST_OK;
    if (user_ws_) {
        if (bytes > user_ws_bytes_)
            return set_error(DST_ERR_CAPACITY,
                             "cuda backend: the caller's workspace has %zu bytes, this op needs %zu",
                             user_ws_bytes_, bytes);
        *ptr = user_ws_;
        return DST_OK;
    }
    if (bytes > own_ws_bytes_) {
        if (capturing())
            return set_error(DST_ERR_STATE,
                             "cuda backend: the workspace must grow to %zu bytes while the stream is capturing a CUDA "
                             "graph, where allocating is not allowed: make the same call once before capturing, or "
                             "give the context a workspace (dst_context_set_workspace)", bytes);
        // Work queued earlier may still read the old buffer.
        DST_CUDA_CHECK(cudaStreamSynchronize(stream_));
        if (own_ws_) DST_CUDA_CHECK(cudaFree(own_ws_));
        own_ws_ = nullptr;
        own_ws_bytes_ = 0;
        const size_t want = align_up(bytes, kWorkspaceGranule);
        if (cudaMalloc(&own_ws_, want) != cudaSuccess) {
            (void)cudaGetLastError();
            own_ws_ = nullptr;
            return set_error(DST_ERR_OUT_OF_MEMORY,
                             "cuda backend: cannot allocate %zu bytes of workspace on device %d", want,
                             device_);
        }
        own_ws_bytes_ = want;
    }
    *ptr = own_ws_;
    return DST_OK;
}

// ---- memory --------------------------------------------------------------------------------------

dst_status CudaBackend::alloc(size_t bytes, void **ptr) {
    *ptr = nullptr;
    if (bytes == 0) return DST_OK;
    DST_TRY(activate());
    if (capturing())  // cudaMalloc would invalidate the caller's capture
        return set_error(DST_ERR_STATE,
                         "cuda backend: %zu bytes of device memory are needed while the stream is capturing a CUDA "
                         "graph, where allocating is not allowed: make the same call once before capturing (it "
                         "allocates what later calls reuse)", bytes);
    if (cudaMalloc(ptr, bytes) != cudaSuccess) {
        (void)cudaGetLastError();
        *ptr = nullptr;
        size_t free_b = 0, total_b = 0;
        (void)cudaMemGetInfo(&free_b, &total_b);
        (void)cudaGetLastError();
        return set_error(DST_ERR_OUT_OF_MEMORY,
                         "cuda backend: cannot allocate %zu bytes on device %d (%zu of %zu bytes free)",
                         bytes, device_, free_b, total_b);
    }
    return DST_OK;
}

void CudaBackend::free(void *ptr) {
    if (!ptr) return;
    if (cudaSetDevice(device_) == cudaSuccess) (void)cudaFree(ptr);
    (void)cudaGetLastError();
}

dst_status CudaBackend::zero(void *ptr, size_t bytes) {
    if (bytes == 0) return DST_OK;
    DST_TRY(activate());
    DST_CUDA_CHECK(cudaMemsetAsync(ptr, 0, bytes, stream_));
    return DST_OK;
}

// Copies that touch host memory complete before returning (plain memcpy semantics, also for
// pinned host buffers); device-to-device copies are enqueued.
dst_status CudaBackend::copy(void *dst, const void *src, size_t bytes, CopyKind kind) {
    if (bytes == 0 || dst == src) return DST_OK;
    DST_TRY(activate());
    cudaMemcpyKind k = cudaMemcpyDeviceToDevice;
    if (kind == CopyKind::HostToDevice) k = cudaMemcpyHostToDevice;
    if (kind == CopyKind::DeviceToHost) k = cudaMemcpyDeviceToHost;
    DST_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, k, stream_));
    if (kind != CopyKind::DeviceToDevice) DST_CUDA_CHECK(cudaStreamSynchronize(stream_));
    return DST_OK;
}

dst_status CudaBackend::synchronize() {
    DST_TRY(activate());
    DST_CUDA_CHECK(cudaStreamSynchronize(stream_));
    return DST_OK;
}

// ---- GEMMs ---------------------------------------------------------------------------------------

// The cuBLASLt workspace: the first bytes of the backend's workspace (ops that keep buffers of
// their own in the workspace across GEMMs place them after this).
size_t CudaBackend::gemm_workspace_bytes() const {
    return user_ws_ ? (user_ws_bytes_ < kGemmWorkspace ? user_ws_bytes_ : kGemmWorkspace) : kGemmWorkspace;
}

size_t cuda_scratch_bytes(const ScratchNeeds &n) {
    size_t s = 0;
    auto need = [&s](size_t v) { s = v > s ? v : s; };
    if (n.gemm) need(kGemmWorkspace);
    if (n.colsum_width > 0 && n.rows > 0) need(cuda::column_sum_workspace(n.dt, n.rows, n.colsum_width));
    if (n.dgelu_width > 0 && n.rows > 0 && CudaBackend::fused_gemm_built())
        need(cuda::dgelu_partial_bytes(n.rows, n.dgelu_width));
    if (n.ln_width > 0 && n.rows > 0) need(cuda::layernorm_bwd_workspace(n.dt, n.rows, n.ln_width, true));
    if (n.attention) need(CudaBackend::attention_scratch(n.dt, n.attn, n.stochastic));
    if (n.index_check) need(cuda::check_indices_workspace(n.index_range, n.index_range > 0));
    if (n.emb_tokens > 0) need(cuda::embedding_bwd_workspace(n.dt, n.emb_tokens, n.emb_vocab, n.emb_types, n.emb_width));
    if (n.cross_entropy) need(CudaBackend::cross_entropy_scratch(n.dt, n.ce, kGemmWorkspace));
    return (s + 255) / 256 * 256;
}

void CudaBackend::set_scratch(void *ptr, size_t bytes) {
    // Stream order protects both regions: work queued before this point still uses the old one and
    // runs first. The owned workspace stays allocated for when scratch is handed back (nullptr).
    user_ws_ = ptr;
    user_ws_bytes_ = ptr ? bytes : 0;
}

namespace {

dst_status make_layout(cublasLtMatrixLayout_t *l, cudaDataType_t type, int64_t rows, int64_t cols, int64_t ld,
                       int64_t batch, int64_t stride) {
    DST_CUBLASLT_CHECK(cublasLtMatrixLayoutCreate(l, type, rows, cols, ld));
    if (batch == 1) return DST_OK;
    const int32_t count = static_cast<int32_t>(batch);
    DST_CUBLASLT_CHECK(cublasLtMatrixLayoutSetAttribute(*l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof count));
    DST_CUBLASLT_CHECK(cublasLtMatrixLayoutSetAttribute(*l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride,
                                                        sizeof stride));
    return DST_OK;
}

}  // namespace

namespace {

// The class of a GEMM extent (rows, columns, leading dimension, stride, batch) for the algorithm
// cache: itself up to 256, else the next of 2^k and 1.5·2^k (1216 → 1536, 4096 → 4096).
int64_t size_class(int64_t x) {
    if (x <= 256) return x;
    int64_t p = 256;
    while (p < x) {
        if (p + p / 2 >= x) return p + p / 2;
        p *= 2;
    }
    return p;
}

}  // namespace

namespace {

// An attribute of an algorithm's configuration (the query wants its exact size); -1 when not readable.
int64_t algo_attribute(const cublasLtMatmulAlgo_t &algo, cublasLtMatmulAlgoConfigAttributes_t attr) {
    uint64_t v = 0;
    size_t need = 0, got = 0;
    if (cublasLtMatmulAlgoConfigGetAttribute(&algo, attr, nullptr, 0, &need) != CUBLAS_STATUS_SUCCESS || need == 0 ||
        need > sizeof v)
        return -1;
    if (cublasLtMatmulAlgoConfigGetAttribute(&algo, attr, &v, need, &got) != CUBLAS_STATUS_SUCCESS) return -1;
    return static_cast<int64_t>(v);  // little-endian: the low bytes
}

// Whether two algorithms are of one kernel family that sums every output element over K in the same
// order: the same algorithm id, no split-K, no reduction. Within such a family only the tile, cluster
// and scheduling differ; kernels/dev/gemm_lab.cu compares their outputs bit for bit.
bool same_summation(const cublasLtMatmulAlgo_t &a, const cublasLtMatmulAlgo_t &b) {
    const int64_t id = algo_attribute(a, CUBLASLT_ALGO_CONFIG_ID);
    return id >= 0 && id == algo_attribute(b, CUBLASLT_ALGO_CONFIG_ID) &&
           algo_attribute(a, CUBLASLT_ALGO_CONFIG_SPLITK_NUM) == 1 &&
           algo_attribute(b, CUBLASLT_ALGO_CONFIG_SPLITK_NUM) == 1 &&
           algo_attribute(a, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME) == CUBLASLT_REDUCTION_SCHEME_NONE &&
           algo_attribute(b, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME) == CUBLASLT_REDUCTION_SCHEME_NONE;
}

// Device bytes at the end of the GEMM workspace that tune_class uses for its digests.
constexpr size_t kDigestBytes = 256;

}  // namespace

// FNV-1a over the key's words.
size_t CudaBackend::LtKeyHash::operator()(const std::array<int64_t, kLtKey> &k) const {
    uint64_t h = 1469598103934665603ull;
    for (int64_t v : k) h = (h ^ static_cast<uint64_t>(v)) * 1099511628211ull;
    return static_cast<size_t>(h);
}

// The algorithm of a problem not seen before. cuBLASLt's heuristic costs up to a few milliseconds of
// host time per query, and some callers meet a new size at every call (the masked rows of an MLM head
// change from batch to batch), so the heuristic runs once per size class: on the representative
// problem, every extent rounded up by size_class; the class's algorithm serves each problem of the
// class that cublasLtMatmulAlgoCheck accepts (the problem's own query otherwise).
// The heuristic's first choice is not always the fastest it offers (8–18 % slower for some of the
// layer's GEMMs on the H200), so for FP16/BF16 the class keeps the other algorithms of the first one's
// family (same_summation) as candidates, and the first call of the class that may overwrite its
// output (β = 0, not capturing, not batched) times them on its own problem (tune_class). Every
// candidate gives the first one's bits, so results depend on the problem alone, never on the timing
// or on the order in which problems arrive (run-to-run determinism); the timing chooses the speed.
dst_status CudaBackend::choose_algo(LtMatmul &mm, cudaDataType_t type, cudaDataType_t d_type, const Gemm &g,
                                    size_t ws_bytes, void *ws_ptr, uint32_t al_a, uint32_t al_b, uint32_t al_d,
                                    const std::array<int64_t, kLtKey> &key, cublasLtMatmulAlgo_t *algo, size_t *ws) {
    const uint64_t ws_limit = ws_bytes;
    DST_CUBLASLT_CHECK(cublasLtMatmulPreferenceCreate(&mm.pref));
    DST_CUBLASLT_CHECK(cublasLtMatmulPreferenceSetAttribute(mm.pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                            &ws_limit, sizeof ws_limit));
    DST_CUBLASLT_CHECK(cublasLtMatmulPreferenceSetAttribute(mm.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al_a,
                                                            sizeof al_a));
    DST_CUBLASLT_CHECK(cublasLtMatmulPreferenceSetAttribute(mm.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &al_b,
                                                            sizeof al_b));
    DST_CUBLASLT_CHECK(cublasLtMatmulPreferenceSetAttribute(mm.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al_d,
                                                            sizeof al_d));
    DST_CUBLASLT_CHECK(cublasLtMatmulPreferenceSetAttribute(mm.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &al_d,
                                                            sizeof al_d));

    // The class entry: the key with every extent (M, N, K, the leading dimensions, strides, batch) classed.
    int64_t ckey[kLtKey];
    std::memcpy(ckey, key.data(), sizeof ckey);
    for (int i = 3; i <= 12; ++i) ckey[i] = size_class(key[i]);
    LtAlgoEntry *cls = nullptr;
    for (LtAlgoEntry &e : lt_classes_)
        if (std::memcmp(e.key, ckey, sizeof ckey) == 0) cls = &e;
    if (!cls) {
        const bool an = g.ta == CUBLAS_OP_N, bn = g.tb == CUBLAS_OP_N;
        const int64_t M = size_class(g.M), N = size_class(g.N), K = size_class(g.K), batch = size_class(g.batch);
        LtMatmul rep;
        DST_TRY(make_layout(&rep.a, type, an ? M : K, an ? K : M, size_class(g.lda), batch, size_class(g.sa)));
        DST_TRY(make_layout(&rep.b, type, bn ? K : N, bn ? N : K, size_class(g.ldb), batch, size_class(g.sb)));
        DST_TRY(make_layout(&rep.d, d_type, M, N, size_class(g.ldd), batch, size_class(g.sd)));
        const bool tunable = type == CUDA_R_16F || type == CUDA_R_16BF;
        cublasLtMatmulHeuristicResult_t heur[kTuneCandidates] = {};
        int found = 0;
        const cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(lt_, mm.op, rep.a, rep.b, rep.d, rep.d, mm.pref,
                                                                 tunable ? kTuneCandidates : 1, heur, &found);
        if (st == CUBLAS_STATUS_SUCCESS && found > 0 && heur[0].state == CUBLAS_STATUS_SUCCESS) {
            LtAlgoEntry e;
            std::memcpy(e.key, ckey, sizeof ckey);
            e.algo = heur[0].algo;
            e.ws = heur[0].workspaceSize;
            for (int i = 1; i < found; ++i)
                if (heur[i].state == CUBLAS_STATUS_SUCCESS && same_summation(heur[0].algo, heur[i].algo)) {
                    if (e.candidates == 0) e.cand[e.candidates++] = heur[0].algo;
                    e.cand[e.candidates++] = heur[i].algo;
                }
            if (lt_classes_.size() >= kLtAlgosKept)
                lt_classes_.erase(lt_classes_.begin(), lt_classes_.begin() + kLtAlgosKept / 2);
            lt_classes_.push_back(e);
            cls = &lt_classes_.back();
        }
    }
    if (cls && cls->candidates > 0 && gemm_tuning_ && !g.accumulate && g.batch == 1 && !capturing())
        DST_TRY(tune_class(mm, g, d_type == CUDA_R_32F, ws_ptr, ws_bytes, cls));
    if (cls) {
        cublasLtMatmulHeuristicResult_t chk{};
        if (cublasLtMatmulAlgoCheck(lt_, mm.op, mm.a, mm.b, mm.d, mm.d, &cls->algo, &chk) == CUBLAS_STATUS_SUCCESS &&
            chk.workspaceSize <= ws_bytes) {
            *algo = cls->algo;
            *ws = chk.workspaceSize;
            return DST_OK;
        }
    }
    cublasLtMatmulHeuristicResult_t heur{};
    int found = 0;
    const cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(lt_, mm.op, mm.a, mm.b, mm.d, mm.d, mm.pref, 1, &heur,
                                                             &found);
    DST_CUBLASLT_CHECK(st);
    if (found < 1)
        return set_error(DST_ERR_BACKEND,
                         "cuda backend: cuBLASLt has no algorithm for a %lldx%lldx%lld GEMM (batch %lld, dtype %d)",
                         static_cast<long long>(g.M), static_cast<long long>(g.N), static_cast<long long>(g.K),
                         static_cast<long long>(g.batch), static_cast<int>(type));
    *algo = heur.algo;
    *ws = heur.workspaceSize;
    return DST_OK;
}

// Each candidate (that accepts this problem and fits the workspace) runs once, then its digest of D is
// taken, then it runs kTuneRuns times between two events; the host waits once for all of them. A
// candidate whose digest differs from the first's is never chosen (none did in gemm_lab's comparisons,
// but the family rule is cuBLASLt's behaviour, not its contract). The class is settled afterwards, also
// when a candidate fails; a failure of the first candidate is the call's error, as it would be without
// tuning.
dst_status CudaBackend::tune_class(LtMatmul &mm, const Gemm &g, bool d_fp32, void *ws_ptr, size_t ws_bytes,
                                   LtAlgoEntry *cls) {
    constexpr int kTuneRuns = 3;
    const int n = cls->candidates;
    cls->candidates = 0;
    if (!ws_ptr || ws_bytes < 2 * kDigestBytes) return DST_OK;
    const size_t gemm_ws = ws_bytes - kDigestBytes;
    const uintptr_t at = (reinterpret_cast<uintptr_t>(ws_ptr) + gemm_ws + 7) & ~uintptr_t(7);
    auto *digests = reinterpret_cast<unsigned long long *>(at);  // n ≤ 8 slots, inside the last kDigestBytes
    for (cudaEvent_t &e : tune_events_)
        if (!e) DST_CUDA_CHECK(cudaEventCreate(&e));
    const float alpha = g.alpha, beta = 0.0f;
    bool ran[kTuneCandidates] = {};
    for (int i = 0; i < n; ++i) {
        cublasLtMatmulHeuristicResult_t chk{};
        if (cublasLtMatmulAlgoCheck(lt_, mm.op, mm.a, mm.b, mm.d, mm.d, &cls->cand[i], &chk) != CUBLAS_STATUS_SUCCESS ||
            chk.workspaceSize > gemm_ws) {
            if (i == 0) return DST_OK;  // nothing to compare with: the heuristic's first stays
            continue;
        }
        auto run = [&] {
            return cublasLtMatmul(lt_, mm.op, &alpha, g.A, mm.a, g.B, mm.b, &beta, g.D, mm.d, g.D, mm.d, &cls->cand[i],
                                  ws_ptr, chk.workspaceSize, stream_);
        };
        const cublasStatus_t first = run();
        if (first != CUBLAS_STATUS_SUCCESS) {
            if (i == 0) DST_CUBLASLT_CHECK(first);
            continue;
        }
        DST_CUDA_CHECK(cuda::matrix_digest(stream_, g.D, g.M, g.N, g.ldd, d_fp32 ? 4 : 2, digests + i));
        DST_CUDA_CHECK(cudaEventRecord(tune_events_[2 * i], stream_));
        for (int r = 0; r < kTuneRuns; ++r) DST_CUBLASLT_CHECK(run());
        DST_CUDA_CHECK(cudaEventRecord(tune_events_[2 * i + 1], stream_));
        ran[i] = true;
    }
    unsigned long long host[kTuneCandidates] = {};
    DST_CUDA_CHECK(cudaMemcpyAsync(host, digests, sizeof(unsigned long long) * static_cast<size_t>(n),
                                   cudaMemcpyDeviceToHost, stream_));
    DST_CUDA_CHECK(cudaStreamSynchronize(stream_));
    int best = 0;
    float best_ms = 0.0f;
    for (int i = 0; i < n; ++i) {
        if (!ran[i] || host[i] != host[0]) continue;
        float ms = 0.0f;
        DST_CUDA_CHECK(cudaEventElapsedTime(&ms, tune_events_[2 * i], tune_events_[2 * i + 1]));
        if (i == 0 || ms < best_ms) {
            best = i;
            best_ms = ms;
        }
    }
    cls->algo = cls->cand[best];
    classes_timed_ += 1;
    classes_changed_ += best != 0;
    return DST_OK;
}

dst_status CudaBackend::gemm(dst_dtype dt, const Gemm &g) {
    cudaDataType_t type, scale_type = CUDA_R_32F;
    cublasComputeType_t compute = CUBLAS_COMPUTE_32F;
    switch (dt) {
        case DST_DTYPE_FP32:
            type = CUDA_R_32F;
            if (allow_tf32_) compute = CUBLAS_COMPUTE_32F_FAST_TF32;
            break;
        case DST_DTYPE_FP16: type = CUDA_R_16F; break;
        case DST_DTYPE_BF16: type = CUDA_R_16BF; break;
        case DST_DTYPE_FP64:
            type = scale_type = CUDA_R_64F;
            compute = CUBLAS_COMPUTE_64F;
            break;
        default:
            return set_error(DST_ERR_INVALID_ARGUMENT, "cuda backend: gemm: unsupported dtype %d",
                             static_cast<int>(dt));
    }
    const cudaDataType_t d_type = g.d_fp32 ? CUDA_R_32F : type;
    const int32_t ta = g.ta, tb = g.tb;
    const void *vec = g.bias;
    const int epilogue = g.bias ? 1 : 0;  // 0 none, 1 BIAS
    const size_t ws_bytes = gemm_workspace_bytes();
    void *ws = nullptr;
    DST_TRY(workspace(ws_bytes, &ws));
    const void *c = g.C ? g.C : g.D;
    const uint32_t al_a = pointer_alignment(g.A), al_b = pointer_alignment(g.B),
                   al_d = std::min(pointer_alignment(g.D), pointer_alignment(c));  // C and D share a layout
    // Everything the descriptors and the algorithm depend on (the bias pointer aside, set per call).
    const std::array<int64_t, kLtKey> key = {static_cast<int64_t>(dt), ta, tb, g.M, g.N, g.K, g.lda, g.sa, g.ldb,
                                             g.sb, g.ldd, g.sd, g.batch, g.d_fp32, al_a, al_b, al_d,
                                             static_cast<int64_t>(ws_bytes), allow_tf32_,
                                             vec ? pointer_alignment(vec) : 0, epilogue};
    auto found = lt_problems_.find(key);
    if (found == lt_problems_.end()) {
        LtProblem p;
        p.mm = std::make_unique<LtMatmul>();
        LtMatmul &mm = *p.mm;
        DST_CUBLASLT_CHECK(cublasLtMatmulDescCreate(&mm.op, compute, scale_type));
        DST_CUBLASLT_CHECK(cublasLtMatmulDescSetAttribute(mm.op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
        DST_CUBLASLT_CHECK(cublasLtMatmulDescSetAttribute(mm.op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
        if (epilogue > 0) {
            const cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_BIAS;
            const int32_t bias_type = type;
            DST_CUBLASLT_CHECK(cublasLtMatmulDescSetAttribute(mm.op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi));
            DST_CUBLASLT_CHECK(cublasLtMatmulDescSetAttribute(mm.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &vec,
                                                              sizeof vec));
            DST_CUBLASLT_CHECK(cublasLtMatmulDescSetAttribute(mm.op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_type,
                                                              sizeof bias_type));
        }
        const bool an = g.ta == CUBLAS_OP_N, bn = g.tb == CUBLAS_OP_N;
        DST_TRY(make_layout(&mm.a, type, an ? g.M : g.K, an ? g.K : g.M, g.lda, g.batch, g.sa));
        DST_TRY(make_layout(&mm.b, type, bn ? g.K : g.N, bn ? g.N : g.K, g.ldb, g.batch, g.sb));
        DST_TRY(make_layout(&mm.d, d_type, g.M, g.N, g.ldd, g.batch, g.sd));
        DST_TRY(choose_algo(mm, type, d_type, g, ws_bytes, ws, al_a, al_b, al_d, key, &p.algo, &p.ws));
        if (lt_problems_.size() >= kLtAlgosKept) lt_problems_.clear();
        found = lt_problems_.emplace(key, std::move(p)).first;
    } else if (epilogue > 0) {
        DST_CUBLASLT_CHECK(cublasLtMatmulDescSetAttribute(found->second.mm->op, CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                                                          &vec, sizeof vec));
    }
    const LtProblem &hit = found->second;
    const LtMatmul &mm = *hit.mm;
    const float alpha_f = g.alpha, beta_f = g.accumulate ? 1.0f : 0.0f;
    const double alpha_d = g.alpha, beta_d = g.accumulate ? 1.0 : 0.0;
    const bool dbl = scale_type == CUDA_R_64F;
    const void *alpha = dbl ? static_cast<const void *>(&alpha_d) : static_cast<const void *>(&alpha_f);
    const void *beta = dbl ? static_cast<const void *>(&beta_d) : static_cast<const void *>(&beta_f);
    DST_CUBLASLT_CHECK(cublasLtMatmul(lt_, mm.op, alpha, g.A, mm.a, g.B, mm.b, beta, c, mm.d, g.D, mm.d, &hit.algo,
                                      ws, hit.ws, stream_));
    return DST_OK;
}

dst_status CudaBackend::linear_fwd(dst_dtype dt, const void *x, const void *w, const void *b, void *y,
                                   int64_t n, int64_t k, int64_t m, const dst_gelu *gelu,
                                   void *pre_act) {
    DST_TRY(activate());
    if (n <= 0 || m <= 0) return DST_OK;
#ifdef DST_WITH_CUTLASS
    if (fused_gemm_ && gelu && pre_act != y && b && k > 0) {  // u (when wanted) and y stored separately
        const void *ptrs[] = {x, w, b, y, pre_act ? pre_act : y};
        if (cuda::gemm_gelu_runs(dt, pre_act ? cuda::kGeluForwardAux : cuda::kGeluForward, n, k, m, ptrs, 5)) {
            DST_CUDA_CHECK(cuda::gemm_bias_gelu(stream_, dt, *gelu, x, w, b, y, pre_act, n, k, m, sm_count_));
            fused_gemm_calls_ += 1;
            return DST_OK;
        }
    }
#endif
    void *target = (gelu && pre_act) ? pre_act : y;
    const bool epilogue_bias = b && dt != DST_DTYPE_FP64 && pointer_alignment(b) >= 16;
    if (b && !epilogue_bias) DST_CUDA_CHECK(cuda::bias_broadcast(stream_, dt, b, target, n, m));
    // D[m,n] = (W as k×m)ᵀ · (x as k×n)
    Gemm g{CUBLAS_OP_T, CUBLAS_OP_N, m, n, k, w, k, 0, x, k, 0, target, m, 0};
    g.accumulate = b && !epilogue_bias;
    g.bias = epilogue_bias ? b : nullptr;
    DST_TRY(gemm(dt, g));
    if (gelu) DST_CUDA_CHECK(cuda::gelu_fwd(stream_, dt, *gelu, target, y, n * m));
    return DST_OK;
}

// One cuBLASLt GEMM: D = acc + C (add, beta 1) + bias (the BIAS epilogue), summed in fp32 and rounded
// once; where the bias epilogue does not apply (FP64, a bias not 16-byte aligned) the two-pass default.
dst_status CudaBackend::linear_fwd_add(dst_dtype dt, const void *x, const void *w, const void *b, const void *add,
                                       void *y, int64_t n, int64_t k, int64_t m) {
    DST_TRY(activate());
    if (n <= 0 || m <= 0) return DST_OK;
    const bool epilogue_bias = b && dt != DST_DTYPE_FP64 && pointer_alignment(b) >= 16;
    if ((b && !epilogue_bias) || k <= 0) return Backend::linear_fwd_add(dt, x, w, b, add, y, n, k, m);
    // D[m,n] = (W as k×m)ᵀ · (x as k×n) + add
    Gemm g{CUBLAS_OP_T, CUBLAS_OP_N, m, n, k, w, k, 0, x, k, 0, y, m, 0};
    g.accumulate = true;
    g.C = add;
    g.bias = b;
    return gemm(dt, g);
}

dst_status CudaBackend::linear_bwd_data(dst_dtype dt, const void *dy, const void *w, void *dx, int64_t n,
                                        int64_t k, int64_t m, const void *add) {
    DST_TRY(activate());
    if (n <= 0 || k <= 0) return DST_OK;
    const size_t bytes = size_t(n * k) * storage_size(dt);
    if (m <= 0) {
        if (!add) DST_CUDA_CHECK(cudaMemsetAsync(dx, 0, bytes, stream_));
        else if (add != dx) DST_CUDA_CHECK(cudaMemcpyAsync(dx, add, bytes, cudaMemcpyDeviceToDevice, stream_));
        return DST_OK;
    }
    // D[k,n] = (W as k×m) · (dy as m×n) + C, C = add (beta = 1)
    Gemm g{CUBLAS_OP_N, CUBLAS_OP_N, k, n, m, w, k, 0, dy, m, 0, dx, k, 0};
    g.accumulate = add != nullptr;
    g.C = add;
    return gemm(dt, g);
}

dst_status CudaBackend::linear_bwd_weight(dst_dtype dt, const void *dy, const void *x, void *dw, void *db,
                                          int64_t n, int64_t k, int64_t m, bool accumulate) {
    DST_TRY(activate());
    if (m <= 0) return DST_OK;
    if (n <= 0) {  // empty batch: the gradients are zero
        if (!accumulate) {
            if (dw) DST_CUDA_CHECK(cudaMemsetAsync(dw, 0, m * k * storage_size(dt), stream_));
            if (db) DST_CUDA_CHECK(cudaMemsetAsync(db, 0, m * storage_size(dt), stream_));
        }
        return DST_OK;
    }
    // D[k,m] = (x as k×n) · (dy as m×n)ᵀ
    Gemm g{CUBLAS_OP_N, CUBLAS_OP_T, k, m, n, x, k, 0, dy, m, 0, dw, k, 0};
    g.accumulate = accumulate;
    if (dw && k > 0) DST_TRY(gemm(dt, g));
    if (db) {
        void *ws = nullptr;
        DST_TRY(workspace(cuda::column_sum_workspace(dt, n, m), &ws));
        DST_CUDA_CHECK(cuda::column_sum(stream_, dt, dy, db, n, m, accumulate, ws));
    }
    return DST_OK;
}

// ---- LayerNorm -----------------------------------------------------------------------------------

dst_status CudaBackend::layernorm_fwd(dst_dtype dt, const void *x, const void *gamma, const void *beta,
                                      void *y, void *mean, void *rstd, int64_t n, int64_t h, double eps) {
    DST_TRY(activate());
    DST_CUDA_CHECK(cuda::layernorm_fwd(stream_, dt, x, gamma, beta, y, mean, rstd, n, h, eps));
    return DST_OK;
}

dst_status CudaBackend::layernorm_bwd(dst_dtype dt, const void *dy, const void *xy, bool invertible,
                                      const void *gamma, const void *beta, const void *mean,
                                      const void *rstd, const void *dresid, void *dx, void *dgamma,
                                      void *dbeta, int64_t n, int64_t h, bool accumulate) {
    // The branch-free form of layernorm_dropout_bwd (a null branch writes nothing more).
    return layernorm_dropout_bwd(dt, dy, xy, invertible, gamma, beta, mean, rstd, dresid, dx, dgamma, dbeta, n, h,
                                 accumulate, DropoutSite{}, nullptr);
}

dst_status CudaBackend::layernorm_dropout_bwd(dst_dtype dt, const void *dy, const void *xy, bool invertible,
                                              const void *gamma, const void *beta, const void *mean,
                                              const void *rstd, const void *dresid, void *dx, void *dgamma,
                                              void *dbeta, int64_t n, int64_t h, bool accumulate,
                                              const DropoutSite &site, void *branch) {
    return layernorm_dropout_bwd_bias_grad(dt, dy, xy, invertible, gamma, beta, mean, rstd, dresid, dx, dgamma, dbeta,
                                           n, h, accumulate, site, branch, nullptr);
}

// The branch's bias gradient from the one-pass kernel's column sums where it runs, else column_sum over
// the stored branch after the LayerNorm's passes (the workspace holds the γ/β partials, then those).
dst_status CudaBackend::layernorm_dropout_bwd_bias_grad(dst_dtype dt, const void *dy, const void *xy, bool invertible,
                                                        const void *gamma, const void *beta, const void *mean,
                                                        const void *rstd, const void *dresid, void *dx, void *dgamma,
                                                        void *dbeta, int64_t n, int64_t h, bool accumulate,
                                                        const DropoutSite &site, void *branch, void *branch_db) {
    if (branch_db && !branch)
        return set_error(DST_ERR_INVALID_ARGUMENT, "layernorm_dropout_bwd_bias_grad: branch_db without a branch");
    DST_TRY(activate());
    void *ws = nullptr;
    if (dgamma || dbeta || branch_db)  // (γ/β partials, then the bias's: column_sum's fit in the same bytes)
        DST_TRY(workspace(cuda::layernorm_bwd_workspace(dt, n, h, branch_db != nullptr), &ws));
    bool one_pass = false;
    DST_CUDA_CHECK(cuda::layernorm_bwd(stream_, dt, dy, xy, invertible, gamma, beta, mean, rstd, dresid, dx, dgamma,
                                       dbeta, n, h, accumulate, ws, branch ? &site : nullptr, branch, branch_db,
                                       ln_split_, &one_pass));
    ln_one_pass_calls_ += one_pass ? 1 : 0;
    return DST_OK;
}

dst_status CudaBackend::dropout_residual_layernorm_fwd(dst_dtype dt, const void *a, const void *residual, void *z,
                                                       const void *gamma, const void *beta, void *y, void *mean,
                                                       void *rstd, int64_t n, int64_t h, double eps,
                                                       const DropoutSite &site) {
    DST_TRY(activate());
    DST_CUDA_CHECK(cuda::dropout_residual_layernorm_fwd(stream_, dt, a, residual, z, gamma, beta, y, mean, rstd, n, h,
                                                        eps, site));
    return DST_OK;
}

dst_status CudaBackend::all_nonzero(dst_dtype dt, const void *x, int64_t count, bool *all_nonzero) {
    DST_TRY(activate());
    DST_CUDA_CHECK(cuda::any_zero(stream_, dt, x, count, flag_));
    int any_zero = 0;
    DST_CUDA_CHECK(cudaMemcpyAsync(&any_zero, flag_, sizeof any_zero, cudaMemcpyDeviceToHost, stream_));
    DST_CUDA_CHECK(cudaStreamSynchronize(stream_));
    *all_nonzero = any_zero == 0;
    return DST_OK;
}

dst_status CudaBackend::rng_take(uint32_t *counter, uint32_t *slot) {
    DST_TRY(activate());
    DST_CUDA_CHECK(cuda::rng_take(stream_, counter, slot));
    return DST_OK;
}

// ---- elementwise ---------------------------------------------------------------------------------

dst_status CudaBackend::gelu_fwd(dst_dtype dt, dst_gelu form, const void *u, void *g, int64_t count) {
    DST_TRY(activate());
    DST_CUDA_CHECK(cuda::gelu_fwd(stream_, dt, form, u, g, count));
    return DST_OK;
}

dst_status CudaBackend::gelu_bwd(dst_dtype dt, dst_gelu form, const void *dg, const void *u, void *du,
                                 int64_t count) {
    DST_TRY(activate());
    DST_CUDA_CHECK(cuda::gelu_bwd(stream_, dt, form, dg, u, du, count));
    return DST_OK;
}

dst_status CudaBackend::gelu_bwd_bias_grad(dst_dtype dt, dst_gelu form, const void *dg, const void *u, void *du,
                                           int64_t n, int64_t m, void *db, bool accumulate) {
    DST_TRY(activate());
    if (!db) return gelu_bwd(dt, form, dg, u, du, n * m);
    void *ws = nullptr;
    DST_TRY(workspace(cuda::column_sum_workspace(dt, n, m), &ws));
    DST_CUDA_CHECK(cuda::gelu_bwd_bias_grad(stream_, dt, form, dg, u, du, n, m, db, accumulate, ws));
    return DST_OK;
}

dst_status CudaBackend::linear_bwd_data_gelu(dst_dtype dt, dst_gelu form, const void *dy, const void *w,
                                             const void *u, void *dg, void *du, int64_t n, int64_t k, int64_t m,
                                             void *db, bool accumulate) {
#ifdef DST_WITH_CUTLASS
    const void *ptrs[] = {dy, w, u, du};
    if (fused_gemm_) DST_TRY(activate());  // gemm_gelu_runs asks about the current device
    if (fused_gemm_ && cuda::gemm_gelu_runs(dt, cuda::kGeluBackward, n, k, m, ptrs, 4)) {
        // The bias gradient: the column sums of du as stored, each 128-row tile's from the kernel's
        // epilogue, then those rows added in order; or (set_dgelu_tile_sums(false)) column_sum over du,
        // the order gelu_bwd_bias_grad sums in. Their scratch is taken first, so that a failure to get it
        // writes nothing.
        const bool tiles = db && dgelu_tile_sums_;
        void *ws = nullptr;
        if (db)
            DST_TRY(workspace(tiles ? cuda::dgelu_partial_bytes(n, k) : cuda::column_sum_workspace(dt, n, k), &ws));
        DST_CUDA_CHECK(cuda::gemm_dgelu(stream_, dt, form, dy, w, u, du, n, k, m, sm_count_,
                                        tiles ? static_cast<float *>(ws) : nullptr));
        fused_gemm_calls_ += 1;
        if (tiles)
            DST_CUDA_CHECK(cuda::column_sum_finalize_chunks(stream_, dt, ws, cuda::dgelu_partial_ld(k),
                                                            cuda::dgelu_partial_chunks(n), db, k, accumulate));
        else if (db)
            DST_CUDA_CHECK(cuda::column_sum(stream_, dt, du, db, n, k, accumulate, ws));
        return DST_OK;
    }
#endif
    return Backend::linear_bwd_data_gelu(dt, form, dy, w, u, dg, du, n, k, m, db, accumulate);
}

bool CudaBackend::fused_gemm_built() {
#ifdef DST_WITH_CUTLASS
    return true;
#else
    return false;
#endif
}

#ifndef DST_WITH_CUTLASS
// A build without kernels/cutlass/ (no CUTLASS headers, or no sm_90 among the architectures): the
// queries of kernels/gemm_gelu.cuh answer false and the launchers refuse, so that code asking them
// (the backend above, the op tests) links and takes the cuBLASLt path.
namespace cuda {
bool gemm_gelu_shape_ok(dst_dtype, GemmGeluKind, int64_t, int64_t, int64_t) { return false; }
bool gemm_gelu_runs(dst_dtype, GemmGeluKind, int64_t, int64_t, int64_t, const void *const *, int) { return false; }
cudaError_t gemm_bias_gelu(cudaStream_t, dst_dtype, dst_gelu, const void *, const void *, const void *, void *, void *,
                           int64_t, int64_t, int64_t, int) {
    return cudaErrorNotSupported;
}
cudaError_t gemm_dgelu(cudaStream_t, dst_dtype, dst_gelu, const void *, const void *, const void *, void *, int64_t,
                       int64_t, int64_t, int, float *) {
    return cudaErrorNotSupported;
}
}  // namespace cuda
#endif

dst_status CudaBackend::dropout_residual_fwd(dst_dtype dt, const void *a, const void *residual, void *y,
                                             int64_t count, const DropoutSite &site) {
    DST_TRY(activate());
    DST_CUDA_CHECK(cuda::dropout_residual_fwd(stream_, dt, a, residual, y, count, site));
    return DST_OK;
}

dst_status CudaBackend::dropout_bwd(dst_dtype dt, const void *dy, void *dx, int64_t count,
                                    const DropoutSite &site) {
    DST_TRY(activate());
    DST_CUDA_CHECK(cuda::dropout_bwd(stream_, dt, dy, dx, count, site));
    return DST_OK;
}

dst_status CudaBackend::dropout_bwd_bias_grad(dst_dtype dt, const void *dy, void *dx, int64_t n, int64_t m,
                                              const DropoutSite &site, void *db, bool accumulate) {
    DST_TRY(activate());
    if (!db) return dropout_bwd(dt, dy, dx, n * m, site);
    void *ws = nullptr;
    DST_TRY(workspace(cuda::column_sum_workspace(dt, n, m), &ws));
    DST_CUDA_CHECK(cuda::dropout_bwd_bias_grad(stream_, dt, dy, dx, n, m, site, db, accumulate, ws));
    return DST_OK;
}

dst_status CudaBackend::add(dst_dtype dt, const void *a, const void *b, void *y, int64_t count) {
    DST_TRY(activate());
    DST_CUDA_CHECK(cuda::add(stream_, dt, a, b, y, count));
    return DST_OK;
}

// ---- training --------------------------------------------------------------------------------------

dst_status CudaBackend::optim_step(const optim::StepArgs &a) {
    DST_TRY(activate());
    DST_CUDA_CHECK(cuda::optim_step(stream_, a));
    return DST_OK;
}

dst_status CudaBackend::scale_by(dst_dtype dt, void *x, int64_t count, const float *factor, float mult) {
    DST_TRY(activate());
    DST_CUDA_CHECK(cuda::scale_by(stream_, dt, x, count, factor, mult));
    return DST_OK;
}

dst_status CudaBackend::convert(dst_dtype src_dt, const void *src, dst_dtype dst_dt, void *dst, int64_t count) {
    DST_TRY(activate());
    DST_CUDA_CHECK(cuda::convert(stream_, src_dt, src, dst_dt, dst, count));
    return DST_OK;
}

}  // namespace dst
