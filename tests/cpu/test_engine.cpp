// The training engine through the public C API on the CPU backend: the loss-scaler state machines on a
// scripted overflow pattern (spec §5.3 and the §9 table), static and unit scales, the learning-rate
// schedules against the §9 oracles (by the lr each step really applies), rewarm, clipping under fp16,
// gradient accumulation ≡ one large batch, bf16 masters, training-state checkpoints (layout, client
// state, atomic overwrite, every failure leaving everything as it was, load options), resuming
// bit-identically, and bad input on every entry point.
#include <gtest/gtest.h>

#include <sys/stat.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "engine_util.h"
#include "../common/scratch_dir.h"
#include "test_util.h"

using namespace dsttest;

namespace {

std::string file_text(const std::string &path) {
    std::ifstream in(path, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

bool exists(const std::string &path) {
    struct stat sb;
    return ::stat(path.c_str(), &sb) == 0;
}

std::string fresh_dir(const std::string &name) {
    const std::string d = dst_test::scratch_path("engine_" + name);
    std::error_code ec;
    std::filesystem::remove_all(d, ec);
    EXPECT_FALSE(ec) << "removing " << d << ": " << ec.message();
    return d;
}

// ================================ loss scaling ===================================================

// Runs the overflow pattern over optimizer steps (X = an inf gradient) and returns the scale each
// step used; checks that overflowed steps change nothing and that the others do.
std::vector<float> scale_sequence(const std::string &fp16, const std::string &pattern, const char *opt = "adam",
                                  float *after = nullptr) {
    Ctx ctx = make_ctx();
    Engine e = make_engine(ctx.get(), std::string(R"({"train_batch_size": 1, "optimizer": {"type": ")") + opt +
                                           R"("}, "fp16": )" + fp16 + "}");
    Param x(DST_DTYPE_FP16, DST_DTYPE_FP16, {1.0, -2.0, 0.5});
    DST_EXPECT_OK(x.add(optimizer_of(e.get()), 0, "x"));
    std::vector<float> used;
    int64_t skipped = 0;
    for (char c : pattern) {
        used.push_back(engine_state(e.get()).loss_scale);
        x.g.set_doubles({0.25, 0.5, -1.0});
        if (c == 'X') x.g.set(1, INFINITY);
        const auto before = x.p.bytes();
        EXPECT_EQ(dst_engine_step(e.get()), DST_OK) << dst_last_error();
        const dst_engine_state s = engine_state(e.get());
        EXPECT_EQ(s.last_overflow, c == 'X');
        EXPECT_EQ(s.last_step_applied, c != 'X');
        if (c == 'X') {
            ++skipped;
            EXPECT_TRUE(x.p.same_bytes(before)) << "an overflowed step changes no weight";
        } else {
            EXPECT_FALSE(x.p.same_bytes(before));
        }
        EXPECT_EQ(s.skipped_steps, skipped);
        EXPECT_EQ(x.g.doubles(), std::vector<double>(3, 0.0)) << "gradients are zeroed at every boundary";
    }
    if (after) *after = engine_state(e.get()).loss_scale;
    return used;
}

std::vector<float> repeat(std::initializer_list<std::pair<float, int>> runs) {
    std::vector<float> v;
    for (const auto &r : runs) v.insert(v.end(), static_cast<size_t>(r.second), r.first);
    return v;
}

TEST(EngineLossScale, Stage0SequenceOfTheSpec) {
    float after = 0.0f;
    const std::vector<float> got =
        scale_sequence(R"({"enabled": true, "loss_scale": 0, "initial_scale_power": 16, "loss_scale_window": 4,
                          "min_loss_scale": 1})",
                       ".....X.....XX.....", "adam", &after);
    EXPECT_EQ(got, repeat({{65536, 5}, {131072, 1}, {65536, 5}, {131072, 1}, {65536, 1}, {32768, 5}}));
    EXPECT_EQ(after, 65536.0f);
    // The hysteresis keys are inert in this rule (DeepSpeed's stage-0 wrappers ignore them).
    EXPECT_EQ(scale_sequence(R"({"enabled": true, "initial_scale_power": 16, "loss_scale_window": 4, "hysteresis": 5})",
                             ".....X.....XX....."),
              got);
}

TEST(EngineLossScale, HysteresisRuleSequenceOfTheSpec) {
    const std::vector<float> want = repeat({{65536, 4}, {131072, 6}, {262144, 3}, {131072, 4}, {262144, 1}});
    for (const char *consecutive : {"false", "true"}) {
        const std::string fp16 = std::string(R"({"enabled": true, "initial_scale_power": 16, "loss_scale_window": 4,
            "hysteresis": 2, "consecutive_hysteresis": )") + consecutive + R"(, "hysteresis_enabled": true})";
        EXPECT_EQ(scale_sequence(fp16, ".....X.....XX....."), want) << "consecutive_hysteresis " << consecutive;
    }
}

TEST(EngineLossScale, FloorsOfTheFp16Wrappers) {
    // Without any dynamic-scaler key, DeepSpeed keeps each wrapper's defaults: min 1 for FusedAdam's,
    // 0.25 for FusedLamb's (unfused) one; a key present gives min_loss_scale (default 1) to both.
    const std::string twenty(20, 'X');
    float after = 0.0f;
    scale_sequence(R"({"enabled": true})", twenty, "lamb", &after);
    EXPECT_EQ(after, 0.25f);
    scale_sequence(R"({"enabled": true})", twenty, "adam", &after);
    EXPECT_EQ(after, 1.0f);
    scale_sequence(R"({"enabled": true, "loss_scale_window": 1000})", twenty, "lamb", &after);
    EXPECT_EQ(after, 1.0f);
    scale_sequence(R"({"enabled": true, "min_loss_scale": 8})", twenty, "adam", &after);
    EXPECT_EQ(after, 8.0f);
}

TEST(EngineLossScale, StaticScaleStillSkipsOverflows) {
    float after = 0.0f;
    const std::vector<float> got = scale_sequence(R"({"enabled": true, "loss_scale": 128})", "..X.XX..", "adam", &after);
    EXPECT_EQ(got, std::vector<float>(8, 128.0f));
    EXPECT_EQ(after, 128.0f);
}

TEST(EngineLossScale, ScaleLossGradientUsesTheDeviceScale) {
    Ctx ctx = make_ctx();
    Engine e = make_engine(ctx.get(), R"({"train_batch_size": 4, "gradient_accumulation_steps": 4,
        "optimizer": {"type": "adam"}, "fp16": {"enabled": true, "initial_scale_power": 10}})");
    HostTensor t = HostTensor::from_doubles(DST_DTYPE_FP32, {3}, {1.0, -0.5, 2.0});
    dst_tensor v = t.view();
    DST_ASSERT_OK(dst_engine_scale_loss_gradient(e.get(), &v));
    EXPECT_EQ(t.doubles(), (std::vector<double>{256.0, -128.0, 512.0})) << "× 1024 / 4";
    HostTensor h = HostTensor::from_doubles(DST_DTYPE_FP16, {2}, {0.5, 1.0});
    dst_tensor hv = h.view();
    DST_ASSERT_OK(dst_engine_scale_loss_gradient(e.get(), &hv));
    EXPECT_EQ(h.doubles(), (std::vector<double>{128.0, 256.0}));
    const float *scale = nullptr;
    DST_ASSERT_OK(dst_engine_loss_scale_pointer(e.get(), &scale));
    EXPECT_EQ(*scale, 1024.0f) << "the CPU backend's memory is host memory";
    // Without fp16 the scale is 1 and only the accumulation divides.
    Engine f = make_engine(ctx.get(), R"({"train_batch_size": 2, "gradient_accumulation_steps": 2, "optimizer": {"type": "adam"}})");
    DST_ASSERT_OK(dst_engine_scale_loss_gradient(f.get(), &v));
    EXPECT_EQ(t.doubles(), (std::vector<double>{128.0, -64.0, 256.0}));
    EXPECT_EQ(engine_state(f.get()).loss_scale, 1.0f);
}

TEST(EngineLossScale, Fp32AndBf16NeverSkip) {
    // DeepSpeed checks overflow only in its fp16 wrappers; fp32 and bf16 steps are always applied.
    for (const char *prec : {"", R"(, "bf16": {"enabled": true})"}) {
        Ctx ctx = make_ctx();
        Engine e = make_engine(ctx.get(), std::string(R"({"train_batch_size": 1, "optimizer": {"type": "adam"})") + prec + "}");
        Param x(*prec ? DST_DTYPE_BF16 : DST_DTYPE_FP32, DST_DTYPE_FP32, {1.0, 2.0});
        DST_EXPECT_OK(x.add(optimizer_of(e.get()), 0, "x"));
        x.g.set_doubles({NAN, 1.0});
        DST_ASSERT_OK(dst_engine_step(e.get()));
        const dst_engine_state s = engine_state(e.get());
        EXPECT_EQ(s.skipped_steps, 0);
        EXPECT_EQ(s.last_step_applied, 1);
        EXPECT_TRUE(std::isnan(x.p.get(0)));
        EXPECT_EQ(s.loss_scale, 1.0f);
    }
}

// ================================ schedules ======================================================

// The lr the engine applies at each of `steps` boundary steps: with β1 = β2 = 0 and no bias
// correction, Adam's update is lr·g/(|g| + eps) = lr for g = 1 (eps 1e-30), measured from p = 0.
// `reported` receives dst_engine_get_lr before each step.
std::vector<double> applied_lrs(const std::string &scheduler, int steps, const std::string &lr = "1e-3",
                                std::vector<double> *reported = nullptr, const std::string &fp16 = "") {
    Ctx ctx = make_ctx();
    EXPECT_EQ(dst_context_set_num_threads(ctx.get(), 1), DST_OK);
    Engine e = make_engine(ctx.get(), R"({"train_batch_size": 1, "optimizer": {"type": "adam", "params": {"lr": )" + lr +
                                          R"(, "betas": [0, 0], "eps": 1e-30, "bias_correction": false}}, "scheduler": )" +
                                          scheduler + fp16 + "}");
    Param x(fp16.empty() ? DST_DTYPE_FP32 : DST_DTYPE_FP16, DST_DTYPE_FP32, {0.0});
    DST_EXPECT_OK(x.add(optimizer_of(e.get()), 0, "x"));
    std::vector<double> out;
    for (int s = 0; s < steps; ++s) {
        if (reported) reported->push_back(engine_lr(e.get()));
        x.p.set(0, 0.0);
        EXPECT_EQ(dst_optimizer_refresh_masters(optimizer_of(e.get())), DST_OK);
        x.g.set(0, fp16.empty() ? 1.0 : 65536.0);
        if (!fp16.empty() && s == 1) x.g.set(0, INFINITY);  // fp16 runs: step 1 overflows
        EXPECT_EQ(dst_engine_step(e.get()), DST_OK) << dst_last_error();
        EXPECT_EQ(dst_optimizer_refresh_masters(optimizer_of(e.get())), DST_OK);
        out.push_back(-x.p.get(0));
    }
    return out;
}

void expect_lr(const std::vector<double> &lrs, size_t at, double want, const char *what) {
    ASSERT_LT(at, lrs.size());
    EXPECT_NEAR(lrs[at], want, 2e-6 * std::fabs(want) + 1e-12) << what << " at " << at;
}

TEST(EngineSchedule, WarmupLROracles) {
    std::vector<double> reported;
    const std::vector<double> log = applied_lrs(R"({"type": "WarmupLR", "params": {"warmup_min_lr": 0,
        "warmup_max_lr": 0.001, "warmup_num_steps": 1000}})", 1002, "1e-3", &reported);
    for (size_t n : {size_t(0), size_t(1)}) expect_lr(log, n, 0.0, "log");
    expect_lr(log, 2, 1.003433319e-4, "log");
    expect_lr(log, 10, 3.333333333e-4, "log");
    expect_lr(log, 500, 8.996566681e-4, "log");
    expect_lr(log, 1000, 1e-3, "log");
    expect_lr(log, 1001, 1e-3, "log");
    for (size_t n = 0; n < log.size(); ++n) expect_lr(reported, n, log[n], "dst_engine_get_lr");
    const std::vector<double> lin = applied_lrs(R"({"type": "WarmupLR", "params": {"warmup_type": "linear"}})", 1002);
    expect_lr(lin, 2, 1e-6, "linear");
    expect_lr(lin, 500, 4.99e-4, "linear");
    expect_lr(lin, 1000, 9.99e-4, "linear");
    expect_lr(lin, 1001, 1e-3, "linear");
}

TEST(EngineSchedule, WarmupDecayAndCosineOracles) {
    const std::vector<double> d = applied_lrs(R"({"type": "WarmupDecayLR", "params": {"warmup_type": "linear",
        "total_num_steps": 2000}})", 2002);
    expect_lr(d, 1500, 5.01e-4, "WarmupDecayLR");
    expect_lr(d, 2000, 1e-6, "WarmupDecayLR");
    expect_lr(d, 2001, 0.0, "WarmupDecayLR");
    const std::vector<double> c = applied_lrs(R"({"type": "WarmupCosineLR", "params": {"warmup_type": "linear",
        "total_num_steps": 2000}})", 2001);
    expect_lr(c, 1001, 9.999975328e-4, "WarmupCosineLR");
    expect_lr(c, 1500, 5.0005e-4, "WarmupCosineLR");
    expect_lr(c, 2000, 1e-7, "WarmupCosineLR");
}

TEST(EngineSchedule, SkippedStepsDoNotAdvanceDeepSpeedSchedulers) {
    // fp16, step 1 overflows: DeepSpeed does not step its scheduler then, so the step after it uses the
    // value the skipped one would have.
    const std::vector<double> lrs = applied_lrs(R"({"type": "WarmupLR", "params": {"warmup_type": "linear",
        "warmup_num_steps": 10, "warmup_max_lr": 0.01}})", 5, "1e-3", nullptr, R"(, "fp16": {"enabled": true})");
    EXPECT_EQ(lrs[1], 0.0) << "skipped";
    // successful steps n = 0, 1, 2, 3 at steps 0, 2, 3, 4: lr = 0.01·(n − 1)/10, 0 for n = 0
    expect_lr(lrs, 0, 0.0, "n = 0");
    expect_lr(lrs, 2, 0.0, "n = 1");
    EXPECT_NEAR(lrs[3], 0.001, 1e-6);  // fp16 parameter: the applied lr read back in half precision
    EXPECT_NEAR(lrs[4], 0.002, 2e-6);
}

TEST(EngineSchedule, BertScriptOracles) {
    const std::string ee = R"({"type": "warmup_exp_decay_exp", "params": {"learning_rate": 0.011, "warmup_proportion": 0.02,
        "decay_rate": 0.9, "decay_step": 250, "total_training_steps": 7500, "lr_offset": 0.001}})";
    const std::vector<double> a = applied_lrs(ee, 7500);
    const std::pair<size_t, double> ee_oracle[] = {
        {0, 0.001}, {1, 0.001000488889}, {10, 0.001048888889}, {75, 0.00375}, {149, 0.01185382222}, {150, 0.012},
        {151, 0.01199536511}, {250, 0.01154604667}, {400, 0.0109}, {1000, 0.008688068023}, {3000, 0.004309461192},
        {7499, 0.001496941759}};
    for (const auto &o : ee_oracle) expect_lr(a, o.first, o.second, "EE warmup 0.02");
    const std::vector<double> b = applied_lrs(R"({"type": "warmup_exp_decay_exp", "params": {"learning_rate": 0.011,
        "warmup_proportion": 0.06, "decay_rate": 0.9, "decay_step": 250, "total_training_steps": 7500, "lr_offset": 0.001}})", 701);
    const std::pair<size_t, double> b_oracle[] = {{1, 0.001000054321}, {225, 0.00375}, {449, 0.01195116543},
                                                  {450, 0.012}, {700, 0.0109}};
    for (const auto &o : b_oracle) expect_lr(b, o.first, o.second, "EE warmup 0.06");
    const std::vector<double> le = applied_lrs(R"({"type": "warmup_linear_decay_exp", "params": {"learning_rate": 4e-4,
        "warmup_proportion": 0.1, "decay_rate": 0.99, "decay_step": 520, "total_training_steps": 125000}})", 50001);
    const std::pair<size_t, double> le_oracle[] = {{6250, 2e-4}, {12500, 4e-4}, {13020, 3.96e-4}, {50000, 1.937717096e-4}};
    for (const auto &o : le_oracle) expect_lr(le, o.first, o.second, "LE");
    // warmup_linear goes negative past the total (the script's formula): the factor −0.1 at s = 1100.
    std::vector<double> wl_reported;
    applied_lrs(R"({"type": "warmup_linear", "params": {"learning_rate": 1.0, "warmup_proportion": 0.1,
        "total_training_steps": 1000}})", 1101, "1e-3", &wl_reported);
    const std::pair<size_t, double> wl[] = {{50, 0.5}, {99, 0.99}, {100, 0.9}, {999, 0.001}, {1100, -0.1}};
    for (const auto &o : wl) expect_lr(wl_reported, o.first, o.second, "warmup_linear factor");
}

// ================================ clipping, accumulation, bf16 ===================================

TEST(EngineClip, Fp16ClippingOracle) {
    // S = 65536, true norm 2.5 (25 × 0.5, stored as 32768 in fp16), clip 1: factor 0.39999984 (spec §9).
    Ctx ctx = make_ctx();
    Engine e = make_engine(ctx.get(), R"({"train_batch_size": 1, "gradient_clipping": 1.0,
        "optimizer": {"type": "adam", "params": {"bias_correction": false}}, "fp16": {"enabled": true, "loss_scale": 65536}})");
    Param x(DST_DTYPE_FP16, DST_DTYPE_FP16, std::vector<double>(25, 1.0));
    DST_EXPECT_OK(x.add(optimizer_of(e.get()), 0, "x"));
    x.g.set_doubles(std::vector<double>(25, 32768.0));
    DST_ASSERT_OK(dst_engine_step(e.get()));
    const dst_engine_state s = engine_state(e.get());
    EXPECT_NEAR(s.grad_norm, 2.5, 1e-6);
    dst_tensor m;
    DST_ASSERT_OK(dst_optimizer_get_state(optimizer_of(e.get()), 0, DST_OPTIMIZER_STATE_EXP_AVG, &m));
    for (int i = 0; i < 25; ++i)
        EXPECT_NEAR(static_cast<const float *>(m.data)[i], 0.1 * 0.5 * 0.39999984, 1e-6 * 0.02) << i;
}

// Two fp32 layers without dropout trained for two steps of `gas` micro-batches of `micro` sequences
// (6 per step); their weights after it. With write_first the engine leaves the gradients at each
// boundary (dst_engine_set_zero_grads_on_step(0)) and the first micro-batch of a step writes them.
static std::vector<std::vector<double>> accumulation_run(int micro, int gas, bool write_first = false) {
    Ctx ctx = make_ctx();
    dst_layer_config cfg = small_config(16, 4, 32);
    cfg.hidden_dropout_ratio = cfg.attn_dropout_ratio = 0.0f;
    cfg.max_batch_tokens = 6 * 5;
    cfg.max_seq_len = 5;
    Layer l0 = make_layer(ctx.get(), cfg), l1 = make_layer(ctx.get(), cfg);
    Engine e = make_engine(ctx.get(), "{\"train_batch_size\": 6, \"train_micro_batch_size_per_gpu\": " +
                                          std::to_string(micro) +
                                          R"(, "optimizer": {"type": "adamw", "params": {"lr": 0.01, "weight_decay": 0.01}}})");
    EXPECT_EQ(engine_state(e.get()).gradient_accumulation_steps, gas);
    dst_optimizer *o = optimizer_of(e.get());
    EXPECT_EQ(dst_optimizer_add_layer(o, l0.get(), "l0.", 0, 0), DST_OK);
    EXPECT_EQ(dst_optimizer_add_layer(o, l1.get(), "l1.", 0, 0), DST_OK);
    EXPECT_EQ(dst_engine_zero_grads(e.get()), DST_OK);
    if (write_first) {
        EXPECT_EQ(dst_engine_set_zero_grads_on_step(e.get(), 0), DST_OK);
    }
    const int64_t S = 5, H = 16;
    for (int boundary = 0; boundary < 2; ++boundary) {
        Rng rng(77 + boundary);
        const std::vector<double> x = rng.normals(6 * S * H), t = rng.normals(6 * S * H);
        for (int k = 0; k < gas; ++k) {
            const int64_t n = micro * S * H;
            std::vector<double> xs(x.begin() + k * n, x.begin() + (k + 1) * n);
            HostTensor in = HostTensor::from_doubles(DST_DTYPE_FP32, {micro, S, H}, xs);
            HostTensor mid(DST_DTYPE_FP32, {micro, S, H}), out(DST_DTYPE_FP32, {micro, S, H});
            dst_tensor iv = in.view(), mv = mid.view(), ov = out.view();
            EXPECT_EQ(dst_layer_forward(l0.get(), nullptr, &iv, nullptr, &mv), DST_OK);
            EXPECT_EQ(dst_layer_forward(l1.get(), nullptr, &mv, nullptr, &ov), DST_OK);
            HostTensor dy(DST_DTYPE_FP32, {micro, S, H}), dmid(DST_DTYPE_FP32, {micro, S, H}),
                dx(DST_DTYPE_FP32, {micro, S, H});
            for (int64_t i = 0; i < n; ++i)  // d/dy of the micro-batch's mean ½‖y − t‖² over tokens
                dy.set(i, (out.get(i) - t[static_cast<size_t>(k * n + i)]) / static_cast<double>(micro * S));
            dst_tensor dyv = dy.view(), dmv = dmid.view(), dxv = dx.view();
            EXPECT_EQ(dst_engine_scale_loss_gradient(e.get(), &dyv), DST_OK);
            const dst_grad_mode mode = write_first && k == 0 ? DST_GRAD_WRITE : DST_GRAD_ACCUMULATE;
            EXPECT_EQ(dst_layer_backward(l1.get(), nullptr, &dyv, &dmv, mode), DST_OK);
            EXPECT_EQ(dst_layer_backward(l0.get(), nullptr, &dmv, &dxv, mode), DST_OK);
            int boundary_next = -1;
            EXPECT_EQ(dst_engine_is_boundary(e.get(), &boundary_next), DST_OK);
            EXPECT_EQ(boundary_next, k == gas - 1);
            EXPECT_EQ(dst_engine_step(e.get()), DST_OK) << dst_last_error();
        }
    }
    EXPECT_EQ(engine_state(e.get()).global_steps, 2);
    EXPECT_EQ(engine_state(e.get()).micro_steps, 2 * gas);
    EXPECT_EQ(engine_state(e.get()).global_samples, 12);
    std::vector<std::vector<double>> w;
    for (dst_layer *l : {l0.get(), l1.get()})
        for (int p = 0; p < DST_PARAM_COUNT; ++p) w.push_back(get_param(l, kParamNames[p]));
    if (write_first) {  // the gradients of the last step are still there
        double sum = 0;
        for (const double g : get_grad(l1.get(), kParamNames[DST_PARAM_OUTPUT_W])) sum += std::fabs(g);
        EXPECT_GT(sum, 0.0) << "the engine left the gradients as the last step found them";
    }
    return w;
}

TEST(EngineAccumulation, KMicroBatchesEqualOneBatchKTimesAsLarge) {
    // Micro-batches of 2 sequences × 3 accumulation steps against one batch of 6. The gradients differ
    // only by summation order, so the weights agree to fp32 rounding.
    const auto big = accumulation_run(6, 1), small = accumulation_run(2, 3);
    ASSERT_EQ(big.size(), small.size());
    for (size_t i = 0; i < big.size(); ++i) {
        std::vector<double> a = small[i], b = big[i];
        if (i % DST_PARAM_COUNT == DST_PARAM_ATTN_QKVB) {
            // The key bias's gradient is zero in exact arithmetic (it adds q·b_k to every score of a
            // query row, which softmax cancels), so both runs hold rounding noise there, which Adam's
            // normalisation turns into steps of ±lr: compare the query and value biases only.
            const size_t h = a.size() / 3;
            a.erase(a.begin() + h, a.begin() + 2 * h);
            b.erase(b.begin() + h, b.begin() + 2 * h);
        }
        EXPECT_LT(rel_l2(a, b), 1e-6) << "tensor " << i;
    }
}

TEST(EngineAccumulation, WritingTheFirstMicroBatchEqualsZeroingAtTheBoundary) {
    // Leaving the gradients at the boundary and writing them in a step's first micro-batch is the same
    // arithmetic as zeroing them and adding to zero: the same weights, value for value.
    for (const int gas : {1, 3}) {
        const auto zeroed = accumulation_run(6 / gas, gas), written = accumulation_run(6 / gas, gas, true);
        ASSERT_EQ(zeroed.size(), written.size());
        for (size_t i = 0; i < zeroed.size(); ++i) EXPECT_EQ(zeroed[i], written[i]) << "gas " << gas << " tensor " << i;
    }
}

TEST(EngineAccumulation, ZeroGradsOnStepSetting) {
    Ctx ctx = make_ctx();
    Engine e = make_engine(ctx.get(), R"({"train_batch_size": 1, "optimizer": {"type": "adam"}, "fp16": {"enabled": true}})");
    Param x(DST_DTYPE_FP16, DST_DTYPE_FP16, {1.0, -2.0, 0.5});
    DST_ASSERT_OK(x.add(optimizer_of(e.get()), 0, "x"));
    int on = -1;
    DST_ASSERT_OK(dst_engine_get_zero_grads_on_step(e.get(), &on));
    EXPECT_EQ(on, 1) << "zeroing at each boundary is the default";
    for (const int bad : {-1, 2, 7})
        EXPECT_FAILS(DST_ERR_INVALID_ARGUMENT, "enabled", dst_engine_set_zero_grads_on_step(e.get(), bad));
    DST_ASSERT_OK(dst_engine_get_zero_grads_on_step(e.get(), &on));
    EXPECT_EQ(on, 1) << "a refused value leaves the setting";
    EXPECT_FAILS(DST_ERR_INVALID_ARGUMENT, "engine", dst_engine_set_zero_grads_on_step(nullptr, 0));
    EXPECT_FAILS(DST_ERR_INVALID_ARGUMENT, "engine", dst_engine_get_zero_grads_on_step(nullptr, &on));
    EXPECT_FAILS(DST_ERR_INVALID_ARGUMENT, "enabled", dst_engine_get_zero_grads_on_step(e.get(), nullptr));

    DST_ASSERT_OK(dst_engine_set_zero_grads_on_step(e.get(), 0));
    DST_ASSERT_OK(dst_engine_get_zero_grads_on_step(e.get(), &on));
    EXPECT_EQ(on, 0);
    // An applied step and an overflowed (skipped) one both leave the gradients.
    x.g.set_doubles({0.25, 0.5, -1.0});
    const auto before = x.p.bytes();
    DST_ASSERT_OK(dst_engine_step(e.get()));
    EXPECT_FALSE(x.p.same_bytes(before));
    EXPECT_EQ(x.g.doubles(), (std::vector<double>{0.25, 0.5, -1.0}));
    x.g.set(1, INFINITY);
    const auto kept = x.p.bytes();
    DST_ASSERT_OK(dst_engine_step(e.get()));
    EXPECT_EQ(engine_state(e.get()).last_overflow, 1);
    EXPECT_TRUE(x.p.same_bytes(kept));
    EXPECT_EQ(x.g.get(0), 0.25);
    EXPECT_TRUE(std::isinf(x.g.get(1)));
    // dst_engine_zero_grads still zeroes; turning the setting back on zeroes at the next boundary.
    DST_ASSERT_OK(dst_engine_zero_grads(e.get()));
    EXPECT_EQ(x.g.doubles(), std::vector<double>(3, 0.0));
    DST_ASSERT_OK(dst_engine_set_zero_grads_on_step(e.get(), 1));
    x.g.set_doubles({0.25, 0.5, -1.0});
    DST_ASSERT_OK(dst_engine_step(e.get()));
    EXPECT_EQ(x.g.doubles(), std::vector<double>(3, 0.0));
}

TEST(EnginePrecision, Bf16ParametersTrainOnFp32Masters) {
    Ctx ctx = make_ctx();
    Engine e = make_engine(ctx.get(), R"({"train_batch_size": 1, "optimizer": {"type": "adamw", "params": {"lr": 1e-4}},
        "bf16": {"enabled": true}})");
    Param x(DST_DTYPE_BF16, DST_DTYPE_BF16, {1.0, -3.0, 0.5});
    DST_EXPECT_OK(x.add(optimizer_of(e.get()), 0, "x"));
    for (int s = 0; s < 3; ++s) {
        x.g.set_doubles({1.0, 1.0, -1.0});
        DST_ASSERT_OK(dst_engine_step(e.get()));
    }
    dst_tensor m;
    DST_ASSERT_OK(dst_optimizer_get_state(optimizer_of(e.get()), 0, DST_OPTIMIZER_STATE_MASTER, &m));
    const float *master = static_cast<const float *>(m.data);
    // lr 1e-4 × 3 steps is below bf16's resolution at 1.0: the parameter still rounds to 1, the master moved.
    EXPECT_NEAR(master[0], 1.0 - 3e-4, 1e-6);
    EXPECT_EQ(x.p.get(0), 1.0);
    for (int i = 0; i < 3; ++i) EXPECT_EQ(x.p.get(i), round_to(master[i], DST_DTYPE_BF16));
    EXPECT_EQ(engine_state(e.get()).loss_scale, 1.0f);
}

// ================================ checkpoints ====================================================

class EngineResume : public ::testing::TestWithParam<const char *> {};

// fp16 layers with dropout, dynamic loss scaling, clipping, a schedule, two groups: a run resumed from
// a checkpoint in a new context continues bit for bit (engine_util.h).
TEST_P(EngineResume, ContinuesBitIdentically) {
    expect_resume_bit_identical(make_ctx, resume_config(GetParam()), fresh_dir(std::string("resume_") + GetParam()));
}

INSTANTIATE_TEST_SUITE_P(Optimizers, EngineResume, ::testing::Values("adam", "lamb"));

TEST(EngineCheckpoint, LayoutLatestAndClientState) {
    const std::string dir = fresh_dir("layout");
    Ctx ctx = make_ctx();
    Engine e = make_engine(ctx.get(), R"({"train_batch_size": 1, "optimizer": {"type": "adam"}, "fp16": {"enabled": true}})");
    Param x(DST_DTYPE_FP16, DST_DTYPE_FP16, {1.0, 2.0});
    DST_EXPECT_OK(x.add(optimizer_of(e.get()), 0, "x"));
    HostTensor ids = HostTensor::from_doubles(DST_DTYPE_INT32, {3}, {7, 8, 9});
    dst_tensor idv = ids.view();
    DST_ASSERT_OK(dst_engine_add_model_tensor(e.get(), "buffers.ids", &idv));
    for (int s = 0; s < 3; ++s) {
        x.g.set_doubles({100.0, -100.0});
        DST_ASSERT_OK(dst_engine_step(e.get()));
    }
    const std::string client = R"({"epoch": 3, "name": "caf\u00e9", "list": [1, 2.5, null, {"k": true}]})";
    DST_ASSERT_OK(dst_engine_save_checkpoint(e.get(), dir.c_str(), nullptr, client.c_str(), 1));
    EXPECT_EQ(file_text(dir + "/latest"), "global_step3") << "the tag, no newline";
    EXPECT_TRUE(exists(dir + "/global_step3/mp_rank_00_model_states.safetensors"));
    EXPECT_TRUE(exists(dir + "/global_step3/mp_rank_00_optim_states.safetensors"));
    char tag[8];
    size_t tag_len = 0;
    DST_ASSERT_OK(dst_checkpoint_latest_tag(dir.c_str(), tag, sizeof tag, &tag_len));
    EXPECT_EQ(tag_len, 12u);
    EXPECT_EQ(std::string(tag), "global_");
    // The model file is a safetensors file other tools read: the tensors under their names.
    char summary[4096];
    DST_ASSERT_OK(dst_checkpoint_describe((dir + "/global_step3/mp_rank_00_model_states.safetensors").c_str(), summary,
                                          sizeof summary, nullptr));
    EXPECT_NE(std::string(summary).find("tensors: 2"), std::string::npos) << summary;
    // Saving without save_latest leaves `latest`.
    DST_ASSERT_OK(dst_engine_save_checkpoint(e.get(), dir.c_str(), "other", nullptr, 0));
    EXPECT_EQ(file_text(dir + "/latest"), "global_step3");
    // Load into fresh tensors: weights, model tensors and the client state (any JSON) come back.
    Engine f = make_engine(ctx.get(), R"({"train_batch_size": 1, "optimizer": {"type": "adam"}, "fp16": {"enabled": true}})");
    Param y(DST_DTYPE_FP16, DST_DTYPE_FP16, {0.0, 0.0});
    DST_EXPECT_OK(y.add(optimizer_of(f.get()), 0, "x"));
    HostTensor ids2(DST_DTYPE_INT32, {3});
    dst_tensor id2v = ids2.view();
    DST_ASSERT_OK(dst_engine_add_model_tensor(f.get(), "buffers.ids", &id2v));
    std::vector<char> buf(256, 'x');
    size_t len = 0;
    DST_ASSERT_OK(dst_engine_load_checkpoint(f.get(), dir.c_str(), nullptr, nullptr, buf.data(), buf.size(), &len));
    EXPECT_EQ(std::string(buf.data()), "{\"epoch\":3,\"name\":\"caf\xc3\xa9\",\"list\":[1,2.5,null,{\"k\":true}]}")
        << "the client state as compact JSON, keys in their order";
    EXPECT_EQ(len, std::strlen(buf.data()));
    EXPECT_TRUE(y.p.same_bytes(x.p.bytes()));
    EXPECT_EQ(ids2.doubles(), ids.doubles());
    EXPECT_EQ(engine_state(f.get()).global_steps, 3);
    EXPECT_EQ(engine_state(f.get()).loss_scale, engine_state(e.get()).loss_scale);
    // The "other" checkpoint saved an empty client state.
    DST_ASSERT_OK(dst_engine_load_checkpoint(f.get(), dir.c_str(), "other", nullptr, buf.data(), buf.size(), &len));
    EXPECT_EQ(std::string(buf.data()), "{}");
}

TEST(EngineCheckpoint, OverwritingATagIsAtomicAndKeepsOtherFiles) {
    const std::string dir = fresh_dir("overwrite");
    Ctx ctx = make_ctx();
    Engine e = make_engine(ctx.get(), R"({"train_batch_size": 1, "optimizer": {"type": "adam"}})");
    Param x(DST_DTYPE_FP32, DST_DTYPE_FP32, {1.0, 2.0});
    DST_EXPECT_OK(x.add(optimizer_of(e.get()), 0, "x"));
    DST_ASSERT_OK(dst_engine_save_checkpoint(e.get(), dir.c_str(), "t", "1", 1));
    std::ofstream(dir + "/t/notes.txt") << "kept";
    x.g.set_doubles({1.0, 1.0});
    DST_ASSERT_OK(dst_engine_step(e.get()));
    DST_ASSERT_OK(dst_engine_save_checkpoint(e.get(), dir.c_str(), "t", "2", 1));
    EXPECT_EQ(file_text(dir + "/t/notes.txt"), "kept");
    char buf[16];
    DST_ASSERT_OK(dst_engine_load_checkpoint(e.get(), dir.c_str(), "t", nullptr, buf, sizeof buf, nullptr));
    EXPECT_EQ(std::string(buf), "2");
    // Nothing is left behind but the tag, `latest` and the caller's file.
    std::string listing;
    const std::string cmd = "ls -A '" + dir + "' '" + dir + "/t'";
    if (FILE *p = popen(cmd.c_str(), "r")) {
        char line[256];
        while (std::fgets(line, sizeof line, p)) listing += line;
        pclose(p);
    }
    EXPECT_EQ(listing.find(".dst-tmp"), std::string::npos) << listing;
    EXPECT_EQ(listing.find(".old"), std::string::npos) << listing;
}

TEST(EngineCheckpoint, EveryFailedLoadChangesNothing) {
    const std::string dir = fresh_dir("failures");
    Ctx ctx = make_ctx();
    const std::string json = R"({"train_batch_size": 1, "optimizer": {"type": "adam"}, "fp16": {"enabled": true}})";
    Engine e = make_engine(ctx.get(), json);
    Param x(DST_DTYPE_FP16, DST_DTYPE_FP16, {1.0, 2.0, 3.0});
    DST_EXPECT_OK(x.add(optimizer_of(e.get()), 0, "x"));
    x.g.set_doubles({10, 10, 10});
    DST_ASSERT_OK(dst_engine_step(e.get()));
    DST_ASSERT_OK(dst_engine_save_checkpoint(e.get(), dir.c_str(), "a", R"({"a": 1})", 1));
    const auto xa = x.p.bytes();
    x.g.set_doubles({10, 10, 10});
    DST_ASSERT_OK(dst_engine_step(e.get()));
    DST_ASSERT_OK(dst_engine_save_checkpoint(e.get(), dir.c_str(), "b", nullptr, 0));

    // The engine that attempts the loads: its own weights, state and buffer must survive each failure.
    Engine f = make_engine(ctx.get(), json);
    Param y(DST_DTYPE_FP16, DST_DTYPE_FP16, {-1.0, -2.0, -3.0});
    DST_EXPECT_OK(y.add(optimizer_of(f.get()), 0, "x"));
    DST_ASSERT_OK(dst_context_set_rng_state(ctx.get(), 77, 88));
    dst_optimizer *fo = optimizer_of(f.get());
    const auto w0 = y.p.bytes();
    const auto s0 = optimizer_state_bytes(ctx.get(), fo);
    char buf[32];
    std::memset(buf, '#', sizeof buf);
    auto unchanged = [&](const char *what) {
        EXPECT_TRUE(y.p.same_bytes(w0)) << what << ": weights";
        EXPECT_TRUE(optimizer_state_bytes(ctx.get(), fo) == s0) << what << ": optimizer state";
        EXPECT_EQ(engine_state(f.get()).global_steps, 0) << what;
        uint64_t seed = 0, off = 0;
        EXPECT_EQ(dst_context_get_rng_state(ctx.get(), &seed, &off), DST_OK);
        EXPECT_EQ(seed, 77u) << what;
        EXPECT_EQ(buf[0], '#') << what << ": client state buffer";
    };
    EXPECT_FAILS(DST_ERR_IO, "missing", dst_engine_load_checkpoint(f.get(), dir.c_str(), "missing", nullptr, buf, sizeof buf, nullptr));
    unchanged("no such tag");
    const std::string empty = fresh_dir("failures_empty");
    ASSERT_EQ(::mkdir(empty.c_str(), 0777), 0);
    EXPECT_FAILS(DST_ERR_IO, "latest", dst_engine_load_checkpoint(f.get(), empty.c_str(), nullptr, nullptr, buf, sizeof buf, nullptr));
    unchanged("no latest");
    std::ofstream(empty + "/latest") << "../../etc";
    EXPECT_FAILS(DST_ERR_FORMAT, "latest", dst_engine_load_checkpoint(f.get(), empty.c_str(), nullptr, nullptr, buf, sizeof buf, nullptr));
    unchanged("bad latest");
    EXPECT_FAILS(DST_ERR_INVALID_ARGUMENT, "tag", dst_engine_load_checkpoint(f.get(), dir.c_str(), "../a", nullptr, buf, sizeof buf, nullptr));
    unchanged("bad tag");

    // One flipped byte of the model file's data.
    const std::string model = dir + "/a/mp_rank_00_model_states.safetensors";
    const std::string good = file_text(model);
    std::string bad = good;
    bad[bad.size() - 1] ^= 0x01;
    std::ofstream(model, std::ios::binary) << bad;
    EXPECT_FAILS(DST_ERR_FORMAT, "checksum", dst_engine_load_checkpoint(f.get(), dir.c_str(), "a", nullptr, buf, sizeof buf, nullptr));
    unchanged("corrupt model file");
    std::ofstream(model, std::ios::binary) << good;
    // A graph dropout counter beyond 32 bits in the engine metadata (the checksum covers the data section,
    // so the edited header still passes it and the value check is what refuses the file).
    {
        const std::string key = R"(graph_counter\":0)";
        const size_t at = good.find(key);
        ASSERT_NE(at, std::string::npos) << "the engine metadata names no graph_counter";
        uint64_t hlen = 0;
        std::memcpy(&hlen, good.data(), 8);  // little-endian, as the test machines are
        std::string edited = good;
        edited.replace(at, key.size(), R"(graph_counter\":4294967296)");
        hlen += edited.size() - good.size();
        std::memcpy(&edited[0], &hlen, 8);
        std::ofstream(model, std::ios::binary) << edited;
        EXPECT_FAILS(DST_ERR_FORMAT, "graph_counter",
                     dst_engine_load_checkpoint(f.get(), dir.c_str(), "a", nullptr, buf, sizeof buf, nullptr));
        unchanged("graph counter beyond 32 bits");
        std::ofstream(model, std::ios::binary) << good;
    }
    // The optimizer file of another save.
    const std::string optim_a = dir + "/a/mp_rank_00_optim_states.safetensors";
    const std::string optim_good = file_text(optim_a);
    std::ofstream(optim_a, std::ios::binary) << file_text(dir + "/b/mp_rank_00_optim_states.safetensors");
    EXPECT_FAILS(DST_ERR_FORMAT, "saves", dst_engine_load_checkpoint(f.get(), dir.c_str(), "a", nullptr, buf, sizeof buf, nullptr));
    unchanged("mixed files");
    std::ofstream(optim_a, std::ios::binary) << optim_good;
    // Registration that does not match: a tensor more, and one of another shape.
    Param extra(DST_DTYPE_FP16, DST_DTYPE_FP16, {5.0});
    {
        Engine g = make_engine(ctx.get(), json);
        Param z(DST_DTYPE_FP16, DST_DTYPE_FP16, {0.0, 0.0, 0.0});
        DST_EXPECT_OK(z.add(optimizer_of(g.get()), 0, "x"));
        DST_EXPECT_OK(extra.add(optimizer_of(g.get()), 0, "extra"));
        const auto ze = extra.p.bytes();
        EXPECT_FAILS(DST_ERR_FORMAT, "extra", dst_engine_load_checkpoint(g.get(), dir.c_str(), "a", nullptr, nullptr, 0, nullptr));
        dst_engine_load_options lo;
        DST_ASSERT_OK(dst_engine_load_options_default(&lo));
        lo.strict = 0;
        lo.load_optimizer_states = 0;
        DST_ASSERT_OK(dst_engine_load_checkpoint(g.get(), dir.c_str(), "a", &lo, nullptr, 0, nullptr));
        EXPECT_TRUE(extra.p.same_bytes(ze)) << "non-strict: the missing tensor keeps its values";
        EXPECT_TRUE(z.p.same_bytes(xa)) << "non-strict: the tensors present are loaded";
    }
    {
        Engine g = make_engine(ctx.get(), json);
        Param z(DST_DTYPE_FP16, DST_DTYPE_FP16, {0.0, 0.0});
        DST_EXPECT_OK(z.add(optimizer_of(g.get()), 0, "x"));
        EXPECT_FAILS(DST_ERR_FORMAT, "x", dst_engine_load_checkpoint(g.get(), dir.c_str(), "a", nullptr, nullptr, 0, nullptr));
        Engine h = make_engine(ctx.get(), json);
        Param w(DST_DTYPE_FP16, DST_DTYPE_FP16, {0.0, 0.0, 0.0});
        DST_EXPECT_OK(w.add(optimizer_of(h.get()), 0, "renamed"));
        EXPECT_FAILS(DST_ERR_FORMAT, "renamed", dst_engine_load_checkpoint(h.get(), dir.c_str(), "a", nullptr, nullptr, 0, nullptr));
    }
    // And the intact checkpoint loads.
    DST_ASSERT_OK(dst_engine_load_checkpoint(f.get(), dir.c_str(), nullptr, nullptr, buf, sizeof buf, nullptr));
    EXPECT_EQ(std::string(buf), R"({"a":1})");
    EXPECT_TRUE(y.p.same_bytes(xa));
}

TEST(EngineCheckpoint, LoadOptions) {
    const std::string dir = fresh_dir("options");
    Ctx ctx = make_ctx();
    const std::string json = R"({"train_batch_size": 1, "optimizer": {"type": "adam"}, "fp16": {"enabled": true}})";
    Engine e = make_engine(ctx.get(), json);
    Param x(DST_DTYPE_FP16, DST_DTYPE_FP16, {1.0, 2.0});
    DST_EXPECT_OK(x.add(optimizer_of(e.get()), 0, "x"));
    DST_ASSERT_OK(dst_context_set_rng_state(ctx.get(), 3, 30));
    DST_ASSERT_OK(dst_context_set_rng_graph_counter(ctx.get(), 12345));  // stored with the RNG state
    for (int s = 0; s < 2; ++s) {
        x.g.set_doubles({1000.0, -1000.0});
        DST_ASSERT_OK(dst_engine_step(e.get()));
    }
    DST_ASSERT_OK(dst_engine_save_checkpoint(e.get(), dir.c_str(), "c", nullptr, 1));
    auto fresh = [&](Engine *eng, Param *p) {
        *eng = make_engine(ctx.get(), json);
        DST_EXPECT_OK(p->add(optimizer_of(eng->get()), 0, "x"));
    };
    dst_engine_load_options o;
    DST_ASSERT_OK(dst_engine_load_options_default(&o));
    EXPECT_EQ(o.struct_size, sizeof o);
    EXPECT_EQ(o.load_optimizer_states, 1);
    EXPECT_EQ(o.load_lr_scheduler_states, 1);
    EXPECT_EQ(o.load_module_only, 0);
    EXPECT_EQ(o.strict, 1);
    EXPECT_EQ(o.restore_rng, 1);
    {
        // load_module_only: the weights, and masters refreshed from them; nothing else.
        Engine f;
        Param y(DST_DTYPE_FP16, DST_DTYPE_FP16, {0.0, 0.0});
        fresh(&f, &y);
        dst_engine_load_options m = o;
        m.load_module_only = 1;
        DST_ASSERT_OK(dst_context_set_rng_state(ctx.get(), 9, 9));
        DST_ASSERT_OK(dst_engine_load_checkpoint(f.get(), dir.c_str(), nullptr, &m, nullptr, 0, nullptr));
        EXPECT_TRUE(y.p.same_bytes(x.p.bytes()));
        dst_tensor mv;
        DST_ASSERT_OK(dst_optimizer_get_state(optimizer_of(f.get()), 0, DST_OPTIMIZER_STATE_MASTER, &mv));
        EXPECT_EQ(static_cast<const float *>(mv.data)[0], static_cast<float>(x.p.get(0)));
        EXPECT_EQ(engine_state(f.get()).global_steps, 0);
        dst_optimizer_tensor_info info;
        info.struct_size = sizeof info;
        DST_ASSERT_OK(dst_optimizer_get_tensor_info(optimizer_of(f.get()), 0, &info));
        EXPECT_EQ(info.step, 0);
        uint64_t seed = 0, off = 0;
        DST_ASSERT_OK(dst_context_get_rng_state(ctx.get(), &seed, &off));
        EXPECT_EQ(seed, 9u);
    }
    {
        // load_optimizer_states = 0: moments stay fresh, masters follow the loaded weights, counters load.
        Engine f;
        Param y(DST_DTYPE_FP16, DST_DTYPE_FP16, {0.0, 0.0});
        fresh(&f, &y);
        dst_engine_load_options m = o;
        m.load_optimizer_states = 0;
        m.restore_rng = 0;
        DST_ASSERT_OK(dst_engine_load_checkpoint(f.get(), dir.c_str(), nullptr, &m, nullptr, 0, nullptr));
        dst_tensor av;
        DST_ASSERT_OK(dst_optimizer_get_state(optimizer_of(f.get()), 0, DST_OPTIMIZER_STATE_EXP_AVG, &av));
        EXPECT_EQ(static_cast<const float *>(av.data)[0], 0.0f);
        DST_ASSERT_OK(dst_optimizer_get_state(optimizer_of(f.get()), 0, DST_OPTIMIZER_STATE_MASTER, &av));
        EXPECT_EQ(static_cast<const float *>(av.data)[1], static_cast<float>(x.p.get(1)));
        EXPECT_EQ(engine_state(f.get()).global_steps, 2);
        EXPECT_EQ(engine_state(f.get()).loss_scale, 65536.0f) << "the scaler is optimizer state";
        uint64_t seed = 0, off = 0;
        DST_ASSERT_OK(dst_context_get_rng_state(ctx.get(), &seed, &off));
        EXPECT_EQ(seed, 9u) << "restore_rng = 0";
        uint64_t counter = 99;
        DST_ASSERT_OK(dst_context_get_rng_graph_counter(ctx.get(), &counter));
        EXPECT_EQ(counter, 0u) << "restore_rng = 0 (the counter as dst_context_set_rng_state(9, 9) left it)";
    }
    {
        // The defaults restore the RNG state: seed, offset and the graph dropout counter.
        Engine f;
        Param y(DST_DTYPE_FP16, DST_DTYPE_FP16, {0.0, 0.0});
        fresh(&f, &y);
        DST_ASSERT_OK(dst_engine_load_checkpoint(f.get(), dir.c_str(), nullptr, &o, nullptr, 0, nullptr));
        uint64_t seed = 0, off = 0, counter = 0;
        DST_ASSERT_OK(dst_context_get_rng_state(ctx.get(), &seed, &off));
        DST_ASSERT_OK(dst_context_get_rng_graph_counter(ctx.get(), &counter));
        EXPECT_EQ(seed, 3u);
        EXPECT_EQ(off, 30u);
        EXPECT_EQ(counter, 12345u);
    }
    dst_engine_load_options older = o;
    older.struct_size = 2;
    EXPECT_FAILS(DST_ERR_INVALID_ARGUMENT, "struct_size",
                 dst_engine_load_checkpoint(e.get(), dir.c_str(), nullptr, &older, nullptr, 0, nullptr));
}

TEST(EngineCheckpoint, RewarmRestartsTheScheduleOnce) {
    const std::string dir = fresh_dir("rewarm");
    Ctx ctx = make_ctx();
    const std::string phase1 = R"({"train_batch_size": 1, "optimizer": {"type": "lamb", "params": {"lr": 0.011}},
        "scheduler": {"type": "warmup_exp_decay_exp", "params": {"warmup_proportion": 0.02, "decay_rate": 0.9,
        "decay_step": 250, "total_training_steps": 7500, "lr_offset": 0.001}}})";
    const std::string phase2 = R"({"train_batch_size": 1, "optimizer": {"type": "lamb", "params": {"lr": 0.002}},
        "scheduler": {"type": "warmup_exp_decay_exp", "params": {"warmup_proportion": 0.02, "decay_rate": 0.9,
        "decay_step": 150, "total_training_steps": 7500, "lr_offset": 0.0, "rewarm": true}}})";
    Param x(DST_DTYPE_FP32, DST_DTYPE_FP32, {1.0});
    {
        Engine e = make_engine(ctx.get(), phase1);
        DST_EXPECT_OK(x.add(optimizer_of(e.get()), 0, "x"));
        for (int s = 0; s < 10; ++s) DST_ASSERT_OK(dst_engine_step(e.get()));
        EXPECT_NEAR(engine_lr(e.get()), 0.011 * (10.0 / 150) * (10.0 / 150) + 0.001, 1e-9);
        DST_ASSERT_OK(dst_engine_save_checkpoint(e.get(), dir.c_str(), "phase1", nullptr, 1));
    }
    {
        Engine e = make_engine(ctx.get(), phase2);
        DST_EXPECT_OK(x.add(optimizer_of(e.get()), 0, "x"));
        DST_ASSERT_OK(dst_engine_load_checkpoint(e.get(), dir.c_str(), "phase1", nullptr, nullptr, 0, nullptr));
        EXPECT_EQ(engine_state(e.get()).global_steps, 10);
        EXPECT_EQ(engine_lr(e.get()), 0.0f) << "s = 0 again";
        DST_ASSERT_OK(dst_engine_step(e.get()));
        EXPECT_NEAR(engine_lr(e.get()), 8.888888889e-8, 1e-7 * 8.888888889e-8) << "fp32 rounding of the lr";
        for (int s = 1; s < 5; ++s) DST_ASSERT_OK(dst_engine_step(e.get()));
        DST_ASSERT_OK(dst_engine_save_checkpoint(e.get(), dir.c_str(), "phase2", nullptr, 1));
    }
    {
        // A checkpoint written under the rewarmed schedule resumes it (s = 5), it does not restart.
        Engine e = make_engine(ctx.get(), phase2);
        DST_EXPECT_OK(x.add(optimizer_of(e.get()), 0, "x"));
        DST_ASSERT_OK(dst_engine_load_checkpoint(e.get(), dir.c_str(), nullptr, nullptr, nullptr, 0, nullptr));
        EXPECT_NEAR(engine_lr(e.get()), 0.002 * (5.0 / 150) * (5.0 / 150), 1e-12);
    }
}

// ================================ rules of use and bad input =====================================

TEST(EngineApi, PrecisionDecidesTheParameterDtypes) {
    Ctx ctx = make_ctx();
    Engine e32 = make_engine(ctx.get(), R"({"train_batch_size": 1, "optimizer": {"type": "adam"}})");
    Engine e16 = make_engine(ctx.get(), R"({"train_batch_size": 1, "optimizer": {"type": "adam"}, "fp16": {"enabled": true}})");
    Param h(DST_DTYPE_FP16, DST_DTYPE_FP16, {1.0}), b(DST_DTYPE_BF16, DST_DTYPE_BF16, {1.0});
    dst_tensor hp = h.p.view(), hg = h.g.view(), bp = b.p.view(), bg = b.g.view();
    EXPECT_FAILS(DST_ERR_UNSUPPORTED, "fp16", dst_optimizer_add_tensor(optimizer_of(e32.get()), 0, "h", &hp, &hg));
    EXPECT_FAILS(DST_ERR_UNSUPPORTED, "bf16", dst_optimizer_add_tensor(optimizer_of(e16.get()), 0, "b", &bp, &bg));
    DST_EXPECT_OK(dst_optimizer_add_tensor(optimizer_of(e16.get()), 0, "h", &hp, &hg));
    // The engine's optimizer is stepped by the engine only, and destroying its handle does nothing.
    EXPECT_FAILS(DST_ERR_STATE, "engine", dst_optimizer_step(optimizer_of(e16.get()), 1.0f, 0.0f));
    dst_optimizer_destroy(optimizer_of(e16.get()));
    DST_EXPECT_OK(dst_engine_step(e16.get()));
    EXPECT_FAILS(DST_ERR_STATE, "registered", dst_engine_step(e32.get()));
}

TEST(EngineApi, BadArguments) {
    const std::string dir = fresh_dir("badargs");
    Ctx ctx = make_ctx();
    Engine e = make_engine(ctx.get(), R"({"train_batch_size": 2, "gradient_accumulation_steps": 2, "optimizer": {"type": "adam"}})");
    Param x(DST_DTYPE_FP32, DST_DTYPE_FP32, {1.0, 2.0});
    DST_EXPECT_OK(x.add(optimizer_of(e.get()), 0, "x"));
    dst_optimizer *o = nullptr;
    EXPECT_FAILS(DST_ERR_INVALID_ARGUMENT, "engine", dst_engine_get_optimizer(nullptr, &o));
    EXPECT_FAILS(DST_ERR_INVALID_ARGUMENT, "opt", dst_engine_get_optimizer(e.get(), nullptr));

    HostTensor t = HostTensor::from_doubles(DST_DTYPE_FP32, {2}, {1.0, 2.0});
    dst_tensor tv = t.view();
    EXPECT_FAILS(DST_ERR_INVALID_ARGUMENT, "engine", dst_engine_add_model_tensor(nullptr, "t", &tv));
    EXPECT_FAILS(DST_ERR_INVALID_ARGUMENT, "name", dst_engine_add_model_tensor(e.get(), nullptr, &tv));
    EXPECT_FAILS(DST_ERR_INVALID_ARGUMENT, "tensor", dst_engine_add_model_tensor(e.get(), "t", nullptr));
    EXPECT_FAILS(DST_ERR_INVALID_ARGUMENT, "name", dst_engine_add_model_tensor(e.get(), "", &tv));
    EXPECT_FAILS(DST_ERR_INVALID_ARGUMENT, "optimizer", dst_engine_add_model_tensor(e.get(), "x", &tv));
    dst_tensor over = x.p.view();
    EXPECT_FAILS(DST_ERR_INVALID_ARGUMENT, "overlaps", dst_engine_add_model_tensor(e.get(), "t", &over));
    dst_tensor bad = tv;
    bad.ndim = 0;
    EXPECT_FAILS(DST_ERR_INVALID_ARGUMENT, "ndim", dst_engine_add_model_tensor(e.get(), "t", &bad));
    bad = tv;
    const int nine = 99;
    std::memcpy(&bad.dtype, &nine, sizeof nine);
    EXPECT_FAILS(DST_ERR_INVALID_ARGUMENT, "dtype", dst_engine_add_model_tensor(e.get(), "t", &bad));
    DST_ASSERT_OK(dst_engine_add_model_tensor(e.get(), "t", &tv));
    EXPECT_FAILS(DST_ERR_INVALID_ARGUMENT, "registered", dst_engine_add_model_tensor(e.get(), "t", &tv));

    const auto tb = t.bytes();
    EXPECT_FAILS(DST_ERR_INVALID_ARGUMENT, "engine", dst_engine_scale_loss_gradient(nullptr, &tv));
    EXPECT_FAILS(DST_ERR_INVALID_ARGUMENT, "grad", dst_engine_scale_loss_gradient(e.get(), nullptr));
    bad = tv;
    bad.data = nullptr;
    EXPECT_FAILS(DST_ERR_INVALID_ARGUMENT, "data", dst_engine_scale_loss_gradient(e.get(), &bad));
    bad = tv;
    bad.dtype = DST_DTYPE_INT32;
    EXPECT_FAILS(DST_ERR_INVALID_ARGUMENT, "dtype", dst_engine_scale_loss_gradient(e.get(), &bad));
    bad = tv;
    bad.ndim = 7;
    EXPECT_FAILS(DST_ERR_INVALID_ARGUMENT, "ndim", dst_engine_scale_loss_gradient(e.get(), &bad));
    bad = tv;
    bad.shape[0] = -4;
    EXPECT_FAILS(DST_ERR_INVALID_ARGUMENT, "shape", dst_engine_scale_loss_gradient(e.get(), &bad));
    EXPECT_TRUE(t.same_bytes(tb)) << "refused calls leave the tensor";

    const float *sp = nullptr;
    int boundary = 0;
    EXPECT_FAILS(DST_ERR_INVALID_ARGUMENT, "engine", dst_engine_loss_scale_pointer(nullptr, &sp));
    EXPECT_FAILS(DST_ERR_INVALID_ARGUMENT, "scale", dst_engine_loss_scale_pointer(e.get(), nullptr));
    EXPECT_FAILS(DST_ERR_INVALID_ARGUMENT, "engine", dst_engine_is_boundary(nullptr, &boundary));
    EXPECT_FAILS(DST_ERR_INVALID_ARGUMENT, "boundary", dst_engine_is_boundary(e.get(), nullptr));
    EXPECT_FAILS(DST_ERR_INVALID_ARGUMENT, "engine", dst_engine_step(nullptr));
    EXPECT_FAILS(DST_ERR_INVALID_ARGUMENT, "engine", dst_engine_zero_grads(nullptr));
    dst_engine_state st;
    st.struct_size = sizeof st;
    EXPECT_FAILS(DST_ERR_INVALID_ARGUMENT, "engine", dst_engine_get_state(nullptr, &st));
    EXPECT_FAILS(DST_ERR_INVALID_ARGUMENT, "state", dst_engine_get_state(e.get(), nullptr));
    st.struct_size = 3;
    EXPECT_FAILS(DST_ERR_INVALID_ARGUMENT, "struct_size", dst_engine_get_state(e.get(), &st));
    st.struct_size = sizeof st + 8;
    EXPECT_FAILS(DST_ERR_UNSUPPORTED, "struct_size", dst_engine_get_state(e.get(), &st));
    // An older, smaller struct receives its fields only.
    dst_engine_state small;
    std::memset(&small, 0xAB, sizeof small);
    small.struct_size = offsetof(dst_engine_state, world_size) + sizeof(int32_t);
    DST_ASSERT_OK(dst_engine_get_state(e.get(), &small));
    EXPECT_EQ(small.world_size, 1);
    unsigned char tail;
    std::memcpy(&tail, &small.optimizer, 1);
    EXPECT_EQ(tail, 0xAB) << "nothing written past struct_size";
    float lr = 0.0f;
    EXPECT_FAILS(DST_ERR_INVALID_ARGUMENT, "group", dst_engine_get_lr(e.get(), 1, &lr));
    EXPECT_FAILS(DST_ERR_INVALID_ARGUMENT, "lr", dst_engine_get_lr(e.get(), 0, nullptr));
    EXPECT_FAILS(DST_ERR_INVALID_ARGUMENT, "engine", dst_engine_get_lr(nullptr, 0, &lr));

    EXPECT_FAILS(DST_ERR_INVALID_ARGUMENT, "engine", dst_engine_save_checkpoint(nullptr, dir.c_str(), "t", nullptr, 1));
    EXPECT_FAILS(DST_ERR_INVALID_ARGUMENT, "save_dir", dst_engine_save_checkpoint(e.get(), nullptr, "t", nullptr, 1));
    EXPECT_FAILS(DST_ERR_INVALID_ARGUMENT, "save_dir", dst_engine_save_checkpoint(e.get(), "", "t", nullptr, 1));
    for (const char *tag : {"", ".hidden", "a/b", "tab\there", ".."})
        EXPECT_FAILS(DST_ERR_INVALID_ARGUMENT, "tag", dst_engine_save_checkpoint(e.get(), dir.c_str(), tag, nullptr, 1));
    EXPECT_FAILS(DST_ERR_INVALID_ARGUMENT, "client_state_json",
                 dst_engine_save_checkpoint(e.get(), dir.c_str(), "t", "{epoch: 1}", 1));
    EXPECT_FALSE(exists(dir)) << "refused saves create nothing";
    DST_ASSERT_OK(dst_engine_step(e.get()));  // one micro-step of two
    EXPECT_FAILS(DST_ERR_STATE, "boundary", dst_engine_save_checkpoint(e.get(), dir.c_str(), "t", nullptr, 1));
    DST_ASSERT_OK(dst_engine_step(e.get()));
    const std::string blocker = dir + "_file";
    std::ofstream(blocker) << "a file where the folder would go";
    EXPECT_FAILS(DST_ERR_IO, "folder", dst_engine_save_checkpoint(e.get(), (blocker + "/sub").c_str(), "t", nullptr, 1));
    std::remove(blocker.c_str());

    EXPECT_FAILS(DST_ERR_INVALID_ARGUMENT, "options", dst_engine_load_options_default(nullptr));
    EXPECT_FAILS(DST_ERR_INVALID_ARGUMENT, "engine", dst_engine_load_checkpoint(nullptr, dir.c_str(), nullptr, nullptr, nullptr, 0, nullptr));
    EXPECT_FAILS(DST_ERR_INVALID_ARGUMENT, "load_dir", dst_engine_load_checkpoint(e.get(), nullptr, nullptr, nullptr, nullptr, 0, nullptr));
    EXPECT_FAILS(DST_ERR_INVALID_ARGUMENT, "load_dir", dst_engine_load_checkpoint(e.get(), "", nullptr, nullptr, nullptr, 0, nullptr));
    char tag[4] = "abc";
    size_t len = 7;
    EXPECT_FAILS(DST_ERR_INVALID_ARGUMENT, "dir", dst_checkpoint_latest_tag(nullptr, tag, sizeof tag, &len));
    EXPECT_FAILS(DST_ERR_INVALID_ARGUMENT, "dir", dst_checkpoint_latest_tag("", tag, sizeof tag, &len));
    EXPECT_FAILS(DST_ERR_IO, "latest", dst_checkpoint_latest_tag(dir.c_str(), tag, sizeof tag, &len));
    EXPECT_EQ(std::string(tag), "abc");
    EXPECT_EQ(len, 7u);
}

}  // namespace
