// Embedding forward and backward.
//   embedding_fwd_kernel: one thread per output element, or per 16-byte vector of kVec<T> adjacent
//     elements when H is a multiple of it and the tables and output are aligned (one index lookup
//     and one division per vector); (word + position) + type in the compute type, one rounding (the
//     CPU twin's order): both forms give the same bits.
//   Word table backward, without floating-point atomics: (1) token indices 0…N−1 are sorted by id
//     with cub's radix sort, which is stable, so the tokens of one id stay in increasing order;
//     (2) chunk_sum_kernel: the sorted positions form chunks of kChunk; a full chunk whose positions
//     all hold one id (a stretch of a long run: [PAD] in padded batches, frequent tokens) has its
//     dout rows summed in order into a compute-type partial row, one block per chunk, in parallel;
//     (3) word_rows_kernel runs one block per sorted position; the block at the first position of
//     each id's run finds the run's end (blockDim.x keys per step) and sums the run column by
//     column in position order, taking each full chunk inside the run as its partial, and writes
//     the id's row. A run of m tokens costs its block at most 2·kChunk rows and m / kChunk partials
//     (one block summed all m rows before: 12 ms per step for the [PAD] run of a 16×512 BERT batch).
//     Deterministic; the order differs from the CPU twin's plain token order only by the grouping.
//     Steps (2) and (3) take kVec<T> adjacent columns per thread (16-byte accesses) when H is a
//     multiple of it and the tensors are 16-byte aligned: the same order per column, the same bits,
//     and a run's serial chain of row loads walked once per vector instead of once per column.
//   type_partial_kernel + type_finalize_kernel: the column sums of kernels/column_partial.cuh (row
//     chunks, lanes, chunks added in order) over the rows of each type, the other rows read as zeros,
//     one grid layer per type. (One block per (chunk of 256 tokens, type) before, each thread summing
//     its columns token by token: 64 blocks at 64×128 tokens, a serial chain of 2048 loads per thread.)
//   position_kernel: one thread per (s, column) sums over the batch in order.
#include "kernels/embedding.cuh"

#include <cub/device/device_radix_sort.cuh>

#include "kernels/column_partial.cuh"
#include "kernels/dispatch.cuh"

namespace dst {
namespace cuda {
namespace {

constexpr int kThreads = 256, kRowThreads = 128;
constexpr int64_t kChunk = 32;  // sorted positions per partial sum of the word-table backward

size_t align256(size_t v) { return (v + 255) / 256 * 256; }

// Bits a radix sort of ids in [0, V) needs.
int key_bits(int64_t V) {
    int b = 1;
    while (b < 31 && (int64_t(1) << b) < V) ++b;
    return b;
}

size_t sort_temp_bytes(int64_t n, int64_t V) {
    size_t bytes = 0;
    cub::DeviceRadixSort::SortPairs(nullptr, bytes, static_cast<const int32_t *>(nullptr), static_cast<int32_t *>(nullptr),
                                    static_cast<const int32_t *>(nullptr), static_cast<int32_t *>(nullptr),
                                    static_cast<int>(n), 0, key_bits(V));
    return bytes;
}

// ================================ kernels ========================================================

__global__ void iota_kernel(int32_t *v, int64_t n) {
    for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
        v[i] = static_cast<int32_t>(i);
}

// Columns c … c + W − 1 of row r of a [rows, H] tensor: one 16-byte vector (W = kVec<T>) or one element.
template <typename T, int W>
__device__ __forceinline__ void load_cols(const T *__restrict__ x, int64_t r, int64_t H, int64_t c, compute_t<T> (&v)[W]) {
    if constexpr (W == 1) {
        v[0] = to_compute(x[r * H + c]);
    } else {
        const Vec<T> q = *reinterpret_cast<const Vec<T> *>(x + r * H + c);
#pragma unroll
        for (int k = 0; k < W; ++k) v[k] = to_compute(q.v[k]);
    }
}

// W = 1: one element per thread; W = kVec<T>: one 16-byte vector (H a multiple of W, every table and
// the output 16-byte aligned). `total` counts the units (elements or vectors).
template <typename T, int W>
__global__ void embedding_fwd_kernel(const int32_t *__restrict__ ids, const int32_t *__restrict__ types,
                                     const T *__restrict__ word, const T *__restrict__ pos, const T *__restrict__ type,
                                     T *__restrict__ out, int64_t S, int64_t H, int64_t V, int64_t T_rows,
                                     int64_t total) {
    using C = compute_t<T>;
    const int64_t HW = H / W;
    for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < total; e += int64_t(gridDim.x) * blockDim.x) {
        const int64_t t = e / HW, j = (e - t * HW) * W;
        const int64_t v = ids[t], s = t % S, k = types ? types[t] : 0;
        C w[W], p[W], y[W];
        const bool wv = v >= 0 && v < V, kv = k >= 0 && k < T_rows;  // out of range: a zero row
        for (int i = 0; i < W; ++i) w[i] = y[i] = C(0);
        if (wv) load_cols<T, W>(word, v, H, j, w);
        if (kv) load_cols<T, W>(type, k, H, j, y);
        load_cols<T, W>(pos, s, H, j, p);
        if constexpr (W == 1) {
            out[t * H + j] = to_storage<T>(w[0] + p[0] + y[0]);
        } else {
            Vec<T> o;
#pragma unroll
            for (int i = 0; i < W; ++i) o.v[i] = to_storage<T>(w[i] + p[i] + y[i]);
            *reinterpret_cast<Vec<T> *>(out + t * H + j) = o;
        }
    }
}

// Block c: when the kChunk sorted positions of chunk c are all there and hold one id, sums their dout
// rows in order into partial[c·H + j]; other chunks are summed row by row by word_rows_kernel. A thread
// takes W adjacent columns (1, or kVec<T> with H a multiple of it and dout 16-byte aligned).
template <typename T, int W>
__global__ void chunk_sum_kernel(const T *__restrict__ dout, const int32_t *__restrict__ keys,
                                 const int32_t *__restrict__ tokens, compute_t<T> *__restrict__ partial, int64_t n,
                                 int64_t H) {
    using C = compute_t<T>;
    const int64_t r0 = blockIdx.x * kChunk;
    if (r0 + kChunk > n || keys[r0] != keys[r0 + kChunk - 1]) return;
    for (int64_t j = threadIdx.x * int64_t(W); j < H; j += int64_t(blockDim.x) * W) {
        C acc[W], v[W];
#pragma unroll
        for (int k = 0; k < W; ++k) acc[k] = 0;
        for (int64_t r = r0; r < r0 + kChunk; ++r) {
            load_cols<T, W>(dout, tokens[r], H, j, v);
#pragma unroll
            for (int k = 0; k < W; ++k) acc[k] += v[k];
        }
#pragma unroll
        for (int k = 0; k < W; ++k) partial[blockIdx.x * H + j + k] = acc[k];
    }
}

// Block i: when sorted position i starts a run of equal ids, sums the run's rows into that id's row,
// a full chunk inside the run through its partial sum (keys are sorted, so such a chunk holds one id).
// W as in chunk_sum_kernel (dword 16-byte aligned too).
template <typename T, int W>
__global__ void word_rows_kernel(const T *__restrict__ dout, const int32_t *__restrict__ keys,
                                 const int32_t *__restrict__ tokens, const compute_t<T> *__restrict__ partial,
                                 T *dword, int64_t n, int64_t H, int64_t V, bool accumulate) {
    using C = compute_t<T>;
    const int64_t i = blockIdx.x;
    const int32_t id = keys[i];
    if ((i > 0 && keys[i - 1] == id) || id < 0 || id >= V) return;  // an id outside the table is skipped
    // The run's end: keys are sorted, so "keys[r] == id" holds on a prefix of r > i; the block tests
    // blockDim.x positions at a time and counts them.
    int64_t end = i + 1;
    for (;;) {
        const int64_t r = end + threadIdx.x;
        const int same = __syncthreads_count(r < n && keys[r] == id);
        end += same;
        if (same < static_cast<int>(blockDim.x)) break;
    }
    for (int64_t j = threadIdx.x * int64_t(W); j < H; j += int64_t(blockDim.x) * W) {
        C acc[W], v[W];
#pragma unroll
        for (int k = 0; k < W; ++k) acc[k] = 0;
        for (int64_t r = i; r < end;) {
            if (r % kChunk == 0 && r + kChunk <= end) {
#pragma unroll
                for (int k = 0; k < W; ++k) acc[k] += partial[(r / kChunk) * H + j + k];
                r += kChunk;
            } else {
                load_cols<T, W>(dout, tokens[r], H, j, v);
#pragma unroll
                for (int k = 0; k < W; ++k) acc[k] += v[k];
                ++r;
            }
        }
        if (accumulate) {
            load_cols<T, W>(dword, id, H, j, v);
#pragma unroll
            for (int k = 0; k < W; ++k) acc[k] = v[k] + acc[k];
        }
        if constexpr (W == 1) {
            dword[int64_t(id) * H + j] = to_storage<T>(acc[0]);
        } else {
            Vec<T> q;
#pragma unroll
            for (int k = 0; k < W; ++k) q.v[k] = to_storage<T>(acc[k]);
            *reinterpret_cast<Vec<T> *>(dword + int64_t(id) * H + j) = q;
        }
    }
}

template <typename T>
__global__ void position_kernel(const T *__restrict__ dout, T *dpos, int64_t B, int64_t S, int64_t P, int64_t H,
                                bool accumulate) {
    using C = compute_t<T>;
    for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < P * H; e += int64_t(gridDim.x) * blockDim.x) {
        const int64_t s = e / H, j = e - s * H;
        if (s >= S) {
            if (!accumulate) dpos[e] = to_storage<T>(C(0));
            continue;
        }
        C acc = 0;
        for (int64_t b = 0; b < B; ++b) acc += to_compute(dout[(b * S + s) * H + j]);
        dpos[e] = to_storage<T>(accumulate ? to_compute(dpos[e]) + acc : acc);
    }
}

// Block (column tile, chunk, type layer z): for the types k = z, z + gridDim.z, …, the column sums'
// partials (kernels/column_partial.cuh) of dout over the rows of type k, the other rows read as zeros
// (adding a zero leaves every sum as it is), into partial[(k · chunks + chunk) · H + column]. VEC: the
// vector form (H a multiple of kVec<T>, dout 16-byte aligned), else the scalar form.
template <typename T, bool VEC>
__global__ void __launch_bounds__(colsum::kTileThreads *colsum::kRowLanes) type_partial_kernel(
    const T *__restrict__ dout, const int32_t *__restrict__ types, compute_t<T> *__restrict__ partial, int64_t n,
    int64_t T_rows, int64_t H, int64_t R) {
    using C = compute_t<T>;
    for (int64_t k = blockIdx.z; k < T_rows; k += gridDim.z) {
        auto of_type = [&](int64_t r) { return (types ? types[r] : 0) == k; };
        C *pk = partial + k * int64_t(gridDim.y) * H;
        if constexpr (VEC) {
            __shared__ C red[colsum::partial_smem<T>() / sizeof(C)];
            __syncthreads();  // red may still be read for the previous type
            colsum::partial_vec<T>(n, H, R, pk, red, [&](int64_t r, int64_t c) {
                Vec<T> q;
                if (of_type(r)) {
                    q = *reinterpret_cast<const Vec<T> *>(dout + r * H + c);
                } else {
#pragma unroll
                    for (int e = 0; e < kVec<T>; ++e) q.v[e] = to_storage<T>(C(0));
                }
                return q;
            });
        } else {
            __syncthreads();
            colsum::partial_scalar<T>(n, H, R, pk,
                                      [&](int64_t r, int64_t c) { return of_type(r) ? dout[r * H + c] : to_storage<T>(C(0)); });
        }
    }
}

// Block (column tile, type layer z): dtype[k, :] for k = z, z + gridDim.y, … from the chunks' partials in
// order (colsum::finalize_column); accumulating, a type no token has keeps its row as it was.
template <typename T>
__global__ void __launch_bounds__(colsum::kTileThreads *colsum::kRowLanes) type_finalize_kernel(
    const compute_t<T> *__restrict__ partial, T *dtype, int64_t chunks, int64_t T_rows, int64_t H, bool accumulate,
    const int32_t *__restrict__ used) {
    using C = compute_t<T>;
    const int64_t col = blockIdx.x * int64_t(colsum::kTileThreads) + threadIdx.x;
    for (int64_t k = blockIdx.y; k < T_rows; k += gridDim.y) {
        C t = colsum::finalize_column(partial + k * chunks * H, H, H, chunks, col);
        if (threadIdx.y != 0 || col >= H) continue;
        T *d = dtype + k * H + col;
        if (!accumulate)
            *d = to_storage<T>(t);
        else if (used[k])
            *d = to_storage<T>(to_compute(*d) + t);
    }
}

// used[k] = whether some token has type k (accumulate mode leaves unused rows as they are).
__global__ void type_used_kernel(const int32_t *__restrict__ types, int64_t n, int64_t T_rows, int32_t *used) {
    for (int64_t t = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; t < n; t += int64_t(gridDim.x) * blockDim.x) {
        const int32_t k = types ? types[t] : 0;
        if (k >= 0 && k < T_rows) used[k] = 1;  // every writer stores the same value
    }
}

}  // namespace

// ================================ launchers ======================================================

cudaError_t embedding_fwd(cudaStream_t stream, dst_dtype dt, const int32_t *ids, const int32_t *types,
                         const void *word, const void *pos, const void *type, void *out, int64_t B, int64_t S,
                         int64_t H, int64_t V, int64_t T_rows) {
    const int64_t total = B * S * H;
    if (total <= 0) return cudaSuccess;
    return dispatch_dtype(dt, [&](auto tag) {
        using T = decltype(tag);
        constexpr int W = kVec<T>;
        const bool vec = H % W == 0 && aligned16(word) && aligned16(pos) && aligned16(out) && (!type || aligned16(type));
        const auto launch = [&](auto kernel, int64_t units) {
            kernel<<<grid_blocks(units, kThreads), kThreads, 0, stream>>>(
                ids, types, static_cast<const T *>(word), static_cast<const T *>(pos), static_cast<const T *>(type),
                static_cast<T *>(out), S, H, V, T_rows, units);
        };
        if (vec)
            launch(embedding_fwd_kernel<T, W>, total / W);
        else
            launch(embedding_fwd_kernel<T, 1>, total);
        DST_KERNEL_CHECK(cudaGetLastError());
        return cudaSuccess;
    });
}

size_t embedding_bwd_workspace(dst_dtype dt, int64_t tokens, int64_t V, int64_t T, int64_t H) {
    size_t s = 0;
    if (V > 0 && tokens > 0)
        s += 3 * align256(static_cast<size_t>(tokens) * sizeof(int32_t)) + align256(sort_temp_bytes(tokens, V)) +
             align256(static_cast<size_t>((tokens + kChunk - 1) / kChunk * H) * compute_size(dt));
    if (T > 0)
        s += align256(static_cast<size_t>(colsum::chunk_count(tokens) * T * H) * compute_size(dt)) +
             align256(static_cast<size_t>(T) * sizeof(int32_t));
    return s;
}

cudaError_t embedding_bwd(cudaStream_t stream, dst_dtype dt, const void *dout, const int32_t *ids,
                         const int32_t *types, void *dword, void *dpos, void *dtype, int64_t B, int64_t S, int64_t H,
                         int64_t V, int64_t P, int64_t T, bool accumulate, void *workspace, size_t workspace_bytes) {
    const int64_t n = B * S;
    if (n <= 0 || H <= 0) return cudaSuccess;
    char *ws = static_cast<char *>(workspace);
    if (embedding_bwd_workspace(dt, n, dword ? V : 0, dtype ? T : 0, H) > workspace_bytes) return cudaErrorInvalidValue;
    const size_t esize = dt == DST_DTYPE_FP64 ? 8 : dt == DST_DTYPE_FP32 ? 4 : 2;
    return dispatch_dtype(dt, [&](auto tag) {
        using T_ = decltype(tag);
        using C = compute_t<T_>;
        char *p = ws;
        if (dword) {
            int32_t *keys = reinterpret_cast<int32_t *>(p);
            p += align256(static_cast<size_t>(n) * 4);
            int32_t *iota = reinterpret_cast<int32_t *>(p);
            p += align256(static_cast<size_t>(n) * 4);
            int32_t *tokens = reinterpret_cast<int32_t *>(p);
            p += align256(static_cast<size_t>(n) * 4);
            size_t temp = sort_temp_bytes(n, V);
            void *tmp = p;
            p += align256(temp);
            iota_kernel<<<grid_blocks(n, kThreads), kThreads, 0, stream>>>(iota, n);
            DST_KERNEL_CHECK(cudaGetLastError());
            DST_KERNEL_CHECK(cub::DeviceRadixSort::SortPairs(tmp, temp, ids, keys, iota, tokens, static_cast<int>(n), 0,
                                                             key_bits(V), stream));
            const int64_t chunks = (n + kChunk - 1) / kChunk;
            C *partial = reinterpret_cast<C *>(p);
            p += align256(static_cast<size_t>(chunks * H) * sizeof(C));
            if (!accumulate) DST_KERNEL_CHECK(cudaMemsetAsync(dword, 0, static_cast<size_t>(V * H) * esize, stream));
            const T_ *src = static_cast<const T_ *>(dout);
            T_ *dst = static_cast<T_ *>(dword);
            if (H % kVec<T_> == 0 && aligned16(dout) && aligned16(dword)) {
                constexpr int W = kVec<T_>;
                chunk_sum_kernel<T_, W><<<static_cast<unsigned>(chunks), kRowThreads, 0, stream>>>(src, keys, tokens,
                                                                                                 partial, n, H);
                DST_KERNEL_CHECK(cudaGetLastError());
                word_rows_kernel<T_, W><<<static_cast<unsigned>(n), kRowThreads, 0, stream>>>(src, keys, tokens, partial,
                                                                                              dst, n, H, V, accumulate);
            } else {
                chunk_sum_kernel<T_, 1><<<static_cast<unsigned>(chunks), kRowThreads, 0, stream>>>(src, keys, tokens,
                                                                                                 partial, n, H);
                DST_KERNEL_CHECK(cudaGetLastError());
                word_rows_kernel<T_, 1><<<static_cast<unsigned>(n), kRowThreads, 0, stream>>>(src, keys, tokens, partial,
                                                                                              dst, n, H, V, accumulate);
            }
            DST_KERNEL_CHECK(cudaGetLastError());
        }
        if (dpos) {
            position_kernel<T_><<<grid_blocks(P * H, kThreads), kThreads, 0, stream>>>(
                static_cast<const T_ *>(dout), static_cast<T_ *>(dpos), B, S, P, H, accumulate);
            DST_KERNEL_CHECK(cudaGetLastError());
        }
        if (dtype) {
            const int64_t chunks = colsum::chunk_count(n), R = colsum::rows_per_chunk(n);
            C *partial = reinterpret_cast<C *>(p);
            p += align256(static_cast<size_t>(chunks * T * H) * sizeof(C));
            int32_t *used = reinterpret_cast<int32_t *>(p);
            DST_KERNEL_CHECK(cudaMemsetAsync(used, 0, static_cast<size_t>(T) * sizeof(int32_t), stream));
            type_used_kernel<<<grid_blocks(n, kThreads), kThreads, 0, stream>>>(types, n, T, used);
            DST_KERNEL_CHECK(cudaGetLastError());
            const bool vec = H % kVec<T_> == 0 && aligned16(dout);
            const unsigned layers = static_cast<unsigned>(T < 65535 ? T : 65535);
            dim3 grid = colsum::partial_grid<T_>(n, H, vec);
            grid.z = layers;
            (vec ? type_partial_kernel<T_, true> : type_partial_kernel<T_, false>)<<<grid, colsum::partial_block(), 0,
                                                                                     stream>>>(
                static_cast<const T_ *>(dout), types, partial, n, T, H, R);
            DST_KERNEL_CHECK(cudaGetLastError());
            const unsigned tiles = static_cast<unsigned>((H + colsum::kTileThreads - 1) / colsum::kTileThreads);
            type_finalize_kernel<T_><<<dim3(tiles, layers), colsum::partial_block(), 0, stream>>>(
                partial, static_cast<T_ *>(dtype), chunks, T, H, accumulate, used);
            DST_KERNEL_CHECK(cudaGetLastError());
        }
        return cudaSuccess;
    });
}

}  // namespace cuda
}  // namespace dst
