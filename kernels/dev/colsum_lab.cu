// Column-sum lab: the column sums' second pass (column_sum_finalize_chunks, kernels/bias.cu: a block
// of 32 columns × 8 chunk lanes adds the per-chunk partials of kernels/column_partial.cuh) and the whole
// column_sum, at the layer's widths and chunk counts, each version checked bit for bit against the
// library's and then timed alone (a CUDA graph of plain launches, so that neither the launch nor a
// programmatic-dependent wait for the kernel before it is counted; the layer profile's kernel times
// include that wait).
//
//   nvcc -O3 -std=c++17 -arch=sm_90 -I. -Icapi/include kernels/dev/colsum_lab.cu -o /tmp/colsum_lab
//   /tmp/colsum_lab            (fp16 and bf16)
//
// v0: the library's (colsum::finalize_column): lane y adds partial[c] for c = y, y + 8, … in a plain
//     loop, which nvcc unrolls by 16 with the loads issued ahead of their adds.
// v1: the loads of 16 chunks written out first, into an array, chunks past the end loading +0 (the
//     same order and bits), then the adds. Measured on the H100 (2026-12-05): slower, 3.9 against 1.5 µs
//     at 128 chunks and 1.7 against 1.2 at 8: ptxas gives every predicated load the same register and
//     issues it after the previous add. Kept as the record of that try.
// An empty kernel's time in the same graphs is the floor (0.8 µs on the H100).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "kernels/bias.cu"
#include "kernels/dev/lab_check.cuh"

namespace lab {
using namespace dst;
using namespace dst::cuda;
constexpr int kTile = colsum::kTileThreads, kLanes = colsum::kRowLanes;

template <typename T>
__global__ void __launch_bounds__(kTile *kLanes) finalize_v1(const compute_t<T> *__restrict__ partial, T *db,
                                                              int64_t m, int64_t ld, int64_t chunks) {
    using C = compute_t<T>;
    constexpr int kBatch = colsum::kMaxChunks / kLanes;
    __shared__ C red[kLanes][kTile + 1];
    const int64_t col = blockIdx.x * int64_t(kTile) + threadIdx.x;
    C s = 0;
    if (col < m)
        for (int64_t c0 = threadIdx.y; c0 < chunks; c0 += int64_t(kLanes) * kBatch) {
            C v[kBatch];
#pragma unroll
            for (int i = 0; i < kBatch; ++i) {
                const int64_t c = c0 + int64_t(i) * kLanes;
                v[i] = c < chunks ? partial[c * ld + col] : C(0);
            }
#pragma unroll
            for (int i = 0; i < kBatch; ++i) s += v[i];
        }
    red[threadIdx.y][threadIdx.x] = s;
    __syncthreads();
    if (threadIdx.y == 0 && col < m) {
        C t = red[0][threadIdx.x];
        for (int k = 1; k < kLanes; ++k) t += red[k][threadIdx.x];
        db[col] = to_storage<T>(t);
    }
}

__global__ void empty_kernel() {}

// Microseconds per launch of `launch` (which enqueues one kernel on the stream): 50 launches captured
// once, the graph replayed 20 times after 3 warm-up replays.
template <typename F>
double time_us(cudaStream_t s, F launch) {
    constexpr int kPerGraph = 50, kReplays = 20;
    cudaGraph_t g;
    cudaGraphExec_t ge;
    LAB_CUDA(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    for (int i = 0; i < kPerGraph; ++i) launch();
    LAB_CUDA(cudaStreamEndCapture(s, &g));
    LAB_CUDA(cudaGraphInstantiate(&ge, g, 0));
    for (int i = 0; i < 3; ++i) LAB_CUDA(cudaGraphLaunch(ge, s));
    const float ms = lab_event_ms(s, [&] {
        for (int i = 0; i < kReplays; ++i) LAB_CUDA(cudaGraphLaunch(ge, s));
    });
    LAB_CUDA(cudaGraphExecDestroy(ge));
    LAB_CUDA(cudaGraphDestroy(g));
    return 1000.0 * ms / (kPerGraph * kReplays);
}

template <typename T>
int run(const char *name, dst_dtype dt, cudaStream_t s) {
    using C = compute_t<T>;
    int failures = 0;
    std::mt19937 rng(7);
    std::normal_distribution<float> nd(0.f, 1.f);
    std::printf("%s\n  %-34s %10s %10s %10s\n", name, "case", "v0 µs", "v1 µs", "bits");
    for (int64_t m : {1024, 3072, 4096})
        for (int64_t chunks : {8, 64, 128}) {
            std::vector<C> hp(size_t(chunks * m));
            for (auto &v : hp) v = C(nd(rng));
            C *p = nullptr;
            T *d0 = nullptr, *d1 = nullptr;
            LAB_CUDA(cudaMalloc(&p, hp.size() * sizeof(C)));
            LAB_CUDA(cudaMalloc(&d0, size_t(m) * sizeof(T)));
            LAB_CUDA(cudaMalloc(&d1, size_t(m) * sizeof(T)));
            // On the lab's stream: it is non-blocking, and a pageable cudaMemcpy may return before its DMA is done.
            LAB_CUDA(cudaMemcpyAsync(p, hp.data(), hp.size() * sizeof(C), cudaMemcpyHostToDevice, s));
            const unsigned grid = unsigned((m + kTile - 1) / kTile);
            auto v0 = [&] { LAB_CUDA(column_sum_finalize_chunks(s, dt, p, m, chunks, d0, m, false)); };
            auto v1 = [&] { finalize_v1<T><<<grid, dim3(kTile, kLanes), 0, s>>>(p, d1, m, m, chunks); };
            v0();
            v1();
            LAB_CUDA(cudaStreamSynchronize(s));
            std::vector<T> h0(static_cast<size_t>(m)), h1(static_cast<size_t>(m));
            LAB_CUDA(cudaMemcpy(h0.data(), d0, size_t(m) * sizeof(T), cudaMemcpyDeviceToHost));
            LAB_CUDA(cudaMemcpy(h1.data(), d1, size_t(m) * sizeof(T), cudaMemcpyDeviceToHost));
            const bool same = std::memcmp(h0.data(), h1.data(), size_t(m) * sizeof(T)) == 0;
            failures += !same;
            char label[64];
            std::snprintf(label, sizeof label, "finalize m=%lld chunks=%lld", (long long)m, (long long)chunks);
            std::printf("  %-34s %10.2f %10.2f %10s\n", label, time_us(s, v0), time_us(s, v1),
                        same ? "same" : "DIFFER");
            LAB_CUDA(cudaFree(p));
            LAB_CUDA(cudaFree(d0));
            LAB_CUDA(cudaFree(d1));
        }
    // The whole column sum (partial + finalisation) as the layer runs it, plain launches.
    for (int64_t n : {1024, 8192})
        for (int64_t m : {1024, 4096}) {
            T *dy = nullptr, *db = nullptr;
            void *ws = nullptr;
            std::vector<T> hy(size_t(n * m));
            for (auto &v : hy) v = to_storage<T>(nd(rng));
            LAB_CUDA(cudaMalloc(&dy, hy.size() * sizeof(T)));
            LAB_CUDA(cudaMalloc(&db, size_t(m) * sizeof(T)));
            LAB_CUDA(cudaMalloc(&ws, column_sum_workspace(dt, n, m)));
            LAB_CUDA(cudaMemcpyAsync(dy, hy.data(), hy.size() * sizeof(T), cudaMemcpyHostToDevice, s));
            LAB_CUDA(cudaStreamSynchronize(s));
            char label[64];
            std::snprintf(label, sizeof label, "column_sum n=%lld m=%lld", (long long)n, (long long)m);
            std::printf("  %-34s %10s %10.2f\n", label, "",
                        time_us(s, [&] { LAB_CUDA(column_sum(s, dt, dy, db, n, m, false, ws)); }));
            LAB_CUDA(cudaFree(dy));
            LAB_CUDA(cudaFree(db));
            LAB_CUDA(cudaFree(ws));
        }
    std::printf("  %-34s %10s %10.2f\n", "empty kernel (the floor)", "", time_us(s, [&] { empty_kernel<<<1, 32, 0, s>>>(); }));
    return failures;
}

}  // namespace lab

int main() {
    std::setvbuf(stdout, nullptr, _IONBF, 0);
    // Plain launches only: a captured programmatic dependency would time the boundary, not the kernel.
    setenv("DST_PDL", "0", 1);
    cudaStream_t s;
    LAB_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    int failures = lab::run<__half>("fp16", DST_DTYPE_FP16, s);
    failures += lab::run<__nv_bfloat16>("bf16", DST_DTYPE_BF16, s);
    std::printf("\ncolsum_lab: %s\n", failures ? "CHECKS FAILED" : "checks ok");
    return failures ? 1 : 0;
}
