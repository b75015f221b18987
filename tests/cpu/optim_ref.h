// Reference implementations of DeepSpeed's FusedAdam and FusedLamb steps in double precision, written
// from DeepSpeed's update rules (docs/engine.md) independently of the library (tests/cpu/test_optim.cpp and the
// engine tests compare the library's fp32 kernels with them). One RefTensor is one parameter tensor
// with its state; a step takes the true gradients (already unscaled and clipped).
#ifndef DST_TESTS_CPU_OPTIM_REF_H
#define DST_TESTS_CPU_OPTIM_REF_H

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

namespace dsttest {

struct RefHyper {
    double lr = 1e-3, beta1 = 0.9, beta2 = 0.999, eps = 1e-8, wd = 0.0;
};

struct RefTensor {
    std::vector<double> p, m, v;
    int64_t t = 0;
    double lamb_ratio = 0.0;
    explicit RefTensor(std::vector<double> init = {}) : p(std::move(init)), m(p.size(), 0.0), v(p.size(), 0.0) {}
};

// FusedAdam: L2 mode (decoupled == false) adds wd·p to g; AdamW adds wd·p to the update.
inline void ref_adam_step(RefTensor &x, const std::vector<double> &g, const RefHyper &h, bool bias_correction,
                          bool decoupled) {
    x.t += 1;
    const double bc1 = bias_correction ? 1.0 - std::pow(h.beta1, static_cast<double>(x.t)) : 1.0;
    const double bc2 = bias_correction ? 1.0 - std::pow(h.beta2, static_cast<double>(x.t)) : 1.0;
    for (size_t i = 0; i < x.p.size(); ++i) {
        double gi = g[i];
        if (!decoupled) gi += h.wd * x.p[i];
        x.m[i] = h.beta1 * x.m[i] + (1.0 - h.beta1) * gi;
        x.v[i] = h.beta2 * x.v[i] + (1.0 - h.beta2) * gi * gi;
        double u = (x.m[i] / bc1) / (std::sqrt(x.v[i] / bc2) + h.eps);
        if (decoupled) u += h.wd * x.p[i];
        x.p[i] -= h.lr * u;
    }
}

// FusedLamb on one tensor (the trust ratio is per tensor).
inline void ref_lamb_step(RefTensor &x, const std::vector<double> &g, const RefHyper &h, bool bias_correction,
                          double max_coeff, double min_coeff, bool eps_inside_sqrt) {
    x.t += 1;
    std::vector<double> u(x.p.size());
    double pn = 0.0, un = 0.0;
    for (size_t i = 0; i < x.p.size(); ++i) {
        x.m[i] = h.beta1 * x.m[i] + (1.0 - h.beta1) * g[i];
        x.v[i] = h.beta2 * x.v[i] + (1.0 - h.beta2) * g[i] * g[i];
        const double d = eps_inside_sqrt ? std::sqrt(x.v[i] + h.eps) : std::sqrt(x.v[i]) + h.eps;
        u[i] = x.m[i] / d + h.wd * x.p[i];
        pn += x.p[i] * x.p[i];
        un += u[i] * u[i];
    }
    double r = 1.0;
    if (pn > 0.0 && un > 0.0) r = std::min(max_coeff, std::max(min_coeff, std::sqrt(pn) / std::sqrt(un)));
    x.lamb_ratio = r;
    const double step = bias_correction ? h.lr * std::sqrt(1.0 - std::pow(h.beta2, static_cast<double>(x.t))) /
                                              (1.0 - std::pow(h.beta1, static_cast<double>(x.t)))
                                        : h.lr;
    for (size_t i = 0; i < x.p.size(); ++i) x.p[i] -= step * r * u[i];
}

// The factor on the true gradients of global-norm clipping: min(1, clip/(N + 1e-6)), N over every tensor.
inline double ref_clip_factor(const std::vector<std::vector<double>> &grads, double clip) {
    if (clip <= 0.0) return 1.0;
    double s = 0.0;
    for (const auto &g : grads)
        for (double x : g) s += x * x;
    const double q = (std::sqrt(s) + 1e-6) / clip;
    return q > 1.0 ? 1.0 / q : 1.0;
}

}  // namespace dsttest

#endif  // DST_TESTS_CPU_OPTIM_REF_H
