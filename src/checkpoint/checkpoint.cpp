#include "checkpoint/checkpoint.h"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "checkpoint/layout.h"       // defines: tensor_name, parse_name, parts, detect_prefix
#include "checkpoint/safetensors.h"  // defines: Reader, write_file, OutTensor
#include "core/context.h"            // defines: Context
#include "core/dtype.h"              // defines: dtype_size, convert_host, is_float_dtype
#include "core/error.h"              // defines: set_error, DST_TRY
#include "core/text.h"               // defines: copy_text
#include "layer/layer.h"             // defines: Layer

namespace dst {

namespace {

using Shape = std::vector<int64_t>;

std::string shape_text(const Shape &s) {
    std::string t = "[";
    for (size_t i = 0; i < s.size(); ++i) {
        if (i) t += ", ";
        t += std::to_string(s[i]);
    }
    return t + "]";
}

int64_t view_numel(const dst_tensor &t) {
    int64_t n = 1;
    for (int i = 0; i < t.ndim; ++i) n *= t.shape[i];
    return n;
}

// Shape of the full parameter `p` of a layer with hidden size H and FFN size I.
Shape param_shape(int p, int64_t H, int64_t I) {
    switch (p) {
    case DST_PARAM_ATTN_QKVW: return {3 * H, H};
    case DST_PARAM_ATTN_QKVB: return {3 * H};
    case DST_PARAM_ATTN_OW: return {H, H};
    case DST_PARAM_INTER_W: return {I, H};
    case DST_PARAM_INTER_B: return {I};
    case DST_PARAM_OUTPUT_W: return {H, I};
    default: return {H};
    }
}

// Shape of one stored tensor of parameter `p`: QKV parts of the HF layout have a third of the rows.
Shape part_shape(dst_weight_layout layout, int p, int64_t H, int64_t I) {
    Shape s = param_shape(p, H, I);
    s[0] /= layout::parts(layout, p);
    return s;
}

// The shortest decimal that reads back as the same float, as a double for JSON (0.1f -> 0.1).
double float_json(float f) {
    char buf[32];
    for (int prec = 6; prec <= 9; ++prec) {
        std::snprintf(buf, sizeof buf, "%.*g", prec, static_cast<double>(f));
        const double d = std::strtod(buf, nullptr);
        if (static_cast<float>(d) == f) return d;
    }
    return static_cast<double>(f);
}

// Every field of dst_layer_config (struct_size aside), as JSON.
static_assert(sizeof(dst_layer_config) == 104,
              "dst_layer_config changed: add the new field to config_json and docs/checkpoints.md");
std::string config_json(const dst_layer_config &c, bool training) {
    nlohmann::ordered_json j;
    j["hidden_size"] = c.hidden_size;
    j["heads"] = c.heads;
    j["intermediate_size"] = c.intermediate_size;
    j["attn_dropout_ratio"] = float_json(c.attn_dropout_ratio);
    j["hidden_dropout_ratio"] = float_json(c.hidden_dropout_ratio);
    j["num_hidden_layers"] = c.num_hidden_layers;
    j["initializer_range"] = float_json(c.initializer_range);
    j["layer_norm_eps"] = float_json(c.layer_norm_eps);
    j["seed"] = c.seed;
    j["pre_layer_norm"] = c.pre_layer_norm;
    j["normalize_invertible"] = c.normalize_invertible;
    j["gelu_checkpoint"] = c.gelu_checkpoint;
    j["attn_dropout_checkpoint"] = c.attn_dropout_checkpoint;
    j["adjust_init_range"] = c.adjust_init_range;
    j["stochastic_mode"] = c.stochastic_mode;
    j["training"] = training ? 1 : 0;
    j["dtype"] = dst_dtype_string(c.dtype);
    j["max_batch_tokens"] = c.max_batch_tokens;
    j["max_seq_len"] = c.max_seq_len;
    j["gelu"] = c.gelu == DST_GELU_TANH ? "tanh" : "erf";
    j["causal"] = c.causal;
    j["allow_tf32"] = c.allow_tf32;
    return j.dump();
}

// Strict decimal uint64 ("0" … "18446744073709551615", no sign, no spaces).
bool parse_u64(const std::string &s, uint64_t *out) {
    if (s.empty() || s.size() > 20) return false;
    uint64_t v = 0;
    for (char ch : s) {
        if (ch < '0' || ch > '9') return false;
        if (__builtin_mul_overflow(v, uint64_t(10), &v) || __builtin_add_overflow(v, uint64_t(ch - '0'), &v))
            return false;
    }
    *out = v;
    return true;
}

const char *param_role(bool grad) { return grad ? "gradient" : "parameter"; }

// ---- client state: any bytes; UTF-8 text without NUL as it is, everything else in base64 ------------
constexpr char kClientState[] = "client_state";
constexpr char kClientStateB64[] = "client_state_base64";
constexpr char kB64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

std::string base64_encode(const std::string &in) {
    std::string out;
    out.reserve((in.size() + 2) / 3 * 4);
    for (size_t i = 0; i < in.size(); i += 3) {
        const size_t n = std::min<size_t>(3, in.size() - i);
        uint32_t v = 0;
        for (size_t k = 0; k < 3; ++k) v = v << 8 | (k < n ? static_cast<unsigned char>(in[i + k]) : 0u);
        for (size_t k = 0; k < 4; ++k) out += k <= n ? kB64[(v >> (18 - 6 * k)) & 63] : '=';
    }
    return out;
}

// Strict: length a multiple of 4, padding only at the end, unused bits zero.
bool base64_decode(const std::string &in, std::string *out) {
    if (in.size() % 4) return false;
    out->clear();
    for (size_t i = 0; i < in.size(); i += 4) {
        uint32_t v = 0;
        int pad = 0;
        for (size_t k = 0; k < 4; ++k) {
            const char c = in[i + k];
            const char *at = c ? std::strchr(kB64, c) : nullptr;
            if (c == '=' && i + 4 == in.size() && k >= 2) {
                ++pad;
                v <<= 6;
                continue;
            }
            if (!at || pad) return false;
            v = v << 6 | static_cast<uint32_t>(at - kB64);
        }
        if ((pad == 1 && (v & 0xFF)) || (pad == 2 && (v & 0xFFFF))) return false;
        for (int k = 0; k < 3 - pad; ++k) *out += static_cast<char>((v >> (16 - 8 * k)) & 0xFF);
    }
    return true;
}

// The metadata entry of a client state: (key, value).
std::pair<std::string, std::string> client_state_entry(const std::string &bytes) {
    if (st::valid_utf8(bytes.data(), bytes.size(), nullptr) && bytes.find('\0') == std::string::npos)
        return {kClientState, bytes};
    return {kClientStateB64, base64_encode(bytes)};
}

}  // namespace

// ---- save -----------------------------------------------------------------------------------------

dst_status checkpoint_save(const char *fn, Layer *const *layers, int num_layers, const char *path,
                           const dst_checkpoint_options &o) {
    return checkpoint_save_model(fn, layers[0]->context(), layers, num_layers, {}, path, o);
}

dst_status checkpoint_save_model(const char *fn, Context &ctx, Layer *const *layers, int num_layers,
                                 const std::vector<NamedTensor> &tensors, const char *path,
                                 const dst_checkpoint_options &o) {
    const dst_weight_layout lay = o.layout;
    const std::string prefix = o.prefix ? o.prefix : "";
    for (int i = 0; i < num_layers; ++i)
        if (lay == DST_LAYOUT_HF_BERT && layers[i]->config().pre_layer_norm)
            return set_error(DST_ERR_INVALID_ARGUMENT,
                             "%s: layers[%d] is a Pre-LN layer (pre_layer_norm = 1); the Hugging Face BertLayer "
                             "layout (DST_LAYOUT_HF_BERT) holds Post-LN layers only: use DST_LAYOUT_DEEPSPEED", fn, i);

    std::deque<std::vector<char>> host;  // a deque keeps earlier buffers in place
    std::vector<st::OutTensor> out;
    for (int g = 0; g < (o.include_grads ? 2 : 1); ++g) {
        for (int i = 0; i < num_layers; ++i) {
            const Layer &L = *layers[i];
            const dst_dtype ldt = L.config().dtype;
            const dst_dtype odt = o.save_dtype < 0 ? ldt : static_cast<dst_dtype>(o.save_dtype);
            const char *base = static_cast<const char *>(g ? L.grads() : L.params());
            for (int p = 0; p < DST_PARAM_COUNT; ++p) {
                const size_t numel = static_cast<size_t>(L.param_numel(p));
                std::vector<char> buf(numel * dtype_size(ldt));
                DST_TRY(L.backend().copy(buf.data(), base + L.param_offset(p), buf.size(), CopyKind::DeviceToHost));
                if (odt != ldt) {
                    std::vector<char> conv(numel * dtype_size(odt));
                    convert_host(buf.data(), ldt, conv.data(), odt, numel);
                    buf.swap(conv);
                }
                host.push_back(std::move(buf));
                const char *mem = host.back().data();
                const int np = layout::parts(lay, p);
                const uint64_t part_bytes = host.back().size() / np;
                for (int k = 0; k < np; ++k) {
                    st::OutTensor t;
                    t.name = layout::tensor_name(lay, prefix, i, p, k, g == 1);
                    t.dtype = st::dtype_name(odt);
                    t.shape = part_shape(lay, p, L.dims().H, L.dims().I);
                    st::Piece piece;
                    piece.mem = mem + k * part_bytes;
                    piece.bytes = part_bytes;
                    t.pieces.push_back(piece);
                    out.push_back(std::move(t));
                }
            }
        }
    }

    // The named tensors, after the layers' (a name may not repeat any of theirs).
    std::set<std::string> names;
    for (const st::OutTensor &t : out) names.insert(t.name);
    for (const NamedTensor &nt : tensors) {
        if (!names.insert(nt.name).second)
            return set_error(DST_ERR_INVALID_ARGUMENT, "%s: the tensor name \"%s\" occurs twice in the file", fn,
                             nt.name.c_str());
        const dst_dtype tdt = nt.view.dtype;
        const dst_dtype odt = o.save_dtype < 0 || !is_float_dtype(tdt) ? tdt : static_cast<dst_dtype>(o.save_dtype);
        const size_t numel = static_cast<size_t>(view_numel(nt.view));
        std::vector<char> buf(numel * dtype_size(tdt));
        DST_TRY(ctx.backend->copy(buf.data(), nt.view.data, buf.size(), CopyKind::DeviceToHost));
        if (odt != tdt) {
            std::vector<char> conv(numel * dtype_size(odt));
            convert_host(buf.data(), tdt, conv.data(), odt, numel);
            buf.swap(conv);
        }
        host.push_back(std::move(buf));
        st::OutTensor t;
        t.name = nt.name;
        t.dtype = st::dtype_name(odt);
        t.shape.assign(nt.view.shape, nt.view.shape + nt.view.ndim);
        st::Piece piece;
        piece.mem = host.back().data();
        piece.bytes = host.back().size();
        t.pieces.push_back(piece);
        out.push_back(std::move(t));
    }

    std::map<std::string, std::string> md;
    // Hugging Face's loaders refuse a safetensors file whose "format" is not a framework name
    // (transformers: "pt", "tf", "flax", "mlx"), so a file in their layout says "pt".
    md["format"] = lay == DST_LAYOUT_HF_BERT ? kHfFormat : kCheckpointFormat;
    md["version"] = dst_version_string();
    md["num_layers"] = std::to_string(num_layers);
    md["layout"] = layout::layout_name(lay);
    md["prefix"] = prefix;
    md["include_grads"] = o.include_grads ? "1" : "0";
    for (int i = 0; i < num_layers; ++i)
        md["config." + std::to_string(i)] = config_json(layers[i]->config(), layers[i]->training());
    if (!tensors.empty()) md["num_tensors"] = std::to_string(tensors.size());
    uint32_t graph_word = 0;
    DST_TRY(ctx.graph_rng_counter(&graph_word, fn));
    md["rng_seed"] = std::to_string(ctx.rng_seed);
    md["rng_offset"] = std::to_string(ctx.rng_offset);
    md["rng_graph_counter"] = std::to_string(graph_word);
    if (o.client_state) {
        const size_t n = o.client_state_len ? o.client_state_len : std::strlen(o.client_state);
        md.insert(client_state_entry(std::string(o.client_state, n)));
    }
    return st::write_file(fn, path, out, md);
}

// ---- load -----------------------------------------------------------------------------------------

dst_status checkpoint_load(const char *fn, Layer *const *layers, int num_layers, const char *path,
                           const dst_checkpoint_options &o, char *client_state, size_t client_state_size,
                           size_t *client_state_len) {
    return checkpoint_load_model(fn, layers[0]->context(), layers, num_layers, {}, nullptr, path, o, client_state,
                                 client_state_size, client_state_len);
}

dst_status checkpoint_load_model(const char *fn, Context &ctx, Layer *const *layers, int num_layers,
                                 const std::vector<NamedTensor> &tensors, int32_t *found, const char *path,
                                 const dst_checkpoint_options &o, char *client_state, size_t client_state_size,
                                 size_t *client_state_len) {
    const dst_weight_layout lay = o.layout;
    for (int i = 0; i < num_layers; ++i)
        if (lay == DST_LAYOUT_HF_BERT && layers[i]->config().pre_layer_norm)
            return set_error(DST_ERR_INVALID_ARGUMENT,
                             "%s: layers[%d] is a Pre-LN layer (pre_layer_norm = 1); the Hugging Face BertLayer "
                             "layout (DST_LAYOUT_HF_BERT) holds Post-LN weights only: load it with "
                             "DST_LAYOUT_DEEPSPEED or create Post-LN layers", fn, i);

    st::Reader rd;
    DST_TRY(rd.open(fn, path));
    const st::Header &h = rd.header();

    std::string prefix;
    if (o.prefix) {
        prefix = o.prefix;
    } else if (lay == DST_LAYOUT_HF_BERT && num_layers > 0) {
        static const std::vector<std::string> cands = {"bert.encoder.", "encoder.", ""};
        std::vector<std::string> names;
        for (const st::Entry &e : h.tensors) names.push_back(e.name);
        const std::string *found = layout::detect_prefix(lay, cands, names);
        if (!found)
            return set_error(DST_ERR_FORMAT,
                             "%s: '%s' has no Hugging Face BertLayer tensors (looked for \"<prefix>layer.<i>."
                             "attention.self.query.weight\" and the other BertLayer names with the prefixes "
                             "\"bert.encoder.\", \"encoder.\" and \"\"; give options->prefix)", fn, path);
        prefix = *found;
    }

    // 1. Every tensor every target needs: present, floating, of the right shape.
    struct Item {
        Layer *layer;
        bool grad;
        int p;
        int nparts;
        const st::Entry *e[3];
        dst_dtype dt[3];
    };
    std::vector<Item> items;
    for (int g = 0; g < (o.include_grads ? 2 : 1); ++g) {
        for (int i = 0; i < num_layers; ++i) {
            Layer &L = *layers[i];
            const int64_t H = L.dims().H, I = L.dims().I;
            for (int p = 0; p < DST_PARAM_COUNT; ++p) {
                Item it{&L, g == 1, p, layout::parts(lay, p), {}, {}};
                const Shape want = part_shape(lay, p, H, I);
                for (int k = 0; k < it.nparts; ++k) {
                    const std::string name = layout::tensor_name(lay, prefix, i, p, k, g == 1);
                    const st::Entry *e = h.find(name);
                    if (!e)
                        return set_error(DST_ERR_FORMAT,
                                         "%s: tensor \"%s\" (%s %s of layers[%d]) is missing from '%s'%s", fn,
                                         name.c_str(), param_role(g == 1), param_name(p), i, path,
                                         g ? " (include_grads is set)" : "");
                    if (!st::to_dst_dtype(e->dtype, &it.dt[k]) || !is_float_dtype(it.dt[k]))
                        return set_error(DST_ERR_FORMAT,
                                         "%s: tensor \"%s\" in '%s' has dtype %s, expected F32, F16, BF16 or F64", fn,
                                         name.c_str(), path, e->dtype.c_str());
                    if (e->shape != want)
                        return set_error(DST_ERR_FORMAT,
                                         "%s: tensor \"%s\" in '%s' has shape %s, expected %s for layers[%d] "
                                         "(hidden_size %lld, intermediate_size %lld)", fn, name.c_str(), path,
                                         shape_text(e->shape).c_str(), shape_text(want).c_str(), i, (long long)H,
                                         (long long)I);
                    it.e[k] = e;
                }
                items.push_back(it);
            }
        }
    }

    // 1b. The named tensors: present (or optional), of the right shape and a dtype that converts.
    std::vector<const st::Entry *> named(tensors.size(), nullptr);
    std::vector<dst_dtype> named_dt(tensors.size(), DST_DTYPE_FP32);
    for (size_t n = 0; n < tensors.size(); ++n) {
        const NamedTensor &nt = tensors[n];
        const st::Entry *e = h.find(nt.name);
        if (!e) {
            if (nt.required)
                return set_error(DST_ERR_FORMAT, "%s: tensor \"%s\" (tensors[%zu]) is missing from '%s'", fn,
                                 nt.name.c_str(), n, path);
            continue;
        }
        const dst_dtype want = nt.view.dtype;
        dst_dtype have = DST_DTYPE_FP32;
        const bool known = st::to_dst_dtype(e->dtype, &have);
        if (!known || (is_float_dtype(want) ? !is_float_dtype(have) : have != want))
            return set_error(DST_ERR_FORMAT, "%s: tensor \"%s\" in '%s' has dtype %s, expected %s", fn,
                             nt.name.c_str(), path, e->dtype.c_str(),
                             is_float_dtype(want) ? "F32, F16, BF16 or F64" : st::dtype_name(want));
        const Shape shape(nt.view.shape, nt.view.shape + nt.view.ndim);
        if (e->shape != shape)
            return set_error(DST_ERR_FORMAT, "%s: tensor \"%s\" in '%s' has shape %s, expected %s (tensors[%zu])", fn,
                             nt.name.c_str(), path, shape_text(e->shape).c_str(), shape_text(shape).c_str(), n);
        named[n] = e;
        named_dt[n] = have;
    }

    // 2. The RNG state and the client state.
    bool have_rng = false;
    uint64_t seed = 0, offset = 0, graph_word = 0;
    if (o.restore_rng) {
        const auto s = h.metadata.find("rng_seed"), f = h.metadata.find("rng_offset");
        if (s != h.metadata.end() || f != h.metadata.end()) {
            if (s == h.metadata.end() || !parse_u64(s->second, &seed))
                return set_error(DST_ERR_FORMAT,
                                 "%s: __metadata__ \"rng_seed\" of '%s' is missing or not a decimal 64-bit unsigned "
                                 "integer", fn, path);
            if (f == h.metadata.end() || !parse_u64(f->second, &offset))
                return set_error(DST_ERR_FORMAT,
                                 "%s: __metadata__ \"rng_offset\" of '%s' is missing or not a decimal 64-bit "
                                 "unsigned integer", fn, path);
            // Optional (files of 0.1.0 before CUDA-graph dropout, and other writers, lack it): 0.
            const auto g = h.metadata.find("rng_graph_counter");
            if (g != h.metadata.end() && (!parse_u64(g->second, &graph_word) || graph_word > UINT32_MAX))
                return set_error(DST_ERR_FORMAT,
                                 "%s: __metadata__ \"rng_graph_counter\" of '%s' is not a decimal 32-bit unsigned "
                                 "integer", fn, path);
            have_rng = true;
        }
    }

    std::string client;
    const auto text = h.metadata.find(kClientState), b64 = h.metadata.find(kClientStateB64);
    if (text != h.metadata.end() && b64 != h.metadata.end())
        return set_error(DST_ERR_FORMAT, "%s: __metadata__ of '%s' has both \"%s\" and \"%s\"", fn, path, kClientState,
                         kClientStateB64);
    if (b64 != h.metadata.end() && !base64_decode(b64->second, &client))
        return set_error(DST_ERR_FORMAT, "%s: __metadata__ \"%s\" of '%s' is not base64", fn, kClientStateB64, path);
    if (text != h.metadata.end()) client = text->second;

    // 3. Read and convert into host buffers of each layer's dtype (nothing changed yet).
    std::vector<std::vector<char>> host(items.size());
    std::vector<char> tmp;
    for (size_t n = 0; n < items.size(); ++n) {
        const Item &it = items[n];
        const dst_dtype ldt = it.layer->config().dtype;
        const size_t numel = static_cast<size_t>(it.layer->param_numel(it.p));
        const size_t part_numel = numel / it.nparts;
        host[n].resize(numel * dtype_size(ldt));
        for (int k = 0; k < it.nparts; ++k) {
            char *dst = host[n].data() + k * part_numel * dtype_size(ldt);
            if (it.dt[k] == ldt) {
                DST_TRY(rd.read(fn, *it.e[k], 0, it.e[k]->bytes(), dst));
            } else {
                tmp.resize(static_cast<size_t>(it.e[k]->bytes()));
                DST_TRY(rd.read(fn, *it.e[k], 0, it.e[k]->bytes(), tmp.data()));
                convert_host(tmp.data(), it.dt[k], dst, ldt, part_numel);
            }
        }
    }

    std::vector<std::vector<char>> named_host(tensors.size());
    for (size_t n = 0; n < tensors.size(); ++n) {
        if (!named[n]) continue;
        const dst_dtype want = tensors[n].view.dtype;
        const size_t numel = static_cast<size_t>(view_numel(tensors[n].view));
        named_host[n].resize(numel * dtype_size(want));
        if (named_dt[n] == want) {
            DST_TRY(rd.read(fn, *named[n], 0, named[n]->bytes(), named_host[n].data()));
        } else {
            tmp.resize(static_cast<size_t>(named[n]->bytes()));
            DST_TRY(rd.read(fn, *named[n], 0, named[n]->bytes(), tmp.data()));
            convert_host(tmp.data(), named_dt[n], named_host[n].data(), want, numel);
        }
    }

    // 4. Only now change the layers and the tensors.
    for (size_t n = 0; n < items.size(); ++n) {
        const Item &it = items[n];
        char *base = static_cast<char *>(it.grad ? it.layer->grads() : it.layer->params());
        DST_TRY(it.layer->backend().copy(base + it.layer->param_offset(it.p), host[n].data(), host[n].size(),
                                         CopyKind::HostToDevice));
    }
    for (size_t n = 0; n < tensors.size(); ++n) {
        if (named[n])
            DST_TRY(ctx.backend->copy(tensors[n].view.data, named_host[n].data(), named_host[n].size(),
                                      CopyKind::HostToDevice));
        if (found) found[n] = named[n] ? 1 : 0;
    }
    if (have_rng) DST_TRY(ctx.set_rng_state(seed, offset, fn, static_cast<uint32_t>(graph_word)));
    copy_text(client, client_state, client_state_size, client_state_len);
    return DST_OK;
}

// ---- convert --------------------------------------------------------------------------------------

dst_status checkpoint_convert(const char *fn, const char *in_path, dst_weight_layout in_layout,
                              const char *in_prefix, const char *out_path, dst_weight_layout out_layout,
                              const char *out_prefix, char *summary, size_t summary_size) {
    st::Reader rd;
    DST_TRY(rd.open(fn, in_path));
    const st::Header &h = rd.header();

    std::string pin;
    bool detected = false;
    if (in_prefix) {
        pin = in_prefix;
    } else {
        static const std::vector<std::string> cands = {"", "bert.encoder.", "encoder."};
        std::vector<std::string> names;
        for (const st::Entry &e : h.tensors) names.push_back(e.name);
        const std::string *found = layout::detect_prefix(in_layout, cands, names);
        if (!found)
            return set_error(DST_ERR_FORMAT,
                             "%s: '%s' has no layer tensors of the %s layout (tried the prefixes \"\", "
                             "\"bert.encoder.\" and \"encoder.\"; give in_prefix)", fn, in_path,
                             layout::layout_name(in_layout));
        pin = *found;
        detected = true;
    }
    const std::string pout = out_prefix ? out_prefix : pin;

    // Group the layer tensors by (gradient?, layer index); everything else passes through.
    struct Group {
        const st::Entry *e[DST_PARAM_COUNT][3] = {};
    };
    std::map<std::pair<int, int>, Group> groups;
    std::vector<const st::Entry *> passthrough;
    for (const st::Entry &e : h.tensors) {
        layout::NameRef r;
        if (layout::parse_name(in_layout, pin, e.name, &r))
            groups[{r.grad ? 1 : 0, r.layer}].e[r.param][r.part] = &e;
        else
            passthrough.push_back(&e);
    }
    if (groups.empty())
        return set_error(DST_ERR_FORMAT, "%s: '%s' has no layer tensors of the %s layout with the prefix \"%s\"", fn,
                         in_path, layout::layout_name(in_layout), pin.c_str());

    if (out_layout == DST_LAYOUT_HF_BERT) {
        for (const auto &kv : groups) {
            const int i = kv.first.second;
            const auto m = h.metadata.find("config." + std::to_string(i));
            if (m == h.metadata.end()) continue;
            const nlohmann::json cfg = nlohmann::json::parse(m->second, nullptr, false);
            if (cfg.is_object() && cfg.contains("pre_layer_norm") && cfg["pre_layer_norm"].is_number() &&
                cfg["pre_layer_norm"].get<double>() != 0)
                return set_error(DST_ERR_INVALID_ARGUMENT,
                                 "%s: layer %d of '%s' is Pre-LN (its __metadata__ \"config.%d\" has pre_layer_norm "
                                 "1); the Hugging Face BertLayer layout holds Post-LN layers only", fn, i, in_path, i);
        }
    }

    // Check every layer: complete, shapes consistent with one (H, I), fused parts of one dtype.
    std::set<std::string> dtypes;
    for (const auto &kv : groups) {
        const bool grad = kv.first.first == 1;
        const int i = kv.first.second;
        const Group &g = kv.second;
        for (int p = 0; p < DST_PARAM_COUNT; ++p)
            for (int k = 0; k < layout::parts(in_layout, p); ++k)
                if (!g.e[p][k])
                    return set_error(DST_ERR_FORMAT, "%s: layer %d of '%s' is incomplete: tensor \"%s\" is missing",
                                     fn, i, in_path, layout::tensor_name(in_layout, pin, i, p, k, grad).c_str());
        const st::Entry *ow = g.e[DST_PARAM_ATTN_OW][0], *iw = g.e[DST_PARAM_INTER_W][0];
        if (ow->shape.size() != 2 || ow->shape[0] != ow->shape[1])
            return set_error(DST_ERR_FORMAT, "%s: tensor \"%s\" in '%s' has shape %s, expected [H, H]", fn,
                             ow->name.c_str(), in_path, shape_text(ow->shape).c_str());
        const int64_t H = ow->shape[0];
        if (iw->shape.size() != 2 || iw->shape[1] != H)
            return set_error(DST_ERR_FORMAT, "%s: tensor \"%s\" in '%s' has shape %s, expected [I, %lld]", fn,
                             iw->name.c_str(), in_path, shape_text(iw->shape).c_str(), (long long)H);
        const int64_t I = iw->shape[0];
        for (int p = 0; p < DST_PARAM_COUNT; ++p) {
            const Shape want = part_shape(in_layout, p, H, I);
            for (int k = 0; k < layout::parts(in_layout, p); ++k) {
                const st::Entry *e = g.e[p][k];
                if (e->shape != want)
                    return set_error(DST_ERR_FORMAT,
                                     "%s: tensor \"%s\" in '%s' has shape %s, expected %s (hidden size %lld, "
                                     "intermediate size %lld)", fn, e->name.c_str(), in_path,
                                     shape_text(e->shape).c_str(), shape_text(want).c_str(), (long long)H,
                                     (long long)I);
                if (e->dtype != g.e[p][0]->dtype)
                    return set_error(DST_ERR_FORMAT,
                                     "%s: tensors \"%s\" (%s) and \"%s\" (%s) in '%s' have different dtypes; they "
                                     "form one %s", fn, g.e[p][0]->name.c_str(), g.e[p][0]->dtype.c_str(),
                                     e->name.c_str(), e->dtype.c_str(), in_path, param_name(p));
                dtypes.insert(e->dtype);
            }
        }
    }

    // Output: passed-through tensors first (as they were), then the layers, parameters before gradients.
    std::vector<st::OutTensor> out;
    std::set<std::string> layer_names;
    for (const auto &kv : groups) {
        const bool grad = kv.first.first == 1;
        const int i = kv.first.second;
        const Group &g = kv.second;
        for (int p = 0; p < DST_PARAM_COUNT; ++p) {
            const int nin = layout::parts(in_layout, p), nout = layout::parts(out_layout, p);
            const uint64_t in_bytes = g.e[p][0]->bytes();  // every input part has this size
            const uint64_t out_bytes = in_bytes * nin / nout;
            Shape full = g.e[p][0]->shape;
            full[0] *= nin;
            for (int k = 0; k < nout; ++k) {
                st::OutTensor t;
                t.name = layout::tensor_name(out_layout, pout, i, p, k, grad);
                t.dtype = g.e[p][0]->dtype;
                t.shape = full;
                t.shape[0] /= nout;
                // Bytes [k·out_bytes, (k+1)·out_bytes) of the concatenated input parts.
                uint64_t a = k * out_bytes;
                const uint64_t b = a + out_bytes;
                while (a < b) {
                    const uint64_t part = in_bytes ? a / in_bytes : 0;
                    const uint64_t off = a - part * in_bytes;
                    const uint64_t n = std::min(b - a, in_bytes - off);
                    st::Piece piece;
                    piece.src = &rd;
                    piece.entry = g.e[p][part];
                    piece.offset = off;
                    piece.bytes = n;
                    t.pieces.push_back(piece);
                    a += n;
                }
                layer_names.insert(t.name);
                out.push_back(std::move(t));
            }
        }
    }
    std::vector<st::OutTensor> all;
    for (const st::Entry *e : passthrough) {
        if (layer_names.count(e->name))
            return set_error(DST_ERR_FORMAT,
                             "%s: tensor \"%s\" of '%s' is not a layer tensor of the %s layout, but the converted "
                             "layers would be written under the same name", fn, e->name.c_str(), in_path,
                             layout::layout_name(in_layout));
        st::OutTensor t;
        t.name = e->name;
        t.dtype = e->dtype;
        t.shape = e->shape;
        st::Piece piece;
        piece.src = &rd;
        piece.entry = e;
        piece.bytes = e->bytes();
        t.pieces.push_back(piece);
        all.push_back(std::move(t));
    }
    for (st::OutTensor &t : out) all.push_back(std::move(t));

    std::map<std::string, std::string> md = h.metadata;
    md["layout"] = layout::layout_name(out_layout);
    md["prefix"] = pout;
    if (out_layout == DST_LAYOUT_HF_BERT) md["format"] = kHfFormat;  // see checkpoint_save_model
    DST_TRY(st::write_file(fn, out_path, all, md));

    if (summary && summary_size > 0) {
        int layers = 0, grads = 0;
        for (const auto &kv : groups) (kv.first.first ? grads : layers)++;
        std::string dt;
        for (const std::string &d : dtypes) dt += (dt.empty() ? "" : ", ") + d;
        std::string s = "read '" + std::string(in_path) + "': " + std::to_string(layers) + " layer(s)";
        if (grads) s += " and gradients of " + std::to_string(grads) + " layer(s)";
        s += ", layout " + std::string(layout::layout_name(in_layout)) + ", prefix \"" + pin + "\"" +
             (detected ? " (detected)" : "") + ", dtype " + dt + "\n";
        s += "wrote '" + std::string(out_path) + "': layout " + layout::layout_name(out_layout) + ", prefix \"" +
             pout + "\", " + std::to_string(out.size()) + " layer tensors\n";
        s += "passed through unchanged: " + std::to_string(passthrough.size()) + " tensor(s)";
        for (size_t n = 0; n < passthrough.size() && n < 8; ++n)
            s += (n ? ", " : ": ") + passthrough[n]->name;
        if (passthrough.size() > 8) s += ", ...";
        s += "\n";
        copy_text(s, summary, summary_size, nullptr);
    }
    return DST_OK;
}

dst_status checkpoint_describe(const char *fn, const char *path, char *summary, size_t summary_size,
                               size_t *summary_len) {
    st::Reader rd;
    DST_TRY(rd.open(fn, path));
    const st::Header &h = rd.header();

    std::vector<std::pair<std::string, size_t>> dtypes;  // in order of first appearance (at most 16)
    struct Group {
        std::string prefix;
        dst_weight_layout layout;
        bool grad;
        std::set<int> layers;
        size_t tensors = 0;
    };
    std::vector<Group> groups;  // in order of first appearance
    std::map<std::tuple<std::string, int, bool>, size_t> group_index;
    size_t other = 0;
    for (const st::Entry &e : h.tensors) {
        auto d = std::find_if(dtypes.begin(), dtypes.end(), [&](const auto &x) { return x.first == e.dtype; });
        if (d == dtypes.end()) dtypes.emplace_back(e.dtype, 1);
        else ++d->second;
        // "[grad.]<prefix>layer.<i>.<suffix>": the suffix, the index and "layer." are read from the end of
        // the name, so each name is looked at a bounded number of times.
        layout::NameRef ref;
        std::string prefix;
        dst_weight_layout lay = DST_LAYOUT_DEEPSPEED;
        if (!layout::parse_name_any_prefix(e.name, &prefix, &lay, &ref)) {
            ++other;
            continue;
        }
        const auto key = std::make_tuple(prefix, static_cast<int>(lay), ref.grad);
        auto it = group_index.find(key);
        if (it == group_index.end()) {
            it = group_index.emplace(key, groups.size()).first;
            groups.push_back(Group{prefix, lay, ref.grad, {}, 0});
        }
        Group &g = groups[it->second];
        g.layers.insert(ref.layer);
        ++g.tensors;
    }

    std::string s = "file: " + std::string(path) + " (" + std::to_string(h.data_start + h.data_size) +
                    " bytes, header " + std::to_string(h.data_start - 8) + " bytes, data " +
                    std::to_string(h.data_size) + " bytes)\n";
    s += "tensors: " + std::to_string(h.tensors.size()) + "\ndtypes:";
    for (const auto &d : dtypes) s += " " + d.first + " x" + std::to_string(d.second);
    s += "\n";
    if (groups.empty()) s += "layers: none recognised\n";
    for (const Group &g : groups)
        s += "layers: " + std::to_string(g.layers.size()) + (g.grad ? " gradient sets" : "") + " (layout " +
             layout::layout_name(g.layout) + ", prefix \"" + g.prefix + "\", " + std::to_string(g.tensors) +
             " tensors)\n";
    s += "other tensors: " + std::to_string(other) + "\n";
    s += "metadata: " + std::to_string(h.metadata.size()) + " entries\n";
    for (const auto &kv : h.metadata) s += "  " + kv.first + ": " + kv.second + "\n";
    s += "tensor list (name: dtype [shape], bytes):\n";
    size_t list_bytes = 0;
    for (const st::Entry &e : h.tensors) list_bytes += e.name.size() + e.dtype.size() + 24 * e.shape.size() + 32;
    s.reserve(s.size() + list_bytes);
    char num[32];
    for (const st::Entry &e : h.tensors) {  // appended piece by piece: no temporaries per tensor
        s.append("  ").append(e.name).append(": ").append(e.dtype).append(" [");
        for (size_t d = 0; d < e.shape.size(); ++d) {
            if (d) s.append(", ");
            s.append(num, static_cast<size_t>(std::snprintf(num, sizeof num, "%lld",
                                                            static_cast<long long>(e.shape[d]))));
        }
        s.append("], ");
        s.append(num, static_cast<size_t>(std::snprintf(num, sizeof num, "%llu",
                                                        static_cast<unsigned long long>(e.bytes()))));
        s.push_back('\n');
    }
    copy_text(s, summary, summary_size, summary_len);
    return DST_OK;
}

}  // namespace dst
