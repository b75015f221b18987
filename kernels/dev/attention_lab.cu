// Attention timing lab: forward (lse out, no probs) and backward (P from lse) of the CUDA backend
// for BERT-Large heads (16 × 64, additive padding mask, dropout 0.1), generic kernels vs the GEMM
// path, fp16/bf16/fp32. Prints ms per call (median of 7 rounds × 10 calls), the relative L2
// difference of the two paths' outputs and the backend's workspace size.
//   build: cmake -DDST_BUILD_KERNEL_LAB=ON …; run: attention_lab
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <vector>

#include "backend/cuda/cuda_backend.h"
#include "core/error.h"
#include "kernels/philox.h"

namespace {

__global__ void fill_kernel(void *p, int64_t n, int dt, uint32_t seed, float lo, float hi) {
    for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
        uint32_t x = static_cast<uint32_t>(i) * 2654435761u ^ seed;
        x ^= x >> 15;
        x *= 2246822519u;
        x ^= x >> 13;
        const float v = lo + (hi - lo) * (x & 0xFFFFFF) / 16777216.0f;
        if (dt == DST_DTYPE_FP16) static_cast<__half *>(p)[i] = __float2half(v);
        else if (dt == DST_DTYPE_BF16) static_cast<__nv_bfloat16 *>(p)[i] = __float2bfloat16(v);
        else static_cast<float *>(p)[i] = v;
    }
}

__global__ void mask_kernel(float *m, int64_t B, int64_t S) {
    for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < B * S; i += int64_t(gridDim.x) * blockDim.x) {
        const int64_t b = i / S, j = i % S;
        m[i] = (b % 2 == 1 && j >= S - S / 3) ? -10000.0f : 0.0f;
    }
}

__global__ void to_float_kernel(const void *p, float *out, int64_t n, int dt) {
    for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
        if (dt == DST_DTYPE_FP16) out[i] = __half2float(static_cast<const __half *>(p)[i]);
        else if (dt == DST_DTYPE_BF16) out[i] = __bfloat162float(static_cast<const __nv_bfloat16 *>(p)[i]);
        else out[i] = static_cast<const float *>(p)[i];
    }
}

#define CK(x)                                                                                  \
    do {                                                                                       \
        if ((x) != DST_OK) {                                                                   \
            std::fprintf(stderr, "%s failed: %s\n", #x, dst::last_error());                   \
            return 1;                                                                          \
        }                                                                                      \
    } while (0)

std::vector<float> download(const void *p, int64_t n, dst_dtype dt) {
    float *tmp = nullptr;
    cudaMalloc(&tmp, n * sizeof(float));
    to_float_kernel<<<1024, 256>>>(p, tmp, n, dt);
    std::vector<float> h(n);
    cudaMemcpy(h.data(), tmp, n * sizeof(float), cudaMemcpyDeviceToHost);
    cudaFree(tmp);
    return h;
}

double rel_l2(const std::vector<float> &a, const std::vector<float> &b) {
    double num = 0, den = 0;
    for (size_t i = 0; i < a.size(); ++i) {
        num += double(a[i] - b[i]) * (a[i] - b[i]);
        den += double(b[i]) * b[i];
    }
    return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

}  // namespace

int main() {
    dst::Backend *raw = nullptr;
    CK(dst::make_cuda_backend(0, &raw));
    dst::CudaBackend &be = *static_cast<dst::CudaBackend *>(raw);
    cudaStream_t st = static_cast<cudaStream_t>(be.stream());
    cudaEvent_t e0, e1;
    cudaEventCreate(&e0);
    cudaEventCreate(&e1);
    const dst_dtype dts[] = {DST_DTYPE_FP16, DST_DTYPE_BF16, DST_DTYPE_FP32};
    const int64_t shapes[][2] = {{64, 128}, {16, 512}};
    std::printf("%-5s %-10s %-8s %9s %9s %9s %12s %12s\n", "dtype", "shape", "path", "fwd_ms", "bwd_ms", "total",
                "ctx_rel_l2", "dqkv_rel_l2");
    for (dst_dtype dt : dts)
        for (const auto &sh : shapes) {
            const int64_t B = sh[0], S = sh[1], heads = 16, d = 64, H = heads * d;
            const size_t es = dt == DST_DTYPE_FP32 ? 4 : 2;
            dst::AttentionParams p;
            p.batch = B;
            p.seq = S;
            p.hidden = H;
            p.heads = heads;
            p.head_dim = d;
            p.scale = 0.125;
            p.mask_kind = DST_MASK_ADDITIVE;
            p.mask_dtype = DST_DTYPE_FP32;
            p.dropout.seed = 1234;
            p.dropout.offset = 8;
            p.dropout.threshold = dst::dropout_threshold(0.1);
            p.dropout.scale = 1.0 / 0.9;
            void *qkv, *ctx, *dctx, *dqkv, *lse, *mask;
            CK(be.alloc(B * S * 3 * H * es, &qkv));
            CK(be.alloc(B * S * H * es, &ctx));
            CK(be.alloc(B * S * H * es, &dctx));
            CK(be.alloc(B * S * 3 * H * es, &dqkv));
            CK(be.alloc(B * heads * S * 4, &lse));
            CK(be.alloc(B * S * 4, &mask));
            fill_kernel<<<1024, 256, 0, st>>>(qkv, B * S * 3 * H, dt, 11u, -2.f, 2.f);
            fill_kernel<<<1024, 256, 0, st>>>(dctx, B * S * H, dt, 22u, -1.f, 1.f);
            mask_kernel<<<256, 256, 0, st>>>(static_cast<float *>(mask), B, S);
            p.mask = mask;
            std::vector<float> ref_ctx, ref_dqkv;
            for (int path = 0; path < 2; ++path) {
                be.set_attention_gemm_path(path == 1);
                for (int w = 0; w < 3; ++w) {
                    CK(be.attention_fwd(dt, p, qkv, ctx, nullptr, lse));
                    CK(be.attention_bwd(dt, p, qkv, ctx, dctx, nullptr, lse, dqkv));
                }
                CK(be.synchronize());
                std::vector<float> fms, bms;
                for (int r = 0; r < 7; ++r) {
                    float ms = 0;
                    cudaEventRecord(e0, st);
                    for (int it = 0; it < 10; ++it) CK(be.attention_fwd(dt, p, qkv, ctx, nullptr, lse));
                    cudaEventRecord(e1, st);
                    cudaEventSynchronize(e1);
                    cudaEventElapsedTime(&ms, e0, e1);
                    fms.push_back(ms / 10);
                    cudaEventRecord(e0, st);
                    for (int it = 0; it < 10; ++it)
                        CK(be.attention_bwd(dt, p, qkv, ctx, dctx, nullptr, lse, dqkv));
                    cudaEventRecord(e1, st);
                    cudaEventSynchronize(e1);
                    cudaEventElapsedTime(&ms, e0, e1);
                    bms.push_back(ms / 10);
                }
                std::sort(fms.begin(), fms.end());
                std::sort(bms.begin(), bms.end());
                std::vector<float> c = download(ctx, B * S * H, dt), g = download(dqkv, B * S * 3 * H, dt);
                double rc = 0, rg = 0;
                if (path == 0) {
                    ref_ctx = c;
                    ref_dqkv = g;
                } else {
                    rc = rel_l2(c, ref_ctx);
                    rg = rel_l2(g, ref_dqkv);
                }
                char shape[32];
                std::snprintf(shape, sizeof shape, "B%lld_S%lld", static_cast<long long>(B), static_cast<long long>(S));
                std::printf("%-5s %-10s %-8s %9.3f %9.3f %9.3f %12.2e %12.2e\n",
                            dt == DST_DTYPE_FP16 ? "fp16" : dt == DST_DTYPE_BF16 ? "bf16" : "fp32", shape,
                            path ? "gemm" : "generic", fms[3], bms[3], fms[3] + bms[3], rc, rg);
            }
            for (void *q : {qkv, ctx, dctx, dqkv, lse, mask}) be.free(q);
            std::printf("      workspace now %.1f MiB\n", be.workspace_bytes() / 1048576.0);
        }
    const cudaError_t err = cudaDeviceSynchronize();
    std::printf("cuda: %s\n", cudaGetErrorString(err));
    delete raw;
    return err == cudaSuccess ? 0 : 1;
}
