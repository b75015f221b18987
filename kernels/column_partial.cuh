// The first pass of the column sums (db[m] = Σ_n dy[n, m]), as a block-level routine that any kernel
// writing a row-major [n, m] tensor can run over what it writes: column_sum (kernels/bias.cu) runs it
// over a tensor that exists, gelu_bwd_bias_grad (kernels/elementwise.cu) over the gradient it
// computes, so that the fused call gives the bits of column_sum over its stored output.
//
// The order, which fixes the result for a shape: the n rows are cut into chunks of R rows
// (chunk_count and rows_per_chunk depend on n only); block (tile, chunk) has kRowLanes row lanes,
// lane y sums rows r0 + y, r0 + y + kRowLanes, … of the chunk in increasing order (compute type,
// from the stored values), and the lanes are added in order 0 … kRowLanes − 1 into one partial per
// (chunk, column). column_sum_finalize (kernels/bias.cuh) then adds the chunks' partials in a fixed
// order. The vector form (a thread takes kVec<T> adjacent columns of its rows) and the scalar form
// (a thread takes one column) sum every column in that same order: the same results.
#ifndef DST_KERNELS_COLUMN_PARTIAL_CUH
#define DST_KERNELS_COLUMN_PARTIAL_CUH

#include <cstdint>

#include "kernels/dispatch.cuh"

namespace dst {
namespace cuda {
namespace colsum {

// A block is kTileThreads column threads × kRowLanes row lanes.
constexpr int kTileThreads = 32, kRowLanes = 8, kMaxChunks = 128;
// Chunks of at least kMinChunkRows rows (one per row lane), at most kMaxChunks of them: 128 chunks from
// 1024 rows on. The LayerNorm backward runs a block per chunk (kernels/layernorm.cu), so at small n the
// chunk count is its grid: with chunks of 32 rows, 1024 rows kept 32 of an H100's 132 multiprocessors
// busy (the batch-token sweep's 1K point). n ≥ 4065 gives the same chunks as 32-row chunks did.
constexpr int kMinChunkRows = kRowLanes;

inline int64_t chunk_count(int64_t n) {
    const int64_t c = (n + kMinChunkRows - 1) / kMinChunkRows;
    return c < kMaxChunks ? c : kMaxChunks;
}
inline int64_t rows_per_chunk(int64_t n) {
    const int64_t c = chunk_count(n);
    return c > 0 ? (n + c - 1) / c : 0;
}
// Columns per block: kTileThreads columns (scalar form) or kTileThreads vectors (vector form).
template <typename T>
__host__ __device__ constexpr int tile_columns(bool vec) {
    return vec ? kTileThreads * kVec<T> : kTileThreads;
}
// The grid and block of a partial pass over [n, m]: (column tiles, chunks) × (kTileThreads, kRowLanes).
template <typename T>
dim3 partial_grid(int64_t n, int64_t m, bool vec) {
    const int64_t tc = tile_columns<T>(vec);
    return dim3(static_cast<unsigned>((m + tc - 1) / tc), static_cast<unsigned>(chunk_count(n)));
}
inline dim3 partial_block() { return dim3(kTileThreads, kRowLanes); }
// Shared memory of the vector form's lane reduction.
template <typename T>
__host__ __device__ constexpr size_t partial_smem() {
    return size_t(kRowLanes) * (kTileThreads * kVec<T> + 1) * sizeof(compute_t<T>);
}

// The vector form, for block (blockIdx.x = column tile, blockIdx.y = chunk) of a grid made by the
// launcher (tile_columns<T>(true) columns per tile; m a multiple of kVec<T>). `produce(r, c)` returns
// the stored vector of row r, columns c … c + kVec<T> − 1 (a kernel that computes it stores it there
// too); its sums go to partial[chunk · m + column]. `red` is partial_smem<T>() bytes of shared memory.
template <typename T, typename Produce>
__device__ __forceinline__ void partial_vec(int64_t n, int64_t m, int64_t R, compute_t<T> *__restrict__ partial,
                                            compute_t<T> *red, Produce &&produce) {
    using C = compute_t<T>;
    constexpr int V = kVec<T>, TC = kTileThreads * V, LD = TC + 1;
    const int64_t c0 = int64_t(blockIdx.x) * TC + int64_t(threadIdx.x) * V;
    const int64_t r0 = int64_t(blockIdx.y) * R, r1 = r0 + R < n ? r0 + R : n;
    C s[V];
#pragma unroll
    for (int k = 0; k < V; ++k) s[k] = C(0);
    if (c0 < m) {
#pragma unroll 4
        for (int64_t r = r0 + threadIdx.y; r < r1; r += kRowLanes) {
            const Vec<T> v = produce(r, c0);
#pragma unroll
            for (int k = 0; k < V; ++k) s[k] += to_compute(v.v[k]);
        }
    }
#pragma unroll
    for (int k = 0; k < V; ++k) red[threadIdx.y * LD + threadIdx.x * V + k] = s[k];
    __syncthreads();
    // Thread t of the block adds the lanes of the tile's columns t, t + 256, … in lane order.
    const int t = threadIdx.y * kTileThreads + threadIdx.x;
    for (int j = t; j < TC; j += kTileThreads * kRowLanes) {
        const int64_t col = int64_t(blockIdx.x) * TC + j;
        if (col >= m) break;
        C sum = red[j];
        for (int y = 1; y < kRowLanes; ++y) sum += red[y * LD + j];
        partial[int64_t(blockIdx.y) * m + col] = sum;
    }
}

// The scalar form, for block (blockIdx.x = column tile of kTileThreads columns, blockIdx.y = chunk):
// `produce(r, c)` returns the stored value of row r, column c; the sums go to partial[chunk · m + c].
template <typename T, typename Produce>
__device__ __forceinline__ void partial_scalar(int64_t n, int64_t m, int64_t R, compute_t<T> *__restrict__ partial,
                                               Produce &&produce) {
    using C = compute_t<T>;
    __shared__ C red[kRowLanes][kTileThreads + 1];
    const int64_t col = blockIdx.x * int64_t(kTileThreads) + threadIdx.x;
    const int64_t r0 = blockIdx.y * R, r1 = r0 + R < n ? r0 + R : n;
    C s = 0;
    if (col < m)
        for (int64_t r = r0 + threadIdx.y; r < r1; r += kRowLanes) s += to_compute(produce(r, col));
    red[threadIdx.y][threadIdx.x] = s;
    __syncthreads();
    if (threadIdx.y == 0 && col < m) {
        C t = red[0][threadIdx.x];
        for (int k = 1; k < kRowLanes; ++k) t += red[k][threadIdx.x];
        partial[blockIdx.y * m + col] = t;
    }
}

// The second pass for column `col` (< m or not) of a block of kTileThreads columns × kRowLanes chunk
// lanes, the partials of chunk c at partial[c · ld + column] (ld ≥ m): lane y adds the partials of
// chunks y, y + kRowLanes, … in order, then the lanes are added in order. Thread (x, 0) of a column
// below m gets the column's sum, the others 0. Every thread of the block calls it (it synchronises the
// block; a block may call it more than once).
template <typename C>
__device__ __forceinline__ C finalize_column(const C *__restrict__ partial, int64_t m, int64_t ld, int64_t chunks,
                                             int64_t col) {
    __shared__ C red[kRowLanes][kTileThreads + 1];
    C s = 0;
    if (col < m)
        for (int64_t c = threadIdx.y; c < chunks; c += kRowLanes) s += partial[c * ld + col];
    __syncthreads();  // red may still be read by the block's previous call
    red[threadIdx.y][threadIdx.x] = s;
    __syncthreads();
    C t = 0;
    if (threadIdx.y == 0 && col < m) {
        t = red[0][threadIdx.x];
        for (int k = 1; k < kRowLanes; ++k) t += red[k][threadIdx.x];
    }
    return t;
}

}  // namespace colsum
}  // namespace cuda
}  // namespace dst

#endif  // DST_KERNELS_COLUMN_PARTIAL_CUH
