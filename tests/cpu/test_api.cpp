// The C API contract: every entry point with bad inputs (exact status, a message naming the argument,
// caller memory untouched), and the bookkeeping calls (versions, status strings, contexts, layer ids,
// configuration, parameter layout and arenas, saved activations, gradient accumulation).
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "test_util.h"

using namespace dsttest;

namespace {

// A layer with an input batch ready: H=16, 4 heads, I=64, FP32 unless changed.
class LayerFixture : public ::testing::Test {
protected:
    static constexpr int64_t B = 2, S = 8, H = 16;

    void build(dst_layer_config cfg) {
        cfg_ = cfg;
        ctx_ = make_ctx();
        ASSERT_TRUE(ctx_);
        layer_ = make_layer(ctx_.get(), cfg_);
        ASSERT_TRUE(layer_);
        randomize_params(layer_.get(), 7);
        Rng rng(11);
        const dst_dtype dt = cfg_.dtype;
        x_ = HostTensor::from_doubles(dt, {B, S, H}, rng.normals(B * S * H));
        dy_ = HostTensor::from_doubles(dt, {B, S, H}, rng.normals(B * S * H));
        y_ = HostTensor(dt, {B, S, H});
        dx_ = HostTensor(dt, {B, S, H});
    }
    void SetUp() override {
        dst_layer_config cfg = small_config(16, 4, 0, DST_DTYPE_FP32);
        cfg.max_batch_tokens = 64;
        cfg.max_seq_len = 16;
        build(cfg);
    }
    dst_status forward(dst_saved *saved = nullptr, const dst_mask *mask = nullptr) {
        dst_tensor in = x_.view(), out = y_.view();
        return dst_layer_forward(layer_.get(), saved, &in, mask, &out);
    }
    dst_status backward(dst_saved *saved = nullptr, dst_grad_mode mode = DST_GRAD_WRITE) {
        dst_tensor go = dy_.view(), gi = dx_.view();
        return dst_layer_backward(layer_.get(), saved, &go, &gi, mode);
    }

    dst_layer_config cfg_{};
    Ctx ctx_;
    Layer layer_;
    HostTensor x_, dy_, y_, dx_;
};

}  // namespace

// ---- version, status strings, dtypes --------------------------------------------------------------
TEST(Version, MacrosMatchRuntime) {
    EXPECT_EQ(dst_version(), DST_VERSION_NUMBER);
    EXPECT_EQ(DST_VERSION_NUMBER, DST_VERSION_MAJOR * 10000 + DST_VERSION_MINOR * 100 + DST_VERSION_PATCH);
    const std::string expect = std::to_string(DST_VERSION_MAJOR) + "." + std::to_string(DST_VERSION_MINOR) +
                               "." + std::to_string(DST_VERSION_PATCH);
    ASSERT_NE(dst_version_string(), nullptr);
    EXPECT_EQ(std::string(dst_version_string()), expect);
    EXPECT_EQ(dst_version_string(), dst_version_string()) << "must be a static string";
}

TEST(Status, Strings) {
    const std::pair<dst_status, const char *> all[] = {
        {DST_OK, "DST_OK"},
        {DST_ERR_INVALID_ARGUMENT, "DST_ERR_INVALID_ARGUMENT"},
        {DST_ERR_UNSUPPORTED, "DST_ERR_UNSUPPORTED"},
        {DST_ERR_CAPACITY, "DST_ERR_CAPACITY"},
        {DST_ERR_OUT_OF_MEMORY, "DST_ERR_OUT_OF_MEMORY"},
        {DST_ERR_STATE, "DST_ERR_STATE"},
        {DST_ERR_BACKEND, "DST_ERR_BACKEND"},
        {DST_ERR_IO, "DST_ERR_IO"},
        {DST_ERR_FORMAT, "DST_ERR_FORMAT"},
        {DST_ERR_INTERNAL, "DST_ERR_INTERNAL"}};
    for (const auto &p : all) {
        ASSERT_NE(dst_status_string(p.first), nullptr);
        EXPECT_STREQ(dst_status_string(p.first), p.second);
    }
    // The fixed numeric values.
    EXPECT_EQ(DST_OK, 0);
    EXPECT_EQ(DST_ERR_INVALID_ARGUMENT, 1);
    EXPECT_EQ(DST_ERR_CAPACITY, 3);
    EXPECT_EQ(DST_ERR_STATE, 5);
    EXPECT_EQ(DST_ERR_INTERNAL, 99);
    for (int v : {9, 10, 42, 98, 100, -1, 1000000}) {
        ASSERT_NE(dst_status_string(static_cast<dst_status>(v)), nullptr);
        EXPECT_STREQ(dst_status_string(static_cast<dst_status>(v)), "DST_ERR_UNKNOWN") << v;
    }
}

TEST(Status, LastErrorIsThreadLocalAndNotClearedBySuccess) {
    // A fresh thread has no error.
    EXPECT_EQ(call_fresh([] { return DST_OK; }).message, "");
    std::string msg_after_success;
    const CallResult r = call_fresh([&] {
        dst_status st = dst_context_create(DST_BACKEND_CPU, 0, nullptr);
        const std::string first = dst_last_error();
        dst_layer_config cfg;
        dst_status ok = dst_layer_config_default(&cfg);  // succeeds
        EXPECT_EQ(ok, DST_OK);
        msg_after_success = dst_last_error();
        EXPECT_EQ(first, msg_after_success) << "a successful call changed dst_last_error()";
        return st;
    });
    EXPECT_EQ(r.status, DST_ERR_INVALID_ARGUMENT);
    EXPECT_FALSE(msg_after_success.empty());
    // The failure on the other thread did not leak into this one's message (it may hold this
    // thread's own earlier errors, but never that exact text unless this thread made it too).
    EXPECT_EQ(call_fresh([] { return DST_OK; }).message, "");
}

TEST(Dtype, SizesAndNames) {
    EXPECT_EQ(dst_dtype_size(DST_DTYPE_FP32), 4u);
    EXPECT_EQ(dst_dtype_size(DST_DTYPE_FP16), 2u);
    EXPECT_EQ(dst_dtype_size(DST_DTYPE_BF16), 2u);
    EXPECT_EQ(dst_dtype_size(DST_DTYPE_FP64), 8u);
    EXPECT_EQ(dst_dtype_size(DST_DTYPE_INT32), 4u);
    EXPECT_EQ(dst_dtype_size(static_cast<dst_dtype>(5)), 0u);
    EXPECT_EQ(dst_dtype_size(static_cast<dst_dtype>(-1)), 0u);
    EXPECT_STREQ(dst_dtype_string(DST_DTYPE_FP32), "fp32");
    EXPECT_STREQ(dst_dtype_string(DST_DTYPE_FP16), "fp16");
    EXPECT_STREQ(dst_dtype_string(DST_DTYPE_BF16), "bf16");
    EXPECT_STREQ(dst_dtype_string(DST_DTYPE_FP64), "fp64");
    EXPECT_STREQ(dst_dtype_string(DST_DTYPE_INT32), "int32");
    EXPECT_STREQ(dst_dtype_string(static_cast<dst_dtype>(5)), "unknown");
    EXPECT_STREQ(dst_dtype_string(static_cast<dst_dtype>(-7)), "unknown");
}

// ---- contexts -----------------------------------------------------------------------------------
TEST(Context, CreateBadArguments) {
    dst_context *const sentinel = reinterpret_cast<dst_context *>(static_cast<uintptr_t>(0x1234));
    dst_context *c = sentinel;
    EXPECT_FAILS(DST_ERR_INVALID_ARGUMENT, "out", dst_context_create(DST_BACKEND_CPU, 0, nullptr));
    EXPECT_FAILS(DST_ERR_INVALID_ARGUMENT, "backend", dst_context_create(static_cast<dst_backend>(7), 0, &c));
    EXPECT_EQ(c, sentinel);
    EXPECT_FAILS(DST_ERR_INVALID_ARGUMENT, "backend", dst_context_create(static_cast<dst_backend>(-1), 0, &c));
    EXPECT_EQ(c, sentinel);
    EXPECT_FAILS(DST_ERR_INVALID_ARGUMENT, "device", dst_context_create(DST_BACKEND_CPU, 1, &c));
    EXPECT_EQ(c, sentinel);
    EXPECT_FAILS(DST_ERR_INVALID_ARGUMENT, "device", dst_context_create(DST_BACKEND_CPU, -1, &c));
    EXPECT_EQ(c, sentinel);
    dst_context_destroy(nullptr);  // no effect
}

TEST(Context, CudaBackendOnThisBuild) {
    dst_context *const sentinel = reinterpret_cast<dst_context *>(static_cast<uintptr_t>(0x1234));
    dst_context *c = sentinel;
    const CallResult r = call_fresh([&] { return dst_context_create(DST_BACKEND_CUDA, 0, &c); });
    if (r.status == DST_OK) {
        dst_backend b = DST_BACKEND_AUTO;
        EXPECT_EQ(dst_context_get_backend(c, &b), DST_OK);
        EXPECT_EQ(b, DST_BACKEND_CUDA);
        dst_context_destroy(c);
    } else {
        EXPECT_EQ(r.status, DST_ERR_UNSUPPORTED) << dst_status_string(r.status) << ": " << r.message;
        EXPECT_NE(lower(r.message).find("cuda"), std::string::npos) << "message: '" << r.message << "'";
        EXPECT_EQ(c, sentinel);
    }
    // AUTO always gives a usable context: CUDA when CUDA worked above, else CPU.
    dst_context *a = nullptr;
    ASSERT_EQ(dst_context_create(DST_BACKEND_AUTO, 0, &a), DST_OK) << dst_last_error();
    dst_backend b = DST_BACKEND_AUTO;
    EXPECT_EQ(dst_context_get_backend(a, &b), DST_OK);
    EXPECT_EQ(b, r.status == DST_OK ? DST_BACKEND_CUDA : DST_BACKEND_CPU);
    dst_context_destroy(a);
    // The layer config check for CUDA is consistent with context creation.
    dst_layer_config cfg = small_config();
    const CallResult v = call_fresh([&] { return dst_layer_config_validate(&cfg, DST_BACKEND_CUDA); });
    if (r.status != DST_OK) {
        EXPECT_EQ(v.status, DST_ERR_UNSUPPORTED) << v.message;
        EXPECT_NE(lower(v.message).find("cuda"), std::string::npos) << "message: '" << v.message << "'";
    }
}

TEST(Context, GettersAndSettersBadArguments) {
    Ctx ctx = make_ctx();
    dst_backend b = static_cast<dst_backend>(77);
    EXPECT_FAILS(DST_ERR_INVALID_ARGUMENT, "ctx", dst_context_get_backend(nullptr, &b));
    EXPECT_EQ(b, static_cast<dst_backend>(77));
    EXPECT_FAILS(DST_ERR_INVALID_ARGUMENT, "backend", dst_context_get_backend(ctx.get(), nullptr));
    EXPECT_EQ(dst_context_get_backend(ctx.get(), &b), DST_OK);
    EXPECT_EQ(b, DST_BACKEND_CPU);

    uint64_t seed = 5, off = 6;
    EXPECT_FAILS(DST_ERR_INVALID_ARGUMENT, "ctx", dst_context_set_rng_state(nullptr, 1, 2));
    EXPECT_FAILS(DST_ERR_INVALID_ARGUMENT, "ctx", dst_context_get_rng_state(nullptr, &seed, &off));
    EXPECT_FAILS(DST_ERR_INVALID_ARGUMENT, "seed", dst_context_get_rng_state(ctx.get(), nullptr, &off));
    EXPECT_FAILS(DST_ERR_INVALID_ARGUMENT, "offset", dst_context_get_rng_state(ctx.get(), &seed, nullptr));
    EXPECT_EQ(seed, 5u);
    EXPECT_EQ(off, 6u);

    int t = -5;
    EXPECT_FAILS(DST_ERR_INVALID_ARGUMENT, "ctx", dst_context_set_num_threads(nullptr, 1));
    EXPECT_FAILS(DST_ERR_INVALID_ARGUMENT, "ctx", dst_context_get_num_threads(nullptr, &t));
    EXPECT_EQ(t, -5);
    EXPECT_FAILS(DST_ERR_INVALID_ARGUMENT, "threads", dst_context_get_num_threads(ctx.get(), nullptr));
    DST_ASSERT_OK(dst_context_set_num_threads(ctx.get(), 2));
    EXPECT_FAILS(DST_ERR_INVALID_ARGUMENT, "threads", dst_context_set_num_threads(ctx.get(), -1));
    DST_ASSERT_OK(dst_context_get_num_threads(ctx.get(), &t));
    EXPECT_EQ(t, 2) << "a failed set_num_threads changed the count";
}

TEST(Context, RngStateRoundTrip) {
    Ctx ctx = make_ctx();
    const std::pair<uint64_t, uint64_t> states[] = {
        {0, 0}, {42, 3}, {0xDEADBEEFCAFEF00Dull, 123456789012345ull}, {UINT64_MAX, UINT64_MAX - 2}};
    for (const auto &s : states) {
        DST_ASSERT_OK(dst_context_set_rng_state(ctx.get(), s.first, s.second));
        uint64_t seed = 1, off = 1;
        DST_ASSERT_OK(dst_context_get_rng_state(ctx.get(), &seed, &off));
        EXPECT_EQ(seed, s.first);
        EXPECT_EQ(off, s.second);
    }
    // Independent per context.
    Ctx other = make_ctx();
    DST_ASSERT_OK(dst_context_set_rng_state(other.get(), 7, 8));
    uint64_t seed = 0, off = 0;
    DST_ASSERT_OK(dst_context_get_rng_state(ctx.get(), &seed, &off));
    EXPECT_EQ(seed, UINT64_MAX);
    EXPECT_EQ(off, UINT64_MAX - 2);
}

TEST(Context, ThreadCount) {
    Ctx ctx = make_ctx();
    int t = 0;
    DST_ASSERT_OK(dst_context_get_num_threads(ctx.get(), &t));
    EXPECT_GE(t, 1);
    const int deflt = t;
    for (int n : {1, 3, 2}) {
        DST_ASSERT_OK(dst_context_set_num_threads(ctx.get(), n));
        DST_ASSERT_OK(dst_context_get_num_threads(ctx.get(), &t));
        EXPECT_EQ(t, n);
    }
    DST_ASSERT_OK(dst_context_set_num_threads(ctx.get(), 0));
    DST_ASSERT_OK(dst_context_get_num_threads(ctx.get(), &t));
    EXPECT_GE(t, 1) << "0 restores the default, never reported as 0";
    EXPECT_EQ(t, deflt);
    // Per context.
    Ctx other = make_ctx();
    DST_ASSERT_OK(dst_context_set_num_threads(other.get(), 1));
    DST_ASSERT_OK(dst_context_set_num_threads(ctx.get(), 3));
    DST_ASSERT_OK(dst_context_get_num_threads(other.get(), &t));
    EXPECT_EQ(t, 1);
}

TEST(Context, IndexChecksMode) {
    Ctx ctx = make_ctx();
    dst_index_checks m = DST_INDEX_CHECKS_DEFERRED;
    DST_ASSERT_OK(dst_context_get_index_checks(ctx.get(), &m));
    EXPECT_EQ(m, DST_INDEX_CHECKS_EAGER) << "the default is eager";
    DST_ASSERT_OK(dst_context_set_index_checks(ctx.get(), DST_INDEX_CHECKS_DEFERRED));
    DST_ASSERT_OK(dst_context_get_index_checks(ctx.get(), &m));
    EXPECT_EQ(m, DST_INDEX_CHECKS_DEFERRED);
    EXPECT_FAILS(DST_ERR_INVALID_ARGUMENT, "mode is 2",
                 dst_context_set_index_checks(ctx.get(), static_cast<dst_index_checks>(2)));
    EXPECT_FAILS(DST_ERR_INVALID_ARGUMENT, "mode is -1",
                 dst_context_set_index_checks(ctx.get(), static_cast<dst_index_checks>(-1)));
    DST_ASSERT_OK(dst_context_get_index_checks(ctx.get(), &m));
    EXPECT_EQ(m, DST_INDEX_CHECKS_DEFERRED) << "a refused mode changed the one in effect";
    EXPECT_FAILS(DST_ERR_INVALID_ARGUMENT, "ctx", dst_context_set_index_checks(nullptr, DST_INDEX_CHECKS_EAGER));
    EXPECT_FAILS(DST_ERR_INVALID_ARGUMENT, "ctx", dst_context_get_index_checks(nullptr, &m));
    EXPECT_FAILS(DST_ERR_INVALID_ARGUMENT, "mode", dst_context_get_index_checks(ctx.get(), nullptr));
    // Per context.
    Ctx other = make_ctx();
    DST_ASSERT_OK(dst_context_get_index_checks(other.get(), &m));
    EXPECT_EQ(m, DST_INDEX_CHECKS_EAGER);
    DST_ASSERT_OK(dst_context_set_index_checks(ctx.get(), DST_INDEX_CHECKS_EAGER));
    DST_ASSERT_OK(dst_context_get_index_checks(ctx.get(), &m));
    EXPECT_EQ(m, DST_INDEX_CHECKS_EAGER);
}

// ---- configuration --------------------------------------------------------------------------------
TEST(Config, Defaults) {
    dst_layer_config cfg;
    std::memset(&cfg, 0xAB, sizeof cfg);
    DST_ASSERT_OK(dst_layer_config_default(&cfg));
    EXPECT_EQ(cfg.struct_size, sizeof(dst_layer_config));
    EXPECT_EQ(cfg.hidden_size, 1024);
    EXPECT_EQ(cfg.heads, 16);
    EXPECT_EQ(cfg.intermediate_size, 0);
    EXPECT_FLOAT_EQ(cfg.attn_dropout_ratio, 0.1f);
    EXPECT_FLOAT_EQ(cfg.hidden_dropout_ratio, 0.1f);
    EXPECT_EQ(cfg.num_hidden_layers, 24);
    EXPECT_FLOAT_EQ(cfg.initializer_range, 0.02f);
    EXPECT_FLOAT_EQ(cfg.layer_norm_eps, 1e-12f);
    EXPECT_EQ(cfg.seed, 42u);
    EXPECT_EQ(cfg.pre_layer_norm, 1);
    EXPECT_EQ(cfg.normalize_invertible, 0);
    EXPECT_EQ(cfg.gelu_checkpoint, 0);
    EXPECT_EQ(cfg.attn_dropout_checkpoint, 0);
    EXPECT_EQ(cfg.adjust_init_range, 1);
    EXPECT_EQ(cfg.stochastic_mode, 0);
    EXPECT_EQ(cfg.training, 1);
    EXPECT_EQ(cfg.dtype, DST_DTYPE_FP32);
    EXPECT_EQ(cfg.max_batch_tokens, 8192);
    EXPECT_EQ(cfg.max_seq_len, 512);
    EXPECT_EQ(cfg.gelu, DST_GELU_ERF);
    EXPECT_EQ(cfg.causal, 0);
    DST_EXPECT_OK(dst_layer_config_validate(&cfg, DST_BACKEND_CPU));
    DST_EXPECT_OK(dst_layer_config_validate(&cfg, DST_BACKEND_AUTO));
    EXPECT_FAILS(DST_ERR_INVALID_ARGUMENT, "config", dst_layer_config_default(nullptr));
}

// Configurations the CUDA kernels cannot run are refused by the validation, before any call, with
// the limit in the message (the CPU backend runs them).
TEST(LayerConfig, CudaLimitsAreReportedByValidate) {
    dst_layer_config cfg;
    DST_ASSERT_OK(dst_layer_config_default(&cfg));
    cfg.hidden_size = 1600;
    cfg.heads = 2;  // head_dim 800: the generic kernels run it, so only a missing device refuses it
    DST_EXPECT_OK(dst_layer_config_validate(&cfg, DST_BACKEND_CPU));
    {
        const CallResult r = call_fresh([&] { return dst_layer_config_validate(&cfg, DST_BACKEND_CUDA); });
        if (r.status != DST_OK) {
            EXPECT_EQ(r.status, DST_ERR_UNSUPPORTED);
            // no device on this machine, or (a CPU-only build) no CUDA backend at all
            EXPECT_TRUE(mentions(r.message, "no CUDA device") || mentions(r.message, "no CUDA backend")) << r.message;
        }
    }
    cfg.hidden_size = 4096;
    cfg.heads = 64;
    cfg.max_batch_tokens = int64_t(1) << 26;  // × 64 heads > 2^31 − 1 blocks
    DST_EXPECT_OK(dst_layer_config_validate(&cfg, DST_BACKEND_CPU));
    EXPECT_FAILS(DST_ERR_UNSUPPORTED, "max_batch_tokens", dst_layer_config_validate(&cfg, DST_BACKEND_CUDA));
}

namespace {
struct BadField {
    const char *what;    // test label
    const char *substr;  // the field the message must name
    std::function<void(dst_layer_config &)> apply;
};
std::vector<BadField> bad_fields() {
    return {
        {"hidden_size 0", "hidden_size", [](dst_layer_config &c) { c.hidden_size = 0; }},
        {"hidden_size -16", "hidden_size", [](dst_layer_config &c) { c.hidden_size = -16; }},
        {"heads 0", "heads", [](dst_layer_config &c) { c.heads = 0; }},
        {"heads -4", "heads", [](dst_layer_config &c) { c.heads = -4; }},
        {"heads 5 not dividing 16", "heads", [](dst_layer_config &c) { c.heads = 5; }},
        {"heads 32 > hidden 16", "heads", [](dst_layer_config &c) { c.heads = 32; }},
        {"intermediate_size -1", "intermediate_size", [](dst_layer_config &c) { c.intermediate_size = -1; }},
        {"attn_dropout_ratio -0.1", "attn_dropout_ratio", [](dst_layer_config &c) { c.attn_dropout_ratio = -0.1f; }},
        {"attn_dropout_ratio 1", "attn_dropout_ratio", [](dst_layer_config &c) { c.attn_dropout_ratio = 1.0f; }},
        {"attn_dropout_ratio 1.5", "attn_dropout_ratio", [](dst_layer_config &c) { c.attn_dropout_ratio = 1.5f; }},
        {"attn_dropout_ratio NaN", "attn_dropout_ratio", [](dst_layer_config &c) { c.attn_dropout_ratio = NAN; }},
        {"hidden_dropout_ratio -0.5", "hidden_dropout_ratio", [](dst_layer_config &c) { c.hidden_dropout_ratio = -0.5f; }},
        {"hidden_dropout_ratio 1", "hidden_dropout_ratio", [](dst_layer_config &c) { c.hidden_dropout_ratio = 1.0f; }},
        {"hidden_dropout_ratio NaN", "hidden_dropout_ratio", [](dst_layer_config &c) { c.hidden_dropout_ratio = NAN; }},
        {"layer_norm_eps 0", "layer_norm_eps", [](dst_layer_config &c) { c.layer_norm_eps = 0.0f; }},
        {"layer_norm_eps -1e-5", "layer_norm_eps", [](dst_layer_config &c) { c.layer_norm_eps = -1e-5f; }},
        {"layer_norm_eps NaN", "layer_norm_eps", [](dst_layer_config &c) { c.layer_norm_eps = NAN; }},
        {"dtype INT32", "dtype", [](dst_layer_config &c) { c.dtype = DST_DTYPE_INT32; }},
        {"dtype 17", "dtype", [](dst_layer_config &c) { c.dtype = static_cast<dst_dtype>(17); }},
        {"dtype -1", "dtype", [](dst_layer_config &c) { c.dtype = static_cast<dst_dtype>(-1); }},
        {"gelu 2", "gelu", [](dst_layer_config &c) { c.gelu = static_cast<dst_gelu>(2); }},
        {"gelu -1", "gelu", [](dst_layer_config &c) { c.gelu = static_cast<dst_gelu>(-1); }},
        {"struct_size 0", "struct_size", [](dst_layer_config &c) { c.struct_size = 0; }},
        {"struct_size 8", "struct_size", [](dst_layer_config &c) { c.struct_size = 8; }},
        {"struct_size splitting causal", "struct_size",
         [](dst_layer_config &c) { c.struct_size = offsetof(dst_layer_config, causal) + 2; }},
        {"struct_size splitting seed", "struct_size",
         [](dst_layer_config &c) { c.struct_size = offsetof(dst_layer_config, seed) + 4; }},
        {"max_batch_tokens 0", "max_batch_tokens", [](dst_layer_config &c) { c.max_batch_tokens = 0; }},
        {"max_batch_tokens -1", "max_batch_tokens", [](dst_layer_config &c) { c.max_batch_tokens = -1; }},
        {"max_seq_len 0", "max_seq_len", [](dst_layer_config &c) { c.max_seq_len = 0; }},
        {"max_seq_len -8", "max_seq_len", [](dst_layer_config &c) { c.max_seq_len = -8; }},
    };
}
}  // namespace

TEST(Config, InvalidFieldsAreRejectedEverywhere) {
    Ctx ctx = make_ctx();
    for (const BadField &bf : bad_fields()) {
        SCOPED_TRACE(bf.what);
        dst_layer_config cfg = small_config();
        DST_ASSERT_OK(dst_layer_config_validate(&cfg, DST_BACKEND_CPU));
        bf.apply(cfg);
        EXPECT_FAILS(DST_ERR_INVALID_ARGUMENT, bf.substr, dst_layer_config_validate(&cfg, DST_BACKEND_CPU));
        EXPECT_FAILS(DST_ERR_INVALID_ARGUMENT, bf.substr, dst_layer_config_validate(&cfg, DST_BACKEND_AUTO));
        dst_layer *const sentinel = reinterpret_cast<dst_layer *>(static_cast<uintptr_t>(0x5678));
        dst_layer *l = sentinel;
        EXPECT_FAILS(DST_ERR_INVALID_ARGUMENT, bf.substr, dst_layer_create(ctx.get(), &cfg, &l));
        EXPECT_EQ(l, sentinel) << "out changed on failure";
        size_t bytes = 777;
        EXPECT_FAILS(DST_ERR_INVALID_ARGUMENT, bf.substr, dst_layer_config_saved_bytes(&cfg, 2, 8, &bytes));
        EXPECT_EQ(bytes, 777u);
    }
    // A failed create does not consume a layer id.
    dst_layer_config cfg = small_config();
    Layer l = make_layer(ctx.get(), cfg);
    int id = -1;
    DST_ASSERT_OK(dst_layer_get_id(l.get(), &id));
    EXPECT_EQ(id, 0);
}

TEST(Config, ValidEdgeValues) {
    Ctx ctx = make_ctx();
    dst_layer_config cfg = small_config(15, 3, 22);
    cfg.attn_dropout_ratio = 0.0f;
    cfg.hidden_dropout_ratio = 0.0f;
    DST_EXPECT_OK(dst_layer_config_validate(&cfg, DST_BACKEND_CPU));
    cfg.attn_dropout_ratio = 0.999f;
    cfg.hidden_dropout_ratio = 0.999f;
    DST_EXPECT_OK(dst_layer_config_validate(&cfg, DST_BACKEND_CPU));
    cfg = small_config(7, 7, 1);  // head_dim 1
    DST_EXPECT_OK(dst_layer_config_validate(&cfg, DST_BACKEND_CPU));
    Layer l = make_layer(ctx.get(), cfg);
    EXPECT_TRUE(l);
    for (dst_dtype dt : {DST_DTYPE_FP32, DST_DTYPE_FP16, DST_DTYPE_BF16, DST_DTYPE_FP64}) {
        cfg = small_config(16, 4, 0, dt);
        DST_EXPECT_OK(dst_layer_config_validate(&cfg, DST_BACKEND_CPU));
    }
    cfg = small_config();
    cfg.gelu = DST_GELU_TANH;
    cfg.causal = 1;
    DST_EXPECT_OK(dst_layer_config_validate(&cfg, DST_BACKEND_CPU));
}

TEST(Config, SavedBytesBadArguments) {
    dst_layer_config cfg = small_config();
    size_t bytes = 99;
    EXPECT_FAILS(DST_ERR_INVALID_ARGUMENT, "config", dst_layer_config_saved_bytes(nullptr, 2, 8, &bytes));
    EXPECT_FAILS(DST_ERR_INVALID_ARGUMENT, "batch", dst_layer_config_saved_bytes(&cfg, 0, 8, &bytes));
    EXPECT_FAILS(DST_ERR_INVALID_ARGUMENT, "batch", dst_layer_config_saved_bytes(&cfg, -2, 8, &bytes));
    EXPECT_FAILS(DST_ERR_INVALID_ARGUMENT, "seq", dst_layer_config_saved_bytes(&cfg, 2, 0, &bytes));
    EXPECT_FAILS(DST_ERR_INVALID_ARGUMENT, "seq", dst_layer_config_saved_bytes(&cfg, 2, -8, &bytes));
    EXPECT_EQ(bytes, 99u);
    EXPECT_FAILS(DST_ERR_INVALID_ARGUMENT, "bytes", dst_layer_config_saved_bytes(&cfg, 2, 8, nullptr));
    EXPECT_FAILS(DST_ERR_INVALID_ARGUMENT, "config", dst_layer_config_validate(nullptr, DST_BACKEND_CPU));
    EXPECT_FAILS(DST_ERR_INVALID_ARGUMENT, "backend", dst_layer_config_validate(&cfg, static_cast<dst_backend>(9)));
}

// ---- layers -------------------------------------------------------------------------------------
TEST(Layer, CreateBadArguments) {
    Ctx ctx = make_ctx();
    dst_layer_config cfg = small_config();
    dst_layer *const sentinel = reinterpret_cast<dst_layer *>(static_cast<uintptr_t>(0x5678));
    dst_layer *l = sentinel;
    EXPECT_FAILS(DST_ERR_INVALID_ARGUMENT, "ctx", dst_layer_create(nullptr, &cfg, &l));
    EXPECT_FAILS(DST_ERR_INVALID_ARGUMENT, "config", dst_layer_create(ctx.get(), nullptr, &l));
    EXPECT_EQ(l, sentinel);
    EXPECT_FAILS(DST_ERR_INVALID_ARGUMENT, "out", dst_layer_create(ctx.get(), &cfg, nullptr));
    dst_layer_destroy(nullptr);

    Layer layer = make_layer(ctx.get(), cfg);
    dst_layer_config got;
    dst_layer_config_default(&got);
    int id = -9;
    EXPECT_FAILS(DST_ERR_INVALID_ARGUMENT, "layer", dst_layer_get_config(nullptr, &got));
    EXPECT_FAILS(DST_ERR_INVALID_ARGUMENT, "config", dst_layer_get_config(layer.get(), nullptr));
    EXPECT_FAILS(DST_ERR_INVALID_ARGUMENT, "layer", dst_layer_get_id(nullptr, &id));
    EXPECT_EQ(id, -9);
    EXPECT_FAILS(DST_ERR_INVALID_ARGUMENT, "id", dst_layer_get_id(layer.get(), nullptr));
    EXPECT_FAILS(DST_ERR_INVALID_ARGUMENT, "layer", dst_layer_set_training(nullptr, 1));
    size_t bytes = 3;
    void *p = reinterpret_cast<void *>(static_cast<uintptr_t>(0x99));
    EXPECT_FAILS(DST_ERR_INVALID_ARGUMENT, "layer", dst_layer_arena_bytes(nullptr, &bytes));
    EXPECT_EQ(bytes, 3u);
    EXPECT_FAILS(DST_ERR_INVALID_ARGUMENT, "bytes", dst_layer_arena_bytes(layer.get(), nullptr));
    EXPECT_FAILS(DST_ERR_INVALID_ARGUMENT, "layer", dst_layer_param_arena(nullptr, &p));
    EXPECT_FAILS(DST_ERR_INVALID_ARGUMENT, "data", dst_layer_param_arena(layer.get(), nullptr));
    EXPECT_FAILS(DST_ERR_INVALID_ARGUMENT, "layer", dst_layer_grad_arena(nullptr, &p));
    EXPECT_FAILS(DST_ERR_INVALID_ARGUMENT, "data", dst_layer_grad_arena(layer.get(), nullptr));
    EXPECT_EQ(p, reinterpret_cast<void *>(static_cast<uintptr_t>(0x99)));
    EXPECT_FAILS(DST_ERR_INVALID_ARGUMENT, "layer", dst_layer_zero_grads(nullptr));
    dst_param_info info;
    std::memset(&info, 0x5A, sizeof info);
    const std::vector<unsigned char> before(reinterpret_cast<unsigned char *>(&info),
                                            reinterpret_cast<unsigned char *>(&info) + sizeof info);
    EXPECT_FAILS(DST_ERR_INVALID_ARGUMENT, "layer", dst_layer_param_info(nullptr, DST_PARAM_ATTN_OB, &info));
    EXPECT_FAILS(DST_ERR_INVALID_ARGUMENT, "param", dst_layer_param_info(layer.get(), DST_PARAM_COUNT, &info));
    EXPECT_FAILS(DST_ERR_INVALID_ARGUMENT, "param",
                 dst_layer_param_info(layer.get(), static_cast<dst_param>(-1), &info));
    EXPECT_EQ(std::memcmp(before.data(), &info, sizeof info), 0) << "info changed on failure";
    EXPECT_FAILS(DST_ERR_INVALID_ARGUMENT, "info", dst_layer_param_info(layer.get(), DST_PARAM_ATTN_OB, nullptr));
}

TEST(Layer, IdsCountPerContext) {
    Ctx ctx = make_ctx();
    dst_layer_config cfg = small_config();
    std::vector<Layer> layers;
    for (int i = 0; i < 3; ++i) {
        layers.push_back(make_layer(ctx.get(), cfg));
        int id = -1;
        DST_ASSERT_OK(dst_layer_get_id(layers.back().get(), &id));
        EXPECT_EQ(id, i);
    }
    // Destroying a layer does not reuse its id.
    layers.erase(layers.begin() + 1);
    Layer l3 = make_layer(ctx.get(), cfg);
    int id = -1;
    DST_ASSERT_OK(dst_layer_get_id(l3.get(), &id));
    EXPECT_EQ(id, 3);
    Ctx ctx2 = make_ctx();
    for (int i = 0; i < 3; ++i) {
        Layer l = make_layer(ctx2.get(), cfg);
        DST_ASSERT_OK(dst_layer_get_id(l.get(), &id));
        EXPECT_EQ(id, i) << "a new context restarts the ids at 0";
    }
}

TEST(Layer, ConfigRoundTrip) {
    Ctx ctx = make_ctx();
    dst_layer_config cfg = small_config(24, 3, 0, DST_DTYPE_FP64);
    cfg.attn_dropout_ratio = 0.25f;
    cfg.hidden_dropout_ratio = 0.125f;
    cfg.num_hidden_layers = 6;
    cfg.initializer_range = 0.05f;
    cfg.layer_norm_eps = 1e-5f;
    cfg.seed = 1234567;
    cfg.pre_layer_norm = 0;
    cfg.normalize_invertible = 1;
    cfg.gelu_checkpoint = 1;
    cfg.attn_dropout_checkpoint = 1;
    cfg.adjust_init_range = 0;
    cfg.stochastic_mode = 0;
    cfg.training = 0;
    cfg.max_batch_tokens = 333;
    cfg.max_seq_len = 37;
    cfg.gelu = DST_GELU_TANH;
    cfg.causal = 1;
    Layer layer = make_layer(ctx.get(), cfg);
    ASSERT_TRUE(layer);
    dst_layer_config got;
    std::memset(&got, 0xCD, sizeof got);
    got.struct_size = sizeof got;
    DST_ASSERT_OK(dst_layer_get_config(layer.get(), &got));
    EXPECT_EQ(got.struct_size, sizeof got);
    EXPECT_EQ(got.hidden_size, 24);
    EXPECT_EQ(got.heads, 3);
    EXPECT_EQ(got.intermediate_size, 96) << "intermediate_size 0 resolves to 4H";
    EXPECT_EQ(got.attn_dropout_ratio, 0.25f);
    EXPECT_EQ(got.hidden_dropout_ratio, 0.125f);
    EXPECT_EQ(got.num_hidden_layers, 6);
    EXPECT_EQ(got.initializer_range, 0.05f);
    EXPECT_EQ(got.layer_norm_eps, 1e-5f);
    EXPECT_EQ(got.seed, 1234567u);
    EXPECT_EQ(got.pre_layer_norm, 0);
    EXPECT_NE(got.normalize_invertible, 0);
    EXPECT_NE(got.gelu_checkpoint, 0);
    EXPECT_NE(got.attn_dropout_checkpoint, 0);
    EXPECT_EQ(got.adjust_init_range, 0);
    EXPECT_EQ(got.stochastic_mode, 0);
    EXPECT_EQ(got.dtype, DST_DTYPE_FP64);
    EXPECT_EQ(got.max_batch_tokens, 333);
    EXPECT_EQ(got.max_seq_len, 37);
    EXPECT_EQ(got.gelu, DST_GELU_TANH);
    EXPECT_NE(got.causal, 0);
    EXPECT_EQ(got.training, 0);
    // Explicit intermediate size is kept; training mode follows set_training.
    cfg = small_config(16, 4, 22);
    Layer l2 = make_layer(ctx.get(), cfg);
    DST_ASSERT_OK(dst_layer_set_training(l2.get(), 0));
    dst_layer_config_default(&got);
    DST_ASSERT_OK(dst_layer_get_config(l2.get(), &got));
    EXPECT_EQ(got.intermediate_size, 22);
    EXPECT_EQ(got.training, 0);
    DST_ASSERT_OK(dst_layer_set_training(l2.get(), 5));
    DST_ASSERT_OK(dst_layer_get_config(l2.get(), &got));
    EXPECT_NE(got.training, 0);
}

// A caller built against an older header: its dst_layer_config ended after max_seq_len (as if gelu,
// causal and allow_tf32 had been appended since). The struct is allocated at exactly its size, so a
// sanitizer build catches any read or write past it; the missing fields take their defaults.
namespace {
struct OlderLayerConfig {
    size_t struct_size;
    int32_t hidden_size, heads, intermediate_size;
    float attn_dropout_ratio, hidden_dropout_ratio;
    int32_t num_hidden_layers;
    float initializer_range, layer_norm_eps;
    uint64_t seed;
    int32_t pre_layer_norm, normalize_invertible, gelu_checkpoint, attn_dropout_checkpoint, adjust_init_range,
        stochastic_mode, training;
    dst_dtype dtype;
    int64_t max_batch_tokens;
    int32_t max_seq_len;
};
static_assert(sizeof(OlderLayerConfig) < sizeof(dst_layer_config), "an older header's struct is smaller");
static_assert(offsetof(OlderLayerConfig, max_seq_len) == offsetof(dst_layer_config, max_seq_len),
              "fields are only appended");
}  // namespace

TEST(Config, CallerBuiltAgainstAnOlderHeader) {
    std::unique_ptr<OlderLayerConfig, decltype(&std::free)> old(
        static_cast<OlderLayerConfig *>(std::malloc(sizeof(OlderLayerConfig))), &std::free);
    ASSERT_TRUE(old);
    dst_layer_config full = small_config(24, 3, 40, DST_DTYPE_FP32);
    std::memcpy(old.get(), &full, sizeof(OlderLayerConfig));
    old->struct_size = sizeof(OlderLayerConfig);
    const dst_layer_config *as_new = reinterpret_cast<const dst_layer_config *>(old.get());
    DST_ASSERT_OK(dst_layer_config_validate(as_new, DST_BACKEND_CPU));
    size_t bytes_old = 0, bytes_new = 0;
    DST_ASSERT_OK(dst_layer_config_saved_bytes(as_new, 2, 8, &bytes_old));
    DST_ASSERT_OK(dst_layer_config_saved_bytes(&full, 2, 8, &bytes_new));
    EXPECT_EQ(bytes_old, bytes_new);
    Ctx ctx = make_ctx();
    dst_layer *l = nullptr;
    DST_ASSERT_OK(dst_layer_create(ctx.get(), as_new, &l));
    Layer layer(l);
    // The layer has the caller's fields and the defaults of the fields its header lacked.
    dst_layer_config got;
    got.struct_size = sizeof got;
    DST_ASSERT_OK(dst_layer_get_config(layer.get(), &got));
    EXPECT_EQ(got.hidden_size, 24);
    EXPECT_EQ(got.heads, 3);
    EXPECT_EQ(got.intermediate_size, 40);
    EXPECT_EQ(got.max_seq_len, full.max_seq_len);
    EXPECT_EQ(got.gelu, DST_GELU_ERF);
    EXPECT_EQ(got.causal, 0);
    EXPECT_EQ(got.allow_tf32, 0);
    // The older caller reads its configuration back: exactly its fields, nothing past them.
    std::memset(old.get(), 0, sizeof(OlderLayerConfig));
    old->struct_size = sizeof(OlderLayerConfig);
    DST_ASSERT_OK(dst_layer_get_config(layer.get(), reinterpret_cast<dst_layer_config *>(old.get())));
    EXPECT_EQ(old->struct_size, sizeof(OlderLayerConfig));
    EXPECT_EQ(old->hidden_size, 24);
    EXPECT_EQ(old->max_seq_len, full.max_seq_len);
    // It runs.
    const int64_t B = 2, S = 4, H = 24;
    HostTensor x = HostTensor::from_doubles(DST_DTYPE_FP32, {B, S, H}, Rng(1).normals(B * S * H));
    HostTensor y(DST_DTYPE_FP32, {B, S, H});
    dst_tensor xv = x.view(), yv = y.view();
    DST_EXPECT_OK(dst_layer_forward(layer.get(), nullptr, &xv, nullptr, &yv));
    // Every prefix that ends after a field is such an older layout; a size inside a field is not, and a
    // larger size comes from a newer header.
    dst_layer_config c = small_config();
    for (size_t size : {offsetof(dst_layer_config, intermediate_size), offsetof(dst_layer_config, seed),
                        offsetof(dst_layer_config, causal), sizeof(dst_layer_config)}) {
        c.struct_size = size;
        DST_EXPECT_OK(dst_layer_config_validate(&c, DST_BACKEND_CPU));
    }
    c.struct_size = sizeof(dst_layer_config) + 8;
    EXPECT_FAILS(DST_ERR_UNSUPPORTED, "struct_size", dst_layer_config_validate(&c, DST_BACKEND_CPU));
    dst_layer_config back;
    back.struct_size = sizeof(dst_layer_config) + 8;
    EXPECT_FAILS(DST_ERR_UNSUPPORTED, "struct_size", dst_layer_get_config(layer.get(), &back));
}

TEST(Layer, GetConfigStructSizeTooSmall) {
    Ctx ctx = make_ctx();
    Layer layer = make_layer(ctx.get(), small_config());
    for (size_t sz : {size_t{0}, size_t{4}}) {
        dst_layer_config got;
        std::memset(&got, 0x3C, sizeof got);
        got.struct_size = sz;
        std::vector<unsigned char> before(reinterpret_cast<unsigned char *>(&got),
                                          reinterpret_cast<unsigned char *>(&got) + sizeof got);
        EXPECT_FAILS(DST_ERR_INVALID_ARGUMENT, "struct_size", dst_layer_get_config(layer.get(), &got));
        EXPECT_EQ(std::memcmp(before.data(), &got, sizeof got), 0) << "config written on failure";
    }
}

// ---- parameters -----------------------------------------------------------------------------------
TEST(Params, Lookup) {
    for (int p = 0; p < DST_PARAM_COUNT; ++p) {
        dst_param got = static_cast<dst_param>(-1);
        DST_EXPECT_OK(dst_param_lookup(kParamNames[p], &got));
        EXPECT_EQ(got, static_cast<dst_param>(p)) << kParamNames[p];
        const std::string prefixed = std::string("bert.encoder.layer.3.") + kParamNames[p];
        got = static_cast<dst_param>(-1);
        DST_EXPECT_OK(dst_param_lookup(prefixed.c_str(), &got));
        EXPECT_EQ(got, static_cast<dst_param>(p)) << prefixed;
        const std::string one = std::string("x.") + kParamNames[p];
        DST_EXPECT_OK(dst_param_lookup(one.c_str(), &got));
        EXPECT_EQ(got, static_cast<dst_param>(p)) << one;
    }
    dst_param got = DST_PARAM_NORM_B;
    DST_EXPECT_OK(dst_param_lookup("bert.encoder.layer.3.attn_qkvw", &got));
    EXPECT_EQ(got, DST_PARAM_ATTN_QKVW);
    got = DST_PARAM_NORM_B;
    for (const char *bad : {"", "attn_qkv", "attn_qkvw2", "ATTN_QKVW", "attn_qkvw.", "bert.encoder.layer.3.",
                            "xattn_qkvw", "bert.encoder.layer.3.attn_foo", "bert.attn_qkvw.weight", "."}) {
        SCOPED_TRACE(bad);
        const std::string expect = std::string(bad).empty() ? std::string("name") : std::string(bad);
        EXPECT_FAILS(DST_ERR_INVALID_ARGUMENT, expect, dst_param_lookup(bad, &got));
        EXPECT_EQ(got, DST_PARAM_NORM_B) << "param changed on failure";
    }
    EXPECT_FAILS(DST_ERR_INVALID_ARGUMENT, "name", dst_param_lookup(nullptr, &got));
    EXPECT_FAILS(DST_ERR_INVALID_ARGUMENT, "param", dst_param_lookup("attn_qkvw", nullptr));
}

TEST(Params, InfoShapesAndOffsets) {
    Ctx ctx = make_ctx();
    const int64_t H = 24, I = 40;
    for (dst_dtype dt : {DST_DTYPE_FP32, DST_DTYPE_FP16, DST_DTYPE_BF16, DST_DTYPE_FP64}) {
        SCOPED_TRACE(dst_dtype_string(dt));
        Layer layer = make_layer(ctx.get(), small_config(static_cast<int>(H), 3, static_cast<int>(I), dt));
        ASSERT_TRUE(layer);
        const int64_t shapes[DST_PARAM_COUNT][2] = {{3 * H, H}, {3 * H, 0}, {H, H}, {H, 0}, {H, 0}, {H, 0},
                                                    {I, H},     {I, 0},     {H, I}, {H, 0}, {H, 0}, {H, 0}};
        size_t arena = 0;
        DST_ASSERT_OK(dst_layer_arena_bytes(layer.get(), &arena));
        std::vector<std::pair<size_t, size_t>> ranges;
        for (int p = 0; p < DST_PARAM_COUNT; ++p) {
            SCOPED_TRACE(kParamNames[p]);
            dst_param_info info;
            DST_ASSERT_OK(dst_layer_param_info(layer.get(), static_cast<dst_param>(p), &info));
            ASSERT_NE(info.name, nullptr);
            EXPECT_STREQ(info.name, kParamNames[p]);
            const int ndim = shapes[p][1] ? 2 : 1;
            EXPECT_EQ(info.ndim, ndim);
            EXPECT_EQ(info.shape[0], shapes[p][0]);
            if (ndim == 2) {
                EXPECT_EQ(info.shape[1], shapes[p][1]);
            }
            const int64_t numel = shapes[p][0] * (ndim == 2 ? shapes[p][1] : 1);
            EXPECT_EQ(info.numel, numel);
            EXPECT_EQ(info.size_bytes, static_cast<size_t>(numel) * dst_dtype_size(dt));
            EXPECT_EQ(info.offset_bytes % 256, 0u);
            EXPECT_LE(info.offset_bytes + info.size_bytes, arena);
            ranges.emplace_back(info.offset_bytes, info.offset_bytes + info.size_bytes);
        }
        std::sort(ranges.begin(), ranges.end());
        for (size_t i = 1; i < ranges.size(); ++i) EXPECT_LE(ranges[i - 1].second, ranges[i].first) << "overlap";
        void *pa = nullptr, *ga = nullptr;
        DST_ASSERT_OK(dst_layer_param_arena(layer.get(), &pa));
        DST_ASSERT_OK(dst_layer_grad_arena(layer.get(), &ga));
        ASSERT_NE(pa, nullptr);
        ASSERT_NE(ga, nullptr);
        EXPECT_NE(pa, ga);
        EXPECT_EQ(reinterpret_cast<uintptr_t>(pa) % 256, 0u);
        EXPECT_EQ(reinterpret_cast<uintptr_t>(ga) % 256, 0u);
    }
}

TEST(Params, InitFollowsTheRule) {
    Ctx ctx = make_ctx();
    dst_layer_config cfg = small_config(32, 4, 64, DST_DTYPE_FP64);
    cfg.initializer_range = 0.5f;
    cfg.num_hidden_layers = 8;
    cfg.adjust_init_range = 1;
    Layer a = make_layer(ctx.get(), cfg);
    Layer b = make_layer(ctx.get(), cfg);
    auto stdev = [](const std::vector<double> &v) {
        double s = 0;
        for (double x : v) s += x * x;
        return std::sqrt(s / static_cast<double>(v.size()));
    };
    for (int p = 0; p < DST_PARAM_COUNT; ++p) {
        SCOPED_TRACE(kParamNames[p]);
        const auto va = get_param(a.get(), kParamNames[p]);
        EXPECT_TRUE(bit_equal(va, get_param(b.get(), kParamNames[p]))) << "same seed, same weights";
        if (p == DST_PARAM_ATTN_NW || p == DST_PARAM_NORM_W) {
            for (double x : va) EXPECT_EQ(x, 1.0);
        } else if (p == DST_PARAM_ATTN_QKVW || p == DST_PARAM_INTER_W) {
            EXPECT_NEAR(stdev(va), 0.5, 0.05);
        } else if (p == DST_PARAM_ATTN_OW || p == DST_PARAM_OUTPUT_W) {
            EXPECT_NEAR(stdev(va), 0.5 / 4.0, 0.0125);  // 0.5 / sqrt(2·8)
        } else {
            for (double x : va) EXPECT_EQ(x, 0.0);
        }
    }
    cfg.seed = 43;
    Layer c = make_layer(ctx.get(), cfg);
    EXPECT_FALSE(bit_equal(get_param(a.get(), "attn_qkvw"), get_param(c.get(), "attn_qkvw")));
}

TEST(Params, SetGetRoundTripAllDtypes) {
    Ctx ctx = make_ctx();
    const dst_dtype dts[] = {DST_DTYPE_FP32, DST_DTYPE_FP16, DST_DTYPE_BF16, DST_DTYPE_FP64};
    for (dst_dtype ldt : dts) {
        Layer layer = make_layer(ctx.get(), small_config(16, 4, 0, ldt));
        ASSERT_TRUE(layer);
        const size_t n = static_cast<size_t>(param_numel(layer.get(), DST_PARAM_INTER_W));
        // (1) Values exact in every dtype (k/8, |k| < 256) survive any src → layer → dst path.
        std::vector<double> exact(n);
        for (size_t i = 0; i < n; ++i) exact[i] = static_cast<double>(static_cast<int>(i % 255) - 127) / 8.0;
        for (dst_dtype sdt : dts) {
            HostTensor src = HostTensor::from_doubles(sdt, {static_cast<int64_t>(n)}, exact);
            DST_ASSERT_OK(dst_layer_set_param(layer.get(), "inter_w", src.data(), sdt, n));
            for (dst_dtype gdt : dts) {
                SCOPED_TRACE(std::string("layer ") + dst_dtype_string(ldt) + " src " + dst_dtype_string(sdt) +
                             " dst " + dst_dtype_string(gdt));
                HostTensor dst(gdt, {static_cast<int64_t>(n)});
                dst.poison();
                DST_ASSERT_OK(dst_layer_get_param(layer.get(), "inter_w", dst.data(), gdt, n));
                EXPECT_TRUE(bit_equal(dst.doubles(), exact));
            }
        }
        // (2) Random float values: stored with one rounding (nearest even) to the layer dtype.
        Rng rng(5);
        std::vector<double> vals(n);
        for (auto &v : vals) v = static_cast<float>(rng.normal() * 3.0);
        for (dst_dtype sdt : {DST_DTYPE_FP32, DST_DTYPE_FP64}) {
            HostTensor src = HostTensor::from_doubles(sdt, {static_cast<int64_t>(n)}, vals);
            DST_ASSERT_OK(dst_layer_set_param(layer.get(), "bert.layer.0.inter_w", src.data(), sdt, n));
            std::vector<double> got(n);
            DST_ASSERT_OK(dst_layer_get_param(layer.get(), "inter_w", got.data(), DST_DTYPE_FP64, n));
            std::vector<double> expect(n);
            for (size_t i = 0; i < n; ++i) expect[i] = round_to(vals[i], ldt);
            EXPECT_TRUE(bit_equal(got, expect)) << "layer " << dst_dtype_string(ldt) << " src "
                                                << dst_dtype_string(sdt) << ": max diff " << max_abs_diff(got, expect);
            // Reading into a narrower dtype rounds to nearest even once more.
            for (dst_dtype gdt : dts) {
                HostTensor dst(gdt, {static_cast<int64_t>(n)});
                DST_ASSERT_OK(dst_layer_get_param(layer.get(), "inter_w", dst.data(), gdt, n));
                std::vector<double> e2(n);
                for (size_t i = 0; i < n; ++i) e2[i] = round_to(expect[i], gdt);
                EXPECT_TRUE(bit_equal(dst.doubles(), e2))
                    << "layer " << dst_dtype_string(ldt) << " get as " << dst_dtype_string(gdt);
            }
        }
        // (3) Other parameters are untouched by set_param of one.
        std::vector<double> ob = get_param(layer.get(), "attn_ob");
        for (double v : ob) EXPECT_EQ(v, 0.0);
    }
}

TEST(Params, SetGetBadArguments) {
    Ctx ctx = make_ctx();
    Layer layer = make_layer(ctx.get(), small_config());
    const size_t n = static_cast<size_t>(param_numel(layer.get(), DST_PARAM_ATTN_OB));
    std::vector<float> buf(n + 8, 0.5f);
    const std::vector<unsigned char> pbefore = param_arena_bytes(layer.get());
    EXPECT_FAILS(DST_ERR_INVALID_ARGUMENT, "layer", dst_layer_set_param(nullptr, "attn_ob", buf.data(), DST_DTYPE_FP32, n));
    EXPECT_FAILS(DST_ERR_INVALID_ARGUMENT, "name", dst_layer_set_param(layer.get(), nullptr, buf.data(), DST_DTYPE_FP32, n));
    EXPECT_FAILS(DST_ERR_INVALID_ARGUMENT, "src", dst_layer_set_param(layer.get(), "attn_ob", nullptr, DST_DTYPE_FP32, n));
    EXPECT_FAILS(DST_ERR_INVALID_ARGUMENT, "attn_bogus",
                 dst_layer_set_param(layer.get(), "attn_bogus", buf.data(), DST_DTYPE_FP32, n));
    EXPECT_FAILS(DST_ERR_INVALID_ARGUMENT, "count", dst_layer_set_param(layer.get(), "attn_ob", buf.data(), DST_DTYPE_FP32, n - 1));
    EXPECT_FAILS(DST_ERR_INVALID_ARGUMENT, "count", dst_layer_set_param(layer.get(), "attn_ob", buf.data(), DST_DTYPE_FP32, n + 1));
    EXPECT_FAILS(DST_ERR_INVALID_ARGUMENT, "count", dst_layer_set_param(layer.get(), "attn_ob", buf.data(), DST_DTYPE_FP32, 0));
    EXPECT_FAILS(DST_ERR_INVALID_ARGUMENT, "dtype", dst_layer_set_param(layer.get(), "attn_ob", buf.data(), DST_DTYPE_INT32, n));
    EXPECT_FAILS(DST_ERR_INVALID_ARGUMENT, "dtype",
                 dst_layer_set_param(layer.get(), "attn_ob", buf.data(), static_cast<dst_dtype>(11), n));
    EXPECT_EQ(param_arena_bytes(layer.get()), pbefore) << "parameters changed by a failed set_param";

    for (int which = 0; which < 2; ++which) {
        SCOPED_TRACE(which ? "get_grad" : "get_param");
        auto call = [&](const dst_layer *l, const char *name, void *dst, dst_dtype dt, size_t count) {
            return which ? dst_layer_get_grad(l, name, dst, dt, count) : dst_layer_get_param(l, name, dst, dt, count);
        };
        std::vector<float> out(n + 8, 123.0f);
        EXPECT_FAILS(DST_ERR_INVALID_ARGUMENT, "layer", call(nullptr, "attn_ob", out.data(), DST_DTYPE_FP32, n));
        EXPECT_FAILS(DST_ERR_INVALID_ARGUMENT, "name", call(layer.get(), nullptr, out.data(), DST_DTYPE_FP32, n));
        EXPECT_FAILS(DST_ERR_INVALID_ARGUMENT, "dst", call(layer.get(), "attn_ob", nullptr, DST_DTYPE_FP32, n));
        EXPECT_FAILS(DST_ERR_INVALID_ARGUMENT, "no_such_param", call(layer.get(), "no_such_param", out.data(), DST_DTYPE_FP32, n));
        EXPECT_FAILS(DST_ERR_INVALID_ARGUMENT, "count", call(layer.get(), "attn_ob", out.data(), DST_DTYPE_FP32, n - 1));
        EXPECT_FAILS(DST_ERR_INVALID_ARGUMENT, "count", call(layer.get(), "attn_ob", out.data(), DST_DTYPE_FP32, n + 8));
        EXPECT_FAILS(DST_ERR_INVALID_ARGUMENT, "dtype", call(layer.get(), "attn_ob", out.data(), DST_DTYPE_INT32, n));
        EXPECT_FAILS(DST_ERR_INVALID_ARGUMENT, "dtype", call(layer.get(), "attn_ob", out.data(), static_cast<dst_dtype>(-3), n));
        for (float v : out) EXPECT_EQ(v, 123.0f) << "caller buffer changed on failure";
    }
}

TEST(Params, BindCallerArenas) {
    Ctx ctx = make_ctx();
    for (dst_dtype dt : {DST_DTYPE_FP32, DST_DTYPE_FP64, DST_DTYPE_BF16}) {
        SCOPED_TRACE(dst_dtype_string(dt));
        Layer layer = make_layer(ctx.get(), small_config(16, 4, 0, dt));
        ASSERT_TRUE(layer);
        randomize_params(layer.get(), 3);
        size_t bytes = 0;
        DST_ASSERT_OK(dst_layer_arena_bytes(layer.get(), &bytes));
        const auto qkvw = get_param(layer.get(), "attn_qkvw");
        const std::vector<unsigned char> params_before = param_arena_bytes(layer.get());

        // Bad binds change nothing: too small, misaligned, NULL.
        HostTensor big(DST_DTYPE_FP32, {static_cast<int64_t>(bytes / 4 + 256)});
        auto *base = static_cast<unsigned char *>(big.data());
        std::memset(base, 0xA5, big.nbytes());
        const std::vector<unsigned char> sentinel = big.bytes();
        EXPECT_FAILS(DST_ERR_INVALID_ARGUMENT, "bytes", dst_layer_bind_param_arena(layer.get(), base, bytes - 1, 1));
        EXPECT_FAILS(DST_ERR_INVALID_ARGUMENT, "bytes", dst_layer_bind_param_arena(layer.get(), base, 0, 1));
        EXPECT_FAILS(DST_ERR_INVALID_ARGUMENT, "data", dst_layer_bind_param_arena(layer.get(), base + 64, bytes, 1));
        EXPECT_FAILS(DST_ERR_INVALID_ARGUMENT, "data", dst_layer_bind_param_arena(layer.get(), base + 2, bytes, 1));
        EXPECT_FAILS(DST_ERR_INVALID_ARGUMENT, "data", dst_layer_bind_param_arena(layer.get(), nullptr, bytes, 1));
        EXPECT_FAILS(DST_ERR_INVALID_ARGUMENT, "layer", dst_layer_bind_param_arena(nullptr, base, bytes, 1));
        EXPECT_FAILS(DST_ERR_INVALID_ARGUMENT, "bytes", dst_layer_bind_grad_arena(layer.get(), base, bytes - 1));
        EXPECT_FAILS(DST_ERR_INVALID_ARGUMENT, "data", dst_layer_bind_grad_arena(layer.get(), base + 128, bytes));
        EXPECT_FAILS(DST_ERR_INVALID_ARGUMENT, "data", dst_layer_bind_grad_arena(layer.get(), nullptr, bytes));
        EXPECT_FAILS(DST_ERR_INVALID_ARGUMENT, "layer", dst_layer_bind_grad_arena(nullptr, base, bytes));
        EXPECT_TRUE(big.same_bytes(sentinel)) << "caller buffer written by a failed bind";
        EXPECT_EQ(param_arena_bytes(layer.get()), params_before);
        EXPECT_TRUE(bit_equal(get_param(layer.get(), "attn_qkvw"), qkvw));

        // Bind with copy: the caller buffer now holds the parameters and is the arena.
        HostTensor pbuf(DST_DTYPE_FP32, {static_cast<int64_t>(bytes / 4 + 64)});
        DST_ASSERT_OK(dst_layer_bind_param_arena(layer.get(), pbuf.data(), bytes, 1));
        void *arena = nullptr;
        DST_ASSERT_OK(dst_layer_param_arena(layer.get(), &arena));
        EXPECT_EQ(arena, pbuf.data());
        EXPECT_TRUE(bit_equal(get_param(layer.get(), "attn_qkvw"), qkvw));
        EXPECT_EQ(std::memcmp(pbuf.data(), params_before.data(), bytes), 0)
            << "copy_current must give the same arena image";
        // Writes through the caller buffer are seen by the layer (an optimizer step).
        dst_param_info info;
        DST_ASSERT_OK(dst_layer_param_info(layer.get(), DST_PARAM_ATTN_OB, &info));
        HostTensor one = HostTensor::from_doubles(dt, {1}, {2.5});
        std::memcpy(static_cast<unsigned char *>(pbuf.data()) + info.offset_bytes + 2 * esize(dt), one.data(), esize(dt));
        EXPECT_EQ(get_param(layer.get(), "attn_ob")[2], 2.5);
        // And set_param writes into the caller buffer.
        std::vector<double> ob(static_cast<size_t>(info.numel), -0.75);
        set_param(layer.get(), "attn_ob", ob);
        HostTensor probe(dt, {1});
        std::memcpy(probe.data(), static_cast<unsigned char *>(pbuf.data()) + info.offset_bytes + 5 * esize(dt), esize(dt));
        EXPECT_EQ(probe.get(0), -0.75);

        // Bind without copy: the buffer is taken as it is.
        HostTensor pbuf2(DST_DTYPE_FP32, {static_cast<int64_t>(bytes / 4 + 64)});
        std::memcpy(pbuf2.data(), pbuf.data(), bytes);
        std::memcpy(static_cast<unsigned char *>(pbuf2.data()) + info.offset_bytes, one.data(), esize(dt));
        DST_ASSERT_OK(dst_layer_bind_param_arena(layer.get(), pbuf2.data(), bytes, 0));
        EXPECT_EQ(get_param(layer.get(), "attn_ob")[0], 2.5);
        EXPECT_EQ(get_param(layer.get(), "attn_ob")[1], -0.75);

        // Gradient arena: backward writes into the caller buffer.
        HostTensor gbuf(DST_DTYPE_FP32, {static_cast<int64_t>(bytes / 4 + 64)});
        std::memset(gbuf.data(), 0, gbuf.nbytes());
        DST_ASSERT_OK(dst_layer_bind_grad_arena(layer.get(), gbuf.data(), bytes));
        DST_ASSERT_OK(dst_layer_grad_arena(layer.get(), &arena));
        EXPECT_EQ(arena, gbuf.data());
        const int64_t B = 2, S = 5, H = 16;
        Rng rng(9);
        HostTensor x = HostTensor::from_doubles(dt, {B, S, H}, rng.normals(B * S * H));
        HostTensor dy = HostTensor::from_doubles(dt, {B, S, H}, rng.normals(B * S * H));
        HostTensor y(dt, {B, S, H}), dx(dt, {B, S, H});
        dst_tensor xv = x.view(), yv = y.view(), dyv = dy.view(), dxv = dx.view();
        DST_ASSERT_OK(dst_layer_forward(layer.get(), nullptr, &xv, nullptr, &yv));
        DST_ASSERT_OK(dst_layer_backward(layer.get(), nullptr, &dyv, &dxv, DST_GRAD_WRITE));
        for (int p = 0; p < DST_PARAM_COUNT; ++p) {
            SCOPED_TRACE(kParamNames[p]);
            DST_ASSERT_OK(dst_layer_param_info(layer.get(), static_cast<dst_param>(p), &info));
            HostTensor view(dt, {info.numel});
            std::memcpy(view.data(), static_cast<unsigned char *>(gbuf.data()) + info.offset_bytes, info.size_bytes);
            const auto g = get_grad(layer.get(), kParamNames[p]);
            EXPECT_TRUE(bit_equal(view.doubles(), g));
            double norm = 0;
            for (double v : g) norm += v * v;
            EXPECT_GT(norm, 0.0) << "gradient not written to the bound arena";
        }
        // The layer was destroyed before the caller buffers (declared before it in this scope
        // they would outlive it anyway); destroy explicitly to make the order obvious.
        layer.reset();
    }
}

// ---- saved activations ----------------------------------------------------------------------------
TEST_F(LayerFixture, SavedBadArguments) {
    dst_saved *const sentinel = reinterpret_cast<dst_saved *>(static_cast<uintptr_t>(0x4242));
    dst_saved *s = sentinel;
    EXPECT_FAILS(DST_ERR_INVALID_ARGUMENT, "layer", dst_saved_create(nullptr, &s));
    EXPECT_EQ(s, sentinel);
    EXPECT_FAILS(DST_ERR_INVALID_ARGUMENT, "out", dst_saved_create(layer_.get(), nullptr));
    EXPECT_FAILS(DST_ERR_INVALID_ARGUMENT, "saved", dst_saved_release(nullptr));
    size_t bytes = 17;
    EXPECT_FAILS(DST_ERR_INVALID_ARGUMENT, "saved", dst_saved_bytes(nullptr, &bytes));
    EXPECT_EQ(bytes, 17u);
    Saved saved = make_saved(layer_.get());
    EXPECT_FAILS(DST_ERR_INVALID_ARGUMENT, "bytes", dst_saved_bytes(saved.get(), nullptr));
    dst_saved_destroy(nullptr);
    DST_ASSERT_OK(dst_saved_bytes(saved.get(), &bytes));
    EXPECT_EQ(bytes, 0u) << "a new saved object is empty";
    DST_ASSERT_OK(forward(saved.get()));
    DST_ASSERT_OK(dst_saved_bytes(saved.get(), &bytes));
    EXPECT_GT(bytes, 0u);
    DST_ASSERT_OK(dst_saved_release(saved.get()));
    DST_ASSERT_OK(dst_saved_bytes(saved.get(), &bytes));
    EXPECT_EQ(bytes, 0u);
    EXPECT_FAILS(DST_ERR_STATE, "forward", backward(saved.get()));
}

TEST(Saved, BytesMatchConfigPrediction) {
    Ctx ctx = make_ctx();
    const int64_t B = 3, S = 7;
    for (dst_dtype dt : {DST_DTYPE_FP32, DST_DTYPE_FP16, DST_DTYPE_BF16, DST_DTYPE_FP64}) {
        for (int pre = 0; pre < 2; ++pre) {
            for (int sw = 0; sw < 8; ++sw) {
                SCOPED_TRACE(std::string(dst_dtype_string(dt)) + (pre ? " pre-LN" : " post-LN") + " switches " +
                             std::to_string(sw));
                dst_layer_config cfg = small_config(15, 3, 22, dt);
                cfg.pre_layer_norm = pre;
                cfg.gelu_checkpoint = sw & 1;
                cfg.normalize_invertible = (sw >> 1) & 1;
                cfg.attn_dropout_checkpoint = (sw >> 2) & 1;
                Layer layer = make_layer(ctx.get(), cfg);
                ASSERT_TRUE(layer);
                Saved saved = make_saved(layer.get());
                Rng rng(1);
                HostTensor x = HostTensor::from_doubles(dt, {B, S, 15}, rng.normals(B * S * 15));
                HostTensor y(dt, {B, S, 15});
                dst_tensor xv = x.view(), yv = y.view();
                DST_ASSERT_OK(dst_layer_forward(layer.get(), saved.get(), &xv, nullptr, &yv));
                size_t got = 0, predicted = 0;
                DST_ASSERT_OK(dst_saved_bytes(saved.get(), &got));
                DST_ASSERT_OK(dst_layer_config_saved_bytes(&cfg, B, S, &predicted));
                EXPECT_EQ(got, predicted);
                EXPECT_GT(got, 0u);
                // Inference keeps nothing.
                DST_ASSERT_OK(dst_layer_set_training(layer.get(), 0));
                Saved s2 = make_saved(layer.get());
                DST_ASSERT_OK(dst_layer_forward(layer.get(), s2.get(), &xv, nullptr, &yv));
                DST_ASSERT_OK(dst_saved_bytes(s2.get(), &got));
                EXPECT_EQ(got, 0u);
            }
        }
    }
}

// ---- forward: bad inputs ---------------------------------------------------------------------------
TEST_F(LayerFixture, ForwardBadArguments) {
    Saved saved = make_saved(layer_.get());
    DST_ASSERT_OK(forward(saved.get()));
    DST_ASSERT_OK(backward(saved.get()));
    const auto grads_ref = all_grads(layer_.get());
    const auto dx_ref = dx_.doubles();
    size_t saved_bytes_before = 0;
    DST_ASSERT_OK(dst_saved_bytes(saved.get(), &saved_bytes_before));
    uint64_t seed0 = 0, off0 = 0;
    DST_ASSERT_OK(dst_context_get_rng_state(ctx_.get(), &seed0, &off0));

    std::memset(y_.data(), 0xA5, y_.nbytes());
    const std::vector<unsigned char> ysent = y_.bytes();
    auto fwd = [&](dst_layer *l, const dst_tensor *in, const dst_mask *m, dst_tensor *out) {
        return dst_layer_forward(l, saved.get(), in, m, out);
    };
    const dst_tensor in = x_.view();
    dst_tensor out = y_.view();

    EXPECT_FAILS(DST_ERR_INVALID_ARGUMENT, "layer", fwd(nullptr, &in, nullptr, &out));
    EXPECT_FAILS(DST_ERR_INVALID_ARGUMENT, "input", fwd(layer_.get(), nullptr, nullptr, &out));
    EXPECT_FAILS(DST_ERR_INVALID_ARGUMENT, "output", fwd(layer_.get(), &in, nullptr, nullptr));
    struct Mut {
        const char *what;
        bool on_input;  // else on output
        std::function<void(dst_tensor &)> f;
    };
    const std::vector<Mut> muts = {
        {"data NULL", true, [](dst_tensor &t) { t.data = nullptr; }},
        {"dtype FP16", true, [](dst_tensor &t) { t.dtype = DST_DTYPE_FP16; }},
        {"dtype FP64", true, [](dst_tensor &t) { t.dtype = DST_DTYPE_FP64; }},
        {"dtype INT32", true, [](dst_tensor &t) { t.dtype = DST_DTYPE_INT32; }},
        {"dtype 9", true, [](dst_tensor &t) { t.dtype = static_cast<dst_dtype>(9); }},
        {"ndim 2", true, [](dst_tensor &t) { t.ndim = 2; t.shape[0] = B * S; t.shape[1] = H; }},
        {"ndim 4", true, [](dst_tensor &t) { t.ndim = 4; t.shape[3] = 1; }},
        {"ndim 0", true, [](dst_tensor &t) { t.ndim = 0; }},
        {"ndim -1", true, [](dst_tensor &t) { t.ndim = -1; }},
        {"ndim 5", true, [](dst_tensor &t) { t.ndim = 5; }},
        {"H+1", true, [](dst_tensor &t) { t.shape[2] = H + 1; }},
        {"H/2", true, [](dst_tensor &t) { t.shape[2] = H / 2; }},
        {"B 0", true, [](dst_tensor &t) { t.shape[0] = 0; }},
        {"S 0", true, [](dst_tensor &t) { t.shape[1] = 0; }},
        {"B -2", true, [](dst_tensor &t) { t.shape[0] = -2; }},
        {"S -8", true, [](dst_tensor &t) { t.shape[1] = -8; }},
        {"H 0", true, [](dst_tensor &t) { t.shape[2] = 0; }},
        {"out data NULL", false, [](dst_tensor &t) { t.data = nullptr; }},
        {"out dtype FP64", false, [](dst_tensor &t) { t.dtype = DST_DTYPE_FP64; }},
        {"out dtype BF16", false, [](dst_tensor &t) { t.dtype = DST_DTYPE_BF16; }},
        {"out ndim 2", false, [](dst_tensor &t) { t.ndim = 2; t.shape[0] = B * S; t.shape[1] = H; }},
        {"out B differs", false, [](dst_tensor &t) { t.shape[0] = B - 1; }},
        {"out S differs", false, [](dst_tensor &t) { t.shape[1] = S - 1; }},
        {"out H differs", false, [](dst_tensor &t) { t.shape[2] = H + 1; }},
    };
    for (const Mut &m : muts) {
        SCOPED_TRACE(m.what);
        dst_tensor i2 = in, o2 = out;
        m.f(m.on_input ? i2 : o2);
        EXPECT_FAILS(DST_ERR_INVALID_ARGUMENT, m.on_input ? "input" : "output", fwd(layer_.get(), &i2, nullptr, &o2));
        EXPECT_TRUE(y_.same_bytes(ysent)) << "output written by a failed forward";
    }
    // Output overlapping the input.
    {
        dst_tensor o2 = in;
        const std::vector<unsigned char> xb = x_.bytes();
        EXPECT_FAILS(DST_ERR_INVALID_ARGUMENT, "output", fwd(layer_.get(), &in, nullptr, &o2));
        EXPECT_TRUE(x_.same_bytes(xb)) << "input/output overlap: buffer modified";
    }
    EXPECT_TRUE(y_.same_bytes(ysent));
    // The saved object, the RNG and the gradients are untouched by all these failures.
    size_t saved_bytes_after = 0;
    DST_ASSERT_OK(dst_saved_bytes(saved.get(), &saved_bytes_after));
    EXPECT_EQ(saved_bytes_after, saved_bytes_before);
    uint64_t seed1 = 0, off1 = 0;
    DST_ASSERT_OK(dst_context_get_rng_state(ctx_.get(), &seed1, &off1));
    EXPECT_EQ(seed1, seed0);
    EXPECT_EQ(off1, off0) << "a failed forward advanced the RNG";
    dx_.poison();
    DST_ASSERT_OK(backward(saved.get()));
    EXPECT_TRUE(bit_equal(dx_.doubles(), dx_ref)) << "saved state changed by a failed forward";
    const auto g2 = all_grads(layer_.get());
    for (int p = 0; p < DST_PARAM_COUNT; ++p) EXPECT_TRUE(bit_equal(g2[p], grads_ref[p])) << kParamNames[p];
}

TEST_F(LayerFixture, ForwardSavedOfAnotherLayer) {
    Layer other = make_layer(ctx_.get(), cfg_);
    Saved foreign = make_saved(other.get());
    std::memset(y_.data(), 0xA5, y_.nbytes());
    const auto ysent = y_.bytes();
    EXPECT_FAILS(DST_ERR_INVALID_ARGUMENT, "saved", forward(foreign.get()));
    EXPECT_TRUE(y_.same_bytes(ysent));
}

TEST_F(LayerFixture, Capacity) {
    // max_seq_len 16, max_batch_tokens 64.
    struct Case { int64_t b, s; const char *limit; };
    for (const Case &c : {Case{1, 17, "max_seq_len"}, Case{2, 40, "max_seq_len"}, Case{5, 16, "max_batch_tokens"},
                          Case{65, 1, "max_batch_tokens"}, Case{9, 8, "max_batch_tokens"}}) {
        SCOPED_TRACE(std::to_string(c.b) + "x" + std::to_string(c.s));
        HostTensor x = HostTensor::from_doubles(cfg_.dtype, {c.b, c.s, H}, Rng(3).normals(c.b * c.s * H));
        HostTensor y(cfg_.dtype, {c.b, c.s, H});
        std::memset(y.data(), 0xA5, y.nbytes());
        const auto ysent = y.bytes();
        dst_tensor xv = x.view(), yv = y.view();
        EXPECT_FAILS(DST_ERR_CAPACITY, c.limit, dst_layer_forward(layer_.get(), nullptr, &xv, nullptr, &yv));
        EXPECT_TRUE(y.same_bytes(ysent));
        // Inference too.
        DST_ASSERT_OK(dst_layer_set_training(layer_.get(), 0));
        EXPECT_FAILS(DST_ERR_CAPACITY, c.limit, dst_layer_forward(layer_.get(), nullptr, &xv, nullptr, &yv));
        DST_ASSERT_OK(dst_layer_set_training(layer_.get(), 1));
        EXPECT_TRUE(y.same_bytes(ysent));
    }
    // Exactly at the limits works: S = 16 and B·S = 64.
    for (const auto &bs : {std::pair<int64_t, int64_t>{4, 16}, {64, 1}, {1, 16}}) {
        HostTensor x = HostTensor::from_doubles(cfg_.dtype, {bs.first, bs.second, H},
                                                Rng(4).normals(bs.first * bs.second * H));
        HostTensor y(cfg_.dtype, {bs.first, bs.second, H}), dx(cfg_.dtype, {bs.first, bs.second, H});
        dst_tensor xv = x.view(), yv = y.view(), dxv = dx.view();
        DST_EXPECT_OK(dst_layer_forward(layer_.get(), nullptr, &xv, nullptr, &yv));
        DST_EXPECT_OK(dst_layer_backward(layer_.get(), nullptr, &xv, &dxv, DST_GRAD_WRITE));
    }
}

TEST_F(LayerFixture, MaskErrors) {
    std::memset(y_.data(), 0xA5, y_.nbytes());
    const auto ysent = y_.bytes();
    HostTensor add_f32 = HostTensor::from_doubles(DST_DTYPE_FP32, {B, S}, std::vector<double>(B * S, 0.0));
    HostTensor add_i32(DST_DTYPE_INT32, {B, S});
    HostTensor add_f16(DST_DTYPE_FP16, {B, S});
    HostTensor add_f64(DST_DTYPE_FP64, {B, S});
    HostTensor add_wrong_b(DST_DTYPE_FP32, {B + 1, S});
    HostTensor add_wrong_s(DST_DTYPE_FP32, {B, S + 1});
    HostTensor add_4d_bad(DST_DTYPE_FP32, {B, 2, 1, S});
    HostTensor add_1d(DST_DTYPE_FP32, {B * S});
    HostTensor len_f32 = HostTensor::from_doubles(DST_DTYPE_FP32, {B}, {3, 4});
    HostTensor len_zero = HostTensor::from_doubles(DST_DTYPE_INT32, {B}, {3, 0});
    HostTensor len_neg = HostTensor::from_doubles(DST_DTYPE_INT32, {B}, {-1, 4});
    HostTensor len_big = HostTensor::from_doubles(DST_DTYPE_INT32, {B}, {static_cast<double>(S + 1), 4});
    HostTensor len_wrong_b = HostTensor::from_doubles(DST_DTYPE_INT32, {B + 1}, {3, 4, 5});
    HostTensor len_short_b = HostTensor::from_doubles(DST_DTYPE_INT32, {B - 1}, {3});
    HostTensor len_2d = HostTensor::from_doubles(DST_DTYPE_INT32, {B, 1}, {3, 4});
    HostTensor len_ok = HostTensor::from_doubles(DST_DTYPE_INT32, {B}, {3, static_cast<double>(S)});

    struct Case { const char *what; dst_mask m; };
    std::vector<Case> cases = {
        {"additive INT32", mask_of(DST_MASK_ADDITIVE, add_i32)},
        {"additive FP16 on FP32 layer", mask_of(DST_MASK_ADDITIVE, add_f16)},
        {"additive FP64 on FP32 layer", mask_of(DST_MASK_ADDITIVE, add_f64)},
        {"additive batch B+1", mask_of(DST_MASK_ADDITIVE, add_wrong_b)},
        {"additive seq S+1", mask_of(DST_MASK_ADDITIVE, add_wrong_s)},
        {"additive [B,2,1,S]", mask_of(DST_MASK_ADDITIVE, add_4d_bad)},
        {"additive 1-d", mask_of(DST_MASK_ADDITIVE, add_1d)},
        {"lengths FP32", mask_of(DST_MASK_KEY_LENGTHS, len_f32)},
        {"lengths value 0", mask_of(DST_MASK_KEY_LENGTHS, len_zero)},
        {"lengths value -1", mask_of(DST_MASK_KEY_LENGTHS, len_neg)},
        {"lengths value S+1", mask_of(DST_MASK_KEY_LENGTHS, len_big)},
        {"lengths batch B+1", mask_of(DST_MASK_KEY_LENGTHS, len_wrong_b)},
        {"lengths batch B-1", mask_of(DST_MASK_KEY_LENGTHS, len_short_b)},
        {"lengths 2-d", mask_of(DST_MASK_KEY_LENGTHS, len_2d)},
        {"unknown kind 3", mask_of(static_cast<dst_mask_kind>(3), len_ok)},
        {"unknown kind -1", mask_of(static_cast<dst_mask_kind>(-1), add_f32)},
    };
    dst_mask null_add = mask_of(DST_MASK_ADDITIVE, add_f32);
    null_add.tensor.data = nullptr;
    cases.push_back({"additive data NULL", null_add});
    dst_mask null_len = mask_of(DST_MASK_KEY_LENGTHS, len_ok);
    null_len.tensor.data = nullptr;
    cases.push_back({"lengths data NULL", null_len});
    for (int training = 1; training >= 0; --training) {
        DST_ASSERT_OK(dst_layer_set_training(layer_.get(), training));
        for (const Case &c : cases) {
            SCOPED_TRACE(std::string(c.what) + (training ? " (training)" : " (inference)"));
            EXPECT_FAILS(DST_ERR_INVALID_ARGUMENT, "mask", forward(nullptr, &c.m));
            EXPECT_TRUE(y_.same_bytes(ysent));
        }
    }
    DST_ASSERT_OK(dst_layer_set_training(layer_.get(), 1));
    // Valid forms work.
    dst_mask ok = mask_of(DST_MASK_KEY_LENGTHS, len_ok);
    DST_EXPECT_OK(forward(nullptr, &ok));
    ok = mask_of(DST_MASK_ADDITIVE, add_f32);
    DST_EXPECT_OK(forward(nullptr, &ok));
    HostTensor add_4d = HostTensor::from_doubles(DST_DTYPE_FP32, {B, 1, 1, S}, std::vector<double>(B * S, -1.0));
    ok = mask_of(DST_MASK_ADDITIVE, add_4d);
    DST_EXPECT_OK(forward(nullptr, &ok));
    dst_mask none = mask_none();
    none.tensor.data = nullptr;  // ignored for NONE
    none.tensor.ndim = 77;
    DST_EXPECT_OK(forward(nullptr, &none));
}

TEST(Masks, EquivalentForms) {
    Ctx ctx = make_ctx();
    const int64_t B = 3, S = 6, H = 12;
    dst_layer_config cfg = small_config(12, 3, 20, DST_DTYPE_FP64);
    cfg.training = 0;
    Layer layer = make_layer(ctx.get(), cfg);
    randomize_params(layer.get(), 21);
    Rng rng(8);
    HostTensor x = HostTensor::from_doubles(DST_DTYPE_FP64, {B, S, H}, rng.normals(B * S * H));
    auto run = [&](const dst_mask *m) {
        HostTensor y(DST_DTYPE_FP64, {B, S, H});
        y.poison();
        dst_tensor xv = x.view(), yv = y.view();
        dst_status st = dst_layer_forward(layer.get(), nullptr, &xv, m, &yv);
        EXPECT_EQ(st, DST_OK) << dst_last_error();
        return y.doubles();
    };
    const auto y_none = run(nullptr);
    dst_mask none = mask_none();
    EXPECT_TRUE(bit_equal(run(&none), y_none));
    HostTensor zeros = HostTensor::from_doubles(DST_DTYPE_FP64, {B, S}, std::vector<double>(B * S, 0.0));
    dst_mask mz = mask_of(DST_MASK_ADDITIVE, zeros);
    EXPECT_LT(rel_l2(run(&mz), y_none), 1e-15);
    HostTensor full = HostTensor::from_doubles(DST_DTYPE_INT32, {B}, {6, 6, 6});
    dst_mask mf = mask_of(DST_MASK_KEY_LENGTHS, full);
    EXPECT_LT(rel_l2(run(&mf), y_none), 1e-15);
    // Random additive mask: [B,S] FP64, [B,1,1,S] FP64 and [B,S] FP32 (values exact in fp32).
    std::vector<double> mv(B * S);
    for (auto &v : mv) v = std::round(rng.normal() * 8.0) / 8.0;
    HostTensor m64 = HostTensor::from_doubles(DST_DTYPE_FP64, {B, S}, mv);
    HostTensor m64_4d = HostTensor::from_doubles(DST_DTYPE_FP64, {B, 1, 1, S}, mv);
    HostTensor m32 = HostTensor::from_doubles(DST_DTYPE_FP32, {B, S}, mv);
    dst_mask a = mask_of(DST_MASK_ADDITIVE, m64), b = mask_of(DST_MASK_ADDITIVE, m64_4d),
             c = mask_of(DST_MASK_ADDITIVE, m32);
    const auto ya = run(&a);
    EXPECT_GT(rel_l2(ya, y_none), 1e-6) << "the mask had no effect";
    EXPECT_TRUE(bit_equal(run(&b), ya));
    EXPECT_LT(rel_l2(run(&c), ya), 1e-15);
    // Key lengths equal an additive mask of -inf-like values on the padded keys.
    HostTensor lens = HostTensor::from_doubles(DST_DTYPE_INT32, {B}, {1, 4, 6});
    std::vector<double> lv(B * S, 0.0);
    const int L[3] = {1, 4, 6};
    for (int b2 = 0; b2 < B; ++b2)
        for (int s = L[b2]; s < S; ++s) lv[b2 * S + s] = -1e6;
    HostTensor ladd = HostTensor::from_doubles(DST_DTYPE_FP64, {B, S}, lv);
    dst_mask ml = mask_of(DST_MASK_KEY_LENGTHS, lens), mla = mask_of(DST_MASK_ADDITIVE, ladd);
    EXPECT_LT(rel_l2(run(&ml), run(&mla)), 1e-13);
}

// ---- backward: bad inputs and state --------------------------------------------------------------
TEST_F(LayerFixture, BackwardWithoutTrainingForward) {
    std::memset(dx_.data(), 0xA5, dx_.nbytes());
    const auto dxsent = dx_.bytes();
    const auto gbefore = grad_arena_bytes(layer_.get());
    EXPECT_FAILS(DST_ERR_STATE, "forward", backward(nullptr));
    Saved fresh = make_saved(layer_.get());
    EXPECT_FAILS(DST_ERR_STATE, "forward", backward(fresh.get()));
    // Inference forward: nothing kept.
    DST_ASSERT_OK(dst_layer_set_training(layer_.get(), 0));
    DST_ASSERT_OK(forward(nullptr));
    DST_ASSERT_OK(forward(fresh.get()));
    EXPECT_FAILS(DST_ERR_STATE, "forward", backward(nullptr));
    EXPECT_FAILS(DST_ERR_STATE, "forward", backward(fresh.get()));
    EXPECT_TRUE(dx_.same_bytes(dxsent));
    EXPECT_EQ(grad_arena_bytes(layer_.get()), gbefore);
    // A layer created in inference mode, same thing.
    dst_layer_config cfg = cfg_;
    cfg.training = 0;
    Layer inf = make_layer(ctx_.get(), cfg);
    dst_tensor xv = x_.view(), yv = y_.view(), dyv = dy_.view(), dxv = dx_.view();
    DST_ASSERT_OK(dst_layer_forward(inf.get(), nullptr, &xv, nullptr, &yv));
    EXPECT_FAILS(DST_ERR_STATE, "forward", dst_layer_backward(inf.get(), nullptr, &dyv, &dxv, DST_GRAD_WRITE));
    EXPECT_TRUE(dx_.same_bytes(dxsent));
}

TEST_F(LayerFixture, BackwardBadArguments) {
    DST_ASSERT_OK(forward(nullptr));
    DST_ASSERT_OK(backward(nullptr));
    const auto dx_ref = dx_.doubles();
    std::memset(dx_.data(), 0xA5, dx_.nbytes());
    const auto dxsent = dx_.bytes();
    const auto gbefore = grad_arena_bytes(layer_.get());
    const dst_tensor go = dy_.view();
    dst_tensor gi = dx_.view();
    auto bwd = [&](dst_layer *l, const dst_tensor *g, dst_tensor *i, dst_grad_mode mode) {
        return dst_layer_backward(l, nullptr, g, i, mode);
    };
    EXPECT_FAILS(DST_ERR_INVALID_ARGUMENT, "layer", bwd(nullptr, &go, &gi, DST_GRAD_WRITE));
    EXPECT_FAILS(DST_ERR_INVALID_ARGUMENT, "grad_output", bwd(layer_.get(), nullptr, &gi, DST_GRAD_WRITE));
    EXPECT_FAILS(DST_ERR_INVALID_ARGUMENT, "grad_input", bwd(layer_.get(), &go, nullptr, DST_GRAD_WRITE));
    EXPECT_FAILS(DST_ERR_INVALID_ARGUMENT, "mode", bwd(layer_.get(), &go, &gi, static_cast<dst_grad_mode>(2)));
    EXPECT_FAILS(DST_ERR_INVALID_ARGUMENT, "mode", bwd(layer_.get(), &go, &gi, static_cast<dst_grad_mode>(-1)));
    struct Mut {
        const char *what;
        bool on_go;
        std::function<void(dst_tensor &)> f;
    };
    const std::vector<Mut> muts = {
        {"go data NULL", true, [](dst_tensor &t) { t.data = nullptr; }},
        {"go dtype FP64", true, [](dst_tensor &t) { t.dtype = DST_DTYPE_FP64; }},
        {"go dtype INT32", true, [](dst_tensor &t) { t.dtype = DST_DTYPE_INT32; }},
        {"go ndim 2", true, [](dst_tensor &t) { t.ndim = 2; t.shape[0] = B * S; t.shape[1] = H; }},
        {"go ndim 0", true, [](dst_tensor &t) { t.ndim = 0; }},
        {"go H+1", true, [](dst_tensor &t) { t.shape[2] = H + 1; }},
        {"go B differs from forward", true, [](dst_tensor &t) { t.shape[0] = B - 1; }},
        {"go S differs from forward", true, [](dst_tensor &t) { t.shape[1] = S - 1; }},
        {"go B 0", true, [](dst_tensor &t) { t.shape[0] = 0; }},
        {"go S -1", true, [](dst_tensor &t) { t.shape[1] = -1; }},
        {"gi data NULL", false, [](dst_tensor &t) { t.data = nullptr; }},
        {"gi dtype FP16", false, [](dst_tensor &t) { t.dtype = DST_DTYPE_FP16; }},
        {"gi ndim 4", false, [](dst_tensor &t) { t.ndim = 4; t.shape[3] = 1; }},
        {"gi H-1", false, [](dst_tensor &t) { t.shape[2] = H - 1; }},
        {"gi S differs", false, [](dst_tensor &t) { t.shape[1] = S - 1; }},
    };
    for (const Mut &m : muts) {
        SCOPED_TRACE(m.what);
        dst_tensor g2 = go, i2 = gi;
        m.f(m.on_go ? g2 : i2);
        EXPECT_FAILS(DST_ERR_INVALID_ARGUMENT, m.on_go ? "grad_output" : "grad_input",
                     bwd(layer_.get(), &g2, &i2, DST_GRAD_WRITE));
        EXPECT_TRUE(dx_.same_bytes(dxsent)) << "grad_input written by a failed backward";
        EXPECT_EQ(grad_arena_bytes(layer_.get()), gbefore) << "gradient arena written by a failed backward";
    }
    // Same B·S but a different split is still a mismatch: [B·S/2... ] → [4, 4] vs forward [2, 8].
    {
        HostTensor go2 = HostTensor::from_doubles(cfg_.dtype, {4, 4, H}, Rng(2).normals(4 * 4 * H));
        HostTensor gi2(cfg_.dtype, {4, 4, H});
        std::memset(gi2.data(), 0xA5, gi2.nbytes());
        const auto s2 = gi2.bytes();
        dst_tensor gv = go2.view(), iv = gi2.view();
        EXPECT_FAILS(DST_ERR_INVALID_ARGUMENT, "grad_output", bwd(layer_.get(), &gv, &iv, DST_GRAD_WRITE));
        EXPECT_TRUE(gi2.same_bytes(s2));
        EXPECT_EQ(grad_arena_bytes(layer_.get()), gbefore);
    }
    // grad_input overlapping grad_output.
    {
        dst_tensor alias = go;
        const auto dyb = dy_.bytes();
        EXPECT_FAILS(DST_ERR_INVALID_ARGUMENT, "grad_input", bwd(layer_.get(), &go, &alias, DST_GRAD_WRITE));
        EXPECT_TRUE(dy_.same_bytes(dyb));
        EXPECT_EQ(grad_arena_bytes(layer_.get()), gbefore);
    }
    // The saved state is intact: backward still works and gives the same result.
    DST_ASSERT_OK(backward(nullptr));
    EXPECT_TRUE(bit_equal(dx_.doubles(), dx_ref));
    EXPECT_EQ(grad_arena_bytes(layer_.get()), gbefore);
}

TEST(Backward, InvertibleWithZeroGammaIsRefused) {
    Ctx ctx = make_ctx();
    for (int pre = 0; pre < 2; ++pre) {
        for (const char *gamma : {"attn_nw", "norm_w"}) {
            SCOPED_TRACE(std::string(pre ? "pre-LN " : "post-LN ") + gamma);
            dst_layer_config cfg = small_config(16, 4, 0, DST_DTYPE_FP32);
            cfg.pre_layer_norm = pre;
            cfg.normalize_invertible = 1;
            Layer layer = make_layer(ctx.get(), cfg);
            randomize_params(layer.get(), 2);
            auto g = get_param(layer.get(), gamma);
            g[5] = 0.0;
            set_param(layer.get(), gamma, g);
            const int64_t B = 2, S = 4, H = 16;
            Rng rng(6);
            HostTensor x = HostTensor::from_doubles(DST_DTYPE_FP32, {B, S, H}, rng.normals(B * S * H));
            HostTensor dy = HostTensor::from_doubles(DST_DTYPE_FP32, {B, S, H}, rng.normals(B * S * H));
            HostTensor y(DST_DTYPE_FP32, {B, S, H}), dx(DST_DTYPE_FP32, {B, S, H});
            dst_tensor xv = x.view(), yv = y.view(), dyv = dy.view(), dxv = dx.view();
            DST_ASSERT_OK(dst_layer_forward(layer.get(), nullptr, &xv, nullptr, &yv));
            std::memset(dx.data(), 0xA5, dx.nbytes());
            const auto dxsent = dx.bytes();
            const auto gbefore = grad_arena_bytes(layer.get());
            EXPECT_FAILS(DST_ERR_INVALID_ARGUMENT, gamma,
                         dst_layer_backward(layer.get(), nullptr, &dyv, &dxv, DST_GRAD_WRITE));
            EXPECT_TRUE(dx.same_bytes(dxsent));
            EXPECT_EQ(grad_arena_bytes(layer.get()), gbefore);
            // Without normalize_invertible the same parameters are fine.
            cfg.normalize_invertible = 0;
            Layer plain = make_layer(ctx.get(), cfg);
            for (int p = 0; p < DST_PARAM_COUNT; ++p)
                set_param(plain.get(), kParamNames[p], get_param(layer.get(), kParamNames[p]));
            DST_ASSERT_OK(dst_layer_forward(plain.get(), nullptr, &xv, nullptr, &yv));
            DST_EXPECT_OK(dst_layer_backward(plain.get(), nullptr, &dyv, &dxv, DST_GRAD_WRITE));
        }
    }
}

// ---- lifetime, several forwards in flight, accumulation -----------------------------------------
TEST(Lifetime, ContextDestroyedBeforeLayer) {
    dst_context *ctx = nullptr;
    ASSERT_EQ(dst_context_create(DST_BACKEND_CPU, 0, &ctx), DST_OK);
    dst_layer_config cfg = small_config(16, 4, 0, DST_DTYPE_FP64);
    Layer layer = make_layer(ctx, cfg);
    Layer ref = make_layer(ctx, cfg);  // same seed → same init
    DST_ASSERT_OK(dst_context_set_rng_state(ctx, 77, 0));
    dst_context_destroy(ctx);
    ctx = nullptr;
    const int64_t B = 2, S = 5, H = 16;
    Rng rng(12);
    HostTensor x = HostTensor::from_doubles(DST_DTYPE_FP64, {B, S, H}, rng.normals(B * S * H));
    HostTensor dy = HostTensor::from_doubles(DST_DTYPE_FP64, {B, S, H}, rng.normals(B * S * H));
    HostTensor y(DST_DTYPE_FP64, {B, S, H}), dx(DST_DTYPE_FP64, {B, S, H});
    y.poison();
    dx.poison();
    dst_tensor xv = x.view(), yv = y.view(), dyv = dy.view(), dxv = dx.view();
    Saved saved = make_saved(layer.get());
    DST_ASSERT_OK(dst_layer_forward(layer.get(), saved.get(), &xv, nullptr, &yv));
    DST_ASSERT_OK(dst_layer_backward(layer.get(), saved.get(), &dyv, &dxv, DST_GRAD_WRITE));
    for (double v : y.doubles()) ASSERT_TRUE(std::isfinite(v));
    for (double v : dx.doubles()) ASSERT_TRUE(std::isfinite(v));
    saved.reset();
    layer.reset();  // the second layer still holds the context
    DST_ASSERT_OK(dst_layer_forward(ref.get(), nullptr, &xv, nullptr, &yv));
    DST_ASSERT_OK(dst_layer_backward(ref.get(), nullptr, &dyv, &dxv, DST_GRAD_WRITE));
}

namespace {
struct RunResult {
    std::vector<double> y, dx;
    std::vector<std::vector<double>> grads;
};
}  // namespace

TEST(InFlight, TwoForwardsThenTwoBackwardsMatchSequential) {
    const int64_t B = 2, S = 6, H = 12;
    for (dst_dtype dt : {DST_DTYPE_FP64, DST_DTYPE_FP32}) {
        SCOPED_TRACE(dst_dtype_string(dt));
        Ctx ctx = make_ctx();
        dst_layer_config cfg = small_config(12, 3, 20, dt);
        cfg.attn_dropout_ratio = 0.2f;
        cfg.hidden_dropout_ratio = 0.2f;
        Layer layer = make_layer(ctx.get(), cfg);
        randomize_params(layer.get(), 31);
        Rng rng(14);
        HostTensor xa = HostTensor::from_doubles(dt, {B, S, H}, rng.normals(B * S * H));
        HostTensor xb = HostTensor::from_doubles(dt, {B, S, H}, rng.normals(B * S * H));
        HostTensor dya = HostTensor::from_doubles(dt, {B, S, H}, rng.normals(B * S * H));
        HostTensor dyb = HostTensor::from_doubles(dt, {B, S, H}, rng.normals(B * S * H));
        HostTensor lens = HostTensor::from_doubles(DST_DTYPE_INT32, {B}, {4, 6});
        const dst_mask mask = mask_of(DST_MASK_KEY_LENGTHS, lens);
        Saved sa = make_saved(layer.get()), sb = make_saved(layer.get());
        auto fwd = [&](dst_saved *s, HostTensor &x, HostTensor &y) {
            dst_tensor xv = x.view(), yv = y.view();
            dst_status st = dst_layer_forward(layer.get(), s, &xv, &mask, &yv);
            EXPECT_EQ(st, DST_OK) << dst_last_error();
        };
        auto bwd = [&](dst_saved *s, HostTensor &dy, RunResult &r) {
            HostTensor dx(dt, {B, S, H});
            dx.poison();
            dst_tensor dyv = dy.view(), dxv = dx.view();
            dst_status st = dst_layer_backward(layer.get(), s, &dyv, &dxv, DST_GRAD_WRITE);
            EXPECT_EQ(st, DST_OK) << dst_last_error();
            r.dx = dx.doubles();
            r.grads = all_grads(layer.get());
        };
        // Interleaved: F(A) F(B) B(A) B(B).
        RunResult ia, ib;
        {
            HostTensor ya(dt, {B, S, H}), yb(dt, {B, S, H});
            DST_ASSERT_OK(dst_context_set_rng_state(ctx.get(), 1234, 10));
            fwd(sa.get(), xa, ya);
            fwd(sb.get(), xb, yb);
            bwd(sa.get(), dya, ia);
            bwd(sb.get(), dyb, ib);
            ia.y = ya.doubles();
            ib.y = yb.doubles();
        }
        // Sequential: F(A) B(A) F(B) B(B), same RNG start (so A gets offsets 10.., B 13..).
        RunResult qa, qb;
        {
            HostTensor ya(dt, {B, S, H}), yb(dt, {B, S, H});
            DST_ASSERT_OK(dst_context_set_rng_state(ctx.get(), 1234, 10));
            fwd(sa.get(), xa, ya);
            bwd(sa.get(), dya, qa);
            fwd(sb.get(), xb, yb);
            bwd(sb.get(), dyb, qb);
            qa.y = ya.doubles();
            qb.y = yb.doubles();
        }
        EXPECT_TRUE(bit_equal(ia.y, qa.y));
        EXPECT_TRUE(bit_equal(ib.y, qb.y));
        EXPECT_TRUE(bit_equal(ia.dx, qa.dx)) << "dX of A";
        EXPECT_TRUE(bit_equal(ib.dx, qb.dx)) << "dX of B";
        for (int p = 0; p < DST_PARAM_COUNT; ++p) {
            EXPECT_TRUE(bit_equal(ia.grads[p], qa.grads[p])) << "A " << kParamNames[p];
            EXPECT_TRUE(bit_equal(ib.grads[p], qb.grads[p])) << "B " << kParamNames[p];
        }
        EXPECT_FALSE(bit_equal(ia.dx, ib.dx));
        // The default saved object is a third independent slot.
        RunResult da;
        HostTensor ya(dt, {B, S, H});
        DST_ASSERT_OK(dst_context_set_rng_state(ctx.get(), 1234, 10));
        fwd(nullptr, xa, ya);
        fwd(sb.get(), xb, ya);
        bwd(nullptr, dya, da);
        EXPECT_TRUE(bit_equal(da.dx, qa.dx));
        // Backward may be repeated on the same saved object.
        RunResult again;
        bwd(sa.get(), dya, again);
        EXPECT_TRUE(bit_equal(again.dx, qa.dx));
        for (int p = 0; p < DST_PARAM_COUNT; ++p) EXPECT_TRUE(bit_equal(again.grads[p], qa.grads[p]));
    }
}

TEST(Accumulate, TwoBackwardsAccumulateTwice) {
    const int64_t B = 2, S = 5, H = 16;
    for (dst_dtype dt : {DST_DTYPE_FP64, DST_DTYPE_FP32, DST_DTYPE_BF16}) {
        SCOPED_TRACE(dst_dtype_string(dt));
        Ctx ctx = make_ctx();
        Layer layer = make_layer(ctx.get(), small_config(16, 4, 0, dt));
        randomize_params(layer.get(), 41);
        Rng rng(15);
        HostTensor x = HostTensor::from_doubles(dt, {B, S, H}, rng.normals(B * S * H));
        HostTensor dy = HostTensor::from_doubles(dt, {B, S, H}, rng.normals(B * S * H));
        HostTensor y(dt, {B, S, H}), dx(dt, {B, S, H});
        dst_tensor xv = x.view(), yv = y.view(), dyv = dy.view(), dxv = dx.view();
        DST_ASSERT_OK(dst_layer_forward(layer.get(), nullptr, &xv, nullptr, &yv));
        DST_ASSERT_OK(dst_layer_backward(layer.get(), nullptr, &dyv, &dxv, DST_GRAD_WRITE));
        const auto g1 = all_grads(layer.get());
        const auto dx1 = dx.doubles();
        dx.poison();
        DST_ASSERT_OK(dst_layer_backward(layer.get(), nullptr, &dyv, &dxv, DST_GRAD_ACCUMULATE));
        const auto g2 = all_grads(layer.get());
        EXPECT_TRUE(bit_equal(dx.doubles(), dx1)) << "dX is written, not accumulated";
        for (int p = 0; p < DST_PARAM_COUNT; ++p) {
            std::vector<double> twice(g1[p]);
            for (auto &v : twice) v *= 2.0;  // exact in every dtype (no overflow here)
            EXPECT_TRUE(bit_equal(g2[p], twice)) << kParamNames[p] << " max diff " << max_abs_diff(g2[p], twice);
        }
        // WRITE again overwrites.
        DST_ASSERT_OK(dst_layer_backward(layer.get(), nullptr, &dyv, &dxv, DST_GRAD_WRITE));
        for (int p = 0; p < DST_PARAM_COUNT; ++p) EXPECT_TRUE(bit_equal(get_grad(layer.get(), kParamNames[p]), g1[p]));
        // zero_grads then ACCUMULATE equals WRITE.
        DST_ASSERT_OK(dst_layer_zero_grads(layer.get()));
        for (int p = 0; p < DST_PARAM_COUNT; ++p)
            for (double v : get_grad(layer.get(), kParamNames[p])) ASSERT_EQ(v, 0.0) << kParamNames[p];
        DST_ASSERT_OK(dst_layer_backward(layer.get(), nullptr, &dyv, &dxv, DST_GRAD_ACCUMULATE));
        for (int p = 0; p < DST_PARAM_COUNT; ++p) EXPECT_TRUE(bit_equal(get_grad(layer.get(), kParamNames[p]), g1[p]));
    }
}

TEST(InFlight, InferenceForwardBetweenTrainingForwardAndBackward) {
    // DeepSpeed's shared layer object made a backward after an interleaved eval forward skip dropout;
    // here the saved object holds everything its backward needs.
    const int64_t B = 2, S = 6, H = 12;
    Ctx ctx = make_ctx();
    dst_layer_config cfg = small_config(12, 3, 20, DST_DTYPE_FP64);
    cfg.attn_dropout_ratio = 0.3f;
    cfg.hidden_dropout_ratio = 0.3f;
    Layer layer = make_layer(ctx.get(), cfg);
    randomize_params(layer.get(), 5);
    Rng rng(3);
    HostTensor x = HostTensor::from_doubles(DST_DTYPE_FP64, {B, S, H}, rng.normals(B * S * H));
    HostTensor x2 = HostTensor::from_doubles(DST_DTYPE_FP64, {B, S, H}, rng.normals(B * S * H));
    HostTensor dy = HostTensor::from_doubles(DST_DTYPE_FP64, {B, S, H}, rng.normals(B * S * H));
    HostTensor y(DST_DTYPE_FP64, {B, S, H}), dx1(DST_DTYPE_FP64, {B, S, H}), dx2(DST_DTYPE_FP64, {B, S, H});
    dst_tensor xv = x.view(), x2v = x2.view(), yv = y.view(), dyv = dy.view(), d1 = dx1.view(), d2 = dx2.view();
    Saved saved = make_saved(layer.get());
    DST_ASSERT_OK(dst_context_set_rng_state(ctx.get(), 8, 0));
    DST_ASSERT_OK(dst_layer_forward(layer.get(), saved.get(), &xv, nullptr, &yv));
    DST_ASSERT_OK(dst_layer_backward(layer.get(), saved.get(), &dyv, &d1, DST_GRAD_WRITE));
    const auto g1 = all_grads(layer.get());
    DST_ASSERT_OK(dst_context_set_rng_state(ctx.get(), 8, 0));
    DST_ASSERT_OK(dst_layer_forward(layer.get(), saved.get(), &xv, nullptr, &yv));
    DST_ASSERT_OK(dst_layer_set_training(layer.get(), 0));
    DST_ASSERT_OK(dst_layer_forward(layer.get(), nullptr, &x2v, nullptr, &yv));  // default saved object
    DST_ASSERT_OK(dst_layer_set_training(layer.get(), 1));
    DST_ASSERT_OK(dst_layer_backward(layer.get(), saved.get(), &dyv, &d2, DST_GRAD_WRITE));
    EXPECT_TRUE(bit_equal(dx1.doubles(), dx2.doubles()));
    const auto g2 = all_grads(layer.get());
    for (int p = 0; p < DST_PARAM_COUNT; ++p) EXPECT_TRUE(bit_equal(g1[p], g2[p])) << kParamNames[p];
}

TEST(Masks, AdditiveMaskDtypesPerLayerDtype) {
    const int64_t B = 2, S = 4, H = 16;
    Ctx ctx = make_ctx();
    for (dst_dtype ldt : {DST_DTYPE_FP32, DST_DTYPE_FP16, DST_DTYPE_BF16, DST_DTYPE_FP64}) {
        Layer layer = make_layer(ctx.get(), small_config(16, 4, 0, ldt));
        HostTensor x = HostTensor::from_doubles(ldt, {B, S, H}, Rng(1).normals(B * S * H));
        HostTensor y(ldt, {B, S, H});
        dst_tensor xv = x.view(), yv = y.view();
        for (dst_dtype mdt : {DST_DTYPE_FP32, DST_DTYPE_FP16, DST_DTYPE_BF16, DST_DTYPE_FP64, DST_DTYPE_INT32}) {
            SCOPED_TRACE(std::string("layer ") + dst_dtype_string(ldt) + ", mask " + dst_dtype_string(mdt));
            HostTensor m = HostTensor::from_doubles(mdt, {B, S}, {0, 0, -1, -1, 0, -1, 0, 0});
            const dst_mask mask = mask_of(DST_MASK_ADDITIVE, m);
            if (mdt == ldt || mdt == DST_DTYPE_FP32) {
                DST_EXPECT_OK(dst_layer_forward(layer.get(), nullptr, &xv, &mask, &yv));
            } else {
                EXPECT_FAILS(DST_ERR_INVALID_ARGUMENT, "mask", dst_layer_forward(layer.get(), nullptr, &xv, &mask, &yv));
            }
        }
    }
}
