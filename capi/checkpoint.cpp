// The extern "C" shims of the checkpoint group: argument checks, then the core (src/checkpoint).
#include "dstransformer/dstransformer.h"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "capi/guard.h"                // defines: guarded
#include "capi/handles.h"              // defines: dst_layer, dst_context
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

namespace {

// The layers of a model call: NULL allowed for none; each of `ctx`.
dst_status model_layers_load(const char *fn, dst_context *ctx, dst_layer *const *layers, int num_layers,
                             std::vector<dst::Layer *> *out) {
    if (num_layers < 0)
        return set_error(DST_ERR_INVALID_ARGUMENT, "%s: num_layers is %d, expected >= 0", fn, num_layers);
    if (num_layers == 0) return DST_OK;
    DST_TRY(layers_load(fn, layers, num_layers, out));
    for (int i = 0; i < num_layers; ++i)
        if (&(*out)[static_cast<size_t>(i)]->context() != ctx->impl.get())
            return set_error(DST_ERR_INVALID_ARGUMENT, "%s: layers[%d] belongs to another context than ctx", fn, i);
    return DST_OK;
}

// The named tensors of a model call: names (UTF-8, 1..1024 bytes) and views (float or int32, 1..4 dims).
dst_status named_tensors_load(const char *fn, const dst_named_tensor *tensors, int num_tensors, int num_layers,
                              bool saving, std::vector<dst::NamedTensor> *out) {
    if (num_tensors < 0)
        return set_error(DST_ERR_INVALID_ARGUMENT, "%s: num_tensors is %d, expected >= 0", fn, num_tensors);
    if (num_tensors > 0 && !tensors) return set_error(DST_ERR_INVALID_ARGUMENT, "%s: tensors is NULL", fn);
    if (saving && num_layers + num_tensors < 1)
        return set_error(DST_ERR_INVALID_ARGUMENT, "%s: num_layers and num_tensors are 0: nothing to save", fn);
    for (int i = 0; i < num_tensors; ++i) {
        const dst_named_tensor &t = tensors[i];
        if (!t.name) return set_error(DST_ERR_INVALID_ARGUMENT, "%s: tensors[%d].name is NULL", fn, i);
        const size_t len = std::strlen(t.name);
        size_t bad = 0;
        if (len == 0 || len > 1024)
            return set_error(DST_ERR_INVALID_ARGUMENT, "%s: tensors[%d].name has %zu bytes, expected 1..1024", fn, i,
                             len);
        if (!dst::st::valid_utf8(t.name, len, &bad))
            return set_error(DST_ERR_INVALID_ARGUMENT, "%s: tensors[%d].name is not valid UTF-8 (byte %zu)", fn, i, bad);
        const dst_tensor &v = t.tensor;
        if (!v.data) return set_error(DST_ERR_INVALID_ARGUMENT, "%s: tensors[%d] (\"%s\") has NULL data", fn, i, t.name);
        if (raw_value(v.dtype) != DST_DTYPE_INT32 && !dst::is_float_dtype(static_cast<dst_dtype>(raw_value(v.dtype))))
            return set_error(DST_ERR_INVALID_ARGUMENT,
                             "%s: tensors[%d] (\"%s\") has dtype %d, expected fp32, fp16, bf16, fp64 or int32", fn, i,
                             t.name, raw_value(v.dtype));
        if (v.ndim < 1 || v.ndim > DST_MAX_DIMS)
            return set_error(DST_ERR_INVALID_ARGUMENT, "%s: tensors[%d] (\"%s\") has ndim %d, expected 1..%d", fn, i,
                             t.name, (int)v.ndim, DST_MAX_DIMS);
        for (int d = 0; d < v.ndim; ++d)
            if (v.shape[d] < 1 || v.shape[d] > (int64_t(1) << 40))
                return set_error(DST_ERR_INVALID_ARGUMENT, "%s: tensors[%d] (\"%s\") has shape[%d] = %lld, expected "
                                 "1..2^40", fn, i, t.name, d, (long long)v.shape[d]);
        dst::NamedTensor nt;
        nt.name = t.name;
        nt.view = v;
        nt.required = t.required != 0;
        out->push_back(std::move(nt));
    }
    return DST_OK;
}

// A load writes every named tensor: no two may share memory.
dst_status disjoint(const char *fn, const std::vector<dst::NamedTensor> &ts) {
    struct Range {
        uintptr_t begin, end;
        size_t index;
    };
    std::vector<Range> r;
    for (size_t i = 0; i < ts.size(); ++i) {
        size_t n = dst::dtype_size(ts[i].view.dtype);
        for (int d = 0; d < ts[i].view.ndim; ++d) n *= static_cast<size_t>(ts[i].view.shape[d]);
        const uintptr_t b = reinterpret_cast<uintptr_t>(ts[i].view.data);
        r.push_back({b, b + n, i});
    }
    std::sort(r.begin(), r.end(), [](const Range &a, const Range &b) { return a.begin < b.begin; });
    for (size_t i = 1; i < r.size(); ++i)
        if (r[i].begin < r[i - 1].end)
            return set_error(DST_ERR_INVALID_ARGUMENT, "%s: tensors[%zu] (\"%s\") and tensors[%zu] (\"%s\") overlap",
                             fn, std::min(r[i - 1].index, r[i].index), ts[std::min(r[i - 1].index, r[i].index)].name.c_str(),
                             std::max(r[i - 1].index, r[i].index), ts[std::max(r[i - 1].index, r[i].index)].name.c_str());
    return DST_OK;
}

// The checked arguments of a model save or load.
struct ModelArgs {
    std::vector<dst::Layer *> layers;
    std::vector<dst::NamedTensor> tensors;
    dst_checkpoint_options options;
};

dst_status model_args(const char *fn, dst_context *ctx, dst_layer *const *layers, int num_layers,
                      const dst_named_tensor *tensors, int num_tensors, const char *path,
                      const dst_checkpoint_options *options, bool saving, ModelArgs *out) {
    if (!ctx) return set_error(DST_ERR_INVALID_ARGUMENT, "%s: ctx is NULL", fn);
    DST_TRY(model_layers_load(fn, ctx, layers, num_layers, &out->layers));
    DST_TRY(named_tensors_load(fn, tensors, num_tensors, num_layers, saving, &out->tensors));
    DST_TRY(path_check(fn, "path", path));
    return options_load(fn, options, &out->options);
}

}  // namespace

dst_status dst_checkpoint_save_model(dst_context *ctx, dst_layer *const *layers, int num_layers,
                                     const dst_named_tensor *tensors, int num_tensors, const char *path,
                                     const dst_checkpoint_options *options) {
    static const char fn[] = "dst_checkpoint_save_model";
    return guarded(fn, [&]() -> dst_status {
        ModelArgs a;
        DST_TRY(model_args(fn, ctx, layers, num_layers, tensors, num_tensors, path, options, true, &a));
        return dst::checkpoint_save_model(fn, *ctx->impl, a.layers.data(), num_layers, a.tensors, path, a.options);
    });
}

dst_status dst_checkpoint_load_model(dst_context *ctx, dst_layer *const *layers, int num_layers,
                                     const dst_named_tensor *tensors, int num_tensors, int32_t *found,
                                     const char *path, const dst_checkpoint_options *options, char *client_state,
                                     size_t client_state_size, size_t *client_state_len) {
    static const char fn[] = "dst_checkpoint_load_model";
    return guarded(fn, [&]() -> dst_status {
        ModelArgs a;
        DST_TRY(model_args(fn, ctx, layers, num_layers, tensors, num_tensors, path, options, false, &a));
        DST_TRY(disjoint(fn, a.tensors));
        return dst::checkpoint_load_model(fn, *ctx->impl, a.layers.data(), num_layers, a.tensors, found, path,
                                          a.options, client_state, client_state_size, client_state_len);
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
