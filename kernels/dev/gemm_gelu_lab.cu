// Fused GELU GEMM lab: the FC1 forward with GELU and the FC2 data gradient with GELU' (the layer's
// BERT-Large shapes, `rows` tokens), as the CUDA backend runs them unfused (a cuBLASLt GEMM, the
// heuristic's first algorithm, with the bias epilogue, then the GELU map; a cuBLASLt GEMM, then the
// fused GELU backward with the bias sums) and fused (DST_FUSED_GEMM: one CUTLASS kernel each,
// kernels/gemm_gelu.cuh; the backward's bias column sums from its epilogue's per-tile partials, then
// column_sum_finalize_chunks), through the kernels' launchers (kernels/*.cuh),
// and, in FP16, the other CUTLASS configurations of kernels/dev/gemm_gelu_variant*.cu. It answers
// whether the fused kernels beat the GEMM plus the pass they replace, and by how much they exceed the
// cuBLASLt GEMM alone (the floor for the fused form).
//
//   cmake -DDST_BUILD_KERNEL_LAB=ON … && ninja gemm_gelu_lab   (needs CUTLASS: tools/cutlass.sh)
//   gemm_gelu_lab [rows=8192] [hidden=1024] [inter=4096]
//   LAB_AB=13,14 gemm_gelu_lab …   times only those variants (every variant is checked)
//
// Checks first (printed, and the exit status is 1 if one fails): the fused forward's y is GELU of its
// own u bit for bit (the map run on it); u and du against the unfused path (relative L2 and the count
// of differing elements: the GEMMs sum in other orders); each variant's outputs against the library
// configuration's. Timing: CUDA events around 30 launches after 5 warm-up ones, µs per call (the
// backward's two bias-gradient forms, its kernel with and without the tile sums, and every variant
// against the library, as medians of seven rounds timed in alternation); and the host's µs to enqueue
// a call, fused and unfused.
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <algorithm>
#include <chrono>
#include <random>
#include <utility>
#include <vector>

#include "kernels/bias.cuh"
#include "kernels/dev/gemm_gelu_variants.cuh"
#include "kernels/dev/lab_check.cuh"
#include "kernels/elementwise.cuh"
#include "kernels/gemm_gelu.cuh"

namespace {

cudaStream_t stream;
cublasLtHandle_t lt;
void *lt_ws;
constexpr size_t kLtWs = size_t(32) << 20;  // the backend's cuBLASLt workspace
int failures = 0;

// Host µs to enqueue one call (30 calls, no wait in between; the stream drained before and after):
// what a fused call costs the CPU (CUTLASS builds its TMA descriptors and sets the kernel's shared
// memory attribute on every call), to compare with the GPU time it hides behind.
template <typename F>
double host_us(F &&f) {
    LAB_CUDA(cudaStreamSynchronize(stream));
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < 30; ++i) f();
    const auto t1 = std::chrono::steady_clock::now();
    LAB_CUDA(cudaStreamSynchronize(stream));
    return std::chrono::duration<double, std::micro>(t1 - t0).count() / 30;
}

template <typename F>
double time_us(F &&f) {
    for (int i = 0; i < 5; ++i) f();
    return lab_event_ms(stream, [&] {
               for (int i = 0; i < 30; ++i) f();
           }) * 1e3 / 30;
}

// Two forms timed in alternation (seven rounds of time_us each, A then B), the medians of their µs per
// call: a comparison that the GPU's clock drift over the lab's run (later timings run slower under
// sustained load) cannot bias toward the form timed first.
template <typename FA, typename FB>
std::pair<double, double> time_pair_us(FA &&fa, FB &&fb) {
    std::vector<double> ta, tb;
    for (int r = 0; r < 7; ++r) {
        ta.push_back(time_us(fa));
        tb.push_back(time_us(fb));
    }
    std::sort(ta.begin(), ta.end());
    std::sort(tb.begin(), tb.end());
    return {ta[3], tb[3]};
}

// A cuBLASLt GEMM as the backend issues the layer's (row-major y[n,m] = x[n,k]·W[m,k]ᵀ + b is the
// column-major D[m,n] = (W as k×m)ᵀ·(x as k×n); dx[n,k] = dy[n,m]·W[m,k] is D[k,n] = (W as k×m)·(dy as
// m×n)), with the heuristic's first algorithm, chosen once.
struct LtGemm {
    cublasLtMatmulDesc_t op{};
    cublasLtMatrixLayout_t la{}, lb{}, ld{};
    cublasLtMatmulAlgo_t algo{};
    size_t ws = 0;
    const void *A, *B;
    void *D;
    LtGemm(cudaDataType_t type, bool forward, const void *w, const void *x, const void *bias, void *d, int64_t n,
           int64_t k, int64_t m)
        : A(w), B(x), D(d) {
        LAB_LT(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
        const int32_t ta = forward ? CUBLAS_OP_T : CUBLAS_OP_N, tb = CUBLAS_OP_N;
        LAB_LT(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
        LAB_LT(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
        if (bias) {
            const cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_BIAS;
            const int32_t bt = type;
            LAB_LT(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi));
            LAB_LT(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias));
            LAB_LT(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bt, sizeof bt));
        }
        const int64_t M = forward ? m : k, N = n, K = forward ? k : m;
        LAB_LT(cublasLtMatrixLayoutCreate(&la, type, forward ? K : M, forward ? M : K, k));  // W: ld k either way
        LAB_LT(cublasLtMatrixLayoutCreate(&lb, type, K, N, K));
        LAB_LT(cublasLtMatrixLayoutCreate(&ld, type, M, N, M));
        cublasLtMatmulPreference_t pref;
        LAB_LT(cublasLtMatmulPreferenceCreate(&pref));
        const uint64_t wsb = kLtWs;
        LAB_LT(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &wsb, sizeof wsb));
        cublasLtMatmulHeuristicResult_t h{};
        int found = 0;
        LAB_LT(cublasLtMatmulAlgoGetHeuristic(lt, op, la, lb, ld, ld, pref, 1, &h, &found));
        if (found < 1) {
            std::fprintf(stderr, "cuBLASLt offers no algorithm\n");
            std::exit(1);
        }
        algo = h.algo;
        ws = h.workspaceSize;
        cublasLtMatmulPreferenceDestroy(pref);
    }
    ~LtGemm() {
        cublasLtMatrixLayoutDestroy(la);
        cublasLtMatrixLayoutDestroy(lb);
        cublasLtMatrixLayoutDestroy(ld);
        cublasLtMatmulDescDestroy(op);
    }
    void run() const {
        const float one = 1.0f, zero = 0.0f;
        LAB_LT(cublasLtMatmul(lt, op, &one, A, la, B, lb, &zero, D, ld, D, ld, &algo, lt_ws, ws, stream));
    }
};

uint16_t bits_of(dst_dtype dt, float v) {
    return dt == DST_DTYPE_FP16 ? __half_as_ushort(__float2half_rn(v)) : __bfloat16_as_ushort(__float2bfloat16_rn(v));
}

float value_of(dst_dtype dt, uint16_t b) {
    if (dt == DST_DTYPE_FP16) return __half2float(__ushort_as_half(b));
    return __bfloat162float(__ushort_as_bfloat16(b));
}

// A device buffer of `count` 16-bit values, random in [lo, hi] (or uninitialised).
void *buffer(dst_dtype dt, int64_t count, double lo = 0, double hi = 0, uint64_t seed = 0) {
    void *p = nullptr;
    LAB_CUDA(cudaMalloc(&p, size_t(count) * 2));
    if (hi > lo) {
        std::vector<uint16_t> h(static_cast<size_t>(count));
        std::mt19937_64 rng(seed);
        std::uniform_real_distribution<float> uni{float(lo), float(hi)};
        for (auto &v : h) v = bits_of(dt, uni(rng));
        LAB_CUDA(cudaMemcpy(p, h.data(), h.size() * 2, cudaMemcpyHostToDevice));
    }
    return p;
}

std::vector<double> fetch(dst_dtype dt, const void *p, int64_t count) {
    std::vector<uint16_t> h(static_cast<size_t>(count));
    LAB_CUDA(cudaStreamSynchronize(stream));
    LAB_CUDA(cudaMemcpy(h.data(), p, h.size() * 2, cudaMemcpyDeviceToHost));
    std::vector<double> v(h.size());
    for (size_t i = 0; i < h.size(); ++i) v[i] = value_of(dt, h[i]);
    return v;
}

// Relative L2 of a against b and how many values differ; bound < 0: every value must be the same.
void compare(const char *what, const std::vector<double> &a, const std::vector<double> &b, double bound) {
    double num = 0, den = 0;
    int64_t differ = 0;
    for (size_t i = 0; i < a.size(); ++i) {
        num += (a[i] - b[i]) * (a[i] - b[i]);
        den += b[i] * b[i];
        differ += !(a[i] == b[i]);  // NaN counts
    }
    const double rel = den > 0 ? std::sqrt(num / den) : std::sqrt(num);
    const bool ok = bound < 0 ? differ == 0 : rel <= bound;
    failures += !ok;
    std::printf("  check %-44s rel L2 %.2e, %lld of %zu differ  %s\n", what, rel, (long long)differ, a.size(),
                ok ? "ok" : "FAIL");
}

}  // namespace

int main(int argc, char **argv) {
    const int64_t n = argc > 1 ? std::atoll(argv[1]) : 8192, H = argc > 2 ? std::atoll(argv[2]) : 1024,
                  I = argc > 3 ? std::atoll(argv[3]) : 4096;
    int sms = 0;
    LAB_CUDA(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    LAB_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    LAB_LT(cublasLtCreate(&lt));
    LAB_CUDA(cudaMalloc(&lt_ws, kLtWs));
    std::printf("gemm_gelu_lab: rows %lld, hidden %lld, intermediate %lld, %d SMs\n", (long long)n, (long long)H,
                (long long)I, sms);
    const dst_gelu erf = DST_GELU_ERF;
    for (dst_dtype dt : {DST_DTYPE_FP16, DST_DTYPE_BF16}) {
        const cudaDataType_t type = dt == DST_DTYPE_FP16 ? CUDA_R_16F : CUDA_R_16BF;
        void *x = buffer(dt, n * H, -1, 1, 1), *w1 = buffer(dt, I * H, -0.03, 0.03, 2), *b1 = buffer(dt, I, -0.3, 0.3, 3);
        void *dy = buffer(dt, n * H, -1, 1, 4), *w2 = buffer(dt, H * I, -0.03, 0.03, 5);
        void *u[2] = {buffer(dt, n * I), buffer(dt, n * I)}, *y[2] = {buffer(dt, n * I), buffer(dt, n * I)};
        void *du[2] = {buffer(dt, n * I), buffer(dt, n * I)}, *db[2] = {buffer(dt, I), buffer(dt, I)};
        void *dg = buffer(dt, n * I), *chk = buffer(dt, n * I), *uv = buffer(dt, n * I), *yv = buffer(dt, n * I);
        void *cs_ws = nullptr, *tile_ws = nullptr;
        LAB_CUDA(cudaMalloc(&cs_ws, dst::cuda::column_sum_workspace(dt, n, I)));
        LAB_CUDA(cudaMalloc(&tile_ws, dst::cuda::dgelu_partial_bytes(n, I)));
        float *tile_partial = static_cast<float *>(tile_ws);
        const LtGemm fc1(type, true, w1, x, b1, u[0], n, H, I), fc1_plain(type, true, w1, x, b1, uv, n, H, I);
        const LtGemm fc2(type, false, w2, dy, nullptr, dg, n, I, H);
        // The four paths: unfused / fused, forward / backward (the backward takes the unfused u).
        auto unfused_fwd = [&] {
            fc1.run();
            LAB_CUDA(dst::cuda::gelu_fwd(stream, dt, erf, u[0], y[0], n * I));
        };
        auto fused_fwd = [&] { LAB_CUDA(dst::cuda::gemm_bias_gelu(stream, dt, erf, x, w1, b1, y[1], u[1], n, H, I, sms)); };
        // The inference form (no u kept), into yv; the backward kernel alone (no bias sums), into du[1].
        auto fused_inf = [&] { LAB_CUDA(dst::cuda::gemm_bias_gelu(stream, dt, erf, x, w1, b1, yv, nullptr, n, H, I, sms)); };
        auto fused_bwd_kernel = [&] { LAB_CUDA(dst::cuda::gemm_dgelu(stream, dt, erf, dy, w2, u[0], du[1], n, I, H, sms)); };
        auto unfused_bwd = [&] {
            fc2.run();
            LAB_CUDA(dst::cuda::gelu_bwd_bias_grad(stream, dt, erf, dg, u[0], du[0], n, I, db[0], false, cs_ws));
        };
        auto fused_bwd = [&] {
            LAB_CUDA(dst::cuda::gemm_dgelu(stream, dt, erf, dy, w2, u[0], du[1], n, I, H, sms, tile_partial));
            LAB_CUDA(dst::cuda::column_sum_finalize_chunks(stream, dt, tile_ws, dst::cuda::dgelu_partial_ld(I),
                                                           dst::cuda::dgelu_partial_chunks(n), db[1], I, false));
        };
        // The form before the epilogue's sums: the kernel, then column_sum's two passes over du.
        auto fused_bwd_pass = [&] {
            fused_bwd_kernel();
            LAB_CUDA(dst::cuda::column_sum(stream, dt, du[1], db[1], n, I, false, cs_ws));
        };
        // LAB_PROFILE=1: one fused forward, one inference-form forward and one fused backward kernel (FP16),
        // nothing else, for `ncu -k regex:device_kernel` (the library's configuration, then
        // LAB_PROFILE_VARIANT's forward and backward if set).
        if (std::getenv("LAB_PROFILE")) {
            fused_fwd();
            fused_inf();
            fused_bwd_kernel();
            if (const char *pv = std::getenv("LAB_PROFILE_VARIANT")) {
                const int v = std::atoi(pv);
                if (v >= 1 && v <= lab::kVariants) {
                    LAB_CUDA(lab::kFwd[v](stream, erf, x, w1, b1, yv, uv, n, H, I, sms));
                    LAB_CUDA(lab::kBwd[v](stream, erf, dy, w2, u[0], chk, n, I, H, sms, nullptr));
                }
            }
            LAB_CUDA(cudaStreamSynchronize(stream));
            std::printf("gemm_gelu_lab: profile run done\n");
            return 0;
        }
        std::printf("\n%s\n", dt == DST_DTYPE_FP16 ? "fp16" : "bf16");
        // ---- checks ----
        unfused_fwd();
        fused_fwd();
        unfused_bwd();
        fused_bwd();
        LAB_CUDA(dst::cuda::gelu_fwd(stream, dt, erf, u[1], chk, n * I));
        compare("fused y = GELU(fused u), bit for bit", fetch(dt, y[1], n * I), fetch(dt, chk, n * I), -1);
        const double tol = dt == DST_DTYPE_FP16 ? 1e-3 : 1e-2;
        compare("fused u against unfused u", fetch(dt, u[1], n * I), fetch(dt, u[0], n * I), tol);
        compare("fused du against unfused du", fetch(dt, du[1], n * I), fetch(dt, du[0], n * I), tol);
        compare("fused bias gradient against unfused", fetch(dt, db[1], I), fetch(dt, db[0], I), tol);
        {  // the epilogue's sums against column_sum's over the same stored du (other order), and run to run
            const std::vector<double> tiles = fetch(dt, db[1], I);
            fused_bwd();
            compare("fused bias gradient, second run, bit for bit", fetch(dt, db[1], I), tiles, -1);
            LAB_CUDA(dst::cuda::column_sum(stream, dt, du[1], chk, n, I, false, cs_ws));
            compare("fused bias gradient against column_sum of fused du", tiles, fetch(dt, chk, I),
                    dt == DST_DTYPE_FP16 ? 1e-3 : 8e-3);
        }
        if (dt == DST_DTYPE_FP16)
            for (int v = 1; v <= lab::kVariants; ++v) {
                const auto fwd = lab::kFwd[v];
                const auto bwd = lab::kBwd[v];
                LAB_CUDA(fwd(stream, erf, x, w1, b1, yv, uv, n, H, I, sms));
                LAB_CUDA(bwd(stream, erf, dy, w2, u[0], chk, n, I, H, sms, nullptr));
                char what[64];
                if (lab::kVariantMath[v] == 2) {  // the GEMM alone: D = x·Wᵀ without the bias
                    std::printf("  (variant %d: the GEMM alone, not checked)\n", v);
                    continue;
                }
                std::snprintf(what, sizeof what, "variant %d u against the library's", v);
                compare(what, fetch(dt, uv, n * I), fetch(dt, u[1], n * I), tol);
                if (lab::kVariantMath[v] == 1) continue;  // its du is the stand-in's, dg·u
                std::snprintf(what, sizeof what, "variant %d du against the library's", v);
                compare(what, fetch(dt, chk, n * I), fetch(dt, du[1], n * I), tol);
            }
        // ---- timing ----
        const double gemm_f = time_us([&] { fc1_plain.run(); }), gemm_b = time_us([&] { fc2.run(); });
        const double unf_f = time_us(unfused_fwd), fus_f = time_us(fused_fwd);
        const double unf_b = time_us(unfused_bwd);
        // The bias gradient's two forms, and the kernel with and without its tile sums, each pair in alternation.
        const auto [fus_b, fus_bp] = time_pair_us(fused_bwd, fused_bwd_pass);
        const auto [kbs, kb] = time_pair_us(
            [&] { LAB_CUDA(dst::cuda::gemm_dgelu(stream, dt, erf, dy, w2, u[0], chk, n, I, H, sms, tile_partial)); },
            fused_bwd_kernel);
        // The inference form: no pre-activation kept (unfused: the GEMM into y, then GELU in place).
        const LtGemm fc1_into_y(type, true, w1, x, b1, yv, n, H, I);
        const double unf_i = time_us([&] {
            fc1_into_y.run();
            LAB_CUDA(dst::cuda::gelu_fwd(stream, dt, erf, yv, yv, n * I));
        });
        const double fus_i = time_us(fused_inf);
        std::printf("  %-58s %9s %9s\n", "us per call", "forward", "backward");
        std::printf("  %-58s %9.1f %9.1f\n", "cuBLASLt GEMM alone (forward: with its bias epilogue)", gemm_f, gemm_b);
        std::printf("  %-58s %9.1f %9.1f\n", "unfused: GEMM + GELU map / GEMM + GELU' with bias sums", unf_f, unf_b);
        std::printf("  %-58s %9.1f %9.1f   (%.3fx / %.3fx unfused; %.3fx / %.3fx GEMM alone)\n",
                    "fused (library configuration; backward + bias sums)", fus_f, fus_b, fus_f / unf_f, fus_b / unf_b,
                    fus_f / gemm_f, fus_b / gemm_b);
        std::printf("  %-58s %9s %9.1f   (kernel with the tile sums %.1f, without %.1f)\n",
                    "fused, bias sums by column_sum over du instead", "", fus_bp, kbs, kb);
        std::printf("  %-58s %9.1f %9s   (%.3fx unfused %.1f)\n", "fused, inference form (u not stored)", fus_i, "",
                    fus_i / unf_i, unf_i);
        std::printf("  %-58s %9.1f %9.1f   (unfused: %.1f / %.1f)\n", "host us to enqueue: fused forward / backward",
                    host_us(fused_fwd), host_us(fused_bwd), host_us(unfused_fwd), host_us(unfused_bwd));
        // The variants (FP16), each against the library's kernels in alternation (medians of seven rounds
        // each, so that the clocks' drift over the run, which slows later timings by up to a quarter under
        // this load, reaches both columns alike): forward with u, the inference form (no u), the backward
        // kernel without the sums. LAB_AB="v,v,…" times only those variants; every variant is checked.
        if (dt == DST_DTYPE_FP16) {
            std::printf("  variants in alternation with the library (variant 0: %s), us, library / variant:\n"
                        "  %-58s %15s  %15s  %15s\n",
                        lab::kVariantNames[0], "", "forward", "inference form", "backward kernel");
            const char *ab = std::getenv("LAB_AB");
            auto listed = [&](int v) {
                if (!ab) return true;
                for (const char *c = ab; *c;) {
                    if (std::atoi(c) == v) return true;
                    while (*c && *c != ',') ++c;
                    if (*c == ',') ++c;
                }
                return false;
            };
            for (int v = 1; v <= lab::kVariants; ++v) {
                if (!listed(v)) continue;
                const auto fwd = lab::kFwd[v];
                const auto bwd = lab::kBwd[v];
                const auto [lf, vf] =
                    time_pair_us(fused_fwd, [&] { LAB_CUDA(fwd(stream, erf, x, w1, b1, yv, uv, n, H, I, sms)); });
                const auto [li, vi] =
                    time_pair_us(fused_inf, [&] { LAB_CUDA(fwd(stream, erf, x, w1, b1, yv, nullptr, n, H, I, sms)); });
                const auto [lb, vb] = time_pair_us(
                    fused_bwd_kernel, [&] { LAB_CUDA(bwd(stream, erf, dy, w2, u[0], chk, n, I, H, sms, nullptr)); });
                std::printf("  variant %2d: %-47s %6.1f / %6.1f  %6.1f / %6.1f  %6.1f / %6.1f\n", v,
                            lab::kVariantNames[v], lf, vf, li, vi, lb, vb);
            }
        }
        for (void *p : {x, w1, b1, dy, w2, u[0], u[1], y[0], y[1], du[0], du[1], db[0], db[1], dg, chk, uv, yv, cs_ws, tile_ws})
            LAB_CUDA(cudaFree(p));
    }
    std::printf("\ngemm_gelu_lab: %s\n", failures ? "CHECKS FAILED" : "checks ok");
    return failures ? 1 : 0;
}
