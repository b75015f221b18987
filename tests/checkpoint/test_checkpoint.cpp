// Checkpoints (dst_checkpoint_save/load/convert) through the public API: round trips in every dtype,
// stacks with gradients, RNG and client state, the Hugging Face layout (bit-exact both ways), the
// dst-convert tool, and the failure suite: every truncation, corrupt headers, wrong tensors, a full
// disk, unwritable folders. Every failure must return its documented status with a message naming
// the tensor or argument, leave existing files byte-identical and the layers (and RNG) unchanged.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <array>
#include <chrono>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "dstransformer/dstransformer.h"

namespace fs = std::filesystem;
using ojson = nlohmann::ordered_json;

namespace {

#define ASSERT_DST_OK(expr)                                                                              \
    do {                                                                                                 \
        const dst_status st_ = (expr);                                                                   \
        ASSERT_EQ(st_, DST_OK) << #expr << " -> " << dst_status_string(st_) << ": " << dst_last_error(); \
    } while (0)

const char *const kNames[DST_PARAM_COUNT] = {"attn_qkvw", "attn_qkvb", "attn_ow",  "attn_ob",  "attn_nw", "attn_nb",
                                             "inter_w",   "inter_b",   "output_w", "output_b", "norm_w",  "norm_b"};
// HF names of every parameter (three for the fused QKV ones).
const std::vector<std::vector<std::string>> kHf = {
    {"attention.self.query.weight", "attention.self.key.weight", "attention.self.value.weight"},
    {"attention.self.query.bias", "attention.self.key.bias", "attention.self.value.bias"},
    {"attention.output.dense.weight"},
    {"attention.output.dense.bias"},
    {"attention.output.LayerNorm.weight"},
    {"attention.output.LayerNorm.bias"},
    {"intermediate.dense.weight"},
    {"intermediate.dense.bias"},
    {"output.dense.weight"},
    {"output.dense.bias"},
    {"output.LayerNorm.weight"},
    {"output.LayerNorm.bias"},
};

bool contains(const std::string &s, const std::string &part) {
    return s.find(part) != std::string::npos;
}

// ---- handles ------------------------------------------------------------------------------------
struct CtxDel {
    void operator()(dst_context *c) const { dst_context_destroy(c); }
};
struct LayerDel {
    void operator()(dst_layer *l) const { dst_layer_destroy(l); }
};
using CtxP = std::unique_ptr<dst_context, CtxDel>;
using LayerP = std::unique_ptr<dst_layer, LayerDel>;

struct Stack {
    CtxP ctx;
    std::vector<LayerP> owned;
    std::vector<dst_layer *> layers;
    int n() const { return static_cast<int>(layers.size()); }
    dst_layer *const *data() const { return layers.data(); }
};

dst_layer_config small_cfg(dst_dtype dt, bool pre_ln, uint64_t seed, int H, int heads, int I) {
    dst_layer_config c;
    dst_layer_config_default(&c);
    c.hidden_size = H;
    c.heads = heads;
    c.intermediate_size = I;
    c.dtype = dt;
    c.pre_layer_norm = pre_ln ? 1 : 0;
    c.seed = seed;
    c.max_batch_tokens = 64;
    c.max_seq_len = 16;
    return c;
}

Stack make_stack(int n, dst_dtype dt, bool pre_ln, uint64_t seed, int H = 16, int heads = 4, int I = 40) {
    Stack s;
    dst_context *c = nullptr;
    EXPECT_EQ(dst_context_create(DST_BACKEND_CPU, 0, &c), DST_OK) << dst_last_error();
    s.ctx.reset(c);
    for (int i = 0; i < n; ++i) {
        const dst_layer_config cfg = small_cfg(dt, pre_ln, seed + static_cast<uint64_t>(i), H, heads, I);
        dst_layer *l = nullptr;
        EXPECT_EQ(dst_layer_create(c, &cfg, &l), DST_OK) << dst_last_error();
        s.owned.emplace_back(l);
        s.layers.push_back(l);
    }
    return s;
}

// ---- data ---------------------------------------------------------------------------------------
uint64_t splitmix(uint64_t &s) {
    uint64_t z = (s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

size_t esize(dst_dtype dt) {
    return dst_dtype_size(dt);
}

// Random finite values with |x| in [2^-8, 2^4) and random mantissa bits, as raw patterns of `dt`.
void fill_random(void *dst, dst_dtype dt, size_t n, uint64_t &state) {
    for (size_t i = 0; i < n; ++i) {
        const uint64_t r = splitmix(state);
        const uint64_t sign = r >> 63;
        const int e = static_cast<int>((r >> 40) % 12) - 8;
        switch (dt) {
        case DST_DTYPE_FP32: {
            const uint32_t v = static_cast<uint32_t>(sign << 31 | uint64_t(127 + e) << 23 | (r & 0x7FFFFF));
            std::memcpy(static_cast<char *>(dst) + 4 * i, &v, 4);
            break;
        }
        case DST_DTYPE_FP64: {
            const uint64_t v = sign << 63 | uint64_t(1023 + e) << 52 | (splitmix(state) & 0xFFFFFFFFFFFFFull);
            std::memcpy(static_cast<char *>(dst) + 8 * i, &v, 8);
            break;
        }
        case DST_DTYPE_FP16: {
            const uint16_t v = static_cast<uint16_t>(sign << 15 | uint64_t(15 + e) << 10 | (r & 0x3FF));
            std::memcpy(static_cast<char *>(dst) + 2 * i, &v, 2);
            break;
        }
        case DST_DTYPE_BF16: {
            const uint16_t v = static_cast<uint16_t>(sign << 15 | uint64_t(127 + e) << 7 | (r & 0x7F));
            std::memcpy(static_cast<char *>(dst) + 2 * i, &v, 2);
            break;
        }
        default: FAIL() << "fill_random: dtype " << dt;
        }
    }
}

dst_dtype layer_dtype(const dst_layer *L) {
    dst_layer_config c;
    dst_layer_config_default(&c);
    EXPECT_EQ(dst_layer_get_config(L, &c), DST_OK);
    return c.dtype;
}

// Writes random values into every parameter (or gradient) of a layer.
void randomize(dst_context *ctx, dst_layer *L, bool grads, uint64_t seed) {
    void *arena = nullptr;
    ASSERT_DST_OK(grads ? dst_layer_grad_arena(L, &arena) : dst_layer_param_arena(L, &arena));
    const dst_dtype dt = layer_dtype(L);
    for (int p = 0; p < DST_PARAM_COUNT; ++p) {
        dst_param_info info;
        ASSERT_DST_OK(dst_layer_param_info(L, static_cast<dst_param>(p), &info));
        std::vector<char> buf(info.size_bytes);
        fill_random(buf.data(), dt, static_cast<size_t>(info.numel), seed);
        ASSERT_DST_OK(dst_memcpy(ctx, static_cast<char *>(arena) + info.offset_bytes, buf.data(), buf.size(),
                                 DST_COPY_HOST_TO_CONTEXT));
    }
}

void randomize(Stack &s, bool grads, uint64_t seed) {
    for (int i = 0; i < s.n(); ++i) randomize(s.ctx.get(), s.layers[i], grads, seed * 131 + i);
}

// The bytes of one parameter (or gradient) region of a layer.
std::string region(dst_context *ctx, dst_layer *L, int p, bool grads) {
    void *arena = nullptr;
    EXPECT_EQ(grads ? dst_layer_grad_arena(L, &arena) : dst_layer_param_arena(L, &arena), DST_OK);
    dst_param_info info;
    EXPECT_EQ(dst_layer_param_info(L, static_cast<dst_param>(p), &info), DST_OK);
    std::string out(info.size_bytes, '\0');
    EXPECT_EQ(dst_memcpy(ctx, out.data(), static_cast<char *>(arena) + info.offset_bytes, out.size(),
                         DST_COPY_CONTEXT_TO_HOST),
              DST_OK);
    return out;
}

// Everything a load may change: all parameters and gradients of every layer and the RNG state.
struct Snapshot {
    std::vector<std::string> regions;
    uint64_t seed = 0, offset = 0;
    bool operator==(const Snapshot &o) const { return regions == o.regions && seed == o.seed && offset == o.offset; }
};
Snapshot snapshot(const Stack &s) {
    Snapshot r;
    for (dst_layer *L : s.layers)
        for (int g = 0; g < 2; ++g)
            for (int p = 0; p < DST_PARAM_COUNT; ++p) r.regions.push_back(region(s.ctx.get(), L, p, g == 1));
    EXPECT_EQ(dst_context_get_rng_state(s.ctx.get(), &r.seed, &r.offset), DST_OK);
    return r;
}

std::string get_param(dst_layer *L, int p, dst_dtype dt) {
    dst_param_info info;
    EXPECT_EQ(dst_layer_param_info(L, static_cast<dst_param>(p), &info), DST_OK);
    std::string out(static_cast<size_t>(info.numel) * esize(dt), '\0');
    EXPECT_EQ(dst_layer_get_param(L, kNames[p], out.data(), dt, static_cast<size_t>(info.numel)), DST_OK)
        << dst_last_error();
    return out;
}

std::vector<double> as_doubles(const std::string &bytes) {
    std::vector<double> v(bytes.size() / 8);
    std::memcpy(v.data(), bytes.data(), v.size() * 8);
    return v;
}

// ---- files --------------------------------------------------------------------------------------
std::string slurp(const std::string &path) {
    std::ifstream f(path, std::ios::binary);
    std::ostringstream ss;
    ss << f.rdbuf();
    return ss.str();
}
void spit(const std::string &path, const std::string &bytes) {
    std::ofstream f(path, std::ios::binary | std::ios::trunc);
    f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    ASSERT_TRUE(f.good()) << path;
}

// ---- a safetensors file built by the test itself ------------------------------------------------
struct StT {
    std::string name, dtype;
    std::vector<int64_t> shape;
    std::string data;
};
struct Built {
    ojson hdr = ojson::object();
    std::string data;
    std::string bytes() const {
        std::string json = hdr.dump();
        json.append((8 - json.size() % 8) % 8, ' ');
        std::string out(8, '\0');
        for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((uint64_t(json.size()) >> (8 * i)) & 0xff);
        return out + json + data;
    }
};
Built build(const std::vector<StT> &ts, const std::map<std::string, std::string> &md = {}) {
    Built b;
    if (!md.empty()) {
        ojson m = ojson::object();
        for (const auto &kv : md) m[kv.first] = kv.second;
        b.hdr["__metadata__"] = m;
    }
    for (const StT &t : ts) {
        b.hdr[t.name] = {
            {"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {b.data.size(), b.data.size() + t.data.size()}}};
        b.data += t.data;
    }
    return b;
}
std::string raw_file(const std::string &json, const std::string &data) {
    std::string out(8, '\0');
    for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((uint64_t(json.size()) >> (8 * i)) & 0xff);
    return out + json + data;
}

struct StRead {
    nlohmann::json hdr;
    std::string data;
    std::string tensor(const std::string &name) const {
        const auto &o = hdr.at(name).at("data_offsets");
        const size_t b = o[0].get<size_t>(), e = o[1].get<size_t>();
        return data.substr(b, e - b);
    }
    std::string meta(const std::string &key) const { return hdr.at("__metadata__").at(key).get<std::string>(); }
    std::vector<std::string> names() const {
        std::vector<std::string> v;
        for (auto it = hdr.begin(); it != hdr.end(); ++it)
            if (it.key() != "__metadata__") v.push_back(it.key());
        return v;
    }
};
StRead st_read(const std::string &path) {
    const std::string b = slurp(path);
    StRead r;
    EXPECT_GE(b.size(), 8u);
    uint64_t n = 0;
    for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<unsigned char>(b[i]);
    EXPECT_EQ((8 + n) % 8, 0u) << "the data section must start 8-byte aligned";
    r.hdr = nlohmann::json::parse(b.substr(8, n));
    r.data = b.substr(8 + n);
    return r;
}

// A complete DeepSpeed-layout layer of random fp32 values (H, I), as the test's own file.
std::vector<StT> ds_layer_tensors(const std::string &prefix, int layer, int64_t H, int64_t I, uint64_t seed) {
    const std::vector<std::vector<int64_t>> shapes = {{3 * H, H}, {3 * H}, {H, H}, {H}, {H}, {H},
                                                      {I, H},     {I},     {H, I}, {H}, {H}, {H}};
    std::vector<StT> ts;
    for (int p = 0; p < DST_PARAM_COUNT; ++p) {
        StT t;
        t.name = prefix + "layer." + std::to_string(layer) + "." + kNames[p];
        t.dtype = "F32";
        t.shape = shapes[p];
        size_t n = 1;
        for (int64_t d : t.shape) n *= static_cast<size_t>(d);
        t.data.resize(n * 4);
        fill_random(t.data.data(), DST_DTYPE_FP32, n, seed);
        ts.push_back(t);
    }
    return ts;
}

// A complete HF BertLayer of random fp32 values.
std::vector<StT> hf_layer_tensors(const std::string &prefix, int layer, int64_t H, int64_t I, uint64_t seed) {
    const std::vector<std::vector<int64_t>> shapes = {{H, H}, {H}, {H, H}, {H}, {H}, {H},
                                                      {I, H}, {I}, {H, I}, {H}, {H}, {H}};
    std::vector<StT> ts;
    for (int p = 0; p < DST_PARAM_COUNT; ++p)
        for (const std::string &suffix : kHf[p]) {
            StT t;
            t.name = prefix + "layer." + std::to_string(layer) + "." + suffix;
            t.dtype = "F32";
            t.shape = shapes[p];
            size_t n = 1;
            for (int64_t d : t.shape) n *= static_cast<size_t>(d);
            t.data.resize(n * 4);
            fill_random(t.data.data(), DST_DTYPE_FP32, n, seed);
            ts.push_back(t);
        }
    return ts;
}

const StT &find(const std::vector<StT> &ts, const std::string &name) {
    for (const StT &t : ts)
        if (t.name == name) return t;
    static const StT none;
    ADD_FAILURE() << "no tensor " << name;
    return none;
}

// ---- fixture ------------------------------------------------------------------------------------
class Checkpoint : public ::testing::Test {
protected:
    void SetUp() override {
        std::string tmpl = fs::path(::testing::TempDir()) / "dst_ckpt_XXXXXX";
        ASSERT_NE(::mkdtemp(tmpl.data()), nullptr) << std::strerror(errno);
        dir_ = tmpl;
        ::chmod(dir_.c_str(), 0755);  // the unwritable-folder test runs a child as another user
    }
    void TearDown() override {
        std::error_code ec;
        for (const auto &e : fs::recursive_directory_iterator(dir_, ec))
            if (e.is_directory()) fs::permissions(e.path(), fs::perms::owner_all, fs::perm_options::add, ec);
        fs::remove_all(dir_, ec);
    }
    std::string path(const std::string &name) const { return dir_ + "/" + name; }
    std::vector<std::string> listing(const std::string &d) const {
        std::vector<std::string> v;
        for (const auto &e : fs::directory_iterator(d)) v.push_back(e.path().filename().string());
        std::sort(v.begin(), v.end());
        return v;
    }

    // Writes `bytes`, loads it into `s` and expects `status` with every fragment in the message, an
    // unchanged stack and an unchanged file.
    void expect_load_fails(Stack &s, const std::string &bytes, dst_status status,
                           const std::vector<std::string> &fragments, const dst_checkpoint_options *o = nullptr) {
        const std::string f = path("bad.safetensors");
        spit(f, bytes);
        const Snapshot before = snapshot(s);
        char client[8] = "keep";
        size_t len = 12345;
        const dst_status st = dst_checkpoint_load(s.data(), s.n(), f.c_str(), o, client, sizeof client, &len);
        const std::string msg = dst_last_error();
        EXPECT_EQ(st, status) << dst_status_string(st) << ": " << msg;
        for (const std::string &frag : fragments)
            EXPECT_TRUE(contains(msg, frag)) << "'" << frag << "' not in: " << msg;
        EXPECT_TRUE(contains(msg, "dst_checkpoint_load")) << msg;
        EXPECT_TRUE(snapshot(s) == before) << "a failed load changed the layers: " << msg;
        EXPECT_EQ(std::string(client), "keep");
        EXPECT_EQ(len, 12345u);
        EXPECT_EQ(slurp(f), bytes);
    }

    std::string dir_;
};

// ---- options and arguments ----------------------------------------------------------------------
TEST_F(Checkpoint, OptionsDefault) {
    dst_checkpoint_options o;
    std::memset(&o, 0xAB, sizeof o);
    ASSERT_DST_OK(dst_checkpoint_options_default(&o));
    EXPECT_EQ(o.struct_size, sizeof o);
    EXPECT_EQ(o.layout, DST_LAYOUT_DEEPSPEED);
    EXPECT_EQ(o.prefix, nullptr);
    EXPECT_EQ(o.include_grads, 0);
    EXPECT_EQ(o.save_dtype, -1);
    EXPECT_EQ(o.restore_rng, 1);
    EXPECT_EQ(o.client_state, nullptr);
    EXPECT_EQ(dst_checkpoint_options_default(nullptr), DST_ERR_INVALID_ARGUMENT);
    EXPECT_TRUE(contains(dst_last_error(), "options is NULL"));
}

TEST_F(Checkpoint, ArgumentChecksNameTheArgument) {
    Stack s = make_stack(2, DST_DTYPE_FP32, true, 1);
    const std::string f = path("a.safetensors");
    auto expect_invalid = [&](dst_status st, const char *fragment) {
        EXPECT_EQ(st, DST_ERR_INVALID_ARGUMENT) << fragment;
        EXPECT_TRUE(contains(dst_last_error(), fragment)) << dst_last_error();
    };
    expect_invalid(dst_checkpoint_save(nullptr, 1, f.c_str(), nullptr), "layers is NULL");
    expect_invalid(dst_checkpoint_save(s.data(), 0, f.c_str(), nullptr), "num_layers is 0");
    dst_layer *holes[2] = {s.layers[0], nullptr};
    expect_invalid(dst_checkpoint_save(holes, 2, f.c_str(), nullptr), "layers[1] is NULL");
    expect_invalid(dst_checkpoint_save(s.data(), 2, nullptr, nullptr), "path is NULL");
    expect_invalid(dst_checkpoint_save(s.data(), 2, "", nullptr), "path is empty");
    dst_checkpoint_options o;
    dst_checkpoint_options_default(&o);
    o.struct_size = 8;
    expect_invalid(dst_checkpoint_save(s.data(), 2, f.c_str(), &o), "options->struct_size");
    dst_checkpoint_options_default(&o);
    o.layout = static_cast<dst_weight_layout>(7);
    expect_invalid(dst_checkpoint_save(s.data(), 2, f.c_str(), &o), "options->layout");
    dst_checkpoint_options_default(&o);
    o.save_dtype = DST_DTYPE_INT32;
    expect_invalid(dst_checkpoint_save(s.data(), 2, f.c_str(), &o), "options->save_dtype");
    o.save_dtype = -2;
    expect_invalid(dst_checkpoint_save(s.data(), 2, f.c_str(), &o), "options->save_dtype");
    EXPECT_FALSE(fs::exists(f));

    ASSERT_DST_OK(dst_checkpoint_save(s.data(), 2, f.c_str(), nullptr));
    const Snapshot before = snapshot(s);
    expect_invalid(dst_checkpoint_load(nullptr, 2, f.c_str(), nullptr, nullptr, 0, nullptr), "layers is NULL");
    expect_invalid(dst_checkpoint_load(s.data(), -1, f.c_str(), nullptr, nullptr, 0, nullptr), "num_layers is -1");
    expect_invalid(dst_checkpoint_load(holes, 2, f.c_str(), nullptr, nullptr, 0, nullptr), "layers[1] is NULL");
    expect_invalid(dst_checkpoint_load(s.data(), 2, nullptr, nullptr, nullptr, 0, nullptr), "path is NULL");
    o.save_dtype = -1;
    o.struct_size = 0;
    expect_invalid(dst_checkpoint_load(s.data(), 2, f.c_str(), &o, nullptr, 0, nullptr), "options->struct_size");
    EXPECT_TRUE(snapshot(s) == before);

    const std::string g = path("b.safetensors");
    expect_invalid(dst_checkpoint_convert(nullptr, DST_LAYOUT_DEEPSPEED, nullptr, g.c_str(), DST_LAYOUT_HF_BERT,
                                          nullptr, nullptr, 0),
                   "in_path is NULL");
    expect_invalid(dst_checkpoint_convert(f.c_str(), DST_LAYOUT_DEEPSPEED, nullptr, nullptr, DST_LAYOUT_HF_BERT,
                                          nullptr, nullptr, 0),
                   "out_path is NULL");
    expect_invalid(dst_checkpoint_convert(f.c_str(), static_cast<dst_weight_layout>(5), nullptr, g.c_str(),
                                          DST_LAYOUT_HF_BERT, nullptr, nullptr, 0),
                   "in_layout is 5");
    expect_invalid(dst_checkpoint_convert(f.c_str(), DST_LAYOUT_DEEPSPEED, nullptr, g.c_str(),
                                          static_cast<dst_weight_layout>(-1), nullptr, nullptr, 0),
                   "out_layout is -1");
    EXPECT_FALSE(fs::exists(g));
}

// ---- round trips --------------------------------------------------------------------------------
class CheckpointDtype : public Checkpoint, public ::testing::WithParamInterface<dst_dtype> {};

TEST_P(CheckpointDtype, StackOfThreeWithGradsRngAndClientState) {
    const dst_dtype dt = GetParam();
    Stack a = make_stack(3, dt, true, 1);
    randomize(a, false, 11);
    randomize(a, true, 12);
    ASSERT_DST_OK(dst_context_set_rng_state(a.ctx.get(), 123456789012345ull, 42));
    dst_checkpoint_options o;
    dst_checkpoint_options_default(&o);
    o.include_grads = 1;
    o.client_state = "epoch=3;step=1200";
    const std::string f = path("stack.safetensors");
    ASSERT_DST_OK(dst_checkpoint_save(a.data(), 3, f.c_str(), &o));
    EXPECT_EQ(listing(dir_), std::vector<std::string>{"stack.safetensors"}) << "no temporary file may remain";

    // What other tools see.
    const StRead r = st_read(f);
    EXPECT_EQ(r.names().size(), 72u);
    const char *stdt = dt == DST_DTYPE_FP32   ? "F32"
                       : dt == DST_DTYPE_FP16 ? "F16"
                       : dt == DST_DTYPE_BF16 ? "BF16"
                                              : "F64";
    for (const std::string &n : r.names()) EXPECT_EQ(r.hdr[n]["dtype"], stdt) << n;
    EXPECT_EQ(r.hdr["layer.2.attn_qkvw"]["shape"], nlohmann::json({48, 16}));
    EXPECT_EQ(r.hdr["grad.layer.1.inter_w"]["shape"], nlohmann::json({40, 16}));
    EXPECT_EQ(r.tensor("layer.1.output_w"), region(a.ctx.get(), a.layers[1], DST_PARAM_OUTPUT_W, false));
    EXPECT_EQ(r.tensor("grad.layer.2.attn_qkvb"), region(a.ctx.get(), a.layers[2], DST_PARAM_ATTN_QKVB, true));
    EXPECT_EQ(r.meta("format"), "dstransformer-checkpoint-1");
    EXPECT_EQ(r.meta("version"), dst_version_string());
    EXPECT_EQ(r.meta("num_layers"), "3");
    EXPECT_EQ(r.meta("layout"), "deepspeed");
    EXPECT_EQ(r.meta("rng_seed"), "123456789012345");
    EXPECT_EQ(r.meta("rng_offset"), "42");
    EXPECT_EQ(r.meta("rng_graph_counter"), "0");
    EXPECT_EQ(r.meta("client_state"), "epoch=3;step=1200");
    const nlohmann::json cfg = nlohmann::json::parse(r.meta("config.1"));
    EXPECT_EQ(cfg["hidden_size"], 16);
    EXPECT_EQ(cfg["heads"], 4);
    EXPECT_EQ(cfg["intermediate_size"], 40);
    EXPECT_EQ(cfg["seed"], 2);
    EXPECT_EQ(cfg["pre_layer_norm"], 1);
    EXPECT_EQ(cfg["dtype"], dst_dtype_string(dt));
    EXPECT_EQ(cfg["gelu"], "erf");
    EXPECT_EQ(cfg["attn_dropout_ratio"], 0.1);
    EXPECT_EQ(cfg["layer_norm_eps"], 1e-12);
    EXPECT_EQ(cfg.size(), 22u) << cfg.dump();

    // Into fresh layers of another seed and context.
    Stack b = make_stack(3, dt, true, 100);
    ASSERT_DST_OK(dst_context_set_rng_state(b.ctx.get(), 5, 6));
    char client[64];
    size_t len = 0;
    ASSERT_DST_OK(dst_checkpoint_load(b.data(), 3, f.c_str(), &o, client, sizeof client, &len));
    EXPECT_TRUE(snapshot(a) == snapshot(b)) << "parameters, gradients and RNG state must round-trip bit-exactly";
    EXPECT_EQ(std::string(client), "epoch=3;step=1200");
    EXPECT_EQ(len, 17u);

    // Truncated client state, no RNG restore, parameters only.
    ASSERT_DST_OK(dst_context_set_rng_state(b.ctx.get(), 5, 6));
    o.restore_rng = 0;
    o.include_grads = 0;
    char small[6];
    ASSERT_DST_OK(dst_checkpoint_load(b.data(), 3, f.c_str(), &o, small, sizeof small, &len));
    EXPECT_EQ(std::string(small), "epoch");
    EXPECT_EQ(len, 17u);
    uint64_t seed = 0, off = 0;
    ASSERT_DST_OK(dst_context_get_rng_state(b.ctx.get(), &seed, &off));
    EXPECT_EQ(seed, 5u);
    EXPECT_EQ(off, 6u);
    // A prefix of the stack loads the first layers only.
    Stack c = make_stack(1, dt, true, 200);
    ASSERT_DST_OK(dst_checkpoint_load(c.data(), 1, f.c_str(), nullptr, nullptr, 0, nullptr));
    for (int p = 0; p < DST_PARAM_COUNT; ++p)
        EXPECT_EQ(region(c.ctx.get(), c.layers[0], p, false), region(a.ctx.get(), a.layers[0], p, false));
}

INSTANTIATE_TEST_SUITE_P(AllDtypes, CheckpointDtype,
                         ::testing::Values(DST_DTYPE_FP32, DST_DTYPE_FP16, DST_DTYPE_BF16, DST_DTYPE_FP64),
                         [](const ::testing::TestParamInfo<dst_dtype> &i) {
                             return std::string(dst_dtype_string(i.param));
                         });

TEST_F(Checkpoint, SaveDtypeAndLoadConvert) {
    Stack a = make_stack(2, DST_DTYPE_FP32, false, 1);
    randomize(a, false, 21);
    dst_checkpoint_options o;
    dst_checkpoint_options_default(&o);
    o.save_dtype = DST_DTYPE_FP16;
    const std::string f = path("half.safetensors");
    ASSERT_DST_OK(dst_checkpoint_save(a.data(), 2, f.c_str(), &o));
    const StRead r = st_read(f);
    for (const std::string &n : r.names()) EXPECT_EQ(r.hdr[n]["dtype"], "F16") << n;
    EXPECT_EQ(r.tensor("layer.1.inter_w"), get_param(a.layers[1], DST_PARAM_INTER_W, DST_DTYPE_FP16));

    // fp16 file into fp16, fp64 and bf16 layers.
    Stack h = make_stack(2, DST_DTYPE_FP16, false, 50);
    ASSERT_DST_OK(dst_checkpoint_load(h.data(), 2, f.c_str(), nullptr, nullptr, 0, nullptr));
    Stack d = make_stack(2, DST_DTYPE_FP64, false, 60);
    ASSERT_DST_OK(dst_checkpoint_load(d.data(), 2, f.c_str(), nullptr, nullptr, 0, nullptr));
    Stack b = make_stack(2, DST_DTYPE_BF16, false, 70);
    ASSERT_DST_OK(dst_checkpoint_load(b.data(), 2, f.c_str(), nullptr, nullptr, 0, nullptr));
    for (int i = 0; i < 2; ++i)
        for (int p = 0; p < DST_PARAM_COUNT; ++p) {
            const std::string want = get_param(a.layers[i], p, DST_DTYPE_FP16);
            EXPECT_EQ(get_param(h.layers[i], p, DST_DTYPE_FP16), want) << kNames[p];
            EXPECT_EQ(get_param(d.layers[i], p, DST_DTYPE_FP16), want) << kNames[p];  // fp16 -> fp64 is exact
            const std::vector<double> ref = as_doubles(get_param(a.layers[i], p, DST_DTYPE_FP64));
            const std::vector<double> got = as_doubles(get_param(b.layers[i], p, DST_DTYPE_FP64));
            ASSERT_EQ(ref.size(), got.size());
            for (size_t k = 0; k < ref.size(); ++k)  // fp16 (2^-11) then bf16 (2^-8) rounding
                ASSERT_LE(std::fabs(got[k] - ref[k]), std::fabs(ref[k]) * (1.0 / 256 + 1.0 / 2048) * 1.0001)
                    << kNames[p] << "[" << k << "]";
        }

    // Widening and narrowing back is exact: bf16 layers saved as fp32, loaded into bf16 layers.
    Stack e = make_stack(1, DST_DTYPE_BF16, false, 80);
    randomize(e, false, 22);
    o.save_dtype = DST_DTYPE_FP32;
    const std::string g = path("wide.safetensors");
    ASSERT_DST_OK(dst_checkpoint_save(e.data(), 1, g.c_str(), &o));
    EXPECT_EQ(st_read(g).hdr["layer.0.attn_ow"]["dtype"], "F32");
    Stack e2 = make_stack(1, DST_DTYPE_BF16, false, 90);
    ASSERT_DST_OK(dst_checkpoint_load(e2.data(), 1, g.c_str(), nullptr, nullptr, 0, nullptr));
    for (int p = 0; p < DST_PARAM_COUNT; ++p)
        EXPECT_EQ(region(e2.ctx.get(), e2.layers[0], p, false), region(e.ctx.get(), e.layers[0], p, false))
            << kNames[p];
}

TEST_F(Checkpoint, PrefixNamesTheTensors) {
    Stack a = make_stack(2, DST_DTYPE_FP32, true, 1);
    randomize(a, false, 3);
    randomize(a, true, 4);
    dst_checkpoint_options o;
    dst_checkpoint_options_default(&o);
    o.prefix = "model.encoder.";
    o.include_grads = 1;
    const std::string f = path("prefixed.safetensors");
    ASSERT_DST_OK(dst_checkpoint_save(a.data(), 2, f.c_str(), &o));
    const StRead r = st_read(f);
    EXPECT_TRUE(r.hdr.contains("model.encoder.layer.1.norm_b"));
    EXPECT_TRUE(r.hdr.contains("grad.model.encoder.layer.0.attn_qkvw"));
    EXPECT_EQ(r.meta("prefix"), "model.encoder.");

    Stack b = make_stack(2, DST_DTYPE_FP32, true, 9);
    expect_load_fails(b, slurp(f), DST_ERR_FORMAT, {"\"layer.0.attn_qkvw\"", "missing"});
    ASSERT_DST_OK(dst_checkpoint_load(b.data(), 2, f.c_str(), &o, nullptr, 0, nullptr));
    EXPECT_TRUE(snapshot(a) == snapshot(b));
}

// ---- Hugging Face layout ------------------------------------------------------------------------
TEST_F(Checkpoint, HfSaveLoadAndConvertAreBitExact) {
    Stack a = make_stack(2, DST_DTYPE_FP32, false, 1);
    randomize(a, false, 5);
    randomize(a, true, 6);
    dst_checkpoint_options o;
    dst_checkpoint_options_default(&o);
    o.layout = DST_LAYOUT_HF_BERT;
    o.prefix = "bert.encoder.";
    o.include_grads = 1;
    const std::string hf = path("hf.safetensors");
    ASSERT_DST_OK(dst_checkpoint_save(a.data(), 2, hf.c_str(), &o));
    const StRead r = st_read(hf);
    EXPECT_EQ(r.names().size(), 2u * 2u * 16u);
    EXPECT_EQ(r.meta("layout"), "hf_bert");
    EXPECT_EQ(r.meta("format"), "pt") << "transformers refuses any other format";
    const int64_t H = 16;
    for (int i = 0; i < 2; ++i) {
        const std::string base = "bert.encoder.layer." + std::to_string(i) + ".";
        const std::string qkvw = region(a.ctx.get(), a.layers[i], DST_PARAM_ATTN_QKVW, false);
        const std::string qkvb = region(a.ctx.get(), a.layers[i], DST_PARAM_ATTN_QKVB, false);
        const char *qkv[3] = {"query", "key", "value"};
        for (int k = 0; k < 3; ++k) {
            const std::string w = base + "attention.self." + qkv[k] + ".weight";
            EXPECT_EQ(r.hdr[w]["shape"], nlohmann::json({H, H}));
            EXPECT_EQ(r.tensor(w), qkvw.substr(k * H * H * 4, H * H * 4)) << w;
            EXPECT_EQ(r.tensor(base + "attention.self." + qkv[k] + ".bias"), qkvb.substr(k * H * 4, H * 4));
        }
        EXPECT_EQ(r.tensor(base + "output.LayerNorm.weight"),
                  region(a.ctx.get(), a.layers[i], DST_PARAM_NORM_W, false));
        EXPECT_EQ(r.tensor(base + "attention.output.LayerNorm.bias"),
                  region(a.ctx.get(), a.layers[i], DST_PARAM_ATTN_NB, false));
        EXPECT_EQ(r.tensor("grad." + base + "intermediate.dense.weight"),
                  region(a.ctx.get(), a.layers[i], DST_PARAM_INTER_W, true));
    }

    // HF file -> layers (prefix detected).
    Stack b = make_stack(2, DST_DTYPE_FP32, false, 40);
    o.prefix = nullptr;
    ASSERT_DST_OK(dst_checkpoint_load(b.data(), 2, hf.c_str(), &o, nullptr, 0, nullptr));
    EXPECT_TRUE(snapshot(a) == snapshot(b));

    // DS -> HF -> DS through convert reproduces every tensor byte for byte.
    const std::string ds = path("ds.safetensors"), hf2 = path("hf2.safetensors"), ds2 = path("ds2.safetensors");
    dst_checkpoint_options_default(&o);
    o.include_grads = 1;
    ASSERT_DST_OK(dst_checkpoint_save(a.data(), 2, ds.c_str(), &o));
    char summary[1024];
    ASSERT_DST_OK(dst_checkpoint_convert(ds.c_str(), DST_LAYOUT_DEEPSPEED, nullptr, hf2.c_str(), DST_LAYOUT_HF_BERT,
                                         "bert.encoder.", summary, sizeof summary));
    EXPECT_TRUE(contains(summary, "2 layer(s)")) << summary;
    EXPECT_TRUE(contains(summary, "gradients of 2 layer(s)")) << summary;
    EXPECT_TRUE(contains(summary, "dtype F32")) << summary;
    EXPECT_TRUE(contains(summary, "passed through unchanged: 0")) << summary;
    const StRead rh = st_read(hf2);
    for (const std::string &n : r.names()) EXPECT_EQ(rh.tensor(n), r.tensor(n)) << n;  // same as save() wrote
    EXPECT_EQ(rh.meta("layout"), "hf_bert");
    EXPECT_EQ(rh.meta("format"), "pt");
    ASSERT_DST_OK(dst_checkpoint_convert(hf2.c_str(), DST_LAYOUT_HF_BERT, nullptr, ds2.c_str(), DST_LAYOUT_DEEPSPEED,
                                         "", summary, sizeof summary));
    EXPECT_TRUE(contains(summary, "prefix \"bert.encoder.\" (detected)")) << summary;
    const StRead r1 = st_read(ds), r2 = st_read(ds2);
    std::vector<std::string> n1 = r1.names(), n2 = r2.names();
    std::sort(n1.begin(), n1.end());
    std::sort(n2.begin(), n2.end());
    EXPECT_EQ(n1, n2);
    for (const std::string &n : n1) {
        EXPECT_EQ(r2.tensor(n), r1.tensor(n)) << n;
        EXPECT_EQ(r2.hdr[n]["shape"], r1.hdr[n]["shape"]) << n;
        EXPECT_EQ(r2.hdr[n]["dtype"], r1.hdr[n]["dtype"]) << n;
    }
    EXPECT_EQ(r2.meta("layout"), "deepspeed");
    EXPECT_EQ(r2.meta("config.1"), r1.meta("config.1"));
}

// ---- models: layers and named tensors in one file (dst_checkpoint_save_model / load_model) ---------

// Host memory of a CPU context holding a named tensor's values (fp32 or int32 patterns from fill_random).
struct Named {
    std::string name;
    dst_dtype dt;
    std::vector<int64_t> shape;
    std::vector<char> mem;
    dst_named_tensor nt() const {
        dst_named_tensor t;
        std::memset(&t, 0, sizeof t);
        t.name = name.c_str();
        t.tensor.data = const_cast<char *>(mem.data());
        t.tensor.dtype = dt;
        t.tensor.ndim = static_cast<int32_t>(shape.size());
        for (size_t i = 0; i < shape.size(); ++i) t.tensor.shape[i] = shape[i];
        t.required = 1;
        return t;
    }
};
Named make_named(const std::string &name, dst_dtype dt, std::vector<int64_t> shape, uint64_t seed) {
    Named n{name, dt, std::move(shape), {}};
    size_t count = 1;
    for (int64_t d : n.shape) count *= static_cast<size_t>(d);
    n.mem.resize(count * esize(dt));
    if (dt == DST_DTYPE_INT32)
        for (size_t i = 0; i < count; ++i) {
            const int32_t v = static_cast<int32_t>(splitmix(seed) % 1000) - 500;
            std::memcpy(n.mem.data() + 4 * i, &v, 4);
        }
    else
        fill_random(n.mem.data(), dt, count, seed);
    return n;
}

TEST_F(Checkpoint, ModelFilesHoldLayersAndNamedTensors) {
    Stack a = make_stack(2, DST_DTYPE_FP32, false, 1);
    randomize(a, false, 7);
    ASSERT_DST_OK(dst_context_set_rng_state(a.ctx.get(), 17, 33));
    std::vector<Named> src = {make_named("bert.embeddings.word_embeddings.weight", DST_DTYPE_FP32, {11, 16}, 1),
                              make_named("cls.predictions.bias", DST_DTYPE_FP32, {11}, 2),
                              make_named("steps", DST_DTYPE_INT32, {3}, 3)};
    std::vector<dst_named_tensor> nts;
    for (const Named &n : src) nts.push_back(n.nt());
    dst_checkpoint_options o;
    dst_checkpoint_options_default(&o);
    o.layout = DST_LAYOUT_HF_BERT;
    o.prefix = "bert.encoder.";
    o.client_state = "{\"epoch\": 2}";
    const std::string f = path("model.safetensors");
    ASSERT_DST_OK(dst_checkpoint_save_model(a.ctx.get(), a.data(), 2, nts.data(), 3, f.c_str(), &o));
    const StRead r = st_read(f);
    EXPECT_EQ(r.names().size(), 2u * 16u + 3u);
    EXPECT_EQ(r.tensor("bert.embeddings.word_embeddings.weight"), std::string(src[0].mem.begin(), src[0].mem.end()));
    EXPECT_EQ(r.hdr["cls.predictions.bias"]["shape"], nlohmann::json({11}));
    EXPECT_EQ(r.hdr["steps"]["dtype"], "I32");
    EXPECT_EQ(r.meta("num_tensors"), "3");
    EXPECT_EQ(r.hdr["bert.encoder.layer.1.output.LayerNorm.weight"]["shape"], nlohmann::json({16}));

    // Into a fresh stack and fresh buffers: everything back, bit for bit, with the RNG and client state.
    Stack b = make_stack(2, DST_DTYPE_FP32, false, 50);
    std::vector<Named> dst = {make_named(src[0].name, DST_DTYPE_FP32, {11, 16}, 9),
                              make_named(src[1].name, DST_DTYPE_FP32, {11}, 10),
                              make_named(src[2].name, DST_DTYPE_INT32, {3}, 11)};
    std::vector<dst_named_tensor> dnts;
    for (const Named &n : dst) dnts.push_back(n.nt());
    int32_t found[3] = {-1, -1, -1};
    char client[64];
    o.prefix = nullptr;  // detected
    ASSERT_DST_OK(dst_checkpoint_load_model(b.ctx.get(), b.data(), 2, dnts.data(), 3, found, f.c_str(), &o, client,
                                            sizeof client, nullptr));
    EXPECT_TRUE(snapshot(a) == snapshot(b));
    for (int i = 0; i < 3; ++i) {
        EXPECT_EQ(found[i], 1);
        EXPECT_EQ(dst[i].mem, src[i].mem) << dst[i].name;
    }
    EXPECT_EQ(std::string(client), "{\"epoch\": 2}");
    // Nothing but the client state (what a program stored there before it builds the model), the RNG
    // state left alone without restore_rng.
    dst_checkpoint_options peek;
    dst_checkpoint_options_default(&peek);
    peek.restore_rng = 0;
    ASSERT_DST_OK(dst_context_set_rng_state(b.ctx.get(), 1, 2));
    std::memset(client, 0, sizeof client);
    size_t len = 0;
    ASSERT_DST_OK(dst_checkpoint_load_model(b.ctx.get(), nullptr, 0, nullptr, 0, nullptr, f.c_str(), &peek, client,
                                            sizeof client, &len));
    EXPECT_EQ(std::string(client), "{\"epoch\": 2}");
    EXPECT_EQ(len, 12u);
    uint64_t rs = 0, ro = 0;
    ASSERT_DST_OK(dst_context_get_rng_state(b.ctx.get(), &rs, &ro));
    EXPECT_EQ(rs, 1u);
    EXPECT_EQ(ro, 2u);

    // Saved as fp16: float tensors converted, int32 kept; loading into fp32 converts back.
    o.save_dtype = DST_DTYPE_FP16;
    const std::string h = path("model16.safetensors");
    ASSERT_DST_OK(dst_checkpoint_save_model(a.ctx.get(), a.data(), 2, nts.data(), 3, h.c_str(), &o));
    const StRead r16 = st_read(h);
    EXPECT_EQ(r16.hdr["cls.predictions.bias"]["dtype"], "F16");
    EXPECT_EQ(r16.hdr["steps"]["dtype"], "I32");
    ASSERT_DST_OK(dst_checkpoint_load_model(b.ctx.get(), nullptr, 0, dnts.data(), 3, found, h.c_str(), &o, nullptr, 0,
                                            nullptr));
    EXPECT_EQ(dst[2].mem, src[2].mem);
    for (int i = 0; i < 11; ++i) {
        float x = 0, y = 0;
        std::memcpy(&x, src[1].mem.data() + 4 * i, 4);
        std::memcpy(&y, dst[1].mem.data() + 4 * i, 4);
        EXPECT_NEAR(y, x, std::fabs(x) * 1e-3) << i;
    }

    // An optional tensor the file lacks keeps its values and is reported as not found; tensors only
    // (no layers) work.
    Named extra = make_named("cls.seq_relationship.weight", DST_DTYPE_FP32, {2, 16}, 12);
    const std::vector<char> extra_before = extra.mem;
    std::vector<dst_named_tensor> opt = {dnts[1], extra.nt()};
    opt[1].required = 0;
    ASSERT_DST_OK(dst_checkpoint_load_model(b.ctx.get(), nullptr, 0, opt.data(), 2, found, f.c_str(), nullptr, nullptr,
                                            0, nullptr));
    EXPECT_EQ(found[0], 1);
    EXPECT_EQ(found[1], 0);
    EXPECT_EQ(extra.mem, extra_before);
}

TEST_F(Checkpoint, ModelFailuresChangeNothing) {
    Stack a = make_stack(1, DST_DTYPE_FP32, false, 1);
    randomize(a, false, 7);
    Named w = make_named("emb", DST_DTYPE_FP32, {5, 16}, 1), ids = make_named("ids", DST_DTYPE_INT32, {4}, 2);
    std::vector<dst_named_tensor> nts = {w.nt(), ids.nt()};
    const std::string f = path("m.safetensors");
    ASSERT_DST_OK(dst_checkpoint_save_model(a.ctx.get(), a.data(), 1, nts.data(), 2, f.c_str(), nullptr));
    const std::string bytes = slurp(f);

    auto expect_bad = [&](dst_status st, const std::string &frag, dst_status got) {
        EXPECT_EQ(got, st) << frag << ": " << dst_last_error();
        EXPECT_TRUE(contains(dst_last_error(), frag)) << "'" << frag << "' not in: " << dst_last_error();
    };
    // Save: arguments.
    dst_named_tensor dup[2] = {w.nt(), w.nt()};
    const std::string g = path("g.safetensors");
    expect_bad(DST_ERR_INVALID_ARGUMENT, "ctx is NULL",
               dst_checkpoint_save_model(nullptr, a.data(), 1, nts.data(), 2, g.c_str(), nullptr));
    expect_bad(DST_ERR_INVALID_ARGUMENT, "occurs twice",
               dst_checkpoint_save_model(a.ctx.get(), a.data(), 1, dup, 2, g.c_str(), nullptr));
    dst_named_tensor clash = w.nt();
    clash.name = "layer.0.attn_qkvw";
    expect_bad(DST_ERR_INVALID_ARGUMENT, "occurs twice",
               dst_checkpoint_save_model(a.ctx.get(), a.data(), 1, &clash, 1, g.c_str(), nullptr));
    dst_named_tensor bad = w.nt();
    bad.name = "";
    expect_bad(DST_ERR_INVALID_ARGUMENT, "tensors[0].name has 0 bytes",
               dst_checkpoint_save_model(a.ctx.get(), nullptr, 0, &bad, 1, g.c_str(), nullptr));
    bad.name = "caf\xe9";
    expect_bad(DST_ERR_INVALID_ARGUMENT, "not valid UTF-8",
               dst_checkpoint_save_model(a.ctx.get(), nullptr, 0, &bad, 1, g.c_str(), nullptr));
    bad = w.nt();
    bad.tensor.ndim = 0;
    expect_bad(DST_ERR_INVALID_ARGUMENT, "ndim 0",
               dst_checkpoint_save_model(a.ctx.get(), nullptr, 0, &bad, 1, g.c_str(), nullptr));
    expect_bad(DST_ERR_INVALID_ARGUMENT, "nothing to save",
               dst_checkpoint_save_model(a.ctx.get(), nullptr, 0, nullptr, 0, g.c_str(), nullptr));
    expect_bad(DST_ERR_INVALID_ARGUMENT, "tensors is NULL",
               dst_checkpoint_save_model(a.ctx.get(), nullptr, 0, nullptr, 2, g.c_str(), nullptr));
    Stack other = make_stack(1, DST_DTYPE_FP32, false, 3);
    expect_bad(DST_ERR_INVALID_ARGUMENT, "another context",
               dst_checkpoint_save_model(a.ctx.get(), other.data(), 1, nts.data(), 2, g.c_str(), nullptr));
    EXPECT_FALSE(fs::exists(g));

    // Load: a required tensor missing, a wrong shape, a wrong dtype, overlapping targets — nothing changes.
    Stack b = make_stack(1, DST_DTYPE_FP32, false, 9);
    const Snapshot before = snapshot(b);
    Named w2 = make_named("emb", DST_DTYPE_FP32, {5, 16}, 5), ids2 = make_named("ids", DST_DTYPE_INT32, {4}, 6);
    const std::vector<char> w2_before = w2.mem, ids2_before = ids2.mem;
    int32_t found[3] = {7, 7, 7};
    auto load_fails = [&](std::vector<dst_named_tensor> ts, dst_status st, const std::string &frag) {
        expect_bad(st, frag,
                   dst_checkpoint_load_model(b.ctx.get(), b.data(), 1, ts.data(), static_cast<int>(ts.size()), found,
                                             f.c_str(), nullptr, nullptr, 0, nullptr));
        EXPECT_TRUE(snapshot(b) == before) << frag;
        EXPECT_EQ(w2.mem, w2_before) << frag;
        EXPECT_EQ(ids2.mem, ids2_before) << frag;
        EXPECT_EQ(found[0], 7) << frag;
        EXPECT_EQ(slurp(f), bytes);
    };
    Named missing = make_named("cls.predictions.bias", DST_DTYPE_FP32, {5}, 1);
    load_fails({w2.nt(), ids2.nt(), missing.nt()}, DST_ERR_FORMAT, "\"cls.predictions.bias\" (tensors[2]) is missing");
    Named shape = make_named("emb", DST_DTYPE_FP32, {4, 16}, 1);
    load_fails({shape.nt()}, DST_ERR_FORMAT, "has shape [5, 16], expected [4, 16]");
    Named as_float = make_named("ids", DST_DTYPE_FP32, {4}, 1);
    load_fails({w2.nt(), as_float.nt()}, DST_ERR_FORMAT, "\"ids\" in");
    Named as_int = make_named("emb", DST_DTYPE_INT32, {5, 16}, 1);
    load_fails({as_int.nt()}, DST_ERR_FORMAT, "has dtype F32, expected I32");
    dst_named_tensor half = w2.nt();
    half.name = "ids";
    half.tensor.dtype = DST_DTYPE_INT32;
    half.tensor.ndim = 1;
    half.tensor.shape[0] = 4;
    load_fails({w2.nt(), half}, DST_ERR_INVALID_ARGUMENT, "overlap");
    Stack pre = make_stack(1, DST_DTYPE_FP32, true, 9);
    dst_checkpoint_options o;
    dst_checkpoint_options_default(&o);
    o.layout = DST_LAYOUT_HF_BERT;
    expect_bad(DST_ERR_INVALID_ARGUMENT, "Pre-LN",
               dst_checkpoint_save_model(pre.ctx.get(), pre.data(), 1, nullptr, 0, g.c_str(), &o));
}

TEST_F(Checkpoint, HfImportOfHandMadeFile) {
    const int64_t H = 16, I = 40;
    for (const std::string &prefix : std::vector<std::string>{"bert.encoder.", "encoder.", ""}) {
        SCOPED_TRACE("prefix \"" + prefix + "\"");
        std::vector<StT> ts = hf_layer_tensors(prefix, 0, H, I, 1);
        const std::vector<StT> l1 = hf_layer_tensors(prefix, 1, H, I, 2);
        ts.insert(ts.end(), l1.begin(), l1.end());
        StT emb{"bert.embeddings.word_embeddings.weight", "F32", {30, H}, std::string(30 * H * 4, '\0')};
        uint64_t seed = 3;
        fill_random(emb.data.data(), DST_DTYPE_FP32, 30 * H, seed);
        StT pool{"bert.pooler.dense.bias", "F16", {H}, std::string(H * 2, '\x11')};
        ts.push_back(emb);
        ts.push_back(pool);
        const std::string f = path("hand.safetensors");
        spit(f, build(ts, {{"format", "pt"}}).bytes());

        Stack s = make_stack(2, DST_DTYPE_FP32, false, 7);
        dst_checkpoint_options o;
        dst_checkpoint_options_default(&o);
        o.layout = DST_LAYOUT_HF_BERT;
        size_t len = 99;
        ASSERT_DST_OK(dst_checkpoint_load(s.data(), 2, f.c_str(), &o, nullptr, 0, &len));
        EXPECT_EQ(len, 0u);
        for (int i = 0; i < 2; ++i) {
            const std::string b = prefix + "layer." + std::to_string(i) + ".";
            for (int p = 0; p < DST_PARAM_COUNT; ++p) {
                std::string want;
                for (const std::string &suffix : kHf[p]) want += find(ts, b + suffix).data;
                EXPECT_EQ(region(s.ctx.get(), s.layers[i], p, false), want) << b << kNames[p];
            }
        }

        // The same file converted to the DeepSpeed layout; the other tensors pass through unchanged.
        const std::string out = path("hand_ds.safetensors");
        char summary[512];
        ASSERT_DST_OK(dst_checkpoint_convert(f.c_str(), DST_LAYOUT_HF_BERT, nullptr, out.c_str(), DST_LAYOUT_DEEPSPEED,
                                             nullptr, summary, sizeof summary));
        EXPECT_TRUE(contains(summary, "passed through unchanged: 2 tensor(s)")) << summary;
        EXPECT_TRUE(contains(summary, "bert.embeddings.word_embeddings.weight")) << summary;
        EXPECT_TRUE(contains(summary, "prefix \"" + prefix + "\" (detected)")) << summary;
        const StRead r = st_read(out);
        EXPECT_EQ(r.tensor("bert.embeddings.word_embeddings.weight"), emb.data);
        EXPECT_EQ(r.tensor("bert.pooler.dense.bias"), pool.data);
        EXPECT_EQ(r.hdr["bert.pooler.dense.bias"]["dtype"], "F16");
        EXPECT_EQ(r.meta("format"), "pt");
        EXPECT_EQ(r.meta("layout"), "deepspeed");
        EXPECT_EQ(r.names().size(), 2u + 24u);
        Stack t = make_stack(2, DST_DTYPE_FP32, false, 8);
        o.layout = DST_LAYOUT_DEEPSPEED;
        o.prefix = prefix.c_str();
        ASSERT_DST_OK(dst_checkpoint_load(t.data(), 2, out.c_str(), &o, nullptr, 0, nullptr));
        EXPECT_TRUE(snapshot(t) == snapshot(s));
        // The summary is truncated to fit a small buffer.
        char tiny[10];
        ASSERT_DST_OK(dst_checkpoint_convert(f.c_str(), DST_LAYOUT_HF_BERT, nullptr, out.c_str(), DST_LAYOUT_DEEPSPEED,
                                             nullptr, tiny, sizeof tiny));
        EXPECT_EQ(std::strlen(tiny), 9u);
    }
}

TEST_F(Checkpoint, HfLayoutRefusesPreLn) {
    Stack pre = make_stack(2, DST_DTYPE_FP32, true, 1);
    dst_checkpoint_options o;
    dst_checkpoint_options_default(&o);
    o.layout = DST_LAYOUT_HF_BERT;
    const std::string f = path("pre.safetensors");
    EXPECT_EQ(dst_checkpoint_save(pre.data(), 2, f.c_str(), &o), DST_ERR_INVALID_ARGUMENT);
    EXPECT_TRUE(contains(dst_last_error(), "layers[0] is a Pre-LN layer")) << dst_last_error();
    EXPECT_FALSE(fs::exists(f));

    // A valid HF file into Pre-LN layers.
    Stack post = make_stack(2, DST_DTYPE_FP32, false, 1);
    ASSERT_DST_OK(dst_checkpoint_save(post.data(), 2, f.c_str(), &o));
    expect_load_fails(pre, slurp(f), DST_ERR_INVALID_ARGUMENT, {"layers[0]", "Pre-LN", "DST_LAYOUT_DEEPSPEED"}, &o);

    // Converting a Pre-LN DeepSpeed checkpoint to the HF layout.
    const std::string ds = path("pre_ds.safetensors"), out = path("pre_hf.safetensors");
    ASSERT_DST_OK(dst_checkpoint_save(pre.data(), 2, ds.c_str(), nullptr));
    EXPECT_EQ(dst_checkpoint_convert(ds.c_str(), DST_LAYOUT_DEEPSPEED, nullptr, out.c_str(), DST_LAYOUT_HF_BERT,
                                     nullptr, nullptr, 0),
              DST_ERR_INVALID_ARGUMENT);
    EXPECT_TRUE(contains(dst_last_error(), "Pre-LN")) << dst_last_error();
    EXPECT_FALSE(fs::exists(out));
}

// ---- the failure suite --------------------------------------------------------------------------
TEST_F(Checkpoint, EveryTruncationFailsCleanly) {
    Stack a = make_stack(1, DST_DTYPE_FP16, false, 1, 8, 2, 8);
    randomize(a, false, 7);
    dst_checkpoint_options o;
    dst_checkpoint_options_default(&o);
    o.client_state = "c";
    const std::string f = path("small.safetensors");
    ASSERT_DST_OK(dst_checkpoint_save(a.data(), 1, f.c_str(), &o));
    const std::string full = slurp(f);
    Stack s = make_stack(1, DST_DTYPE_FP16, false, 2, 8, 2, 8);
    const Snapshot before = snapshot(s);
    const std::string cut_path = path("cut.safetensors"), out = path("cut_out.safetensors");
    for (size_t cut = 0; cut < full.size(); ++cut) {
        const std::string bytes = full.substr(0, cut);
        spit(cut_path, bytes);
        const dst_status st = dst_checkpoint_load(s.data(), 1, cut_path.c_str(), nullptr, nullptr, 0, nullptr);
        ASSERT_EQ(st, DST_ERR_FORMAT) << "cut at " << cut << ": " << dst_last_error();
        ASSERT_TRUE(contains(dst_last_error(), cut_path) || contains(dst_last_error(), "tensor \""))
            << "cut at " << cut << ": " << dst_last_error();
        const dst_status cs = dst_checkpoint_convert(cut_path.c_str(), DST_LAYOUT_DEEPSPEED, nullptr, out.c_str(),
                                                     DST_LAYOUT_HF_BERT, nullptr, nullptr, 0);
        ASSERT_EQ(cs, DST_ERR_FORMAT) << "cut at " << cut << ": " << dst_last_error();
        char text[8] = "keep";
        size_t len = 12345;
        ASSERT_EQ(dst_checkpoint_describe(cut_path.c_str(), text, sizeof text, &len), DST_ERR_FORMAT)
            << "cut at " << cut;
        ASSERT_TRUE(std::string(text) == "keep" && len == 12345u) << "cut at " << cut;
        ASSERT_EQ(slurp(cut_path), bytes);
    }
    EXPECT_TRUE(snapshot(s) == before);
    EXPECT_FALSE(fs::exists(out));
    ASSERT_DST_OK(dst_checkpoint_load(s.data(), 1, f.c_str(), nullptr, nullptr, 0, nullptr));
    EXPECT_TRUE(snapshot(s) == snapshot(a));
}

TEST_F(Checkpoint, CorruptHeaderLength) {
    Stack s = make_stack(1, DST_DTYPE_FP32, false, 1);
    ASSERT_DST_OK(dst_checkpoint_save(s.data(), 1, path("ok.safetensors").c_str(), nullptr));
    const std::string good = slurp(path("ok.safetensors"));
    Stack t = make_stack(1, DST_DTYPE_FP32, false, 2);
    auto with_len = [&](uint64_t n) {
        std::string b = good;
        for (int i = 0; i < 8; ++i) b[i] = static_cast<char>((n >> (8 * i)) & 0xff);
        return b;
    };
    uint64_t n = 0;
    for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<unsigned char>(good[i]);
    expect_load_fails(t, with_len(~0ull), DST_ERR_FORMAT, {"header length 18446744073709551615"});
    expect_load_fails(t, with_len(uint64_t(1) << 63), DST_ERR_FORMAT, {"header length"});
    expect_load_fails(t, with_len(good.size() - 7), DST_ERR_FORMAT, {"header length"});
    expect_load_fails(t, with_len(0), DST_ERR_FORMAT, {"header length 0"});
    const size_t last_brace = good.substr(8, n).find_last_of('}');
    expect_load_fails(t, with_len(last_brace), DST_ERR_FORMAT, {"not valid JSON"});
    expect_load_fails(t, with_len(n + 8), DST_ERR_FORMAT, {"not valid JSON"});
    // A header above 100 MiB is refused before it is read (a sparse file keeps the test cheap).
    const std::string huge = path("huge.safetensors");
    {
        const uint64_t len = (uint64_t(100) << 20) + 8;
        std::string head(8, '\0');
        for (int i = 0; i < 8; ++i) head[i] = static_cast<char>((len >> (8 * i)) & 0xff);
        spit(huge, head + "{");
        ASSERT_EQ(::truncate(huge.c_str(), static_cast<off_t>(len + 16)), 0);
    }
    const Snapshot before = snapshot(t);
    EXPECT_EQ(dst_checkpoint_load(t.data(), 1, huge.c_str(), nullptr, nullptr, 0, nullptr), DST_ERR_FORMAT);
    EXPECT_TRUE(contains(dst_last_error(), "above the limit")) << dst_last_error();
    EXPECT_TRUE(snapshot(t) == before);
}

TEST_F(Checkpoint, MalformedHeaders) {
    const int64_t H = 16, I = 40;
    Stack t = make_stack(1, DST_DTYPE_FP32, false, 2);
    const std::vector<StT> ts = ds_layer_tensors("", 0, H, I, 1);
    const Built ok = build(ts);
    spit(path("valid.safetensors"), ok.bytes());
    {
        Stack u = make_stack(1, DST_DTYPE_FP32, false, 3);
        ASSERT_DST_OK(
            dst_checkpoint_load(u.data(), 1, path("valid.safetensors").c_str(), nullptr, nullptr, 0, nullptr));
    }
    auto mutated = [&](const std::function<void(ojson &)> &f) {
        Built b = ok;
        f(b.hdr);
        return b.bytes();
    };
    // Invalid JSON and non-objects.
    {
        std::string b = ok.bytes();
        b[8] = '[';
        expect_load_fails(t, b, DST_ERR_FORMAT, {"does not start with '{'"});
        b = ok.bytes();
        b[9] = '#';
        expect_load_fails(t, b, DST_ERR_FORMAT, {"not valid JSON"});
        expect_load_fails(t, raw_file("{\"a\": [1, 2}        ", ""), DST_ERR_FORMAT, {"not valid JSON"});
        expect_load_fails(t, raw_file("{} {}", ""), DST_ERR_FORMAT, {"not valid JSON"});
        expect_load_fails(t,
                          raw_file("{\"x\": {\"dtype\": \"F32\", \"shape\": [], \"data_offsets\": [0, 4]}, "
                                   "\"x\": {\"dtype\": \"F32\", \"shape\": [], \"data_offsets\": [4, 8]}}",
                                   std::string(8, '\0')),
                          DST_ERR_FORMAT, {"duplicate key \"x\""});
        expect_load_fails(t, raw_file("{\"x\": 5}", ""), DST_ERR_FORMAT, {"tensor \"x\"", "not a JSON object"});
        expect_load_fails(t, raw_file("{\"x\": {\"a\": [[[[[[[[[[[[1]]]]]]]]]]]]}}", ""), DST_ERR_FORMAT, {"nesting"});
        expect_load_fails(t, raw_file("{\"x\": {\"dtype\": \"F32\", \"shape\": [1]}}", ""), DST_ERR_FORMAT,
                          {"tensor \"x\"", "data_offsets"});
    }
    // Offsets.
    expect_load_fails(t, mutated([](ojson &h) {
                          h["layer.0.attn_ob"]["data_offsets"] = {0, 64};
                      }),
                      DST_ERR_FORMAT, {"overlapping", "layer.0.attn_ob", "layer.0.attn_qkvw"});
    expect_load_fails(t, mutated([&](ojson &h) {
                          const uint64_t e = ok.data.size();
                          h["layer.0.norm_b"]["data_offsets"] = {e - 60, e + 4};
                      }),
                      DST_ERR_FORMAT, {"tensor \"layer.0.norm_b\"", "past the data section"});
    expect_load_fails(t, mutated([](ojson &h) {
                          h["layer.0.norm_b"]["data_offsets"] = {64, 0};
                      }),
                      DST_ERR_FORMAT, {"tensor \"layer.0.norm_b\"", "begin > end"});
    expect_load_fails(t, mutated([](ojson &h) {
                          h["layer.0.norm_b"]["data_offsets"] = {-4, 60};
                      }),
                      DST_ERR_FORMAT, {"tensor \"layer.0.norm_b\"", "data_offsets"});
    expect_load_fails(t, mutated([](ojson &h) { h["layer.0.norm_b"]["data_offsets"] = {0}; }), DST_ERR_FORMAT,
                      {"tensor \"layer.0.norm_b\"", "data_offsets"});
    // Dtypes.
    expect_load_fails(t, mutated([](ojson &h) { h["layer.0.attn_ob"]["dtype"] = "F33"; }), DST_ERR_FORMAT,
                      {"tensor \"layer.0.attn_ob\"", "unknown dtype \"F33\""});
    expect_load_fails(t, mutated([](ojson &h) { h["layer.0.attn_ob"]["dtype"] = 32; }), DST_ERR_FORMAT,
                      {"tensor \"layer.0.attn_ob\"", "dtype"});
    expect_load_fails(t, mutated([](ojson &h) { h["layer.0.attn_ob"]["dtype"] = "I32"; }), DST_ERR_FORMAT,
                      {"tensor \"layer.0.attn_ob\"", "has dtype I32"});
    // Shapes and element counts.
    expect_load_fails(t, mutated([](ojson &h) {
                          h["layer.0.attn_ow"]["shape"] = {8, 32};
                      }),
                      DST_ERR_FORMAT, {"tensor \"layer.0.attn_ow\"", "has shape [8, 32], expected [16, 16]"});
    expect_load_fails(t, mutated([](ojson &h) { h["layer.0.norm_b"]["shape"] = {17}; }), DST_ERR_FORMAT,
                      {"tensor \"layer.0.norm_b\"", "span 64 bytes", "17 elements"});
    expect_load_fails(t, mutated([](ojson &h) { h["layer.0.norm_b"]["shape"] = {-16}; }), DST_ERR_FORMAT,
                      {"tensor \"layer.0.norm_b\"", "\"shape\"[0]"});
    expect_load_fails(t, mutated([](ojson &h) { h["layer.0.norm_b"]["shape"] = {16.0}; }), DST_ERR_FORMAT,
                      {"tensor \"layer.0.norm_b\"", "\"shape\"[0]"});
    expect_load_fails(t, mutated([](ojson &h) {
                          h["layer.0.norm_b"]["shape"] = {uint64_t(1) << 62, uint64_t(1) << 62};
                      }),
                      DST_ERR_FORMAT, {"tensor \"layer.0.norm_b\"", "overflows"});
    expect_load_fails(t, mutated([](ojson &h) { h["layer.0.norm_b"]["shape"] = "16"; }), DST_ERR_FORMAT,
                      {"tensor \"layer.0.norm_b\"", "shape"});
    // Missing tensors and gradients.
    expect_load_fails(t, mutated([](ojson &h) { h.erase("layer.0.norm_b"); }), DST_ERR_FORMAT,
                      {"tensor \"layer.0.norm_b\"", "missing"});
    dst_checkpoint_options o;
    dst_checkpoint_options_default(&o);
    o.include_grads = 1;
    expect_load_fails(t, ok.bytes(), DST_ERR_FORMAT, {"tensor \"grad.layer.0.attn_qkvw\"", "missing"}, &o);
    // A layer of another size.
    Stack small = make_stack(1, DST_DTYPE_FP32, false, 2, 8, 2, 40);
    expect_load_fails(small, ok.bytes(), DST_ERR_FORMAT, {"tensor \"layer.0.attn_qkvw\"", "expected [24, 8]"});
    // Metadata.
    expect_load_fails(t, mutated([](ojson &h) {
                          h["__metadata__"] = {{"a", 1}};
                      }),
                      DST_ERR_FORMAT, {"__metadata__", "\"a\""});
    expect_load_fails(t, mutated([](ojson &h) { h["__metadata__"] = "x"; }), DST_ERR_FORMAT, {"__metadata__"});
    expect_load_fails(t, mutated([](ojson &h) {
                          h["__metadata__"] = {{"rng_seed", "12x"}, {"rng_offset", "0"}};
                      }),
                      DST_ERR_FORMAT, {"rng_seed"});
    expect_load_fails(t, mutated([](ojson &h) {
                          h["__metadata__"] = {{"rng_seed", "1"}};
                      }),
                      DST_ERR_FORMAT, {"rng_offset"});
    expect_load_fails(t, mutated([](ojson &h) {
                          h["__metadata__"] = {{"rng_seed", "18446744073709551616"}, {"rng_offset", "0"}};
                      }),
                      DST_ERR_FORMAT, {"rng_seed"});
    // The graph dropout counter is a 32-bit word (optional: absent reads as 0).
    expect_load_fails(t, mutated([](ojson &h) {
                          h["__metadata__"] = {{"rng_seed", "1"}, {"rng_offset", "0"}, {"rng_graph_counter", "4294967296"}};
                      }),
                      DST_ERR_FORMAT, {"rng_graph_counter"});
    expect_load_fails(t, mutated([](ojson &h) {
                          h["__metadata__"] = {{"rng_seed", "1"}, {"rng_offset", "0"}, {"rng_graph_counter", "-1"}};
                      }),
                      DST_ERR_FORMAT, {"rng_graph_counter"});
    // Files that are not there or not files.
    const Snapshot before = snapshot(t);
    EXPECT_EQ(dst_checkpoint_load(t.data(), 1, path("absent.safetensors").c_str(), nullptr, nullptr, 0, nullptr),
              DST_ERR_IO);
    EXPECT_TRUE(contains(dst_last_error(), "No such file")) << dst_last_error();
    EXPECT_EQ(dst_checkpoint_load(t.data(), 1, dir_.c_str(), nullptr, nullptr, 0, nullptr), DST_ERR_IO);
    EXPECT_TRUE(contains(dst_last_error(), "not a regular file")) << dst_last_error();
    EXPECT_TRUE(snapshot(t) == before);
}

TEST_F(Checkpoint, FullDiskLeavesTheOldFile) {
    Stack old = make_stack(1, DST_DTYPE_FP32, false, 1, 8, 2, 8);
    const std::string f = path("ckpt.safetensors");
    ASSERT_DST_OK(dst_checkpoint_save(old.data(), 1, f.c_str(), nullptr));
    const std::string before = slurp(f);
    Stack big = make_stack(2, DST_DTYPE_FP32, false, 2, 64, 4, 256);  // 0.4 MB

    // A file-size limit makes write() fail with EFBIG, as a full disk fails with ENOSPC.
    struct rlimit saved;
    ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &saved), 0);
    struct sigaction ign {
    }, prev{};
    ign.sa_handler = SIG_IGN;
    ASSERT_EQ(::sigaction(SIGXFSZ, &ign, &prev), 0);
    for (rlim_t limit : {rlim_t(0), rlim_t(6), rlim_t(100), rlim_t(20000), rlim_t(300000)}) {
        struct rlimit lim = saved;
        lim.rlim_cur = limit;
        ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &lim), 0);
        const dst_status st = dst_checkpoint_save(big.data(), 2, f.c_str(), nullptr);
        const std::string msg = dst_last_error();
        ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &saved), 0);
        EXPECT_EQ(st, DST_ERR_IO) << "limit " << limit << ": " << msg;
        EXPECT_TRUE(contains(msg, std::strerror(EFBIG))) << msg;
        EXPECT_TRUE(contains(msg, f)) << msg;
        EXPECT_TRUE(slurp(f) == before) << "limit " << limit;
        EXPECT_EQ(listing(dir_), std::vector<std::string>{"ckpt.safetensors"}) << "the temporary file must be removed";
    }
    ::sigaction(SIGXFSZ, &prev, nullptr);
    Stack back = make_stack(1, DST_DTYPE_FP32, false, 9, 8, 2, 8);
    ASSERT_DST_OK(dst_checkpoint_load(back.data(), 1, f.c_str(), nullptr, nullptr, 0, nullptr));
    EXPECT_TRUE(snapshot(back) == snapshot(old));
}

TEST_F(Checkpoint, UnwritableFolderLeavesTheOldFile) {
    Stack s = make_stack(1, DST_DTYPE_FP32, false, 1, 8, 2, 8);
    const std::string ro = path("ro"), f = ro + "/ckpt.safetensors";
    ASSERT_EQ(::mkdir(ro.c_str(), 0755), 0);
    ASSERT_DST_OK(dst_checkpoint_save(s.data(), 1, f.c_str(), nullptr));
    ASSERT_EQ(::chmod(f.c_str(), 0666), 0);
    const std::string before = slurp(f);
    ASSERT_EQ(::chmod(ro.c_str(), 0555), 0);
    randomize(s, false, 3);

    // root ignores permissions: the save runs in a child process that drops to an unprivileged user.
    int fds[2];
    ASSERT_EQ(::pipe(fds), 0);
    const pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
        ::close(fds[0]);
        int code = 0;
        if (::geteuid() == 0 && (::setgid(65534) != 0 || ::setuid(65534) != 0)) code = 77;
        std::string msg;
        if (code == 0) {
            const dst_status st = dst_checkpoint_save(s.data(), 1, f.c_str(), nullptr);
            code = static_cast<int>(st);
            msg = dst_last_error();
        }
        if (::write(fds[1], msg.data(), msg.size()) < 0) code = 78;
        ::close(fds[1]);
        ::_exit(code);
    }
    ::close(fds[1]);
    std::string msg;
    char buf[512];
    for (ssize_t n; (n = ::read(fds[0], buf, sizeof buf)) > 0;) msg.append(buf, static_cast<size_t>(n));
    ::close(fds[0]);
    int wst = 0;
    ASSERT_EQ(::waitpid(pid, &wst, 0), pid);
    ASSERT_TRUE(WIFEXITED(wst));
    if (WEXITSTATUS(wst) == 77) GTEST_SKIP() << "cannot drop root privileges here";
    EXPECT_EQ(WEXITSTATUS(wst), static_cast<int>(DST_ERR_IO)) << msg;
    EXPECT_TRUE(contains(msg, std::strerror(EACCES))) << msg;
    EXPECT_TRUE(contains(msg, "cannot create a temporary file")) << msg;
    EXPECT_EQ(slurp(f), before);
    EXPECT_EQ(listing(ro), std::vector<std::string>{"ckpt.safetensors"});
}

TEST_F(Checkpoint, BadDestinations) {
    Stack s = make_stack(1, DST_DTYPE_FP32, false, 1, 8, 2, 8);
    EXPECT_EQ(dst_checkpoint_save(s.data(), 1, path("nodir/x.safetensors").c_str(), nullptr), DST_ERR_IO);
    EXPECT_TRUE(contains(dst_last_error(), std::strerror(ENOENT))) << dst_last_error();
    const std::string d = path("adir");
    ASSERT_EQ(::mkdir(d.c_str(), 0755), 0);
    EXPECT_EQ(dst_checkpoint_save(s.data(), 1, d.c_str(), nullptr), DST_ERR_IO);
    EXPECT_TRUE(contains(dst_last_error(), "cannot rename")) << dst_last_error();
    EXPECT_TRUE(fs::is_directory(d));
    EXPECT_EQ(listing(dir_), std::vector<std::string>{"adir"});
    // The mode of a replaced file is kept; a new file gets 0666 less the umask.
    const std::string f = path("mode.safetensors");
    ASSERT_DST_OK(dst_checkpoint_save(s.data(), 1, f.c_str(), nullptr));
    const mode_t mask = ::umask(022);
    ::umask(mask);
    EXPECT_EQ(fs::status(f).permissions(), static_cast<fs::perms>(0666 & ~mask));
    ASSERT_EQ(::chmod(f.c_str(), 0640), 0);
    ASSERT_DST_OK(dst_checkpoint_save(s.data(), 1, f.c_str(), nullptr));
    EXPECT_EQ(fs::status(f).permissions(), static_cast<fs::perms>(0640));
}

TEST_F(Checkpoint, ConvertFailures) {
    const int64_t H = 16, I = 40;
    const std::string in = path("in.safetensors"), out = path("out.safetensors");
    spit(out, "existing");
    auto expect_fails = [&](const std::string &bytes, dst_weight_layout from, dst_weight_layout to, dst_status status,
                            const std::vector<std::string> &fragments) {
        spit(in, bytes);
        const dst_status st = dst_checkpoint_convert(in.c_str(), from, nullptr, out.c_str(), to, nullptr, nullptr, 0);
        EXPECT_EQ(st, status) << dst_last_error();
        for (const std::string &frag : fragments)
            EXPECT_TRUE(contains(dst_last_error(), frag)) << "'" << frag << "' not in: " << dst_last_error();
        EXPECT_EQ(slurp(out), "existing");
        EXPECT_EQ(slurp(in), bytes);
        EXPECT_EQ(listing(dir_), (std::vector<std::string>{"in.safetensors", "out.safetensors"}));
    };
    std::vector<StT> hf = hf_layer_tensors("bert.encoder.", 0, H, I, 1);
    std::vector<StT> incomplete;
    for (const StT &t : hf)
        if (t.name != "bert.encoder.layer.0.attention.self.value.weight") incomplete.push_back(t);
    expect_fails(build(incomplete).bytes(), DST_LAYOUT_HF_BERT, DST_LAYOUT_DEEPSPEED, DST_ERR_FORMAT,
                 {"layer 0", "incomplete", "\"bert.encoder.layer.0.attention.self.value.weight\""});
    std::vector<StT> mixed = hf;
    for (StT &t : mixed)
        if (t.name == "bert.encoder.layer.0.attention.self.key.bias") {
            t.dtype = "F16";
            t.data.resize(t.data.size() / 2);
        }
    expect_fails(build(mixed).bytes(), DST_LAYOUT_HF_BERT, DST_LAYOUT_DEEPSPEED, DST_ERR_FORMAT,
                 {"different dtypes", "attention.self.key.bias"});
    std::vector<StT> badshape = hf;
    for (StT &t : badshape)
        if (t.name == "bert.encoder.layer.0.intermediate.dense.bias") {
            t.shape = {I - 1};
            t.data.resize(t.data.size() - 4);
        }
    expect_fails(build(badshape).bytes(), DST_LAYOUT_HF_BERT, DST_LAYOUT_DEEPSPEED, DST_ERR_FORMAT,
                 {"\"bert.encoder.layer.0.intermediate.dense.bias\"", "expected [40]"});
    expect_fails(build(hf).bytes(), DST_LAYOUT_DEEPSPEED, DST_LAYOUT_HF_BERT, DST_ERR_FORMAT,
                 {"no layer tensors of the deepspeed layout"});
    // A file that already holds the names the conversion would write.
    std::vector<StT> clash = hf;
    StT extra{"bert.encoder.layer.0.attn_qkvw", "F32", {1}, std::string(4, '\0')};
    clash.push_back(extra);
    expect_fails(build(clash).bytes(), DST_LAYOUT_HF_BERT, DST_LAYOUT_DEEPSPEED, DST_ERR_FORMAT,
                 {"\"bert.encoder.layer.0.attn_qkvw\"", "same name"});
    expect_fails("garbage", DST_LAYOUT_HF_BERT, DST_LAYOUT_DEEPSPEED, DST_ERR_FORMAT, {"too short"});
    EXPECT_EQ(dst_checkpoint_convert(path("absent").c_str(), DST_LAYOUT_HF_BERT, nullptr, out.c_str(),
                                     DST_LAYOUT_DEEPSPEED, nullptr, nullptr, 0),
              DST_ERR_IO);
    EXPECT_EQ(slurp(out), "existing");
}

// dst_checkpoint_describe: what a file holds, without layers; truncation; errors leave the buffer.
TEST_F(Checkpoint, Describe) {
    Stack a = make_stack(3, DST_DTYPE_FP16, false, 1);
    randomize(a, true, 3);
    dst_checkpoint_options o;
    dst_checkpoint_options_default(&o);
    o.include_grads = 1;
    o.client_state = "epoch=3";
    const std::string f = path("described.safetensors");
    ASSERT_DST_OK(dst_checkpoint_save(a.data(), 3, f.c_str(), &o));
    std::vector<StT> ts = hf_layer_tensors("bert.encoder.", 4, 16, 40, 1);
    ts.push_back(StT{"bert.pooler.dense.bias", "F32", {16}, std::string(64, '\0')});
    const std::string hf = path("hf.safetensors");
    spit(hf, build(ts, {{"format", "pt"}}).bytes());

    std::vector<char> text(1 << 14, 'x');
    size_t len = 0;
    ASSERT_DST_OK(dst_checkpoint_describe(f.c_str(), text.data(), text.size(), &len));
    std::string d(text.data());
    EXPECT_EQ(d.size(), len);
    EXPECT_TRUE(contains(d, "file: " + f + " (" + std::to_string(fs::file_size(f)) + " bytes")) << d;
    EXPECT_TRUE(contains(d, "tensors: 72\ndtypes: F16 x72\n")) << d;
    EXPECT_TRUE(contains(d, "layers: 3 (layout deepspeed, prefix \"\", 36 tensors)")) << d;
    EXPECT_TRUE(contains(d, "layers: 3 gradient sets (layout deepspeed, prefix \"\", 36 tensors)")) << d;
    EXPECT_TRUE(contains(d, "other tensors: 0\n")) << d;
    EXPECT_TRUE(contains(d, "  client_state: epoch=3\n")) << d;
    EXPECT_TRUE(contains(d, "  layout: deepspeed\n")) << d;

    ASSERT_DST_OK(dst_checkpoint_describe(hf.c_str(), text.data(), text.size(), &len));
    d = text.data();
    EXPECT_TRUE(contains(d, "tensors: 17\n")) << d;
    EXPECT_TRUE(contains(d, "layers: 1 (layout hf_bert, prefix \"bert.encoder.\", 16 tensors)")) << d;
    EXPECT_TRUE(contains(d, "other tensors: 1\n")) << d;
    EXPECT_TRUE(contains(d, "metadata: 1 entries\n  format: pt\ntensor list (name: dtype [shape], bytes):\n")) << d;
    EXPECT_TRUE(contains(d, "\n  bert.pooler.dense.bias: F32 [16], 64\n")) << d;
    EXPECT_TRUE(contains(d, "\n  bert.encoder.layer.4.intermediate.dense.weight: F32 [40, 16], 2560\n")) << d;

    // Truncated to the buffer, NUL-terminated; the full length is reported; NULL buffer: length only.
    char small[10];
    size_t full = 0;
    ASSERT_DST_OK(dst_checkpoint_describe(hf.c_str(), small, sizeof small, &full));
    EXPECT_EQ(std::string(small), d.substr(0, 9));
    EXPECT_EQ(full, d.size());
    full = 0;
    ASSERT_DST_OK(dst_checkpoint_describe(hf.c_str(), nullptr, 0, &full));
    EXPECT_EQ(full, d.size());
    ASSERT_DST_OK(dst_checkpoint_describe(hf.c_str(), nullptr, 0, nullptr));

    // Errors: status and message, the buffer and length untouched.
    auto fails = [&](const char *p, dst_status want, const char *frag) {
        char keep[8] = "keep";
        size_t n = 12345;
        EXPECT_EQ(dst_checkpoint_describe(p, keep, sizeof keep, &n), want) << frag;
        EXPECT_TRUE(contains(dst_last_error(), "dst_checkpoint_describe")) << dst_last_error();
        EXPECT_TRUE(contains(dst_last_error(), frag)) << dst_last_error();
        EXPECT_TRUE(std::string(keep) == "keep" && n == 12345u) << frag;
    };
    fails(nullptr, DST_ERR_INVALID_ARGUMENT, "path is NULL");
    fails("", DST_ERR_INVALID_ARGUMENT, "path is empty");
    const std::string absent = path("absent.safetensors"), bad = path("bad.safetensors");
    fails(absent.c_str(), DST_ERR_IO, "cannot open");
    spit(bad, raw_file("{\"t\": {\"dtype\": \"F32\", \"shape\": [4], \"data_offsets\": [0, 8]}}", std::string(16, '\0')));
    fails(bad.c_str(), DST_ERR_FORMAT, "\"t\"");
}

// ---- hostile inputs (issue 10) ----------------------------------------------------------------------
// Item 4: client state is bytes with a length (invalid UTF-8 and NUL bytes included) and round-trips
// exactly; a prefix that is not UTF-8 is an INVALID_ARGUMENT naming the field. Both used to fail with
// DST_ERR_INTERNAL (a JSON library exception).
TEST_F(Checkpoint, HostileClientStateAndPrefix) {
    Stack s = make_stack(2, DST_DTYPE_FP32, false, 1);
    randomize(s, false, 5);
    const std::string f = path("state.safetensors");
    const std::string bin("\xff\xfe\x00step=\x80\xc3(\x00", 12);
    dst_checkpoint_options o;
    ASSERT_DST_OK(dst_checkpoint_options_default(&o));
    EXPECT_EQ(o.client_state_len, 0u);
    o.client_state = bin.data();
    o.client_state_len = bin.size();
    ASSERT_DST_OK(dst_checkpoint_save(s.data(), 2, f.c_str(), &o));
    const StRead r = st_read(f);
    EXPECT_FALSE(r.hdr.at("__metadata__").contains("client_state")) << "binary state stored as text";
    Stack back = make_stack(2, DST_DTYPE_FP32, false, 9);
    std::vector<char> buf(64, 'x');
    size_t len = 0;
    ASSERT_DST_OK(dst_checkpoint_load(back.data(), 2, f.c_str(), nullptr, buf.data(), buf.size(), &len));
    EXPECT_EQ(len, bin.size());
    EXPECT_EQ(std::string(buf.data(), len), bin);
    EXPECT_EQ(buf[len], '\0');
    EXPECT_TRUE(snapshot(back).regions == snapshot(s).regions);
    // A NUL-terminated string with invalid UTF-8 (client_state_len 0) is stored the same way.
    const char latin1[] = "epoch=3;caf\xe9";
    o.client_state = latin1;
    o.client_state_len = 0;
    ASSERT_DST_OK(dst_checkpoint_save(s.data(), 2, f.c_str(), &o));
    ASSERT_DST_OK(dst_checkpoint_load(back.data(), 2, f.c_str(), nullptr, buf.data(), buf.size(), &len));
    EXPECT_EQ(std::string(buf.data(), len), latin1);
    // UTF-8 text stays readable text in the file.
    o.client_state = "epoch=4;\xc3\xa9t\xc3\xa9";
    ASSERT_DST_OK(dst_checkpoint_save(s.data(), 2, f.c_str(), &o));
    EXPECT_EQ(st_read(f).meta("client_state"), "epoch=4;\xc3\xa9t\xc3\xa9");
    ASSERT_DST_OK(dst_checkpoint_load(back.data(), 2, f.c_str(), nullptr, buf.data(), buf.size(), &len));
    EXPECT_EQ(std::string(buf.data(), len), "epoch=4;\xc3\xa9t\xc3\xa9");
    // A length without data.
    o.client_state = nullptr;
    o.client_state_len = 3;
    const std::string before = slurp(f);
    EXPECT_EQ(dst_checkpoint_save(s.data(), 2, f.c_str(), &o), DST_ERR_INVALID_ARGUMENT);
    EXPECT_TRUE(contains(dst_last_error(), "options->client_state")) << dst_last_error();

    // Prefixes that are not UTF-8: save, load and convert name the field; nothing changes.
    ASSERT_DST_OK(dst_checkpoint_options_default(&o));
    o.prefix = "enc\xff.";
    EXPECT_EQ(dst_checkpoint_save(s.data(), 2, f.c_str(), &o), DST_ERR_INVALID_ARGUMENT);
    EXPECT_TRUE(contains(dst_last_error(), "options->prefix")) << dst_last_error();
    EXPECT_TRUE(contains(dst_last_error(), "UTF-8")) << dst_last_error();
    EXPECT_EQ(slurp(f), before);
    const Snapshot snap = snapshot(back);
    EXPECT_EQ(dst_checkpoint_load(back.data(), 2, f.c_str(), &o, nullptr, 0, nullptr), DST_ERR_INVALID_ARGUMENT);
    EXPECT_TRUE(contains(dst_last_error(), "options->prefix")) << dst_last_error();
    EXPECT_TRUE(snapshot(back) == snap);
    const std::string g = path("converted.safetensors");
    EXPECT_EQ(dst_checkpoint_convert(f.c_str(), DST_LAYOUT_DEEPSPEED, nullptr, g.c_str(), DST_LAYOUT_DEEPSPEED,
                                     "x\xc3", nullptr, 0),
              DST_ERR_INVALID_ARGUMENT);
    EXPECT_TRUE(contains(dst_last_error(), "out_prefix")) << dst_last_error();
    EXPECT_EQ(dst_checkpoint_convert(f.c_str(), DST_LAYOUT_DEEPSPEED, "\x80", g.c_str(), DST_LAYOUT_DEEPSPEED,
                                     nullptr, nullptr, 0),
              DST_ERR_INVALID_ARGUMENT);
    EXPECT_TRUE(contains(dst_last_error(), "in_prefix")) << dst_last_error();
    EXPECT_FALSE(fs::exists(g));
}

// A caller built against the header before client_state_len was appended: its options struct ends after
// client_state (allocated at exactly that size, so a sanitizer build catches any read past it). It is
// accepted and its client state is a NUL-terminated string, as that header said.
struct OptionsBeforeClientStateLen {
    size_t struct_size;
    dst_weight_layout layout;
    const char *prefix;
    int32_t include_grads;
    int32_t save_dtype;
    int32_t restore_rng;
    const char *client_state;
};
static_assert(sizeof(OptionsBeforeClientStateLen) == offsetof(dst_checkpoint_options, client_state_len),
              "fields are only appended");

TEST_F(Checkpoint, OptionsOfAnOlderHeaderAreAccepted) {
    Stack s = make_stack(2, DST_DTYPE_FP32, false, 1);
    randomize(s, false, 7);
    std::unique_ptr<OptionsBeforeClientStateLen, decltype(&std::free)> old(
        static_cast<OptionsBeforeClientStateLen *>(std::malloc(sizeof(OptionsBeforeClientStateLen))), &std::free);
    ASSERT_TRUE(old);
    old->struct_size = sizeof(OptionsBeforeClientStateLen);
    old->layout = DST_LAYOUT_DEEPSPEED;
    old->prefix = "enc.";
    old->include_grads = 0;
    old->save_dtype = -1;
    old->restore_rng = 1;
    old->client_state = "step=12";
    const auto *o = reinterpret_cast<const dst_checkpoint_options *>(old.get());
    const std::string f = path("old.safetensors");
    ASSERT_DST_OK(dst_checkpoint_save(s.data(), 2, f.c_str(), o));
    EXPECT_EQ(st_read(f).meta("client_state"), "step=12");
    EXPECT_EQ(st_read(f).meta("prefix"), "enc.");
    Stack back = make_stack(2, DST_DTYPE_FP32, false, 9);
    char buf[32];
    size_t len = 0;
    ASSERT_DST_OK(dst_checkpoint_load(back.data(), 2, f.c_str(), o, buf, sizeof buf, &len));
    EXPECT_EQ(std::string(buf, len), "step=12");
    EXPECT_TRUE(snapshot(back).regions == snapshot(s).regions);
    // Sizes that split a field, or a newer header's larger struct, are refused.
    dst_checkpoint_options n;
    ASSERT_DST_OK(dst_checkpoint_options_default(&n));
    n.struct_size = offsetof(dst_checkpoint_options, prefix) + 4;
    EXPECT_EQ(dst_checkpoint_save(s.data(), 2, f.c_str(), &n), DST_ERR_INVALID_ARGUMENT);
    EXPECT_TRUE(contains(dst_last_error(), "options->struct_size")) << dst_last_error();
    n.struct_size = sizeof n + 8;
    EXPECT_EQ(dst_checkpoint_save(s.data(), 2, f.c_str(), &n), DST_ERR_UNSUPPORTED);
    EXPECT_TRUE(contains(dst_last_error(), "options->struct_size")) << dst_last_error();
}

// A call that blocks is reported by the test instead of hanging it: `call` runs on a thread; when it has
// not returned after `seconds`, `release` runs (it must make the call return) and *blocked is set.
dst_status call_with_deadline(const std::function<dst_status()> &call, const std::function<void()> &release,
                              double seconds, bool *blocked, std::string *message) {
    std::atomic<bool> done{false};
    dst_status st = DST_OK;
    std::thread t([&] {
        st = call();
        *message = dst_last_error();
        done = true;
    });
    const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
    while (!done && std::chrono::steady_clock::now() < until)
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
    *blocked = !done;
    while (!done) {
        release();
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    t.join();
    return st;
}

// Item 5: load, describe and convert on a FIFO blocked forever in open(). They return DST_ERR_IO at once.
TEST_F(Checkpoint, FifoIsRefusedWithoutBlocking) {
    Stack s = make_stack(1, DST_DTYPE_FP32, false, 1);
    const std::string fifo = path("pipe.safetensors"), out = path("out.safetensors");
    ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0) << std::strerror(errno);
    // Opening the write end releases a reader blocked in open(); the writer closes at once (EOF).
    auto release = [&] {
        const int fd = ::open(fifo.c_str(), O_WRONLY | O_NONBLOCK | O_CLOEXEC);
        if (fd >= 0) ::close(fd);
    };
    const Snapshot before = snapshot(s);
    const std::vector<std::pair<const char *, std::function<dst_status()>>> calls = {
        {"dst_checkpoint_load",
         [&] { return dst_checkpoint_load(s.data(), 1, fifo.c_str(), nullptr, nullptr, 0, nullptr); }},
        {"dst_checkpoint_describe", [&] { return dst_checkpoint_describe(fifo.c_str(), nullptr, 0, nullptr); }},
        {"dst_checkpoint_convert",
         [&] {
             return dst_checkpoint_convert(fifo.c_str(), DST_LAYOUT_DEEPSPEED, nullptr, out.c_str(), DST_LAYOUT_HF_BERT,
                                           nullptr, nullptr, 0);
         }},
    };
    for (const auto &c : calls) {
        SCOPED_TRACE(c.first);
        bool blocked = false;
        std::string msg;
        const dst_status st = call_with_deadline(c.second, release, 5.0, &blocked, &msg);
        EXPECT_FALSE(blocked) << c.first << " blocked on a FIFO until a writer appeared";
        EXPECT_EQ(st, DST_ERR_IO) << msg;
        EXPECT_TRUE(contains(msg, "not a regular file")) << msg;
        EXPECT_TRUE(contains(msg, c.first)) << msg;
    }
    EXPECT_TRUE(snapshot(s) == before);
    EXPECT_FALSE(fs::exists(out));
}

// Item 6: header validation was quadratic in the number of tensors (100,000 one-element tensors: 46 s
// to describe). Describe, load and convert of such a header, and of names built to defeat the name
// parser, scale like n log n: 10× the tensors may take at most 30× the time (quadratic work takes
// 100×), plus a fixed allowance for timer noise, each size timed by its fastest of several runs; and
// each stays within a generous absolute bound.
TEST_F(Checkpoint, HundredThousandTensorsAreFast) {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
    const double limit = 10.0;  // instrumented builds run the same O(n log n) work a few times slower
#else
    const double limit = 2.5;
#endif
    auto timed = [](const std::function<dst_status()> &f, dst_status *st) {
        const auto t0 = std::chrono::steady_clock::now();
        *st = f();
        return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    };
    struct Case {
        const char *what;
        std::function<std::string(int)> name;
    };
    const Case cases[] = {
        {"plain names", [](int i) { return "t" + std::to_string(i); }},
        {"a different prefix each", [](int i) { return "p" + std::to_string(i) + ".layer.0.attn_qkvw"; }},
        {"a grad prefix each", [](int i) { return "grad.q" + std::to_string(i) + ".layer.1.norm_b"; }},
    };
    Stack s = make_stack(1, DST_DTYPE_FP32, false, 1);
    const std::string f = path("many.safetensors"), out = path("out.safetensors");
    // Seconds of describe, load and convert of a header of n one-element tensors.
    auto run = [&](const Case &c, int n) {
        std::string json = "{";
        for (int i = 0; i < n; ++i) {
            json += (i ? ",\"" : "\"") + c.name(i) + "\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[" +
                    std::to_string(4 * i) + "," + std::to_string(4 * i + 4) + "]}";
        }
        json += "}";
        spit(f, raw_file(json, std::string(4 * size_t(n), '\0')));
        std::array<double, 3> t{};
        dst_status st;
        std::vector<char> text(1 << 12);
        size_t len = 0;
        t[0] = timed([&] { return dst_checkpoint_describe(f.c_str(), text.data(), text.size(), &len); }, &st);
        EXPECT_EQ(st, DST_OK) << dst_last_error();
        EXPECT_TRUE(contains(text.data(), ("tensors: " + std::to_string(n) + "\n").c_str())) << text.data();
        t[1] = timed([&] { return dst_checkpoint_load(s.data(), 1, f.c_str(), nullptr, nullptr, 0, nullptr); }, &st);
        EXPECT_EQ(st, DST_ERR_FORMAT) << dst_last_error();  // no layer tensors
        t[2] = timed(
            [&] {
                return dst_checkpoint_convert(f.c_str(), DST_LAYOUT_DEEPSPEED, "", out.c_str(), DST_LAYOUT_HF_BERT,
                                              nullptr, nullptr, 0);
            },
            &st);
        EXPECT_EQ(st, DST_ERR_FORMAT) << dst_last_error();
        return t;
    };
    const char *ops[3] = {"describe", "load", "convert"};
    for (const Case &c : cases) {
        SCOPED_TRACE(c.what);
        // Each size's fastest of several runs: one run of the small size (tens of ms) on a loaded
        // machine can be slowed by a scheduling hiccup as large as itself. The sizes' runs alternate,
        // so that a stretch of load on a shared machine slows both sizes rather than one.
        auto keep_fastest = [](std::array<double, 3> &t, const std::array<double, 3> &u) {
            for (int k = 0; k < 3; ++k) t[k] = std::min(t[k], u[k]);
        };
        auto small = run(c, 10000), big = run(c, 100000);
        for (int r = 1; r < 5; ++r) {
            keep_fastest(small, run(c, 10000));
            if (r < 3) keep_fastest(big, run(c, 100000));
        }
        for (int k = 0; k < 3; ++k) {
            std::printf("  %s, %s: %.3f s for 10,000 tensors, %.3f s for 100,000\n", c.what, ops[k], small[k], big[k]);
            // n log n gives about 12.5x, quadratic work 100x.
            EXPECT_LT(big[k], 30.0 * small[k] + 0.05) << ops[k] << " grows faster than n log n";
            EXPECT_LT(big[k], limit) << ops[k] << " took " << big[k] << " s";
        }
    }
    // One name of 1 MiB made of "layer.7.": every dotted component looks like the start of a layer.
    std::string name;
    while (name.size() < (1u << 20)) name += "layer.7.";
    name += "attn_qkvw";
    spit(f, raw_file("{\"" + name + "\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}",
                     std::string(4, '\0')));
    dst_status st;
    std::vector<char> text(1 << 12);
    const double t = timed([&] { return dst_checkpoint_describe(f.c_str(), text.data(), text.size(), nullptr); }, &st);
    EXPECT_EQ(st, DST_OK) << dst_last_error();
    EXPECT_LT(t, limit) << "describe of one long name took " << t << " s";
}

// Item 8: a save killed by SIGKILL left its temporary file beside the target forever. A later save of the
// same target removes it once no writer holds it; the temporary files of live saves, of other targets
// and the user's own files are left alone.
TEST_F(Checkpoint, StaleTemporaryFileOfAKilledSaveIsRemoved) {
    Stack big = make_stack(1, DST_DTYPE_FP32, false, 1, 256, 4, 1024);  // ~12 MB: the write takes a while
    const std::string f = path("ckpt.safetensors");
    const pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
        for (;;) (void)dst_checkpoint_save(big.data(), 1, f.c_str(), nullptr);
    }
    bool seen = false;
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (!seen && std::chrono::steady_clock::now() < until) {
        for (const std::string &n : listing(dir_)) seen = seen || n != "ckpt.safetensors";
        if (!seen) std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
    ::kill(pid, SIGKILL);
    int wst = 0;
    ASSERT_EQ(::waitpid(pid, &wst, 0), pid);
    ASSERT_TRUE(seen) << "never saw the temporary file of the child's save";
    // The child may have moved on to its next save; whichever temporary file it left is the stale one.
    std::vector<std::string> left;
    for (const std::string &n : listing(dir_))
        if (n != "ckpt.safetensors") left.push_back(n);
    if (left.empty()) GTEST_SKIP() << "the child was killed between two saves; no temporary file was left";
    ASSERT_EQ(left.size(), 1u) << "one save in flight leaves one temporary file";
    const std::string stale = left[0];
    EXPECT_EQ(stale.rfind("ckpt.safetensors.", 0), 0u) << stale << ": named after its target";

    // Files a later save must leave alone: the user's, another target's stale file, and a live writer's.
    spit(path("ckpt.safetensors.tmp.backup"), "mine");
    spit(path("ckpt.safetensors.notes"), "mine too");
    const std::string other_stale = "other.safetensors" + stale.substr(std::strlen("ckpt.safetensors"));
    spit(path(other_stale), "stale of another target");
    std::string live = stale;
    live.back() = live.back() == 'A' ? 'B' : 'A';
    spit(path(live), "a live save");
    const int live_fd = ::open(path(live).c_str(), O_RDONLY | O_CLOEXEC);
    ASSERT_GE(live_fd, 0);
    ASSERT_EQ(::flock(live_fd, LOCK_EX), 0) << "the live writer holds its lock";
    // Old enough that no save can be between creating and locking them.
    const struct timespec old_times[2] = {{::time(nullptr) - 3600, 0}, {::time(nullptr) - 3600, 0}};
    for (const std::string &n : {stale, live, std::string("ckpt.safetensors.tmp.backup"), other_stale})
        ASSERT_EQ(::utimensat(AT_FDCWD, path(n).c_str(), old_times, 0), 0);

    Stack s = make_stack(1, DST_DTYPE_FP32, false, 2);
    ASSERT_DST_OK(dst_checkpoint_save(s.data(), 1, f.c_str(), nullptr));
    std::vector<std::string> want = {"ckpt.safetensors", "ckpt.safetensors.notes", "ckpt.safetensors.tmp.backup",
                                     live, other_stale};
    std::sort(want.begin(), want.end());
    EXPECT_EQ(listing(dir_), want) << "the stale temporary file of the killed save is still there";
    EXPECT_EQ(slurp(path("ckpt.safetensors.tmp.backup")), "mine");
    ::close(live_fd);
    Stack back = make_stack(1, DST_DTYPE_FP32, false, 3);
    ASSERT_DST_OK(dst_checkpoint_load(back.data(), 1, f.c_str(), nullptr, nullptr, 0, nullptr));
    EXPECT_TRUE(snapshot(back).regions == snapshot(s).regions);
}

#ifdef DST_CONVERT_EXE
// Runs a command; returns its exit status and what it printed on stdout and stderr.
int run(const std::string &args, std::string *out, std::string *err, const std::string &dir) {
    const std::string o = dir + "/stdout.txt", e = dir + "/stderr.txt";
    const int rc =
        std::system((std::string("'") + DST_CONVERT_EXE + "' " + args + " >'" + o + "' 2>'" + e + "'").c_str());
    *out = slurp(o);
    *err = slurp(e);
    fs::remove(o);
    fs::remove(e);
    return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

TEST_F(Checkpoint, DstConvertTool) {
    std::vector<StT> ts = hf_layer_tensors("bert.encoder.", 0, 16, 40, 1);
    const std::vector<StT> l1 = hf_layer_tensors("bert.encoder.", 1, 16, 40, 2);
    ts.insert(ts.end(), l1.begin(), l1.end());
    ts.push_back(StT{"bert.pooler.dense.bias", "F32", {16}, std::string(64, '\0')});
    const std::string hf = path("hf.safetensors"), ds = path("ds.safetensors"), back = path("back.safetensors");
    spit(hf, build(ts, {{"format", "pt"}}).bytes());
    const std::string work = path("w");
    fs::create_directory(work);
    std::string out, err;

    EXPECT_EQ(run("", &out, &err, work), 2);
    EXPECT_TRUE(contains(err, "usage:")) << err;
    // Usage errors name the argument at fault.
    EXPECT_EQ(run("--from nope a b", &out, &err, work), 2);
    EXPECT_TRUE(contains(err, "--from: unknown layout 'nope'")) << err;
    EXPECT_EQ(run("a b --to", &out, &err, work), 2);
    EXPECT_TRUE(contains(err, "--to needs a layout")) << err;
    EXPECT_EQ(run("--bogus a b", &out, &err, work), 2);
    EXPECT_TRUE(contains(err, "unknown option '--bogus'")) << err;
    EXPECT_EQ(run("a b c", &out, &err, work), 2);
    EXPECT_TRUE(contains(err, "too many arguments: 'c'")) << err;
    EXPECT_EQ(run("only_in", &out, &err, work), 2);
    EXPECT_TRUE(contains(err, "missing OUT after IN 'only_in'")) << err;
    EXPECT_EQ(run("--info a b", &out, &err, work), 2);
    EXPECT_TRUE(contains(err, "unexpected argument 'b'")) << err;
    EXPECT_EQ(run("--help", &out, &err, work), 0);
    EXPECT_TRUE(contains(out, "--info")) << out;
    EXPECT_EQ(run("--version", &out, &err, work), 0);
    EXPECT_TRUE(contains(out, std::string("dst-convert ") + dst_version_string() + " (libdstransformer ")) << out;

    EXPECT_EQ(run("--from hf --to deepspeed '" + hf + "' '" + ds + "'", &out, &err, work), 0) << err;
    EXPECT_TRUE(contains(out, "2 layer(s)")) << out;
    EXPECT_TRUE(contains(out, "prefix \"bert.encoder.\" (detected)")) << out;
    EXPECT_TRUE(contains(out, "passed through unchanged: 1 tensor(s): bert.pooler.dense.bias")) << out;
    EXPECT_EQ(
        run("--from deepspeed --to hf --in-prefix bert.encoder. --out-prefix encoder. '" + ds + "' '" + back + "'",
            &out, &err, work),
        0)
        << err;
    const StRead a = st_read(hf), b = st_read(back);
    for (const StT &t : l1) {
        const std::string n = "encoder." + t.name.substr(std::strlen("bert.encoder."));
        EXPECT_EQ(b.tensor(n), a.tensor(t.name)) << n;
    }

    EXPECT_EQ(run("--info '" + ds + "'", &out, &err, work), 0) << err;
    EXPECT_TRUE(contains(out, "tensors: 25")) << out;
    EXPECT_TRUE(contains(out, "F32 x25")) << out;
    EXPECT_TRUE(contains(out, "layers: 2 (layout deepspeed, prefix \"bert.encoder.\", 24 tensors)")) << out;
    EXPECT_TRUE(contains(out, "other tensors: 1")) << out;
    EXPECT_TRUE(contains(out, "layout: deepspeed")) << out;
    EXPECT_TRUE(contains(out, "format: pt")) << out;
    // every tensor with its dtype, shape and size
    EXPECT_TRUE(contains(out, "tensor list (name: dtype [shape], bytes):\n")) << out;
    EXPECT_TRUE(contains(out, "\n  bert.encoder.layer.1.attn_qkvw: F32 [48, 16], 3072\n")) << out;
    EXPECT_TRUE(contains(out, "\n  bert.pooler.dense.bias: F32 [16], 64\n")) << out;

    spit(path("bad.safetensors"), "nonsense bytes");
    EXPECT_EQ(run("'" + path("bad.safetensors") + "' '" + path("x.safetensors") + "'", &out, &err, work), 1);
    EXPECT_TRUE(contains(err, "DST_ERR_FORMAT")) << err;
    EXPECT_EQ(run("--info '" + path("bad.safetensors") + "'", &out, &err, work), 1);
    EXPECT_EQ(run("--info '" + path("absent") + "'", &out, &err, work), 1);
    EXPECT_FALSE(fs::exists(path("x.safetensors")));
}
#endif

}  // namespace
