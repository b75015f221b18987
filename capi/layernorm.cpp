// The extern "C" shims of the standalone LayerNorm (the final LN of a Pre-LN stack): argument checks,
// then the backend's layernorm_fwd / layernorm_bwd ops, which the layer itself uses.
#include <cmath>
#include <cstdint>

#include "backend/backend.h"  // defines: Backend
#include "capi/guard.h"       // defines: guarded
#include "capi/handles.h"     // defines: dst_context
#include "capi/tensor_view.h" // defines: views_overlap
#include "core/dtype.h"       // defines: dtype_size, stat_size, is_storage_dtype
#include "core/error.h"       // defines: set_error, DST_TRY

using dst::set_error;
using dst::capi::begin_context_call;
using dst::capi::guarded;
using dst::capi::views_overlap;

namespace {

struct Dims {
    int64_t n = 1, h = 0;
};

// Checks a tensor's pointer, ndim (1..4) and extents; returns N (leading dims) and H (last dim).
dst_status check_data(const char *fn, const char *arg, const dst_tensor *t, Dims *d) {
    if (!t) return set_error(DST_ERR_INVALID_ARGUMENT, "%s: %s is NULL", fn, arg);
    if (!t->data) return set_error(DST_ERR_INVALID_ARGUMENT, "%s: %s->data is NULL", fn, arg);
    if (t->ndim < 1 || t->ndim > DST_MAX_DIMS)
        return set_error(DST_ERR_INVALID_ARGUMENT, "%s: %s->ndim is %d, expected 1..%d", fn, arg, (int)t->ndim,
                         DST_MAX_DIMS);
    d->n = 1;
    for (int i = 0; i < t->ndim; ++i) {
        if (t->shape[i] < 1 || t->shape[i] > (int64_t(1) << 40))
            return set_error(DST_ERR_INVALID_ARGUMENT, "%s: %s->shape[%d] is %lld, expected 1..2^40", fn, arg, i,
                             (long long)t->shape[i]);
        if (i + 1 < t->ndim) d->n *= t->shape[i];
    }
    d->h = t->shape[t->ndim - 1];
    if (d->n > (int64_t(1) << 40))
        return set_error(DST_ERR_INVALID_ARGUMENT, "%s: %s has more than 2^40 rows", fn, arg);
    return DST_OK;
}

// `t` must have the dtype and exactly the shape of `like`.
dst_status check_same(const char *fn, const char *arg, const dst_tensor *t, const dst_tensor *like,
                      const char *like_name) {
    Dims d;
    DST_TRY(check_data(fn, arg, t, &d));
    bool same = t->dtype == like->dtype && t->ndim == like->ndim;
    for (int i = 0; same && i < t->ndim; ++i) same = t->shape[i] == like->shape[i];
    if (!same)
        return set_error(DST_ERR_INVALID_ARGUMENT, "%s: %s must have the dtype (%s) and shape of %s", fn, arg,
                         dst_dtype_string(like->dtype), like_name);
    return DST_OK;
}

// A vector [H] in dtype dt.
dst_status check_vector(const char *fn, const char *arg, const dst_tensor *t, dst_dtype dt, int64_t h) {
    Dims d;
    DST_TRY(check_data(fn, arg, t, &d));
    if (t->ndim != 1 || t->shape[0] != h || t->dtype != dt)
        return set_error(DST_ERR_INVALID_ARGUMENT, "%s: %s must be [%lld] of dtype %s", fn, arg, (long long)h,
                         dst_dtype_string(dt));
    return DST_OK;
}

// stats: [2, N] in the statistics dtype (fp64 for fp64 data, else fp32).
dst_status check_stats(const char *fn, const dst_tensor *t, dst_dtype dt, int64_t n) {
    Dims d;
    DST_TRY(check_data(fn, "stats", t, &d));
    const dst_dtype sdt = dt == DST_DTYPE_FP64 ? DST_DTYPE_FP64 : DST_DTYPE_FP32;
    if (t->ndim != 2 || t->shape[0] != 2 || t->shape[1] != n || t->dtype != sdt)
        return set_error(DST_ERR_INVALID_ARGUMENT, "%s: stats must be [2, %lld] of dtype %s", fn, (long long)n,
                         dst_dtype_string(sdt));
    return DST_OK;
}

// x: the data tensor that fixes dtype, N and H.
dst_status check_input(const char *fn, const char *arg, const dst_tensor *x, Dims *d) {
    DST_TRY(check_data(fn, arg, x, d));
    if (!dst::is_storage_dtype(x->dtype))
        return set_error(DST_ERR_INVALID_ARGUMENT, "%s: %s->dtype is %d, expected fp32, fp16, bf16 or fp64", fn, arg,
                         (int)x->dtype);
    return DST_OK;
}

}  // namespace

extern "C" {

dst_status dst_layernorm_forward(dst_context *ctx, const dst_tensor *x, const dst_tensor *gamma,
                                 const dst_tensor *beta, float eps, dst_tensor *y, dst_tensor *stats) {
    static const char fn[] = "dst_layernorm_forward";
    return guarded(fn, [&]() -> dst_status {
        DST_TRY(begin_context_call(fn, ctx));
        Dims d;
        DST_TRY(check_input(fn, "x", x, &d));
        DST_TRY(check_vector(fn, "gamma", gamma, x->dtype, d.h));
        DST_TRY(check_vector(fn, "beta", beta, x->dtype, d.h));
        if (!std::isfinite(eps) || !(eps > 0.0f))
            return set_error(DST_ERR_INVALID_ARGUMENT, "%s: eps is %g, expected a finite value > 0", fn, (double)eps);
        DST_TRY(check_same(fn, "y", y, x, "x"));
        if (views_overlap(x, y)) return set_error(DST_ERR_INVALID_ARGUMENT, "%s: y overlaps x", fn);
        void *mean = nullptr, *rstd = nullptr;
        if (stats) {
            DST_TRY(check_stats(fn, stats, x->dtype, d.n));
            if (views_overlap(stats, y) || views_overlap(stats, x))
                return set_error(DST_ERR_INVALID_ARGUMENT, "%s: stats overlaps x or y", fn);
            mean = stats->data;
            rstd = static_cast<char *>(stats->data) + static_cast<size_t>(d.n) * dst::stat_size(x->dtype);
        }
        return ctx->impl->backend->layernorm_fwd(x->dtype, x->data, gamma->data, beta->data, y->data, mean, rstd,
                                                 d.n, d.h, eps);
    });
}

dst_status dst_layernorm_backward(dst_context *ctx, const dst_tensor *dy, const dst_tensor *x,
                                  const dst_tensor *gamma, const dst_tensor *beta, const dst_tensor *stats,
                                  dst_tensor *dx, dst_tensor *dgamma, dst_tensor *dbeta, dst_grad_mode mode) {
    static const char fn[] = "dst_layernorm_backward";
    return guarded(fn, [&]() -> dst_status {
        DST_TRY(begin_context_call(fn, ctx));
        Dims d;
        DST_TRY(check_input(fn, "x", x, &d));
        DST_TRY(check_same(fn, "dy", dy, x, "x"));
        DST_TRY(check_vector(fn, "gamma", gamma, x->dtype, d.h));
        DST_TRY(check_vector(fn, "beta", beta, x->dtype, d.h));
        DST_TRY(check_stats(fn, stats, x->dtype, d.n));
        DST_TRY(check_same(fn, "dx", dx, x, "x"));
        DST_TRY(check_vector(fn, "dgamma", dgamma, x->dtype, d.h));
        DST_TRY(check_vector(fn, "dbeta", dbeta, x->dtype, d.h));
        if (views_overlap(dx, dy) || views_overlap(dx, x))
            return set_error(DST_ERR_INVALID_ARGUMENT, "%s: dx overlaps dy or x", fn);
        if (views_overlap(dgamma, dbeta))
            return set_error(DST_ERR_INVALID_ARGUMENT, "%s: dgamma overlaps dbeta", fn);
        if (mode != DST_GRAD_WRITE && mode != DST_GRAD_ACCUMULATE)
            return set_error(DST_ERR_INVALID_ARGUMENT, "%s: mode is %d, expected DST_GRAD_WRITE or DST_GRAD_ACCUMULATE",
                             fn, (int)mode);
        const void *mean = stats->data;
        const void *rstd =
            static_cast<const char *>(stats->data) + static_cast<size_t>(d.n) * dst::stat_size(x->dtype);
        // The γ/β reductions' scratch comes from the context's workspace (docs/api.md, "Memory of a context").
        dst::ScratchNeeds need;
        need.dt = x->dtype;
        need.rows = d.n;
        need.ln_width = d.h;
        dst::Backend &be = *ctx->impl->backend;
        const size_t scratch = be.scratch_bytes(need);
        char *ws = nullptr;
        if (scratch) DST_TRY(ctx->impl->ensure_workspace(scratch, &ws));
        be.set_scratch(ws, scratch);
        return ctx->impl->backend->layernorm_bwd(x->dtype, dy->data, x->data, false, gamma->data, beta->data, mean,
                                                 rstd, nullptr, dx->data, dgamma->data, dbeta->data, d.n, d.h,
                                                 mode == DST_GRAD_ACCUMULATE);
    });
}

}  // extern "C"
