// Defaults shared by every backend, and the device count of builds without CUDA.
#include "backend/backend.h"

#include <vector>

#include "core/error.h"  // defines: set_error

namespace dst {

dst_status Backend::set_stream(void *stream) {
    if (stream)
        return set_error(DST_ERR_INVALID_ARGUMENT, "stream is not NULL, but this backend has no streams");
    return DST_OK;
}

// The immediate form of the deferred checks: the values are read now (a copy, which on a device
// backend waits for it) and a failure is returned by this call.
dst_status Backend::check_range_deferred(const int32_t *v, int64_t count, int32_t lo, int32_t hi, const char *what,
                                         const char *detail) {
    if (count <= 0) return DST_OK;
    std::vector<int32_t> host(static_cast<size_t>(count));
    DST_TRY(copy(host.data(), v, host.size() * sizeof(int32_t), CopyKind::DeviceToHost));
    for (int64_t i = 0; i < count; ++i)
        if (host[i] < lo || host[i] > hi)
            return set_error(DST_ERR_INVALID_ARGUMENT, "%s value %d at index %lld is outside %d..%d%s", what,
                             (int)host[i], (long long)i, (int)lo, (int)hi, detail);
    return DST_OK;
}

dst_status Backend::check_index_values(const int32_t *idx, int64_t count, int32_t lo, int32_t hi, bool distinct,
                                       const char *what) {
    int64_t bad = -1, repeat = -1;
    DST_TRY(check_indices(idx, count, lo, hi, distinct, &bad, distinct ? &repeat : nullptr));
    const int64_t at = bad >= 0 ? bad : repeat;
    if (at < 0) return DST_OK;
    int32_t value = 0;
    DST_TRY(copy(&value, idx + at, sizeof value, CopyKind::DeviceToHost));
    if (bad >= 0)
        return set_error(DST_ERR_INVALID_ARGUMENT, "%s[%lld] is %d, expected a value in [%d, %d)", what,
                         (long long)bad, (int)value, (int)lo, (int)hi);
    return set_error(DST_ERR_INVALID_ARGUMENT, "%s[%lld] is %d, which occurs more than once (must be distinct)", what,
                     (long long)repeat, (int)value);
}

dst_status Backend::check_nonzero_deferred(dst_dtype dt, const void *x, int64_t count, const char *what,
                                           const char *detail) {
    bool ok = true;
    DST_TRY(all_nonzero(dt, x, count, &ok));
    if (!ok) return set_error(DST_ERR_INVALID_ARGUMENT, "%s has a zero element%s", what, detail);
    return DST_OK;
}

dst_status Backend::dropout_residual_layernorm_fwd(dst_dtype dt, const void *a, const void *residual, void *z,
                                                   const void *gamma, const void *beta, void *y, void *mean,
                                                   void *rstd, int64_t n, int64_t h, double eps,
                                                   const DropoutSite &site) {
    DST_TRY(dropout_residual_fwd(dt, a, residual, z, n * h, site));
    return layernorm_fwd(dt, z, gamma, beta, y, mean, rstd, n, h, eps);
}

dst_status Backend::gelu_bwd_bias_grad(dst_dtype dt, dst_gelu form, const void *dg, const void *u, void *du,
                                       int64_t n, int64_t m, void *db, bool accumulate) {
    DST_TRY(gelu_bwd(dt, form, dg, u, du, n * m));
    return linear_bwd_weight(dt, du, nullptr, nullptr, db, n, 0, m, accumulate);
}

dst_status Backend::linear_fwd_add(dst_dtype dt, const void *x, const void *w, const void *b, const void *add,
                                   void *y, int64_t n, int64_t k, int64_t m) {
    DST_TRY(linear_fwd(dt, x, w, b, y, n, k, m, nullptr, nullptr));
    return dropout_residual_fwd(dt, y, add, y, n * m, DropoutSite{});
}

dst_status Backend::dropout_bwd_bias_grad(dst_dtype dt, const void *dy, void *dx, int64_t n, int64_t m,
                                          const DropoutSite &site, void *db, bool accumulate) {
    DST_TRY(dropout_bwd(dt, dy, dx, n * m, site));
    return db ? linear_bwd_weight(dt, dx, nullptr, nullptr, db, n, 0, m, accumulate) : DST_OK;
}

dst_status Backend::layernorm_dropout_bwd_bias_grad(dst_dtype dt, const void *dy, const void *xy, bool invertible,
                                                    const void *gamma, const void *beta, const void *mean,
                                                    const void *rstd, const void *dresid, void *dx, void *dgamma,
                                                    void *dbeta, int64_t n, int64_t h, bool accumulate,
                                                    const DropoutSite &site, void *branch, void *branch_db) {
    DST_TRY(layernorm_dropout_bwd(dt, dy, xy, invertible, gamma, beta, mean, rstd, dresid, dx, dgamma, dbeta, n, h,
                                  accumulate, site, branch));
    return branch_db ? linear_bwd_weight(dt, branch, nullptr, nullptr, branch_db, n, 0, h, accumulate) : DST_OK;
}

dst_status Backend::linear_bwd_data_gelu(dst_dtype dt, dst_gelu form, const void *dy, const void *w, const void *u,
                                         void *dg, void *du, int64_t n, int64_t k, int64_t m, void *db,
                                         bool accumulate) {
    DST_TRY(linear_bwd_data(dt, dy, w, dg, n, k, m, nullptr));
    return gelu_bwd_bias_grad(dt, form, dg, u, du, n, k, db, accumulate);
}

#if !defined(DST_WITH_CUDA)
dst_status cuda_device_count(int *count) {
    *count = 0;
    return DST_OK;
}

size_t cuda_scratch_bytes(const ScratchNeeds &n) {
    (void)n;
    return 0;
}
#endif

}  // namespace dst
