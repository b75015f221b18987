// The GELU GEMMs with fused epilogues (kernels/cutlass/: CUTLASS 3 warp-specialised TMA kernels with
// epilogue visitor trees, compiled for sm_90a only, when CMake finds CUTLASS's headers; the library then
// defines DST_WITH_CUTLASS). Row-major, nn.Linear's convention (W is [m, k]), 16-bit storage types:
//
//   gemm_bias_gelu: u = x[n,k]·W[m,k]ᵀ + b[m] rounded to the storage type (written to `u` unless it is
//                   null: inference), and y = GELU(u as stored), both [n, m]: the FC1 forward and the
//                   GELU pass in one kernel.
//   gemm_dgelu:     dg = dy[n,m]·W[m,k] rounded to the storage type (not written), and
//                   du = dg·GELU'(u[n,k]) written to du [n, k]: the FC2 data gradient and GELU's backward;
//                   with `partial`, also the column sums of du as stored, one fp32 row per 128-row tile
//                   (the FC1 bias gradient's first pass: column_sum_finalize_chunks adds the rows).
//
// The epilogues compute GELU and GELU' with kernels/gelu_math.cuh on the stored (rounded) u and dg, so
// given the same GEMM result they give the bits of gelu_fwd / gelu_bwd (kernels/elementwise.cuh); the
// GEMM's own summation order is CUTLASS's (fixed for a shape: no split-K, so runs are bit-reproducible).
// Which calls they take: gemm_gelu_runs(), which the caller asks first (the launchers do not ask it
// again: it queries the device). Launchers return the CUDA error of a failed launch, or
// cudaErrorInvalidValue for another dtype, u == y, or a problem CUTLASS refuses (GemmGelu::run asks it).
#ifndef DST_KERNELS_GEMM_GELU_CUH
#define DST_KERNELS_GEMM_GELU_CUH

#include <cuda_runtime_api.h>

#include <cstdint>

#include "dstransformer/dstransformer.h"  // defines: dst_dtype, dst_gelu

namespace dst {
namespace cuda {

// The three kernels: the forward storing u (training), the forward alone (inference: u null), the
// backward.
enum GemmGeluKind : int { kGeluForwardAux = 0, kGeluForward = 1, kGeluBackward = 2 };

// Whether the fused GEMM of `kind` takes this problem (host code, no device needed): FP16 or BF16, k and
// m positive multiples of 8 (the row lengths: TMA's 16-byte strides), n positive, all below 2^31, and
// CUTLASS's own can_implement() for the kernel, with no workspace. False in a build without them.
bool gemm_gelu_shape_ok(dst_dtype dt, GemmGeluKind kind, int64_t n, int64_t k, int64_t m);
// Whether the fused GEMMs run this call: gemm_gelu_shape_ok, every pointer 16-byte aligned, and the
// current device of compute capability 9.0 (the sm_90a objects run there only).
bool gemm_gelu_runs(dst_dtype dt, GemmGeluKind kind, int64_t n, int64_t k, int64_t m, const void *const *ptrs,
                    int nptrs);

// The launchers (kernels/cutlass/gemm_gelu_{fp16,bf16}.cu). `sm_count`: the device's multiprocessors
// (the persistent tile scheduler's grid). A build without them defines all four (CudaBackend's file):
// the queries answer false, the launchers return cudaErrorNotSupported.
cudaError_t gemm_bias_gelu(cudaStream_t stream, dst_dtype dt, dst_gelu form, const void *x, const void *w,
                           const void *b, void *y, void *u, int64_t n, int64_t k, int64_t m, int sm_count);
cudaError_t gemm_dgelu(cudaStream_t stream, dst_dtype dt, dst_gelu form, const void *dy, const void *w,
                       const void *u, void *du, int64_t n, int64_t k, int64_t m, int sm_count,
                       float *partial = nullptr);

// Which of the backward's two compiled configurations a call takes (the forward kinds have one, without
// a cluster). Both use 128×256 tiles and the persistent cooperative schedule over `sm_count` blocks; the
// library's pairs the blocks in clusters of two along the rows (each weight tile multicast to both),
// which rounds the row tiles up to an even count. Where that rounding costs one more round of tiles
// than single blocks need (an odd row-tile count whose pairs just pass a multiple of the clusters that
// run at once, e.g. 5203 rows × 4096 columns on 132 multiprocessors: 6 rounds against 5), the call runs
// the kernels without a cluster (kernels/cutlass/gemm_gelu_*_single.cu): the same tiles and summation
// order, so the same bits. `cols` is the output's width (the backward's k). Host arithmetic only.
inline bool gemm_gelu_unclustered(int64_t rows, int64_t cols, int sm_count) {
    if (rows <= 0 || cols <= 0 || sm_count < 2) return false;
    const int64_t mt = (rows + 127) / 128, nt = (cols + 255) / 256;
    const int64_t pairs = sm_count / 2;
    const int64_t rounds_paired = ((mt + 1) / 2 * nt + pairs - 1) / pairs;
    const int64_t rounds_single = (mt * nt + sm_count - 1) / sm_count;
    return rounds_single < rounds_paired;
}

// gemm_dgelu's column partial sums (both storage types): row c (c < dgelu_partial_chunks(n)) holds, in
// columns 0 … k − 1 of dgelu_partial_ld(k) floats, the sums over rows 128c … 128c + 127 of du as stored
// (each tile's sum in CUTLASS's fixed order: per thread, then across lanes and warps; no atomics, so
// the sums are the same bits from run to run). 16-byte aligned, dgelu_partial_bytes(n, k) bytes.
constexpr int64_t kDgeluPartialRows = 128, kDgeluPartialColumns = 256;  // the kernel's tile (M, N)
inline int64_t dgelu_partial_chunks(int64_t n) { return n > 0 ? (n + kDgeluPartialRows - 1) / kDgeluPartialRows : 0; }
inline int64_t dgelu_partial_ld(int64_t k) {
    return k > 0 ? (k + kDgeluPartialColumns - 1) / kDgeluPartialColumns * kDgeluPartialColumns : 0;
}
inline size_t dgelu_partial_bytes(int64_t n, int64_t k) {
    return static_cast<size_t>(dgelu_partial_chunks(n) * dgelu_partial_ld(k)) * sizeof(float);
}

}  // namespace cuda
}  // namespace dst

#endif  // DST_KERNELS_GEMM_GELU_CUH
