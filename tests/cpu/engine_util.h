// Helpers of the engine tests (CPU and CUDA suites): RAII engines, engine states, and a small training
// setup — a stack of layers plus a caller tensor trained by an engine on a deterministic regression
// task — whose losses and weights two runs can compare bit for bit.
#ifndef DST_TESTS_CPU_ENGINE_UTIL_H
#define DST_TESTS_CPU_ENGINE_UTIL_H

#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "test_util.h"

namespace dsttest {

struct OptDeleter {
    void operator()(dst_optimizer *o) const { dst_optimizer_destroy(o); }
};
using Opt = std::unique_ptr<dst_optimizer, OptDeleter>;

inline Opt make_opt(dst_context *ctx, const dst_optimizer_config &c) {
    dst_optimizer *o = nullptr;
    EXPECT_EQ(dst_optimizer_create(ctx, &c, &o), DST_OK) << dst_last_error();
    return Opt(o);
}

// A 1-D parameter with its gradient in host memory (the CPU backend's memory space); the gradient
// starts at `gv` (zeros when empty).
struct Param {
    HostTensor p, g;
    Param(dst_dtype pdt, dst_dtype gdt, const std::vector<double> &pv, std::vector<double> gv = {})
        : p(HostTensor::from_doubles(pdt, {static_cast<int64_t>(pv.size())}, pv)),
          g(HostTensor::from_doubles(gdt, {static_cast<int64_t>(pv.size())},
                                     gv.empty() ? std::vector<double>(pv.size(), 0.0) : gv)) {}
    dst_status add(dst_optimizer *o, int group, const char *name) const {
        dst_tensor pv = p.view(), gv = g.view();
        return dst_optimizer_add_tensor(o, group, name, &pv, &gv);
    }
};

struct EngineDeleter {
    void operator()(dst_engine *e) const { dst_engine_destroy(e); }
};
using Engine = std::unique_ptr<dst_engine, EngineDeleter>;

inline Engine make_engine(dst_context *ctx, const std::string &json) {
    dst_engine *e = nullptr;
    const dst_status s = dst_engine_create(ctx, json.c_str(), 1, &e);
    EXPECT_EQ(s, DST_OK) << "dst_engine_create: " << dst_last_error() << "\n" << json;
    return Engine(e);
}

inline dst_optimizer *optimizer_of(dst_engine *e) {
    dst_optimizer *o = nullptr;
    EXPECT_EQ(dst_engine_get_optimizer(e, &o), DST_OK) << dst_last_error();
    return o;
}

inline dst_engine_state engine_state(const dst_engine *e) {
    dst_engine_state s;
    std::memset(&s, 0, sizeof s);
    s.struct_size = sizeof s;
    EXPECT_EQ(dst_engine_get_state(e, &s), DST_OK) << dst_last_error();
    return s;
}

inline float engine_lr(const dst_engine *e, int group = 0) {
    float lr = -1.0f;
    EXPECT_EQ(dst_engine_get_lr(e, group, &lr), DST_OK) << dst_last_error();
    return lr;
}

// Copies a tensor between host and context memory (the CPU backend's memory is the host's).
inline void to_context(dst_context *ctx, void *dst, const void *src, size_t bytes) {
    EXPECT_EQ(dst_memcpy(ctx, dst, src, bytes, DST_COPY_HOST_TO_CONTEXT), DST_OK) << dst_last_error();
}
inline void to_host(dst_context *ctx, void *dst, const void *src, size_t bytes) {
    EXPECT_EQ(dst_memcpy(ctx, dst, src, bytes, DST_COPY_CONTEXT_TO_HOST), DST_OK) << dst_last_error();
}

// Memory in a context, freed with it.
class CtxBuffer {
public:
    CtxBuffer(dst_context *ctx, size_t bytes) : ctx_(ctx), bytes_(bytes) {
        EXPECT_EQ(dst_malloc(ctx, bytes, &ptr_), DST_OK) << dst_last_error();
    }
    ~CtxBuffer() { dst_free(ctx_, ptr_); }
    CtxBuffer(const CtxBuffer &) = delete;
    CtxBuffer &operator=(const CtxBuffer &) = delete;
    void *data() const { return ptr_; }
    size_t bytes() const { return bytes_; }
    void upload(const HostTensor &h) { to_context(ctx_, ptr_, h.data(), h.nbytes()); }
    void download(HostTensor &h) const { to_host(ctx_, h.data(), ptr_, h.nbytes()); }
    dst_tensor view(dst_dtype dt, std::vector<int64_t> shape) const {
        dst_tensor t;
        std::memset(&t, 0, sizeof t);
        t.data = ptr_;
        t.dtype = dt;
        t.ndim = static_cast<int32_t>(shape.size());
        for (size_t i = 0; i < shape.size(); ++i) t.shape[i] = shape[i];
        return t;
    }

private:
    dst_context *ctx_;
    size_t bytes_;
    void *ptr_ = nullptr;
};

// A regression task over `num_layers` Pre-LN layers (H = 16, 4 heads, I = 32, dropout on) followed by
// a caller-owned fp32 gain vector s[H]: y' = layers(x) ⊙ s, loss = ½·mean over tokens of ‖y' − t‖².
// Everything lives in the given context; inputs and targets of micro-step k come from a generator
// seeded with k, so a resumed run sees the same data as an uninterrupted one.
class TinyModel {
public:
    static constexpr int64_t B = 2, S = 6, H = 16;

    TinyModel(dst_context *ctx, dst_dtype dt, int num_layers, uint64_t seed) : ctx_(ctx), dt_(dt) {
        dst_layer_config cfg = small_config(16, 4, 32, dt);
        cfg.max_batch_tokens = B * S;
        cfg.max_seq_len = S;
        cfg.num_hidden_layers = num_layers;
        cfg.hidden_dropout_ratio = 0.1f;
        cfg.attn_dropout_ratio = 0.1f;
        for (int i = 0; i < num_layers; ++i) {
            cfg.seed = seed + static_cast<uint64_t>(i);
            layers_.push_back(make_layer(ctx, cfg));
        }
        gain_.reset(new CtxBuffer(ctx, H * 4));
        gain_grad_.reset(new CtxBuffer(ctx, H * 4));
        HostTensor g = HostTensor::from_doubles(DST_DTYPE_FP32, {H}, std::vector<double>(H, 1.0 + 0.01 * seed));
        gain_->upload(g);
        HostTensor z(DST_DTYPE_FP32, {H});
        gain_grad_->upload(z);
        for (int i = 0; i <= num_layers; ++i) acts_.emplace_back(new CtxBuffer(ctx, B * S * H * esize(dt)));
        dy_.reset(new CtxBuffer(ctx, B * S * H * esize(dt)));
        dx_.reset(new CtxBuffer(ctx, B * S * H * esize(dt)));
        dy32_.reset(new CtxBuffer(ctx, B * S * H * 4));
    }

    // Registers the layers (weights in group 0, biases and LayerNorms in group 1) and the gain.
    void register_with(dst_engine *e) {
        dst_optimizer *o = optimizer_of(e);
        int groups = 0;
        EXPECT_EQ(dst_optimizer_num_groups(o, &groups), DST_OK);
        if (groups == 1) {
            dst_param_group g;
            g.struct_size = sizeof g;
            EXPECT_EQ(dst_optimizer_get_group(o, 0, &g), DST_OK);
            g.weight_decay = 0.0f;
            EXPECT_EQ(dst_optimizer_add_group(o, &g, nullptr), DST_OK) << dst_last_error();
        }
        for (size_t i = 0; i < layers_.size(); ++i) {
            const std::string prefix = "encoder.layer." + std::to_string(i) + ".";
            EXPECT_EQ(dst_optimizer_add_layer(o, layers_[i].get(), prefix.c_str(), 0, 1), DST_OK) << dst_last_error();
        }
        dst_tensor p = gain_->view(DST_DTYPE_FP32, {H}), g = gain_grad_->view(DST_DTYPE_FP32, {H});
        EXPECT_EQ(dst_optimizer_add_tensor(o, 1, "head.gain", &p, &g), DST_OK) << dst_last_error();
        EXPECT_EQ(dst_engine_zero_grads(e), DST_OK) << dst_last_error();
    }

    // One micro-step: forward, loss, scaled loss gradient, backward (accumulating), dst_engine_step.
    // Returns the micro-batch's loss.
    double micro_step(dst_engine *e, int64_t k) {
        Rng rng(1000 + static_cast<uint64_t>(k));
        HostTensor x = HostTensor::from_doubles(dt_, {B, S, H}, rng.normals(B * S * H));
        const std::vector<double> t = rng.normals(B * S * H, 0.5);
        acts_[0]->upload(x);
        for (size_t i = 0; i < layers_.size(); ++i) {
            dst_tensor in = acts_[i]->view(dt_, {B, S, H}), out = acts_[i + 1]->view(dt_, {B, S, H});
            EXPECT_EQ(dst_layer_forward(layers_[i].get(), nullptr, &in, nullptr, &out), DST_OK) << dst_last_error();
        }
        HostTensor y(dt_, {B, S, H}), gain(DST_DTYPE_FP32, {H}), gg(DST_DTYPE_FP32, {H});
        acts_.back()->download(y);
        gain_->download(gain);
        gain_grad_->download(gg);
        const double n = static_cast<double>(B * S);
        double loss = 0.0;
        HostTensor dy32(DST_DTYPE_FP32, {B, S, H});
        std::vector<double> dgain(H, 0.0);
        for (int64_t i = 0; i < B * S * H; ++i) {
            const int64_t h = i % H;
            const double yp = y.get(i) * gain.get(h), r = yp - t[static_cast<size_t>(i)];
            loss += 0.5 * r * r / n;
            dy32.set(i, r * gain.get(h) / n);
            dgain[static_cast<size_t>(h)] += r * y.get(i) / n;
        }
        // The gain's gradient is scaled like the layers' (loss scale / accumulation steps): through the
        // engine, on a copy in context memory.
        HostTensor dg(DST_DTYPE_FP32, {H});
        for (int64_t h = 0; h < H; ++h) dg.set(h, dgain[static_cast<size_t>(h)]);
        CtxBuffer tmp(ctx_, H * 4);
        tmp.upload(dg);
        dst_tensor tv = tmp.view(DST_DTYPE_FP32, {H});
        EXPECT_EQ(dst_engine_scale_loss_gradient(e, &tv), DST_OK) << dst_last_error();
        tmp.download(dg);
        for (int64_t h = 0; h < H; ++h) gg.set(h, gg.get(h) + dg.get(h));
        gain_grad_->upload(gg);
        dy32_->upload(dy32);
        dst_tensor d32 = dy32_->view(DST_DTYPE_FP32, {B, S, H});
        EXPECT_EQ(dst_engine_scale_loss_gradient(e, &d32), DST_OK) << dst_last_error();
        dy32_->download(dy32);
        HostTensor dy(dt_, {B, S, H});
        for (int64_t i = 0; i < B * S * H; ++i) dy.set(i, dy32.get(i));
        dy_->upload(dy);
        for (size_t i = layers_.size(); i-- > 0;) {
            dst_tensor go = (i + 1 == layers_.size() ? dy_ : dx_)->view(dt_, {B, S, H});
            CtxBuffer next(ctx_, B * S * H * esize(dt_));
            dst_tensor gi = next.view(dt_, {B, S, H});
            EXPECT_EQ(dst_layer_backward(layers_[i].get(), nullptr, &go, &gi, DST_GRAD_ACCUMULATE), DST_OK)
                << dst_last_error();
            EXPECT_EQ(dst_memcpy(ctx_, dx_->data(), next.data(), next.bytes(), DST_COPY_CONTEXT_TO_CONTEXT), DST_OK);
        }
        EXPECT_EQ(dst_engine_step(e), DST_OK) << dst_last_error();
        return loss;
    }

    // Every weight of the model: the twelve parameters of each layer (their bytes in the arena, not the
    // padding between them) and the gain.
    std::vector<unsigned char> weights() const {
        std::vector<unsigned char> out;
        for (const Layer &l : layers_) {
            void *arena = nullptr;
            EXPECT_EQ(dst_layer_param_arena(l.get(), &arena), DST_OK);
            for (int p = 0; p < DST_PARAM_COUNT; ++p) {
                dst_param_info info;
                EXPECT_EQ(dst_layer_param_info(l.get(), static_cast<dst_param>(p), &info), DST_OK);
                std::vector<unsigned char> b(info.size_bytes);
                to_host(ctx_, b.data(), static_cast<char *>(arena) + info.offset_bytes, b.size());
                out.insert(out.end(), b.begin(), b.end());
            }
        }
        std::vector<unsigned char> g(H * 4);
        to_host(ctx_, g.data(), gain_->data(), g.size());
        out.insert(out.end(), g.begin(), g.end());
        return out;
    }

    dst_layer *layer(size_t i) const { return layers_[i].get(); }

private:
    dst_context *ctx_;
    dst_dtype dt_;
    std::vector<Layer> layers_;
    std::unique_ptr<CtxBuffer> gain_, gain_grad_, dy_, dx_, dy32_;
    std::vector<std::unique_ptr<CtxBuffer>> acts_;
};

// Every fp32 state tensor of an optimizer (moments, masters), as bytes.
inline std::vector<unsigned char> optimizer_state_bytes(dst_context *ctx, dst_optimizer *o) {
    std::vector<unsigned char> out;
    int n = 0;
    EXPECT_EQ(dst_optimizer_num_tensors(o, &n), DST_OK);
    for (int i = 0; i < n; ++i)
        for (dst_optimizer_state w : {DST_OPTIMIZER_STATE_EXP_AVG, DST_OPTIMIZER_STATE_EXP_AVG_SQ,
                                      DST_OPTIMIZER_STATE_MASTER}) {
            dst_tensor v;
            if (dst_optimizer_get_state(o, i, w, &v) != DST_OK) continue;  // fp32 tensors have no master
            int64_t numel = 1;
            for (int d = 0; d < v.ndim; ++d) numel *= v.shape[d];
            std::vector<unsigned char> b(static_cast<size_t>(numel) * 4);
            to_host(ctx, b.data(), v.data, b.size());
            out.insert(out.end(), b.begin(), b.end());
        }
    return out;
}

// Trains a TinyModel (two fp16 layers) 8 boundary steps (16 micro-steps) without stopping, saving a
// checkpoint after 4; then a new context from `make`, layers initialised from another seed and a new
// engine load it and train the last 4. The losses of the last 8 micro-steps, every weight, every
// optimizer state, the loss scale and the counters must match bit for bit; the client state and the
// RNG state come from the checkpoint.
inline void expect_resume_bit_identical(const std::function<Ctx()> &make, const std::string &json,
                                        const std::string &dir) {
    std::vector<double> straight;
    std::vector<unsigned char> weights, opt_state;
    dst_engine_state end{};
    {
        Ctx ctx = make();
        ASSERT_EQ(dst_context_set_rng_state(ctx.get(), 5, 0), DST_OK);
        TinyModel model(ctx.get(), DST_DTYPE_FP16, 2, 1);
        Engine e = make_engine(ctx.get(), json);
        model.register_with(e.get());
        for (int64_t k = 0; k < 16; ++k) {
            straight.push_back(model.micro_step(e.get(), k));
            if (k == 7) {
                ASSERT_EQ(dst_engine_save_checkpoint(e.get(), dir.c_str(), "mid", R"({"epoch": 1})", 1), DST_OK)
                    << dst_last_error();
            }
        }
        weights = model.weights();
        opt_state = optimizer_state_bytes(ctx.get(), optimizer_of(e.get()));
        end = engine_state(e.get());
    }
    Ctx ctx = make();
    ASSERT_EQ(dst_context_set_rng_state(ctx.get(), 999, 12345), DST_OK);
    TinyModel model(ctx.get(), DST_DTYPE_FP16, 2, 50);
    Engine e = make_engine(ctx.get(), json);
    model.register_with(e.get());
    char client[64];
    size_t len = 0;
    ASSERT_EQ(dst_engine_load_checkpoint(e.get(), dir.c_str(), nullptr, nullptr, client, sizeof client, &len), DST_OK)
        << dst_last_error();
    EXPECT_EQ(std::string(client), R"({"epoch":1})");
    EXPECT_EQ(len, std::strlen(client));
    const dst_engine_state at = engine_state(e.get());
    ASSERT_EQ(at.micro_steps, 8);
    EXPECT_EQ(at.global_steps, 4);
    for (int64_t k = at.micro_steps; k < 16; ++k)
        EXPECT_EQ(model.micro_step(e.get(), k), straight[static_cast<size_t>(k)]) << "micro-step " << k;
    EXPECT_TRUE(model.weights() == weights) << "weights after the resumed run";
    EXPECT_TRUE(optimizer_state_bytes(ctx.get(), optimizer_of(e.get())) == opt_state) << "optimizer state";
    const dst_engine_state now = engine_state(e.get());
    EXPECT_EQ(now.loss_scale, end.loss_scale);
    EXPECT_EQ(now.skipped_steps, end.skipped_steps);
    EXPECT_EQ(now.global_samples, end.global_samples);
    uint64_t seed = 0, offset = 0;
    EXPECT_EQ(dst_context_get_rng_state(ctx.get(), &seed, &offset), DST_OK);
    EXPECT_EQ(seed, 5u) << "the RNG state came from the checkpoint";
}

// The engine configuration of the resume tests: accumulation 2, clipping, a schedule, dynamic fp16
// scaling with a short window (the scale changes during the run), the optimizer `opt`.
inline std::string resume_config(const char *opt) {
    return std::string(R"({"train_batch_size": 4, "train_micro_batch_size_per_gpu": 2, "gradient_clipping": 1.0,
        "optimizer": {"type": ")") + opt + R"(", "params": {"lr": 0.002, "weight_decay": 0.01}},
        "scheduler": {"type": "WarmupLR", "params": {"warmup_max_lr": 0.002, "warmup_num_steps": 5}},
        "fp16": {"enabled": true, "initial_scale_power": 12, "loss_scale_window": 3}})";
}

}  // namespace dsttest

#endif  // DST_TESTS_CPU_ENGINE_UTIL_H
