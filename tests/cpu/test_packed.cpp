// Packed sequences (dst_layer_forward_packed / dst_layer_backward_packed): every packed row gets what
// the padded layer with key lengths gives it (up to rounding), forward and backward, with the same
// dropout; bad arguments fail with a message naming them and change nothing.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "test_util.h"

using namespace dsttest;

namespace {

constexpr int64_t kH = 16;

struct Batch {
    std::vector<int32_t> lens;
    int64_t S;
    int64_t B() const { return static_cast<int64_t>(lens.size()); }
    int64_t N() const {
        int64_t n = 0;
        for (int32_t l : lens) n += l;
        return n;
    }
    HostTensor offsets() const {
        HostTensor cu(DST_DTYPE_INT32, {B() + 1});
        int64_t at = 0;
        cu.set(0, 0);
        for (int64_t b = 0; b < B(); ++b) cu.set(b + 1, static_cast<double>(at += lens[static_cast<size_t>(b)]));
        return cu;
    }
};

// Padded [B, S, H] values: `rows` (N rows of H) at the valid places, zero elsewhere.
std::vector<double> pad(const Batch &bt, const std::vector<double> &rows) {
    std::vector<double> out(static_cast<size_t>(bt.B() * bt.S * kH), 0.0);
    size_t r = 0;
    for (int64_t b = 0; b < bt.B(); ++b)
        for (int64_t s = 0; s < bt.lens[static_cast<size_t>(b)]; ++s, ++r)
            for (int64_t h = 0; h < kH; ++h) out[static_cast<size_t>((b * bt.S + s) * kH + h)] = rows[r * kH + h];
    return out;
}

// The valid rows of a padded [B, S, H] tensor.
std::vector<double> valid_rows(const Batch &bt, const HostTensor &t) {
    std::vector<double> out;
    for (int64_t b = 0; b < bt.B(); ++b)
        for (int64_t s = 0; s < bt.lens[static_cast<size_t>(b)]; ++s)
            for (int64_t h = 0; h < kH; ++h) out.push_back(t.get((b * bt.S + s) * kH + h));
    return out;
}

struct Outcome {
    std::vector<double> y, dx;
    std::vector<std::vector<double>> grads;
};

// max |a − b| over max(1, max |a|): the packed call's GEMMs run over other row counts than the padded
// call's, so the two agree up to the rounding of the dtype (the dropped elements are the same: a
// different one would be off by a whole activation).
double rel_diff(const std::vector<double> &a, const std::vector<double> &b) {
    EXPECT_EQ(a.size(), b.size());
    double d = 0, m = 1;
    for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
        d = std::max(d, std::fabs(a[i] - b[i]));
        m = std::max(m, std::fabs(a[i]));
    }
    return d / m;
}

double bound_of(dst_dtype dt) { return dt == DST_DTYPE_FP64 ? 1e-11 : dt == DST_DTYPE_FP32 ? 2e-5 : 3e-2; }

dst_layer_config packed_config(dst_dtype dt, bool pre, bool dropout, bool causal) {
    dst_layer_config cfg = small_config(kH, 4, 40, dt);
    cfg.pre_layer_norm = pre;
    cfg.attn_dropout_ratio = dropout ? 0.2f : 0.0f;
    cfg.hidden_dropout_ratio = dropout ? 0.15f : 0.0f;
    cfg.causal = causal;
    return cfg;
}

// The same weights and RNG state for both runs.
Layer fresh_layer(dst_context *ctx, const dst_layer_config &cfg, bool train) {
    Layer layer = make_layer(ctx, cfg);
    randomize_params(layer.get(), 21);
    DST_EXPECT_OK(dst_layer_set_training(layer.get(), train));
    DST_EXPECT_OK(dst_context_set_rng_state(ctx, 77, 5));
    return layer;
}

Outcome run_padded(const dst_layer_config &cfg, const Batch &bt, const std::vector<double> &x, const std::vector<double> &dy,
               bool train) {
    Ctx ctx = make_ctx();
    Layer layer = fresh_layer(ctx.get(), cfg, train);
    const dst_dtype dt = cfg.dtype;
    HostTensor xp = HostTensor::from_doubles(dt, {bt.B(), bt.S, kH}, pad(bt, x));
    HostTensor dyp = HostTensor::from_doubles(dt, {bt.B(), bt.S, kH}, pad(bt, dy));
    HostTensor yp(dt, {bt.B(), bt.S, kH}), dxp(dt, {bt.B(), bt.S, kH}), lens(DST_DTYPE_INT32, {bt.B()});
    for (int64_t b = 0; b < bt.B(); ++b) lens.set(b, bt.lens[static_cast<size_t>(b)]);
    dst_tensor xv = xp.view(), yv = yp.view(), dyv = dyp.view(), dxv = dxp.view();
    const dst_mask m = mask_of(DST_MASK_KEY_LENGTHS, lens);
    DST_EXPECT_OK(dst_layer_forward(layer.get(), nullptr, &xv, &m, &yv));
    Outcome r;
    r.y = valid_rows(bt, yp);
    if (train) {
        DST_EXPECT_OK(dst_layer_backward(layer.get(), nullptr, &dyv, &dxv, DST_GRAD_WRITE));
        r.dx = valid_rows(bt, dxp);
        r.grads = all_grads(layer.get());
    }
    return r;
}

Outcome run_packed(const dst_layer_config &cfg, const Batch &bt, const std::vector<double> &x, const std::vector<double> &dy,
               bool train) {
    Ctx ctx = make_ctx();
    Layer layer = fresh_layer(ctx.get(), cfg, train);
    const dst_dtype dt = cfg.dtype;
    HostTensor xs = HostTensor::from_doubles(dt, {bt.N(), kH}, x), dys = HostTensor::from_doubles(dt, {bt.N(), kH}, dy);
    HostTensor ys(dt, {bt.N(), kH}), dxs(dt, {bt.N(), kH}), cu = bt.offsets();
    dst_tensor xv = xs.view(), yv = ys.view(), dyv = dys.view(), dxv = dxs.view(), cuv = cu.view();
    DST_EXPECT_OK(dst_layer_forward_packed(layer.get(), nullptr, &xv, &cuv, bt.S, &yv));
    Outcome r;
    r.y = ys.doubles();
    if (train) {
        DST_EXPECT_OK(dst_layer_backward_packed(layer.get(), nullptr, &dyv, &dxv, DST_GRAD_WRITE));
        r.dx = dxs.doubles();
        r.grads = all_grads(layer.get());
    }
    return r;
}

// The packed call runs on the N rows themselves (a second batch with more rows than one GEMM block).
TEST(Packed, EveryRowGetsWhatThePaddedLayerGivesIt) {
  for (const Batch &bt : {Batch{{5, 1, 12, 7}, 12}, Batch{{64, 37, 1, 63, 60, 3, 64, 50}, 64}})
    for (dst_dtype dt : {DST_DTYPE_FP32, DST_DTYPE_BF16, DST_DTYPE_FP64})
        for (int pre = 0; pre < 2; ++pre)
            for (int variant = 0; variant < 3; ++variant) {  // plain, dropout, dropout + causal
                const bool dropout = variant > 0, causal = variant == 2;
                SCOPED_TRACE(std::string(dst_dtype_string(dt)) + (pre ? " pre-LN" : " post-LN") +
                             (dropout ? " dropout" : "") + (causal ? " causal" : ""));
                dst_layer_config cfg = packed_config(dt, pre != 0, dropout, causal);
                cfg.max_batch_tokens = static_cast<int32_t>(bt.B() * bt.S);
                Rng rng(static_cast<uint64_t>(100 + int(dt) * 10 + pre * 3 + variant));
                const std::vector<double> x = rng.normals(static_cast<size_t>(bt.N() * kH));
                const std::vector<double> dy = rng.normals(static_cast<size_t>(bt.N() * kH));
                for (int train = 1; train >= 0; --train) {
                    SCOPED_TRACE(train ? "training" : "inference");
                    const Outcome a = run_padded(cfg, bt, x, dy, train != 0), b = run_packed(cfg, bt, x, dy, train != 0);
                    const double tol = bound_of(dt);
                    EXPECT_LE(rel_diff(a.y, b.y), tol) << "forward";
                    if (!train) continue;
                    EXPECT_LE(rel_diff(a.dx, b.dx), tol) << "dx";
                    ASSERT_EQ(a.grads.size(), b.grads.size());
                    for (size_t g = 0; g < a.grads.size(); ++g)
                        EXPECT_LE(rel_diff(a.grads[g], b.grads[g]), tol) << kParamNames[g];
                }
            }
}

TEST(Packed, BadArgumentsAreRefusedAndChangeNothing) {
    Ctx ctx = make_ctx();
    const dst_layer_config cfg = packed_config(DST_DTYPE_FP32, true, true, false);  // max_seq_len 64, 256 tokens
    Layer layer = make_layer(ctx.get(), cfg);
    randomize_params(layer.get(), 3);
    const Batch bt{{3, 4}, 8};
    HostTensor x = HostTensor::from_doubles(DST_DTYPE_FP32, {7, kH}, Rng(4).normals(7 * kH));
    HostTensor y(DST_DTYPE_FP32, {7, kH}), y6(DST_DTYPE_FP32, {6, kH}), xh(DST_DTYPE_BF16, {7, kH});
    y.poison();
    const auto ysent = y.bytes();
    HostTensor cu = bt.offsets();
    dst_tensor xv = x.view(), yv = y.view(), y6v = y6.view(), xhv = xh.view(), cuv = cu.view();
    auto fwd = [&](const dst_tensor *cu_t, int64_t S, dst_tensor *out) {
        return dst_layer_forward_packed(layer.get(), nullptr, &xv, cu_t, S, out);
    };
    auto offsets = [](std::vector<double> v) {
        return HostTensor::from_doubles(DST_DTYPE_INT32, {static_cast<int64_t>(v.size())}, v);
    };
    HostTensor not_zero = offsets({1, 4, 7}), short_end = offsets({0, 3, 6}), empty_seq = offsets({0, 0, 7}),
               too_long = offsets({0, 1, 7}), f32 = HostTensor::from_doubles(DST_DTYPE_FP32, {3}, {0, 3, 7}),
               one = offsets({0});
    dst_tensor nz = not_zero.view(), se = short_end.view(), es = empty_seq.view(), tl = too_long.view(),
               fv = f32.view(), ov = one.view();
    EXPECT_FAILS(DST_ERR_INVALID_ARGUMENT, "cu_seqlens", fwd(&nz, 8, &yv));
    EXPECT_FAILS(DST_ERR_INVALID_ARGUMENT, "cu_seqlens", fwd(&se, 8, &yv));
    EXPECT_FAILS(DST_ERR_INVALID_ARGUMENT, "length", fwd(&es, 8, &yv));
    EXPECT_FAILS(DST_ERR_INVALID_ARGUMENT, "length", fwd(&tl, 5, &yv));  // 6 > max_seqlen 5
    EXPECT_FAILS(DST_ERR_INVALID_ARGUMENT, "cu_seqlens", fwd(&fv, 8, &yv));
    EXPECT_FAILS(DST_ERR_INVALID_ARGUMENT, "cu_seqlens", fwd(&ov, 8, &yv));
    EXPECT_FAILS(DST_ERR_INVALID_ARGUMENT, "cu_seqlens", fwd(nullptr, 8, &yv));
    EXPECT_FAILS(DST_ERR_INVALID_ARGUMENT, "max_seqlen", fwd(&cuv, 0, &yv));
    EXPECT_FAILS(DST_ERR_CAPACITY, "max_seqlen", fwd(&cuv, 65, &yv));
    EXPECT_FAILS(DST_ERR_INVALID_ARGUMENT, "output", fwd(&cuv, 8, &y6v));
    EXPECT_FAILS(DST_ERR_INVALID_ARGUMENT, "rows", fwd(&cuv, 3, &yv));  // 7 rows cannot be 2 sequences of <= 3
    EXPECT_FAILS(DST_ERR_INVALID_ARGUMENT, "input",
                 dst_layer_forward_packed(layer.get(), nullptr, &xhv, &cuv, 8, &yv));
    EXPECT_TRUE(y.same_bytes(ysent)) << "a refused call wrote to output";
    // Backward needs a packed training forward in the same saved object, and the padded backward refuses it.
    HostTensor dx(DST_DTYPE_FP32, {7, kH});
    dst_tensor dxv = dx.view();
    EXPECT_FAILS(DST_ERR_STATE, "saved", dst_layer_backward_packed(layer.get(), nullptr, &yv, &dxv, DST_GRAD_WRITE));
    DST_ASSERT_OK(fwd(&cuv, 8, &yv));
    HostTensor yp(DST_DTYPE_FP32, {2, 8, kH}), dxp(DST_DTYPE_FP32, {2, 8, kH});
    dst_tensor ypv = yp.view(), dxpv = dxp.view();
    EXPECT_FAILS(DST_ERR_STATE, "packed", dst_layer_backward(layer.get(), nullptr, &ypv, &dxpv, DST_GRAD_WRITE));
    EXPECT_FAILS(DST_ERR_INVALID_ARGUMENT, "grad_output",
                 dst_layer_backward_packed(layer.get(), nullptr, &y6v, &dxv, DST_GRAD_WRITE));
    DST_EXPECT_OK(dst_layer_backward_packed(layer.get(), nullptr, &yv, &dxv, DST_GRAD_WRITE));
    // A refused packed forward leaves the saved object as it was: backward still gives the same dx.
    HostTensor dx1(DST_DTYPE_FP32, {7, kH});
    dst_tensor dx1v = dx1.view();
    DST_ASSERT_OK(fwd(&cuv, 8, &yv));
    DST_ASSERT_OK(dst_layer_backward_packed(layer.get(), nullptr, &yv, &dxv, DST_GRAD_WRITE));
    EXPECT_FAILS(DST_ERR_INVALID_ARGUMENT, "length", fwd(&es, 8, &yv));
    DST_ASSERT_OK(dst_layer_backward_packed(layer.get(), nullptr, &yv, &dx1v, DST_GRAD_WRITE));
    EXPECT_TRUE(dx1.same_bytes(dx.bytes())) << "a refused forward changed the saved activations";
    // A padded forward into the same saved object makes the packed backward refuse it.
    DST_ASSERT_OK(dst_layer_forward(layer.get(), nullptr, &ypv, nullptr, &dxpv));
    EXPECT_FAILS(DST_ERR_STATE, "padded", dst_layer_backward_packed(layer.get(), nullptr, &yv, &dxv, DST_GRAD_WRITE));
}

}  // namespace
