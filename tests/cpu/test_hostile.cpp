// Calls a hostile caller makes, each once a defect (issue 10): a thread count that crashed OpenMP, binding
// a layer's own arena back to it, allocation sizes whose alignment round-up overflowed, and an RNG offset
// that wrapped past 2^64. Each must fail with a clear status and a message naming the argument, and change
// nothing of the caller's (buffers, layer, RNG state).
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "test_util.h"

using namespace dsttest;

namespace {

bool says(const char *needle) { return std::string(dst_last_error()).find(needle) != std::string::npos; }

// A small layer with an input ready; `out` is poisoned so that any write shows.
struct Rig {
    static constexpr int64_t B = 2, S = 5, H = 16;
    Ctx ctx = make_ctx();
    Layer layer;
    HostTensor x, y;
    Rig() {
        dst_layer_config cfg = small_config(16, 4, 0, DST_DTYPE_FP32);
        layer = make_layer(ctx.get(), cfg);
        randomize_params(layer.get(), 3);
        x = HostTensor::from_doubles(DST_DTYPE_FP32, {B, S, H}, Rng(4).normals(B * S * H));
        y = HostTensor(DST_DTYPE_FP32, {B, S, H});
        y.poison();
    }
    dst_status forward(dst_saved *saved = nullptr) {
        dst_tensor xv = x.view(), yv = y.view();
        return dst_layer_forward(layer.get(), saved, &xv, nullptr, &yv);
    }
};

// Item 1: dst_context_set_num_threads(ctx, 1 << 20) returned DST_OK and the next forward overflowed the
// stack inside OpenMP. Counts above DST_MAX_NUM_THREADS are refused and leave the count as it was.
TEST(Hostile, ThreadCountIsBounded) {
    Rig r;
    DST_ASSERT_OK(dst_context_set_num_threads(r.ctx.get(), 2));
    for (int bad : {1 << 20, DST_MAX_NUM_THREADS + 1, 0x7fffffff}) {
        SCOPED_TRACE(bad);
        EXPECT_EQ(dst_context_set_num_threads(r.ctx.get(), bad), DST_ERR_INVALID_ARGUMENT);
        EXPECT_TRUE(says("threads")) << dst_last_error();
        EXPECT_TRUE(says(std::to_string(DST_MAX_NUM_THREADS).c_str())) << dst_last_error();
        int t = 0;
        DST_ASSERT_OK(dst_context_get_num_threads(r.ctx.get(), &t));
        EXPECT_EQ(t, 2) << "a refused count changed the context";
    }
    // The largest accepted count runs.
    DST_ASSERT_OK(dst_context_set_num_threads(r.ctx.get(), DST_MAX_NUM_THREADS));
    DST_ASSERT_OK(r.forward());
    int t = 0;
    DST_ASSERT_OK(dst_context_get_num_threads(r.ctx.get(), &t));
    EXPECT_EQ(t, DST_MAX_NUM_THREADS);
}

// Item 2: binding the layer's own parameter arena (or a range inside it) freed the arena and then read
// freed memory. Any overlap with the layer's current arenas is refused, and the layer keeps working.
TEST(Hostile, BindingTheLayersOwnArenaIsRefused) {
    Rig r;
    DST_ASSERT_OK(dst_layer_set_training(r.layer.get(), 0));  // no dropout: equal parameters, equal output
    size_t bytes = 0;
    void *params = nullptr, *grads = nullptr;
    DST_ASSERT_OK(dst_layer_arena_bytes(r.layer.get(), &bytes));
    DST_ASSERT_OK(dst_layer_param_arena(r.layer.get(), &params));
    DST_ASSERT_OK(dst_layer_grad_arena(r.layer.get(), &grads));
    const std::vector<unsigned char> pbefore = param_arena_bytes(r.layer.get());
    DST_ASSERT_OK(r.forward());
    const std::vector<unsigned char> y_ref = r.y.bytes();
    char *p = static_cast<char *>(params), *g = static_cast<char *>(grads);
    struct Try {
        const char *what;
        char *data;
        bool grad_arena;  // bind as the gradient arena
    };
    const Try tries[] = {
        {"its own parameter arena", p, false},
        {"its own parameter arena, one block in", p + 256, false},
        {"a range that starts before the arena and runs into it", p - 256, false},
        {"its gradient arena, one block in", g + 256, false},
        {"its own gradient arena as the gradient arena", g, true},
        {"the parameter arena as the gradient arena", p, true},
        {"the parameter arena, one block in, as the gradient arena", p + 256, true},
    };
    for (const Try &t : tries) {
        SCOPED_TRACE(t.what);
        for (int copy : {0, 1}) {
            const dst_status st = t.grad_arena ? dst_layer_bind_grad_arena(r.layer.get(), t.data, bytes)
                                               : dst_layer_bind_param_arena(r.layer.get(), t.data, bytes, copy);
            EXPECT_EQ(st, DST_ERR_INVALID_ARGUMENT);
            EXPECT_TRUE(says("data")) << dst_last_error();
            EXPECT_TRUE(says("overlaps")) << dst_last_error();
        }
        void *now = nullptr;
        DST_ASSERT_OK(dst_layer_param_arena(r.layer.get(), &now));
        EXPECT_EQ(now, params);
        DST_ASSERT_OK(dst_layer_grad_arena(r.layer.get(), &now));
        EXPECT_EQ(now, grads);
    }
    EXPECT_EQ(param_arena_bytes(r.layer.get()), pbefore);
    r.y.poison();
    DST_ASSERT_OK(r.forward());
    EXPECT_EQ(r.y.bytes(), y_ref) << "the layer changed after the refused binds";

    // A caller-owned arena may be bound again (nothing is freed), but not a range overlapping it.
    std::vector<unsigned char> mem(2 * bytes + 512);
    char *base = reinterpret_cast<char *>((reinterpret_cast<uintptr_t>(mem.data()) + 255) & ~uintptr_t(255));
    DST_ASSERT_OK(dst_layer_bind_param_arena(r.layer.get(), base, bytes, 1));
    DST_ASSERT_OK(dst_layer_bind_param_arena(r.layer.get(), base, bytes, 1));
    EXPECT_EQ(dst_layer_bind_param_arena(r.layer.get(), base + 256, bytes, 1), DST_ERR_INVALID_ARGUMENT);
    EXPECT_TRUE(says("overlaps")) << dst_last_error();
    r.y.poison();
    DST_ASSERT_OK(r.forward());
    EXPECT_EQ(r.y.bytes(), y_ref);
}

// Item 3: dst_malloc(ctx, SIZE_MAX, &p) returned DST_OK with a tiny buffer (the 256-byte round-up
// overflowed). Sizes no allocation can hold fail with DST_ERR_OUT_OF_MEMORY and leave *ptr NULL.
TEST(Hostile, MallocSizesNearSizeMaxFail) {
    Ctx ctx = make_ctx();
    for (size_t bytes : {SIZE_MAX, SIZE_MAX - 1, SIZE_MAX - 255, SIZE_MAX - 256, SIZE_MAX / 2 + 1}) {
        SCOPED_TRACE(bytes);
        void *ptr = reinterpret_cast<void *>(uintptr_t(0x1234));
        EXPECT_EQ(dst_malloc(ctx.get(), bytes, &ptr), DST_ERR_OUT_OF_MEMORY);
        EXPECT_EQ(ptr, nullptr);
        EXPECT_TRUE(says("bytes")) << dst_last_error();
    }
    void *ok = nullptr;
    DST_ASSERT_OK(dst_malloc(ctx.get(), 4096, &ok));
    ASSERT_NE(ok, nullptr);
    std::memset(ok, 0x5A, 4096);  // the whole size is usable
    dst_free(ctx.get(), ok);
}

// Item 7: the RNG offset wrapped past 2^64 after dst_context_set_rng_state(ctx, s, UINT64_MAX - 1) and a
// training forward, silently reusing the masks of offset 0. A forward that needs offsets the counter
// cannot hold fails with DST_ERR_STATE and changes nothing; inference draws nothing and still runs.
TEST(Hostile, RngOffsetExhaustionIsAnError) {
    Rig r;
    Saved saved = make_saved(r.layer.get());
    // The last offsets that fit: the forward takes three and leaves UINT64_MAX.
    DST_ASSERT_OK(dst_context_set_rng_state(r.ctx.get(), 5, UINT64_MAX - 3));
    DST_ASSERT_OK(r.forward(saved.get()));
    uint64_t seed = 0, off = 0;
    DST_ASSERT_OK(dst_context_get_rng_state(r.ctx.get(), &seed, &off));
    EXPECT_EQ(off, UINT64_MAX);
    size_t kept = 0;
    DST_ASSERT_OK(dst_saved_bytes(saved.get(), &kept));
    ASSERT_GT(kept, 0u);

    for (uint64_t start : {UINT64_MAX - 2, UINT64_MAX - 1, UINT64_MAX}) {
        SCOPED_TRACE(start);
        DST_ASSERT_OK(dst_context_set_rng_state(r.ctx.get(), 5, start));
        r.y.poison();
        const std::vector<unsigned char> poisoned = r.y.bytes();
        EXPECT_EQ(r.forward(saved.get()), DST_ERR_STATE);
        EXPECT_TRUE(says("offset")) << dst_last_error();
        EXPECT_TRUE(says("dst_context_set_rng_state")) << dst_last_error();
        EXPECT_EQ(r.y.bytes(), poisoned) << "the refused forward wrote the output";
        DST_ASSERT_OK(dst_context_get_rng_state(r.ctx.get(), &seed, &off));
        EXPECT_EQ(seed, 5u);
        EXPECT_EQ(off, start) << "the refused forward moved the offset";
        size_t still = 0;
        DST_ASSERT_OK(dst_saved_bytes(saved.get(), &still));
        EXPECT_EQ(still, kept) << "the refused forward dropped the saved activations";
    }
    // The earlier forward's activations are still usable.
    HostTensor dy = HostTensor::from_doubles(DST_DTYPE_FP32, {Rig::B, Rig::S, Rig::H}, Rng(8).normals(160));
    HostTensor dx(DST_DTYPE_FP32, {Rig::B, Rig::S, Rig::H});
    dst_tensor dyv = dy.view(), dxv = dx.view();
    DST_EXPECT_OK(dst_layer_backward(r.layer.get(), saved.get(), &dyv, &dxv, DST_GRAD_WRITE));
    // Inference takes no offsets.
    DST_ASSERT_OK(dst_layer_set_training(r.layer.get(), 0));
    DST_EXPECT_OK(r.forward());
    DST_ASSERT_OK(dst_context_get_rng_state(r.ctx.get(), &seed, &off));
    EXPECT_EQ(off, UINT64_MAX);
}

}  // namespace
