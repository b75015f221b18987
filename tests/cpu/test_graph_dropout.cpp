// The graph dropout stream (kernels/philox.h, docs/rng.md): a training forward captured into a CUDA
// graph draws its dropout sites under key graph_dropout_seed(seed), offsets {k, word}, the word taken
// from the context's device counter as the call runs, and its backward regenerates the masks from the
// word kept with the saved activations. The CPU backend cannot capture, so these tests turn on the
// context's test switch that makes every training forward draw that way (white-box: links the static
// library) and check the whole path against ordinary calls whose host RNG state names the same
// counters: bit for bit, forward and backward, padded and packed. The CUDA tests capture real graphs
// (tests/cuda/test_cuda_layer.cpp, CudaLayerGraphs).
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "capi/handles.h"
#include "kernels/philox.h"
#include "test_util.h"
#include "../common/scratch_dir.h"

using namespace dsttest;

namespace {

constexpr int64_t B = 3, S = 7;
constexpr uint64_t kSeed = 0x1234ABCDull;

dst_layer_config dropout_config(int pre) {
    dst_layer_config cfg = small_config(24, 4, 40, DST_DTYPE_FP32);
    cfg.pre_layer_norm = pre;
    cfg.attn_dropout_ratio = 0.2f;
    cfg.hidden_dropout_ratio = 0.15f;
    return cfg;
}

struct Step {
    std::vector<unsigned char> y, dx, grads;
};

// The layer, its inputs and a context; `graph`: the context's training forwards draw as captured ones.
struct Rig {
    Ctx ctx = make_ctx();
    Layer layer;
    HostTensor x{DST_DTYPE_FP32, {B, S, 24}}, dy{DST_DTYPE_FP32, {B, S, 24}}, lens{DST_DTYPE_INT32, {B}};
    Rig(int pre, bool graph) {
        layer = make_layer(ctx.get(), dropout_config(pre));
        randomize_params(layer.get(), 17);
        Rng rng(5);
        x = HostTensor::from_doubles(DST_DTYPE_FP32, {B, S, 24}, rng.normals(B * S * 24));
        dy = HostTensor::from_doubles(DST_DTYPE_FP32, {B, S, 24}, rng.normals(B * S * 24));
        const int32_t len[B] = {7, 3, 5};
        for (int b = 0; b < B; ++b) reinterpret_cast<int32_t *>(lens.data())[b] = len[b];
        ctx->impl->graph_rng_eager = graph;
        EXPECT_EQ(dst_context_set_rng_state(ctx.get(), kSeed, 0), DST_OK);
    }
    dst_status forward(dst_saved *saved, HostTensor &y) {
        dst_tensor xv = x.view(), yv = y.view();
        const dst_mask m = mask_of(DST_MASK_KEY_LENGTHS, lens);
        return dst_layer_forward(layer.get(), saved, &xv, &m, &yv);
    }
    Step backward(dst_saved *saved, const HostTensor &y) {
        HostTensor dx(DST_DTYPE_FP32, {B, S, 24});
        dx.poison();
        dst_tensor dyv = dy.view(), dxv = dx.view();
        EXPECT_EQ(dst_layer_backward(layer.get(), saved, &dyv, &dxv, DST_GRAD_WRITE), DST_OK) << dst_last_error();
        return Step{y.bytes(), dx.bytes(), grad_arena_bytes(layer.get())};
    }
    Step step(dst_saved *saved = nullptr) {
        HostTensor y(DST_DTYPE_FP32, {B, S, 24});
        y.poison();
        EXPECT_EQ(forward(saved, y), DST_OK) << dst_last_error();
        return backward(saved, y);
    }
};

// An ordinary (host-offset) step drawing what the graph stream draws with counter word `word`.
Step reference_step(int pre, uint32_t word) {
    Rig r(pre, false);
    EXPECT_EQ(dst_context_set_rng_state(r.ctx.get(), dst::graph_dropout_seed(kSeed), uint64_t(word) << 32), DST_OK);
    return r.step();
}

void expect_same(const Step &a, const Step &b, const char *what) {
    EXPECT_EQ(a.y, b.y) << what << ": output";
    EXPECT_EQ(a.dx, b.dx) << what << ": input gradient";
    EXPECT_EQ(a.grads, b.grads) << what << ": parameter gradients";
}

class GraphDropout : public ::testing::TestWithParam<int> {};

// Each run takes the next counter word: run n draws exactly what key graph_dropout_seed(seed), offsets
// {0, 1, 2} + n·2^32 draw; the host offset does not move.
TEST_P(GraphDropout, EachRunTakesTheNextWord) {
    const int pre = GetParam();
    Rig g(pre, true);
    const Step s0 = g.step(), s1 = g.step(), s2 = g.step();
    expect_same(s0, reference_step(pre, 0), "run 0");
    expect_same(s1, reference_step(pre, 1), "run 1");
    expect_same(s2, reference_step(pre, 2), "run 2");
    EXPECT_NE(s0.y, s1.y) << "two runs drew the same masks";
    uint64_t seed = 0, offset = 99;
    ASSERT_EQ(dst_context_get_rng_state(g.ctx.get(), &seed, &offset), DST_OK);
    EXPECT_EQ(seed, kSeed);
    EXPECT_EQ(offset, 0u) << "graph-drawn forwards take no host offsets";
    // And the stream is not the host one: an ordinary first step draws other masks.
    Rig h(pre, false);
    EXPECT_NE(h.step().y, s0.y);
}

// The word lives with the saved activations: two forwards into two saved objects, then their
// backwards in either order, each regenerating its own forward's masks.
TEST_P(GraphDropout, BackwardReadsTheWordItsForwardTook) {
    const int pre = GetParam();
    Rig g(pre, true);
    Saved a = make_saved(g.layer.get()), b = make_saved(g.layer.get());
    HostTensor ya(DST_DTYPE_FP32, {B, S, 24}), yb(DST_DTYPE_FP32, {B, S, 24});
    ASSERT_EQ(g.forward(a.get(), ya), DST_OK) << dst_last_error();
    ASSERT_EQ(g.forward(b.get(), yb), DST_OK) << dst_last_error();
    const Step sb = g.backward(b.get(), yb), sa = g.backward(a.get(), ya);
    expect_same(sa, reference_step(pre, 0), "first forward, second backward");
    expect_same(sb, reference_step(pre, 1), "second forward, first backward");
    // An ordinary forward into `a` afterwards goes back to the host stream for that object.
    g.ctx->impl->graph_rng_eager = false;
    const Step host = g.step(a.get());
    Rig h(pre, false);
    expect_same(host, h.step(), "host-stream step after graph-drawn ones");
}

// dst_context_set_rng_state resets the counter: the runs after it repeat the first ones.
TEST_P(GraphDropout, SetRngStateResetsTheCounter) {
    const int pre = GetParam();
    Rig g(pre, true);
    const Step s0 = g.step();
    g.step();
    ASSERT_EQ(dst_context_set_rng_state(g.ctx.get(), kSeed, 0), DST_OK);
    expect_same(g.step(), s0, "first run after the reset");
}

// Packed calls draw the elements of their padded places from the same stream.
TEST_P(GraphDropout, PackedCallsDrawTheSameStream) {
    const int pre = GetParam();
    auto packed_step = [&](Rig &r) {
        const int32_t len[B] = {7, 3, 5};
        const int64_t N = 15;
        std::vector<double> xs(static_cast<size_t>(N * 24)), dys(xs.size());
        const std::vector<double> xd = r.x.doubles(), dyd = r.dy.doubles();
        HostTensor cu(DST_DTYPE_INT32, {B + 1});
        int32_t *c = reinterpret_cast<int32_t *>(cu.data());
        c[0] = 0;
        for (int b = 0, row = 0; b < B; ++b) {
            for (int i = 0; i < len[b]; ++i, ++row)
                for (int j = 0; j < 24; ++j) {
                    xs[size_t(row) * 24 + j] = xd[(size_t(b) * S + i) * 24 + j];
                    dys[size_t(row) * 24 + j] = dyd[(size_t(b) * S + i) * 24 + j];
                }
            c[b + 1] = c[b] + len[b];
        }
        HostTensor x = HostTensor::from_doubles(DST_DTYPE_FP32, {N, 24}, xs);
        HostTensor dy = HostTensor::from_doubles(DST_DTYPE_FP32, {N, 24}, dys);
        HostTensor y(DST_DTYPE_FP32, {N, 24}), dx(DST_DTYPE_FP32, {N, 24});
        dst_tensor xv = x.view(), yv = y.view(), dyv = dy.view(), dxv = dx.view(), cv = cu.view();
        EXPECT_EQ(dst_layer_forward_packed(r.layer.get(), nullptr, &xv, &cv, S, &yv), DST_OK) << dst_last_error();
        EXPECT_EQ(dst_layer_backward_packed(r.layer.get(), nullptr, &dyv, &dxv, DST_GRAD_WRITE), DST_OK)
            << dst_last_error();
        return Step{y.bytes(), dx.bytes(), grad_arena_bytes(r.layer.get())};
    };
    Rig g(pre, true);
    const Step s0 = packed_step(g), s1 = packed_step(g);
    for (uint32_t word : {0u, 1u}) {
        Rig h(pre, false);
        ASSERT_EQ(dst_context_set_rng_state(h.ctx.get(), dst::graph_dropout_seed(kSeed), uint64_t(word) << 32),
                  DST_OK);
        expect_same(word ? s1 : s0, packed_step(h), word ? "packed run 1" : "packed run 0");
    }
}

// The counter through the C API: 0 before the context has one, one more per graph-drawn forward, set
// to any 32-bit word (the next run draws that word), back to 0 with dst_context_set_rng_state; bad
// arguments refused with the state unchanged.
TEST_P(GraphDropout, CounterReadAndSetThroughTheApi) {
    const int pre = GetParam();
    Rig g(pre, true);
    uint64_t counter = 99;
    ASSERT_EQ(dst_context_get_rng_graph_counter(g.ctx.get(), &counter), DST_OK) << dst_last_error();
    EXPECT_EQ(counter, 0u) << "a context without a counter";
    g.step();
    g.step();
    ASSERT_EQ(dst_context_get_rng_graph_counter(g.ctx.get(), &counter), DST_OK) << dst_last_error();
    EXPECT_EQ(counter, 2u);
    ASSERT_EQ(dst_context_set_rng_graph_counter(g.ctx.get(), 0xFFFFFFFFull), DST_OK) << dst_last_error();
    expect_same(g.step(), reference_step(pre, 0xFFFFFFFFu), "the run after setting the counter to 2^32 - 1");
    ASSERT_EQ(dst_context_get_rng_graph_counter(g.ctx.get(), &counter), DST_OK);
    EXPECT_EQ(counter, 0u) << "the word wraps";
    ASSERT_EQ(dst_context_set_rng_graph_counter(g.ctx.get(), 7), DST_OK);
    EXPECT_EQ(dst_context_set_rng_graph_counter(g.ctx.get(), uint64_t(1) << 32), DST_ERR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(dst_last_error()).find("counter"), std::string::npos) << dst_last_error();
    EXPECT_EQ(dst_context_set_rng_graph_counter(nullptr, 1), DST_ERR_INVALID_ARGUMENT);
    EXPECT_EQ(dst_context_get_rng_graph_counter(nullptr, &counter), DST_ERR_INVALID_ARGUMENT);
    EXPECT_EQ(dst_context_get_rng_graph_counter(g.ctx.get(), nullptr), DST_ERR_INVALID_ARGUMENT);
    ASSERT_EQ(dst_context_get_rng_graph_counter(g.ctx.get(), &counter), DST_OK);
    EXPECT_EQ(counter, 7u) << "a refused call changed the counter";
    ASSERT_EQ(dst_context_set_rng_state(g.ctx.get(), kSeed, 0), DST_OK);
    ASSERT_EQ(dst_context_get_rng_graph_counter(g.ctx.get(), &counter), DST_OK);
    EXPECT_EQ(counter, 0u) << "dst_context_set_rng_state resets the counter";
    // Setting a counter on a context that has none makes it.
    Rig fresh(pre, true);
    ASSERT_EQ(dst_context_set_rng_graph_counter(fresh.ctx.get(), 5), DST_OK) << dst_last_error();
    expect_same(fresh.step(), reference_step(pre, 5), "the first run of a fresh context set to word 5");
}

// A checkpoint stores the counter with the RNG state: two runs, save, load into a fresh context, and
// the next run draws what the third run of an uninterrupted sequence draws.
TEST_P(GraphDropout, CheckpointsResumeTheCounter) {
    const int pre = GetParam();
    const std::string path = dst_test::scratch_path("graph_dropout_" + std::to_string(pre) + ".safetensors");
    dst_checkpoint_options o;
    ASSERT_EQ(dst_checkpoint_options_default(&o), DST_OK);
    {
        Rig g(pre, true);
        g.step();
        g.step();
        dst_layer *l = g.layer.get();
        ASSERT_EQ(dst_checkpoint_save(&l, 1, path.c_str(), &o), DST_OK) << dst_last_error();
    }
    Rig r(pre, true);
    ASSERT_EQ(dst_context_set_rng_state(r.ctx.get(), 1, 1), DST_OK);
    dst_layer *l = r.layer.get();
    ASSERT_EQ(dst_checkpoint_load(&l, 1, path.c_str(), &o, nullptr, 0, nullptr), DST_OK) << dst_last_error();
    uint64_t counter = 0;
    ASSERT_EQ(dst_context_get_rng_graph_counter(r.ctx.get(), &counter), DST_OK);
    EXPECT_EQ(counter, 2u);
    expect_same(r.step(), reference_step(pre, 2), "the first run after the load");
    std::remove(path.c_str());
}

INSTANTIATE_TEST_SUITE_P(PreAndPostLn, GraphDropout, ::testing::Values(1, 0),
                         [](const ::testing::TestParamInfo<int> &i) { return i.param ? "PreLN" : "PostLN"; });

}  // namespace
