#include "checkpoint/layout.h"

#include <cstring>

#include "layer/layer.h"  // defines: param_name

namespace dst::layout {

namespace {

// HF suffixes of every part, indexed [param][part]; parameters other than QKV have one part.
const char *const kHf[DST_PARAM_COUNT][3] = {
    {"attention.self.query.weight", "attention.self.key.weight", "attention.self.value.weight"},
    {"attention.self.query.bias", "attention.self.key.bias", "attention.self.value.bias"},
    {"attention.output.dense.weight", nullptr, nullptr},
    {"attention.output.dense.bias", nullptr, nullptr},
    {"attention.output.LayerNorm.weight", nullptr, nullptr},
    {"attention.output.LayerNorm.bias", nullptr, nullptr},
    {"intermediate.dense.weight", nullptr, nullptr},
    {"intermediate.dense.bias", nullptr, nullptr},
    {"output.dense.weight", nullptr, nullptr},
    {"output.dense.bias", nullptr, nullptr},
    {"output.LayerNorm.weight", nullptr, nullptr},
    {"output.LayerNorm.bias", nullptr, nullptr},
};

constexpr char kGrad[] = "grad.";
constexpr char kLayer[] = "layer.";
constexpr int kMaxLayerIndex = 1000000;

bool starts_with(const std::string &s, size_t pos, const char *lit, size_t n) {
    return s.size() >= pos + n && s.compare(pos, n, lit) == 0;
}

}  // namespace

const char *layout_name(dst_weight_layout layout) {
    switch (layout) {
    case DST_LAYOUT_DEEPSPEED: return "deepspeed";
    case DST_LAYOUT_HF_BERT: return "hf_bert";
    }
    return "unknown";
}

bool is_layout(int value) { return value == DST_LAYOUT_DEEPSPEED || value == DST_LAYOUT_HF_BERT; }

int parts(dst_weight_layout layout, int p) {
    return layout == DST_LAYOUT_HF_BERT && (p == DST_PARAM_ATTN_QKVW || p == DST_PARAM_ATTN_QKVB) ? 3 : 1;
}

const char *suffix(dst_weight_layout layout, int p, int k) {
    if (p < 0 || p >= DST_PARAM_COUNT || k < 0 || k >= parts(layout, p)) return nullptr;
    return layout == DST_LAYOUT_HF_BERT ? kHf[p][k] : param_name(p);
}

std::string tensor_name(dst_weight_layout layout, const std::string &prefix, int layer, int p, int k, bool grad) {
    std::string s;
    if (grad) s += kGrad;
    s += prefix;
    s += kLayer;
    s += std::to_string(layer);
    s += '.';
    s += suffix(layout, p, k);
    return s;
}

bool parse_name(dst_weight_layout layout, const std::string &prefix, const std::string &name, NameRef *out) {
    NameRef r;
    size_t pos = 0;
    if (starts_with(name, 0, kGrad, sizeof kGrad - 1)) {
        r.grad = true;
        pos = sizeof kGrad - 1;
    }
    if (!starts_with(name, pos, prefix.data(), prefix.size())) return false;
    pos += prefix.size();
    if (!starts_with(name, pos, kLayer, sizeof kLayer - 1)) return false;
    pos += sizeof kLayer - 1;
    const size_t digits = pos;
    long idx = 0;
    while (pos < name.size() && name[pos] >= '0' && name[pos] <= '9') {
        idx = idx * 10 + (name[pos] - '0');
        if (idx >= kMaxLayerIndex) return false;
        ++pos;
    }
    if (pos == digits || (name[digits] == '0' && pos - digits > 1)) return false;
    if (pos >= name.size() || name[pos] != '.') return false;
    const char *rest = name.c_str() + pos + 1;
    for (int p = 0; p < DST_PARAM_COUNT; ++p)
        for (int k = 0; k < parts(layout, p); ++k)
            if (std::strcmp(rest, suffix(layout, p, k)) == 0 &&
                std::strlen(rest) == name.size() - pos - 1) {  // no embedded NUL
                r.layer = static_cast<int>(idx);
                r.param = p;
                r.part = k;
                *out = r;
                return true;
            }
    return false;
}

bool parse_name_any_prefix(const std::string &name, std::string *prefix, dst_weight_layout *layout, NameRef *out) {
    const size_t start = starts_with(name, 0, kGrad, sizeof kGrad - 1) ? sizeof kGrad - 1 : 0;
    for (dst_weight_layout lay : {DST_LAYOUT_DEEPSPEED, DST_LAYOUT_HF_BERT})
        for (int p = 0; p < DST_PARAM_COUNT; ++p)
            for (int k = 0; k < parts(lay, p); ++k) {
                const char *sfx = suffix(lay, p, k);
                const size_t n = std::strlen(sfx);
                // ... "layer." <digits> "." <suffix> at the end of the name.
                if (name.size() < start + sizeof kLayer - 1 + 2 + n) continue;
                const size_t dot = name.size() - n - 1;
                if (name[dot] != '.' || name.compare(dot + 1, n, sfx) != 0) continue;
                size_t d = dot;
                while (d > start && name[d - 1] >= '0' && name[d - 1] <= '9' && dot - d < 7) --d;
                const size_t digits = dot - d;
                if (digits == 0 || digits > 6 || (name[d] == '0' && digits > 1)) continue;
                if (d < start + sizeof kLayer - 1 || name.compare(d - (sizeof kLayer - 1), sizeof kLayer - 1, kLayer) != 0)
                    continue;
                const size_t at = d - (sizeof kLayer - 1);  // where "layer." starts: after the prefix
                if (at != start && name[at - 1] != '.') continue;
                NameRef r;
                r.grad = start != 0;
                r.layer = std::stoi(name.substr(d, digits));
                r.param = p;
                r.part = k;
                *out = r;
                *prefix = name.substr(start, at - start);
                *layout = lay;
                return true;
            }
    return false;
}

const std::string *detect_prefix(dst_weight_layout layout, const std::vector<std::string> &candidates,
                                 const std::vector<std::string> &names) {
    NameRef r;
    for (const std::string &c : candidates)
        for (const std::string &n : names)
            if (parse_name(layout, c, n, &r)) return &c;
    return nullptr;
}

}  // namespace dst::layout
