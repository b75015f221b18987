// CUDA backend: the model ops of BERT pre-training (kernels/rows.cu, kernels/embedding.cu,
// kernels/cross_entropy.cu, tanh in kernels/elementwise.cu) and the fused linear + cross-entropy,
// whose GEMMs go through the backend's cuBLASLt routine.
//
// linear_cross_entropy, in stream order: gather the selected rows (when `rows` is given) → z[m, v] =
// h·Wᵀ in the compute type (cuBLASLt, D in fp32 for fp16/bf16) → bias, row lse/loss/argmax and the
// gradient g in the storage type (in place over z when storage = compute type) → the mean loss →
// dh = g·W (then scattered into dx, zero elsewhere) → dW (+)= gᵀ·h, db (+)= Σ g through
// linear_bwd_weight. Nothing [n, v] is formed: only the m selected rows get logits.
// Workspace layout: [GEMM workspace | column sums] first (the region gemm() and column_sum use),
// then the buffers of this op at 256-byte aligned offsets (cross_entropy_scratch).
#include <cstdint>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_check.h"
#include "core/error.h"
#include "kernels/bias.cuh"
#include "kernels/cross_entropy.cuh"
#include "kernels/elementwise.cuh"
#include "kernels/embedding.cuh"
#include "kernels/checks.cuh"
#include "kernels/rows.cuh"

namespace dst {

namespace {

size_t align256(size_t v) { return (v + 255) / 256 * 256; }
size_t esize(dst_dtype dt) { return dt == DST_DTYPE_FP64 ? 8 : dt == DST_DTYPE_FP32 ? 4 : 2; }
size_t csize(dst_dtype dt) { return dt == DST_DTYPE_FP64 ? 8 : 4; }
bool storage_is_compute(dst_dtype dt) { return dt == DST_DTYPE_FP32 || dt == DST_DTYPE_FP64; }

struct CeLayout {
    size_t hsel = 0, z = 0, g = 0, dh = 0, rows = 0, end = 0;
};

CeLayout ce_layout(dst_dtype dt, const CrossEntropyParams &p, size_t gemm_region) {
    CeLayout l;
    const bool grads = p.dx || p.dw || p.db;
    size_t o = align256(gemm_region);
    if (p.db) {
        const size_t cs = cuda::column_sum_workspace(dt, p.m, p.v);
        o = o > align256(cs) ? o : align256(cs);
    }
    l.hsel = o;
    if (p.rows) o += align256(static_cast<size_t>(p.m * p.h) * esize(dt));
    l.z = o;
    o += align256(static_cast<size_t>(p.m * p.v) * csize(dt));
    l.g = storage_is_compute(dt) ? l.z : o;
    if (grads && !storage_is_compute(dt)) o += align256(static_cast<size_t>(p.m * p.v) * esize(dt));
    l.dh = o;
    if (p.dx && p.rows) o += align256(static_cast<size_t>(p.m * p.h) * esize(dt));
    l.rows = o;
    o += align256(cuda::cross_entropy_workspace(dt, p.m));
    l.end = o;
    return l;
}

}  // namespace

size_t CudaBackend::cross_entropy_scratch(dst_dtype dt, const CrossEntropyParams &p, size_t gemm_region) {
    return ce_layout(dt, p, gemm_region).end;
}

dst_status CudaBackend::check_indices_deferred(const int32_t *idx, int64_t count, int32_t lo, int32_t hi,
                                               bool distinct, const char *what) {
    DST_TRY(activate());
    if (count <= 0) return DST_OK;
    uint32_t range_id = 0, repeat_id = 0;
    DST_TRY(note_check(CheckKind::Range, lo, hi - 1, what, "", &range_id));
    if (distinct) DST_TRY(note_check(CheckKind::Repeat, lo, hi - 1, what, "", &repeat_id));
    void *ws = nullptr;
    DST_TRY(workspace(cuda::check_indices_workspace(int64_t(hi) - lo, distinct), &ws));
    DST_CUDA_CHECK(cuda::check_indices_deferred(stream_, idx, count, lo, hi, distinct, ws, check_dev_, range_id,
                                                repeat_id));
    return DST_OK;
}

dst_status CudaBackend::check_indices(const int32_t *idx, int64_t count, int32_t lo, int32_t hi, bool distinct,
                                      int64_t *first_bad, int64_t *first_repeat) {
    DST_TRY(activate());
    *first_bad = -1;
    if (first_repeat) *first_repeat = -1;
    void *ws = nullptr;
    DST_TRY(workspace(cuda::check_indices_workspace(int64_t(hi) - lo, distinct), &ws));
    DST_CUDA_CHECK(cuda::check_indices(stream_, idx, count, lo, hi, distinct, ws));
    int32_t result[2] = {0, 0};
    DST_CUDA_CHECK(cudaMemcpyAsync(result, ws, sizeof result, cudaMemcpyDeviceToHost, stream_));
    DST_CUDA_CHECK(cudaStreamSynchronize(stream_));
    if (result[0] != INT32_MAX) *first_bad = result[0];
    else if (distinct && first_repeat && result[1] != INT32_MAX) *first_repeat = result[1];
    return DST_OK;
}

dst_status CudaBackend::embedding_fwd(dst_dtype dt, const int32_t *ids, const int32_t *types, const void *word,
                                      const void *pos, const void *type, void *out, int64_t B, int64_t S, int64_t H,
                                      int64_t V, int64_t T) {
    DST_TRY(activate());
    DST_CUDA_CHECK(cuda::embedding_fwd(stream_, dt, ids, types, word, pos, type, out, B, S, H, V, T));
    return DST_OK;
}

dst_status CudaBackend::embedding_bwd(dst_dtype dt, const void *dout, const int32_t *ids, const int32_t *types,
                                      void *dword, void *dpos, void *dtype, int64_t B, int64_t S, int64_t H,
                                      int64_t V, int64_t P, int64_t T, bool accumulate) {
    DST_TRY(activate());
    const size_t bytes = cuda::embedding_bwd_workspace(dt, B * S, dword ? V : 0, dtype ? T : 0, H);
    void *ws = nullptr;
    DST_TRY(workspace(bytes, &ws));
    DST_CUDA_CHECK(cuda::embedding_bwd(stream_, dt, dout, ids, types, dword, dpos, dtype, B, S, H, V, P, T,
                                       accumulate, ws, bytes));
    return DST_OK;
}

dst_status CudaBackend::packed_index(const int32_t *cu, int64_t B, int64_t S, int64_t N, int32_t *idx,
                                     int32_t *lens, const char *what) {
    DST_TRY(activate());
    uint32_t id = 0;
    DST_TRY(note_check(CheckKind::Offsets, 0, static_cast<int32_t>(S), what, "", &id));
    DST_CUDA_CHECK(cuda::check_offsets_deferred(stream_, cu, B, N, S, check_dev_, id));
    DST_CUDA_CHECK(cuda::packed_index(stream_, cu, B, S, N, idx, lens));
    return DST_OK;
}

dst_status CudaBackend::gather_rows(dst_dtype dt, const void *src, const int32_t *idx, void *dst, int64_t n,
                                    int64_t m, int64_t h) {
    DST_TRY(activate());
    DST_CUDA_CHECK(cuda::gather_rows(stream_, dt, src, idx, dst, n, m, h));
    return DST_OK;
}

dst_status CudaBackend::scatter_rows(dst_dtype dt, const void *src, const int32_t *idx, void *dst, int64_t n,
                                     int64_t m, int64_t h, bool accumulate) {
    DST_TRY(activate());
    DST_CUDA_CHECK(cuda::scatter_rows(stream_, dt, src, idx, dst, n, m, h, accumulate));
    return DST_OK;
}

dst_status CudaBackend::tanh_fwd(dst_dtype dt, const void *u, void *y, int64_t count) {
    DST_TRY(activate());
    DST_CUDA_CHECK(cuda::tanh_fwd(stream_, dt, u, y, count));
    return DST_OK;
}

dst_status CudaBackend::tanh_bwd(dst_dtype dt, const void *dy, const void *u, void *du, int64_t count) {
    DST_TRY(activate());
    DST_CUDA_CHECK(cuda::tanh_bwd(stream_, dt, dy, u, du, count));
    return DST_OK;
}

dst_status CudaBackend::linear_cross_entropy(dst_dtype dt, const CrossEntropyParams &p) {
    DST_TRY(activate());
    const CeLayout l = ce_layout(dt, p, gemm_workspace_bytes());
    char *ws = nullptr;
    DST_TRY(workspace(l.end, reinterpret_cast<void **>(&ws)));
    const void *h = p.x;
    if (p.rows) {
        DST_CUDA_CHECK(cuda::gather_rows(stream_, dt, p.x, p.rows, ws + l.hsel, p.n, p.m, p.h));
        h = ws + l.hsel;
    }
    // D[v, m] = (W as h×v)ᵀ · (h as h×m): z row-major [m, v], in the compute type.
    Gemm gz{CUBLAS_OP_T, CUBLAS_OP_N, p.v, p.m, p.h, p.w, p.h, 0, h, p.h, 0, ws + l.z, p.v, 0};
    gz.d_fp32 = dt == DST_DTYPE_FP16 || dt == DST_DTYPE_BF16;
    DST_TRY(gemm(dt, gz));
    const bool grads = p.dx || p.dw || p.db;
    void *g = grads ? ws + l.g : nullptr;
    DST_CUDA_CHECK(cuda::cross_entropy(stream_, dt, ws + l.z, p.b, p.labels, p.m, p.v, p.grad_scale, g, p.loss,
                                       p.counts, ws + l.rows));
    if (!grads) return DST_OK;
    if (p.dx) {
        void *dh = p.rows ? ws + l.dh : p.dx;
        DST_TRY(linear_bwd_data(dt, g, p.w, dh, p.m, p.h, p.v, nullptr));
        if (p.rows) DST_CUDA_CHECK(cuda::scatter_rows(stream_, dt, dh, p.rows, p.dx, p.n, p.m, p.h, false));
    }
    if (p.dw || p.db) DST_TRY(linear_bwd_weight(dt, g, h, p.dw, p.db, p.m, p.h, p.v, p.accumulate));
    return DST_OK;
}

}  // namespace dst
