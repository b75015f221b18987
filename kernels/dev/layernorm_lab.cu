// LayerNorm backward lab: the library's passes (the warp-per-row dx kernel with the dropout branch,
// the γ/β partial sums, their finalisation, and the column sums of the branch for the bias gradient
// of the linear layer before it) against one-pass forms that compute dx, the branch and every partial
// sum from one read of the rows, checked first (the sums' bits must be the library's: same rows per
// lane, same order, explicit fma), then timed. The layer's two LayerNorm backwards at BERT-Large:
// "LN2" (dresid, dropout branch, branch bias sums) and "LN1" (dresid, no branch).
//
//   nvcc -O3 -std=c++17 -arch=sm_90 -I. -Icapi/include kernels/dev/layernorm_lab.cu -o /tmp/ln_lab
//   /tmp/ln_lab [rows=8192] [hidden=1024]        (fp16 and bf16; hidden 256, 512 or 1024)
//
// v1: a block per row chunk of kernels/column_partial.cuh, warp y on the chunk's row lane y (rows
//     r0 + y, r0 + y + 8, …), the sums per column in registers, the warps' sums added in order; the
//     row as float arrays between its two passes and dresid read in the second (the form measured in
//     the layer on 2026-12-05: 43.8 / 32.9 µs at 8192×1024 fp16 against 77 for the passes it replaces;
//     255 registers, one block of 8 warps per SM).
// v2: v1 with the row kept packed (16-bit) between the passes and recomputed, dresid read with dy and x
//     (one wait for memory per row instead of two), γ read again from L1 in the second pass: fewer
//     registers and one round trip per row.
// v3: v2 with four times the chunks (another summation order) in at most 128 registers, so that two
//     blocks (16 warps) share an SM.
// v4: two warps per row (16 per block): v2's rows and column-sum order with half the registers per
//     thread and twice the warps per SM (hidden 512 and 1024 in the 16-bit types). Now the library's
//     one-pass form (layernorm_bwd's one_pass_split 2), which the lab runs.
// v5: v4 with four warps per row (32 per block, at most 64 registers; one_pass_split 4): the same bytes in flight per
//     row lane, but each warp's arithmetic between its loads a quarter of v2's, so that more of the
//     SM's warps wait on memory at once (hidden 1024 in the 16-bit types). The grid is the column
//     sums' chunk count (128 at 8192 rows), one block per SM, so only the block's size adds warps.
// Prediction for the next device call (8192×1024 fp16, µs): library LN2 ~45 (27.9 + 11.75 + ~5, the
// layer profile), LN1 ~32; v1 ~44 / ~33; v2 ~25–30 / ~20–24 if one memory wait per row is what v1
// waits on; v3 and v4 ~20–24 / ~16–19 if warps in flight are the limit (near the ~4 TB/s of a copy);
// no gain anywhere if the block's serial flush or the finalisations dominate. v5 (added later, with
// ptxas's counts in hand: v4 at 128 registers, no spills; v3 spills 0.5–1.3 KB): ~2–4 µs under v4 if
// v4's warps spend a third or more of a row's time in arithmetic and sums rather than waiting on loads.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cmath>
#include <cstring>
#include <initializer_list>
#include <random>
#include <vector>

// column_sum and its finalisation; its file-local tile width is renamed, layernorm.cu has one too.
#define kTileCols kBiasTileCols
#include "kernels/bias.cu"
#undef kTileCols
#include "kernels/dev/lab_check.cuh"
#include "kernels/elementwise.cu"  // what layernorm.cu's fallbacks call
#include "kernels/layernorm.cu"

namespace lab {
using namespace dst;
using namespace dst::cuda;

constexpr int kRows = colsum::kRowLanes;  // warps per block: the row lanes of a chunk
constexpr int kMaxCols = 1024;

// One row lane's sums of its columns: dy·x̂ and dy (γ, β) and the stored branch (its bias).
template <typename C, int VPL, int V>
struct Sums {
    C g[VPL][V], b[VPL][V], br[VPL][V];
    __device__ Sums() {
#pragma unroll
        for (int j = 0; j < VPL; ++j)
#pragma unroll
            for (int k = 0; k < V; ++k) g[j][k] = b[j][k] = br[j][k] = C(0);
    }
};

// The first pass over one vector of a row: g = γ·dy and x̂ (out), their row sums Σg and Σg·x̂, and the
// column sums dy·x̂ (one fma, the library's partial-sum arithmetic) and dy.
template <typename T>
__device__ __forceinline__ void first_pass_vec(const Vec<T> &d, const Vec<T> &xv, const Vec<T> &gm, compute_t<T> mu,
                                               compute_t<T> rs, compute_t<T> &sg, compute_t<T> &sgx,
                                               compute_t<T> (&cg)[kVec<T>], compute_t<T> (&cb)[kVec<T>],
                                               compute_t<T> (&g)[kVec<T>], compute_t<T> (&xh)[kVec<T>]) {
    using C = compute_t<T>;
#pragma unroll
    for (int k = 0; k < kVec<T>; ++k) {
        const C dk = to_compute(d.v[k]);
        g[k] = to_compute(gm.v[k]) * dk;
        xh[k] = (to_compute(xv.v[k]) - mu) * rs;
        sg += g[k];
        sgx += g[k] * xh[k];
        cg[k] = fma(dk, xh[k], cg[k]);
        cb[k] += dk;
    }
}

// v1 (kPacked false), v2 (kPacked true) and v3 (v2 in 128 registers, two blocks per SM); non-invertible
// (x̂ from x and the statistics).
template <typename T, int VPL, bool kBranch, bool kPacked, int kMinBlocks>
__global__ void __launch_bounds__(32 * kRows, kMinBlocks)
    ln_bwd_chunk(const T *dy, const T *__restrict__ x, const T *__restrict__ gamma, const compute_t<T> *mean,
                 const compute_t<T> *rstd, const T *dresid, T *dx, int64_t n, int64_t h, int64_t R, int64_t chunks,
                 LnBwdBranch<T> branch, compute_t<T> *partial, compute_t<T> *bias_partial) {
    DST_GRID_DEPENDENCY();
    using C = compute_t<T>;
    constexpr int V = kVec<T>;
    static_assert(32 * VPL * V <= kMaxCols, "a chunk's lane sums fit the shared buffer");
    __shared__ C red[kRows * kMaxCols];
    const int lane = threadIdx.x & 31;
    const int64_t r0 = int64_t(blockIdx.x) * R, r1 = r0 + R < n ? r0 + R : n;
    Sums<C, VPL, V> s;
    for (int64_t row = r0 + (threadIdx.x >> 5); row < r1; row += kRows) {
        const int64_t base = row * h;
        Vec<T> d[VPL], xv[VPL], rv[VPL];
#pragma unroll
        for (int j = 0; j < VPL; ++j) {
            d[j] = reinterpret_cast<const Vec<T> *>(dy + base)[lane + 32 * j];
            xv[j] = reinterpret_cast<const Vec<T> *>(x + base)[lane + 32 * j];
            if (kPacked && dresid) rv[j] = reinterpret_cast<const Vec<T> *>(dresid + base)[lane + 32 * j];
        }
        const C rs = rstd[row], mu = mean[row];
        C ga[kPacked ? 1 : VPL][V], xa[kPacked ? 1 : VPL][V];
        C sg = 0, sgx = 0;
#pragma unroll
        for (int j = 0; j < VPL; ++j) {
            const Vec<T> gm = reinterpret_cast<const Vec<T> *>(gamma)[lane + 32 * j];
            C g[V], xh[V];
            first_pass_vec<T>(d[j], xv[j], gm, mu, rs, sg, sgx, s.g[j], s.b[j], g, xh);
            if constexpr (!kPacked)
#pragma unroll
                for (int k = 0; k < V; ++k) ga[j][k] = g[k], xa[j][k] = xh[k];
        }
        const C mg = warp_sum(sg) / C(h);
        const C mgx = warp_sum(sgx) / C(h);
#pragma unroll
        for (int j = 0; j < VPL; ++j) {
            const int64_t vi = lane + 32 * j;
            if (!kPacked && dresid) rv[j] = reinterpret_cast<const Vec<T> *>(dresid + base)[vi];
            Vec<T> gm{};
            if constexpr (kPacked) gm = reinterpret_cast<const Vec<T> *>(gamma)[vi];
            C val[V];
#pragma unroll
            for (int k = 0; k < V; ++k) {
                C g, xh;
                if constexpr (kPacked) {
                    g = to_compute(gm.v[k]) * to_compute(d[j].v[k]);
                    xh = (to_compute(xv[j].v[k]) - mu) * rs;
                } else {
                    g = ga[j][k], xh = xa[j][k];
                }
                val[k] = rs * (g - mg - xh * mgx);
                if (dresid) val[k] += to_compute(rv[j].v[k]);
            }
            ln_bwd_store_vec<T, kBranch, true>(val, branch, row, h, base, vi, dx, s.br[j]);
        }
    }
    const int y = threadIdx.x >> 5;
    flush_lane_sums(s.g, red, partial, h, y, 0);  // the library's (kernels/layernorm.cu)
    flush_lane_sums(s.b, red, partial + chunks * h, h, y, 0);
    if (kBranch && bias_partial) flush_lane_sums(s.br, red, bias_partial, h, y, 0);
}

template <typename T>
struct Bufs {
    int64_t n = 0, h = 0;
    T *dy = nullptr, *x = nullptr, *y = nullptr, *dresid = nullptr, *gamma = nullptr, *beta = nullptr;
    T *dx = nullptr, *branch = nullptr, *dgamma = nullptr, *dbeta = nullptr, *bias = nullptr;
    T *bias_own = nullptr;  // column_sum over the branch a version stored (the check's reference)
    float *mean = nullptr, *rstd = nullptr;
    compute_t<T> *ws = nullptr;  // γ/β partials, then the bias partials
};

template <typename T>
T *dev_alloc(size_t count) {
    T *p = nullptr;
    LAB_CUDA(cudaMalloc(&p, count * sizeof(T) + 256));
    return p;
}

template <typename T>
void upload(T *d, const std::vector<float> &v) {
    std::vector<T> h(v.size());
    for (size_t i = 0; i < v.size(); ++i) h[i] = to_storage<T>(v[i]);
    LAB_CUDA(cudaMemcpy(d, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice));
}

template <typename T>
std::vector<unsigned char> download(const T *d, size_t count) {
    std::vector<unsigned char> h(count * sizeof(T));
    LAB_CUDA(cudaMemcpy(h.data(), d, h.size(), cudaMemcpyDeviceToHost));
    return h;
}

// The library's passes: LN2 = layernorm_bwd with the branch, then column_sum over the branch; LN1 =
// layernorm_bwd with dresid only.
template <typename T>
void run_library(Bufs<T> &b, bool ln2, const DropoutSite &site) {
    const dst_dtype dt = std::is_same<T, __half>::value ? DST_DTYPE_FP16 : DST_DTYPE_BF16;
    LAB_CUDA(layernorm_bwd(nullptr, dt, b.dy, b.x, false, b.gamma, b.beta, b.mean, b.rstd, b.dresid, b.dx, b.dgamma,
                           b.dbeta, b.n, b.h, false, b.ws, ln2 ? &site : nullptr, ln2 ? b.branch : nullptr));
    if (ln2)
        LAB_CUDA(column_sum(nullptr, dt, b.branch, b.bias, b.n, b.h, false,
                            b.ws + 2 * colsum::chunk_count(b.n) * b.h));
}

// v1 / v2 / v3: the one-pass kernel, then the γ/β and bias finalisations. v3 cuts the rows into four
// times the chunks (so its sums are in another order: checked against the library's within a
// tolerance, not bit for bit) and asks for two blocks per SM.
template <typename T, int VPL, bool kPacked, int kMinBlocks = 1>
void run_chunk(Bufs<T> &b, bool ln2, const DropoutSite &site) {
    using C = compute_t<T>;
    const dst_dtype dt = std::is_same<T, __half>::value ? DST_DTYPE_FP16 : DST_DTYPE_BF16;
    const int64_t chunks = kMinBlocks == 1 ? colsum::chunk_count(b.n) : std::min<int64_t>(4 * colsum::chunk_count(b.n), b.n);
    const int64_t R = (b.n + chunks - 1) / chunks;
    C *bias_partial = ln2 ? b.ws + 2 * chunks * b.h : nullptr;
    const LnBwdBranch<T> br{ln2 ? b.branch : nullptr, ln2 ? site : DropoutSite{}};
    auto k = ln2 ? ln_bwd_chunk<T, VPL, true, kPacked, kMinBlocks> : ln_bwd_chunk<T, VPL, false, kPacked, kMinBlocks>;
    LAB_CUDA(launch_dependent(k, unsigned(chunks), 32 * kRows, 0, nullptr, b.dy, b.x, b.gamma, b.mean, b.rstd, b.dresid,
                              b.dx, b.n, b.h, R, chunks, br, b.ws, bias_partial));
    LAB_CUDA(launch_dependent(layernorm_param_finalize_kernel<T>, unsigned((b.h + kTileCols - 1) / kTileCols),
                              dim3(kTileCols, kRowLanes), 0, nullptr, static_cast<const C *>(b.ws), b.dgamma,
                              b.dbeta, b.h, chunks, false));
    if (ln2 && kMinBlocks == 1) LAB_CUDA(column_sum_finalize(nullptr, dt, bias_partial, b.bias, b.n, b.h, false));
    if (ln2 && kMinBlocks != 1)  // column_sum_finalize knows colsum's chunk count only: γ's finalize, on the bias
        LAB_CUDA(launch_dependent(layernorm_param_finalize_kernel<T>, unsigned((b.h + kTileCols - 1) / kTileCols),
                                  dim3(kTileCols, kRowLanes), 0, nullptr, static_cast<const C *>(bias_partial),
                                  b.bias, static_cast<T *>(nullptr), b.h, chunks, false));
}

// v4 / v5: the library's split form (kernels/layernorm.cu, layernorm_bwd_split_kernel: these versions
// moved there), 2 or 4 warps per row, with its finalisations.
template <typename T, int VPL, int kSplit>
void run_split(Bufs<T> &b, bool ln2, const DropoutSite &site) {
    const dst_dtype dt = std::is_same<T, __half>::value ? DST_DTYPE_FP16 : DST_DTYPE_BF16;
    bool ran = false;
    LAB_CUDA(layernorm_bwd(nullptr, dt, b.dy, b.x, false, b.gamma, b.beta, b.mean, b.rstd, b.dresid, b.dx, b.dgamma,
                           b.dbeta, b.n, b.h, false, b.ws, ln2 ? &site : nullptr, ln2 ? b.branch : nullptr,
                           ln2 ? b.bias : nullptr, kSplit, &ran));
    if (!ran) lab_fail(__FILE__, __LINE__, "layernorm_bwd", "the one-pass form did not run", kSplit);
}

template <typename F>
float time_us(F &&f, int reps = 50) {
    for (int i = 0; i < 5; ++i) f();
    cudaEvent_t a, e;
    LAB_CUDA(cudaEventCreate(&a));
    LAB_CUDA(cudaEventCreate(&e));
    LAB_CUDA(cudaEventRecord(a));
    for (int i = 0; i < reps; ++i) f();
    LAB_CUDA(cudaEventRecord(e));
    LAB_CUDA(cudaEventSynchronize(e));
    float ms = 0;
    LAB_CUDA(cudaEventElapsedTime(&ms, a, e));
    LAB_CUDA(cudaEventDestroy(a));
    LAB_CUDA(cudaEventDestroy(e));
    return 1000.0f * ms / reps;
}

int differing(const std::vector<unsigned char> &a, const std::vector<unsigned char> &b, size_t es) {
    int d = 0;
    for (size_t i = 0; i < a.size(); i += es) d += std::memcmp(&a[i], &b[i], es) != 0;
    return d;
}

template <typename T, int VPL>
int run_dtype(const char *name, int64_t n, int64_t h) {
    Bufs<T> b;
    b.n = n;
    b.h = h;
    const size_t count = size_t(n * h);
    T **rows_bufs[] = {&b.dy, &b.x, &b.y, &b.dresid, &b.dx, &b.branch};
    T **col_bufs[] = {&b.gamma, &b.beta, &b.dgamma, &b.dbeta, &b.bias, &b.bias_own};
    for (T **p : rows_bufs) *p = dev_alloc<T>(count);
    for (T **p : col_bufs) *p = dev_alloc<T>(size_t(h));
    b.mean = dev_alloc<float>(size_t(n));
    b.rstd = dev_alloc<float>(size_t(n));
    b.ws = dev_alloc<compute_t<T>>(size_t(4 * 4 * colsum::chunk_count(n) * h));  // v3: four times the chunks, read as two
    std::mt19937_64 rng(7);
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    std::vector<float> v(count), w(static_cast<size_t>(h));
    for (float &e : v) e = u(rng);
    upload(b.dy, v);
    for (float &e : v) e = u(rng);
    upload(b.dresid, v);
    for (float &e : v) e = 2.0f * u(rng) + 0.5f;
    upload(b.x, v);
    for (float &e : w) e = 1.0f + 0.5f * u(rng);
    upload(b.gamma, w);
    for (float &e : w) e = u(rng);
    upload(b.beta, w);
    const dst_dtype dt = std::is_same<T, __half>::value ? DST_DTYPE_FP16 : DST_DTYPE_BF16;
    LAB_CUDA(layernorm_fwd(nullptr, dt, b.x, b.gamma, b.beta, b.y, b.mean, b.rstd, n, h, 1e-12));
    DropoutSite site;
    site.seed = 0x5eedull;
    site.offset = 3;
    site.threshold = dropout_threshold(0.1);
    site.scale = 1.0 / 0.9;

    int failures = 0;
    std::printf("\n%s %lld x %lld\n", name, (long long)n, (long long)h);
    for (bool ln2 : {true, false}) {
        const char *form = ln2 ? "LN2 (dresid, branch, bias)" : "LN1 (dresid)";
        // The library's results, then each version's against them.
        run_library(b, ln2, site);
        LAB_CUDA(cudaDeviceSynchronize());
        const auto dx0 = download(b.dx, count), br0 = download(b.branch, count);
        const auto g0 = download(b.dgamma, size_t(h)), be0 = download(b.dbeta, size_t(h));
        const auto bi0 = download(b.bias, size_t(h));
        // bits: the sums must be the library's bits (v1, v2); otherwise within 2 % of the sum's scale (v3).
        auto check = [&](const char *ver, bool bits) {
            LAB_CUDA(cudaDeviceSynchronize());
            const int ddx = differing(download(b.dx, count), dx0, sizeof(T));
            const int dbr = ln2 ? differing(download(b.branch, count), br0, sizeof(T)) : 0;
            const auto g1 = download(b.dgamma, size_t(h)), be1 = download(b.dbeta, size_t(h));
            const auto bi1 = download(b.bias, size_t(h));
            const int dg = differing(g1, g0, sizeof(T)), db = differing(be1, be0, sizeof(T));
            // The bias gradient: column_sum's bits over the branch this version stored (v4 and v5 add a
            // row's two sums in another order, so their dx, and the branch, may differ from the library's).
            int dbi = 0;
            if (ln2) {
                LAB_CUDA(column_sum(nullptr, dt, b.branch, b.bias_own, b.n, b.h, false, b.ws));
                LAB_CUDA(cudaDeviceSynchronize());
                dbi = differing(bi1, download(b.bias_own, size_t(h)), sizeof(T));
            }
            double worst = 0;  // largest difference over the column sums' largest magnitude
            for (auto pr : {std::make_pair(&g1, &g0), std::make_pair(&be1, &be0), std::make_pair(&bi1, &bi0)}) {
                if (!ln2 && pr.first == &bi1) continue;
                double big = 0, diff = 0;
                for (int64_t c = 0; c < h; ++c) {
                    T a, r;
                    std::memcpy(&a, pr.first->data() + c * sizeof(T), sizeof(T));
                    std::memcpy(&r, pr.second->data() + c * sizeof(T), sizeof(T));
                    const double fa = to_compute(a), fr = to_compute(r);
                    big = std::max(big, std::fabs(fr));
                    diff = std::isfinite(fa) ? std::max(diff, std::fabs(fa - fr)) : 1e30;
                }
                worst = std::max(worst, diff / big);
            }
            const bool ok = bits ? dg == 0 && db == 0 && dbi == 0 : worst < 0.02;
            failures += !ok;
            std::printf("  check %-3s %-27s dgamma %d, dbeta %d differ, bias %d off its branch's sums (%s), worst %.1e; "
                        "dx %d, branch %d differ  %s\n",
                        ver, form, dg, db, dbi, bits ? "must be 0" : "another order", worst, ddx, dbr, ok ? "ok" : "FAIL");
        };
        auto clear = [&] {  // every output poisoned (all bits set: NaN), so that one not written differs
            LAB_CUDA(cudaMemset(b.dx, 0xff, count * sizeof(T)));
            LAB_CUDA(cudaMemset(b.branch, 0xff, count * sizeof(T)));
            LAB_CUDA(cudaMemset(b.dgamma, 0xff, size_t(h) * sizeof(T)));
            LAB_CUDA(cudaMemset(b.dbeta, 0xff, size_t(h) * sizeof(T)));
            LAB_CUDA(cudaMemset(b.bias, 0xff, size_t(h) * sizeof(T)));
        };
        clear();
        run_chunk<T, VPL, false>(b, ln2, site);
        check("v1", true);
        clear();
        run_chunk<T, VPL, true>(b, ln2, site);
        check("v2", true);
        clear();
        run_chunk<T, VPL, true, 2>(b, ln2, site);
        check("v3", false);
        if constexpr (VPL >= 2) {
            clear();
            run_split<T, VPL, 2>(b, ln2, site);
            check("v4", true);
        }
        if constexpr (VPL >= 4) {
            clear();
            run_split<T, VPL, 4>(b, ln2, site);
            check("v5", true);
        }
        const double mb = double(count) * sizeof(T) * (ln2 ? 5 : 4) / 1e6;  // dy, x, dresid in; dx (branch) out
        const float t0 = time_us([&] { run_library(b, ln2, site); });
        const float t1 = time_us([&] { run_chunk<T, VPL, false>(b, ln2, site); });
        const float t2 = time_us([&] { run_chunk<T, VPL, true>(b, ln2, site); });
        const float t3 = time_us([&] { run_chunk<T, VPL, true, 2>(b, ln2, site); });
        float t4 = 0, t5 = 0;  // v4 needs two vectors per lane, v5 four
        if constexpr (VPL >= 2) t4 = time_us([&] { run_split<T, VPL, 2>(b, ln2, site); });
        if constexpr (VPL >= 4) t5 = time_us([&] { run_split<T, VPL, 4>(b, ln2, site); });
        auto tbs = [&](float t) { return t > 0 ? mb / t : 0.0; };
        std::printf("  us per call, %-27s library %6.1f  v1 %6.1f  v2 %6.1f  v3 %6.1f  v4 %6.1f  v5 %6.1f  (%.0f MB: "
                    "%.2f %.2f %.2f %.2f %.2f %.2f TB/s)\n",
                    form, t0, t1, t2, t3, t4, t5, mb, tbs(t0), tbs(t1), tbs(t2), tbs(t3), tbs(t4), tbs(t5));
    }
    for (T **p : rows_bufs) LAB_CUDA(cudaFree(*p));
    for (T **p : col_bufs) LAB_CUDA(cudaFree(*p));
    LAB_CUDA(cudaFree(b.mean));
    LAB_CUDA(cudaFree(b.rstd));
    LAB_CUDA(cudaFree(b.ws));
    return failures;
}

template <typename T>
int run_h(const char *name, int64_t n, int64_t h) {
    const int64_t vpl = h / (32 * kVec<T>);
    if (vpl * 32 * kVec<T> != h || (vpl != 1 && vpl != 2 && vpl != 4)) {
        std::fprintf(stderr, "hidden must be 256, 512 or 1024\n");
        return 1;
    }
    return vpl == 1 ? run_dtype<T, 1>(name, n, h) : vpl == 2 ? run_dtype<T, 2>(name, n, h) : run_dtype<T, 4>(name, n, h);
}

}  // namespace lab

int main(int argc, char **argv) {
    std::setvbuf(stdout, nullptr, _IONBF, 0);  // every line out at once, whatever ends the run
    const int64_t n = argc > 1 ? std::atoll(argv[1]) : 8192, h = argc > 2 ? std::atoll(argv[2]) : 1024;
    int devices = 0;
    LAB_CUDA(cudaGetDeviceCount(&devices));
    std::printf("layernorm_lab: %d device(s), rows %lld, hidden %lld\n", devices, (long long)n, (long long)h);
    int failures = lab::run_h<__half>("fp16", n, h);
    failures += lab::run_h<__nv_bfloat16>("bf16", n, h);
    std::printf("\nlayernorm_lab: %s\n", failures ? "CHECKS FAILED" : "checks ok");
    return failures ? 1 : 0;
}
