// The extern "C" shims of the optimizer group: argument checks, then the core (src/optim).
#include "dstransformer/dstransformer.h"

#include <cmath>
#include <cstring>
#include <string>

#include "capi/guard.h"         // defines: guarded, DST_REQUIRE
#include "capi/handles.h"       // defines: dst_context, dst_layer, dst_optimizer
#include "core/error.h"         // defines: set_error
#include "core/versioned.h"     // defines: StructVersions, versioned_copy_in, versioned_check
#include "optim/optimizer.h"    // defines: Optimizer, optimizer_config_defaults, kOptimizerConfigVersions

using dst::set_error;
using dst::capi::guarded;

namespace {

constexpr size_t kInfoSizes[] = {
    DST_PREFIX_SIZE(dst_optimizer_tensor_info, name),  DST_PREFIX_SIZE(dst_optimizer_tensor_info, group),
    DST_PREFIX_SIZE(dst_optimizer_tensor_info, dtype), DST_PREFIX_SIZE(dst_optimizer_tensor_info, grad_dtype),
    DST_PREFIX_SIZE(dst_optimizer_tensor_info, ndim),  DST_PREFIX_SIZE(dst_optimizer_tensor_info, shape),
    DST_PREFIX_SIZE(dst_optimizer_tensor_info, numel), DST_PREFIX_SIZE(dst_optimizer_tensor_info, step),
    DST_PREFIX_SIZE(dst_optimizer_tensor_info, lamb_coeff),
};
static_assert(kInfoSizes[sizeof kInfoSizes / sizeof kInfoSizes[0] - 1] == sizeof(dst_optimizer_tensor_info),
              "a field was appended to dst_optimizer_tensor_info: list it in kInfoSizes");
constexpr dst::StructVersions kInfoVersions = {"dst_optimizer_tensor_info", "sizeof(dst_optimizer_tensor_info)",
                                               sizeof(dst_optimizer_tensor_info), kInfoSizes,
                                               sizeof kInfoSizes / sizeof kInfoSizes[0]};

dst_status check_index(const char *fn, const dst_optimizer *opt, int index) {
    const size_t n = opt->impl->num_tensors();
    if (index < 0 || static_cast<size_t>(index) >= n)
        return set_error(DST_ERR_INVALID_ARGUMENT, "%s: index is %d, expected 0..%lld (the registered tensors)", fn, index,
                         (long long)n - 1);
    return DST_OK;
}

dst_status check_group_index(const char *fn, const dst_optimizer *opt, int index) {
    if (index < 0 || index >= opt->impl->num_groups())
        return set_error(DST_ERR_INVALID_ARGUMENT, "%s: index is %d, expected 0..%d (the groups)", fn, index,
                         opt->impl->num_groups() - 1);
    return DST_OK;
}

// Copies the caller's group (an older header's smaller struct: the missing fields from `base`).
dst_status group_in(const char *fn, const dst_param_group *in, const dst_param_group &base, dst_param_group *out) {
    *out = base;
    return dst::versioned_copy_in(fn, "group", dst::kParamGroupVersions, in, out);
}

}  // namespace

extern "C" {

dst_status dst_optimizer_config_default(dst_optimizer_config *config) {
    DST_REQUIRE("dst_optimizer_config_default", config);
    dst::optimizer_config_defaults(config);
    return DST_OK;
}

dst_status dst_param_group_default(dst_param_group *group) {
    DST_REQUIRE("dst_param_group_default", group);
    dst::param_group_defaults(group);
    return DST_OK;
}

dst_status dst_optimizer_create(dst_context *ctx, const dst_optimizer_config *config, dst_optimizer **out) {
    static const char fn[] = "dst_optimizer_create";
    return guarded(fn, [&]() -> dst_status {
        DST_REQUIRE(fn, ctx);
        DST_REQUIRE(fn, out);
        dst_optimizer_config c;
        dst::optimizer_config_defaults(&c);
        if (config) DST_TRY(dst::versioned_copy_in(fn, "config", dst::kOptimizerConfigVersions, config, &c));
        dst::Optimizer *o = nullptr;
        DST_TRY(dst::Optimizer::create(fn, ctx->impl, c, &o));
        dst_optimizer *h = new dst_optimizer;
        h->impl.reset(o);
        *out = h;
        return DST_OK;
    });
}

void dst_optimizer_destroy(dst_optimizer *opt) {
    if (opt && !opt->engine_owned) delete opt;
}

dst_status dst_optimizer_add_group(dst_optimizer *opt, const dst_param_group *group, int *index) {
    static const char fn[] = "dst_optimizer_add_group";
    return guarded(fn, [&]() -> dst_status {
        DST_REQUIRE(fn, opt);
        dst_param_group g = opt->impl->group(0);
        if (group) DST_TRY(group_in(fn, group, opt->impl->group(0), &g));
        return opt->impl->add_group(fn, g, index);
    });
}

dst_status dst_optimizer_num_groups(const dst_optimizer *opt, int *count) {
    static const char fn[] = "dst_optimizer_num_groups";
    DST_REQUIRE(fn, opt);
    DST_REQUIRE(fn, count);
    *count = opt->impl->num_groups();
    return DST_OK;
}

dst_status dst_optimizer_get_group(const dst_optimizer *opt, int index, dst_param_group *group) {
    static const char fn[] = "dst_optimizer_get_group";
    DST_REQUIRE(fn, opt);
    DST_REQUIRE(fn, group);
    DST_TRY(check_group_index(fn, opt, index));
    size_t size = 0;
    std::memcpy(&size, group, sizeof size);
    DST_TRY(dst::versioned_check(fn, "group", dst::kParamGroupVersions, size));
    dst_param_group g = opt->impl->group(index);
    g.struct_size = size;
    std::memcpy(group, &g, size);
    return DST_OK;
}

dst_status dst_optimizer_set_group(dst_optimizer *opt, int index, const dst_param_group *group) {
    static const char fn[] = "dst_optimizer_set_group";
    return guarded(fn, [&]() -> dst_status {
        DST_REQUIRE(fn, opt);
        DST_REQUIRE(fn, group);
        DST_TRY(check_group_index(fn, opt, index));
        dst_param_group g;
        DST_TRY(group_in(fn, group, opt->impl->group(index), &g));
        return opt->impl->set_group(fn, index, g);
    });
}

dst_status dst_optimizer_add_tensor(dst_optimizer *opt, int group, const char *name, const dst_tensor *param,
                                    const dst_tensor *grad) {
    static const char fn[] = "dst_optimizer_add_tensor";
    return guarded(fn, [&]() -> dst_status {
        DST_REQUIRE(fn, opt);
        DST_REQUIRE(fn, name);
        DST_REQUIRE(fn, param);
        DST_REQUIRE(fn, grad);
        return opt->impl->add_tensor(fn, group, name, *param, *grad);
    });
}

dst_status dst_optimizer_add_layer(dst_optimizer *opt, dst_layer *layer, const char *prefix, int decay_group,
                                   int no_decay_group) {
    static const char fn[] = "dst_optimizer_add_layer";
    return guarded(fn, [&]() -> dst_status {
        DST_REQUIRE(fn, opt);
        DST_REQUIRE(fn, layer);
        return opt->impl->add_layer(fn, layer->impl.get(), prefix, decay_group, no_decay_group);
    });
}

dst_status dst_optimizer_num_tensors(const dst_optimizer *opt, int *count) {
    static const char fn[] = "dst_optimizer_num_tensors";
    DST_REQUIRE(fn, opt);
    DST_REQUIRE(fn, count);
    *count = static_cast<int>(opt->impl->num_tensors());
    return DST_OK;
}

dst_status dst_optimizer_find_tensor(const dst_optimizer *opt, const char *name, int *index) {
    static const char fn[] = "dst_optimizer_find_tensor";
    return guarded(fn, [&]() -> dst_status {
        DST_REQUIRE(fn, opt);
        DST_REQUIRE(fn, name);
        DST_REQUIRE(fn, index);
        const int i = opt->impl->find(name);
        if (i < 0) return set_error(DST_ERR_INVALID_ARGUMENT, "%s: no tensor is registered as \"%s\"", fn, name);
        *index = i;
        return DST_OK;
    });
}

dst_status dst_optimizer_get_tensor_info(const dst_optimizer *opt, int index, dst_optimizer_tensor_info *info) {
    static const char fn[] = "dst_optimizer_get_tensor_info";
    return guarded(fn, [&]() -> dst_status {
        DST_REQUIRE(fn, opt);
        DST_REQUIRE(fn, info);
        DST_TRY(check_index(fn, opt, index));
        size_t size = 0;
        std::memcpy(&size, info, sizeof size);
        DST_TRY(dst::versioned_check(fn, "info", kInfoVersions, size));
        const dst::OptTensor &t = opt->impl->tensor(static_cast<size_t>(index));
        dst_optimizer_tensor_info r;
        std::memset(&r, 0, sizeof r);
        r.struct_size = size;
        r.name = t.name.c_str();
        r.group = t.group;
        r.dtype = t.dtype;
        r.grad_dtype = t.grad_dtype;
        r.ndim = t.ndim;
        for (int i = 0; i < t.ndim; ++i) r.shape[i] = t.shape[i];
        r.numel = t.numel;
        DST_TRY(opt->impl->read_tensor_counters(static_cast<size_t>(index), &r.step, &r.lamb_coeff));
        std::memcpy(info, &r, size);
        return DST_OK;
    });
}

dst_status dst_optimizer_get_state(dst_optimizer *opt, int index, dst_optimizer_state which, dst_tensor *view) {
    static const char fn[] = "dst_optimizer_get_state";
    DST_REQUIRE(fn, opt);
    DST_REQUIRE(fn, view);
    DST_TRY(check_index(fn, opt, index));
    int w;
    std::memcpy(&w, &which, sizeof w);
    const dst::OptTensor &t = opt->impl->tensor(static_cast<size_t>(index));
    float *p = nullptr;
    switch (w) {
    case DST_OPTIMIZER_STATE_EXP_AVG: p = t.exp_avg(); break;
    case DST_OPTIMIZER_STATE_EXP_AVG_SQ: p = t.exp_avg_sq(); break;
    case DST_OPTIMIZER_STATE_MASTER:
        if (!t.has_master())
            return set_error(DST_ERR_INVALID_ARGUMENT,
                             "%s: tensor \"%s\" is fp32 and is its own master: it has no DST_OPTIMIZER_STATE_MASTER", fn,
                             t.name.c_str());
        p = t.master();
        break;
    default:
        return set_error(DST_ERR_INVALID_ARGUMENT, "%s: which is %d, expected DST_OPTIMIZER_STATE_EXP_AVG, "
                         "DST_OPTIMIZER_STATE_EXP_AVG_SQ or DST_OPTIMIZER_STATE_MASTER", fn, w);
    }
    dst_tensor v;
    std::memset(&v, 0, sizeof v);
    v.data = p;
    v.dtype = DST_DTYPE_FP32;
    v.ndim = t.ndim;
    for (int i = 0; i < t.ndim; ++i) v.shape[i] = t.shape[i];
    *view = v;
    return DST_OK;
}

dst_status dst_optimizer_set_step(dst_optimizer *opt, int index, int64_t step) {
    static const char fn[] = "dst_optimizer_set_step";
    return guarded(fn, [&]() -> dst_status {
        DST_REQUIRE(fn, opt);
        DST_TRY(check_index(fn, opt, index));
        if (step < 0) return set_error(DST_ERR_INVALID_ARGUMENT, "%s: step is %lld, expected >= 0", fn, (long long)step);
        return opt->impl->set_step(index, step);
    });
}

dst_status dst_optimizer_refresh_masters(dst_optimizer *opt) {
    static const char fn[] = "dst_optimizer_refresh_masters";
    DST_REQUIRE(fn, opt);
    return guarded(fn, [&] { return opt->impl->refresh_masters(); });
}

dst_status dst_optimizer_step(dst_optimizer *opt, float grad_scale, float max_grad_norm) {
    static const char fn[] = "dst_optimizer_step";
    return guarded(fn, [&]() -> dst_status {
        DST_REQUIRE(fn, opt);
        if (opt->impl->engine_owned())
            return set_error(DST_ERR_STATE, "%s: this optimizer belongs to an engine, which steps it: call "
                             "dst_engine_step", fn);
        if (!(std::isfinite(grad_scale) && grad_scale > 0.0f))
            return set_error(DST_ERR_INVALID_ARGUMENT, "%s: grad_scale is %g, expected a finite value > 0", fn,
                             (double)grad_scale);
        if (!(std::isfinite(max_grad_norm) && max_grad_norm >= 0.0f))
            return set_error(DST_ERR_INVALID_ARGUMENT, "%s: max_grad_norm is %g, expected a finite value >= 0 (0: no "
                             "clipping)", fn, (double)max_grad_norm);
        dst::optim::StepArgs a;
        a.grad_scale = grad_scale;
        a.clip = max_grad_norm;
        a.compute_norm = max_grad_norm > 0.0f;
        return opt->impl->step(a);
    });
}

dst_status dst_optimizer_get_grad_norm(const dst_optimizer *opt, float *norm) {
    static const char fn[] = "dst_optimizer_get_grad_norm";
    return guarded(fn, [&]() -> dst_status {
        DST_REQUIRE(fn, opt);
        DST_REQUIRE(fn, norm);
        dst::optim::TrainState s;
        DST_TRY(opt->impl->read_state(&s));
        *norm = s.norm_computed ? s.grad_norm : 0.0f;
        return DST_OK;
    });
}

dst_status dst_optimizer_save(const dst_optimizer *opt, const char *path) {
    static const char fn[] = "dst_optimizer_save";
    return guarded(fn, [&]() -> dst_status {
        DST_REQUIRE(fn, opt);
        DST_REQUIRE(fn, path);
        if (!*path) return set_error(DST_ERR_INVALID_ARGUMENT, "%s: path is empty", fn);
        return opt->impl->save_file(fn, path, {});
    });
}

dst_status dst_optimizer_load(dst_optimizer *opt, const char *path) {
    static const char fn[] = "dst_optimizer_load";
    return guarded(fn, [&]() -> dst_status {
        DST_REQUIRE(fn, opt);
        DST_REQUIRE(fn, path);
        if (!*path) return set_error(DST_ERR_INVALID_ARGUMENT, "%s: path is empty", fn);
        dst::OptimizerSnapshot s;
        DST_TRY(dst::Optimizer::read_file(fn, path, &s, nullptr));
        DST_TRY(opt->impl->check_snapshot(fn, std::string("'") + path + "'", s));
        return opt->impl->restore(s, true);
    });
}

}  // extern "C"
