// The optimizers through the public C API on the CPU backend: DeepSpeed's FusedAdam and FusedLamb
// against numeric oracles computed from DeepSpeed's formulas and against the double-precision
// reference of optim_ref.h (groups, weight decay, bias correction on and off, clipping, loss scales,
// fp32/fp16/bf16 parameters with fp32 masters, several chunks), layers as tensors, the state as
// tensors, saved files, determinism, and bad input on every entry point.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include <unistd.h>

#include "engine_util.h"
#include "optim_ref.h"
#include "test_util.h"
#include "../common/scratch_dir.h"

using namespace dsttest;

namespace {

dst_optimizer_config opt_config(dst_optimizer_kind kind, float lr, float wd, bool bc, bool adam_w_mode = true) {
    dst_optimizer_config c;
    dst_optimizer_config_default(&c);
    c.kind = kind;
    c.lr = lr;
    c.weight_decay = wd;
    c.bias_correction = bc;
    c.adam_w_mode = adam_w_mode;
    return c;
}

// The fp32 state tensor `which` of tensor `index`, as doubles.
std::vector<double> state_of(dst_optimizer *o, int index, dst_optimizer_state which) {
    dst_tensor v;
    EXPECT_EQ(dst_optimizer_get_state(o, index, which, &v), DST_OK) << dst_last_error();
    int64_t n = 1;
    for (int i = 0; i < v.ndim; ++i) n *= v.shape[i];
    const float *f = static_cast<const float *>(v.data);
    return std::vector<double>(f, f + n);
}

dst_optimizer_tensor_info info_of(dst_optimizer *o, int index) {
    dst_optimizer_tensor_info info;
    std::memset(&info, 0, sizeof info);
    info.struct_size = sizeof info;
    EXPECT_EQ(dst_optimizer_get_tensor_info(o, index, &info), DST_OK) << dst_last_error();
    return info;
}

// |a − oracle| within the oracle's printed precision (7 significant digits, with fp32 rounding).
void expect_oracle(const std::vector<double> &got, const std::vector<double> &oracle, const char *what,
                   double rel = 5e-7) {
    ASSERT_EQ(got.size(), oracle.size()) << what;
    for (size_t i = 0; i < got.size(); ++i)
        EXPECT_NEAR(got[i], oracle[i], rel * std::fabs(oracle[i]) + 1e-12) << what << " [" << i << "]";
}

const std::vector<double> kP = {0.5, -1.0, 2.0, -0.25};
const std::vector<double> kG = {0.1, -0.2, 0.3, 0.0};

// One Adam step from the spec's starting point, returning the parameter.
std::vector<double> adam_once(bool adam_w, bool bc, std::vector<double> *m = nullptr, std::vector<double> *v = nullptr) {
    Ctx ctx = make_ctx();
    Opt o = make_opt(ctx.get(), opt_config(DST_OPTIMIZER_ADAM, 1e-3f, 0.01f, bc, adam_w));
    Param x(DST_DTYPE_FP32, DST_DTYPE_FP32, kP, kG);
    EXPECT_EQ(x.add(o.get(), 0, "p"), DST_OK) << dst_last_error();
    EXPECT_EQ(dst_optimizer_step(o.get(), 1.0f, 0.0f), DST_OK) << dst_last_error();
    if (m) *m = state_of(o.get(), 0, DST_OPTIMIZER_STATE_EXP_AVG);
    if (v) *v = state_of(o.get(), 0, DST_OPTIMIZER_STATE_EXP_AVG_SQ);
    return x.p.doubles();
}

// ================================ spec §9 oracles ================================================

TEST(OptimOracle, AdamOneStep) {
    std::vector<double> m, v;
    expect_oracle(adam_once(true, true, &m, &v), {0.498995, -0.99899, 1.99898, -0.2499975}, "AdamW, bias correction");
    expect_oracle(m, {0.01, -0.02, 0.03, 0.0}, "m");
    expect_oracle(v, {9.9998715e-6, 3.9999486e-5, 8.9998844e-5, 0.0}, "v");
    expect_oracle(adam_once(true, false), {0.4968327, -0.9968277, 1.9968177, -0.2499975}, "AdamW, no bias correction");
    expect_oracle(adam_once(false, true), {0.499, -0.999, 1.999, -0.249}, "L2, bias correction");
    expect_oracle(adam_once(false, false), {0.4968377, -0.9968377, 1.9968377, -0.2468381}, "L2, no bias correction");
}

TEST(OptimOracle, AdamSecondStepAndZeroGradientSteps) {
    Ctx ctx = make_ctx();
    {
        Opt o = make_opt(ctx.get(), opt_config(DST_OPTIMIZER_ADAMW, 1e-3f, 0.01f, true));
        Param x(DST_DTYPE_FP32, DST_DTYPE_FP32, kP, kG);
        DST_ASSERT_OK(x.add(o.get(), 0, "p"));
        DST_ASSERT_OK(dst_optimizer_step(o.get(), 1.0f, 0.0f));
        x.g.set_doubles({-0.05, 0.1, 0.3, 0.2});
        DST_ASSERT_OK(dst_optimizer_step(o.get(), 1.0f, 0.0f));
        expect_oracle(x.p.doubles(), {0.4987237, -0.9987137, 1.9979601, -0.2507391}, "AdamW+bc, t = 2");
        EXPECT_EQ(info_of(o.get(), 0).step, 2);
    }
    {
        // DeepSpeed's fp16 wrappers step once with zero gradients at construction (spec §5.1): the same
        // call with zero gradients here, then the first real step at t = 2.
        Opt o = make_opt(ctx.get(), opt_config(DST_OPTIMIZER_ADAM, 1e-3f, 0.01f, true, true));
        Param x(DST_DTYPE_FP32, DST_DTYPE_FP32, kP, {0, 0, 0, 0});
        DST_ASSERT_OK(x.add(o.get(), 0, "p"));
        DST_ASSERT_OK(dst_optimizer_step(o.get(), 1.0f, 0.0f));
        expect_oracle(x.p.doubles(), {0.499995, -0.99999, 1.99998, -0.2499975}, "zero-gradient step, AdamW");
        expect_oracle(state_of(o.get(), 0, DST_OPTIMIZER_STATE_EXP_AVG), {0, 0, 0, 0}, "m");
        expect_oracle(state_of(o.get(), 0, DST_OPTIMIZER_STATE_EXP_AVG_SQ), {0, 0, 0, 0}, "v");
        x.g.set_doubles(kG);
        DST_ASSERT_OK(dst_optimizer_step(o.get(), 1.0f, 0.0f));
        expect_oracle(x.p.doubles(), {0.49924585, -0.99923587, 1.9992158, -0.249995}, "then the first real step");
    }
    {
        Opt o = make_opt(ctx.get(), opt_config(DST_OPTIMIZER_ADAM, 1e-3f, 0.01f, true, false));
        Param x(DST_DTYPE_FP32, DST_DTYPE_FP32, kP, {0, 0, 0, 0});
        DST_ASSERT_OK(x.add(o.get(), 0, "p"));
        DST_ASSERT_OK(dst_optimizer_step(o.get(), 1.0f, 0.0f));
        expect_oracle(x.p.doubles(), {0.499, -0.999, 1.999, -0.249}, "zero-gradient step, L2");
        expect_oracle(state_of(o.get(), 0, DST_OPTIMIZER_STATE_EXP_AVG), {5e-4, -1e-3, 2e-3, -2.5e-4}, "m, L2");
    }
}

// One LAMB step from the spec's starting point (lr 11e-3, wd 0.01, max 0.3, min 0.01).
struct LambRun {
    std::vector<double> p;
    float ratio;
};
LambRun lamb_once(bool bc, float max_coeff, std::vector<double> p0, std::vector<double> g, float wd = 0.01f,
                  float grad_scale = 1.0f) {
    Ctx ctx = make_ctx();
    dst_optimizer_config c = opt_config(DST_OPTIMIZER_LAMB, 11e-3f, wd, bc);
    c.max_coeff = max_coeff;
    c.min_coeff = 0.01f;
    Opt o = make_opt(ctx.get(), c);
    for (double &x : g) x *= grad_scale;
    Param x(DST_DTYPE_FP32, DST_DTYPE_FP32, p0, g);
    EXPECT_EQ(x.add(o.get(), 0, "p"), DST_OK) << dst_last_error();
    EXPECT_EQ(dst_optimizer_step(o.get(), grad_scale, 0.0f), DST_OK) << dst_last_error();
    return {x.p.doubles(), info_of(o.get(), 0).lamb_coeff};
}

TEST(OptimOracle, LambOneStep) {
    LambRun r = lamb_once(false, 0.3f, kP, kG);
    expect_oracle(r.p, {0.48954794, -0.98953146, 1.9894984, -0.24999174}, "no bias correction");
    EXPECT_FLOAT_EQ(r.ratio, 0.3f) << "raw ratio 0.41926 clamped to max_coeff";
    expect_oracle(lamb_once(true, 0.3f, kP, kG).p, {0.4966948, -0.99668956, 1.9966792, -0.24999739}, "bias correction");
    r = lamb_once(false, 10.0f, kP, kG);
    expect_oracle(r.p, {0.4853928, -0.98536974, 1.9853235, -0.24998847}, "max_coeff 10");
    EXPECT_NEAR(r.ratio, 0.41926306, 1e-6);
    // Gradients pre-multiplied by 65536 with s = 65536: the same bits as unscaled (powers of two).
    const LambRun unscaled = lamb_once(false, 0.3f, kP, kG), scaled = lamb_once(false, 0.3f, kP, kG, 0.01f, 65536.0f);
    EXPECT_TRUE(bit_equal(unscaled.p, scaled.p));
    // All-zero weights: r = 1, unclamped although max_coeff < 1.
    r = lamb_once(false, 0.3f, {0, 0, 0, 0}, kG, 0.0f);
    expect_oracle(r.p, {-0.034785174, 0.034785233, -0.03478525, 0.0}, "zero weights");
    EXPECT_EQ(r.ratio, 1.0f);
    // Zero gradients (the fp16 wrapper's construction step): u = wd·p, r = 1/wd clamped to 0.3.
    r = lamb_once(false, 0.3f, kP, {0, 0, 0, 0});
    std::vector<double> want;
    for (double p : kP) want.push_back(p * 0.999967);
    expect_oracle(r.p, want, "zero-gradient step", 1e-6);
    EXPECT_FLOAT_EQ(r.ratio, 0.3f);
}

TEST(OptimOracle, GlobalNormClipping) {
    // True norm 2.5 (25 elements of 0.5), clip 1: factor 1/(2.5 + 1e-6) = 0.39999984 on the true
    // gradient, also when the gradients arrive scaled by S = 65536 (spec §9, "Clipping").
    for (float scale : {1.0f, 65536.0f}) {
        Ctx ctx = make_ctx();
        Opt o = make_opt(ctx.get(), opt_config(DST_OPTIMIZER_ADAMW, 1e-3f, 0.0f, false));
        Param x(DST_DTYPE_FP32, DST_DTYPE_FP32, std::vector<double>(25, 1.0), std::vector<double>(25, 0.5 * scale));
        DST_ASSERT_OK(x.add(o.get(), 0, "p"));
        DST_ASSERT_OK(dst_optimizer_step(o.get(), scale, 1.0f));
        float norm = 0.0f;
        DST_ASSERT_OK(dst_optimizer_get_grad_norm(o.get(), &norm));
        EXPECT_NEAR(norm, 2.5, 1e-6) << "scale " << scale;
        // m = (1 − β1)·g_clipped = 0.1 · 0.5 · 0.39999984
        expect_oracle(state_of(o.get(), 0, DST_OPTIMIZER_STATE_EXP_AVG), std::vector<double>(25, 0.1 * 0.5 * 0.39999984),
                      "m after clipping", 1e-6);
    }
}

// ================================ double-precision reference =====================================

struct Case {
    dst_optimizer_kind kind;
    bool adam_w_mode, bias_correction, eps_inside_sqrt;
};

std::string case_name(const Case &c) {
    std::string s = c.kind == DST_OPTIMIZER_LAMB ? "lamb" : c.kind == DST_OPTIMIZER_ADAMW ? "adamw" : "adam";
    if (c.kind == DST_OPTIMIZER_ADAM) s += c.adam_w_mode ? "_wmode" : "_l2";
    s += c.bias_correction ? "_bc" : "_nobc";
    if (c.eps_inside_sqrt) s += "_epsin";
    return s;
}

class OptimReference : public ::testing::TestWithParam<Case> {};

// Five tensors in two groups, of fp32, fp16 and bf16 (with fp16, fp32 and bf16 gradients), of 1 to 70000
// elements (one to three chunks), one with tiny gradients where eps matters; four steps with fresh
// gradients scaled by 8 and clipped to norm 1.
TEST_P(OptimReference, MatchesDoubleReference) {
    const Case c = GetParam();
    Ctx ctx = make_ctx();
    dst_optimizer_config cfg = opt_config(c.kind, 2e-3f, 0.01f, c.bias_correction, c.adam_w_mode);
    cfg.eps_inside_sqrt = c.eps_inside_sqrt;
    cfg.max_coeff = 5.0f;
    cfg.min_coeff = 0.05f;
    Opt o = make_opt(ctx.get(), cfg);
    dst_param_group g1;
    DST_ASSERT_OK(dst_param_group_default(&g1));
    g1.lr = 5e-4f;
    g1.beta1 = 0.8f;
    g1.beta2 = 0.99f;
    g1.eps = 1e-6f;
    g1.weight_decay = 0.0f;
    int idx = -1;
    DST_ASSERT_OK(dst_optimizer_add_group(o.get(), &g1, &idx));
    ASSERT_EQ(idx, 1);
    struct Spec {
        dst_dtype pdt, gdt;
        int64_t n;
        int group;
        double gscale;  // magnitude of the true gradients
    };
    const Spec specs[] = {{DST_DTYPE_FP32, DST_DTYPE_FP32, 70000, 0, 1.0},
                          {DST_DTYPE_FP16, DST_DTYPE_FP16, 7, 1, 1.0},
                          {DST_DTYPE_BF16, DST_DTYPE_FP32, 32769, 0, 1.0},
                          {DST_DTYPE_FP32, DST_DTYPE_FP32, 1, 1, 1.0},
                          {DST_DTYPE_FP32, DST_DTYPE_FP32, 100, 1, 1e-6}};
    Rng rng(1234);
    std::vector<Param> xs;
    std::vector<RefTensor> ref;
    for (const Spec &s : specs) {
        xs.emplace_back(s.pdt, s.gdt, rng.normals(static_cast<size_t>(s.n), 0.5), std::vector<double>(s.n, 0.0));
        ref.emplace_back(xs.back().p.doubles());  // the values the library's masters start from
    }
    for (size_t i = 0; i < xs.size(); ++i) DST_ASSERT_OK(xs[i].add(o.get(), specs[i].group, ("t" + std::to_string(i)).c_str()));
    const float S = 8.0f, clip = 1.0f;
    const RefHyper h0{2e-3, 0.9f, 0.999f, 1e-8f, 0.01f};
    const RefHyper h1{5e-4f, 0.8f, 0.99f, 1e-6f, 0.0};
    for (int step = 0; step < 4; ++step) {
        std::vector<std::vector<double>> truth;
        for (size_t i = 0; i < xs.size(); ++i) {
            std::vector<double> g = rng.normals(static_cast<size_t>(specs[i].n), specs[i].gscale);
            for (double &v : g) v *= S;
            xs[i].g.set_doubles(g);
            std::vector<double> stored = xs[i].g.doubles();  // as rounded to the gradient's dtype
            for (double &v : stored) v /= S;
            truth.push_back(stored);
        }
        const double f = ref_clip_factor(truth, clip);
        ASSERT_LT(f, 1.0) << "the case is meant to clip";
        DST_ASSERT_OK(dst_optimizer_step(o.get(), S, clip));
        for (size_t i = 0; i < xs.size(); ++i) {
            std::vector<double> g = truth[i];
            for (double &v : g) v *= f;
            const RefHyper &h = specs[i].group ? h1 : h0;
            if (c.kind == DST_OPTIMIZER_LAMB)
                ref_lamb_step(ref[i], g, h, c.bias_correction, 5.0, 0.05, c.eps_inside_sqrt);
            else
                ref_adam_step(ref[i], g, h, c.bias_correction, c.kind == DST_OPTIMIZER_ADAMW || c.adam_w_mode);
        }
    }
    for (size_t i = 0; i < xs.size(); ++i) {
        const bool master = specs[i].pdt != DST_DTYPE_FP32;
        const std::vector<double> p = master ? state_of(o.get(), static_cast<int>(i), DST_OPTIMIZER_STATE_MASTER)
                                             : xs[i].p.doubles();
        // fp32 arithmetic against double over four steps: the parameters move by ~1e-3 per step, so
        // their relative error stays near fp32's epsilon; the moments carry the gradients' rounding.
        EXPECT_LT(rel_l2(p, ref[i].p), 2e-7) << "tensor " << i << " parameters";
        EXPECT_LT(rel_l2(state_of(o.get(), static_cast<int>(i), DST_OPTIMIZER_STATE_EXP_AVG), ref[i].m), 2e-6)
            << "tensor " << i << " m";
        EXPECT_LT(rel_l2(state_of(o.get(), static_cast<int>(i), DST_OPTIMIZER_STATE_EXP_AVG_SQ), ref[i].v), 2e-6)
            << "tensor " << i << " v";
        const dst_optimizer_tensor_info info = info_of(o.get(), static_cast<int>(i));
        EXPECT_EQ(info.step, 4);
        if (c.kind == DST_OPTIMIZER_LAMB) {
            EXPECT_NEAR(info.lamb_coeff, ref[i].lamb_ratio, 1e-5 * ref[i].lamb_ratio);
        }
        if (master) {
            // The 16-bit parameter is its master rounded once.
            for (int64_t k = 0; k < specs[i].n; ++k)
                ASSERT_EQ(xs[i].p.get(k), round_to(static_cast<float>(p[static_cast<size_t>(k)]), specs[i].pdt))
                    << "tensor " << i << " element " << k;
        }
    }
}

INSTANTIATE_TEST_SUITE_P(Rules, OptimReference,
                         ::testing::Values(Case{DST_OPTIMIZER_ADAM, true, true, false},
                                           Case{DST_OPTIMIZER_ADAM, false, true, false},
                                           Case{DST_OPTIMIZER_ADAM, false, false, false},
                                           Case{DST_OPTIMIZER_ADAMW, false, false, false},
                                           Case{DST_OPTIMIZER_LAMB, true, true, false},
                                           Case{DST_OPTIMIZER_LAMB, true, false, false},
                                           Case{DST_OPTIMIZER_LAMB, true, false, true}),
                         [](const ::testing::TestParamInfo<Case> &i) { return case_name(i.param); });

// ================================ layers, groups, state ==========================================

TEST(Optim, LayerParametersAreTwelveTensorsInDecayGroups) {
    Ctx ctx = make_ctx();
    dst_layer_config lc = small_config(16, 4);
    lc.max_batch_tokens = 32;
    Layer layer = make_layer(ctx.get(), lc);
    randomize_params(layer.get(), 3);
    Opt o = make_opt(ctx.get(), opt_config(DST_OPTIMIZER_ADAMW, 1e-2f, 0.1f, true));
    DST_ASSERT_OK(dst_optimizer_add_group(o.get(), nullptr, nullptr));
    dst_param_group nd;
    nd.struct_size = sizeof nd;
    DST_ASSERT_OK(dst_optimizer_get_group(o.get(), 1, &nd));
    EXPECT_EQ(nd.weight_decay, 0.1f) << "a group added with NULL copies group 0";
    nd.weight_decay = 0.0f;
    DST_ASSERT_OK(dst_optimizer_set_group(o.get(), 1, &nd));
    DST_ASSERT_OK(dst_optimizer_add_layer(o.get(), layer.get(), "enc.0.", 0, 1));
    int n = 0;
    DST_ASSERT_OK(dst_optimizer_num_tensors(o.get(), &n));
    ASSERT_EQ(n, DST_PARAM_COUNT);
    // Gradients from a real backward.
    Rng rng(5);
    HostTensor x = HostTensor::from_doubles(DST_DTYPE_FP32, {2, 8, 16}, rng.normals(256));
    HostTensor y(DST_DTYPE_FP32, {2, 8, 16}), dx(DST_DTYPE_FP32, {2, 8, 16});
    dst_tensor xv = x.view(), yv = y.view(), dxv = dx.view();
    DST_ASSERT_OK(dst_layer_forward(layer.get(), nullptr, &xv, nullptr, &yv));
    DST_ASSERT_OK(dst_layer_backward(layer.get(), nullptr, &yv, &dxv, DST_GRAD_WRITE));
    std::vector<RefTensor> ref;
    std::vector<std::vector<double>> grads;
    for (int p = 0; p < DST_PARAM_COUNT; ++p) {
        ref.emplace_back(get_param(layer.get(), kParamNames[p]));
        grads.push_back(get_grad(layer.get(), kParamNames[p]));
        int index = -1;
        DST_ASSERT_OK(dst_optimizer_find_tensor(o.get(), ("enc.0." + std::string(kParamNames[p])).c_str(), &index));
        EXPECT_EQ(index, p);
        const dst_optimizer_tensor_info info = info_of(o.get(), p);
        EXPECT_EQ(std::string(info.name), "enc.0." + std::string(kParamNames[p]));
        EXPECT_EQ(info.group, info.ndim == 2 ? 0 : 1) << kParamNames[p];
        EXPECT_EQ(info.numel, param_numel(layer.get(), p));
    }
    DST_ASSERT_OK(dst_optimizer_step(o.get(), 1.0f, 0.0f));
    for (int p = 0; p < DST_PARAM_COUNT; ++p) {
        const bool matrix = info_of(o.get(), p).ndim == 2;
        ref_adam_step(ref[static_cast<size_t>(p)], grads[static_cast<size_t>(p)], RefHyper{1e-2f, 0.9f, 0.999f, 1e-8f, matrix ? 0.1f : 0.0},
                      true, true);
        EXPECT_LT(rel_l2(get_param(layer.get(), kParamNames[p]), ref[static_cast<size_t>(p)].p), 1e-6) << kParamNames[p];
    }
    // The layer gets caller arenas: the next step updates those.
    size_t bytes = 0;
    DST_ASSERT_OK(dst_layer_arena_bytes(layer.get(), &bytes));
    HostTensor arena(DST_DTYPE_FP32, {static_cast<int64_t>(bytes / 4)});
    DST_ASSERT_OK(dst_layer_bind_param_arena(layer.get(), arena.data(), bytes, 1));
    const std::vector<double> before = get_param(layer.get(), "attn_qkvw");
    DST_ASSERT_OK(dst_optimizer_step(o.get(), 1.0f, 0.0f));
    EXPECT_GT(max_abs_diff(get_param(layer.get(), "attn_qkvw"), before), 0.0) << "the bound arena is updated";
}

TEST(Optim, StateIsReadableAndWritable) {
    Ctx ctx = make_ctx();
    Opt o = make_opt(ctx.get(), opt_config(DST_OPTIMIZER_ADAMW, 1e-3f, 0.0f, true));
    Param a(DST_DTYPE_FP32, DST_DTYPE_FP32, {1.0, 2.0, 3.0}, {0.1, 0.2, 0.3});
    Param b(DST_DTYPE_FP16, DST_DTYPE_FP16, {1.0, -1.0}, {0.5, 0.5});
    DST_ASSERT_OK(a.add(o.get(), 0, "a"));
    DST_ASSERT_OK(b.add(o.get(), 0, "b"));
    // Moments and step count written by the caller are what the next step continues from.
    dst_tensor m, v;
    DST_ASSERT_OK(dst_optimizer_get_state(o.get(), 0, DST_OPTIMIZER_STATE_EXP_AVG, &m));
    DST_ASSERT_OK(dst_optimizer_get_state(o.get(), 0, DST_OPTIMIZER_STATE_EXP_AVG_SQ, &v));
    EXPECT_EQ(m.dtype, DST_DTYPE_FP32);
    EXPECT_EQ(m.ndim, 1);
    EXPECT_EQ(m.shape[0], 3);
    const float m0[3] = {0.05f, -0.1f, 0.2f}, v0[3] = {1e-3f, 2e-3f, 3e-3f};
    std::memcpy(m.data, m0, sizeof m0);
    std::memcpy(v.data, v0, sizeof v0);
    DST_ASSERT_OK(dst_optimizer_set_step(o.get(), 0, 5));
    RefTensor r({1.0, 2.0, 3.0});
    r.m = {m0[0], m0[1], m0[2]};
    r.v = {v0[0], v0[1], v0[2]};
    r.t = 5;
    DST_ASSERT_OK(dst_optimizer_step(o.get(), 1.0f, 0.0f));
    ref_adam_step(r, {0.1f, 0.2f, 0.3f}, RefHyper{1e-3f, 0.9f, 0.999f, 1e-8f, 0.0}, true, true);
    EXPECT_LT(rel_l2(a.p.doubles(), r.p), 1e-7);
    EXPECT_EQ(info_of(o.get(), 0).step, 6);
    EXPECT_EQ(info_of(o.get(), 1).step, 1);
    // The master of the fp16 tensor, and its refresh from parameters the caller changed.
    dst_tensor mv;
    EXPECT_FAILS(DST_ERR_INVALID_ARGUMENT, "master", dst_optimizer_get_state(o.get(), 0, DST_OPTIMIZER_STATE_MASTER, &mv));
    b.p.set_doubles({0.25, 4.0});
    DST_ASSERT_OK(dst_optimizer_refresh_masters(o.get()));
    expect_oracle(state_of(o.get(), 1, DST_OPTIMIZER_STATE_MASTER), {0.25, 4.0}, "refreshed master");
}

TEST(Optim, StepsAreBitIdenticalForAnyThreadCount) {
    std::vector<std::vector<unsigned char>> results;
    for (int threads : {1, 2, 3}) {
        Ctx ctx = make_ctx();
        DST_ASSERT_OK(dst_context_set_num_threads(ctx.get(), threads));
        Opt o = make_opt(ctx.get(), opt_config(DST_OPTIMIZER_LAMB, 1e-3f, 0.01f, true));
        Rng rng(9);
        Param x(DST_DTYPE_FP32, DST_DTYPE_FP32, rng.normals(100003), rng.normals(100003));
        DST_ASSERT_OK(x.add(o.get(), 0, "x"));
        for (int s = 0; s < 3; ++s) DST_ASSERT_OK(dst_optimizer_step(o.get(), 1.0f, 0.5f));
        results.push_back(x.p.bytes());
    }
    EXPECT_EQ(results[0], results[1]);
    EXPECT_EQ(results[0], results[2]);
}

// ================================ files ==========================================================

std::string temp_path(const std::string &name) {
    return dst_test::scratch_path("optim_" + name);
}

TEST(Optim, SaveAndLoadRoundTrip) {
    Ctx ctx = make_ctx();
    Opt o = make_opt(ctx.get(), opt_config(DST_OPTIMIZER_LAMB, 1e-3f, 0.01f, true));
    DST_ASSERT_OK(dst_optimizer_add_group(o.get(), nullptr, nullptr));
    Rng rng(21);
    Param a(DST_DTYPE_FP32, DST_DTYPE_FP32, rng.normals(50), rng.normals(50));
    Param b(DST_DTYPE_FP16, DST_DTYPE_FP16, rng.normals(40000), rng.normals(40000));
    Param c(DST_DTYPE_BF16, DST_DTYPE_FP32, rng.normals(9), rng.normals(9));
    DST_ASSERT_OK(a.add(o.get(), 0, "a"));
    DST_ASSERT_OK(b.add(o.get(), 1, "b"));
    DST_ASSERT_OK(c.add(o.get(), 0, "c"));
    for (int s = 0; s < 3; ++s) DST_ASSERT_OK(dst_optimizer_step(o.get(), 1.0f, 0.0f));
    auto capture = [&] {
        std::vector<std::vector<double>> st;
        for (int i = 0; i < 3; ++i) {
            st.push_back(state_of(o.get(), i, DST_OPTIMIZER_STATE_EXP_AVG));
            st.push_back(state_of(o.get(), i, DST_OPTIMIZER_STATE_EXP_AVG_SQ));
            if (i > 0) st.push_back(state_of(o.get(), i, DST_OPTIMIZER_STATE_MASTER));
            const dst_optimizer_tensor_info info = info_of(o.get(), i);
            st.push_back({static_cast<double>(info.step), info.lamb_coeff});
        }
        dst_param_group g;
        g.struct_size = sizeof g;
        dst_optimizer_get_group(o.get(), 1, &g);
        st.push_back({g.lr, g.beta1, g.weight_decay});
        return st;
    };
    const auto saved = capture();
    const std::string path = temp_path("roundtrip.safetensors");
    DST_ASSERT_OK(dst_optimizer_save(o.get(), path.c_str()));
    for (int s = 0; s < 2; ++s) DST_ASSERT_OK(dst_optimizer_step(o.get(), 1.0f, 0.0f));
    dst_param_group g;
    DST_ASSERT_OK(dst_param_group_default(&g));
    g.lr = 0.5f;
    DST_ASSERT_OK(dst_optimizer_set_group(o.get(), 1, &g));
    const auto changed = capture();
    ASSERT_NE(changed, saved);
    DST_ASSERT_OK(dst_optimizer_load(o.get(), path.c_str()));
    const auto loaded = capture();
    for (size_t i = 0; i < saved.size(); ++i) EXPECT_TRUE(bit_equal(loaded[i], saved[i])) << "state " << i;

    // A corrupt file (one flipped byte in the data) is refused and changes nothing.
    std::string bytes;
    {
        std::ifstream in(path, std::ios::binary);
        bytes.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
    }
    const std::string bad = temp_path("corrupt.safetensors");
    {
        std::string flipped = bytes;
        flipped[flipped.size() - 3] ^= 0x10;
        std::ofstream(bad, std::ios::binary) << flipped;
    }
    for (int s = 0; s < 1; ++s) DST_ASSERT_OK(dst_optimizer_step(o.get(), 1.0f, 0.0f));
    const auto before = capture();
    EXPECT_FAILS(DST_ERR_FORMAT, "checksum", dst_optimizer_load(o.get(), bad.c_str()));
    EXPECT_EQ(capture(), before);
    {
        std::ofstream(bad, std::ios::binary) << bytes.substr(0, bytes.size() / 2);
    }
    EXPECT_FAILS(DST_ERR_FORMAT, "truncated", dst_optimizer_load(o.get(), bad.c_str()));
    EXPECT_EQ(capture(), before);
    // Another set of tensors: the message names the one that differs.
    {
        Opt other = make_opt(ctx.get(), opt_config(DST_OPTIMIZER_LAMB, 1e-3f, 0.01f, true));
        DST_ASSERT_OK(dst_optimizer_add_group(other.get(), nullptr, nullptr));
        Param a2(DST_DTYPE_FP32, DST_DTYPE_FP32, rng.normals(50), rng.normals(50));
        DST_ASSERT_OK(a2.add(other.get(), 0, "a"));
        EXPECT_FAILS(DST_ERR_FORMAT, "b", dst_optimizer_load(other.get(), path.c_str()));
        Opt adam = make_opt(ctx.get(), opt_config(DST_OPTIMIZER_ADAM, 1e-3f, 0.01f, true));
        EXPECT_FAILS(DST_ERR_FORMAT, "lamb", dst_optimizer_load(adam.get(), path.c_str()));
    }
    std::remove(path.c_str());
    std::remove(bad.c_str());
}

// ================================ bad input ======================================================

TEST(OptimApi, CreateAndGroupsBadArguments) {
    Ctx ctx = make_ctx();
    dst_optimizer *o = reinterpret_cast<dst_optimizer *>(0x1);
    dst_optimizer_config c;
    DST_ASSERT_OK(dst_optimizer_config_default(&c));
    EXPECT_FAILS(DST_ERR_INVALID_ARGUMENT, "config", dst_optimizer_config_default(nullptr));
    EXPECT_FAILS(DST_ERR_INVALID_ARGUMENT, "ctx", dst_optimizer_create(nullptr, &c, &o));
    EXPECT_FAILS(DST_ERR_INVALID_ARGUMENT, "out", dst_optimizer_create(ctx.get(), &c, nullptr));
    auto bad = [&](const char *field, void (*edit)(dst_optimizer_config *)) {
        dst_optimizer_config b = c;
        edit(&b);
        dst_optimizer *out = reinterpret_cast<dst_optimizer *>(0x1);
        EXPECT_FAILS(DST_ERR_INVALID_ARGUMENT, field, dst_optimizer_create(ctx.get(), &b, &out));
        EXPECT_EQ(out, reinterpret_cast<dst_optimizer *>(0x1)) << "out unchanged on failure";
    };
    bad("kind", [](dst_optimizer_config *b) { const int v = 7; std::memcpy(&b->kind, &v, sizeof v); });
    bad("lr", [](dst_optimizer_config *b) { b->lr = -1.0f; });
    bad("lr", [](dst_optimizer_config *b) { b->lr = INFINITY; });
    bad("beta1", [](dst_optimizer_config *b) { b->beta1 = 1.0f; });
    bad("beta2", [](dst_optimizer_config *b) { b->beta2 = -0.5f; });
    bad("eps", [](dst_optimizer_config *b) { b->eps = NAN; });
    bad("weight_decay", [](dst_optimizer_config *b) { b->weight_decay = -0.01f; });
    bad("max_coeff", [](dst_optimizer_config *b) { b->max_coeff = 0.0f; });
    bad("min_coeff", [](dst_optimizer_config *b) { b->min_coeff = 20.0f; });
    bad("struct_size", [](dst_optimizer_config *b) { b->struct_size = 3; });
    dst_optimizer_config newer = c;
    newer.struct_size = sizeof c + 8;
    EXPECT_FAILS(DST_ERR_UNSUPPORTED, "struct_size", dst_optimizer_create(ctx.get(), &newer, &o));
    // A caller built against a header that ended after `lr` gets the defaults for the rest.
    dst_optimizer_config older = c;
    older.struct_size = offsetof(dst_optimizer_config, lr) + sizeof(float);
    older.beta1 = 7.0f;  // past its struct: ignored
    Opt opt = make_opt(ctx.get(), older);
    dst_param_group g;
    g.struct_size = sizeof g;
    DST_ASSERT_OK(dst_optimizer_get_group(opt.get(), 0, &g));
    EXPECT_EQ(g.beta1, 0.9f);
    dst_optimizer_destroy(nullptr);

    EXPECT_FAILS(DST_ERR_INVALID_ARGUMENT, "group", dst_param_group_default(nullptr));
    EXPECT_FAILS(DST_ERR_INVALID_ARGUMENT, "opt", dst_optimizer_add_group(nullptr, &g, nullptr));
    dst_param_group bg = g;
    bg.eps = -1.0f;
    EXPECT_FAILS(DST_ERR_INVALID_ARGUMENT, "eps", dst_optimizer_add_group(opt.get(), &bg, nullptr));
    int count = 0;
    DST_ASSERT_OK(dst_optimizer_num_groups(opt.get(), &count));
    EXPECT_EQ(count, 1) << "a failed add_group adds nothing";
    for (int i = 1; i < DST_OPTIMIZER_MAX_GROUPS; ++i) DST_ASSERT_OK(dst_optimizer_add_group(opt.get(), nullptr, nullptr));
    EXPECT_FAILS(DST_ERR_CAPACITY, "groups", dst_optimizer_add_group(opt.get(), nullptr, nullptr));
    EXPECT_FAILS(DST_ERR_INVALID_ARGUMENT, "count", dst_optimizer_num_groups(opt.get(), nullptr));
    EXPECT_FAILS(DST_ERR_INVALID_ARGUMENT, "opt", dst_optimizer_num_groups(nullptr, &count));
    EXPECT_FAILS(DST_ERR_INVALID_ARGUMENT, "index", dst_optimizer_get_group(opt.get(), DST_OPTIMIZER_MAX_GROUPS, &g));
    EXPECT_FAILS(DST_ERR_INVALID_ARGUMENT, "index", dst_optimizer_get_group(opt.get(), -1, &g));
    EXPECT_FAILS(DST_ERR_INVALID_ARGUMENT, "group", dst_optimizer_get_group(opt.get(), 0, nullptr));
    dst_param_group sized = g;
    sized.struct_size = 5;
    EXPECT_FAILS(DST_ERR_INVALID_ARGUMENT, "struct_size", dst_optimizer_get_group(opt.get(), 0, &sized));
    EXPECT_FAILS(DST_ERR_INVALID_ARGUMENT, "index", dst_optimizer_set_group(opt.get(), 99, &g));
    EXPECT_FAILS(DST_ERR_INVALID_ARGUMENT, "group", dst_optimizer_set_group(opt.get(), 0, nullptr));
    bg = g;
    bg.lr = NAN;
    EXPECT_FAILS(DST_ERR_INVALID_ARGUMENT, "lr", dst_optimizer_set_group(opt.get(), 0, &bg));
    DST_ASSERT_OK(dst_optimizer_get_group(opt.get(), 0, &g));
    EXPECT_FALSE(std::isnan(g.lr)) << "a failed set_group changes nothing";
}

TEST(OptimApi, TensorsBadArguments) {
    Ctx ctx = make_ctx();
    Opt o = make_opt(ctx.get(), opt_config(DST_OPTIMIZER_ADAM, 1e-3f, 0.0f, true));
    Param x(DST_DTYPE_FP32, DST_DTYPE_FP32, {1, 2, 3, 4}, {1, 1, 1, 1});
    dst_tensor p = x.p.view(), g = x.g.view();
    EXPECT_FAILS(DST_ERR_INVALID_ARGUMENT, "opt", dst_optimizer_add_tensor(nullptr, 0, "x", &p, &g));
    EXPECT_FAILS(DST_ERR_INVALID_ARGUMENT, "name", dst_optimizer_add_tensor(o.get(), 0, nullptr, &p, &g));
    EXPECT_FAILS(DST_ERR_INVALID_ARGUMENT, "param", dst_optimizer_add_tensor(o.get(), 0, "x", nullptr, &g));
    EXPECT_FAILS(DST_ERR_INVALID_ARGUMENT, "grad", dst_optimizer_add_tensor(o.get(), 0, "x", &p, nullptr));
    EXPECT_FAILS(DST_ERR_INVALID_ARGUMENT, "group", dst_optimizer_add_tensor(o.get(), 1, "x", &p, &g));
    EXPECT_FAILS(DST_ERR_INVALID_ARGUMENT, "name", dst_optimizer_add_tensor(o.get(), 0, "", &p, &g));
    EXPECT_FAILS(DST_ERR_INVALID_ARGUMENT, "UTF-8", dst_optimizer_add_tensor(o.get(), 0, "\xff\xfe", &p, &g));
    auto bad_view = [&](const char *what, dst_status want, void (*edit)(dst_tensor *), bool on_grad) {
        dst_tensor pp = p, gg = g;
        edit(on_grad ? &gg : &pp);
        EXPECT_FAILS(want, what, dst_optimizer_add_tensor(o.get(), 0, "x", &pp, &gg));
    };
    bad_view("data", DST_ERR_INVALID_ARGUMENT, [](dst_tensor *t) { t->data = nullptr; }, false);
    bad_view("ndim", DST_ERR_INVALID_ARGUMENT, [](dst_tensor *t) { t->ndim = 0; }, false);
    bad_view("ndim", DST_ERR_INVALID_ARGUMENT, [](dst_tensor *t) { t->ndim = 5; }, true);
    bad_view("shape", DST_ERR_INVALID_ARGUMENT, [](dst_tensor *t) { t->shape[0] = 0; }, false);
    bad_view("fp64", DST_ERR_UNSUPPORTED, [](dst_tensor *t) { t->dtype = DST_DTYPE_FP64; }, false);
    bad_view("dtype", DST_ERR_INVALID_ARGUMENT, [](dst_tensor *t) { t->dtype = DST_DTYPE_INT32; }, false);
    bad_view("dtype", DST_ERR_INVALID_ARGUMENT, [](dst_tensor *t) { t->dtype = DST_DTYPE_BF16; }, true);
    bad_view("shape", DST_ERR_INVALID_ARGUMENT, [](dst_tensor *t) { t->shape[0] = 3; }, true);
    bad_view("aligned", DST_ERR_INVALID_ARGUMENT, [](dst_tensor *t) { t->data = static_cast<char *>(t->data) + 2; }, false);
    dst_tensor same = p;
    EXPECT_FAILS(DST_ERR_INVALID_ARGUMENT, "overlap", dst_optimizer_add_tensor(o.get(), 0, "x", &p, &same));
    int n = -1;
    DST_ASSERT_OK(dst_optimizer_num_tensors(o.get(), &n));
    EXPECT_EQ(n, 0) << "failed registrations register nothing";
    const auto p_bytes = x.p.bytes();
    DST_ASSERT_OK(dst_optimizer_add_tensor(o.get(), 0, "x", &p, &g));
    EXPECT_TRUE(x.p.same_bytes(p_bytes)) << "registration leaves the parameter as it is";
    Param y(DST_DTYPE_FP32, DST_DTYPE_FP32, {1, 2}, {1, 1});
    dst_tensor yp = y.p.view(), yg = y.g.view();
    EXPECT_FAILS(DST_ERR_INVALID_ARGUMENT, "registered", dst_optimizer_add_tensor(o.get(), 0, "x", &yp, &yg));
    Param z(DST_DTYPE_FP32, DST_DTYPE_FP32, {1}, {1});
    dst_tensor zp = z.p.view(), zg = z.g.view(), part_p = zp, part_g = zg;
    part_p.data = static_cast<float *>(p.data) + 2;  // inside x's parameter
    part_g.data = static_cast<float *>(g.data) + 3;  // inside x's gradient
    EXPECT_FAILS(DST_ERR_INVALID_ARGUMENT, "overlaps", dst_optimizer_add_tensor(o.get(), 0, "y", &part_p, &zg));
    EXPECT_FAILS(DST_ERR_INVALID_ARGUMENT, "overlaps", dst_optimizer_add_tensor(o.get(), 0, "y", &zp, &part_g));

    // Layers.
    dst_layer_config lc = small_config(16, 4);
    Layer layer = make_layer(ctx.get(), lc);
    EXPECT_FAILS(DST_ERR_INVALID_ARGUMENT, "opt", dst_optimizer_add_layer(nullptr, layer.get(), nullptr, 0, 0));
    EXPECT_FAILS(DST_ERR_INVALID_ARGUMENT, "layer", dst_optimizer_add_layer(o.get(), nullptr, nullptr, 0, 0));
    EXPECT_FAILS(DST_ERR_INVALID_ARGUMENT, "decay_group", dst_optimizer_add_layer(o.get(), layer.get(), nullptr, 2, 0));
    EXPECT_FAILS(DST_ERR_INVALID_ARGUMENT, "no_decay_group", dst_optimizer_add_layer(o.get(), layer.get(), nullptr, 0, -1));
    DST_ASSERT_OK(dst_optimizer_add_layer(o.get(), layer.get(), "", 0, 0));
    EXPECT_FAILS(DST_ERR_INVALID_ARGUMENT, "registered", dst_optimizer_add_layer(o.get(), layer.get(), "", 0, 0));
    EXPECT_FAILS(DST_ERR_INVALID_ARGUMENT, "overlaps", dst_optimizer_add_layer(o.get(), layer.get(), "again.", 0, 0));
    DST_ASSERT_OK(dst_optimizer_num_tensors(o.get(), &n));
    EXPECT_EQ(n, 1 + DST_PARAM_COUNT) << "the layer registered once, the later attempts refused whole";
    Ctx other = make_ctx();
    Layer foreign = make_layer(other.get(), lc);
    EXPECT_FAILS(DST_ERR_INVALID_ARGUMENT, "context", dst_optimizer_add_layer(o.get(), foreign.get(), "f.", 0, 0));
    dst_layer_config l64 = lc;
    l64.dtype = DST_DTYPE_FP64;
    Layer layer64 = make_layer(ctx.get(), l64);
    EXPECT_FAILS(DST_ERR_UNSUPPORTED, "fp64", dst_optimizer_add_layer(o.get(), layer64.get(), "d.", 0, 0));

    // Lookups, info, state.
    int index = 0;
    EXPECT_FAILS(DST_ERR_INVALID_ARGUMENT, "count", dst_optimizer_num_tensors(o.get(), nullptr));
    EXPECT_FAILS(DST_ERR_INVALID_ARGUMENT, "nope", dst_optimizer_find_tensor(o.get(), "nope", &index));
    EXPECT_FAILS(DST_ERR_INVALID_ARGUMENT, "index", dst_optimizer_find_tensor(o.get(), "x", nullptr));
    dst_optimizer_tensor_info info;
    info.struct_size = sizeof info;
    EXPECT_FAILS(DST_ERR_INVALID_ARGUMENT, "index", dst_optimizer_get_tensor_info(o.get(), 99, &info));
    EXPECT_FAILS(DST_ERR_INVALID_ARGUMENT, "info", dst_optimizer_get_tensor_info(o.get(), 0, nullptr));
    info.struct_size = 1;
    EXPECT_FAILS(DST_ERR_INVALID_ARGUMENT, "struct_size", dst_optimizer_get_tensor_info(o.get(), 0, &info));
    dst_tensor view;
    dst_optimizer_state which;
    const int nine = 9;
    std::memcpy(&which, &nine, sizeof which);
    EXPECT_FAILS(DST_ERR_INVALID_ARGUMENT, "which", dst_optimizer_get_state(o.get(), 0, which, &view));
    EXPECT_FAILS(DST_ERR_INVALID_ARGUMENT, "index", dst_optimizer_get_state(o.get(), -1, DST_OPTIMIZER_STATE_EXP_AVG, &view));
    EXPECT_FAILS(DST_ERR_INVALID_ARGUMENT, "view", dst_optimizer_get_state(o.get(), 0, DST_OPTIMIZER_STATE_EXP_AVG, nullptr));
    EXPECT_FAILS(DST_ERR_INVALID_ARGUMENT, "step", dst_optimizer_set_step(o.get(), 0, -1));
    EXPECT_FAILS(DST_ERR_INVALID_ARGUMENT, "index", dst_optimizer_set_step(o.get(), 1000, 1));
    EXPECT_FAILS(DST_ERR_INVALID_ARGUMENT, "opt", dst_optimizer_refresh_masters(nullptr));

    // A NULL optimizer, everywhere.
    dst_param_group pg;
    dst_param_group_default(&pg);
    EXPECT_FAILS(DST_ERR_INVALID_ARGUMENT, "opt", dst_optimizer_get_group(nullptr, 0, &pg));
    EXPECT_FAILS(DST_ERR_INVALID_ARGUMENT, "opt", dst_optimizer_set_group(nullptr, 0, &pg));
    EXPECT_FAILS(DST_ERR_INVALID_ARGUMENT, "opt", dst_optimizer_num_tensors(nullptr, &n));
    EXPECT_FAILS(DST_ERR_INVALID_ARGUMENT, "opt", dst_optimizer_find_tensor(nullptr, "x", &index));
    EXPECT_FAILS(DST_ERR_INVALID_ARGUMENT, "name", dst_optimizer_find_tensor(o.get(), nullptr, &index));
    info.struct_size = sizeof info;
    EXPECT_FAILS(DST_ERR_INVALID_ARGUMENT, "opt", dst_optimizer_get_tensor_info(nullptr, 0, &info));
    EXPECT_FAILS(DST_ERR_INVALID_ARGUMENT, "opt", dst_optimizer_get_state(nullptr, 0, DST_OPTIMIZER_STATE_EXP_AVG, &view));
    EXPECT_FAILS(DST_ERR_INVALID_ARGUMENT, "opt", dst_optimizer_set_step(nullptr, 0, 1));

    // Steps: bad arguments change no parameter.
    const auto before = x.p.bytes();
    EXPECT_FAILS(DST_ERR_INVALID_ARGUMENT, "opt", dst_optimizer_step(nullptr, 1.0f, 0.0f));
    EXPECT_FAILS(DST_ERR_INVALID_ARGUMENT, "grad_scale", dst_optimizer_step(o.get(), 0.0f, 0.0f));
    EXPECT_FAILS(DST_ERR_INVALID_ARGUMENT, "grad_scale", dst_optimizer_step(o.get(), NAN, 0.0f));
    EXPECT_FAILS(DST_ERR_INVALID_ARGUMENT, "grad_scale", dst_optimizer_step(o.get(), INFINITY, 0.0f));
    EXPECT_FAILS(DST_ERR_INVALID_ARGUMENT, "max_grad_norm", dst_optimizer_step(o.get(), 1.0f, -1.0f));
    EXPECT_FAILS(DST_ERR_INVALID_ARGUMENT, "max_grad_norm", dst_optimizer_step(o.get(), 1.0f, NAN));
    EXPECT_TRUE(x.p.same_bytes(before));
    float norm;
    EXPECT_FAILS(DST_ERR_INVALID_ARGUMENT, "norm", dst_optimizer_get_grad_norm(o.get(), nullptr));
    EXPECT_FAILS(DST_ERR_INVALID_ARGUMENT, "opt", dst_optimizer_get_grad_norm(nullptr, &norm));

    // Files.
    EXPECT_FAILS(DST_ERR_INVALID_ARGUMENT, "path", dst_optimizer_save(o.get(), nullptr));
    EXPECT_FAILS(DST_ERR_INVALID_ARGUMENT, "path", dst_optimizer_save(o.get(), ""));
    EXPECT_FAILS(DST_ERR_INVALID_ARGUMENT, "opt", dst_optimizer_save(nullptr, "x"));
    EXPECT_FAILS(DST_ERR_IO, "temporary", dst_optimizer_save(o.get(), "/nonexistent-dir/o.safetensors"));
    EXPECT_FAILS(DST_ERR_IO, "nonexistent", dst_optimizer_load(o.get(), "/nonexistent-dir/o.safetensors"));
    EXPECT_FAILS(DST_ERR_INVALID_ARGUMENT, "path", dst_optimizer_load(o.get(), nullptr));
    EXPECT_FAILS(DST_ERR_INVALID_ARGUMENT, "opt", dst_optimizer_load(nullptr, "x"));
    // A safetensors file of another kind (a layer checkpoint) is not an optimizer file.
    const std::string lpath = temp_path("layer.safetensors");
    dst_layer *layers[1] = {layer.get()};
    DST_ASSERT_OK(dst_checkpoint_save(layers, 1, lpath.c_str(), nullptr));
    EXPECT_FAILS(DST_ERR_FORMAT, "format", dst_optimizer_load(o.get(), lpath.c_str()));
    std::remove(lpath.c_str());
}

}  // namespace
