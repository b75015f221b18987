// Elementwise ops: GELU forward/backward (erf or tanh form, exact derivative of each), dropout with
// residual add, dropout backward, and add. Element e of a dropout site is kept iff
// philox_dropout_keep(seed, offset, e, threshold) (with a row map, e is the element's place in the padded
// layout: kernels/philox.h); kept values are scaled by 1/(1−p). Work is split
// over groups of 4 elements (one Philox block each); no reductions, so results never depend on
// the thread count. See docs/ops/gelu.md and docs/ops/dropout.md.
#include <algorithm>

#include "backend/cpu/convert.h"
#include "backend/cpu/cpu_backend.h"

namespace dst {
namespace {

using cpu::compute_t;
using cpu::load;
using cpu::store;

// Calls f(e, factor) for every element, factor = scale when kept, 0 when dropped, 1 when inactive. A
// dropped element is written as +0 (not x·0, which is −0 for negative x and NaN for NaN), as the CUDA
// kernels write it, so both backends give the same bits.
template <typename C, typename F>
void for_each_dropout(const DropoutSite &site, int64_t count, int nt, F &&f) {
    const int64_t groups = (count + 3) / 4;
    const C scale = C(site.scale);
    const uint64_t offset = site.offset_now();
#pragma omp parallel for num_threads(nt) schedule(static)
    for (int64_t g = 0; g < groups; ++g) {
        const int64_t e1 = std::min(count, 4 * g + 4);
        if (!site.active()) {
            for (int64_t e = 4 * g; e < e1; ++e) f(e, C(1));
            continue;
        }
        if (!site.rows) {
            const Philox4 r = philox_dropout_block(site.seed, offset, static_cast<uint64_t>(g));
            for (int64_t e = 4 * g; e < e1; ++e) f(e, r.v[e & 3] >= site.threshold ? scale : C(0));
            continue;
        }
        for (int64_t e = 4 * g; e < e1; ++e) {  // packed rows: the element's place in the padded layout
            const int64_t L = site.row_len;
            const uint64_t pe = static_cast<uint64_t>(site.rows[e / L]) * static_cast<uint64_t>(L) +
                                static_cast<uint64_t>(e % L);
            f(e, philox_dropout_keep(site.seed, offset, pe, site.threshold) ? scale : C(0));
        }
    }
}

}  // namespace

dst_status CpuBackend::gelu_fwd(dst_dtype dt, dst_gelu form, const void *u, void *g, int64_t count) {
    const int nt = num_threads();
    return cpu::dispatch(dt, "gelu_fwd", [&](auto tag) {
        using T = decltype(tag);
#pragma omp parallel for num_threads(nt) schedule(static)
        for (int64_t i = 0; i < count; ++i) store<T>(g, i, cpu::gelu_value(form, load<T>(u, i)));
        return DST_OK;
    });
}

dst_status CpuBackend::gelu_bwd(dst_dtype dt, dst_gelu form, const void *dg, const void *u, void *du,
                                int64_t count) {
    const int nt = num_threads();
    return cpu::dispatch(dt, "gelu_bwd", [&](auto tag) {
        using T = decltype(tag);
#pragma omp parallel for num_threads(nt) schedule(static)
        for (int64_t i = 0; i < count; ++i)
            store<T>(du, i, load<T>(dg, i) * cpu::gelu_grad(form, load<T>(u, i)));
        return DST_OK;
    });
}

dst_status CpuBackend::dropout_residual_fwd(dst_dtype dt, const void *a, const void *residual, void *y,
                                            int64_t count, const DropoutSite &site) {
    const int nt = num_threads();
    return cpu::dispatch(dt, "dropout_residual_fwd", [&](auto tag) {
        using T = decltype(tag);
        using C = compute_t<T>;
        for_each_dropout<C>(site, count, nt, [&](int64_t e, C f) {
            const C v = f != C(0) ? load<T>(a, e) * f : C(0);
            store<T>(y, e, residual ? load<T>(residual, e) + v : v);
        });
        return DST_OK;
    });
}

dst_status CpuBackend::dropout_bwd(dst_dtype dt, const void *dy, void *dx, int64_t count,
                                   const DropoutSite &site) {
    const int nt = num_threads();
    return cpu::dispatch(dt, "dropout_bwd", [&](auto tag) {
        using T = decltype(tag);
        using C = compute_t<T>;
        for_each_dropout<C>(site, count, nt, [&](int64_t e, C f) {
            store<T>(dx, e, f != C(0) ? load<T>(dy, e) * f : C(0));
        });
        return DST_OK;
    });
}

dst_status CpuBackend::add(dst_dtype dt, const void *a, const void *b, void *y, int64_t count) {
    const int nt = num_threads();
    return cpu::dispatch(dt, "add", [&](auto tag) {
        using T = decltype(tag);
#pragma omp parallel for num_threads(nt) schedule(static)
        for (int64_t i = 0; i < count; ++i) store<T>(y, i, load<T>(a, i) + load<T>(b, i));
        return DST_OK;
    });
}

}  // namespace dst
