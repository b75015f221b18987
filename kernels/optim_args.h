// The one description of an optimizer step that both backends take (Backend::optim_step), filled by
// the optimizer (src/optim) once its tensors are registered. Plain C++ (no CUDA types), so the host
// code, the CPU twin and the CUDA kernels share it; the scalar math on these structs (loss scaler,
// learning-rate schedules, bias corrections, the element updates) is in kernels/optim_math.h.
//
// A step works on a table of tensors, each a parameter with its gradient and its fp32 state, cut into
// chunks of at most kChunk elements (a chunk never spans two tensors). In the order of the passes:
//   1. norm      (when `compute_norm`): partial[c] = Σ g² over chunk c, in double, g as stored.
//   2. finalize  (always): N² = Σ_c partial[c] in chunk order; overflow = N² not finite; the step is
//                skipped when `check_overflow` and overflow; the loss scaler is updated; the true norm
//                N/S and the combined factor 1/C (C = S·max(1, (N/S + 1e-6)/clip)) are stored; every
//                group's lr for this step comes from the schedule; unless skipped, each tensor's step
//                count t is incremented.
//   3. lamb      (LAMB only, unless skipped): m, v updated; per chunk Σ p² and Σ u² (double).
//   4. ratio     (LAMB only, unless skipped): per tensor r = ‖p‖/‖u‖ clamped (or 1), from its chunks.
//   5. update    (unless skipped): p ← p − lr·u (Adam) or p − step_size·r·u (LAMB); the 16-bit
//                parameter is the master rounded once. With `zero_grads`, the last pass that reads a
//                gradient sets it to zero, also when the step is skipped.
// Every sum runs in a fixed order, so a step is bit-reproducible on a backend for a given table.
#ifndef DST_KERNELS_OPTIM_ARGS_H
#define DST_KERNELS_OPTIM_ARGS_H

#include <stddef.h>
#include <stdint.h>

namespace dst {
namespace optim {

// Largest number of parameter groups (their hyperparameters travel by value with every step).
constexpr int kMaxGroups = 32;
// Elements per chunk of the multi-tensor passes.
constexpr int64_t kChunk = 32768;

// The update rule.
enum Rule : int32_t {
    kRuleAdamL2 = 0,  // FusedAdam, adam_w_mode = false: g ← g + wd·p before the moments
    kRuleAdamW = 1,   // FusedAdam, adam_w_mode = true: u ← u + wd·p after them (decoupled)
    kRuleLamb = 2     // FusedLamb: layer-wise trust ratio
};

// Learning-rate schedules (src/train parses their DeepSpeed names).
enum Schedule : int32_t {
    kScheduleNone = 0,           // each group's own lr
    kScheduleWarmupLR = 1,       // DeepSpeed WarmupLR
    kScheduleWarmupDecayLR = 2,  // DeepSpeed WarmupDecayLR
    kScheduleWarmupCosineLR = 3, // DeepSpeed WarmupCosineLR
    kScheduleWarmupLinear = 4,   // BERT script: warmup_linear
    kScheduleLE = 5,             // BERT script: warmup_linear_decay_exp
    kScheduleEE = 6,             // BERT script: warmup_exp_decay_exp
    kScheduleEP = 7              // BERT script: warmup_exp_decay_poly
};

// One registered tensor (device array of num_tensors). `master` is nullptr for an fp32 parameter,
// which is its own master; `grad` may be fp32 or the parameter's dtype.
struct TensorDesc {
    void *param;
    void *grad;
    float *master;
    float *exp_avg;
    float *exp_avg_sq;
    int64_t *step;        // one int64: the tensor's step count t
    float *lamb_coeff;    // one float: the trust ratio of the last applied LAMB step
    int64_t numel;
    int32_t param_dtype;  // dst_dtype: FP32, FP16 or BF16
    int32_t grad_dtype;
    int32_t group;
    int32_t first_chunk;
    int32_t num_chunks;
    int32_t reserved;
};

// Elements [begin, end) of tensor `tensor` (device array of num_chunks, tensors in order).
struct Chunk {
    int32_t tensor;
    int32_t reserved;
    int64_t begin;
    int64_t end;
};

// Hyperparameters of one group.
struct GroupParams {
    float lr;
    float beta1;
    float beta2;
    float eps;
    float weight_decay;
};

// Dynamic loss scaling (fp16).
struct ScalerConfig {
    int32_t dynamic;        // update the scale from the overflow of each step
    int32_t hysteresis_rule;  // 0: DeepSpeed's stage-0 rule (no hysteresis); 1: its DynamicLossScaler
    int32_t window;         // good steps between doublings, ≥ 1
    int32_t hysteresis;     // overflows tolerated before halving (rule 1), ≥ 1
    int32_t consecutive;    // rule 1: refill the hysteresis on every good step
    float min_scale;        // floor of the scale
};

// A schedule and its parameters (doubles: the formulas run in double on both backends).
struct ScheduleConfig {
    int32_t kind;            // Schedule
    int32_t warmup_log;      // DeepSpeed kinds: 1 log warm-up, 0 linear
    double warmup_min_lr, warmup_max_lr, warmup_num_steps, total_num_steps;  // DeepSpeed kinds
    double warmup_min_ratio, cos_min_ratio;                                  // WarmupCosineLR
    double learning_rate, warmup_proportion, decay_rate, decay_step, total_training_steps,
        lr_offset;                                                           // BERT script kinds
};

// The device-resident state of an optimizer: what a step reads and writes without the host.
struct TrainState {
    // loss scaler
    float loss_scale;
    int32_t cur_iter;
    int32_t last_overflow_iter;
    int32_t hysteresis_left;
    // counters
    int64_t applied_steps;   // steps applied (not skipped) since creation
    int64_t skipped_steps;
    // the last step
    float grad_norm;         // ‖g‖ of the true (unscaled) gradients; 0 when no norm was computed
    float inv_scale;         // 1/C, the factor the gradients were multiplied by
    int32_t norm_computed;
    int32_t overflow;        // the gradients held inf or NaN
    int32_t skipped;         // the step was skipped
    int32_t reserved;
    float lr[kMaxGroups];    // the lr each group used
};

// Everything one step needs. Pointers are in the backend's memory space.
struct StepArgs {
    const TensorDesc *tensors = nullptr;
    int32_t num_tensors = 0;
    const Chunk *chunks = nullptr;
    int32_t num_chunks = 0;
    double *partials = nullptr;  // scratch: 3·num_chunks doubles
    TrainState *state = nullptr;

    int32_t rule = kRuleAdamW;
    int32_t bias_correction = 1;
    int32_t eps_inside_sqrt = 0;  // LAMB: sqrt(v + eps) instead of sqrt(v) + eps
    float max_coeff = 10.0f, min_coeff = 0.01f;
    int32_t num_groups = 0;
    GroupParams groups[kMaxGroups] = {};

    // Gradient scale S: the device loss scale (state->loss_scale) or `grad_scale`.
    int32_t scale_from_state = 0;
    float grad_scale = 1.0f;
    int32_t check_overflow = 0;  // skip the step when a gradient is inf or NaN
    ScalerConfig scaler = {};
    float clip = 0.0f;           // global-norm clip of the true gradients (0: none)
    int32_t compute_norm = 0;    // run the norm pass (clip > 0 or check_overflow)
    ScheduleConfig schedule = {};
    int64_t schedule_step = 0;   // s of the BERT script kinds for this step
    int32_t zero_grads = 0;
};

}  // namespace optim
}  // namespace dst

#endif  // DST_KERNELS_OPTIM_ARGS_H
