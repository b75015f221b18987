// The extern "C" shims of the model ops of BERT pre-training (dstransformer.h, group modelops):
// argument checks (NULLs, dtypes, shapes, overlaps, modes), the index checks on the backend, the
// context's workspace for the backend's scratch (and the dense backward's du), then the backend's ops.
// Every check happens before the first write, so a refused call leaves every output as it was; with
// deferred index checks (dst_context_set_index_checks) the index values are the exception: a CUDA
// context checks them on the device after the call has returned, and a later call reports them.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <initializer_list>
#include <utility>

#include "backend/backend.h"  // defines: Backend, ScratchNeeds, CrossEntropyParams
#include "capi/guard.h"       // defines: guarded
#include "capi/handles.h"     // defines: dst_context
#include "capi/tensor_view.h" // defines: views_overlap, view_bytes
#include "core/dtype.h"       // defines: dtype_size, stat_size, is_storage_dtype
#include "core/error.h"       // defines: set_error, DST_TRY

using dst::set_error;
using dst::capi::begin_context_call;
using dst::capi::guarded;
using dst::capi::views_overlap;

namespace {

constexpr int64_t kMaxExtent = int64_t(1) << 40;
constexpr int64_t kMaxIndexCount = INT32_MAX;

// A tensor's pointer, ndim and extents (every extent 1..2^40); returns the element count.
dst_status check_view(const char *fn, const char *arg, const dst_tensor *t, int min_ndim, int max_ndim,
                      int64_t *numel) {
    if (!t) return set_error(DST_ERR_INVALID_ARGUMENT, "%s: %s is NULL", fn, arg);
    if (!t->data) return set_error(DST_ERR_INVALID_ARGUMENT, "%s: %s->data is NULL", fn, arg);
    if (t->ndim < min_ndim || t->ndim > max_ndim)
        return set_error(DST_ERR_INVALID_ARGUMENT, "%s: %s->ndim is %d, expected %d..%d", fn, arg, (int)t->ndim,
                         min_ndim, max_ndim);
    int64_t n = 1;
    for (int i = 0; i < t->ndim; ++i) {
        if (t->shape[i] < 1 || t->shape[i] > kMaxExtent)
            return set_error(DST_ERR_INVALID_ARGUMENT, "%s: %s->shape[%d] is %lld, expected 1..2^40", fn, arg, i,
                             (long long)t->shape[i]);
        n *= t->shape[i];
        if (n > kMaxExtent) return set_error(DST_ERR_INVALID_ARGUMENT, "%s: %s has more than 2^40 elements", fn, arg);
    }
    if (numel) *numel = n;
    return DST_OK;
}

// A float tensor of the storage dtypes.
dst_status check_float(const char *fn, const char *arg, const dst_tensor *t, int min_ndim, int max_ndim) {
    DST_TRY(check_view(fn, arg, t, min_ndim, max_ndim, nullptr));
    if (!dst::is_storage_dtype(t->dtype))
        return set_error(DST_ERR_INVALID_ARGUMENT, "%s: %s->dtype is %d, expected fp32, fp16, bf16 or fp64", fn, arg,
                         (int)t->dtype);
    return DST_OK;
}

// A matrix [rows, cols] (rows or cols < 0: any) of dtype dt.
dst_status check_matrix(const char *fn, const char *arg, const dst_tensor *t, dst_dtype dt, int64_t rows,
                        int64_t cols) {
    DST_TRY(check_view(fn, arg, t, 2, 2, nullptr));
    if (t->dtype != dt || (rows >= 0 && t->shape[0] != rows) || (cols >= 0 && t->shape[1] != cols))
        return set_error(DST_ERR_INVALID_ARGUMENT, "%s: %s is [%lld, %lld] of dtype %s, expected [%lld, %lld] of dtype %s",
                         fn, arg, (long long)t->shape[0], (long long)t->shape[1], dst_dtype_string(t->dtype),
                         (long long)rows, (long long)cols, dst_dtype_string(dt));
    return DST_OK;
}

// A vector [n] of dtype dt.
dst_status check_vector(const char *fn, const char *arg, const dst_tensor *t, dst_dtype dt, int64_t n) {
    DST_TRY(check_view(fn, arg, t, 1, 1, nullptr));
    if (t->dtype != dt || t->shape[0] != n)
        return set_error(DST_ERR_INVALID_ARGUMENT, "%s: %s must be [%lld] of dtype %s", fn, arg, (long long)n,
                         dst_dtype_string(dt));
    return DST_OK;
}

// `t` has exactly the dtype and shape of `like`.
dst_status check_like(const char *fn, const char *arg, const dst_tensor *t, const dst_tensor *like,
                      const char *like_name) {
    DST_TRY(check_view(fn, arg, t, 1, DST_MAX_DIMS, nullptr));
    bool same = t->dtype == like->dtype && t->ndim == like->ndim;
    for (int i = 0; same && i < t->ndim; ++i) same = t->shape[i] == like->shape[i];
    if (!same)
        return set_error(DST_ERR_INVALID_ARGUMENT, "%s: %s must have the dtype (%s) and shape of %s", fn, arg,
                         dst_dtype_string(like->dtype), like_name);
    return DST_OK;
}

// An int32 index tensor of `ndim` dims; returns its element count (≤ INT32_MAX).
dst_status check_index_tensor(const char *fn, const char *arg, const dst_tensor *t, int ndim, int64_t *count) {
    DST_TRY(check_view(fn, arg, t, ndim, ndim, count));
    if (t->dtype != DST_DTYPE_INT32)
        return set_error(DST_ERR_INVALID_ARGUMENT, "%s: %s->dtype is %s, expected int32", fn, arg,
                         dst_dtype_string(t->dtype));
    if (*count > kMaxIndexCount)
        return set_error(DST_ERR_INVALID_ARGUMENT, "%s: %s has more than 2^31 - 1 elements", fn, arg);
    return DST_OK;
}

dst_status check_mode(const char *fn, dst_grad_mode mode) {
    if (mode != DST_GRAD_WRITE && mode != DST_GRAD_ACCUMULATE)
        return set_error(DST_ERR_INVALID_ARGUMENT, "%s: mode is %d, expected DST_GRAD_WRITE or DST_GRAD_ACCUMULATE",
                         fn, (int)mode);
    return DST_OK;
}

// Refuses any overlap between an output and the other tensors (NULL entries are skipped).
dst_status check_no_overlap(const char *fn, const char *out_name, const dst_tensor *out,
                            std::initializer_list<std::pair<const char *, const dst_tensor *>> others) {
    if (!out) return DST_OK;
    for (const auto &o : others)
        if (o.second && o.second != out && views_overlap(out, o.second))
            return set_error(DST_ERR_INVALID_ARGUMENT, "%s: %s overlaps %s", fn, out_name, o.first);
    return DST_OK;
}

// The values of an index tensor, checked on the context's backend: every value in [lo, hi) (and
// distinct). Eager: the failure is this call's; deferred (dst_context_set_index_checks), a CUDA
// context queues the check and a later call reports it.
dst_status check_index_values(const char *fn, const char *arg, dst_context *ctx, const dst_tensor *t, int64_t count,
                              int32_t lo, int32_t hi, bool distinct) {
    char what[96];
    std::snprintf(what, sizeof what, "%s: %s", fn, arg);
    dst::Backend &be = *ctx->impl->backend;
    const int32_t *idx = static_cast<const int32_t *>(t->data);
    if (ctx->impl->deferred_index_checks) return be.check_indices_deferred(idx, count, lo, hi, distinct, what);
    // The eager check waits for the device, which would end the caller's capture: refused before
    // anything is queued (this is the call's first queued work), so the capture stays valid.
    if (be.capturing())
        return set_error(DST_ERR_UNSUPPORTED,
                         "%s: the stream is capturing a CUDA graph, and eager index checks wait for the device: "
                         "defer them (dst_context_set_index_checks, DST_INDEX_CHECKS_DEFERRED) to capture this call",
                         fn);
    return be.check_index_values(idx, count, lo, hi, distinct, what);
}

// The context's workspace: `own` bytes for the caller of the ops, then the backend's scratch for `need`.
dst_status take_workspace(dst_context *ctx, const dst::ScratchNeeds &need, size_t own, char **own_ptr) {
    dst::Backend &be = *ctx->impl->backend;
    own = (own + 255) / 256 * 256;
    const size_t scratch = be.scratch_bytes(need);
    char *ws = nullptr;
    if (own + scratch) DST_TRY(ctx->impl->ensure_workspace(own + scratch, &ws));
    be.set_scratch(scratch ? ws + own : nullptr, scratch);
    if (own_ptr) *own_ptr = ws;
    return DST_OK;
}

// Leading-dims product and last dim of a [..., K] tensor (already checked).
void rows_cols(const dst_tensor *t, int64_t *rows, int64_t *cols) {
    int64_t n = 1;
    for (int i = 0; i + 1 < t->ndim; ++i) n *= t->shape[i];
    *rows = n;
    *cols = t->shape[t->ndim - 1];
}

// `t` has the leading dims of `like` and the last extent `last`, dtype dt.
dst_status check_rows_of(const char *fn, const char *arg, const dst_tensor *t, const dst_tensor *like,
                         const char *like_name, int64_t last, dst_dtype dt) {
    DST_TRY(check_view(fn, arg, t, 1, DST_MAX_DIMS, nullptr));
    bool ok = t->dtype == dt && t->ndim == like->ndim && t->shape[t->ndim - 1] == last;
    for (int i = 0; ok && i + 1 < t->ndim; ++i) ok = t->shape[i] == like->shape[i];
    if (!ok)
        return set_error(DST_ERR_INVALID_ARGUMENT, "%s: %s must have the leading dims of %s, last dim %lld and dtype %s",
                         fn, arg, like_name, (long long)last, dst_dtype_string(dt));
    return DST_OK;
}

// A dense layer's x [..., K] (N rows) and W [M, K] of the dtype of x.
dst_status check_dense_xw(const char *fn, const dst_tensor *x, const dst_tensor *w, int64_t *n, int64_t *k,
                          int64_t *m) {
    DST_TRY(check_float(fn, "x", x, 1, DST_MAX_DIMS));
    rows_cols(x, n, k);
    DST_TRY(check_matrix(fn, "w", w, x->dtype, -1, *k));
    *m = w->shape[0];
    return DST_OK;
}

dst_status check_activation(const char *fn, dst_activation a) {
    if (a < DST_ACTIVATION_NONE || a > DST_ACTIVATION_TANH)
        return set_error(DST_ERR_INVALID_ARGUMENT, "%s: activation is %d, expected a dst_activation", fn, (int)a);
    return DST_OK;
}

// ids int32 [B, S] and types (NULL, or int32 of the same shape); their element counts.
dst_status check_ids_types(const char *fn, const dst_tensor *ids, const dst_tensor *types, int64_t *count,
                           int64_t *tcount) {
    DST_TRY(check_index_tensor(fn, "ids", ids, 2, count));
    if (!types) return DST_OK;
    DST_TRY(check_index_tensor(fn, "types", types, 2, tcount));
    if (types->shape[0] != ids->shape[0] || types->shape[1] != ids->shape[1])
        return set_error(DST_ERR_INVALID_ARGUMENT, "%s: types must have the shape of ids", fn);
    return DST_OK;
}

dst_gelu gelu_form(dst_activation a) { return a == DST_ACTIVATION_GELU_TANH ? DST_GELU_TANH : DST_GELU_ERF; }

size_t elems_bytes(int64_t n, dst_dtype dt) { return static_cast<size_t>(n) * dst::dtype_size(dt); }

// The dropout ops' shared checks: a float input of 1..4 dims, an output of its dtype and shape that is
// the input itself or disjoint from it, and p in [0, 1). Returns the element count.
dst_status check_dropout_args(const char *fn, const char *in_name, const dst_tensor *in, const char *out_name,
                              const dst_tensor *out, float p, int64_t *count) {
    DST_TRY(check_float(fn, in_name, in, 1, DST_MAX_DIMS));
    DST_TRY(check_view(fn, in_name, in, 1, DST_MAX_DIMS, count));
    DST_TRY(check_like(fn, out_name, out, in, in_name));
    if (out->data != in->data && views_overlap(out, in))
        return set_error(DST_ERR_INVALID_ARGUMENT, "%s: %s partly overlaps %s (it must be the same memory or disjoint)",
                         fn, out_name, in_name);
    if (!(p >= 0.0f && p < 1.0f))
        return set_error(DST_ERR_INVALID_ARGUMENT, "%s: p is %g, expected a value in [0, 1)", fn, (double)p);
    return DST_OK;
}

// The site of one dropout call: the layer's rule (docs/rng.md), threshold ⌈p·2³²⌉ and scale 1/(1 − p).
dst::DropoutSite dropout_site(uint64_t seed, uint64_t offset, float p) {
    dst::DropoutSite d;
    d.seed = seed;
    d.offset = offset;
    d.threshold = dst::dropout_threshold(static_cast<double>(p));
    d.scale = d.threshold ? 1.0 / (1.0 - static_cast<double>(p)) : 1.0;
    return d;
}

}  // namespace

extern "C" {

dst_status dst_embedding_forward(dst_context *ctx, const dst_tensor *ids, const dst_tensor *types,
                                 const dst_tensor *word, const dst_tensor *position, const dst_tensor *type,
                                 dst_tensor *out) {
    static const char fn[] = "dst_embedding_forward";
    return guarded(fn, [&]() -> dst_status {
        DST_TRY(begin_context_call(fn, ctx));
        int64_t count = 0, tcount = 0;
        DST_TRY(check_ids_types(fn, ids, types, &count, &tcount));
        const int64_t B = ids->shape[0], S = ids->shape[1];
        DST_TRY(check_float(fn, "word", word, 2, 2));
        const dst_dtype dt = word->dtype;
        const int64_t V = word->shape[0], H = word->shape[1];
        DST_TRY(check_matrix(fn, "position", position, dt, -1, H));
        if (position->shape[0] < S)
            return set_error(DST_ERR_INVALID_ARGUMENT, "%s: position has %lld rows, fewer than S = %lld", fn,
                             (long long)position->shape[0], (long long)S);
        DST_TRY(check_matrix(fn, "type", type, dt, -1, H));
        DST_TRY(check_view(fn, "out", out, 3, 3, nullptr));
        if (out->dtype != dt || out->shape[0] != B || out->shape[1] != S || out->shape[2] != H)
            return set_error(DST_ERR_INVALID_ARGUMENT, "%s: out must be [%lld, %lld, %lld] of dtype %s", fn,
                             (long long)B, (long long)S, (long long)H, dst_dtype_string(dt));
        DST_TRY(check_no_overlap(fn, "out", out,
                                 {{"ids", ids}, {"types", types}, {"word", word}, {"position", position}, {"type", type}}));
        if (V > INT32_MAX || type->shape[0] > INT32_MAX)
            return set_error(DST_ERR_INVALID_ARGUMENT, "%s: tables have more than 2^31 - 1 rows", fn);
        dst::Backend &be = *ctx->impl->backend;
        dst::ScratchNeeds need;
        need.dt = dt;
        need.index_check = true;
        DST_TRY(take_workspace(ctx, need, 0, nullptr));
        DST_TRY(check_index_values(fn, "ids", ctx, ids, count, 0, static_cast<int32_t>(V), false));
        if (types)
            DST_TRY(check_index_values(fn, "types", ctx, types, tcount, 0, static_cast<int32_t>(type->shape[0]), false));
        return be.embedding_fwd(dt, static_cast<const int32_t *>(ids->data),
                                types ? static_cast<const int32_t *>(types->data) : nullptr, word->data,
                                position->data, type->data, out->data, B, S, H, V, type->shape[0]);
    });
}

dst_status dst_embedding_backward(dst_context *ctx, const dst_tensor *dout, const dst_tensor *ids,
                                  const dst_tensor *types, dst_tensor *dword, dst_tensor *dposition,
                                  dst_tensor *dtype, dst_grad_mode mode) {
    static const char fn[] = "dst_embedding_backward";
    return guarded(fn, [&]() -> dst_status {
        DST_TRY(begin_context_call(fn, ctx));
        int64_t count = 0, tcount = 0;
        DST_TRY(check_ids_types(fn, ids, types, &count, &tcount));
        const int64_t B = ids->shape[0], S = ids->shape[1];
        DST_TRY(check_float(fn, "dout", dout, 3, 3));
        const dst_dtype dt = dout->dtype;
        const int64_t H = dout->shape[2];
        if (dout->shape[0] != B || dout->shape[1] != S)
            return set_error(DST_ERR_INVALID_ARGUMENT, "%s: dout must be [%lld, %lld, H] like ids", fn, (long long)B,
                             (long long)S);
        int64_t V = 0, P = 0, T = 0;
        if (dword) {
            DST_TRY(check_matrix(fn, "dword", dword, dt, -1, H));
            V = dword->shape[0];
        }
        if (dposition) {
            DST_TRY(check_matrix(fn, "dposition", dposition, dt, -1, H));
            P = dposition->shape[0];
            if (P < S)
                return set_error(DST_ERR_INVALID_ARGUMENT, "%s: dposition has %lld rows, fewer than S = %lld", fn,
                                 (long long)P, (long long)S);
        }
        if (dtype) {
            DST_TRY(check_matrix(fn, "dtype", dtype, dt, -1, H));
            T = dtype->shape[0];
        }
        if (V > INT32_MAX || T > 65535)
            return set_error(DST_ERR_INVALID_ARGUMENT, "%s: dword has more than 2^31 - 1 rows or dtype more than 65535",
                             fn);
        DST_TRY(check_mode(fn, mode));
        for (dst_tensor *o : {dword, dposition, dtype})
            DST_TRY(check_no_overlap(fn, o == dword ? "dword" : o == dposition ? "dposition" : "dtype", o,
                                     {{"dout", dout}, {"ids", ids}, {"types", types}, {"dword", dword},
                                      {"dposition", dposition}, {"dtype", dtype}}));
        dst::Backend &be = *ctx->impl->backend;
        dst::ScratchNeeds need;
        need.dt = dt;
        need.emb_tokens = B * S;
        need.emb_vocab = V;
        need.emb_types = dtype ? T : 0;
        need.emb_width = H;
        need.index_check = true;
        DST_TRY(take_workspace(ctx, need, 0, nullptr));
        if (dword) DST_TRY(check_index_values(fn, "ids", ctx, ids, count, 0, static_cast<int32_t>(V), false));
        if (dtype && types) DST_TRY(check_index_values(fn, "types", ctx, types, tcount, 0, static_cast<int32_t>(T), false));
        if (!dword && !dposition && !dtype) return DST_OK;
        return be.embedding_bwd(dt, dout->data, static_cast<const int32_t *>(ids->data),
                                types ? static_cast<const int32_t *>(types->data) : nullptr,
                                dword ? dword->data : nullptr, dposition ? dposition->data : nullptr,
                                dtype ? dtype->data : nullptr, B, S, H, V, P, T, mode == DST_GRAD_ACCUMULATE);
    });
}

dst_status dst_dense_forward(dst_context *ctx, const dst_tensor *x, const dst_tensor *w, const dst_tensor *b,
                             dst_activation activation, dst_tensor *y, dst_tensor *pre_act) {
    static const char fn[] = "dst_dense_forward";
    return guarded(fn, [&]() -> dst_status {
        DST_TRY(begin_context_call(fn, ctx));
        int64_t n = 0, k = 0, m = 0;
        DST_TRY(check_dense_xw(fn, x, w, &n, &k, &m));
        const dst_dtype dt = x->dtype;
        if (b) DST_TRY(check_vector(fn, "b", b, dt, m));
        DST_TRY(check_activation(fn, activation));
        DST_TRY(check_rows_of(fn, "y", y, x, "x", m, dt));
        if (pre_act) DST_TRY(check_like(fn, "pre_act", pre_act, y, "y"));
        DST_TRY(check_no_overlap(fn, "y", y, {{"x", x}, {"w", w}, {"b", b}, {"pre_act", pre_act}}));
        DST_TRY(check_no_overlap(fn, "pre_act", pre_act, {{"x", x}, {"w", w}, {"b", b}}));
        dst::Backend &be = *ctx->impl->backend;
        dst::ScratchNeeds need;
        need.dt = dt;
        need.gemm = true;
        DST_TRY(take_workspace(ctx, need, 0, nullptr));
        const void *bias = b ? b->data : nullptr;
        if (activation == DST_ACTIVATION_GELU_ERF || activation == DST_ACTIVATION_GELU_TANH) {
            const dst_gelu form = gelu_form(activation);
            return be.linear_fwd(dt, x->data, w->data, bias, y->data, n, k, m, &form,
                                 pre_act ? pre_act->data : nullptr);
        }
        if (activation == DST_ACTIVATION_TANH) {
            void *u = pre_act ? pre_act->data : y->data;
            DST_TRY(be.linear_fwd(dt, x->data, w->data, bias, u, n, k, m, nullptr, nullptr));
            return be.tanh_fwd(dt, u, y->data, n * m);
        }
        DST_TRY(be.linear_fwd(dt, x->data, w->data, bias, y->data, n, k, m, nullptr, nullptr));
        if (pre_act)
            DST_TRY(be.copy(pre_act->data, y->data, elems_bytes(n * m, dt), dst::CopyKind::DeviceToDevice));
        return DST_OK;
    });
}

dst_status dst_dense_backward(dst_context *ctx, const dst_tensor *dy, const dst_tensor *x, const dst_tensor *w,
                              const dst_tensor *pre_act, dst_activation activation, dst_tensor *dx, dst_tensor *dw,
                              dst_tensor *db, dst_grad_mode mode) {
    static const char fn[] = "dst_dense_backward";
    return guarded(fn, [&]() -> dst_status {
        DST_TRY(begin_context_call(fn, ctx));
        int64_t n = 0, k = 0, m = 0;
        DST_TRY(check_dense_xw(fn, x, w, &n, &k, &m));
        const dst_dtype dt = x->dtype;
        DST_TRY(check_rows_of(fn, "dy", dy, x, "x", m, dt));
        DST_TRY(check_activation(fn, activation));
        const bool act = activation != DST_ACTIVATION_NONE;
        if (act) {
            if (!pre_act)
                return set_error(DST_ERR_INVALID_ARGUMENT, "%s: pre_act is NULL, but the activation needs it", fn);
            DST_TRY(check_like(fn, "pre_act", pre_act, dy, "dy"));
        }
        if (dx) DST_TRY(check_like(fn, "dx", dx, x, "x"));
        if (dw) DST_TRY(check_like(fn, "dw", dw, w, "w"));
        if (db) DST_TRY(check_vector(fn, "db", db, dt, m));
        DST_TRY(check_mode(fn, mode));
        const dst_tensor *pa = act ? pre_act : nullptr;
        for (dst_tensor *o : {dx, dw, db})
            DST_TRY(check_no_overlap(fn, o == dx ? "dx" : o == dw ? "dw" : "db", o,
                                     {{"dy", dy}, {"x", x}, {"w", w}, {"pre_act", pa}, {"dx", dx}, {"dw", dw}, {"db", db}}));
        dst::Backend &be = *ctx->impl->backend;
        dst::ScratchNeeds need;
        need.dt = dt;
        need.gemm = true;
        need.rows = n;
        need.colsum_width = db ? m : 0;
        char *own = nullptr;
        DST_TRY(take_workspace(ctx, need, act ? elems_bytes(n * m, dt) : 0, &own));
        const void *du = dy->data;
        if (act) {
            if (activation == DST_ACTIVATION_TANH) DST_TRY(be.tanh_bwd(dt, dy->data, pre_act->data, own, n * m));
            else DST_TRY(be.gelu_bwd(dt, gelu_form(activation), dy->data, pre_act->data, own, n * m));
            du = own;
        }
        if (dx) DST_TRY(be.linear_bwd_data(dt, du, w->data, dx->data, n, k, m, nullptr));
        if (dw || db)
            DST_TRY(be.linear_bwd_weight(dt, du, x->data, dw ? dw->data : nullptr, db ? db->data : nullptr, n, k, m,
                                         mode == DST_GRAD_ACCUMULATE));
        return DST_OK;
    });
}

dst_status dst_gather_rows(dst_context *ctx, const dst_tensor *src, const dst_tensor *index, dst_tensor *dst) {
    static const char fn[] = "dst_gather_rows";
    return guarded(fn, [&]() -> dst_status {
        DST_TRY(begin_context_call(fn, ctx));
        DST_TRY(check_float(fn, "src", src, 2, 2));
        const dst_dtype dt = src->dtype;
        const int64_t N = src->shape[0], H = src->shape[1];
        int64_t M = 0;
        DST_TRY(check_index_tensor(fn, "index", index, 1, &M));
        DST_TRY(check_matrix(fn, "dst", dst, dt, M, H));
        DST_TRY(check_no_overlap(fn, "dst", dst, {{"src", src}, {"index", index}}));
        if (N > INT32_MAX) return set_error(DST_ERR_INVALID_ARGUMENT, "%s: src has more than 2^31 - 1 rows", fn);
        dst::Backend &be = *ctx->impl->backend;
        dst::ScratchNeeds need;
        need.dt = dt;
        need.index_check = true;
        DST_TRY(take_workspace(ctx, need, 0, nullptr));
        DST_TRY(check_index_values(fn, "index", ctx, index, M, 0, static_cast<int32_t>(N), false));
        return be.gather_rows(dt, src->data, static_cast<const int32_t *>(index->data), dst->data, N, M, H);
    });
}

dst_status dst_scatter_rows(dst_context *ctx, const dst_tensor *src, const dst_tensor *index, dst_tensor *dst,
                            dst_grad_mode mode) {
    static const char fn[] = "dst_scatter_rows";
    return guarded(fn, [&]() -> dst_status {
        DST_TRY(begin_context_call(fn, ctx));
        DST_TRY(check_float(fn, "src", src, 2, 2));
        const dst_dtype dt = src->dtype;
        const int64_t M = src->shape[0], H = src->shape[1];
        int64_t count = 0;
        DST_TRY(check_index_tensor(fn, "index", index, 1, &count));
        if (count != M)
            return set_error(DST_ERR_INVALID_ARGUMENT, "%s: index has %lld elements, src has %lld rows", fn,
                             (long long)count, (long long)M);
        DST_TRY(check_matrix(fn, "dst", dst, dt, -1, H));
        const int64_t N = dst->shape[0];
        DST_TRY(check_mode(fn, mode));
        DST_TRY(check_no_overlap(fn, "dst", dst, {{"src", src}, {"index", index}}));
        if (N > INT32_MAX) return set_error(DST_ERR_INVALID_ARGUMENT, "%s: dst has more than 2^31 - 1 rows", fn);
        dst::Backend &be = *ctx->impl->backend;
        dst::ScratchNeeds need;
        need.dt = dt;
        need.index_check = true;
        need.index_range = N;
        DST_TRY(take_workspace(ctx, need, 0, nullptr));
        DST_TRY(check_index_values(fn, "index", ctx, index, M, 0, static_cast<int32_t>(N), true));
        return be.scatter_rows(dt, src->data, static_cast<const int32_t *>(index->data), dst->data, N, M, H,
                               mode == DST_GRAD_ACCUMULATE);
    });
}

dst_status dst_linear_cross_entropy(dst_context *ctx, const dst_tensor *x, const dst_tensor *rows,
                                    const dst_tensor *w, const dst_tensor *b, const dst_tensor *labels,
                                    float grad_scale, dst_tensor *loss, dst_tensor *counts, dst_tensor *dx,
                                    dst_tensor *dw, dst_tensor *db, dst_grad_mode mode) {
    static const char fn[] = "dst_linear_cross_entropy";
    return guarded(fn, [&]() -> dst_status {
        DST_TRY(begin_context_call(fn, ctx));
        DST_TRY(check_float(fn, "x", x, 2, 2));
        const dst_dtype dt = x->dtype;
        const int64_t N = x->shape[0], H = x->shape[1];
        int64_t M = N;
        if (rows) DST_TRY(check_index_tensor(fn, "rows", rows, 1, &M));
        if (N > INT32_MAX) return set_error(DST_ERR_INVALID_ARGUMENT, "%s: x has more than 2^31 - 1 rows", fn);
        DST_TRY(check_matrix(fn, "w", w, dt, -1, H));
        const int64_t V = w->shape[0];
        if (V > INT32_MAX) return set_error(DST_ERR_INVALID_ARGUMENT, "%s: w has more than 2^31 - 1 rows", fn);
        if (b) DST_TRY(check_vector(fn, "b", b, dt, V));
        int64_t nlabels = 0;
        DST_TRY(check_index_tensor(fn, "labels", labels, 1, &nlabels));
        if (nlabels != M)
            return set_error(DST_ERR_INVALID_ARGUMENT, "%s: labels has %lld elements, expected %lld (one per row)", fn,
                             (long long)nlabels, (long long)M);
        if (!std::isfinite(grad_scale))
            return set_error(DST_ERR_INVALID_ARGUMENT, "%s: grad_scale is %g, expected a finite value", fn,
                             (double)grad_scale);
        const dst_dtype sdt = dt == DST_DTYPE_FP64 ? DST_DTYPE_FP64 : DST_DTYPE_FP32;
        DST_TRY(check_vector(fn, "loss", loss, sdt, 1));
        if (counts) DST_TRY(check_vector(fn, "counts", counts, DST_DTYPE_INT32, 2));
        if (dx) DST_TRY(check_like(fn, "dx", dx, x, "x"));
        if (dw) DST_TRY(check_like(fn, "dw", dw, w, "w"));
        if (db) {
            if (!b) return set_error(DST_ERR_INVALID_ARGUMENT, "%s: db is given but b is NULL", fn);
            DST_TRY(check_like(fn, "db", db, b, "b"));
        }
        DST_TRY(check_mode(fn, mode));
        const std::initializer_list<std::pair<const char *, const dst_tensor *>> all = {
            {"x", x}, {"rows", rows}, {"w", w}, {"b", b}, {"labels", labels}, {"loss", loss},
            {"counts", counts}, {"dx", dx}, {"dw", dw}, {"db", db}};
        for (const dst_tensor *o : {static_cast<const dst_tensor *>(loss), static_cast<const dst_tensor *>(counts),
                                    static_cast<const dst_tensor *>(dx), static_cast<const dst_tensor *>(dw),
                                    static_cast<const dst_tensor *>(db)})
            DST_TRY(check_no_overlap(fn,
                                     o == loss ? "loss" : o == counts ? "counts" : o == dx ? "dx" : o == dw ? "dw" : "db",
                                     o, all));
        dst::Backend &be = *ctx->impl->backend;
        dst::CrossEntropyParams p;
        p.x = x->data;
        p.rows = rows ? static_cast<const int32_t *>(rows->data) : nullptr;
        p.w = w->data;
        p.b = b ? b->data : nullptr;
        p.labels = static_cast<const int32_t *>(labels->data);
        p.grad_scale = grad_scale;
        p.loss = loss->data;
        p.counts = counts ? static_cast<int32_t *>(counts->data) : nullptr;
        p.dx = dx ? dx->data : nullptr;
        p.dw = dw ? dw->data : nullptr;
        p.db = db ? db->data : nullptr;
        p.n = N;
        p.m = M;
        p.v = V;
        p.h = H;
        p.accumulate = mode == DST_GRAD_ACCUMULATE;
        dst::ScratchNeeds need;
        need.dt = dt;
        need.gemm = true;
        need.index_check = true;
        need.index_range = rows ? N : 0;
        need.cross_entropy = true;
        need.ce = p;
        DST_TRY(take_workspace(ctx, need, 0, nullptr));
        if (rows) DST_TRY(check_index_values(fn, "rows", ctx, rows, M, 0, static_cast<int32_t>(N), true));
        DST_TRY(check_index_values(fn, "labels", ctx, labels, M, -1, static_cast<int32_t>(V), false));
        return be.linear_cross_entropy(dt, p);
    });
}


dst_status dst_dropout_forward(dst_context *ctx, const dst_tensor *x, float p, dst_tensor *y, uint64_t *seed,
                               uint64_t *offset) {
    static const char fn[] = "dst_dropout_forward";
    return guarded(fn, [&]() -> dst_status {
        DST_TRY(begin_context_call(fn, ctx));
        int64_t count = 0;
        DST_TRY(check_dropout_args(fn, "x", x, "y", y, p, &count));
        dst::Context &c = *ctx->impl;
        if (p > 0.0f && c.backend->capturing())
            return set_error(DST_ERR_UNSUPPORTED,
                             "%s: the stream is capturing a CUDA graph; the call's RNG offset is taken on the host, so "
                             "every replay would drop the same elements (capture with p = 0, or call it eagerly)", fn);
        if (c.rng_offset == UINT64_MAX)
            return set_error(DST_ERR_STATE,
                             "%s: the context's RNG offset is 2^64 - 1; the dropout stream of this seed is exhausted: "
                             "start a new one with dst_context_set_rng_state", fn);
        const uint64_t s = c.rng_seed, off = c.rng_offset;
        // The backend's dropout backward is the same elementwise map, y = x·keep·scale.
        DST_TRY(c.backend->dropout_bwd(x->dtype, x->data, y->data, count, dropout_site(s, off, p)));
        c.take_offsets(1);
        if (seed) *seed = s;
        if (offset) *offset = off;
        return DST_OK;
    });
}

dst_status dst_dropout_backward(dst_context *ctx, const dst_tensor *dy, float p, uint64_t seed, uint64_t offset,
                                dst_tensor *dx) {
    static const char fn[] = "dst_dropout_backward";
    return guarded(fn, [&]() -> dst_status {
        DST_TRY(begin_context_call(fn, ctx));
        int64_t count = 0;
        DST_TRY(check_dropout_args(fn, "dy", dy, "dx", dx, p, &count));
        return ctx->impl->backend->dropout_bwd(dy->dtype, dy->data, dx->data, count, dropout_site(seed, offset, p));
    });
}

dst_status dst_model_op_workspace_bytes(dst_model_op op, dst_dtype dtype, int64_t n, int64_t k, int64_t m, int64_t h,
                                        size_t *bytes) {
    static const char fn[] = "dst_model_op_workspace_bytes";
    return guarded(fn, [&]() -> dst_status {
        if (!bytes) return set_error(DST_ERR_INVALID_ARGUMENT, "%s: bytes is NULL", fn);
        if (!dst::is_storage_dtype(dtype))
            return set_error(DST_ERR_INVALID_ARGUMENT, "%s: dtype is %d, expected fp32, fp16, bf16 or fp64", fn,
                             (int)dtype);
        if (n < 0 || k < 0 || m < 0 || h < 0 || n > kMaxExtent || k > kMaxExtent || m > kMaxExtent || h > kMaxExtent)
            return set_error(DST_ERR_INVALID_ARGUMENT, "%s: sizes must be in 0..2^40", fn);
        dst::ScratchNeeds need;
        need.dt = dtype;
        size_t own = 0;
        switch (op) {
            case DST_MODEL_OP_EMBEDDING_BACKWARD:
                need.emb_tokens = n;
                need.emb_vocab = k;
                need.emb_types = h;
                need.emb_width = m;
                need.index_check = true;
                break;
            case DST_MODEL_OP_DENSE:
                need.gemm = true;
                need.rows = n;
                need.colsum_width = m;
                own = (elems_bytes(n * m, dtype) + 255) / 256 * 256;
                break;
            case DST_MODEL_OP_SCATTER_ROWS:
                need.index_check = true;
                need.index_range = n;
                break;
            case DST_MODEL_OP_LINEAR_CROSS_ENTROPY:
                need.gemm = true;
                need.index_check = true;
                need.index_range = n;
                need.cross_entropy = true;
                need.ce.n = n;
                need.ce.m = k;
                need.ce.v = m;
                need.ce.h = h;
                need.ce.rows = reinterpret_cast<const int32_t *>(1);  // the worst case: selected rows, all grads
                need.ce.dx = need.ce.dw = need.ce.db = reinterpret_cast<void *>(1);
                need.ce.b = reinterpret_cast<const void *>(1);
                break;
            default:
                return set_error(DST_ERR_INVALID_ARGUMENT, "%s: op is %d, expected a dst_model_op", fn, (int)op);
        }
        *bytes = own + dst::cuda_scratch_bytes(need);
        return DST_OK;
    });
}

}  // extern "C"
