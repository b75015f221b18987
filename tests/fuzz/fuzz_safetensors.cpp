// libFuzzer target over the checkpoint reader: every input is taken as the bytes of a safetensors
// file, written to a temporary file, then
//   - loaded with dst_checkpoint_load into a stack of two small Post-LN layers (fp32 and bf16,
//     H = 8, 2 heads, I = 16) in the DeepSpeed layout (with and without gradients) and the Hugging
//     Face layout (prefix detection), and
//   - converted with dst_checkpoint_convert in both directions, and
//   - described with dst_checkpoint_describe (a buffer smaller than most descriptions).
// Any crash, sanitizer report or leak is a bug; every status is fine. A failed load must leave the
// layers unchanged, which the target checks too (it aborts otherwise).
//
// The corpus lives in the repository (tests/fuzz/corpus/): checkpoints of these layers (one with a binary
// client state, stored base64-encoded) and small hand-made headers at the edges the reader checks (many
// tensors, deep nesting, duplicate keys, long layer-like names, overlapping offsets). Regenerate the seeds
// with
//   DST_FUZZ_WRITE_SEEDS=tests/fuzz/corpus ./fuzz_safetensors
// CI runs the target for a bounded time (tests/fuzz/CMakeLists.txt) from that corpus and keeps what it
// finds in the build folder; `ninja fuzz_corpus_merge` minimises those finds into tests/fuzz/corpus/ to be
// committed. The training engine's JSON configurations are not part of the library yet: when they are,
// they get a target and a corpus of their own beside this one.
//
// Any input that once crashed or hung the reader belongs in the corpus too.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include <unistd.h>

#include "dstransformer/dstransformer.h"

namespace {

dst_context *g_ctx = nullptr;
dst_layer *g_layers[2] = {nullptr, nullptr};
std::string g_dir, g_in, g_out;

void check(dst_status s, const char *what) {
    if (s != DST_OK) {
        std::fprintf(stderr, "fuzz_safetensors: %s failed: %s: %s\n", what, dst_status_string(s), dst_last_error());
        std::abort();
    }
}

std::vector<char> arena_copy(dst_layer *L, bool grads) {
    size_t bytes = 0;
    void *arena = nullptr;
    check(dst_layer_arena_bytes(L, &bytes), "dst_layer_arena_bytes");
    check(grads ? dst_layer_grad_arena(L, &arena) : dst_layer_param_arena(L, &arena), "arena");
    std::vector<char> v(bytes);
    check(dst_memcpy(g_ctx, v.data(), arena, bytes, DST_COPY_CONTEXT_TO_HOST), "dst_memcpy");
    return v;
}

void cleanup() {
    for (dst_layer *&L : g_layers) {
        dst_layer_destroy(L);
        L = nullptr;
    }
    dst_context_destroy(g_ctx);
    g_ctx = nullptr;
    if (!g_dir.empty()) {
        ::unlink(g_in.c_str());
        ::unlink(g_out.c_str());
        ::rmdir(g_dir.c_str());
    }
}

void write_seeds(const char *dir) {
    dst_checkpoint_options o;
    check(dst_checkpoint_options_default(&o), "options");
    const std::string d(dir);
    o.client_state = "step=1";
    check(dst_checkpoint_save(g_layers, 2, (d + "/ds_two_layers.safetensors").c_str(), &o), "save ds");
    o.include_grads = 1;
    o.save_dtype = DST_DTYPE_FP16;
    check(dst_checkpoint_save(g_layers, 2, (d + "/ds_grads_fp16.safetensors").c_str(), &o), "save ds grads");
    o.include_grads = 0;
    o.save_dtype = -1;
    o.layout = DST_LAYOUT_HF_BERT;
    o.prefix = "bert.encoder.";
    check(dst_checkpoint_save(g_layers, 1, (d + "/hf_one_layer.safetensors").c_str(), &o), "save hf");
    o.layout = DST_LAYOUT_DEEPSPEED;
    o.prefix = nullptr;
    const char state[] = "\xff\x00step=\x80";
    o.client_state = state;
    o.client_state_len = sizeof state - 1;
    check(dst_checkpoint_save(g_layers, 2, (d + "/ds_binary_state.safetensors").c_str(), &o), "save binary state");

    // Hand-made headers: [u64 length][JSON][data].
    auto raw = [&](const char *name, const std::string &json, size_t data_bytes) {
        std::string bytes(8, '\0');
        for (int i = 0; i < 8; ++i) bytes[i] = static_cast<char>((uint64_t(json.size()) >> (8 * i)) & 0xff);
        bytes += json;
        bytes.append(data_bytes, '\0');
        FILE *f = std::fopen((d + "/" + name).c_str(), "wb");
        if (!f || std::fwrite(bytes.data(), 1, bytes.size(), f) != bytes.size()) std::abort();
        std::fclose(f);
    };
    const std::string t = "{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":";
    std::string many = "{";
    for (int i = 0; i < 64; ++i)
        many += (i ? ",\"" : "\"") + std::string(i % 2 ? "p" : "grad.q") + std::to_string(i) + ".layer." +
                std::to_string(i % 3) + ".norm_b\":" + t + "[" + std::to_string(4 * i) + "," + std::to_string(4 * i + 4) + "]}";
    raw("many_tensors.safetensors", many + "}", 4 * 64);
    raw("deep_json.safetensors", "{\"x\":{\"a\":[[[[[[[1]]]]]]]},\"__metadata__\":{\"k\":\"v\"}}", 0);
    raw("duplicate_key.safetensors", "{\"x\":" + t + "[0,4]},\"x\":" + t + "[4,8]}}", 8);
    raw("overlap.safetensors", "{\"a\":" + t + "[0,4]},\"b\":{\"dtype\":\"F16\",\"shape\":[2],\"data_offsets\":[2,6]}}", 8);
    std::string name;
    while (name.size() < 512) name += "layer.7.";
    raw("long_name.safetensors", "{\"" + name + "attn_qkvw\":" + t + "[0,4]},\"__metadata__\":{\"client_state_base64\":\"/w==\"}}", 4);
    std::printf("fuzz_safetensors: wrote 9 seeds into %s\n", dir);
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int *, char ***) {
    check(dst_context_create(DST_BACKEND_CPU, 0, &g_ctx), "dst_context_create");
    check(dst_context_set_num_threads(g_ctx, 1), "dst_context_set_num_threads");
    const dst_dtype dts[2] = {DST_DTYPE_FP32, DST_DTYPE_BF16};
    for (int i = 0; i < 2; ++i) {
        dst_layer_config cfg;
        check(dst_layer_config_default(&cfg), "dst_layer_config_default");
        cfg.hidden_size = 8;
        cfg.heads = 2;
        cfg.intermediate_size = 16;
        cfg.pre_layer_norm = 0;
        cfg.dtype = dts[i];
        cfg.max_batch_tokens = 16;
        cfg.max_seq_len = 8;
        cfg.seed = 7 + i;
        check(dst_layer_create(g_ctx, &cfg, &g_layers[i]), "dst_layer_create");
    }
    std::atexit(cleanup);
    if (const char *seeds = std::getenv("DST_FUZZ_WRITE_SEEDS")) {
        write_seeds(seeds);
        std::exit(0);
    }
    char tmpl[] = "/tmp/dst_fuzz_XXXXXX";
    if (!::mkdtemp(tmpl)) {
        std::perror("fuzz_safetensors: mkdtemp");
        std::abort();
    }
    g_dir = tmpl;
    g_in = g_dir + "/in.safetensors";
    g_out = g_dir + "/out.safetensors";
    return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    FILE *f = std::fopen(g_in.c_str(), "wb");
    if (!f) std::abort();
    if (size && std::fwrite(data, 1, size, f) != size) std::abort();
    std::fclose(f);

    dst_checkpoint_options o;
    check(dst_checkpoint_options_default(&o), "options");
    char client[16];
    size_t client_len = 0;
    for (int variant = 0; variant < 3; ++variant) {
        const std::vector<char> p0 = arena_copy(g_layers[0], false), p1 = arena_copy(g_layers[1], false);
        const std::vector<char> g0 = arena_copy(g_layers[0], true), g1 = arena_copy(g_layers[1], true);
        uint64_t seed0 = 0, off0 = 0;
        check(dst_context_get_rng_state(g_ctx, &seed0, &off0), "dst_context_get_rng_state");
        o.include_grads = variant == 1;
        o.layout = variant == 2 ? DST_LAYOUT_HF_BERT : DST_LAYOUT_DEEPSPEED;
        const int n = variant == 2 ? 1 : 2;
        const dst_status s = dst_checkpoint_load(g_layers, n, g_in.c_str(), &o, client, sizeof client, &client_len);
        if (s == DST_OK) {
            if (std::strlen(client) >= sizeof client) std::abort();
        } else {
            // All-or-nothing: a failed load changed nothing.
            uint64_t seed = 0, off = 0;
            check(dst_context_get_rng_state(g_ctx, &seed, &off), "dst_context_get_rng_state");
            if (arena_copy(g_layers[0], false) != p0 || arena_copy(g_layers[1], false) != p1 ||
                arena_copy(g_layers[0], true) != g0 || arena_copy(g_layers[1], true) != g1 || seed != seed0 ||
                off != off0) {
                std::fprintf(stderr, "fuzz_safetensors: a failed load changed the layers: %s\n", dst_last_error());
                std::abort();
            }
        }
    }
    char summary[256];
    (void)dst_checkpoint_convert(g_in.c_str(), DST_LAYOUT_DEEPSPEED, nullptr, g_out.c_str(), DST_LAYOUT_HF_BERT,
                                 nullptr, summary, sizeof summary);
    (void)dst_checkpoint_convert(g_in.c_str(), DST_LAYOUT_HF_BERT, nullptr, g_out.c_str(), DST_LAYOUT_DEEPSPEED,
                                 "x.", summary, sizeof summary);
    size_t len = 0;
    (void)dst_checkpoint_describe(g_in.c_str(), summary, sizeof summary, &len);
    return 0;
}
