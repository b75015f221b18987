#include "optim/optimizer.h"

#include <cmath>
#include <cstring>
#include <string>
#include <utility>

#include "checkpoint/safetensors.h"  // defines: st::valid_utf8
#include "core/dtype.h"              // defines: dtype_size
#include "core/error.h"              // defines: set_error, DST_TRY
#include "layer/layer.h"             // defines: Layer, param_name

namespace dst {

namespace {

constexpr size_t kMaxNameBytes = 1024;
constexpr int64_t kMaxNumel = int64_t(1) << 40;

bool finite_nonneg(float v) { return std::isfinite(v) && v >= 0.0f; }
bool beta_ok(float v) { return std::isfinite(v) && v >= 0.0f && v < 1.0f; }

constexpr size_t kConfigSizes[] = {
    DST_PREFIX_SIZE(dst_optimizer_config, kind),         DST_PREFIX_SIZE(dst_optimizer_config, lr),
    DST_PREFIX_SIZE(dst_optimizer_config, beta1),        DST_PREFIX_SIZE(dst_optimizer_config, beta2),
    DST_PREFIX_SIZE(dst_optimizer_config, eps),          DST_PREFIX_SIZE(dst_optimizer_config, weight_decay),
    DST_PREFIX_SIZE(dst_optimizer_config, bias_correction), DST_PREFIX_SIZE(dst_optimizer_config, adam_w_mode),
    DST_PREFIX_SIZE(dst_optimizer_config, max_coeff),    DST_PREFIX_SIZE(dst_optimizer_config, min_coeff),
    DST_PREFIX_SIZE(dst_optimizer_config, eps_inside_sqrt),
};
static_assert(kConfigSizes[sizeof kConfigSizes / sizeof kConfigSizes[0] - 1] == sizeof(dst_optimizer_config),
              "a field was appended to dst_optimizer_config: list it in kConfigSizes");
constexpr size_t kGroupSizes[] = {
    DST_PREFIX_SIZE(dst_param_group, lr),  DST_PREFIX_SIZE(dst_param_group, beta1),
    DST_PREFIX_SIZE(dst_param_group, beta2), DST_PREFIX_SIZE(dst_param_group, eps),
    DST_PREFIX_SIZE(dst_param_group, weight_decay),
};
static_assert(kGroupSizes[sizeof kGroupSizes / sizeof kGroupSizes[0] - 1] == sizeof(dst_param_group),
              "a field was appended to dst_param_group: list it in kGroupSizes");

const char *dt_name(dst_dtype dt) { return dst_dtype_string(dt); }

std::string shape_text(int32_t ndim, const int64_t *shape) {
    std::string s = "[";
    for (int32_t i = 0; i < ndim; ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
    return s + "]";
}

}  // namespace

const StructVersions kOptimizerConfigVersions = {"dst_optimizer_config", "dst_optimizer_config_default",
                                                 sizeof(dst_optimizer_config), kConfigSizes,
                                                 sizeof kConfigSizes / sizeof kConfigSizes[0]};
const StructVersions kParamGroupVersions = {"dst_param_group", "dst_param_group_default", sizeof(dst_param_group),
                                            kGroupSizes, sizeof kGroupSizes / sizeof kGroupSizes[0]};

void optimizer_config_defaults(dst_optimizer_config *c) {
    std::memset(c, 0, sizeof *c);
    c->struct_size = sizeof *c;
    c->kind = DST_OPTIMIZER_ADAM;
    c->lr = 1e-3f;
    c->beta1 = 0.9f;
    c->beta2 = 0.999f;
    c->eps = 1e-8f;
    c->weight_decay = 0.0f;
    c->bias_correction = 1;
    c->adam_w_mode = 1;
    c->max_coeff = 10.0f;
    c->min_coeff = 0.01f;
    c->eps_inside_sqrt = 0;
}

void param_group_defaults(dst_param_group *g) {
    dst_optimizer_config c;
    optimizer_config_defaults(&c);
    *g = group_of_config(c);
}

dst_param_group group_of_config(const dst_optimizer_config &c) {
    dst_param_group g;
    std::memset(&g, 0, sizeof g);
    g.struct_size = sizeof g;
    g.lr = c.lr;
    g.beta1 = c.beta1;
    g.beta2 = c.beta2;
    g.eps = c.eps;
    g.weight_decay = c.weight_decay;
    return g;
}

dst_status optimizer_config_check(const char *fn, const dst_optimizer_config &c) {
    int kind;
    std::memcpy(&kind, &c.kind, sizeof kind);
    if (kind != DST_OPTIMIZER_ADAM && kind != DST_OPTIMIZER_ADAMW && kind != DST_OPTIMIZER_LAMB)
        return set_error(DST_ERR_INVALID_ARGUMENT,
                         "%s: config->kind is %d, expected DST_OPTIMIZER_ADAM, DST_OPTIMIZER_ADAMW or DST_OPTIMIZER_LAMB",
                         fn, kind);
    if (!finite_nonneg(c.lr)) return set_error(DST_ERR_INVALID_ARGUMENT, "%s: config->lr is %g, expected a finite value >= 0", fn, (double)c.lr);
    if (!beta_ok(c.beta1)) return set_error(DST_ERR_INVALID_ARGUMENT, "%s: config->beta1 is %g, expected [0, 1)", fn, (double)c.beta1);
    if (!beta_ok(c.beta2)) return set_error(DST_ERR_INVALID_ARGUMENT, "%s: config->beta2 is %g, expected [0, 1)", fn, (double)c.beta2);
    if (!finite_nonneg(c.eps)) return set_error(DST_ERR_INVALID_ARGUMENT, "%s: config->eps is %g, expected a finite value >= 0", fn, (double)c.eps);
    if (!finite_nonneg(c.weight_decay))
        return set_error(DST_ERR_INVALID_ARGUMENT, "%s: config->weight_decay is %g, expected a finite value >= 0", fn,
                         (double)c.weight_decay);
    if (!(std::isfinite(c.max_coeff) && c.max_coeff > 0.0f))
        return set_error(DST_ERR_INVALID_ARGUMENT, "%s: config->max_coeff is %g, expected a finite value > 0", fn,
                         (double)c.max_coeff);
    if (!(std::isfinite(c.min_coeff) && c.min_coeff > 0.0f && c.min_coeff <= c.max_coeff))
        return set_error(DST_ERR_INVALID_ARGUMENT, "%s: config->min_coeff is %g, expected a value in (0, max_coeff = %g]",
                         fn, (double)c.min_coeff, (double)c.max_coeff);
    return DST_OK;
}

// ---- lifetime -------------------------------------------------------------------------------------

dst_status Optimizer::create(const char *fn, std::shared_ptr<Context> ctx, const dst_optimizer_config &cfg,
                             Optimizer **out) {
    DST_TRY(optimizer_config_check(fn, cfg));
    std::unique_ptr<Optimizer> o(new Optimizer());
    o->ctx_ = std::move(ctx);
    o->cfg_ = cfg;
    o->cfg_.bias_correction = cfg.bias_correction != 0;
    o->cfg_.adam_w_mode = cfg.adam_w_mode != 0;
    o->cfg_.eps_inside_sqrt = cfg.eps_inside_sqrt != 0;
    o->groups_.push_back(group_of_config(o->cfg_));
    void *p = nullptr;
    DST_TRY(o->backend().alloc(sizeof(optim::TrainState), &p));
    o->state_ = static_cast<optim::TrainState *>(p);
    optim::TrainState s;
    std::memset(&s, 0, sizeof s);
    s.loss_scale = 1.0f;
    s.last_overflow_iter = -1;
    s.hysteresis_left = 1;
    s.inv_scale = 1.0f;
    DST_TRY(o->write_state(s));
    *out = o.release();
    return DST_OK;
}

Optimizer::~Optimizer() {
    if (!ctx_) return;
    (void)backend().synchronize();
    free_tables();
    for (OptTensor &t : tensors_) free_state(&t);
    backend().free(state_);
}

int32_t Optimizer::rule() const {
    if (cfg_.kind == DST_OPTIMIZER_LAMB) return optim::kRuleLamb;
    if (cfg_.kind == DST_OPTIMIZER_ADAM && !cfg_.adam_w_mode) return optim::kRuleAdamL2;
    return optim::kRuleAdamW;
}

// ---- groups ---------------------------------------------------------------------------------------

dst_status Optimizer::check_group(const char *fn, const char *arg, const dst_param_group &g) const {
    if (!finite_nonneg(g.lr))
        return set_error(DST_ERR_INVALID_ARGUMENT, "%s: %s->lr is %g, expected a finite value >= 0", fn, arg, (double)g.lr);
    if (!beta_ok(g.beta1))
        return set_error(DST_ERR_INVALID_ARGUMENT, "%s: %s->beta1 is %g, expected [0, 1)", fn, arg, (double)g.beta1);
    if (!beta_ok(g.beta2))
        return set_error(DST_ERR_INVALID_ARGUMENT, "%s: %s->beta2 is %g, expected [0, 1)", fn, arg, (double)g.beta2);
    if (!finite_nonneg(g.eps))
        return set_error(DST_ERR_INVALID_ARGUMENT, "%s: %s->eps is %g, expected a finite value >= 0", fn, arg, (double)g.eps);
    if (!finite_nonneg(g.weight_decay))
        return set_error(DST_ERR_INVALID_ARGUMENT, "%s: %s->weight_decay is %g, expected a finite value >= 0", fn, arg,
                         (double)g.weight_decay);
    return DST_OK;
}

dst_status Optimizer::add_group(const char *fn, const dst_param_group &g, int *index) {
    DST_TRY(check_group(fn, "group", g));
    if (groups_.size() >= static_cast<size_t>(optim::kMaxGroups))
        return set_error(DST_ERR_CAPACITY, "%s: the optimizer has %d groups already, the most it can have "
                         "(DST_OPTIMIZER_MAX_GROUPS)", fn, optim::kMaxGroups);
    groups_.push_back(g);
    groups_.back().struct_size = sizeof(dst_param_group);
    if (index) *index = static_cast<int>(groups_.size()) - 1;
    return DST_OK;
}

dst_status Optimizer::set_group(const char *fn, int index, const dst_param_group &g) {
    DST_TRY(check_group(fn, "group", g));
    groups_[static_cast<size_t>(index)] = g;
    groups_[static_cast<size_t>(index)].struct_size = sizeof(dst_param_group);
    return DST_OK;
}

// ---- tensors --------------------------------------------------------------------------------------

int Optimizer::find(const std::string &name) const {
    const auto it = by_name_.find(name);
    return it == by_name_.end() ? -1 : static_cast<int>(it->second);
}

bool Optimizer::overlaps(const void *p, size_t bytes, std::string *what) const {
    if (bytes == 0) return false;
    const uintptr_t a = reinterpret_cast<uintptr_t>(p), b = a + bytes;
    auto it = ranges_.lower_bound(b);  // first range starting at or after b: cannot overlap
    if (it == ranges_.begin()) return false;
    --it;                              // the last range starting before b
    if (it->second.first > a) {
        if (what) *what = tensors_[it->second.second].name;
        return true;
    }
    return false;
}

dst_status Optimizer::check_tensor(const char *fn, int group, const std::string &name, const dst_tensor &param,
                                   const dst_tensor &grad, const std::vector<OptTensor> &pending) const {
    if (group < 0 || group >= num_groups())
        return set_error(DST_ERR_INVALID_ARGUMENT, "%s: group is %d, expected 0..%d (dst_optimizer_add_group adds more)",
                         fn, group, num_groups() - 1);
    size_t bad = 0;
    if (name.empty()) return set_error(DST_ERR_INVALID_ARGUMENT, "%s: name is empty", fn);
    if (name.size() > kMaxNameBytes)
        return set_error(DST_ERR_INVALID_ARGUMENT, "%s: name has %zu bytes, at most %zu are allowed", fn, name.size(),
                         kMaxNameBytes);
    if (!st::valid_utf8(name.data(), name.size(), &bad))
        return set_error(DST_ERR_INVALID_ARGUMENT, "%s: name is not valid UTF-8 (byte %zu)", fn, bad);
    if (find(name) >= 0)
        return set_error(DST_ERR_INVALID_ARGUMENT, "%s: name \"%s\" is registered already", fn, name.c_str());
    for (const OptTensor &t : pending)
        if (t.name == name)
            return set_error(DST_ERR_INVALID_ARGUMENT, "%s: name \"%s\" is given twice", fn, name.c_str());
    const dst_tensor *views[2] = {&param, &grad};
    const char *vname[2] = {"param", "grad"};
    for (int k = 0; k < 2; ++k) {
        const dst_tensor &v = *views[k];
        int dt;
        std::memcpy(&dt, &v.dtype, sizeof dt);
        if (!v.data) return set_error(DST_ERR_INVALID_ARGUMENT, "%s: %s->data is NULL (tensor \"%s\")", fn, vname[k], name.c_str());
        if (v.ndim < 1 || v.ndim > DST_MAX_DIMS)
            return set_error(DST_ERR_INVALID_ARGUMENT, "%s: %s->ndim is %d, expected 1..%d (tensor \"%s\")", fn, vname[k],
                             (int)v.ndim, DST_MAX_DIMS, name.c_str());
        int64_t n = 1;
        for (int i = 0; i < v.ndim; ++i) {
            if (v.shape[i] < 1 || v.shape[i] > kMaxNumel)
                return set_error(DST_ERR_INVALID_ARGUMENT, "%s: %s->shape[%d] is %lld, expected 1..2^40 (tensor \"%s\")",
                                 fn, vname[k], i, (long long)v.shape[i], name.c_str());
            n *= v.shape[i];
            if (n > kMaxNumel)
                return set_error(DST_ERR_INVALID_ARGUMENT, "%s: %s has more than 2^40 elements (tensor \"%s\")", fn,
                                 vname[k], name.c_str());
        }
        if (dt == DST_DTYPE_FP64 && k == 0)
            return set_error(DST_ERR_UNSUPPORTED,
                             "%s: param->dtype is fp64 (tensor \"%s\"); the optimizer updates fp32, fp16 and bf16 "
                             "parameters", fn, name.c_str());
        if (dt != DST_DTYPE_FP32 && dt != DST_DTYPE_FP16 && dt != DST_DTYPE_BF16)
            return set_error(DST_ERR_INVALID_ARGUMENT, "%s: %s->dtype is %d (%s), expected fp32, fp16 or bf16 (tensor \"%s\")",
                             fn, vname[k], dt, dt_name(static_cast<dst_dtype>(dt)), name.c_str());
        if (reinterpret_cast<uintptr_t>(v.data) % dtype_size(v.dtype) != 0)
            return set_error(DST_ERR_INVALID_ARGUMENT, "%s: %s->data is not aligned to its element size (tensor \"%s\")",
                             fn, vname[k], name.c_str());
    }
    if (grad.dtype != param.dtype && grad.dtype != DST_DTYPE_FP32)
        return set_error(DST_ERR_INVALID_ARGUMENT, "%s: grad->dtype is %s, expected %s (the parameter's) or fp32 (tensor \"%s\")",
                         fn, dt_name(grad.dtype), dt_name(param.dtype), name.c_str());
    bool same = grad.ndim == param.ndim;
    for (int i = 0; same && i < param.ndim; ++i) same = grad.shape[i] == param.shape[i];
    if (!same)
        return set_error(DST_ERR_INVALID_ARGUMENT, "%s: grad->shape is %s, expected %s, the shape of param (tensor \"%s\")",
                         fn, shape_text(grad.ndim, grad.shape).c_str(), shape_text(param.ndim, param.shape).c_str(),
                         name.c_str());
    if (!(allowed_dtypes_ & (1u << static_cast<unsigned>(param.dtype))))
        return set_error(DST_ERR_UNSUPPORTED, "%s: param->dtype is %s (tensor \"%s\"): %s", fn, dt_name(param.dtype),
                         name.c_str(), allowed_why_.c_str());
    // Memory: the two views are disjoint, and disjoint from everything registered before.
    int64_t n = 1;
    for (int i = 0; i < param.ndim; ++i) n *= param.shape[i];
    const size_t pb = static_cast<size_t>(n) * dtype_size(param.dtype), gb = static_cast<size_t>(n) * dtype_size(grad.dtype);
    const uintptr_t pa = reinterpret_cast<uintptr_t>(param.data), ga = reinterpret_cast<uintptr_t>(grad.data);
    if (pa < ga + gb && ga < pa + pb)
        return set_error(DST_ERR_INVALID_ARGUMENT, "%s: param and grad overlap (tensor \"%s\")", fn, name.c_str());
    std::string other;
    for (int k = 0; k < 2; ++k) {
        const void *p = k ? grad.data : param.data;
        const size_t b = k ? gb : pb;
        if (overlaps(p, b, &other))
            return set_error(DST_ERR_INVALID_ARGUMENT, "%s: %s of tensor \"%s\" overlaps the memory of registered tensor \"%s\"",
                             fn, vname[k], name.c_str(), other.c_str());
        const uintptr_t a = reinterpret_cast<uintptr_t>(p);
        for (const OptTensor &t : pending)
            for (int j = 0; j < 2; ++j) {
                const uintptr_t q = reinterpret_cast<uintptr_t>(j ? t.grad : t.param);
                const size_t qb = j ? t.grad_bytes() : t.param_bytes();
                if (a < q + qb && q < a + b)
                    return set_error(DST_ERR_INVALID_ARGUMENT, "%s: %s of tensor \"%s\" overlaps tensor \"%s\"", fn,
                                     vname[k], name.c_str(), t.name.c_str());
            }
    }
    return DST_OK;
}

dst_status Optimizer::init_state(OptTensor *t) {
    t->state_bytes = 256 + (t->has_master() ? 3 : 2) * t->part_bytes();
    void *p = nullptr;
    DST_TRY(backend().alloc(t->state_bytes, &p));
    t->state = static_cast<char *>(p);
    dst_status s = backend().zero(t->state, t->state_bytes);
    if (s == DST_OK && t->has_master()) s = backend().convert(t->dtype, t->param, DST_DTYPE_FP32, t->master(), t->numel);
    if (s != DST_OK) free_state(t);
    return s;
}

void Optimizer::free_state(OptTensor *t) {
    backend().free(t->state);
    t->state = nullptr;
}

void Optimizer::insert(OptTensor &&t) {
    const size_t i = tensors_.size();
    ranges_[reinterpret_cast<uintptr_t>(t.param)] = {reinterpret_cast<uintptr_t>(t.param) + t.param_bytes(), i};
    ranges_[reinterpret_cast<uintptr_t>(t.grad)] = {reinterpret_cast<uintptr_t>(t.grad) + t.grad_bytes(), i};
    by_name_[t.name] = i;
    tensors_.push_back(std::move(t));
    dirty_ = true;
}

static OptTensor make_tensor(int group, const std::string &name, const dst_tensor &param, const dst_tensor &grad) {
    OptTensor t;
    t.name = name;
    t.group = group;
    t.dtype = param.dtype;
    t.grad_dtype = grad.dtype;
    t.ndim = param.ndim;
    t.numel = 1;
    for (int i = 0; i < param.ndim; ++i) {
        t.shape[i] = param.shape[i];
        t.numel *= param.shape[i];
    }
    t.param = param.data;
    t.grad = grad.data;
    return t;
}

dst_status Optimizer::add_tensor(const char *fn, int group, const char *name, const dst_tensor &param,
                                 const dst_tensor &grad) {
    const std::string nm(name);
    DST_TRY(check_tensor(fn, group, nm, param, grad, {}));
    OptTensor t = make_tensor(group, nm, param, grad);
    DST_TRY(init_state(&t));
    insert(std::move(t));
    return DST_OK;
}

dst_status Optimizer::add_layer(const char *fn, Layer *layer, const char *prefix, int decay_group,
                                int no_decay_group) {
    if (&layer->context() != ctx_.get())
        return set_error(DST_ERR_INVALID_ARGUMENT, "%s: layer belongs to another context than the optimizer", fn);
    const dst_dtype dt = layer->config().dtype;
    if (dt == DST_DTYPE_FP64)
        return set_error(DST_ERR_UNSUPPORTED, "%s: layer has dtype fp64; the optimizer updates fp32, fp16 and bf16 layers",
                         fn);
    for (int g : {decay_group, no_decay_group})
        if (g < 0 || g >= num_groups())
            return set_error(DST_ERR_INVALID_ARGUMENT, "%s: %s is %d, expected 0..%d", fn,
                             g == decay_group ? "decay_group" : "no_decay_group", g, num_groups() - 1);
    const std::string pre = prefix ? std::string(prefix) : "layer." + std::to_string(layer->id()) + ".";
    std::vector<OptTensor> pending;
    for (int p = 0; p < DST_PARAM_COUNT; ++p) {
        dst_tensor pv, gv;
        std::memset(&pv, 0, sizeof pv);
        int64_t sh[2];
        layer->param_shape(p, &pv.ndim, sh);
        pv.shape[0] = sh[0];
        pv.shape[1] = pv.ndim == 2 ? sh[1] : 0;
        pv.dtype = dt;
        pv.data = static_cast<char *>(layer->params()) + layer->param_offset(p);
        gv = pv;
        gv.data = static_cast<char *>(layer->grads()) + layer->param_offset(p);
        const int group = pv.ndim == 2 ? decay_group : no_decay_group;
        const std::string nm = pre + param_name(p);
        DST_TRY(check_tensor(fn, group, nm, pv, gv, pending));
        OptTensor t = make_tensor(group, nm, pv, gv);
        t.layer = layer;
        t.layer_param = p;
        pending.push_back(std::move(t));
    }
    for (size_t i = 0; i < pending.size(); ++i) {
        const dst_status s = init_state(&pending[i]);
        if (s != DST_OK) {
            for (size_t j = 0; j < i; ++j) free_state(&pending[j]);
            return s;
        }
    }
    for (OptTensor &t : pending) insert(std::move(t));
    return DST_OK;
}

// ---- state ----------------------------------------------------------------------------------------

dst_status Optimizer::refresh_masters() {
    DST_TRY(sync_layers());
    for (const OptTensor &t : tensors_)
        if (t.has_master()) DST_TRY(backend().convert(t.dtype, t.param, DST_DTYPE_FP32, t.master(), t.numel));
    return DST_OK;
}

dst_status Optimizer::zero_grads() {
    DST_TRY(sync_layers());
    for (const OptTensor &t : tensors_) DST_TRY(backend().zero(t.grad, t.grad_bytes()));
    return DST_OK;
}

dst_status Optimizer::set_step(int index, int64_t step) {
    return backend().copy(tensors_[static_cast<size_t>(index)].step(), &step, sizeof step, CopyKind::HostToDevice);
}

dst_status Optimizer::read_state(optim::TrainState *out) const {
    return backend().copy(out, state_, sizeof *out, CopyKind::DeviceToHost);
}

dst_status Optimizer::write_state(const optim::TrainState &s) {
    return backend().copy(state_, &s, sizeof s, CopyKind::HostToDevice);
}

dst_status Optimizer::read_tensor_counters(size_t i, int64_t *step, float *coeff) const {
    char head[16];
    DST_TRY(backend().copy(head, tensors_[i].state, sizeof head, CopyKind::DeviceToHost));
    std::memcpy(step, head, 8);
    std::memcpy(coeff, head + 8, 4);
    return DST_OK;
}

// ---- the step -------------------------------------------------------------------------------------

// A layer's arenas may have been rebound since registration: follow them (the next step rebuilds the
// tables) and keep the overlap index in step.
dst_status Optimizer::sync_layers() {
    for (size_t i = 0; i < tensors_.size(); ++i) {
        OptTensor &t = tensors_[i];
        if (!t.layer) continue;
        void *p = static_cast<char *>(t.layer->params()) + t.layer->param_offset(t.layer_param);
        void *g = static_cast<char *>(t.layer->grads()) + t.layer->param_offset(t.layer_param);
        if (p == t.param && g == t.grad) continue;
        ranges_.erase(reinterpret_cast<uintptr_t>(t.param));
        ranges_.erase(reinterpret_cast<uintptr_t>(t.grad));
        t.param = p;
        t.grad = g;
        ranges_[reinterpret_cast<uintptr_t>(p)] = {reinterpret_cast<uintptr_t>(p) + t.param_bytes(), i};
        ranges_[reinterpret_cast<uintptr_t>(g)] = {reinterpret_cast<uintptr_t>(g) + t.grad_bytes(), i};
        dirty_ = true;
    }
    return DST_OK;
}

void Optimizer::free_tables() {
    backend().free(tables_);
    backend().free(partials_);
    tables_ = nullptr;
    partials_ = nullptr;
    num_chunks_ = 0;
}

dst_status Optimizer::build_tables() {
    std::vector<optim::TensorDesc> td(tensors_.size());
    std::vector<optim::Chunk> ch;
    for (size_t i = 0; i < tensors_.size(); ++i) {
        const OptTensor &t = tensors_[i];
        optim::TensorDesc &d = td[i];
        std::memset(&d, 0, sizeof d);
        d.param = t.param;
        d.grad = t.grad;
        d.master = t.master();
        d.exp_avg = t.exp_avg();
        d.exp_avg_sq = t.exp_avg_sq();
        d.step = t.step();
        d.lamb_coeff = t.lamb_coeff();
        d.numel = t.numel;
        d.param_dtype = t.dtype;
        d.grad_dtype = t.grad_dtype;
        d.group = t.group;
        d.first_chunk = static_cast<int32_t>(ch.size());
        for (int64_t b = 0; b < t.numel; b += optim::kChunk) {
            if (ch.size() >= static_cast<size_t>(INT32_MAX))
                return set_error(DST_ERR_CAPACITY, "optimizer: the registered tensors have more than 2^31 chunks of %lld "
                                 "elements", (long long)optim::kChunk);
            optim::Chunk c;
            std::memset(&c, 0, sizeof c);
            c.tensor = static_cast<int32_t>(i);
            c.begin = b;
            c.end = b + optim::kChunk < t.numel ? b + optim::kChunk : t.numel;
            ch.push_back(c);
        }
        d.num_chunks = static_cast<int32_t>(ch.size()) - d.first_chunk;
    }
    const size_t tb = (td.size() * sizeof(optim::TensorDesc) + 255) / 256 * 256;
    const size_t cb = ch.size() * sizeof(optim::Chunk);
    void *tables = nullptr, *partials = nullptr;
    DST_TRY(backend().alloc(tb + cb, &tables));
    dst_status s = backend().alloc(3 * ch.size() * sizeof(double), &partials);
    if (s == DST_OK) s = backend().copy(tables, td.data(), td.size() * sizeof(optim::TensorDesc), CopyKind::HostToDevice);
    if (s == DST_OK) s = backend().copy(static_cast<char *>(tables) + tb, ch.data(), cb, CopyKind::HostToDevice);
    if (s != DST_OK) {
        backend().free(tables);
        backend().free(partials);
        return s;
    }
    free_tables();
    tables_ = tables;
    partials_ = static_cast<double *>(partials);
    num_chunks_ = static_cast<int32_t>(ch.size());
    dirty_ = false;
    return DST_OK;
}

dst_status Optimizer::step(const optim::StepArgs &control) {
    DST_TRY(sync_layers());
    if (dirty_) DST_TRY(build_tables());
    optim::StepArgs a = control;
    const size_t tb = (tensors_.size() * sizeof(optim::TensorDesc) + 255) / 256 * 256;
    a.tensors = static_cast<const optim::TensorDesc *>(tables_);
    a.num_tensors = static_cast<int32_t>(tensors_.size());
    a.chunks = tables_ ? reinterpret_cast<const optim::Chunk *>(static_cast<char *>(tables_) + tb) : nullptr;
    a.num_chunks = num_chunks_;
    a.partials = partials_;
    a.state = state_;
    a.rule = rule();
    a.bias_correction = cfg_.bias_correction;
    a.eps_inside_sqrt = cfg_.eps_inside_sqrt;
    a.max_coeff = cfg_.max_coeff;
    a.min_coeff = cfg_.min_coeff;
    a.num_groups = num_groups();
    for (int g = 0; g < num_groups(); ++g) {
        const dst_param_group &p = groups_[static_cast<size_t>(g)];
        a.groups[g] = optim::GroupParams{p.lr, p.beta1, p.beta2, p.eps, p.weight_decay};
    }
    return backend().optim_step(a);
}

}  // namespace dst
