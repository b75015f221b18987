// The saved state of an optimizer: host snapshots, and the optimizer file (dst_optimizer_save/load and
// the optim part of engine checkpoints). File layout (docs/engine.md):
//   tensors   exp_avg.<name>, exp_avg_sq.<name> and, for FP16/BF16 parameters, master.<name> (F32)
//   metadata  "optimizer": JSON {config, groups, tensors: [{name, group, dtype, grad_dtype, shape, step,
//             lamb_coeff}], train_state}, plus "format" and "checksum" (checkpoint/verified.h)
// Every float goes through JSON as a double, which holds it exactly: a saved state reads back bit for bit.
#include <cstring>
#include <stdexcept>
#include <string>

#include <nlohmann/json.hpp>

#include "checkpoint/safetensors.h"  // defines: OutTensor, Piece
#include "checkpoint/verified.h"     // defines: write_verified, read_verified
#include "core/error.h"              // defines: set_error, DST_TRY
#include "optim/optimizer.h"

namespace dst {

namespace {

constexpr char kFormat[] = "dstransformer-optimizer-1";
constexpr char kStateKey[] = "optimizer";

using json = nlohmann::ordered_json;

json train_state_json(const optim::TrainState &s) {
    json j;
    j["loss_scale"] = s.loss_scale;
    j["cur_iter"] = s.cur_iter;
    j["last_overflow_iter"] = s.last_overflow_iter;
    j["hysteresis_left"] = s.hysteresis_left;
    j["applied_steps"] = s.applied_steps;
    j["skipped_steps"] = s.skipped_steps;
    j["grad_norm"] = s.grad_norm;
    j["inv_scale"] = s.inv_scale;
    j["norm_computed"] = s.norm_computed;
    j["overflow"] = s.overflow;
    j["skipped"] = s.skipped;
    j["lr"] = std::vector<float>(s.lr, s.lr + optim::kMaxGroups);
    return j;
}

void train_state_from(const nlohmann::json &j, optim::TrainState *s) {
    std::memset(s, 0, sizeof *s);
    s->loss_scale = j.at("loss_scale").get<float>();
    s->cur_iter = j.at("cur_iter").get<int32_t>();
    s->last_overflow_iter = j.at("last_overflow_iter").get<int32_t>();
    s->hysteresis_left = j.at("hysteresis_left").get<int32_t>();
    s->applied_steps = j.at("applied_steps").get<int64_t>();
    s->skipped_steps = j.at("skipped_steps").get<int64_t>();
    s->grad_norm = j.at("grad_norm").get<float>();
    s->inv_scale = j.at("inv_scale").get<float>();
    s->norm_computed = j.at("norm_computed").get<int32_t>();
    s->overflow = j.at("overflow").get<int32_t>();
    s->skipped = j.at("skipped").get<int32_t>();
    const std::vector<float> lr = j.at("lr").get<std::vector<float>>();
    for (size_t g = 0; g < lr.size() && g < static_cast<size_t>(optim::kMaxGroups); ++g) s->lr[g] = lr[g];
}

json group_json(const dst_param_group &g) {
    return json{{"lr", g.lr}, {"beta1", g.beta1}, {"beta2", g.beta2}, {"eps", g.eps}, {"weight_decay", g.weight_decay}};
}

dst_param_group group_from(const nlohmann::json &j) {
    dst_param_group g;
    std::memset(&g, 0, sizeof g);
    g.struct_size = sizeof g;
    g.lr = j.at("lr").get<float>();
    g.beta1 = j.at("beta1").get<float>();
    g.beta2 = j.at("beta2").get<float>();
    g.eps = j.at("eps").get<float>();
    g.weight_decay = j.at("weight_decay").get<float>();
    return g;
}

const char *kind_name(dst_optimizer_kind k) {
    return k == DST_OPTIMIZER_LAMB ? "lamb" : k == DST_OPTIMIZER_ADAMW ? "adamw" : "adam";
}

dst_dtype dtype_from(const std::string &s) {
    if (s == "fp16") return DST_DTYPE_FP16;
    if (s == "bf16") return DST_DTYPE_BF16;
    if (s == "fp32") return DST_DTYPE_FP32;
    throw std::runtime_error("unknown dtype \"" + s + "\"");
}

}  // namespace

// ---- snapshots --------------------------------------------------------------------------------------

dst_status Optimizer::snapshot(OptimizerSnapshot *out) const {
    OptimizerSnapshot s;
    s.config = cfg_;
    s.groups = groups_;
    DST_TRY(read_state(&s.train_state));
    for (size_t i = 0; i < tensors_.size(); ++i) {
        const OptTensor &t = tensors_[i];
        OptimizerSnapshot::Tensor st;
        st.name = t.name;
        st.group = t.group;
        st.dtype = t.dtype;
        st.grad_dtype = t.grad_dtype;
        st.shape.assign(t.shape, t.shape + t.ndim);
        DST_TRY(read_tensor_counters(i, &st.step, &st.lamb_coeff));
        const size_t n = static_cast<size_t>(t.numel);
        st.exp_avg.resize(n);
        st.exp_avg_sq.resize(n);
        DST_TRY(backend().copy(st.exp_avg.data(), t.exp_avg(), n * 4, CopyKind::DeviceToHost));
        DST_TRY(backend().copy(st.exp_avg_sq.data(), t.exp_avg_sq(), n * 4, CopyKind::DeviceToHost));
        if (t.has_master()) {
            st.master.resize(n);
            DST_TRY(backend().copy(st.master.data(), t.master(), n * 4, CopyKind::DeviceToHost));
        }
        s.tensors.push_back(std::move(st));
    }
    *out = std::move(s);
    return DST_OK;
}

dst_status Optimizer::check_snapshot(const char *fn, const std::string &source, const OptimizerSnapshot &s) const {
    if (s.config.kind != cfg_.kind)
        return set_error(DST_ERR_FORMAT, "%s: %s holds the state of a %s optimizer, this one is %s", fn, source.c_str(),
                         kind_name(s.config.kind), kind_name(cfg_.kind));
    if (s.groups.size() != groups_.size())
        return set_error(DST_ERR_FORMAT, "%s: %s has %zu parameter groups, the optimizer %zu", fn, source.c_str(),
                         s.groups.size(), groups_.size());
    std::map<std::string, const OptimizerSnapshot::Tensor *> by_name;
    for (const OptimizerSnapshot::Tensor &t : s.tensors) by_name[t.name] = &t;
    for (const OptTensor &t : tensors_) {
        const auto it = by_name.find(t.name);
        if (it == by_name.end())
            return set_error(DST_ERR_FORMAT, "%s: %s has no state for tensor \"%s\"", fn, source.c_str(), t.name.c_str());
        const OptimizerSnapshot::Tensor &f = *it->second;
        const std::vector<int64_t> shape(t.shape, t.shape + t.ndim);
        if (f.shape != shape || f.dtype != t.dtype)
            return set_error(DST_ERR_FORMAT, "%s: %s holds tensor \"%s\" as another shape or dtype (%s, %zu dims) than "
                             "registered (%s, %d dims)", fn, source.c_str(), t.name.c_str(), dst_dtype_string(f.dtype),
                             f.shape.size(), dst_dtype_string(t.dtype), (int)t.ndim);
        if (f.group != t.group)
            return set_error(DST_ERR_FORMAT, "%s: %s has tensor \"%s\" in group %d, it is registered in group %d", fn,
                             source.c_str(), t.name.c_str(), f.group, t.group);
        const size_t n = static_cast<size_t>(t.numel);
        if (f.exp_avg.size() != n || f.exp_avg_sq.size() != n || f.master.size() != (t.has_master() ? n : 0))
            return set_error(DST_ERR_FORMAT, "%s: %s has incomplete state for tensor \"%s\"", fn, source.c_str(),
                             t.name.c_str());
    }
    if (s.tensors.size() != tensors_.size()) {
        for (const OptimizerSnapshot::Tensor &t : s.tensors)
            if (find(t.name) < 0)
                return set_error(DST_ERR_FORMAT, "%s: %s has state for tensor \"%s\", which is not registered", fn,
                                 source.c_str(), t.name.c_str());
        return set_error(DST_ERR_FORMAT, "%s: %s names a tensor twice", fn, source.c_str());
    }
    return DST_OK;
}

dst_status Optimizer::restore(const OptimizerSnapshot &s, bool train_state) {
    std::map<std::string, const OptimizerSnapshot::Tensor *> by_name;
    for (const OptimizerSnapshot::Tensor &t : s.tensors) by_name[t.name] = &t;
    for (const OptTensor &t : tensors_) {
        const OptimizerSnapshot::Tensor &f = *by_name.at(t.name);
        char head[16] = {0};
        std::memcpy(head, &f.step, 8);
        std::memcpy(head + 8, &f.lamb_coeff, 4);
        const size_t n = static_cast<size_t>(t.numel);
        DST_TRY(backend().copy(t.state, head, sizeof head, CopyKind::HostToDevice));
        DST_TRY(backend().copy(t.exp_avg(), f.exp_avg.data(), n * 4, CopyKind::HostToDevice));
        DST_TRY(backend().copy(t.exp_avg_sq(), f.exp_avg_sq.data(), n * 4, CopyKind::HostToDevice));
        if (t.has_master()) DST_TRY(backend().copy(t.master(), f.master.data(), n * 4, CopyKind::HostToDevice));
    }
    for (size_t g = 0; g < groups_.size(); ++g) {
        groups_[g] = s.groups[g];
        groups_[g].struct_size = sizeof(dst_param_group);
    }
    if (train_state) DST_TRY(write_state(s.train_state));
    return DST_OK;
}

// ---- the file ---------------------------------------------------------------------------------------

dst_status Optimizer::save_file(const char *fn, const std::string &path,
                                const std::map<std::string, std::string> &extra) const {
    OptimizerSnapshot s;
    DST_TRY(snapshot(&s));
    json meta;
    meta["config"] = {{"kind", kind_name(s.config.kind)},        {"bias_correction", s.config.bias_correction},
                      {"adam_w_mode", s.config.adam_w_mode},     {"max_coeff", s.config.max_coeff},
                      {"min_coeff", s.config.min_coeff},         {"eps_inside_sqrt", s.config.eps_inside_sqrt}};
    json groups = json::array();
    for (const dst_param_group &g : s.groups) groups.push_back(group_json(g));
    meta["groups"] = groups;
    json tensors = json::array();
    std::vector<st::OutTensor> out;
    auto add = [&](const std::string &name, const std::vector<int64_t> &shape, const std::vector<float> &v) {
        st::OutTensor t;
        t.name = name;
        t.dtype = "F32";
        t.shape = shape;
        st::Piece p;
        p.mem = v.data();
        p.bytes = v.size() * 4;
        t.pieces.push_back(p);
        out.push_back(std::move(t));
    };
    for (const OptimizerSnapshot::Tensor &t : s.tensors) {
        tensors.push_back({{"name", t.name},
                           {"group", t.group},
                           {"dtype", dst_dtype_string(t.dtype)},
                           {"grad_dtype", dst_dtype_string(t.grad_dtype)},
                           {"shape", t.shape},
                           {"step", t.step},
                           {"lamb_coeff", t.lamb_coeff}});
        add("exp_avg." + t.name, t.shape, t.exp_avg);
        add("exp_avg_sq." + t.name, t.shape, t.exp_avg_sq);
        if (!t.master.empty()) add("master." + t.name, t.shape, t.master);
    }
    meta["tensors"] = tensors;
    meta["train_state"] = train_state_json(s.train_state);
    std::map<std::string, std::string> md = extra;
    md[kStateKey] = meta.dump();
    md["version"] = dst_version_string();
    return st::write_verified(fn, path, kFormat, out, md);
}

dst_status Optimizer::read_file(const char *fn, const std::string &path, OptimizerSnapshot *out,
                                std::map<std::string, std::string> *metadata) {
    st::VerifiedFile f;
    DST_TRY(st::read_verified(fn, path, kFormat, &f));
    const auto m = f.header.metadata.find(kStateKey);
    if (m == f.header.metadata.end())
        return set_error(DST_ERR_FORMAT, "%s: '%s' has no __metadata__ \"%s\"", fn, path.c_str(), kStateKey);
    OptimizerSnapshot s;
    try {
        const nlohmann::json j = nlohmann::json::parse(m->second);
        const nlohmann::json &c = j.at("config");
        optimizer_config_defaults(&s.config);
        const std::string kind = c.at("kind").get<std::string>();
        s.config.kind = kind == "lamb" ? DST_OPTIMIZER_LAMB : kind == "adamw" ? DST_OPTIMIZER_ADAMW : DST_OPTIMIZER_ADAM;
        s.config.bias_correction = c.at("bias_correction").get<int32_t>();
        s.config.adam_w_mode = c.at("adam_w_mode").get<int32_t>();
        s.config.max_coeff = c.at("max_coeff").get<float>();
        s.config.min_coeff = c.at("min_coeff").get<float>();
        s.config.eps_inside_sqrt = c.at("eps_inside_sqrt").get<int32_t>();
        for (const nlohmann::json &g : j.at("groups")) s.groups.push_back(group_from(g));
        for (const nlohmann::json &t : j.at("tensors")) {
            OptimizerSnapshot::Tensor st;
            st.name = t.at("name").get<std::string>();
            st.group = t.at("group").get<int>();
            st.dtype = dtype_from(t.at("dtype").get<std::string>());
            st.grad_dtype = dtype_from(t.at("grad_dtype").get<std::string>());
            st.shape = t.at("shape").get<std::vector<int64_t>>();
            st.step = t.at("step").get<int64_t>();
            st.lamb_coeff = t.at("lamb_coeff").get<float>();
            s.tensors.push_back(std::move(st));
        }
        train_state_from(j.at("train_state"), &s.train_state);
    } catch (const std::exception &e) {
        return set_error(DST_ERR_FORMAT, "%s: __metadata__ \"%s\" of '%s' is malformed: %s", fn, kStateKey, path.c_str(),
                         e.what());
    }
    for (OptimizerSnapshot::Tensor &t : s.tensors) {
        const std::vector<char> *d = nullptr;
        auto take = [&](const std::string &key, std::vector<float> *v) -> dst_status {
            DST_TRY(f.tensor(fn, key, "F32", t.shape, &d));
            v->resize(d->size() / 4);
            if (!d->empty()) std::memcpy(v->data(), d->data(), d->size());
            return DST_OK;
        };
        DST_TRY(take("exp_avg." + t.name, &t.exp_avg));
        DST_TRY(take("exp_avg_sq." + t.name, &t.exp_avg_sq));
        if (t.dtype != DST_DTYPE_FP32) DST_TRY(take("master." + t.name, &t.master));
    }
    if (metadata) *metadata = f.header.metadata;
    *out = std::move(s);
    return DST_OK;
}

}  // namespace dst
