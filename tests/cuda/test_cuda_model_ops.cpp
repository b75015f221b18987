// The model ops of BERT pre-training on the CUDA backend, through the public C API, against the CPU
// reference backend (the twin, same dtype, same inputs): every output by relative L2 error
// ‖gpu − cpu‖/‖cpu‖ within tests/common/bounds.h (FP64 1e-12, FP32 1e-5, FP16 1e-3, BF16 1e-2);
// outputs are poisoned with NaN first, so an unwritten element fails; NaN never passes. Every case runs twice on
// the GPU and must be bit-identical (no floating-point atomics). Shapes are awkward on purpose: odd
// B, S = 1, 7, 129, V not a multiple of 8, H not a multiple of 64. Each case runs once more with deferred
// index checks, which must give the same bytes. Bad indices on device memory give the same error as
// on the CPU and leave the outputs untouched; with deferred checks a later call reports them. Skips without a GPU.
#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <climits>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <ostream>
#include <sstream>
#include <string>
#include <vector>

#include "../common/bounds.h"
#include "../common/model_ops_cases.h"

using namespace dsttest;

namespace {

bool have_gpu() {
    int n = 0;
    return dst_cuda_device_count(&n) == DST_OK && n > 0;
}

struct Named {
    std::string name;
    std::function<ModelOpCase()> make;
};
void PrintTo(const Named &n, std::ostream *os) { *os << n.name; }

std::string dtname(dst_dtype dt) { return dst_dtype_string(dt); }

std::vector<Named> all_cases() {
    std::vector<Named> v;
    const dst_dtype dts[] = {DST_DTYPE_FP64, DST_DTYPE_FP32, DST_DTYPE_FP16, DST_DTYPE_BF16};
    for (dst_dtype dt : dts) {
        const std::string d = dtname(dt);
        struct E { int64_t B, S, H, V, P, T; bool types; };
        // The last two have runs of hundreds of equal ids (V = 3; a third of the ids in [0, 4)): the word
        // table's chunked partial sums, with runs starting and ending inside chunks. H = 100 takes the
        // element kernels in fp16 and bf16, the other cases 16-byte vectors; H = 1032 needs several vectors
        // per thread of a row in every dtype.
        const E es[] = {{3, 1, 40, 37, 4, 2, true},      {5, 7, 100, 1001, 9, 2, false},
                        {3, 129, 72, 30523, 130, 3, true}, {2, 160, 1032, 1001, 160, 2, true},
                        {4, 200, 40, 3, 200, 1, false},   {8, 300, 72, 30523, 300, 2, true}};
        for (const E &e : es) {
            std::ostringstream s;
            s << "B" << e.B << "_S" << e.S << "_H" << e.H << "_V" << e.V << (e.types ? "_types" : "");
            v.push_back({"embedding_fwd_" + d + "_" + s.str(),
                         [=] { return embedding_fwd_case(dt, e.B, e.S, e.H, e.V, e.P, e.T, e.types, 1); }});
            for (bool acc : {false, true})
                v.push_back({"embedding_bwd_" + d + "_" + s.str() + (acc ? "_acc" : ""),
                             [=] { return embedding_bwd_case(dt, e.B, e.S, e.H, e.V, e.P, e.T, e.types, acc, 2); }});
        }
        struct D { int64_t n, k, m; };
        const D ds[] = {{7, 33, 17}, {129, 100, 257}, {1, 72, 2}};
        for (const D &x : ds)
            for (dst_activation act : {DST_ACTIVATION_NONE, DST_ACTIVATION_GELU_ERF, DST_ACTIVATION_GELU_TANH,
                                       DST_ACTIVATION_TANH}) {
                std::ostringstream s;
                s << "n" << x.n << "_k" << x.k << "_m" << x.m << "_act" << act;
                v.push_back({"dense_fwd_" + d + "_" + s.str(), [=] { return dense_fwd_case(dt, x.n, x.k, x.m, act, true, 3); }});
                v.push_back({"dense_bwd_" + d + "_" + s.str(),
                             [=] { return dense_bwd_case(dt, x.n, x.k, x.m, act, act == DST_ACTIVATION_TANH, 4); }});
            }
        // Rows of 100 elements (element copies) and of 1024 (16-byte copies in every dtype).
        for (int64_t h : {int64_t(100), int64_t(1024)}) {
            const std::string hs = "_N387_M60_H" + std::to_string(h);
            v.push_back({"gather_rows_" + d + hs, [=] { return gather_case(dt, 387, 60, h, 5); }});
            for (bool acc : {false, true})
                v.push_back({"scatter_rows_" + d + hs + std::string(acc ? "_acc" : ""),
                             [=] { return scatter_case(dt, 387, 60, h, acc, 6); }});
        }
        // Dropout: the same Philox mask on both backends (odd sizes: a partial group of four at the end).
        for (float p : {0.0f, 0.1f, 0.5f}) {
            std::ostringstream s;
            s << "B3_S129_H100_p" << static_cast<int>(p * 100);
            v.push_back({"dropout_fwd_" + d + "_" + s.str(), [=] { return dropout_fwd_case(dt, {3, 129, 100}, p, 8); }});
            v.push_back({"dropout_bwd_" + d + "_" + s.str(), [=] { return dropout_bwd_case(dt, {3, 129, 100}, p, 9); }});
        }
        v.push_back({"dropout_fwd_" + d + "_n7", [=] { return dropout_fwd_case(dt, {7}, 0.3f, 10); }});
        struct X { int64_t n, m, h, v; bool rows, bias, grads, acc; double scale; double tol = 1.0; };
        const X xs[] = {{387, 59, 72, 1001, true, true, true, true, 1.0},     // MLM: rows of [B·S, H], tied dW
                        {129, 129, 100, 30523, false, true, true, false, 8.0},  // V like BERT's, not a multiple of 8
                        {7, 7, 72, 2, false, true, true, false, 1.0},         // NSP: two classes
                        {3, 1, 40, 37, true, false, false, false, 1.0},       // evaluation: loss only, S = 1
                        // Even V: the register form of the row kernel (fp32 arithmetic), 16 pairs per
                        // thread at BERT's V, one pair at V = 2, and past its largest V the general form.
                        {97, 41, 72, 30522, true, true, true, false, 2.0},
                        {9, 9, 40, 2050, false, false, true, true, 1.0},
                        // dx = g·W sums 32 770 products per element in each backend's own fp32 GEMM
                        // order (cuBLAS, OpenBLAS): they differ by ~√K·ε (1.1·10⁻⁵ seen), so this case's
                        // ceiling is twice the fp32 bound (the other dtypes' bounds are far above it).
                        {3, 3, 40, 32770, false, true, true, false, 1.0, 2.0}};
        for (const X &x : xs) {
            std::ostringstream s;
            s << "n" << x.n << "_m" << x.m << "_h" << x.h << "_v" << x.v << (x.rows ? "_rows" : "")
              << (x.grads ? "_grads" : "_loss") << (x.acc ? "_acc" : "");
            v.push_back({"linear_cross_entropy_" + d + "_" + s.str(), [=] {
                             ModelOpCase c = cross_entropy_case(dt, x.n, x.m, x.h, x.v, x.rows, x.bias, x.grads,
                                                                x.acc, x.scale, 7);
                             c.tol_scale = x.tol;
                             return c;
                         }});
        }
    }
    return v;
}

double compare(const HostTensor &got, const HostTensor &ref, int64_t *bad) {
    double num = 0, den = 0;
    *bad = 0;
    for (int64_t i = 0; i < ref.numel(); ++i) {
        const double g = got.get(i), e = ref.get(i);
        if (std::isnan(g) || std::isnan(e) || !std::isfinite(g) || !std::isfinite(e)) {
            ++*bad;
            continue;
        }
        num += (g - e) * (g - e);
        den += e * e;
    }
    return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

class CudaModelOps : public ::testing::TestWithParam<Named> {};

TEST_P(CudaModelOps, MatchesCpuAndIsDeterministic) {
    if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
    const ModelOpCase c = GetParam().make();
    Ctx cpu = make_ctx();
    dst_context *g = nullptr;
    ASSERT_EQ(dst_context_create(DST_BACKEND_CUDA, 0, &g), DST_OK) << dst_last_error();
    Ctx gpu(g);
    std::vector<HostTensor> ref, got, again;
    std::string err;
    ASSERT_EQ(run_case(cpu.get(), c, false, &ref, &err), DST_OK) << "cpu: " << err;
    ASSERT_EQ(run_case(gpu.get(), c, true, &got, &err), DST_OK) << "cuda: " << err;
    ASSERT_EQ(run_case(gpu.get(), c, true, &again, &err), DST_OK) << "cuda (second run): " << err;
    // Deferred index checks (dst_context_set_index_checks) change when the indices are checked, not
    // what the op computes.
    std::vector<HostTensor> deferred;
    ASSERT_EQ(dst_context_set_index_checks(gpu.get(), DST_INDEX_CHECKS_DEFERRED), DST_OK);
    ASSERT_EQ(run_case(gpu.get(), c, true, &deferred, &err), DST_OK) << "cuda (deferred checks): " << err;
    ASSERT_EQ(dst_context_synchronize(gpu.get()), DST_OK) << dst_last_error();
    const double tol = design_tolerance(c.dt) * c.tol_scale;
    for (size_t s = 0; s < c.slots.size(); ++s) {
        const OpSlot &sl = c.slots[s];
        if (!sl.out || !sl.present) continue;
        EXPECT_TRUE(got[s].same_bytes(again[s].bytes())) << sl.name << ": two GPU runs differ";
        EXPECT_TRUE(got[s].same_bytes(deferred[s].bytes())) << sl.name << ": deferred index checks changed the result";
        if (sl.name == "counts") {
            EXPECT_EQ(got[s].get(0), ref[s].get(0)) << "valid-label count";
            // A near-tie of the two largest logits may resolve differently under another summation order.
            EXPECT_LE(std::fabs(got[s].get(1) - ref[s].get(1)), 1.0) << "argmax hits";
            continue;
        }
        int64_t bad = 0;
        const double e = compare(got[s], ref[s], &bad);
        EXPECT_EQ(bad, 0) << sl.name << ": NaN or non-finite values";
        EXPECT_LE(e, tol) << sl.name << ": relative L2 error vs the CPU backend";
    }
}

INSTANTIATE_TEST_SUITE_P(Ops, CudaModelOps, ::testing::ValuesIn(all_cases()),
                         [](const ::testing::TestParamInfo<Named> &info) { return info.param.name; });

// Out-of-range and repeated indices in device memory: the status and message of the CPU backend, and
// the outputs untouched.
TEST(CudaModelOpsErrors, BadIndicesOnTheDevice) {
    if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
    dst_context *g = nullptr;
    ASSERT_EQ(dst_context_create(DST_BACKEND_CUDA, 0, &g), DST_OK) << dst_last_error();
    Ctx gpu(g);
    auto expect_refused = [&](const ModelOpCase &c, const std::string &needle) {
        std::vector<HostTensor> r;
        std::string err;
        EXPECT_EQ(run_case(gpu.get(), c, true, &r, &err), DST_ERR_INVALID_ARGUMENT) << c.name;
        EXPECT_NE(err.find(needle), std::string::npos) << "message: " << err;
    };
    ModelOpCase e = embedding_fwd_case(DST_DTYPE_FP32, 3, 7, 40, 37, 8, 2, true, 1);
    e.slots[0].t.set(20, 37);
    expect_refused(e, "ids[20] is 37");
    ModelOpCase b = embedding_bwd_case(DST_DTYPE_FP16, 3, 7, 40, 37, 8, 2, true, false, 1);
    b.slots[2].t.set(5, 2);
    expect_refused(b, "types[5] is 2");
    ModelOpCase s = scatter_case(DST_DTYPE_BF16, 50, 9, 8, false, 1);
    s.slots[1].t.set(8, s.slots[1].t.get(3));
    expect_refused(s, "index[3]");
    ModelOpCase x = cross_entropy_case(DST_DTYPE_FP32, 40, 9, 8, 13, true, true, true, false, 1.0, 1);
    x.slots[4].t.set(6, 13);
    expect_refused(x, "labels[6] is 13");
    x.slots[4].t.set(6, 0);
    x.slots[1].t.set(2, 40);
    expect_refused(x, "rows[2] is 40");
    // The context is usable afterwards.
    std::vector<HostTensor> r;
    std::string err;
    EXPECT_EQ(run_case(gpu.get(), cross_entropy_case(DST_DTYPE_FP32, 40, 9, 8, 13, true, true, true, false, 1.0, 1),
                       true, &r, &err),
              DST_OK)
        << err;
}

// Deferred index checks: a call with bad indices returns DST_OK without waiting; the failure comes,
// once, from the next call on the context (dst_context_synchronize here, a model op below) with the
// call, the tensor, the element and the value. Every value class: one past the end, −1 (or −2 for
// labels), INT32_MIN, INT32_MAX; `compute-sanitizer --tool memcheck` on this test checks that the
// kernels stay inside their tensors (tools/gpu-check.sh full runs it).
TEST(CudaModelOpsErrors, DeferredIndexChecksReportLater) {
    if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
    dst_context *g = nullptr;
    ASSERT_EQ(dst_context_create(DST_BACKEND_CUDA, 0, &g), DST_OK) << dst_last_error();
    Ctx gpu(g);
    ASSERT_EQ(dst_context_set_index_checks(gpu.get(), DST_INDEX_CHECKS_DEFERRED), DST_OK);
    auto expect_reported = [&](const ModelOpCase &c, const std::string &needle, std::vector<HostTensor> *r) {
        std::string err;
        EXPECT_EQ(run_case(gpu.get(), c, true, r, &err), DST_OK) << c.name << ": " << err;
        EXPECT_EQ(dst_context_synchronize(gpu.get()), DST_ERR_INVALID_ARGUMENT) << c.name << " was not reported";
        const std::string msg = dst_last_error();
        EXPECT_NE(msg.find("dst_context_synchronize: an earlier call, "), std::string::npos) << msg;
        EXPECT_NE(msg.find(needle), std::string::npos) << "message: " << msg;
        EXPECT_EQ(dst_context_synchronize(gpu.get()), DST_OK) << "reported twice: " << dst_last_error();
    };
    const int32_t extremes[] = {-1, INT32_MIN, INT32_MAX};
    std::vector<HostTensor> r;
    {
        ModelOpCase e = embedding_fwd_case(DST_DTYPE_FP32, 3, 7, 40, 37, 8, 2, true, 1);
        e.slots[0].t.set(20, 37);
        expect_reported(e, "dst_embedding_forward: ids value 37 at index 20 is outside 0..36", &r);
        for (int32_t v : extremes) {
            e.slots[0].t.set(20, v);
            expect_reported(e, "ids value " + std::to_string(v) + " at index 20", &r);
        }
        e.slots[0].t.set(20, 0);
        e.slots[1].t.set(4, 2);
        expect_reported(e, "dst_embedding_forward: types value 2 at index 4 is outside 0..1", &r);
    }
    for (dst_dtype dt : {DST_DTYPE_FP16, DST_DTYPE_FP32}) {  // the vector and the element word sums
        for (bool acc : {false, true}) {
            ModelOpCase b = embedding_bwd_case(dt, 3, 129, 72, 1001, 130, 3, true, acc, 1);
            for (int32_t v : extremes) {
                b.slots[1].t.set(7, v);
                b.slots[1].t.set(300, v);
                expect_reported(b, "dst_embedding_backward: ids value " + std::to_string(v) + " at index 7", &r);
            }
            b.slots[1].t.set(7, 0);
            b.slots[1].t.set(300, 0);
            b.slots[2].t.set(11, -1);
            expect_reported(b, "dst_embedding_backward: types value -1 at index 11 is outside 0..2", &r);
        }
    }
    {  // gather: a bad index reads as a row of zeros (the output was poisoned with NaN)
        ModelOpCase ga = gather_case(DST_DTYPE_BF16, 50, 9, 1024, 1);
        for (int32_t v : {50, -1, INT32_MIN, INT32_MAX}) {
            ga.slots[1].t.set(4, v);
            expect_reported(ga, "dst_gather_rows: index value " + std::to_string(v) + " at index 4 is outside 0..49",
                            &r);
            for (int64_t j = 0; j < 1024; ++j) ASSERT_EQ(r[2].get(4 * 1024 + j), 0.0) << "gathered row 4, column " << j;
        }
    }
    {  // scatter: a bad index is skipped; a repeated one is reported as such
        ModelOpCase sc = scatter_case(DST_DTYPE_FP32, 50, 9, 8, false, 1);
        const double kept = sc.slots[1].t.get(3);
        sc.slots[1].t.set(3, 50);
        expect_reported(sc, "dst_scatter_rows: index value 50 at index 3 is outside 0..49", &r);
        for (int64_t j = 0; j < 8; ++j) EXPECT_EQ(r[2].get(static_cast<int64_t>(kept) * 8 + j), 0.0) << "row not skipped";
        sc.slots[1].t.set(3, INT32_MIN);
        expect_reported(sc, "index value -2147483648 at index 3", &r);
        sc.slots[1].t.set(3, sc.slots[1].t.get(5));
        expect_reported(sc, "dst_scatter_rows: index value " + std::to_string(static_cast<int>(sc.slots[1].t.get(5))) +
                                " at index 3 occurs more than once", &r);
        ModelOpCase sa = scatter_case(DST_DTYPE_FP16, 50, 9, 100, true, 1);
        sa.slots[1].t.set(0, INT32_MAX);
        expect_reported(sa, "dst_scatter_rows: index value 2147483647 at index 0", &r);
    }
    {  // cross-entropy: a label outside [0, V) is ignored (not counted), a bad row reported
        ModelOpCase x = cross_entropy_case(DST_DTYPE_FP32, 40, 9, 8, 13, true, true, true, false, 1.0, 1);
        int valid = 0;
        for (int64_t i = 0; i < 9; ++i) valid += x.slots[4].t.get(i) >= 0 && i != 6;
        for (int32_t v : {13, -2, INT32_MIN, INT32_MAX}) {
            x.slots[4].t.set(6, v);
            expect_reported(x, "dst_linear_cross_entropy: labels value " + std::to_string(v) + " at index 6 is outside -1..12",
                            &r);
            EXPECT_EQ(r[6].get(0), valid) << "the bad label was counted";
        }
        x.slots[4].t.set(6, 0);
        for (int32_t v : {40, -1, INT32_MAX}) {
            x.slots[1].t.set(2, v);
            expect_reported(x, "dst_linear_cross_entropy: rows value " + std::to_string(v) + " at index 2 is outside 0..39",
                            &r);
        }
        x.slots[1].t.set(2, x.slots[1].t.get(0));
        expect_reported(x, "rows value", &r);
        ModelOpCase ok = cross_entropy_case(DST_DTYPE_FP32, 40, 9, 8, 13, true, true, true, false, 1.0, 1);
        std::string err;
        ASSERT_EQ(run_case(gpu.get(), ok, true, &r, &err), DST_OK) << err;
        ASSERT_EQ(dst_context_synchronize(gpu.get()), DST_OK) << "a good call reported: " << dst_last_error();
    }
    {  // The next model op reports it, before doing anything.
        ModelOpCase ga = gather_case(DST_DTYPE_FP32, 50, 9, 8, 1);
        ModelOpCase bad = gather_case(DST_DTYPE_FP32, 50, 9, 8, 1);
        bad.slots[1].t.set(1, -7);
        std::string err;
        ASSERT_EQ(run_case(gpu.get(), bad, true, &r, &err), DST_OK) << err;  // read back: the device has run it
        EXPECT_EQ(run_case(gpu.get(), ga, true, &r, &err), DST_ERR_INVALID_ARGUMENT);
        EXPECT_NE(err.find("dst_gather_rows: an earlier call, dst_gather_rows: index value -7 at index 1"),
                  std::string::npos)
            << err;
        EXPECT_EQ(run_case(gpu.get(), ga, true, &r, &err), DST_OK) << "reported twice: " << err;
        EXPECT_EQ(dst_context_synchronize(gpu.get()), DST_OK) << dst_last_error();
    }
}

// A case's tensors in device memory: views for its call, and downloads.
struct DeviceCase {
    dst_context *ctx;
    const ModelOpCase &c;
    std::vector<void *> dev;
    std::vector<dst_tensor> views;
    std::vector<dst_tensor *> ptrs;
    DeviceCase(dst_context *x, const ModelOpCase &mc)
        : ctx(x), c(mc), dev(mc.slots.size(), nullptr), views(mc.slots.size()), ptrs(mc.slots.size(), nullptr) {
        for (size_t i = 0; i < c.slots.size(); ++i) {
            views[i] = c.slots[i].t.view();
            if (!c.slots[i].present) continue;
            EXPECT_EQ(dst_malloc(ctx, c.slots[i].t.nbytes(), &dev[i]), DST_OK) << dst_last_error();
            upload(i, c.slots[i].t);
            views[i].data = dev[i];
            ptrs[i] = &views[i];
        }
    }
    ~DeviceCase() {
        for (void *p : dev) dst_free(ctx, p);
    }
    void upload(size_t i, const HostTensor &t) {
        EXPECT_EQ(dst_memcpy(ctx, dev[i], t.data(), t.nbytes(), DST_COPY_HOST_TO_CONTEXT), DST_OK) << dst_last_error();
    }
    void poison_outputs() {
        for (size_t i = 0; i < c.slots.size(); ++i)
            if (dev[i] && c.slots[i].out) {
                HostTensor p = clone(c.slots[i].t);
                p.poison();
                upload(i, p);
            }
    }
    HostTensor download(size_t i) {
        HostTensor back = clone(c.slots[i].t);
        EXPECT_EQ(dst_memcpy(ctx, back.data(), dev[i], back.nbytes(), DST_COPY_CONTEXT_TO_HOST), DST_OK);
        return back;
    }
    std::vector<unsigned char> outputs() {
        std::vector<unsigned char> all;
        for (size_t i = 0; i < c.slots.size(); ++i)
            if (dev[i] && c.slots[i].out) {
                const HostTensor back = download(i);
                const size_t at = all.size();
                all.resize(at + back.nbytes());
                std::memcpy(all.data() + at, back.data(), back.nbytes());
            }
        return all;
    }
    dst_status call() { return c.call(ctx, ptrs); }
};

// With deferred index checks the model ops never wait, so they can be captured in a CUDA graph: an
// embedding lookup and the fused linear + cross-entropy (its GEMMs included), captured once and
// replayed, give the bytes of the eager calls, and a bad id written between two replays is reported
// after the replay. With eager checks an op that takes indices is refused on the capturing stream
// before it queues anything (the capture stays valid and empty), and so is a dropout with p > 0.
TEST(CudaModelOpsGraphs, DeferredChecksCaptureAndReplay) {
    if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
    dst_context *g = nullptr;
    ASSERT_EQ(dst_context_create(DST_BACKEND_CUDA, 0, &g), DST_OK) << dst_last_error();
    Ctx gpu(g);
    const ModelOpCase e = embedding_fwd_case(DST_DTYPE_BF16, 3, 7, 40, 37, 8, 2, true, 1);
    const ModelOpCase x = cross_entropy_case(DST_DTYPE_FP16, 40, 9, 72, 1001, true, true, true, false, 1.0, 2);
    DeviceCase de(gpu.get(), e), dx(gpu.get(), x);
    cudaStream_t st;
    ASSERT_EQ(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking), cudaSuccess);
    ASSERT_EQ(dst_context_set_stream(gpu.get(), st), DST_OK);
    ASSERT_EQ(dst_context_set_index_checks(gpu.get(), DST_INDEX_CHECKS_DEFERRED), DST_OK);
    auto both = [&] {
        dst_status s = de.call();
        return s == DST_OK ? dx.call() : s;
    };
    ASSERT_EQ(both(), DST_OK) << dst_last_error();  // eager: also grows the workspace
    ASSERT_EQ(dst_context_synchronize(gpu.get()), DST_OK) << dst_last_error();
    const auto eager_e = de.outputs(), eager_x = dx.outputs();

    ASSERT_EQ(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal), cudaSuccess);
    const dst_status captured = both();
    cudaGraph_t graph = nullptr;
    ASSERT_EQ(cudaStreamEndCapture(st, &graph), cudaSuccess);
    ASSERT_EQ(captured, DST_OK) << dst_last_error();
    cudaGraphExec_t exec = nullptr;
    ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
    for (int replay = 0; replay < 2; ++replay) {
        de.poison_outputs();
        dx.poison_outputs();
        ASSERT_EQ(cudaGraphLaunch(exec, st), cudaSuccess);
        ASSERT_EQ(dst_context_synchronize(gpu.get()), DST_OK) << dst_last_error();
        EXPECT_TRUE(de.outputs() == eager_e) << "embedding, replay " << replay << " differs from the eager call";
        EXPECT_TRUE(dx.outputs() == eager_x) << "cross-entropy, replay " << replay << " differs from the eager call";
    }
    HostTensor ids = clone(e.slots[0].t);
    ids.set(5, 37);
    de.upload(0, ids);
    ASSERT_EQ(cudaGraphLaunch(exec, st), cudaSuccess);
    EXPECT_EQ(dst_context_synchronize(gpu.get()), DST_ERR_INVALID_ARGUMENT) << "the replay did not check the ids";
    EXPECT_NE(std::string(dst_last_error()).find("dst_embedding_forward: ids value 37 at index 5"), std::string::npos)
        << dst_last_error();
    EXPECT_EQ(dst_context_synchronize(gpu.get()), DST_OK) << dst_last_error();
    ASSERT_EQ(cudaGraphExecDestroy(exec), cudaSuccess);
    ASSERT_EQ(cudaGraphDestroy(graph), cudaSuccess);

    // Eager checks on a capturing stream: refused, nothing queued, the capture still valid.
    ASSERT_EQ(dst_context_set_index_checks(gpu.get(), DST_INDEX_CHECKS_EAGER), DST_OK);
    de.upload(0, e.slots[0].t);
    ASSERT_EQ(dst_context_synchronize(gpu.get()), DST_OK);
    ASSERT_EQ(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal), cudaSuccess);
    EXPECT_EQ(de.call(), DST_ERR_UNSUPPORTED);
    EXPECT_NE(std::string(dst_last_error()).find("DST_INDEX_CHECKS_DEFERRED"), std::string::npos) << dst_last_error();
    EXPECT_EQ(dx.call(), DST_ERR_UNSUPPORTED);
    dst_tensor drop = *dx.ptrs[0];  // x of the cross-entropy case: fp16 [40, 72]
    EXPECT_EQ(dst_dropout_forward(gpu.get(), &drop, 0.1f, &drop, nullptr, nullptr), DST_ERR_UNSUPPORTED);
    EXPECT_NE(std::string(dst_last_error()).find("capturing"), std::string::npos) << dst_last_error();
    ASSERT_EQ(cudaStreamEndCapture(st, &graph), cudaSuccess) << "a refused call invalidated the capture";
    size_t nodes = 99;
    ASSERT_EQ(cudaGraphGetNodes(graph, nullptr, &nodes), cudaSuccess);
    EXPECT_EQ(nodes, 0u) << "a refused call queued work";
    ASSERT_EQ(cudaGraphDestroy(graph), cudaSuccess);
    ASSERT_EQ(de.call(), DST_OK) << "eager calls after the capture: " << dst_last_error();
    ASSERT_EQ(dst_context_synchronize(gpu.get()), DST_OK) << dst_last_error();
    EXPECT_TRUE(de.outputs() == eager_e);
    ASSERT_EQ(dst_context_set_stream(gpu.get(), nullptr), DST_OK);
    ASSERT_EQ(cudaStreamDestroy(st), cudaSuccess);
}

// Outputs stay as they were after a refused call on device memory (read back explicitly).
TEST(CudaModelOpsErrors, RefusedCallWritesNothing) {
    if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
    dst_context *g = nullptr;
    ASSERT_EQ(dst_context_create(DST_BACKEND_CUDA, 0, &g), DST_OK) << dst_last_error();
    Ctx gpu(g);
    ModelOpCase c = cross_entropy_case(DST_DTYPE_FP16, 40, 9, 8, 13, true, true, true, true, 1.0, 2);
    c.slots[4].t.set(0, -3);
    DeviceCase dc(gpu.get(), c);
    EXPECT_EQ(dc.call(), DST_ERR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(dst_last_error()).find("labels[0] is -3"), std::string::npos) << dst_last_error();
    for (size_t i = 0; i < c.slots.size(); ++i) {
        if (!dc.dev[i]) continue;
        EXPECT_TRUE(dc.download(i).same_bytes(c.slots[i].t.bytes())) << c.slots[i].name << " changed";
    }
}

}  // namespace
