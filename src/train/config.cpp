// Parsing of the DeepSpeed-style JSON configuration (docs/engine.md has the table of keys). The text is
// parsed by nlohmann-json with comments allowed (DeepSpeed reads its files with hjson) and duplicate
// keys refused (as hjson does); then each section is read through a Section, which records every key
// it is asked about, so that any other key of the object is reported as unknown, with its JSON path and
// the closest known key.
#include "train/config.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstring>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/error.h"       // defines: set_error, DST_TRY
#include "optim/optimizer.h"  // defines: optimizer_config_defaults

namespace dst {

namespace {

using json = nlohmann::json;

std::string lower(std::string s) {
    for (char &c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    return s;
}

size_t edit_distance(const std::string &a, const std::string &b) {
    std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
    for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
    for (size_t i = 1; i <= a.size(); ++i) {
        cur[0] = i;
        for (size_t j = 1; j <= b.size(); ++j)
            cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1)});
        prev.swap(cur);
    }
    return prev[b.size()];
}

// The known name closest to `s` (same letters in another case, or at most 2 edits away), or "".
std::string closest(const std::string &s, const std::vector<std::string> &known) {
    std::string best;
    size_t best_d = 3;
    for (const std::string &k : known) {
        if (lower(k) == lower(s)) return k;
        const size_t d = edit_distance(s, k);
        if (d < best_d) {
            best_d = d;
            best = k;
        }
    }
    return best;
}

std::string type_name(const json &v) {
    if (v.is_boolean()) return v.get<bool>() ? "true" : "false";
    if (v.is_number_integer() || v.is_number_unsigned() || v.is_number_float()) return "the number " + v.dump();
    if (v.is_string()) return "the string " + v.dump();
    if (v.is_array()) return "an array";
    if (v.is_object()) return "an object";
    return "null";
}

// ---- parsing with duplicate-key detection -------------------------------------------------------------

struct Frame {
    bool array = false;
    std::set<std::string> keys;
    std::string key;   // current key (objects)
    int64_t index = 0; // current element (arrays)
};

std::string frames_path(const std::vector<Frame> &frames, size_t upto) {
    std::string p;
    for (size_t i = 0; i < upto && i < frames.size(); ++i) {
        if (frames[i].array)
            p += "[" + std::to_string(frames[i].index) + "]";
        else
            p += (p.empty() ? "" : ".") + frames[i].key;
    }
    return p;
}

dst_status parse_json(const char *fn, const char *text, json *out) {
    std::vector<Frame> frames;
    std::string duplicate;
    auto element_done = [&frames] {
        if (!frames.empty() && frames.back().array) ++frames.back().index;
    };
    json::parser_callback_t cb = [&](int, json::parse_event_t ev, json &parsed) -> bool {
        switch (ev) {
        case json::parse_event_t::object_start: frames.push_back(Frame{}); break;
        case json::parse_event_t::array_start: {
            Frame f;
            f.array = true;
            frames.push_back(f);
            break;
        }
        case json::parse_event_t::object_end:
        case json::parse_event_t::array_end:
            frames.pop_back();
            element_done();
            break;
        case json::parse_event_t::key: {
            Frame &f = frames.back();
            f.key = parsed.get<std::string>();
            if (!f.keys.insert(f.key).second && duplicate.empty()) duplicate = frames_path(frames, frames.size());
            break;
        }
        case json::parse_event_t::value: element_done(); break;
        }
        return true;
    };
    try {
        *out = json::parse(text, cb, true, true);
    } catch (const json::exception &e) {
        return set_error(DST_ERR_INVALID_ARGUMENT, "%s: config_json is not valid JSON: %s", fn, e.what());
    }
    if (!duplicate.empty())
        return set_error(DST_ERR_INVALID_ARGUMENT, "%s: config: duplicate key %s (a key may appear once per object)", fn,
                         duplicate.c_str());
    return DST_OK;
}

// ---- typed access to one JSON object ---------------------------------------------------------------------

class Section {
public:
    Section(const char *fn, const json *obj, std::string path) : fn_(fn), obj_(obj), path_(std::move(path)) {}

    std::string path_of(const char *key) const { return path_.empty() ? key : path_ + "." + key; }

    // Each getter registers `key` as known; an absent key or JSON null leaves *out and gives *present = false.
    dst_status get_int(const char *key, int64_t lo, int64_t hi, int64_t *out, bool *present = nullptr) {
        const json *v = find(key, present);
        if (!v) return DST_OK;
        if (!v->is_number_integer() && !v->is_number_unsigned())
            return set_error(DST_ERR_INVALID_ARGUMENT, "%s: config: %s: expected an integer, got %s", fn_,
                             path_of(key).c_str(), type_name(*v).c_str());
        // nlohmann parses every non-negative integer as unsigned, so both bounds are checked on each form.
        const bool out_of_range = v->is_number_unsigned()
                                      ? (v->get<uint64_t>() > static_cast<uint64_t>(hi) ||
                                         (lo > 0 && v->get<uint64_t>() < static_cast<uint64_t>(lo)))
                                      : (v->get<int64_t>() < lo || v->get<int64_t>() > hi);
        if (out_of_range)
            return set_error(DST_ERR_INVALID_ARGUMENT, "%s: config: %s is %s, expected %lld..%lld", fn_,
                             path_of(key).c_str(), v->dump().c_str(), (long long)lo, (long long)hi);
        *out = v->get<int64_t>();
        return DST_OK;
    }
    dst_status get_int32(const char *key, int64_t lo, int64_t hi, int32_t *out, bool *present = nullptr) {
        int64_t v = *out;
        DST_TRY(get_int(key, lo, hi, &v, present));
        *out = static_cast<int32_t>(v);
        return DST_OK;
    }
    // A number in [lo, hi] (closed unless open_lo / open_hi).
    dst_status get_number(const char *key, double lo, double hi, double *out, bool *present = nullptr,
                          bool open_lo = false, bool open_hi = false) {
        const json *v = find(key, present);
        if (!v) return DST_OK;
        if (!v->is_number())
            return set_error(DST_ERR_INVALID_ARGUMENT, "%s: config: %s: expected a number, got %s", fn_,
                             path_of(key).c_str(), type_name(*v).c_str());
        const double d = v->get<double>();
        if (!std::isfinite(d) || (open_lo ? d <= lo : d < lo) || (open_hi ? d >= hi : d > hi))
            return set_error(DST_ERR_INVALID_ARGUMENT, "%s: config: %s is %s, expected a number in %s%g, %g%s", fn_,
                             path_of(key).c_str(), v->dump().c_str(), open_lo ? "(" : "[", lo, hi, open_hi ? ")" : "]");
        *out = d;
        return DST_OK;
    }
    dst_status get_float(const char *key, double lo, double hi, float *out, bool *present = nullptr,
                         bool open_lo = false, bool open_hi = false) {
        double d = *out;
        DST_TRY(get_number(key, lo, hi, &d, present, open_lo, open_hi));
        *out = static_cast<float>(d);
        return DST_OK;
    }
    dst_status get_bool(const char *key, bool *out, bool *present = nullptr) {
        const json *v = find(key, present);
        if (!v) return DST_OK;
        if (!v->is_boolean())
            return set_error(DST_ERR_INVALID_ARGUMENT, "%s: config: %s: expected true or false, got %s", fn_,
                             path_of(key).c_str(), type_name(*v).c_str());
        *out = v->get<bool>();
        return DST_OK;
    }
    dst_status get_string(const char *key, std::string *out, bool *present = nullptr) {
        const json *v = find(key, present);
        if (!v) return DST_OK;
        if (!v->is_string())
            return set_error(DST_ERR_INVALID_ARGUMENT, "%s: config: %s: expected a string, got %s", fn_,
                             path_of(key).c_str(), type_name(*v).c_str());
        *out = v->get<std::string>();
        return DST_OK;
    }
    // A string that must be one of `choices` (compared without case when `nocase`); the choice in *out.
    dst_status get_choice(const char *key, const std::vector<std::string> &choices, bool nocase, std::string *out,
                          bool *present = nullptr) {
        bool here = false;
        std::string s;
        DST_TRY(get_string(key, &s, &here));
        if (present) *present = here;
        if (!here) return DST_OK;
        for (const std::string &c : choices)
            if (c == s || (nocase && lower(c) == lower(s))) {
                *out = c;
                return DST_OK;
            }
        std::string list;
        for (const std::string &c : choices) list += (list.empty() ? "\"" : ", \"") + c + "\"";
        return set_error(DST_ERR_INVALID_ARGUMENT, "%s: config: %s is \"%s\", expected one of %s", fn_,
                         path_of(key).c_str(), s.c_str(), list.c_str());
    }
    // A pair [a, b] of numbers, each in [lo, hi).
    dst_status get_pair(const char *key, double lo, double hi, double *a, double *b) {
        const json *v = find(key, nullptr);
        if (!v) return DST_OK;
        if (!v->is_array() || v->size() != 2)
            return set_error(DST_ERR_INVALID_ARGUMENT, "%s: config: %s: expected an array of two numbers, got %s", fn_,
                             path_of(key).c_str(), v->is_array() ? ("an array of " + std::to_string(v->size()) +
                                                                     " elements").c_str() : type_name(*v).c_str());
        double *dst[2] = {a, b};
        for (size_t i = 0; i < 2; ++i) {
            const json &e = (*v)[i];
            const std::string at = path_of(key) + "[" + std::to_string(i) + "]";
            if (!e.is_number())
                return set_error(DST_ERR_INVALID_ARGUMENT, "%s: config: %s: expected a number, got %s", fn_, at.c_str(),
                                 type_name(e).c_str());
            const double d = e.get<double>();
            if (!(d >= lo && d < hi))
                return set_error(DST_ERR_INVALID_ARGUMENT, "%s: config: %s is %s, expected a number in [%g, %g)", fn_,
                                 at.c_str(), e.dump().c_str(), lo, hi);
            *dst[i] = d;
        }
        return DST_OK;
    }
    dst_status get_section(const char *key, Section *out, bool *present) {
        const json *v = find(key, present);
        if (!v) return DST_OK;
        if (!v->is_object())
            return set_error(DST_ERR_INVALID_ARGUMENT, "%s: config: %s: expected an object, got %s", fn_,
                             path_of(key).c_str(), type_name(*v).c_str());
        *out = Section(fn_, v, path_of(key));
        return DST_OK;
    }
    // Registers every key of the object as known (a section whose keys belong to another library).
    void accept_all() {
        for (auto it = obj_->begin(); it != obj_->end(); ++it) known_.push_back(it.key());
    }
    // Reports the first key of the object that no getter asked about.
    dst_status finish() const {
        for (auto it = obj_->begin(); it != obj_->end(); ++it) {
            if (std::find(known_.begin(), known_.end(), it.key()) != known_.end()) continue;
            const std::string hint = closest(it.key(), known_);
            std::string list;
            for (const std::string &k : known_) list += (list.empty() ? "" : ", ") + k;
            return set_error(DST_ERR_INVALID_ARGUMENT, "%s: config: unknown key %s%s%s%s (known keys here: %s)", fn_,
                             path_of(it.key().c_str()).c_str(), hint.empty() ? "" : " (did you mean ",
                             hint.empty() ? "" : path_of(hint.c_str()).c_str(), hint.empty() ? "" : "?)",
                             list.c_str());
        }
        return DST_OK;
    }
    bool has(const char *key) const {
        const auto it = obj_->find(key);
        return it != obj_->end() && !it->is_null();
    }

private:
    const json *find(const char *key, bool *present) {
        if (std::find(known_.begin(), known_.end(), key) == known_.end()) known_.push_back(key);
        if (present) *present = false;
        const auto it = obj_->find(key);
        if (it == obj_->end() || it->is_null()) return nullptr;
        if (present) *present = true;
        return &*it;
    }

    const char *fn_;
    const json *obj_;
    std::string path_;
    std::vector<std::string> known_;
};

const json kEmpty = json::object();

// ---- sections ---------------------------------------------------------------------------------------

dst_status parse_optimizer(const char *fn, Section &top, EngineConfig *c) {
    Section opt(fn, &kEmpty, "optimizer");
    bool present = false;
    DST_TRY(top.get_section("optimizer", &opt, &present));
    if (!present)
        return set_error(DST_ERR_INVALID_ARGUMENT,
                         "%s: config: the \"optimizer\" section is missing (the engine builds its optimizer from it: "
                         "{\"type\": \"Adam\", \"params\": {\"lr\": ...}})", fn);
    std::string type;
    bool have_type = false;
    DST_TRY(opt.get_string("type", &type, &have_type));
    if (!have_type)
        return set_error(DST_ERR_INVALID_ARGUMENT, "%s: config: optimizer.type is missing (adam, adamw or lamb)", fn);
    bool legacy = false;
    DST_TRY(opt.get_bool("legacy_fusion", &legacy));
    dst_optimizer_config &o = c->optimizer;
    optimizer_config_defaults(&o);
    const std::string t = lower(type);
    static const std::vector<std::string> other_ds = {"adagrad", "onebitadam", "onebitlamb", "zerooneadam",
                                                      "muadam",  "muadamw",    "musgd",      "lion"};
    if (t == "adam") {
        o.kind = DST_OPTIMIZER_ADAM;
    } else if (t == "adamw") {
        o.kind = DST_OPTIMIZER_ADAMW;
    } else if (t == "lamb") {
        o.kind = DST_OPTIMIZER_LAMB;
    } else if (std::find(other_ds.begin(), other_ds.end(), t) != other_ds.end()) {
        return set_error(DST_ERR_UNSUPPORTED,
                         "%s: config: optimizer.type \"%s\" is a DeepSpeed optimizer this library does not implement "
                         "(it has Adam, AdamW and Lamb)", fn, type.c_str());
    } else {
        return set_error(DST_ERR_UNSUPPORTED,
                         "%s: config: optimizer.type \"%s\" is not one of DeepSpeed's optimizers; torch.optim classes "
                         "are not available (use Adam, AdamW or Lamb)", fn, type.c_str());
    }
    Section params(fn, &kEmpty, "optimizer.params");
    DST_TRY(opt.get_section("params", &params, nullptr));
    DST_TRY(opt.finish());

    DST_TRY(params.get_float("lr", 0.0, 1e30, &o.lr));
    double b1 = o.beta1, b2 = o.beta2;
    DST_TRY(params.get_pair("betas", 0.0, 1.0, &b1, &b2));
    o.beta1 = static_cast<float>(b1);
    o.beta2 = static_cast<float>(b2);
    DST_TRY(params.get_float("eps", 0.0, 1e30, &o.eps));
    DST_TRY(params.get_float("weight_decay", 0.0, 1e30, &o.weight_decay));
    bool bc = o.bias_correction != 0;
    DST_TRY(params.get_bool("bias_correction", &bc));
    o.bias_correction = bc;
    double max_grad_norm = 0.0;
    bool have_mgn = false;
    DST_TRY(params.get_number("max_grad_norm", 0.0, 1e30, &max_grad_norm, &have_mgn));
    if (o.kind == DST_OPTIMIZER_LAMB) {
        DST_TRY(params.get_float("max_coeff", 0.0, 1e30, &o.max_coeff, nullptr, true));
        DST_TRY(params.get_float("min_coeff", 0.0, 1e30, &o.min_coeff, nullptr, true));
        bool inside = false;
        DST_TRY(params.get_bool("eps_inside_sqrt", &inside));
        o.eps_inside_sqrt = inside;
        if (o.min_coeff > o.max_coeff)
            return set_error(DST_ERR_INVALID_ARGUMENT,
                             "%s: config: optimizer.params.min_coeff (%g) is larger than optimizer.params.max_coeff (%g)",
                             fn, (double)o.min_coeff, (double)o.max_coeff);
    } else {
        bool wmode = true, amsgrad = false, torch_adam = false, set_grad_none = true;
        DST_TRY(params.get_bool("adam_w_mode", &wmode));
        DST_TRY(params.get_bool("amsgrad", &amsgrad));
        DST_TRY(params.get_bool("torch_adam", &torch_adam));
        DST_TRY(params.get_bool("set_grad_none", &set_grad_none));
        o.adam_w_mode = wmode;
        if (amsgrad)
            return set_error(DST_ERR_UNSUPPORTED, "%s: config: optimizer.params.amsgrad is true; FusedAdam has no AMSGrad "
                             "variant", fn);
    }
    DST_TRY(params.finish());
    if (have_mgn) {
        bool have_clip = false;
        double clip = 0.0;
        DST_TRY(top.get_number("gradient_clipping", 0.0, 1e30, &clip, &have_clip));
        if (have_clip && clip != max_grad_norm)
            return set_error(DST_ERR_INVALID_ARGUMENT,
                             "%s: config: gradient_clipping (%g) and optimizer.params.max_grad_norm (%g) disagree; both "
                             "set the global gradient-norm clipping: give one of them", fn, clip, max_grad_norm);
        c->gradient_clipping = static_cast<float>(max_grad_norm);
    }
    return DST_OK;
}

dst_status parse_scheduler(const char *fn, Section &top, EngineConfig *c) {
    Section sch(fn, &kEmpty, "scheduler");
    bool present = false;
    DST_TRY(top.get_section("scheduler", &sch, &present));
    optim::ScheduleConfig &k = c->schedule;
    std::memset(&k, 0, sizeof k);
    k.kind = optim::kScheduleNone;
    if (!present) return DST_OK;
    std::string type;
    bool have_type = false;
    DST_TRY(sch.get_string("type", &type, &have_type));
    Section params(fn, &kEmpty, "scheduler.params");
    DST_TRY(sch.get_section("params", &params, nullptr));
    DST_TRY(sch.finish());
    struct Kind {
        const char *name;
        int32_t kind;
    };
    static const Kind kinds[] = {{"WarmupLR", optim::kScheduleWarmupLR},
                                 {"WarmupDecayLR", optim::kScheduleWarmupDecayLR},
                                 {"WarmupCosineLR", optim::kScheduleWarmupCosineLR},
                                 {"warmup_linear", optim::kScheduleWarmupLinear},
                                 {"warmup_linear_decay_exp", optim::kScheduleLE},
                                 {"warmup_exp_decay_exp", optim::kScheduleEE},
                                 {"warmup_exp_decay_poly", optim::kScheduleEP}};
    if (!have_type)
        return set_error(DST_ERR_INVALID_ARGUMENT, "%s: config: scheduler.type is missing", fn);
    std::vector<std::string> names;
    for (const Kind &kd : kinds) {
        names.push_back(kd.name);
        if (type == kd.name) k.kind = kd.kind;
    }
    if (k.kind == optim::kScheduleNone) {
        if (type == "OneCycle" || type == "LRRangeTest")
            return set_error(DST_ERR_UNSUPPORTED, "%s: config: scheduler.type \"%s\" is not implemented (WarmupLR, "
                             "WarmupDecayLR, WarmupCosineLR and the BERT script's schedules are)", fn, type.c_str());
        const std::string hint = closest(type, names);
        std::string list;
        for (const std::string &n : names) list += (list.empty() ? "" : ", ") + n;
        return set_error(DST_ERR_INVALID_ARGUMENT, "%s: config: scheduler.type \"%s\" is unknown%s%s%s (names are "
                         "case-sensitive: %s)", fn, type.c_str(), hint.empty() ? "" : " (did you mean \"",
                         hint.c_str(), hint.empty() ? "" : "\"?)", list.c_str());
    }
    c->scheduler = type;
    const double kBig = 1e30;
    const bool ds_kind = k.kind == optim::kScheduleWarmupLR || k.kind == optim::kScheduleWarmupDecayLR ||
                         k.kind == optim::kScheduleWarmupCosineLR;
    if (ds_kind) {
        std::string wtype = "log";
        DST_TRY(params.get_choice("warmup_type", {"log", "linear"}, false, &wtype));
        k.warmup_log = wtype == "log";
        k.warmup_num_steps = 1000;
        int64_t w = 1000, total = 0, last = -1;
        DST_TRY(params.get_int("warmup_num_steps", 0, INT32_MAX, &w));
        k.warmup_num_steps = static_cast<double>(w);
        DST_TRY(params.get_int("last_batch_iteration", -1, INT32_MAX, &last));
        c->last_batch_iteration = last;
        if (k.kind == optim::kScheduleWarmupCosineLR) {
            k.warmup_min_ratio = 0.0;
            k.cos_min_ratio = 1e-4;
            DST_TRY(params.get_number("warmup_min_ratio", 0.0, 1.0, &k.warmup_min_ratio));
            DST_TRY(params.get_number("cos_min_ratio", 0.0, 1.0, &k.cos_min_ratio));
        } else {
            k.warmup_min_lr = 0.0;
            k.warmup_max_lr = 1e-3;
            DST_TRY(params.get_number("warmup_min_lr", 0.0, kBig, &k.warmup_min_lr));
            DST_TRY(params.get_number("warmup_max_lr", 0.0, kBig, &k.warmup_max_lr));
        }
        if (k.kind != optim::kScheduleWarmupLR) {
            bool have_total = false;
            DST_TRY(params.get_int("total_num_steps", 1, INT32_MAX, &total, &have_total));
            if (!have_total)
                return set_error(DST_ERR_INVALID_ARGUMENT, "%s: config: scheduler.params.total_num_steps is required by %s",
                                 fn, type.c_str());
            k.total_num_steps = static_cast<double>(total);
        }
    } else {
        bool have = false;
        k.learning_rate = c->optimizer.lr;
        DST_TRY(params.get_number("learning_rate", 0.0, kBig, &k.learning_rate));
        DST_TRY(params.get_number("warmup_proportion", 0.0, 1.0, &k.warmup_proportion, &have));
        if (!have)
            return set_error(DST_ERR_INVALID_ARGUMENT, "%s: config: scheduler.params.warmup_proportion is required by %s",
                             fn, type.c_str());
        int64_t total = 0;
        DST_TRY(params.get_int("total_training_steps", 1, INT32_MAX, &total, &have));
        if (!have)
            return set_error(DST_ERR_INVALID_ARGUMENT,
                             "%s: config: scheduler.params.total_training_steps is required by %s", fn, type.c_str());
        k.total_training_steps = static_cast<double>(total);
        DST_TRY(params.get_number("lr_offset", -kBig, kBig, &k.lr_offset));
        DST_TRY(params.get_bool("rewarm", &c->rewarm));
        if (k.kind == optim::kScheduleLE || k.kind == optim::kScheduleEE) {
            DST_TRY(params.get_number("decay_rate", 0.0, kBig, &k.decay_rate, &have, true));
            if (!have)
                return set_error(DST_ERR_INVALID_ARGUMENT, "%s: config: scheduler.params.decay_rate is required by %s",
                                 fn, type.c_str());
            int64_t ds = 0;
            DST_TRY(params.get_int("decay_step", 1, INT32_MAX, &ds, &have));
            if (!have)
                return set_error(DST_ERR_INVALID_ARGUMENT, "%s: config: scheduler.params.decay_step is required by %s",
                                 fn, type.c_str());
            k.decay_step = static_cast<double>(ds);
        }
    }
    return params.finish();
}

dst_status parse_precision(const char *fn, Section &top, EngineConfig *c) {
    // fp16
    Section fp16(fn, &kEmpty, "fp16");
    DST_TRY(top.get_section("fp16", &fp16, nullptr));
    DST_TRY(fp16.get_bool("enabled", &c->fp16));
    double loss_scale = 0.0, min_scale = 1.0;
    int32_t power = 16, window = 1000, hysteresis = 2;
    bool consecutive = false, auto_cast = false, rule = false;
    bool p_power = false, p_window = false, p_min = false, p_hyst = false, p_cons = false;
    DST_TRY(fp16.get_number("loss_scale", 0.0, 3.4e38, &loss_scale));
    DST_TRY(fp16.get_int32("initial_scale_power", 0, 127, &power, &p_power));
    DST_TRY(fp16.get_int32("loss_scale_window", 1, INT32_MAX, &window, &p_window));
    DST_TRY(fp16.get_int32("hysteresis", 1, INT32_MAX, &hysteresis, &p_hyst));
    DST_TRY(fp16.get_bool("consecutive_hysteresis", &consecutive, &p_cons));
    DST_TRY(fp16.get_number("min_loss_scale", 0.0, 3.4e38, &min_scale, &p_min, true));
    DST_TRY(fp16.get_bool("auto_cast", &auto_cast));
    DST_TRY(fp16.get_bool("hysteresis_enabled", &rule));
    DST_TRY(fp16.finish());
    // DeepSpeed builds the dynamic scaler's arguments only when one of these keys is given; otherwise
    // each fp16 wrapper keeps its own defaults, and FusedLamb's (unfused) wrapper has min 0.25.
    const bool any_key = p_power || p_window || p_min || p_hyst || p_cons;
    if (!any_key && c->optimizer.kind == DST_OPTIMIZER_LAMB) min_scale = 0.25;
    c->static_loss_scale = static_cast<float>(loss_scale);
    c->initial_scale = std::ldexp(1.0f, power);
    optim::ScalerConfig &s = c->scaler;
    std::memset(&s, 0, sizeof s);
    s.dynamic = c->fp16 && loss_scale == 0.0;
    s.hysteresis_rule = rule;
    s.window = window;
    s.hysteresis = hysteresis;
    s.consecutive = consecutive;
    s.min_scale = static_cast<float>(min_scale);

    // bf16 (legacy name: bfloat16)
    Section bf16(fn, &kEmpty, "bf16");
    bool have_bf16 = false, have_legacy = false;
    DST_TRY(top.get_section("bf16", &bf16, &have_bf16));
    Section legacy(fn, &kEmpty, "bfloat16");
    DST_TRY(top.get_section("bfloat16", &legacy, &have_legacy));
    if (have_bf16 && have_legacy)
        return set_error(DST_ERR_INVALID_ARGUMENT, "%s: config: both bf16 and bfloat16 are given (the same section under "
                         "its current and its legacy name): keep bf16", fn);
    Section &b = have_legacy ? legacy : bf16;
    DST_TRY(b.get_bool("enabled", &c->bf16));
    DST_TRY(b.finish());
    if (c->fp16 && c->bf16)
        return set_error(DST_ERR_INVALID_ARGUMENT, "%s: config: fp16.enabled and %s.enabled are both true; enable one",
                         fn, have_legacy ? "bfloat16" : "bf16");

    // amp (apex): its other keys are apex's and are not checked
    Section amp(fn, &kEmpty, "amp");
    DST_TRY(top.get_section("amp", &amp, nullptr));
    bool amp_on = false;
    DST_TRY(amp.get_bool("enabled", &amp_on));
    amp.accept_all();
    if (amp_on)
        return set_error(DST_ERR_UNSUPPORTED, "%s: config: amp.enabled is true; apex AMP is not available (use fp16 or "
                         "bf16)", fn);

    // ZeRO: stage 0 only
    Section zero(fn, &kEmpty, "zero_optimization");
    DST_TRY(top.get_section("zero_optimization", &zero, nullptr));
    int64_t stage = 0;
    DST_TRY(zero.get_int("stage", 0, 3, &stage));
    DST_TRY(zero.finish());
    if (stage != 0)
        return set_error(DST_ERR_UNSUPPORTED, "%s: config: zero_optimization.stage is %lld; only stage 0 (no ZeRO "
                         "partitioning) is implemented", fn, (long long)stage);

    Section ck(fn, &kEmpty, "checkpoint");
    DST_TRY(top.get_section("checkpoint", &ck, nullptr));
    std::string tv;
    DST_TRY(ck.get_choice("tag_validation", {"Ignore", "Warn", "Fail"}, true, &tv));
    return ck.finish();
}

// DeepSpeed's batch-size triad (runtime/config.py): any two of train_batch_size (TB),
// train_micro_batch_size_per_gpu (MB) and gradient_accumulation_steps (GAS) give the third by integer
// division; then TB == MB·GAS·W must hold.
dst_status resolve_batch(const char *fn, bool have_tb, int64_t tb, bool have_mb, int64_t mb, bool have_gas,
                         int64_t gas, int64_t w, EngineConfig *c) {
    if (have_tb && have_mb && have_gas) {
    } else if (have_tb && have_mb) {
        gas = tb / mb / w;
    } else if (have_tb && have_gas) {
        mb = tb / w / gas;
    } else if (have_mb && have_gas) {
        tb = mb * gas * w;
    } else if (have_tb) {
        gas = 1;
        mb = tb / w;
    } else if (have_mb) {
        gas = 1;
        tb = mb * w;
    } else {
        return set_error(DST_ERR_INVALID_ARGUMENT,
                         "%s: config: either train_batch_size or train_micro_batch_size_per_gpu needs to be provided", fn);
    }
    if (mb < 1 || gas < 1 || tb != mb * gas * w)
        return set_error(DST_ERR_INVALID_ARGUMENT,
                         "%s: config: inconsistent batch sizes: train_batch_size %lld must equal "
                         "train_micro_batch_size_per_gpu %lld x gradient_accumulation_steps %lld x world_size %lld "
                         "(= %lld)%s", fn, (long long)tb, (long long)mb, (long long)gas, (long long)w,
                         (long long)(mb * gas * w),
                         have_tb && have_mb && have_gas ? "" : "; the missing values were derived by integer division");
    if (tb > INT32_MAX)
        return set_error(DST_ERR_INVALID_ARGUMENT, "%s: config: train_batch_size resolves to %lld, above 2^31 - 1", fn,
                         (long long)tb);
    c->train_batch_size = static_cast<int32_t>(tb);
    c->micro_batch = static_cast<int32_t>(mb);
    c->gradient_accumulation_steps = static_cast<int32_t>(gas);
    return DST_OK;
}

}  // namespace

dst_status parse_engine_config(const char *fn, const char *json_text, int world_size, EngineConfig *out) {
    if (!json_text) return set_error(DST_ERR_INVALID_ARGUMENT, "%s: config_json is NULL", fn);
    if (world_size < 1) return set_error(DST_ERR_INVALID_ARGUMENT, "%s: world_size is %d, expected >= 1", fn, world_size);
    json j;
    DST_TRY(parse_json(fn, json_text, &j));
    if (!j.is_object())
        return set_error(DST_ERR_INVALID_ARGUMENT, "%s: config: the configuration is %s, expected a JSON object", fn,
                         type_name(j).c_str());
    EngineConfig c;
    c.world_size = world_size;
    Section top(fn, &j, "");
    const int64_t kMax = INT32_MAX;
    int64_t tb = 0, mb = 0, gas = 0;
    bool have_tb = false, have_mb = false, have_gas = false;
    DST_TRY(top.get_int("train_batch_size", 1, kMax, &tb, &have_tb));
    DST_TRY(top.get_int("train_micro_batch_size_per_gpu", 1, kMax, &mb, &have_mb));
    DST_TRY(top.get_int("gradient_accumulation_steps", 1, kMax, &gas, &have_gas));
    DST_TRY(top.get_int32("steps_per_print", 0, kMax, &c.steps_per_print));
    bool b = false;
    DST_TRY(top.get_bool("wall_clock_breakdown", &b));
    DST_TRY(top.get_bool("prescale_gradients", &b));
    double predivide = 1.0;
    DST_TRY(top.get_number("gradient_predivide_factor", 0.0, 1e30, &predivide, nullptr, true));
    std::string comm;
    DST_TRY(top.get_choice("communication_data_type", {"fp32", "fp16", "bf16"}, false, &comm));
    DST_TRY(top.get_float("gradient_clipping", 0.0, 1e30, &c.gradient_clipping));
    DST_TRY(parse_optimizer(fn, top, &c));
    DST_TRY(parse_scheduler(fn, top, &c));
    DST_TRY(parse_precision(fn, top, &c));
    DST_TRY(top.finish());
    DST_TRY(resolve_batch(fn, have_tb, tb, have_mb, mb, have_gas, gas, world_size, &c));
    *out = c;
    return DST_OK;
}

}  // namespace dst
