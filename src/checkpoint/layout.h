// Tensor names of the two weight layouts of a checkpoint, and how a parameter splits into tensors.
//
// DeepSpeed (native): one tensor per parameter, "<prefix>layer.<i>.<name>" with <name> one of
// attn_qkvw … norm_b (dst_param order).
// Hugging Face BertLayer (Post-LN only):
//   attn_qkvw → attention.self.{query,key,value}.weight   (rows [Q; K; V] of attn_qkvw, each [H, H])
//   attn_qkvb → attention.self.{query,key,value}.bias     (each [H])
//   attn_ow/ob → attention.output.dense.{weight,bias}
//   attn_nw/nb → attention.output.LayerNorm.{weight,bias}
//   inter_w/b  → intermediate.dense.{weight,bias}
//   output_w/b → output.dense.{weight,bias}
//   norm_w/b   → output.LayerNorm.{weight,bias}
// Gradients use the same names behind "grad.". Splitting [3H, H] by rows is three contiguous byte
// ranges of the row-major tensor, so conversions copy bytes and round-trip bit-exactly.
#ifndef DST_CHECKPOINT_LAYOUT_H
#define DST_CHECKPOINT_LAYOUT_H

#include <string>
#include <vector>

#include "dstransformer/dstransformer.h"  // defines: dst_weight_layout, dst_param

namespace dst::layout {

// "deepspeed" or "hf_bert" (the value of the "layout" metadata key); "unknown" otherwise.
const char *layout_name(dst_weight_layout layout);
bool is_layout(int value);

// Number of tensors parameter `p` is stored as: 3 for attn_qkvw/attn_qkvb in the HF layout, else 1.
int parts(dst_weight_layout layout, int p);
// Name of part `k` of parameter `p` after "layer.<i>.".
const char *suffix(dst_weight_layout layout, int p, int k);
// Full tensor name: "[grad.]<prefix>layer.<i>.<suffix>".
std::string tensor_name(dst_weight_layout layout, const std::string &prefix, int layer, int p, int k, bool grad);

// A tensor name decoded against a layout and prefix.
struct NameRef {
    bool grad = false;
    int layer = 0;
    int param = 0;
    int part = 0;
};
// Decodes "[grad.]<prefix>layer.<i>.<suffix>"; false when the name is not of that form (the layer index
// is a decimal number without leading zeros, below 10^6).
bool parse_name(dst_weight_layout layout, const std::string &prefix, const std::string &name, NameRef *out);

// Decodes "[grad.]<prefix>layer.<i>.<suffix>" under either layout, with whatever prefix the name has
// (empty or ending in '.'): the suffix, the index and "layer." are read from the end of the name, in time
// linear in its length. False when the name is no layer tensor of either layout.
bool parse_name_any_prefix(const std::string &name, std::string *prefix, dst_weight_layout *layout, NameRef *out);

// The first of `candidates` under which at least one of `names` decodes; nullptr when none does.
const std::string *detect_prefix(dst_weight_layout layout, const std::vector<std::string> &candidates,
                                 const std::vector<std::string> &names);

}  // namespace dst::layout

#endif  // DST_CHECKPOINT_LAYOUT_H
