// Host side of the flash attention (kernels/attention_flash.cuh): fills the kernels' Params once
// from AttentionArgs and runs the forward, or the backward's passes (row sums D and lse·log2 e,
// zeroed counters, then the one backward kernel).
#include "kernels/attention_flash.cuh"

#include <climits>

#include <cub/block/block_scan.cuh>

#include "kernels/attention_flash_impl.cuh"
#include "kernels/dispatch.cuh"  // defines: DST_KERNEL_CHECK

namespace dst {
namespace cuda {

namespace {

// Blocks of the largest launch (tiles of 16 rows at the least) must fit a 1-D grid.
int64_t max_blocks(const AttentionArgs &a) { return (a.seq + 15) / 16 * a.batch * a.heads; }

// One block: the spans are a prefix sum of the clamped lengths, kSpanThreads sequences at a time
// (a block scan per chunk, the chunk's total carried to the next). It was one thread walking the
// batch: ~75 ns per sequence on the H200, 5 µs per call at B = 64, twice per packed layer.
constexpr int kSpanThreads = 256;
__global__ void __launch_bounds__(kSpanThreads)
    packed_spans_kernel(const int32_t *len, int64_t B, int64_t S, int64_t n, int32_t *start, int32_t *rows) {
    using Scan = cub::BlockScan<int64_t, kSpanThreads>;
    __shared__ typename Scan::TempStorage scan;
    int64_t carry = 0;  // the clamped lengths of the chunks before
    for (int64_t b0 = 0; b0 < B; b0 += kSpanThreads) {
        const int64_t b = b0 + threadIdx.x;
        const int64_t raw = b < B ? len[b] : 0, l = raw < 0 ? 0 : (raw > S ? S : raw);
        int64_t before = 0, chunk = 0;
        Scan(scan).ExclusiveSum(l, before, chunk);
        const int64_t at = carry + before, st = at < n ? at : n;
        if (b < B) {
            start[b] = static_cast<int32_t>(st);
            rows[b] = static_cast<int32_t>(l < n - st ? l : n - st);
        }
        carry += chunk;
        __syncthreads();  // the scan's storage is used again
    }
}

}  // namespace

cudaError_t flash_packed_spans(cudaStream_t stream, const int32_t *len, int64_t B, int64_t S, int64_t n,
                               int32_t *start, int32_t *rows) {
    if (B <= 0) return cudaSuccess;
    packed_spans_kernel<<<1, kSpanThreads, 0, stream>>>(len, B, S, n, start, rows);
    return cudaGetLastError();
}

bool flash_attention_supported(const AttentionArgs &a, const char **why) {
    const char *reason = nullptr;
    if (a.head_dim < 1 || a.head_dim > kFlashMaxHeadDim) reason = "head_dim must be 1 … 128";
    else if (a.seq < 1 || a.batch < 1 || a.heads < 1) reason = "empty call";
    else if (a.seq > INT_MAX / 4 || a.hidden > INT_MAX / 4 || max_blocks(a) > INT_MAX)
        reason = "batch·heads·sequence too large for one grid";
    if (why) *why = reason;
    return reason == nullptr;
}

size_t flash_attention_bwd_workspace(const AttentionArgs &a) { return flash::BwdScratch(a).total; }

cudaError_t flash_attention_fwd(cudaStream_t stream, bool bf16, const AttentionArgs &a, const void *qkv, void *ctx,
                                float *lse) {
    if (!flash_attention_supported(a, nullptr)) return cudaErrorInvalidValue;
    flash::Params p = flash::make_params(a);
    p.qkv = qkv;
    p.ctx = ctx;
    p.lse = lse;
    p.vec16 = p.vec16 && aligned16(qkv);
    return flash::fwd(p, bf16, flash::padded_head_dim(a.head_dim), stream);
}

cudaError_t flash_attention_bwd(cudaStream_t stream, bool bf16, const AttentionArgs &a, const void *qkv,
                                const void *ctx, const void *dctx, const float *lse, void *dqkv, void *workspace) {
    if (!flash_attention_supported(a, nullptr) || !lse) return cudaErrorInvalidValue;
    const flash::BwdScratch ws(a);
    flash::Params p = flash::make_params(a);
    p.qkv = qkv;
    p.ctx_in = ctx;
    p.dctx = dctx;
    p.lse = const_cast<float *>(lse);  // read only in backward
    p.dqkv = dqkv;
    ws.bind(p, workspace);
    p.vec16 = p.vec16 && aligned16(qkv) && aligned16(dctx);
    const int D = flash::padded_head_dim(a.head_dim);
    if (a.seq <= flash::bwd_key_block(p, D)) p.deterministic = true;  // one key block: no reduction to order
    DST_KERNEL_CHECK(bf16 ? flash::bwd_prologue<__nv_bfloat16>(p, ws, stream) : flash::bwd_prologue<__half>(p, ws, stream));
    return flash::bwd(p, bf16, D, stream);
}

}  // namespace cuda
}  // namespace dst
