// Checkpoints of layer stacks (dst_checkpoint_save/load), file-to-file layout conversion
// (dst_checkpoint_convert) and description (dst_checkpoint_describe), on top of the safetensors reader/writer and the layout name tables.
// The C API validated the arguments (non-NULL layers and path, num_layers >= 1, options complete with
// a known layout and save_dtype); `fn` prefixes every message.
#ifndef DST_CHECKPOINT_CHECKPOINT_H
#define DST_CHECKPOINT_CHECKPOINT_H

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "dstransformer/dstransformer.h"  // defines: dst_checkpoint_options, dst_weight_layout

namespace dst {

class Layer;
struct Context;

// A named tensor of dst_checkpoint_save_model/load_model (checked by the C API: a valid view of a float or
// int32 dtype, a UTF-8 name).
struct NamedTensor {
    std::string name;
    dst_tensor view;
    bool required = true;
};

// Metadata keys written by checkpoint_save (see docs/checkpoints.md).
constexpr char kCheckpointFormat[] = "dstransformer-checkpoint-1";
// The "format" of files in the Hugging Face layout: the framework name Hugging Face's loaders require.
constexpr char kHfFormat[] = "pt";

dst_status checkpoint_save(const char *fn, Layer *const *layers, int num_layers, const char *path,
                           const dst_checkpoint_options &options);

dst_status checkpoint_load(const char *fn, Layer *const *layers, int num_layers, const char *path,
                           const dst_checkpoint_options &options, char *client_state, size_t client_state_size,
                           size_t *client_state_len);

// The same for a model: the layers (of `ctx`, possibly none) and named tensors in one file. `found`
// (one entry per named tensor, or nullptr) receives whether the file held each.
dst_status checkpoint_save_model(const char *fn, Context &ctx, Layer *const *layers, int num_layers,
                                 const std::vector<NamedTensor> &tensors, const char *path,
                                 const dst_checkpoint_options &options);

dst_status checkpoint_load_model(const char *fn, Context &ctx, Layer *const *layers, int num_layers,
                                 const std::vector<NamedTensor> &tensors, int32_t *found, const char *path,
                                 const dst_checkpoint_options &options, char *client_state,
                                 size_t client_state_size, size_t *client_state_len);

dst_status checkpoint_convert(const char *fn, const char *in_path, dst_weight_layout in_layout,
                              const char *in_prefix, const char *out_path, dst_weight_layout out_layout,
                              const char *out_prefix, char *summary, size_t summary_size);

dst_status checkpoint_describe(const char *fn, const char *path, char *summary, size_t summary_size,
                               size_t *summary_len);

}  // namespace dst

#endif  // DST_CHECKPOINT_CHECKPOINT_H
