// The extern "C" shims of the training-engine group: argument checks, then the core (src/train).
#include "dstransformer/dstransformer.h"

#include <algorithm>
#include <cstring>
#include <string>

#include "capi/guard.h"             // defines: guarded, DST_REQUIRE
#include "capi/handles.h"           // defines: dst_context, dst_engine, dst_optimizer
#include "core/dtype.h"             // defines: is_float_dtype, dtype_size
#include "core/error.h"             // defines: set_error, last_error
#include "core/text.h"              // defines: copy_text
#include "core/versioned.h"         // defines: StructVersions, versioned_copy_in, versioned_check
#include "train/checkpoint_dir.h"   // defines: read_latest
#include "train/config.h"           // defines: parse_engine_config
#include "train/engine.h"           // defines: Engine

using dst::copy_text;
using dst::set_error;
using dst::capi::guarded;

namespace {

constexpr size_t kStateSizes[] = {
    DST_PREFIX_SIZE(dst_engine_state, train_batch_size),
    DST_PREFIX_SIZE(dst_engine_state, train_micro_batch_size_per_gpu),
    DST_PREFIX_SIZE(dst_engine_state, gradient_accumulation_steps),
    DST_PREFIX_SIZE(dst_engine_state, world_size),
    DST_PREFIX_SIZE(dst_engine_state, optimizer),
    DST_PREFIX_SIZE(dst_engine_state, fp16_enabled),
    DST_PREFIX_SIZE(dst_engine_state, bf16_enabled),
    DST_PREFIX_SIZE(dst_engine_state, dynamic_loss_scale),
    DST_PREFIX_SIZE(dst_engine_state, steps_per_print),
    DST_PREFIX_SIZE(dst_engine_state, gradient_clipping),
    DST_PREFIX_SIZE(dst_engine_state, micro_steps),
    DST_PREFIX_SIZE(dst_engine_state, global_steps),
    DST_PREFIX_SIZE(dst_engine_state, global_samples),
    DST_PREFIX_SIZE(dst_engine_state, skipped_steps),
    DST_PREFIX_SIZE(dst_engine_state, loss_scale),
    DST_PREFIX_SIZE(dst_engine_state, grad_norm),
    DST_PREFIX_SIZE(dst_engine_state, last_step_applied),
    DST_PREFIX_SIZE(dst_engine_state, last_overflow),
};
static_assert(kStateSizes[sizeof kStateSizes / sizeof kStateSizes[0] - 1] == sizeof(dst_engine_state),
              "a field was appended to dst_engine_state: list it in kStateSizes");
constexpr dst::StructVersions kStateVersions = {"dst_engine_state", "sizeof(dst_engine_state)", sizeof(dst_engine_state),
                                                kStateSizes, sizeof kStateSizes / sizeof kStateSizes[0]};

constexpr size_t kLoadSizes[] = {
    DST_PREFIX_SIZE(dst_engine_load_options, load_optimizer_states),
    DST_PREFIX_SIZE(dst_engine_load_options, load_lr_scheduler_states),
    DST_PREFIX_SIZE(dst_engine_load_options, load_module_only),
    DST_PREFIX_SIZE(dst_engine_load_options, strict),
    DST_PREFIX_SIZE(dst_engine_load_options, restore_rng),
};
static_assert(kLoadSizes[sizeof kLoadSizes / sizeof kLoadSizes[0] - 1] == sizeof(dst_engine_load_options),
              "a field was appended to dst_engine_load_options: list it in kLoadSizes");
constexpr dst::StructVersions kLoadVersions = {"dst_engine_load_options", "dst_engine_load_options_default",
                                               sizeof(dst_engine_load_options), kLoadSizes,
                                               sizeof kLoadSizes / sizeof kLoadSizes[0]};

void load_defaults(dst_engine_load_options *o) {
    std::memset(o, 0, sizeof *o);
    o->struct_size = sizeof *o;
    o->load_optimizer_states = 1;
    o->load_lr_scheduler_states = 1;
    o->load_module_only = 0;
    o->strict = 1;
    o->restore_rng = 1;
}

dst_status path_arg(const char *fn, const char *arg, const char *p) {
    if (!p) return set_error(DST_ERR_INVALID_ARGUMENT, "%s: %s is NULL", fn, arg);
    if (!*p) return set_error(DST_ERR_INVALID_ARGUMENT, "%s: %s is empty", fn, arg);
    return DST_OK;
}

}  // namespace

extern "C" {

dst_status dst_engine_config_validate(const char *config_json, int world_size, char *reason, size_t reason_size) {
    static const char fn[] = "dst_engine_config_validate";
    const dst_status s = guarded(fn, [&]() -> dst_status {
        dst::EngineConfig c;
        return dst::parse_engine_config(fn, config_json, world_size, &c);
    });
    copy_text(s == DST_OK ? std::string() : std::string(dst::last_error()), reason, reason_size, nullptr);
    return s;
}

dst_status dst_engine_create(dst_context *ctx, const char *config_json, int world_size, dst_engine **out) {
    static const char fn[] = "dst_engine_create";
    return guarded(fn, [&]() -> dst_status {
        DST_REQUIRE(fn, ctx);
        DST_REQUIRE(fn, out);
        dst::Engine *e = nullptr;
        DST_TRY(dst::Engine::create(fn, ctx->impl, config_json, world_size, &e));
        dst_engine *h = new dst_engine;
        h->impl.reset(e);
        h->optimizer.impl = e->optimizer_ptr();
        h->optimizer.engine_owned = true;
        *out = h;
        return DST_OK;
    });
}

void dst_engine_destroy(dst_engine *engine) { delete engine; }

dst_status dst_engine_get_optimizer(dst_engine *engine, dst_optimizer **opt) {
    static const char fn[] = "dst_engine_get_optimizer";
    DST_REQUIRE(fn, engine);
    DST_REQUIRE(fn, opt);
    *opt = &engine->optimizer;
    return DST_OK;
}

dst_status dst_engine_add_model_tensor(dst_engine *engine, const char *name, const dst_tensor *tensor) {
    static const char fn[] = "dst_engine_add_model_tensor";
    return guarded(fn, [&]() -> dst_status {
        DST_REQUIRE(fn, engine);
        DST_REQUIRE(fn, name);
        DST_REQUIRE(fn, tensor);
        return engine->impl->add_model_tensor(fn, name, *tensor);
    });
}

dst_status dst_engine_scale_loss_gradient(dst_engine *engine, const dst_tensor *grad) {
    static const char fn[] = "dst_engine_scale_loss_gradient";
    return guarded(fn, [&]() -> dst_status {
        DST_REQUIRE(fn, engine);
        DST_REQUIRE(fn, grad);
        if (!grad->data) return set_error(DST_ERR_INVALID_ARGUMENT, "%s: grad->data is NULL", fn);
        int dt;
        std::memcpy(&dt, &grad->dtype, sizeof dt);
        if (!dst::is_float_dtype(static_cast<dst_dtype>(dt)))
            return set_error(DST_ERR_INVALID_ARGUMENT, "%s: grad->dtype is %d, expected fp32, fp16, bf16 or fp64", fn, dt);
        if (grad->ndim < 1 || grad->ndim > DST_MAX_DIMS)
            return set_error(DST_ERR_INVALID_ARGUMENT, "%s: grad->ndim is %d, expected 1..%d", fn, (int)grad->ndim,
                             DST_MAX_DIMS);
        for (int i = 0; i < grad->ndim; ++i)
            if (grad->shape[i] < 0 || grad->shape[i] > (int64_t(1) << 40))
                return set_error(DST_ERR_INVALID_ARGUMENT, "%s: grad->shape[%d] is %lld, expected 0..2^40", fn, i,
                                 (long long)grad->shape[i]);
        return engine->impl->scale_loss_gradient(*grad);
    });
}

dst_status dst_engine_loss_scale_pointer(const dst_engine *engine, const float **scale) {
    static const char fn[] = "dst_engine_loss_scale_pointer";
    DST_REQUIRE(fn, engine);
    DST_REQUIRE(fn, scale);
    *scale = engine->impl->loss_scale_pointer();
    return DST_OK;
}

dst_status dst_engine_is_boundary(const dst_engine *engine, int *boundary) {
    static const char fn[] = "dst_engine_is_boundary";
    DST_REQUIRE(fn, engine);
    DST_REQUIRE(fn, boundary);
    *boundary = engine->impl->next_is_boundary() ? 1 : 0;
    return DST_OK;
}

dst_status dst_engine_step(dst_engine *engine) {
    static const char fn[] = "dst_engine_step";
    DST_REQUIRE(fn, engine);
    return guarded(fn, [&] { return engine->impl->step(); });
}

dst_status dst_engine_zero_grads(dst_engine *engine) {
    static const char fn[] = "dst_engine_zero_grads";
    DST_REQUIRE(fn, engine);
    return guarded(fn, [&] { return engine->impl->zero_grads(); });
}

dst_status dst_engine_set_zero_grads_on_step(dst_engine *engine, int enabled) {
    static const char fn[] = "dst_engine_set_zero_grads_on_step";
    DST_REQUIRE(fn, engine);
    if (enabled != 0 && enabled != 1)
        return set_error(DST_ERR_INVALID_ARGUMENT, "%s: enabled is %d, expected 0 or 1", fn, enabled);
    engine->impl->set_zero_grads_on_step(enabled == 1);
    return DST_OK;
}

dst_status dst_engine_get_zero_grads_on_step(const dst_engine *engine, int *enabled) {
    static const char fn[] = "dst_engine_get_zero_grads_on_step";
    DST_REQUIRE(fn, engine);
    DST_REQUIRE(fn, enabled);
    *enabled = engine->impl->zero_grads_on_step() ? 1 : 0;
    return DST_OK;
}

dst_status dst_engine_get_state(const dst_engine *engine, dst_engine_state *state) {
    static const char fn[] = "dst_engine_get_state";
    return guarded(fn, [&]() -> dst_status {
        DST_REQUIRE(fn, engine);
        DST_REQUIRE(fn, state);
        size_t size = 0;
        std::memcpy(&size, state, sizeof size);
        DST_TRY(dst::versioned_check(fn, "state", kStateVersions, size));
        dst_engine_state r;
        DST_TRY(engine->impl->get_state(&r));
        r.struct_size = size;
        std::memcpy(state, &r, size);
        return DST_OK;
    });
}

dst_status dst_engine_get_lr(const dst_engine *engine, int group, float *lr) {
    static const char fn[] = "dst_engine_get_lr";
    return guarded(fn, [&]() -> dst_status {
        DST_REQUIRE(fn, engine);
        DST_REQUIRE(fn, lr);
        const int n = engine->impl->optimizer().num_groups();
        if (group < 0 || group >= n)
            return set_error(DST_ERR_INVALID_ARGUMENT, "%s: group is %d, expected 0..%d", fn, group, n - 1);
        return engine->impl->get_lr(group, lr);
    });
}

dst_status dst_engine_save_checkpoint(dst_engine *engine, const char *save_dir, const char *tag,
                                      const char *client_state_json, int save_latest) {
    static const char fn[] = "dst_engine_save_checkpoint";
    return guarded(fn, [&]() -> dst_status {
        DST_REQUIRE(fn, engine);
        DST_TRY(path_arg(fn, "save_dir", save_dir));
        return engine->impl->save_checkpoint(fn, save_dir, tag, client_state_json, save_latest != 0);
    });
}

dst_status dst_engine_load_options_default(dst_engine_load_options *options) {
    DST_REQUIRE("dst_engine_load_options_default", options);
    load_defaults(options);
    return DST_OK;
}

dst_status dst_engine_load_checkpoint(dst_engine *engine, const char *load_dir, const char *tag,
                                      const dst_engine_load_options *options, char *client_state,
                                      size_t client_state_size, size_t *client_state_len) {
    static const char fn[] = "dst_engine_load_checkpoint";
    return guarded(fn, [&]() -> dst_status {
        DST_REQUIRE(fn, engine);
        DST_TRY(path_arg(fn, "load_dir", load_dir));
        dst_engine_load_options o;
        load_defaults(&o);
        if (options) DST_TRY(dst::versioned_copy_in(fn, "options", kLoadVersions, options, &o));
        std::string client;
        DST_TRY(engine->impl->load_checkpoint(fn, load_dir, tag, o, &client));
        copy_text(client, client_state, client_state_size, client_state_len);
        return DST_OK;
    });
}

dst_status dst_checkpoint_latest_tag(const char *dir, char *tag, size_t tag_size, size_t *tag_len) {
    static const char fn[] = "dst_checkpoint_latest_tag";
    return guarded(fn, [&]() -> dst_status {
        DST_TRY(path_arg(fn, "dir", dir));
        std::string t;
        DST_TRY(dst::ckdir::read_latest(fn, dir, &t));
        copy_text(t, tag, tag_size, tag_len);
        return DST_OK;
    });
}

}  // extern "C"
