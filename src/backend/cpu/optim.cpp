// The CPU twin of the optimizer step (kernels/optim.cu) and of the two training helpers (scale_by,
// convert). Plain loops over the same chunks as the CUDA kernels: one partial sum per chunk, in
// double, in element order; partials added in chunk order. Chunks are independent, so the OpenMP
// loops give the same bits for any thread count. The passes and their math are described in
// kernels/optim_args.h and kernels/optim_math.h (shared with the kernels); docs/engine.md restates it.
#include <cstdint>

#include "backend/cpu/convert.h"
#include "backend/cpu/cpu_backend.h"
#include "core/dtype.h"        // defines: convert_host
#include "core/half.h"         // defines: half_bits_to_float, float_to_half_bits, bf16 conversions
#include "kernels/optim_math.h"  // defines: finalize_step, adam_element, lamb_*

namespace dst {
namespace {

using optim::Chunk;
using optim::GroupParams;
using optim::StepArgs;
using optim::TensorDesc;
using optim::TrainState;

// Element i of a parameter or gradient (FP32, FP16 or BF16), as float.
float load_f(const void *p, int32_t dt, int64_t i) {
    if (dt == DST_DTYPE_FP16) return half_bits_to_float(static_cast<const uint16_t *>(p)[i]);
    if (dt == DST_DTYPE_BF16) return bf16_bits_to_float(static_cast<const uint16_t *>(p)[i]);
    return static_cast<const float *>(p)[i];
}

void store_f(void *p, int32_t dt, int64_t i, float v) {
    if (dt == DST_DTYPE_FP16)
        static_cast<uint16_t *>(p)[i] = float_to_half_bits(v);
    else if (dt == DST_DTYPE_BF16)
        static_cast<uint16_t *>(p)[i] = float_to_bf16_bits(v);
    else
        static_cast<float *>(p)[i] = v;
}

// The fp32 master of element i: the master copy, or the fp32 parameter itself.
float master_of(const TensorDesc &t, int64_t i) {
    return t.master ? t.master[i] : static_cast<const float *>(t.param)[i];
}

// Writes the new master value and the parameter (rounded once to its dtype).
void store_master(const TensorDesc &t, int64_t i, float p) {
    if (t.master) t.master[i] = p;
    store_f(t.param, t.param_dtype, i, p);
}

void zero_grad_range(const TensorDesc &t, const Chunk &c) {
    for (int64_t i = c.begin; i < c.end; ++i) store_f(t.grad, t.grad_dtype, i, 0.0f);
}

// Pass 1: Σ g² of one chunk, in double, gradients as stored.
double chunk_sumsq(const TensorDesc &t, const Chunk &c) {
    double s = 0.0;
    for (int64_t i = c.begin; i < c.end; ++i) {
        const double g = load_f(t.grad, t.grad_dtype, i);
        s += g * g;
    }
    return s;
}

// Pass 3 (LAMB): the moments of one chunk, and its Σ p², Σ u².
void lamb_chunk(const StepArgs &a, const TrainState &st, const TensorDesc &t, const Chunk &c, double *p2,
                double *u2) {
    const GroupParams &gp = a.groups[t.group];
    double sp = 0.0, su = 0.0;
    for (int64_t i = c.begin; i < c.end; ++i) {
        const float g = load_f(t.grad, t.grad_dtype, i) * st.inv_scale;
        const float p = master_of(t, i);
        optim::lamb_moments(gp, g, t.exp_avg[i], t.exp_avg_sq[i]);
        const float u = optim::lamb_direction(gp, a.eps_inside_sqrt, t.exp_avg[i], t.exp_avg_sq[i], p);
        sp += static_cast<double>(p) * p;
        su += static_cast<double>(u) * u;
    }
    *p2 = sp;
    *u2 = su;
}

// Pass 5: the update of one chunk.
void update_chunk(const StepArgs &a, const TrainState &st, const TensorDesc &t, const Chunk &c) {
    const GroupParams &gp = a.groups[t.group];
    const float lr = st.lr[t.group];
    const int64_t step = *t.step;
    if (a.rule == optim::kRuleLamb) {
        const float k = optim::lamb_step_size(gp, lr, step, a.bias_correction) * *t.lamb_coeff;
        for (int64_t i = c.begin; i < c.end; ++i) {
            const float p = master_of(t, i);
            const float u = optim::lamb_direction(gp, a.eps_inside_sqrt, t.exp_avg[i], t.exp_avg_sq[i], p);
            store_master(t, i, p - k * u);
        }
        return;
    }
    const float bc1 = optim::bias_correction(gp.beta1, step, a.bias_correction);
    const float bc2 = optim::bias_correction(gp.beta2, step, a.bias_correction);
    for (int64_t i = c.begin; i < c.end; ++i) {
        const float g = load_f(t.grad, t.grad_dtype, i) * st.inv_scale;
        const float p = optim::adam_element(a.rule, gp, lr, bc1, bc2, g, master_of(t, i), t.exp_avg[i],
                                            t.exp_avg_sq[i]);
        store_master(t, i, p);
        if (a.zero_grads) store_f(t.grad, t.grad_dtype, i, 0.0f);
    }
}

}  // namespace

dst_status CpuBackend::optim_step(const StepArgs &a) {
    const int nt = num_threads();
    const int nc = a.num_chunks;
    double *norm = a.partials, *p2 = a.partials + nc, *u2 = a.partials + 2 * static_cast<int64_t>(nc);

    // 1. norm
    double sumsq = 0.0;
    if (a.compute_norm) {
#pragma omp parallel for num_threads(nt) schedule(static)
        for (int c = 0; c < nc; ++c) norm[c] = chunk_sumsq(a.tensors[a.chunks[c].tensor], a.chunks[c]);
        for (int c = 0; c < nc; ++c) sumsq += norm[c];
    }
    // 2. finalize
    TrainState &st = *a.state;
    const bool skip = optim::finalize_step(a, sumsq, st);
    if (skip) {
        if (a.zero_grads)
            for (int c = 0; c < nc; ++c) zero_grad_range(a.tensors[a.chunks[c].tensor], a.chunks[c]);
        return DST_OK;
    }
    for (int t = 0; t < a.num_tensors; ++t) *a.tensors[t].step += 1;
    // 3, 4. LAMB moments and trust ratios
    if (a.rule == optim::kRuleLamb) {
#pragma omp parallel for num_threads(nt) schedule(static)
        for (int c = 0; c < nc; ++c) {
            const TensorDesc &t = a.tensors[a.chunks[c].tensor];
            lamb_chunk(a, st, t, a.chunks[c], &p2[c], &u2[c]);
            if (a.zero_grads) zero_grad_range(t, a.chunks[c]);
        }
        for (int t = 0; t < a.num_tensors; ++t) {
            const TensorDesc &d = a.tensors[t];
            double sp = 0.0, su = 0.0;
            for (int c = d.first_chunk; c < d.first_chunk + d.num_chunks; ++c) {
                sp += p2[c];
                su += u2[c];
            }
            *d.lamb_coeff = optim::lamb_ratio(sp, su, a.max_coeff, a.min_coeff);
        }
    }
    // 5. update
#pragma omp parallel for num_threads(nt) schedule(static)
    for (int c = 0; c < nc; ++c) update_chunk(a, st, a.tensors[a.chunks[c].tensor], a.chunks[c]);
    return DST_OK;
}

dst_status CpuBackend::scale_by(dst_dtype dt, void *x, int64_t count, const float *factor, float mult) {
    const float f = *factor * mult;
    const int nt = num_threads();
    return cpu::dispatch(dt, "scale_by", [&](auto tag) {
        using T = decltype(tag);
        using C = cpu::compute_t<T>;
#pragma omp parallel for num_threads(nt) schedule(static)
        for (int64_t i = 0; i < count; ++i) cpu::store<T>(x, i, cpu::load<T>(x, i) * static_cast<C>(f));
        return DST_OK;
    });
}

dst_status CpuBackend::convert(dst_dtype src_dt, const void *src, dst_dtype dst_dt, void *dst, int64_t count) {
    if (count > 0) convert_host(src, src_dt, dst, dst_dt, static_cast<size_t>(count));
    return DST_OK;
}

}  // namespace dst
