// The context-level entry points on the CPU backend: device count, streams, synchronisation, the
// shared workspace (owned and caller-provided, with its size query), and the memory helpers
// dst_malloc / dst_free / dst_memcpy. Every bad argument gives its documented status and a message
// naming the argument, and leaves the caller's buffers as they were.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "test_util.h"

using namespace dsttest;

namespace {

bool mentions(const char *needle) { return std::string(dst_last_error()).find(needle) != std::string::npos; }

// The count is checked against what the build has and against what a context can be created on: a
// build without CUDA counts 0; with n devices, device n - 1 opens and device n is refused.
TEST(ContextApi, CudaDeviceCount) {
    EXPECT_EQ(dst_cuda_device_count(nullptr), DST_ERR_INVALID_ARGUMENT);
    EXPECT_TRUE(mentions("count"));
    int n = -1;
    ASSERT_EQ(dst_cuda_device_count(&n), DST_OK);
#if !DST_TEST_BUILD_HAS_CUDA
    EXPECT_EQ(n, 0) << "this build has no CUDA backend";
#endif
    dst_context *c = nullptr;
    if (n == 0) {
        EXPECT_EQ(dst_context_create(DST_BACKEND_CUDA, 0, &c), DST_ERR_UNSUPPORTED) << dst_last_error();
        EXPECT_EQ(c, nullptr);
        // AUTO falls back to the CPU backend.
        ASSERT_EQ(dst_context_create(DST_BACKEND_AUTO, 0, &c), DST_OK) << dst_last_error();
        dst_backend b = DST_BACKEND_AUTO;
        EXPECT_EQ(dst_context_get_backend(c, &b), DST_OK);
        EXPECT_EQ(b, DST_BACKEND_CPU);
        dst_context_destroy(c);
    } else {
        ASSERT_GT(n, 0);
        ASSERT_EQ(dst_context_create(DST_BACKEND_CUDA, n - 1, &c), DST_OK) << dst_last_error();
        dst_context_destroy(c);
        c = nullptr;
        EXPECT_EQ(dst_context_create(DST_BACKEND_CUDA, n, &c), DST_ERR_INVALID_ARGUMENT);
        EXPECT_TRUE(mentions("device"));
        EXPECT_EQ(c, nullptr);
    }
}

TEST(ContextApi, StreamsOnTheCpuBackend) {
    Ctx ctx = make_ctx();
    void *s = reinterpret_cast<void *>(0x1234);
    EXPECT_EQ(dst_context_set_stream(nullptr, nullptr), DST_ERR_INVALID_ARGUMENT);
    EXPECT_TRUE(mentions("ctx"));
    EXPECT_EQ(dst_context_set_stream(ctx.get(), s), DST_ERR_INVALID_ARGUMENT);  // the CPU has no streams
    EXPECT_TRUE(mentions("stream"));
    EXPECT_EQ(dst_context_set_stream(ctx.get(), nullptr), DST_OK);
    EXPECT_EQ(dst_context_get_stream(nullptr, &s), DST_ERR_INVALID_ARGUMENT);
    EXPECT_EQ(dst_context_get_stream(ctx.get(), nullptr), DST_ERR_INVALID_ARGUMENT);
    EXPECT_TRUE(mentions("stream"));
    ASSERT_EQ(dst_context_get_stream(ctx.get(), &s), DST_OK);
    EXPECT_EQ(s, nullptr);
    EXPECT_EQ(dst_context_synchronize(nullptr), DST_ERR_INVALID_ARGUMENT);
    EXPECT_EQ(dst_context_synchronize(ctx.get()), DST_OK);
}

TEST(ContextApi, MallocFreeMemcpy) {
    Ctx ctx = make_ctx();
    void *p = reinterpret_cast<void *>(0x1);
    EXPECT_EQ(dst_malloc(nullptr, 16, &p), DST_ERR_INVALID_ARGUMENT);
    EXPECT_TRUE(mentions("ctx"));
    EXPECT_EQ(dst_malloc(ctx.get(), 16, nullptr), DST_ERR_INVALID_ARGUMENT);
    EXPECT_TRUE(mentions("ptr"));
    ASSERT_EQ(dst_malloc(ctx.get(), 0, &p), DST_OK);
    EXPECT_EQ(p, nullptr);
#if !defined(__SANITIZE_ADDRESS__)  // ASan's operator new aborts on such a size instead of throwing
    EXPECT_EQ(dst_malloc(ctx.get(), size_t(1) << 62, &p), DST_ERR_OUT_OF_MEMORY);
    EXPECT_TRUE(mentions("allocate"));
#endif
    ASSERT_EQ(dst_malloc(ctx.get(), 1000, &p), DST_OK);
    ASSERT_NE(p, nullptr);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % 256, 0u);

    std::vector<unsigned char> src(1000), back(1000, 0xAB);
    for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<unsigned char>(i * 7);
    EXPECT_EQ(dst_memcpy(nullptr, p, src.data(), 10, DST_COPY_HOST_TO_CONTEXT), DST_ERR_INVALID_ARGUMENT);
    EXPECT_EQ(dst_memcpy(ctx.get(), nullptr, src.data(), 10, DST_COPY_HOST_TO_CONTEXT), DST_ERR_INVALID_ARGUMENT);
    EXPECT_TRUE(mentions("dst"));
    EXPECT_EQ(dst_memcpy(ctx.get(), back.data(), nullptr, 10, DST_COPY_CONTEXT_TO_HOST), DST_ERR_INVALID_ARGUMENT);
    EXPECT_TRUE(mentions("src"));
    dst_copy_kind bad;
    const int32_t seven = 7;
    std::memcpy(&bad, &seven, sizeof bad);
    EXPECT_EQ(dst_memcpy(ctx.get(), back.data(), p, 10, bad), DST_ERR_INVALID_ARGUMENT);
    EXPECT_TRUE(mentions("kind"));
    EXPECT_EQ(back, std::vector<unsigned char>(1000, 0xAB));  // failed calls wrote nothing
    EXPECT_EQ(dst_memcpy(ctx.get(), nullptr, nullptr, 0, DST_COPY_HOST_TO_CONTEXT), DST_OK);

    ASSERT_EQ(dst_memcpy(ctx.get(), p, src.data(), src.size(), DST_COPY_HOST_TO_CONTEXT), DST_OK);
    void *q = nullptr;
    ASSERT_EQ(dst_malloc(ctx.get(), 1000, &q), DST_OK);
    ASSERT_EQ(dst_memcpy(ctx.get(), q, p, 1000, DST_COPY_CONTEXT_TO_CONTEXT), DST_OK);
    ASSERT_EQ(dst_memcpy(ctx.get(), back.data(), q, 1000, DST_COPY_CONTEXT_TO_HOST), DST_OK);
    EXPECT_EQ(back, src);
    dst_free(ctx.get(), p);
    dst_free(ctx.get(), q);
    dst_free(ctx.get(), nullptr);
    dst_free(nullptr, nullptr);
}

// Forward + backward of a small layer with the context's current workspace; returns y, dx and the
// gradients, or the failing status.
struct CallOutcome {
    dst_status st = DST_OK;
    std::vector<double> y, dx;
    std::vector<std::vector<double>> grads;
};

CallOutcome run_layer(dst_context *ctx, dst_layer *layer, int B, int S, int H, bool training) {
    CallOutcome r;
    Rng rng(3);
    HostTensor x = HostTensor::from_doubles(DST_DTYPE_FP32, {B, S, H}, rng.normals(size_t(B) * S * H));
    HostTensor y(DST_DTYPE_FP32, {B, S, H}), dx(DST_DTYPE_FP32, {B, S, H});
    y.poison();
    dx.poison();
    const std::vector<unsigned char> poisoned = y.bytes();
    dst_tensor xv = x.view(), yv = y.view(), dyv = x.view(), dxv = dx.view();
    EXPECT_EQ(dst_context_set_rng_state(ctx, 11, 0), DST_OK);
    EXPECT_EQ(dst_layer_set_training(layer, training), DST_OK);
    r.st = dst_layer_forward(layer, nullptr, &xv, nullptr, &yv);
    if (r.st != DST_OK) {
        EXPECT_TRUE(y.same_bytes(poisoned));  // a failed call wrote nothing
        return r;
    }
    if (training) r.st = dst_layer_backward(layer, nullptr, &dyv, &dxv, DST_GRAD_WRITE);
    r.y = y.doubles();
    r.dx = dx.doubles();
    r.grads = all_grads(layer);
    return r;
}

TEST(ContextApi, WorkspaceOwnedAndCallerProvided) {
    const int B = 3, S = 9, H = 24;
    dst_layer_config cfg = small_config(H, 3, 40, DST_DTYPE_FP32);
    size_t need = 0;
    EXPECT_EQ(dst_layer_config_workspace_bytes(nullptr, B, S, &need), DST_ERR_INVALID_ARGUMENT);
    EXPECT_EQ(dst_layer_config_workspace_bytes(&cfg, 0, S, &need), DST_ERR_INVALID_ARGUMENT);
    EXPECT_TRUE(mentions("batch"));
    EXPECT_EQ(dst_layer_config_workspace_bytes(&cfg, B, -1, &need), DST_ERR_INVALID_ARGUMENT);
    EXPECT_EQ(dst_layer_config_workspace_bytes(&cfg, B, S, nullptr), DST_ERR_INVALID_ARGUMENT);
    EXPECT_TRUE(mentions("bytes"));
    ASSERT_EQ(dst_layer_config_workspace_bytes(&cfg, B, S, &need), DST_OK);
    EXPECT_GT(need, 0u);

    Ctx ctx = make_ctx();
    size_t have = 1;
    EXPECT_EQ(dst_context_workspace_bytes(nullptr, &have), DST_ERR_INVALID_ARGUMENT);
    EXPECT_EQ(dst_context_workspace_bytes(ctx.get(), nullptr), DST_ERR_INVALID_ARGUMENT);
    ASSERT_EQ(dst_context_workspace_bytes(ctx.get(), &have), DST_OK);
    EXPECT_EQ(have, 0u);  // an owned workspace grows at the first call

    Layer layer = make_layer(ctx.get(), cfg);
    randomize_params(layer.get(), 5);
    const CallOutcome owned = run_layer(ctx.get(), layer.get(), B, S, H, true);
    ASSERT_EQ(owned.st, DST_OK) << dst_last_error();
    ASSERT_EQ(dst_context_workspace_bytes(ctx.get(), &have), DST_OK);
    EXPECT_GT(have, 0u);
    EXPECT_LE(have, need);  // the query covers training and inference

    // Caller memory: misaligned is refused; too small fails the call with DST_ERR_CAPACITY and
    // writes nothing; the queried size serves training and inference with identical results.
    void *mem = nullptr;
    ASSERT_EQ(dst_malloc(ctx.get(), need + 256, &mem), DST_OK);
    EXPECT_EQ(dst_context_set_workspace(nullptr, mem, need), DST_ERR_INVALID_ARGUMENT);
    EXPECT_EQ(dst_context_set_workspace(ctx.get(), static_cast<char *>(mem) + 8, need), DST_ERR_INVALID_ARGUMENT);
    EXPECT_TRUE(mentions("aligned"));
    ASSERT_EQ(dst_context_set_workspace(ctx.get(), mem, 512), DST_OK);
    const std::vector<unsigned char> grads_before = grad_arena_bytes(layer.get());
    const CallOutcome small = run_layer(ctx.get(), layer.get(), B, S, H, true);
    EXPECT_EQ(small.st, DST_ERR_CAPACITY);
    EXPECT_TRUE(mentions("workspace"));
    EXPECT_EQ(grad_arena_bytes(layer.get()), grads_before);
    ASSERT_EQ(dst_context_set_workspace(ctx.get(), mem, need), DST_OK);
    ASSERT_EQ(dst_context_workspace_bytes(ctx.get(), &have), DST_OK);
    EXPECT_EQ(have, need);
    const CallOutcome caller = run_layer(ctx.get(), layer.get(), B, S, H, true);
    ASSERT_EQ(caller.st, DST_OK) << dst_last_error();
    EXPECT_TRUE(caller.y == owned.y && caller.dx == owned.dx && caller.grads == owned.grads);
    EXPECT_EQ(run_layer(ctx.get(), layer.get(), B, S, H, false).st, DST_OK) << dst_last_error();
    // Back to an owned workspace before the caller's memory goes.
    ASSERT_EQ(dst_context_set_workspace(ctx.get(), nullptr, 0), DST_OK);
    dst_free(ctx.get(), mem);
    const CallOutcome again = run_layer(ctx.get(), layer.get(), B, S, H, true);
    ASSERT_EQ(again.st, DST_OK) << dst_last_error();
    EXPECT_TRUE(again.y == owned.y && again.grads == owned.grads);
}

}  // namespace
