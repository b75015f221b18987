// The model ops of BERT pre-training on the CPU reference backend, through the public C API:
// the formulas, every gradient by central finite differences in FP64, the 16/32-bit paths against
// FP64 on the same rounded inputs (tests/common/bounds.h bounds), write/accumulate, and bad arguments
// (status, a message naming the argument or element, outputs untouched).
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "../../kernels/philox.h"  // the dropout rule the op must follow (docs/rng.md)
#include "../common/bounds.h"
#include "../common/model_ops_cases.h"
#include "test_util.h"

using namespace dsttest;

namespace {

std::vector<HostTensor> run_ok(dst_context *ctx, const ModelOpCase &c) {
    std::vector<HostTensor> r;
    std::string err;
    const dst_status st = run_case(ctx, c, false, &r, &err);
    EXPECT_EQ(st, DST_OK) << c.name << ": " << err;
    return r;
}

// The case with every float tensor converted to FP64 (values kept exactly), for the FP64 reference.
ModelOpCase as_fp64(const ModelOpCase &c) {
    ModelOpCase d;
    d.name = c.name;
    d.dt = DST_DTYPE_FP64;
    d.call = c.call;
    for (const OpSlot &s : c.slots) {
        OpSlot t{s.name, HostTensor(), s.out, s.keep, s.present};
        if (s.t.dtype() == DST_DTYPE_INT32) t.t = clone(s.t);
        else t.t = HostTensor::from_doubles(DST_DTYPE_FP64, s.t.shape(), s.t.doubles());
        d.slots.push_back(std::move(t));
    }
    return d;
}

// Σ r ⊙ out for a fixed random r: the scalar whose gradient a backward computes from dout = r.
double weighted_sum(const HostTensor &t, const HostTensor &r) {
    double s = 0;
    for (int64_t i = 0; i < t.numel(); ++i) s += t.get(i) * r.get(i);
    return s;
}

// Central differences of f with respect to element i of `slot` of the case (h = 1e-6 in FP64).
double central_difference(const ModelOpCase &base, int slot, int64_t i, const std::function<double(ModelOpCase &)> &f) {
    const double h = 1e-6;
    ModelOpCase p = as_fp64(base), m = as_fp64(base);
    p.slots[slot].t.set(i, p.slots[slot].t.get(i) + h);
    m.slots[slot].t.set(i, m.slots[slot].t.get(i) - h);
    return (f(p) - f(m)) / (2 * h);
}

// ---- embeddings ---------------------------------------------------------------------------------

TEST(ModelOps, EmbeddingForwardFormula) {
    Ctx ctx = make_ctx();
    const ModelOpCase c = embedding_fwd_case(DST_DTYPE_FP64, 3, 7, 5, 11, 9, 2, true, 1);
    const std::vector<HostTensor> r = run_ok(ctx.get(), c);
    const HostTensor &ids = r[0], &types = r[1], &word = r[2], &pos = r[3], &type = r[4], &o = r[5];
    for (int64_t t = 0; t < 21; ++t)
        for (int64_t j = 0; j < 5; ++j) {
            const double want = word.get(int64_t(ids.get(t)) * 5 + j) + pos.get((t % 7) * 5 + j) +
                                type.get(int64_t(types.get(t)) * 5 + j);
            EXPECT_EQ(o.get(t * 5 + j), want) << "token " << t << " column " << j;
        }
    // Without types every token takes type row 0.
    const ModelOpCase n = embedding_fwd_case(DST_DTYPE_FP64, 2, 3, 4, 6, 3, 2, false, 2);
    const std::vector<HostTensor> q = run_ok(ctx.get(), n);
    for (int64_t t = 0; t < 6; ++t)
        for (int64_t j = 0; j < 4; ++j)
            EXPECT_EQ(q[5].get(t * 4 + j),
                      q[2].get(int64_t(q[0].get(t)) * 4 + j) + q[3].get((t % 3) * 4 + j) + q[4].get(j));
}

TEST(ModelOps, EmbeddingBackwardFiniteDifferencesAndModes) {
    Ctx ctx = make_ctx();
    const int64_t B = 3, S = 5, H = 4, V = 7, P = 8, T = 3;
    const ModelOpCase bwd = embedding_bwd_case(DST_DTYPE_FP64, B, S, H, V, P, T, true, false, 3);
    const std::vector<HostTensor> g = run_ok(ctx.get(), bwd);
    // The forward on the same ids/types with random tables; L = Σ dout ⊙ out.
    ModelOpCase fwd = embedding_fwd_case(DST_DTYPE_FP64, B, S, H, V, P, T, true, 4);
    fwd.slots[0].t = clone(bwd.slots[1].t);
    fwd.slots[1].t = clone(bwd.slots[2].t);
    const HostTensor &dout = bwd.slots[0].t;
    auto loss = [&](ModelOpCase &c) { return weighted_sum(run_ok(ctx.get(), c)[5], dout); };
    for (int tab = 0; tab < 3; ++tab) {
        const HostTensor &grad = g[3 + tab];
        for (int64_t i = 0; i < grad.numel(); i += 3)
            EXPECT_NEAR(grad.get(i), central_difference(fwd, 2 + tab, i, loss), 1e-7)
                << "table " << tab << " element " << i;
    }
    // Rows no token uses are written as 0 (positions ≥ S here); accumulate adds to the used rows only.
    for (int64_t s = S; s < P; ++s)
        for (int64_t j = 0; j < H; ++j) EXPECT_EQ(g[4].get(s * H + j), 0.0);
    const ModelOpCase acc = embedding_bwd_case(DST_DTYPE_FP64, B, S, H, V, P, T, true, true, 3);
    const std::vector<HostTensor> a = run_ok(ctx.get(), acc);
    for (int tab = 0; tab < 3; ++tab) {
        const HostTensor &old = acc.slots[3 + tab].t;
        for (int64_t i = 0; i < old.numel(); ++i)
            EXPECT_NEAR(a[3 + tab].get(i), old.get(i) + g[3 + tab].get(i), 1e-12) << "table " << tab << " " << i;
    }
}

// ---- dense ----------------------------------------------------------------------------------------

TEST(ModelOps, DenseFiniteDifferencesEveryActivation) {
    Ctx ctx = make_ctx();
    for (dst_activation act : {DST_ACTIVATION_NONE, DST_ACTIVATION_GELU_ERF, DST_ACTIVATION_GELU_TANH,
                               DST_ACTIVATION_TANH}) {
        SCOPED_TRACE("activation " + std::to_string(act));
        const int64_t N = 5, K = 7, M = 3;
        const ModelOpCase fwd = dense_fwd_case(DST_DTYPE_FP64, N, K, M, act, true, 10 + act);
        const std::vector<HostTensor> f = run_ok(ctx.get(), fwd);
        Rng rr(99);
        const HostTensor dy = rand_float(rr, DST_DTYPE_FP64, {N, M});
        ModelOpCase bwd = dense_bwd_case(DST_DTYPE_FP64, N, K, M, act, false, 20);
        bwd.slots[0].t = clone(dy);
        bwd.slots[1].t = clone(fwd.slots[0].t);
        bwd.slots[2].t = clone(fwd.slots[1].t);
        if (act != DST_ACTIVATION_NONE) bwd.slots[3].t = clone(f[4]);
        const std::vector<HostTensor> g = run_ok(ctx.get(), bwd);
        // pre_act is u = x·Wᵀ + b for every activation.
        for (int64_t r = 0; r < N; ++r)
            for (int64_t c = 0; c < M; ++c) {
                double u = fwd.slots[2].t.get(c);
                for (int64_t k = 0; k < K; ++k) u += fwd.slots[0].t.get(r * K + k) * fwd.slots[1].t.get(c * K + k);
                EXPECT_NEAR(f[4].get(r * M + c), u, 1e-12);
            }
        auto loss = [&](ModelOpCase &c) { return weighted_sum(run_ok(ctx.get(), c)[3], dy); };
        const int grad_of[3] = {0, 1, 2};  // x, w, b of the forward
        const int grad_slot[3] = {4, 5, 6};
        for (int q = 0; q < 3; ++q)
            for (int64_t i = 0; i < fwd.slots[grad_of[q]].t.numel(); i += 2)
                EXPECT_NEAR(g[grad_slot[q]].get(i), central_difference(fwd, grad_of[q], i, loss), 1e-7)
                    << bwd.slots[grad_slot[q]].name << "[" << i << "]";
    }
}

// ---- rows -----------------------------------------------------------------------------------------

TEST(ModelOps, GatherAndScatterRows) {
    Ctx ctx = make_ctx();
    const ModelOpCase gc = gather_case(DST_DTYPE_FP32, 9, 13, 5, 5);  // M > N: rows repeat
    const std::vector<HostTensor> g = run_ok(ctx.get(), gc);
    for (int64_t i = 0; i < 13; ++i)
        for (int64_t j = 0; j < 5; ++j) EXPECT_EQ(g[2].get(i * 5 + j), g[0].get(int64_t(g[1].get(i)) * 5 + j));
    for (bool acc : {false, true}) {
        const ModelOpCase sc = scatter_case(DST_DTYPE_FP32, 11, 4, 3, acc, 6);
        const std::vector<HostTensor> s = run_ok(ctx.get(), sc);
        std::vector<double> want = acc ? sc.slots[2].t.doubles() : std::vector<double>(33, 0.0);
        for (int64_t i = 0; i < 4; ++i)
            for (int64_t j = 0; j < 3; ++j) want[int64_t(s[1].get(i)) * 3 + j] += s[0].get(i * 3 + j);
        for (int64_t i = 0; i < 33; ++i) EXPECT_EQ(s[2].get(i), static_cast<float>(want[i])) << "acc " << acc << " " << i;
    }
}

// ---- linear + cross-entropy -------------------------------------------------------------------------

TEST(ModelOps, CrossEntropyFormulaAndFiniteDifferences) {
    Ctx ctx = make_ctx();
    const int64_t N = 9, M = 6, H = 5, V = 7;
    const double scale = 3.0;
    const ModelOpCase c = cross_entropy_case(DST_DTYPE_FP64, N, M, H, V, true, true, true, false, scale, 7);
    const std::vector<HostTensor> r = run_ok(ctx.get(), c);
    const HostTensor &x = r[0], &rows = r[1], &w = r[2], &b = r[3], &labels = r[4];
    double total = 0;
    int valid = 0, hits = 0;
    for (int64_t i = 0; i < M; ++i) {
        const int y = static_cast<int>(labels.get(i));
        if (y < 0) continue;
        std::vector<double> z(V);
        for (int64_t v = 0; v < V; ++v) {
            z[v] = b.get(v);
            for (int64_t j = 0; j < H; ++j) z[v] += x.get(int64_t(rows.get(i)) * H + j) * w.get(v * H + j);
        }
        double mx = z[0], se = 0;
        int arg = 0;
        for (int64_t v = 1; v < V; ++v)
            if (z[v] > mx) { mx = z[v]; arg = static_cast<int>(v); }
        for (double zv : z) se += std::exp(zv - mx);
        total += mx + std::log(se) - z[y];
        ++valid;
        hits += arg == y;
    }
    ASSERT_GT(valid, 0);
    EXPECT_NEAR(r[5].get(0), total / valid, 1e-12);
    EXPECT_EQ(r[6].get(0), valid);
    EXPECT_EQ(r[6].get(1), hits);
    // Gradients of grad_scale · loss; rows that are not selected get dx = 0.
    auto loss = [&](ModelOpCase &k) { return scale * run_ok(ctx.get(), k)[5].get(0); };
    for (int64_t i = 0; i < N * H; ++i) EXPECT_NEAR(r[7].get(i), central_difference(c, 0, i, loss), 1e-7) << "dx " << i;
    for (int64_t i = 0; i < V * H; i += 2) EXPECT_NEAR(r[8].get(i), central_difference(c, 2, i, loss), 1e-7) << "dw " << i;
    for (int64_t i = 0; i < V; ++i) EXPECT_NEAR(r[9].get(i), central_difference(c, 3, i, loss), 1e-7) << "db " << i;
    // Accumulate adds dw/db to what they held; without rows x holds the M rows itself.
    const ModelOpCase a = cross_entropy_case(DST_DTYPE_FP64, N, M, H, V, true, true, true, true, scale, 7);
    const std::vector<HostTensor> ra = run_ok(ctx.get(), a);
    for (int64_t i = 0; i < V * H; ++i) EXPECT_NEAR(ra[8].get(i), a.slots[8].t.get(i) + r[8].get(i), 1e-12);
    for (int64_t i = 0; i < V; ++i) EXPECT_NEAR(ra[9].get(i), a.slots[9].t.get(i) + r[9].get(i), 1e-12);
    const ModelOpCase d = cross_entropy_case(DST_DTYPE_FP64, N, M, H, V, false, false, true, false, 1.0, 8);
    const std::vector<HostTensor> rd = run_ok(ctx.get(), d);
    auto loss1 = [&](ModelOpCase &k) { return run_ok(ctx.get(), k)[5].get(0); };
    for (int64_t i = 0; i < M * H; i += 3) EXPECT_NEAR(rd[7].get(i), central_difference(d, 0, i, loss1), 1e-7);
}

TEST(ModelOps, CrossEntropyWithoutValidLabels) {
    Ctx ctx = make_ctx();
    ModelOpCase c = cross_entropy_case(DST_DTYPE_FP32, 4, 3, 5, 6, true, true, true, false, 1.0, 9);
    for (int64_t i = 0; i < 3; ++i) c.slots[4].t.set(i, -1);
    const std::vector<HostTensor> r = run_ok(ctx.get(), c);
    EXPECT_EQ(r[5].get(0), 0.0);
    EXPECT_EQ(r[6].get(0), 0.0);
    EXPECT_EQ(r[6].get(1), 0.0);
    for (int s = 7; s <= 9; ++s)
        for (int64_t i = 0; i < r[s].numel(); ++i) EXPECT_EQ(r[s].get(i), 0.0) << c.slots[s].name << " " << i;
}

// The ops composed into a small BERT MLM head with the decoder tied to the word embedding:
// embeddings → gather the masked rows → dense + GELU → linear + cross-entropy with W = word table.
// The word table's gradient has two parts (the decoder's, written first, then the embedding's,
// accumulated); their sum must be the finite-difference gradient of the loss.
struct TinyBert {
    int64_t B = 2, S = 5, H = 6, V = 11, T = 2;
    HostTensor ids, types, rows, labels, word, pos, type, wt, bt, bdec;
    explicit TinyBert(uint64_t seed) {
        Rng r(seed);
        ids = rand_ints(r, {B, S}, 0, V);
        types = rand_ints(r, {B, S}, 0, T);
        rows = HostTensor::from_doubles(DST_DTYPE_INT32, {3}, {1, 4, 7});
        labels = HostTensor::from_doubles(DST_DTYPE_INT32, {3}, {3, -1, 9});
        word = rand_float(r, DST_DTYPE_FP64, {V, H});
        pos = rand_float(r, DST_DTYPE_FP64, {S, H});
        type = rand_float(r, DST_DTYPE_FP64, {T, H});
        wt = rand_float(r, DST_DTYPE_FP64, {H, H}, 0.5);
        bt = rand_float(r, DST_DTYPE_FP64, {H}, 0.1);
        bdec = rand_float(r, DST_DTYPE_FP64, {V}, 0.1);
    }
    // Loss, and with grads the word table's gradient.
    double run(dst_context *ctx, HostTensor *dword) {
        HostTensor x(DST_DTYPE_FP64, {B, S, H}), hm(DST_DTYPE_FP64, {3, H}), t(DST_DTYPE_FP64, {3, H}),
            u(DST_DTYPE_FP64, {3, H}), loss(DST_DTYPE_FP64, {1});
        dst_tensor vids = ids.view(), vty = types.view(), vw = word.view(), vp = pos.view(), vt = type.view(),
                   vx = x.view(), vrows = rows.view(), vhm = hm.view(), vwt = wt.view(), vbt = bt.view(),
                   vtt = t.view(), vu = u.view(), vlab = labels.view(), vbd = bdec.view(), vloss = loss.view();
        EXPECT_EQ(dst_embedding_forward(ctx, &vids, &vty, &vw, &vp, &vt, &vx), DST_OK) << dst_last_error();
        dst_tensor x2 = vx;
        x2.ndim = 2;
        x2.shape[0] = B * S;
        x2.shape[1] = H;
        EXPECT_EQ(dst_gather_rows(ctx, &x2, &vrows, &vhm), DST_OK) << dst_last_error();
        EXPECT_EQ(dst_dense_forward(ctx, &vhm, &vwt, &vbt, DST_ACTIVATION_GELU_ERF, &vtt, &vu), DST_OK);
        if (!dword) {
            EXPECT_EQ(dst_linear_cross_entropy(ctx, &vtt, nullptr, &vw, &vbd, &vlab, 1.0f, &vloss, nullptr, nullptr,
                                               nullptr, nullptr, DST_GRAD_WRITE),
                      DST_OK);
            return loss.get(0);
        }
        HostTensor dt(DST_DTYPE_FP64, {3, H}), dbd(DST_DTYPE_FP64, {V}), dhm(DST_DTYPE_FP64, {3, H}),
            dx(DST_DTYPE_FP64, {B * S, H});
        dst_tensor vdt = dt.view(), vdw = dword->view(), vdbd = dbd.view(), vdhm = dhm.view(), vdx = dx.view();
        EXPECT_EQ(dst_linear_cross_entropy(ctx, &vtt, nullptr, &vw, &vbd, &vlab, 1.0f, &vloss, nullptr, &vdt, &vdw,
                                           &vdbd, DST_GRAD_WRITE),
                  DST_OK)
            << dst_last_error();
        EXPECT_EQ(dst_dense_backward(ctx, &vdt, &vhm, &vwt, &vu, DST_ACTIVATION_GELU_ERF, &vdhm, nullptr, nullptr,
                                     DST_GRAD_WRITE),
                  DST_OK);
        EXPECT_EQ(dst_scatter_rows(ctx, &vdhm, &vrows, &vdx, DST_GRAD_WRITE), DST_OK) << dst_last_error();
        dst_tensor vdx3 = vdx;
        vdx3.ndim = 3;
        vdx3.shape[0] = B;
        vdx3.shape[1] = S;
        vdx3.shape[2] = H;
        EXPECT_EQ(dst_embedding_backward(ctx, &vdx3, &vids, &vty, &vdw, nullptr, nullptr, DST_GRAD_ACCUMULATE), DST_OK)
            << dst_last_error();
        return loss.get(0);
    }
};

TEST(ModelOps, TiedEmbeddingHeadFiniteDifferences) {
    Ctx ctx = make_ctx();
    TinyBert m(31);
    HostTensor dword(DST_DTYPE_FP64, {m.V, m.H});
    m.run(ctx.get(), &dword);
    double largest = 0;
    for (int64_t i = 0; i < m.V * m.H; ++i) {
        const double w0 = m.word.get(i), h = 1e-6;
        m.word.set(i, w0 + h);
        const double lp = m.run(ctx.get(), nullptr);
        m.word.set(i, w0 - h);
        const double lm = m.run(ctx.get(), nullptr);
        m.word.set(i, w0);
        EXPECT_NEAR(dword.get(i), (lp - lm) / (2 * h), 1e-7) << "dword[" << i << "]";
        largest = std::max(largest, std::fabs(dword.get(i)));
    }
    EXPECT_GT(largest, 1e-3) << "the check must see a gradient";
}

// ---- 16/32-bit against FP64 --------------------------------------------------------------------------

TEST(ModelOps, ReducedPrecisionAgainstFp64) {
    Ctx ctx = make_ctx();
    for (dst_dtype dt : {DST_DTYPE_FP32, DST_DTYPE_FP16, DST_DTYPE_BF16}) {
        std::vector<ModelOpCase> cases;
        cases.push_back(embedding_fwd_case(dt, 3, 7, 24, 50, 9, 2, true, 1));
        cases.push_back(embedding_bwd_case(dt, 5, 7, 24, 30, 9, 2, true, false, 2));
        cases.push_back(embedding_bwd_case(dt, 5, 7, 24, 30, 9, 2, true, true, 3));
        for (dst_activation act : {DST_ACTIVATION_NONE, DST_ACTIVATION_GELU_ERF, DST_ACTIVATION_TANH}) {
            cases.push_back(dense_fwd_case(dt, 33, 40, 17, act, true, 4));
            cases.push_back(dense_bwd_case(dt, 33, 40, 17, act, act == DST_ACTIVATION_TANH, 5));
        }
        cases.push_back(scatter_case(dt, 40, 13, 24, true, 6));
        cases.push_back(cross_entropy_case(dt, 60, 37, 32, 101, true, true, true, true, 1.0, 7));
        cases.push_back(cross_entropy_case(dt, 37, 37, 32, 2, false, true, true, false, 1.0, 8));
        for (const ModelOpCase &c : cases) {
            SCOPED_TRACE(std::string(dst_dtype_string(dt)) + " " + c.name);
            const std::vector<HostTensor> lo = run_ok(ctx.get(), c), hi = run_ok(ctx.get(), as_fp64(c));
            for (size_t s = 0; s < c.slots.size(); ++s) {
                if (!c.slots[s].out || !c.slots[s].present) continue;
                const double e = rel_l2(lo[s].doubles(), hi[s].doubles());
                EXPECT_LE(e, design_tolerance(dt)) << c.slots[s].name;
            }
        }
    }
}

// ---- bad input --------------------------------------------------------------------------------------

// The call fails with `want`, the message contains `needle`, and no output changed.
void expect_refused(dst_context *ctx, const ModelOpCase &c, dst_status want, const std::string &needle) {
    std::vector<HostTensor> host;
    for (const OpSlot &s : c.slots) host.push_back(clone(s.t));
    std::vector<dst_tensor> views;
    for (const HostTensor &t : host) views.push_back(t.view());
    std::vector<dst_tensor *> ptrs;
    for (size_t i = 0; i < views.size(); ++i) ptrs.push_back(c.slots[i].present ? &views[i] : nullptr);
    const CallResult r = call_fresh([&] { return c.call(ctx, ptrs); });
    EXPECT_EQ(r.status, want) << c.name << ": " << r.message;
    EXPECT_NE(r.message.find(needle), std::string::npos) << "message: " << r.message;
    for (size_t i = 0; i < host.size(); ++i)
        EXPECT_TRUE(host[i].same_bytes(c.slots[i].t.bytes())) << c.slots[i].name << " changed";
}

TEST(ModelOps, BadInputIsRefusedWithoutWriting) {
    // A CPU context checks index values before the call in both modes (dst_context_set_index_checks).
    const dst_status bad = DST_ERR_INVALID_ARGUMENT;
    for (dst_index_checks mode : {DST_INDEX_CHECKS_EAGER, DST_INDEX_CHECKS_DEFERRED}) {
        SCOPED_TRACE(mode == DST_INDEX_CHECKS_EAGER ? "eager index checks" : "deferred index checks");
        Ctx ctx = make_ctx();
        ASSERT_EQ(dst_context_set_index_checks(ctx.get(), mode), DST_OK);
        {  // ids out of range (both ends), types out of range, short position table, wrong dtype
            ModelOpCase c = embedding_fwd_case(DST_DTYPE_FP32, 2, 3, 4, 5, 3, 2, true, 1);
            c.slots[0].t.set(4, 5);
            expect_refused(ctx.get(), c, bad, "ids[4] is 5");
            c.slots[0].t.set(4, -1);
            expect_refused(ctx.get(), c, bad, "ids[4] is -1");
            c.slots[0].t.set(4, 0);
            c.slots[1].t.set(2, 2);
            expect_refused(ctx.get(), c, bad, "types[2] is 2");
            ModelOpCase p = embedding_fwd_case(DST_DTYPE_FP32, 2, 4, 4, 5, 3, 2, true, 1);
            expect_refused(ctx.get(), p, bad, "position has 3 rows");
            ModelOpCase d = embedding_fwd_case(DST_DTYPE_FP32, 2, 3, 4, 5, 3, 2, true, 1);
            d.slots[3].t = HostTensor(DST_DTYPE_FP16, {3, 4});
            expect_refused(ctx.get(), d, bad, "position");
            d = embedding_fwd_case(DST_DTYPE_FP32, 2, 3, 4, 5, 3, 2, true, 1);
            d.slots[0].t = HostTensor(DST_DTYPE_FP32, {2, 3});
            expect_refused(ctx.get(), d, bad, "ids->dtype");
            d = embedding_fwd_case(DST_DTYPE_FP32, 2, 3, 4, 5, 3, 2, true, 1);
            d.slots[0].present = false;
            expect_refused(ctx.get(), d, bad, "ids is NULL");
        }
        {  // backward: bad mode, id out of range
            ModelOpCase c = embedding_bwd_case(DST_DTYPE_FP32, 2, 3, 4, 5, 3, 2, true, false, 1);
            c.slots[1].t.set(0, 7);
            expect_refused(ctx.get(), c, bad, "ids[0] is 7");
            ModelOpCase m = embedding_bwd_case(DST_DTYPE_FP32, 2, 3, 4, 5, 3, 2, true, false, 1);
            m.call = [](dst_context *x, std::vector<dst_tensor *> &v) {
                return dst_embedding_backward(x, v[0], v[1], v[2], v[3], v[4], v[5], static_cast<dst_grad_mode>(7));
            };
            expect_refused(ctx.get(), m, bad, "mode is 7");
        }
        {  // dense: missing pre_act, wrong weight shape, bad activation
            ModelOpCase c = dense_bwd_case(DST_DTYPE_FP32, 3, 4, 5, DST_ACTIVATION_GELU_ERF, false, 1);
            c.slots[3].present = false;
            expect_refused(ctx.get(), c, bad, "pre_act is NULL");
            ModelOpCase w = dense_fwd_case(DST_DTYPE_FP32, 3, 4, 5, DST_ACTIVATION_NONE, true, 1);
            w.slots[1].t = HostTensor(DST_DTYPE_FP32, {5, 3});
            expect_refused(ctx.get(), w, bad, "w is [5, 3]");
            ModelOpCase a = dense_fwd_case(DST_DTYPE_FP32, 3, 4, 5, static_cast<dst_activation>(9), true, 1);
            expect_refused(ctx.get(), a, bad, "activation is 9");
        }
        {  // rows: out of range, repeated
            ModelOpCase g = gather_case(DST_DTYPE_FP32, 4, 3, 2, 1);
            g.slots[1].t.set(1, 4);
            expect_refused(ctx.get(), g, bad, "index[1] is 4");
            ModelOpCase s = scatter_case(DST_DTYPE_FP32, 6, 3, 2, false, 1);
            s.slots[1].t.set(2, s.slots[1].t.get(0));
            expect_refused(ctx.get(), s, bad, "index[0]");
            expect_refused(ctx.get(), s, bad, "more than once");
        }
        {  // cross-entropy: label out of range (−2, V), repeated row, rows out of range, non-finite scale,
           // loss of the wrong dtype, db without b
            ModelOpCase c = cross_entropy_case(DST_DTYPE_FP32, 8, 4, 3, 5, true, true, true, false, 1.0, 1);
            c.slots[4].t.set(3, 5);
            expect_refused(ctx.get(), c, bad, "labels[3] is 5");
            c.slots[4].t.set(3, -2);
            expect_refused(ctx.get(), c, bad, "labels[3] is -2");
            c.slots[4].t.set(3, 0);
            c.slots[1].t.set(3, c.slots[1].t.get(1));
            expect_refused(ctx.get(), c, bad, "more than once");
            c.slots[1].t.set(3, 8);
            expect_refused(ctx.get(), c, bad, "rows[3] is 8");
            ModelOpCase s = cross_entropy_case(DST_DTYPE_FP32, 8, 4, 3, 5, true, true, true, false, INFINITY, 1);
            expect_refused(ctx.get(), s, bad, "grad_scale");
            ModelOpCase l = cross_entropy_case(DST_DTYPE_FP32, 8, 4, 3, 5, true, true, true, false, 1.0, 1);
            l.slots[5].t = HostTensor(DST_DTYPE_FP64, {1});
            expect_refused(ctx.get(), l, bad, "loss must be [1] of dtype fp32");
            ModelOpCase b = cross_entropy_case(DST_DTYPE_FP32, 8, 4, 3, 5, true, true, true, false, 1.0, 1);
            b.slots[3].present = false;
            expect_refused(ctx.get(), b, bad, "db is given but b is NULL");
        }
    }
    EXPECT_EQ(dst_embedding_forward(nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr), bad);
    EXPECT_EQ(dst_linear_cross_entropy(nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, 1.0f, nullptr, nullptr,
                                       nullptr, nullptr, nullptr, DST_GRAD_WRITE),
              bad);
    size_t bytes = 0;
    EXPECT_EQ(dst_model_op_workspace_bytes(static_cast<dst_model_op>(42), DST_DTYPE_FP32, 1, 1, 1, 1, &bytes), bad);
    EXPECT_EQ(dst_model_op_workspace_bytes(DST_MODEL_OP_DENSE, DST_DTYPE_INT32, 1, 1, 1, 1, &bytes), bad);
    EXPECT_EQ(dst_model_op_workspace_bytes(DST_MODEL_OP_DENSE, DST_DTYPE_FP32, -1, 1, 1, 1, &bytes), bad);
}

// ---- dropout ----------------------------------------------------------------------------------------

// The rule of docs/rng.md, element by element: element e is kept iff the Philox word of (seed, offset, e)
// is ≥ ⌈p·2³²⌉, and kept elements are x·scale with scale = 1/(1 − p) rounded to the compute type, the
// product rounded once to the storage type; the call takes one RNG offset and reports it; backward
// regenerates the same mask; in place equals out of place.
TEST(ModelOps, DropoutFollowsThePhiloxRule) {
    Ctx ctx = make_ctx();
    for (dst_dtype dt : {DST_DTYPE_FP64, DST_DTYPE_FP32, DST_DTYPE_FP16, DST_DTYPE_BF16}) {
        SCOPED_TRACE(dst_dtype_string(dt));
        const float p = 0.25f;
        ModelOpCase c = dropout_fwd_case(dt, {3, 7, 33}, p, 11);
        ASSERT_EQ(dst_context_set_rng_state(ctx.get(), 99, 5), DST_OK);
        const HostTensor &x = c.slots[0].t;
        HostTensor y(dt, x.shape());
        y.poison();
        dst_tensor xv = x.view(), yv = y.view();
        uint64_t seed = 0, offset = 0, s2 = 0, o2 = 0;
        ASSERT_EQ(dst_dropout_forward(ctx.get(), &xv, p, &yv, &seed, &offset), DST_OK) << dst_last_error();
        EXPECT_EQ(seed, 99u);
        EXPECT_EQ(offset, 5u);
        ASSERT_EQ(dst_context_get_rng_state(ctx.get(), &s2, &o2), DST_OK);
        EXPECT_EQ(o2, 6u) << "one offset per call";
        const uint32_t threshold = dst::dropout_threshold(p);
        const double scale64 = 1.0 / (1.0 - static_cast<double>(p));
        const double scale = dt == DST_DTYPE_FP64 ? scale64 : static_cast<double>(static_cast<float>(scale64));
        HostTensor want(dt, x.shape());
        int64_t dropped = 0;
        for (int64_t e = 0; e < x.numel(); ++e) {
            const bool keep = dst::philox_dropout_keep(99, 5, static_cast<uint64_t>(e), threshold);
            const double v = dt == DST_DTYPE_FP64 ? x.get(e) * scale
                                                  : static_cast<double>(static_cast<float>(x.get(e)) * static_cast<float>(scale));
            want.set(e, keep ? v : 0.0);
            dropped += keep ? 0 : 1;
        }
        EXPECT_TRUE(y.same_bytes(want.bytes())) << "the mask or the scaling differs from the rule";
        EXPECT_GT(dropped, 0);
        // Backward with the reported (seed, offset): the same mask on dy.
        Rng gen(3);
        HostTensor dy = rand_float(gen, dt, x.shape());
        HostTensor dx(dt, x.shape());
        dx.poison();
        dst_tensor dyv = dy.view(), dxv = dx.view();
        ASSERT_EQ(dst_dropout_backward(ctx.get(), &dyv, p, seed, offset, &dxv), DST_OK) << dst_last_error();
        for (int64_t e = 0; e < x.numel(); ++e)
            EXPECT_EQ(dx.get(e) == 0.0 && dy.get(e) != 0.0, y.get(e) == 0.0 && x.get(e) != 0.0) << "element " << e;
        ASSERT_EQ(dst_context_get_rng_state(ctx.get(), &s2, &o2), DST_OK);
        EXPECT_EQ(o2, 6u) << "backward takes no offset";
        // In place, from the same state: the same bytes.
        ASSERT_EQ(dst_context_set_rng_state(ctx.get(), 99, 5), DST_OK);
        HostTensor z = clone(x);
        dst_tensor zv = z.view();
        ASSERT_EQ(dst_dropout_forward(ctx.get(), &zv, p, &zv, nullptr, nullptr), DST_OK) << dst_last_error();
        EXPECT_TRUE(z.same_bytes(y.bytes()));
    }
}

// Over 2^20 elements the dropped fraction is p within 0.3 %; the next call (next offset) draws another
// mask; p = 0 copies and still takes an offset.
TEST(ModelOps, DropoutFractionAndFreshMasks) {
    Ctx ctx = make_ctx();
    const int64_t n = int64_t(1) << 20;
    HostTensor x(DST_DTYPE_FP32, {n}), y1(DST_DTYPE_FP32, {n}), y2(DST_DTYPE_FP32, {n});
    for (int64_t i = 0; i < n; ++i) x.set(i, 1.0);
    dst_tensor xv = x.view(), v1 = y1.view(), v2 = y2.view();
    ASSERT_EQ(dst_dropout_forward(ctx.get(), &xv, 0.1f, &v1, nullptr, nullptr), DST_OK) << dst_last_error();
    ASSERT_EQ(dst_dropout_forward(ctx.get(), &xv, 0.1f, &v2, nullptr, nullptr), DST_OK) << dst_last_error();
    int64_t d1 = 0, same = 0;
    for (int64_t i = 0; i < n; ++i) {
        d1 += y1.get(i) == 0.0;
        same += (y1.get(i) == 0.0) == (y2.get(i) == 0.0);
    }
    EXPECT_NEAR(static_cast<double>(d1) / static_cast<double>(n), 0.1, 0.003);
    EXPECT_LT(same, n - n / 20) << "two calls drew (nearly) the same mask";
    uint64_t seed = 0, off = 0, before = 0;
    ASSERT_EQ(dst_context_get_rng_state(ctx.get(), &seed, &before), DST_OK);
    ASSERT_EQ(dst_dropout_forward(ctx.get(), &xv, 0.0f, &v1, nullptr, &off), DST_OK) << dst_last_error();
    EXPECT_EQ(off, before);
    EXPECT_TRUE(y1.same_bytes(x.bytes()));
    ASSERT_EQ(dst_context_get_rng_state(ctx.get(), &seed, &off), DST_OK);
    EXPECT_EQ(off, before + 1);
}

// Bad arguments: the status, a message naming the argument, y and the RNG state untouched.
TEST(ModelOps, DropoutBadInput) {
    Ctx ctx = make_ctx();
    ASSERT_EQ(dst_context_set_rng_state(ctx.get(), 5, 10), DST_OK);
    HostTensor x(DST_DTYPE_FP32, {4, 6}), y(DST_DTYPE_FP32, {4, 6}), small(DST_DTYPE_FP32, {4, 5}),
        ints(DST_DTYPE_INT32, {4, 6}), half(DST_DTYPE_FP16, {4, 6});
    for (int64_t i = 0; i < x.numel(); ++i) x.set(i, 1.5);
    y.poison();
    const std::vector<unsigned char> before = y.bytes();
    dst_tensor xv = x.view(), yv = y.view(), sv = small.view(), iv = ints.view(), hv = half.view();
    dst_tensor shifted = x.view();
    shifted.data = static_cast<float *>(x.data()) + 1;
    shifted.shape[0] = 3;
    dst_tensor xpart = x.view();
    xpart.shape[0] = 3;
    struct Bad { const char *what; dst_status st; std::function<dst_status()> call; };
    const Bad bad[] = {
        {"ctx is NULL", DST_ERR_INVALID_ARGUMENT, [&] { return dst_dropout_forward(nullptr, &xv, 0.1f, &yv, nullptr, nullptr); }},
        {"x is NULL", DST_ERR_INVALID_ARGUMENT, [&] { return dst_dropout_forward(ctx.get(), nullptr, 0.1f, &yv, nullptr, nullptr); }},
        {"y is NULL", DST_ERR_INVALID_ARGUMENT, [&] { return dst_dropout_forward(ctx.get(), &xv, 0.1f, nullptr, nullptr, nullptr); }},
        {"p is 1", DST_ERR_INVALID_ARGUMENT, [&] { return dst_dropout_forward(ctx.get(), &xv, 1.0f, &yv, nullptr, nullptr); }},
        {"p is -0.1", DST_ERR_INVALID_ARGUMENT, [&] { return dst_dropout_forward(ctx.get(), &xv, -0.1f, &yv, nullptr, nullptr); }},
        {"p is nan", DST_ERR_INVALID_ARGUMENT, [&] { return dst_dropout_forward(ctx.get(), &xv, NAN, &yv, nullptr, nullptr); }},
        {"y must have the dtype", DST_ERR_INVALID_ARGUMENT, [&] { return dst_dropout_forward(ctx.get(), &xv, 0.1f, &sv, nullptr, nullptr); }},
        {"y must have the dtype", DST_ERR_INVALID_ARGUMENT, [&] { return dst_dropout_forward(ctx.get(), &xv, 0.1f, &hv, nullptr, nullptr); }},
        {"x->dtype", DST_ERR_INVALID_ARGUMENT, [&] { return dst_dropout_forward(ctx.get(), &iv, 0.1f, &iv, nullptr, nullptr); }},
        {"partly overlaps", DST_ERR_INVALID_ARGUMENT, [&] { return dst_dropout_forward(ctx.get(), &xpart, 0.1f, &shifted, nullptr, nullptr); }},
        {"dy is NULL", DST_ERR_INVALID_ARGUMENT, [&] { return dst_dropout_backward(ctx.get(), nullptr, 0.1f, 1, 2, &yv); }},
        {"p is 2", DST_ERR_INVALID_ARGUMENT, [&] { return dst_dropout_backward(ctx.get(), &xv, 2.0f, 1, 2, &yv); }},
        {"dx must have the dtype", DST_ERR_INVALID_ARGUMENT, [&] { return dst_dropout_backward(ctx.get(), &xv, 0.1f, 1, 2, &sv); }},
    };
    for (const Bad &b : bad) {
        EXPECT_EQ(b.call(), b.st) << b.what;
        EXPECT_NE(std::string(dst_last_error()).find(b.what), std::string::npos) << b.what << " not in: " << dst_last_error();
        EXPECT_TRUE(y.same_bytes(before)) << b.what << ": y was written";
        uint64_t s = 0, o = 0;
        ASSERT_EQ(dst_context_get_rng_state(ctx.get(), &s, &o), DST_OK);
        EXPECT_EQ(o, 10u) << b.what << ": the RNG state moved";
    }
    // An exhausted stream: DST_ERR_STATE, nothing written, the state kept.
    ASSERT_EQ(dst_context_set_rng_state(ctx.get(), 5, UINT64_MAX), DST_OK);
    EXPECT_EQ(dst_dropout_forward(ctx.get(), &xv, 0.1f, &yv, nullptr, nullptr), DST_ERR_STATE);
    EXPECT_NE(std::string(dst_last_error()).find("exhausted"), std::string::npos) << dst_last_error();
    EXPECT_TRUE(y.same_bytes(before));
    uint64_t s = 0, o = 0;
    ASSERT_EQ(dst_context_get_rng_state(ctx.get(), &s, &o), DST_OK);
    EXPECT_EQ(o, UINT64_MAX);
}

// A caller-owned workspace of the queried size runs the call; one byte less than the dense backward's
// own buffer fails with DST_ERR_CAPACITY and writes nothing.
TEST(ModelOps, CallerWorkspaceOfTheQueriedSize) {
    Ctx ctx = make_ctx();
    const ModelOpCase c = dense_bwd_case(DST_DTYPE_FP32, 33, 20, 17, DST_ACTIVATION_GELU_ERF, false, 1);
    size_t need = 0;
    ASSERT_EQ(dst_model_op_workspace_bytes(DST_MODEL_OP_DENSE, DST_DTYPE_FP32, 33, 20, 17, 0, &need), DST_OK);
    EXPECT_GE(need, size_t(33 * 17 * 4));
    HostTensor ws(DST_DTYPE_FP32, {static_cast<int64_t>(need / 4 + 64)});
    ASSERT_EQ(dst_context_set_workspace(ctx.get(), ws.data(), need), DST_OK);
    run_ok(ctx.get(), c);
    ASSERT_EQ(dst_context_set_workspace(ctx.get(), ws.data(), 33 * 17 * 4 - 1), DST_OK);
    expect_refused(ctx.get(), c, DST_ERR_CAPACITY, "workspace");
    ASSERT_EQ(dst_context_set_workspace(ctx.get(), nullptr, 0), DST_OK);
    size_t ce = 0;
    ASSERT_EQ(dst_model_op_workspace_bytes(DST_MODEL_OP_LINEAR_CROSS_ENTROPY, DST_DTYPE_FP16, 4096, 640, 30528, 1024, &ce),
              DST_OK);
#if defined(DST_TEST_BUILD_HAS_CUDA) && DST_TEST_BUILD_HAS_CUDA
    EXPECT_GE(ce, size_t(640) * 30528 * 4) << "the [M, V] fp32 logits are counted";
#endif
}

}  // namespace
