// The whole layer on the CUDA backend, through the public C API, against the CPU reference in FP64.
//
// Every combination of Pre/Post-LN × the three memory switches × dropout on/off × mask kind × dtype
// runs forward and backward on the GPU and on the CPU. The CPU layer computes in FP64 from the very
// values the GPU layer holds (inputs, mask and parameters rounded to the GPU dtype), so the relative
// L2 error per tensor (output, dX, 12 gradients) measures the GPU computation alone: FP64 ≤ 1e-12
// (summation order only), FP32 ≤ 1e-5 (TF32 off), FP16 ≤ 1e-3, BF16 ≤ 1e-2 (tests/common/bounds.h; for
// FP16/BF16 at most twice the CPU backend's own error in that dtype where that is larger, capped at fixed
// ceilings of 2.5e-3 and 2e-2, see below). With
// dropout on, the same (seed, offset) must give the CPU's masks, or these bounds fail by orders of
// magnitude. Outputs are poisoned (NaN) before each call. Further: determinism, device memory
// actually saved by the switches, and errors that leave the layer usable. Tests skip without a GPU.
#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <ostream>
#include <string>
#include <vector>

#include "../common/bounds.h"
#include "../cpu/test_util.h"
#include "../../kernels/philox.h"  // graph_dropout_seed: the documented key of the graph dropout stream

using namespace dsttest;

namespace {

// A device copy of a host tensor, freed with the context's allocator.
class DevTensor {
public:
    DevTensor(dst_context *ctx, const HostTensor &h) : ctx_(ctx), view_(h.view()) {
        EXPECT_EQ(dst_malloc(ctx, h.nbytes(), &view_.data), DST_OK) << dst_last_error();
        EXPECT_EQ(dst_memcpy(ctx, view_.data, h.data(), h.nbytes(), DST_COPY_HOST_TO_CONTEXT), DST_OK);
    }
    ~DevTensor() { dst_free(ctx_, view_.data); }
    DevTensor(const DevTensor &) = delete;
    DevTensor &operator=(const DevTensor &) = delete;
    void download(HostTensor &h) const {
        EXPECT_EQ(dst_memcpy(ctx_, h.data(), view_.data, h.nbytes(), DST_COPY_CONTEXT_TO_HOST), DST_OK);
    }
    void upload(const HostTensor &h) {
        EXPECT_EQ(dst_memcpy(ctx_, view_.data, h.data(), h.nbytes(), DST_COPY_HOST_TO_CONTEXT), DST_OK);
    }
    dst_tensor *view() { return &view_; }

private:
    dst_context *ctx_;
    dst_tensor view_;
};

// The bytes of a run's results, for comparing runs bit for bit: the device tensors `outs` (each the
// size and dtype of `like`), then the gradient arenas of `layers`.
std::vector<unsigned char> run_bytes(dst_context *ctx, const HostTensor &like, const std::vector<DevTensor *> &outs,
                                     const std::vector<dst_layer *> &layers) {
    std::vector<unsigned char> all;
    HostTensor t(like.dtype(), like.shape());
    for (DevTensor *d : outs) {
        d->download(t);
        const auto b = t.bytes();
        all.insert(all.end(), b.begin(), b.end());
    }
    for (dst_layer *l : layers) {
        size_t n = 0;
        void *p = nullptr;
        EXPECT_EQ(dst_layer_arena_bytes(l, &n), DST_OK);
        EXPECT_EQ(dst_layer_grad_arena(l, &p), DST_OK);
        std::vector<unsigned char> b(n);
        EXPECT_EQ(dst_memcpy(ctx, b.data(), p, n, DST_COPY_CONTEXT_TO_HOST), DST_OK);
        all.insert(all.end(), b.begin(), b.end());
    }
    return all;
}

struct Shape {
    int B, S, H, heads, I;
};

struct Case {
    bool pre;
    int switches;  // bit 0 attn_dropout_checkpoint, bit 1 normalize_invertible, bit 2 gelu_checkpoint
    bool dropout;
    dst_mask_kind mask;
    dst_dtype dt;
    Shape shape;
    bool causal = false;
};

struct Result {
    std::vector<double> y, dx;
    std::vector<std::vector<double>> grads;
    std::vector<unsigned char> grad_bytes;
};

dst_layer_config config_of(const Case &c, dst_dtype dt) {
    dst_layer_config cfg;
    dst_layer_config_default(&cfg);
    cfg.hidden_size = c.shape.H;
    cfg.heads = c.shape.heads;
    cfg.intermediate_size = c.shape.I;
    cfg.dtype = dt;
    cfg.pre_layer_norm = c.pre;
    cfg.attn_dropout_checkpoint = c.switches & 1;
    cfg.normalize_invertible = (c.switches >> 1) & 1;
    cfg.gelu_checkpoint = (c.switches >> 2) & 1;
    cfg.attn_dropout_ratio = c.dropout ? 0.1f : 0.0f;
    cfg.hidden_dropout_ratio = c.dropout ? 0.1f : 0.0f;
    cfg.causal = c.causal;
    cfg.max_batch_tokens = int64_t(c.shape.B) * c.shape.S;
    cfg.max_seq_len = c.shape.S;
    return cfg;
}

// Inputs of one case, already rounded to the GPU dtype (exactly representable there).
struct Inputs {
    std::vector<std::vector<double>> params;
    std::vector<double> x, dy, mask_add;
    std::vector<int32_t> lengths;
};

Inputs make_inputs(const Case &c, uint64_t seed) {
    const auto &s = c.shape;
    Rng rng(seed);
    Inputs in;
    const int64_t sizes[DST_PARAM_COUNT] = {3LL * s.H * s.H, 3LL * s.H, 1LL * s.H * s.H, s.H, s.H, s.H,
                                            1LL * s.I * s.H, s.I, 1LL * s.H * s.I, s.H, s.H, s.H};
    const double fan[DST_PARAM_COUNT] = {double(s.H), 0, double(s.H), 0, 0, 0, double(s.H), 0, double(s.I), 0, 0, 0};
    for (int p = 0; p < DST_PARAM_COUNT; ++p) {
        std::vector<double> v(static_cast<size_t>(sizes[p]));
        const bool gamma = p == DST_PARAM_ATTN_NW || p == DST_PARAM_NORM_W;
        for (auto &x : v) x = round_to(fan[p] > 0 ? rng.normal() / std::sqrt(fan[p]) : gamma ? 1.0 + 0.2 * rng.normal()
                                                                                              : 0.3 * rng.normal(),
                                       c.dt);
        in.params.push_back(v);
    }
    const size_t n = size_t(s.B) * s.S * s.H;
    in.x = rng.normals(n);
    in.dy = rng.normals(n);
    for (auto &v : in.x) v = round_to(v, c.dt);
    for (auto &v : in.dy) v = round_to(v, c.dt);
    in.mask_add.assign(size_t(s.B) * s.S, 0.0);
    in.lengths.assign(size_t(s.B), s.S);
    for (int b = 1; b < s.B; ++b) {
        in.lengths[size_t(b)] = std::max(1, s.S - (b * s.S) / (s.B + 1));
        for (int j = in.lengths[size_t(b)]; j < s.S; ++j) in.mask_add[size_t(b) * s.S + j] = -10000.0;
    }
    for (auto &v : in.mask_add) v = round_to(v, c.dt);
    return in;
}

// Runs forward + backward of case `c` on `ctx` with a layer of dtype `dt`.
void run_layer(dst_context *ctx, bool on_gpu, const Case &c, dst_dtype dt, const Inputs &in, Result *r) {
    const auto &s = c.shape;
    dst_layer_config cfg = config_of(c, dt);
    Layer layer = make_layer(ctx, cfg);
    ASSERT_TRUE(layer);
    for (int p = 0; p < DST_PARAM_COUNT; ++p) set_param(layer.get(), kParamNames[p], in.params[size_t(p)]);
    HostTensor x = HostTensor::from_doubles(dt, {s.B, s.S, s.H}, in.x);
    HostTensor dy = HostTensor::from_doubles(dt, {s.B, s.S, s.H}, in.dy);
    HostTensor y(dt, {s.B, s.S, s.H}), dx(dt, {s.B, s.S, s.H});
    y.poison();
    dx.poison();
    HostTensor mh;
    if (c.mask == DST_MASK_ADDITIVE) mh = HostTensor::from_doubles(dt, {s.B, s.S}, in.mask_add);
    if (c.mask == DST_MASK_KEY_LENGTHS) {
        mh = HostTensor(DST_DTYPE_INT32, {s.B});
        std::memcpy(mh.data(), in.lengths.data(), in.lengths.size() * 4);
    }
    ASSERT_EQ(dst_context_set_rng_state(ctx, 77, 1234), DST_OK);
    if (on_gpu) {
        DevTensor dxv(ctx, x), dyv(ctx, y), ddy(ctx, dy), ddx(ctx, dx);
        dst_mask m = mask_none();
        std::unique_ptr<DevTensor> dm;
        if (c.mask != DST_MASK_NONE) {
            dm.reset(new DevTensor(ctx, mh));
            m.kind = c.mask;
            m.tensor = *dm->view();
        }
        DST_ASSERT_OK(dst_layer_forward(layer.get(), nullptr, dxv.view(), &m, dyv.view()));
        DST_ASSERT_OK(dst_layer_backward(layer.get(), nullptr, ddy.view(), ddx.view(), DST_GRAD_WRITE));
        dyv.download(y);
        ddx.download(dx);
    } else {
        dst_mask m = c.mask == DST_MASK_NONE ? mask_none() : mask_of(c.mask, mh);
        dst_tensor xv = x.view(), yv = y.view(), dyv = dy.view(), dxv = dx.view();
        DST_ASSERT_OK(dst_layer_forward(layer.get(), nullptr, &xv, &m, &yv));
        DST_ASSERT_OK(dst_layer_backward(layer.get(), nullptr, &dyv, &dxv, DST_GRAD_WRITE));
    }
    r->y = y.doubles();
    r->dx = dx.doubles();
    r->grads = all_grads(layer.get());
    // The gradient arena lives in the context's memory space (device memory on the GPU).
    size_t n = 0;
    void *arena = nullptr;
    DST_ASSERT_OK(dst_layer_arena_bytes(layer.get(), &n));
    DST_ASSERT_OK(dst_layer_grad_arena(layer.get(), &arena));
    r->grad_bytes.resize(n);
    DST_ASSERT_OK(dst_memcpy(ctx, r->grad_bytes.data(), arena, n, DST_COPY_CONTEXT_TO_HOST));
}


std::string case_name(const Case &c) {
    static const char *masks[] = {"nomask", "additive", "lengths"};
    std::string n = std::string(c.pre ? "pre" : "post") + "_sw" + std::to_string(c.switches) +
                    (c.dropout ? "_drop" : "_nodrop") + "_" + masks[c.mask] + "_" + dst_dtype_string(c.dt);
    n += "_B" + std::to_string(c.shape.B) + "S" + std::to_string(c.shape.S) + "H" + std::to_string(c.shape.H);
    if (c.causal) n += "_causal";
    return n;
}

void PrintTo(const Case &c, std::ostream *os) { *os << case_name(c); }

class CudaLayer : public ::testing::TestWithParam<Case> {};

TEST_P(CudaLayer, MatchesCpuFp64) {
    SKIP_WITHOUT_GPU();
    const Case c = GetParam();
    const Inputs in = make_inputs(c, 1000 + c.switches + 16 * c.mask);
    Ctx gctx = make_cuda_ctx(), cctx = make_ctx();
    ASSERT_TRUE(gctx && cctx);
    Result g, r, same;
    run_layer(gctx.get(), true, c, c.dt, in, &g);
    run_layer(cctx.get(), false, c, DST_DTYPE_FP64, in, &r);
    // FP16/BF16: a whole layer forward and backward stores every activation and activation gradient in
    // 16 bits, and on some tensors (the deepest gradients: norm_w/norm_b, dX) that alone comes to the
    // tests/common/bounds.h bound (the CPU backend in the same dtype measured up to 1.0e-3 in fp16
    // here). As for fused GEMM chains generally, the GPU must then be no worse than twice the
    // same-dtype CPU reference: bound = max(tests/common/bounds.h bound, 2 × CPU-in-dtype error), per
    // tensor, but never above a fixed ceiling. The ceilings: the CPU backend in the same dtype,
    // measured against FP64 on every case of this grid (inputs of make_inputs, worst tensor of each
    // case), reached at most 1.0e-3 in fp16 (pre_sw0_drop_nomask, B3 S13 H48; BERT-Base/Large shapes
    // 7.3e-4 / 8.3e-4) and 8.1e-3 in bf16 (pre_sw1_drop_additive, B3 S13 H48; BERT-Base/Large 5.8e-3 /
    // 6.7e-3). Twice those, rounded up: 2.5e-3 and 2e-2. A GPU error above them is more than 16-bit
    // storage rounding, whatever the CPU's error was in that case.
    const bool reduced = c.dt == DST_DTYPE_FP16 || c.dt == DST_DTYPE_BF16;
    if (reduced) run_layer(cctx.get(), false, c, c.dt, in, &same);
    const double tol = design_tolerance(c.dt);
    const double ceiling = c.dt == DST_DTYPE_FP16 ? 2.5e-3 : 2e-2;
    double worst = 0, worst_bound = tol;
    auto check = [&](const char *name, const std::vector<double> &a, const std::vector<double> &b,
                     const std::vector<double> *cpu_same) {
        const double e = rel_l2(a, b);
        const double bound = cpu_same ? std::min(ceiling, std::max(tol, 2.0 * rel_l2(*cpu_same, b))) : tol;
        EXPECT_LE(e, bound) << name << " of " << case_name(c);  // NaN fails too
        if (e / bound > worst / worst_bound) {
            worst = e;
            worst_bound = bound;
        }
    };
    check("output", g.y, r.y, reduced ? &same.y : nullptr);
    check("grad_input", g.dx, r.dx, reduced ? &same.dx : nullptr);
    for (int p = 0; p < DST_PARAM_COUNT; ++p)
        check(kParamNames[p], g.grads[p], r.grads[p], reduced ? &same.grads[p] : nullptr);
    std::printf("%s: worst rel L2 %.2e (bound %.2e)\n", case_name(c).c_str(), worst, worst_bound);
}

std::vector<Case> grid() {
    std::vector<Case> v;
    const Shape small{3, 13, 48, 3, 80};  // odd S, odd head count, I != 4H, d = 16
    for (dst_dtype dt : {DST_DTYPE_FP64, DST_DTYPE_FP32, DST_DTYPE_FP16, DST_DTYPE_BF16})
        for (bool pre : {true, false})
            for (int sw = 0; sw < 8; ++sw)
                for (bool drop : {false, true})
                    for (dst_mask_kind m : {DST_MASK_NONE, DST_MASK_ADDITIVE, DST_MASK_KEY_LENGTHS})
                        v.push_back({pre, sw, drop, m, dt, small});
    // Awkward and real shapes, a few combinations each.
    const Shape s1{5, 1, 40, 5, 56}, s129{2, 129, 96, 3, 200}, base{2, 128, 768, 12, 3072}, large{2, 512, 1024, 16, 4096};
    for (dst_dtype dt : {DST_DTYPE_FP32, DST_DTYPE_FP16, DST_DTYPE_BF16}) {
        v.push_back({true, 0, true, DST_MASK_ADDITIVE, dt, s1});
        v.push_back({false, 7, true, DST_MASK_KEY_LENGTHS, dt, s129});
        v.push_back({true, 0, true, DST_MASK_KEY_LENGTHS, dt, s129, true});
        v.push_back({false, 0, true, DST_MASK_ADDITIVE, dt, base});
        v.push_back({true, 7, true, DST_MASK_KEY_LENGTHS, dt, large});
    }
    return v;
}

INSTANTIATE_TEST_SUITE_P(Grid, CudaLayer, ::testing::ValuesIn(grid()),
                         [](const ::testing::TestParamInfo<Case> &i) { return case_name(i.param); });

// The library's device count equals the CUDA runtime's (0 when the runtime finds no driver or no
// device); runs with and without a GPU.
TEST(CudaLayerDevices, CountMatchesTheRuntime) {
    int runtime = 0;
    if (cudaGetDeviceCount(&runtime) != cudaSuccess) {
        runtime = 0;
        (void)cudaGetLastError();
    }
    int n = -1;
    ASSERT_EQ(dst_cuda_device_count(&n), DST_OK) << dst_last_error();
    EXPECT_EQ(n, runtime);
}

// Two runs with the same seed and offset are bit-identical (output, dX and the gradient arena).
TEST(CudaLayerDeterminism, TwoRunsBitIdentical) {
    SKIP_WITHOUT_GPU();
    for (dst_dtype dt : {DST_DTYPE_FP32, DST_DTYPE_FP16, DST_DTYPE_BF16}) {
        const Case c{true, 0, true, DST_MASK_ADDITIVE, dt, {4, 128, 256, 4, 1024}};
        const Inputs in = make_inputs(c, 5);
        Ctx ctx = make_cuda_ctx();
        Result a, b;
        run_layer(ctx.get(), true, c, dt, in, &a);
        run_layer(ctx.get(), true, c, dt, in, &b);
        EXPECT_TRUE(a.y == b.y && a.dx == b.dx && a.grad_bytes == b.grad_bytes) << dst_dtype_string(dt);
    }
}

// Device memory a training forward keeps, measured with cudaMemGetInfo around a forward into a fresh
// saved-activations object; each switch must lower it, and it must match dst_saved_bytes.
TEST(CudaLayerMemory, SwitchesLowerMeasuredDeviceMemory) {
    SKIP_WITHOUT_GPU();
    const Shape s{8, 512, 1024, 16, 4096};
    size_t measured[4] = {0, 0, 0, 0};
    const int combos[4] = {0, 1, 2, 4};
    for (int k = 0; k < 4; ++k) {
        Case c{true, combos[k], true, DST_MASK_KEY_LENGTHS, DST_DTYPE_FP16, s};
        Ctx ctx = make_cuda_ctx();
        dst_layer_config cfg = config_of(c, DST_DTYPE_FP16);
        Layer layer = make_layer(ctx.get(), cfg);
        HostTensor x(DST_DTYPE_FP16, {s.B, s.S, s.H}), lens(DST_DTYPE_INT32, {s.B});
        for (int b = 0; b < s.B; ++b) reinterpret_cast<int32_t *>(lens.data())[b] = s.S;
        DevTensor dx(ctx.get(), x), dy(ctx.get(), x), dl(ctx.get(), lens);
        dst_mask m = mask_none();
        m.kind = DST_MASK_KEY_LENGTHS;
        m.tensor = *dl.view();
        // Warm-up: grows the workspace and the backend's scratch, fills the default saved object.
        DST_ASSERT_OK(dst_layer_forward(layer.get(), nullptr, dx.view(), &m, dy.view()));
        Saved sv = make_saved(layer.get());
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        size_t free0 = 0, free1 = 0, total = 0;
        ASSERT_EQ(cudaMemGetInfo(&free0, &total), cudaSuccess);
        DST_ASSERT_OK(dst_layer_forward(layer.get(), sv.get(), dx.view(), &m, dy.view()));
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        ASSERT_EQ(cudaMemGetInfo(&free1, &total), cudaSuccess);
        measured[k] = free0 - free1;
        size_t counted = 0;
        DST_ASSERT_OK(dst_saved_bytes(sv.get(), &counted));
        // cudaMalloc rounds allocations up to its page size (2 MiB).
        EXPECT_NEAR(double(measured[k]), double(counted), double(4u << 20)) << "switches " << combos[k];
        std::printf("switches %d: measured %.2f MB, counted %.2f MB per sample\n", combos[k],
                    measured[k] / 1e6 / s.B, counted / 1e6 / s.B);
    }
    // combos[1] is attn_dropout_checkpoint: attention is fused, nothing S×S is kept with or without
    // it, so it keeps exactly as much; the other two keep less.
    EXPECT_NEAR(double(measured[1]), double(measured[0]), double(2u << 20)) << "attn_dropout_checkpoint";
    for (int k = 2; k < 4; ++k) EXPECT_LT(measured[k], measured[0]) << "switch combination " << combos[k];
    // Linear in S: 32 KiB per token plus statistics, ≤ 16.5 MiB per sample at S = 512 (the target of
    // the fused attention; 0.1.0 kept 24 MiB with its S×S probabilities).
    EXPECT_LE(double(measured[0]) / s.B, 16.5 * 1048576.0);
}

// Every kernel, copy and library call of a layer call is queued on the context's stream: work
// anywhere else would race with what the caller queues next. With a non-blocking caller stream,
// the output is poisoned on that stream, the call is made, and a copy queued right behind it on the
// same stream (then only that stream synchronised) must see the final output: the bytes a copy
// after a device-wide synchronisation sees. Inference and training, additive and key-length masks.
TEST(CudaLayerStreams, CallsAreOrderedOnTheCallersStream) {
    SKIP_WITHOUT_GPU();
    const Shape s{16, 128, 1024, 16, 4096};
    const int64_t n = int64_t(s.B) * s.S * s.H;
    const size_t bytes = size_t(n) * 2;
    for (dst_mask_kind mk : {DST_MASK_ADDITIVE, DST_MASK_KEY_LENGTHS})
        for (int training : {0, 1}) {
            SCOPED_TRACE(std::string(mk == DST_MASK_ADDITIVE ? "additive" : "lengths") +
                         (training ? " training" : " inference"));
            const Case c{true, 0, true, mk, DST_DTYPE_FP16, s};
            Ctx ctx = make_cuda_ctx();
            cudaStream_t st = nullptr;
            ASSERT_EQ(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking), cudaSuccess);
            DST_ASSERT_OK(dst_context_set_stream(ctx.get(), st));
            {
                Layer layer = make_layer(ctx.get(), config_of(c, DST_DTYPE_FP16));
                DST_ASSERT_OK(dst_layer_set_training(layer.get(), training));
                HostTensor x = HostTensor::from_doubles(DST_DTYPE_FP16, {s.B, s.S, s.H}, Rng(3).normals(n));
                HostTensor madd(DST_DTYPE_FP16, {s.B, s.S}), lens(DST_DTYPE_INT32, {s.B});
                for (int b = 0; b < s.B; ++b) {
                    const int len = s.S - (b % 3) * 17;
                    reinterpret_cast<int32_t *>(lens.data())[b] = len;
                    for (int j = 0; j < s.S; ++j) madd.set(int64_t(b) * s.S + j, j < len ? 0.0 : -10000.0);
                }
                DevTensor dx(ctx.get(), x), dy(ctx.get(), x), dg(ctx.get(), x), dxg(ctx.get(), x);
                DevTensor dm(ctx.get(), mk == DST_MASK_ADDITIVE ? madd : lens);
                dst_mask m = mask_none();
                m.kind = mk;
                m.tensor = *dm.view();
                void *host = nullptr;
                ASSERT_EQ(cudaMallocHost(&host, bytes), cudaSuccess);
                // The bytes a copy queued on `st` right after the call sees, and the final bytes.
                auto early_equals_final = [&](void *dev) {
                    EXPECT_EQ(cudaMemcpyAsync(host, dev, bytes, cudaMemcpyDeviceToHost, st), cudaSuccess);
                    EXPECT_EQ(cudaStreamSynchronize(st), cudaSuccess);
                    const std::vector<unsigned char> early(static_cast<unsigned char *>(host),
                                                           static_cast<unsigned char *>(host) + bytes);
                    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
                    EXPECT_EQ(cudaMemcpy(host, dev, bytes, cudaMemcpyDeviceToHost), cudaSuccess);
                    return std::memcmp(early.data(), host, bytes) == 0;
                };
                for (int rep = 0; rep < 3; ++rep) {
                    ASSERT_EQ(cudaMemsetAsync(dy.view()->data, 0xff, bytes, st), cudaSuccess);
                    DST_ASSERT_OK(dst_layer_forward(layer.get(), nullptr, dx.view(), &m, dy.view()));
                    EXPECT_TRUE(early_equals_final(dy.view()->data)) << "forward, repetition " << rep;
                    if (!training) continue;
                    ASSERT_EQ(cudaMemsetAsync(dxg.view()->data, 0xff, bytes, st), cudaSuccess);
                    DST_ASSERT_OK(dst_layer_backward(layer.get(), nullptr, dg.view(), dxg.view(), DST_GRAD_WRITE));
                    EXPECT_TRUE(early_equals_final(dxg.view()->data)) << "backward, repetition " << rep;
                }
                ASSERT_EQ(cudaFreeHost(host), cudaSuccess);
            }
            DST_EXPECT_OK(dst_context_set_stream(ctx.get(), nullptr));
            ASSERT_EQ(cudaStreamDestroy(st), cudaSuccess);
        }
}

// Errors on the GPU return a status and leave the layer usable.
TEST(CudaLayerErrors, CapacityStreamAndOutOfMemory) {
    SKIP_WITHOUT_GPU();
    const Case c{true, 0, true, DST_MASK_NONE, DST_DTYPE_FP16, {2, 16, 64, 4, 128}};
    Ctx ctx = make_cuda_ctx();
    dst_layer_config cfg = config_of(c, DST_DTYPE_FP16);
    Layer layer = make_layer(ctx.get(), cfg);
    HostTensor x(DST_DTYPE_FP16, {2, 16, 64}), big(DST_DTYPE_FP16, {4, 16, 64});
    DevTensor dx(ctx.get(), x), dy(ctx.get(), x), dbig(ctx.get(), big), dbig2(ctx.get(), big);
    auto works = [&] {
        EXPECT_EQ(dst_layer_forward(layer.get(), nullptr, dx.view(), nullptr, dy.view()), DST_OK) << dst_last_error();
        EXPECT_EQ(dst_layer_backward(layer.get(), nullptr, dy.view(), dx.view(), DST_GRAD_WRITE), DST_OK)
            << dst_last_error();
    };
    // Over capacity.
    EXPECT_EQ(dst_layer_forward(layer.get(), nullptr, dbig.view(), nullptr, dbig2.view()), DST_ERR_CAPACITY);
    works();
    // (An invalid stream handle cannot be tested here: CUDA dereferences a destroyed or made-up
    // handle, which is undefined behaviour in the caller's process. dst_context_set_stream rejects
    // the handles CUDA reports as invalid or as belonging to another device.)
    // A caller stream works, and NULL returns to the context's own.
    cudaStream_t st;
    ASSERT_EQ(cudaStreamCreate(&st), cudaSuccess);
    DST_EXPECT_OK(dst_context_set_stream(ctx.get(), st));
    works();
    DST_EXPECT_OK(dst_context_synchronize(ctx.get()));
    DST_EXPECT_OK(dst_context_set_stream(ctx.get(), nullptr));
    ASSERT_EQ(cudaStreamDestroy(st), cudaSuccess);
    // Exhausted device memory: a layer whose call needs far more than the device has.
    dst_layer_config huge = cfg;
    huge.hidden_size = 4096;
    huge.heads = 32;
    huge.intermediate_size = 16384;
    huge.max_batch_tokens = int64_t(1) << 24;
    huge.max_seq_len = 1 << 14;
    Layer hl = make_layer(ctx.get(), huge);
    ASSERT_TRUE(hl);
    dst_tensor hx = *dx.view(), hy = *dy.view();
    // Never read: the workspace allocation fails first. Far apart, so they do not overlap.
    hx.data = reinterpret_cast<void *>(uintptr_t(1) << 40);
    hy.data = reinterpret_cast<void *>(uintptr_t(1) << 42);
    hx.shape[0] = hy.shape[0] = 1024;
    hx.shape[1] = hy.shape[1] = 1 << 14;
    hx.shape[2] = hy.shape[2] = 4096;
    EXPECT_EQ(dst_layer_forward(hl.get(), nullptr, &hx, nullptr, &hy), DST_ERR_OUT_OF_MEMORY) << dst_last_error();
    works();
}

// The CUDA-graph tests' stack: two fp16 Pre-LN layers (3×40×64, 4 heads, key lengths 40, 17, 1) on a
// context of their own, with or without dropout, their device buffers and a stream to capture on.
struct GraphStack {
    static constexpr int64_t B = 3, S = 40, H = 64;
    Ctx ctx = make_cuda_ctx();
    Layer l0, l1;
    HostTensor zero{DST_DTYPE_FP16, {B, S, H}};
    DevTensor dx, dg, dlen, dh, dy, dgh, dgx;
    dst_mask m = mask_none();
    cudaStream_t st = nullptr;  // a non-blocking stream for the tests' captures (the context starts on its own)
    static Case case_of(bool dropout) {
        return Case{true, 0, dropout, DST_MASK_KEY_LENGTHS, DST_DTYPE_FP16, {int(B), int(S), int(H), 4, 128}};
    }
    static HostTensor normals(uint64_t seed) {
        return HostTensor::from_doubles(DST_DTYPE_FP16, {B, S, H}, Rng(seed).normals(B * S * H));
    }
    static HostTensor lengths() {
        HostTensor lens(DST_DTYPE_INT32, {B});
        lens.set(0, 40);
        lens.set(1, 17);
        lens.set(2, 1);
        return lens;
    }
    explicit GraphStack(bool dropout)
        : l0(make_layer(ctx.get(), config_of(case_of(dropout), DST_DTYPE_FP16))),
          l1(make_layer(ctx.get(), config_of(case_of(dropout), DST_DTYPE_FP16))), dx(ctx.get(), normals(13)),
          dg(ctx.get(), normals(14)), dlen(ctx.get(), lengths()), dh(ctx.get(), zero), dy(ctx.get(), zero),
          dgh(ctx.get(), zero), dgx(ctx.get(), zero) {
        if (l0 && l1) {
            randomize_params(l0.get(), 11);
            randomize_params(l1.get(), 12);
        }
        m.kind = DST_MASK_KEY_LENGTHS;
        m.tensor = *dlen.view();
        EXPECT_EQ(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking), cudaSuccess);
    }
    // The context back on its own stream, then the stream destroyed.
    ~GraphStack() {
        if (!st) return;
        EXPECT_EQ(dst_context_set_stream(ctx.get(), nullptr), DST_OK) << dst_last_error();
        EXPECT_EQ(cudaStreamDestroy(st), cudaSuccess);
    }
    GraphStack(const GraphStack &) = delete;
    GraphStack &operator=(const GraphStack &) = delete;
    // Both forwards, then (train) both backwards. `offsets`: the host RNG state (seed, offsets[i]) set
    // before layer i's forward.
    dst_status run(bool train, const uint64_t *offsets = nullptr, uint64_t seed = 0) {
        dst_status s = offsets ? dst_context_set_rng_state(ctx.get(), seed, offsets[0]) : DST_OK;
        if (s == DST_OK) s = dst_layer_forward(l0.get(), nullptr, dx.view(), &m, dh.view());
        if (s == DST_OK && offsets) s = dst_context_set_rng_state(ctx.get(), seed, offsets[1]);
        if (s == DST_OK) s = dst_layer_forward(l1.get(), nullptr, dh.view(), &m, dy.view());
        if (train && s == DST_OK) s = dst_layer_backward(l1.get(), nullptr, dg.view(), dgh.view(), DST_GRAD_WRITE);
        if (train && s == DST_OK) s = dst_layer_backward(l0.get(), nullptr, dgh.view(), dgx.view(), DST_GRAD_WRITE);
        return s;
    }
    // The output, and (train) the input gradient and both gradient arenas.
    std::vector<unsigned char> outputs(bool train) {
        if (!train) return run_bytes(ctx.get(), zero, {&dy}, {});
        return run_bytes(ctx.get(), zero, {&dy, &dgx}, {l0.get(), l1.get()});
    }
};

// `call`, made while `st` captures a CUDA graph, is refused with `want` and a message containing `expect`,
// and leaves the capture valid and empty.
static void expect_refused_in_capture(cudaStream_t st, const std::function<dst_status()> &call, dst_status want,
                                      const char *expect) {
    ASSERT_EQ(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal), cudaSuccess);
    const dst_status s = call();
    const std::string msg = dst_last_error();
    cudaGraph_t graph = nullptr;
    ASSERT_EQ(cudaStreamEndCapture(st, &graph), cudaSuccess) << "the refused call invalidated the capture";
    EXPECT_EQ(s, want) << msg;
    EXPECT_NE(msg.find(expect), std::string::npos) << msg;
    size_t nodes = 99;
    ASSERT_EQ(cudaGraphGetNodes(graph, nullptr, &nodes), cudaSuccess);
    EXPECT_EQ(nodes, 0u) << "a refused call queued work: " << msg;
    ASSERT_EQ(cudaGraphDestroy(graph), cudaSuccess);
}

// Forward and backward never wait for the device, so they can be captured in a CUDA graph: a 2-layer
// stack's inference forward, and its training forward + backward without dropout, captured once and
// replayed twice, give the bytes the same calls give eagerly (the default backward is deterministic).
// The key-length check is captured too.
TEST(CudaLayerGraphs, CaptureAndReplayMatchEagerCalls) {
    SKIP_WITHOUT_GPU();
    GraphStack gs(false);
    ASSERT_TRUE(gs.l0 && gs.l1);
    DST_ASSERT_OK(dst_context_set_stream(gs.ctx.get(), gs.st));
    for (int train = 0; train < 2; ++train) {
        SCOPED_TRACE(train ? "training forward + backward" : "inference forward");
        for (dst_layer *l : {gs.l0.get(), gs.l1.get()}) DST_ASSERT_OK(dst_layer_set_training(l, train));
        DST_ASSERT_OK(gs.run(train != 0));  // eager: also sizes the workspace and the saved activations
        DST_ASSERT_OK(dst_context_synchronize(gs.ctx.get()));
        const auto eager = gs.outputs(train != 0);
        ASSERT_EQ(cudaStreamBeginCapture(gs.st, cudaStreamCaptureModeThreadLocal), cudaSuccess);
        const dst_status captured = gs.run(train != 0);
        cudaGraph_t graph = nullptr;
        ASSERT_EQ(cudaStreamEndCapture(gs.st, &graph), cudaSuccess);
        ASSERT_EQ(captured, DST_OK) << dst_last_error();
        cudaGraphExec_t exec = nullptr;
        ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
        for (int replay = 0; replay < 2; ++replay) {
            gs.dy.upload(gs.zero);
            gs.dgx.upload(gs.zero);
            for (dst_layer *l : {gs.l0.get(), gs.l1.get()}) DST_ASSERT_OK(dst_layer_zero_grads(l));
            DST_ASSERT_OK(dst_context_synchronize(gs.ctx.get()));
            ASSERT_EQ(cudaGraphLaunch(exec, gs.st), cudaSuccess);
            DST_ASSERT_OK(dst_context_synchronize(gs.ctx.get()));
            EXPECT_TRUE(gs.outputs(train != 0) == eager) << "replay " << replay << " differs from the eager calls";
        }
        ASSERT_EQ(cudaGraphExecDestroy(exec), cudaSuccess);
        ASSERT_EQ(cudaGraphDestroy(graph), cudaSuccess);
    }
}

// A call refused while the stream captures a CUDA graph queues nothing, so the caller's capture stays
// valid and empty: an inference forward on a fresh context (its workspace would have to grow) and a
// training forward with a fresh saved object (its memory would have to be allocated), both with a
// key-length mask, whose device check the call would otherwise queue first. The same calls made eagerly
// then succeed.
TEST(CudaLayerGraphs, RefusedCallsQueueNothing) {
    SKIP_WITHOUT_GPU();
    GraphStack gs(false);
    ASSERT_TRUE(gs.l0 && gs.l1);
    DST_ASSERT_OK(dst_context_set_stream(gs.ctx.get(), gs.st));
    Saved fresh = make_saved(gs.l0.get());
    ASSERT_TRUE(fresh);
    auto refused_in_capture = [&](dst_saved *saved, const char *expect) {
        expect_refused_in_capture(
            gs.st, [&] { return dst_layer_forward(gs.l0.get(), saved, gs.dx.view(), &gs.m, gs.dh.view()); },
            DST_ERR_STATE, expect);
    };
    {
        SCOPED_TRACE("workspace growth (an inference forward: no saved activations)");
        DST_ASSERT_OK(dst_layer_set_training(gs.l0.get(), 0));
        refused_in_capture(nullptr, "while the stream is capturing");
        DST_ASSERT_OK(dst_layer_set_training(gs.l0.get(), 1));
    }
    // Eagerly, a training forward sizes the workspace (and the layer's default saved object).
    DST_ASSERT_OK(dst_layer_forward(gs.l0.get(), nullptr, gs.dx.view(), &gs.m, gs.dh.view()));
    DST_ASSERT_OK(dst_context_synchronize(gs.ctx.get()));
    {
        SCOPED_TRACE("saved activations allocation");
        refused_in_capture(fresh.get(), "saved activations");
    }
    DST_EXPECT_OK(dst_layer_forward(gs.l0.get(), fresh.get(), gs.dx.view(), &gs.m, gs.dh.view()));
    DST_EXPECT_OK(dst_layer_backward(gs.l0.get(), fresh.get(), gs.dg.view(), gs.dgx.view(), DST_GRAD_WRITE));
    DST_EXPECT_OK(dst_context_synchronize(gs.ctx.get()));
}

// Setting the context's stream does not wait when either stream captures a CUDA graph (the wait would
// end the capture; PyTorch captures in the global mode, where any wait fails), nor query a capturing
// stream's device (CUDA forbids cudaStreamGetDevice during a capture, and the failed call invalidates
// it: this test's first GPU run failed so): a context on its own
// stream is pointed at a stream that began a global-mode capture, runs the stack's inference forward
// there, and is pointed back at its own stream before the capture ends; the capture stays valid, and
// its replay gives the eager bytes.
TEST(CudaLayerGraphs, SwitchingStreamsDuringACaptureDoesNotWait) {
    SKIP_WITHOUT_GPU();
    GraphStack gs(false);
    ASSERT_TRUE(gs.l0 && gs.l1);
    for (dst_layer *l : {gs.l0.get(), gs.l1.get()}) DST_ASSERT_OK(dst_layer_set_training(l, 0));
    DST_ASSERT_OK(gs.run(false));  // eager, on the context's own stream: sizes the workspace
    DST_ASSERT_OK(dst_context_synchronize(gs.ctx.get()));
    const auto eager = gs.outputs(false);
    ASSERT_EQ(cudaStreamBeginCapture(gs.st, cudaStreamCaptureModeGlobal), cudaSuccess);
    const dst_status to = dst_context_set_stream(gs.ctx.get(), gs.st);
    const dst_status ran = to == DST_OK ? gs.run(false) : to;
    const std::string msg = dst_last_error();
    const dst_status back = dst_context_set_stream(gs.ctx.get(), nullptr);
    cudaGraph_t graph = nullptr;
    ASSERT_EQ(cudaStreamEndCapture(gs.st, &graph), cudaSuccess) << "switching streams ended the capture";
    EXPECT_EQ(to, DST_OK);
    EXPECT_EQ(ran, DST_OK) << msg;
    EXPECT_EQ(back, DST_OK);
    cudaGraphExec_t exec = nullptr;
    ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
    gs.dy.upload(gs.zero);
    DST_ASSERT_OK(dst_context_synchronize(gs.ctx.get()));
    ASSERT_EQ(cudaGraphLaunch(exec, gs.st), cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(gs.st), cudaSuccess);
    EXPECT_TRUE(gs.outputs(false) == eager) << "the replay differs from the eager calls";
    ASSERT_EQ(cudaGraphExecDestroy(exec), cudaSuccess);
    ASSERT_EQ(cudaGraphDestroy(graph), cudaSuccess);
}

// Training calls with dropout captured into a CUDA graph draw from the graph dropout stream
// (kernels/philox.h): each forward takes the next word of the context's device counter as it runs, so
// replays draw new masks, and replay r of a 2-layer stack draws exactly what eager calls of the same
// layers draw with the host RNG state (graph_dropout_seed(seed), word << 32) for words 2r (layer 0)
// and 2r + 1 (layer 1), forward and backward, bit for bit. A context that never ran a training forward
// with dropout has no counter yet and refuses to make one while capturing; resetting the RNG state is
// refused while capturing; neither ends the capture.
TEST(CudaLayerGraphs, DropoutTrainingReplaysDrawNewMasks) {
    SKIP_WITHOUT_GPU();
    const uint64_t seed = 0xC0FFEEull;
    GraphStack gs(true);
    ASSERT_TRUE(gs.l0 && gs.l1);
    {  // a fresh context has no counter: the capturing call is refused, the capture stays valid and empty
        GraphStack fresh(true);
        DST_ASSERT_OK(dst_context_set_stream(fresh.ctx.get(), fresh.st));
        auto forward = [&] {
            return dst_layer_forward(fresh.l0.get(), nullptr, fresh.dx.view(), &fresh.m, fresh.dh.view());
        };
        expect_refused_in_capture(fresh.st, forward, DST_ERR_STATE, "before capturing");
    }
    DST_ASSERT_OK(dst_context_set_stream(gs.ctx.get(), gs.st));
    DST_ASSERT_OK(gs.run(true));  // eager: makes the counter, sizes the workspace and the saved activations
    DST_ASSERT_OK(dst_context_set_rng_state(gs.ctx.get(), seed, 0));  // the counter back to word 0
    DST_ASSERT_OK(dst_context_synchronize(gs.ctx.get()));
    ASSERT_EQ(cudaStreamBeginCapture(gs.st, cudaStreamCaptureModeThreadLocal), cudaSuccess);
    const dst_status captured = gs.run(true);
    const std::string capture_msg = dst_last_error();
    const dst_status reset = dst_context_set_rng_state(gs.ctx.get(), seed, 0);
    uint64_t counter = 0;
    const dst_status read = dst_context_get_rng_graph_counter(gs.ctx.get(), &counter);
    cudaGraph_t graph = nullptr;
    ASSERT_EQ(cudaStreamEndCapture(gs.st, &graph), cudaSuccess);
    ASSERT_EQ(captured, DST_OK) << capture_msg;
    EXPECT_EQ(reset, DST_ERR_UNSUPPORTED) << "resetting the counter inside a capture";
    EXPECT_EQ(read, DST_ERR_UNSUPPORTED) << "reading the counter inside a capture";
    cudaGraphExec_t exec = nullptr;
    ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
    std::vector<std::vector<unsigned char>> replays;
    for (int replay = 0; replay < 2; ++replay) {
        for (dst_layer *l : {gs.l0.get(), gs.l1.get()}) DST_ASSERT_OK(dst_layer_zero_grads(l));
        ASSERT_EQ(cudaGraphLaunch(exec, gs.st), cudaSuccess);
        DST_ASSERT_OK(dst_context_synchronize(gs.ctx.get()));
        replays.push_back(gs.outputs(true));
    }
    ASSERT_EQ(cudaGraphExecDestroy(exec), cudaSuccess);
    ASSERT_EQ(cudaGraphDestroy(graph), cudaSuccess);
    EXPECT_FALSE(replays[0] == replays[1]) << "two replays drew the same masks";
    uint64_t got_seed = 0, got_offset = 99;
    DST_ASSERT_OK(dst_context_get_rng_state(gs.ctx.get(), &got_seed, &got_offset));
    EXPECT_EQ(got_offset, 0u) << "replays took host offsets";
    DST_ASSERT_OK(dst_context_get_rng_graph_counter(gs.ctx.get(), &counter));
    EXPECT_EQ(counter, 4u) << "two replays of two forwards";
    // The same layers and context, eagerly, with host states naming the words each replay took.
    for (int replay = 0; replay < 2; ++replay) {
        const uint64_t offsets[2] = {uint64_t(2 * replay) << 32, uint64_t(2 * replay + 1) << 32};
        DST_ASSERT_OK(gs.run(true, offsets, dst::graph_dropout_seed(seed)));
        DST_ASSERT_OK(dst_context_synchronize(gs.ctx.get()));
        EXPECT_TRUE(gs.outputs(true) == replays[size_t(replay)])
            << "replay " << replay << " differs from eager calls drawing counter words " << 2 * replay << " and "
            << 2 * replay + 1;
    }
}

// On CUDA, key lengths and (normalize_invertible) LayerNorm γ are checked on the device without waiting:
// the call with a bad value returns DST_OK, writes only finite values (the kernels clamp lengths to
// 0..S), and the failure comes back once, with the value and its index, from a later call:
// dst_context_synchronize, or the next forward/backward (which then does nothing).
TEST(CudaLayerErrors, DeviceChecksAreReportedByALaterCall) {
    SKIP_WITHOUT_GPU();
    const int64_t B = 2, S = 16, H = 64;
    const Case c{false, 2, false, DST_MASK_KEY_LENGTHS, DST_DTYPE_FP32, {int(B), int(S), int(H), 4, 128}};
    Ctx ctx = make_cuda_ctx();
    Layer layer = make_layer(ctx.get(), config_of(c, DST_DTYPE_FP32));
    ASSERT_TRUE(layer);
    randomize_params(layer.get(), 7);
    HostTensor x = HostTensor::from_doubles(DST_DTYPE_FP32, {B, S, H}, Rng(8).normals(B * S * H));
    HostTensor y(DST_DTYPE_FP32, {B, S, H}), lens(DST_DTYPE_INT32, {B}), good(DST_DTYPE_INT32, {B});
    lens.set(0, 16);
    lens.set(1, 17);
    good.set(0, 16);
    good.set(1, 3);
    DevTensor dx(ctx.get(), x), dy(ctx.get(), y), dlen(ctx.get(), lens), dgood(ctx.get(), good);
    dst_mask bad = mask_none(), ok = mask_none();
    bad.kind = ok.kind = DST_MASK_KEY_LENGTHS;
    bad.tensor = *dlen.view();
    ok.tensor = *dgood.view();
    DST_EXPECT_OK(dst_layer_forward(layer.get(), nullptr, dx.view(), &bad, dy.view()));
    EXPECT_FAILS(DST_ERR_INVALID_ARGUMENT, "key-length mask value 17 at index 1",
                 dst_context_synchronize(ctx.get()));
    HostTensor after(DST_DTYPE_FP32, {B, S, H});
    dy.download(after);
    for (int64_t i = 0; i < B * S * H; ++i) ASSERT_TRUE(std::isfinite(after.get(i))) << i;
    EXPECT_EQ(dst_context_synchronize(ctx.get()), DST_OK) << "the failure was reported twice: " << dst_last_error();
    // Reported by the next forward instead: it fails before writing anything.
    DST_EXPECT_OK(dst_layer_forward(layer.get(), nullptr, dx.view(), &bad, dy.view()));
    EXPECT_EQ(dst_context_synchronize(ctx.get()), DST_ERR_INVALID_ARGUMENT);
    DST_EXPECT_OK(dst_layer_forward(layer.get(), nullptr, dx.view(), &bad, dy.view()));
    // (no synchronisation: the next call reports once the device has run the check)
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    HostTensor sent(DST_DTYPE_FP32, {B, S, H});
    sent.poison();
    dy.upload(sent);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    EXPECT_FAILS(DST_ERR_INVALID_ARGUMENT, "key-length mask", dst_layer_forward(layer.get(), nullptr, dx.view(), &ok,
                                                                                   dy.view()));
    DST_ASSERT_OK(dst_context_synchronize(ctx.get()));
    dy.download(after);
    EXPECT_TRUE(after.same_bytes(sent.bytes())) << "the forward that reported the failure wrote to y";
    DST_EXPECT_OK(dst_layer_forward(layer.get(), nullptr, dx.view(), &ok, dy.view()));
    DST_EXPECT_OK(dst_context_synchronize(ctx.get()));
    // A zero γ under normalize_invertible (switch bit 1): backward runs, a later call reports it.
    std::vector<double> gamma(static_cast<size_t>(H), 1.0);
    gamma[5] = 0.0;
    set_param(layer.get(), "norm_w", gamma);
    DST_ASSERT_OK(dst_layer_forward(layer.get(), nullptr, dx.view(), &ok, dy.view()));
    DST_EXPECT_OK(dst_layer_backward(layer.get(), nullptr, dy.view(), dx.view(), DST_GRAD_WRITE));
    EXPECT_FAILS(DST_ERR_INVALID_ARGUMENT, "norm_w has a zero element", dst_context_synchronize(ctx.get()));
    DST_EXPECT_OK(dst_context_synchronize(ctx.get()));
}

// Packed sequences on CUDA: the layer runs on the packed rows (its GEMMs over N rows, attention in the
// packed layout), and every row gets what the padded layer with key lengths gives it on the same device
// within the dtype's bound (forward, dx and parameter gradients; dropout on: a different dropped set
// would be far outside it; the deterministic backward), twice with the same bits; bad offsets come back
// from a later call, with nothing written out of bounds.
TEST(CudaLayerPacked, EveryRowGetsWhatThePaddedLayerGivesAndBadOffsetsAreReported) {
    SKIP_WITHOUT_GPU();
    const std::vector<int32_t> lens = {5, 1, 33, 64, 17};
    const int64_t B = 5, S = 64, H = 64, N = 120;
    for (dst_dtype dt : {DST_DTYPE_FP16, DST_DTYPE_BF16, DST_DTYPE_FP32}) {
        SCOPED_TRACE(dst_dtype_string(dt));
        const Case c{true, 0, true, DST_MASK_KEY_LENGTHS, dt, {int(B), int(S), int(H), 4, 96}};
        Ctx ctx = make_cuda_ctx();
        Layer pl = make_layer(ctx.get(), config_of(c, dt)), ql = make_layer(ctx.get(), config_of(c, dt));
        ASSERT_TRUE(pl && ql);
        randomize_params(pl.get(), 31);
        randomize_params(ql.get(), 31);
        Rng rng(32);
        const std::vector<double> xs = rng.normals(size_t(N * H)), dys = rng.normals(size_t(N * H));
        std::vector<double> xp(size_t(B * S * H), 0.0), dyp(size_t(B * S * H), 0.0);
        HostTensor cu(DST_DTYPE_INT32, {B + 1}), kl(DST_DTYPE_INT32, {B});
        int64_t r = 0;
        cu.set(0, 0);
        for (int64_t b = 0; b < B; ++b) {
            kl.set(b, lens[size_t(b)]);
            for (int64_t s = 0; s < lens[size_t(b)]; ++s, ++r)
                for (int64_t h = 0; h < H; ++h) {
                    xp[size_t((b * S + s) * H + h)] = xs[size_t(r * H + h)];
                    dyp[size_t((b * S + s) * H + h)] = dys[size_t(r * H + h)];
                }
            cu.set(b + 1, double(r));
        }
        ASSERT_EQ(r, N);
        HostTensor hxp = HostTensor::from_doubles(dt, {B, S, H}, xp), hdyp = HostTensor::from_doubles(dt, {B, S, H}, dyp);
        HostTensor hxs = HostTensor::from_doubles(dt, {N, H}, xs), hdys = HostTensor::from_doubles(dt, {N, H}, dys);
        HostTensor zp(dt, {B, S, H}), zs(dt, {N, H});
        DevTensor dxp(ctx.get(), hxp), ddyp(ctx.get(), hdyp), dyp_out(ctx.get(), zp), ddxp(ctx.get(), zp),
            dxs(ctx.get(), hxs), ddys(ctx.get(), hdys), dys_out(ctx.get(), zs), ddxs(ctx.get(), zs),
            dcu(ctx.get(), cu), dkl(ctx.get(), kl);
        dst_mask m = mask_none();
        m.kind = DST_MASK_KEY_LENGTHS;
        m.tensor = *dkl.view();
        DST_ASSERT_OK(dst_context_set_rng_state(ctx.get(), 9, 0));
        DST_ASSERT_OK(dst_layer_forward(pl.get(), nullptr, dxp.view(), &m, dyp_out.view()));
        DST_ASSERT_OK(dst_layer_backward(pl.get(), nullptr, ddyp.view(), ddxp.view(), DST_GRAD_WRITE));
        HostTensor ys1(dt, {N, H}), dxs1(dt, {N, H});
        std::vector<std::vector<double>> grads1;
        for (int run = 0; run < 2; ++run) {
            DST_ASSERT_OK(dst_context_set_rng_state(ctx.get(), 9, 0));
            DST_ASSERT_OK(dst_layer_forward_packed(ql.get(), nullptr, dxs.view(), dcu.view(), S, dys_out.view()));
            DST_ASSERT_OK(dst_layer_backward_packed(ql.get(), nullptr, ddys.view(), ddxs.view(), DST_GRAD_WRITE));
            DST_ASSERT_OK(dst_context_synchronize(ctx.get()));
            if (run == 0) {
                dys_out.download(ys1);
                ddxs.download(dxs1);
                grads1 = all_grads(ql.get());
            }
        }
        HostTensor yp(dt, {B, S, H}), dxph(dt, {B, S, H}), ys(dt, {N, H}), dxsh(dt, {N, H});
        dyp_out.download(yp);
        ddxp.download(dxph);
        dys_out.download(ys);
        ddxs.download(dxsh);
        EXPECT_TRUE(ys.same_bytes(ys1.bytes()) && dxsh.same_bytes(dxs1.bytes())) << "two packed runs differ";
        auto valid = [&](const HostTensor &t) {
            std::vector<double> out;
            for (int64_t b = 0; b < B; ++b)
                for (int64_t i = 0; i < int64_t(b * S + lens[size_t(b)]) - b * S; ++i)
                    for (int64_t h = 0; h < H; ++h) out.push_back(t.get((b * S + i) * H + h));
            return out;
        };
        const double tol = design_tolerance(dt);
        EXPECT_LE(rel_l2(ys.doubles(), valid(yp)), tol) << "forward";
        EXPECT_LE(rel_l2(dxsh.doubles(), valid(dxph)), tol) << "dx";
        const std::vector<std::vector<double>> gp = all_grads(pl.get()), gq = all_grads(ql.get());
        for (size_t g = 0; g < gp.size(); ++g) {
            EXPECT_LE(rel_l2(gq[g], gp[g]), tol) << kParamNames[g];
            EXPECT_TRUE(gq[g] == grads1[g]) << kParamNames[g] << ": two packed runs differ";
        }
        // Offsets that do not add up: the call returns, the next one reports it.
        HostTensor bad(DST_DTYPE_INT32, {B + 1});
        for (int64_t b = 0; b <= B; ++b) bad.set(b, cu.get(b));
        bad.set(3, bad.get(2) - 1);  // sequence 2 gets a negative length
        DevTensor dbad(ctx.get(), bad);
        DST_EXPECT_OK(dst_layer_forward_packed(ql.get(), nullptr, dxs.view(), dbad.view(), S, dys_out.view()));
        EXPECT_FAILS(DST_ERR_INVALID_ARGUMENT, "sequence 2", dst_context_synchronize(ctx.get()));
        DST_EXPECT_OK(dst_context_synchronize(ctx.get()));
    }
}

// The standalone LayerNorm of the C API on device memory, against the CPU backend in FP64 on the same
// rounded inputs: an awkward row count and width, BERT-Large's width, every dtype, write and accumulate.
TEST(CudaLayerNormApi, MatchesCpuFp64) {
    SKIP_WITHOUT_GPU();
    Ctx gpu = make_cuda_ctx();
    Ctx cpu = make_ctx();
    struct Dim {
        int64_t n, h;
    };
    for (Dim d : {Dim{37, 77}, Dim{300, 1024}, Dim{5, 4096}})
        for (dst_dtype dt : {DST_DTYPE_FP32, DST_DTYPE_FP16, DST_DTYPE_BF16, DST_DTYPE_FP64}) {
            SCOPED_TRACE(std::string(dst_dtype_string(dt)) + " n " + std::to_string(d.n) + " h " +
                         std::to_string(d.h));
            Rng rng(uint64_t(d.n * 31 + d.h + int(dt)));
            auto rounded = [&](std::vector<double> v) {
                for (double &e : v) e = round_to(e, dt);
                return v;
            };
            const std::vector<double> xv = rounded(rng.normals(size_t(d.n * d.h), 2.0, 0.5)),
                                      gv = rounded(rng.normals(size_t(d.h), 0.3, 1.0)),
                                      bv = rounded(rng.normals(size_t(d.h), 0.3)),
                                      dyv = rounded(rng.normals(size_t(d.n * d.h)));
            struct Out {
                std::vector<double> y, mean, dx, dg, db;
            };
            auto run = [&](dst_context *ctx, bool on_gpu, dst_dtype t) {
                HostTensor x = HostTensor::from_doubles(t, {d.n, d.h}, xv), g = HostTensor::from_doubles(t, {d.h}, gv),
                           b = HostTensor::from_doubles(t, {d.h}, bv), dy = HostTensor::from_doubles(t, {d.n, d.h}, dyv),
                           y(t, {d.n, d.h}), st(t == DST_DTYPE_FP64 ? DST_DTYPE_FP64 : DST_DTYPE_FP32, {2, d.n}),
                           dx(t, {d.n, d.h}), dg(t, {d.h}), db(t, {d.h});
                for (HostTensor *o : {&y, &st, &dx, &dg, &db}) o->poison();
                Out o;
                if (on_gpu) {
                    DevTensor X(ctx, x), G(ctx, g), B(ctx, b), DY(ctx, dy), Y(ctx, y), ST(ctx, st), DX(ctx, dx),
                        DG(ctx, dg), DB(ctx, db);
                    DST_EXPECT_OK(dst_layernorm_forward(ctx, X.view(), G.view(), B.view(), 1e-5f, Y.view(), ST.view()));
                    DST_EXPECT_OK(dst_layernorm_backward(ctx, DY.view(), X.view(), G.view(), B.view(), ST.view(),
                                                         DX.view(), DG.view(), DB.view(), DST_GRAD_WRITE));
                    // Accumulate: dgamma/dbeta double, dx is written again.
                    DST_EXPECT_OK(dst_layernorm_backward(ctx, DY.view(), X.view(), G.view(), B.view(), ST.view(),
                                                         DX.view(), DG.view(), DB.view(), DST_GRAD_ACCUMULATE));
                    Y.download(y);
                    ST.download(st);
                    DX.download(dx);
                    DG.download(dg);
                    DB.download(db);
                } else {
                    dst_tensor X = x.view(), G = g.view(), B = b.view(), DY = dy.view(), Y = y.view(),
                               ST = st.view(), DX = dx.view(), DG = dg.view(), DB = db.view();
                    DST_EXPECT_OK(dst_layernorm_forward(ctx, &X, &G, &B, 1e-5f, &Y, &ST));
                    DST_EXPECT_OK(dst_layernorm_backward(ctx, &DY, &X, &G, &B, &ST, &DX, &DG, &DB, DST_GRAD_WRITE));
                    DST_EXPECT_OK(
                        dst_layernorm_backward(ctx, &DY, &X, &G, &B, &ST, &DX, &DG, &DB, DST_GRAD_ACCUMULATE));
                }
                o.y = y.doubles();
                o.mean = st.doubles();
                o.mean.resize(size_t(d.n));
                o.dx = dx.doubles();
                o.dg = dg.doubles();
                o.db = db.doubles();
                return o;
            };
            const Out got = run(gpu.get(), true, dt), ref = run(cpu.get(), false, DST_DTYPE_FP64);
            // One rounding of each output: tests/common/bounds.h (fp64: summation order only). dgamma/dbeta are
            // two accumulated sums, each rounded.
            const double tol = design_tolerance(dt);
            EXPECT_LE(rel_l2(got.y, ref.y), tol);
            EXPECT_LE(rel_l2(got.mean, ref.mean), tol);
            EXPECT_LE(rel_l2(got.dx, ref.dx), tol);
            EXPECT_LE(rel_l2(got.dg, ref.dg), tol);
            EXPECT_LE(rel_l2(got.db, ref.db), tol);
        }
}

// A stream of another device is refused, and the context keeps working on its own stream.
TEST(CudaLayerErrors, StreamOfAnotherDevice) {
    int n = 0;
    if (dst_cuda_device_count(&n) != DST_OK || n < 2) GTEST_SKIP() << "needs two CUDA devices";
    const Case c{true, 0, false, DST_MASK_NONE, DST_DTYPE_FP32, {2, 8, 32, 2, 64}};
    Ctx ctx = make_cuda_ctx();
    Layer layer = make_layer(ctx.get(), config_of(c, DST_DTYPE_FP32));
    int prev = 0;
    ASSERT_EQ(cudaGetDevice(&prev), cudaSuccess);
    ASSERT_EQ(cudaSetDevice(1), cudaSuccess);
    cudaStream_t other;
    ASSERT_EQ(cudaStreamCreate(&other), cudaSuccess);
    ASSERT_EQ(cudaSetDevice(prev), cudaSuccess);
    EXPECT_EQ(dst_context_set_stream(ctx.get(), other), DST_ERR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(dst_last_error()).find("device"), std::string::npos) << dst_last_error();
    HostTensor x(DST_DTYPE_FP32, {2, 8, 32});
    DevTensor dx(ctx.get(), x), dy(ctx.get(), x);
    EXPECT_EQ(dst_layer_forward(layer.get(), nullptr, dx.view(), nullptr, dy.view()), DST_OK) << dst_last_error();
    EXPECT_EQ(dst_context_synchronize(ctx.get()), DST_OK);
    ASSERT_EQ(cudaSetDevice(1), cudaSuccess);
    EXPECT_EQ(cudaStreamDestroy(other), cudaSuccess);
    ASSERT_EQ(cudaSetDevice(prev), cudaSuccess);
}

}  // namespace
