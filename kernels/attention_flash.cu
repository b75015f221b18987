// Host side of the flash attention (kernels/attention_flash.cuh): fills the kernels' Params once
// from AttentionArgs and runs the forward, or the backward's passes (row sums D, then dK/dV and dQ
// or, stochastic, dK/dV with dQ atomics and a conversion).
#include "kernels/attention_flash.cuh"

#include <climits>

#include "kernels/attention_flash_impl.cuh"

namespace dst {
namespace cuda {

namespace {

bool aligned16(const void *p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; }

// Blocks of 256 threads for a grid-stride loop over n items (at most 65536).
unsigned grid_256(int64_t n) { return static_cast<unsigned>(n / 256 + 1 < 65536 ? n / 256 + 1 : 65536); }

// Blocks of the largest launch (tiles of 32 rows at the least) must fit a 1-D grid.
int64_t max_blocks(const AttentionArgs &a) { return (a.seq + 31) / 32 * a.batch * a.heads; }

}  // namespace

bool flash_attention_supported(const AttentionArgs &a, const char **why) {
    const char *reason = nullptr;
    if (a.head_dim < 1 || a.head_dim > kFlashMaxHeadDim) reason = "head_dim must be 1 … 128";
    else if (a.seq < 1 || a.batch < 1 || a.heads < 1) reason = "empty call";
    else if (a.seq > INT_MAX / 4 || a.hidden > INT_MAX / 4 || max_blocks(a) > INT_MAX)
        reason = "batch·heads·sequence too large for one grid";
    if (why) *why = reason;
    return reason == nullptr;
}

size_t flash_attention_bwd_workspace(const AttentionArgs &a) {
    const size_t rows = size_t(a.batch) * size_t(a.heads) * size_t(a.seq);
    const size_t dsum = (rows * sizeof(float) + 255) / 256 * 256;  // then, stochastic: the dQ accumulator
    return a.deterministic ? dsum : dsum + rows * size_t(flash::padded_head_dim(a.head_dim)) * sizeof(float);
}

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
    const int D = flash::padded_head_dim(a.head_dim);
    flash::Params p = flash::make_params(a);
    p.qkv = qkv;
    p.ctx_in = ctx;
    p.dctx = dctx;
    p.lse = const_cast<float *>(lse);  // read only in backward
    p.dqkv = dqkv;
    p.dsum = static_cast<float *>(workspace);
    if (!a.deterministic) {  // after the row sums: the deterministic workspace is exactly them
        AttentionArgs det = a;
        det.deterministic = true;
        p.dq_accum = p.dsum + flash_attention_bwd_workspace(det) / sizeof(float);
    }
    const size_t rows = size_t(a.batch) * size_t(a.heads) * size_t(a.seq);
    p.vec16 = p.vec16 && aligned16(qkv) && aligned16(dctx);

    const unsigned grid = grid_256(int64_t(rows));
    if (bf16) flash::flash_rowdot_kernel<__nv_bfloat16><<<grid, 256, 0, stream>>>(p);
    else flash::flash_rowdot_kernel<__half><<<grid, 256, 0, stream>>>(p);
    cudaError_t e = cudaGetLastError();
    if (e == cudaSuccess && p.dq_accum) e = cudaMemsetAsync(p.dq_accum, 0, rows * size_t(D) * sizeof(float), stream);
    if (e == cudaSuccess) e = flash::bwd_dkdv(p, bf16, D, stream);
    if (e != cudaSuccess) return e;
    if (a.deterministic) return flash::bwd_dq(p, bf16, D, stream);
    return flash::dispatch(bf16, D, [&](auto tag, auto dim) {
        using T = decltype(tag);
        flash::flash_dq_convert_kernel<T, decltype(dim)::value><<<grid_256(int64_t(rows) * a.head_dim), 256, 0, stream>>>(p);
        return cudaGetLastError();
    });
}

}  // namespace cuda
}  // namespace dst
