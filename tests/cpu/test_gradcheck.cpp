// Finite-difference check of the whole layer's backward in FP64 on the CPU backend.
//
// Loss L(x, θ) = Σ dy ⊙ y(x, θ) with a fixed random dy, so dL/dx and dL/dθ are exactly what
// dst_layer_backward(grad_output = dy) returns. For a capped random subset of elements of dX and of
// each of the 12 parameter gradients we compare with the central difference
//     fd = (L(θ + h·e_i) − L(θ − h·e_i)) / (2h).
// Every perturbed forward runs in training mode after dst_context_set_rng_state(seed, offset), so the
// dropout masks are the same in every evaluation and L is a smooth function of θ (the masks are
// constants, not functions of the data).
//
// Error budget (h = kH = 2e-6, FP64):
//  - truncation: h²/6 · |∂³L| ≈ 7e-13 · |∂³L|, negligible for these O(1) data;
//  - rounding: each L is a sum of N·H terms that carry a few ε of relative error through the layer,
//    so |δL| ≲ c·ε·Σ|dy⊙y| and the difference quotient carries c·ε·Σ|dy⊙y|/h. This noise floor is
//    above a fixed 1e-9: gradients that are exactly 0 (e.g. of the key bias, softmax is invariant to
//    it) read back as ±1.8e-9 = a few ulp(L)/2h. So atol = 1e-9 + kRoundingC·ε·Σ|dy⊙y|/h with
//    kRoundingC = 1 (≈ 3e-8 for these shapes; the largest error measured is ~7% of the bound).
//  - relative part 1e-6·(|fd| + |an|): a wrong formula (a missing term, a transposed index, a wrong
//    mask replay) produces relative errors of order 1e-2 … 1, many orders above this bound.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <numeric>
#include <sstream>
#include <string>
#include <vector>

#include "test_util.h"

using namespace dsttest;

namespace {

constexpr double kH = 2e-6;
constexpr double kRel = 1e-6;
constexpr double kAbs = 1e-9;
constexpr double kRoundingC = 1.0;
constexpr int kMaxElems = 12;
constexpr int64_t kB = 3;
constexpr int kHidden = 15, kHeads = 3, kInter = 22;

enum MaskKind { kNone = 0, kAdditive = 1, kLengths = 2 };

struct GcParam {
    int pre;        // 1 Pre-LN, 0 Post-LN
    int switches;   // bit 0 gelu_checkpoint, bit 1 normalize_invertible, bit 2 attn_dropout_checkpoint
    int dropout;    // 1: p_attn = p_hidden = 0.1
    int mask;       // MaskKind
    int seq;        // S
    int causal;
    int tanh_gelu;
};

std::string param_name(const GcParam &p) {
    static const char *const masks[] = {"nomask", "additive", "lengths"};
    std::ostringstream os;
    os << (p.pre ? "PreLN" : "PostLN") << "_sw" << (p.switches & 1 ? "G" : "") << (p.switches & 2 ? "N" : "")
       << (p.switches & 4 ? "A" : "") << (p.switches ? "" : "0") << (p.dropout ? "_drop" : "_nodrop") << "_"
       << masks[p.mask] << "_S" << p.seq << (p.causal ? "_causal" : "") << (p.tanh_gelu ? "_tanh" : "");
    return os.str();
}

void PrintTo(const GcParam &p, std::ostream *os) { *os << param_name(p); }

class GradCheck : public ::testing::TestWithParam<GcParam> {};

TEST_P(GradCheck, BackwardMatchesCentralDifferences) {
    const GcParam gp = GetParam();
    const int64_t S = gp.seq, H = kHidden;
    const uint64_t kSeed = 2024, kOffset = 7;
    const uint64_t case_seed = static_cast<uint64_t>(gp.pre * 1000 + gp.switches * 100 + gp.dropout * 10 + gp.mask +
                                                     gp.seq * 10000 + gp.causal * 7 + gp.tanh_gelu * 3);

    Ctx ctx = make_ctx();
    ASSERT_TRUE(ctx);
    DST_ASSERT_OK(dst_context_set_num_threads(ctx.get(), 1));
    dst_layer_config cfg = small_config(kHidden, kHeads, kInter, DST_DTYPE_FP64);
    cfg.pre_layer_norm = gp.pre;
    cfg.gelu_checkpoint = gp.switches & 1;
    cfg.normalize_invertible = (gp.switches >> 1) & 1;
    cfg.attn_dropout_checkpoint = (gp.switches >> 2) & 1;
    cfg.attn_dropout_ratio = gp.dropout ? 0.1f : 0.0f;
    cfg.hidden_dropout_ratio = gp.dropout ? 0.1f : 0.0f;
    cfg.layer_norm_eps = 1e-5f;
    cfg.causal = gp.causal;
    cfg.gelu = gp.tanh_gelu ? DST_GELU_TANH : DST_GELU_ERF;
    cfg.max_batch_tokens = 64;
    cfg.max_seq_len = 16;
    Layer layer = make_layer(ctx.get(), cfg);
    ASSERT_TRUE(layer);
    randomize_params(layer.get(), 100 + case_seed);

    Rng rng(case_seed);
    HostTensor x = HostTensor::from_doubles(DST_DTYPE_FP64, {kB, S, H}, rng.normals(kB * S * H));
    HostTensor dy = HostTensor::from_doubles(DST_DTYPE_FP64, {kB, S, H}, rng.normals(kB * S * H));
    HostTensor y(DST_DTYPE_FP64, {kB, S, H}), dx(DST_DTYPE_FP64, {kB, S, H});

    // Masks: additive values in [-3, 0] with some keys at -1e4 (key 0 always visible); lengths
    // {S, 1, ceil(S/2)}.
    HostTensor madd(DST_DTYPE_FP64, {kB, S});
    HostTensor mlen(DST_DTYPE_INT32, {kB});
    for (int64_t b = 0; b < kB; ++b)
        for (int64_t s = 0; s < S; ++s) madd.set(b * S + s, (s > 0 && rng.uniform() < 0.25) ? -1e4 : -3.0 * rng.uniform());
    mlen.set(0, static_cast<double>(S));
    mlen.set(1, 1.0);
    mlen.set(2, static_cast<double>((S + 1) / 2));
    dst_mask mask = mask_none();
    if (gp.mask == kAdditive) mask = mask_of(DST_MASK_ADDITIVE, madd);
    if (gp.mask == kLengths) mask = mask_of(DST_MASK_KEY_LENGTHS, mlen);

    // Analytic gradients.
    y.poison();
    dx.poison();
    {
        dst_tensor xv = x.view(), yv = y.view(), dyv = dy.view(), dxv = dx.view();
        DST_ASSERT_OK(dst_context_set_rng_state(ctx.get(), kSeed, kOffset));
        DST_ASSERT_OK(dst_layer_forward(layer.get(), nullptr, &xv, &mask, &yv));
        DST_ASSERT_OK(dst_layer_backward(layer.get(), nullptr, &dyv, &dxv, DST_GRAD_WRITE));
    }
    const std::vector<double> dx_an = dx.doubles();
    const auto grads_an = all_grads(layer.get());
    for (double v : dx_an) ASSERT_TRUE(std::isfinite(v));

    // The loss of one perturbed forward (same RNG state every time).
    Saved scratch = make_saved(layer.get());
    const std::vector<double> dyv_host = dy.doubles();
    double loss_scale = 0;  // Σ|dy⊙y| at the unperturbed point
    auto loss = [&](double *scale) -> double {
        HostTensor yy(DST_DTYPE_FP64, {kB, S, H});
        yy.poison();
        dst_tensor xv = x.view(), yv = yy.view();
        EXPECT_EQ(dst_context_set_rng_state(ctx.get(), kSeed, kOffset), DST_OK);
        const dst_status st = dst_layer_forward(layer.get(), scratch.get(), &xv, &mask, &yv);
        EXPECT_EQ(st, DST_OK) << dst_last_error();
        long double sum = 0, abs_sum = 0;
        for (int64_t i = 0; i < yy.numel(); ++i) {
            const long double t = static_cast<long double>(dyv_host[static_cast<size_t>(i)]) * yy.get(i);
            sum += t;
            abs_sum += std::fabs(t);
        }
        if (scale) *scale = static_cast<double>(abs_sum);
        return static_cast<double>(sum);
    };
    const double l0 = loss(&loss_scale);
    {
        // The forward used for the loss reproduces the training forward bit for bit.
        double l_ref = 0;
        for (size_t i = 0; i < dyv_host.size(); ++i) l_ref += dyv_host[i] * y.get(static_cast<int64_t>(i));
        EXPECT_NEAR(l0, l_ref, 1e-12 * loss_scale) << "re-running the forward with the same RNG state differs";
    }
    const double eps = std::numeric_limits<double>::epsilon();
    const double atol = kAbs + kRoundingC * eps * loss_scale / kH;

    // Checks one tensor: `perturb(i, delta)` adds delta to element i of it.
    auto check = [&](const char *what, const std::vector<double> &an, int64_t n,
                     const std::function<void(int64_t, double)> &perturb) {
        std::vector<int64_t> idx(static_cast<size_t>(n));
        std::iota(idx.begin(), idx.end(), 0);
        for (int64_t i = n - 1; i > 0; --i) std::swap(idx[static_cast<size_t>(i)], idx[static_cast<size_t>(rng.below(i + 1))]);
        idx.resize(static_cast<size_t>(std::min<int64_t>(n, kMaxElems)));
        double worst = 0;
        int bad = 0;
        for (int64_t i : idx) {
            perturb(i, kH);
            const double lp = loss(nullptr);
            perturb(i, -2 * kH);
            const double lm = loss(nullptr);
            perturb(i, kH);
            const double fd = (lp - lm) / (2 * kH);
            const double a = an[static_cast<size_t>(i)];
            const double err = std::fabs(fd - a);
            const double bound = kRel * (std::fabs(fd) + std::fabs(a)) + atol;
            worst = std::max(worst, err / bound);
            if (!(err <= bound)) {
                if (++bad <= 4)
                    ADD_FAILURE() << what << "[" << i << "]: analytic " << a << " vs finite difference " << fd
                                  << " (|diff| " << err << " > bound " << bound << ")";
            }
        }
        if (::testing::Test::HasFailure() || std::getenv("DST_GRADCHECK_VERBOSE"))
            std::printf("  %-10s worst err/bound %.3g (%d of %zu bad)\n", what, worst, bad, idx.size());
    };

    check("dX", dx_an, x.numel(), [&](int64_t i, double d) { x.set(i, x.get(i) + d); });
    for (int p = 0; p < DST_PARAM_COUNT; ++p) {
        std::vector<double> theta = get_param(layer.get(), kParamNames[p]);
        check(kParamNames[p], grads_an[static_cast<size_t>(p)], static_cast<int64_t>(theta.size()),
              [&](int64_t i, double d) {
                  theta[static_cast<size_t>(i)] += d;
                  set_param(layer.get(), kParamNames[p], theta);
              });
    }
}

std::vector<GcParam> main_grid() {
    std::vector<GcParam> v;
    for (int pre : {1, 0})
        for (int sw = 0; sw < 8; ++sw)
            for (int drop : {0, 1})
                for (int mask : {kNone, kAdditive, kLengths})
                    for (int seq : {1, 5, 13}) v.push_back(GcParam{pre, sw, drop, mask, seq, 0, 0});
    return v;
}

std::vector<GcParam> extra_grid() {
    // Causal attention and the tanh GELU, with and without all switches, dropout on.
    std::vector<GcParam> v;
    for (int pre : {1, 0})
        for (int sw : {0, 7})
            for (int ct : {1, 2, 3})  // bit 0 causal, bit 1 tanh
                v.push_back(GcParam{pre, sw, 1, ct == 2 ? kAdditive : kLengths, 13, ct & 1, ct >> 1});
    return v;
}

INSTANTIATE_TEST_SUITE_P(Layer, GradCheck, ::testing::ValuesIn(main_grid()),
                         [](const ::testing::TestParamInfo<GcParam> &i) { return param_name(i.param); });
INSTANTIATE_TEST_SUITE_P(Variants, GradCheck, ::testing::ValuesIn(extra_grid()),
                         [](const ::testing::TestParamInfo<GcParam> &i) { return param_name(i.param); });

}  // namespace
