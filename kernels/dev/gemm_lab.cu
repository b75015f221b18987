// GEMM lab: the layer's linear GEMMs through cuBLASLt as the CUDA backend issues them, with and
// without their epilogues, against the other algorithms cuBLASLt offers for the same problem and
// against the library's column-sum kernel. It answers one question per row: what an epilogue costs
// on top of the plain GEMM, and whether the heuristic's first choice is the fastest it offers.
//
//   nvcc -O3 -std=c++17 -arch=sm_90 -I. -Icapi/include kernels/dev/gemm_lab.cu -lcublasLt -o /tmp/gemm_lab
//   /tmp/gemm_lab [rows=8192] [hidden=1024] [inter=4096] [dtype=fp16|bf16]
//
// Rows (BERT-Large layer, `rows` tokens), each timed over 30 launches after 5 warm-up ones:
//   fwd      y[n,m] = x[n,k]·W[m,k]ᵀ       plain | BIAS epilogue
//   dX       dx[n,k] = dy[n,m]·W[m,k]      plain
//   dW       dW[m,k] = dy[n,m]ᵀ·x[n,k]     plain | BGRADB epilogue (db = Σ_n dy) | plain + column_sum
// For each, "h0" is the heuristic's first algorithm (what the backend runs) and "best/N" the fastest of
// the N algorithms the heuristic returns (up to 16), with its index.
// With LAB_DETAIL=1 every algorithm offered for the plain GEMMs is listed with its time and its
// configuration (algo id, tile, stages, split-K, reduction scheme, CTA swizzling, custom option, inner
// and cluster shape, waves), to find a run-independent rule where the first choice is not the fastest.
// The BGRADB bias gradient is checked against column_sum (fp32 sums of the same data; relative
// difference printed), so a fast algorithm that computes something else would show. Every algorithm's
// output is compared bit for bit with the first's ("same" / how many elements differ, and "bits
// same/N" in the summary): whether choosing among them by time could change a result.
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "kernels/bias.cu"
#include "kernels/dev/lab_check.cuh"

namespace {

constexpr size_t kWs = size_t(32) << 20;  // the backend's GEMM workspace size class
cublasLtHandle_t lt;
void *ws;
cudaStream_t stream;
cudaEvent_t ev0, ev1;

struct Problem {
    cublasOperation_t ta, tb;
    int64_t M, N, K, lda, ldb, ldd;
    const void *A, *B;
    void *D;
    cublasLtEpilogue_t epi;
    const void *vec;  // bias (BIAS) or bias gradient (BGRADB)
};

template <typename F>
float time_ms(F &&f) {
    for (int i = 0; i < 5; ++i) f();
    LAB_CUDA(cudaEventRecord(ev0, stream));
    for (int i = 0; i < 30; ++i) f();
    LAB_CUDA(cudaEventRecord(ev1, stream));
    LAB_CUDA(cudaEventSynchronize(ev1));
    float ms = 0;
    LAB_CUDA(cudaEventElapsedTime(&ms, ev0, ev1));
    return ms / 30;
}

bool detail = false;

void describe(const cublasLtMatmulHeuristicResult_t &h, int i, float ms, float h0) {
    const cublasLtMatmulAlgoConfigAttributes_t attrs[] = {
        CUBLASLT_ALGO_CONFIG_ID,           CUBLASLT_ALGO_CONFIG_TILE_ID,        CUBLASLT_ALGO_CONFIG_STAGES_ID,
        CUBLASLT_ALGO_CONFIG_SPLITK_NUM,   CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING,
        CUBLASLT_ALGO_CONFIG_CUSTOM_OPTION, CUBLASLT_ALGO_CONFIG_INNER_SHAPE_ID, CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID};
    const char *names[] = {"id", "tile", "stages", "splitk", "red", "swz", "custom", "inner", "cluster"};
    std::printf("      #%-2d %7.1f us (%+5.1f%%) waves %.2f ws %zu |", i, ms * 1e3, h0 > 0 ? (ms / h0 - 1) * 100 : 0.0,
                h.wavesCount, h.workspaceSize);
    for (size_t k = 0; k < sizeof attrs / sizeof attrs[0]; ++k) {
        // The query wants the attribute's exact size (2 or 4 bytes here): ask for it first.
        uint64_t v = 0;
        size_t need = 0, got = 0;
        if (cublasLtMatmulAlgoConfigGetAttribute(&h.algo, attrs[k], nullptr, 0, &need) != CUBLAS_STATUS_SUCCESS ||
            need == 0 || need > sizeof v) {
            std::printf(" %s ?", names[k]);
            continue;
        }
        if (cublasLtMatmulAlgoConfigGetAttribute(&h.algo, attrs[k], &v, need, &got) == CUBLAS_STATUS_SUCCESS)
            std::printf(" %s %llu", names[k], (unsigned long long)v);  // little-endian: the low bytes
        else
            std::printf(" %s ?", names[k]);
    }
    std::printf("\n");
}

struct Timed {
    float h0 = -1, best = -1;
    int best_i = -1, n = 0, same = 0;  // same: algorithms whose output has the first's bits
    float best_same = -1;              // the fastest of those
};

// Elements of the M×N output (leading dimension ldd, 2-byte elements) that differ from `ref`.
int64_t differing(const void *d, int64_t M, int64_t N, int64_t ldd, const std::vector<uint16_t> &ref) {
    std::vector<uint16_t> h(static_cast<size_t>(ldd * N));
    LAB_CUDA(cudaMemcpy(h.data(), d, h.size() * sizeof(uint16_t), cudaMemcpyDeviceToHost));
    int64_t n = 0;
    for (int64_t j = 0; j < N; ++j)
        for (int64_t i = 0; i < M; ++i) n += h[size_t(j * ldd + i)] != ref[size_t(j * ldd + i)];
    return n;
}

// Times the heuristic's algorithms for the problem (up to 16); h0 is the first.
Timed run(cudaDataType_t type, const Problem &p) {
    cublasLtMatmulDesc_t op;
    LAB_LT(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    const int32_t ta = p.ta, tb = p.tb;
    LAB_LT(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
    LAB_LT(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
    if (p.epi != CUBLASLT_EPILOGUE_DEFAULT) {
        const int32_t bt = type;
        LAB_LT(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE, &p.epi, sizeof p.epi));
        LAB_LT(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &p.vec, sizeof p.vec));
        LAB_LT(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bt, sizeof bt));
    }
    const bool an = p.ta == CUBLAS_OP_N, bn = p.tb == CUBLAS_OP_N;
    cublasLtMatrixLayout_t la, lb, ld;
    LAB_LT(cublasLtMatrixLayoutCreate(&la, type, an ? p.M : p.K, an ? p.K : p.M, p.lda));
    LAB_LT(cublasLtMatrixLayoutCreate(&lb, type, bn ? p.K : p.N, bn ? p.N : p.K, p.ldb));
    LAB_LT(cublasLtMatrixLayoutCreate(&ld, type, p.M, p.N, p.ldd));
    cublasLtMatmulPreference_t pref;
    LAB_LT(cublasLtMatmulPreferenceCreate(&pref));
    const uint64_t wsb = kWs;
    LAB_LT(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &wsb, sizeof wsb));
    cublasLtMatmulHeuristicResult_t heur[16];
    int found = 0;
    Timed t;
    const cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(lt, op, la, lb, ld, ld, pref, 16, heur, &found);
    if (st == CUBLAS_STATUS_SUCCESS) {
        const float one = 1.0f, zero = 0.0f;
        std::vector<uint16_t> ref;
        for (int i = 0; i < found; ++i) {
            if (heur[i].state != CUBLAS_STATUS_SUCCESS) continue;
            bool ok = true;
            const float ms = time_ms([&] {
                if (cublasLtMatmul(lt, op, &one, p.A, la, p.B, lb, &zero, p.D, ld, p.D, ld, &heur[i].algo, ws,
                                   heur[i].workspaceSize, stream) != CUBLAS_STATUS_SUCCESS)
                    ok = false;
            });
            if (!ok) continue;
            int64_t diff = 0;
            if (i == 0) {
                t.h0 = ms;
                ref.resize(static_cast<size_t>(p.ldd * p.N));
                LAB_CUDA(cudaMemcpy(ref.data(), p.D, ref.size() * sizeof(uint16_t), cudaMemcpyDeviceToHost));
            } else if (!ref.empty()) {
                diff = differing(p.D, p.M, p.N, p.ldd, ref);
            } else {
                diff = -1;  // the first failed: nothing to compare with
            }
            if (diff == 0) {
                ++t.same;
                if (t.best_same < 0 || ms < t.best_same) t.best_same = ms;
            }
            if (detail && p.epi == CUBLASLT_EPILOGUE_DEFAULT) {
                describe(heur[i], i, ms, t.h0);
                std::printf("          bits: %s", diff == 0 ? "same as #0\n" : "");
                if (diff != 0) std::printf("%lld of %lld elements differ from #0\n", (long long)diff, (long long)(p.M * p.N));
            }
            if (t.best < 0 || ms < t.best) {
                t.best = ms;
                t.best_i = i;
            }
        }
        t.n = found;
    }
    cublasLtMatmulPreferenceDestroy(pref);
    cublasLtMatrixLayoutDestroy(la);
    cublasLtMatrixLayoutDestroy(lb);
    cublasLtMatrixLayoutDestroy(ld);
    cublasLtMatmulDescDestroy(op);
    return t;
}

std::string cell(const Timed &t) {
    char buf[160];
    if (t.n == 0) return "      none";
    std::snprintf(buf, sizeof buf, "h0 %7.1f  best/%-2d %7.1f (#%d)  bits same/%d: %d, best %7.1f", t.h0 * 1e3, t.n,
                  t.best * 1e3, t.best_i, t.n, t.same, t.best_same * 1e3);
    return buf;
}

template <typename T>
void fill(T *d, int64_t count, unsigned seed) {
    std::vector<T> h(count);
    unsigned s = seed;
    for (auto &v : h) {
        s = s * 1664525u + 1013904223u;
        v = T(float(int(s >> 9) % 2001 - 1000) / 1000.0f);
    }
    LAB_CUDA(cudaMemcpy(d, h.data(), count * sizeof(T), cudaMemcpyHostToDevice));
}

template <typename T>
float to_f(T v) {
    return float(v);
}

template <typename T>
void lab(dst_dtype dt, cudaDataType_t type, int64_t n, int64_t H, int64_t I) {
    struct Lin {
        const char *name;
        int64_t k, m;
    } lins[] = {{"qkv", H, 3 * H}, {"out", H, H}, {"inter", H, I}, {"output", I, H}};
    const int64_t maxw = std::max(3 * H, I);
    T *x, *dy, *w, *y, *dw, *b, *db1, *db2;
    LAB_CUDA(cudaMalloc(&x, n * maxw * sizeof(T)));
    LAB_CUDA(cudaMalloc(&dy, n * maxw * sizeof(T)));
    LAB_CUDA(cudaMalloc(&y, n * maxw * sizeof(T)));
    LAB_CUDA(cudaMalloc(&w, maxw * maxw * sizeof(T)));
    LAB_CUDA(cudaMalloc(&dw, maxw * maxw * sizeof(T)));
    LAB_CUDA(cudaMalloc(&b, maxw * sizeof(T)));
    LAB_CUDA(cudaMalloc(&db1, maxw * sizeof(T)));
    LAB_CUDA(cudaMalloc(&db2, maxw * sizeof(T)));
    fill(x, n * maxw, 1);
    fill(dy, n * maxw, 2);
    fill(w, maxw * maxw, 3);
    fill(b, maxw, 4);
    void *csws;
    LAB_CUDA(cudaMalloc(&csws, std::max<size_t>(dst::cuda::column_sum_workspace(dt, n, maxw), 16)));
    std::printf("%s, %lld rows (µs per GEMM)\n", dt == DST_DTYPE_FP16 ? "fp16" : "bf16", (long long)n);
    for (const Lin &L : lins) {
        const int64_t k = L.k, m = L.m;
        // fwd: D[m,n] = (W as k×m)ᵀ·(x as k×n)
        Problem f{CUBLAS_OP_T, CUBLAS_OP_N, m, n, k, k, k, m, w, x, y, CUBLASLT_EPILOGUE_DEFAULT, nullptr};
        if (detail) std::printf("    %s fwd (M %lld N %lld K %lld):\n", L.name, (long long)m, (long long)n, (long long)k);
        const Timed fp = run(type, f);
        f.epi = CUBLASLT_EPILOGUE_BIAS;
        f.vec = b;
        const Timed fb = run(type, f);
        // dX: D[k,n] = (W as k×m)·(dy as m×n)
        Problem dx{CUBLAS_OP_N, CUBLAS_OP_N, k, n, m, k, m, k, w, dy, y, CUBLASLT_EPILOGUE_DEFAULT, nullptr};
        if (detail) std::printf("    %s dX:\n", L.name);
        const Timed dxp = run(type, dx);
        // dW: D[k,m] = (x as k×n)·(dy as m×n)ᵀ
        Problem wg{CUBLAS_OP_N, CUBLAS_OP_T, k, m, n, k, m, k, x, dy, dw, CUBLASLT_EPILOGUE_DEFAULT, nullptr};
        if (detail) std::printf("    %s dW:\n", L.name);
        const Timed wp = run(type, wg);
        wg.epi = CUBLASLT_EPILOGUE_BGRADB;
        wg.vec = db1;
        const Timed wb = run(type, wg);
        const float cs = time_ms([&] {
            LAB_CUDA(dst::cuda::column_sum(stream, dt, dy, db2, n, m, false, csws));
        });
        // The BGRADB sums against column_sum's (both from the last launches above).
        std::vector<T> h1(m), h2(m);
        LAB_CUDA(cudaMemcpy(h1.data(), db1, m * sizeof(T), cudaMemcpyDeviceToHost));
        LAB_CUDA(cudaMemcpy(h2.data(), db2, m * sizeof(T), cudaMemcpyDeviceToHost));
        double num = 0, den = 0;
        for (int64_t j = 0; j < m; ++j) {
            const double d = double(to_f(h1[j])) - double(to_f(h2[j]));
            num += d * d;
            den += double(to_f(h2[j])) * double(to_f(h2[j]));
        }
        std::printf("  %-6s k %5lld m %5lld | fwd plain %s | fwd BIAS %s\n", L.name, (long long)k, (long long)m,
                    cell(fp).c_str(), cell(fb).c_str());
        std::printf("  %-6s                  | dX  plain %s\n", "", cell(dxp).c_str());
        std::printf("  %-6s                  | dW  plain %s | dW BGRADB %s | column_sum %6.1f | db rel %.1e\n",
                    "", cell(wp).c_str(), cell(wb).c_str(), cs * 1e3, den > 0 ? std::sqrt(num / den) : 0.0);
    }
    for (void *p : {(void *)x, (void *)dy, (void *)y, (void *)w, (void *)dw, (void *)b, (void *)db1, (void *)db2,
                    csws})
        LAB_CUDA(cudaFree(p));
}

}  // namespace

int main(int argc, char **argv) {
    const int64_t n = argc > 1 ? std::atoll(argv[1]) : 8192;
    const int64_t H = argc > 2 ? std::atoll(argv[2]) : 1024;
    const int64_t I = argc > 3 ? std::atoll(argv[3]) : 4096;
    const std::string d = argc > 4 ? argv[4] : "fp16";
    detail = std::getenv("LAB_DETAIL") && std::string(std::getenv("LAB_DETAIL")) == "1";
    LAB_LT(cublasLtCreate(&lt));
    LAB_CUDA(cudaMalloc(&ws, kWs));
    LAB_CUDA(cudaStreamCreate(&stream));
    LAB_CUDA(cudaEventCreate(&ev0));
    LAB_CUDA(cudaEventCreate(&ev1));
    cudaDeviceProp prop{};
    LAB_CUDA(cudaGetDeviceProperties(&prop, 0));
    std::printf("GEMM lab on %s, cuBLASLt %zu\n", prop.name, cublasLtGetVersion());
    if (d == "bf16") lab<__nv_bfloat16>(DST_DTYPE_BF16, CUDA_R_16BF, n, H, I);
    else lab<__half>(DST_DTYPE_FP16, CUDA_R_16F, n, H, I);
    return 0;
}
