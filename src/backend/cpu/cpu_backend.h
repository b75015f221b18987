// The CPU reference backend: host memory, CBLAS (OpenBLAS) GEMMs and OpenMP loops. Every op is
// deterministic: parallel loops split over independent rows or columns, and every sum runs in a
// fixed order that does not depend on the thread count. Internal header; users get the backend
// through make_cpu_backend().
#ifndef DST_BACKEND_CPU_CPU_BACKEND_H
#define DST_BACKEND_CPU_CPU_BACKEND_H

#include <cmath>

#include "backend/backend.h"
#include "kernels/philox.h"

namespace dst {

class CpuBackend final : public Backend {
public:
    dst_backend kind() const override { return DST_BACKEND_CPU; }

    dst_status alloc(size_t bytes, void **ptr) override;
    void free(void *ptr) override;
    dst_status zero(void *ptr, size_t bytes) override;
    dst_status copy(void *dst, const void *src, size_t bytes, CopyKind kind) override;
    dst_status synchronize() override { return DST_OK; }
    void set_num_threads(int threads) override { threads_ = threads > 0 ? threads : 0; }
    int num_threads() const override;

    dst_status linear_fwd_add(dst_dtype dt, const void *x, const void *w, const void *b, const void *add, void *y,
                              int64_t n, int64_t k, int64_t m) override;
    dst_status linear_fwd(dst_dtype dt, const void *x, const void *w, const void *b, void *y, int64_t n,
                          int64_t k, int64_t m, const dst_gelu *gelu, void *pre_act) override;
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
    dst_status all_nonzero(dst_dtype dt, const void *x, int64_t count, bool *all_nonzero) override;

    dst_status gelu_fwd(dst_dtype dt, dst_gelu form, const void *u, void *g, int64_t count) override;
    dst_status gelu_bwd(dst_dtype dt, dst_gelu form, const void *dg, const void *u, void *du,
                        int64_t count) override;
    dst_status dropout_residual_fwd(dst_dtype dt, const void *a, const void *residual, void *y,
                                    int64_t count, const DropoutSite &site) override;
    dst_status rng_take(uint32_t *counter, uint32_t *slot) override {
        *slot = *counter;
        *counter = *slot + 1u;
        return DST_OK;
    }
    dst_status dropout_bwd(dst_dtype dt, const void *dy, void *dx, int64_t count,
                           const DropoutSite &site) override;
    dst_status add(dst_dtype dt, const void *a, const void *b, void *y, int64_t count) override;

    dst_status attention_fwd(dst_dtype dt, const AttentionParams &p, const void *qkv, void *ctx,
                             void *lse) override;
    dst_status attention_bwd(dst_dtype dt, const AttentionParams &p, const void *qkv, const void *ctx,
                             const void *dctx, const void *lse,
                             void *dqkv) override;

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

private:
    int threads_ = 0;  // 0: OpenMP's default
};

namespace cpu {

// Keep decisions of one dropout site, drawing one Philox block per group of 4 elements; equal to
// philox_dropout_keep element by element. Cheapest when elements are visited in increasing order.
class DropoutStream {
public:
    explicit DropoutStream(const DropoutSite &site) : site_(site), offset_(site.offset_now()) {}
    bool keep(uint64_t e) {
        if (!site_.active()) return true;
        if ((e >> 2) != group_ || !valid_) {
            group_ = e >> 2;
            valid_ = true;
            block_ = philox_dropout_block(site_.seed, offset_, group_);
        }
        return block_.v[e & 3] >= site_.threshold;
    }

private:
    const DropoutSite &site_;
    uint64_t offset_;  // the site's, read once (DropoutSite::offset_hi)
    uint64_t group_ = 0;
    bool valid_ = false;
    Philox4 block_{};
};

// GELU(x) in the given form, and its exact derivative:
//   erf:  0.5·x·(1+erf(x/√2)),              ' = Φ(x) + x·φ(x);
//   tanh: 0.5·x·(1+tanh(a(x+0.044715x³))), ' = 0.5(1+t) + 0.5·x·(1−t²)·a(1+3·0.044715x²), a = √(2/π).
template <typename C>
inline C gelu_value(dst_gelu form, C x) {
    if (form == DST_GELU_TANH) {
        const C a = C(0.7978845608028654);
        return C(0.5) * x * (C(1) + std::tanh(a * (x + C(0.044715) * x * x * x)));
    }
    return C(0.5) * x * (C(1) + std::erf(x * C(0.7071067811865476)));
}

template <typename C>
inline C gelu_grad(dst_gelu form, C x) {
    if (form == DST_GELU_TANH) {
        const C a = C(0.7978845608028654), c = C(0.044715);
        const C t = std::tanh(a * (x + c * x * x * x));
        return C(0.5) * (C(1) + t) + C(0.5) * x * (C(1) - t * t) * a * (C(1) + C(3) * c * x * x);
    }
    const C cdf = C(0.5) * (C(1) + std::erf(x * C(0.7071067811865476)));
    const C pdf = std::exp(C(-0.5) * x * x) * C(0.3989422804014327);  // 1/√(2π)
    return cdf + x * pdf;
}

}  // namespace cpu
}  // namespace dst

#endif  // DST_BACKEND_CPU_CPU_BACKEND_H
