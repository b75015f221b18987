// Host side of the flash attention (kernels/attention_flash.cuh): fills the kernels' Params once
// from AttentionArgs and runs the forward, or the backward's passes (row sums D and lse·log2 e,
// zeroed counters, then the one backward kernel).
#include "kernels/attention_flash.cuh"

#include <climits>

#include "kernels/attention_flash_impl.cuh"
#include "kernels/dispatch.cuh"  // defines: DST_KERNEL_CHECK

namespace dst {
namespace cuda {

namespace {

// Blocks of the largest launch (tiles of 16 rows at the least) must fit a 1-D grid.
int64_t max_blocks(const AttentionArgs &a) { return (a.seq + 15) / 16 * a.batch * a.heads; }

// One thread: B is a batch's sequence count, and the spans are a prefix sum.
__global__ void packed_spans_kernel(const int32_t *len, int64_t B, int64_t S, int64_t n, int32_t *start,
                                    int32_t *rows) {
    int64_t at = 0;
    for (int64_t b = 0; b < B; ++b) {
        const int64_t l = len[b] < 0 ? 0 : (len[b] > S ? S : len[b]), st = at < n ? at : n;
        start[b] = static_cast<int32_t>(st);
        rows[b] = static_cast<int32_t>(l < n - st ? l : n - st);
        at += l;
    }
}

}  // namespace

cudaError_t flash_packed_spans(cudaStream_t stream, const int32_t *len, int64_t B, int64_t S, int64_t n,
                               int32_t *start, int32_t *rows) {
    if (B <= 0) return cudaSuccess;
    packed_spans_kernel<<<1, 1, 0, stream>>>(len, B, S, n, start, rows);
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
