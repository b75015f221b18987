// Memory switches (gelu_checkpoint, normalize_invertible, attn_dropout_checkpoint), determinism and
// the dropout random-number stream.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "test_util.h"

using namespace dsttest;

namespace {

constexpr int kG = 1, kN = 2, kA = 4;  // switch bits

void apply_switches(dst_layer_config &cfg, int sw) {
    cfg.gelu_checkpoint = (sw & kG) ? 1 : 0;
    cfg.normalize_invertible = (sw & kN) ? 1 : 0;
    cfg.attn_dropout_checkpoint = (sw & kA) ? 1 : 0;
}

std::string switch_name(int sw) {
    if (sw == 0) return "none";
    std::string s;
    if (sw & kG) s += "gelu_checkpoint_";
    if (sw & kN) s += "normalize_invertible_";
    if (sw & kA) s += "attn_dropout_checkpoint_";
    s.pop_back();
    return s;
}

struct LayerRun {
    std::vector<double> y, dx;
    std::vector<std::vector<double>> grads;
    std::vector<unsigned char> y_bytes, dx_bytes, grad_bytes;
    size_t saved_bytes = 0;
};

// One training forward + backward of a fresh layer built from `cfg` with parameters from `pseed`.
LayerRun run_layer(const dst_layer_config &cfg, int64_t B, int64_t S, uint64_t pseed, uint64_t seed, uint64_t offset,
              const dst_mask *mask, uint64_t data_seed = 5) {
    LayerRun r;
    Ctx ctx = make_ctx();
    Layer layer = make_layer(ctx.get(), cfg);
    if (!layer) return r;
    randomize_params(layer.get(), pseed);
    const int64_t H = cfg.hidden_size;
    Rng rng(data_seed);
    HostTensor x = HostTensor::from_doubles(cfg.dtype, {B, S, H}, rng.normals(B * S * H));
    HostTensor dy = HostTensor::from_doubles(cfg.dtype, {B, S, H}, rng.normals(B * S * H));
    HostTensor y(cfg.dtype, {B, S, H}), dx(cfg.dtype, {B, S, H});
    y.poison();
    dx.poison();
    Saved saved = make_saved(layer.get());
    dst_tensor xv = x.view(), yv = y.view(), dyv = dy.view(), dxv = dx.view();
    EXPECT_EQ(dst_context_set_rng_state(ctx.get(), seed, offset), DST_OK);
    dst_status st = dst_layer_forward(layer.get(), saved.get(), &xv, mask, &yv);
    EXPECT_EQ(st, DST_OK) << dst_last_error();
    EXPECT_EQ(dst_saved_bytes(saved.get(), &r.saved_bytes), DST_OK);
    st = dst_layer_backward(layer.get(), saved.get(), &dyv, &dxv, DST_GRAD_WRITE);
    EXPECT_EQ(st, DST_OK) << dst_last_error();
    r.y = y.doubles();
    r.dx = dx.doubles();
    r.y_bytes = y.bytes();
    r.dx_bytes = dx.bytes();
    r.grads = all_grads(layer.get());
    r.grad_bytes = grad_arena_bytes(layer.get());
    return r;
}

// ---- the switches do not change the results -------------------------------------------------------
struct SwParam {
    int pre;
    int sw;
};

void PrintTo(const SwParam &p, std::ostream *os) { *os << (p.pre ? "PreLN " : "PostLN ") << switch_name(p.sw); }

class SwitchEquivalence : public ::testing::TestWithParam<SwParam> {};

TEST_P(SwitchEquivalence, SameResultsAsNoSwitchesInFp64) {
    const SwParam p = GetParam();
    const int64_t B = 3, S = 9;
    dst_layer_config cfg = small_config(24, 4, 40, DST_DTYPE_FP64);
    cfg.pre_layer_norm = p.pre;
    cfg.attn_dropout_ratio = 0.15f;
    cfg.hidden_dropout_ratio = 0.1f;
    HostTensor lens = HostTensor::from_doubles(DST_DTYPE_INT32, {B}, {9, 4, 1});
    const dst_mask mask = mask_of(DST_MASK_KEY_LENGTHS, lens);
    const LayerRun ref = run_layer(cfg, B, S, 77, 99, 12, &mask);
    apply_switches(cfg, p.sw);
    const LayerRun got = run_layer(cfg, B, S, 77, 99, 12, &mask);
    ASSERT_FALSE(ref.y.empty());
    ASSERT_FALSE(got.y.empty());

    // The forward does the same arithmetic whatever is kept: bit-identical output.
    EXPECT_TRUE(bit_equal(got.y, ref.y)) << "output differs, max |diff| " << max_abs_diff(got.y, ref.y);

    // gelu_checkpoint recomputes GELU from the same pre-activation and attn_dropout_checkpoint
    // regenerates the same dropout mask from the recorded (seed, offset): identical operations, so
    // bit-identical gradients. normalize_invertible reconstructs x̂ = (y − β)/γ from the LN output
    // instead of (x − μ)·rstd from its input: algebraically equal, rounded differently, so with it
    // the FP64 results can differ in the last bits; there we require a relative L2 error ≤ 1e-14
    // (≈ 45 ε; measured: ≤ 6e-16 on these shapes, the reconstruction error is amplified only by
    // O(1) factors |β|/|γ x̂| here).
    const bool exact = (p.sw & kN) == 0;
    auto compare = [&](const char *what, const std::vector<double> &a, const std::vector<double> &b) {
        const bool same = bit_equal(a, b);
        const double rel = rel_l2(a, b);
        if (exact) {
            EXPECT_TRUE(same) << what << ": not bit-identical, rel L2 " << rel << ", max |diff| " << max_abs_diff(a, b);
        } else {
            EXPECT_LE(rel, 1e-14) << what;
            if (!same) std::printf("  %-10s rel L2 %.3g (not bit-identical; normalize_invertible)\n", what, rel);
        }
    };
    compare("dX", got.dx, ref.dx);
    for (int i = 0; i < DST_PARAM_COUNT; ++i) compare(kParamNames[i], got.grads[i], ref.grads[i]);
    // And it kept less, except attn_dropout_checkpoint alone: with fused attention nothing S×S is
    // kept in the first place, so that switch has nothing left to drop (docs/memory.md).
    if (p.sw == kA)
        EXPECT_EQ(got.saved_bytes, ref.saved_bytes);
    else
        EXPECT_LT(got.saved_bytes, ref.saved_bytes);
}

std::vector<SwParam> sw_grid() {
    std::vector<SwParam> v;
    for (int pre : {1, 0})
        for (int sw : {kG, kN, kA, kG | kN | kA}) v.push_back({pre, sw});
    return v;
}
INSTANTIATE_TEST_SUITE_P(Switches, SwitchEquivalence, ::testing::ValuesIn(sw_grid()),
                         [](const ::testing::TestParamInfo<SwParam> &i) {
                             return std::string(i.param.pre ? "PreLN_" : "PostLN_") + switch_name(i.param.sw);
                         });

// ---- saved bytes ------------------------------------------------------------------------------------
// What a training forward keeps, counted from the layer contract (docs/api.md "What a layer computes"
// and the table of docs/memory.md), not from the library's buffer plan: N = B·S tokens, e = dtype size,
// s = statistics size (4, or 8 for fp64), every tensor starting on a 256-byte boundary. Attention keeps
// its row log-sum-exp [B, heads, S] and never the S×S probabilities, with or without
// attn_dropout_checkpoint.
size_t contract_saved_bytes(const dst_layer_config &cfg, int64_t B, int64_t S) {
    const size_t N = static_cast<size_t>(B * S), H = static_cast<size_t>(cfg.hidden_size);
    const size_t I = cfg.intermediate_size ? static_cast<size_t>(cfg.intermediate_size) : 4 * H;
    const size_t heads = static_cast<size_t>(cfg.heads);
    const size_t e = dst_dtype_size(cfg.dtype), s = cfg.dtype == DST_DTYPE_FP64 ? 8 : 4;
    const bool pre = cfg.pre_layer_norm != 0, inv = cfg.normalize_invertible != 0, gck = cfg.gelu_checkpoint != 0;
    size_t total = 0;
    auto keep = [&](bool kept, size_t bytes) {
        if (kept) total += (bytes + 255) / 256 * 256;
    };
    keep(!(pre && inv), N * H * e);       // layer input x (Post-LN: the QKV GEMM's input, always)
    keep(pre, N * H * e);                 // LN1 output h
    keep(pre && !inv, N * s);             // LN1 mean
    keep(pre, N * s);                     // LN1 1/σ
    keep(true, N * 3 * H * e);            // qkv
    keep(true, N * H * e);                // attention context
    keep(true, static_cast<size_t>(B) * heads * static_cast<size_t>(S) * s);  // row log-sum-exp
    keep(!inv, N * H * e);                // r = x + dropout(attn)
    keep(true, N * H * e);                // LN2 output h2
    keep(!inv, N * s);                    // LN2 mean
    keep(true, N * s);                    // LN2 1/σ
    keep(true, N * I * e);                // pre-GELU u
    keep(!gck, N * I * e);                // GELU output g
    keep(!pre && !inv, N * H * e);        // z = h2 + dropout(FFN), the final LN's input
    keep(!pre && inv, N * H * e);         // output y, the final LN's output
    keep(!pre && !inv, N * s);            // final LN mean
    keep(!pre, N * s);                    // final LN 1/σ
    keep(true, N * std::max<size_t>(4, e));  // the attention mask copy
    // the high word of a CUDA-graph-captured forward's dropout offsets, with dropout only
    keep(cfg.attn_dropout_ratio > 0.0f || cfg.hidden_dropout_ratio > 0.0f, 4);
    return total;
}

size_t saved_after_forward(const dst_layer_config &cfg, int64_t B, int64_t S) {
    Ctx ctx = make_ctx();
    Layer layer = make_layer(ctx.get(), cfg);
    if (!layer) return 0;
    Saved saved = make_saved(layer.get());
    const int64_t H = cfg.hidden_size;
    HostTensor x = HostTensor::from_doubles(cfg.dtype, {B, S, H}, Rng(1).normals(B * S * H));
    HostTensor y(cfg.dtype, {B, S, H});
    dst_tensor xv = x.view(), yv = y.view();
    EXPECT_EQ(dst_layer_forward(layer.get(), saved.get(), &xv, nullptr, &yv), DST_OK) << dst_last_error();
    size_t bytes = 0;
    EXPECT_EQ(dst_saved_bytes(saved.get(), &bytes), DST_OK);
    EXPECT_EQ(bytes, contract_saved_bytes(cfg, B, S))
        << "dst_saved_bytes disagrees with the tensors the layer contract keeps for these switches";
    size_t predicted = 0;
    EXPECT_EQ(dst_layer_config_saved_bytes(&cfg, B, S, &predicted), DST_OK) << dst_last_error();
    EXPECT_EQ(bytes, predicted) << "dst_layer_config_saved_bytes disagrees with dst_saved_bytes";
    return bytes;
}

TEST(SavedBytes, MemorySwitchesKeepStrictlyLess) {
    const int64_t B = 2, S = 32, H = 32, heads = 4, I = 96;
    for (dst_dtype dt : {DST_DTYPE_FP32, DST_DTYPE_FP16, DST_DTYPE_BF16, DST_DTYPE_FP64}) {
        for (int pre : {1, 0}) {
            SCOPED_TRACE(std::string(dst_dtype_string(dt)) + (pre ? " pre-LN" : " post-LN"));
            dst_layer_config cfg = small_config(static_cast<int>(H), static_cast<int>(heads), static_cast<int>(I), dt);
            cfg.max_batch_tokens = 256;
            cfg.max_seq_len = 128;
            cfg.pre_layer_norm = pre;
            const size_t es = dst_dtype_size(dt);
            const size_t N = static_cast<size_t>(B * S);
            size_t bytes[8];
            for (int sw = 0; sw < 8; ++sw) {
                apply_switches(cfg, sw);
                bytes[sw] = saved_after_forward(cfg, B, S);
                std::printf("  %s %s %-55s %zu bytes\n", dst_dtype_string(dt), pre ? "pre " : "post",
                            switch_name(sw).c_str(), bytes[sw]);
            }
            // Each switch alone keeps strictly less, and by at least the tensor it drops.
            EXPECT_LT(bytes[kG], bytes[0]);
            EXPECT_GE(bytes[0] - bytes[kG], N * static_cast<size_t>(I) * es) << "gelu_checkpoint drops one [N, I]";
            EXPECT_LT(bytes[kN], bytes[0]);
            EXPECT_GE(bytes[0] - bytes[kN], N * static_cast<size_t>(H) * es) << "normalize_invertible drops an LN input";
            // Attention is fused: only per-row statistics are kept, so attn_dropout_checkpoint (the
            // switch that drops the S×S probabilities in DeepSpeed) changes nothing.
            EXPECT_EQ(bytes[kA], bytes[0]) << "attn_dropout_checkpoint has nothing S×S to drop";
            // Switches combine.
            for (int sw = 1; sw < 8; ++sw)
                for (int bit : {kG, kN}) {
                    if (sw & bit) {
                        EXPECT_LT(bytes[sw], bytes[sw & ~bit]) << switch_name(sw) << " vs " << switch_name(sw & ~bit);
                    }
                }
        }
    }
}

// The word a CUDA-graph-captured forward takes for its dropout offsets (docs/rng.md) is kept by every
// training forward with dropout (one 256-byte slot), and by none without.
TEST(SavedBytes, DropoutOffsetWordOnlyWithDropout) {
    dst_layer_config cfg = small_config(32, 4, 96, DST_DTYPE_FP16);
    cfg.attn_dropout_ratio = cfg.hidden_dropout_ratio = 0.0f;
    const size_t without = saved_after_forward(cfg, 2, 16);
    cfg.hidden_dropout_ratio = 0.1f;
    EXPECT_EQ(saved_after_forward(cfg, 2, 16), without + 256) << "hidden dropout only";
    cfg.hidden_dropout_ratio = 0.0f;
    cfg.attn_dropout_ratio = 0.1f;
    EXPECT_EQ(saved_after_forward(cfg, 2, 16), without + 256) << "attention dropout only";
}

TEST(SavedBytes, NothingQuadraticIsKept) {
    // f(2S) − 2 f(S) isolates the S² part of the saved size f(S) (the rest is linear in S).
    const int64_t B = 2, H = 32, heads = 4, S = 64;
    for (dst_dtype dt : {DST_DTYPE_FP32, DST_DTYPE_BF16}) {
        SCOPED_TRACE(dst_dtype_string(dt));
        dst_layer_config cfg = small_config(static_cast<int>(H), static_cast<int>(heads), 0, dt);
        cfg.max_batch_tokens = 512;
        cfg.max_seq_len = 256;
        const double s2 = static_cast<double>(B * heads * S * S * static_cast<int64_t>(dst_dtype_size(dt)));
        for (int sw : {0, kA, kG | kN | kA}) {
            apply_switches(cfg, sw);
            const double f1 = static_cast<double>(saved_after_forward(cfg, B, S));
            const double f2 = static_cast<double>(saved_after_forward(cfg, B, 2 * S));
            const double quad = f2 - 2 * f1;  // = 2·(bytes per S² unit)·S²
            std::printf("  %s %-55s f(S)=%.0f f(2S)=%.0f quadratic part %.0f (one S×S tensor: %.0f)\n",
                        dst_dtype_string(dt), switch_name(sw).c_str(), f1, f2, quad / 2, s2);
            EXPECT_LT(std::fabs(quad), 0.25 * s2) << switch_name(sw) << " keeps something S×S";
        }
    }
}

// ---- determinism and the RNG stream -----------------------------------------------------------------
TEST(Determinism, SameSeedAndOffsetBitIdenticalAllDtypes) {
    const int64_t B = 2, S = 11;
    for (dst_dtype dt : {DST_DTYPE_FP32, DST_DTYPE_FP16, DST_DTYPE_BF16, DST_DTYPE_FP64}) {
        for (int sw : {0, kG | kN | kA}) {
            SCOPED_TRACE(std::string(dst_dtype_string(dt)) + " " + switch_name(sw));
            dst_layer_config cfg = small_config(20, 5, 36, dt);
            apply_switches(cfg, sw);
            cfg.attn_dropout_ratio = 0.2f;
            cfg.hidden_dropout_ratio = 0.2f;
            HostTensor lens = HostTensor::from_doubles(DST_DTYPE_INT32, {B}, {11, 6});
            const dst_mask mask = mask_of(DST_MASK_KEY_LENGTHS, lens);
            const LayerRun a = run_layer(cfg, B, S, 3, 555, 21, &mask);
            const LayerRun b = run_layer(cfg, B, S, 3, 555, 21, &mask);
            EXPECT_EQ(a.y_bytes, b.y_bytes) << "output";
            EXPECT_EQ(a.dx_bytes, b.dx_bytes) << "dX";
            EXPECT_EQ(a.grad_bytes, b.grad_bytes) << "gradient arena";
            for (double v : a.y) ASSERT_TRUE(std::isfinite(v));
            for (double v : a.dx) ASSERT_TRUE(std::isfinite(v));
            // A different offset or seed changes the masks, hence the output.
            const LayerRun c = run_layer(cfg, B, S, 3, 555, 24, &mask);
            const LayerRun d = run_layer(cfg, B, S, 3, 556, 21, &mask);
            EXPECT_NE(a.y_bytes, c.y_bytes) << "offset 21 vs 24 gave the same output";
            EXPECT_NE(a.y_bytes, d.y_bytes) << "seed 555 vs 556 gave the same output";
            EXPECT_NE(a.dx_bytes, c.dx_bytes);
        }
    }
}

TEST(Determinism, RepeatedCallsOnOneLayer) {
    const int64_t B = 2, S = 7, H = 16;
    Ctx ctx = make_ctx();
    dst_layer_config cfg = small_config(16, 4, 0, DST_DTYPE_FP32);
    Layer layer = make_layer(ctx.get(), cfg);
    randomize_params(layer.get(), 8);
    Rng rng(2);
    HostTensor x = HostTensor::from_doubles(DST_DTYPE_FP32, {B, S, H}, rng.normals(B * S * H));
    HostTensor y1(DST_DTYPE_FP32, {B, S, H}), y2(DST_DTYPE_FP32, {B, S, H}), y3(DST_DTYPE_FP32, {B, S, H});
    dst_tensor xv = x.view(), v1 = y1.view(), v2 = y2.view(), v3 = y3.view();
    DST_ASSERT_OK(dst_context_set_rng_state(ctx.get(), 9, 0));
    DST_ASSERT_OK(dst_layer_forward(layer.get(), nullptr, &xv, nullptr, &v1));
    DST_ASSERT_OK(dst_layer_forward(layer.get(), nullptr, &xv, nullptr, &v2));  // offset 3: new masks
    DST_ASSERT_OK(dst_context_set_rng_state(ctx.get(), 9, 0));
    DST_ASSERT_OK(dst_layer_forward(layer.get(), nullptr, &xv, nullptr, &v3));
    EXPECT_TRUE(y1.same_bytes(y3.bytes()));
    EXPECT_FALSE(y1.same_bytes(y2.bytes())) << "two consecutive training forwards used the same masks";
}

TEST(Rng, OffsetAdvancesByThreePerTrainingForwardOnly) {
    const int64_t B = 2, S = 5, H = 16;
    for (float ratio : {0.1f, 0.0f}) {
        SCOPED_TRACE("dropout ratio " + std::to_string(ratio));
        Ctx ctx = make_ctx();
        dst_layer_config cfg = small_config(16, 4, 0, DST_DTYPE_FP32);
        cfg.attn_dropout_ratio = ratio;
        cfg.hidden_dropout_ratio = ratio;
        Layer l1 = make_layer(ctx.get(), cfg);
        Layer l2 = make_layer(ctx.get(), cfg);
        Rng rng(2);
        HostTensor x = HostTensor::from_doubles(DST_DTYPE_FP32, {B, S, H}, rng.normals(B * S * H));
        HostTensor y(DST_DTYPE_FP32, {B, S, H}), dx(DST_DTYPE_FP32, {B, S, H});
        dst_tensor xv = x.view(), yv = y.view(), dxv = dx.view();
        auto state = [&] {
            uint64_t s = 0, o = 0;
            EXPECT_EQ(dst_context_get_rng_state(ctx.get(), &s, &o), DST_OK);
            EXPECT_EQ(s, 1234u) << "the seed never changes";
            return o;
        };
        DST_ASSERT_OK(dst_context_set_rng_state(ctx.get(), 1234, 100));
        EXPECT_EQ(state(), 100u);
        DST_ASSERT_OK(dst_layer_forward(l1.get(), nullptr, &xv, nullptr, &yv));
        EXPECT_EQ(state(), 103u) << "one training forward";
        DST_ASSERT_OK(dst_layer_backward(l1.get(), nullptr, &xv, &dxv, DST_GRAD_WRITE));
        EXPECT_EQ(state(), 103u) << "backward does not draw";
        DST_ASSERT_OK(dst_layer_forward(l2.get(), nullptr, &xv, nullptr, &yv));
        EXPECT_EQ(state(), 106u) << "layers of one context share the stream";
        DST_ASSERT_OK(dst_layer_set_training(l1.get(), 0));
        DST_ASSERT_OK(dst_layer_forward(l1.get(), nullptr, &xv, nullptr, &yv));
        EXPECT_EQ(state(), 106u) << "inference does not advance";
        DST_ASSERT_OK(dst_layer_set_training(l1.get(), 1));
        DST_ASSERT_OK(dst_layer_forward(l1.get(), nullptr, &xv, nullptr, &yv));
        DST_ASSERT_OK(dst_layer_forward(l1.get(), nullptr, &xv, nullptr, &yv));
        EXPECT_EQ(state(), 112u);
        // Another context's stream is independent.
        Ctx other = make_ctx();
        DST_ASSERT_OK(dst_context_set_rng_state(other.get(), 1, 0));
        Layer l3 = make_layer(other.get(), cfg);
        DST_ASSERT_OK(dst_layer_forward(l3.get(), nullptr, &xv, nullptr, &yv));
        EXPECT_EQ(state(), 112u);
    }
}

TEST(Inference, EqualsTrainingWithZeroDropout) {
    const int64_t B = 3, S = 6, H = 24;
    for (dst_dtype dt : {DST_DTYPE_FP64, DST_DTYPE_FP32, DST_DTYPE_BF16}) {
        for (int pre : {1, 0}) {
            for (int sw : {0, kG | kN | kA}) {
                SCOPED_TRACE(std::string(dst_dtype_string(dt)) + (pre ? " pre-LN " : " post-LN ") + switch_name(sw));
                Ctx ctx = make_ctx();
                dst_layer_config cfg = small_config(24, 3, 50, dt);
                cfg.pre_layer_norm = pre;
                cfg.attn_dropout_ratio = 0.0f;
                cfg.hidden_dropout_ratio = 0.0f;
                apply_switches(cfg, sw);
                Layer layer = make_layer(ctx.get(), cfg);
                randomize_params(layer.get(), 17);
                Rng rng(3);
                HostTensor x = HostTensor::from_doubles(dt, {B, S, H}, rng.normals(B * S * H));
                HostTensor add = HostTensor::from_doubles(dt, {B, S}, rng.normals(B * S, 1.0, -1.0));
                const dst_mask mask = mask_of(DST_MASK_ADDITIVE, add);
                HostTensor yt(dt, {B, S, H}), yi(dt, {B, S, H});
                yt.poison();
                yi.poison();
                dst_tensor xv = x.view(), tv = yt.view(), iv = yi.view();
                DST_ASSERT_OK(dst_layer_forward(layer.get(), nullptr, &xv, &mask, &tv));
                DST_ASSERT_OK(dst_layer_set_training(layer.get(), 0));
                DST_ASSERT_OK(dst_layer_forward(layer.get(), nullptr, &xv, &mask, &iv));
                EXPECT_TRUE(yi.same_bytes(yt.bytes()))
                    << "inference vs training (p = 0): rel L2 " << rel_l2(yi.doubles(), yt.doubles());
            }
        }
    }
}

// ---- the dropped fraction -------------------------------------------------------------------------
// Parameters are chosen so that y − x exposes one dropout site's mask directly.
class DropFraction : public ::testing::Test {
protected:
    static constexpr int64_t B = 8, S = 128, H = 128, heads = 4, I = 256;
    void build(float p_attn, float p_hidden) {
        ctx_ = make_ctx();
        dst_layer_config cfg = small_config(static_cast<int>(H), static_cast<int>(heads), static_cast<int>(I),
                                            DST_DTYPE_FP64);
        cfg.pre_layer_norm = 1;
        cfg.attn_dropout_ratio = p_attn;
        cfg.hidden_dropout_ratio = p_hidden;
        cfg.max_batch_tokens = B * S;
        cfg.max_seq_len = static_cast<int32_t>(S);
        layer_ = make_layer(ctx_.get(), cfg);
        ASSERT_TRUE(layer_);
        randomize_params(layer_.get(), 4);
        x_ = HostTensor::from_doubles(DST_DTYPE_FP64, {B, S, H}, Rng(6).normals(B * S * H));
    }
    std::vector<double> y_minus_x(uint64_t offset) {
        HostTensor y(DST_DTYPE_FP64, {B, S, H});
        y.poison();
        dst_tensor xv = x_.view(), yv = y.view();
        EXPECT_EQ(dst_context_set_rng_state(ctx_.get(), 31337, offset), DST_OK);
        EXPECT_EQ(dst_layer_forward(layer_.get(), nullptr, &xv, nullptr, &yv), DST_OK) << dst_last_error();
        std::vector<double> d(static_cast<size_t>(B * S * H));
        for (int64_t i = 0; i < B * S * H; ++i) d[static_cast<size_t>(i)] = y.get(i) - x_.get(i);
        return d;
    }
    // Counts elements equal to 0 (dropped) or to `scale` (kept); anything else is a failure.
    double dropped_fraction(const std::vector<double> &d, double scale) {
        size_t dropped = 0, kept = 0, other = 0;
        for (double v : d) {
            if (std::fabs(v) < 1e-9) ++dropped;
            else if (std::fabs(v - scale) < 1e-6 * scale) ++kept;  // classification only
            else if (++other <= 3) ADD_FAILURE() << "element neither dropped nor kept: " << v << " (scale " << scale << ")";
        }
        EXPECT_EQ(other, 0u);
        return static_cast<double>(dropped) / static_cast<double>(d.size());
    }
    Ctx ctx_;
    Layer layer_;
    HostTensor x_;
};

TEST_F(DropFraction, FfnOutputSite) {
    const double p = 0.3;
    build(0.0f, static_cast<float>(p));
    // a = ctx·0 + 0 = 0 → r = x; FFN output = g·0 + 1 = 1 → y = x + dropout(1).
    set_param_const(layer_.get(), "attn_ow", 0.0);
    set_param_const(layer_.get(), "attn_ob", 0.0);
    set_param_const(layer_.get(), "output_w", 0.0);
    set_param_const(layer_.get(), "output_b", 1.0);
    const double scale = 1.0 / (1.0 - static_cast<double>(static_cast<float>(p)));
    const double f = dropped_fraction(y_minus_x(0), scale);
    std::printf("  FFN-output dropout: dropped %.5f of %lld (p = %.2f)\n", f, static_cast<long long>(B * S * H), p);
    EXPECT_NEAR(f, p, 0.01);
    const double f2 = dropped_fraction(y_minus_x(3), scale);
    EXPECT_NEAR(f2, p, 0.01);
}

TEST_F(DropFraction, AttentionOutputSite) {
    const double p = 0.3;
    build(0.0f, static_cast<float>(p));
    // a = 1 → r = x + dropout(1); FFN output 0 → y = r.
    set_param_const(layer_.get(), "attn_ow", 0.0);
    set_param_const(layer_.get(), "attn_ob", 1.0);
    set_param_const(layer_.get(), "output_w", 0.0);
    set_param_const(layer_.get(), "output_b", 0.0);
    const double scale = 1.0 / (1.0 - static_cast<double>(static_cast<float>(p)));
    const double f = dropped_fraction(y_minus_x(0), scale);
    std::printf("  attention-output dropout: dropped %.5f (p = %.2f)\n", f, p);
    EXPECT_NEAR(f, p, 0.01);
}

TEST_F(DropFraction, TheTwoHiddenSitesUseDifferentMasks) {
    const double p = 0.3;
    build(0.0f, static_cast<float>(p));
    // y = x + dropout₁(1) + dropout₂(1): values 0, s, 2s; s appears only if the masks differ.
    set_param_const(layer_.get(), "attn_ow", 0.0);
    set_param_const(layer_.get(), "attn_ob", 1.0);
    set_param_const(layer_.get(), "output_w", 0.0);
    set_param_const(layer_.get(), "output_b", 1.0);
    const double s = 1.0 / (1.0 - static_cast<double>(static_cast<float>(p)));
    size_t n0 = 0, n1 = 0, n2 = 0;
    for (double v : y_minus_x(0)) {
        if (std::fabs(v) < 1e-9) ++n0;
        else if (std::fabs(v - s) < 1e-6) ++n1;
        else if (std::fabs(v - 2 * s) < 1e-6) ++n2;
    }
    const double n = static_cast<double>(B * S * H);
    EXPECT_EQ(n0 + n1 + n2, static_cast<size_t>(n));
    EXPECT_NEAR(n1 / n, 2 * p * (1 - p), 0.01) << "independent masks: P(exactly one kept) = 2p(1−p)";
    EXPECT_NEAR(n0 / n, p * p, 0.01);
}

TEST_F(DropFraction, AttentionProbabilitySite) {
    const double p = 0.3;
    build(static_cast<float>(p), 0.0f);
    // Q = K = 0 → uniform probabilities 1/S; V = 1 → ctx_{b,q,h} = (#kept keys)/(S(1−p));
    // attn_ow = I, attn_ob = 0 → a = ctx; FFN output 0 → y − x = ctx.
    set_param_const(layer_.get(), "attn_qkvw", 0.0);
    std::vector<double> qkvb(static_cast<size_t>(3 * H), 0.0);
    for (int64_t i = 2 * H; i < 3 * H; ++i) qkvb[static_cast<size_t>(i)] = 1.0;
    set_param(layer_.get(), "attn_qkvb", qkvb);
    std::vector<double> eye(static_cast<size_t>(H * H), 0.0);
    for (int64_t i = 0; i < H; ++i) eye[static_cast<size_t>(i * H + i)] = 1.0;
    set_param(layer_.get(), "attn_ow", eye);
    set_param_const(layer_.get(), "attn_ob", 0.0);
    set_param_const(layer_.get(), "output_w", 0.0);
    set_param_const(layer_.get(), "output_b", 0.0);
    const std::vector<double> c = y_minus_x(0);
    const double keep_scale = 1.0 - static_cast<double>(static_cast<float>(p));
    const int64_t d = H / heads;
    double kept_total = 0;
    int bad = 0;
    for (int64_t b = 0; b < B; ++b)
        for (int64_t q = 0; q < S; ++q)
            for (int64_t h = 0; h < heads; ++h) {
                const double v = c[static_cast<size_t>((b * S + q) * H + h * d)];
                const double kept = v * static_cast<double>(S) * keep_scale;
                if (std::fabs(kept - std::round(kept)) > 1e-3 && ++bad <= 3)
                    ADD_FAILURE() << "row (" << b << "," << q << "," << h << "): kept count " << kept << " not an integer";
                // Every element of a head sees the same mask row (up to GEMM summation order).
                for (int64_t j = 1; j < d; ++j) {
                    const double w = c[static_cast<size_t>((b * S + q) * H + h * d + j)];
                    if (std::fabs(w - v) > 1e-12 && ++bad <= 3) ADD_FAILURE() << "head elements differ: " << v << " vs " << w;
                }
                kept_total += std::round(kept);
            }
    const double dropped = 1.0 - kept_total / static_cast<double>(B * heads * S * S);
    std::printf("  attention-probability dropout: dropped %.5f of %lld (p = %.2f)\n", dropped,
                static_cast<long long>(B * heads * S * S), p);
    EXPECT_NEAR(dropped, p, 0.01);
}

}  // namespace
