// Training-state checkpoints of the engine (dst_engine_save_checkpoint / dst_engine_load_checkpoint):
//   save_dir/latest                                      the last tag (no newline)
//   save_dir/<tag>/mp_rank_00_model_states.safetensors   every registered tensor and model tensor in its
//        dtype, under its name; metadata "engine" (counters, schedule position, RNG state, batch sizes),
//        "ds_config" (the configuration text), "client_state" (JSON text), "checkpoint_id", "checksum"
//   save_dir/<tag>/mp_rank_00_optim_states.safetensors   the optimizer file (optim/optimizer_io.cpp) with
//        the same "checkpoint_id"
// Loading reads and checks both files completely before it changes anything.
#include <sys/types.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstring>
#include <deque>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "checkpoint/safetensors.h"  // defines: OutTensor, dtype_name
#include "checkpoint/verified.h"     // defines: write_verified, read_verified
#include "core/error.h"              // defines: set_error, DST_TRY
#include "train/checkpoint_dir.h"    // defines: check_tag, publish, read_latest
#include "train/engine.h"

namespace dst {

namespace {

constexpr char kModelFile[] = "mp_rank_00_model_states.safetensors";
constexpr char kOptimFile[] = "mp_rank_00_optim_states.safetensors";
constexpr char kModelFormat[] = "dstransformer-engine-model-1";
constexpr char kIdKey[] = "checkpoint_id";

// An identifier that two saves never share (time, process, address and a counter, mixed).
std::string new_checkpoint_id(const void *salt) {
    static thread_local uint64_t counter = 0;
    uint64_t z = static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count()) ^
                 (static_cast<uint64_t>(::getpid()) << 32) ^ reinterpret_cast<uintptr_t>(salt) ^ (++counter << 48);
    std::string out;
    for (int k = 0; k < 2; ++k) {
        z += 0x9E3779B97F4A7C15ull;
        uint64_t x = z;
        x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
        x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
        x ^= x >> 31;
        char buf[17];
        std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(x));
        out += buf;
    }
    return out;
}

std::vector<int64_t> shape_of(int32_t ndim, const int64_t *shape) { return std::vector<int64_t>(shape, shape + ndim); }

// What a checkpoint's "engine" metadata holds.
struct SavedEngine {
    int64_t global_steps = 0, global_samples = 0, micro_steps = 0, skipped_steps = 0;
    int64_t schedule_offset = 0;
    bool rewarm_done = false;
    uint64_t rng_seed = 0, rng_offset = 0;
    uint32_t rng_graph_counter = 0;
};

}  // namespace

dst_status Engine::save_checkpoint(const char *fn, const char *save_dir, const char *tag_in, const char *client_state,
                                   bool save_latest) {
    if (micro_steps_ % cfg_.gradient_accumulation_steps != 0)
        return set_error(DST_ERR_STATE,
                         "%s: %lld micro steps are not a multiple of gradient_accumulation_steps %d: save at an "
                         "accumulation boundary (gradients are not saved)", fn, (long long)micro_steps_,
                         cfg_.gradient_accumulation_steps);
    const std::string tag = tag_in ? std::string(tag_in) : "global_step" + std::to_string(global_steps_);
    DST_TRY(ckdir::check_tag(fn, "tag", tag));
    std::string client = "{}";
    if (client_state) {
        try {
            client = nlohmann::ordered_json::parse(client_state).dump();
        } catch (const nlohmann::json::exception &e) {
            return set_error(DST_ERR_INVALID_ARGUMENT, "%s: client_state_json is not valid JSON: %s", fn, e.what());
        }
    }
    const std::string dir(save_dir);

    // The tensors, copied to the host now (the optimizer's state is read by save_file below).
    std::deque<std::vector<char>> host;
    std::vector<st::OutTensor> out;
    std::set<std::string> names;
    auto add = [&](const std::string &name, dst_dtype dt, std::vector<int64_t> shape, const void *src,
                   size_t bytes) -> dst_status {
        if (!names.insert(name).second)
            return set_error(DST_ERR_INVALID_ARGUMENT, "%s: two registered tensors are named \"%s\" (an optimizer tensor "
                             "and a model tensor): checkpoints need unique names", fn, name.c_str());
        host.emplace_back(bytes);
        DST_TRY(backend().copy(host.back().data(), src, bytes, CopyKind::DeviceToHost));
        st::OutTensor t;
        t.name = name;
        t.dtype = st::dtype_name(dt);
        t.shape = std::move(shape);
        st::Piece p;
        p.mem = host.back().data();
        p.bytes = bytes;
        t.pieces.push_back(p);
        out.push_back(std::move(t));
        return DST_OK;
    };
    DST_TRY(opt_->sync_layers());  // a layer's arenas may have been rebound
    for (size_t i = 0; i < opt_->num_tensors(); ++i) {
        const OptTensor &t = opt_->tensor(i);
        DST_TRY(add(t.name, t.dtype, shape_of(t.ndim, t.shape), t.param, t.param_bytes()));
    }
    for (const ModelTensor &m : model_)
        DST_TRY(add(m.name, m.view.dtype, shape_of(m.view.ndim, m.view.shape), m.view.data, m.bytes));

    optim::TrainState s;
    DST_TRY(opt_->read_state(&s));
    nlohmann::ordered_json e;
    e["global_steps"] = global_steps_;
    e["global_samples"] = global_samples_;
    e["micro_steps"] = micro_steps_;
    e["skipped_steps"] = s.skipped_steps;
    e["schedule"] = {{"type", cfg_.scheduler}, {"offset", schedule_offset_}, {"rewarm_done", rewarm_done_}};
    uint32_t graph_word = 0;
    DST_TRY(ctx_->graph_rng_counter(&graph_word, fn));
    e["rng"] = {{"seed", ctx_->rng_seed}, {"offset", ctx_->rng_offset}, {"graph_counter", graph_word}};
    e["dp_world_size"] = cfg_.world_size;
    e["train_batch_size"] = cfg_.train_batch_size;
    e["train_micro_batch_size_per_gpu"] = cfg_.micro_batch;
    e["gradient_accumulation_steps"] = cfg_.gradient_accumulation_steps;
    const std::string id = new_checkpoint_id(this);
    std::map<std::string, std::string> md;
    md["engine"] = e.dump();
    md["ds_config"] = config_text_;
    md["client_state"] = client;
    md["version"] = dst_version_string();
    md[kIdKey] = id;

    DST_TRY(ckdir::make_dirs(fn, dir));
    std::string tmp;
    DST_TRY(ckdir::make_temp_dir(fn, dir, tag, &tmp));
    dst_status st = st::write_verified(fn, tmp + "/" + kModelFile, kModelFormat, out, md);
    if (st == DST_OK) st = opt_->save_file(fn, tmp + "/" + kOptimFile, {{kIdKey, id}});
    if (st == DST_OK) st = ckdir::publish(fn, tmp, dir + "/" + tag, {kModelFile, kOptimFile});
    if (st != DST_OK) {
        ckdir::remove_dir(tmp);
        return st;
    }
    if (save_latest) DST_TRY(st::write_text_file(fn, dir + "/latest", tag));
    return DST_OK;
}

dst_status Engine::load_checkpoint(const char *fn, const char *load_dir, const char *tag_in,
                                   const dst_engine_load_options &o, std::string *client_state) {
    const std::string dir(load_dir);
    std::string tag;
    if (tag_in) {
        tag = tag_in;
        DST_TRY(ckdir::check_tag(fn, "tag", tag));
    } else {
        DST_TRY(ckdir::read_latest(fn, dir, &tag));
    }
    const std::string tdir = dir + "/" + tag;
    if (!ckdir::is_dir(tdir))
        return set_error(DST_ERR_IO, "%s: there is no checkpoint \"%s\" in '%s' (no folder '%s')", fn, tag.c_str(),
                         dir.c_str(), tdir.c_str());

    // 1. Read and check everything.
    DST_TRY(opt_->sync_layers());  // a layer's arenas may have been rebound
    st::VerifiedFile model;
    DST_TRY(st::read_verified(fn, tdir + "/" + kModelFile, kModelFormat, &model));
    const auto &mmd = model.header.metadata;
    SavedEngine saved;
    std::string client;
    try {
        const nlohmann::json e = nlohmann::json::parse(mmd.at("engine"));
        saved.global_steps = e.at("global_steps").get<int64_t>();
        saved.global_samples = e.at("global_samples").get<int64_t>();
        saved.micro_steps = e.at("micro_steps").get<int64_t>();
        saved.skipped_steps = e.at("skipped_steps").get<int64_t>();
        saved.schedule_offset = e.at("schedule").at("offset").get<int64_t>();
        saved.rewarm_done = e.at("schedule").at("rewarm_done").get<bool>();
        saved.rng_seed = e.at("rng").at("seed").get<uint64_t>();
        saved.rng_offset = e.at("rng").at("offset").get<uint64_t>();
        // Optional (absent from checkpoints written before CUDA-graph dropout): 0.
        const uint64_t graph_word = e.at("rng").value("graph_counter", uint64_t(0));
        if (graph_word > UINT32_MAX) throw std::out_of_range("rng.graph_counter is not a 32-bit unsigned word");
        saved.rng_graph_counter = static_cast<uint32_t>(graph_word);
        client = nlohmann::ordered_json::parse(mmd.at("client_state")).dump();
    } catch (const std::exception &ex) {
        return set_error(DST_ERR_FORMAT, "%s: the metadata of '%s' is malformed: %s", fn, model.path.c_str(), ex.what());
    }
    const auto mid = mmd.find(kIdKey);
    OptimizerSnapshot snap;
    if (!o.load_module_only) {
        std::map<std::string, std::string> omd;
        DST_TRY(Optimizer::read_file(fn, tdir + "/" + kOptimFile, &snap, &omd));
        const auto oid = omd.find(kIdKey);
        if (mid == mmd.end() || oid == omd.end() || mid->second != oid->second)
            return set_error(DST_ERR_FORMAT,
                             "%s: the two files of checkpoint '%s' come from different saves (their checkpoint_id "
                             "differs)", fn, tdir.c_str());
        if (o.load_optimizer_states) DST_TRY(opt_->check_snapshot(fn, "'" + tdir + "/" + kOptimFile + "'", snap));
    }
    struct Target {
        const std::string *name;
        void *dst;
        dst_dtype dtype;
        std::vector<int64_t> shape;
        size_t bytes;
        const std::vector<char> *src = nullptr;
    };
    std::vector<Target> targets;
    for (size_t i = 0; i < opt_->num_tensors(); ++i) {
        const OptTensor &t = opt_->tensor(i);
        targets.push_back({&t.name, t.param, t.dtype, shape_of(t.ndim, t.shape), t.param_bytes()});
    }
    for (const ModelTensor &m : model_)
        targets.push_back({&m.name, m.view.data, m.view.dtype, shape_of(m.view.ndim, m.view.shape), m.bytes});
    std::set<std::string> wanted;
    for (Target &t : targets) {
        wanted.insert(*t.name);
        if (!model.header.find(*t.name)) {
            if (o.strict)
                return set_error(DST_ERR_FORMAT, "%s: tensor \"%s\" is missing from '%s' (load with strict = 0 to keep "
                                 "its current values)", fn, t.name->c_str(), model.path.c_str());
            continue;
        }
        DST_TRY(model.tensor(fn, *t.name, st::dtype_name(t.dtype), t.shape, &t.src));
    }
    if (o.strict)
        for (const st::Entry &e : model.header.tensors)
            if (!wanted.count(e.name))
                return set_error(DST_ERR_FORMAT, "%s: '%s' holds tensor \"%s\", which is not registered with the engine "
                                 "(load with strict = 0 to ignore it)", fn, model.path.c_str(), e.name.c_str());

    // 2. Apply.
    for (const Target &t : targets)
        if (t.src) DST_TRY(backend().copy(t.dst, t.src->data(), t.bytes, CopyKind::HostToDevice));
    if (o.load_module_only) {
        DST_TRY(opt_->refresh_masters());
        *client_state = client;
        return DST_OK;
    }
    optim::TrainState s;
    DST_TRY(opt_->read_state(&s));
    if (o.load_optimizer_states) {
        DST_TRY(opt_->restore(snap, false));
        const optim::TrainState &f = snap.train_state;
        s.loss_scale = f.loss_scale;
        s.cur_iter = f.cur_iter;
        s.last_overflow_iter = f.last_overflow_iter;
        s.hysteresis_left = f.hysteresis_left;
        s.grad_norm = f.grad_norm;
        s.inv_scale = f.inv_scale;
        s.norm_computed = f.norm_computed;
        s.overflow = f.overflow;
        s.skipped = f.skipped;
        std::memcpy(s.lr, f.lr, sizeof s.lr);
    } else {
        DST_TRY(opt_->refresh_masters());
    }
    if (o.load_lr_scheduler_states) {
        s.applied_steps = snap.train_state.applied_steps;
        schedule_offset_ = saved.schedule_offset;
        rewarm_done_ = saved.rewarm_done;
    }
    s.skipped_steps = saved.skipped_steps;
    global_steps_ = saved.global_steps;
    global_samples_ = saved.global_samples;
    micro_steps_ = saved.micro_steps;
    if (cfg_.rewarm && !rewarm_done_) {
        schedule_offset_ = global_steps_;
        rewarm_done_ = true;
    }
    DST_TRY(opt_->write_state(s));
    if (o.restore_rng) DST_TRY(ctx_->set_rng_state(saved.rng_seed, saved.rng_offset, fn, saved.rng_graph_counter));
    *client_state = client;
    return DST_OK;
}

}  // namespace dst
