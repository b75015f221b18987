// One Transformer layer: its parameters and gradients (two arenas), its workspace, and the dataflow
// of docs/api.md ("What a layer computes") written once over the Backend op table.
#ifndef DST_LAYER_LAYER_H
#define DST_LAYER_LAYER_H

#include <array>
#include <cstdint>
#include <memory>
#include <set>

#include "backend/backend.h"  // defines: Backend, AttentionParams, DropoutSite
#include "core/context.h"     // defines: Context
#include "layer/buffers.h"    // defines: Plan, Slot
#include "layer/config.h"     // defines: Dims

namespace dst {

class Layer;

// Activations of one training forward (the object behind dst_saved).
struct Saved {
    Layer *layer = nullptr;       // null once the layer is gone
    void *mem = nullptr;
    size_t capacity = 0;
    bool valid = false;           // holds a training forward
    int64_t B = 0, S = 0;
    uint64_t rng_seed = 0, rng_offset = 0;
    // The offsets' high word in backend memory (the kSlotRng slot), or nullptr: a forward captured
    // into a CUDA graph, whose replays each take a new word (kernels/philox.h, graph dropout).
    const uint32_t *rng_offset_hi = nullptr;
    dst_mask_kind mask_kind = DST_MASK_NONE;
    dst_dtype mask_dtype = DST_DTYPE_FP32;
    size_t bytes = 0;             // bytes of the recorded forward
    // A packed forward (dst_layer_forward_packed) of packed_n rows (their padded places and the
    // key lengths are slots of the plan).
    bool packed = false;
    int64_t packed_n = 0;

    void release();
    ~Saved() { release(); }
};

// A validated mask: kind, data pointer (context memory), dtype.
struct MaskArg {
    dst_mask_kind kind = DST_MASK_NONE;
    const void *data = nullptr;
    dst_dtype dtype = DST_DTYPE_FP32;
};

class Layer {
public:
    static dst_status create(std::shared_ptr<Context> ctx, const dst_layer_config &cfg, Layer **out);
    ~Layer();
    Layer(const Layer &) = delete;
    Layer &operator=(const Layer &) = delete;

    const dst_layer_config &config() const { return cfg_; }
    const Dims &dims() const { return dims_; }
    int id() const { return id_; }
    Backend &backend() const { return *ctx_->backend; }
    Context &context() const { return *ctx_; }
    bool training() const { return training_; }
    void set_training(bool on) { training_ = on; }

    // Arenas.
    size_t arena_bytes() const { return arena_bytes_; }
    size_t param_offset(int p) const { return offset_[p]; }
    int64_t param_numel(int p) const { return numel_[p]; }
    void param_shape(int p, int32_t *ndim, int64_t shape[2]) const;
    void *params() const { return params_; }
    void *grads() const { return grads_; }
    bool owns_params() const { return own_params_; }
    bool owns_grads() const { return own_grads_; }
    dst_status bind_params(void *data, bool copy_current);
    dst_status bind_grads(void *data);
    dst_status zero_grads();

    // Saved-activation objects.
    Saved *default_saved() { return &default_saved_; }
    dst_status new_saved(Saved **out);
    void delete_saved(Saved *s);

    // The dataflow. Arguments were validated by the C API: x, y are [B, S, H] in the layer dtype.
    // A training forward with dropout made while the backend's stream captures a CUDA graph draws
    // from the graph dropout stream (kernels/philox.h): each replay takes a new offset word from the
    // context's counter on the device.
    // DST_ERR_STATE when such a forward would have to make that counter while the stream captures (an
    // allocation would end the capture); the C API asks before the call queues anything.
    dst_status check_capture(const char *fn) const;
    dst_status forward(Saved *saved, const void *x, int64_t B, int64_t S, const MaskArg &mask, void *y);
    dst_status backward(Saved *saved, const void *dy, void *dx, bool accumulate);
    // Packed sequences: x, y are [N, H]; cu (int32 [B+1], context memory) gives sequence b's rows
    // cu[b] .. cu[b+1]-1, each at most S long. The dataflow runs on the N rows (attention in the
    // packed layout); each row gets what the padded layer with key lengths gives it, up to the
    // rounding of GEMMs over other row counts, with the same dropout elements.
    dst_status forward_packed(Saved *saved, const void *x, int64_t N, const int32_t *cu, int64_t B, int64_t S,
                              void *y);
    dst_status backward_packed(Saved *saved, const void *dy, void *dx, bool accumulate);

private:
    Layer() = default;
    dst_status init_params();
    dst_status run_forward(Saved *saved, const void *x, int64_t B, int64_t S, const MaskArg &mask, const int32_t *cu,
                           int64_t packed_n, void *y);
    void pack(AttentionParams &ap, DropoutSite &d1, DropoutSite &d2, void *lens, void *rows, int64_t packed_n) const;
    void *param(int p) const { return static_cast<char *>(params_) + offset_[p]; }
    void *grad(int p) const { return static_cast<char *>(grads_) + offset_[p]; }
    DropoutSite site(uint64_t seed, uint64_t offset, const uint32_t *offset_hi, float ratio) const;
    AttentionParams attention_params(int64_t B, int64_t S) const;
    dst_status workspace(const Plan &p, int64_t B, int64_t S, dst_mask_kind mask, dst_dtype mask_dtype,
                         int64_t packed_tokens, char **ws);
    // z = residual + dropout(a·Wᵀ + b), y = LN(z) (W: [H, k]; t: an N×H temporary).
    dst_status branch_residual_layernorm(const void *a, int w, int b, int64_t k, const void *residual, void *t,
                                         void *z, int nw, int nb, void *y, void *mean, void *rstd, int64_t N,
                                         const DropoutSite &d);
    dst_status forward_pre_ln(const Plan &p, char *sv, char *ws, const void *x, const AttentionParams &ap,
                              const DropoutSite &d1, const DropoutSite &d2, void *y);
    dst_status forward_post_ln(const Plan &p, char *sv, char *ws, const void *x, const AttentionParams &ap,
                               const DropoutSite &d1, const DropoutSite &d2, void *y);
    dst_status backward_ffn(const Plan &p, char *sv, char *ws, int64_t N, bool acc);
    dst_status backward_attention_ln(const Plan &p, char *sv, char *ws, const void *dh2, const void *dresid,
                                     const DropoutSite &d1, int64_t N, bool acc);
    dst_status backward_attention(const Plan &p, char *sv, char *ws, const AttentionParams &ap, const void *qkv_in,
                                  bool acc);
    dst_status backward_pre_ln(const Plan &p, char *sv, char *ws, const AttentionParams &ap,
                               const DropoutSite &d1, const DropoutSite &d2, const void *dy, void *dx,
                               bool acc);
    dst_status backward_post_ln(const Plan &p, char *sv, char *ws, const AttentionParams &ap,
                                const DropoutSite &d1, const DropoutSite &d2, const void *dy, void *dx,
                                bool acc);

    std::shared_ptr<Context> ctx_;
    dst_layer_config cfg_{};
    Dims dims_;
    int id_ = 0;
    bool training_ = true;
    std::array<size_t, DST_PARAM_COUNT> offset_{};
    std::array<int64_t, DST_PARAM_COUNT> numel_{};
    size_t arena_bytes_ = 0;
    void *params_ = nullptr, *grads_ = nullptr;
    bool own_params_ = true, own_grads_ = true;
    Saved default_saved_;
    std::set<Saved *> saved_objects_;
};

// The 12 DeepSpeed parameter names, indexed by dst_param.
const char *param_name(int p);
// Looks up a name, accepting a prefix that ends in '.'; returns -1 when unknown.
int param_lookup(const char *name);

}  // namespace dst

#endif  // DST_LAYER_LAYER_H
