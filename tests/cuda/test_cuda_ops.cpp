// CUDA backend op tests: one table of cases (op × dtype × shape); every case runs on the CUDA backend
// and on the CPU reference backend (the twin, in the same dtype) on the same random inputs, and
// compares every output by relative L2 error ‖gpu − cpu‖ / ‖cpu‖:
//   FP64 ≤ 1e-12, FP32 ≤ 1e-5, FP16 ≤ 1e-3, BF16 ≤ 1e-2 (one rounding of the storage type apart).
// Outputs are poisoned with NaN before each call, so an unwritten element fails; NaN never passes.
// Dropout cases also require the set of dropped elements to be identical (bit-identical Philox
// masks) and near p. Every case runs twice on the GPU and must give bit-identical outputs.
// Cases skip themselves (GTEST_SKIP) when no CUDA device is usable.
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <random>
#include <set>
#include <sstream>
#include <ostream>
#include <string>
#include <vector>

#include "../common/bounds.h"
#include "../cpu/test_util.h"
#include "backend/backend.h"
#include "backend/cuda/cuda_backend.h"
#include "capi/handles.h"
#include "core/error.h"
#include "core/half.h"
#include "kernels/attention_flash.cuh"
#include "kernels/bias.cuh"
#include "kernels/gemm_gelu.cuh"
#include "kernels/philox.h"

namespace {

using dst::AttentionParams;
using dst::Backend;
using dst::CopyKind;
using dst::DropoutSite;

// ---- host buffers in any dtype -----------------------------------------------------------------

// The compute (stats) dtype of a layer dtype.
dst_dtype stat_dtype(dst_dtype dt) { return dt == DST_DTYPE_FP64 ? DST_DTYPE_FP64 : DST_DTYPE_FP32; }

struct HostBuf {
    dst_dtype dt = DST_DTYPE_FP32;
    int64_t count = 0;
    std::vector<unsigned char> bytes;

    HostBuf() = default;
    HostBuf(dst_dtype d, int64_t n) : dt(d), count(n), bytes(static_cast<size_t>(n) * dst_dtype_size(d)) {}
    void *data() { return bytes.data(); }

    double get(int64_t i) const {
        const unsigned char *p = bytes.data() + static_cast<size_t>(i) * dst_dtype_size(dt);
        switch (dt) {
            case DST_DTYPE_FP64: { double v; std::memcpy(&v, p, 8); return v; }
            case DST_DTYPE_FP32: { float v; std::memcpy(&v, p, 4); return v; }
            case DST_DTYPE_FP16: { uint16_t v; std::memcpy(&v, p, 2); return dst::half_bits_to_float(v); }
            case DST_DTYPE_BF16: { uint16_t v; std::memcpy(&v, p, 2); return dst::bf16_bits_to_float(v); }
            default: { int32_t v; std::memcpy(&v, p, 4); return v; }
        }
    }
    void set(int64_t i, double x) {
        unsigned char *p = bytes.data() + static_cast<size_t>(i) * dst_dtype_size(dt);
        switch (dt) {
            case DST_DTYPE_FP64: std::memcpy(p, &x, 8); break;
            case DST_DTYPE_FP32: { const float v = static_cast<float>(x); std::memcpy(p, &v, 4); break; }
            case DST_DTYPE_FP16: { const uint16_t v = dst::float_to_half_bits(static_cast<float>(x)); std::memcpy(p, &v, 2); break; }
            case DST_DTYPE_BF16: { const uint16_t v = dst::float_to_bf16_bits(static_cast<float>(x)); std::memcpy(p, &v, 2); break; }
            default: { const int32_t v = static_cast<int32_t>(x); std::memcpy(p, &v, 4); break; }
        }
    }
};

// ---- the case table ------------------------------------------------------------------------------

enum class Role {
    In,     // random input (or filled by the case's fill/prepare)
    Out,    // poisoned with NaN, compared
    InOut,  // random initial content (accumulate), compared
    Host    // host-side output of the op (all_nonzero's bool, stored as int32), compared
};

struct Arg {
    Arg(std::string n, dst_dtype d, int64_t c, Role r, double l = -1.0, double h = 1.0)
        : name(std::move(n)), dt(d), count(c), role(r), lo(l), hi(h) {}
    std::string name;
    dst_dtype dt;
    int64_t count;
    Role role;
    double lo = -1.0, hi = 1.0;  // uniform range of random content
    int64_t offset = 0;          // elements between the allocation and the pointer (alignment tests)
    std::function<void(HostBuf &)> fill;  // replaces the random content
};

using Ptrs = std::vector<void *>;

struct OpCase {
    std::string name;
    dst_dtype dt = DST_DTYPE_FP32;
    std::vector<Arg> args;
    // Derives inputs from others on the CPU reference (e.g. LayerNorm stats, attention lse/ctx).
    std::function<dst_status(Backend &cpu, const Ptrs &host)> prepare;
    std::function<dst_status(Backend &be, const Ptrs &ptrs)> call;
    // Dropout cases: the dropped-element set of the output, computed from the buffers after the call.
    std::function<std::vector<bool>(const std::vector<HostBuf> &)> dropped;
    double drop_p = 0.0;
    double tol_scale = 1.0;  // > 1 only with a comment at the case saying why
};

// gtest prints a case by its name (the test name already says it; the default dumps raw bytes).
void PrintTo(const OpCase &c, std::ostream *os) { *os << c.name; }


DropoutSite make_site(double p, uint64_t seed, uint64_t offset) {
    DropoutSite s;
    s.seed = seed;
    s.offset = offset;
    s.threshold = dst::dropout_threshold(p);
    s.scale = p > 0 ? 1.0 / (1.0 - p) : 1.0;
    return s;
}

const dst_dtype kDtypes[] = {DST_DTYPE_FP64, DST_DTYPE_FP32, DST_DTYPE_FP16, DST_DTYPE_BF16};

std::string tag(const char *op, dst_dtype dt, const std::string &shape) {
    return std::string(op) + "_" + dst_dtype_string(dt) + "_" + shape;
}

// Runs `call` with the CUDA backend's fused GELU GEMMs on or off (CudaBackend::set_fused_gemm), then
// restores the backend's setting; on the CPU backend, `call` alone. On: when kernels/gemm_gelu.cuh's
// gemm_gelu_runs() accepts the call's shape and pointers (FP16/BF16 on a 9.0 device), the call must
// have run a fused kernel (a case that silently fell back to the separate ops would test nothing new).
// Off: it must have run none (the separate GEMM and GELU kernels are what the case tests).
dst_status with_fused_gemm(Backend &be, bool on, dst_dtype dt, dst::cuda::GemmGeluKind kind, int64_t n, int64_t k,
                           int64_t m, std::vector<const void *> ptrs, const std::function<dst_status()> &call) {
    auto *cb = dynamic_cast<dst::CudaBackend *>(&be);
    if (!cb) return call();
    const bool expect =
        on && dst::cuda::gemm_gelu_runs(dt, kind, n, k, m, ptrs.data(), static_cast<int>(ptrs.size()));
    const int64_t before = cb->fused_gemm_calls();
    const bool was = cb->fused_gemm();
    cb->set_fused_gemm(on);
    const dst_status st = call();
    cb->set_fused_gemm(was);
    if (st == DST_OK && cb->fused_gemm_calls() != before + (expect ? 1 : 0))
        return dst::set_error(DST_ERR_STATE, "the fused GELU GEMM %s (%lld calls before, %lld after)",
                              expect ? "did not run" : "ran with the fused GEMMs off",
                              static_cast<long long>(before), static_cast<long long>(cb->fused_gemm_calls()));
    return st;
}

// Runs `call` with the CUDA backend's LayerNorm backward form set to `split` (CudaBackend::
// set_layernorm_one_pass: 0 the separate passes, 2 or 4 the one-pass form at that many warps per row),
// then restores the backend's setting; the call must have taken the form asked for (a one-pass case
// that fell back to the separate passes would test nothing new, and the passes keep cases of their own
// now that the backend's default is the one-pass form). On the CPU backend, `call` alone.
dst_status with_ln_form(Backend &be, int split, const std::function<dst_status()> &call) {
    auto *cb = dynamic_cast<dst::CudaBackend *>(&be);
    if (!cb) return call();
    const int was = cb->layernorm_one_pass();
    const int64_t before = cb->layernorm_one_pass_calls();
    cb->set_layernorm_one_pass(split);
    const dst_status st = call();
    cb->set_layernorm_one_pass(was);
    const int64_t took = cb->layernorm_one_pass_calls() - before;
    if (st == DST_OK && took != (split ? 1 : 0))
        return dst::set_error(DST_ERR_STATE, "the LayerNorm backward asked for %s took %s",
                              split ? "the one-pass form" : "the separate passes",
                              took ? "the one-pass form" : "the separate passes");
    return st;
}

// Whether layernorm_bwd's one-pass form takes rows of h in dt (kernels/layernorm.cuh) at `split`.
bool ln_one_pass_applies(dst_dtype dt, int64_t h, int split) {
    if (dt == DST_DTYPE_FP64) return false;
    const int64_t per = 32 * (16 / int64_t(dst_dtype_size(dt))), vpl = h % per == 0 ? h / per : 0;
    return split == 2 ? vpl == 2 || vpl == 4 : vpl == 4;
}

// ---- GEMMs ----
void add_linear_cases(std::vector<OpCase> &out) {
    struct Shape { int64_t n, k, m; bool bias; int gelu; bool pre_act; int64_t off; };
    // gelu: -1 none, else dst_gelu. off: misaligned x and bias pointers (elements).
    const Shape shapes[] = {{7, 5, 3, true, -1, false, 0},          {100, 64, 129, false, -1, false, 0},
                            {129, 96, 257, true, DST_GELU_ERF, true, 0}, {513, 80, 240, true, DST_GELU_TANH, false, 0},
                            {33, 17, 11, true, -1, false, 1},        {1024, 1024, 4096, true, DST_GELU_ERF, true, 0},
                            {1024, 4096, 1024, true, -1, false, 0}};
    for (dst_dtype dt : kDtypes)
        for (const Shape &s : shapes) {
            std::ostringstream nm;
            nm << "n" << s.n << "_k" << s.k << "_m" << s.m << (s.bias ? "_bias" : "")
               << (s.gelu == DST_GELU_ERF ? "_erf" : s.gelu == DST_GELU_TANH ? "_tanh" : "")
               << (s.pre_act ? "_preact" : "") << (s.off ? "_misaligned" : "");
            OpCase c;
            c.name = tag("linear_fwd", dt, nm.str());
            c.dt = dt;
            Arg x{"x", dt, s.n * s.k, Role::In};
            x.offset = s.off;
            Arg b{"b", dt, s.m, Role::In};
            b.offset = s.off;
            c.args = {x, {"w", dt, s.m * s.k, Role::In, -0.2, 0.2}, b, {"y", dt, s.n * s.m, Role::Out},
                      {"pre_act", dt, s.n * s.m, Role::Out}};
            // The cuBLASLt GEMM with the GELU map after it (the fused kernels are the `_fused` cases).
            c.call = [s, dt](Backend &be, const Ptrs &p) {
                const dst_gelu form = static_cast<dst_gelu>(s.gelu < 0 ? 0 : s.gelu);
                return with_fused_gemm(be, false, dt, dst::cuda::kGeluForward, s.n, s.k, s.m, {}, [&] {
                    return be.linear_fwd(dt, p[0], p[1], s.bias ? p[2] : nullptr, p[3], s.n, s.k, s.m,
                                         s.gelu < 0 ? nullptr : &form, s.pre_act ? p[4] : nullptr);
                });
            };
            if (!s.pre_act) c.args[4].role = Role::In;  // untouched: not compared
            out.push_back(c);
            if (s.gelu >= 0) continue;
            // The linear layer with a residual term added (the Pre-LN FFN output without dropout): one
            // GEMM with add as its C operand where the bias is aligned, else the two-pass default.
            OpCase a;
            a.name = tag("linear_fwd_add", dt, nm.str());
            a.dt = dt;
            a.args = {x, {"w", dt, s.m * s.k, Role::In, -0.2, 0.2}, b, {"add", dt, s.n * s.m, Role::In},
                      {"y", dt, s.n * s.m, Role::Out}};
            a.call = [s, dt](Backend &be, const Ptrs &p) {
                return be.linear_fwd_add(dt, p[0], p[1], s.bias ? p[2] : nullptr, p[3], p[4], s.n, s.k, s.m);
            };
            out.push_back(a);
        }

    // db_off: db that many elements past an aligned pointer (the column sums write it element by element
    // in any case).
    struct BShape { int64_t n, k, m; bool accumulate; bool bias; int64_t db_off; };
    const BShape bshapes[] = {{7, 5, 3, false, true, 0},    {129, 96, 257, true, true, 0},
                              {513, 80, 240, true, false, 0}, {1, 33, 7, false, true, 0},
                              {1024, 1024, 4096, false, true, 0}, {33, 17, 11, false, true, 1}};
    for (dst_dtype dt : kDtypes)
        for (const BShape &s : bshapes) {
            std::ostringstream nm;
            nm << "n" << s.n << "_k" << s.k << "_m" << s.m << (s.accumulate ? "_acc" : "");
            if (s.db_off) {  // only the bias gradient has a misaligned pointer
                OpCase w;
                w.name = tag("linear_bwd_weight", dt, nm.str() + "_db_misaligned");
                w.dt = dt;
                Arg db{"db", dt, s.m, Role::Out};
                db.offset = s.db_off;
                w.args = {{"dy", dt, s.n * s.m, Role::In}, {"x", dt, s.n * s.k, Role::In},
                          {"dw", dt, s.m * s.k, Role::Out}, db};
                w.call = [s, dt](Backend &be, const Ptrs &p) {
                    return be.linear_bwd_weight(dt, p[0], p[1], p[2], p[3], s.n, s.k, s.m, s.accumulate);
                };
                out.push_back(w);
                continue;
            }
            OpCase d;
            d.name = tag("linear_bwd_data", dt, nm.str());
            d.dt = dt;
            d.args = {{"dy", dt, s.n * s.m, Role::In}, {"w", dt, s.m * s.k, Role::In, -0.2, 0.2},
                      {"dx", dt, s.n * s.k, s.accumulate ? Role::InOut : Role::Out}};
            d.call = [s, dt](Backend &be, const Ptrs &p) {
                return be.linear_bwd_data(dt, p[0], p[1], p[2], s.n, s.k, s.m, s.accumulate ? p[2] : nullptr);
            };
            out.push_back(d);
            if (s.accumulate) {  // the added term from another buffer (the layer's residual branches)
                OpCase da;
                da.name = tag("linear_bwd_data", dt, nm.str() + "_add");
                da.dt = dt;
                da.args = {{"dy", dt, s.n * s.m, Role::In}, {"w", dt, s.m * s.k, Role::In, -0.2, 0.2},
                           {"dx", dt, s.n * s.k, Role::Out}, {"add", dt, s.n * s.k, Role::In}};
                da.call = [s, dt](Backend &be, const Ptrs &p) {
                    return be.linear_bwd_data(dt, p[0], p[1], p[2], s.n, s.k, s.m, p[3]);
                };
                out.push_back(da);
            }

            OpCase w;
            w.name = tag("linear_bwd_weight", dt, nm.str() + (s.bias ? "_db" : ""));
            w.dt = dt;
            const Role r = s.accumulate ? Role::InOut : Role::Out;
            w.args = {{"dy", dt, s.n * s.m, Role::In}, {"x", dt, s.n * s.k, Role::In},
                      {"dw", dt, s.m * s.k, r}, {"db", dt, s.m, s.bias ? r : Role::In}};
            w.call = [s, dt](Backend &be, const Ptrs &p) {
                return be.linear_bwd_weight(dt, p[0], p[1], p[2], s.bias ? p[3] : nullptr, s.n, s.k, s.m,
                                            s.accumulate);
            };
            out.push_back(w);
        }

    // The FC2 data gradient with GELU's backward and the FC1 bias gradient (linear_bwd_data_gelu), every
    // dtype through the default ops; dg is scratch (not compared: a fused backend leaves it alone), or
    // the same buffer as du.
    struct GShape { int64_t n, k, m; bool db, accumulate, alias; int form; };
    const GShape gshapes[] = {{7, 13, 5, true, false, false, DST_GELU_ERF},     {129, 96, 257, true, true, false, DST_GELU_ERF},
                              {129, 200, 96, true, true, false, DST_GELU_ERF},
                              {136, 264, 72, true, false, true, DST_GELU_TANH}, {513, 240, 80, false, false, false, DST_GELU_ERF},
                              {1000, 4096, 1024, true, false, false, DST_GELU_ERF}};
    // With the CUDA backend's fused GELU GEMMs (FP16/BF16, k and m multiples of 8, any n): the forward
    // with the pre-activation (tiles of 128×256 left partly empty, K not a multiple of 64, odd n), and
    // the backward.
    // pre_act false: the inference form (y only).
    struct FShape { int64_t n, k, m; int form; bool pre_act; };
    const FShape fshapes[] = {{8, 8, 8, DST_GELU_ERF, true},          {1, 8, 16, DST_GELU_ERF, true},
                              {129, 96, 200, DST_GELU_ERF, true},     {129, 96, 200, DST_GELU_ERF, false},
                              {136, 72, 264, DST_GELU_TANH, true},    {136, 72, 264, DST_GELU_TANH, false},
                              {264, 1032, 136, DST_GELU_ERF, true},   {1000, 1024, 4096, DST_GELU_ERF, true}};
    const bool fused_built = dst::CudaBackend::fused_gemm_built();
    for (dst_dtype dt : kDtypes) {
        const bool low = dt == DST_DTYPE_FP16 || dt == DST_DTYPE_BF16;
        for (int fused = 0; fused < 2; ++fused) {
            if (fused && !(low && fused_built)) continue;
            for (const GShape &s0 : gshapes) {
                if (fused && (s0.k % 8 || s0.m % 8)) continue;
                const GShape s = s0;
                std::ostringstream nm;
                nm << "n" << s.n << "_k" << s.k << "_m" << s.m << (s.form == DST_GELU_ERF ? "_erf" : "_tanh")
                   << (s.db ? "_db" : "") << (s.accumulate ? "_acc" : "") << (s.alias ? "_dg_is_du" : "")
                   << (fused ? "_fused" : "");
                OpCase g;
                g.name = tag("linear_bwd_data_gelu", dt, nm.str());
                g.dt = dt;
                // 0 dy, 1 w, 2 u, 3 dg (scratch), 4 du, 5 db
                g.args = {{"dy", dt, s.n * s.m, Role::In},       {"w", dt, s.m * s.k, Role::In, -0.2, 0.2},
                          {"u", dt, s.n * s.k, Role::In, -5.0, 5.0}, {"dg", dt, s.n * s.k, Role::In},
                          {"du", dt, s.n * s.k, Role::Out},
                          {"db", dt, s.k, s.db ? (s.accumulate ? Role::InOut : Role::Out) : Role::In}};
                g.call = [s, dt, fused](Backend &be, const Ptrs &p) {
                    const dst_gelu form = static_cast<dst_gelu>(s.form);
                    void *du = p[4], *dg = s.alias ? p[4] : p[3], *db = s.db ? p[5] : nullptr;
                    auto run = [&] {
                        return be.linear_bwd_data_gelu(dt, form, p[0], p[1], p[2], dg, du, s.n, s.k, s.m, db,
                                                       s.accumulate);
                    };
                    return with_fused_gemm(be, fused, dt, dst::cuda::kGeluBackward, s.n, s.k, s.m,
                                           {p[0], p[1], p[2], du}, run);
                };
                if (s.n * s.k < 100) g.tol_scale = 100.0;  // few elements: see gelu_bwd's cases below
                out.push_back(g);
            }
            if (!fused) continue;
            for (const FShape &s : fshapes) {
                std::ostringstream nm;
                nm << "n" << s.n << "_k" << s.k << "_m" << s.m << "_bias" << (s.form == DST_GELU_ERF ? "_erf" : "_tanh")
                   << (s.pre_act ? "_preact" : "") << "_fused";
                OpCase c;
                c.name = tag("linear_fwd", dt, nm.str());
                c.dt = dt;
                c.args = {{"x", dt, s.n * s.k, Role::In},   {"w", dt, s.m * s.k, Role::In, -0.2, 0.2},
                          {"b", dt, s.m, Role::In},          {"y", dt, s.n * s.m, Role::Out},
                          {"pre_act", dt, s.n * s.m, Role::Out}};
                c.call = [s, dt](Backend &be, const Ptrs &p) {
                    const dst_gelu form = static_cast<dst_gelu>(s.form);
                    void *pre = s.pre_act ? p[4] : nullptr;
                    const auto kind = pre ? dst::cuda::kGeluForwardAux : dst::cuda::kGeluForward;
                    const std::vector<const void *> ptrs = {p[0], p[1], p[2], p[3], pre ? pre : p[3]};
                    return with_fused_gemm(be, true, dt, kind, s.n, s.k, s.m, ptrs, [&] {
                        return be.linear_fwd(dt, p[0], p[1], p[2], p[3], s.n, s.k, s.m, &form, pre);
                    });
                };
                if (!s.pre_act) c.args[4].role = Role::In;  // untouched: not compared
                out.push_back(c);
            }
        }
    }
}

// ---- LayerNorm ----
struct LnShape { int64_t n, h; double eps; };

// layernorm_bwd. variant 0: from the input, no residual gradient, write; 1: from the input, + dresid,
// accumulate; 2: invertible (from the output), + dresid, write; 3: as 2 with dx written over dy
// (backend.h allows that alias); 4: as 1, writing, with dx over dy. split: the CUDA backend's form
// (with_ln_form: 0 the separate passes, 2 or 4 the one-pass form with that many warps per row).
OpCase ln_bwd_case(dst_dtype dt, const LnShape &s, int variant, int split) {
    const dst_dtype st = stat_dtype(dt);
    std::ostringstream nm;
    nm << "n" << s.n << "_h" << s.h;
    const bool invertible = variant == 2 || variant == 3, dresid = variant >= 1, accumulate = variant == 1;
    const bool alias = variant >= 3;
    OpCase b;
    b.name = tag("layernorm_bwd", dt,
                 nm.str() + (invertible ? "_invertible" : "") + (dresid ? "_dresid" : "") +
                     (accumulate ? "_acc" : "") + (alias ? "_dx_over_dy" : "") +
                     (split ? "_one_pass" + std::to_string(split) : ""));
    b.dt = dt;
    const Role pr = accumulate ? Role::InOut : Role::Out;
    // 0 dy, 1 x, 2 y, 3 gamma, 4 beta, 5 mean, 6 rstd, 7 dresid, 8 dx, 9 dgamma, 10 dbeta
    b.args = {{"dy", dt, s.n * s.h, Role::In},       {"x", dt, s.n * s.h, Role::In, -2.0, 3.0},
              {"y", dt, s.n * s.h, Role::In},        {"gamma", dt, s.h, Role::In, 0.5, 1.5},
              {"beta", dt, s.h, Role::In},           {"mean", st, s.n, Role::In},
              {"rstd", st, s.n, Role::In},           {"dresid", dt, s.n * s.h, Role::In},
              {"dx", dt, s.n * s.h, Role::Out},      {"dgamma", dt, s.h, pr},
              {"dbeta", dt, s.h, pr}};
    if (alias) {
        b.args[0].role = Role::InOut;
        b.args[8].role = Role::In;
    }
    b.prepare = [s, dt](Backend &cpu, const Ptrs &p) {
        return cpu.layernorm_fwd(dt, p[1], p[3], p[4], p[2], p[5], p[6], s.n, s.h, s.eps);
    };
    b.call = [=](Backend &be, const Ptrs &p) {
        auto run = [&] {
            return be.layernorm_bwd(dt, p[0], invertible ? p[2] : p[1], invertible, p[3], p[4], p[5],
                                    p[6], dresid ? p[7] : nullptr, alias ? p[0] : p[8], p[9], p[10], s.n,
                                    s.h, accumulate);
        };
        return with_ln_form(be, split, run);
    };
    return b;
}

// The fused forms of the layer: dropout + residual + LayerNorm, and LayerNorm backward with the branch
// gradient of the dropout before it. variant 0: p 0; 1: p 0.1, + dresid, accumulating; 2: p 0.1 with a
// row map (packed calls: rows r + r/3, row length h). The dropped set of the branch output is compared
// with the CPU's (a dropped element is exactly 0; a kept one almost never is). Variants 1 and 2 also take
// the branch's bias gradient (layernorm_dropout_bwd_bias_grad). split: the backward's form on the CUDA
// backend (with_ln_form: 0 the separate passes, 2 or 4 the one-pass form with that many warps per row).
void add_ln_fused_cases(std::vector<OpCase> &out, dst_dtype dt, const LnShape &s, int variant, int split) {
    const dst_dtype st = stat_dtype(dt);
    std::ostringstream nm;
    nm << "n" << s.n << "_h" << s.h;
    const double prob = variant == 0 ? 0.0 : 0.1;
    const bool mapped = variant == 2, dresid = variant == 1, bias = variant >= 1, acc = variant == 1;
    const DropoutSite site = make_site(prob, 0xfeed0000ull + s.h, 13 + s.n);
    const std::string vn = nm.str() + (prob > 0 ? "_p0.1" : "_p0") + (mapped ? "_mapped" : "") +
                           (dresid ? "_dresid" : "");
    Arg places{"rows", DST_DTYPE_INT32, s.n, Role::In};
    places.fill = [](HostBuf &h) {
        for (int64_t r = 0; r < h.count; ++r) h.set(r, double(r + r / 3));
    };
    OpCase ff;
    ff.name = tag("dropout_residual_layernorm_fwd", dt, vn);
    ff.dt = dt;
    // 0 a, 1 residual, 2 z, 3 gamma, 4 beta, 5 y, 6 mean, 7 rstd, 8 rows
    ff.args = {{"a", dt, s.n * s.h, Role::In, -2.0, 2.0}, {"residual", dt, s.n * s.h, Role::In},
               {"z", dt, s.n * s.h, Role::Out},           {"gamma", dt, s.h, Role::In, 0.5, 1.5},
               {"beta", dt, s.h, Role::In},               {"y", dt, s.n * s.h, Role::Out},
               {"mean", st, s.n, Role::Out},              {"rstd", st, s.n, Role::Out},
               places};
    ff.call = [=](Backend &be, const Ptrs &p) {
        DropoutSite m = site;
        if (mapped) m.rows = static_cast<const int32_t *>(p[8]), m.row_len = s.h;
        return be.dropout_residual_layernorm_fwd(dt, p[0], p[1], p[2], p[3], p[4], p[5], p[6], p[7], s.n,
                                                 s.h, s.eps, m);
    };
    ff.drop_p = prob;
    ff.dropped = [s](const std::vector<HostBuf> &b) {  // dropped: z == residual exactly
        std::vector<bool> m(static_cast<size_t>(s.n * s.h));
        for (int64_t i = 0; i < s.n * s.h; ++i) m[i] = b[2].get(i) == b[1].get(i);
        return m;
    };
    if (split == 0) out.push_back(ff);

    OpCase fb;
    fb.name = tag(bias ? "layernorm_dropout_bwd_bias_grad" : "layernorm_dropout_bwd", dt,
                  vn + (acc ? "_acc" : "") + (split ? "_one_pass" + std::to_string(split) : ""));
    fb.dt = dt;
    const Role pr = acc ? Role::InOut : Role::Out;
    // 0 dy, 1 x, 2 gamma, 3 beta, 4 mean, 5 rstd, 6 dresid, 7 dx, 8 dgamma, 9 dbeta, 10 branch, 11 rows
    // (, 12 dbias)
    fb.args = {{"dy", dt, s.n * s.h, Role::In},    {"x", dt, s.n * s.h, Role::In, -2.0, 3.0},
               {"gamma", dt, s.h, Role::In, 0.5, 1.5}, {"beta", dt, s.h, Role::In},
               {"mean", st, s.n, Role::In},        {"rstd", st, s.n, Role::In},
               {"dresid", dt, s.n * s.h, Role::In}, {"dx", dt, s.n * s.h, Role::Out},
               {"dgamma", dt, s.h, pr},            {"dbeta", dt, s.h, pr},
               {"branch", dt, s.n * s.h, Role::Out}, places};
    if (bias) fb.args.push_back({"dbias", dt, s.h, pr});
    fb.prepare = [s, dt](Backend &cpu, const Ptrs &p) {
        std::vector<unsigned char> y(static_cast<size_t>(s.n * s.h) * dst_dtype_size(dt));
        return cpu.layernorm_fwd(dt, p[1], p[2], p[3], y.data(), p[4], p[5], s.n, s.h, s.eps);
    };
    fb.call = [=](Backend &be, const Ptrs &p) {
        DropoutSite m = site;
        if (mapped) m.rows = static_cast<const int32_t *>(p[11]), m.row_len = s.h;
        auto run = [&] {
            if (bias)
                return be.layernorm_dropout_bwd_bias_grad(dt, p[0], p[1], false, p[2], p[3], p[4], p[5],
                                                          dresid ? p[6] : nullptr, p[7], p[8], p[9], s.n,
                                                          s.h, acc, m, p[10], p[12]);
            return be.layernorm_dropout_bwd(dt, p[0], p[1], false, p[2], p[3], p[4], p[5],
                                            dresid ? p[6] : nullptr, p[7], p[8], p[9], s.n, s.h, false, m,
                                            p[10]);
        };
        return with_ln_form(be, split, run);
    };
    fb.drop_p = prob;
    fb.dropped = [s](const std::vector<HostBuf> &b) {
        std::vector<bool> m(static_cast<size_t>(s.n * s.h));
        for (int64_t i = 0; i < s.n * s.h; ++i) m[i] = b[10].get(i) == 0.0;
        return m;
    };
    out.push_back(fb);
}

void add_layernorm_cases(std::vector<OpCase> &out) {
    using Shape = LnShape;
    // 256, 512, 1024 and 2048 take the one-warp-per-row kernels (16-byte vectors) in some dtypes: 256
    // and 512 in all four, 1024 in fp16/bf16/fp32, 2048 in fp16/bf16; n not a multiple of the 4 rows per
    // block.
    const Shape shapes[] = {{1, 5, 1e-12},   {7, 100, 1e-5},  {129, 1000, 1e-12}, {1024, 1024, 1e-12},
                            {37, 256, 1e-5}, {21, 512, 1e-5}, {5, 2048, 1e-12}};
    for (dst_dtype dt : kDtypes)
        for (const Shape &s : shapes) {
            const dst_dtype st = stat_dtype(dt);
            std::ostringstream nm;
            nm << "n" << s.n << "_h" << s.h;
            OpCase f;
            f.name = tag("layernorm_fwd", dt, nm.str());
            f.dt = dt;
            f.args = {{"x", dt, s.n * s.h, Role::In, -2.0, 3.0}, {"gamma", dt, s.h, Role::In, 0.5, 1.5},
                      {"beta", dt, s.h, Role::In}, {"y", dt, s.n * s.h, Role::Out},
                      {"mean", st, s.n, Role::Out}, {"rstd", st, s.n, Role::Out}};
            f.call = [s, dt](Backend &be, const Ptrs &p) {
                return be.layernorm_fwd(dt, p[0], p[1], p[2], p[3], p[4], p[5], s.n, s.h, s.eps);
            };
            out.push_back(f);

            for (int variant = 0; variant < 4; ++variant) out.push_back(ln_bwd_case(dt, s, variant, 0));
            for (int variant = 0; variant < 3; ++variant) add_ln_fused_cases(out, dt, s, variant, 0);
        }
    // The one-pass backward (CudaBackend::set_layernorm_one_pass) with 2 and 4 warps per row where it
    // applies: the non-invertible layernorm_bwd variants (and dx over dy), and every fused one; rows that
    // end inside a column-sum chunk (1031) and chunks of a few rows (21, 37).
    const Shape one_pass_shapes[] = {{21, 512, 1e-5}, {37, 256, 1e-5}, {1031, 1024, 1e-12}, {1031, 512, 1e-5}};
    for (dst_dtype dt : kDtypes)
        for (const Shape &s : one_pass_shapes)
            for (int split : {2, 4}) {
                if (!ln_one_pass_applies(dt, s.h, split)) continue;
                for (int variant : {0, 1, 4}) out.push_back(ln_bwd_case(dt, s, variant, split));
                for (int variant = 0; variant < 3; ++variant) add_ln_fused_cases(out, dt, s, variant, split);
            }
}


// ---- elementwise ----
void add_elementwise_cases(std::vector<OpCase> &out) {
    const int64_t counts[] = {1, 7, 1000003};
    for (dst_dtype dt : kDtypes)
        for (int64_t n : counts) {
            const std::string cn = "count" + std::to_string(n);
            for (dst_gelu form : {DST_GELU_ERF, DST_GELU_TANH}) {
                const std::string fn = form == DST_GELU_ERF ? "_erf" : "_tanh";
                OpCase g;
                g.name = tag("gelu_fwd", dt, cn + fn);
                g.dt = dt;
                g.args = {{"u", dt, n, Role::In, -5.0, 5.0}, {"g", dt, n, Role::Out}};
                g.call = [=](Backend &be, const Ptrs &p) { return be.gelu_fwd(dt, form, p[0], p[1], n); };
                out.push_back(g);
                OpCase gb;
                gb.name = tag("gelu_bwd", dt, cn + fn);
                gb.dt = dt;
                gb.args = {{"dg", dt, n, Role::In}, {"u", dt, n, Role::In, -5.0, 5.0}, {"du", dt, n, Role::Out}};
                gb.call = [=](Backend &be, const Ptrs &p) { return be.gelu_bwd(dt, form, p[0], p[1], p[2], n); };
                // Widened ×100 for tensors of a few elements only: GELU'(x) = Φ(x) + x·φ(x) (and
                // 0.5·(1 + tanh z) + …) cancels for x ≪ 0, where 1 + erf(x/√2) loses
                // log2(1/Φ(x)) bits in both backends alike (same formula, different erf/tanh
                // rounding). Seen on the H200: u = −4.73 (fp64) gave 2.3e-12, u = −3.26 (fp32)
                // 1.4e-5. With many elements the L2 norm is dominated by well-conditioned ones and
                // the standard tolerance holds (count 1000003 passes unwidened).
                if (n < 100) gb.tol_scale = 100.0;
                out.push_back(gb);
                OpCase gi = gb;  // in place: du written over dg
                gi.name = tag("gelu_bwd", dt, cn + fn + "_inplace");
                gi.args[0].role = Role::InOut;
                gi.args[2].role = Role::In;
                gi.call = [=](Backend &be, const Ptrs &p) { return be.gelu_bwd(dt, form, p[0], p[1], p[0], n); };
                out.push_back(gi);
            }
            // Pointers off the 16-byte grid: the element-by-element path of the vectorised maps.
            if (n > 100) {
                OpCase m;
                m.name = tag("gelu_bwd", dt, cn + "_erf_misaligned");
                m.dt = dt;
                m.args = {{"dg", dt, n, Role::In}, {"u", dt, n, Role::In, -5.0, 5.0}, {"du", dt, n, Role::Out}};
                for (Arg &x : m.args) x.offset = 1;
                m.args[1].offset = 3;
                const dst_gelu erf = DST_GELU_ERF;
                m.call = [=](Backend &be, const Ptrs &p) { return be.gelu_bwd(dt, erf, p[0], p[1], p[2], n); };
                out.push_back(m);
            }
            OpCase a;
            a.name = tag("add", dt, cn);
            a.dt = dt;
            a.args = {{"a", dt, n, Role::In}, {"b", dt, n, Role::In}, {"y", dt, n, Role::Out}};
            a.call = [=](Backend &be, const Ptrs &p) { return be.add(dt, p[0], p[1], p[2], n); };
            out.push_back(a);

            for (double prob : {0.0, 0.1}) {
                const DropoutSite site = make_site(prob, 0x1234567890abcdefull + n, 977 + 4 * n);
                const std::string pn = prob > 0 ? "_p0.1" : "_p0";
                OpCase r;
                r.name = tag("dropout_residual_fwd", dt, cn + pn);
                r.dt = dt;
                r.args = {{"a", dt, n, Role::In}, {"residual", dt, n, Role::In}, {"y", dt, n, Role::Out}};
                r.call = [=](Backend &be, const Ptrs &p) {
                    return be.dropout_residual_fwd(dt, p[0], p[1], p[2], n, site);
                };
                r.drop_p = prob;
                r.dropped = [n](const std::vector<HostBuf> &b) {  // dropped: y == residual exactly
                    std::vector<bool> m(static_cast<size_t>(n));
                    for (int64_t i = 0; i < n; ++i) m[i] = b[2].get(i) == b[1].get(i);
                    return m;
                };
                out.push_back(r);
                if (n > 100) {  // off the 4-element grid: the group-by-group path
                    OpCase rm = r;
                    rm.name = tag("dropout_residual_fwd", dt, cn + pn + "_misaligned");
                    for (Arg &x : rm.args) x.offset = 1;
                    out.push_back(rm);
                }
                OpCase d;
                d.name = tag("dropout_bwd", dt, cn + pn);
                d.dt = dt;
                d.args = {{"dy", dt, n, Role::In}, {"dx", dt, n, Role::Out}};
                d.call = [=](Backend &be, const Ptrs &p) { return be.dropout_bwd(dt, p[0], p[1], n, site); };
                d.drop_p = prob;
                d.dropped = [n](const std::vector<HostBuf> &b) {
                    std::vector<bool> m(static_cast<size_t>(n));
                    for (int64_t i = 0; i < n; ++i) m[i] = b[1].get(i) == 0.0;
                    return m;
                };
                out.push_back(d);
            }
            for (int zero_at : std::set<int>{-1, 0, static_cast<int>(n / 2)}) {
                OpCase z;
                z.name = tag("all_nonzero", dt, cn + (zero_at < 0 ? "_none_zero" : "_zero_at" + std::to_string(zero_at)));
                z.dt = dt;
                Arg x{"x", dt, n, Role::In};
                x.fill = [zero_at](HostBuf &h) {
                    for (int64_t i = 0; i < h.count; ++i) h.set(i, i % 2 ? 0.75 : -1.5);
                    if (zero_at >= 0) h.set(zero_at, zero_at % 2 ? 0.0 : -0.0);
                };
                z.args = {x, {"result", DST_DTYPE_INT32, 1, Role::Host}};
                z.call = [=](Backend &be, const Ptrs &p) {
                    bool all = false;
                    const dst_status st = be.all_nonzero(dt, p[0], n, &all);
                    *static_cast<int32_t *>(p[1]) = all ? 1 : 0;
                    return st;
                };
                out.push_back(z);
            }
        }
    // GELU backward with the bias gradient of its GEMM (gelu_bwd_bias_grad): rows of 16-byte vectors
    // take the fused pass, the others (m not a multiple of the vector, a misaligned pointer) gelu_bwd
    // and the column sums; m = 200 and 520 end inside a column tile, n = 1031 inside a row chunk.
    struct GShape { int64_t n, m; bool accumulate, inplace; int64_t off; };
    const GShape gshapes[] = {{1, 8, false, false, 0},     {7, 13, true, false, 0},   {300, 200, false, false, 0},
                              {300, 200, true, true, 0},   {1031, 520, false, false, 0}, {1031, 520, true, false, 1},
                              {2053, 1024, false, false, 0}};
    for (dst_dtype dt : kDtypes)
        for (const GShape &s : gshapes) {
            const int64_t n = s.n, m = s.m;
            OpCase c;
            c.name = tag("gelu_bwd_bias_grad", dt,
                         "n" + std::to_string(n) + "_m" + std::to_string(m) + (s.accumulate ? "_acc" : "") +
                             (s.inplace ? "_inplace" : "") + (s.off ? "_misaligned" : ""));
            c.dt = dt;
            c.args = {{"dg", dt, n * m, s.inplace ? Role::InOut : Role::In},
                      {"u", dt, n * m, Role::In, -5.0, 5.0},
                      {"du", dt, n * m, s.inplace ? Role::In : Role::Out},
                      {"db", dt, m, s.accumulate ? Role::InOut : Role::Out}};
            c.args[0].offset = s.off;
            const bool acc = s.accumulate, inplace = s.inplace;
            const dst_gelu erf = DST_GELU_ERF;
            c.call = [=](Backend &be, const Ptrs &p) {
                return be.gelu_bwd_bias_grad(dt, erf, p[0], p[1], inplace ? p[0] : p[2], n, m, p[3], acc);
            };
            if (n * m < 100) c.tol_scale = 100.0;  // few elements: see gelu_bwd's cases above
            out.push_back(c);
        }
    // Dropout backward with the bias gradient of the linear layer before it (dropout_bwd_bias_grad), on
    // the same shapes: p 0.1 (p 0 in the in-place ones), a row map (rows r + r/3, row length m) where
    // the shape is not misaligned; the fused pass where rows are 16-byte vectors of fp32 or a 16-bit type.
    for (dst_dtype dt : kDtypes)
        for (const GShape &s : gshapes) {
            const int64_t n = s.n, m = s.m;
            const bool acc = s.accumulate, inplace = s.inplace, mapped = s.off == 0 && !s.inplace;
            const double prob = inplace ? 0.0 : 0.1;
            const DropoutSite site = make_site(prob, 0xb1a5000ull + m, 7 + n);
            Arg places{"rows", DST_DTYPE_INT32, n, Role::In};
            places.fill = [](HostBuf &h) {
                for (int64_t r = 0; r < h.count; ++r) h.set(r, double(r + r / 3));
            };
            OpCase c;
            c.name = tag("dropout_bwd_bias_grad", dt,
                         "n" + std::to_string(n) + "_m" + std::to_string(m) + (prob > 0 ? "_p0.1" : "_p0") +
                             (acc ? "_acc" : "") + (inplace ? "_inplace" : "") + (s.off ? "_misaligned" : "") +
                             (mapped ? "_mapped" : ""));
            c.dt = dt;
            c.args = {{"dy", dt, n * m, inplace ? Role::InOut : Role::In},
                      {"dx", dt, n * m, inplace ? Role::In : Role::Out},
                      {"db", dt, m, acc ? Role::InOut : Role::Out},
                      places};
            c.args[0].offset = s.off;
            c.call = [=](Backend &be, const Ptrs &p) {
                DropoutSite st = site;
                if (mapped) st.rows = static_cast<const int32_t *>(p[3]), st.row_len = m;
                return be.dropout_bwd_bias_grad(dt, p[0], inplace ? p[0] : p[1], n, m, st, p[2], acc);
            };
            if (prob > 0) {
                c.drop_p = prob;
                c.dropped = [n, m](const std::vector<HostBuf> &b) {
                    std::vector<bool> d(static_cast<size_t>(n * m));
                    for (int64_t i = 0; i < n * m; ++i) d[i] = b[1].get(i) == 0.0;
                    return d;
                };
            }
            out.push_back(c);
        }
}

// ---- attention ----
struct AttnShape {
    int64_t b, s, heads, d;
    dst_mask_kind mask;
    bool mask_layer_dtype;  // additive mask in the layer dtype (else fp32)
    bool causal;
    double p;
    bool lse;               // forward: lse wanted (backward always reads it)
    bool fully_masked;      // additive: batch 0 sees no key at all (−inf everywhere)
};

std::string attn_name(const AttnShape &a) {
    std::ostringstream nm;
    nm << "b" << a.b << "_s" << a.s << "_h" << a.heads << "_d" << a.d
       << (a.mask == DST_MASK_ADDITIVE ? (a.mask_layer_dtype ? "_addmask" : "_addmask32")
                                       : a.mask == DST_MASK_KEY_LENGTHS ? "_lengths" : "")
       << (a.fully_masked ? "_fullymasked" : "") << (a.causal ? "_causal" : "") << (a.p > 0 ? "_drop" : "")
       << (a.lse ? "_lse" : "");
    return nm.str();
}

AttentionParams attn_params(const AttnShape &a, const void *mask, dst_dtype dt) {
    AttentionParams p;
    p.batch = a.b;
    p.seq = a.s;
    p.heads = a.heads;
    p.head_dim = a.d;
    p.hidden = a.heads * a.d;
    p.scale = 1.0 / std::sqrt(static_cast<double>(a.d));
    p.causal = a.causal;
    p.mask_kind = a.mask;
    p.mask = a.mask == DST_MASK_NONE ? nullptr : mask;
    p.mask_dtype = a.mask == DST_MASK_KEY_LENGTHS ? DST_DTYPE_INT32
                   : a.mask_layer_dtype           ? dt
                                                  : DST_DTYPE_FP32;
    p.dropout = make_site(a.p, 42 + a.s, 4096 * a.b + 8);
    return p;
}

Arg mask_arg(const AttnShape &a, dst_dtype dt) {
    if (a.mask == DST_MASK_KEY_LENGTHS) {
        Arg m{"lengths", DST_DTYPE_INT32, a.b, Role::In};
        m.fill = [a](HostBuf &h) {
            for (int64_t b = 0; b < a.b; ++b) h.set(b, b == 0 ? a.s : 1 + (a.s * (b + 2) / 3 + b) % a.s);
        };
        return m;
    }
    Arg m{"mask", a.mask_layer_dtype ? dt : DST_DTYPE_FP32, a.b * a.s, Role::In};
    m.fill = [a](HostBuf &h) {  // BERT padding: the last keys of some batches get −10000
        for (int64_t b = 0; b < a.b; ++b)
            for (int64_t j = 0; j < a.s; ++j) {
                double v = (b % 2 == 1 && j >= a.s - (a.s / 3)) ? -10000.0 : 0.0;
                if (a.fully_masked && b == 0) v = -std::numeric_limits<double>::infinity();
                h.set(b * a.s + j, v);
            }
    };
    return m;
}

void add_attention_cases(std::vector<OpCase> &out) {
    // Awkward S (1, 7, 65, 100, 129, 1000, 4097: rows not 4-aligned and partial tiles; 1024, 1088,
    // 1152: the sm_90 forward's own kernel and its last block's idle warpgroups), B 1 to 3,
    // odd head counts, every head dim the flash kernels are built for (32, 64, 96, 128), dims in
    // between (5, 12, 24, 80: zero padding; 5 and 12 also element-wise loads), heads wider than
    // 128 (200, 256, 800), every mask kind, fully masked rows, causal, dropout on and off;
    // BERT-Large heads at S = 128 and 512, and at S ≤ 128 with 160 and 192 (batch, head) pairs.
    const AttnShape shapes[] = {
        {2, 1, 3, 5, DST_MASK_NONE, false, false, 0.0, true, false},
        {2, 7, 3, 5, DST_MASK_ADDITIVE, false, true, 0.0, true, false},
        {3, 100, 3, 32, DST_MASK_KEY_LENGTHS, false, false, 0.1, true, false},
        {2, 129, 2, 64, DST_MASK_ADDITIVE, true, true, 0.1, true, false},
        {2, 129, 3, 80, DST_MASK_ADDITIVE, false, false, 0.0, true, true},
        {1, 513, 3, 80, DST_MASK_KEY_LENGTHS, false, true, 0.0, true, false},
        {2, 129, 1, 128, DST_MASK_NONE, false, false, 0.1, false, false},
        {3, 65, 2, 128, DST_MASK_KEY_LENGTHS, false, true, 0.1, true, false},
        {3, 65, 3, 96, DST_MASK_ADDITIVE, false, false, 0.1, true, false},
        {1, 65, 2, 24, DST_MASK_KEY_LENGTHS, false, false, 0.1, true, false},
        {2, 512, 16, 64, DST_MASK_ADDITIVE, false, false, 0.1, true, false},  // BERT-Large
        {2, 128, 16, 64, DST_MASK_ADDITIVE, false, false, 0.1, true, false},
        {2, 128, 16, 64, DST_MASK_KEY_LENGTHS, false, true, 0.1, true, false},
        {2, 128, 16, 64, DST_MASK_NONE, false, false, 0.0, false, false},
        {2, 128, 16, 64, DST_MASK_ADDITIVE, true, true, 0.0, true, true},
        {1, 512, 16, 64, DST_MASK_ADDITIVE, true, true, 0.1, true, false},
        {3, 1, 3, 64, DST_MASK_KEY_LENGTHS, false, true, 0.1, true, false},
        {2, 7, 3, 64, DST_MASK_ADDITIVE, false, false, 0.1, true, true},
        {2, 129, 3, 64, DST_MASK_NONE, false, true, 0.1, false, false},
        {2, 129, 3, 32, DST_MASK_KEY_LENGTHS, false, false, 0.0, true, false},
        {2, 33, 4, 5, DST_MASK_ADDITIVE, true, true, 0.1, true, false},
        {2, 64, 2, 12, DST_MASK_KEY_LENGTHS, false, false, 0.1, true, false},
        {1, 1000, 2, 64, DST_MASK_KEY_LENGTHS, false, true, 0.1, true, false},
        {1, 4097, 1, 64, DST_MASK_NONE, false, false, 0.1, true, false},
        // S a multiple of 64 from 1024 on: the warp-specialised forward on sm_90 (three warpgroups of
        // 64 rows per block: 1088 and 1024 leave one or two of the last block's past the sequence).
        {2, 1024, 2, 64, DST_MASK_KEY_LENGTHS, false, false, 0.1, true, false},
        {1, 1088, 3, 64, DST_MASK_ADDITIVE, true, true, 0.1, true, false},
        {2, 1152, 1, 64, DST_MASK_ADDITIVE, false, false, 0.0, false, true},
        // Heads wider than 128 (generic kernels, 128-column chunks; 800 is DeepSpeed's test size).
        {2, 65, 2, 200, DST_MASK_KEY_LENGTHS, false, true, 0.1, true, false},
        {3, 33, 1, 800, DST_MASK_ADDITIVE, false, false, 0.1, true, true},
        {1, 129, 2, 256, DST_MASK_NONE, false, false, 0.0, true, false},
        // More (batch, head) pairs than an H200 has SMs at S ≤ 128 (one backward key block each).
        {12, 128, 16, 64, DST_MASK_KEY_LENGTHS, false, false, 0.1, true, false},
        {10, 100, 16, 64, DST_MASK_ADDITIVE, false, true, 0.1, true, true},
    };
    for (dst_dtype dt : kDtypes)
        for (const AttnShape &a : shapes) {
            const int64_t H = a.heads * a.d, rows = a.b * a.heads * a.s;
            const dst_dtype st = stat_dtype(dt);
            // 0 qkv, 1 mask, 2 ctx, 3 lse
            OpCase f;
            f.name = tag("attention_fwd", dt, attn_name(a));
            f.dt = dt;
            f.args = {{"qkv", dt, a.b * a.s * 3 * H, Role::In, -2.0, 2.0}, mask_arg(a, dt),
                      {"ctx", dt, a.b * a.s * H, Role::Out}, {"lse", st, rows, a.lse ? Role::Out : Role::In}};
            f.call = [a, dt](Backend &be, const Ptrs &p) {
                return be.attention_fwd(dt, attn_params(a, p[1], dt), p[0], p[2], a.lse ? p[3] : nullptr);
            };
            out.push_back(f);

            // 0 qkv, 1 mask, 2 ctx, 3 lse, 4 dctx, 5 dqkv; ctx and lse from the CPU forward.
            OpCase b;
            AttnShape ab = a;
            ab.lse = false;
            b.name = tag("attention_bwd", dt, attn_name(ab));
            b.dt = dt;
            b.args = {{"qkv", dt, a.b * a.s * 3 * H, Role::In, -2.0, 2.0}, mask_arg(a, dt),
                      {"ctx", dt, a.b * a.s * H, Role::In}, {"lse", st, rows, Role::In},
                      {"dctx", dt, a.b * a.s * H, Role::In}, {"dqkv", dt, a.b * a.s * 3 * H, Role::Out}};
            b.prepare = [a, dt](Backend &cpu, const Ptrs &p) {
                return cpu.attention_fwd(dt, attn_params(a, p[1], dt), p[0], p[2], p[3]);
            };
            b.call = [a, dt](Backend &be, const Ptrs &p) {
                return be.attention_bwd(dt, attn_params(a, p[1], dt), p[0], p[2], p[4], p[3], p[5]);
            };
            out.push_back(b);
        }
}

// Packed layer calls (dst_layer_forward_packed): hidden dropout over rows with a map to their padded
// places (rows of 1024: one group per four elements; rows of 7: groups across rows), and attention
// in the packed layout (lengths as mask_arg gives them; rows of sequence b follow those of b − 1).
void add_packed_cases(std::vector<OpCase> &out) {
    for (dst_dtype dt : kDtypes) {
        for (int64_t L : {int64_t(1024), int64_t(7)}) {
            const int64_t rows = L == 7 ? 301 : 37, n = rows * L;
            Arg places{"rows", DST_DTYPE_INT32, rows, Role::In};
            places.fill = [](HostBuf &h) {  // increasing, with gaps: r + r/3
                for (int64_t r = 0; r < h.count; ++r) h.set(r, double(r + r / 3));
            };
            const DropoutSite site = make_site(0.1, 0x5eed0000 + L, 31 + L);
            OpCase r;
            r.name = tag("dropout_residual_fwd", dt, "rows" + std::to_string(rows) + "x" + std::to_string(L) + "_mapped");
            r.dt = dt;
            r.args = {{"a", dt, n, Role::In}, {"residual", dt, n, Role::In}, {"y", dt, n, Role::Out}, places};
            r.call = [=](Backend &be, const Ptrs &p) {
                DropoutSite m = site;
                m.rows = static_cast<const int32_t *>(p[3]);
                m.row_len = L;
                return be.dropout_residual_fwd(dt, p[0], p[1], p[2], n, m);
            };
            r.drop_p = 0.1;
            r.dropped = [n](const std::vector<HostBuf> &b) {
                std::vector<bool> m(static_cast<size_t>(n));
                for (int64_t i = 0; i < n; ++i) m[i] = b[2].get(i) == b[1].get(i);
                return m;
            };
            out.push_back(r);
            OpCase d;
            d.name = tag("dropout_bwd", dt, "rows" + std::to_string(rows) + "x" + std::to_string(L) + "_mapped");
            d.dt = dt;
            d.args = {{"dy", dt, n, Role::In}, {"dx", dt, n, Role::Out}, places};
            d.call = [=](Backend &be, const Ptrs &p) {
                DropoutSite m = site;
                m.rows = static_cast<const int32_t *>(p[2]);
                m.row_len = L;
                return be.dropout_bwd(dt, p[0], p[1], n, m);
            };
            d.drop_p = 0.1;
            d.dropped = [n](const std::vector<HostBuf> &b) {
                std::vector<bool> m(static_cast<size_t>(n));
                for (int64_t i = 0; i < n; ++i) m[i] = b[1].get(i) == 0.0;
                return m;
            };
            out.push_back(d);
        }
        const AttnShape shapes[] = {
            {3, 100, 3, 32, DST_MASK_KEY_LENGTHS, false, false, 0.1, true, false},
            {3, 65, 2, 128, DST_MASK_KEY_LENGTHS, false, true, 0.1, true, false},
            {4, 128, 16, 64, DST_MASK_KEY_LENGTHS, false, false, 0.1, true, false},  // BERT-Large heads
            {2, 65, 2, 200, DST_MASK_KEY_LENGTHS, false, true, 0.0, true, false},   // generic kernels
        };
        for (const AttnShape &a : shapes) {
            const int64_t H = a.heads * a.d, stat_rows = a.b * a.heads * a.s;
            const dst_dtype st = stat_dtype(dt);
            HostBuf lens(DST_DTYPE_INT32, a.b);
            mask_arg(a, dt).fill(lens);
            int64_t N = 0;
            for (int64_t b = 0; b < a.b; ++b) N += int64_t(lens.get(b));
            Arg places{"rows", DST_DTYPE_INT32, N, Role::In};
            places.fill = [a, lens](HostBuf &h) {
                int64_t r = 0;
                for (int64_t b = 0; b < a.b; ++b)
                    for (int64_t i = 0; i < int64_t(lens.get(b)); ++i) h.set(r++, double(b * a.s + i));
            };
            auto params = [a, dt, N](const Ptrs &p) {
                AttentionParams ap = attn_params(a, p[1], dt);
                ap.rows = static_cast<const int32_t *>(p[2]);
                ap.packed_tokens = N;
                return ap;
            };
            // 0 qkv, 1 lengths, 2 rows, 3 ctx, 4 lse (the padded rows' entries are unspecified: not compared)
            OpCase f;
            f.name = tag("attention_fwd", dt, attn_name(a) + "_packed");
            f.dt = dt;
            f.args = {{"qkv", dt, N * 3 * H, Role::In, -2.0, 2.0}, mask_arg(a, dt), places,
                      {"ctx", dt, N * H, Role::Out}, {"lse", st, stat_rows, Role::In}};
            f.call = [=](Backend &be, const Ptrs &p) { return be.attention_fwd(dt, params(p), p[0], p[3], p[4]); };
            out.push_back(f);
            // 0 qkv, 1 lengths, 2 rows, 3 ctx, 4 lse, 5 dctx, 6 dqkv; ctx and lse from the CPU forward.
            OpCase b;
            b.name = tag("attention_bwd", dt, attn_name(a) + "_packed");
            b.dt = dt;
            b.args = {{"qkv", dt, N * 3 * H, Role::In, -2.0, 2.0}, mask_arg(a, dt), places,
                      {"ctx", dt, N * H, Role::In}, {"lse", st, stat_rows, Role::In},
                      {"dctx", dt, N * H, Role::In}, {"dqkv", dt, N * 3 * H, Role::Out}};
            b.prepare = [=](Backend &cpu, const Ptrs &p) { return cpu.attention_fwd(dt, params(p), p[0], p[3], p[4]); };
            b.call = [=](Backend &be, const Ptrs &p) {
                return be.attention_bwd(dt, params(p), p[0], p[3], p[5], p[4], p[6]);
            };
            out.push_back(b);
        }
    }
}

std::vector<OpCase> all_cases() {
    std::vector<OpCase> cases;
    add_linear_cases(cases);
    add_layernorm_cases(cases);
    add_elementwise_cases(cases);
    add_attention_cases(cases);
    add_packed_cases(cases);
    std::set<std::string> seen;
    for (OpCase &c : cases) {
        for (char &ch : c.name)
            if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
        std::string base = c.name;
        for (int k = 2; !seen.insert(c.name).second; ++k) c.name = base + "_" + std::to_string(k);
    }
    return cases;
}

// ---- runner ----------------------------------------------------------------------------------------

struct Backends {
    std::unique_ptr<Backend> cpu, gpu;
};

// Created once: the cuBLASLt handle and workspace are reused across cases (as in a layer).
Backends &backends() {
    static Backends b = [] {
        Backends r;
        Backend *c = nullptr, *g = nullptr;
        if (dst::make_cpu_backend(&c) == DST_OK) r.cpu.reset(c);
        if (dst::make_cuda_backend(0, &g) == DST_OK) r.gpu.reset(g);
        return r;
    }();
    return b;
}

bool have_gpu() {
    int n = 0;
    return dst::cuda_device_count(&n) == DST_OK && n > 0;
}

// A CUDA backend on device 0 for the tests that call its ops directly (null, with a failure recorded,
// when it cannot be made).
std::unique_ptr<dst::CudaBackend> cuda_backend() {
    Backend *raw = nullptr;
    const dst_status st = dst::make_cuda_backend(0, &raw);
    EXPECT_EQ(st, DST_OK) << dst::last_error();
    return std::unique_ptr<dst::CudaBackend>(st == DST_OK ? static_cast<dst::CudaBackend *>(raw) : nullptr);
}

// Device buffers of one backend for a test, freed together when it goes out of scope: get(count) is
// count elements of `elem` bytes, uploaded from `from` when given (a failure is a test failure and
// gives nullptr).
class DeviceBufs {
  public:
    DeviceBufs(Backend &be, size_t elem) : be_(be), elem_(elem) {}
    ~DeviceBufs() {
        for (void *p : ptrs_) be_.free(p);
    }
    DeviceBufs(const DeviceBufs &) = delete;
    DeviceBufs &operator=(const DeviceBufs &) = delete;
    void *get(int64_t count, const HostBuf *from = nullptr) {
        void *p = nullptr;
        EXPECT_EQ(be_.alloc(static_cast<size_t>(count) * elem_, &p), DST_OK);
        if (p && from) {
            EXPECT_EQ(be_.copy(p, from->bytes.data(), from->bytes.size(), CopyKind::HostToDevice), DST_OK);
        }
        if (p) ptrs_.push_back(p);
        return p;
    }

  private:
    Backend &be_;
    size_t elem_;
    std::vector<void *> ptrs_;
};

std::vector<HostBuf> make_inputs(const OpCase &c, uint64_t seed) {
    std::mt19937_64 rng(seed);
    std::vector<HostBuf> bufs;
    for (const Arg &a : c.args) {
        HostBuf h(a.dt, a.count);
        if (a.role == Role::Out || a.role == Role::Host) {
            std::memset(h.data(), 0xFF, h.bytes.size());  // NaN in every float format
        } else if (a.fill) {
            a.fill(h);
        } else {
            std::uniform_real_distribution<double> u(a.lo, a.hi);
            for (int64_t i = 0; i < a.count; ++i) h.set(i, u(rng));
        }
        bufs.push_back(std::move(h));
    }
    return bufs;
}

// Runs the case on `be`: allocates every buffer there, uploads, calls, downloads. Host-role
// buffers stay on the host.
dst_status run_on(Backend &be, const OpCase &c, std::vector<HostBuf> &bufs, std::string *err) {
    std::vector<void *> allocs(c.args.size(), nullptr);
    Ptrs ptrs(c.args.size(), nullptr);
    dst_status st = DST_OK;
    for (size_t i = 0; i < c.args.size() && st == DST_OK; ++i) {
        const Arg &a = c.args[i];
        if (a.role == Role::Host) {
            ptrs[i] = bufs[i].data();
            continue;
        }
        const size_t es = dst_dtype_size(a.dt);
        st = be.alloc((a.count + a.offset) * es, &allocs[i]);
        if (st != DST_OK) break;
        ptrs[i] = static_cast<char *>(allocs[i]) + a.offset * es;
        st = be.copy(ptrs[i], bufs[i].data(), bufs[i].bytes.size(), CopyKind::HostToDevice);
    }
    if (st == DST_OK) st = c.call(be, ptrs);
    if (st == DST_OK) st = be.synchronize();
    if (st != DST_OK) *err = dst::last_error();
    for (size_t i = 0; i < c.args.size(); ++i) {
        if (st == DST_OK && c.args[i].role != Role::Host && ptrs[i])
            st = be.copy(bufs[i].data(), ptrs[i], bufs[i].bytes.size(), CopyKind::DeviceToHost);
        if (allocs[i]) be.free(allocs[i]);
    }
    return st;
}

struct Compare {
    double rel_l2 = 0.0;
    int64_t bad = 0;  // NaN, or non-finite values that differ
};

Compare compare(const HostBuf &got, const HostBuf &ref) {
    Compare r;
    double num = 0.0, den = 0.0;
    for (int64_t i = 0; i < ref.count; ++i) {
        const double g = got.get(i), e = ref.get(i);
        if (std::isnan(g) || std::isnan(e)) { ++r.bad; continue; }
        if (g == e) { if (std::isfinite(e)) den += e * e; continue; }
        if (!std::isfinite(g) || !std::isfinite(e)) { ++r.bad; continue; }
        num += (g - e) * (g - e);
        den += e * e;
    }
    r.rel_l2 = den > 0 ? std::sqrt(num / den) : std::sqrt(num);
    return r;
}

class CudaOps : public ::testing::TestWithParam<OpCase> {};

TEST_P(CudaOps, MatchesCpuAndIsDeterministic) {
    if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
    const OpCase &c = GetParam();
    Backends &be = backends();
    ASSERT_TRUE(be.cpu && be.gpu) << "backend creation failed: " << dst::last_error();

    std::vector<HostBuf> init = make_inputs(c, std::hash<std::string>{}(c.name));
    if (c.prepare) {
        Ptrs host(init.size());
        for (size_t i = 0; i < init.size(); ++i) host[i] = init[i].data();
        ASSERT_EQ(c.prepare(*be.cpu, host), DST_OK) << "prepare: " << dst::last_error();
    }
    std::vector<HostBuf> ref = init, got = init, again = init;
    std::string err;
    ASSERT_EQ(run_on(*be.cpu, c, ref, &err), DST_OK) << "cpu: " << err;
    ASSERT_EQ(run_on(*be.gpu, c, got, &err), DST_OK) << "cuda: " << err;
    ASSERT_EQ(run_on(*be.gpu, c, again, &err), DST_OK) << "cuda (second run): " << err;

    const double tol = dsttest::design_tolerance(c.dt) * c.tol_scale;
    for (size_t i = 0; i < c.args.size(); ++i) {
        const Arg &a = c.args[i];
        if (a.role == Role::In) continue;
        const Compare r = compare(got[i], ref[i]);
        EXPECT_EQ(r.bad, 0) << a.name << ": NaN or mismatched non-finite values";
        EXPECT_LE(r.rel_l2, tol) << a.name << ": relative L2 error vs the CPU backend";
        EXPECT_TRUE(got[i].bytes == again[i].bytes) << a.name << ": two GPU runs differ";
    }
    if (c.dropped) {
        const std::vector<bool> mg = c.dropped(got), mc = c.dropped(ref);
        int64_t differ = 0, dropped = 0;
        for (size_t i = 0; i < mg.size(); ++i) {
            differ += mg[i] != mc[i];
            dropped += mg[i];
        }
        EXPECT_EQ(differ, 0) << "dropout masks differ between CUDA and CPU";
        if (mg.size() >= 100000) {
            const double frac = static_cast<double>(dropped) / mg.size();
            EXPECT_NEAR(frac, c.drop_p, 0.01) << "dropped fraction";
        }
    }
}

INSTANTIATE_TEST_SUITE_P(Ops, CudaOps, ::testing::ValuesIn(all_cases()),
                         [](const ::testing::TestParamInfo<OpCase> &info) { return info.param.name; });

// ---- backend-level behaviour -------------------------------------------------------------------------

TEST(CudaBackend, DeviceCountNeverFails) {
    int n = -1;
    EXPECT_EQ(dst::cuda_device_count(&n), DST_OK);
    EXPECT_GE(n, 0);
    EXPECT_NE(dst::cuda_device_count(nullptr), DST_OK);
}

TEST(CudaBackend, BadDeviceAndOutOfMemoryAreReported) {
    if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
    Backend *b = nullptr;
    EXPECT_EQ(dst::make_cuda_backend(1 << 20, &b), DST_ERR_INVALID_ARGUMENT);
    EXPECT_EQ(b, nullptr);
    Backend &gpu = *backends().gpu;
    void *p = nullptr;
    EXPECT_EQ(gpu.alloc(size_t(1) << 52, &p), DST_ERR_OUT_OF_MEMORY);
    EXPECT_EQ(p, nullptr);
    EXPECT_NE(std::string(dst::last_error()).find("cannot allocate"), std::string::npos);
    // The failure does not leak into later ops.
    void *q = nullptr;
    ASSERT_EQ(gpu.alloc(1024, &q), DST_OK);
    EXPECT_EQ(gpu.zero(q, 1024), DST_OK);
    EXPECT_EQ(gpu.add(DST_DTYPE_FP32, q, q, q, 256), DST_OK);
    EXPECT_EQ(gpu.synchronize(), DST_OK);
    gpu.free(q);
}

// Device buffers of one attention call, filled from host buffers.
struct AttnDev {
    Backend &be;
    std::vector<void *> ptrs;
    explicit AttnDev(Backend &b) : be(b) {}
    ~AttnDev() {
        for (void *p : ptrs) be.free(p);
    }
    void *put(const HostBuf &h) {
        void *p = nullptr;
        EXPECT_EQ(be.alloc(h.bytes.size(), &p), DST_OK);
        EXPECT_EQ(be.copy(p, h.bytes.data(), h.bytes.size(), CopyKind::HostToDevice), DST_OK);
        ptrs.push_back(p);
        return p;
    }
    void get(HostBuf &h, const void *p) {
        EXPECT_EQ(be.copy(h.data(), p, h.bytes.size(), CopyKind::DeviceToHost), DST_OK);
    }
};

// The dropped set, exactly, for the flash kernels (fp16, bf16; S % 4 == 0 and not) and the generic
// ones (fp32). With Q = 0 every visible score is equal (a deliberate non-random input: it makes
// the mask readable), and with one-hot values v_j = e_(j mod d) ctx_i[t] = n_it/((1−p)·S), n_it the
// number of kept elements ((b·heads + h)·S + i)·S + j with j ≡ t (mod d): at S ≤ d (S = 100, 128) a
// single element, so ctx shows the dropped set itself; at S = 1024 (head dim 64, the warp-specialised
// forward on sm_90) counts of 16. With one-hot dctx_i = e_(i mod d) the backward's dV_j[t] = n'_jt/((1−p)·S)
// likewise shows the mask the dK/dV kernel regenerates; dQ's kernel is held to the reference by the
// op table above.
TEST(CudaBackend, AttentionDroppedSetIsExact) {
    if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
    Backend &gpu = *backends().gpu;
    for (dst_dtype dt : {DST_DTYPE_FP16, DST_DTYPE_BF16, DST_DTYPE_FP32})
        for (int64_t S : {100, 128, 1024}) {
            SCOPED_TRACE(std::string(dst_dtype_string(dt)) + " S=" + std::to_string(S));
            const int64_t d = S <= 128 ? S : 64;
            const AttnShape a{2, S, 2, d, DST_MASK_NONE, false, false, 0.3, true, false};
            const int64_t H = a.heads * a.d;
            HostBuf qkv(dt, a.b * S * 3 * H), dctx(dt, a.b * S * H), ctx(dt, a.b * S * H), dqkv(dt, a.b * S * 3 * H);
            std::mt19937_64 rng(11);
            std::uniform_real_distribution<double> u(-1.0, 1.0);
            for (int64_t b = 0; b < a.b; ++b)
                for (int64_t i = 0; i < S; ++i)
                    for (int64_t h = 0; h < a.heads; ++h)
                        for (int64_t t = 0; t < a.d; ++t) {
                            const int64_t row = (b * S + i) * 3 * H + h * a.d + t;
                            qkv.set(row, 0.0);
                            qkv.set(row + H, u(rng));
                            qkv.set(row + 2 * H, t == i % d ? 1.0 : 0.0);
                            dctx.set((b * S + i) * H + h * a.d + t, t == i % d ? 1.0 : 0.0);
                        }
            AttnDev dev(gpu);
            void *dq = dev.put(qkv), *dc = dev.put(ctx), *dd = dev.put(dctx), *dg = dev.put(dqkv);
            HostBuf lse(DST_DTYPE_FP32, a.b * a.heads * S);
            void *dl = dev.put(lse);
            const AttentionParams p = attn_params(a, nullptr, dt);
            ASSERT_EQ(gpu.attention_fwd(dt, p, dq, dc, dl), DST_OK) << dst::last_error();
            ASSERT_EQ(gpu.attention_bwd(dt, p, dq, dc, dd, dl, dg), DST_OK) << dst::last_error();
            dev.get(ctx, dc);
            dev.get(dqkv, dg);
            int64_t kept = 0, wrong_fwd = 0, wrong_bwd = 0;
            const double unit = (1.0 - a.p) * double(S);  // 1/(a kept element's share)
            std::vector<int> n_fwd(size_t(S * d)), n_bwd(size_t(S * d));
            for (int64_t b = 0; b < a.b; ++b)
                for (int64_t h = 0; h < a.heads; ++h) {
                    std::fill(n_fwd.begin(), n_fwd.end(), 0);
                    std::fill(n_bwd.begin(), n_bwd.end(), 0);
                    for (int64_t i = 0; i < S; ++i)
                        for (int64_t j = 0; j < S; ++j) {
                            const uint64_t e = static_cast<uint64_t>(((b * a.heads + h) * S + i) * S + j);
                            const bool keep = dst::philox_dropout_keep(p.dropout.seed, p.dropout.offset, e,
                                                                       p.dropout.threshold);
                            kept += keep;
                            n_fwd[size_t(i * d + j % d)] += keep;
                            n_bwd[size_t(j * d + i % d)] += keep;
                        }
                    for (int64_t i = 0; i < S; ++i)
                        for (int64_t t = 0; t < d; ++t) {
                            const double f = ctx.get((b * S + i) * H + h * a.d + t) * unit;
                            const double g = dqkv.get((b * S + i) * 3 * H + 2 * H + h * a.d + t) * unit;
                            wrong_fwd += std::llround(f) != n_fwd[size_t(i * d + t)];
                            wrong_bwd += std::llround(g) != n_bwd[size_t(i * d + t)];
                        }
                }
            EXPECT_EQ(wrong_fwd, 0) << "forward keeps a different set";
            EXPECT_EQ(wrong_bwd, 0) << "backward regenerates a different set";
            EXPECT_NEAR(double(kept) / double(a.b * a.heads * S * S), 0.7, 0.01);
        }
}

// One attention call on the GPU with random inputs (key lengths as mask_arg gives them): the forward
// once, then the backward in either mode, its dqkv returned.
struct AttnBwdRuns {
    Backend &gpu;
    dst_dtype dt;
    AttnShape a;
    int64_t count;
    AttnDev dev;
    AttentionParams p{};
    void *dq = nullptr, *dc = nullptr, *dd = nullptr, *dl = nullptr, *dg = nullptr;
    AttnBwdRuns(Backend &be, dst_dtype t, const AttnShape &shape, uint64_t seed)
        : gpu(be), dt(t), a(shape), count(shape.b * shape.s * 3 * shape.heads * shape.d), dev(be) {
        const int64_t H = a.heads * a.d, tokens = a.b * a.s;
        std::mt19937_64 rng(seed);
        std::uniform_real_distribution<double> u(-2.0, 2.0);
        const Arg mask_spec = mask_arg(a, dt);  // key lengths [B] or an additive mask [B, S]
        HostBuf qkv(dt, tokens * 3 * H), dctx(dt, tokens * H), mask(mask_spec.dt, mask_spec.count);
        for (int64_t i = 0; i < qkv.count; ++i) qkv.set(i, u(rng));
        for (int64_t i = 0; i < dctx.count; ++i) dctx.set(i, u(rng));
        mask_spec.fill(mask);
        const HostBuf ctx(dt, tokens * H), lse(DST_DTYPE_FP32, a.b * a.heads * a.s), g(dt, count);
        dq = dev.put(qkv);
        void *dm = dev.put(mask);
        dd = dev.put(dctx);
        dc = dev.put(ctx);
        dl = dev.put(lse);
        dg = dev.put(g);
        p = attn_params(a, dm, dt);
        EXPECT_EQ(gpu.attention_fwd(dt, p, dq, dc, dl), DST_OK) << dst::last_error();
    }
    HostBuf backward(bool stochastic) {
        HostBuf out(dt, count);
        gpu.set_stochastic(stochastic);
        EXPECT_EQ(gpu.attention_bwd(dt, p, dq, dc, dd, dl, dg), DST_OK) << dst::last_error();
        gpu.set_stochastic(false);
        dev.get(out, dg);
        return out;
    }
};

// Default backward: bit-identical run to run. stochastic_mode: dQ through float atomics, whose
// order varies: close to the deterministic result (same tolerance as against the CPU twin), and
// allowed to differ in the last bits (the count is printed, not asserted: equal runs are possible).
// S = 1000 and S = 1280 (on sm_90 the second takes the backward whose dQ adds a writer warpgroup
// makes: S ≥ 1024 with dropout; stochastic mode takes it from S = 512 on, its
// adds as bulk reductions, one per query row: S = 4097 ends in a partial query tile), a causal
// case without dropout, and S ≥ 8192, where the deterministic backward adds a query tile's partials
// in ascending key-block order (with and without dropout: both kernels), as stochastic mode's
// kernel walks the query tiles from S = 512 on.
TEST(CudaBackend, AttentionBackwardDeterministicUnlessStochastic) {
    if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
    const AttnShape shapes[] = {
        {4, 1000, 4, 64, DST_MASK_KEY_LENGTHS, false, false, 0.1, true, false},
        {2, 1280, 4, 64, DST_MASK_KEY_LENGTHS, false, false, 0.1, true, false},
        {1, 4097, 2, 64, DST_MASK_KEY_LENGTHS, false, false, 0.1, true, false},
        {2, 8200, 2, 64, DST_MASK_KEY_LENGTHS, false, false, 0.1, true, false},
        {1, 8192, 2, 64, DST_MASK_KEY_LENGTHS, false, false, 0.0, true, false},
        {2, 700, 3, 64, DST_MASK_KEY_LENGTHS, false, true, 0.0, true, false},
    };
    for (dst_dtype dt : {DST_DTYPE_FP16, DST_DTYPE_BF16}) {
        for (const AttnShape &shape : shapes) {
            const int64_t S = shape.s;
            SCOPED_TRACE(std::string(dst_dtype_string(dt)) + " " + attn_name(shape));
            AttnBwdRuns runs(*backends().gpu, dt, shape, 5);
            const HostBuf g1 = runs.backward(false), g2 = runs.backward(false), g3 = runs.backward(true);
            EXPECT_EQ(g1.bytes, g2.bytes) << "deterministic backward differs between two runs";
            const Compare c = compare(g3, g1);
            EXPECT_EQ(c.bad, 0);
            EXPECT_LE(c.rel_l2, dsttest::design_tolerance(dt)) << "stochastic vs deterministic";
            int64_t differ = 0;
            for (int64_t i = 0; i < g1.count; ++i) differ += g1.get(i) != g3.get(i);
            std::printf("  %s S %lld stochastic vs deterministic: rel L2 %.2e, %lld of %lld elements differ\n",
                        dst_dtype_string(dt), static_cast<long long>(S), c.rel_l2, static_cast<long long>(differ),
                        static_cast<long long>(g1.count));
        }
    }
}

// The packed layout's spans (cuda::flash_packed_spans: a block scan, a chunk of 256 sequences at a
// time) against the host's prefix sums: lengths outside 0 … S clamped, spans clamped into the n rows,
// batches of one, a partial chunk, one full chunk, one past it and several.
TEST(CudaBackend, PackedSpansAreClampedPrefixSums) {
    if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
    std::mt19937_64 rng(5);
    const int64_t S = 512;
    for (int64_t B : {int64_t(1), int64_t(3), int64_t(256), int64_t(257), int64_t(3000)}) {
        std::uniform_int_distribution<int32_t> u(-8, int32_t(S) + 8);
        std::vector<int32_t> len(static_cast<size_t>(B));
        int64_t total = 0;
        for (int32_t &l : len) {
            l = u(rng);
            total += std::min<int64_t>(std::max<int32_t>(l, 0), S);
        }
        for (int64_t n : {total, total / 2}) {
            SCOPED_TRACE("B " + std::to_string(B) + ", n " + std::to_string(n) + " of " + std::to_string(total));
            const size_t bytes = static_cast<size_t>(B) * sizeof(int32_t);
            std::vector<int32_t> out(static_cast<size_t>(2 * B), -7);
            void *mem = nullptr;
            ASSERT_EQ(cudaMalloc(&mem, 3 * bytes), cudaSuccess);
            int32_t *d = static_cast<int32_t *>(mem);
            cudaError_t e = cudaMemcpy(d, len.data(), bytes, cudaMemcpyHostToDevice);
            if (e == cudaSuccess) e = dst::cuda::flash_packed_spans(nullptr, d, B, S, n, d + B, d + 2 * B);
            if (e == cudaSuccess) e = cudaMemcpy(out.data(), d + B, 2 * bytes, cudaMemcpyDeviceToHost);
            cudaFree(d);
            ASSERT_EQ(e, cudaSuccess) << cudaGetErrorString(e);
            int64_t at = 0, bad = 0;
            for (int64_t b = 0; b < B; ++b) {
                const int64_t l = std::min<int64_t>(std::max<int32_t>(len[b], 0), S), st = std::min(at, n);
                bad += out[b] != st || out[B + b] != std::min(l, n - st);
                at += l;
            }
            EXPECT_EQ(bad, 0) << "sequences whose span differs from the host's";
        }
    }
}

// When S fits in one key block of the backward (128 keys at head_dim 64), each (batch, head) is one
// block whose dQ needs no reduction: stochastic_mode takes the deterministic direct store, so both
// modes give the same bits (and both agree with the CPU twin, checked by the op table).
TEST(CudaBackend, AttentionBackwardOneKeyBlockSameBitsInBothModes) {
    if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
    for (dst_dtype dt : {DST_DTYPE_FP16, DST_DTYPE_BF16}) {
        SCOPED_TRACE(dst_dtype_string(dt));
        AttnBwdRuns runs(*backends().gpu, dt, AttnShape{3, 100, 4, 64, DST_MASK_KEY_LENGTHS, false, false, 0.1, true, false}, 6);
        const HostBuf g1 = runs.backward(false), g2 = runs.backward(true);
        EXPECT_EQ(g1.bytes, g2.bytes) << "one key block: stochastic and deterministic differ";
        int64_t nonzero = 0;
        for (int64_t i = 0; i < g1.count; ++i) nonzero += g1.get(i) != 0.0;
        EXPECT_GT(nonzero, g1.count / 2) << "the gradient is mostly zero: nothing was computed";
    }
}

// The fused dropout + residual + LayerNorm forward gives the bits of its two ops run one after the
// other on the same backend (its contract), in the fused warp form (fp16 and fp32, h 1024, with and
// without a row map) and in the fallback (h 1000).
TEST(CudaBackend, FusedDropoutLayerNormIsItsTwoOps) {
    if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
    Backend &gpu = *backends().gpu;
    for (dst_dtype dt : {DST_DTYPE_FP16, DST_DTYPE_FP32})
        for (int64_t h : {int64_t(1024), int64_t(1000)})
            for (bool mapped : {false, true}) {
                SCOPED_TRACE(std::string(dst_dtype_string(dt)) + " h" + std::to_string(h) + (mapped ? " mapped" : ""));
                const int64_t n = 77, count = n * h;
                const size_t es = dst_dtype_size(dt), bytes = size_t(count) * es;
                HostBuf a(dt, count), r(dt, count), g(dt, h), b(dt, h);
                std::mt19937_64 rng(11 + h);
                std::uniform_real_distribution<double> u(-1.0, 1.0);
                for (int64_t i = 0; i < count; ++i) a.set(i, 2 * u(rng)), r.set(i, u(rng));
                for (int64_t i = 0; i < h; ++i) g.set(i, 1.0 + 0.5 * u(rng)), b.set(i, u(rng));
                std::vector<int32_t> rows(n);
                for (int64_t i = 0; i < n; ++i) rows[i] = int32_t(i + i / 3);
                void *da, *dr, *dg, *db, *drows, *z1, *y1, *m1, *s1, *z2, *y2, *m2, *s2;
                for (void **q : {&da, &dr, &z1, &y1, &z2, &y2}) ASSERT_EQ(gpu.alloc(bytes, q), DST_OK);
                for (void **q : {&dg, &db}) ASSERT_EQ(gpu.alloc(size_t(h) * es, q), DST_OK);
                for (void **q : {&m1, &s1, &m2, &s2}) ASSERT_EQ(gpu.alloc(size_t(n) * 4, q), DST_OK);
                ASSERT_EQ(gpu.alloc(size_t(n) * 4, &drows), DST_OK);
                ASSERT_EQ(gpu.copy(da, a.data(), bytes, CopyKind::HostToDevice), DST_OK);
                ASSERT_EQ(gpu.copy(dr, r.data(), bytes, CopyKind::HostToDevice), DST_OK);
                ASSERT_EQ(gpu.copy(dg, g.data(), size_t(h) * es, CopyKind::HostToDevice), DST_OK);
                ASSERT_EQ(gpu.copy(db, b.data(), size_t(h) * es, CopyKind::HostToDevice), DST_OK);
                ASSERT_EQ(gpu.copy(drows, rows.data(), size_t(n) * 4, CopyKind::HostToDevice), DST_OK);
                DropoutSite site = make_site(0.1, 0xabcdefull, 4096);
                if (mapped) site.rows = static_cast<const int32_t *>(drows), site.row_len = h;
                ASSERT_EQ(gpu.dropout_residual_layernorm_fwd(dt, da, dr, z1, dg, db, y1, m1, s1, n, h, 1e-12, site),
                          DST_OK);
                ASSERT_EQ(gpu.dropout_residual_fwd(dt, da, dr, z2, count, site), DST_OK);
                ASSERT_EQ(gpu.layernorm_fwd(dt, z2, dg, db, y2, m2, s2, n, h, 1e-12), DST_OK);
                auto host = [&](const void *d, size_t nb) {
                    std::vector<unsigned char> v(nb);
                    EXPECT_EQ(gpu.copy(v.data(), d, nb, CopyKind::DeviceToHost), DST_OK);
                    return v;
                };
                EXPECT_EQ(host(z1, bytes), host(z2, bytes)) << "z";
                EXPECT_EQ(host(y1, bytes), host(y2, bytes)) << "y";
                EXPECT_EQ(host(m1, size_t(n) * 4), host(m2, size_t(n) * 4)) << "mean";
                EXPECT_EQ(host(s1, size_t(n) * 4), host(s2, size_t(n) * 4)) << "rstd";
                for (void *q : {da, dr, dg, db, drows, z1, y1, m1, s1, z2, y2, m2, s2}) gpu.free(q);
            }
}

// The bias gradient's column sums: the vector pass (16-byte rows), the element-by-element pass (dy
// off the 16-byte grid) and gelu_bwd_bias_grad's fused pass over the gradient it writes sum every
// column in the same order (kernels/column_partial.cuh), so all three give the same bits, and
// gelu_bwd_bias_grad's du is gelu_bwd's. Each against the fp64 sum, writing and accumulating.
TEST(CudaBackend, BiasGradientPathsSameBits) {
    if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
    auto be = cuda_backend();
    ASSERT_TRUE(be);
    const int64_t n = 1031, m = 520;
    for (dst_dtype dt : {DST_DTYPE_FP32, DST_DTYPE_FP16, DST_DTYPE_BF16}) {
        SCOPED_TRACE("dtype " + std::to_string(static_cast<int>(dt)));
        const size_t es = dst_dtype_size(dt);
        HostBuf dg(dt, n * m), u(dt, n * m), db0(dt, m);
        std::mt19937_64 rng(11);
        std::uniform_real_distribution<double> uni(-1.0, 1.0);
        for (int64_t i = 0; i < n * m; ++i) {
            dg.set(i, uni(rng));
            u.set(i, 4.0 * uni(rng));
        }
        for (int64_t j = 0; j < m; ++j) db0.set(j, uni(rng));
        // Buffers with 16 spare bytes: +0 is 16-byte aligned, +es is not.
        void *ddg = nullptr, *du_ref = nullptr, *du_mis = nullptr, *du_fused = nullptr, *dgu = nullptr, *ddb = nullptr;
        for (void **q : {&ddg, &du_ref, &du_mis, &du_fused, &dgu}) ASSERT_EQ(be->alloc(n * m * es + 16, q), DST_OK);
        ASSERT_EQ(be->alloc(4 * m * es, &ddb), DST_OK);
        ASSERT_EQ(be->copy(ddg, dg.data(), dg.bytes.size(), CopyKind::HostToDevice), DST_OK);
        ASSERT_EQ(be->copy(dgu, u.data(), u.bytes.size(), CopyKind::HostToDevice), DST_OK);
        // du = dg·GELU'(u) by gelu_bwd, aligned and shifted by one element (the element-by-element pass).
        char *mis = static_cast<char *>(du_mis) + es;
        ASSERT_EQ(be->gelu_bwd(dt, DST_GELU_ERF, ddg, dgu, du_ref, n * m), DST_OK);
        ASSERT_EQ(be->copy(mis, du_ref, n * m * es, CopyKind::DeviceToDevice), DST_OK);
        HostBuf du(dt, n * m);
        ASSERT_EQ(be->copy(du.data(), du_ref, du.bytes.size(), CopyKind::DeviceToHost), DST_OK);
        for (bool acc : {false, true}) {
            SCOPED_TRACE(acc ? "accumulating" : "writing");
            HostBuf got[4] = {HostBuf(dt, m), HostBuf(dt, m), HostBuf(dt, m), HostBuf(dt, m)};
            void *db[4];
            for (int r = 0; r < 4; ++r) {
                db[r] = static_cast<char *>(ddb) + r * m * es;
                ASSERT_EQ(be->copy(db[r], db0.data(), db0.bytes.size(), CopyKind::HostToDevice), DST_OK);
            }
            ASSERT_EQ(be->linear_bwd_weight(dt, du_ref, nullptr, nullptr, db[0], n, 0, m, acc), DST_OK);
            ASSERT_EQ(be->linear_bwd_weight(dt, mis, nullptr, nullptr, db[1], n, 0, m, acc), DST_OK);
            ASSERT_EQ(be->gelu_bwd_bias_grad(dt, DST_GELU_ERF, ddg, dgu, du_fused, n, m, db[2], acc), DST_OK);
            ASSERT_EQ(be->linear_bwd_weight(dt, du_ref, nullptr, nullptr, db[3], n, 0, m, acc), DST_OK);  // again
            for (int r = 0; r < 4; ++r)
                ASSERT_EQ(be->copy(got[r].data(), db[r], got[r].bytes.size(), CopyKind::DeviceToHost), DST_OK);
            HostBuf fused(dt, n * m);
            ASSERT_EQ(be->copy(fused.data(), du_fused, fused.bytes.size(), CopyKind::DeviceToHost), DST_OK);
            EXPECT_EQ(fused.bytes, du.bytes) << "gelu_bwd_bias_grad's du";
            EXPECT_EQ(got[1].bytes, got[0].bytes) << "element-by-element pass";
            EXPECT_EQ(got[2].bytes, got[0].bytes) << "fused pass";
            EXPECT_EQ(got[3].bytes, got[0].bytes) << "second run";
            const double tol = dt == DST_DTYPE_FP32 ? 1e-5 : dt == DST_DTYPE_FP16 ? 2e-3 : 1.6e-2;
            for (int64_t j = 0; j < m; ++j) {
                double want = acc ? db0.get(j) : 0.0;
                for (int64_t i = 0; i < n; ++i) want += du.get(i * m + j);
                // one rounding to the storage dtype of a sum of up to ~50 in magnitude
                EXPECT_NEAR(got[0].get(j), want, tol * (1.0 + std::fabs(want))) << "column " << j;
            }
        }
        for (void *q : {ddg, du_ref, du_mis, du_fused, dgu, ddb}) be->free(q);
    }
}

// The inputs of a LayerNorm backward on the GPU for the tests below: dy and dresid uniform in (−1, 1),
// x in (−2, 2), γ in (0.5, 1.5), β in (−1, 1) (drawn interleaved from one stream), the forward's
// statistics, and v0 (old values for the accumulated gradients, on the host). dev() allocates a device
// buffer (copied from host bytes when given); the rig frees them all.
struct LnBwdRig {
    Backend &gpu;
    const dst_dtype dt;
    const int64_t n, h, count;
    const size_t bytes, vb;
    HostBuf v0;
    bool ok = true;
    std::vector<void *> bufs;
    void *dy = nullptr, *x = nullptr, *dresid = nullptr, *gamma = nullptr, *beta = nullptr, *y = nullptr;
    void *mean = nullptr, *rstd = nullptr;

    LnBwdRig(Backend &g, dst_dtype d, int64_t rows, int64_t width, uint64_t seed)
        : gpu(g), dt(d), n(rows), h(width), count(rows * width), bytes(size_t(count) * dst_dtype_size(d)),
          vb(size_t(width) * dst_dtype_size(d)), v0(d, width) {
        HostBuf hdy(dt, count), hx(dt, count), hdr(dt, count), hg(dt, h), hb(dt, h);
        std::mt19937_64 rng(seed);
        std::uniform_real_distribution<double> u(-1.0, 1.0);
        for (int64_t i = 0; i < count; ++i) hdy.set(i, u(rng)), hx.set(i, 2 * u(rng)), hdr.set(i, u(rng));
        for (int64_t i = 0; i < h; ++i) hg.set(i, 1.0 + 0.5 * u(rng)), hb.set(i, u(rng)), v0.set(i, u(rng));
        dy = dev(bytes, hdy.data()), x = dev(bytes, hx.data()), dresid = dev(bytes, hdr.data());
        gamma = dev(vb, hg.data()), beta = dev(vb, hb.data()), y = dev(bytes);
        mean = dev(size_t(n) * 4), rstd = dev(size_t(n) * 4);
        ok = ok && gpu.layernorm_fwd(dt, x, gamma, beta, y, mean, rstd, n, h, 1e-12) == DST_OK;
    }
    ~LnBwdRig() {
        for (void *q : bufs) gpu.free(q);
    }
    void *dev(size_t nb, const void *from = nullptr) {
        void *q = nullptr;
        ok = ok && gpu.alloc(nb, &q) == DST_OK;
        if (q && from) ok = ok && gpu.copy(q, from, nb, CopyKind::HostToDevice) == DST_OK;
        bufs.push_back(q);
        return q;
    }
    std::vector<unsigned char> host(const void *d, size_t nb) {
        std::vector<unsigned char> v(nb);
        EXPECT_EQ(gpu.copy(v.data(), d, nb, CopyKind::DeviceToHost), DST_OK);
        return v;
    }
};

// The backward passes that also take a bias gradient give the bits of their separate passes:
// dropout_bwd_bias_grad (one pass where rows are 16-byte vectors) is dropout_bwd then the column sums of
// dx, and layernorm_dropout_bwd_bias_grad is layernorm_dropout_bwd with the column sums of the branch it
// stored. n = 1031 ends inside a row chunk; writing and accumulating.
TEST(CudaBackend, BackwardBiasGradientsAreColumnSums) {
    if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
    Backend &gpu = *backends().gpu;
    const int64_t n = 1031;
    for (dst_dtype dt : {DST_DTYPE_FP32, DST_DTYPE_FP16, DST_DTYPE_BF16})
        for (bool acc : {false, true}) {
            const int64_t h = dt == DST_DTYPE_FP32 ? 512 : 1024, count = n * h;
            SCOPED_TRACE(std::string(dst_dtype_string(dt)) + (acc ? " accumulating" : " writing"));
            LnBwdRig r(gpu, dt, n, h, 5 + h);
            ASSERT_TRUE(r.ok);
            const size_t bytes = r.bytes, vb = r.vb;
            const void *v0 = r.v0.bytes.data();
            auto dev = [&](size_t nb, const void *from = nullptr) { return r.dev(nb, from); };
            auto host = [&](const void *d, size_t nb) { return r.host(d, nb); };
            const std::vector<unsigned char> start = r.v0.bytes;
            void *ddy = r.dy, *xin = r.x, *ddr = r.dresid, *dg = r.gamma, *db = r.beta, *mean = r.mean, *rstd = r.rstd;
            const DropoutSite site = make_site(0.1, 0xc0ffeeull + h, 99);

            void *t1 = dev(bytes), *t2 = dev(bytes), *b1 = dev(vb, v0), *b2 = dev(vb, v0);
            ASSERT_EQ(gpu.dropout_bwd_bias_grad(dt, ddy, t1, n, h, site, b1, acc), DST_OK);
            ASSERT_EQ(gpu.dropout_bwd(dt, ddy, t2, count, site), DST_OK);
            ASSERT_EQ(gpu.linear_bwd_weight(dt, t2, nullptr, nullptr, b2, n, 0, h, acc), DST_OK);
            EXPECT_EQ(host(t1, bytes), host(t2, bytes)) << "dropout_bwd_bias_grad's dx";
            EXPECT_EQ(host(b1, vb), host(b2, vb)) << "dropout_bwd_bias_grad's bias gradient";
            EXPECT_NE(host(b1, vb), start) << "the bias gradient was not written";

            void *ox = dev(bytes), *br = dev(bytes), *dgam = dev(vb, v0), *dbet = dev(vb, v0);
            void *bias = dev(vb, v0), *bias_ref = dev(vb, v0);
            ASSERT_EQ(gpu.layernorm_dropout_bwd_bias_grad(dt, ddy, xin, false, dg, db, mean, rstd, ddr, ox, dgam, dbet,
                                                          n, h, acc, site, br, bias),
                      DST_OK);
            ASSERT_EQ(gpu.linear_bwd_weight(dt, br, nullptr, nullptr, bias_ref, n, 0, h, acc), DST_OK);
            EXPECT_EQ(host(bias, vb), host(bias_ref, vb)) << "the branch's bias gradient";
            EXPECT_NE(host(bias, vb), start) << "the branch's bias gradient was not written";
            void *ox2 = dev(bytes), *br2 = dev(bytes), *dgam2 = dev(vb, v0), *dbet2 = dev(vb, v0);
            ASSERT_EQ(gpu.layernorm_dropout_bwd(dt, ddy, xin, false, dg, db, mean, rstd, ddr, ox2, dgam2, dbet2, n, h,
                                                acc, site, br2),
                      DST_OK);
            EXPECT_EQ(host(ox, bytes), host(ox2, bytes)) << "dx";
            EXPECT_EQ(host(br, bytes), host(br2, bytes)) << "branch";
            EXPECT_EQ(host(dgam, vb), host(dgam2, vb)) << "dgamma";
            EXPECT_EQ(host(dbet, vb), host(dbet2, vb)) << "dbeta";
        }
}

// The one-pass LayerNorm backward (CudaBackend::set_layernorm_one_pass, 2 and 4 warps per row) against
// the separate passes on the same inputs: the γ and β column sums are added in the same order (the
// chunks and row lanes of kernels/column_partial.cuh, dy·x̂ by one fma), so the same bits, and the bias
// gradient is column_sum's over the branch it stored; dx and the branch differ only by the order of the
// two row sums inside a row (within 2 units in the last place of the storage type, a tiny absolute
// floor), and the branch drops the same elements. The
// layer's LN2 form (dresid, dropout branch, bias gradient) and LN1 form (dresid only), writing and
// accumulating; n = 1031 ends inside a row chunk.
TEST(CudaBackend, LayerNormOnePassGivesThePassesSums) {
    if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
    auto *gpu = dynamic_cast<dst::CudaBackend *>(backends().gpu.get());
    ASSERT_NE(gpu, nullptr);
    const int64_t n = 1031;
    for (dst_dtype dt : {DST_DTYPE_FP32, DST_DTYPE_FP16, DST_DTYPE_BF16})
        for (int split : {2, 4})
            for (bool ln2 : {true, false})
                for (bool acc : {false, true}) {
                    const int64_t h = dt == DST_DTYPE_FP32 ? 512 : 1024, count = n * h;
                    SCOPED_TRACE(std::string(dst_dtype_string(dt)) + " split " + std::to_string(split) +
                                 (ln2 ? " LN2" : " LN1") + (acc ? " accumulating" : " writing"));
                    LnBwdRig r(*gpu, dt, n, h, 11 + h + split);
                    ASSERT_TRUE(r.ok);
                    const size_t bytes = r.bytes, vb = r.vb;
                    auto dev = [&](size_t nb, const void *from = nullptr) { return r.dev(nb, from); };
                    auto host = [&](const void *d, int64_t cnt) {
                        HostBuf hb(dt, cnt);
                        hb.bytes = r.host(d, hb.bytes.size());
                        return hb;
                    };
                    void *ddy = r.dy, *xin = r.x, *ddr = r.dresid, *dg = r.gamma, *db = r.beta, *mean = r.mean,
                         *rstd = r.rstd;
                    const void *v0 = r.v0.bytes.data();
                    const DropoutSite site = make_site(0.1, 0xbeefull + h, 7);
                    // [0]: the separate passes, [1]: the one-pass form.
                    void *dx[2], *br[2], *dgam[2], *dbet[2], *bias[2];
                    for (int f = 0; f < 2; ++f) {
                        dx[f] = dev(bytes), br[f] = dev(bytes);
                        dgam[f] = dev(vb, v0), dbet[f] = dev(vb, v0), bias[f] = dev(vb, v0);
                        // with_ln_form: the call must have taken the form asked for
                        const dst_status st = with_ln_form(*gpu, f ? split : 0, [&] {
                            return ln2 ? gpu->layernorm_dropout_bwd_bias_grad(dt, ddy, xin, false, dg, db, mean, rstd,
                                                                              ddr, dx[f], dgam[f], dbet[f], n, h, acc,
                                                                              site, br[f], bias[f])
                                       : gpu->layernorm_bwd(dt, ddy, xin, false, dg, db, mean, rstd, ddr, dx[f],
                                                            dgam[f], dbet[f], n, h, acc);
                        });
                        ASSERT_EQ(st, DST_OK) << dst_last_error();
                    }
                    EXPECT_EQ(host(dgam[1], h).bytes, host(dgam[0], h).bytes) << "dgamma";
                    EXPECT_EQ(host(dbet[1], h).bytes, host(dbet[0], h).bytes) << "dbeta";
                    if (ln2) {  // the column sums of the branch the one-pass form stored (its dx may differ)
                        void *bias_ref = dev(vb, v0);
                        ASSERT_EQ(gpu->linear_bwd_weight(dt, br[1], nullptr, nullptr, bias_ref, n, 0, h, acc), DST_OK);
                        EXPECT_EQ(host(bias[1], h).bytes, host(bias_ref, h).bytes) << "the branch's bias gradient";
                    }
                    const double ulp = dt == DST_DTYPE_FP32 ? 0x1p-23 : dt == DST_DTYPE_FP16 ? 0x1p-10 : 0x1p-7;
                    for (int which = 0; which < (ln2 ? 2 : 1); ++which) {
                        const HostBuf a = host(which ? br[1] : dx[1], count), r = host(which ? br[0] : dx[0], count);
                        int64_t off = 0, drops = 0;
                        for (int64_t i = 0; i < count; ++i) {
                            const double av = a.get(i), rv = r.get(i);
                            off += !(std::fabs(av - rv) <= 2 * ulp * std::fabs(rv) + 1e-6);
                            drops += (av == 0.0) != (rv == 0.0);
                        }
                        EXPECT_EQ(off, 0) << (which ? "branch" : "dx") << ": elements beyond 2 ulps";
                        if (which) {
                            EXPECT_EQ(drops, 0) << "branch: elements dropped in one form only";
                        }
                    }
                }
}

// Which configuration a fused GELU GEMM backward takes (host arithmetic): the kernels without a cluster only
// where the library's pairs of blocks need one more round of 128×256 tiles than single blocks. The row
// counts are those the lab timed on an H100 (132 multiprocessors, 4096 columns: 5203 rows took 101.7 µs
// paired against 90.9 single, 5120 rows 85.8 against 93.1); an even row-tile count never takes them.
TEST(CudaBackend, FusedGeluGemmsRunUnclusteredWhereThePairsCostARound) {
    struct P { int64_t rows, cols; int sms; bool single; };
    const P probs[] = {{5203, 4096, 132, true},  {5248, 4096, 132, true},  {5120, 4096, 132, false},
                       {8192, 4096, 132, false}, {8195, 4096, 132, false}, {2100, 4096, 132, false},
                       {4200, 4096, 132, true},  {4200, 4096, 114, false}, {1, 8, 132, false},
                       {0, 4096, 132, false},    {5203, 0, 132, false},    {5203, 4096, 1, false}};
    for (const P &p : probs)
        EXPECT_EQ(dst::cuda::gemm_gelu_unclustered(p.rows, p.cols, p.sms), p.single)
            << p.rows << " rows, " << p.cols << " columns, " << p.sms << " SMs";
    for (int sms : {114, 132, 144})
        for (int64_t tiles = 2; tiles <= 200; tiles += 2)
            for (int64_t cols : {520, 1024, 3072, 4096})
                EXPECT_FALSE(dst::cuda::gemm_gelu_unclustered(tiles * 128, cols, sms))
                    << tiles << " row tiles (even), " << cols << " columns, " << sms << " SMs";
}

// Which problems the fused GELU GEMMs take (host code: runs without a GPU too): every shape the
// library's rule admits (FP16/BF16, k and m multiples of 8, any n) must be one CUTLASS's can_implement()
// accepts for each of the three kernels, with no workspace, since gemm_gelu_shape_ok asks it; the
// others are refused before CUTLASS is asked. A rule wider than CUTLASS's would make a call fail at
// run time instead of taking the cuBLASLt path.
TEST(CudaBackend, FusedGeluGemmShapesAreWhatCutlassAccepts) {
    if (!dst::CudaBackend::fused_gemm_built()) GTEST_SKIP() << "built without the fused GELU GEMMs (no CUTLASS)";
    struct P { int64_t n, k, m; bool ok; };
    const P probs[] = {{1, 8, 8, true},           {7, 8, 16, true},         {129, 96, 200, true},
                       {136, 72, 264, true},      {8192, 1024, 4096, true}, {8192, 4096, 1024, true},
                       {65536, 1024, 3072, true}, {1, 4104, 8, true},       {8, 12, 8, false},
                       {8, 8, 20, false},         {0, 8, 8, false},         {8, 0, 8, false},
                       {8, 8, -8, false}};
    for (dst_dtype dt : {DST_DTYPE_FP16, DST_DTYPE_BF16, DST_DTYPE_FP32, DST_DTYPE_FP64})
        for (auto kind : {dst::cuda::kGeluForwardAux, dst::cuda::kGeluForward, dst::cuda::kGeluBackward})
            for (const P &p : probs) {
                const bool want = p.ok && (dt == DST_DTYPE_FP16 || dt == DST_DTYPE_BF16);
                EXPECT_EQ(dst::cuda::gemm_gelu_shape_ok(dt, kind, p.n, p.k, p.m), want)
                    << dst_dtype_string(dt) << " kind " << int(kind) << " n " << p.n << " k " << p.k << " m " << p.m;
            }
}

// The scratch a layer call is counted for (dst_layer_config_workspace_bytes adds cuda_scratch_bytes) covers
// the fused FC2 data gradient's per-tile column sums, which outgrow every other need at large token
// counts (at 2^20 tokens and I = 4096: 128 MiB against the GEMM library's 32), and the need follows the
// token count. Host code: runs without a GPU.
TEST(CudaBackend, ScratchCountsTheDgeluTileSums) {
    if (!dst::CudaBackend::fused_gemm_built()) GTEST_SKIP() << "built without the fused GELU GEMMs (no CUTLASS)";
    dst::ScratchNeeds n;
    n.dt = DST_DTYPE_FP16;
    n.gemm = true;
    n.rows = int64_t(1) << 20;
    n.colsum_width = 4096;
    const size_t without = dst::cuda_scratch_bytes(n);
    n.dgelu_width = 4096;
    const size_t with = dst::cuda_scratch_bytes(n), tiles = dst::cuda::dgelu_partial_bytes(n.rows, 4096);
    EXPECT_EQ(tiles, size_t(8192) * 4096 * sizeof(float));
    EXPECT_GE(with, tiles);
    EXPECT_LT(without, tiles) << "the case no longer tells whether the tile sums are counted";
    // Partial tiles: 129 rows and k = 264 take two row tiles of 512 floats.
    EXPECT_EQ(dst::cuda::dgelu_partial_bytes(129, 264), size_t(2) * 512 * sizeof(float));
    EXPECT_EQ(dst::cuda::dgelu_partial_bytes(0, 264), size_t(0));
}

// The fused GELU GEMMs (CudaBackend::set_fused_gemm, kernels/gemm_gelu.cuh) against the unfused ops on
// inputs whose GEMM sums are exact in fp32 in any order (multiples of 1/32 below 8 in magnitude, exact
// in BF16 too): since the epilogues compute GELU and GELU' with the elementwise maps' code on the same
// stored values, u, y = GELU(u) (also from the inference form, which stores no u) and du = dg·GELU'(u)
// must be the same bits. The bias gradient (written and accumulated) sums the same stored du in another
// order (the fused kernel's per-tile sums, then the tiles; the unfused path column_sum's chunks): both
// must lie within fp32 summation's bound, plus one rounding to the storage type, of the exact column
// sums of du, and the fused one must be the same bits when the call is repeated. Shapes that leave the
// tiles (128×128 forward, 128×256 backward) partly empty (rows and columns) and give a block several tiles.
TEST(CudaBackend, FusedGeluGemmsGiveTheUnfusedBits) {
    if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
    if (!dst::CudaBackend::fused_gemm_built()) GTEST_SKIP() << "built without the fused GELU GEMMs (no CUTLASS)";
    auto be = cuda_backend();
    ASSERT_TRUE(be);
    // Dyadic values from a hash of the index: x, dy in {0, ±1/4, ±1/2}, W in {0, ±1/8}, b in {0, ±1/16, ±1/8}.
    auto level = [](int64_t i, uint64_t salt, int levels) {
        uint64_t h = (static_cast<uint64_t>(i) + salt) * 0x9E3779B97F4A7C15ull;
        h ^= h >> 29;
        return static_cast<int>(h % static_cast<uint64_t>(levels)) - levels / 2;
    };
    struct Shape { int64_t n, k, m; };  // the forward's; the backward's is (n, m, k): FC2 of the same layer
    std::vector<Shape> shapes = {{136, 72, 264}, {1032, 64, 520}};
    // A row count at which this device's backward calls run the kernels without a cluster
    // (gemm_gelu_unclustered): the smallest odd row-tile count for 4096 columns that takes them (4196 rows
    // on 132 multiprocessors).
    int sms = 0;
    ASSERT_EQ(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0), cudaSuccess);
    for (int64_t rows = 100; rows < 128 * 512; rows += 256)  // 2j + 1 row tiles, the last one partial
        if (dst::cuda::gemm_gelu_unclustered(rows, 4096, sms)) {
            shapes.push_back({rows, 64, 4096});
            break;
        }
    ASSERT_EQ(shapes.size(), 3u) << "no row count below 65536 takes the unclustered kernels on " << sms << " SMs";
    for (dst_dtype dt : {DST_DTYPE_FP16, DST_DTYPE_BF16})
        for (dst_gelu form : {DST_GELU_ERF, DST_GELU_TANH})
            for (const Shape &s : shapes) {
                SCOPED_TRACE(std::string(dst_dtype_string(dt)) + (form == DST_GELU_ERF ? " erf" : " tanh") + " n" +
                             std::to_string(s.n) + " k" + std::to_string(s.k) + " m" + std::to_string(s.m));
                const int64_t n = s.n, k = s.k, m = s.m;
                const size_t es = dst_dtype_size(dt);
                HostBuf x(dt, n * k), w(dt, m * k), b(dt, m), dy(dt, n * k), w2(dt, k * m), u2(dt, n * m),
                    db0(dt, m);
                for (int64_t i = 0; i < n * k; ++i) x.set(i, level(i, 1, 5) / 4.0), dy.set(i, level(i, 2, 5) / 4.0);
                for (int64_t i = 0; i < m * k; ++i) w.set(i, level(i, 3, 3) / 8.0), w2.set(i, level(i, 4, 3) / 8.0);
                for (int64_t j = 0; j < m; ++j) b.set(j, level(j, 5, 5) / 16.0), db0.set(j, level(j, 6, 9) / 2.0);
                std::mt19937_64 rng(7);
                std::uniform_real_distribution<double> uni(-5.0, 5.0);
                for (int64_t i = 0; i < n * m; ++i) u2.set(i, uni(rng));
                DeviceBufs bufs(*be, es);
                void *dx = bufs.get(n * k, &x), *dw = bufs.get(m * k, &w), *dbias = bufs.get(m, &b),
                     *ddy = bufs.get(n * k, &dy), *dw2 = bufs.get(k * m, &w2), *du2 = bufs.get(n * m, &u2);
                void *y[2], *u[2], *du[2], *dg = bufs.get(n * m), *db[2], *y_only = bufs.get(n * m);
                for (int f = 0; f < 2; ++f) {
                    y[f] = bufs.get(n * m), u[f] = bufs.get(n * m), du[f] = bufs.get(n * m);
                    db[f] = bufs.get(m);
                }
                const void *fwd_ptrs[] = {dx, dw, dbias, y[1], u[1]};
                if (!dst::cuda::gemm_gelu_runs(dt, dst::cuda::kGeluForwardAux, n, k, m, fwd_ptrs, 5)) {
                    GTEST_SKIP() << "the fused GELU GEMMs do not run on this device (compute capability 9.0 only)";
                }
                auto get = [&](void *p, int64_t count) {
                    HostBuf h(dt, count);
                    EXPECT_EQ(be->copy(h.data(), p, h.bytes.size(), CopyKind::DeviceToHost), DST_OK);
                    return h;
                };
                for (bool acc : {false, true}) {
                    SCOPED_TRACE(acc ? "accumulating the bias gradient" : "writing the bias gradient");
                    for (int f = 0; f < 2; ++f) {
                        be->set_fused_gemm(f == 1);
                        const int64_t before = be->fused_gemm_calls();
                        ASSERT_EQ(be->linear_fwd(dt, dx, dw, dbias, y[f], n, k, m, &form, u[f]), DST_OK)
                            << dst::last_error();
                        if (f == 1) {  // the inference form: y alone
                            ASSERT_EQ(be->linear_fwd(dt, dx, dw, dbias, y_only, n, k, m, &form, nullptr), DST_OK)
                                << dst::last_error();
                        }
                        ASSERT_EQ(be->copy(db[f], db0.data(), db0.bytes.size(), CopyKind::HostToDevice), DST_OK);
                        // FC2's data gradient: dy [n, k]·W2 [k, m] → du [n, m], with u2 as the pre-activation.
                        ASSERT_EQ(be->linear_bwd_data_gelu(dt, form, ddy, dw2, du2, dg, du[f], n, m, k, db[f], acc),
                                  DST_OK)
                            << dst::last_error();
                        EXPECT_EQ(be->fused_gemm_calls(), before + (f == 1 ? 3 : 0)) << "fused kernels run";
                        be->set_fused_gemm(false);
                    }
                    ASSERT_EQ(be->synchronize(), DST_OK);
                    EXPECT_EQ(get(u[1], n * m).bytes, get(u[0], n * m).bytes) << "u (pre-activation)";
                    EXPECT_EQ(get(y[1], n * m).bytes, get(y[0], n * m).bytes) << "y = GELU(u)";
                    EXPECT_EQ(get(y_only, n * m).bytes, get(y[0], n * m).bytes) << "y = GELU(u), u not stored";
                    const HostBuf du_f = get(du[1], n * m);
                    EXPECT_EQ(du_f.bytes, get(du[0], n * m).bytes) << "du = dg·GELU'(u)";
                    // The fused call again, into a fresh gradient (the same bits), and with the bias gradient
                    // from column_sum over du instead of the tile sums (the unfused path's bits).
                    void *db_again = bufs.get(m), *db_pass = bufs.get(m), *du_again = bufs.get(n * m);
                    be->set_fused_gemm(true);
                    for (void *d : {db_again, db_pass}) {
                        ASSERT_EQ(be->copy(d, db0.data(), db0.bytes.size(), CopyKind::HostToDevice), DST_OK);
                        be->set_dgelu_tile_sums(d == db_again);
                        ASSERT_EQ(be->linear_bwd_data_gelu(dt, form, ddy, dw2, du2, dg, du_again, n, m, k, d, acc),
                                  DST_OK)
                            << dst::last_error();
                    }
                    be->set_dgelu_tile_sums(true);
                    be->set_fused_gemm(false);
                    const HostBuf db_f = get(db[1], m), db_u = get(db[0], m);
                    EXPECT_EQ(get(db_again, m).bytes, db_f.bytes) << "the fused bias gradient, run twice";
                    EXPECT_EQ(get(db_pass, m).bytes, db_u.bytes) << "the fused path's column_sum bias gradient";
                    // fp32 sums of n + 1 terms: |error| ≤ (n + 1)·2⁻²⁴·Σ|terms| (a loose form of γ_n), then
                    // one rounding to the storage type (half an ulp: 2⁻¹¹ or 2⁻⁸ relative, 2⁻²⁵ absolute
                    // below FP16's normal range).
                    const double half_ulp = dt == DST_DTYPE_FP16 ? 0x1p-11 : 0x1p-8;
                    int64_t off_f = 0, off_u = 0;
                    for (int64_t j = 0; j < m; ++j) {
                        double ref = acc ? db0.get(j) : 0.0, mag = std::fabs(ref);
                        for (int64_t i = 0; i < n; ++i) {
                            ref += du_f.get(i * m + j);
                            mag += std::fabs(du_f.get(i * m + j));
                        }
                        const double bound = double(n + 1) * 0x1p-24 * mag + half_ulp * std::fabs(ref) + 0x1p-25;
                        off_f += !(std::fabs(db_f.get(j) - ref) <= bound);
                        off_u += !(std::fabs(db_u.get(j) - ref) <= bound);
                    }
                    EXPECT_EQ(off_f, 0) << "fused bias gradient: columns beyond the summation bound";
                    EXPECT_EQ(off_u, 0) << "unfused bias gradient: columns beyond the summation bound";
                }
            }
}

// The whole layer with the fused GELU GEMMs (FC1 forward and FC2 data gradient: two fused calls per
// forward and backward) against the same layer unfused, on one CUDA context, the same parameters, inputs
// and RNG state (dropout on, key lengths; Pre-LN, and Post-LN with gelu_checkpoint, whose backward
// recomputes GELU before the fused call). Only those two GEMMs' summation orders differ, so every
// output and gradient is within the 16-bit design tolerance of the unfused layer (which the CudaLayer
// grid checks against fp64). 258 rows (not a multiple of 8), H = 96, I = 200.
TEST(CudaBackend, LayerWithFusedGeluGemmsMatchesUnfused) {
    if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
    if (!dst::CudaBackend::fused_gemm_built()) GTEST_SKIP() << "built without the fused GELU GEMMs (no CUTLASS)";
    const void *probe = reinterpret_cast<const void *>(uintptr_t(256));
    if (!dst::cuda::gemm_gelu_runs(DST_DTYPE_FP16, dst::cuda::kGeluForwardAux, 8, 8, 8, &probe, 1))
        GTEST_SKIP() << "the fused GELU GEMMs do not run on this device (compute capability 9.0 only)";
    dsttest::Ctx ctx = dsttest::make_cuda_ctx();
    ASSERT_TRUE(ctx);
    auto *cb = static_cast<dst::CudaBackend *>(ctx->impl->backend.get());
    const int B = 2, S = 129, H = 96;
    for (dst_dtype dt : {DST_DTYPE_FP16, DST_DTYPE_BF16})
        for (bool pre : {true, false}) {
            SCOPED_TRACE(std::string(dst_dtype_string(dt)) + (pre ? " Pre-LN" : " Post-LN, gelu_checkpoint"));
            dst_layer_config cfg = dsttest::small_config(H, 3, 200, dt);
            cfg.pre_layer_norm = pre;
            cfg.gelu_checkpoint = !pre;
            cfg.attn_dropout_ratio = cfg.hidden_dropout_ratio = 0.1f;
            cfg.max_batch_tokens = B * S;
            cfg.max_seq_len = S;
            dsttest::Layer layer = dsttest::make_layer(ctx.get(), cfg);
            ASSERT_TRUE(layer);
            dsttest::randomize_params(layer.get(), 31);
            dsttest::Rng rng(5);
            const std::vector<double> xs = rng.normals(size_t(B) * S * H), dys = rng.normals(size_t(B) * S * H);
            dsttest::HostTensor x = dsttest::HostTensor::from_doubles(dt, {B, S, H}, xs);
            dsttest::HostTensor dy = dsttest::HostTensor::from_doubles(dt, {B, S, H}, dys);
            dsttest::HostTensor lens(DST_DTYPE_INT32, {B});
            const int32_t lv[B] = {S, 77};
            std::memcpy(lens.data(), lv, sizeof lv);
            void *dev[5] = {};
            const size_t bytes = x.nbytes();
            for (int i = 0; i < 4; ++i) ASSERT_EQ(dst_malloc(ctx.get(), bytes, &dev[i]), DST_OK);
            ASSERT_EQ(dst_malloc(ctx.get(), sizeof lv, &dev[4]), DST_OK);
            ASSERT_EQ(dst_memcpy(ctx.get(), dev[0], x.data(), bytes, DST_COPY_HOST_TO_CONTEXT), DST_OK);
            ASSERT_EQ(dst_memcpy(ctx.get(), dev[2], dy.data(), bytes, DST_COPY_HOST_TO_CONTEXT), DST_OK);
            ASSERT_EQ(dst_memcpy(ctx.get(), dev[4], lv, sizeof lv, DST_COPY_HOST_TO_CONTEXT), DST_OK);
            dst_tensor xv = x.view(), yv = x.view(), dyv = dy.view(), dxv = dy.view();
            xv.data = dev[0], yv.data = dev[1], dyv.data = dev[2], dxv.data = dev[3];
            dst_mask mask = dsttest::mask_of(DST_MASK_KEY_LENGTHS, lens);
            mask.tensor.data = dev[4];
            struct Run { std::vector<double> y, dx; std::vector<std::vector<double>> grads; };
            Run r[2];
            for (int f = 0; f < 2; ++f) {
                cb->set_fused_gemm(f == 1);
                const int64_t before = cb->fused_gemm_calls();
                ASSERT_EQ(dst_context_set_rng_state(ctx.get(), 77, 1234), DST_OK);
                ASSERT_EQ(dst_layer_forward(layer.get(), nullptr, &xv, &mask, &yv), DST_OK) << dst_last_error();
                ASSERT_EQ(dst_layer_backward(layer.get(), nullptr, &dyv, &dxv, DST_GRAD_WRITE), DST_OK)
                    << dst_last_error();
                cb->set_fused_gemm(false);
                EXPECT_EQ(cb->fused_gemm_calls(), before + (f == 1 ? 2 : 0)) << "fused kernels run";
                dsttest::HostTensor y(dt, {B, S, H}), dx(dt, {B, S, H});
                ASSERT_EQ(dst_memcpy(ctx.get(), y.data(), dev[1], bytes, DST_COPY_CONTEXT_TO_HOST), DST_OK);
                ASSERT_EQ(dst_memcpy(ctx.get(), dx.data(), dev[3], bytes, DST_COPY_CONTEXT_TO_HOST), DST_OK);
                r[f] = {y.doubles(), dx.doubles(), dsttest::all_grads(layer.get())};
            }
            const double tol = dsttest::design_tolerance(dt);
            EXPECT_LE(dsttest::rel_l2(r[1].y, r[0].y), tol) << "output";
            EXPECT_LE(dsttest::rel_l2(r[1].dx, r[0].dx), tol) << "grad_input";
            for (int p = 0; p < DST_PARAM_COUNT; ++p)
                EXPECT_LE(dsttest::rel_l2(r[1].grads[p], r[0].grads[p]), tol) << dsttest::kParamNames[p];
            for (void *d : dev) dst_free(ctx.get(), d);
        }
}

// The backend times the FP16/BF16 GEMM algorithms of one kernel family (same algorithm id, no split-K)
// on the first call of a size class and keeps the fastest (DST_GEMM_TUNE=0: the heuristic's first).
// Every candidate sums in the same order, so the tuned backend gives the untuned one's bits: the
// layer's four linears (BERT-Large widths, 2048 rows), forward with the bias epilogue, data and weight
// gradients, and awkward sizes, each twice on the tuned backend (the first call times, the second
// runs the choice).
TEST(CudaBackend, TunedGemmAlgorithmsGiveTheHeuristicsBits) {
    if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
    auto make = [](bool tune) {
        if (tune) ::unsetenv("DST_GEMM_TUNE");
        else ::setenv("DST_GEMM_TUNE", "0", 1);
        std::unique_ptr<Backend> be = cuda_backend();
        ::unsetenv("DST_GEMM_TUNE");
        return be;
    };
    std::unique_ptr<Backend> plain = make(false), tuned = make(true);
    ASSERT_TRUE(plain && tuned);
    struct Lin {
        int64_t n, k, m;
    } lins[] = {{2048, 1024, 3072}, {2048, 1024, 1024}, {2048, 1024, 4096}, {2048, 4096, 1024}, {1000, 520, 1032}};
    for (dst_dtype dt : {DST_DTYPE_FP16, DST_DTYPE_BF16}) {
        for (const Lin &L : lins) {
            SCOPED_TRACE("dtype " + std::to_string(static_cast<int>(dt)) + " n " + std::to_string(L.n) + " k " +
                         std::to_string(L.k) + " m " + std::to_string(L.m));
            HostBuf x(dt, L.n * L.k), w(dt, L.m * L.k), b(dt, L.m), dy(dt, L.n * L.m);
            std::mt19937_64 rng(L.n + L.k + L.m);
            std::uniform_real_distribution<double> uni(-1.0, 1.0);
            for (HostBuf *h : {&x, &w, &b, &dy})
                for (int64_t i = 0; i < h->count; ++i) h->set(i, uni(rng));
            // outputs: y [n,m], dx [n,k], dw [m,k] per backend and run
            std::vector<unsigned char> out[2][2][3];
            for (int be_i = 0; be_i < 2; ++be_i) {
                Backend *be = be_i ? tuned.get() : plain.get();
                void *p[7] = {};
                const size_t es = dst_dtype_size(dt);
                const size_t sizes[7] = {x.bytes.size(), w.bytes.size(), b.bytes.size(), dy.bytes.size(),
                                         size_t(L.n * L.m) * es, size_t(L.n * L.k) * es, size_t(L.m * L.k) * es};
                for (int i = 0; i < 7; ++i) ASSERT_EQ(be->alloc(sizes[i], &p[i]), DST_OK);
                HostBuf *in[4] = {&x, &w, &b, &dy};
                for (int i = 0; i < 4; ++i)
                    ASSERT_EQ(be->copy(p[i], in[i]->data(), in[i]->bytes.size(), CopyKind::HostToDevice), DST_OK);
                for (int run = 0; run < 2; ++run) {
                    ASSERT_EQ(be->linear_fwd(dt, p[0], p[1], p[2], p[4], L.n, L.k, L.m, nullptr, nullptr), DST_OK);
                    ASSERT_EQ(be->linear_bwd_data(dt, p[3], p[1], p[5], L.n, L.k, L.m, nullptr), DST_OK);
                    ASSERT_EQ(be->linear_bwd_weight(dt, p[3], p[0], p[6], nullptr, L.n, L.k, L.m, false), DST_OK);
                    for (int o = 0; o < 3; ++o) {
                        out[be_i][run][o].resize(sizes[4 + o]);
                        ASSERT_EQ(be->copy(out[be_i][run][o].data(), p[4 + o], sizes[4 + o], CopyKind::DeviceToHost),
                                  DST_OK);
                    }
                }
                for (void *q : p) be->free(q);
            }
            const char *names[3] = {"y", "dx", "dw"};
            for (int o = 0; o < 3; ++o) {
                EXPECT_EQ(out[0][1][o], out[0][0][o]) << names[o] << ": untuned, second run";
                EXPECT_EQ(out[1][0][o], out[0][0][o]) << names[o] << ": tuned (first call, timing) against untuned";
                EXPECT_EQ(out[1][1][o], out[0][0][o]) << names[o] << ": tuned (the choice) against untuned";
            }
        }
    }
    const auto *t = dynamic_cast<const dst::CudaBackend *>(tuned.get());
    const auto *u = dynamic_cast<const dst::CudaBackend *>(plain.get());
    ASSERT_TRUE(t && u);
    EXPECT_EQ(u->gemm_classes_timed(), 0) << "DST_GEMM_TUNE=0 times nothing";
    EXPECT_GT(t->gemm_classes_timed(), 0) << "no size class had candidates: the test compared nothing tuned";
    std::printf("GEMM tuning: %d size classes timed, %d chose another algorithm than the heuristic's first\n",
                t->gemm_classes_timed(), t->gemm_classes_changed());
}

// The backend keeps each GEMM problem's cuBLASLt descriptors (and empties the cache after 1024 problems);
// only the bias pointer is set per call. Problems of one shape alternate between two biases (same
// alignment, so the same cached problem), across more distinct shapes than the cache holds, and then
// again after it was emptied: every output is the exact x·Wᵀ + b of its own call (small integers, so
// exact in every dtype).
TEST(CudaBackend, CachedGemmDescriptorsTakeEachCallsBias) {
    if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
    auto be = cuda_backend();
    ASSERT_TRUE(be);
    const int64_t k = 8, m = 24, shapes = 1032;  // more than the cache's 1024 problems
    for (dst_dtype dt : {DST_DTYPE_FP16, DST_DTYPE_FP32}) {
        SCOPED_TRACE("dtype " + std::to_string(static_cast<int>(dt)));
        HostBuf x(dt, shapes * k), w(dt, m * k), bias[2] = {HostBuf(dt, m), HostBuf(dt, m)};
        std::mt19937_64 rng(11);
        std::uniform_int_distribution<int> small(-2, 2);
        for (int64_t i = 0; i < x.count; ++i) x.set(i, small(rng));
        for (int64_t i = 0; i < w.count; ++i) w.set(i, small(rng));
        for (int64_t j = 0; j < m; ++j) {
            bias[0].set(j, 100 + j);
            bias[1].set(j, -50 - 2 * j);
        }
        const size_t es = dst_dtype_size(dt);
        void *px = nullptr, *pw = nullptr, *pb[2] = {}, *py = nullptr;
        ASSERT_EQ(be->alloc(x.bytes.size(), &px), DST_OK);
        ASSERT_EQ(be->alloc(w.bytes.size(), &pw), DST_OK);
        for (int i = 0; i < 2; ++i) ASSERT_EQ(be->alloc(bias[i].bytes.size(), &pb[i]), DST_OK);
        ASSERT_EQ(be->alloc(size_t(shapes * m) * es, &py), DST_OK);
        ASSERT_EQ(be->copy(px, x.data(), x.bytes.size(), CopyKind::HostToDevice), DST_OK);
        ASSERT_EQ(be->copy(pw, w.data(), w.bytes.size(), CopyKind::HostToDevice), DST_OK);
        for (int i = 0; i < 2; ++i)
            ASSERT_EQ(be->copy(pb[i], bias[i].data(), bias[i].bytes.size(), CopyKind::HostToDevice), DST_OK);
        HostBuf y(dt, shapes * m);
        std::vector<double> xw(size_t(shapes * m), 0.0);  // x·Wᵀ, exact
        for (int64_t r = 0; r < shapes; ++r)
            for (int64_t j = 0; j < m; ++j)
                for (int64_t t = 0; t < k; ++t) xw[size_t(r * m + j)] += x.get(r * k + t) * w.get(j * k + t);
        int64_t wrong = 0, checked = 0;
        auto run = [&](int64_t n, int which) {
            ASSERT_EQ(be->linear_fwd(dt, px, pw, pb[which], py, n, k, m, nullptr, nullptr), DST_OK);
            ASSERT_EQ(be->copy(y.data(), py, size_t(n * m) * es, CopyKind::DeviceToHost), DST_OK);
            for (int64_t r = 0; r < n; ++r)
                for (int64_t j = 0; j < m; ++j) {
                    const double want = bias[which].get(j) + xw[size_t(r * m + j)];
                    const double got = y.get(r * m + j);
                    if (got != want && wrong++ < 5)
                        ADD_FAILURE() << "n " << n << " bias " << which << " row " << r << " col " << j << ": " << got
                                      << ", expected " << want;
                    ++checked;
                }
        };
        for (int64_t n = 1; n <= shapes; ++n)
            for (int which : {0, 1}) run(n, which);
        for (int which : {1, 0}) run(3, which);  // a shape met before the cache was emptied
        EXPECT_EQ(wrong, 0) << "of " << checked << " outputs";
        for (void *q : {px, pw, pb[0], pb[1], py}) be->free(q);
    }
}

// Kernels launched as programmatic dependents (kernels/launch.cuh) wait for the kernel before them on
// the device. A chain in which every op reads what the previous one wrote, several in place, gives
// the same bits with no synchronisation between the ops as with one after each (the host then
// launches every kernel only after the previous one has finished).
TEST(CudaBackend, DependentLaunchChainSameBitsAsSynchronized) {
    if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
    auto be = cuda_backend();
    ASSERT_TRUE(be);
    const int64_t n = 4096, h = 1024, rounds = 12;
    for (dst_dtype dt : {DST_DTYPE_FP32, DST_DTYPE_BF16}) {
        SCOPED_TRACE("dtype " + std::to_string(static_cast<int>(dt)));
        const size_t es = dst_dtype_size(dt), cs = dt == DST_DTYPE_FP64 ? 8 : 4;
        HostBuf x0(dt, n * h), g0(dt, h), b0(dt, h);
        std::mt19937_64 rng(5);
        std::uniform_real_distribution<double> uni(-1.0, 1.0);
        for (int64_t i = 0; i < n * h; ++i) x0.set(i, 3.0 * uni(rng));
        for (int64_t j = 0; j < h; ++j) {
            g0.set(j, 1.0 + 0.25 * uni(rng));
            b0.set(j, 0.25 * uni(rng));
        }
        void *x = nullptr, *y = nullptr, *gamma = nullptr, *beta = nullptr, *mean = nullptr, *rstd = nullptr,
             *dg = nullptr, *dbt = nullptr, *db = nullptr;
        for (void **q : {&x, &y}) ASSERT_EQ(be->alloc(n * h * es, q), DST_OK);
        for (void **q : {&gamma, &beta, &dg, &dbt, &db}) ASSERT_EQ(be->alloc(h * es, q), DST_OK);
        for (void **q : {&mean, &rstd}) ASSERT_EQ(be->alloc(n * cs, q), DST_OK);
        ASSERT_EQ(be->copy(gamma, g0.data(), g0.bytes.size(), CopyKind::HostToDevice), DST_OK);
        ASSERT_EQ(be->copy(beta, b0.data(), b0.bytes.size(), CopyKind::HostToDevice), DST_OK);
        std::vector<unsigned char> out[2];
        for (int sync = 0; sync < 2; ++sync) {
            auto step = [&](dst_status st) {
                ASSERT_EQ(st, DST_OK);
                if (sync) {
                    ASSERT_EQ(be->synchronize(), DST_OK);
                }
            };
            ASSERT_EQ(be->copy(x, x0.data(), x0.bytes.size(), CopyKind::HostToDevice), DST_OK);
            ASSERT_EQ(be->zero(db, h * es), DST_OK);
            ASSERT_EQ(be->synchronize(), DST_OK);
            for (int64_t r = 0; r < rounds; ++r) {
                step(be->layernorm_fwd(dt, x, gamma, beta, y, mean, rstd, n, h, 1e-5));  // y = LN(x)
                step(be->gelu_fwd(dt, DST_GELU_ERF, y, x, n * h));                        // x = GELU(y)
                step(be->gelu_bwd(dt, DST_GELU_ERF, x, y, x, n * h));                     // x = x·GELU'(y), in place
                step(be->linear_bwd_weight(dt, x, nullptr, nullptr, db, n, 0, h, true));  // db += Σ rows of x
                // x = LN'(x) with y's statistics, in place (dx aliases dy), γ/β gradients first
                step(be->layernorm_bwd(dt, x, y, true, gamma, beta, mean, rstd, nullptr, x, dg, dbt, n, h, false));
                DropoutSite ds;
                ds.seed = 7;
                ds.offset = static_cast<uint64_t>(r);
                ds.threshold = dst::dropout_threshold(0.1);
                ds.scale = 1.0 / 0.9;
                step(be->dropout_residual_fwd(dt, y, x, x, n * h, ds));  // x = x + dropout(y), in place
            }
            ASSERT_EQ(be->synchronize(), DST_OK);
            HostBuf hx(dt, n * h), hdb(dt, h), hdg(dt, h);
            ASSERT_EQ(be->copy(hx.data(), x, hx.bytes.size(), CopyKind::DeviceToHost), DST_OK);
            ASSERT_EQ(be->copy(hdb.data(), db, hdb.bytes.size(), CopyKind::DeviceToHost), DST_OK);
            ASSERT_EQ(be->copy(hdg.data(), dg, hdg.bytes.size(), CopyKind::DeviceToHost), DST_OK);
            out[sync] = hx.bytes;
            out[sync].insert(out[sync].end(), hdb.bytes.begin(), hdb.bytes.end());
            out[sync].insert(out[sync].end(), hdg.bytes.begin(), hdg.bytes.end());
            bool finite = true;
            for (int64_t i = 0; i < n * h && finite; ++i) finite = std::isfinite(hx.get(i));
            EXPECT_TRUE(finite) << "the chain stays finite (else the comparison below is weak)";
        }
        EXPECT_TRUE(out[0] == out[1]) << "no synchronisation between the ops vs one after each";
        for (void *q : {x, y, gamma, beta, mean, rstd, dg, dbt, db}) be->free(q);
    }
}

// The fused GELU GEMMs (CUTLASS) as programmatic dependents: a chain in which our kernels read what a
// fused GEMM wrote and overwrite what it read, and a fused GEMM reads and overwrites what ours did, must
// give the same bits with no synchronisation as with one after each op (the kernels' own dependency
// waits are all that orders them).
TEST(CudaBackend, FusedGemmDependentChainSameBitsAsSynchronized) {
    if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
    if (!dst::CudaBackend::fused_gemm_built()) GTEST_SKIP() << "built without the fused GELU GEMMs (no CUTLASS)";
    auto be = cuda_backend();
    ASSERT_TRUE(be);
    be->set_fused_gemm(true);
    const int64_t n = 2056, h = 512, rounds = 6;
    const dst_dtype dt = DST_DTYPE_BF16;
    const dst_gelu form = DST_GELU_ERF;
    const size_t es = dst_dtype_size(dt);
    HostBuf x0(dt, n * h), w0(dt, h * h), w20(dt, h * h), b0(dt, h), g0(dt, h), bt0(dt, h);
    std::mt19937_64 rng(11);
    std::uniform_real_distribution<double> uni(-1.0, 1.0);
    for (int64_t i = 0; i < n * h; ++i) x0.set(i, uni(rng));
    for (int64_t i = 0; i < h * h; ++i) w0.set(i, 0.08 * uni(rng)), w20.set(i, 0.08 * uni(rng));
    for (int64_t j = 0; j < h; ++j) b0.set(j, 0.1 * uni(rng)), g0.set(j, 1.0 + 0.25 * uni(rng)), bt0.set(j, 0.1 * uni(rng));
    DeviceBufs bufs(*be, es), stats(*be, 4);
    void *x = bufs.get(n * h), *y = bufs.get(n * h), *u = bufs.get(n * h), *dg = bufs.get(n * h),
         *w = bufs.get(h * h, &w0), *w2 = bufs.get(h * h, &w20), *b = bufs.get(h, &b0), *gamma = bufs.get(h, &g0),
         *beta = bufs.get(h, &bt0), *db = bufs.get(h), *mean = stats.get(n), *rstd = stats.get(n);
    ASSERT_TRUE(mean && rstd);
    const void *ptrs[] = {x, w, b, y, u};
    if (!dst::cuda::gemm_gelu_runs(dt, dst::cuda::kGeluForwardAux, n, h, h, ptrs, 5)) {
        GTEST_SKIP() << "the fused GELU GEMMs do not run on this device (compute capability 9.0 only)";
    }
    std::vector<unsigned char> out[2];
    for (int sync = 0; sync < 2; ++sync) {
        auto step = [&](dst_status st) {
            ASSERT_EQ(st, DST_OK) << dst::last_error();
            if (sync) {
                ASSERT_EQ(be->synchronize(), DST_OK);
            }
        };
        ASSERT_EQ(be->copy(x, x0.data(), x0.bytes.size(), CopyKind::HostToDevice), DST_OK);
        ASSERT_EQ(be->zero(db, h * es), DST_OK);
        ASSERT_EQ(be->synchronize(), DST_OK);
        const int64_t before = be->fused_gemm_calls();
        for (int64_t r = 0; r < rounds; ++r) {
            step(be->linear_fwd(dt, x, w, b, y, n, h, h, &form, u));  // y = GELU(u), u = x·Wᵀ + b (fused)
            DropoutSite ds;
            ds.seed = 3;
            ds.offset = static_cast<uint64_t>(r);
            ds.threshold = dst::dropout_threshold(0.1);
            ds.scale = 1.0 / 0.9;
            step(be->dropout_residual_fwd(dt, y, x, x, n * h, ds));  // x += dropout(y): reads the GEMM's y
            // y = (x·W2)·GELU'(u) (fused; y overwritten after the pass above read it), db += Σ rows
            step(be->linear_bwd_data_gelu(dt, form, x, w2, u, dg, y, n, h, h, db, true));
            step(be->layernorm_fwd(dt, y, gamma, beta, x, mean, rstd, n, h, 1e-5));  // x = LN(y): x read by the GEMM
        }
        ASSERT_EQ(be->synchronize(), DST_OK);
        EXPECT_EQ(be->fused_gemm_calls(), before + 2 * rounds) << "the fused kernels ran every GEMM of the chain";
        HostBuf hx(dt, n * h), hdb(dt, h);
        ASSERT_EQ(be->copy(hx.data(), x, hx.bytes.size(), CopyKind::DeviceToHost), DST_OK);
        ASSERT_EQ(be->copy(hdb.data(), db, hdb.bytes.size(), CopyKind::DeviceToHost), DST_OK);
        bool finite = true;
        for (int64_t i = 0; i < n * h && finite; ++i) finite = std::isfinite(hx.get(i));
        for (int64_t j = 0; j < h && finite; ++j) finite = std::isfinite(hdb.get(j));
        EXPECT_TRUE(finite) << "the chain stays finite (else the comparison below is weak)";
        out[sync] = hx.bytes;
        out[sync].insert(out[sync].end(), hdb.bytes.begin(), hdb.bytes.end());
    }
    EXPECT_TRUE(out[0] == out[1]) << "no synchronisation between the ops vs one after each";
}

// The column sums' second pass (column_sum_finalize_chunks, kernels/column_partial.cuh) adds, per
// column, chunks y, y + 8, y + 16, … into row lane y's sum in that order, then the 8 lanes in order
// (then the old value, accumulating), in the compute type, rounded once; the loop is unrolled by the
// compiler (loads ahead of their adds). This checks the bits against that order computed here, at chunk
// counts that leave lanes empty (3), fill 16 per lane (128, the unroll), go one past (129) and beyond
// (300), with a width that is not a multiple of the 32-column tile and ld > m.
TEST(CudaBackend, ColumnFinalizeAddsEachLanesChunksInOrderThenTheLanes) {
    if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
    auto be = cuda_backend();
    ASSERT_TRUE(be);
    const int64_t m = 1000, ld = 1032;
    std::mt19937_64 rng(23);
    std::uniform_real_distribution<float> uni(-1.0f, 1.0f);
    for (dst_dtype dt : {DST_DTYPE_FP16, DST_DTYPE_BF16, DST_DTYPE_FP32})
        for (int64_t chunks : {3, 128, 129, 300})
            for (bool accumulate : {false, true}) {
                SCOPED_TRACE(std::string(dst_dtype_string(dt)) + " chunks " + std::to_string(chunks) +
                             (accumulate ? " accumulating" : ""));
                std::vector<float> part(static_cast<size_t>(chunks * ld));
                // Magnitudes over several binades, so that a changed order changes bits.
                for (float &v : part) v = uni(rng) * std::ldexp(1.0f, static_cast<int>(rng() % 12) - 6);
                HostBuf old(dt, m), want(dt, m), got(dt, m);
                for (int64_t j = 0; j < m; ++j) old.set(j, 4.0 * uni(rng));
                for (int64_t j = 0; j < m; ++j) {
                    float lane[8] = {};
                    for (int64_t c = 0; c < chunks; ++c) lane[c % 8] += part[static_cast<size_t>(c * ld + j)];
                    float t = lane[0];
                    for (int k = 1; k < 8; ++k) t += lane[k];
                    if (accumulate) t = static_cast<float>(old.get(j)) + t;
                    want.set(j, t);
                }
                DeviceBufs f32(*be, sizeof(float)), out(*be, dst_dtype_size(dt));
                void *dp = f32.get(chunks * ld), *db = out.get(m, &old);
                ASSERT_TRUE(dp && db);
                ASSERT_EQ(be->copy(dp, part.data(), part.size() * sizeof(float), CopyKind::HostToDevice), DST_OK);
                ASSERT_EQ(dst::cuda::column_sum_finalize_chunks(static_cast<cudaStream_t>(be->stream()), dt, dp, ld,
                                                                chunks, db, m, accumulate),
                          cudaSuccess);
                ASSERT_EQ(be->copy(got.data(), db, got.bytes.size(), CopyKind::DeviceToHost), DST_OK);
                const size_t es = dst_dtype_size(dt);
                int64_t differ = 0;
                for (int64_t j = 0; j < m; ++j) differ += std::memcmp(&got.bytes[j * es], &want.bytes[j * es], es) != 0;
                EXPECT_EQ(differ, 0) << "columns whose bits differ from the lane order's";
            }
}

TEST(CudaBackend, CallerStreamAndWorkspace) {
    if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
    auto be = cuda_backend();
    ASSERT_TRUE(be);
    cudaStream_t s = nullptr;
    ASSERT_EQ(cudaStreamCreate(&s), cudaSuccess);
    ASSERT_EQ(be->set_stream(s), DST_OK);
    EXPECT_EQ(be->stream(), static_cast<void *>(s));

    const int64_t n = 64, h = 48;
    std::vector<float> x(n * h), g(h, 1.0f), b(h, 0.0f), y(n * h);
    for (int64_t i = 0; i < n * h; ++i) x[i] = std::sin(0.1f * i);
    void *dx = nullptr, *dg = nullptr, *db = nullptr, *ddw = nullptr, *ws = nullptr;
    ASSERT_EQ(be->alloc(x.size() * 4, &dx), DST_OK);
    ASSERT_EQ(be->alloc(h * 4, &dg), DST_OK);
    ASSERT_EQ(be->alloc(h * 4, &db), DST_OK);
    ASSERT_EQ(be->alloc(h * h * 4, &ddw), DST_OK);
    ASSERT_EQ(be->copy(dx, x.data(), x.size() * 4, CopyKind::HostToDevice), DST_OK);

    // A caller workspace that is too small is refused with a message; a large one is used.
    ASSERT_EQ(be->set_workspace(nullptr, 0), DST_OK);
    ASSERT_EQ(be->alloc(size_t(64) << 20, &ws), DST_OK);
    ASSERT_EQ(be->set_workspace(ws, 16), DST_OK);
    EXPECT_EQ(be->workspace_bytes(), 16u);
    EXPECT_EQ(be->linear_bwd_weight(DST_DTYPE_FP32, dx, dx, ddw, db, n, h, h, false), DST_ERR_CAPACITY);
    ASSERT_EQ(be->set_workspace(ws, size_t(64) << 20), DST_OK);
    EXPECT_EQ(be->linear_bwd_weight(DST_DTYPE_FP32, dx, dx, ddw, db, n, h, h, false), DST_OK);
    ASSERT_EQ(be->set_workspace(nullptr, 0), DST_OK);
    EXPECT_EQ(be->linear_bwd_weight(DST_DTYPE_FP32, dx, dx, ddw, db, n, h, h, false), DST_OK);
    EXPECT_GT(be->workspace_bytes(), 0u);

    std::vector<float> col(h), want(h, 0.0f);
    ASSERT_EQ(be->copy(col.data(), db, h * 4, CopyKind::DeviceToHost), DST_OK);
    for (int64_t i = 0; i < n; ++i)
        for (int64_t j = 0; j < h; ++j) want[j] += x[i * h + j];
    for (int64_t j = 0; j < h; ++j) EXPECT_NEAR(col[j], want[j], 1e-4f);

    ASSERT_EQ(be->set_stream(nullptr), DST_OK);
    EXPECT_NE(be->stream(), static_cast<void *>(s));
    for (void *p : {dx, dg, db, ddw, ws}) be->free(p);
    be.reset();
    cudaStreamDestroy(s);
}

}  // namespace
