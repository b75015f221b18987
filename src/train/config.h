// The training engine's configuration: DeepSpeed's JSON keys (docs/engine.md lists
// every key), parsed strictly — an unknown key, a duplicate key, a wrong type or a
// value out of range is an error naming its JSON path — and resolved (the batch-size triad, the
// loss-scaler defaults of DeepSpeed's fp16 wrappers, the schedule).
#ifndef DST_TRAIN_CONFIG_H
#define DST_TRAIN_CONFIG_H

#include <cstdint>
#include <string>

#include "dstransformer/dstransformer.h"  // defines: dst_status, dst_optimizer_config
#include "kernels/optim_args.h"            // defines: optim::ScheduleConfig, ScalerConfig

namespace dst {

struct EngineConfig {
    // batch sizes, resolved: train_batch_size = micro_batch · gradient_accumulation_steps · world_size
    int32_t train_batch_size = 0;
    int32_t micro_batch = 0;
    int32_t gradient_accumulation_steps = 0;
    int32_t world_size = 1;
    int32_t steps_per_print = 0;  // 0: absent (DeepSpeed's None)
    float gradient_clipping = 0.0f;

    // optimizer (group 0 = its params)
    dst_optimizer_config optimizer{};

    // precision and loss scaling
    bool fp16 = false;
    bool bf16 = false;
    float static_loss_scale = 0.0f;  // fp16.loss_scale > 0: a static scale
    float initial_scale = 65536.0f;  // dynamic: 2^initial_scale_power
    optim::ScalerConfig scaler{};    // dynamic = fp16 with loss_scale 0

    // schedule
    std::string scheduler;                  // DeepSpeed's type name, "" for none
    optim::ScheduleConfig schedule{};
    int64_t last_batch_iteration = -1;      // DeepSpeed schedulers: the iteration they start after
    bool rewarm = false;                    // BERT script schedules: restart at s = 0 on load
};

// Parses and resolves `json_text` for `world_size` processes; messages start with `fn`.
// DST_ERR_INVALID_ARGUMENT for malformed or invalid configurations, DST_ERR_UNSUPPORTED for valid
// DeepSpeed settings the library does not implement.
dst_status parse_engine_config(const char *fn, const char *json_text, int world_size, EngineConfig *out);

}  // namespace dst

#endif  // DST_TRAIN_CONFIG_H
