// LayerNorm kernels of the CUDA backend (rows of length h): forward with saved statistics, and
// backward either from the input and its statistics or from the output (normalize_invertible),
// with an optional residual gradient added to dx and deterministic γ/β gradients.
// Statistics (mean, rstd) are in the compute type: double for FP64, float otherwise.
#ifndef DST_KERNELS_LAYERNORM_CUH
#define DST_KERNELS_LAYERNORM_CUH

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "dstransformer/dstransformer.h"  // defines: dst_dtype
#include "kernels/philox.h"                // defines: DropoutSite

namespace dst {
namespace cuda {

// y = γ·(x−mean)·rstd + β; mean/rstd (each may be nullptr) receive the row statistics.
cudaError_t layernorm_fwd(cudaStream_t stream, dst_dtype dt, const void *x, const void *gamma,
                         const void *beta, void *y, void *mean, void *rstd, int64_t n, int64_t h,
                         double eps);

// z = residual + dropout(a) (stored), then y = LayerNorm(z) with its statistics: the results of
// dropout_residual_fwd followed by layernorm_fwd, in one pass over the rows where the warp form applies
// (fp32/fp16/bf16, 16-byte aligned, a row map of row length h), as those two launches otherwise.
cudaError_t dropout_residual_layernorm_fwd(cudaStream_t stream, dst_dtype dt, const void *a, const void *residual,
                                           void *z, const void *gamma, const void *beta, void *y, void *mean,
                                           void *rstd, int64_t n, int64_t h, double eps, const DropoutSite &site);

// Workspace bytes layernorm_bwd needs for the γ/β partial sums, and with branch_sums for the branch's
// bias gradient too (branch_db).
size_t layernorm_bwd_workspace(dst_dtype dt, int64_t n, int64_t h, bool branch_sums = false);

// dx = rstd·(g − mean(g) − x̂·mean(g·x̂)) + dresid with g = γ·dy and x̂ = (x−mean)·rstd, or, when
// `invertible`, x̂ = (y−β)/γ from the output (mean unused). dγ = Σ_rows dy·x̂, dβ = Σ_rows dy
// (accumulate: +=); dgamma/dbeta/dresid may be nullptr; dx may alias dy or dresid (dγ/dβ are
// computed first). Deterministic: per-chunk partial sums in
// `workspace`, then a fixed-order pass; no atomics.
// With branch_out (and branch_site): also branch_out = dropout'(dx) with that site, from dx before its
// rounding (the site's element c of row r is (rows ? rows[r] : r)·h + c; its row_len is h); branch_out
// may not overlap the inputs. With branch_db too: branch_db[c] = Σ_r branch_out[r, c] as stored
// (accumulate: +=), the bits of column_sum over branch_out.
// one_pass_split (0: off): 2 or 4 computes dx, the branch and all the column sums in one pass over the
// rows (layernorm_bwd_split_kernel: FP16/BF16/FP32, not invertible, dγ or dβ wanted, rows where the
// warp form has 2 or 4 vectors per lane — h = 512 or 1024 in 16-bit types, 256 or 512 in fp32), 2 or 4
// warps per row; elsewhere the separate passes. The same γ/β bits as the separate passes (both sum dy·x̂
// by an explicit fma), and branch_db has column_sum's bits over the branch it stored; dx's two row sums
// are added in another order (so dx and the branch may differ from the separate passes' by an ulp).
// *one_pass_ran (when given) says whether it ran.
cudaError_t layernorm_bwd(cudaStream_t stream, dst_dtype dt, const void *dy, const void *xy,
                         bool invertible, const void *gamma, const void *beta, const void *mean,
                         const void *rstd, const void *dresid, void *dx, void *dgamma, void *dbeta,
                         int64_t n, int64_t h, bool accumulate, void *workspace,
                         const DropoutSite *branch_site = nullptr, void *branch_out = nullptr,
                         void *branch_db = nullptr, int one_pass_split = 0, bool *one_pass_ran = nullptr);

}  // namespace cuda
}  // namespace dst

#endif  // DST_KERNELS_LAYERNORM_CUH
