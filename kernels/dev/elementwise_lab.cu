// Elementwise kernel lab: the production GELU and dropout launchers against numbered variants that
// change only how the work is spread over threads (so their outputs must be bit-identical, which the
// lab checks before it times anything), beside a device copy of the same bytes as the bandwidth line.
// The GELU rows also time the erff form the 16-bit types had before cdf16 (elementwise.cu) and check
// both against fp64 on the host (errors in fp16 spacings, results not correctly rounded).
//
//   nvcc -O3 -std=c++17 -arch=sm_90 -I. -Icapi/include kernels/dev/elementwise_lab.cu -o /tmp/ew_lab
//   /tmp/ew_lab [rows=8192] [hidden=1024] [inter=4096]
//
// v1: U 16-byte vectors per thread, all loads issued before any arithmetic (U = 1 is the production
//     map kernel's form since this lab measured it: 65.8 → 60.0 µs for the GELU forward of 8192×4096
//     fp16 on the H200, where the grid-stride loop it had before was slower; U = 2, 4 were slower).
// d1: dropout over 16-byte vectors (two Philox groups per vector for 16-bit types; U = 1 is the
//     production dropout_vec_kernel's form: 23.2 → 18.0 µs for 8192×1024 with a residual, against
//     4-element groups of 8-byte accesses before).
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cmath>
#include <cstring>
#include <vector>

#include "kernels/bias.cu"  // the column sums that gelu_bwd_bias_grad ends with
#include "kernels/elementwise.cu"
#include "kernels/dev/lab_check.cuh"

namespace lab {
using namespace dst;
using namespace dst::cuda;

template <typename T, typename Op, int U>
__global__ void map_u_kernel(const T *a, const T *b, T *y, int64_t nvec, Op op) {
    using C = compute_t<T>;
    constexpr int V = kVec<T>;
    const int64_t base = blockIdx.x * int64_t(blockDim.x) * U + threadIdx.x;
    Vec<T> va[U], vb[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
        const int64_t i = base + int64_t(u) * blockDim.x;
        if (i < nvec) {
            va[u] = reinterpret_cast<const Vec<T> *>(a)[i];
            if (b) vb[u] = reinterpret_cast<const Vec<T> *>(b)[i];
        }
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
        const int64_t i = base + int64_t(u) * blockDim.x;
        if (i >= nvec) continue;
        Vec<T> out;
#pragma unroll
        for (int k = 0; k < V; ++k)
            out.v[k] = to_storage<T>(op(to_compute(va[u].v[k]), b ? to_compute(vb[u].v[k]) : C(0)));
        reinterpret_cast<Vec<T> *>(y)[i] = out;
    }
}

// Dropout (+ residual) over 16-byte vectors: vector i is Philox groups 2i and 2i + 1 (fp16/bf16).
template <typename T, int U>
__global__ void dropout_vec_kernel(const T *a, const T *residual, T *y, int64_t nvec, uint64_t seed,
                                   uint64_t offset, uint32_t threshold, float scale) {
    constexpr int V = kVec<T>;
    static_assert(V == 8, "16-bit types");
    const int64_t base = blockIdx.x * int64_t(blockDim.x) * U + threadIdx.x;
    Vec<T> va[U], vr[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
        const int64_t i = base + int64_t(u) * blockDim.x;
        if (i < nvec) {
            va[u] = reinterpret_cast<const Vec<T> *>(a)[i];
            if (residual) vr[u] = reinterpret_cast<const Vec<T> *>(residual)[i];
        }
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
        const int64_t i = base + int64_t(u) * blockDim.x;
        if (i >= nvec) continue;
        const Philox4 r0 = philox_dropout_block(seed, offset, uint64_t(2 * i)),
                      r1 = philox_dropout_block(seed, offset, uint64_t(2 * i + 1));
        Vec<T> out;
#pragma unroll
        for (int k = 0; k < V; ++k) {
            const uint32_t w = k < 4 ? r0.v[k] : r1.v[k - 4];
            float v = to_compute(va[u].v[k]);
            v = w >= threshold ? v * scale : 0.0f;
            if (residual) v = to_compute(vr[u].v[k]) + v;
            out.v[k] = to_storage<T>(v);
        }
        reinterpret_cast<Vec<T> *>(y)[i] = out;
    }
}

// GELU (or dg·GELU') of the fp16 inputs in fp64 on the host against the production result (prod) and
// the erff form (erff): the largest error in units of the fp16 spacing at the exact value, how many
// results are not the correctly rounded fp16 of the exact value, and how many differ between the two.
inline void accuracy(const char *name, const __half *u, const __half *dg, const __half *prod, const __half *erff,
                     int64_t n, bool grad) {
    std::vector<__half> hu(n), hg(dg ? n : 0), hp(n), he(n);
    cudaMemcpy(hu.data(), u, n * 2, cudaMemcpyDeviceToHost);
    if (dg) cudaMemcpy(hg.data(), dg, n * 2, cudaMemcpyDeviceToHost);
    cudaMemcpy(hp.data(), prod, n * 2, cudaMemcpyDeviceToHost);
    cudaMemcpy(he.data(), erff, n * 2, cudaMemcpyDeviceToHost);
    double worst[2] = {0, 0};
    int64_t off[2] = {0, 0}, differ = 0;
    for (int64_t i = 0; i < n; ++i) {
        const double x = __half2float(hu[i]), cdf = 0.5 * std::erfc(-x / std::sqrt(2.0));
        double ref = grad ? cdf + x * std::exp(-0.5 * x * x) / std::sqrt(2.0 * M_PI) : x * cdf;
        if (dg) ref *= double(__half2float(hg[i]));
        const __half rr = __float2half_rn(float(ref));
        // fp16 spacing at |ref| (subnormal spacing 2^-24 below 2^-14)
        const double a = std::fabs(ref), spacing = a < 6.103515625e-05 ? 5.960464477539063e-08
                                                                         : std::ldexp(1.0, std::ilogb(a) - 10);
        const __half got[2] = {hp[i], he[i]};
        for (int k = 0; k < 2; ++k) {
            const double e = std::fabs(double(__half2float(got[k])) - ref) / spacing;
            worst[k] = std::max(worst[k], e);
            if (__half_as_ushort(got[k]) != __half_as_ushort(rr)) ++off[k];
        }
        if (__half_as_ushort(hp[i]) != __half_as_ushort(he[i])) ++differ;
    }
    std::printf("  %-10s accuracy vs fp64: prod worst %.3f spacings, %lld not correctly rounded; erff worst %.3f, "
                "%lld; prod != erff in %lld of %lld\n",
                name, worst[0], (long long)off[0], worst[1], (long long)off[1], (long long)differ, (long long)n);
}
}  // namespace lab

template <typename F>
float time_ms(F &&f, int reps = 30) {
    cudaEvent_t a, b;
    LAB_CUDA(cudaEventCreate(&a));
    LAB_CUDA(cudaEventCreate(&b));
    for (int i = 0; i < 3; ++i) f();
    std::vector<float> t;
    for (int i = 0; i < reps; ++i) {
        LAB_CUDA(cudaEventRecord(a));
        f();
        LAB_CUDA(cudaEventRecord(b));
        LAB_CUDA(cudaEventSynchronize(b));
        float ms = 0;
        LAB_CUDA(cudaEventElapsedTime(&ms, a, b));
        t.push_back(ms);
    }
    std::sort(t.begin(), t.end());
    return t[t.size() / 2];
}

bool same(const void *x, const void *y, size_t bytes) {
    std::vector<unsigned char> hx(bytes), hy(bytes);
    LAB_CUDA(cudaMemcpy(hx.data(), x, bytes, cudaMemcpyDeviceToHost));
    LAB_CUDA(cudaMemcpy(hy.data(), y, bytes, cudaMemcpyDeviceToHost));
    return std::memcmp(hx.data(), hy.data(), bytes) == 0;
}

void row(const char *name, float ms, double bytes, float ref_ms, bool ok) {
    std::printf("  %-34s %8.1f us  %6.2f TB/s  %5.2fx copy  %s\n", name, ms * 1e3, bytes / (ms * 1e-3) / 1e12,
                ms / ref_ms, ok ? "bit-identical" : "DIFFERS");
}

int main(int argc, char **argv) {
    const int64_t rows = argc > 1 ? atoll(argv[1]) : 8192, H = argc > 2 ? atoll(argv[2]) : 1024,
                  I = argc > 3 ? atoll(argv[3]) : 4096;
    using T = __half;
    const int64_t nI = rows * I, nH = rows * H;
    T *u, *dg, *g0, *g1, *x, *r, *y0, *y1, *c;
    for (T **p : {&u, &dg, &g0, &g1, &c}) LAB_CUDA(cudaMalloc(p, nI * 2));
    for (T **p : {&x, &r, &y0, &y1}) LAB_CUDA(cudaMalloc(p, nH * 2));
    {
        std::vector<__half> h(nI);
        for (int64_t i = 0; i < nI; ++i) h[i] = __float2half(float((i * 2654435761u) % 20001) / 2500.0f - 4.0f);
        LAB_CUDA(cudaMemcpy(u, h.data(), nI * 2, cudaMemcpyHostToDevice));
        LAB_CUDA(cudaMemcpy(dg, h.data() + 7, (nI - 7) * 2, cudaMemcpyHostToDevice));
        LAB_CUDA(cudaMemcpy(x, h.data(), nH * 2, cudaMemcpyHostToDevice));
        LAB_CUDA(cudaMemcpy(r, h.data() + 3, nH * 2, cudaMemcpyHostToDevice));
    }
    const int th = 256;
    std::printf("fp16, %lld x %lld (GELU) and %lld x %lld (dropout)\n", (long long)rows, (long long)I,
                (long long)rows, (long long)H);
    // The bandwidth line: a device copy of read + write bytes.
    const float copy2 = time_ms([&] { LAB_CUDA(cudaMemcpyAsync(g1, u, nI * 2, cudaMemcpyDeviceToDevice)); });
    row("copy (read + write N*I)", copy2, 2.0 * nI * 2, copy2, true);

    // Production GELU (erf form; 16-bit types through cdf16) against the erff form it replaced
    // ("erff": the same functors with low = false), timed and checked against fp64 on the host.
    const dst::cuda::GeluFwd fwd{DST_GELU_ERF, true}, fwd_erff{DST_GELU_ERF, false};
    const dst::cuda::GeluBwd bwd_erff{DST_GELU_ERF, false};
    const int64_t nv = nI / 8;
    const unsigned blocks1 = unsigned((nv + th - 1) / th);
    float t0 = time_ms([&] { LAB_CUDA(dst::cuda::gelu_fwd(0, DST_DTYPE_FP16, DST_GELU_ERF, u, g0, nI)); });
    row("gelu_fwd prod", t0, 2.0 * nI * 2, copy2, true);
    {
        lab::map_u_kernel<T, dst::cuda::GeluFwd, 1><<<blocks1, th>>>(u, nullptr, g1, nv, fwd);
        row("gelu_fwd v1 U=1 (as prod)", time_ms([&] { lab::map_u_kernel<T, dst::cuda::GeluFwd, 1><<<blocks1, th>>>(u, nullptr, g1, nv, fwd); }),
            2.0 * nI * 2, copy2, same(g0, g1, nI * 2));
        const float te = time_ms([&] { lab::map_u_kernel<T, dst::cuda::GeluFwd, 1><<<blocks1, th>>>(u, nullptr, g1, nv, fwd_erff); });
        row("gelu_fwd erff (before)", te, 2.0 * nI * 2, copy2, same(g0, g1, nI * 2));
        lab::accuracy("gelu_fwd", u, nullptr, g0, g1, nI, false);
    }
    t0 = time_ms([&] { LAB_CUDA(dst::cuda::gelu_bwd(0, DST_DTYPE_FP16, DST_GELU_ERF, dg, u, g0, nI)); });
    row("gelu_bwd prod", t0, 3.0 * nI * 2, copy2 * 1.5f, true);
    {
        const float te = time_ms([&] { lab::map_u_kernel<T, dst::cuda::GeluBwd, 1><<<blocks1, th>>>(dg, u, g1, nv, bwd_erff); });
        row("gelu_bwd erff (before)", te, 3.0 * nI * 2, copy2 * 1.5f, same(g0, g1, nI * 2));
        lab::accuracy("gelu_bwd", u, dg, g0, g1, nI, true);
        void *ws = nullptr;
        float *db = nullptr;
        LAB_CUDA(cudaMalloc(&ws, dst::cuda::column_sum_workspace(DST_DTYPE_FP16, rows, I)));
        LAB_CUDA(cudaMalloc(&db, I * 2));
        const float tf = time_ms([&] {
            LAB_CUDA(dst::cuda::gelu_bwd_bias_grad(0, DST_DTYPE_FP16, DST_GELU_ERF, dg, u, g1, rows, I, db, false, ws));
        });
        row("gelu_bwd_bias_grad prod (+ sums)", tf, 3.0 * nI * 2, copy2 * 1.5f, same(g0, g1, nI * 2));
        LAB_CUDA(cudaFree(ws));
        LAB_CUDA(cudaFree(db));
    }

    dst::DropoutSite site;
    site.seed = 1234;
    site.offset = 77;
    site.threshold = dst::dropout_threshold(0.1);
    site.scale = 1.0 / 0.9;
    const float copyH = time_ms([&] { LAB_CUDA(cudaMemcpyAsync(y1, x, nH * 2, cudaMemcpyDeviceToDevice)); });
    t0 = time_ms([&] { LAB_CUDA(dst::cuda::dropout_residual_fwd(0, DST_DTYPE_FP16, x, r, y0, nH, site)); });
    row("dropout+residual prod", t0, 3.0 * nH * 2, copyH * 1.5f, true);
    const int64_t nvh = nH / 8;
    auto drop_u = [&](auto U, bool resid) {
        constexpr int kU = decltype(U)::value;
        const unsigned blocks = unsigned((nvh + th * kU - 1) / (th * kU));
        const float t = time_ms([&] {
            lab::dropout_vec_kernel<T, kU><<<blocks, th>>>(x, resid ? r : nullptr, y1, nvh, site.seed, site.offset,
                                                          site.threshold, float(site.scale));
        });
        char name[64];
        std::snprintf(name, sizeof name, "dropout%s d1 U=%d", resid ? "+residual" : "", kU);
        row(name, t, (resid ? 3.0 : 2.0) * nH * 2, copyH * (resid ? 1.5f : 1.0f), same(y0, y1, nH * 2));
    };
    drop_u(std::integral_constant<int, 1>{}, true);
    drop_u(std::integral_constant<int, 2>{}, true);
    drop_u(std::integral_constant<int, 4>{}, true);
    t0 = time_ms([&] { LAB_CUDA(dst::cuda::dropout_bwd(0, DST_DTYPE_FP16, x, y0, nH, site)); });
    row("dropout_bwd prod", t0, 2.0 * nH * 2, copyH, true);
    drop_u(std::integral_constant<int, 1>{}, false);
    drop_u(std::integral_constant<int, 2>{}, false);
    drop_u(std::integral_constant<int, 4>{}, false);
    return 0;
}
