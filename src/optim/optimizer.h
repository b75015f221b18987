// The optimizer behind dst_optimizer: parameter groups, the registered tensors with their fp32 state
// (moments, master copies, step counts) in the context's memory, the device tables of the
// multi-tensor step (kernels/optim_args.h) and the device state that a step reads and writes (loss
// scaler, counters, the last step's norm and lrs). A step is one Backend::optim_step call.
//
// State of a tensor: one allocation per tensor, laid out as
//   [header: int64 step, float lamb_coeff | 256 B] [exp_avg | numel fp32] [exp_avg_sq] [master, FP16/BF16]
// with every part 256-byte aligned. The tables are rebuilt (and uploaded, the only wait) on the first
// step after tensors were added or a registered layer got other arenas.
#ifndef DST_OPTIM_OPTIMIZER_H
#define DST_OPTIM_OPTIMIZER_H

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/context.h"        // defines: Context
#include "core/versioned.h"      // defines: StructVersions
#include "kernels/optim_args.h"  // defines: optim::StepArgs, TrainState, TensorDesc, Chunk

namespace dst {

class Layer;

struct OptTensor {
    std::string name;
    int group = 0;
    dst_dtype dtype = DST_DTYPE_FP32;       // of the parameter
    dst_dtype grad_dtype = DST_DTYPE_FP32;
    int32_t ndim = 0;
    int64_t shape[DST_MAX_DIMS] = {0, 0, 0, 0};
    int64_t numel = 0;
    void *param = nullptr;
    void *grad = nullptr;
    const Layer *layer = nullptr;  // a layer parameter: `param`/`grad` follow its arenas
    int layer_param = -1;
    char *state = nullptr;         // the owned allocation (see the file comment)
    size_t state_bytes = 0;

    bool has_master() const { return dtype != DST_DTYPE_FP32; }
    size_t part_bytes() const { return (static_cast<size_t>(numel) * 4 + 255) / 256 * 256; }
    int64_t *step() const { return reinterpret_cast<int64_t *>(state); }
    float *lamb_coeff() const { return reinterpret_cast<float *>(state + 8); }
    float *exp_avg() const { return reinterpret_cast<float *>(state + 256); }
    float *exp_avg_sq() const { return reinterpret_cast<float *>(state + 256 + part_bytes()); }
    float *master() const { return has_master() ? reinterpret_cast<float *>(state + 256 + 2 * part_bytes()) : nullptr; }
    // Bytes of the parameter (and of the gradient, in its dtype).
    size_t param_bytes() const { return static_cast<size_t>(numel) * (dtype == DST_DTYPE_FP32 ? 4 : 2); }
    size_t grad_bytes() const { return static_cast<size_t>(numel) * (grad_dtype == DST_DTYPE_FP32 ? 4 : 2); }
};

// A host copy of an optimizer's state (dst_optimizer_save/load, engine checkpoints).
struct OptimizerSnapshot {
    struct Tensor {
        std::string name;
        int group = 0;
        dst_dtype dtype = DST_DTYPE_FP32, grad_dtype = DST_DTYPE_FP32;
        std::vector<int64_t> shape;
        int64_t step = 0;
        float lamb_coeff = 0.0f;
        std::vector<float> exp_avg, exp_avg_sq, master;  // master empty for FP32 parameters
    };
    dst_optimizer_config config{};
    std::vector<dst_param_group> groups;
    std::vector<Tensor> tensors;
    optim::TrainState train_state{};
};

class Optimizer {
public:
    static dst_status create(const char *fn, std::shared_ptr<Context> ctx, const dst_optimizer_config &cfg,
                             Optimizer **out);
    ~Optimizer();
    Optimizer(const Optimizer &) = delete;
    Optimizer &operator=(const Optimizer &) = delete;

    const dst_optimizer_config &config() const { return cfg_; }
    Context &context() const { return *ctx_; }
    Backend &backend() const { return *ctx_->backend; }

    // ---- groups ----
    int num_groups() const { return static_cast<int>(groups_.size()); }
    const dst_param_group &group(int g) const { return groups_[static_cast<size_t>(g)]; }
    dst_status add_group(const char *fn, const dst_param_group &g, int *index);
    dst_status set_group(const char *fn, int index, const dst_param_group &g);

    // ---- tensors ----
    // Registers `param` (updated in place) and `grad`; validated here (messages name `fn`).
    dst_status add_tensor(const char *fn, int group, const char *name, const dst_tensor &param, const dst_tensor &grad);
    dst_status add_layer(const char *fn, Layer *layer, const char *prefix, int decay_group, int no_decay_group);
    size_t num_tensors() const { return tensors_.size(); }
    const OptTensor &tensor(size_t i) const { return tensors_[i]; }
    int find(const std::string &name) const;
    // Whether [p, p + bytes) overlaps a registered parameter or gradient (the name of one in *what).
    bool overlaps(const void *p, size_t bytes, std::string *what) const;

    // An engine that owns this optimizer: dst_optimizer_step is refused, and only the parameter dtypes
    // of `allowed` (a bit per dst_dtype) may be registered; `why` explains a refusal.
    void set_engine_owned(unsigned allowed, const std::string &why) {
        engine_owned_ = true;
        allowed_dtypes_ = allowed;
        allowed_why_ = why;
    }
    bool engine_owned() const { return engine_owned_; }

    dst_status refresh_masters();
    dst_status zero_grads();
    // Follows registered layers whose arenas were rebound (the next step rebuilds the tables).
    dst_status sync_layers();
    dst_status set_step(int index, int64_t step);

    // One step. `control` carries the scaling, overflow, scaler, clip, schedule and zero_grads fields
    // of optim::StepArgs; the optimizer fills the tables, groups and rule.
    dst_status step(const optim::StepArgs &control);

    // The device state (loss scaler, counters, last norm) — reading waits for the device.
    const optim::TrainState *device_state() const { return state_; }
    dst_status read_state(optim::TrainState *out) const;
    dst_status write_state(const optim::TrainState &s);
    // A tensor's step count and trust ratio (waits).
    dst_status read_tensor_counters(size_t i, int64_t *step, float *coeff) const;

    // ---- saved state (optimizer_io.cpp) ----
    dst_status snapshot(OptimizerSnapshot *out) const;
    // Checks that `s` describes this optimizer's tensors and groups (messages name `fn` and `source`).
    dst_status check_snapshot(const char *fn, const std::string &source, const OptimizerSnapshot &s) const;
    // Applies a checked snapshot (host to device copies).
    dst_status restore(const OptimizerSnapshot &s, bool train_state);
    dst_status save_file(const char *fn, const std::string &path, const std::map<std::string, std::string> &extra)
        const;
    // Reads and verifies an optimizer file into *out (nothing changes); its metadata in *metadata.
    static dst_status read_file(const char *fn, const std::string &path, OptimizerSnapshot *out,
                                std::map<std::string, std::string> *metadata);

    int32_t rule() const;

private:
    Optimizer() = default;
    dst_status check_group(const char *fn, const char *arg, const dst_param_group &g) const;
    // Validates a tensor without registering it; `pending` are tensors validated in the same call.
    dst_status check_tensor(const char *fn, int group, const std::string &name, const dst_tensor &param,
                            const dst_tensor &grad, const std::vector<OptTensor> &pending) const;
    // Allocates and initialises the state of `t` (zero moments, master from the parameter).
    dst_status init_state(OptTensor *t);
    void free_state(OptTensor *t);
    void insert(OptTensor &&t);
    dst_status build_tables();
    void free_tables();

    std::shared_ptr<Context> ctx_;
    dst_optimizer_config cfg_{};
    std::vector<dst_param_group> groups_;
    std::vector<OptTensor> tensors_;
    std::map<std::string, size_t> by_name_;
    std::map<uintptr_t, std::pair<uintptr_t, size_t>> ranges_;  // begin -> (end, tensor index)
    bool engine_owned_ = false;
    unsigned allowed_dtypes_ = ~0u;
    std::string allowed_why_;

    optim::TrainState *state_ = nullptr;  // device
    bool dirty_ = true;
    void *tables_ = nullptr;              // device: TensorDesc[n] | Chunk[c]
    double *partials_ = nullptr;          // device: 3·c doubles
    int32_t num_chunks_ = 0;
};

// Config and group checks shared by the C API shims (messages name fn and the field).
dst_status optimizer_config_check(const char *fn, const dst_optimizer_config &c);
void optimizer_config_defaults(dst_optimizer_config *c);
void param_group_defaults(dst_param_group *g);
// The group 0 hyperparameters a configuration gives.
dst_param_group group_of_config(const dst_optimizer_config &c);
extern const StructVersions kOptimizerConfigVersions;
extern const StructVersions kParamGroupVersions;

}  // namespace dst

#endif  // DST_OPTIM_OPTIMIZER_H
