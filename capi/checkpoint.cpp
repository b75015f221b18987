// The extern "C" shims of the checkpoint group: argument checks, then the core (src/checkpoint).
#include "dstransformer/dstransformer.h"

#include <cstddef>
#include <cstring>
#include <vector>

#include "capi/guard.h"                // defines: guarded
#include "capi/handles.h"              // defines: dst_layer
#include "checkpoint/checkpoint.h"     // defines: checkpoint_save, checkpoint_load, checkpoint_convert
#include "checkpoint/layout.h"         // defines: is_layout
#include "checkpoint/safetensors.h"    // defines: valid_utf8
#include "core/dtype.h"                // defines: is_float_dtype
#include "core/error.h"                // defines: set_error
#include "core/versioned.h"            // defines: StructVersions, versioned_copy_in

using dst::set_error;
using dst::capi::guarded;

namespace {

// The integer value of an enum argument or field as the caller stored it. Reading the bytes, not the
// enum, keeps an out-of-range value (from C) from being undefined behaviour here.
template <class E>
int raw_value(const E &e) {
    static_assert(sizeof(E) == sizeof(int), "C enums are int-sized");
    int v;
    std::memcpy(&v, &e, sizeof v);
    return v;
}

// Every layout a caller's header may have given dst_checkpoint_options (core/versioned.h).
constexpr size_t kOptionsSizes[] = {
    DST_PREFIX_SIZE(dst_checkpoint_options, layout),        DST_PREFIX_SIZE(dst_checkpoint_options, prefix),
    DST_PREFIX_SIZE(dst_checkpoint_options, include_grads), DST_PREFIX_SIZE(dst_checkpoint_options, save_dtype),
    DST_PREFIX_SIZE(dst_checkpoint_options, restore_rng),   DST_PREFIX_SIZE(dst_checkpoint_options, client_state),
    DST_PREFIX_SIZE(dst_checkpoint_options, client_state_len),
};
static_assert(kOptionsSizes[sizeof kOptionsSizes / sizeof kOptionsSizes[0] - 1] == sizeof(dst_checkpoint_options),
              "a field was appended to dst_checkpoint_options: list it in kOptionsSizes");
constexpr dst::StructVersions kOptionsVersions = {"dst_checkpoint_options", "dst_checkpoint_options_default",
                                                  sizeof(dst_checkpoint_options), kOptionsSizes,
                                                  sizeof kOptionsSizes / sizeof kOptionsSizes[0]};

// A prefix ends up in tensor names and in the JSON header, which must be UTF-8.
dst_status prefix_check(const char *fn, const char *arg, const char *prefix) {
    size_t bad = 0;
    if (prefix && !dst::st::valid_utf8(prefix, std::strlen(prefix), &bad))
        return set_error(DST_ERR_INVALID_ARGUMENT,
                         "%s: %s is not valid UTF-8 (byte %zu is 0x%02x); tensor names are UTF-8 text", fn, arg, bad,
                         static_cast<unsigned>(static_cast<unsigned char>(prefix[bad])));
    return DST_OK;
}

void options_defaults(dst_checkpoint_options *o) {
    std::memset(o, 0, sizeof *o);
    o->struct_size = sizeof *o;
    o->layout = DST_LAYOUT_DEEPSPEED;
    o->prefix = nullptr;
    o->include_grads = 0;
    o->save_dtype = -1;
    o->restore_rng = 1;
    o->client_state = nullptr;
    o->client_state_len = 0;
}

// Copies the caller's options (NULL: the defaults) and validates them.
dst_status options_load(const char *fn, const dst_checkpoint_options *in, dst_checkpoint_options *out) {
    options_defaults(out);
    if (!in) return DST_OK;
    // A caller built against an older header has fewer fields: the rest keep their defaults.
    const dst_status vs = dst::versioned_copy_in(fn, "options", kOptionsVersions, in, out);
    if (vs != DST_OK) {
        options_defaults(out);
        return vs;
    }
    if (!dst::layout::is_layout(raw_value(out->layout))) {
        const int v = raw_value(out->layout);
        options_defaults(out);
        return set_error(DST_ERR_INVALID_ARGUMENT,
                         "%s: options->layout is %d, expected DST_LAYOUT_DEEPSPEED or DST_LAYOUT_HF_BERT", fn, v);
    }
    if (out->save_dtype != -1 &&
        (out->save_dtype < 0 || !dst::is_float_dtype(static_cast<dst_dtype>(out->save_dtype))))
        return set_error(DST_ERR_INVALID_ARGUMENT,
                         "%s: options->save_dtype is %d, expected -1 (keep each layer's dtype) or DST_DTYPE_FP32, "
                         "DST_DTYPE_FP16, DST_DTYPE_BF16 or DST_DTYPE_FP64", fn, (int)out->save_dtype);
    if (!out->client_state && out->client_state_len != 0)
        return set_error(DST_ERR_INVALID_ARGUMENT, "%s: options->client_state is NULL, but options->client_state_len is %zu",
                         fn, out->client_state_len);
    DST_TRY(prefix_check(fn, "options->prefix", out->prefix));
    out->include_grads = out->include_grads != 0;
    out->restore_rng = out->restore_rng != 0;
    return DST_OK;
}

dst_status layers_load(const char *fn, dst_layer *const *layers, int num_layers, std::vector<dst::Layer *> *out) {
    if (!layers) return set_error(DST_ERR_INVALID_ARGUMENT, "%s: layers is NULL", fn);
    if (num_layers < 1)
        return set_error(DST_ERR_INVALID_ARGUMENT, "%s: num_layers is %d, expected >= 1", fn, num_layers);
    out->resize(static_cast<size_t>(num_layers));
    for (int i = 0; i < num_layers; ++i) {
        if (!layers[i] || !layers[i]->impl)
            return set_error(DST_ERR_INVALID_ARGUMENT, "%s: layers[%d] is NULL", fn, i);
        (*out)[static_cast<size_t>(i)] = layers[i]->impl.get();
    }
    return DST_OK;
}

dst_status path_check(const char *fn, const char *arg, const char *path) {
    if (!path) return set_error(DST_ERR_INVALID_ARGUMENT, "%s: %s is NULL", fn, arg);
    if (!*path) return set_error(DST_ERR_INVALID_ARGUMENT, "%s: %s is empty", fn, arg);
    return DST_OK;
}

}  // namespace

dst_status dst_checkpoint_options_default(dst_checkpoint_options *options) {
    if (!options)
        return set_error(DST_ERR_INVALID_ARGUMENT, "dst_checkpoint_options_default: options is NULL");
    options_defaults(options);
    return DST_OK;
}

dst_status dst_checkpoint_save(dst_layer *const *layers, int num_layers, const char *path,
                               const dst_checkpoint_options *options) {
    static const char fn[] = "dst_checkpoint_save";
    return guarded(fn, [&]() -> dst_status {
        std::vector<dst::Layer *> ls;
        DST_TRY(layers_load(fn, layers, num_layers, &ls));
        DST_TRY(path_check(fn, "path", path));
        dst_checkpoint_options o;
        DST_TRY(options_load(fn, options, &o));
        return dst::checkpoint_save(fn, ls.data(), num_layers, path, o);
    });
}

dst_status dst_checkpoint_load(dst_layer *const *layers, int num_layers, const char *path,
                               const dst_checkpoint_options *options, char *client_state, size_t client_state_size,
                               size_t *client_state_len) {
    static const char fn[] = "dst_checkpoint_load";
    return guarded(fn, [&]() -> dst_status {
        std::vector<dst::Layer *> ls;
        DST_TRY(layers_load(fn, layers, num_layers, &ls));
        DST_TRY(path_check(fn, "path", path));
        dst_checkpoint_options o;
        DST_TRY(options_load(fn, options, &o));
        return dst::checkpoint_load(fn, ls.data(), num_layers, path, o, client_state, client_state_size,
                                    client_state_len);
    });
}

dst_status dst_checkpoint_convert(const char *in_path, dst_weight_layout in_layout, const char *in_prefix,
                                  const char *out_path, dst_weight_layout out_layout, const char *out_prefix,
                                  char *summary, size_t summary_size) {
    static const char fn[] = "dst_checkpoint_convert";
    return guarded(fn, [&]() -> dst_status {
        DST_TRY(path_check(fn, "in_path", in_path));
        DST_TRY(path_check(fn, "out_path", out_path));
        if (!dst::layout::is_layout(raw_value(in_layout)))
            return set_error(DST_ERR_INVALID_ARGUMENT,
                             "%s: in_layout is %d, expected DST_LAYOUT_DEEPSPEED or DST_LAYOUT_HF_BERT", fn,
                             raw_value(in_layout));
        if (!dst::layout::is_layout(raw_value(out_layout)))
            return set_error(DST_ERR_INVALID_ARGUMENT,
                             "%s: out_layout is %d, expected DST_LAYOUT_DEEPSPEED or DST_LAYOUT_HF_BERT", fn,
                             raw_value(out_layout));
        DST_TRY(prefix_check(fn, "in_prefix", in_prefix));
        DST_TRY(prefix_check(fn, "out_prefix", out_prefix));
        return dst::checkpoint_convert(fn, in_path, in_layout, in_prefix, out_path, out_layout, out_prefix, summary,
                                       summary_size);
    });
}

dst_status dst_checkpoint_describe(const char *path, char *summary, size_t summary_size, size_t *summary_len) {
    static const char fn[] = "dst_checkpoint_describe";
    return guarded(fn, [&]() -> dst_status {
        DST_TRY(path_check(fn, "path", path));
        return dst::checkpoint_describe(fn, path, summary, summary_size, summary_len);
    });
}
