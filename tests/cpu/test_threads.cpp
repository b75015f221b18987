// The threading contract of the header, as callers use it; CI also runs this binary under
// ThreadSanitizer (run.sh, build-tsan/), which reports any data race in the library:
//   - two contexts used by two threads at the same time (each with its own layers and thread count);
//   - one context handed from thread to thread (used by one thread at a time, the hand-over ordered
//     by the caller), forward on one thread, backward on the next, a checkpoint save on a third;
//   - checkpoint saves of layers of different contexts to different paths of one folder, concurrently;
//   - the calls without a handle (configuration queries, dst_last_error) from many threads at once.
// Every threaded result must equal, bit for bit, the same work done on one thread.
#include <gtest/gtest.h>

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "test_util.h"

using namespace dsttest;

namespace {

constexpr int64_t kB = 2, kS = 9, kH = 24;

dst_layer_config config(uint64_t seed) {
    dst_layer_config cfg = small_config(static_cast<int>(kH), 3, 40, DST_DTYPE_FP32);
    cfg.seed = seed;
    cfg.attn_dropout_ratio = 0.1f;
    cfg.hidden_dropout_ratio = 0.1f;
    return cfg;
}

struct Outcome {
    std::vector<unsigned char> y, dx, grads;
    bool operator==(const Outcome &o) const { return y == o.y && dx == o.dx && grads == o.grads; }
};

// `steps` training forward + backward calls of a layer on its context; returns the last results.
Outcome train(dst_context *ctx, dst_layer *layer, uint64_t data_seed, int steps) {
    Outcome r;
    Rng rng(data_seed);
    HostTensor x = HostTensor::from_doubles(DST_DTYPE_FP32, {kB, kS, kH}, rng.normals(kB * kS * kH));
    HostTensor dy = HostTensor::from_doubles(DST_DTYPE_FP32, {kB, kS, kH}, rng.normals(kB * kS * kH));
    HostTensor y(DST_DTYPE_FP32, {kB, kS, kH}), dx(DST_DTYPE_FP32, {kB, kS, kH});
    dst_tensor xv = x.view(), yv = y.view(), dyv = dy.view(), dxv = dx.view();
    EXPECT_EQ(dst_context_set_rng_state(ctx, 17, 0), DST_OK);
    for (int i = 0; i < steps; ++i) {
        EXPECT_EQ(dst_layer_forward(layer, nullptr, &xv, nullptr, &yv), DST_OK) << dst_last_error();
        EXPECT_EQ(dst_layer_backward(layer, nullptr, &dyv, &dxv, DST_GRAD_ACCUMULATE), DST_OK) << dst_last_error();
    }
    r.y = y.bytes();
    r.dx = dx.bytes();
    r.grads = grad_arena_bytes(layer);
    return r;
}

// A fresh context and layer doing `steps` steps with `threads` host threads.
Outcome fresh_run(uint64_t seed, int threads, int steps) {
    Ctx ctx = make_ctx();
    EXPECT_EQ(dst_context_set_num_threads(ctx.get(), threads), DST_OK);
    Layer layer = make_layer(ctx.get(), config(seed));
    if (!layer) return {};
    return train(ctx.get(), layer.get(), seed + 100, steps);
}

TEST(Threads, TwoContextsOnTwoThreadsAtOnce) {
    const int steps = 3;
    const Outcome ref_a = fresh_run(1, 2, steps), ref_b = fresh_run(2, 1, steps);
    ASSERT_FALSE(ref_a.y.empty());
    Outcome got_a, got_b;
    std::thread ta([&] { got_a = fresh_run(1, 2, steps); });
    std::thread tb([&] { got_b = fresh_run(2, 1, steps); });
    ta.join();
    tb.join();
    EXPECT_TRUE(got_a == ref_a) << "context A gave other results next to context B";
    EXPECT_TRUE(got_b == ref_b) << "context B gave other results next to context A";
}

std::string temp_dir() {
    std::string tmpl = ::testing::TempDir() + "dst_threads_XXXXXX";
    if (!::mkdtemp(tmpl.data())) return {};
    return tmpl;
}

TEST(Threads, OneContextHandedBetweenThreads) {
    const std::string dir = temp_dir();
    ASSERT_FALSE(dir.empty());
    // Sequential reference: forward, backward, save, on this thread.
    auto run = [&](bool threaded, const std::string &path, Outcome *out) {
        Ctx ctx = make_ctx();
        Layer layer = make_layer(ctx.get(), config(5));
        ASSERT_TRUE(layer);
        Rng rng(6);
        HostTensor x = HostTensor::from_doubles(DST_DTYPE_FP32, {kB, kS, kH}, rng.normals(kB * kS * kH));
        HostTensor y(DST_DTYPE_FP32, {kB, kS, kH}), dx(DST_DTYPE_FP32, {kB, kS, kH});
        dst_tensor xv = x.view(), yv = y.view(), dxv = dx.view();
        auto forward = [&] {
            EXPECT_EQ(dst_context_set_rng_state(ctx.get(), 3, 9), DST_OK);
            EXPECT_EQ(dst_layer_forward(layer.get(), nullptr, &xv, nullptr, &yv), DST_OK) << dst_last_error();
        };
        auto backward = [&] {
            EXPECT_EQ(dst_layer_backward(layer.get(), nullptr, &xv, &dxv, DST_GRAD_WRITE), DST_OK) << dst_last_error();
        };
        dst_layer *l = layer.get();
        auto save = [&] { EXPECT_EQ(dst_checkpoint_save(&l, 1, path.c_str(), nullptr), DST_OK) << dst_last_error(); };
        if (threaded) {
            // Each join hands the context to the next thread.
            std::thread(forward).join();
            std::thread(backward).join();
            std::thread(save).join();
        } else {
            forward();
            backward();
            save();
        }
        out->y = y.bytes();
        out->dx = dx.bytes();
        out->grads = grad_arena_bytes(layer.get());
    };
    Outcome ref, got;
    run(false, dir + "/ref.safetensors", &ref);
    run(true, dir + "/got.safetensors", &got);
    EXPECT_TRUE(got == ref);
    std::FILE *a = std::fopen((dir + "/ref.safetensors").c_str(), "rb");
    std::FILE *b = std::fopen((dir + "/got.safetensors").c_str(), "rb");
    ASSERT_TRUE(a && b);
    std::vector<char> ba(1 << 20), bb(1 << 20);
    const size_t na = std::fread(ba.data(), 1, ba.size(), a), nb = std::fread(bb.data(), 1, bb.size(), b);
    std::fclose(a);
    std::fclose(b);
    EXPECT_EQ(na, nb);
    EXPECT_TRUE(std::equal(ba.begin(), ba.begin() + static_cast<long>(na), bb.begin())) << "the saved files differ";
    std::remove((dir + "/ref.safetensors").c_str());
    std::remove((dir + "/got.safetensors").c_str());
    ::rmdir(dir.c_str());
}

TEST(Threads, ConcurrentCheckpointSavesToDifferentPaths) {
    const std::string dir = temp_dir();
    ASSERT_FALSE(dir.empty());
    const int n = 4, rounds = 3;
    std::vector<Ctx> ctxs;
    std::vector<Layer> layers;
    for (int i = 0; i < n; ++i) {
        ctxs.push_back(make_ctx());
        layers.push_back(make_layer(ctxs.back().get(), config(10 + static_cast<uint64_t>(i))));
        ASSERT_TRUE(layers.back());
    }
    std::vector<std::thread> ts;
    for (int i = 0; i < n; ++i)
        ts.emplace_back([&, i] {
            dst_layer *l = layers[static_cast<size_t>(i)].get();
            const std::string path = dir + "/layer" + std::to_string(i) + ".safetensors";
            dst_checkpoint_options o;
            EXPECT_EQ(dst_checkpoint_options_default(&o), DST_OK);
            const std::string state = "writer " + std::to_string(i);
            o.client_state = state.c_str();
            for (int r = 0; r < rounds; ++r)
                EXPECT_EQ(dst_checkpoint_save(&l, 1, path.c_str(), &o), DST_OK) << dst_last_error();
            size_t len = 0;
            std::vector<char> d(1 << 12);
            EXPECT_EQ(dst_checkpoint_describe(path.c_str(), d.data(), d.size(), &len), DST_OK) << dst_last_error();
        });
    for (std::thread &t : ts) t.join();
    // Each file holds its own layer and client state; no temporary file is left.
    for (int i = 0; i < n; ++i) {
        const std::string path = dir + "/layer" + std::to_string(i) + ".safetensors";
        Ctx c = make_ctx();
        Layer back = make_layer(c.get(), config(99));
        dst_layer *l = back.get();
        char state[32];
        size_t len = 0;
        ASSERT_EQ(dst_checkpoint_load(&l, 1, path.c_str(), nullptr, state, sizeof state, &len), DST_OK)
            << dst_last_error();
        EXPECT_EQ(std::string(state, len), "writer " + std::to_string(i));
        for (const char *name : kParamNames)
            EXPECT_TRUE(bit_equal(get_param(l, name), get_param(layers[static_cast<size_t>(i)].get(), name))) << name;
        std::remove(path.c_str());
    }
    EXPECT_EQ(::rmdir(dir.c_str()), 0) << "a temporary file was left in " << dir;
}

TEST(Threads, CallsWithoutAHandleFromManyThreads) {
    std::vector<std::thread> ts;
    for (int i = 0; i < 6; ++i)
        ts.emplace_back([i] {
            static const int kBadHeads[] = {5, 7, 9, 10, 11, 13};  // none divides hidden_size 24
            const int bad = kBadHeads[i];
            dst_layer_config cfg = config(static_cast<uint64_t>(i));
            for (int k = 0; k < 50; ++k) {
                size_t bytes = 0;
                EXPECT_EQ(dst_layer_config_saved_bytes(&cfg, 2, 8 + i, &bytes), DST_OK);
                EXPECT_EQ(dst_layer_config_validate(&cfg, DST_BACKEND_CPU), DST_OK);
                // A failure on this thread leaves its own message, never another thread's.
                cfg.heads = bad;
                EXPECT_EQ(dst_layer_config_validate(&cfg, DST_BACKEND_CPU), DST_ERR_INVALID_ARGUMENT);
                EXPECT_NE(std::string(dst_last_error()).find("(" + std::to_string(bad) + ")"), std::string::npos)
                    << dst_last_error();
                cfg.heads = 3;
            }
        });
    for (std::thread &t : ts) t.join();
}

}  // namespace
