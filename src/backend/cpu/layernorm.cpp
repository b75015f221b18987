// LayerNorm over rows of length h (population variance), its backward, and the γ ≠ 0 check.
//   forward:  mean = Σx/h, var = Σ(x−mean)²/h, rstd = 1/√(var+ε), y = γ·x̂ + β, x̂ = (x−mean)·rstd;
//   backward: x̂ from x (or from y: x̂ = (y−β)/γ when invertible), g = γ·dy,
//             dx = rstd·(g − mean(g) − x̂·mean(g·x̂)) + dresid, dγ = Σ_rows dy·x̂, dβ = Σ_rows dy.
// Rows run in parallel, each summed sequentially; dγ/dβ are column sums over blocks of 64 columns,
// rows in order. Stats are compute_t (double for fp64 layers, float otherwise). See docs/ops/layernorm.md.
#include <algorithm>
#include <cmath>

#include "backend/cpu/convert.h"
#include "backend/cpu/cpu_backend.h"

namespace dst {
namespace {

using cpu::compute_t;
using cpu::load;
using cpu::store;

template <typename T>
dst_status layernorm_fwd_t(const void *x, const void *gamma, const void *beta, void *y, void *mean,
                           void *rstd, int64_t n, int64_t h, double eps, int nt) {
    using C = compute_t<T>;
#pragma omp parallel for num_threads(nt) schedule(static)
    for (int64_t r = 0; r < n; ++r) {
        const int64_t o = r * h;
        C s = 0;
        for (int64_t j = 0; j < h; ++j) s += load<T>(x, o + j);
        const C mu = s / C(h);
        C v = 0;
        for (int64_t j = 0; j < h; ++j) {
            const C d = load<T>(x, o + j) - mu;
            v += d * d;
        }
        const C rs = C(1) / std::sqrt(v / C(h) + C(eps));
        for (int64_t j = 0; j < h; ++j)
            store<T>(y, o + j, load<T>(gamma, j) * ((load<T>(x, o + j) - mu) * rs) + load<T>(beta, j));
        if (mean) static_cast<C *>(mean)[r] = mu;
        if (rstd) static_cast<C *>(rstd)[r] = rs;
    }
    return DST_OK;
}

// x̂ of element (r, j), from the input or (invertible) from the output.
template <typename T>
inline compute_t<T> xhat(const void *xy, bool invertible, const void *gamma, const void *beta,
                         const void *mean, const void *rstd, int64_t r, int64_t j, int64_t h) {
    using C = compute_t<T>;
    const C v = load<T>(xy, r * h + j);
    if (invertible) return (v - load<T>(beta, j)) / load<T>(gamma, j);
    return (v - static_cast<const C *>(mean)[r]) * static_cast<const C *>(rstd)[r];
}

template <typename T>
dst_status layernorm_bwd_t(const void *dy, const void *xy, bool inv, const void *gamma,
                           const void *beta, const void *mean, const void *rstd, const void *dresid,
                           void *dx, void *dgamma, void *dbeta, int64_t n, int64_t h, bool accumulate,
                           int nt, const DropoutSite *site, void *branch) {
    using C = compute_t<T>;
    // Column sums first, so that dx may overwrite dy or dresid.
    if (dgamma || dbeta) {
        const int64_t blocks = (h + 63) / 64;
#pragma omp parallel for num_threads(nt) schedule(static)
        for (int64_t blk = 0; blk < blocks; ++blk) {
            C ag[64] = {}, ab[64] = {};
            const int64_t j0 = blk * 64, j1 = std::min(h, j0 + 64);
            for (int64_t r = 0; r < n; ++r) {
                for (int64_t j = j0; j < j1; ++j) {
                    const C d = load<T>(dy, r * h + j);
                    if (dgamma) ag[j - j0] += d * xhat<T>(xy, inv, gamma, beta, mean, rstd, r, j, h);
                    ab[j - j0] += d;
                }
            }
            for (int64_t j = j0; j < j1; ++j) {
                if (dgamma) store<T>(dgamma, j, accumulate ? load<T>(dgamma, j) + ag[j - j0] : ag[j - j0]);
                if (dbeta) store<T>(dbeta, j, accumulate ? load<T>(dbeta, j) + ab[j - j0] : ab[j - j0]);
            }
        }
    }
    if (dx) {
#pragma omp parallel for num_threads(nt) schedule(static)
        for (int64_t r = 0; r < n; ++r) {
            const int64_t o = r * h;
            C sg = 0, sgx = 0;
            for (int64_t j = 0; j < h; ++j) {
                const C g = load<T>(gamma, j) * load<T>(dy, o + j);
                sg += g;
                sgx += g * xhat<T>(xy, inv, gamma, beta, mean, rstd, r, j, h);
            }
            const C mg = sg / C(h), mgx = sgx / C(h);
            const C rs = static_cast<const C *>(rstd)[r];
            for (int64_t j = 0; j < h; ++j) {
                const C g = load<T>(gamma, j) * load<T>(dy, o + j);
                C d = rs * (g - mg - xhat<T>(xy, inv, gamma, beta, mean, rstd, r, j, h) * mgx);
                if (dresid) d += load<T>(dresid, o + j);
                if (branch) {  // dropout'(d) before d is rounded
                    C b = d;
                    if (site->active()) {
                        const uint64_t pe = static_cast<uint64_t>(site->rows ? site->rows[r] : r) *
                                                static_cast<uint64_t>(h) + static_cast<uint64_t>(j);
                        b = philox_dropout_keep(site->seed, site->offset_now(), pe, site->threshold)
                                ? d * C(site->scale)
                                : C(0);
                    }
                    store<T>(branch, o + j, b);
                }
                store<T>(dx, o + j, d);
            }
        }
    }
    return DST_OK;
}

}  // namespace

dst_status CpuBackend::layernorm_fwd(dst_dtype dt, const void *x, const void *gamma, const void *beta,
                                     void *y, void *mean, void *rstd, int64_t n, int64_t h, double eps) {
    const int nt = num_threads();
    return cpu::dispatch(dt, "layernorm_fwd", [&](auto tag) {
        return layernorm_fwd_t<decltype(tag)>(x, gamma, beta, y, mean, rstd, n, h, eps, nt);
    });
}

dst_status CpuBackend::layernorm_bwd(dst_dtype dt, const void *dy, const void *xy, bool invertible,
                                     const void *gamma, const void *beta, const void *mean,
                                     const void *rstd, const void *dresid, void *dx, void *dgamma,
                                     void *dbeta, int64_t n, int64_t h, bool accumulate) {
    const int nt = num_threads();
    return cpu::dispatch(dt, "layernorm_bwd", [&](auto tag) {
        return layernorm_bwd_t<decltype(tag)>(dy, xy, invertible, gamma, beta, mean, rstd, dresid, dx,
                                              dgamma, dbeta, n, h, accumulate, nt, nullptr, nullptr);
    });
}

dst_status CpuBackend::layernorm_dropout_bwd(dst_dtype dt, const void *dy, const void *xy, bool invertible,
                                             const void *gamma, const void *beta, const void *mean,
                                             const void *rstd, const void *dresid, void *dx, void *dgamma,
                                             void *dbeta, int64_t n, int64_t h, bool accumulate,
                                             const DropoutSite &site, void *branch) {
    const int nt = num_threads();
    return cpu::dispatch(dt, "layernorm_dropout_bwd", [&](auto tag) {
        return layernorm_bwd_t<decltype(tag)>(dy, xy, invertible, gamma, beta, mean, rstd, dresid, dx,
                                              dgamma, dbeta, n, h, accumulate, nt, &site, branch);
    });
}

dst_status CpuBackend::all_nonzero(dst_dtype dt, const void *x, int64_t count, bool *all_nonzero) {
    return cpu::dispatch(dt, "all_nonzero", [&](auto tag) {
        bool ok = true;
        for (int64_t i = 0; i < count && ok; ++i) ok = load<decltype(tag)>(x, i) != 0;
        *all_nonzero = ok;
        return DST_OK;
    });
}

}  // namespace dst
