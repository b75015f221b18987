// The optimizers and the training engine on the CUDA backend, through the public C API: every
// optimizer step against the CPU twin on the same data (Adam in both weight-decay modes, LAMB with
// both eps forms; fp32, fp16 and bf16 parameters with fp32 masters; one to four chunks; groups;
// clipping; a loss scale), bit-reproducibility, files written on one backend read on the other, the
// loss-scaler sequence of the spec, a boundary step captured into a CUDA graph (which fails if the
// step waits for the device or copies from the host), and a resumed fp16 run matching an
// uninterrupted one bit for bit. Every test skips itself without a GPU.
#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include <unistd.h>

#include "../cpu/engine_util.h"
#include "../common/scratch_dir.h"
#include "../cpu/test_util.h"

using namespace dsttest;

namespace {

// The same tensors on the CPU (host memory) and on the GPU (device copies). `shift` places the GPU
// tensors that many elements past the start of their buffers (shift 1 misaligns them for the
// optimizer's vector path, which then falls back to element accesses).
struct Pair {
    HostTensor hp, hg;                       // the CPU optimizer's tensors
    std::unique_ptr<CtxBuffer> dp, dg;       // the GPU optimizer's
    size_t pshift, gshift;                   // byte offsets of the GPU tensors in dp and dg
    Pair(dst_context *gpu, dst_dtype pdt, dst_dtype gdt, const std::vector<double> &p, int64_t shift = 0)
        : hp(HostTensor::from_doubles(pdt, {static_cast<int64_t>(p.size())}, p)),
          hg(HostTensor(gdt, {static_cast<int64_t>(p.size())})),
          dp(new CtxBuffer(gpu, hp.nbytes() + 16)),
          dg(new CtxBuffer(gpu, hg.nbytes() + 16)),
          pshift(static_cast<size_t>(shift) * dst_dtype_size(pdt)),
          gshift(static_cast<size_t>(shift) * dst_dtype_size(gdt)),
          ctx(gpu) {
        to_context(ctx, pdata(), hp.data(), hp.nbytes());
        to_context(ctx, gdata(), hg.data(), hg.nbytes());
    }
    void *pdata() const { return static_cast<char *>(dp->data()) + pshift; }
    void *gdata() const { return static_cast<char *>(dg->data()) + gshift; }
    dst_tensor pview() const { return shifted(dp->view(hp.dtype(), hp.shape()), pdata()); }
    dst_tensor gview() const { return shifted(dg->view(hg.dtype(), hg.shape()), gdata()); }
    void set_grad(const std::vector<double> &g) {
        hg.set_doubles(g);
        to_context(ctx, gdata(), hg.data(), hg.nbytes());
    }
    std::vector<double> gpu_param() const {
        HostTensor t(hp.dtype(), hp.shape());
        to_host(ctx, t.data(), pdata(), t.nbytes());
        return t.doubles();
    }

private:
    static dst_tensor shifted(dst_tensor t, void *data) {
        t.data = data;
        return t;
    }
    dst_context *ctx;
};

std::vector<double> state(dst_context *ctx, dst_optimizer *o, int i, dst_optimizer_state w) {
    dst_tensor v;
    EXPECT_EQ(dst_optimizer_get_state(o, i, w, &v), DST_OK) << dst_last_error();
    int64_t n = 1;
    for (int d = 0; d < v.ndim; ++d) n *= v.shape[d];
    std::vector<float> f(static_cast<size_t>(n));
    to_host(ctx, f.data(), v.data, f.size() * 4);
    return std::vector<double>(f.begin(), f.end());
}

float lamb_coeff(dst_optimizer *o, int i) {
    dst_optimizer_tensor_info info;
    std::memset(&info, 0, sizeof info);
    info.struct_size = sizeof info;
    EXPECT_EQ(dst_optimizer_get_tensor_info(o, i, &info), DST_OK) << dst_last_error();
    return info.lamb_coeff;
}

struct Rule {
    const char *name;
    dst_optimizer_kind kind;
    bool adam_w_mode, bias_correction, eps_inside_sqrt;
};

class CudaOptimMatchesCpu : public ::testing::TestWithParam<Rule> {};

// Eight tensors (fp32, fp16 and bf16 parameters; fp32, fp16 and bf16 gradients; 1 to 100003 elements;
// two of them one element off their buffers' alignment, which takes the element path),
// two groups, gradients scaled by 8 and clipped to norm 1, three steps on each backend from the same
// values. The norms are summed in another order on the GPU (a block tree) and the element math may be
// contracted into FMAs, so the two agree to fp32 rounding, not bit for bit: masters and moments within
// 2e-6 relative L2 (the CPU suite holds the CPU within 2e-7 of a double reference), 16-bit parameters
// within one rounding of their dtype; and on the GPU every 16-bit parameter is its master rounded once.
TEST_P(CudaOptimMatchesCpu, ThreeSteps) {
    SKIP_WITHOUT_GPU();
    const Rule r = GetParam();
    Ctx cpu = make_ctx(), gpu = make_cuda_ctx();
    dst_optimizer_config c;
    dst_optimizer_config_default(&c);
    c.kind = r.kind;
    c.adam_w_mode = r.adam_w_mode;
    c.bias_correction = r.bias_correction;
    c.eps_inside_sqrt = r.eps_inside_sqrt;
    c.lr = 2e-3f;
    c.weight_decay = 0.01f;
    c.max_coeff = 5.0f;
    c.min_coeff = 0.05f;
    Opt oc = make_opt(cpu.get(), c), og = make_opt(gpu.get(), c);
    dst_param_group g1;
    dst_param_group_default(&g1);
    g1.lr = 5e-4f;
    g1.beta1 = 0.8f;
    g1.eps = 1e-6f;
    DST_ASSERT_OK(dst_optimizer_add_group(oc.get(), &g1, nullptr));
    DST_ASSERT_OK(dst_optimizer_add_group(og.get(), &g1, nullptr));
    struct Spec {
        dst_dtype pdt, gdt;
        int64_t n;
        int group;
        int64_t shift;  // elements: 1 misaligns the GPU tensors
    };
    const Spec specs[] = {{DST_DTYPE_FP32, DST_DTYPE_FP32, 100003, 0, 0}, {DST_DTYPE_FP16, DST_DTYPE_FP16, 7, 1, 0},
                          {DST_DTYPE_BF16, DST_DTYPE_BF16, 32769, 0, 0},   {DST_DTYPE_FP16, DST_DTYPE_FP32, 32768, 1, 0},
                          {DST_DTYPE_FP32, DST_DTYPE_FP32, 1, 1, 0},      {DST_DTYPE_BF16, DST_DTYPE_FP32, 1000, 0, 0},
                          {DST_DTYPE_FP16, DST_DTYPE_FP16, 4099, 1, 1},   {DST_DTYPE_FP32, DST_DTYPE_FP32, 33001, 0, 1}};
    Rng rng(31);
    std::vector<std::unique_ptr<Pair>> xs;
    for (size_t i = 0; i < sizeof specs / sizeof specs[0]; ++i) {
        const Spec &s = specs[i];
        xs.emplace_back(new Pair(gpu.get(), s.pdt, s.gdt, rng.normals(static_cast<size_t>(s.n), 0.5), s.shift));
        const std::string name = "t" + std::to_string(i);
        dst_tensor hp = xs.back()->hp.view(), hg = xs.back()->hg.view();
        dst_tensor dp = xs.back()->pview(), dg = xs.back()->gview();
        DST_ASSERT_OK(dst_optimizer_add_tensor(oc.get(), s.group, name.c_str(), &hp, &hg));
        DST_ASSERT_OK(dst_optimizer_add_tensor(og.get(), s.group, name.c_str(), &dp, &dg));
    }
    for (int step = 0; step < 3; ++step) {
        for (size_t i = 0; i < xs.size(); ++i) {
            std::vector<double> g = rng.normals(static_cast<size_t>(specs[i].n));
            for (double &v : g) v *= 8.0;
            xs[i]->set_grad(g);
        }
        DST_ASSERT_OK(dst_optimizer_step(oc.get(), 8.0f, 1.0f));
        DST_ASSERT_OK(dst_optimizer_step(og.get(), 8.0f, 1.0f));
    }
    float nc = 0.0f, ng = 0.0f;
    DST_ASSERT_OK(dst_optimizer_get_grad_norm(oc.get(), &nc));
    DST_ASSERT_OK(dst_optimizer_get_grad_norm(og.get(), &ng));
    EXPECT_NEAR(ng, nc, 1e-5 * nc);
    for (size_t i = 0; i < xs.size(); ++i) {
        const int k = static_cast<int>(i);
        const bool master = specs[i].pdt != DST_DTYPE_FP32;
        const std::vector<double> pc = master ? state(cpu.get(), oc.get(), k, DST_OPTIMIZER_STATE_MASTER) : xs[i]->hp.doubles();
        const std::vector<double> pg = master ? state(gpu.get(), og.get(), k, DST_OPTIMIZER_STATE_MASTER) : xs[i]->gpu_param();
        EXPECT_LT(rel_l2(pg, pc), 2e-6) << r.name << " tensor " << i << " parameters";
        for (dst_optimizer_state w : {DST_OPTIMIZER_STATE_EXP_AVG, DST_OPTIMIZER_STATE_EXP_AVG_SQ})
            EXPECT_LT(rel_l2(state(gpu.get(), og.get(), k, w), state(cpu.get(), oc.get(), k, w)), 2e-6)
                << r.name << " tensor " << i << " state " << w;
        if (r.kind == DST_OPTIMIZER_LAMB) {
            const float a = lamb_coeff(og.get(), k), b = lamb_coeff(oc.get(), k);
            EXPECT_NEAR(a, b, 1e-5 * b) << "trust ratio of tensor " << i;
        }
        if (master) {
            const std::vector<double> p16 = xs[i]->gpu_param();
            for (size_t e = 0; e < p16.size(); ++e)
                ASSERT_EQ(p16[e], round_to(static_cast<float>(pg[e]), specs[i].pdt)) << "tensor " << i << " element " << e;
            EXPECT_LT(rel_l2(p16, xs[i]->hp.doubles()), specs[i].pdt == DST_DTYPE_FP16 ? 1e-3 : 1e-2) << "tensor " << i;
        }
    }
}

INSTANTIATE_TEST_SUITE_P(Rules, CudaOptimMatchesCpu,
                         ::testing::Values(Rule{"adamw", DST_OPTIMIZER_ADAM, true, true, false},
                                           Rule{"adam_l2", DST_OPTIMIZER_ADAM, false, true, false},
                                           Rule{"adam_l2_nobc", DST_OPTIMIZER_ADAM, false, false, false},
                                           Rule{"lamb", DST_OPTIMIZER_LAMB, true, true, false},
                                           Rule{"lamb_nobc_epsin", DST_OPTIMIZER_LAMB, true, false, true}),
                         [](const ::testing::TestParamInfo<Rule> &i) { return std::string(i.param.name); });

TEST(CudaOptim, StepsAreBitReproducibleAndFilesCrossBackends) {
    SKIP_WITHOUT_GPU();
    auto run = [](dst_context *gpu, std::vector<unsigned char> *bytes, const std::string &save) {
        dst_optimizer_config c;
        dst_optimizer_config_default(&c);
        c.kind = DST_OPTIMIZER_LAMB;
        Opt o = make_opt(gpu, c);
        Rng rng(3);
        Pair x(gpu, DST_DTYPE_FP16, DST_DTYPE_FP16, rng.normals(70001));
        dst_tensor p = x.pview(), g = x.gview();
        EXPECT_EQ(dst_optimizer_add_tensor(o.get(), 0, "x", &p, &g), DST_OK) << dst_last_error();
        for (int s = 0; s < 3; ++s) {
            x.set_grad(rng.normals(70001, 100.0));
            EXPECT_EQ(dst_optimizer_step(o.get(), 64.0f, 0.5f), DST_OK) << dst_last_error();
        }
        *bytes = optimizer_state_bytes(gpu, o.get());
        HostTensor h(DST_DTYPE_FP16, {70001});
        x.dp->download(h);
        const auto pb = h.bytes();
        bytes->insert(bytes->end(), pb.begin(), pb.end());
        if (!save.empty()) {
            EXPECT_EQ(dst_optimizer_save(o.get(), save.c_str()), DST_OK) << dst_last_error();
        }
    };
    Ctx gpu = make_cuda_ctx();
    const std::string path = dst_test::scratch_path("cuda_optim.safetensors");
    std::vector<unsigned char> a, b;
    run(gpu.get(), &a, path);
    run(gpu.get(), &b, "");
    EXPECT_TRUE(a == b) << "two runs on the GPU give the same bits";
    // The GPU's file loads into a CPU optimizer of the same tensors: the same state, bit for bit.
    Ctx cpu = make_ctx();
    dst_optimizer_config c;
    dst_optimizer_config_default(&c);
    c.kind = DST_OPTIMIZER_LAMB;
    Opt oc = make_opt(cpu.get(), c);
    HostTensor hp(DST_DTYPE_FP16, {70001}), hg(DST_DTYPE_FP16, {70001});
    dst_tensor pv = hp.view(), gv = hg.view();
    DST_ASSERT_OK(dst_optimizer_add_tensor(oc.get(), 0, "x", &pv, &gv));
    DST_ASSERT_OK(dst_optimizer_load(oc.get(), path.c_str()));
    std::vector<unsigned char> c_state = optimizer_state_bytes(cpu.get(), oc.get());
    a.resize(c_state.size());
    EXPECT_TRUE(c_state == a);
    std::remove(path.c_str());
}

// ================================ the engine on the GPU ==========================================

TEST(CudaEngine, LossScalerSequenceOfTheSpec) {
    SKIP_WITHOUT_GPU();
    Ctx gpu = make_cuda_ctx();
    Engine e = make_engine(gpu.get(), R"({"train_batch_size": 1, "optimizer": {"type": "adam"},
        "fp16": {"enabled": true, "initial_scale_power": 16, "loss_scale_window": 4, "min_loss_scale": 1}})");
    Pair x(gpu.get(), DST_DTYPE_FP16, DST_DTYPE_FP16, {1.0, -2.0, 0.5});
    dst_tensor p = x.pview(), g = x.gview();
    DST_ASSERT_OK(dst_optimizer_add_tensor(optimizer_of(e.get()), 0, "x", &p, &g));
    const std::string pattern = ".....X.....XX.....";
    std::vector<float> used;
    for (char c : pattern) {
        used.push_back(engine_state(e.get()).loss_scale);
        x.set_grad({0.25, c == 'X' ? INFINITY : 0.5, -1.0});
        const std::vector<double> before = x.gpu_param();
        DST_ASSERT_OK(dst_engine_step(e.get()));
        const dst_engine_state s = engine_state(e.get());
        EXPECT_EQ(s.last_overflow, c == 'X');
        if (c == 'X') {
            EXPECT_TRUE(bit_equal(x.gpu_param(), before)) << "an overflowed step changes nothing";
        }
        HostTensor gh(DST_DTYPE_FP16, {3});
        x.dg->download(gh);
        EXPECT_EQ(gh.doubles(), std::vector<double>(3, 0.0)) << "gradients zeroed at the boundary";
    }
    std::vector<float> want;
    for (const auto &run : std::vector<std::pair<float, int>>{{65536, 5}, {131072, 1}, {65536, 5}, {131072, 1}, {65536, 1}, {32768, 5}})
        want.insert(want.end(), static_cast<size_t>(run.second), run.first);
    EXPECT_EQ(used, want);
    EXPECT_EQ(engine_state(e.get()).loss_scale, 65536.0f);
    EXPECT_EQ(engine_state(e.get()).skipped_steps, 3);
    // The loss scale on the device, applied without reading it back.
    HostTensor t = HostTensor::from_doubles(DST_DTYPE_FP16, {2}, {0.5, -0.25});
    CtxBuffer d(gpu.get(), t.nbytes());
    d.upload(t);
    dst_tensor dv = d.view(DST_DTYPE_FP16, {2});
    DST_ASSERT_OK(dst_engine_scale_loss_gradient(e.get(), &dv));
    d.download(t);
    EXPECT_EQ(t.doubles(), (std::vector<double>{32768.0, -16384.0}));
}

// A boundary step and the loss-gradient scaling, captured into a CUDA graph on the caller's stream:
// the capture fails if either call synchronizes, copies to or from pageable host memory or allocates.
TEST(CudaEngine, StepNeverWaitsForTheDevice) {
    SKIP_WITHOUT_GPU();
    Ctx gpu = make_cuda_ctx();
    Engine e = make_engine(gpu.get(), R"({"train_batch_size": 1, "gradient_clipping": 1.0,
        "optimizer": {"type": "lamb"}, "scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": 10}},
        "fp16": {"enabled": true}})");
    Pair x(gpu.get(), DST_DTYPE_FP16, DST_DTYPE_FP16, std::vector<double>(5000, 0.5));
    dst_tensor p = x.pview(), g = x.gview();
    DST_ASSERT_OK(dst_optimizer_add_tensor(optimizer_of(e.get()), 0, "x", &p, &g));
    // The first step uploads the tables (the only wait). WarmupLR's first two steps have lr 0 (its log
    // ramp starts at log 1), so the captured step is the third, the first that moves the weights.
    for (int k = 0; k < 2; ++k) {
        x.set_grad(std::vector<double>(5000, 1.0));
        DST_ASSERT_OK(dst_engine_step(e.get()));
    }
    cudaStream_t stream = nullptr;
    ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
    DST_ASSERT_OK(dst_context_set_stream(gpu.get(), stream));
    x.set_grad(std::vector<double>(5000, 1.0));
    DST_ASSERT_OK(dst_context_synchronize(gpu.get()));
    CtxBuffer lg(gpu.get(), 64 * 2);
    dst_tensor lv = lg.view(DST_DTYPE_FP16, {64});
    ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal), cudaSuccess);
    const dst_status s1 = dst_engine_scale_loss_gradient(e.get(), &lv);
    const dst_status s2 = dst_engine_step(e.get());
    cudaGraph_t graph = nullptr;
    const cudaError_t end = cudaStreamEndCapture(stream, &graph);
    EXPECT_EQ(s1, DST_OK) << dst_last_error();
    EXPECT_EQ(s2, DST_OK) << dst_last_error();
    ASSERT_EQ(end, cudaSuccess) << cudaGetErrorString(end) << ": a captured call waited or copied from the host";
    ASSERT_NE(graph, nullptr);
    cudaGraphExec_t exec = nullptr;
    ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
    // The step moves the fp32 masters by lr·‖w‖-sized amounts, under half an fp16 ulp of 0.5 here: the
    // masters show it, the fp16 copies need not.
    const std::vector<double> before = state(gpu.get(), optimizer_of(e.get()), 0, DST_OPTIMIZER_STATE_MASTER);
    ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    EXPECT_FALSE(bit_equal(state(gpu.get(), optimizer_of(e.get()), 0, DST_OPTIMIZER_STATE_MASTER), before))
        << "the replayed graph applied a step";
    EXPECT_EQ(engine_state(e.get()).skipped_steps, 0);
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
    DST_ASSERT_OK(dst_context_set_stream(gpu.get(), nullptr));
    cudaStreamDestroy(stream);
}

class CudaEngineResume : public ::testing::TestWithParam<const char *> {};

// As the CPU suite's EngineResume, on the GPU: fp16 layers with dropout, dynamic loss scaling,
// clipping, a schedule; a run resumed from a checkpoint in a new context continues bit for bit.
TEST_P(CudaEngineResume, ContinuesBitIdentically) {
    SKIP_WITHOUT_GPU();
    expect_resume_bit_identical(make_cuda_ctx, resume_config(GetParam()),
                                dst_test::scratch_path(std::string("cuda_resume_") + GetParam()));
}

INSTANTIATE_TEST_SUITE_P(Optimizers, CudaEngineResume, ::testing::Values("adam", "lamb"));

}  // namespace
