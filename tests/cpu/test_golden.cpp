// The whole layer against golden files computed in float64 by the independent NumPy reference
// (tests/reference/make_golden.py → tests/data/golden_*.safetensors), in every layer dtype on the CPU
// backend. Tolerances are relative L2 errors per tensor (tests/common/bounds.h):
//   FP64 ≤ 1e-10 (same maths, different summation order), FP32 ≤ 1e-5, FP16 ≤ 1e-3, BF16 ≤ 1e-2.
// NaN never passes. FP64 and FP32 layers are compared with the float64 reference of the file's
// inputs. FP16 and BF16 layers round their inputs and parameters on the way in, which alone moves the
// outputs by about the dtype's precision; they are compared with the "<dtype>." references of the
// file: the float64 reference run on exactly those rounded values, so the bound measures the error
// of the 16-bit computation itself.
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "../common/bounds.h"
#include "test_util.h"

using namespace dsttest;

namespace {

namespace fs = std::filesystem;

struct StTensor {
    std::string dtype;  // "F64" or "I32"
    std::vector<int64_t> shape;
    std::vector<double> f64;
    std::vector<int32_t> i32;
    int64_t numel() const {
        int64_t n = 1;
        for (int64_t s : shape) n *= s;
        return n;
    }
};

struct Golden {
    std::map<std::string, std::string> meta;
    std::map<std::string, StTensor> tensors;
    std::string error;  // non-empty when the file could not be parsed
};

Golden load_golden(const std::string &path) {
    Golden g;
    std::ifstream f(path, std::ios::binary);
    if (!f) { g.error = "cannot open " + path; return g; }
    std::vector<char> all((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    if (all.size() < 8) { g.error = "file shorter than 8 bytes"; return g; }
    uint64_t n = 0;
    for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<unsigned char>(all[static_cast<size_t>(i)]);
    if (n > all.size() - 8) { g.error = "header length past the end of the file"; return g; }
    nlohmann::json h;
    try {
        h = nlohmann::json::parse(all.begin() + 8, all.begin() + 8 + static_cast<std::ptrdiff_t>(n));
    } catch (const std::exception &e) {
        g.error = std::string("bad JSON header: ") + e.what();
        return g;
    }
    const size_t data0 = 8 + static_cast<size_t>(n);
    const size_t data_len = all.size() - data0;
    try {
        for (auto it = h.begin(); it != h.end(); ++it) {
            if (it.key() == "__metadata__") {
                for (auto m = it.value().begin(); m != it.value().end(); ++m) g.meta[m.key()] = m.value().get<std::string>();
                continue;
            }
            StTensor t;
            t.dtype = it.value().at("dtype").get<std::string>();
            t.shape = it.value().at("shape").get<std::vector<int64_t>>();
            const auto off = it.value().at("data_offsets").get<std::vector<uint64_t>>();
            if (off.size() != 2 || off[0] > off[1] || off[1] > data_len) {
                g.error = "bad data_offsets for " + it.key();
                return g;
            }
            const size_t es = t.dtype == "F64" ? 8 : (t.dtype == "I32" || t.dtype == "F32") ? 4 : 0;
            if (es == 0 || off[1] - off[0] != static_cast<uint64_t>(t.numel()) * es) {
                g.error = "bad dtype or size for " + it.key();
                return g;
            }
            const char *src = all.data() + data0 + off[0];
            if (es == 8) {
                t.f64.resize(static_cast<size_t>(t.numel()));
                std::memcpy(t.f64.data(), src, off[1] - off[0]);  // little-endian host assumed (x86-64/aarch64)
            } else if (t.dtype == "F32") {
                std::vector<float> f(static_cast<size_t>(t.numel()));
                std::memcpy(f.data(), src, off[1] - off[0]);
                t.f64.assign(f.begin(), f.end());
            } else {
                t.i32.resize(static_cast<size_t>(t.numel()));
                std::memcpy(t.i32.data(), src, off[1] - off[0]);
            }
            g.tensors[it.key()] = std::move(t);
        }
    } catch (const std::exception &e) {
        g.error = std::string("bad tensor entry: ") + e.what();
    }
    return g;
}

std::vector<std::string> golden_files() {
    std::vector<std::string> v;
    std::error_code ec;
    for (const auto &e : fs::directory_iterator(DST_TEST_DATA_DIR, ec)) {
        const std::string name = e.path().filename().string();
        if (e.is_regular_file() && name.rfind("golden_", 0) == 0 && e.path().extension() == ".safetensors")
            v.push_back(e.path().string());
    }
    std::sort(v.begin(), v.end());
    return v;
}

struct GoldenParam {
    std::string path;
    dst_dtype dtype;
};

void PrintTo(const GoldenParam &p, std::ostream *os) {
    *os << fs::path(p.path).filename().string() << " " << dst_dtype_string(p.dtype);
}

std::vector<GoldenParam> golden_params() {
    std::vector<GoldenParam> v;
    for (const auto &f : golden_files())
        for (dst_dtype dt : {DST_DTYPE_FP64, DST_DTYPE_FP32, DST_DTYPE_FP16, DST_DTYPE_BF16}) v.push_back({f, dt});
    return v;
}

// tests/common/bounds.h, except fp64: the NumPy reference sums in another order over longer chains.
double tolerance(dst_dtype dt) { return dt == DST_DTYPE_FP64 ? 1e-10 : design_tolerance(dt); }

class GoldenTest : public ::testing::TestWithParam<GoldenParam> {};

TEST_P(GoldenTest, ForwardBackwardMatchReference) {
    const GoldenParam gp = GetParam();
    const Golden g = load_golden(gp.path);
    ASSERT_TRUE(g.error.empty()) << gp.path << ": " << g.error;
    auto meta = [&](const char *k) -> std::string {
        auto it = g.meta.find(k);
        if (it == g.meta.end()) {
            ADD_FAILURE() << gp.path << ": metadata key '" << k << "' missing";
            return "0";
        }
        return it->second;
    };
    auto tensor = [&](const std::string &k) -> const StTensor * {
        auto it = g.tensors.find(k);
        if (it == g.tensors.end()) {
            ADD_FAILURE() << gp.path << ": tensor '" << k << "' missing";
            return nullptr;
        }
        return &it->second;
    };
    ASSERT_EQ(meta("format"), "dst-golden-1")
        << "unknown golden format; regenerate with: python3 tests/reference/make_golden.py";

    const int64_t B = std::stoll(meta("batch")), S = std::stoll(meta("seq"));
    const int H = std::stoi(meta("hidden_size"));
    dst_layer_config cfg;
    dst_layer_config_default(&cfg);
    cfg.hidden_size = H;
    cfg.heads = std::stoi(meta("heads"));
    cfg.intermediate_size = std::stoi(meta("intermediate_size"));
    cfg.attn_dropout_ratio = std::stof(meta("attn_dropout_ratio"));
    cfg.hidden_dropout_ratio = std::stof(meta("hidden_dropout_ratio"));
    cfg.pre_layer_norm = std::stoi(meta("pre_layer_norm"));
    cfg.layer_norm_eps = std::stof(meta("layer_norm_eps"));
    const std::string gelu = meta("gelu");
    ASSERT_TRUE(gelu == "erf" || gelu == "tanh") << gelu;
    cfg.gelu = gelu == "tanh" ? DST_GELU_TANH : DST_GELU_ERF;
    cfg.causal = std::stoi(meta("causal"));
    cfg.dtype = gp.dtype;
    cfg.training = 1;
    cfg.max_batch_tokens = B * S;
    cfg.max_seq_len = static_cast<int32_t>(S);
    const uint64_t seed = std::stoull(meta("rng_seed")), offset = std::stoull(meta("rng_offset"));
    const std::string mask_kind = meta("mask_kind");

    std::printf("%s [%s]: B=%lld S=%lld H=%d heads=%d I=%d %s gelu=%s causal=%d mask=%s p=%g/%g\n",
                fs::path(gp.path).filename().string().c_str(), dst_dtype_string(gp.dtype),
                static_cast<long long>(B), static_cast<long long>(S), H, cfg.heads, cfg.intermediate_size,
                cfg.pre_layer_norm ? "Pre-LN" : "Post-LN", gelu.c_str(), cfg.causal, mask_kind.c_str(),
                static_cast<double>(cfg.attn_dropout_ratio), static_cast<double>(cfg.hidden_dropout_ratio));

    Ctx ctx = make_ctx();
    ASSERT_TRUE(ctx);
    Layer layer = make_layer(ctx.get(), cfg);
    ASSERT_TRUE(layer);
    for (int p = 0; p < DST_PARAM_COUNT; ++p) {
        const StTensor *t = tensor(kParamNames[p]);
        ASSERT_NE(t, nullptr);
        DST_ASSERT_OK(dst_layer_set_param(layer.get(), kParamNames[p], t->f64.data(), DST_DTYPE_FP64, t->f64.size()));
    }
    const StTensor *in = tensor("input"), *go = tensor("grad_output"), *out_ref = tensor("output"),
                   *gi_ref = tensor("grad_input");
    ASSERT_TRUE(in && go && out_ref && gi_ref);
    ASSERT_EQ(in->numel(), B * S * H);
    HostTensor x = HostTensor::from_doubles(gp.dtype, {B, S, H}, in->f64);
    HostTensor dy = HostTensor::from_doubles(gp.dtype, {B, S, H}, go->f64);
    HostTensor y(gp.dtype, {B, S, H}), dx(gp.dtype, {B, S, H});
    y.poison();
    dx.poison();

    dst_mask mask = mask_none();
    HostTensor mask_data;
    if (mask_kind == "additive") {
        const StTensor *m = tensor("mask");
        ASSERT_NE(m, nullptr);
        ASSERT_EQ(m->dtype, "F64");
        mask_data = HostTensor::from_doubles(gp.dtype, {B, S}, m->f64);
        mask = mask_of(DST_MASK_ADDITIVE, mask_data);
    } else if (mask_kind == "lengths") {
        const StTensor *m = tensor("mask");
        ASSERT_NE(m, nullptr);
        ASSERT_EQ(m->dtype, "I32");
        mask_data = HostTensor(DST_DTYPE_INT32, {B});
        std::memcpy(mask_data.data(), m->i32.data(), m->i32.size() * 4);
        mask = mask_of(DST_MASK_KEY_LENGTHS, mask_data);
    } else {
        ASSERT_EQ(mask_kind, "none");
    }

    dst_tensor xv = x.view(), yv = y.view(), dyv = dy.view(), dxv = dx.view();
    DST_ASSERT_OK(dst_context_set_rng_state(ctx.get(), seed, offset));
    DST_ASSERT_OK(dst_layer_forward(layer.get(), nullptr, &xv, &mask, &yv));
    DST_ASSERT_OK(dst_layer_backward(layer.get(), nullptr, &dyv, &dxv, DST_GRAD_WRITE));

    const double tol = tolerance(gp.dtype);
    auto report = [&](const std::string &name, const std::vector<double> &got, const std::vector<double> &ref) {
        const double err = rel_l2(got, ref);
        const bool ok = err <= tol;  // NaN compares false
        std::printf("  %-16s rel L2 %.3e  %s\n", name.c_str(), err, ok ? "OK" : "NOT OK");
        EXPECT_LE(err, tol) << name << " (" << dst_dtype_string(gp.dtype) << ", " << gp.path << ")";
        if (!ok) {
            std::printf("    first values: got");
            for (size_t i = 0; i < std::min<size_t>(4, got.size()); ++i) std::printf(" %.9g", got[i]);
            std::printf(" | ref");
            for (size_t i = 0; i < std::min<size_t>(4, ref.size()); ++i) std::printf(" %.9g", ref[i]);
            std::printf("\n");
        }
    };
    const bool reduced = gp.dtype == DST_DTYPE_FP16 || gp.dtype == DST_DTYPE_BF16;
    const std::string rp = reduced ? std::string(dst_dtype_string(gp.dtype)) + "." : "";
    if (reduced) {
        out_ref = tensor(rp + "output");
        gi_ref = tensor(rp + "grad_input");
        ASSERT_TRUE(out_ref && gi_ref);
    }
    report("output", y.doubles(), out_ref->f64);
    report("grad_input", dx.doubles(), gi_ref->f64);
    for (int p = 0; p < DST_PARAM_COUNT; ++p) {
        const StTensor *gr = tensor(rp + "grad." + kParamNames[p]);
        ASSERT_NE(gr, nullptr);
        report(std::string("grad.") + kParamNames[p], get_grad(layer.get(), kParamNames[p]), gr->f64);
    }
}

std::string sanitize(const std::string &s) {
    std::string r;
    for (char c : s) r += (std::isalnum(static_cast<unsigned char>(c)) ? c : '_');
    return r;
}

INSTANTIATE_TEST_SUITE_P(Files, GoldenTest, ::testing::ValuesIn(golden_params()),
                         [](const ::testing::TestParamInfo<GoldenParam> &i) {
                             return sanitize(fs::path(i.param.path).stem().string()) + "_" +
                                    dst_dtype_string(i.param.dtype);
                         });
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(GoldenTest);

// Having no golden file is a failure, not a skip.
TEST(Golden, FilesExist) {
    const auto files = golden_files();
    EXPECT_FALSE(files.empty()) << "no tests/data/golden_*.safetensors in " << DST_TEST_DATA_DIR
                                << "; generate them with: python3 tests/reference/make_golden.py";
    for (const auto &f : files) {
        const Golden g = load_golden(f);
        EXPECT_TRUE(g.error.empty()) << f << ": " << g.error;
    }
}

}  // namespace
