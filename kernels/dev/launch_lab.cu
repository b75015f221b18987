// Launch lab: what the boundary between two dependent kernels costs on this GPU, and what programmatic
// dependent launch (PDL) and CUDA graphs take off it. A chain of dependent elementwise kernels
// (y = 1.0001·x + 1, buffers alternating) is timed per kernel
//   plain   <<<>>> launches on one stream
//   pdl     the library's launch_dependent (kernels/launch.cuh: programmatic stream serialization;
//           the kernel begins with DST_GRID_DEPENDENCY(), as the library's kernels do)
//   graph / graph+pdl   the same chain captured once and replayed
// at three sizes, against the kernel's own time (one launch, timed alone); then the layer's pattern,
// a cuBLASLt GEMM (8192×1024 · 1024×1024, bf16) followed by the elementwise kernel on its output,
// plain and with the elementwise kernel launched as a PDL dependent of the GEMM.
//
//   nvcc -O3 -std=c++17 -arch=sm_90 -I. kernels/dev/launch_lab.cu -lcublasLt -o /tmp/launch_lab
// (run without DST_PDL=0 in the environment, or the pdl columns are plain launches)
#include <cublasLt.h>
#include <cuda_bf16.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "kernels/launch.cuh"
#include "kernels/dev/lab_check.cuh"

template <typename T>
__global__ void step_kernel(const T *x, T *y, int64_t n) {
    DST_GRID_DEPENDENCY();  // a no-op for the plain launches
    for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
        y[i] = T(float(x[i]) * 1.0001f + 1.0f);
}

template <bool kPdl, typename T>
void launch(cudaStream_t s, const T *x, T *y, int64_t n) {
    const unsigned blocks = unsigned(std::min<int64_t>((n + 255) / 256, 132 * 8));
    if constexpr (!kPdl)
        step_kernel<T><<<blocks, 256, 0, s>>>(x, y, n);
    else
        LAB_CUDA(dst::cuda::launch_dependent(step_kernel<T>, blocks, 256, 0, s, x, y, n));
}

template <typename F>
float time_ms(cudaStream_t s, F &&f, int reps = 7) {
    f();
    LAB_CUDA(cudaStreamSynchronize(s));
    std::vector<float> t;
    for (int r = 0; r < reps; ++r) t.push_back(lab_event_ms(s, f));
    std::sort(t.begin(), t.end());
    return t[t.size() / 2];
}

template <typename F>
cudaGraphExec_t capture(cudaStream_t s, F &&f) {
    cudaGraph_t g;
    cudaGraphExec_t e;
    LAB_CUDA(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    f();
    LAB_CUDA(cudaStreamEndCapture(s, &g));
    LAB_CUDA(cudaGraphInstantiate(&e, g, 0));
    LAB_CUDA(cudaGraphDestroy(g));
    return e;
}

int main() {
    if (!dst::cuda::dependent_launch_enabled())
        std::printf("note: programmatic launches are off (DST_PDL=0 or below sm_90): the pdl columns are plain\n");
    cudaStream_t s;
    LAB_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    const int chain = 400;
    float *a, *b;
    const int64_t big = 8192LL * 1024;
    LAB_CUDA(cudaMalloc(&a, big * 4));
    LAB_CUDA(cudaMalloc(&b, big * 4));
    LAB_CUDA(cudaMemset(a, 0, big * 4));
    LAB_CUDA(cudaMemset(b, 0, big * 4));
    std::printf("chain of %d dependent kernels, us per kernel (median of 7)\n", chain);
    std::printf("  %-12s %8s %8s %8s %8s %8s\n", "elements", "alone", "plain", "pdl", "graph", "graph+pdl");
    for (int64_t n : {int64_t(132 * 256), int64_t(1) << 20, big}) {
        const float alone = time_ms(s, [&] { launch<false>(s, a, b, n); }, 21) * 1e3f;
        auto run = [&](auto pdl) {
            for (int i = 0; i < chain; ++i) launch<decltype(pdl)::value>(s, i & 1 ? b : a, i & 1 ? a : b, n);
        };
        const float plain = time_ms(s, [&] { run(std::false_type{}); }) * 1e3f / chain;
        const float pdl = time_ms(s, [&] { run(std::true_type{}); }) * 1e3f / chain;
        cudaGraphExec_t g0 = capture(s, [&] { run(std::false_type{}); });
        cudaGraphExec_t g1 = capture(s, [&] { run(std::true_type{}); });
        const float gp = time_ms(s, [&] { LAB_CUDA(cudaGraphLaunch(g0, s)); }) * 1e3f / chain;
        const float gq = time_ms(s, [&] { LAB_CUDA(cudaGraphLaunch(g1, s)); }) * 1e3f / chain;
        std::printf("  %-12lld %8.2f %8.2f %8.2f %8.2f %8.2f\n", (long long)n, alone, plain, pdl, gp, gq);
        LAB_CUDA(cudaGraphExecDestroy(g0));
        LAB_CUDA(cudaGraphExecDestroy(g1));
    }

    // GEMM then elementwise, as in the layer (bf16, D[1024, 8192] col-major = x[8192,1024]·W[1024,1024]ᵀ).
    cublasLtHandle_t lt;
    LAB_LT(cublasLtCreate(&lt));
    const int64_t M = 1024, N = 8192, K = 1024;
    __nv_bfloat16 *A, *B, *D, *E;
    LAB_CUDA(cudaMalloc(&A, M * K * 2));
    LAB_CUDA(cudaMalloc(&B, K * N * 2));
    LAB_CUDA(cudaMalloc(&D, M * N * 2));
    LAB_CUDA(cudaMalloc(&E, M * N * 2));
    LAB_CUDA(cudaMemset(A, 0, M * K * 2));
    LAB_CUDA(cudaMemset(B, 0, K * N * 2));
    void *ws;
    const size_t wsb = 32 << 20;
    LAB_CUDA(cudaMalloc(&ws, wsb));
    cublasLtMatmulDesc_t op;
    LAB_LT(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    const int32_t tA = CUBLAS_OP_T;
    LAB_LT(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &tA, sizeof tA));
    cublasLtMatrixLayout_t la, lb, ld;
    LAB_LT(cublasLtMatrixLayoutCreate(&la, CUDA_R_16BF, K, M, K));
    LAB_LT(cublasLtMatrixLayoutCreate(&lb, CUDA_R_16BF, K, N, K));
    LAB_LT(cublasLtMatrixLayoutCreate(&ld, CUDA_R_16BF, M, N, M));
    cublasLtMatmulPreference_t pref;
    LAB_LT(cublasLtMatmulPreferenceCreate(&pref));
    LAB_LT(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &wsb, sizeof wsb));
    cublasLtMatmulHeuristicResult_t h;
    int found = 0;
    LAB_LT(cublasLtMatmulAlgoGetHeuristic(lt, op, la, lb, ld, ld, pref, 1, &h, &found));
    const float one = 1, zero = 0;
    auto gemm = [&] { LAB_LT(cublasLtMatmul(lt, op, &one, A, la, B, lb, &zero, D, ld, D, ld, &h.algo, ws, wsb, s)); };
    const float tg = time_ms(s, [&] { for (int i = 0; i < 50; ++i) gemm(); }) * 1e3f / 50;
    const float te = time_ms(s, [&] { for (int i = 0; i < 50; ++i) launch<false>(s, D, E, M * N); }) * 1e3f / 50;
    const float pp = time_ms(s, [&] { for (int i = 0; i < 50; ++i) { gemm(); launch<false>(s, D, E, M * N); } }) * 1e3f / 50;
    const float pq = time_ms(s, [&] { for (int i = 0; i < 50; ++i) { gemm(); launch<true>(s, D, E, M * N); } }) * 1e3f / 50;
    cudaGraphExec_t g0 = capture(s, [&] { for (int i = 0; i < 50; ++i) { gemm(); launch<false>(s, D, E, M * N); } });
    const float pg = time_ms(s, [&] { LAB_CUDA(cudaGraphLaunch(g0, s)); }) * 1e3f / 50;
    std::printf("GEMM 8192x1024x1024 bf16 then elementwise on its output (us per pair, 50 pairs)\n");
    std::printf("  GEMM alone %.2f (back to back), elementwise alone %.2f (back to back)\n", tg, te);
    std::printf("  pair plain %.2f, elementwise as PDL dependent %.2f, plain pairs in a graph %.2f\n", pp, pq, pg);
    return 0;
}
