// Op-level tests of the CPU reference backend (src/backend/cpu):
//  - every backward op against central finite differences in fp64 on small awkward shapes
//    (n=5, h=7, S=1/5/13, 3 heads of 5, every mask kind, causal, dropout on and off);
//  - fp32/fp16/bf16 against fp64 on the same (rounded) inputs, relative L2 error per tensor;
//  - the dropout keep fraction, the Philox mask element by element, accumulate, memory ops;
//  - bit-identical outputs on repeated calls and for different thread counts.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "../common/bounds.h"
#include "backend/backend.h"
#include "core/error.h"
#include "core/half.h"
#include "kernels/philox.h"

namespace {

using dst::AttentionParams;
using dst::Backend;
using dst::DropoutSite;
using Vec = std::vector<double>;
const double kInf = std::numeric_limits<double>::infinity();

// ---- buffers of any dtype ------------------------------------------------------------------------

size_t elem_size(dst_dtype dt) { return dt == DST_DTYPE_FP64 ? 8 : (dt == DST_DTYPE_FP16 || dt == DST_DTYPE_BF16) ? 2 : 4; }
dst_dtype stat_dtype(dst_dtype dt) { return dt == DST_DTYPE_FP64 ? DST_DTYPE_FP64 : DST_DTYPE_FP32; }

struct Buf {
    dst_dtype dt = DST_DTYPE_FP64;
    size_t n = 0;
    std::vector<unsigned char> bytes;
    void *p() { return bytes.empty() ? nullptr : bytes.data(); }
    const void *p() const { return bytes.empty() ? nullptr : bytes.data(); }
};

void put(Buf &b, size_t i, double v) {
    unsigned char *d = b.bytes.data();
    switch (b.dt) {
        case DST_DTYPE_FP64: reinterpret_cast<double *>(d)[i] = v; break;
        case DST_DTYPE_FP32: reinterpret_cast<float *>(d)[i] = static_cast<float>(v); break;
        case DST_DTYPE_FP16: reinterpret_cast<dst::half_t *>(d)[i] = dst::half_t(static_cast<float>(v)); break;
        case DST_DTYPE_BF16: reinterpret_cast<dst::bf16_t *>(d)[i] = dst::bf16_t(static_cast<float>(v)); break;
        case DST_DTYPE_INT32: reinterpret_cast<int32_t *>(d)[i] = static_cast<int32_t>(v); break;
    }
}
double get(const Buf &b, size_t i) {
    const unsigned char *d = b.bytes.data();
    switch (b.dt) {
        case DST_DTYPE_FP64: return reinterpret_cast<const double *>(d)[i];
        case DST_DTYPE_FP32: return reinterpret_cast<const float *>(d)[i];
        case DST_DTYPE_FP16: return static_cast<float>(reinterpret_cast<const dst::half_t *>(d)[i]);
        case DST_DTYPE_BF16: return static_cast<float>(reinterpret_cast<const dst::bf16_t *>(d)[i]);
        case DST_DTYPE_INT32: return reinterpret_cast<const int32_t *>(d)[i];
    }
    return 0;
}
Buf make(dst_dtype dt, const Vec &v) {
    Buf b;
    b.dt = dt;
    b.n = v.size();
    b.bytes.resize(v.size() * (dt == DST_DTYPE_INT32 ? 4 : elem_size(dt)));
    for (size_t i = 0; i < v.size(); ++i) put(b, i, v[i]);
    return b;
}
// An output buffer poisoned with NaN, so unwritten elements fail.
Buf poisoned(dst_dtype dt, size_t n) { return make(dt, Vec(n, std::nan(""))); }
Vec vals(const Buf &b) {
    Vec v(b.n);
    for (size_t i = 0; i < b.n; ++i) v[i] = get(b, i);
    return v;
}
Vec round_to(dst_dtype dt, const Vec &v) { return vals(make(dt, v)); }

Vec rand_vec(size_t n, uint64_t seed, double lo = -1.0, double hi = 1.0) {
    std::mt19937_64 g(seed);
    std::uniform_real_distribution<double> u(lo, hi);
    Vec v(n);
    for (auto &x : v) x = u(g);
    return v;
}
double dot(const Vec &a, const Vec &b) {
    double s = 0;
    for (size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
    return s;
}

// ‖out − ref‖ / ‖ref‖ over the entries where ref is finite; a non-finite out there, or a mismatch
// of infinities, gives +inf.
double rel_l2(const Vec &out, const Vec &ref) {
    double num = 0, den = 0;
    for (size_t i = 0; i < ref.size(); ++i) {
        if (!std::isfinite(ref[i])) {
            if (out[i] != ref[i]) return kInf;
            continue;
        }
        if (!std::isfinite(out[i])) return kInf;
        num += (out[i] - ref[i]) * (out[i] - ref[i]);
        den += ref[i] * ref[i];
    }
    return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

// Central finite differences of f at every element of x (h = 1e-5: in fp64 the truncation error is
// ~h² and the rounding error ~1e-16·|f|/h ≈ 1e-11 for these small losses).
Vec fd_grad(const std::function<double(const Vec &)> &f, Vec x, double h = 1e-5) {
    Vec g(x.size());
    for (size_t i = 0; i < x.size(); ++i) {
        const double x0 = x[i];
        x[i] = x0 + h;
        const double fp = f(x);
        x[i] = x0 - h;
        const double fm = f(x);
        x[i] = x0;
        g[i] = (fp - fm) / (2 * h);
    }
    return g;
}

// FD tolerance: 1e-6 relative to max(1, max|grad|); FD error is ~1e-10, so this only fails on a
// wrong derivative, not on noise.
void expect_grad(const Vec &an, const Vec &fd, const std::string &what) {
    ASSERT_EQ(an.size(), fd.size()) << what;
    double scale = 1, err = 0;
    for (double v : fd) scale = std::max(scale, std::fabs(v));
    size_t worst = 0;
    for (size_t i = 0; i < an.size(); ++i) {
        const double e = std::isfinite(an[i]) ? std::fabs(an[i] - fd[i]) : kInf;
        if (e > err) err = e, worst = i;
    }
    EXPECT_LE(err / scale, 1e-6) << what << ": worst element " << worst << " analytic " << an[worst]
                                 << " fd " << fd[worst];
}


DropoutSite site_for(double p, uint64_t seed = 1234, uint64_t offset = 77) {
    DropoutSite s;
    s.seed = seed;
    s.offset = offset;
    s.threshold = dst::dropout_threshold(p);
    s.scale = p > 0 ? 1.0 / (1.0 - p) : 1.0;
    return s;
}

class CpuOps : public ::testing::Test {
protected:
    void SetUp() override { ASSERT_EQ(dst::make_cpu_backend(&be_), DST_OK); }
    void TearDown() override { delete be_; }
    Backend *be_ = nullptr;
};
#define OK(expr) ASSERT_EQ((expr), DST_OK) << dst::last_error()

// ---- op runners: inputs as doubles (rounded to dt on the way in), outputs as raw buffers ---------

struct LinearIn {
    int64_t n = 5, k = 7, m = 6;
    Vec x, w, b, dy;
    bool gelu = false;
    dst_gelu form = DST_GELU_ERF;
};
LinearIn linear_in(bool gelu, dst_gelu form) {
    LinearIn in;
    in.x = rand_vec(35, 1), in.w = rand_vec(42, 2), in.b = rand_vec(6, 3), in.dy = rand_vec(30, 4);
    in.gelu = gelu, in.form = form;
    return in;
}
// outputs: y, pre_act (gelu only, else empty), dx, dw, db
std::vector<Buf> run_linear(Backend &be, dst_dtype dt, const LinearIn &in) {
    Buf x = make(dt, in.x), w = make(dt, in.w), b = make(dt, in.b), dy = make(dt, in.dy);
    Buf y = poisoned(dt, in.n * in.m), pre = poisoned(dt, in.gelu ? in.n * in.m : 0);
    Buf dx = poisoned(dt, in.n * in.k), dw = poisoned(dt, in.m * in.k), db = poisoned(dt, in.m);
    std::vector<Buf> out;
    if (be.linear_fwd(dt, x.p(), w.p(), b.p(), y.p(), in.n, in.k, in.m, in.gelu ? &in.form : nullptr,
                      pre.p()) != DST_OK)
        return out;
    Buf du = dy;
    if (in.gelu && be.gelu_bwd(dt, in.form, dy.p(), pre.p(), du.p(), in.n * in.m) != DST_OK) return out;
    if (be.linear_bwd_data(dt, du.p(), w.p(), dx.p(), in.n, in.k, in.m, nullptr) != DST_OK) return out;
    if (be.linear_bwd_weight(dt, du.p(), x.p(), dw.p(), db.p(), in.n, in.k, in.m, false) != DST_OK) return out;
    return {y, pre, dx, dw, db};
}

struct LnIn {
    int64_t n = 5, h = 7;
    Vec x, gamma, beta, dy, dresid;
    bool invertible = false, with_dresid = false;
    double eps = 1e-5;
};
LnIn ln_in(bool invertible, bool with_dresid) {
    LnIn in;
    in.x = rand_vec(35, 11, -2, 2), in.gamma = rand_vec(7, 12, 0.5, 1.5), in.beta = rand_vec(7, 13);
    in.dy = rand_vec(35, 14), in.dresid = rand_vec(35, 15);
    in.invertible = invertible, in.with_dresid = with_dresid;
    return in;
}
// outputs: y, mean, rstd, dx, dgamma, dbeta
std::vector<Buf> run_ln(Backend &be, dst_dtype dt, const LnIn &in) {
    const size_t nh = static_cast<size_t>(in.n * in.h);
    Buf x = make(dt, in.x), g = make(dt, in.gamma), b = make(dt, in.beta), dy = make(dt, in.dy);
    Buf dr = make(dt, in.dresid), y = poisoned(dt, nh), mean = poisoned(stat_dtype(dt), in.n),
        rstd = poisoned(stat_dtype(dt), in.n), dx = poisoned(dt, nh), dg = poisoned(dt, in.h),
        dbt = poisoned(dt, in.h);
    if (be.layernorm_fwd(dt, x.p(), g.p(), b.p(), y.p(), mean.p(), rstd.p(), in.n, in.h, in.eps) != DST_OK)
        return {};
    if (be.layernorm_bwd(dt, dy.p(), in.invertible ? y.p() : x.p(), in.invertible, g.p(), b.p(),
                         in.invertible ? nullptr : mean.p(), rstd.p(), in.with_dresid ? dr.p() : nullptr,
                         dx.p(), dg.p(), dbt.p(), in.n, in.h, false) != DST_OK)
        return {};
    return {y, mean, rstd, dx, dg, dbt};
}

struct AttnIn {
    AttentionParams p;
    Vec qkv, dctx, mask;  // mask: additive values [B,S] or lengths [B]
    dst_dtype mask_dt = DST_DTYPE_FP32;
};
// kind: 0 none, 1 additive (with some −inf keys), 2 key lengths, 3 additive with batch 1 fully masked.
AttnIn attn_in(int64_t S, int kind, bool causal, double p_drop, dst_dtype mask_dt = DST_DTYPE_FP32) {
    AttnIn in;
    AttentionParams &p = in.p;
    p.batch = 2, p.seq = S, p.heads = 3, p.head_dim = 5, p.hidden = 15;
    p.scale = 1.0 / std::sqrt(5.0);
    p.causal = causal;
    p.dropout = site_for(p_drop, 99, 5);
    in.qkv = rand_vec(2 * S * 45, 21, -1.5, 1.5);
    in.dctx = rand_vec(2 * S * 15, 22);
    in.mask_dt = mask_dt;
    if (kind == 1 || kind == 3) {
        p.mask_kind = DST_MASK_ADDITIVE;
        in.mask = rand_vec(2 * S, 23, -3, 0);
        if (S > 1) in.mask[S - 1] = -kInf;  // batch 0: last key hidden
        if (kind == 3)
            for (int64_t j = 0; j < S; ++j) in.mask[S + j] = -kInf;
    } else if (kind == 2) {
        p.mask_kind = DST_MASK_KEY_LENGTHS;
        in.mask = {static_cast<double>(S), static_cast<double>(std::max<int64_t>(1, S - 3))};
    }
    return in;
}
// outputs: ctx, lse, dqkv (P recomputed from lse)
std::vector<Buf> run_attn(Backend &be, dst_dtype dt, const AttnIn &in) {
    AttentionParams p = in.p;
    const int64_t B = p.batch, S = p.seq, nh = p.heads;
    Buf qkv = make(dt, in.qkv), dctx = make(dt, in.dctx);
    Buf mask = make(p.mask_kind == DST_MASK_KEY_LENGTHS ? DST_DTYPE_INT32 : in.mask_dt, in.mask);
    p.mask = mask.p();
    p.mask_dtype = in.mask_dt;
    Buf ctx = poisoned(dt, B * S * p.hidden), lse = poisoned(stat_dtype(dt), B * nh * S),
        dq = poisoned(dt, B * S * 3 * p.hidden);
    if (be.attention_fwd(dt, p, qkv.p(), ctx.p(), lse.p()) != DST_OK) return {};
    if (be.attention_bwd(dt, p, qkv.p(), ctx.p(), dctx.p(), lse.p(), dq.p()) != DST_OK) return {};
    return {ctx, lse, dq};
}
// ctx only, without the optional outputs (for finite differences).
Vec attn_ctx(Backend &be, const AttnIn &in, const Vec &qkv_v) {
    AttentionParams p = in.p;
    Buf qkv = make(DST_DTYPE_FP64, qkv_v);
    Buf mask = make(p.mask_kind == DST_MASK_KEY_LENGTHS ? DST_DTYPE_INT32 : in.mask_dt, in.mask);
    p.mask = mask.p();
    p.mask_dtype = in.mask_dt;
    Buf ctx = poisoned(DST_DTYPE_FP64, p.batch * p.seq * p.hidden);
    EXPECT_EQ(be.attention_fwd(DST_DTYPE_FP64, p, qkv.p(), ctx.p(), nullptr), DST_OK);
    return vals(ctx);
}

struct EwIn {
    int64_t count = 37;
    Vec a, r, dy;
};
EwIn ew_in() { return {37, rand_vec(37, 31, -4, 4), rand_vec(37, 32), rand_vec(37, 33)}; }
// outputs: gelu_erf, dgelu_erf, gelu_tanh, dgelu_tanh, dropout_residual, dropout_bwd, add
std::vector<Buf> run_ew(Backend &be, dst_dtype dt, const EwIn &in, const DropoutSite &site) {
    Buf a = make(dt, in.a), r = make(dt, in.r), dy = make(dt, in.dy);
    std::vector<Buf> out(7, poisoned(dt, in.count));
    bool ok = be.gelu_fwd(dt, DST_GELU_ERF, a.p(), out[0].p(), in.count) == DST_OK &&
              be.gelu_bwd(dt, DST_GELU_ERF, dy.p(), a.p(), out[1].p(), in.count) == DST_OK &&
              be.gelu_fwd(dt, DST_GELU_TANH, a.p(), out[2].p(), in.count) == DST_OK &&
              be.gelu_bwd(dt, DST_GELU_TANH, dy.p(), a.p(), out[3].p(), in.count) == DST_OK &&
              be.dropout_residual_fwd(dt, a.p(), r.p(), out[4].p(), in.count, site) == DST_OK &&
              be.dropout_bwd(dt, dy.p(), out[5].p(), in.count, site) == DST_OK &&
              be.add(dt, a.p(), r.p(), out[6].p(), in.count) == DST_OK;
    return ok ? out : std::vector<Buf>{};
}

// ---- finite differences in fp64 --------------------------------------------------------------------

TEST_F(CpuOps, LinearGradientsMatchFiniteDifferences) {
    for (int mode = 0; mode < 3; ++mode) {
        SCOPED_TRACE(mode == 0 ? "no gelu" : mode == 1 ? "gelu erf" : "gelu tanh");
        const LinearIn in = linear_in(mode > 0, mode == 2 ? DST_GELU_TANH : DST_GELU_ERF);
        const auto out = run_linear(*be_, DST_DTYPE_FP64, in);
        ASSERT_EQ(out.size(), 5u) << dst::last_error();
        auto loss = [&](const Vec &x, const Vec &w, const Vec &b) {
            LinearIn t = in;
            t.x = x, t.w = w, t.b = b;
            return dot(vals(run_linear(*be_, DST_DTYPE_FP64, t)[0]), in.dy);
        };
        expect_grad(vals(out[2]), fd_grad([&](const Vec &v) { return loss(v, in.w, in.b); }, in.x), "dx");
        expect_grad(vals(out[3]), fd_grad([&](const Vec &v) { return loss(in.x, v, in.b); }, in.w), "dW");
        expect_grad(vals(out[4]), fd_grad([&](const Vec &v) { return loss(in.x, in.w, v); }, in.b), "db");
    }
}

TEST_F(CpuOps, LayerNormGradientsMatchFiniteDifferences) {
    for (int invertible = 0; invertible < 2; ++invertible) {
        for (int dres = 0; dres < 2; ++dres) {
            SCOPED_TRACE("invertible " + std::to_string(invertible) + " dresid " + std::to_string(dres));
            const LnIn in = ln_in(invertible, dres);
            const auto out = run_ln(*be_, DST_DTYPE_FP64, in);
            ASSERT_EQ(out.size(), 6u) << dst::last_error();
            auto loss = [&](const Vec &x, const Vec &g, const Vec &b) {
                LnIn t = in;
                t.x = x, t.gamma = g, t.beta = b;
                return dot(vals(run_ln(*be_, DST_DTYPE_FP64, t)[0]), in.dy);
            };
            Vec dx = vals(out[3]);
            if (dres)
                for (size_t i = 0; i < dx.size(); ++i) dx[i] -= in.dresid[i];  // dx = ∂L/∂x + dresid
            expect_grad(dx, fd_grad([&](const Vec &v) { return loss(v, in.gamma, in.beta); }, in.x), "dx");
            expect_grad(vals(out[4]), fd_grad([&](const Vec &v) { return loss(in.x, v, in.beta); }, in.gamma),
                        "dgamma");
            expect_grad(vals(out[5]), fd_grad([&](const Vec &v) { return loss(in.x, in.gamma, v); }, in.beta),
                        "dbeta");
        }
    }
}

TEST_F(CpuOps, ElementwiseGradientsMatchFiniteDifferences) {
    const EwIn in = ew_in();
    for (double p : {0.0, 0.3}) {
        SCOPED_TRACE("p " + std::to_string(p));
        const DropoutSite site = site_for(p);
        const auto out = run_ew(*be_, DST_DTYPE_FP64, in, site);
        ASSERT_EQ(out.size(), 7u) << dst::last_error();
        auto f = [&](size_t which) {
            return [&, which](const Vec &a) {
                EwIn t = in;
                t.a = a;
                return dot(vals(run_ew(*be_, DST_DTYPE_FP64, t, site)[which]), in.dy);
            };
        };
        expect_grad(vals(out[1]), fd_grad(f(0), in.a), "gelu erf");
        expect_grad(vals(out[3]), fd_grad(f(2), in.a), "gelu tanh");
        // d/da Σ dy·(r + dropout(a)) = dropout_bwd(dy); the residual passes dy through.
        expect_grad(vals(out[5]), fd_grad(f(4), in.a), "dropout");
        expect_grad(in.dy, fd_grad([&](const Vec &r) {
                        EwIn t = in;
                        t.r = r;
                        return dot(vals(run_ew(*be_, DST_DTYPE_FP64, t, site)[4]), in.dy);
                    }, in.r), "residual");
    }
}

struct AttnCase {
    int64_t S;
    int kind;
    bool causal;
    double p;
    dst_dtype mask_dt;
};
std::vector<AttnCase> attn_cases() {
    std::vector<AttnCase> v;
    for (int64_t S : {1, 5, 13})
        for (int kind = 0; kind < 4; ++kind)
            for (int causal = 0; causal < 2; ++causal)
                for (double p : {0.0, 0.25}) v.push_back({S, kind, causal != 0, p, DST_DTYPE_FP32});
    v.push_back({5, 1, false, 0.25, DST_DTYPE_FP64});  // mask in the layer dtype
    return v;
}
std::string attn_name(const AttnCase &c) {
    static const char *kinds[] = {"none", "additive", "key_lengths", "fully_masked_row"};
    return "S=" + std::to_string(c.S) + " mask=" + kinds[c.kind] + (c.causal ? " causal" : "") +
           " p=" + std::to_string(c.p) + " mask_dtype=" + dst_dtype_string(c.mask_dt);
}

TEST_F(CpuOps, AttentionGradientsMatchFiniteDifferences) {
    be_->set_num_threads(1);  // thousands of tiny calls: thread start-up would dominate
    for (const AttnCase &c : attn_cases()) {
        SCOPED_TRACE(attn_name(c));
        const AttnIn in = attn_in(c.S, c.kind, c.causal, c.p, c.mask_dt);
        const auto out = run_attn(*be_, DST_DTYPE_FP64, in);
        ASSERT_EQ(out.size(), 3u) << dst::last_error();
        const Vec fd = fd_grad([&](const Vec &q) { return dot(attn_ctx(*be_, in, q), in.dctx); }, in.qkv);
        expect_grad(vals(out[2]), fd, "dqkv recomputed from lse");
        // Fully masked rows (kind 3: the second batch sees no key) have lse = −inf, the others are finite.
        const Vec lse = vals(out[1]);
        for (size_t row = 0; row < lse.size(); ++row) {
            EXPECT_FALSE(std::isnan(lse[row])) << "row " << row;
            if (c.kind == 3) {
                EXPECT_EQ(std::isinf(lse[row]), row >= lse.size() / 2) << "row " << row;
            } else {
                EXPECT_FALSE(std::isinf(lse[row])) << "row " << row;
            }
        }
    }
}

// ---- fp32 / fp16 / bf16 against fp64 on the same rounded inputs ------------------------------------

void expect_close(const std::vector<Buf> &got, const std::vector<Buf> &ref, dst_dtype dt, double tol,
                  const char *const *names) {
    ASSERT_EQ(got.size(), ref.size()) << dst::last_error();
    for (size_t i = 0; i < got.size(); ++i) {
        const double e = rel_l2(vals(got[i]), vals(ref[i]));
        EXPECT_LE(e, tol) << dst_dtype_string(dt) << " " << names[i];
    }
}

TEST_F(CpuOps, LowPrecisionMatchesFp64) {
    static const char *lin_names[] = {"y", "pre_act", "dx", "dW", "db"};
    static const char *ln_names[] = {"y", "mean", "rstd", "dx", "dgamma", "dbeta"};
    static const char *ew_names[] = {"gelu erf", "dgelu erf", "gelu tanh", "dgelu tanh",
                                     "dropout_residual", "dropout_bwd", "add"};
    static const char *attn_names[] = {"ctx", "lse", "dqkv"};
    for (dst_dtype dt : {DST_DTYPE_FP32, DST_DTYPE_FP16, DST_DTYPE_BF16}) {
        const double tol = dsttest::design_tolerance(dt);
        for (int mode = 0; mode < 3; ++mode) {
            LinearIn in = linear_in(mode > 0, mode == 2 ? DST_GELU_TANH : DST_GELU_ERF);
            in.x = round_to(dt, in.x), in.w = round_to(dt, in.w), in.b = round_to(dt, in.b);
            in.dy = round_to(dt, in.dy);
            expect_close(run_linear(*be_, dt, in), run_linear(*be_, DST_DTYPE_FP64, in), dt, tol, lin_names);
        }
        for (int inv = 0; inv < 2; ++inv) {
            LnIn in = ln_in(inv, true);
            for (Vec *v : {&in.x, &in.gamma, &in.beta, &in.dy, &in.dresid}) *v = round_to(dt, *v);
            expect_close(run_ln(*be_, dt, in), run_ln(*be_, DST_DTYPE_FP64, in), dt, tol, ln_names);
        }
        {
            EwIn in = ew_in();
            for (Vec *v : {&in.a, &in.r, &in.dy}) *v = round_to(dt, *v);
            for (double p : {0.0, 0.3})
                expect_close(run_ew(*be_, dt, in, site_for(p)), run_ew(*be_, DST_DTYPE_FP64, in, site_for(p)),
                             dt, tol, ew_names);
        }
        for (const AttnCase &c : attn_cases()) {
            if (c.S == 1 && c.kind != 0) continue;
            SCOPED_TRACE(attn_name(c));
            AttnIn in = attn_in(c.S, c.kind, c.causal, c.p);
            in.qkv = round_to(dt, in.qkv), in.dctx = round_to(dt, in.dctx), in.mask = round_to(DST_DTYPE_FP32, in.mask);
            if (dt == DST_DTYPE_BF16 && c.kind == 1) in.mask_dt = DST_DTYPE_BF16;  // mask in the layer dtype
            if (in.mask_dt == DST_DTYPE_BF16) in.mask = round_to(DST_DTYPE_BF16, in.mask);
            expect_close(run_attn(*be_, dt, in), run_attn(*be_, DST_DTYPE_FP64, in), dt, tol, attn_names);
        }
    }
}

// ---- accumulate -------------------------------------------------------------------------------------

TEST_F(CpuOps, AccumulateAddsIntoGradients) {
    for (dst_dtype dt : {DST_DTYPE_FP64, DST_DTYPE_FP32, DST_DTYPE_FP16, DST_DTYPE_BF16}) {
        SCOPED_TRACE(dst_dtype_string(dt));
        // Two roundings (fresh value, then the sum) instead of one: 2× the dtype tolerance.
        const double tol = dt == DST_DTYPE_FP64 ? 1e-14 : 2 * dsttest::design_tolerance(dt);
        const LinearIn li = linear_in(false, DST_GELU_ERF);
        const auto fresh = run_linear(*be_, dt, li);
        ASSERT_EQ(fresh.size(), 5u);
        const Vec old_dx = rand_vec(35, 41), old_dw = rand_vec(42, 42), old_db = rand_vec(6, 43);
        Buf x = make(dt, li.x), w = make(dt, li.w), dy = make(dt, li.dy);
        Buf dx = make(dt, old_dx), dw = make(dt, old_dw), db = make(dt, old_db);
        OK(be_->linear_bwd_data(dt, dy.p(), w.p(), dx.p(), 5, 7, 6, dx.p()));
        OK(be_->linear_bwd_weight(dt, dy.p(), x.p(), dw.p(), db.p(), 5, 7, 6, true));
        auto sum = [&](const Vec &a, const Buf &b) {
            Vec s = vals(b);
            for (size_t i = 0; i < s.size(); ++i) s[i] += round_to(dt, a)[i];
            return s;
        };
        EXPECT_LE(rel_l2(vals(dx), sum(old_dx, fresh[2])), tol) << "dx";
        // The added term from another buffer gives what accumulating onto a copy of it gives, and
        // leaves that buffer as it was.
        Buf add = make(dt, old_dx), dx2 = make(dt, rand_vec(35, 46));
        OK(be_->linear_bwd_data(dt, dy.p(), w.p(), dx2.p(), 5, 7, 6, add.p()));
        EXPECT_EQ(vals(dx2), vals(dx)) << "dx = dy·W + add";
        EXPECT_EQ(vals(add), vals(make(dt, old_dx))) << "add unchanged";
        EXPECT_LE(rel_l2(vals(dw), sum(old_dw, fresh[3])), tol) << "dW";
        EXPECT_LE(rel_l2(vals(db), sum(old_db, fresh[4])), tol) << "db";

        const LnIn ln = ln_in(false, false);
        const auto lfresh = run_ln(*be_, dt, ln);
        ASSERT_EQ(lfresh.size(), 6u);
        Buf lx = make(dt, ln.x), g = make(dt, ln.gamma), bt = make(dt, ln.beta), ldy = make(dt, ln.dy);
        const Vec old_dg = rand_vec(7, 44), old_dbt = rand_vec(7, 45);
        Buf dg = make(dt, old_dg), dbt = make(dt, old_dbt);
        OK(be_->layernorm_bwd(dt, ldy.p(), lx.p(), false, g.p(), bt.p(), lfresh[1].p(), lfresh[2].p(),
                              nullptr, nullptr, dg.p(), dbt.p(), 5, 7, true));
        EXPECT_LE(rel_l2(vals(dg), sum(old_dg, lfresh[4])), tol) << "dgamma";
        EXPECT_LE(rel_l2(vals(dbt), sum(old_dbt, lfresh[5])), tol) << "dbeta";
    }
}

// linear_fwd_add: y = x·Wᵀ + b + add summed in the compute type and rounded once. In FP16/BF16 that is
// the FP32 call's result on the same (rounded) operands, rounded to the dtype — the same sgemm, then
// one rounding — which differs from linear_fwd followed by the addition (two roundings) somewhere on
// these inputs. Against FP64 within the dtype's tolerance; `add` left as it was; without a bias too.
TEST_F(CpuOps, LinearFwdAddRoundsOnce) {
    const int64_t n = 64, k = 48, m = 40;
    const Vec x0 = rand_vec(n * k, 71), w0 = rand_vec(m * k, 72, -0.3, 0.3), b0 = rand_vec(m, 73),
              a0 = rand_vec(n * m, 74, -4.0, 4.0);
    for (dst_dtype dt : {DST_DTYPE_FP64, DST_DTYPE_FP32, DST_DTYPE_FP16, DST_DTYPE_BF16})
        for (bool bias : {true, false}) {
            SCOPED_TRACE(std::string(dst_dtype_string(dt)) + (bias ? " bias" : " no bias"));
            const Vec x = round_to(dt, x0), w = round_to(dt, w0), b = round_to(dt, b0), a = round_to(dt, a0);
            Buf bx = make(dt, x), bw = make(dt, w), bb = make(dt, b), ba = make(dt, a), y = poisoned(dt, n * m);
            OK(be_->linear_fwd_add(dt, bx.p(), bw.p(), bias ? bb.p() : nullptr, ba.p(), y.p(), n, k, m));
            EXPECT_EQ(vals(ba), a) << "add unchanged";
            Buf rx = make(DST_DTYPE_FP64, x), rw = make(DST_DTYPE_FP64, w), rb = make(DST_DTYPE_FP64, b),
                ra = make(DST_DTYPE_FP64, a), ry = poisoned(DST_DTYPE_FP64, n * m);
            OK(be_->linear_fwd_add(DST_DTYPE_FP64, rx.p(), rw.p(), bias ? rb.p() : nullptr, ra.p(), ry.p(), n, k, m));
            const double tol = dt == DST_DTYPE_FP64 ? 1e-14 : dsttest::design_tolerance(dt);
            EXPECT_LE(rel_l2(vals(y), vals(ry)), tol) << "against FP64";
            if (dt != DST_DTYPE_FP16 && dt != DST_DTYPE_BF16) continue;
            Buf fx = make(DST_DTYPE_FP32, x), fw = make(DST_DTYPE_FP32, w), fb = make(DST_DTYPE_FP32, b),
                fa = make(DST_DTYPE_FP32, a), fy = poisoned(DST_DTYPE_FP32, n * m);
            OK(be_->linear_fwd_add(DST_DTYPE_FP32, fx.p(), fw.p(), bias ? fb.p() : nullptr, fa.p(), fy.p(), n, k, m));
            EXPECT_EQ(vals(y), round_to(dt, vals(fy))) << "one rounding of the FP32 sum";
            // The two-pass form (linear_fwd, then the addition) rounds twice: some element differs.
            Buf t = poisoned(dt, n * m), y2 = poisoned(dt, n * m);
            OK(be_->linear_fwd(dt, bx.p(), bw.p(), bias ? bb.p() : nullptr, t.p(), n, k, m, nullptr, nullptr));
            OK(be_->dropout_residual_fwd(dt, t.p(), ba.p(), y2.p(), n * m, dst::DropoutSite{}));
            EXPECT_NE(vals(y), vals(y2)) << "the inputs do not tell one rounding from two";
        }
}

// ---- dropout ------------------------------------------------------------------------------------------

TEST_F(CpuOps, DropoutKeepsOneMinusP) {
    const int64_t count = 1000000;
    const Buf ones = make(DST_DTYPE_FP32, Vec(count, 1.0));
    for (double p : {0.1, 0.5, 0.9}) {
        const DropoutSite site = site_for(p, 7, 3);
        Buf out = poisoned(DST_DTYPE_FP32, count);
        OK(be_->dropout_bwd(DST_DTYPE_FP32, ones.p(), out.p(), count, site));
        int64_t kept = 0;
        const float scale = static_cast<float>(site.scale);
        for (int64_t i = 0; i < count; ++i) {
            const double v = get(out, i);
            if (v != 0) {
                ++kept;
                ASSERT_EQ(v, scale) << i;
            }
        }
        // ±1% absolute on the kept fraction (the binomial standard deviation is ≤ 5e-4).
        EXPECT_NEAR(static_cast<double>(kept) / count, 1.0 - p, 0.01) << "p " << p;
    }
}

TEST_F(CpuOps, DropoutMaskIsPhiloxElementByElement) {
    const int64_t count = 1001;  // not a multiple of 4
    const DropoutSite site = site_for(0.4, 0x123456789ABCDEFull, (1ull << 33) + 5);
    const Vec a = rand_vec(count, 51, 0.5, 1.5);
    const Buf ab = make(DST_DTYPE_FP64, a);
    Buf y = poisoned(DST_DTYPE_FP64, count);
    OK(be_->dropout_residual_fwd(DST_DTYPE_FP64, ab.p(), nullptr, y.p(), count, site));
    for (int64_t e = 0; e < count; ++e) {
        const bool keep = dst::philox_dropout_keep(site.seed, site.offset, e, site.threshold);
        EXPECT_EQ(get(y, e), keep ? a[e] * site.scale : 0.0) << e;
    }
    // Inactive site: identity.
    OK(be_->dropout_residual_fwd(DST_DTYPE_FP64, ab.p(), nullptr, y.p(), count, DropoutSite{}));
    EXPECT_EQ(vals(y), a);
}

// ---- determinism ------------------------------------------------------------------------------------

std::vector<Buf> run_everything(Backend &be, dst_dtype dt) {
    std::vector<Buf> all;
    auto append = [&](std::vector<Buf> v) { all.insert(all.end(), v.begin(), v.end()); };
    append(run_linear(be, dt, linear_in(true, DST_GELU_ERF)));
    append(run_ln(be, dt, ln_in(false, true)));
    append(run_ln(be, dt, ln_in(true, false)));
    append(run_ew(be, dt, ew_in(), site_for(0.2)));
    append(run_attn(be, dt, attn_in(13, 1, true, 0.2)));
    append(run_attn(be, dt, attn_in(5, 2, false, 0.0)));
    // A larger GEMM so OpenBLAS and the column-sum blocks split work.
    LinearIn big;
    big.n = 67, big.k = 130, big.m = 129;
    big.x = rand_vec(67 * 130, 61), big.w = rand_vec(129 * 130, 62), big.b = rand_vec(129, 63);
    big.dy = rand_vec(67 * 129, 64);
    append(run_linear(be, dt, big));
    return all;
}

TEST_F(CpuOps, BitIdenticalAcrossRunsAndThreadCounts) {
    for (dst_dtype dt : {DST_DTYPE_FP64, DST_DTYPE_FP32, DST_DTYPE_FP16, DST_DTYPE_BF16}) {
        SCOPED_TRACE(dst_dtype_string(dt));
        be_->set_num_threads(0);
        const auto a = run_everything(*be_, dt);
        const auto b = run_everything(*be_, dt);
        be_->set_num_threads(1);
        const auto c = run_everything(*be_, dt);
        be_->set_num_threads(3);
        const auto d = run_everything(*be_, dt);
        ASSERT_EQ(a.size(), 35u) << dst::last_error();
        for (size_t i = 0; i < a.size(); ++i) {
            EXPECT_EQ(a[i].bytes, b[i].bytes) << "output " << i << " differs between two runs";
            EXPECT_EQ(a[i].bytes, c[i].bytes) << "output " << i << " differs with 1 thread";
            EXPECT_EQ(a[i].bytes, d[i].bytes) << "output " << i << " differs with 3 threads";
        }
    }
}

// ---- memory ops, misc -----------------------------------------------------------------------------

TEST_F(CpuOps, MemoryOps) {
    EXPECT_EQ(be_->kind(), DST_BACKEND_CPU);
    void *p = reinterpret_cast<void *>(1);
    OK(be_->alloc(0, &p));
    EXPECT_EQ(p, nullptr);
    void *a = nullptr, *b = nullptr;
    OK(be_->alloc(1000, &a));
    OK(be_->alloc(1000, &b));
    EXPECT_EQ(reinterpret_cast<uintptr_t>(a) % 256, 0u);
    std::memset(a, 0x5A, 1000);
    OK(be_->copy(b, a, 1000, dst::CopyKind::DeviceToDevice));
    EXPECT_EQ(static_cast<unsigned char *>(b)[999], 0x5A);
    OK(be_->zero(b, 500));
    EXPECT_EQ(static_cast<unsigned char *>(b)[499], 0);
    EXPECT_EQ(static_cast<unsigned char *>(b)[500], 0x5A);
    OK(be_->synchronize());
    be_->free(a);
    be_->free(b);
    be_->free(nullptr);
#if !defined(__SANITIZE_ADDRESS__)
    void *huge = nullptr;
    EXPECT_EQ(be_->alloc(size_t(1) << 62, &huge), DST_ERR_OUT_OF_MEMORY);
    EXPECT_EQ(huge, nullptr);
    EXPECT_NE(std::string(dst::last_error()).find("allocate"), std::string::npos);
#endif
    be_->set_num_threads(2);
    EXPECT_EQ(be_->num_threads(), 2);
    be_->set_num_threads(0);
    EXPECT_GE(be_->num_threads(), 1);
}

TEST_F(CpuOps, AllNonzeroAndBadDtype) {
    for (dst_dtype dt : {DST_DTYPE_FP64, DST_DTYPE_FP32, DST_DTYPE_FP16, DST_DTYPE_BF16}) {
        Buf g = make(dt, {1, -2, 0.5, 3});
        bool nz = false;
        OK(be_->all_nonzero(dt, g.p(), 4, &nz));
        EXPECT_TRUE(nz);
        put(g, 2, 0.0);
        OK(be_->all_nonzero(dt, g.p(), 4, &nz));
        EXPECT_FALSE(nz);
    }
    Buf x = make(DST_DTYPE_FP32, {1, 2});
    EXPECT_EQ(be_->add(DST_DTYPE_INT32, x.p(), x.p(), x.p(), 2), DST_ERR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(dst::last_error()).find("add"), std::string::npos);
}

}  // namespace
