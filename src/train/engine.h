// The training engine behind dst_engine (DeepSpeed's DeepSpeedEngine at ZeRO stage 0, for C
// trainers): its configuration, an optimizer it owns, the host counters (micro steps, global steps,
// samples), the schedule's position, the model tensors that checkpoints carry besides the optimizer's,
// and training-state checkpoints (engine_checkpoint.cpp). The loss scale and every decision of a step
// live in the optimizer's device state; a step never waits for the device.
#ifndef DST_TRAIN_ENGINE_H
#define DST_TRAIN_ENGINE_H

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/context.h"     // defines: Context
#include "optim/optimizer.h"  // defines: Optimizer
#include "train/config.h"     // defines: EngineConfig

namespace dst {

class Engine {
public:
    static dst_status create(const char *fn, std::shared_ptr<Context> ctx, const char *config_json, int world_size,
                             Engine **out);

    const EngineConfig &config() const { return cfg_; }
    Optimizer &optimizer() const { return *opt_; }
    const std::shared_ptr<Optimizer> &optimizer_ptr() const { return opt_; }
    Backend &backend() const { return *ctx_->backend; }

    dst_status add_model_tensor(const char *fn, const char *name, const dst_tensor &t);
    dst_status scale_loss_gradient(const dst_tensor &t);
    const float *loss_scale_pointer() const { return &opt_->device_state()->loss_scale; }
    bool next_is_boundary() const { return (micro_steps_ + 1) % cfg_.gradient_accumulation_steps == 0; }
    dst_status step();
    dst_status zero_grads() { return opt_->zero_grads(); }
    // Whether a boundary step zeroes the gradients (dst_engine_set_zero_grads_on_step).
    void set_zero_grads_on_step(bool on) { zero_on_step_ = on; }
    bool zero_grads_on_step() const { return zero_on_step_; }
    dst_status get_state(dst_engine_state *out) const;  // all fields; the caller copies the prefix it has
    dst_status get_lr(int group, float *lr) const;

    dst_status save_checkpoint(const char *fn, const char *save_dir, const char *tag, const char *client_state,
                               bool save_latest);
    dst_status load_checkpoint(const char *fn, const char *load_dir, const char *tag,
                               const dst_engine_load_options &o, std::string *client_state);

    struct ModelTensor {
        std::string name;
        dst_tensor view;
        size_t bytes;
    };

private:
    Engine() = default;
    optim::StepArgs control() const;

    std::shared_ptr<Context> ctx_;
    EngineConfig cfg_;
    std::string config_text_;
    std::shared_ptr<Optimizer> opt_;
    std::vector<ModelTensor> model_;
    int64_t micro_steps_ = 0, global_steps_ = 0, global_samples_ = 0;
    int64_t schedule_offset_ = 0;  // BERT script schedules: s = global_steps − offset
    bool rewarm_done_ = false;
    bool zero_on_step_ = true;
};

}  // namespace dst

#endif  // DST_TRAIN_ENGINE_H
