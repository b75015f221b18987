#include "train/engine.h"

#include <cstring>
#include <utility>

#include "checkpoint/safetensors.h"  // defines: st::valid_utf8
#include "core/dtype.h"              // defines: dtype_size
#include "core/error.h"              // defines: set_error, DST_TRY
#include "kernels/optim_math.h"      // defines: optim::schedule_lr

namespace dst {

namespace {

// The parameter dtypes an engine's precision allows (a bit per dst_dtype), and why others are refused.
unsigned allowed_dtypes(const EngineConfig &c, std::string *why) {
    unsigned m = 1u << DST_DTYPE_FP32;
    if (c.fp16) m |= 1u << DST_DTYPE_FP16;
    if (c.bf16) m |= 1u << DST_DTYPE_BF16;
    *why = c.fp16   ? "the engine's configuration enables fp16: parameters are fp16 or fp32"
           : c.bf16 ? "the engine's configuration enables bf16: parameters are bf16 or fp32"
                    : "the engine's configuration enables neither fp16 nor bf16: parameters are fp32 (set "
                      "fp16.enabled or bf16.enabled for 16-bit parameters)";
    return m;
}

}  // namespace

dst_status Engine::create(const char *fn, std::shared_ptr<Context> ctx, const char *config_json, int world_size,
                          Engine **out) {
    EngineConfig cfg;
    DST_TRY(parse_engine_config(fn, config_json, world_size, &cfg));
    if (world_size != 1)
        return set_error(DST_ERR_UNSUPPORTED,
                         "%s: world_size is %d; data parallelism needs a communicator, which this version does not "
                         "have: create the engine with world_size 1", fn, world_size);
    const std::string text(config_json);
    size_t bad = 0;
    if (!st::valid_utf8(text.data(), text.size(), &bad))
        return set_error(DST_ERR_INVALID_ARGUMENT, "%s: config_json is not valid UTF-8 (byte %zu)", fn, bad);
    std::unique_ptr<Engine> e(new Engine());
    e->ctx_ = std::move(ctx);
    e->cfg_ = cfg;
    e->config_text_ = text;
    Optimizer *o = nullptr;
    DST_TRY(Optimizer::create(fn, e->ctx_, cfg.optimizer, &o));
    e->opt_.reset(o);
    std::string why;
    const unsigned allowed = allowed_dtypes(cfg, &why);
    e->opt_->set_engine_owned(allowed, why);
    optim::TrainState s;
    std::memset(&s, 0, sizeof s);
    s.loss_scale = cfg.fp16 ? (cfg.static_loss_scale > 0.0f ? cfg.static_loss_scale : cfg.initial_scale) : 1.0f;
    s.last_overflow_iter = -1;
    s.hysteresis_left = cfg.scaler.hysteresis;
    s.applied_steps = cfg.last_batch_iteration + 1;
    s.inv_scale = 1.0f;
    DST_TRY(e->opt_->write_state(s));
    *out = e.release();
    return DST_OK;
}

dst_status Engine::add_model_tensor(const char *fn, const char *name, const dst_tensor &t) {
    const std::string nm(name);
    size_t bad = 0;
    if (nm.empty()) return set_error(DST_ERR_INVALID_ARGUMENT, "%s: name is empty", fn);
    if (nm.size() > 1024 || !st::valid_utf8(nm.data(), nm.size(), &bad))
        return set_error(DST_ERR_INVALID_ARGUMENT, "%s: name is longer than 1024 bytes or not valid UTF-8", fn);
    if (opt_->find(nm) >= 0)
        return set_error(DST_ERR_INVALID_ARGUMENT, "%s: name \"%s\" is a tensor of the engine's optimizer already", fn,
                         nm.c_str());
    for (const ModelTensor &m : model_)
        if (m.name == nm) return set_error(DST_ERR_INVALID_ARGUMENT, "%s: name \"%s\" is registered already", fn, nm.c_str());
    int dt;
    std::memcpy(&dt, &t.dtype, sizeof dt);
    if (dtype_size(static_cast<dst_dtype>(dt)) == 0)
        return set_error(DST_ERR_INVALID_ARGUMENT, "%s: tensor->dtype is %d, expected a dst_dtype", fn, dt);
    if (!t.data) return set_error(DST_ERR_INVALID_ARGUMENT, "%s: tensor->data is NULL", fn);
    if (t.ndim < 1 || t.ndim > DST_MAX_DIMS)
        return set_error(DST_ERR_INVALID_ARGUMENT, "%s: tensor->ndim is %d, expected 1..%d", fn, (int)t.ndim, DST_MAX_DIMS);
    int64_t n = 1;
    for (int i = 0; i < t.ndim; ++i) {
        if (t.shape[i] < 1 || t.shape[i] > (int64_t(1) << 40))
            return set_error(DST_ERR_INVALID_ARGUMENT, "%s: tensor->shape[%d] is %lld, expected 1..2^40", fn, i,
                             (long long)t.shape[i]);
        n *= t.shape[i];
        if (n > (int64_t(1) << 40))
            return set_error(DST_ERR_INVALID_ARGUMENT, "%s: tensor has more than 2^40 elements", fn);
    }
    const size_t bytes = static_cast<size_t>(n) * dtype_size(t.dtype);
    std::string other;
    if (opt_->overlaps(t.data, bytes, &other))
        return set_error(DST_ERR_INVALID_ARGUMENT, "%s: tensor overlaps the memory of optimizer tensor \"%s\"", fn,
                         other.c_str());
    const uintptr_t a = reinterpret_cast<uintptr_t>(t.data);
    for (const ModelTensor &m : model_) {
        const uintptr_t b = reinterpret_cast<uintptr_t>(m.view.data);
        if (a < b + m.bytes && b < a + bytes)
            return set_error(DST_ERR_INVALID_ARGUMENT, "%s: tensor overlaps model tensor \"%s\"", fn, m.name.c_str());
    }
    ModelTensor m;
    m.name = nm;
    m.view = t;
    for (int i = t.ndim; i < DST_MAX_DIMS; ++i) m.view.shape[i] = 0;
    m.bytes = bytes;
    model_.push_back(std::move(m));
    return DST_OK;
}

dst_status Engine::scale_loss_gradient(const dst_tensor &t) {
    int64_t n = 1;
    for (int i = 0; i < t.ndim; ++i) n *= t.shape[i];
    return backend().scale_by(t.dtype, t.data, n, loss_scale_pointer(),
                              1.0f / static_cast<float>(cfg_.gradient_accumulation_steps));
}

optim::StepArgs Engine::control() const {
    optim::StepArgs a;
    a.scale_from_state = 1;
    a.check_overflow = cfg_.fp16;
    a.scaler = cfg_.scaler;
    a.clip = cfg_.gradient_clipping;
    a.compute_norm = cfg_.fp16 || cfg_.gradient_clipping > 0.0f;
    a.schedule = cfg_.schedule;
    a.schedule_step = global_steps_ - schedule_offset_;
    a.zero_grads = zero_on_step_ ? 1 : 0;
    return a;
}

dst_status Engine::step() {
    if (opt_->num_tensors() == 0)
        return set_error(DST_ERR_STATE, "dst_engine_step: no tensor is registered with the engine's optimizer "
                         "(dst_engine_get_optimizer, then dst_optimizer_add_tensor or dst_optimizer_add_layer)");
    if (next_is_boundary()) {
        DST_TRY(opt_->step(control()));
        global_steps_ += 1;
        global_samples_ += cfg_.train_batch_size;
    }
    micro_steps_ += 1;
    return DST_OK;
}

dst_status Engine::get_state(dst_engine_state *out) const {
    optim::TrainState s;
    DST_TRY(opt_->read_state(&s));
    dst_engine_state r;
    std::memset(&r, 0, sizeof r);
    r.struct_size = sizeof r;
    r.train_batch_size = cfg_.train_batch_size;
    r.train_micro_batch_size_per_gpu = cfg_.micro_batch;
    r.gradient_accumulation_steps = cfg_.gradient_accumulation_steps;
    r.world_size = cfg_.world_size;
    r.optimizer = cfg_.optimizer.kind;
    r.fp16_enabled = cfg_.fp16;
    r.bf16_enabled = cfg_.bf16;
    r.dynamic_loss_scale = cfg_.scaler.dynamic;
    r.steps_per_print = cfg_.steps_per_print;
    r.gradient_clipping = cfg_.gradient_clipping;
    r.micro_steps = micro_steps_;
    r.global_steps = global_steps_;
    r.global_samples = global_samples_;
    r.skipped_steps = s.skipped_steps;
    r.loss_scale = s.loss_scale;
    r.grad_norm = s.norm_computed ? s.grad_norm : 0.0f;
    r.last_step_applied = global_steps_ > 0 && !s.skipped;
    r.last_overflow = global_steps_ > 0 && s.overflow;
    *out = r;
    return DST_OK;
}

dst_status Engine::get_lr(int group, float *lr) const {
    optim::TrainState s;
    DST_TRY(opt_->read_state(&s));
    const double base = opt_->group(group).lr;
    *lr = static_cast<float>(optim::schedule_lr(cfg_.schedule, base, s.applied_steps, global_steps_ - schedule_offset_));
    return DST_OK;
}

}  // namespace dst
