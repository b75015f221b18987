// Elementwise ops of the CUDA backend: GELU forward/backward (erf and tanh forms), tanh, residual +
// dropout, dropout backward, add, and the any-zero test behind all_nonzero. Every launcher takes the stream first,
// then the storage dtype, returns DST_OK or a status with a message, and never synchronizes.
#ifndef DST_KERNELS_ELEMENTWISE_CUH
#define DST_KERNELS_ELEMENTWISE_CUH

#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/philox.h"                // defines: DropoutSite
#include "dstransformer/dstransformer.h"  // defines: dst_dtype, dst_gelu

namespace dst {
namespace cuda {

// g = GELU(u) over count elements (g may alias u).
cudaError_t gelu_fwd(cudaStream_t stream, dst_dtype dt, dst_gelu form, const void *u, void *g,
                    int64_t count);
// du = dg · GELU'(u) (du may alias dg).
cudaError_t gelu_bwd(cudaStream_t stream, dst_dtype dt, dst_gelu form, const void *dg, const void *u,
                    void *du, int64_t count);
// gelu_bwd over [n, m] and db[j] = Σ_i du[i, j] (accumulate: db +=), in one pass where the rows are
// 16-byte vectors: the results of gelu_bwd followed by column_sum (kernels/bias.cuh) over du, whose
// workspace (column_sum_workspace bytes) it takes. du may alias dg.
cudaError_t gelu_bwd_bias_grad(cudaStream_t stream, dst_dtype dt, dst_gelu form, const void *dg, const void *u,
                              void *du, int64_t n, int64_t m, void *db, bool accumulate, void *workspace);
// y = tanh(u) (y may alias u).
cudaError_t tanh_fwd(cudaStream_t stream, dst_dtype dt, const void *u, void *y, int64_t count);
// du = dy·(1 − tanh(u)²) (du may alias dy).
cudaError_t tanh_bwd(cudaStream_t stream, dst_dtype dt, const void *dy, const void *u, void *du, int64_t count);
// y = residual + dropout(a); element e kept iff philox_dropout_keep(seed, offset, e, threshold).
cudaError_t dropout_residual_fwd(cudaStream_t stream, dst_dtype dt, const void *a, const void *residual,
                                void *y, int64_t count, const DropoutSite &site);
// dx = dy · keep · scale (a copy when the site is inactive).
cudaError_t dropout_bwd(cudaStream_t stream, dst_dtype dt, const void *dy, void *dx, int64_t count,
                       const DropoutSite &site);
// dropout_bwd over [n, m] and db[j] = Σ_i dx[i, j] (accumulate: db +=), in one pass where the rows are
// 16-byte vectors of a 16-bit or fp32 type (a row map of row length m): the results of dropout_bwd
// followed by column_sum (kernels/bias.cuh) over dx, whose workspace (column_sum_workspace bytes) it
// takes. dx may alias dy.
cudaError_t dropout_bwd_bias_grad(cudaStream_t stream, dst_dtype dt, const void *dy, void *dx, int64_t n, int64_t m,
                                 const DropoutSite &site, void *db, bool accumulate, void *workspace);
// y = a + b.
cudaError_t add(cudaStream_t stream, dst_dtype dt, const void *a, const void *b, void *y, int64_t count);
// Sets the device int *flag to 1 when some element of x is zero (±0), else 0 (asynchronous; the
// all_nonzero op reads it back).
cudaError_t any_zero(cudaStream_t stream, dst_dtype dt, const void *x, int64_t count, int *flag);

}  // namespace cuda
}  // namespace dst

#endif  // DST_KERNELS_ELEMENTWISE_CUH
