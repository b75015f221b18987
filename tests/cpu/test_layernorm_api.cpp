// The standalone LayerNorm of the C API (the final LN of a Pre-LN stack): the formula, gradients by
// central finite differences in FP64, the 16/32-bit paths against FP64 on the same rounded inputs,
// accumulation, and bad arguments (status, message naming the argument, outputs untouched).
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "../common/bounds.h"
#include "test_util.h"

using namespace dsttest;

namespace {

struct Ln {
    dst_dtype dt;
    int64_t B = 3, S = 5, H = 7;
    HostTensor x, gamma, beta, y, stats, dy, dx, dgamma, dbeta;
    Ln(dst_dtype d, const std::vector<double> &xv, const std::vector<double> &g, const std::vector<double> &b,
       const std::vector<double> &dyv)
        : dt(d),
          x(HostTensor::from_doubles(d, {B, S, H}, xv)),
          gamma(HostTensor::from_doubles(d, {H}, g)),
          beta(HostTensor::from_doubles(d, {H}, b)),
          y(d, {B, S, H}),
          stats(d == DST_DTYPE_FP64 ? DST_DTYPE_FP64 : DST_DTYPE_FP32, {2, B * S}),
          dy(HostTensor::from_doubles(d, {B, S, H}, dyv)),
          dx(d, {B, S, H}),
          dgamma(d, {H}),
          dbeta(d, {H}) {}
    dst_status forward(dst_context *ctx, float eps = 1e-5f) {
        dst_tensor xv = x.view(), gv = gamma.view(), bv = beta.view(), yv = y.view(), sv = stats.view();
        return dst_layernorm_forward(ctx, &xv, &gv, &bv, eps, &yv, &sv);
    }
    dst_status backward(dst_context *ctx, dst_grad_mode mode = DST_GRAD_WRITE) {
        dst_tensor dyv = dy.view(), xv = x.view(), gv = gamma.view(), bv = beta.view(), sv = stats.view(),
                   dxv = dx.view(), dgv = dgamma.view(), dbv = dbeta.view();
        return dst_layernorm_backward(ctx, &dyv, &xv, &gv, &bv, &sv, &dxv, &dgv, &dbv, mode);
    }
};

struct Data {
    std::vector<double> x, g, b, dy;
};

Data make_data(uint64_t seed) {
    Rng rng(seed);
    Data d;
    d.x = rng.normals(3 * 5 * 7, 2.0, 0.5);
    d.g = rng.normals(7, 0.3, 1.0);
    d.b = rng.normals(7, 0.3);
    d.dy = rng.normals(3 * 5 * 7);
    return d;
}

double loss(dst_context *ctx, const Data &d) {
    Ln ln(DST_DTYPE_FP64, d.x, d.g, d.b, d.dy);
    EXPECT_EQ(ln.forward(ctx), DST_OK) << dst_last_error();
    double l = 0;
    for (size_t i = 0; i < d.dy.size(); ++i) l += d.dy[i] * ln.y.get(static_cast<int64_t>(i));
    return l;
}

TEST(LayerNormApi, FormulaAndFiniteDifferencesFp64) {
    Ctx ctx = make_ctx();
    const Data d = make_data(1);
    Ln ln(DST_DTYPE_FP64, d.x, d.g, d.b, d.dy);
    ln.y.poison();
    ASSERT_EQ(ln.forward(ctx.get()), DST_OK) << dst_last_error();
    for (int r = 0; r < 15; ++r) {  // y = γ (x − μ)/sqrt(var + ε) + β, population variance
        double mu = 0, var = 0;
        for (int j = 0; j < 7; ++j) mu += d.x[r * 7 + j] / 7;
        for (int j = 0; j < 7; ++j) var += (d.x[r * 7 + j] - mu) * (d.x[r * 7 + j] - mu) / 7;
        for (int j = 0; j < 7; ++j) {
            const double want = d.g[j] * (d.x[r * 7 + j] - mu) / std::sqrt(var + 1e-5f) + d.b[j];
            EXPECT_NEAR(ln.y.get(r * 7 + j), want, 1e-12 * (1 + std::fabs(want)));
        }
        EXPECT_NEAR(ln.stats.get(r), mu, 1e-12);
    }
    ASSERT_EQ(ln.backward(ctx.get()), DST_OK) << dst_last_error();
    // Central differences of L = Σ dy ⊙ y; h = 1e-6 gives an FD error near 1e-9 here.
    const double h = 1e-6;
    auto fd = [&](std::vector<double> Data::*field, size_t i) {
        Data p = d, m = d;
        (p.*field)[i] += h;
        (m.*field)[i] -= h;
        return (loss(ctx.get(), p) - loss(ctx.get(), m)) / (2 * h);
    };
    for (size_t i = 0; i < d.x.size(); i += 4)
        EXPECT_NEAR(ln.dx.get(static_cast<int64_t>(i)), fd(&Data::x, i), 1e-6) << "dx[" << i << "]";
    for (size_t j = 0; j < 7; ++j) {
        EXPECT_NEAR(ln.dgamma.get(static_cast<int64_t>(j)), fd(&Data::g, j), 1e-6) << "dgamma[" << j << "]";
        EXPECT_NEAR(ln.dbeta.get(static_cast<int64_t>(j)), fd(&Data::b, j), 1e-6) << "dbeta[" << j << "]";
    }
    // Accumulate adds to dgamma/dbeta and writes dx.
    const std::vector<double> g1 = ln.dgamma.doubles(), b1 = ln.dbeta.doubles(), x1 = ln.dx.doubles();
    ASSERT_EQ(ln.backward(ctx.get(), DST_GRAD_ACCUMULATE), DST_OK);
    for (size_t j = 0; j < 7; ++j) {
        EXPECT_NEAR(ln.dgamma.get(static_cast<int64_t>(j)), 2 * g1[j], 1e-12 * (1 + std::fabs(g1[j])));
        EXPECT_NEAR(ln.dbeta.get(static_cast<int64_t>(j)), 2 * b1[j], 1e-12 * (1 + std::fabs(b1[j])));
    }
    EXPECT_EQ(ln.dx.doubles(), x1);
    // Inference: stats may be NULL.
    dst_tensor xv = ln.x.view(), gv = ln.gamma.view(), bv = ln.beta.view(), yv = ln.y.view();
    EXPECT_EQ(dst_layernorm_forward(ctx.get(), &xv, &gv, &bv, 1e-5f, &yv, nullptr), DST_OK) << dst_last_error();
}

TEST(LayerNormApi, ReducedPrecisionAgainstFp64) {
    Ctx ctx = make_ctx();
    for (dst_dtype dt : {DST_DTYPE_FP32, DST_DTYPE_FP16, DST_DTYPE_BF16}) {
        Data d = make_data(2);
        for (auto *v : {&d.x, &d.g, &d.b, &d.dy})
            for (double &e : *v) e = round_to(e, dt);
        Ln lo(dt, d.x, d.g, d.b, d.dy), hi(DST_DTYPE_FP64, d.x, d.g, d.b, d.dy);
        ASSERT_EQ(lo.forward(ctx.get()), DST_OK) << dst_last_error();
        ASSERT_EQ(lo.backward(ctx.get()), DST_OK) << dst_last_error();
        ASSERT_EQ(hi.forward(ctx.get()), DST_OK);
        ASSERT_EQ(hi.backward(ctx.get()), DST_OK);
        // One rounding of each output (tests/common/bounds.h bounds; measured errors are ~3x below them).
        const double tol = design_tolerance(dt);
        EXPECT_LE(rel_l2(lo.y.doubles(), hi.y.doubles()), tol) << dst_dtype_string(dt);
        EXPECT_LE(rel_l2(lo.dx.doubles(), hi.dx.doubles()), tol) << dst_dtype_string(dt);
        EXPECT_LE(rel_l2(lo.dgamma.doubles(), hi.dgamma.doubles()), tol) << dst_dtype_string(dt);
        EXPECT_LE(rel_l2(lo.dbeta.doubles(), hi.dbeta.doubles()), tol) << dst_dtype_string(dt);
    }
}

bool mentions(const char *needle) { return std::string(dst_last_error()).find(needle) != std::string::npos; }

TEST(LayerNormApi, BadArguments) {
    Ctx ctx = make_ctx();
    const Data d = make_data(3);
    Ln ln(DST_DTYPE_FP32, d.x, d.g, d.b, d.dy);
    ln.y.poison();
    ln.stats.poison();
    const auto y0 = ln.y.bytes(), s0 = ln.stats.bytes();
    dst_tensor x = ln.x.view(), g = ln.gamma.view(), b = ln.beta.view(), y = ln.y.view(), s = ln.stats.view();
    auto fwd_fails = [&](dst_context *c, const dst_tensor *xx, const dst_tensor *gg, const dst_tensor *bb, float eps,
                         dst_tensor *yy, dst_tensor *ss, const char *arg) {
        EXPECT_EQ(dst_layernorm_forward(c, xx, gg, bb, eps, yy, ss), DST_ERR_INVALID_ARGUMENT) << arg;
        EXPECT_TRUE(mentions(arg)) << arg << ": " << dst_last_error();
        EXPECT_TRUE(ln.y.same_bytes(y0) && ln.stats.same_bytes(s0)) << arg;
    };
    fwd_fails(nullptr, &x, &g, &b, 1e-5f, &y, &s, "ctx");
    fwd_fails(ctx.get(), nullptr, &g, &b, 1e-5f, &y, &s, "x");
    fwd_fails(ctx.get(), &x, nullptr, &b, 1e-5f, &y, &s, "gamma");
    fwd_fails(ctx.get(), &x, &g, nullptr, 1e-5f, &y, &s, "beta");
    fwd_fails(ctx.get(), &x, &g, &b, 1e-5f, nullptr, &s, "y");
    fwd_fails(ctx.get(), &x, &g, &b, 0.0f, &y, &s, "eps");
    fwd_fails(ctx.get(), &x, &g, &b, NAN, &y, &s, "eps");
    dst_tensor bad = g;
    bad.shape[0] = 6;
    fwd_fails(ctx.get(), &x, &bad, &b, 1e-5f, &y, &s, "gamma");
    bad = x;
    bad.dtype = DST_DTYPE_INT32;
    fwd_fails(ctx.get(), &bad, &g, &b, 1e-5f, &y, &s, "x");
    bad = y;
    bad.shape[1] = 4;
    fwd_fails(ctx.get(), &x, &g, &b, 1e-5f, &bad, &s, "y");
    fwd_fails(ctx.get(), &x, &g, &b, 1e-5f, &x, &s, "overlaps");
    bad = s;
    bad.dtype = DST_DTYPE_FP64;
    fwd_fails(ctx.get(), &x, &g, &b, 1e-5f, &y, &bad, "stats");
    bad = s;
    bad.shape[1] = 14;
    fwd_fails(ctx.get(), &x, &g, &b, 1e-5f, &y, &bad, "stats");

    ASSERT_EQ(ln.forward(ctx.get()), DST_OK);
    ln.dx.poison();
    const auto dx0 = ln.dx.bytes(), dg0 = ln.dgamma.bytes();
    dst_tensor dy = ln.dy.view(), dx = ln.dx.view(), dg = ln.dgamma.view(), db = ln.dbeta.view();
    auto bwd_fails = [&](const dst_tensor *dyy, const dst_tensor *ss, dst_tensor *dxx, dst_grad_mode mode,
                         const char *arg) {
        EXPECT_EQ(dst_layernorm_backward(ctx.get(), dyy, &x, &g, &b, ss, dxx, &dg, &db, mode),
                  DST_ERR_INVALID_ARGUMENT)
            << arg;
        EXPECT_TRUE(mentions(arg)) << arg << ": " << dst_last_error();
        EXPECT_TRUE(ln.dx.same_bytes(dx0) && ln.dgamma.same_bytes(dg0)) << arg;
    };
    bwd_fails(nullptr, &s, &dx, DST_GRAD_WRITE, "dy");
    bwd_fails(&dy, nullptr, &dx, DST_GRAD_WRITE, "stats");
    bwd_fails(&dy, &s, nullptr, DST_GRAD_WRITE, "dx");
    bwd_fails(&dy, &s, &dy, DST_GRAD_WRITE, "overlaps");
    dst_grad_mode bad_mode;
    const int32_t nine = 9;
    std::memcpy(&bad_mode, &nine, sizeof bad_mode);
    bwd_fails(&dy, &s, &dx, bad_mode, "mode");
}

}  // namespace
