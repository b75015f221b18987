// The scalar math of an optimizer step, written once for the host (the CPU twin, src/backend/cpu/
// optim.cpp, and the optimizer's queries) and the device (kernels/optim.cu): the loss-scale state
// machines, the learning-rate schedules, the finalize step, and the per-element Adam and LAMB rules.
// The formulas follow DeepSpeed's FusedAdam and FusedLamb; docs/engine.md states them.
// Element math is fp32; schedules and bias corrections run in double and are rounded to fp32 once.
#ifndef DST_KERNELS_OPTIM_MATH_H
#define DST_KERNELS_OPTIM_MATH_H

#include <math.h>
#include <stdint.h>

#include "kernels/optim_args.h"  // defines: StepArgs, TrainState, ScalerConfig, ScheduleConfig

#if defined(__CUDACC__)
#define DST_HD __host__ __device__ inline
#else
#define DST_HD inline
#endif

namespace dst {
namespace optim {

// Finite: neither NaN (x != x) nor ±inf.
DST_HD bool is_finite(double x) { return x == x && x <= 1.7976931348623157e308 && x >= -1.7976931348623157e308; }

// ---- loss scaling ---------------------------------------------------------------------------------
// One update per optimizer step. Rule 0 (DeepSpeed's stage-0 fp16 wrappers; hysteresis unused):
//   overflow:    scale = max(scale/2, min); last_overflow = iter
//   no overflow: k = iter − last_overflow − 1; scale *= 2 when k > 0 and k % window == 0
// Rule 1 (DeepSpeed's DynamicLossScaler): an overflow halves the scale only when the hysteresis
// counter is down to 1 (else it counts down); a good step refills the counter (every good step when
// consecutive, else only when it doubles) and doubles when (iter − last_overflow) % window == 0.
// Both: iter += 1.
DST_HD void scaler_update(const ScalerConfig &c, TrainState &s, bool overflow) {
    if (overflow) {
        if (c.hysteresis_rule == 0 || c.hysteresis <= 1 || s.hysteresis_left <= 1) {
            const float half = s.loss_scale * 0.5f;
            s.loss_scale = half > c.min_scale ? half : c.min_scale;
        } else {
            s.hysteresis_left -= 1;
        }
        s.last_overflow_iter = s.cur_iter;
    } else if (c.hysteresis_rule == 0) {
        const int32_t k = s.cur_iter - s.last_overflow_iter - 1;
        if (k > 0 && k % c.window == 0) s.loss_scale *= 2.0f;
    } else {
        if (c.consecutive) s.hysteresis_left = c.hysteresis;
        if ((s.cur_iter - s.last_overflow_iter) % c.window == 0) {
            if (!c.consecutive) s.hysteresis_left = c.hysteresis;
            s.loss_scale *= 2.0f;
        }
    }
    s.cur_iter += 1;
}

// ---- learning-rate schedules ----------------------------------------------------------------------
// DeepSpeed's warm-up factor γ(i) for iteration i of a warm-up over w steps (log: ln(i+1)/ln(max(2, w));
// linear: i/w), 1 once i ≥ w.
DST_HD double warmup_gamma(const ScheduleConfig &c, double i) {
    const double w = c.warmup_num_steps;
    if (i >= w) return 1.0;
    if (c.warmup_log) return log(i + 1.0) / log(w > 2.0 ? w : 2.0);
    return i / w;
}

// The lr a group with base lr `base` uses for the step that follows `applied` applied steps;
// `s` is the BERT script's step (boundary steps since the schedule started).
//  - DeepSpeed kinds: i = applied − 1 (their step() runs after each applied step, never on a skipped
//    one); i < 0 gives the construction value.
//  - BERT script kinds: lr = learning_rate·f(s) + lr_offset with x = s/total, E = warmup·total.
DST_HD double schedule_lr(const ScheduleConfig &c, double base, int64_t applied, int64_t s) {
    const double i = static_cast<double>(applied) - 1.0;
    switch (c.kind) {
    case kScheduleWarmupLR:
    case kScheduleWarmupDecayLR: {
        if (i < 0) return c.warmup_min_lr;
        double g = warmup_gamma(c, i);
        if (c.kind == kScheduleWarmupDecayLR && i >= c.warmup_num_steps) {
            const double span = c.total_num_steps - c.warmup_num_steps;
            g = (c.total_num_steps - i) / (span > 1.0 ? span : 1.0);
            if (g < 0.0) g = 0.0;
        }
        return c.warmup_min_lr + (c.warmup_max_lr - c.warmup_min_lr) * g;
    }
    case kScheduleWarmupCosineLR: {
        double ratio;
        if (i < 0) {
            ratio = c.warmup_min_ratio;
        } else if (i < c.warmup_num_steps) {
            ratio = c.warmup_min_ratio + warmup_gamma(c, i) * (1.0 - c.warmup_min_ratio);
        } else {
            const double span = c.total_num_steps - c.warmup_num_steps;
            const double x = (i - c.warmup_num_steps + 1.0) / (span > 1.0 ? span : 1.0);
            ratio = c.cos_min_ratio + (1.0 - c.cos_min_ratio) * (1.0 + cos(3.141592653589793 * x)) * 0.5;
            if (ratio < 0.0) ratio = 0.0;
        }
        return base * ratio;
    }
    case kScheduleWarmupLinear:
    case kScheduleLE:
    case kScheduleEE:
    case kScheduleEP: {
        const double sd = static_cast<double>(s);
        const double x = sd / c.total_training_steps, w = c.warmup_proportion;
        const double e = w * c.total_training_steps;
        double f;
        if (c.kind == kScheduleEP) {
            f = x < w ? pow(x / w, 1.5) : (1.0 - x) * (1.0 - x);
        } else if (w == 0.0) {
            f = 1.0;
        } else if (x < w) {
            f = c.kind == kScheduleEE ? (x / w) * (x / w) : x / w;
        } else if (c.kind == kScheduleWarmupLinear) {
            f = 1.0 - x;
        } else {
            f = pow(c.decay_rate, (sd - e) / c.decay_step);
        }
        return c.learning_rate * f + c.lr_offset;
    }
    default:
        return base;
    }
}

// ---- the finalize pass ----------------------------------------------------------------------------
// Given Σ g² over every gradient (as stored, i.e. scaled by S), decides the step and updates the
// state: overflow, skip, the scaler, the true norm N/S, the combined factor 1/C with
// C = S·max(1, (N/S + 1e-6)/clip), each group's lr, and the step counters. Returns whether the step is
// skipped. The caller increments every tensor's step count when it is not.
DST_HD bool finalize_step(const StepArgs &a, double sumsq, TrainState &st) {
    const double scale = a.scale_from_state ? static_cast<double>(st.loss_scale) : static_cast<double>(a.grad_scale);
    const bool overflow = a.compute_norm && !is_finite(sumsq);
    const bool skip = a.check_overflow && overflow;
    if (a.scaler.dynamic) scaler_update(a.scaler, st, overflow);
    double combined = scale, norm = 0.0;
    if (a.compute_norm) {
        norm = sqrt(sumsq) / scale;
        if (!overflow && a.clip > 0.0f) {
            const double q = (norm + 1e-6) / static_cast<double>(a.clip);
            if (q > 1.0) combined = q * scale;
        }
    }
    st.norm_computed = a.compute_norm ? 1 : 0;
    st.overflow = overflow ? 1 : 0;
    st.skipped = skip ? 1 : 0;
    st.grad_norm = static_cast<float>(norm);
    st.inv_scale = static_cast<float>(1.0 / combined);
    if (skip) {
        st.skipped_steps += 1;
        return true;
    }
    for (int g = 0; g < a.num_groups && g < kMaxGroups; ++g)
        st.lr[g] = static_cast<float>(schedule_lr(a.schedule, a.groups[g].lr, st.applied_steps, a.schedule_step));
    st.applied_steps += 1;
    return false;
}

// ---- element rules ----------------------------------------------------------------------------------
// Bias corrections of step t: 1 − β^t (1 when off), in double, rounded to fp32.
DST_HD float bias_correction(float beta, int64_t t, int32_t on) {
    return on ? static_cast<float>(1.0 - pow(static_cast<double>(beta), static_cast<double>(t))) : 1.0f;
}

// FusedAdam on one element; g is the unscaled, clipped gradient, p the fp32 master. Returns the new p.
//   L2:    g ← g + wd·p
//   m ← β1·m + (1−β1)·g ;  v ← β2·v + (1−β2)·g² ;  u = (m/bc1) / (sqrt(v/bc2) + eps)
//   AdamW: u ← u + wd·p ;  p ← p − lr·u
DST_HD float adam_element(int32_t rule, const GroupParams &gp, float lr, float bc1, float bc2, float g, float p,
                          float &m, float &v) {
    if (rule == kRuleAdamL2) g = g + gp.weight_decay * p;
    m = gp.beta1 * m + (1.0f - gp.beta1) * g;
    v = gp.beta2 * v + (1.0f - gp.beta2) * g * g;
    float u = (m / bc1) / (sqrtf(v / bc2) + gp.eps);
    if (rule == kRuleAdamW) u = u + gp.weight_decay * p;
    return p - lr * u;
}

// FusedLamb's moments (raw, never bias-corrected) on one element.
DST_HD void lamb_moments(const GroupParams &gp, float g, float &m, float &v) {
    m = gp.beta1 * m + (1.0f - gp.beta1) * g;
    v = gp.beta2 * v + (1.0f - gp.beta2) * g * g;
}

// FusedLamb's direction u = m/d + wd·p, d = sqrt(v) + eps (or sqrt(v + eps)).
DST_HD float lamb_direction(const GroupParams &gp, int32_t eps_inside_sqrt, float m, float v, float p) {
    const float d = eps_inside_sqrt ? sqrtf(v + gp.eps) : sqrtf(v) + gp.eps;
    return m / d + gp.weight_decay * p;
}

// Trust ratio ‖p‖/‖u‖ clamped to [min, max] when both norms are non-zero, else 1 (unclamped).
DST_HD float lamb_ratio(double p2, double u2, float max_coeff, float min_coeff) {
    if (!(p2 > 0.0) || !(u2 > 0.0)) return 1.0f;
    double r = sqrt(p2) / sqrt(u2);
    if (r > max_coeff) r = max_coeff;
    if (r < min_coeff) r = min_coeff;
    return static_cast<float>(r);
}

// LAMB's step size: lr·sqrt(1 − β2^t)/(1 − β1^t) with bias correction, else lr.
DST_HD float lamb_step_size(const GroupParams &gp, float lr, int64_t t, int32_t bias_correction_on) {
    if (!bias_correction_on) return lr;
    const double b1 = 1.0 - pow(static_cast<double>(gp.beta1), static_cast<double>(t));
    const double b2 = 1.0 - pow(static_cast<double>(gp.beta2), static_cast<double>(t));
    return static_cast<float>(static_cast<double>(lr) * sqrt(b2) / b1);
}

}  // namespace optim
}  // namespace dst

#undef DST_HD

#endif  // DST_KERNELS_OPTIM_MATH_H
