// Shared helpers of the CPU test suites. Everything here goes through the public C API only
// (dstransformer.h): RAII wrappers for the handles, host tensors in any dtype, deterministic random
// data, fp16/bf16 conversion for activation tensors, and small comparison helpers.
#ifndef DST_TESTS_CPU_TEST_UTIL_H
#define DST_TESTS_CPU_TEST_UTIL_H

#include <gtest/gtest.h>

#include <cctype>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "dstransformer/dstransformer.h"

namespace dsttest {

// ---- status checks ------------------------------------------------------------------------------
#define DST_ASSERT_OK(expr)                                                                      \
    do {                                                                                         \
        dst_status _st = (expr);                                                                 \
        ASSERT_EQ(_st, DST_OK) << #expr << " -> " << dst_status_string(_st) << ": "              \
                               << dst_last_error();                                              \
    } while (0)
#define DST_EXPECT_OK(expr)                                                                      \
    do {                                                                                         \
        dst_status _st = (expr);                                                                 \
        EXPECT_EQ(_st, DST_OK) << #expr << " -> " << dst_status_string(_st) << ": "              \
                               << dst_last_error();                                              \
    } while (0)

// The 12 parameters in DeepSpeed order.
inline const char *const kParamNames[DST_PARAM_COUNT] = {
    "attn_qkvw", "attn_qkvb", "attn_ow", "attn_ob", "attn_nw", "attn_nb",
    "inter_w",   "inter_b",   "output_w", "output_b", "norm_w", "norm_b"};

// ---- RAII handles -------------------------------------------------------------------------------
struct CtxDeleter { void operator()(dst_context *c) const { dst_context_destroy(c); } };
struct LayerDeleter { void operator()(dst_layer *l) const { dst_layer_destroy(l); } };
struct SavedDeleter { void operator()(dst_saved *s) const { dst_saved_destroy(s); } };
using Ctx = std::unique_ptr<dst_context, CtxDeleter>;
using Layer = std::unique_ptr<dst_layer, LayerDeleter>;
using Saved = std::unique_ptr<dst_saved, SavedDeleter>;

inline Ctx make_ctx() {
    dst_context *c = nullptr;
    dst_status st = dst_context_create(DST_BACKEND_CPU, 0, &c);
    EXPECT_EQ(st, DST_OK) << dst_last_error();
    return Ctx(c);
}
// GPU suites: whether a CUDA device is usable, a test's early exit when not, and a CUDA context.
inline bool have_gpu() {
    int n = 0;
    return dst_cuda_device_count(&n) == DST_OK && n > 0;
}
#define SKIP_WITHOUT_GPU() \
    if (!::dsttest::have_gpu()) GTEST_SKIP() << "no CUDA device"
inline Ctx make_cuda_ctx() {
    dst_context *c = nullptr;
    EXPECT_EQ(dst_context_create(DST_BACKEND_CUDA, 0, &c), DST_OK) << dst_last_error();
    return Ctx(c);
}
inline Layer make_layer(dst_context *ctx, const dst_layer_config &cfg) {
    dst_layer *l = nullptr;
    dst_status st = dst_layer_create(ctx, &cfg, &l);
    EXPECT_EQ(st, DST_OK) << "dst_layer_create: " << dst_last_error();
    return Layer(l);
}
inline Saved make_saved(dst_layer *layer) {
    dst_saved *s = nullptr;
    dst_status st = dst_saved_create(layer, &s);
    EXPECT_EQ(st, DST_OK) << "dst_saved_create: " << dst_last_error();
    return Saved(s);
}

// A small configuration: caller changes what it needs.
inline dst_layer_config small_config(int hidden = 16, int heads = 4, int inter = 0,
                                     dst_dtype dtype = DST_DTYPE_FP32) {
    dst_layer_config cfg;
    dst_layer_config_default(&cfg);
    cfg.hidden_size = hidden;
    cfg.heads = heads;
    cfg.intermediate_size = inter;
    cfg.dtype = dtype;
    cfg.max_batch_tokens = 256;
    cfg.max_seq_len = 64;
    return cfg;
}

// ---- deterministic random numbers ---------------------------------------------------------------
// splitmix64 + Box-Muller: identical on every platform and standard library.
class Rng {
public:
    explicit Rng(uint64_t seed) : s_(seed ^ 0x9E3779B97F4A7C15ull) {}
    uint64_t next() {
        uint64_t z = (s_ += 0x9E3779B97F4A7C15ull);
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
        return z ^ (z >> 31);
    }
    double uniform() { return (static_cast<double>(next() >> 11) + 0.5) * (1.0 / 9007199254740992.0); }
    double uniform(double lo, double hi) { return lo + (hi - lo) * uniform(); }
    double normal() {
        const double u1 = uniform(), u2 = uniform();
        return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
    }
    int64_t below(int64_t n) { return static_cast<int64_t>(next() % static_cast<uint64_t>(n)); }
    std::vector<double> normals(size_t n, double std = 1.0, double mean = 0.0) {
        std::vector<double> v(n);
        for (auto &x : v) x = mean + std * normal();
        return v;
    }

private:
    uint64_t s_;
};

// ---- fp16 / bf16 conversion (round to nearest even) --------------------------------------------
inline uint32_t f2u(float f) { uint32_t u; std::memcpy(&u, &f, 4); return u; }
inline float u2f(uint32_t u) { float f; std::memcpy(&f, &u, 4); return f; }

inline uint16_t float_to_half(float f) {
    const uint32_t x = f2u(f);
    const uint32_t sign = (x >> 16) & 0x8000u;
    uint32_t a = x & 0x7FFFFFFFu;
    if (a >= 0x7F800000u) return static_cast<uint16_t>(sign | 0x7C00u | (a > 0x7F800000u ? 0x200u : 0u));
    if (a >= 0x477FF000u) return static_cast<uint16_t>(sign | 0x7C00u);  // >= 65520 rounds to inf
    if (a < 0x38800000u) {  // subnormal half: value = round(|f| * 2^24) * 2^-24
        const float scaled = u2f(a) * 16777216.0f;   // exact (power of two)
        const float r = std::nearbyint(scaled);      // default rounding mode: nearest even
        return static_cast<uint16_t>(sign | static_cast<uint32_t>(r));
    }
    uint32_t r = (a - 0x38000000u) >> 13;
    const uint32_t rem = a & 0x1FFFu;
    if (rem > 0x1000u || (rem == 0x1000u && (r & 1u))) ++r;
    return static_cast<uint16_t>(sign | r);
}
inline float half_to_float(uint16_t h) {
    const uint32_t sign = (static_cast<uint32_t>(h) & 0x8000u) << 16;
    const uint32_t e = (h >> 10) & 0x1Fu, m = h & 0x3FFu;
    if (e == 0) {
        const float v = static_cast<float>(m) * (1.0f / 16777216.0f);
        return sign ? -v : v;
    }
    if (e == 31) return u2f(sign | 0x7F800000u | (m << 13));
    return u2f(sign | ((e + 112u) << 23) | (m << 13));
}
inline uint16_t float_to_bf16(float f) {
    const uint32_t x = f2u(f);
    if ((x & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<uint16_t>((x >> 16) | 0x40u);
    return static_cast<uint16_t>((x + 0x7FFFu + ((x >> 16) & 1u)) >> 16);
}
inline float bf16_to_float(uint16_t b) { return u2f(static_cast<uint32_t>(b) << 16); }

// Value of a double after storage in `dt` (float first for the 16-bit types, as the test data is).
inline double round_to(double v, dst_dtype dt) {
    switch (dt) {
        case DST_DTYPE_FP64: return v;
        case DST_DTYPE_FP32: return static_cast<float>(v);
        case DST_DTYPE_FP16: return half_to_float(float_to_half(static_cast<float>(v)));
        case DST_DTYPE_BF16: return bf16_to_float(float_to_bf16(static_cast<float>(v)));
        default: return v;
    }
}

inline size_t esize(dst_dtype dt) {
    switch (dt) {
        case DST_DTYPE_FP64: return 8;
        case DST_DTYPE_FP32: case DST_DTYPE_INT32: return 4;
        case DST_DTYPE_FP16: case DST_DTYPE_BF16: return 2;
        default: return 0;
    }
}

// ---- host tensors -------------------------------------------------------------------------------
// Owning host buffer in any dtype, with a dst_tensor view. Data is 256-byte aligned.
class HostTensor {
public:
    HostTensor() = default;
    HostTensor(dst_dtype dt, std::vector<int64_t> shape) : dt_(dt), shape_(std::move(shape)) {
        numel_ = 1;
        for (int64_t s : shape_) numel_ *= (s > 0 ? s : 0);
        bytes_ = static_cast<size_t>(numel_) * esize(dt_);
        const size_t alloc = ((bytes_ + 255) / 256 + 1) * 256;
        buf_.reset(static_cast<unsigned char *>(std::aligned_alloc(256, alloc)));
        std::memset(buf_.get(), 0, alloc);
    }
    static HostTensor from_doubles(dst_dtype dt, std::vector<int64_t> shape, const std::vector<double> &v) {
        HostTensor t(dt, std::move(shape));
        t.set_doubles(v);
        return t;
    }
    void set_doubles(const std::vector<double> &v) {
        EXPECT_EQ(v.size(), static_cast<size_t>(numel_));
        for (int64_t i = 0; i < numel_ && i < static_cast<int64_t>(v.size()); ++i) set(i, v[i]);
    }
    void set(int64_t i, double v) {
        unsigned char *p = buf_.get();
        switch (dt_) {
            case DST_DTYPE_FP64: reinterpret_cast<double *>(p)[i] = v; break;
            case DST_DTYPE_FP32: reinterpret_cast<float *>(p)[i] = static_cast<float>(v); break;
            case DST_DTYPE_FP16: reinterpret_cast<uint16_t *>(p)[i] = float_to_half(static_cast<float>(v)); break;
            case DST_DTYPE_BF16: reinterpret_cast<uint16_t *>(p)[i] = float_to_bf16(static_cast<float>(v)); break;
            case DST_DTYPE_INT32: reinterpret_cast<int32_t *>(p)[i] = static_cast<int32_t>(v); break;
        }
    }
    double get(int64_t i) const {
        const unsigned char *p = buf_.get();
        switch (dt_) {
            case DST_DTYPE_FP64: return reinterpret_cast<const double *>(p)[i];
            case DST_DTYPE_FP32: return reinterpret_cast<const float *>(p)[i];
            case DST_DTYPE_FP16: return half_to_float(reinterpret_cast<const uint16_t *>(p)[i]);
            case DST_DTYPE_BF16: return bf16_to_float(reinterpret_cast<const uint16_t *>(p)[i]);
            case DST_DTYPE_INT32: return reinterpret_cast<const int32_t *>(p)[i];
        }
        return 0;
    }
    std::vector<double> doubles() const {
        std::vector<double> v(static_cast<size_t>(numel_));
        for (int64_t i = 0; i < numel_; ++i) v[static_cast<size_t>(i)] = get(i);
        return v;
    }
    // Fills every byte with a recognisable pattern (a NaN in every float dtype).
    void poison() { std::memset(buf_.get(), 0xFF, bytes_); }
    std::vector<unsigned char> bytes() const { return {buf_.get(), buf_.get() + bytes_}; }
    bool same_bytes(const std::vector<unsigned char> &b) const {
        return b.size() == bytes_ && (bytes_ == 0 || std::memcmp(b.data(), buf_.get(), bytes_) == 0);
    }
    dst_tensor view() const {
        dst_tensor t;
        std::memset(&t, 0, sizeof t);
        t.data = buf_.get();
        t.dtype = dt_;
        t.ndim = static_cast<int32_t>(shape_.size());
        for (size_t i = 0; i < shape_.size() && i < DST_MAX_DIMS; ++i) t.shape[i] = shape_[i];
        return t;
    }
    void *data() const { return buf_.get(); }
    int64_t numel() const { return numel_; }
    size_t nbytes() const { return bytes_; }
    dst_dtype dtype() const { return dt_; }
    const std::vector<int64_t> &shape() const { return shape_; }

private:
    struct Free { void operator()(unsigned char *p) const { std::free(p); } };
    dst_dtype dt_ = DST_DTYPE_FP32;
    std::vector<int64_t> shape_;
    int64_t numel_ = 0;
    size_t bytes_ = 0;
    std::unique_ptr<unsigned char, Free> buf_;
};

inline dst_mask mask_none() {
    dst_mask m;
    std::memset(&m, 0, sizeof m);
    m.kind = DST_MASK_NONE;
    return m;
}
inline dst_mask mask_of(dst_mask_kind kind, const HostTensor &t) {
    dst_mask m;
    std::memset(&m, 0, sizeof m);
    m.kind = kind;
    m.tensor = t.view();
    return m;
}

// ---- parameters and gradients -------------------------------------------------------------------
inline int64_t param_numel(const dst_layer *layer, int p) {
    dst_param_info info;
    std::memset(&info, 0, sizeof info);
    if (dst_layer_param_info(layer, static_cast<dst_param>(p), &info) != DST_OK) return -1;
    return info.numel;
}
inline std::vector<double> get_param(const dst_layer *layer, const char *name) {
    dst_param p;
    if (dst_param_lookup(name, &p) != DST_OK) { ADD_FAILURE() << "lookup " << name; return {}; }
    std::vector<double> v(static_cast<size_t>(param_numel(layer, p)));
    dst_status st = dst_layer_get_param(layer, name, v.data(), DST_DTYPE_FP64, v.size());
    EXPECT_EQ(st, DST_OK) << "get_param " << name << ": " << dst_last_error();
    return v;
}
inline std::vector<double> get_grad(const dst_layer *layer, const char *name) {
    dst_param p;
    if (dst_param_lookup(name, &p) != DST_OK) { ADD_FAILURE() << "lookup " << name; return {}; }
    std::vector<double> v(static_cast<size_t>(param_numel(layer, p)));
    dst_status st = dst_layer_get_grad(layer, name, v.data(), DST_DTYPE_FP64, v.size());
    EXPECT_EQ(st, DST_OK) << "get_grad " << name << ": " << dst_last_error();
    return v;
}
inline void set_param(dst_layer *layer, const char *name, const std::vector<double> &v) {
    dst_status st = dst_layer_set_param(layer, name, v.data(), DST_DTYPE_FP64, v.size());
    EXPECT_EQ(st, DST_OK) << "set_param " << name << ": " << dst_last_error();
}
inline void set_param_const(dst_layer *layer, const char *name, double value) {
    dst_param p;
    ASSERT_EQ(dst_param_lookup(name, &p), DST_OK);
    set_param(layer, name, std::vector<double>(static_cast<size_t>(param_numel(layer, p)), value));
}

// Random parameters with O(1) effect (far from the tiny default init, so that every gradient is
// significant): weights N(0, 1/sqrt(fan_in)), biases N(0, 0.3), γ = 1 + N(0, 0.2), β N(0, 0.3).
inline void randomize_params(dst_layer *layer, uint64_t seed) {
    Rng rng(seed);
    for (int p = 0; p < DST_PARAM_COUNT; ++p) {
        dst_param_info info;
        ASSERT_EQ(dst_layer_param_info(layer, static_cast<dst_param>(p), &info), DST_OK) << dst_last_error();
        std::vector<double> v(static_cast<size_t>(info.numel));
        const bool weight = info.ndim == 2;
        const bool gamma = (p == DST_PARAM_ATTN_NW || p == DST_PARAM_NORM_W);
        for (auto &x : v) {
            if (weight) x = rng.normal() / std::sqrt(static_cast<double>(info.shape[1]));
            else if (gamma) x = 1.0 + 0.2 * rng.normal();
            else x = 0.3 * rng.normal();
        }
        set_param(layer, kParamNames[p], v);
    }
}

// All 12 gradients, in order, as doubles.
inline std::vector<std::vector<double>> all_grads(const dst_layer *layer) {
    std::vector<std::vector<double>> g;
    for (int p = 0; p < DST_PARAM_COUNT; ++p) g.push_back(get_grad(layer, kParamNames[p]));
    return g;
}

// Raw bytes of the whole gradient (or parameter) arena.
inline std::vector<unsigned char> grad_arena_bytes(dst_layer *layer) {
    size_t n = 0;
    void *p = nullptr;
    EXPECT_EQ(dst_layer_arena_bytes(layer, &n), DST_OK);
    EXPECT_EQ(dst_layer_grad_arena(layer, &p), DST_OK);
    if (!p) return {};
    auto *c = static_cast<unsigned char *>(p);
    return {c, c + n};
}
inline std::vector<unsigned char> param_arena_bytes(dst_layer *layer) {
    size_t n = 0;
    void *p = nullptr;
    EXPECT_EQ(dst_layer_arena_bytes(layer, &n), DST_OK);
    EXPECT_EQ(dst_layer_param_arena(layer, &p), DST_OK);
    if (!p) return {};
    auto *c = static_cast<unsigned char *>(p);
    return {c, c + n};
}

// ---- comparisons --------------------------------------------------------------------------------
// ‖a − ref‖ / ‖ref‖; NaN (anywhere) gives NaN, which never passes a `<=` bound.
inline double rel_l2(const std::vector<double> &a, const std::vector<double> &ref) {
    if (a.size() != ref.size()) return std::nan("");
    long double num = 0, den = 0;
    for (size_t i = 0; i < a.size(); ++i) {
        const long double d = static_cast<long double>(a[i]) - ref[i];
        num += d * d;
        den += static_cast<long double>(ref[i]) * ref[i];
    }
    if (std::isnan(static_cast<double>(num)) || std::isnan(static_cast<double>(den))) return std::nan("");
    if (den == 0) return num == 0 ? 0.0 : INFINITY;
    return static_cast<double>(std::sqrt(num / den));
}
inline bool bit_equal(const std::vector<double> &a, const std::vector<double> &b) {
    return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(double)) == 0);
}
inline double max_abs_diff(const std::vector<double> &a, const std::vector<double> &b) {
    if (a.size() != b.size()) return INFINITY;
    double m = 0;
    for (size_t i = 0; i < a.size(); ++i) {
        const double d = std::fabs(a[i] - b[i]);
        if (std::isnan(d)) return NAN;
        m = std::max(m, d);
    }
    return m;
}

// ---- errors -------------------------------------------------------------------------------------
// Runs `fn` on a fresh thread, whose thread-local error message starts out empty, so the message
// seen afterwards belongs to this call and no earlier one.
struct CallResult {
    dst_status status;
    std::string message;
};
inline CallResult call_fresh(const std::function<dst_status()> &fn) {
    CallResult r{DST_OK, std::string()};
    std::thread t([&] {
        r.status = fn();
        r.message = dst_last_error();
    });
    t.join();
    return r;
}

// ---- failure messages -------------------------------------------------------------------------
inline std::string lower(std::string s) {
    for (auto &c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    return s;
}

// True when `msg` names `word` as a whole word outside the library's own identifiers: tokens that
// start with "dst_"/"DST_" (the function name every message starts with, enum names) are removed
// first, so "layer" is not found in "dst_layer_forward: ...".
inline bool mentions(const std::string &msg, const std::string &word) {
    auto ident = [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; };
    std::string m;
    for (size_t i = 0; i < msg.size();) {
        const bool at_token_start = (i == 0 || !ident(msg[i - 1]));
        if (at_token_start && i + 4 <= msg.size() && lower(msg.substr(i, 4)) == "dst_") {
            while (i < msg.size() && ident(msg[i])) ++i;
            m += ' ';
            continue;
        }
        m += msg[i++];
    }
    for (size_t pos = m.find(word); pos != std::string::npos; pos = m.find(word, pos + 1)) {
        const bool left = pos == 0 || !ident(m[pos - 1]) || !ident(word.front());
        const size_t end = pos + word.size();
        const bool right = end >= m.size() || !ident(m[end]) || !ident(word.back());
        if (left && right) return true;
    }
    return false;
}

// Asserts that the call fails with `want_` and a message that names `substr_` (see mentions()); the
// call runs on a fresh thread so the message cannot be left over from an earlier failure.
#define EXPECT_FAILS(want_, substr_, ...)                                                         \
    do {                                                                                          \
        const CallResult r_ = call_fresh([&]() -> dst_status { return (__VA_ARGS__); });          \
        EXPECT_EQ(r_.status, (want_)) << #__VA_ARGS__ << " -> " << dst_status_string(r_.status)   \
                                      << ", message: '" << r_.message << "'";                     \
        EXPECT_FALSE(r_.message.empty()) << #__VA_ARGS__ << ": empty dst_last_error()";           \
        EXPECT_TRUE(mentions(r_.message, (substr_)))                                              \
            << #__VA_ARGS__ << ": message '" << r_.message << "' does not name '" << (substr_)    \
            << "'";                                                                               \
    } while (0)

}  // namespace dsttest

#endif  // DST_TESTS_CPU_TEST_UTIL_H
