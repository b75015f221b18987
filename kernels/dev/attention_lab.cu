// Attention kernel lab: checks the flash attention kernels against an fp64 reference on awkward
// shapes, checks the dropped set exactly and the backward's determinism, checks every numbered
// version against the reference, and times them at BERT-Large heads (16 × 64) next to the GPU's
// dense fp16 GEMM rate measured in the same run.
//
// build and run on the GPU machine: bash kernels/dev/lab.sh OUTDIR [check] [time] [philox] [tma] [fp16|bf16]
//   (LAB_ROOT=DIR builds an earlier copy of kernels/ beside it, to time before and after in one
//   call); attention_lab profile [B S] [p0] [version NAME] runs one production forward and backward
//   (dropout 0 with p0), then one launch of the numbered version NAME (for ncu); philox
//   measures the Philox rate of the kernels' generator alone (the floor of dropout regeneration); tma
//   checks that TMA loads a key tile in the kernels' perm16 row order (check_tma_tile). LAB_ONLY=w1,w9,b8
//   (environment) times only the versions named (checks still run every version); LAB_ALL_SHAPES=1
//   times the versions at every shape (without a mask), LAB_LENGTHS=1 also with key lengths.
//
// Versions (fp16, d = 64, dropout 0.1, no mask, 8×2048 and 64×128; timings in bench/RESULTS.md, "attention
// lab"). Earlier kernels (2026-12-01, separate dK/dV and dQ backward kernels, one Philox block per
// 4 elements traded through shuffles) reached 81.5 TFLOP/s forward, 115.8 dK/dV, 106.8 dQ.
//   fwd  f1 (BN 64, 4 warps, 4 blocks/SM)  f2 = f1 at 3 blocks/SM  f3 (BN 128, 4 warps, 2)
//        f4 (BN 64, 8 warps, 2)  f5 (BN 32, 4 warps, 4)  f6 (BN 32, 4 warps, 5: 96 registers)
//        f7 (BN 64, 2 warps, 8)
//        w1 (wgmma, BN 64, 1 warpgroup, 3/SM)  w2 (wgmma, BN 128, 2/SM)  w3 (wgmma, BN 128, 1/SM): built
//        only for sm_90a (lab.sh defines DST_LAB_SM90A); kernels/attention_flash_wgmma.cuh
//        (w4–w6 and b7, which drew the dropout keep bits while the products ran, measured no faster
//        and were removed: commit 09487bb; w7, a second warpgroup drawing them, measured slower and
//        was removed: commit a8ce23e; bench/RESULTS.md)
//        w11, w12: w1 at 4 and 5 blocks per SM (128 and 96 registers: ptxas spills 16 and 52 bytes;
//        w1's bits), for short sequences, where w1's 3 blocks of 4 warps leave the loads exposed
//        (w13, w11 walking its items persistently with the next item's loads issued during the
//        current one's last tile, measured slower and was removed: commit 1ad7e92; bench/RESULTS.md)
//        w14: w11 with both key tiles of a two-tile item (S ≤ 128) copied before its first product
//        w8 (kernels/attention_flash_ws.cuh; warp-specialised: a producer warpgroup loads K and V
//        by TMA in perm16 order, two consumer warpgroups of 64 rows issue the next tile's scores
//        before the softmax; w1's bits), w9 (three consumer warpgroups), w10 (two, key tiles of
//        128: w2's bits)
//        all: 16 query rows per warp, Q fragments held in registers, perm16 key columns so that a
//        lane's four columns of a row are one Philox block (no shuffles), the scale folded into
//        the exponent's FFMA, the first Philox round's uniform products folded on the host.
//   bwd  b1 (BM 64 queries per step, 4 warps = 64 keys, 2 blocks/SM)  b2 (BM 32, 4 warps, 2)
//        b3 (BM 32, 8 warps = 128 keys, 1)  b4 (BM 64, 8 warps, 1)  b5 (BM 16, 4 warps, 3)
//        b4a = b4 with the ascending dQ order (the fallback when a (batch, head) has more key blocks
//        than fit on the GPU at once)
//        b6 (wgmma: Sᵀ, dP̃ᵀ, dV and dK on warpgroup MMAs, dQ on mma.sync; BM 64, 1 warpgroup = 64
//        keys, 2/SM; sm_90a only)  b8 = b6 with two warpgroups per block (128 keys, 1/SM): one dQ
//        partial per 128 keys  (b9, b8 persistent at S ≤ 128 with the next item's tiles loaded
//        during the last tile, measured no faster and was removed: commit 306aea1; b10, b8 with the
//        next tile's Sᵀ and dP̃ᵀ issued beside this tile's dV, dK and dQ products, measured slower and
//        was removed: commit 4bcf25c)
//        b8n = b8 without the dQ product and its adds: a timing control (what dQ costs), not checked
//        b11 = b8 with the dQ product on warpgroup MMAs (dSᵀ swizzled in shared memory, both
//        operands MN-major, each warpgroup 32 of dQ's columns; the library's backward)  (b12, b11
//        with the partials added 16 bytes at a time, and b13, b11 with a tile's dQ adds made in the
//        next step while its Sᵀ and dP̃ᵀ products run, measured no faster and were not kept;
//        bench/RESULTS.md)  b14 = b11 with a third, writer warpgroup that makes the dQ adds
//        (its turns included) from two shared fp32 buffers while the consumers go on (the library's
//        backward from S = 1024 with dropout: −9 % at 8×2048, −14 % at 2×8192 deterministic)
//        (b15, b14 with the consumers decoupled: each forms the dQ partial of its own 64 keys, the
//        Q/dctx tiles through four mbarrier stages, no block barrier per step; b16, b15 with the
//        consumers taking turns to issue Sᵀ/dP̃ᵀ, FlashAttention-3's ping-pong: measured no faster
//        than b14 and removed, commit e9fc30e has them in kernels/attention_flash_ws_bwd.cuh)
//        b14a, b14q = b14 without the writer's global adds, without the dQ product: timing
//        controls (what each costs), not checked  (b17, b14 with a step's dV/dK/dQ products
//        completing under the next step's start, measured no faster and was removed: commit
//        473e0da)
//        (b19, b20: the writer's adds as bulk reductions, per 256-byte row or per 16 KB tile,
//        in both modes: stochastic 7–14 % faster, deterministic slower; b14's stochastic adds
//        took b19's form, and both were removed: commit 9e22d5d has them)
//        (b21: the deterministic adds as bulk reductions by the writer's two halves on
//        alternate steps: no faster with dropout; removed, commit 6509c8e has it)
//        b11o, b14o = b11, b14 with the ascending dQ order (a tile's key blocks add in ticket order,
//        every block walking the query tiles from the first) instead of the step order; timed
//        with key lengths too under LAB_LENGTHS=1
//        b14b3, b14b4 = b14 with three, four dQ buffers (the consumers may run that many steps
//        ahead of the writer's turns); b14ob4 = b14o with four (written 2026-12-04, not yet run)
//        (b22, the writer backward in thread block clusters, was removed after its run: bench/RESULTS.md)
//        b15 = b11 with both query tiles of a two-tile block (S ≤ 128) copied with K and V, before
//        its first product (the forward's w14 for the backward; b11's bits)
//        all: one kernel; dSᵀ staged in shared memory for dQ = dS·K, added into an fp32
//        accumulator in a fixed key-block order (det) or in arrival order (stoch).
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <initializer_list>
#include <string>
#include <vector>

#include "kernels/attention_flash.cuh"
#include "kernels/attention_flash_impl.cuh"
#include "kernels/philox.h"
#if defined(DST_LAB_SM90A)
#include "kernels/attention_flash_wgmma.cuh"
#include "kernels/attention_flash_ws.cuh"  // w8–w10 and the TMA tile (CUtensorMap)
#endif
#include "kernels/dev/lab_check.cuh"

using namespace dst;
using namespace dst::cuda;

namespace {

// ---- host data ---------------------------------------------------------------------------------

uint32_t hash32(uint64_t x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ULL;
    x ^= x >> 33;
    return static_cast<uint32_t>(x);
}
// Uniform in [-1, 1) from (seed, i).
double urand(uint64_t seed, uint64_t i) { return (hash32(seed * 0x9E3779B97F4A7C15ULL + i) >> 8) / 8388608.0 - 1.0; }

uint16_t to_bits(double v, bool bf16) {
    if (bf16) return __nv_bfloat16_raw(__float2bfloat16_rn(static_cast<float>(v))).x;
    return __half_raw(__float2half_rn(static_cast<float>(v))).x;
}
double from_bits(uint16_t b, bool bf16) {
    if (bf16) {
        __nv_bfloat16_raw r;
        r.x = b;
        return __bfloat162float(__nv_bfloat16(r));
    }
    __half_raw r;
    r.x = b;
    return __half2float(__half(r));
}

struct Case {
    int B, S, heads, d;
    int mask;  // 0 none, 1 additive (fp32, −10000 and −inf entries), 2 key lengths
    bool causal;
    double p;
    bool det;
    bool bf16;
    std::string name() const {
        char buf[160];
        std::snprintf(buf, sizeof buf, "%s B%d S%d h%d d%d %s%s p%.1f %s", bf16 ? "bf16" : "fp16", B, S, heads, d,
                      mask == 0 ? "none" : mask == 1 ? "additive" : "lengths", causal ? "+causal" : "", p,
                      det ? "det" : "stoch");
        return buf;
    }
};

struct Inputs {
    std::vector<uint16_t> qkv, dctx;  // [B,S,3H], [B,S,H]
    std::vector<float> bias;          // [B,S] (additive)
    std::vector<int32_t> lens;        // [B]
};

Inputs make_inputs(const Case &c, uint64_t seed) {
    const int H = c.heads * c.d;
    Inputs in;
    in.qkv.resize(size_t(c.B) * c.S * 3 * H);
    in.dctx.resize(size_t(c.B) * c.S * H);
    for (size_t i = 0; i < in.qkv.size(); ++i) in.qkv[i] = to_bits(2.0 * urand(seed, i), c.bf16);
    for (size_t i = 0; i < in.dctx.size(); ++i) in.dctx[i] = to_bits(urand(seed + 1, i), c.bf16);
    in.bias.assign(size_t(c.B) * c.S, 0.0f);
    in.lens.assign(c.B, c.S);
    for (int b = 0; b < c.B; ++b) {
        // Batch 0 full; odd batches lose their last third; batch 2 (if any) hides every key.
        const int len = b == 2 ? 0 : (b % 2 == 1 ? c.S - c.S / 3 : c.S);
        in.lens[b] = len;
        for (int j = 0; j < c.S; ++j) {
            float v = float(0.5 * urand(seed + 2, size_t(b) * c.S + j));
            if (j >= len) v = (j % 3 == 0 && len > 0) ? -INFINITY : -10000.0f;
            if (b == 2) v = -INFINITY;
            in.bias[size_t(b) * c.S + j] = v;
        }
    }
    return in;
}

// ---- fp64 reference (AttentionArgs semantics) ---------------------------------------------------

struct Ref {
    std::vector<double> ctx, lse, dqkv;
};

Ref reference(const Case &c, const Inputs &in, const AttentionArgs &a, const std::vector<double> &ctx_gpu) {
    const int B = c.B, S = c.S, nh = c.heads, d = c.d, H = nh * d;
    const int64_t ld = 3 * H;
    Ref r;
    r.ctx.assign(size_t(B) * S * H, 0.0);
    r.lse.assign(size_t(B) * nh * S, 0.0);
    r.dqkv.assign(size_t(B) * S * 3 * H, 0.0);
    auto q = [&](int b, int i, int h, int t) { return from_bits(in.qkv[(size_t(b) * S + i) * ld + h * d + t], c.bf16); };
    auto k = [&](int b, int j, int h, int t) { return from_bits(in.qkv[(size_t(b) * S + j) * ld + H + h * d + t], c.bf16); };
    auto v = [&](int b, int j, int h, int t) { return from_bits(in.qkv[(size_t(b) * S + j) * ld + 2 * H + h * d + t], c.bf16); };
    auto go = [&](int b, int i, int h, int t) { return from_bits(in.dctx[(size_t(b) * S + i) * H + h * d + t], c.bf16); };
    const double dscale = c.p > 0 ? 1.0 / (1.0 - c.p) : 1.0;
#pragma omp parallel for collapse(2) schedule(dynamic)
    for (int b = 0; b < B; ++b)
        for (int h = 0; h < nh; ++h) {
            const int len = c.mask == 2 ? std::max(0, std::min(S, in.lens[b])) : S;
            std::vector<double> P(size_t(S) * S, 0.0), keep(size_t(S) * S, 1.0), dP(size_t(S) * S), Dv(S);
            for (int i = 0; i < S; ++i) {
                std::vector<double> s(S);
                double m = -INFINITY;
                for (int j = 0; j < S; ++j) {
                    if (j >= len || (c.causal && j > i)) {
                        s[j] = -INFINITY;
                    } else {
                        double dot = 0;
                        for (int t = 0; t < d; ++t) dot += q(b, i, h, t) * k(b, j, h, t);
                        s[j] = a.scale * dot + (c.mask == 1 ? double(in.bias[size_t(b) * S + j]) : 0.0);
                    }
                    m = std::max(m, s[j]);
                }
                double lse = -INFINITY;
                if (m != -INFINITY) {
                    double l = 0;
                    for (int j = 0; j < S; ++j) l += std::exp(s[j] - m);
                    lse = m + std::log(l);
                    for (int j = 0; j < S; ++j) P[size_t(i) * S + j] = std::exp(s[j] - lse);
                }
                r.lse[(size_t(b) * nh + h) * S + i] = lse;
                for (int j = 0; j < S; ++j) {
                    const uint64_t e = ((uint64_t(b) * nh + h) * S + i) * uint64_t(S) + j;
                    if (a.threshold) keep[size_t(i) * S + j] = philox_dropout_keep(a.seed, a.offset, e, a.threshold) ? 1 : 0;
                }
                for (int t = 0; t < d; ++t) {
                    double acc = 0;
                    for (int j = 0; j < S; ++j) acc += P[size_t(i) * S + j] * keep[size_t(i) * S + j] * dscale * v(b, j, h, t);
                    r.ctx[(size_t(b) * S + i) * H + h * d + t] = acc;
                }
                double D = 0;
                for (int t = 0; t < d; ++t) D += go(b, i, h, t) * ctx_gpu[(size_t(b) * S + i) * H + h * d + t];
                Dv[i] = D;
            }
            for (int i = 0; i < S; ++i)
                for (int j = 0; j < S; ++j) {
                    double dot = 0;
                    for (int t = 0; t < d; ++t) dot += go(b, i, h, t) * v(b, j, h, t);
                    const size_t ij = size_t(i) * S + j;
                    dP[ij] = P[ij] * (dot * keep[ij] * dscale - Dv[i]);  // dS
                }
            for (int i = 0; i < S; ++i)
                for (int t = 0; t < d; ++t) {
                    double acc = 0;
                    for (int j = 0; j < S; ++j) acc += dP[size_t(i) * S + j] * k(b, j, h, t);
                    r.dqkv[(size_t(b) * S + i) * ld + h * d + t] = a.scale * acc;
                }
            for (int j = 0; j < S; ++j)
                for (int t = 0; t < d; ++t) {
                    double dk = 0, dv = 0;
                    for (int i = 0; i < S; ++i) {
                        const size_t ij = size_t(i) * S + j;
                        dk += dP[ij] * q(b, i, h, t);
                        dv += P[ij] * keep[ij] * dscale * go(b, i, h, t);
                    }
                    r.dqkv[(size_t(b) * S + j) * ld + H + h * d + t] = a.scale * dk;
                    r.dqkv[(size_t(b) * S + j) * ld + 2 * H + h * d + t] = dv;
                }
        }
    return r;
}

double rel_l2(const std::vector<double> &x, const std::vector<double> &ref, bool *nan = nullptr) {
    double num = 0, den = 0;
    for (size_t i = 0; i < x.size(); ++i) {
        if (std::isnan(x[i]) && nan) *nan = true;
        if (std::isinf(ref[i]) || std::isinf(x[i])) {
            if (x[i] != ref[i]) num += 1e30;
            continue;
        }
        num += (x[i] - ref[i]) * (x[i] - ref[i]);
        den += ref[i] * ref[i];
    }
    return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

// ---- device run ---------------------------------------------------------------------------------

struct Dev {
    uint16_t *qkv = nullptr, *ctx = nullptr, *dctx = nullptr, *dqkv = nullptr;
    float *lse = nullptr, *bias = nullptr;
    int32_t *lens = nullptr;
    void *ws = nullptr;
    size_t ws_bytes = 0;
    void alloc(const Case &c) {
        const size_t H = size_t(c.heads) * c.d, N = size_t(c.B) * c.S;
        LAB_CUDA(cudaMalloc(&qkv, N * 3 * H * 2));
        LAB_CUDA(cudaMalloc(&ctx, N * H * 2));
        LAB_CUDA(cudaMalloc(&dctx, N * H * 2));
        LAB_CUDA(cudaMalloc(&dqkv, N * 3 * H * 2));
        LAB_CUDA(cudaMalloc(&lse, N * c.heads * 4));
        LAB_CUDA(cudaMalloc(&bias, N * 4));
        LAB_CUDA(cudaMalloc(&lens, c.B * 4));
    }
    // The inputs of a case: qkv, dctx, the additive mask and the key lengths.
    void upload(const Case &c, const Inputs &in) {
        const size_t H = size_t(c.heads) * c.d, N = size_t(c.B) * c.S;
        LAB_CUDA(cudaMemcpy(qkv, in.qkv.data(), N * 3 * H * 2, cudaMemcpyHostToDevice));
        LAB_CUDA(cudaMemcpy(dctx, in.dctx.data(), N * H * 2, cudaMemcpyHostToDevice));
        LAB_CUDA(cudaMemcpy(bias, in.bias.data(), N * 4, cudaMemcpyHostToDevice));
        LAB_CUDA(cudaMemcpy(lens, in.lens.data(), c.B * 4, cudaMemcpyHostToDevice));
    }
    void free_all() {
        cudaFree(qkv), cudaFree(ctx), cudaFree(dctx), cudaFree(dqkv), cudaFree(lse), cudaFree(bias), cudaFree(lens),
            cudaFree(ws);
    }
};

AttentionArgs args_of(const Case &c, const Dev &dv) {
    AttentionArgs a;
    a.batch = c.B;
    a.seq = c.S;
    a.heads = c.heads;
    a.head_dim = c.d;
    a.hidden = int64_t(c.heads) * c.d;
    a.scale = 1.0 / std::sqrt(double(c.d));
    a.causal = c.causal;
    a.key_bias = c.mask == 1 ? dv.bias : nullptr;
    a.key_len = c.mask == 2 ? dv.lens : nullptr;
    a.seed = 0x1234567890ULL;
    a.offset = 77;
    a.threshold = dropout_threshold(c.p);
    a.drop_scale = c.p > 0 ? 1.0 / (1.0 - c.p) : 1.0;
    a.deterministic = c.det;
    return a;
}

// A case's device tensors: allocated, the inputs uploaded, the backward's workspace allocated.
AttentionArgs prepare(Dev &dv, const Case &c, const Inputs &in) {
    dv.alloc(c);
    dv.upload(c, in);
    const AttentionArgs a = args_of(c, dv);
    dv.ws_bytes = flash_attention_bwd_workspace(a);
    LAB_CUDA(cudaMalloc(&dv.ws, dv.ws_bytes));
    return a;
}

// n 16-bit elements from the device, as their bits.
std::vector<uint16_t> download_bits(const uint16_t *p, size_t n) {
    std::vector<uint16_t> h(n);
    LAB_CUDA(cudaMemcpy(h.data(), p, n * 2, cudaMemcpyDeviceToHost));
    return h;
}
size_t count_differing(const std::vector<uint16_t> &x, const std::vector<uint16_t> &y) {
    size_t n = 0;
    for (size_t i = 0; i < x.size(); ++i) n += x[i] != y[i];
    return n;
}

std::vector<double> download(const uint16_t *p, size_t n, bool bf16) {
    const std::vector<uint16_t> h = download_bits(p, n);
    std::vector<double> out(n);
    for (size_t i = 0; i < n; ++i) out[i] = from_bits(h[i], bf16);
    return out;
}

int g_failures = 0;

// Runs the production path on one case and compares ctx, lse and dqkv with the fp64 reference.
void check_case(const Case &c) {
    Dev dv;
    const Inputs in = make_inputs(c, 1000 + c.S * 7 + c.d);
    const size_t H = size_t(c.heads) * c.d, N = size_t(c.B) * c.S;
    const AttentionArgs a = prepare(dv, c, in);
    LAB_CUDA(cudaMemset(dv.ctx, 0xff, N * H * 2));  // poison: NaN in fp16 and bf16
    LAB_CUDA(cudaMemset(dv.dqkv, 0xff, N * 3 * H * 2));
    LAB_CUDA(cudaMemset(dv.lse, 0xff, N * c.heads * 4));
    LAB_CUDA(flash_attention_fwd(0, c.bf16, a, dv.qkv, dv.ctx, dv.lse));
    LAB_CUDA(flash_attention_bwd(0, c.bf16, a, dv.qkv, dv.ctx, dv.dctx, dv.lse, dv.dqkv, dv.ws));
    LAB_CUDA(cudaDeviceSynchronize());
    const std::vector<double> ctx = download(dv.ctx, N * H, c.bf16), dqkv = download(dv.dqkv, N * 3 * H, c.bf16);
    std::vector<float> lsef(N * c.heads);
    LAB_CUDA(cudaMemcpy(lsef.data(), dv.lse, lsef.size() * 4, cudaMemcpyDeviceToHost));
    std::vector<double> lse(lsef.begin(), lsef.end());
    const Ref r = reference(c, in, a, ctx);
    bool nan = false;
    const double e_ctx = rel_l2(ctx, r.ctx, &nan), e_lse = rel_l2(lse, r.lse, &nan), e_dq = rel_l2(dqkv, r.dqkv, &nan);
    const double tol = c.bf16 ? 1e-2 : 1e-3;
    const bool ok = !nan && e_ctx <= tol && e_lse <= 1e-5 && e_dq <= tol;
    if (!ok) ++g_failures;
    std::printf("%-4s %-60s ctx %.2e lse %.2e dqkv %.2e%s\n", ok ? "ok" : "FAIL", c.name().c_str(), e_ctx, e_lse, e_dq,
                nan ? " NaN" : "");
    dv.free_all();
}

// The dropped set, exactly: with Q = 0 every visible score is equal, so with V = one-hot rows
// (v_j = e_j, S ≤ d) ctx[i][j] = keep_ij/((1 − p)·visible_i): nonzero exactly where kept; and with
// dctx rows one-hot (dctx_i = e_i), dV[j][i] = P̃_ij: nonzero exactly where kept (dkdv kernel).
void check_dropped_set(bool bf16, int S, bool det) {
    Case c{2, S, 2, 128, 0, false, 0.3, det, bf16};
    Dev dv;
    dv.alloc(c);
    const size_t H = size_t(c.heads) * c.d, N = size_t(c.B) * c.S;
    std::vector<uint16_t> qkv(N * 3 * H, 0), dctx(N * H, 0);
    for (int b = 0; b < c.B; ++b)
        for (int i = 0; i < S; ++i)
            for (int h = 0; h < c.heads; ++h) {
                qkv[(size_t(b) * S + i) * 3 * H + 2 * H + h * c.d + i] = to_bits(1.0, bf16);
                dctx[(size_t(b) * S + i) * H + h * c.d + i] = to_bits(1.0, bf16);
            }
    LAB_CUDA(cudaMemcpy(dv.qkv, qkv.data(), qkv.size() * 2, cudaMemcpyHostToDevice));
    LAB_CUDA(cudaMemcpy(dv.dctx, dctx.data(), dctx.size() * 2, cudaMemcpyHostToDevice));
    AttentionArgs a = args_of(c, dv);
    LAB_CUDA(cudaMalloc(&dv.ws, flash_attention_bwd_workspace(a)));
    LAB_CUDA(flash_attention_fwd(0, bf16, a, dv.qkv, dv.ctx, dv.lse));
    LAB_CUDA(flash_attention_bwd(0, bf16, a, dv.qkv, dv.ctx, dv.dctx, dv.lse, dv.dqkv, dv.ws));
    const std::vector<double> ctx = download(dv.ctx, N * H, bf16), dqkv = download(dv.dqkv, N * 3 * H, bf16);
    int64_t wrong_f = 0, wrong_b = 0, kept = 0, total = 0;
    for (int b = 0; b < c.B; ++b)
        for (int h = 0; h < c.heads; ++h)
            for (int i = 0; i < S; ++i)
                for (int j = 0; j < S; ++j) {
                    const uint64_t e = ((uint64_t(b) * c.heads + h) * S + i) * uint64_t(S) + j;
                    const bool keep = philox_dropout_keep(a.seed, a.offset, e, a.threshold);
                    kept += keep;
                    ++total;
                    wrong_f += (ctx[(size_t(b) * S + i) * H + h * c.d + j] != 0.0) != keep;
                    wrong_b += (dqkv[(size_t(b) * S + j) * 3 * H + 2 * H + h * c.d + i] != 0.0) != keep;
                }
    const bool ok = wrong_f == 0 && wrong_b == 0;
    if (!ok) ++g_failures;
    std::printf("%-4s dropped set %s S%d %s: %lld of %lld kept (%.3f); mismatches fwd %lld, dV %lld\n", ok ? "ok" : "FAIL",
                bf16 ? "bf16" : "fp16", S, det ? "det" : "stoch", (long long)kept, (long long)total, double(kept) / total,
                (long long)wrong_f, (long long)wrong_b);
    dv.free_all();
}

// Two backward runs bit-identical (deterministic), or close (stochastic).
void check_determinism(bool det, int B, int S) {
    Case c{B, S, 4, 64, 2, false, 0.1, det, false};
    Dev dv;
    const size_t H = size_t(c.heads) * c.d, N = size_t(c.B) * c.S;
    const AttentionArgs a = prepare(dv, c, make_inputs(c, 5));
    LAB_CUDA(flash_attention_fwd(0, false, a, dv.qkv, dv.ctx, dv.lse));
    LAB_CUDA(flash_attention_bwd(0, false, a, dv.qkv, dv.ctx, dv.dctx, dv.lse, dv.dqkv, dv.ws));
    const std::vector<uint16_t> r1 = download_bits(dv.dqkv, N * 3 * H);
    LAB_CUDA(flash_attention_bwd(0, false, a, dv.qkv, dv.ctx, dv.dctx, dv.lse, dv.dqkv, dv.ws));
    const size_t diff = count_differing(r1, download_bits(dv.dqkv, N * 3 * H));
    const bool ok = det ? diff == 0 : true;
    if (!ok) ++g_failures;
    std::printf("%-4s %s backward twice, %dx%d: %zu of %zu elements differ\n", ok ? "ok" : "FAIL",
                det ? "deterministic" : "stochastic", B, S, diff, r1.size());
    dv.free_all();
}

// ---- timing -------------------------------------------------------------------------------------

float time_ms(const std::function<void()> &f, int reps) {
    for (int w = 0; w < 2; ++w) f();
    LAB_CUDA(cudaDeviceSynchronize());
    std::vector<float> t;
    cudaEvent_t a, b;
    LAB_CUDA(cudaEventCreate(&a));
    LAB_CUDA(cudaEventCreate(&b));
    for (int r = 0; r < reps; ++r) {
        LAB_CUDA(cudaEventRecord(a));
        f();
        LAB_CUDA(cudaEventRecord(b));
        LAB_CUDA(cudaEventSynchronize(b));
        float ms = 0;
        LAB_CUDA(cudaEventElapsedTime(&ms, a, b));
        t.push_back(ms);
    }
    cudaEventDestroy(a);
    cudaEventDestroy(b);
    std::sort(t.begin(), t.end());
    return t[t.size() / 2];
}

double gemm_peak_tflops(bool bf16) {
    const int n = 8192;
    void *A, *B, *C;
    LAB_CUDA(cudaMalloc(&A, size_t(n) * n * 2));
    LAB_CUDA(cudaMalloc(&B, size_t(n) * n * 2));
    LAB_CUDA(cudaMalloc(&C, size_t(n) * n * 2));
    std::vector<uint16_t> h(size_t(n) * n);
    for (size_t i = 0; i < h.size(); ++i) h[i] = to_bits(urand(9, i), bf16);
    LAB_CUDA(cudaMemcpy(A, h.data(), h.size() * 2, cudaMemcpyHostToDevice));
    LAB_CUDA(cudaMemcpy(B, h.data(), h.size() * 2, cudaMemcpyHostToDevice));
    cublasHandle_t hd;
    cublasCreate(&hd);
    const float one = 1.0f, zero = 0.0f;
    const cudaDataType_t t = bf16 ? CUDA_R_16BF : CUDA_R_16F;
    const float ms = time_ms(
        [&] {
            cublasGemmEx(hd, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &one, A, t, n, B, t, n, &zero, C, t, n,
                         CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
        },
        10);
    cublasDestroy(hd);
    cudaFree(A), cudaFree(B), cudaFree(C);
    return 2.0 * n * n * double(n) / (ms * 1e-3) / 1e12;
}

// The Philox ceiling of dropout regeneration: each thread draws 8 independent groups per iteration
// with the kernels' philox_group (8 chains in flight, as a forward tile's lane has), counts the kept
// words and sums all words, so nothing is dead code and the two forms can be compared word for word.
// Groups per second on the whole GPU; a direction of attention at B×S with h heads draws B·h·S²/4
// groups. M0: the groups through philox_group_m0 (the product M0·group formed by additions, as the
// kernels do when every group of a call is below 2^32).
template <bool M0>
__global__ void philox_rate_kernel(const flash::Params p, int iters, uint32_t *out) {
    uint32_t kept = 0, sum = 0;
    const uint32_t r0c = flash::philox_r0c(p);
    const uint64_t tid = uint64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    for (int it = 0; it < iters; ++it) {
        const uint64_t g0 = (uint64_t(it) * gridDim.x * blockDim.x + tid) * 8;
        uint64_t m0 = uint64_t(flash::kPhiloxM0) * uint32_t(g0);
#pragma unroll
        for (int c = 0; c < 8; ++c) {
            const uint4 r = M0 ? flash::philox_group_m0(p, r0c, m0) : flash::philox_group(p, r0c, g0 + uint64_t(c));
            m0 += flash::kPhiloxM0;
            kept += (r.x >= p.threshold) + (r.y >= p.threshold) + (r.z >= p.threshold) + (r.w >= p.threshold);
            sum += r.x ^ r.y ^ r.z ^ r.w;
        }
    }
    out[2 * tid] = kept;
    out[2 * tid + 1] = sum;
}

void philox_rate() {
    AttentionArgs a{};
    a.batch = 1, a.seq = 128, a.heads = 1, a.head_dim = 64, a.hidden = 64;
    a.seed = 1234, a.offset = 77, a.threshold = dropout_threshold(0.1), a.drop_scale = 1.0 / 0.9;
    const flash::Params p = flash::make_params(a);
    int sms = 0, clock_khz = 0;
    LAB_CUDA(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    LAB_CUDA(cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, 0));
    const int threads = 256, blocks = sms * 8, iters = 256;
    uint32_t *out = nullptr;
    LAB_CUDA(cudaMalloc(&out, size_t(blocks) * threads * 2 * sizeof(uint32_t)));
    std::vector<uint32_t> got[2];
    for (int m0 : {0, 1}) {
        const float ms = time_ms(
            [&] {
                if (m0) philox_rate_kernel<true><<<blocks, threads>>>(p, iters, out);
                else philox_rate_kernel<false><<<blocks, threads>>>(p, iters, out);
            },
            10);
        LAB_CUDA(cudaGetLastError());
        got[m0].resize(size_t(blocks) * threads * 2);
        LAB_CUDA(cudaMemcpy(got[m0].data(), out, got[m0].size() * 4, cudaMemcpyDeviceToHost));
        const double groups = double(blocks) * threads * iters * 8, rate = groups / (ms * 1e-3);
        const double per_dir = 8.0 * 16 * 2048.0 * 2048.0 / 4;  // 8×2048, 16 heads
        std::printf("philox%s: %.3f ms for %.3g groups: %.3g groups/s, %.2f groups per SM per cycle at %.0f MHz; "
                    "8x2048x16 heads (%.3g groups per direction): %.3f ms per direction\n",
                    m0 ? " (m0 form)" : "", ms, groups, rate, rate / sms / (clock_khz * 1e3), clock_khz / 1e3, per_dir,
                    per_dir / rate * 1e3);
    }
    LAB_CUDA(cudaFree(out));
    const bool same = got[0] == got[1];  // every thread's kept count and word sum: the two forms agree
    if (!same) ++g_failures;
    std::printf("%-4s philox: the two forms keep and sum the same words in every thread\n", same ? "ok" : "FAIL");
}

#if defined(DST_LAB_SM90A)
// ---- TMA: a key tile in perm16 row order (docs/design-notes.md, "What the long-sequence target asks")
// Two 4-D tensor maps over qkv [rows][ld], at row 0 and row 2: dimensions (columns, x0, x2 + 2·x3,
// 16-row group), strides (1, ld, 4·ld, 16·ld) elements; a (64, 2, 4, 1) box of map x1 for group G
// holds keys 16G + x0 + 2·x1 + 4·(x2 + 2·x3) in the order x0 fastest, then x2 + 2·x3: loaded at
// shared row 16G + 8·x1, it puts key x of the group at row perm16_inv(x), as the cp.async copies of
// flash_fwd_wgmma_kernel do. tma_tile_kernel loads one 64-key tile of one head that way (eight 1 KB
// boxes, one mbarrier) and copies the 8 KB of shared memory out as they are (swizzled); the host
// compares them with the layout the wgmma descriptors read.
__global__ void tma_tile_kernel(const __grid_constant__ flash::ws::Maps maps, int col0, int group0, uint4 *out) {
    extern __shared__ __align__(1024) unsigned char smem_raw[];
    const uint32_t base = (flash::smem_addr(smem_raw) + 1023u) & ~1023u;
    const uint32_t bar = base + 8192;
    unsigned char *gen = smem_raw + (base - flash::smem_addr(smem_raw));
    if (threadIdx.x == 0) flash::mbar_init(bar, 1);
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    __syncthreads();
    if (threadIdx.x == 0) {
        flash::mbar_expect(bar, 8192);
        flash::ws::tma_tile(maps, base, col0, group0, bar);  // w8's loads
    }
    flash::mbar_wait(bar, 0);
    for (int i = threadIdx.x; i < 512; i += blockDim.x) out[i] = reinterpret_cast<const uint4 *>(gen)[i];
}

// The check: B = 2, S = 128, 16 heads of 64 (ld = 3072), the K tile of head 3 at keys 64 … 127 of batch 1.
void check_tma_tile() {
    const int B = 2, S = 128, heads = 16, H = heads * 64, ld = 3 * H, rows = B * S;
    std::vector<uint16_t> qkv(size_t(rows) * ld);
    for (size_t i = 0; i < qkv.size(); ++i) qkv[i] = uint16_t(hash32(i) & 0x7BFF);  // finite fp16 bits
    uint16_t *dqkv = nullptr;
    uint4 *dout = nullptr;
    LAB_CUDA(cudaMalloc(&dqkv, qkv.size() * 2));
    LAB_CUDA(cudaMalloc(&dout, 8192));
    LAB_CUDA(cudaMemcpy(dqkv, qkv.data(), qkv.size() * 2, cudaMemcpyHostToDevice));
    flash::ws::Maps maps;
    const cudaError_t me = flash::ws::make_maps(maps, dqkv, rows, ld);
    if (me != cudaSuccess) {
        ++g_failures;
        std::printf("FAIL tma: the tensor maps were refused (%s)\n", cudaGetErrorString(me));
        return;
    }
    const int head = 3, key0 = S + 64;  // batch 1, keys 64 … 127
    const int col0 = H + head * 64;     // K of the head
    LAB_CUDA(cudaFuncSetAttribute(tma_tile_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 8192 + 1024 + 16));
    tma_tile_kernel<<<1, 128, 8192 + 1024 + 16>>>(maps, col0, key0 / 16, dout);
    LAB_CUDA(cudaGetLastError());
    LAB_CUDA(cudaDeviceSynchronize());
    std::vector<uint16_t> got(4096);
    LAB_CUDA(cudaMemcpy(got.data(), dout, 8192, cudaMemcpyDeviceToHost));
    auto perm16_inv = [](int x) { return 8 * ((x >> 1) & 1) + 2 * (x >> 2) + (x & 1); };
    int64_t wrong = 0;
    for (int jl = 0; jl < 64; ++jl) {                     // the tile's key jl
        const int r = 16 * (jl / 16) + perm16_inv(jl % 16);  // its shared row
        for (int c = 0; c < 64; ++c) {
            const size_t at = size_t(r) * 64 + size_t(((c / 8) ^ (r & 7)) * 8 + c % 8);  // swizzled 16-byte chunk
            wrong += got[at] != qkv[size_t(key0 + jl) * ld + col0 + c];
        }
    }
    const bool ok = wrong == 0;
    if (!ok) ++g_failures;
    std::printf("%-4s tma: a 64-key tile in perm16 order from eight boxes of two 4-D maps: %lld of 4096 elements "
                "misplaced\n",
                ok ? "ok" : "FAIL", (long long)wrong);
    LAB_CUDA(cudaFree(dqkv));
    LAB_CUDA(cudaFree(dout));
}
#endif

// Params of a call with every pointer and the backward scratch bound.
flash::Params bound_params(const AttentionArgs &a, Dev &dv) {
    flash::Params p = flash::make_params(a);
    p.qkv = dv.qkv, p.ctx = dv.ctx, p.lse = dv.lse, p.dctx = dv.dctx, p.ctx_in = dv.ctx, p.dqkv = dv.dqkv;
    flash::BwdScratch(a).bind(p, dv.ws);
    p.vec16 = p.vec16 && (reinterpret_cast<uintptr_t>(dv.qkv) & 15) == 0;
    return p;
}

// One timed shape: inputs, a Params with pointers, and helpers to time a launch.
struct Bench {
    Case c;
    Dev dv;
    AttentionArgs a;
    flash::Params p;
    double fwd_flops;
    explicit Bench(const Case &cc) : c(cc) {
        a = prepare(dv, c, make_inputs(c, 3));
        std::vector<int32_t> lens(c.B);
        for (int b = 0; b < c.B; ++b) lens[b] = b % 2 ? c.S - c.S / 4 : c.S;
        LAB_CUDA(cudaMemcpy(dv.lens, lens.data(), c.B * 4, cudaMemcpyHostToDevice));
        LAB_CUDA(flash_attention_fwd(0, c.bf16, a, dv.qkv, dv.ctx, dv.lse));
        p = bound_params(a, dv);
        LAB_CUDA(cudaDeviceSynchronize());
        fwd_flops = 4.0 * c.B * c.heads * double(c.S) * c.S * c.d;
    }
    ~Bench() { dv.free_all(); }
    int reps() const { return c.S >= 8192 ? 5 : 15; }
};

template <typename K>
int occupancy(K kernel, int threads, size_t smem) {
    int n = 0;
    LAB_CUDA(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kernel, threads, smem));
    return n;
}

// A numbered version: its name and launches of the forward and the whole backward (prologue
// included) with a Params whose pointers and scratch are set.
struct FwdVersion {
    const char *name;
    int bn, nw, mb;
    std::function<cudaError_t(const flash::Params &)> run;
    std::function<int()> occ;
};
struct BwdVersion {
    const char *name;
    int bm, nw, mb;
    std::function<cudaError_t(const flash::Params &, const flash::BwdScratch &)> run;
    std::function<int()> occ;
    bool control = false;  // a timing control that leaves part of the work out: timed, not checked
};

template <typename T, int BN, int NW, int MB>
FwdVersion fwd_version(const char *name) {
    using Tr = flash::FwdTraits<T, 64, BN, NW>;
    return {name, BN, NW, MB, [](const flash::Params &p) { return flash::launch_fwd<T, 64, BN, NW, MB>(p, 0); },
            [] {
                LAB_CUDA(flash::allow_smem(flash::flash_fwd_kernel<T, 64, BN, NW, MB>, Tr::kSmem));
                return occupancy(flash::flash_fwd_kernel<T, 64, BN, NW, MB>, Tr::kThreads, Tr::kSmem);
            }};
}
template <typename T, int BM, int NW, int MB, int kOrder = -1>
BwdVersion bwd_version(const char *name) {
    using Tr = flash::BwdTraits<T, 64, BM, NW>;
    return {name, BM, NW, MB,
            [](const flash::Params &p, const flash::BwdScratch &ws) {
                cudaError_t e = flash::bwd_prologue<T>(p, ws, 0);
                return e != cudaSuccess ? e : flash::launch_bwd<T, 64, BM, NW, MB>(p, 0, kOrder);
            },
            [] {
                LAB_CUDA(flash::allow_smem(flash::flash_bwd_kernel<T, 64, BM, NW, MB>, Tr::kSmem));
                return occupancy(flash::flash_bwd_kernel<T, 64, BM, NW, MB>, Tr::kThreads, Tr::kSmem);
            }};
}
#if defined(DST_LAB_SM90A)
// The wgmma forward (kernels/attention_flash_wgmma.cuh): one warpgroup, BM 64, BN keys, MB blocks/SM.
template <typename T, int BN, int MB, bool EAGER2 = false>
FwdVersion fwd_wgmma_version(const char *name) {
    using Tr = flash::WgTraits<BN>;
    return {name, BN, 4, MB, [](const flash::Params &p) { return flash::launch_fwd_wgmma<T, BN, MB, EAGER2>(p, 0); },
            [] {
                LAB_CUDA(flash::allow_smem(flash::flash_fwd_wgmma_kernel<T, BN, MB, EAGER2>, Tr::kSmem));
                return occupancy(flash::flash_fwd_wgmma_kernel<T, BN, MB, EAGER2>, Tr::kThreads, Tr::kSmem);
            }};
}
#endif
#if defined(DST_LAB_SM90A)
template <typename T, int NC, int BN>
FwdVersion fwd_ws_version(const char *name) {
    return {name, BN, 4 * (NC + 1), 1, [](const flash::Params &p) { return flash::ws::launch<T, NC, BN>(p, 0); },
            [] {
                LAB_CUDA(flash::allow_smem(flash::ws::flash_fwd_ws_kernel<T, NC, BN>, flash::ws::smem_bytes<NC, BN>()));
                return occupancy(flash::ws::flash_fwd_ws_kernel<T, NC, BN>, 128 * (NC + 1), flash::ws::smem_bytes<NC, BN>());
            }};
}
#endif
template <typename T>
std::vector<FwdVersion> fwd_versions() {
    std::vector<FwdVersion> v = {fwd_version<T, 64, 4, 4>("f1"), fwd_version<T, 64, 4, 3>("f2"),
                                 fwd_version<T, 128, 4, 2>("f3"), fwd_version<T, 64, 8, 2>("f4"),
                                 fwd_version<T, 32, 4, 4>("f5"), fwd_version<T, 32, 4, 5>("f6"),
                                 fwd_version<T, 64, 2, 8>("f7")};
#if defined(DST_LAB_SM90A)
    v.push_back(fwd_wgmma_version<T, 64, 3>("w1"));
    v.push_back(fwd_wgmma_version<T, 128, 2>("w2"));
    v.push_back(fwd_wgmma_version<T, 128, 1>("w3"));
    v.push_back(fwd_wgmma_version<T, 64, 4>("w11"));
    v.push_back(fwd_wgmma_version<T, 64, 5>("w12"));
    v.push_back(fwd_wgmma_version<T, 64, 4, true>("w14"));
    v.push_back(fwd_ws_version<T, 2, 64>("w8"));
    v.push_back(fwd_ws_version<T, 3, 64>("w9"));
    v.push_back(fwd_ws_version<T, 2, 128>("w10"));
#endif
    return v;
}
#if defined(DST_LAB_SM90A)
// The wgmma backward (kernels/attention_flash_wgmma.cuh): WGS warpgroups, 64·WGS keys, BM queries, MB blocks/SM.
// ORDER: the deterministic dQ order (launch_bwd_wgmma's: −1 the library's choice, 0 ascending key blocks).
template <typename T, int BM, int MB, int WGS, int DQM = flash::kDqMma, int ORDER = -1, bool EAGER2 = false>
BwdVersion bwd_wgmma_version(const char *name) {
    using Tr = flash::WgBwdTraits<BM, WGS, DQM>;
    return {name, BM, 4 * WGS, MB,
            [](const flash::Params &p, const flash::BwdScratch &ws) {
                cudaError_t e = flash::bwd_prologue<T>(p, ws, 0);
                return e != cudaSuccess ? e : flash::launch_bwd_wgmma<T, BM, MB, WGS, DQM, EAGER2>(p, 0, ORDER);
            },
            [] {
                const auto kernel = flash::flash_bwd_wgmma_kernel<T, BM, MB, WGS, DQM, EAGER2>;
                LAB_CUDA(flash::allow_smem(kernel, Tr::kSmem));
                return occupancy(kernel, Tr::kBlockThreads, Tr::kSmem);
            },
            DQM == flash::kDqNone || DQM == flash::kDqWriterNoAdd || DQM == flash::kDqWriterNoMma};
}
#endif
template <typename T>
std::vector<BwdVersion> bwd_versions() {
    std::vector<BwdVersion> v = {bwd_version<T, 64, 4, 2>("b1"), bwd_version<T, 32, 4, 2>("b2"),
                                 bwd_version<T, 32, 8, 1>("b3"), bwd_version<T, 64, 8, 1>("b4"),
                                 bwd_version<T, 16, 4, 3>("b5"),
                                 bwd_version<T, 64, 8, 1, 0>("b4a")};  // b4a: b4 with the ascending dQ order
#if defined(DST_LAB_SM90A)
    v.push_back(bwd_wgmma_version<T, 64, 2, 1>("b6"));
    v.push_back(bwd_wgmma_version<T, 64, 1, 2>("b8"));
    v.push_back(bwd_wgmma_version<T, 64, 1, 2, flash::kDqNone>("b8n"));  // control: b8 without dQ
    v.push_back(bwd_wgmma_version<T, 64, 1, 2, flash::kDqWgmma>("b11"));
    v.push_back(bwd_wgmma_version<T, 64, 1, 2, flash::kDqWgmma, -1, true>("b15"));  // b11, two query tiles copied first
    v.push_back(bwd_wgmma_version<T, 64, 1, 2, flash::kDqWriter>("b14"));
    v.push_back(bwd_wgmma_version<T, 64, 1, 2, flash::kDqWgmma, 0>("b11o"));   // b11, ascending dQ order
    v.push_back(bwd_wgmma_version<T, 64, 1, 2, flash::kDqWriter, 0>("b14o"));  // b14, ascending dQ order
    v.push_back(bwd_wgmma_version<T, 64, 1, 2, flash::kDqWriterNoAdd>("b14a"));  // control: no global adds
    v.push_back(bwd_wgmma_version<T, 64, 1, 2, flash::kDqWriterNoMma>("b14q"));  // control: no dQ product
    v.push_back(bwd_wgmma_version<T, 64, 1, 2, flash::kDqWriter3>("b14b3"));     // b14, three dQ buffers
    v.push_back(bwd_wgmma_version<T, 64, 1, 2, flash::kDqWriter4>("b14b4"));     // b14, four dQ buffers
    v.push_back(bwd_wgmma_version<T, 64, 1, 2, flash::kDqWriter4, 0>("b14ob4"));  // b14o, four dQ buffers
#endif
    return v;
}

// Every numbered version against the fp64 reference on two awkward cases (both modes of the backward): S = 300
// (several key blocks), and S = 128 with more (batch, head) items than SMs (one key block each, one
// sequence with no keys); the forward versions also on S = 256 with an additive mask and causal. The
// library's writer backwards also on S = 2100 with key lengths (17, 11 and no key blocks) in both
// modes, and causal S = 1500.
bool is_version(const char *name, std::initializer_list<const char *> names) {
    for (const char *n : names)
        if (!std::strcmp(name, n)) return true;
    return false;
}
template <typename T>
void check_versions(bool bf16) {
    for (int k = 0; k < 8; ++k) {
        const int det = k == 6 ? 0 : k == 5 || k == 7 ? 1 : k % 2 == 0;
        Case c = k < 2   ? Case{3, 300, 2, 64, 2, false, 0.1, bool(det), bf16}
                 : k < 4 ? Case{40, 128, 4, 64, 2, false, 0.1, bool(det), bf16}
                 : k < 5 ? Case{6, 256, 4, 64, 1, true, 0.1, true, bf16}
                 : k < 7 ? Case{3, 2100, 1, 64, 2, false, 0.1, bool(det), bf16}
                         : Case{2, 1500, 2, 64, 0, true, 0.1, true, bf16};
        Dev dv;
        const Inputs in = make_inputs(c, 77);
        const size_t H = size_t(c.heads) * c.d, N = size_t(c.B) * c.S;
        const AttentionArgs a = prepare(dv, c, in);
        const flash::Params p = bound_params(a, dv);
        LAB_CUDA(flash_attention_fwd(0, bf16, a, dv.qkv, dv.ctx, dv.lse));
        LAB_CUDA(cudaDeviceSynchronize());
        const std::vector<double> ctx0 = download(dv.ctx, N * H, bf16);
        const Ref r = reference(c, in, a, ctx0);
        const double tol = bf16 ? 1e-2 : 1e-3;
        if (det) {  // S = 300 and S = 128 (the second: 16-row aligned, where w8 runs its own kernel)
            // w8 runs w1's arithmetic on the same tiles: the same bits as w1.
            std::vector<uint16_t> w1_bits, w2_bits;  // w8, w9, w11, w12, w14 run w1's tiles, w10 w2's
            for (const FwdVersion &v : fwd_versions<T>()) {
                LAB_CUDA(cudaMemset(dv.ctx, 0xff, N * H * 2));
                LAB_CUDA(v.run(p));
                LAB_CUDA(cudaDeviceSynchronize());
                bool nan = false;
                const double e = rel_l2(download(dv.ctx, N * H, bf16), r.ctx, &nan);
                const std::vector<uint16_t> bits = download_bits(dv.ctx, N * H);
                if (!std::strcmp(v.name, "w1")) w1_bits = bits;
                if (!std::strcmp(v.name, "w2")) w2_bits = bits;
                long long differ = -1;
                const char *same_as = nullptr;
                if ((!std::strcmp(v.name, "w8") || !std::strcmp(v.name, "w9") || !std::strcmp(v.name, "w11") ||
                     !std::strcmp(v.name, "w12") || !std::strcmp(v.name, "w14")) &&
                    !w1_bits.empty()) {
                    differ = (long long)count_differing(bits, w1_bits);
                    same_as = "w1";
                }
                if (!std::strcmp(v.name, "w10") && !w2_bits.empty()) {
                    differ = (long long)count_differing(bits, w2_bits);
                    same_as = "w2";
                }
                const bool ok = !nan && e <= tol && differ <= 0;
                if (!ok) ++g_failures;
                std::printf("%-4s version %s %s: ctx %.2e", ok ? "ok" : "FAIL", v.name, c.name().c_str(), e);
                if (differ >= 0) std::printf(", %lld elements differ from %s", differ, same_as);
                std::printf("\n");
            }
            LAB_CUDA(flash_attention_fwd(0, bf16, a, dv.qkv, dv.ctx, dv.lse));  // the reference's ctx again
        }
        std::vector<uint16_t> b11_bits;
        for (const BwdVersion &v : bwd_versions<T>()) {
            if (v.control) continue;
            // The causal case (k 4): the library's two backwards (and the versions after them) only;
            // the long cases (k 5 … 7): the library's writer backwards.
            if (k == 4 && !is_version(v.name, {"b11", "b14", "b11o", "b14o", "b15"})) continue;
            if (k >= 5 && !is_version(v.name, {"b14", "b14o"})) continue;
            // Deterministic mode: a second run must give the same bits.
            std::vector<uint16_t> runs[2];
            for (int run = 0; run < (det ? 2 : 1); ++run) {
                LAB_CUDA(cudaMemset(dv.dqkv, 0xff, N * 3 * H * 2));
                LAB_CUDA(v.run(p, flash::BwdScratch(a)));
                LAB_CUDA(cudaDeviceSynchronize());
                runs[run] = download_bits(dv.dqkv, N * 3 * H);
            }
            bool nan = false;
            const double e = rel_l2(download(dv.dqkv, N * 3 * H, bf16), r.dqkv, &nan);
            const long long differ = det ? (long long)count_differing(runs[0], runs[1]) : 0;
            // b15 runs b11's arithmetic: deterministic, the same bits.
            if (det && !std::strcmp(v.name, "b11")) b11_bits = runs[0];
            const long long off_b11 = det && !std::strcmp(v.name, "b15") && !b11_bits.empty()
                                          ? (long long)count_differing(runs[0], b11_bits)
                                          : 0;
            const bool ok = !nan && e <= tol && differ == 0 && off_b11 == 0;
            if (!ok) ++g_failures;
            std::printf("%-4s version %s %s: dqkv %.2e", ok ? "ok" : "FAIL", v.name, c.name().c_str(), e);
            if (det) std::printf(", %lld elements differ between two runs", differ);
            if (det && !std::strcmp(v.name, "b15")) std::printf(", %lld from b11", off_b11);
            std::printf("\n");
        }
        dv.free_all();
    }
}

// The two Philox forms give the same bits: every numbered version run with grp32 (17 multiplies per
// group, what every shape the lab and the tests can afford takes) and with it off (19: the form of
// calls with groups past 2^32), outputs compared bit for bit, both backward modes.
template <typename T>
void check_philox_forms(bool bf16) {
    for (int det : {1, 0}) {
        Case c{3, 300, 2, 64, 2, false, 0.1, bool(det), bf16};
        Dev dv;
        const size_t H = size_t(c.heads) * c.d, N = size_t(c.B) * c.S;
        const AttentionArgs a = prepare(dv, c, make_inputs(c, 91));
        flash::Params p = bound_params(a, dv);
        if (!p.grp32) {
            ++g_failures;
            std::printf("FAIL philox forms: grp32 off at %s\n", c.name().c_str());
        }
        LAB_CUDA(flash_attention_fwd(0, bf16, a, dv.qkv, dv.ctx, dv.lse));  // ctx and lse for the backward
        LAB_CUDA(cudaDeviceSynchronize());
        const std::vector<uint16_t> ctx_in = download_bits(dv.ctx, N * H);
        size_t worst = 0;
        if (det)
            for (const FwdVersion &v : fwd_versions<T>()) {
                std::vector<uint16_t> out[2];
                for (int g : {1, 0}) {
                    flash::Params q = p;
                    q.grp32 = bool(g);
                    LAB_CUDA(cudaMemset(dv.ctx, 0xff, N * H * 2));
                    LAB_CUDA(v.run(q));
                    LAB_CUDA(cudaDeviceSynchronize());
                    out[g] = download_bits(dv.ctx, N * H);
                }
                worst = std::max(worst, count_differing(out[0], out[1]));
            }
        LAB_CUDA(cudaMemcpy(dv.ctx, ctx_in.data(), N * H * 2, cudaMemcpyHostToDevice));
        for (const BwdVersion &v : bwd_versions<T>()) {
            if (v.control) continue;
            std::vector<uint16_t> out[2];
            for (int g : {1, 0}) {
                flash::Params q = p;
                q.grp32 = bool(g);
                LAB_CUDA(cudaMemset(dv.dqkv, 0xff, N * 3 * H * 2));
                LAB_CUDA(v.run(q, flash::BwdScratch(a)));
                LAB_CUDA(cudaDeviceSynchronize());
                out[g] = download_bits(dv.dqkv, N * 3 * H);
            }
            // the stochastic dQ sums in arrival order: compare dK and dV there (columns H … 3H of each row)
            if (!det)
                for (size_t r = 0; r < N; ++r)
                    for (size_t cc = 0; cc < H; ++cc) out[0][r * 3 * H + cc] = out[1][r * 3 * H + cc];
            worst = std::max(worst, count_differing(out[0], out[1]));
        }
        const bool ok = worst == 0;
        if (!ok) ++g_failures;
        std::printf("%-4s philox forms (17 and 19 multiplies), every version, %s: at most %zu elements differ\n",
                    ok ? "ok" : "FAIL", c.name().c_str(), worst);
        dv.free_all();
    }
}

// Whether the environment's LAB_ONLY (a comma-separated list of version names, e.g. "w1,w9,b8")
// leaves version `name` in the timings; unset or empty: every version.
bool timed_version(const char *name) {
    const char *only = std::getenv("LAB_ONLY");
    if (!only || !*only) return true;
    const std::string list = std::string(",") + only + ",", key = std::string(",") + name + ",";
    return list.find(key) != std::string::npos;
}

template <typename T>
void time_versions(Bench &bn, bool wgmma_fwd_only = false) {
    const flash::BwdScratch ws(bn.a);
    for (const FwdVersion &v : fwd_versions<T>()) {
        if ((wgmma_fwd_only && v.name[0] != 'w') || !timed_version(v.name)) continue;
        const int occ = v.occ();
        const float ms = time_ms([&] { LAB_CUDA(v.run(bn.p)); }, bn.reps());
        std::printf("  fwd  %-3s (BN %3d, %d warps, %d/SM) %2d blk/SM %8.3f ms  %6.1f TFLOP/s\n", v.name, v.bn, v.nw, v.mb,
                    occ, ms, bn.fwd_flops / (ms * 1e-3) / 1e12);
    }
    for (const BwdVersion &v : bwd_versions<T>()) {
        if (wgmma_fwd_only) break;
        if (!timed_version(v.name)) continue;
        const int occ = v.occ();
        float ms[2];
        for (int det : {1, 0}) {
            flash::Params p = bn.p;
            p.deterministic = det;
            ms[det] = time_ms([&] { LAB_CUDA(v.run(p, ws)); }, bn.reps());
        }
        std::printf("  bwd  %-3s (BM %3d, %d warps, %d/SM) %2d blk/SM det %8.3f ms %6.1f | stoch %8.3f ms %6.1f TFLOP/s\n",
                    v.name, v.bm, v.nw, v.mb, occ, ms[1], 2.5 * bn.fwd_flops / (ms[1] * 1e-3) / 1e12, ms[0],
                    2.5 * bn.fwd_flops / (ms[0] * 1e-3) / 1e12);
    }
}

void time_production(Bench &bn, const char *label) {
    const Case &c = bn.c;
    AttentionArgs a = bn.a;
    const float f = time_ms([&] { LAB_CUDA(flash_attention_fwd(0, c.bf16, a, bn.dv.qkv, bn.dv.ctx, bn.dv.lse)); }, bn.reps());
    a.deterministic = true;
    const float bd = time_ms(
        [&] { LAB_CUDA(flash_attention_bwd(0, c.bf16, a, bn.dv.qkv, bn.dv.ctx, bn.dv.dctx, bn.dv.lse, bn.dv.dqkv, bn.dv.ws)); },
        bn.reps());
    a.deterministic = false;
    const float bs = time_ms(
        [&] { LAB_CUDA(flash_attention_bwd(0, c.bf16, a, bn.dv.qkv, bn.dv.ctx, bn.dv.dctx, bn.dv.lse, bn.dv.dqkv, bn.dv.ws)); },
        bn.reps());
    const double tf = 3.5 * bn.fwd_flops;
    std::printf("  prod %-28s fwd %7.3f  bwd det %7.3f  stoch %7.3f ms | fwd+bwd %6.1f (det) %6.1f (stoch) TFLOP/s\n", label,
                f, bd, bs, tf / ((f + bd) * 1e-3) / 1e12, tf / ((f + bs) * 1e-3) / 1e12);
}

}  // namespace

int main(int argc, char **argv) {
    bool do_check = false, do_time = false, bf16_only = false, fp16_only = false, profile = false, philox = false,
         tma = false;
    for (int i = 1; i < argc; ++i) {
        if (!std::strcmp(argv[i], "check")) do_check = true;
        if (!std::strcmp(argv[i], "time")) do_time = true;
        if (!std::strcmp(argv[i], "bf16")) bf16_only = true;
        if (!std::strcmp(argv[i], "fp16")) fp16_only = true;
        if (!std::strcmp(argv[i], "profile")) profile = true;
        if (!std::strcmp(argv[i], "philox")) philox = true;
        if (!std::strcmp(argv[i], "tma")) tma = true;
    }
    if (profile) {  // one production forward and backward, at 8×2048 or at "profile B S" (for ncu --launch-count)
        int B = 8, S = 2048;
        for (int i = 1; i + 2 < argc; ++i)
            if (!std::strcmp(argv[i], "profile")) {
                B = std::atoi(argv[i + 1]);
                S = std::atoi(argv[i + 2]);
            }
        if (B < 1 || S < 1) {
            std::fprintf(stderr, "profile: B and S must be positive integers\n");
            return 2;
        }
        // "p0": dropout 0; "version NAME": then one launch of that numbered forward or backward version.
        double pd = 0.1;
        const char *version = nullptr;
        for (int i = 1; i < argc; ++i) {
            if (!std::strcmp(argv[i], "p0")) pd = 0.0;
            if (!std::strcmp(argv[i], "version") && i + 1 < argc) version = argv[i + 1];
        }
        Bench bn(Case{B, S, 16, 64, 0, false, pd, true, false});
        LAB_CUDA(flash_attention_fwd(0, false, bn.a, bn.dv.qkv, bn.dv.ctx, bn.dv.lse));
        LAB_CUDA(flash_attention_bwd(0, false, bn.a, bn.dv.qkv, bn.dv.ctx, bn.dv.dctx, bn.dv.lse, bn.dv.dqkv, bn.dv.ws));
        if (version) {
            bool found = false;
            for (const FwdVersion &v : fwd_versions<__half>())
                if (!std::strcmp(v.name, version)) {
                    LAB_CUDA(v.run(bn.p));
                    found = true;
                }
            for (const BwdVersion &v : bwd_versions<__half>())
                if (!std::strcmp(v.name, version)) {
                    LAB_CUDA(v.run(bn.p, flash::BwdScratch(bn.a)));
                    found = true;
                }
            if (!found) {
                std::fprintf(stderr, "profile: no version named %s\n", version);
                return 2;
            }
        }
        LAB_CUDA(cudaDeviceSynchronize());
        return 0;
    }
    if (!do_check && !do_time && !philox && !tma) do_check = do_time = true;
    cudaDeviceProp prop;
    LAB_CUDA(cudaGetDeviceProperties(&prop, 0));
    std::printf("attention lab on %s (%d SMs)\n", prop.name, prop.multiProcessorCount);
    if (philox) philox_rate();
#if defined(DST_LAB_SM90A)
    if (tma) check_tma_tile();
#endif

    if (do_check) {
        std::vector<Case> cases;
        for (int bf : {0, 1}) {
            if ((bf && fp16_only) || (!bf && bf16_only)) continue;
            // Every head dim (and a non-multiple of 8: element loads), every mask, dropout on and off.
            for (int d : {64, 32, 80, 96, 128, 24, 40})
                cases.push_back({3, 65, 3, d, d % 3, d == 96, 0.1, d != 80, bool(bf)});
            for (int S : {1, 7, 100, 129})
                for (int mask : {0, 1, 2})
                    cases.push_back({3, S, 2, 64, mask, S == 129 && mask == 2, S == 7 ? 0.0 : 0.1, mask != 1, bool(bf)});
            cases.push_back({1, 1000, 2, 64, 2, true, 0.1, true, bool(bf)});
            cases.push_back({3, 250, 2, 128, 1, true, 0.1, false, bool(bf)});
            cases.push_back({1, 4097, 1, 64, 0, false, 0.1, true, bool(bf)});
            // More (batch, head) items than SMs at one key block each (the persistent backward), every mask.
            cases.push_back({40, 128, 4, 64, 2, false, 0.1, true, bool(bf)});
            cases.push_back({24, 100, 8, 64, 1, true, 0.1, false, bool(bf)});
        }
        for (const Case &c : cases) check_case(c);
        for (int bf : {0, 1})
            for (int S : {128, 100}) check_dropped_set(bool(bf), S, S == 128);
        check_determinism(true, 4, 1000);
        check_determinism(false, 4, 1000);
        check_determinism(true, 40, 128);
        if (!bf16_only) check_versions<__half>(false), check_philox_forms<__half>(false);
        if (!fp16_only) check_versions<__nv_bfloat16>(true), check_philox_forms<__nv_bfloat16>(true);
        std::printf("check: %d failure(s)\n", g_failures);
    }
    if (do_time) {
        for (int bf : {0, 1}) {
            if ((bf && fp16_only) || (!bf && bf16_only)) continue;
            std::printf("dense %s GEMM 8192^3: %.0f TFLOP/s\n", bf ? "bf16" : "fp16", gemm_peak_tflops(bool(bf)));
            struct Shape { int B, S; } shapes[] = {{64, 128}, {16, 512}, {16, 1024}, {8, 2048}, {4, 4096}, {2, 8192}, {1, 16384}};
            for (const Shape &s : shapes) {
                for (int mask : {0, 2}) {
                    Bench bn(Case{s.B, s.S, 16, 64, mask, false, 0.1, true, bool(bf)});
                    char label[64];
                    std::snprintf(label, sizeof label, "%s %dx%d %s", bf ? "bf16" : "fp16", s.B, s.S, mask ? "lengths" : "no mask");
                    time_production(bn, label);
                    // LAB_ALL_SHAPES=1: every version at every shape (no mask), dropout 0.1 only.
                    const char *all = std::getenv("LAB_ALL_SHAPES");
                    if (all && *all == '1' && s.S != 2048 && s.S != 128 && mask == 0) {
                        if (bf) time_versions<__nv_bfloat16>(bn);
                        else time_versions<__half>(bn);
                    } else if ((s.S == 512 || s.S == 1024) && mask == 0) {  // where the warp-specialised forward starts to pay
                        if (bf) time_versions<__nv_bfloat16>(bn, true);
                        else time_versions<__half>(bn, true);
                    }
                    // LAB_LENGTHS=1: the versions also with key lengths (the dQ order's waits depend on them).
                    const char *with_lengths = std::getenv("LAB_LENGTHS");
                    if (with_lengths && *with_lengths == '1' && mask == 2) {
                        if (bf) time_versions<__nv_bfloat16>(bn);
                        else time_versions<__half>(bn);
                    }
                    if ((s.S == 2048 || s.S == 128) && mask == 0) {
                        if (bf) time_versions<__nv_bfloat16>(bn);
                        else time_versions<__half>(bn);
                        Bench nd(Case{s.B, s.S, 16, 64, 0, false, 0.0, true, bool(bf)});
                        time_production(nd, "same, dropout 0");
                        std::printf("  versions, dropout 0:\n");
                        if (bf) time_versions<__nv_bfloat16>(nd);
                        else time_versions<__half>(nd);
                    }
                }
            }
        }
    }
    return g_failures ? 1 : 0;
}
