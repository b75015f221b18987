/**
 * @file dstransformer.h
 * @brief The public C API of libdstransformer, a fused BERT-style Transformer layer for training.
 *
 * libdstransformer computes one Transformer encoder layer (self-attention, feed-forward network,
 * LayerNorms, dropouts and residual connections), forward and backward, in the Pre-LN or Post-LN
 * arrangement, with the memory switches of DeepSpeed's Transformer Kernel
 * (`attn_dropout_checkpoint`, `normalize_invertible`, `gelu_checkpoint`).
 *
 * It also trains: optimizers (::dst_optimizer: DeepSpeed's FusedAdam and FusedLamb over any tensors)
 * and a training engine (::dst_engine: a DeepSpeed JSON configuration, gradient accumulation, loss
 * scaling, clipping, schedules and checkpoints), for these layers or any other tensors.
 *
 * The API is plain C99 and is the only interface of the library; the bindings (Python, Java, Rust)
 * are built on it. Conventions:
 *  - Every fallible call returns a ::dst_status; ::DST_OK is 0. On failure, dst_last_error() gives a
 *    message naming the argument and what was expected, and nothing the caller owns was changed.
 *  - Handles (::dst_context, ::dst_layer, ::dst_saved, ::dst_optimizer, ::dst_engine) are opaque; each
 *    has a create/destroy pair and every destroy function accepts NULL.
 *  - Tensors cross the API as non-owning views (::dst_tensor) in the memory space of the context
 *    (host memory for ::DST_BACKEND_CPU). Shapes are row-major.
 *  - Configuration structs start with `struct_size` and are filled by a `*_default()` function;
 *    fields are only ever appended.
 *  - No global state: the layer counter, the random-number state and the thread count belong to a
 *    context.
 *  - Threads: calls without a handle may be made from any thread at any time. Different contexts (with
 *    their layers and saved objects) may be used from different threads at the same time, checkpoint
 *    saves of their layers to different paths included. One context may be used from any thread, but
 *    by one thread at a time: the caller orders the hand-over (a join, a mutex). These patterns are what
 *    CI runs under ThreadSanitizer (tests/cpu/test_threads.cpp).
 *
 * A minimal session:
 * @code
 *   dst_context *ctx; dst_layer *layer; dst_layer_config cfg;
 *   dst_context_create(DST_BACKEND_CPU, 0, &ctx);
 *   dst_layer_config_default(&cfg);
 *   cfg.hidden_size = 256; cfg.heads = 4; cfg.max_batch_tokens = 4096; cfg.max_seq_len = 512;
 *   dst_layer_create(ctx, &cfg, &layer);
 *   // ... dst_layer_forward(), dst_layer_backward(), dst_layer_get_grad() ...
 *   dst_layer_destroy(layer);
 *   dst_context_destroy(ctx);
 * @endcode
 */
#ifndef DSTRANSFORMER_DSTRANSFORMER_H
#define DSTRANSFORMER_DSTRANSFORMER_H

#include <stddef.h>
#include <stdint.h>

/** @brief Marks the symbols that the shared library exports. */
#if defined(_WIN32)
#define DST_API
#elif defined(DST_BUILDING_LIBRARY)
#define DST_API __attribute__((visibility("default")))
#else
#define DST_API
#endif

/**
 * @brief Declares a public enum type.
 *
 * C++ sees a fixed underlying type (int), so every 32-bit value a caller passes is a value of the
 * type that the library can check and reject; C sees a plain enum of the same size.
 */
#ifdef __cplusplus
#define DST_ENUM(name) enum name : int
#else
#define DST_ENUM(name) enum name
#endif

#ifdef __cplusplus
extern "C" {
#endif

/**
 * @defgroup version Version
 * @brief Compile-time and run-time version of the library.
 * @{
 */
/** @brief Major version; the SONAME is `libdstransformer.so.<major>`. */
#define DST_VERSION_MAJOR 0
/** @brief Minor version: grows when API is added. */
#define DST_VERSION_MINOR 1
/** @brief Patch version: grows with fixes. */
#define DST_VERSION_PATCH 0
/** @brief The version as one number: major·10000 + minor·100 + patch. */
#define DST_VERSION_NUMBER (DST_VERSION_MAJOR * 10000 + DST_VERSION_MINOR * 100 + DST_VERSION_PATCH)

/**
 * @brief Version of the library loaded at run time, as ::DST_VERSION_NUMBER computes it.
 * @return The version number; compare with ::DST_VERSION_NUMBER to detect a mismatch.
 * Thread safety: may be called from any thread. @since v0.1
 */
DST_API int dst_version(void);

/**
 * @brief Version of the library loaded at run time, as "major.minor.patch".
 * @return A static string owned by the library; do not free. Thread safety: any thread. @since v0.1
 */
DST_API const char *dst_version_string(void);
/** @} */

/**
 * @defgroup errors Status codes and errors
 * @brief Every fallible call returns a status; the message of the last failure is thread-local.
 * @{
 */
/** @brief Result of a call. The numeric values are fixed and never reused. */
typedef DST_ENUM(dst_status) {
    DST_OK = 0,                    /**< Success. */
    DST_ERR_INVALID_ARGUMENT = 1,  /**< An argument is NULL, out of range, or of the wrong dtype/shape. */
    DST_ERR_UNSUPPORTED = 2,       /**< Valid request that this build or backend cannot serve. */
    DST_ERR_CAPACITY = 3,          /**< B·S or S exceeds the maxima the layer was created with. */
    DST_ERR_OUT_OF_MEMORY = 4,     /**< An allocation failed (host or device). */
    DST_ERR_STATE = 5,             /**< Call out of order, e.g. backward without a training forward. */
    DST_ERR_BACKEND = 6,           /**< A backend library (BLAS, CUDA, cuBLAS) reported an error. */
    DST_ERR_IO = 7,                /**< A file could not be read or written. */
    DST_ERR_FORMAT = 8,            /**< A file or buffer is malformed or does not match the target. */
    DST_ERR_INTERNAL = 99          /**< A bug in the library; please report it with the message. */
} dst_status;

/**
 * @brief Name of a status, e.g. "DST_ERR_CAPACITY".
 * @param status Any value; unknown values give "DST_ERR_UNKNOWN".
 * @return A static string owned by the library; do not free. Thread safety: any thread. @since v0.1
 */
DST_API const char *dst_status_string(dst_status status);

/**
 * @brief Message of the last failed call on this thread.
 *
 * The message names the function, the argument and what was expected. Successful calls do not clear it.
 * @return A thread-local string owned by the library, valid until the next failing call on this
 *         thread; "" when no call has failed. Do not free. Thread safety: per thread. @since v0.1
 */
DST_API const char *dst_last_error(void);
/** @} */

/**
 * @defgroup types Element types and tensor views
 * @brief How data crosses the API.
 * @{
 */
/** @brief Element type of a tensor or of a layer's storage. */
typedef DST_ENUM(dst_dtype) {
    DST_DTYPE_FP32 = 0,  /**< IEEE binary32. */
    DST_DTYPE_FP16 = 1,  /**< IEEE binary16. */
    DST_DTYPE_BF16 = 2,  /**< bfloat16 (upper half of a binary32). */
    DST_DTYPE_FP64 = 3,  /**< IEEE binary64 (reference computations). */
    DST_DTYPE_INT32 = 4  /**< 32-bit signed integer (key-length masks). */
} dst_dtype;

/**
 * @brief Size in bytes of one element of a dtype.
 * @param dtype The element type.
 * @return 8, 4 or 2; 0 for a value that is not a ::dst_dtype. Thread safety: any thread. @since v0.1
 */
DST_API size_t dst_dtype_size(dst_dtype dtype);

/**
 * @brief Name of a dtype, e.g. "bf16".
 * @param dtype The element type.
 * @return A static string; "unknown" for a value that is not a ::dst_dtype. Thread safety: any thread.
 * @since v0.1
 */
DST_API const char *dst_dtype_string(dst_dtype dtype);

/** @brief Most dimensions a ::dst_tensor can have. */
#define DST_MAX_DIMS 4

/**
 * @brief A non-owning view of a dense, row-major tensor.
 *
 * `data` lives in the memory space of the context it is passed to (host memory for the CPU
 * backend). The caller owns it; the library never keeps the pointer beyond the call.
 */
typedef struct dst_tensor {
    void *data;                    /**< First element; must not be NULL. */
    dst_dtype dtype;               /**< Element type. */
    int32_t ndim;                  /**< Number of dimensions, 1..::DST_MAX_DIMS. */
    int64_t shape[DST_MAX_DIMS];   /**< Extent of each dimension; entries past `ndim` are ignored. */
} dst_tensor;
/** @} */

/**
 * @defgroup context Contexts
 * @brief A context binds a backend, its memory, its random-number state and its layer counter.
 * @{
 */
/** @brief Compute backend of a context. */
typedef DST_ENUM(dst_backend) {
    DST_BACKEND_AUTO = 0,  /**< The best available: CUDA when a GPU is usable, else CPU. */
    DST_BACKEND_CPU = 1,   /**< The reference backend: host memory, CBLAS GEMMs, OpenMP loops. */
    DST_BACKEND_CUDA = 2   /**< NVIDIA GPUs (builds with CUDA, sm_80 and newer). */
} dst_backend;

/** @brief Opaque context handle. */
typedef struct dst_context dst_context;

/**
 * @brief Creates a context on a backend.
 * @param backend ::DST_BACKEND_CPU, ::DST_BACKEND_CUDA or ::DST_BACKEND_AUTO.
 * @param device Device ordinal for GPU backends; must be 0 for the CPU backend.
 * @param[out] out Receives the new context; unchanged on failure.
 * @return ::DST_OK; ::DST_ERR_INVALID_ARGUMENT for a NULL `out`, an unknown backend or a bad device;
 *         ::DST_ERR_UNSUPPORTED when the backend is not available in this build or on this machine;
 *         ::DST_ERR_OUT_OF_MEMORY.
 * Ownership: the caller owns the context and frees it with dst_context_destroy(). Layers keep
 * their context alive, so the handle may be destroyed before them. Thread safety: any thread; a context
 * and its layers must not be used from two threads at the same time. @since v0.1
 */
DST_API dst_status dst_context_create(dst_backend backend, int device, dst_context **out);

/**
 * @brief Releases the caller's reference to a context.
 * @param ctx The context, or NULL (no effect). Layers created in it stay valid.
 * Thread safety: not concurrently with other calls on the same context. @since v0.1
 */
DST_API void dst_context_destroy(dst_context *ctx);

/**
 * @brief The backend a context runs on (::DST_BACKEND_AUTO resolved).
 * @param ctx The context.
 * @param[out] backend Receives ::DST_BACKEND_CPU or ::DST_BACKEND_CUDA.
 * @return ::DST_OK or ::DST_ERR_INVALID_ARGUMENT for a NULL argument.
 * Ownership: nothing is allocated. Thread safety: as for the context. @since v0.1
 */
DST_API dst_status dst_context_get_backend(const dst_context *ctx, dst_backend *backend);

/**
 * @brief Sets the dropout random-number state: a Philox4x32-10 key and a counter offset.
 *
 * Each training forward of a layer in this context takes the next three offsets (one per dropout
 * site) and records them, so that backward regenerates the masks; the same (seed, offset) gives
 * bit-identical masks on every backend. The offset never wraps: once fewer than three offsets are left
 * below 2^64 − 1, training forwards fail with ::DST_ERR_STATE until a new state is set. Training
 * forwards captured into a CUDA graph draw from a device-side counter instead (docs/rng.md, "Dropout
 * in CUDA graphs"); this call also sets that counter back to 0.
 * @param ctx The context.
 * @param seed Philox key.
 * @param offset First counter offset the next training forward uses.
 * @return ::DST_OK; ::DST_ERR_INVALID_ARGUMENT for a NULL context; ::DST_ERR_UNSUPPORTED while the
 *         context's stream captures a CUDA graph and the context has a graph counter (the reset
 *         would run at every replay; the state is unchanged); ::DST_ERR_BACKEND.
 * Thread safety: as for the context. @since v0.1
 */
DST_API dst_status dst_context_set_rng_state(dst_context *ctx, uint64_t seed, uint64_t offset);

/**
 * @brief Reads the dropout random-number state.
 * @param ctx The context.
 * @param[out] seed Receives the Philox key.
 * @param[out] offset Receives the next counter offset.
 * @return ::DST_OK or ::DST_ERR_INVALID_ARGUMENT for a NULL argument.
 * Thread safety: as for the context. @since v0.1
 */
DST_API dst_status dst_context_get_rng_state(const dst_context *ctx, uint64_t *seed, uint64_t *offset);

/**
 * @brief Reads the graph dropout counter: the word the next training forward with dropout that runs
 *        from a CUDA graph (captured, then replayed) takes (docs/rng.md, "Dropout in CUDA graphs").
 *
 * The counter lives in device memory and advances as replays run, so this call waits for the
 * context's stream. With the seed and offset of dst_context_get_rng_state() it is the whole dropout
 * state: a program that stores all three and sets them back (dst_context_set_rng_state(), then
 * dst_context_set_rng_graph_counter()) draws the masks an uninterrupted run would. The library's
 * checkpoints store it with the RNG state.
 * @param ctx The context.
 * @param[out] counter Receives the word, 0 … 2^32 − 1 (0 on a context that has not made one: before
 *        its first training forward with dropout, and on the CPU backend until then).
 * @return ::DST_OK; ::DST_ERR_INVALID_ARGUMENT for a NULL argument; ::DST_ERR_UNSUPPORTED while the
 *         context's stream captures a CUDA graph (waiting would end the capture); ::DST_ERR_BACKEND.
 * Thread safety: as for the context. @since v0.1
 */
DST_API dst_status dst_context_get_rng_graph_counter(const dst_context *ctx, uint64_t *counter);

/**
 * @brief Sets the graph dropout counter (see dst_context_get_rng_graph_counter()); queued on the
 *        context's stream, after the work already queued there.
 * @param ctx The context.
 * @param counter The word the next graph-run training forward takes, 0 … 2^32 − 1.
 * @return ::DST_OK; ::DST_ERR_INVALID_ARGUMENT (NULL context, counter ≥ 2^32; the state is unchanged);
 *         ::DST_ERR_UNSUPPORTED while the context's stream captures a CUDA graph and the context has a
 *         counter (the write would run at every replay); ::DST_ERR_OUT_OF_MEMORY (the counter is made by the first call that needs
 *         it); ::DST_ERR_BACKEND.
 * Thread safety: as for the context. @since v0.1
 */
DST_API dst_status dst_context_set_rng_graph_counter(dst_context *ctx, uint64_t counter);

/**
 * @brief Number of CUDA devices usable by this build.
 * @param[out] count Receives the count; 0 when the build has no CUDA backend or no driver/GPU is present.
 * @return ::DST_OK or ::DST_ERR_INVALID_ARGUMENT for NULL.
 * Thread safety: any thread. @since v0.1
 */
DST_API dst_status dst_cuda_device_count(int *count);

/**
 * @brief Sets the stream on which a CUDA context runs all its work.
 * @param ctx The context.
 * @param stream A `cudaStream_t` of the context's device, passed as a pointer; NULL restores the
 *               context's own stream (a non-blocking stream: it does not wait for the legacy default
 *               stream). To run on the legacy default stream (handle 0 in CUDA and in PyTorch's
 *               `torch.cuda.current_stream().cuda_stream` by default) pass `cudaStreamLegacy`,
 *               `(void *)1` (what the Python binding passes for handle 0). For a CPU context only
 *               NULL is accepted.
 *
 * Every kernel, copy and library call of the context's later calls is queued on this stream, so
 * work the caller queues on it afterwards sees their results (tested with a non-blocking stream).
 * Before switching, the call waits (on the host) until the work queued on the previous stream has
 * finished, so that later work cannot overtake it; it does not wait when either stream is in a CUDA
 * graph capture (the wait would end the capture): switching to a capturing stream, or back from one,
 * leaves the order of eager and captured work to the caller, as CUDA's capture rules do. A stream in
 * a capture is taken without the device check (CUDA forbids that query during a capture); one of
 * another device then fails at the first call that launches work (::DST_ERR_BACKEND).
 * @return ::DST_OK; ::DST_ERR_INVALID_ARGUMENT for a NULL context or a stream on a CPU context.
 * Ownership: the caller keeps the stream and must keep it alive while the context uses it.
 * Thread safety: as for the context. @since v0.1
 */
DST_API dst_status dst_context_set_stream(dst_context *ctx, void *stream);

/**
 * @brief The stream a context runs on.
 * @param ctx The context.
 * @param[out] stream Receives the `cudaStream_t` (NULL for a CPU context).
 * @return ::DST_OK or ::DST_ERR_INVALID_ARGUMENT for NULL.
 * Thread safety: as for the context. @since v0.1
 */
DST_API dst_status dst_context_get_stream(const dst_context *ctx, void **stream);

/**
 * @brief Waits until all work the context queued has finished.
 *
 * Then reports a failed device-side argument check of an earlier call, if any (see dst_layer_forward()).
 * @param ctx The context.
 * @return ::DST_OK; ::DST_ERR_INVALID_ARGUMENT for NULL, or for a device-side check of an earlier call that
 *         failed (the message names that call, the argument, the value and its index; reported once);
 *         ::DST_ERR_BACKEND when the device reports an error.
 * Thread safety: as for the context. @since v0.1
 */
DST_API dst_status dst_context_synchronize(dst_context *ctx);

/**
 * @brief Gives the context caller-owned memory for the activation workspace its layers share.
 *
 * By default a context owns its workspace and grows it on demand. With caller memory, a call that
 * needs more than `bytes` fails with ::DST_ERR_CAPACITY (see dst_layer_config_workspace_bytes()).
 * The backend's scratch is carved from this workspace too, so caller memory bounds all of a layer
 * call's temporary device memory.
 * @param ctx The context.
 * @param data Memory in the context's memory space, 256-byte aligned; NULL returns to an owned workspace.
 * @param bytes Size of `data`.
 * @return ::DST_OK or ::DST_ERR_INVALID_ARGUMENT (NULL context, misaligned data).
 * Ownership: the caller keeps `data` and must keep it alive while the context uses it.
 * Thread safety: as for the context. @since v0.1
 */
DST_API dst_status dst_context_set_workspace(dst_context *ctx, void *data, size_t bytes);

/**
 * @brief Current size of the context's workspace.
 * @param ctx The context.
 * @param[out] bytes Receives the size in bytes (0 before the first forward of an owned workspace).
 * @return ::DST_OK or ::DST_ERR_INVALID_ARGUMENT for NULL.
 * Thread safety: as for the context. @since v0.1
 */
DST_API dst_status dst_context_workspace_bytes(const dst_context *ctx, size_t *bytes);

/** @brief Direction of dst_memcpy(). */
typedef DST_ENUM(dst_copy_kind) {
    DST_COPY_HOST_TO_CONTEXT = 0,    /**< Host memory to the context's memory space. */
    DST_COPY_CONTEXT_TO_HOST = 1,    /**< The context's memory space to host memory. */
    DST_COPY_CONTEXT_TO_CONTEXT = 2  /**< Within the context's memory space. */
} dst_copy_kind;

/**
 * @brief Allocates memory in the context's memory space (device memory for CUDA).
 * @param ctx The context.
 * @param bytes Size; 0 gives NULL.
 * @param[out] ptr Receives the memory, 256-byte aligned; NULL on failure.
 * @return ::DST_OK; ::DST_ERR_INVALID_ARGUMENT for NULL; ::DST_ERR_OUT_OF_MEMORY, also for any size above
 *         PTRDIFF_MAX (no allocation can hold it).
 * Ownership: the caller frees it with dst_free() on the same context. Thread safety: as for the context.
 * @since v0.1
 */
DST_API dst_status dst_malloc(dst_context *ctx, size_t bytes, void **ptr);

/**
 * @brief Frees memory from dst_malloc().
 * @param ctx The context it was allocated in.
 * @param ptr The memory, or NULL (no effect).
 * Thread safety: as for the context. @since v0.1
 */
DST_API void dst_free(dst_context *ctx, void *ptr);

/**
 * @brief Copies bytes between host memory and the context's memory space; returns when the copy is done.
 * @param ctx The context.
 * @param dst Destination.
 * @param src Source.
 * @param bytes Number of bytes.
 * @param kind Direction.
 * @return ::DST_OK; ::DST_ERR_INVALID_ARGUMENT (NULL pointers with bytes > 0, unknown kind); ::DST_ERR_BACKEND.
 * Ownership: both buffers stay the caller's. Thread safety: as for the context. @since v0.1
 */
DST_API dst_status dst_memcpy(dst_context *ctx, void *dst, const void *src, size_t bytes, dst_copy_kind kind);

/**
 * @brief Most host threads a context runs its CPU loops on (dst_context_set_num_threads()).
 *
 * OpenMP starts every thread of a parallel region at once and keeps per-thread bookkeeping on the
 * caller's stack; far larger counts exhaust the stack instead of running.
 */
#define DST_MAX_NUM_THREADS 1024

/**
 * @brief Sets how many host threads the context uses for its own loops: the CPU backend's ops, and on
 * every backend the draw of a new layer's initial weights.
 *
 * Results do not depend on the count (every reduction has a fixed order). The GEMMs run on the BLAS
 * library's own threads, which OpenBLAS takes from `OPENBLAS_NUM_THREADS` for the whole process.
 * @param ctx The context.
 * @param threads 1 to ::DST_MAX_NUM_THREADS; 0 restores the default (OpenMP's, normally the number of
 *                cores, capped at ::DST_MAX_NUM_THREADS).
 * @return ::DST_OK or ::DST_ERR_INVALID_ARGUMENT for a NULL context, a negative count or a count above
 *         ::DST_MAX_NUM_THREADS (the count in effect is then unchanged).
 * Thread safety: as for the context. @since v0.1
 */
DST_API dst_status dst_context_set_num_threads(dst_context *ctx, int threads);

/**
 * @brief Reads the host thread count of a context.
 * @param ctx The context.
 * @param[out] threads Receives the count in effect (never 0).
 * @return ::DST_OK or ::DST_ERR_INVALID_ARGUMENT for a NULL argument.
 * Thread safety: as for the context. @since v0.1
 */
DST_API dst_status dst_context_get_num_threads(const dst_context *ctx, int *threads);

/** @brief When the model ops check the index values they are given (dst_context_set_index_checks()). */
typedef DST_ENUM(dst_index_checks) {
    DST_INDEX_CHECKS_EAGER = 0,   /**< Before the call returns; a CUDA context waits for the device (default). */
    DST_INDEX_CHECKS_DEFERRED = 1 /**< On the device, without waiting; a later call reports a failure. */
} dst_index_checks;

/**
 * @brief Chooses when the model ops (@ref modelops) check their index values: token ids and types,
 * row indices and labels.
 *
 * ::DST_INDEX_CHECKS_EAGER (the default): an index out of range (or repeated, where indices must be
 * distinct) is ::DST_ERR_INVALID_ARGUMENT from the call itself, before it writes anything. On a
 * CUDA context that costs one stream synchronisation per index tensor: the host waits for the device
 * to finish all earlier work, and the device then waits for the host to queue more.
 *
 * ::DST_INDEX_CHECKS_DEFERRED: on a CUDA context the check is a kernel queued with the call, which
 * returns ::DST_OK without waiting. A failure is returned once, as ::DST_ERR_INVALID_ARGUMENT naming
 * the earlier call, the tensor, the element and its value, by the first call on the context that
 * starts after the device ran the check (a model op, a final-LayerNorm op, dst_layer_forward() or
 * dst_layer_backward(), before it does anything), or by dst_context_synchronize(). The failing call's
 * outputs are then not meaningful, but its kernels never read or write outside the call's tensors:
 * an index out of range contributes nothing (a gathered or looked-up row reads as zeros, a scattered
 * row is skipped, a label outside [0, V) is ignored). A CPU context checks at once in both modes.
 *
 * Trainers whose data loader has already checked its batches on the host (dst-pretrain does) use the
 * deferred mode to keep the device busy; it is also what lets the model ops be captured in a CUDA graph
 * (@ref modelops).
 * @param ctx The context.
 * @param mode ::DST_INDEX_CHECKS_EAGER or ::DST_INDEX_CHECKS_DEFERRED.
 * @return ::DST_OK or ::DST_ERR_INVALID_ARGUMENT for a NULL context or an unknown mode (the mode in
 *         effect is then unchanged).
 * Thread safety: as for the context. @since v0.1
 */
DST_API dst_status dst_context_set_index_checks(dst_context *ctx, dst_index_checks mode);

/**
 * @brief Reads when the model ops of a context check their index values.
 * @param ctx The context.
 * @param[out] mode Receives ::DST_INDEX_CHECKS_EAGER or ::DST_INDEX_CHECKS_DEFERRED.
 * @return ::DST_OK or ::DST_ERR_INVALID_ARGUMENT for a NULL argument.
 * Thread safety: as for the context. @since v0.1
 */
DST_API dst_status dst_context_get_index_checks(const dst_context *ctx, dst_index_checks *mode);
/** @} */

/**
 * @defgroup config Layer configuration
 * @brief DeepSpeed's `DeepSpeedTransformerConfig` fields that describe the layer, plus dtype, capacity and
 * GELU form (docs/api.md says what stands for `batch_size`, `local_rank`, `fp16` and `return_tuple`).
 * @{
 */
/** @brief Form of the GELU activation. */
typedef DST_ENUM(dst_gelu) {
    DST_GELU_ERF = 0,  /**< Exact: x·Φ(x) (Hugging Face BERT). Default. */
    DST_GELU_TANH = 1  /**< tanh approximation (DeepSpeed's kernel). */
} dst_gelu;

/**
 * @brief Configuration of a layer. Fill with dst_layer_config_default(), then change fields.
 *
 * Boolean fields are int32_t: 0 is false, anything else true.
 */
typedef struct dst_layer_config {
    size_t struct_size;          /**< sizeof(dst_layer_config) of the caller's header; set by default(). Fields are
                                      only ever appended, so a caller built against an older header passes its
                                      smaller size: any size that ends after one of the fields is accepted, and
                                      the fields past it take their defaults. Other sizes are
                                      ::DST_ERR_INVALID_ARGUMENT; a larger size (a newer header) is
                                      ::DST_ERR_UNSUPPORTED. */
    int32_t hidden_size;         /**< H, the model width. Default 1024. */
    int32_t heads;               /**< Attention heads; must divide H. Default 16. */
    int32_t intermediate_size;   /**< FFN width I; 0 means 4·H. Default 0. */
    float attn_dropout_ratio;    /**< Dropout on attention probabilities, in [0, 1). Default 0.1. */
    float hidden_dropout_ratio;  /**< Dropout on both sub-layer outputs, in [0, 1). Default 0.1. */
    int32_t num_hidden_layers;   /**< Layers in the model (for the init rule). Default 24. */
    float initializer_range;     /**< Std. deviation of weight init. Default 0.02. */
    float layer_norm_eps;        /**< LayerNorm ε, added to the variance. Default 1e-12. */
    uint64_t seed;               /**< Seed of the initial weights (Philox key). Default 42. */
    int32_t pre_layer_norm;      /**< 1: Pre-LN, 0: Post-LN. Default 1. */
    int32_t normalize_invertible;    /**< LayerNorm backward from its output; drops LN inputs. Default 0. */
    int32_t gelu_checkpoint;         /**< Keep only the pre-GELU value; recompute GELU. Default 0. */
    int32_t attn_dropout_checkpoint; /**< Accepted for DeepSpeed configs; has no effect: attention is fused and
                                          never keeps anything S×S (docs/memory.md). Default 0. */
    int32_t adjust_init_range;   /**< Scale the output-projection init by 1/sqrt(2·layers). Default 1. */
    int32_t stochastic_mode;     /**< Allow non-deterministic fast paths (CUDA: the attention backward adds its
                                      partial dQs in arrival order instead of a fixed order; results then differ
                                      in the last bits from run to run). Default 0: every backward is
                                      bit-reproducible. */
    int32_t training;            /**< Initial mode: 1 training (dropout, saved state), 0 inference. Default 1. */
    dst_dtype dtype;             /**< Storage type of parameters and activations. Default FP32. */
    int64_t max_batch_tokens;    /**< Largest B·S of any call. Default 8192. */
    int32_t max_seq_len;         /**< Largest S of any call. Default 512. */
    dst_gelu gelu;               /**< GELU form. Default ::DST_GELU_ERF. */
    int32_t causal;              /**< Causal attention (query i sees keys ≤ i). Default 0. */
    int32_t allow_tf32;          /**< Let FP32 GEMMs use TF32 tensor cores (CUDA). Default 0. */
} dst_layer_config;

/**
 * @brief Fills a configuration with the defaults listed on each field.
 *
 * Writes sizeof(dst_layer_config) of the library's own header: a program built against an older,
 * smaller struct that must run with newer libraries fills its fields itself (the library accepts its
 * smaller struct_size, see dst_layer_config::struct_size).
 * @param[out] config The struct to fill; `struct_size` is set to sizeof(dst_layer_config).
 * @return ::DST_OK or ::DST_ERR_INVALID_ARGUMENT for NULL.
 * Thread safety: any thread. @since v0.1
 */
DST_API dst_status dst_layer_config_default(dst_layer_config *config);

/**
 * @brief Checks a configuration for a backend without allocating anything.
 * @param config The configuration.
 * @param backend Backend it is meant for (::DST_BACKEND_AUTO checks the generic rules only).
 * @return ::DST_OK; ::DST_ERR_INVALID_ARGUMENT with the offending field in dst_last_error();
 *         ::DST_ERR_UNSUPPORTED when the values are valid but the backend cannot run them.
 * Thread safety: any thread. @since v0.1
 */
DST_API dst_status dst_layer_config_validate(const dst_layer_config *config, dst_backend backend);

/**
 * @brief Bytes of activations one training forward keeps for backward with this configuration.
 * @param config The configuration (its three memory switches and dtype count).
 * @param batch B of the call, ≥ 1.
 * @param seq S of the call, ≥ 1.
 * @param[out] bytes Receives the size of everything a ::dst_saved holds after such a forward.
 * @return ::DST_OK or ::DST_ERR_INVALID_ARGUMENT (invalid configuration, sizes or NULL).
 * Thread safety: any thread. @since v0.1
 */
DST_API dst_status dst_layer_config_saved_bytes(const dst_layer_config *config, int64_t batch,
                                                int64_t seq, size_t *bytes);
/**
 * @brief Bytes of workspace a call with this configuration needs (the largest of forward and backward).
 *
 * The count covers all temporary device memory of a layer call: the layer's own buffers and the
 * backend's scratch (on CUDA: the cuBLASLt workspace, the additive mask converted to fp32, the
 * attention backward's row statistics, fp32 dQ accumulator and reduction counters). It is the CUDA
 * backend's need, the larger one; a CPU layer uses less of it.
 * @param config The configuration.
 * @param batch B of the call, ≥ 1.
 * @param seq S of the call, ≥ 1.
 * @param[out] bytes Receives the size; give at least this much to dst_context_set_workspace().
 * @return ::DST_OK or ::DST_ERR_INVALID_ARGUMENT (invalid configuration, sizes or NULL).
 * Thread safety: any thread. @since v0.1
 */
DST_API dst_status dst_layer_config_workspace_bytes(const dst_layer_config *config, int64_t batch,
                                                    int64_t seq, size_t *bytes);
/** @} */

/**
 * @defgroup layer Layers
 * @brief Creating a layer, its parameters and gradients.
 * @{
 */
/** @brief Opaque layer handle. */
typedef struct dst_layer dst_layer;

/** @brief Parameter identifiers, in DeepSpeed's order. */
typedef DST_ENUM(dst_param) {
    DST_PARAM_ATTN_QKVW = 0,  /**< `attn_qkvw` [3H, H]: rows Q, then K, then V; head h owns rows h·d…h·d+d−1 of each. */
    DST_PARAM_ATTN_QKVB = 1,  /**< `attn_qkvb` [3H]. */
    DST_PARAM_ATTN_OW = 2,    /**< `attn_ow` [H, H], attention output projection. */
    DST_PARAM_ATTN_OB = 3,    /**< `attn_ob` [H]. */
    DST_PARAM_ATTN_NW = 4,    /**< `attn_nw` [H], γ of the LayerNorm after the attention residual. */
    DST_PARAM_ATTN_NB = 5,    /**< `attn_nb` [H], β of that LayerNorm. */
    DST_PARAM_INTER_W = 6,    /**< `inter_w` [I, H], FFN up-projection. */
    DST_PARAM_INTER_B = 7,    /**< `inter_b` [I]. */
    DST_PARAM_OUTPUT_W = 8,   /**< `output_w` [H, I], FFN down-projection. */
    DST_PARAM_OUTPUT_B = 9,   /**< `output_b` [H]. */
    DST_PARAM_NORM_W = 10,    /**< `norm_w` [H]: γ of the input LN (Pre-LN) or of the final LN (Post-LN). */
    DST_PARAM_NORM_B = 11,    /**< `norm_b` [H]. */
    DST_PARAM_COUNT = 12      /**< Number of parameters. */
} dst_param;

/** @brief Where one parameter lives in the layer's arena (gradients use the same layout). */
typedef struct dst_param_info {
    const char *name;        /**< DeepSpeed name, e.g. "attn_qkvw"; static string. */
    int32_t ndim;            /**< 1 or 2. */
    int64_t shape[2];        /**< Row-major shape ([out, in] for weights). */
    int64_t numel;           /**< Number of elements. */
    size_t offset_bytes;     /**< Byte offset from the start of the arena (multiple of 256). */
    size_t size_bytes;       /**< numel × dtype size. */
} dst_param_info;

/**
 * @brief Creates a layer and initialises its parameters.
 *
 * Weights are drawn from N(0, initializer_range) with a Philox stream keyed by `config->seed`
 * (identical on every backend); `attn_ow` and `output_w` use initializer_range/sqrt(2·num_hidden_layers)
 * when `adjust_init_range` is set; biases are 0, LayerNorm γ 1 and β 0. The layer gets the next
 * layer id of its context (0, 1, 2, …).
 * @param ctx The context; the layer keeps it alive.
 * @param config The configuration; copied.
 * @param[out] out Receives the layer; unchanged on failure.
 * @return ::DST_OK; ::DST_ERR_INVALID_ARGUMENT (see dst_layer_config_validate()); ::DST_ERR_UNSUPPORTED;
 *         ::DST_ERR_OUT_OF_MEMORY.
 * Ownership: the caller owns the layer and frees it with dst_layer_destroy().
 * Thread safety: not concurrently with other calls on the same context. @since v0.1
 */
DST_API dst_status dst_layer_create(dst_context *ctx, const dst_layer_config *config, dst_layer **out);

/**
 * @brief Destroys a layer, its arenas (unless caller-bound), its default saved activations and workspace.
 * @param layer The layer, or NULL (no effect). ::dst_saved objects created for it must be destroyed first.
 * Thread safety: not concurrently with other calls on the layer. @since v0.1
 */
DST_API void dst_layer_destroy(dst_layer *layer);

/**
 * @brief Copies the layer's configuration (with `intermediate_size` resolved).
 * @param layer The layer.
 * @param[out] config Receives the configuration; its `struct_size` must be set by the caller
 *             (dst_layer_config_default() does) and only that many bytes are written (an older header's
 *             smaller struct receives the fields it has).
 * @return ::DST_OK; ::DST_ERR_INVALID_ARGUMENT (NULL, or a struct_size that is no layout of the struct);
 *         ::DST_ERR_UNSUPPORTED (a struct_size larger than this library's). Nothing is written on failure.
 * Thread safety: as for the layer. @since v0.1
 */
DST_API dst_status dst_layer_get_config(const dst_layer *layer, dst_layer_config *config);

/**
 * @brief The layer's id within its context, in creation order from 0 (DeepSpeed's `layer_id`).
 * @param layer The layer.
 * @param[out] id Receives the id.
 * @return ::DST_OK or ::DST_ERR_INVALID_ARGUMENT for NULL.
 * Thread safety: as for the layer. @since v0.1
 */
DST_API dst_status dst_layer_get_id(const dst_layer *layer, int *id);

/**
 * @brief Switches between training (dropout on, activations saved) and inference.
 * @param layer The layer.
 * @param training Non-zero for training.
 * @return ::DST_OK or ::DST_ERR_INVALID_ARGUMENT for NULL.
 * Thread safety: as for the layer. @since v0.1
 */
DST_API dst_status dst_layer_set_training(dst_layer *layer, int training);

/**
 * @brief Looks up a parameter by name.
 *
 * Accepts DeepSpeed's names ("attn_qkvw" … "norm_b"), optionally after a prefix ending in '.'
 * (e.g. "bert.encoder.layer.3.attn_qkvw").
 * @param name NUL-terminated name.
 * @param[out] param Receives the ::dst_param.
 * @return ::DST_OK; ::DST_ERR_INVALID_ARGUMENT for NULL or an unknown name.
 * Thread safety: any thread. @since v0.1
 */
DST_API dst_status dst_param_lookup(const char *name, dst_param *param);

/**
 * @brief Shape and arena position of a parameter (and of its gradient).
 * @param layer The layer.
 * @param param The parameter.
 * @param[out] info Receives the description; `info->name` is a static string.
 * @return ::DST_OK or ::DST_ERR_INVALID_ARGUMENT (NULL, or `param` out of range).
 * Thread safety: as for the layer. @since v0.1
 */
DST_API dst_status dst_layer_param_info(const dst_layer *layer, dst_param param, dst_param_info *info);

/**
 * @brief Size of the parameter arena (and of the gradient arena) in bytes.
 * @param layer The layer.
 * @param[out] bytes Receives the size; parameters are 256-byte aligned inside it.
 * @return ::DST_OK or ::DST_ERR_INVALID_ARGUMENT for NULL.
 * Thread safety: as for the layer. @since v0.1
 */
DST_API dst_status dst_layer_arena_bytes(const dst_layer *layer, size_t *bytes);

/**
 * @brief The parameter arena: all 12 parameters in one buffer (see dst_layer_param_info()).
 * @param layer The layer.
 * @param[out] data Receives the arena pointer, in the context's memory space.
 * @return ::DST_OK or ::DST_ERR_INVALID_ARGUMENT for NULL.
 * Ownership: owned by the layer (or by the caller, once bound); valid until the layer is destroyed
 * or another arena is bound. The caller may read and write it between calls (an optimizer step).
 * Thread safety: as for the layer. @since v0.1
 */
DST_API dst_status dst_layer_param_arena(dst_layer *layer, void **data);

/**
 * @brief The gradient arena: same layout as the parameter arena.
 * @param layer The layer.
 * @param[out] data Receives the arena pointer, in the context's memory space.
 * @return ::DST_OK or ::DST_ERR_INVALID_ARGUMENT for NULL.
 * Ownership: as for dst_layer_param_arena(). Thread safety: as for the layer. @since v0.1
 */
DST_API dst_status dst_layer_grad_arena(dst_layer *layer, void **data);

/**
 * @brief Makes the layer use caller-owned memory for its parameters.
 * @param layer The layer.
 * @param data Caller memory in the context's memory space, at least dst_layer_arena_bytes() bytes,
 *             aligned to 256 bytes.
 * @param bytes Size of `data` in bytes.
 * @param copy_current Non-zero: the current parameter values are copied into `data` first.
 *                     Zero: `data` is taken as it is (it must hold valid parameters).
 * @return ::DST_OK; ::DST_ERR_INVALID_ARGUMENT for NULL, a short buffer, misalignment, or memory whose first
 *         dst_layer_arena_bytes() bytes overlap the layer's current parameter or gradient arena (binding
 *         the caller-owned parameter arena that is bound already is allowed and changes nothing); on
 *         failure nothing changes.
 * Ownership: the caller keeps ownership and must keep `data` alive while the layer uses it; the
 * layer's own arena is freed. Thread safety: as for the layer. @since v0.1
 */
DST_API dst_status dst_layer_bind_param_arena(dst_layer *layer, void *data, size_t bytes, int copy_current);

/**
 * @brief Makes the layer use caller-owned memory for its gradients.
 * @param layer The layer.
 * @param data Caller memory as for dst_layer_bind_param_arena().
 * @param bytes Size of `data` in bytes.
 * @return ::DST_OK; ::DST_ERR_INVALID_ARGUMENT for NULL, a short buffer, misalignment, or an overlap with the
 *         layer's current arenas as for dst_layer_bind_param_arena(); on failure nothing changes.
 * Ownership: as for dst_layer_bind_param_arena(); the contents are taken as they are.
 * Thread safety: as for the layer. @since v0.1
 */
DST_API dst_status dst_layer_bind_grad_arena(dst_layer *layer, void *data, size_t bytes);

/**
 * @brief Copies host data into one parameter, converting between floating dtypes.
 * @param layer The layer.
 * @param name Parameter name as accepted by dst_param_lookup().
 * @param src Host memory with `count` elements of `dtype`.
 * @param dtype ::DST_DTYPE_FP32, FP16, BF16 or FP64.
 * @param count Must equal the parameter's element count.
 * @return ::DST_OK; ::DST_ERR_INVALID_ARGUMENT (NULL, unknown name, wrong count or dtype).
 * Ownership: `src` stays the caller's and may be freed after the return. Thread safety: as for the layer.
 * @since v0.1
 */
DST_API dst_status dst_layer_set_param(dst_layer *layer, const char *name, const void *src,
                                       dst_dtype dtype, size_t count);

/**
 * @brief Copies one parameter into host memory, converting to `dtype`.
 * @param layer The layer.
 * @param name Parameter name as accepted by dst_param_lookup().
 * @param dst Host memory for `count` elements of `dtype`.
 * @param dtype ::DST_DTYPE_FP32, FP16, BF16 or FP64.
 * @param count Must equal the parameter's element count.
 * @return ::DST_OK; ::DST_ERR_INVALID_ARGUMENT (NULL, unknown name, wrong count or dtype).
 * Ownership: `dst` is the caller's. Thread safety: as for the layer. @since v0.1
 */
DST_API dst_status dst_layer_get_param(const dst_layer *layer, const char *name, void *dst,
                                       dst_dtype dtype, size_t count);

/**
 * @brief Copies the gradient of one parameter into host memory, converting to `dtype`.
 * @param layer The layer.
 * @param name Parameter name as accepted by dst_param_lookup().
 * @param dst Host memory for `count` elements of `dtype`.
 * @param dtype ::DST_DTYPE_FP32, FP16, BF16 or FP64.
 * @param count Must equal the parameter's element count.
 * @return ::DST_OK; ::DST_ERR_INVALID_ARGUMENT (NULL, unknown name, wrong count or dtype).
 * Ownership: `dst` is the caller's. Thread safety: as for the layer. @since v0.1
 */
DST_API dst_status dst_layer_get_grad(const dst_layer *layer, const char *name, void *dst,
                                      dst_dtype dtype, size_t count);

/**
 * @brief Sets every gradient to zero.
 * @param layer The layer.
 * @return ::DST_OK or ::DST_ERR_INVALID_ARGUMENT for NULL.
 * Thread safety: as for the layer. @since v0.1
 */
DST_API dst_status dst_layer_zero_grads(dst_layer *layer);
/** @} */

/**
 * @defgroup run Forward and backward
 * @brief Running the layer; masks; saved activations.
 * @{
 */
/** @brief Kind of attention mask. */
typedef DST_ENUM(dst_mask_kind) {
    DST_MASK_NONE = 0,         /**< Every key is visible. */
    DST_MASK_ADDITIVE = 1,     /**< Added to the scores: tensor [B, S] or [B, 1, 1, S], layer dtype or FP32. */
    DST_MASK_KEY_LENGTHS = 2   /**< Keys j ≥ len[b] are masked: tensor int32 [B], values in 1..S. */
} dst_mask_kind;

/** @brief An attention mask: its kind and its data (ignored for ::DST_MASK_NONE). */
typedef struct dst_mask {
    dst_mask_kind kind;  /**< Kind of mask. */
    dst_tensor tensor;   /**< The mask data, in the context's memory space. */
} dst_mask;

/** @brief How backward stores parameter gradients. */
typedef DST_ENUM(dst_grad_mode) {
    DST_GRAD_WRITE = 0,       /**< Overwrite the gradient arena. */
    DST_GRAD_ACCUMULATE = 1   /**< Add to the gradient arena (gradient accumulation). */
} dst_grad_mode;

/**
 * @brief Opaque holder of the activations that one training forward keeps for its backward.
 *
 * Hold one per micro-batch to have several forwards in flight; each layer also has a default one.
 */
typedef struct dst_saved dst_saved;

/**
 * @brief Creates an empty saved-activations object for a layer.
 * @param layer The layer it will serve.
 * @param[out] out Receives the object; unchanged on failure.
 * @return ::DST_OK; ::DST_ERR_INVALID_ARGUMENT for NULL; ::DST_ERR_OUT_OF_MEMORY.
 * Ownership: the caller owns it and destroys it (before the layer) with dst_saved_destroy(). Memory is
 * allocated by the forward that fills it and kept for the next forward into the same object (grown when
 * too small): reuse objects across steps, since on a CUDA context freeing device memory
 * (dst_saved_release(), dst_saved_destroy()) waits for the device. Thread safety: as for the layer.
 * @since v0.1
 */
DST_API dst_status dst_saved_create(dst_layer *layer, dst_saved **out);

/**
 * @brief Destroys a saved-activations object and its memory.
 * @param saved The object, or NULL (no effect). Thread safety: as for its layer. @since v0.1
 */
DST_API void dst_saved_destroy(dst_saved *saved);

/**
 * @brief Frees the memory a saved-activations object holds; it must be filled again before a backward.
 * @param saved The object.
 * @return ::DST_OK or ::DST_ERR_INVALID_ARGUMENT for NULL.
 * Thread safety: as for its layer. @since v0.1
 */
DST_API dst_status dst_saved_release(dst_saved *saved);

/**
 * @brief Bytes of activations a saved-activations object currently holds.
 * @param saved The object.
 * @param[out] bytes Receives the size (0 when empty).
 * @return ::DST_OK or ::DST_ERR_INVALID_ARGUMENT for NULL.
 * Thread safety: as for its layer. @since v0.1
 */
DST_API dst_status dst_saved_bytes(const dst_saved *saved, size_t *bytes);

/**
 * @brief Runs the layer forward on a batch.
 *
 * In training mode dropout is applied with the context's next RNG offsets and the activations needed
 * by backward are kept in `saved`; in inference mode nothing is kept and the RNG does not advance.
 * @param layer The layer.
 * @param saved Where to keep activations (training only); NULL means the layer's default object.
 * @param input [B, S, H] in the layer dtype; 1 ≤ S ≤ max_seq_len and B·S ≤ max_batch_tokens.
 * @param mask The attention mask, or NULL for none.
 * @param output [B, S, H] in the layer dtype; may not overlap `input`.
 * @return ::DST_OK; ::DST_ERR_INVALID_ARGUMENT (NULL, shape, dtype, mask kind/shape/values, or a failed
 *         device-side check of an earlier call); ::DST_ERR_CAPACITY; ::DST_ERR_STATE (training, and the
 *         context's RNG offset is exhausted: see dst_context_set_rng_state(); or an allocation needed
 *         while the stream captures a CUDA graph); ::DST_ERR_OUT_OF_MEMORY; ::DST_ERR_BACKEND. Every check and allocation
 *         happens before the first write, so on failure `output` and `saved` are unchanged — except
 *         after ::DST_ERR_BACKEND, a device or library failure in the middle of the computation.
 *
 * Device-side checks: forward and backward never wait for the device. On a CUDA context the values
 * of a key-length mask (1..S) and, in backward with normalize_invertible, the LayerNorm γ (non-zero)
 * are checked by a kernel queued with the call; the call returns ::DST_OK and a failure is returned
 * once, as ::DST_ERR_INVALID_ARGUMENT naming the call, the argument, the value and its index, by the
 * first call on the context that starts after the device ran the check (dst_layer_forward(),
 * dst_layer_backward(), a model op or a final-LayerNorm op, before it does anything), or by
 * dst_context_synchronize(). The failing call's outputs are
 * then not meaningful, but nothing outside them is written (the kernels clamp lengths to 0..S). The
 * CPU backend checks these values before the call writes anything and returns the failure itself.
 * (The first FP16/BF16 call of a new GEMM size on a CUDA context waits once while it times cuBLASLt's
 * algorithms of one summation order, which give the same bits; later calls of that size do not wait.)
 *
 * CUDA graphs: the calls can be captured on a stream set with dst_context_set_stream() once an eager
 * call of the same shapes has sized the workspace and `saved` (and, for a layer with dropout, made the
 * context's graph dropout counter); a call that would allocate while capturing fails with
 * ::DST_ERR_STATE and queues nothing. A captured training forward with dropout takes its dropout
 * offsets from that counter as it runs, so every replay draws new masks (docs/rng.md).
 * Ownership: all tensors stay the caller's; `input` and `mask` are copied as needed, so they may be
 * reused after the return. Thread safety: as for the layer. @since v0.1
 */
DST_API dst_status dst_layer_forward(dst_layer *layer, dst_saved *saved, const dst_tensor *input,
                                     const dst_mask *mask, dst_tensor *output);

/**
 * @brief Runs the layer backward for the forward recorded in `saved`.
 *
 * Writes dX and the 12 parameter gradients (into the gradient arena, overwriting or accumulating).
 * `saved` stays valid, so backward may be repeated.
 * @param layer The layer.
 * @param saved The object filled by a training forward; NULL means the layer's default object.
 * @param grad_output dL/dY, [B, S, H] with the B and S of that forward, in the layer dtype.
 * @param grad_input dL/dX, [B, S, H] in the layer dtype; may not overlap `grad_output`.
 * @param mode ::DST_GRAD_WRITE or ::DST_GRAD_ACCUMULATE.
 * @return ::DST_OK; ::DST_ERR_INVALID_ARGUMENT (NULL, shape, dtype, mode; a zero LayerNorm γ with
 *         normalize_invertible, on CUDA reported by a later call: see dst_layer_forward(); a failed
 *         device-side check of an earlier call); ::DST_ERR_STATE (no matching training forward);
 *         ::DST_ERR_OUT_OF_MEMORY; ::DST_ERR_BACKEND. Every check and allocation happens before the
 *         first write, so on failure `grad_input` and the gradient arena are unchanged — except after
 *         ::DST_ERR_BACKEND, a device or library failure in the middle of the computation.
 * Ownership: all tensors stay the caller's. Thread safety: as for the layer. @since v0.1
 */
DST_API dst_status dst_layer_backward(dst_layer *layer, dst_saved *saved, const dst_tensor *grad_output,
                                      dst_tensor *grad_input, dst_grad_mode mode);

/**
 * @brief Runs the layer forward on packed sequences: B sequences laid end to end, no padding.
 *
 * Sequence b is rows `cu_seqlens[b]` .. `cu_seqlens[b+1] - 1` of `input` (attention stays within a
 * sequence; causal applies within it). The layer runs on the N rows: its GEMMs and elementwise passes
 * cover N tokens and attention works in the packed layout. Each row gets what dst_layer_forward()
 * gives it in a padded [B, max_seqlen, H] batch with key lengths `cu_seqlens[b+1] - cu_seqlens[b]`, up
 * to the rounding of GEMMs over another row count, with the same dropout masks for the same RNG state
 * (dropout elements are numbered in that padded layout). B·max_seqlen must fit max_batch_tokens; the
 * saved activations are those of N tokens plus the attention's row statistics [B, heads, max_seqlen]
 * and B + N int32 (counted by dst_saved_bytes()). The offsets are checked as dst_layer_forward()
 * checks key lengths: at once on the CPU backend, on the device on CUDA (reported by a later call).
 * @param layer The layer.
 * @param saved As for dst_layer_forward(); a later backward must be dst_layer_backward_packed().
 * @param input [N, H] in the layer dtype, N ≥ B.
 * @param cu_seqlens int32 [B + 1] in context memory: 0 = cu_seqlens[0] < … < cu_seqlens[B] = N.
 * @param max_seqlen At least every sequence's length, 1..max_seq_len.
 * @param output [N, H] in the layer dtype; may not overlap `input`.
 * @return As dst_layer_forward(): ::DST_OK; ::DST_ERR_INVALID_ARGUMENT (NULL, shapes, dtypes, offsets);
 *         ::DST_ERR_CAPACITY (max_seqlen above max_seq_len, B·max_seqlen above max_batch_tokens);
 *         ::DST_ERR_UNSUPPORTED; ::DST_ERR_STATE; ::DST_ERR_OUT_OF_MEMORY; ::DST_ERR_BACKEND.
 * Ownership: all tensors stay the caller's. Thread safety: as for the layer. @since v0.1
 */
DST_API dst_status dst_layer_forward_packed(dst_layer *layer, dst_saved *saved, const dst_tensor *input,
                                            const dst_tensor *cu_seqlens, int64_t max_seqlen, dst_tensor *output);

/**
 * @brief Runs the layer backward for the packed forward recorded in `saved`.
 * @param layer The layer.
 * @param saved The object filled by dst_layer_forward_packed() in training mode; NULL: the default object.
 * @param grad_output dL/dY, [N, H] with the N of that forward.
 * @param grad_input dL/dX, [N, H]; may not overlap `grad_output`.
 * @param mode ::DST_GRAD_WRITE or ::DST_GRAD_ACCUMULATE (for the gradient arena; dX is written).
 * @return As dst_layer_backward(); ::DST_ERR_STATE also when `saved` holds a padded forward.
 * Ownership: all tensors stay the caller's. Thread safety: as for the layer. @since v0.1
 */
DST_API dst_status dst_layer_backward_packed(dst_layer *layer, dst_saved *saved, const dst_tensor *grad_output,
                                             dst_tensor *grad_input, dst_grad_mode mode);
/** @} */

/**
 * @defgroup layernorm Final LayerNorm of a Pre-LN stack
 * @brief A standalone LayerNorm over the last dimension, for the LN a Pre-LN model needs after its
 * last layer (Pre-LN layers normalise their inputs, not their outputs).
 *
 * Statistics in fp32 (fp64 for fp64 data), population variance: y = γ·(x − mean)/sqrt(var + eps) + β.
 * @{
 */
/**
 * @brief LayerNorm forward over the last dimension of `x`.
 * @param ctx The context; every tensor is in its memory space.
 * @param x Input [..., H] (ndim 1..4) in fp32, fp16, bf16 or fp64; N = product of the leading dims.
 * @param gamma γ [H], dtype of `x`.
 * @param beta β [H], dtype of `x`.
 * @param eps Added to the variance; finite and > 0.
 * @param y Output, same shape and dtype as `x`; may not overlap it.
 * @param stats Where backward's statistics go: [2, N] (mean, then 1/σ) in fp32, or fp64 for fp64
 *              data; NULL when no backward follows.
 * @return ::DST_OK; ::DST_ERR_INVALID_ARGUMENT (NULL, dtype, shape, overlap, eps); ::DST_ERR_BACKEND.
 *         On failure `y` and `stats` are unchanged except after ::DST_ERR_BACKEND.
 * Ownership: all tensors stay the caller's. Thread safety: as for the context. @since v0.1
 */
DST_API dst_status dst_layernorm_forward(dst_context *ctx, const dst_tensor *x, const dst_tensor *gamma,
                                         const dst_tensor *beta, float eps, dst_tensor *y, dst_tensor *stats);

/**
 * @brief LayerNorm backward: dX and the γ/β gradients, from the input and the forward's statistics.
 * @param ctx The context.
 * @param dy Gradient of the output, shape and dtype of `x`.
 * @param x The forward's input.
 * @param gamma γ [H].
 * @param beta β [H] (read for its shape and dtype).
 * @param stats The [2, N] statistics dst_layernorm_forward() wrote for this `x`.
 * @param dx Gradient of the input, shape and dtype of `x`; may not overlap `dy` or `x`.
 * @param dgamma Gradient of γ [H].
 * @param dbeta Gradient of β [H].
 * @param mode ::DST_GRAD_WRITE or ::DST_GRAD_ACCUMULATE (for `dgamma` and `dbeta`; `dx` is written).
 * @return ::DST_OK; ::DST_ERR_INVALID_ARGUMENT (NULL, dtype, shape, overlap, mode); ::DST_ERR_BACKEND.
 *         On failure the outputs are unchanged except after ::DST_ERR_BACKEND.
 * Ownership: all tensors stay the caller's. Thread safety: as for the context. @since v0.1
 */
DST_API dst_status dst_layernorm_backward(dst_context *ctx, const dst_tensor *dy, const dst_tensor *x,
                                          const dst_tensor *gamma, const dst_tensor *beta, const dst_tensor *stats,
                                          dst_tensor *dx, dst_tensor *dgamma, dst_tensor *dbeta, dst_grad_mode mode);
/** @} */

/**
 * @defgroup modelops Model ops for BERT pre-training
 * @brief The ops a BERT-for-pre-training model needs around its layers: the embeddings, dense layers
 * (the MLM transform, the pooler), row gathers and scatters, and a linear layer fused with
 * cross-entropy (the MLM decoder with its loss at the masked positions only, and the NSP classifier).
 *
 * Every op runs on a context: tensors are in its memory space (device memory for a CUDA context,
 * host memory for a CPU one) and all float tensors of one call share one dtype (fp32, fp16, bf16 or
 * fp64), in which they are stored; arithmetic is in fp32 (fp64 for fp64 data) with one rounding on
 * store, as for the layer. Integer inputs (token ids, token types, row indices, labels) are int32.
 *
 * Gradients follow the layer's rule: an op's input gradient (`dx`, `dhidden`) is written; parameter
 * gradients (tables, weights, biases) are written or added according to a ::dst_grad_mode, so that a
 * tied weight (the word embedding, which is also the MLM decoder) collects both contributions.
 *
 * Indices are checked: an id, type, row or label outside its range is ::DST_ERR_INVALID_ARGUMENT
 * naming the tensor, the element and the value, and nothing is written. On a CUDA context the check
 * runs on the device and the call waits for its one-word answer (one stream synchronisation per
 * index tensor), unless the context defers index checks (dst_context_set_index_checks(): the call
 * then does not wait, and a later call reports a failure). Every op starts by reporting a failed
 * device-side check of an earlier call on the context, as dst_layer_forward() does.
 *
 * CUDA graphs: with deferred index checks every op can be captured on a stream set with
 * dst_context_set_stream() (each replay checks the indices again), once an eager call of the same
 * sizes has grown the workspace; with eager checks an op that takes indices is refused on a capturing
 * stream with ::DST_ERR_UNSUPPORTED before it queues anything, so the capture stays valid, and so is
 * dst_dropout_forward() with p > 0.
 * Every op is deterministic: two calls with the same inputs give
 * bit-identical outputs (no floating-point atomics; docs/model-ops.md).
 *
 * Scratch memory comes from the context's workspace; dst_model_op_workspace_bytes() gives what a call
 * needs, for a caller-owned workspace (dst_context_set_workspace()).
 * @{
 */
/** @brief Activation applied after a dense layer's bias. */
typedef DST_ENUM(dst_activation) {
    DST_ACTIVATION_NONE = 0,      /**< y = u. */
    DST_ACTIVATION_GELU_ERF = 1,  /**< y = u·Φ(u), the exact GELU (Hugging Face BERT's MLM transform). */
    DST_ACTIVATION_GELU_TANH = 2, /**< The tanh approximation of GELU. */
    DST_ACTIVATION_TANH = 3       /**< y = tanh(u) (BERT's pooler). */
} dst_activation;

/**
 * @brief Embedding lookup: out[b,s] = word[ids[b,s]] + position[s] + type[types[b,s]].
 *
 * The sum is formed in the compute type and rounded once. Positions are 0…S−1 for every sequence.
 * A LayerNorm (dst_layernorm_forward()) and dropout usually follow; they are not part of this op.
 * @param ctx The context; every tensor is in its memory space.
 * @param ids Token ids, int32 [B, S], each in [0, V).
 * @param types Token types (segment ids), int32 [B, S], each in [0, T); NULL: all 0.
 * @param word Word embedding table [V, H] (fp32, fp16, bf16 or fp64).
 * @param position Position table [P, H] with P ≥ S, dtype of `word`.
 * @param type Token-type table [T, H], dtype of `word`.
 * @param out Output [B, S, H], dtype of `word`; may not overlap any input.
 * @return ::DST_OK; ::DST_ERR_INVALID_ARGUMENT (NULL, dtype, shape, overlap, an id or type out of range:
 *         the message names the element); ::DST_ERR_BACKEND. On failure `out` is unchanged except after
 *         ::DST_ERR_BACKEND.
 * Ownership: all tensors stay the caller's. Thread safety: as for the context. @since v0.1
 */
DST_API dst_status dst_embedding_forward(dst_context *ctx, const dst_tensor *ids, const dst_tensor *types,
                                         const dst_tensor *word, const dst_tensor *position,
                                         const dst_tensor *type, dst_tensor *out);

/**
 * @brief Embedding backward: scatter-adds the output gradient into the three tables.
 *
 * dword[v] = Σ over tokens with id v of dout[token], dposition[s] = Σ_b dout[b,s],
 * dtype[t] = Σ over tokens of type t, each sum taken in token order (b·S + s) in the compute type and
 * rounded once; with ::DST_GRAD_WRITE every row of a table is written (rows no token uses get 0),
 * with ::DST_GRAD_ACCUMULATE the sums are added to the rows the tokens use and the other rows keep
 * their values. Deterministic on every backend (docs/model-ops.md says how the CUDA kernels order
 * the sums without atomics).
 * @param ctx The context.
 * @param dout Gradient of the output, [B, S, H].
 * @param ids The forward's token ids, int32 [B, S].
 * @param types The forward's token types, int32 [B, S], or NULL (all 0).
 * @param dword Gradient of the word table [V, H], or NULL to skip it.
 * @param dposition Gradient of the position table [P, H] (P ≥ S), or NULL to skip it.
 * @param dtype Gradient of the token-type table [T, H] (T ≤ 65535), or NULL to skip it.
 * @param mode ::DST_GRAD_WRITE or ::DST_GRAD_ACCUMULATE.
 * @return ::DST_OK; ::DST_ERR_INVALID_ARGUMENT (NULL `dout`/`ids`, dtype, shape, overlap, mode, ids or
 *         types out of range for the tables given); ::DST_ERR_CAPACITY (a caller-owned workspace that
 *         is too small); ::DST_ERR_OUT_OF_MEMORY; ::DST_ERR_BACKEND. On failure the tables are unchanged
 *         except after ::DST_ERR_BACKEND.
 * Ownership: all tensors stay the caller's. Thread safety: as for the context. @since v0.1
 */
DST_API dst_status dst_embedding_backward(dst_context *ctx, const dst_tensor *dout, const dst_tensor *ids,
                                          const dst_tensor *types, dst_tensor *dword, dst_tensor *dposition,
                                          dst_tensor *dtype, dst_grad_mode mode);

/**
 * @brief Dense layer: u = x·Wᵀ + b (nn.Linear convention, W is [M, K]), y = act(u).
 *
 * u is rounded to the storage dtype before the activation, so a backward from the `pre_act` this call
 * wrote sees exactly the forward's value.
 * @param ctx The context.
 * @param x Input [..., K] (ndim 1..4); N = product of the leading dims.
 * @param w Weight [M, K], dtype of `x`.
 * @param b Bias [M], dtype of `x`, or NULL for none.
 * @param activation The activation.
 * @param y Output [..., M] with the leading dims of `x`; may not overlap `x`, `w` or `b`.
 * @param pre_act Where u goes ([..., M] like `y`), or NULL; dst_dense_backward() needs it when the
 *        activation is not ::DST_ACTIVATION_NONE.
 * @return ::DST_OK; ::DST_ERR_INVALID_ARGUMENT (NULL, dtype, shape, overlap, activation);
 *         ::DST_ERR_CAPACITY; ::DST_ERR_OUT_OF_MEMORY; ::DST_ERR_BACKEND.
 *         On failure the outputs are unchanged except after ::DST_ERR_BACKEND.
 * Ownership: all tensors stay the caller's. Thread safety: as for the context. @since v0.1
 */
DST_API dst_status dst_dense_forward(dst_context *ctx, const dst_tensor *x, const dst_tensor *w,
                                     const dst_tensor *b, dst_activation activation, dst_tensor *y,
                                     dst_tensor *pre_act);

/**
 * @brief Dense layer backward: du = dy·act'(u), dx = du·W, dW = duᵀ·x, db = Σ_rows du.
 * @param ctx The context.
 * @param dy Gradient of the output, [..., M].
 * @param x The forward's input [..., K].
 * @param w Weight [M, K].
 * @param pre_act The forward's u (shape of `dy`); required unless the activation is ::DST_ACTIVATION_NONE
 *        (then it must be NULL or is ignored).
 * @param activation The forward's activation.
 * @param dx Gradient of the input (shape of `x`, written), or NULL.
 * @param dw Gradient of W [M, K], or NULL.
 * @param db Gradient of b [M], or NULL.
 * @param mode ::DST_GRAD_WRITE or ::DST_GRAD_ACCUMULATE for `dw` and `db` (`dx` is written).
 * @return ::DST_OK; ::DST_ERR_INVALID_ARGUMENT (NULL, dtype, shape, overlap, activation, mode, a missing
 *         `pre_act`); ::DST_ERR_CAPACITY; ::DST_ERR_OUT_OF_MEMORY; ::DST_ERR_BACKEND.
 *         On failure the outputs are unchanged except after ::DST_ERR_BACKEND.
 * Ownership: all tensors stay the caller's. Thread safety: as for the context. @since v0.1
 */
DST_API dst_status dst_dense_backward(dst_context *ctx, const dst_tensor *dy, const dst_tensor *x,
                                      const dst_tensor *w, const dst_tensor *pre_act, dst_activation activation,
                                      dst_tensor *dx, dst_tensor *dw, dst_tensor *db, dst_grad_mode mode);

/**
 * @brief Gathers rows: dst[i] = src[index[i]] (the masked tokens before the MLM head, the [CLS]
 * rows before the pooler).
 * @param ctx The context.
 * @param src Source [N, H] (ndim 2; a [B, S, H] tensor is viewed as [B·S, H] by the caller).
 * @param index Row indices, int32 [M], each in [0, N); repeats are allowed.
 * @param dst Destination [M, H], dtype of `src`; may not overlap it.
 * @return ::DST_OK; ::DST_ERR_INVALID_ARGUMENT (NULL, dtype, shape, overlap, an index out of range);
 *         ::DST_ERR_BACKEND. On failure `dst` is unchanged except after ::DST_ERR_BACKEND.
 * Ownership: all tensors stay the caller's. Thread safety: as for the context. @since v0.1
 */
DST_API dst_status dst_gather_rows(dst_context *ctx, const dst_tensor *src, const dst_tensor *index,
                                   dst_tensor *dst);

/**
 * @brief Scatters rows, the backward of dst_gather_rows(): dst[index[i]] (+)= src[i].
 *
 * With ::DST_GRAD_WRITE every row of `dst` is written (rows no index names get 0); with
 * ::DST_GRAD_ACCUMULATE the named rows are added to and the others keep their values.
 * @param ctx The context.
 * @param src Source [M, H].
 * @param index Row indices, int32 [M], each in [0, N) and all distinct (a repeated index is refused, so
 *        that no order of additions has to be chosen).
 * @param dst Destination [N, H], dtype of `src`; may not overlap it.
 * @param mode ::DST_GRAD_WRITE or ::DST_GRAD_ACCUMULATE.
 * @return ::DST_OK; ::DST_ERR_INVALID_ARGUMENT (NULL, dtype, shape, overlap, mode, an index out of range
 *         or repeated); ::DST_ERR_CAPACITY; ::DST_ERR_OUT_OF_MEMORY; ::DST_ERR_BACKEND. On failure `dst` is
 *         unchanged except after ::DST_ERR_BACKEND.
 * Ownership: all tensors stay the caller's. Thread safety: as for the context. @since v0.1
 */
DST_API dst_status dst_scatter_rows(dst_context *ctx, const dst_tensor *src, const dst_tensor *index,
                                    dst_tensor *dst, dst_grad_mode mode);

/**
 * @brief A linear layer fused with softmax cross-entropy, forward and backward in one call: the MLM
 * decoder and loss at the masked positions, or the NSP classifier (V = 2).
 *
 * For each row i of the M selected rows h_i (row `rows[i]` of `x`, or row i when `rows` is NULL):
 * z_i = h_i·Wᵀ + b (logits over V classes, fp32, or fp64 for fp64 data), ℓ_i = logsumexp(z_i) −
 * z_i[labels[i]]. Rows whose label is −1 are ignored. loss = Σ ℓ_i / n over the n valid rows (0 when
 * n = 0). The logits exist only for the M rows, in the workspace ([M, V] in the compute type, see
 * dst_model_op_workspace_bytes()); nothing [N, V] is ever formed.
 *
 * Gradients, when asked for, are those of `grad_scale`·loss (pass the loss scale of mixed-precision
 * training, or 1): with g_i = grad_scale·(softmax(z_i) − onehot(labels[i]))/n rounded to the storage
 * dtype (0 for ignored rows), dx[rows[i]] = g_i·W (the other rows of `dx` are 0), dW (+)= gᵀ·h,
 * db (+)= Σ_i g_i.
 * @param ctx The context.
 * @param x Hidden rows [N, H]: the M rows to classify are selected by `rows`, or x is [M, H] itself.
 * @param rows Row indices, int32 [M], each in [0, N) and distinct; NULL when `x` holds the M rows.
 * @param w Weight [V, H] (for the MLM decoder, the word-embedding table it is tied to), dtype of `x`.
 * @param b Bias [V], dtype of `x`, or NULL for none.
 * @param labels Target classes, int32 [M], each in [0, V) or −1 (ignored).
 * @param grad_scale Factor of the gradients; finite.
 * @param loss Output: the mean loss, [1] in fp32 (fp64 for fp64 data).
 * @param counts Output, or NULL: int32 [2], the number of valid labels n and the number of valid rows
 *        whose largest logit (the first, on ties) is at the label — the accuracy is counts[1]/counts[0].
 * @param dx Gradient of `x` (shape of `x`, written), or NULL.
 * @param dw Gradient of `w` [V, H], or NULL.
 * @param db Gradient of `b` [V], or NULL (must be NULL when `b` is).
 * @param mode ::DST_GRAD_WRITE or ::DST_GRAD_ACCUMULATE for `dw` and `db`; ::DST_GRAD_ACCUMULATE is what a
 *        tied decoder weight needs.
 * @return ::DST_OK; ::DST_ERR_INVALID_ARGUMENT (NULL, dtype, shape, overlap, mode, grad_scale, a row or
 *         label out of range, a repeated row); ::DST_ERR_CAPACITY (a caller-owned workspace that is too
 *         small); ::DST_ERR_OUT_OF_MEMORY; ::DST_ERR_BACKEND. On failure the outputs are unchanged except
 *         after ::DST_ERR_BACKEND.
 * Ownership: all tensors stay the caller's. Thread safety: as for the context. @since v0.1
 */
DST_API dst_status dst_linear_cross_entropy(dst_context *ctx, const dst_tensor *x, const dst_tensor *rows,
                                            const dst_tensor *w, const dst_tensor *b, const dst_tensor *labels,
                                            float grad_scale, dst_tensor *loss, dst_tensor *counts,
                                            dst_tensor *dx, dst_tensor *dw, dst_tensor *db, dst_grad_mode mode);

/**
 * @brief Dropout of a whole tensor with the context's random numbers (the dropout after BERT's
 * embedding LayerNorm): y = x·keep/(1 − p), the mask regenerated by dst_dropout_backward().
 *
 * The call takes the next RNG offset of the context (dst_context_set_rng_state()), one per call, also
 * for p = 0, and reports it with the seed: element e (the row-major position in `x`) is kept when the
 * Philox word for (seed, offset, e) is at least ⌈p·2³²⌉, the rule of the layer's dropout sites
 * (docs/rng.md), so every backend draws the same mask. It is a training op: for inference, skip it.
 * @param ctx The context; the tensors are in its memory space.
 * @param x Input (fp32, fp16, bf16 or fp64, ndim 1..4).
 * @param p Drop probability, in [0, 1).
 * @param y Output, shape and dtype of `x`; may be `x` itself (in place), but not partly overlap it.
 * @param[out] seed Receives the Philox key used, or NULL.
 * @param[out] offset Receives the RNG offset used (pass both to dst_dropout_backward()), or NULL.
 * @return ::DST_OK; ::DST_ERR_INVALID_ARGUMENT (NULL, dtype, shape, partial overlap, p out of range);
 *         ::DST_ERR_UNSUPPORTED (p > 0 on a stream capturing a CUDA graph: the offset is taken on the
 *         host, so every replay would drop the same elements; nothing is queued);
 *         ::DST_ERR_STATE (the context's RNG offset is exhausted: 2⁶⁴ − 1); ::DST_ERR_BACKEND. On failure
 *         `y` and the context's RNG state are unchanged except after ::DST_ERR_BACKEND.
 * Ownership: all tensors stay the caller's. Thread safety: as for the context. @since v0.1
 */
DST_API dst_status dst_dropout_forward(dst_context *ctx, const dst_tensor *x, float p, dst_tensor *y,
                                       uint64_t *seed, uint64_t *offset);

/**
 * @brief Dropout backward: dx = dy·keep/(1 − p) with the mask of the forward that used (seed, offset).
 * @param ctx The context.
 * @param dy Gradient of the output (fp32, fp16, bf16 or fp64, ndim 1..4), the forward's shape.
 * @param p The forward's drop probability.
 * @param seed The Philox key dst_dropout_forward() reported.
 * @param offset The RNG offset dst_dropout_forward() reported.
 * @param dx Gradient of the input, shape and dtype of `dy`; may be `dy` itself, but not partly overlap it.
 * @return ::DST_OK; ::DST_ERR_INVALID_ARGUMENT (NULL, dtype, shape, partial overlap, p out of range);
 *         ::DST_ERR_BACKEND. The context's RNG state is not used or changed.
 * Ownership: all tensors stay the caller's. Thread safety: as for the context. @since v0.1
 */
DST_API dst_status dst_dropout_backward(dst_context *ctx, const dst_tensor *dy, float p, uint64_t seed,
                                        uint64_t offset, dst_tensor *dx);

/** @brief The model ops, for dst_model_op_workspace_bytes(). */
typedef DST_ENUM(dst_model_op) {
    DST_MODEL_OP_EMBEDDING_BACKWARD = 0,  /**< dst_embedding_backward(): n = B·S tokens, k = V word rows, m = H,
                                               h = T token-type rows. */
    DST_MODEL_OP_DENSE = 1,               /**< dst_dense_forward() and backward: n rows, k = K, m = M. */
    DST_MODEL_OP_SCATTER_ROWS = 2,        /**< dst_scatter_rows() (and the gather): n = N rows, k = M, m = H. */
    DST_MODEL_OP_LINEAR_CROSS_ENTROPY = 3 /**< dst_linear_cross_entropy(): n = N rows of x, k = M selected rows,
                                               m = V classes, h = H. */
} dst_model_op;

/**
 * @brief Bytes of workspace a model op needs for a shape (the CUDA backend's need, the larger one).
 * @param op The op.
 * @param dtype The dtype of its float tensors.
 * @param n First size listed at ::dst_model_op.
 * @param k Second size listed at ::dst_model_op.
 * @param m Third size listed at ::dst_model_op.
 * @param h Fourth size listed at ::dst_model_op (ignored by the ops that list three).
 * @param[out] bytes Receives the size; a context whose caller-owned workspace has at least this many
 *        bytes runs the call without ::DST_ERR_CAPACITY.
 * @return ::DST_OK or ::DST_ERR_INVALID_ARGUMENT (NULL, unknown op or dtype, negative sizes).
 * Thread safety: any thread. @since v0.1
 */
DST_API dst_status dst_model_op_workspace_bytes(dst_model_op op, dst_dtype dtype, int64_t n, int64_t k,
                                                int64_t m, int64_t h, size_t *bytes);
/** @} */

/**
 * @defgroup checkpoint Checkpoints and weight layouts
 * @brief safetensors files of one layer or a stack; DeepSpeed and Hugging Face BERT names.
 *
 * A checkpoint is a safetensors file (an 8-byte little-endian header length, a JSON header, raw
 * little-endian tensors) that other tools read. Layer i's parameters are stored under
 * `<prefix>layer.<i>.<name>`, where `<name>` depends on the layout; gradients, when included, under
 * `grad.<prefix>layer.<i>.<name>`. The `__metadata__` holds the configuration of every layer, the
 * context's RNG seed and offset, the library version and the caller's client state.
 * @{
 */
/** @brief Tensor naming scheme of a checkpoint. */
typedef DST_ENUM(dst_weight_layout) {
    DST_LAYOUT_DEEPSPEED = 0,  /**< DeepSpeed Transformer Kernel names (`attn_qkvw` … `norm_b`); the native layout. */
    DST_LAYOUT_HF_BERT = 1     /**< Hugging Face `BertLayer` names (`attention.self.query.weight` …); Post-LN only. */
} dst_weight_layout;

/** @brief Options of dst_checkpoint_save() and dst_checkpoint_load(). Fill with dst_checkpoint_options_default(). */
typedef struct dst_checkpoint_options {
    size_t struct_size;          /**< sizeof(dst_checkpoint_options) of the caller's header; set by default(). A
                                      caller built against an older header passes its smaller size (see
                                      dst_layer_config::struct_size). */
    dst_weight_layout layout;    /**< Naming scheme. Default ::DST_LAYOUT_DEEPSPEED. */
    const char *prefix;          /**< Prepended to `layer.<i>.`; NULL or "" for none. Loading a Hugging Face
                                      file also accepts the prefixes "bert.encoder." and "encoder." when this is
                                      NULL. Default NULL. */
    int32_t include_grads;       /**< Save: also write the gradients. Load: also read them (they must be present).
                                      Default 0. */
    int32_t save_dtype;          /**< Save: -1 keeps each layer's dtype, else a ::dst_dtype to convert to. Default -1. */
    int32_t restore_rng;         /**< Load: set the first layer's context RNG state from the file. Default 1. */
    const char *client_state;    /**< Save: opaque bytes stored with the weights (epoch, step…), `client_state_len`
                                      of them, or a NUL-terminated string when `client_state_len` is 0; NULL for
                                      none. Any bytes are kept exactly: UTF-8 text without NUL is stored as the
                                      text (`client_state` metadata), anything else base64-encoded
                                      (`client_state_base64`). Default NULL. */
    size_t client_state_len;     /**< Save: number of bytes at `client_state`; 0 means a NUL-terminated string.
                                      Default 0. @since v0.1 (appended; a caller built against a header without
                                      it passes the smaller struct_size, and its client state is a string). */
} dst_checkpoint_options;

/**
 * @brief Fills checkpoint options with the defaults listed on each field.
 *
 * Writes sizeof(dst_checkpoint_options) of the library's own header (see dst_layer_config_default()).
 * @param[out] options The struct to fill.
 * @return ::DST_OK or ::DST_ERR_INVALID_ARGUMENT for NULL.
 * Thread safety: any thread. @since v0.1
 */
DST_API dst_status dst_checkpoint_options_default(dst_checkpoint_options *options);

/**
 * @brief Writes the parameters (and optionally gradients) of a stack of layers to a safetensors file.
 *
 * The file is written to a temporary file in the same folder, flushed and renamed over `path`, so
 * `path` holds either its old content or the complete new file, never a partial one.
 * @param layers Array of `num_layers` layers; layer i is stored as `layer.<i>`.
 * @param num_layers Number of layers, ≥ 1.
 * @param path Destination file.
 * The temporary file is named `<path>.dst-tmp.XXXXXX` and locked (flock) while it is written. A save
 * killed before its rename leaves it behind; a later save of the same `path` removes such files when no
 * writer holds their lock and they were last changed more than a minute ago. Other files are never
 * touched.
 * @param options Options, or NULL for the defaults.
 * @return ::DST_OK; ::DST_ERR_INVALID_ARGUMENT (NULL, bad options, a prefix that is not UTF-8, a NULL
 *         client_state with a non-zero client_state_len, a Pre-LN layer with the Hugging Face layout);
 *         ::DST_ERR_IO with the system's reason (the old file is left as it was).
 * Ownership: nothing is retained. Thread safety: as for the layers. @since v0.1
 */
DST_API dst_status dst_checkpoint_save(dst_layer *const *layers, int num_layers, const char *path,
                                       const dst_checkpoint_options *options);

/**
 * @brief Reads parameters (and optionally gradients) of a stack of layers from a safetensors file.
 *
 * Every tensor is checked (header bounds, offsets inside the data and not overlapping, dtype, shape
 * against the target layer) before any layer is changed; a file of another floating dtype is
 * converted. Tensors that belong to no target layer (embeddings, a pooler, further layers) are ignored.
 * @param layers Array of `num_layers` target layers.
 * @param num_layers Number of layers, ≥ 1.
 * @param path Source file.
 * @param options Options, or NULL for the defaults.
 * @param client_state Buffer for the stored client state, or NULL: its bytes (which may include NUL),
 *        truncated to `client_state_size` − 1, then a NUL.
 * @param client_state_size Size of that buffer in bytes.
 * @param[out] client_state_len Receives the full length in bytes of the stored client state (0 when none),
 *        or NULL.
 * @return ::DST_OK; ::DST_ERR_INVALID_ARGUMENT (also a prefix that is not UTF-8); ::DST_ERR_IO (cannot open
 *         or read, or `path` is not a regular file: a FIFO or device is refused without blocking);
 *         ::DST_ERR_FORMAT (malformed file, or a tensor missing or of the wrong shape — the message names
 *         it). On failure no layer and no RNG state is changed.
 * Ownership: nothing is retained. Thread safety: as for the layers. @since v0.1
 */
DST_API dst_status dst_checkpoint_load(dst_layer *const *layers, int num_layers, const char *path,
                                       const dst_checkpoint_options *options, char *client_state,
                                       size_t client_state_size, size_t *client_state_len);

/**
 * @brief A tensor that dst_checkpoint_save_model() writes and dst_checkpoint_load_model() reads under
 * its own name, next to the layers: a model's embeddings, heads and final LayerNorm.
 */
typedef struct dst_named_tensor {
    const char *name;    /**< Its name in the file (UTF-8, 1 to 1024 bytes, unique in the file), e.g.
                              "bert.embeddings.word_embeddings.weight". */
    dst_tensor tensor;   /**< The tensor (fp32, fp16, bf16, fp64 or int32) in the memory space of the context:
                              read by a save, written by a load. */
    int32_t required;    /**< Load: 1 the file must hold it; 0 a tensor the file lacks keeps its values.
                              Ignored by a save. */
} dst_named_tensor;

/**
 * @brief Writes a model — a stack of layers and further named tensors — to one safetensors file.
 *
 * As dst_checkpoint_save() (same options, layer names, metadata and atomic write), plus every tensor of
 * `tensors` under its name, converted to `options->save_dtype` when that is set (int32 tensors are kept).
 * With ::DST_LAYOUT_HF_BERT and the prefix "bert.encoder." and Hugging Face's names for the other
 * tensors, the file is a Hugging Face BERT checkpoint (what `dst-pretrain` exports).
 * @param ctx The context of the layers and tensors; the RNG state stored is its.
 * @param layers Array of `num_layers` layers of `ctx`, or NULL when `num_layers` is 0.
 * @param num_layers Number of layers, ≥ 0.
 * @param tensors Array of `num_tensors` named tensors, or NULL when `num_tensors` is 0.
 * @param num_tensors Number of named tensors, ≥ 0; `num_layers` + `num_tensors` ≥ 1.
 * @param path Destination file.
 * @param options Options, or NULL for the defaults.
 * @return ::DST_OK; ::DST_ERR_INVALID_ARGUMENT (as dst_checkpoint_save(); also a layer of another context,
 *         a NULL, empty, non-UTF-8 or repeated name — a layer tensor's name included — or a bad view);
 *         ::DST_ERR_IO (the old file is left as it was); ::DST_ERR_BACKEND.
 * Ownership: nothing is retained. Thread safety: as for the context. @since v0.1
 */
DST_API dst_status dst_checkpoint_save_model(dst_context *ctx, dst_layer *const *layers, int num_layers,
                                             const dst_named_tensor *tensors, int num_tensors, const char *path,
                                             const dst_checkpoint_options *options);

/**
 * @brief Reads a model — a stack of layers and further named tensors — from one safetensors file.
 *
 * As dst_checkpoint_load() for the layers (layout, prefix detection, dtype conversion, client state,
 * RNG state of `ctx`), plus every tensor of `tensors` by name: its shape must match exactly, and a file
 * tensor of another floating dtype is converted (int32 tensors must be int32). Every tensor is read and
 * checked before anything changes. Tensors of the file that nothing asks for are ignored.
 * @param ctx The context of the layers and tensors.
 * @param layers Array of `num_layers` layers of `ctx`, or NULL when `num_layers` is 0.
 * @param num_layers Number of layers, ≥ 0.
 * @param tensors Array of `num_tensors` named tensors (their memory receives the values), or NULL.
 * @param num_tensors Number of named tensors, ≥ 0. With no layers and no tensors the call reads the client
 *        state (and the RNG state, with `restore_rng`) only: how a program finds the configuration it
 *        stored there before it creates the model.
 * @param[out] found Receives, for each named tensor, 1 when the file held it and 0 otherwise; or NULL.
 * @param path Source file.
 * @param options Options, or NULL for the defaults (`include_grads` applies to the layers only).
 * @param client_state Buffer for the stored client state, or NULL (as for dst_checkpoint_load()).
 * @param client_state_size Size of that buffer in bytes.
 * @param[out] client_state_len Receives the full length of the stored client state, or NULL.
 * @return ::DST_OK; ::DST_ERR_INVALID_ARGUMENT (as for the save); ::DST_ERR_IO; ::DST_ERR_FORMAT (malformed
 *         file; a layer tensor or a required named tensor missing; a tensor of another shape or of a dtype
 *         that cannot be converted — the message names it). On failure nothing is changed: no layer, no
 *         tensor, no RNG state, not `found`.
 * Ownership: nothing is retained. Thread safety: as for the context. @since v0.1
 */
DST_API dst_status dst_checkpoint_load_model(dst_context *ctx, dst_layer *const *layers, int num_layers,
                                             const dst_named_tensor *tensors, int num_tensors, int32_t *found,
                                             const char *path, const dst_checkpoint_options *options,
                                             char *client_state, size_t client_state_size, size_t *client_state_len);

/**
 * @brief Converts a checkpoint file between weight layouts without creating layers.
 *
 * Hugging Face → DeepSpeed fuses query/key/value into `attn_qkvw`/`attn_qkvb` (rows Q, K, V);
 * DeepSpeed → Hugging Face splits them. Tensors outside the encoder layers are copied unchanged.
 * The output is written atomically as by dst_checkpoint_save().
 * @param in_path Source file.
 * @param in_layout Layout of the source.
 * @param in_prefix Prefix of the source's layer names, or NULL to detect ("", "bert.encoder.", "encoder.").
 * @param out_path Destination file.
 * @param out_layout Layout to write.
 * @param out_prefix Prefix for the written layer names, or NULL to keep the source's.
 * @param summary Buffer for a human-readable summary of what was read and written, or NULL.
 * @param summary_size Size of that buffer (the summary is truncated to fit).
 * @return ::DST_OK; ::DST_ERR_INVALID_ARGUMENT (also a prefix that is not UTF-8); ::DST_ERR_IO (also a
 *         source that is not a regular file); ::DST_ERR_FORMAT (malformed file, an incomplete layer — the
 *         message names the tensor).
 * Ownership: nothing is retained. Thread safety: any thread. @since v0.1
 */
DST_API dst_status dst_checkpoint_convert(const char *in_path, dst_weight_layout in_layout, const char *in_prefix,
                                          const char *out_path, dst_weight_layout out_layout,
                                          const char *out_prefix, char *summary, size_t summary_size);

/**
 * @brief Describes a checkpoint file without creating layers or reading tensor data.
 *
 * The header is validated as by dst_checkpoint_load() (bounds, offsets, sizes, dtypes). The text gives
 * the file, header and data sizes, the tensor count and dtypes, the encoder layers found under each
 * layout and prefix (weights and gradient sets separately: "[grad.]<prefix>layer.<i>.<name>" with a
 * DeepSpeed or Hugging Face BERT name), the count of other tensors, the metadata, then one line per tensor
 * in file order ("  <name>: <dtype> [<shape>], <bytes>") — what `dst-convert --info` prints.
 * @param path File to describe.
 * @param summary Buffer for the text (NUL-terminated, truncated to fit), or NULL.
 * @param summary_size Size of that buffer in bytes.
 * @param[out] summary_len Receives the full length of the text, or NULL (call again with a larger
 *        buffer when it is not below summary_size).
 * Validation takes O(n log n) time in the number of tensors n (100,000 tensors: well under a second).
 * @return ::DST_OK; ::DST_ERR_INVALID_ARGUMENT (path NULL or empty); ::DST_ERR_IO (cannot open or read, or
 *         not a regular file); ::DST_ERR_FORMAT (malformed file). On failure the buffer and *summary_len are
 *         unchanged.
 * Ownership: nothing is retained. Thread safety: any thread. @since v0.1
 */
DST_API dst_status dst_checkpoint_describe(const char *path, char *summary, size_t summary_size,
                                           size_t *summary_len);
/** @} */

/**
 * @defgroup optim Optimizers
 * @brief Adam, AdamW and LAMB (DeepSpeed's FusedAdam and FusedLamb) over any set of tensors.
 *
 * An optimizer updates tensors registered with it: caller tensors (embeddings, heads) with
 * dst_optimizer_add_tensor() and the twelve parameters of a layer with dst_optimizer_add_layer().
 * Tensors belong to parameter groups, each with its own lr, betas, eps and weight decay (group 0
 * exists from the start, with the configuration's values). For every tensor the optimizer owns fp32
 * moments and, for FP16 and BF16 parameters, an fp32 master copy: the update runs on the master, and
 * the parameter receives the master rounded once. The state is readable and writable as tensors
 * (dst_optimizer_get_state()) and can be saved to and loaded from a file.
 *
 * A step is one call, dst_optimizer_step(), over every registered tensor: on CUDA a fixed handful of
 * multi-tensor kernels however many tensors there are, with the global gradient norm for clipping
 * computed on the device, and no wait for the device. The math is DeepSpeed's (docs/engine.md):
 *  - Adam/AdamW: m ← β1·m + (1−β1)·g, v ← β2·v + (1−β2)·g², u = (m/bc1)/(sqrt(v/bc2) + eps),
 *    p ← p − lr·(u + wd·p) (AdamW, decoupled) or with g ← g + wd·p first (Adam in L2 mode); bc1,
 *    bc2 = 1 − β^t with bias correction, else 1.
 *  - LAMB: raw moments, u = m/(sqrt(v) + eps) + wd·p, trust ratio r = ‖p‖/‖u‖ per tensor clamped to
 *    [min_coeff, max_coeff] (1 when either norm is 0), p ← p − step_size·r·u with
 *    step_size = lr·sqrt(1 − β2^t)/(1 − β1^t) (bias correction) or lr.
 *
 * The training engine (::dst_engine) owns an optimizer and adds loss scaling, accumulation and
 * schedules; dst_engine_get_optimizer() gives it to register tensors and read state.
 * @{
 */
/** @brief Opaque optimizer handle. */
typedef struct dst_optimizer dst_optimizer;

/** @brief The update rule of an optimizer. */
typedef DST_ENUM(dst_optimizer_kind) {
    DST_OPTIMIZER_ADAM = 0,   /**< DeepSpeed's "adam" (FusedAdam): decoupled weight decay when
                                   dst_optimizer_config::adam_w_mode is set (the default), else L2. */
    DST_OPTIMIZER_ADAMW = 1,  /**< DeepSpeed's "adamw": FusedAdam with decoupled weight decay always. */
    DST_OPTIMIZER_LAMB = 2    /**< DeepSpeed's "lamb" (FusedLamb): layer-wise trust ratio. */
} dst_optimizer_kind;

/** @brief Most parameter groups an optimizer can have. */
#define DST_OPTIMIZER_MAX_GROUPS 32

/** @brief Configuration of an optimizer. Fill with dst_optimizer_config_default(), then change fields. */
typedef struct dst_optimizer_config {
    size_t struct_size;        /**< sizeof(dst_optimizer_config) of the caller's header; set by default(). An
                                    older header's smaller size is accepted as for dst_layer_config. */
    dst_optimizer_kind kind;   /**< Update rule. Default ::DST_OPTIMIZER_ADAM. */
    float lr;                  /**< Learning rate of group 0. Default 1e-3. */
    float beta1;               /**< β1 of group 0, in [0, 1). Default 0.9. */
    float beta2;               /**< β2 of group 0, in [0, 1). Default 0.999. */
    float eps;                 /**< ε of group 0, ≥ 0. Default 1e-8. */
    float weight_decay;        /**< Weight decay of group 0, ≥ 0. Default 0. */
    int32_t bias_correction;   /**< Adam and LAMB bias correction (1 on, 0 off). Default 1. */
    int32_t adam_w_mode;       /**< ::DST_OPTIMIZER_ADAM only: 1 decoupled (AdamW) weight decay, 0 L2. Default 1. */
    float max_coeff;           /**< LAMB: upper bound of the trust ratio, > 0. Default 10. */
    float min_coeff;           /**< LAMB: lower bound of the trust ratio, in (0, max_coeff]. Default 0.01. */
    int32_t eps_inside_sqrt;   /**< LAMB: 1 uses sqrt(v + eps), 0 sqrt(v) + eps. Default 0. */
} dst_optimizer_config;

/** @brief Hyperparameters of one parameter group. */
typedef struct dst_param_group {
    size_t struct_size;   /**< sizeof(dst_param_group) of the caller's header; set by default(). */
    float lr;             /**< Learning rate, finite and ≥ 0. Default 1e-3. */
    float beta1;          /**< β1, in [0, 1). Default 0.9. */
    float beta2;          /**< β2, in [0, 1). Default 0.999. */
    float eps;            /**< ε, finite and ≥ 0. Default 1e-8. */
    float weight_decay;   /**< Weight decay, finite and ≥ 0. Default 0. */
} dst_param_group;

/** @brief Which fp32 state tensor of a registered tensor dst_optimizer_get_state() gives. */
typedef DST_ENUM(dst_optimizer_state) {
    DST_OPTIMIZER_STATE_EXP_AVG = 0,     /**< The first moment m. */
    DST_OPTIMIZER_STATE_EXP_AVG_SQ = 1,  /**< The second moment v. */
    DST_OPTIMIZER_STATE_MASTER = 2       /**< The fp32 master weights (FP16 and BF16 parameters only). */
} dst_optimizer_state;

/** @brief What dst_optimizer_get_tensor_info() reports about a registered tensor. */
typedef struct dst_optimizer_tensor_info {
    size_t struct_size;              /**< Set by the caller to sizeof(dst_optimizer_tensor_info); only that
                                          many bytes are written. */
    const char *name;                /**< The registered name; owned by the optimizer, valid while it lives. */
    int32_t group;                   /**< Its parameter group. */
    dst_dtype dtype;                 /**< The parameter's dtype. */
    dst_dtype grad_dtype;            /**< The gradient's dtype. */
    int32_t ndim;                    /**< Number of dimensions. */
    int64_t shape[DST_MAX_DIMS];     /**< Shape; entries past ndim are 0. */
    int64_t numel;                   /**< Number of elements. */
    int64_t step;                    /**< Steps applied to it (t of the bias corrections). */
    float lamb_coeff;                /**< LAMB: the trust ratio of its last step (0 before the first). */
} dst_optimizer_tensor_info;

/**
 * @brief Fills an optimizer configuration with the defaults listed on each field.
 * @param[out] config The struct to fill; `struct_size` is set to sizeof(dst_optimizer_config).
 * @return ::DST_OK or ::DST_ERR_INVALID_ARGUMENT for NULL.
 * Thread safety: any thread. @since v0.1
 */
DST_API dst_status dst_optimizer_config_default(dst_optimizer_config *config);

/**
 * @brief Creates an optimizer in a context, with group 0 holding the configuration's hyperparameters.
 * @param ctx The context; every registered tensor and the optimizer's state live in its memory space.
 *            The optimizer keeps the context alive.
 * @param config The configuration, or NULL for the defaults; copied.
 * @param[out] out Receives the optimizer; unchanged on failure.
 * @return ::DST_OK; ::DST_ERR_INVALID_ARGUMENT (NULL `ctx` or `out`, a field out of range: the message
 *         names it); ::DST_ERR_UNSUPPORTED (a struct_size from a newer header); ::DST_ERR_OUT_OF_MEMORY.
 * Ownership: the caller owns the optimizer and frees it with dst_optimizer_destroy().
 * Thread safety: as for the context. @since v0.1
 */
DST_API dst_status dst_optimizer_create(dst_context *ctx, const dst_optimizer_config *config, dst_optimizer **out);

/**
 * @brief Destroys an optimizer and its state; registered tensors are not touched.
 * @param opt The optimizer, or NULL (no effect). The optimizer of an engine (dst_engine_get_optimizer())
 *            belongs to the engine: destroying it here has no effect.
 * Thread safety: as for its context. @since v0.1
 */
DST_API void dst_optimizer_destroy(dst_optimizer *opt);

/**
 * @brief Fills a parameter group with the defaults listed on each field (FusedAdam's).
 * @param[out] group The struct to fill; `struct_size` is set to sizeof(dst_param_group).
 * @return ::DST_OK or ::DST_ERR_INVALID_ARGUMENT for NULL.
 * Thread safety: any thread. @since v0.1
 */
DST_API dst_status dst_param_group_default(dst_param_group *group);

/**
 * @brief Adds a parameter group.
 * @param opt The optimizer.
 * @param group Its hyperparameters, or NULL for those of group 0; copied.
 * @param[out] index Receives the new group's index (1, 2, …), or NULL.
 * @return ::DST_OK; ::DST_ERR_INVALID_ARGUMENT (NULL `opt`, a field out of range);
 *         ::DST_ERR_CAPACITY (already ::DST_OPTIMIZER_MAX_GROUPS groups). On failure nothing changes.
 * Thread safety: as for its context. @since v0.1
 */
DST_API dst_status dst_optimizer_add_group(dst_optimizer *opt, const dst_param_group *group, int *index);

/**
 * @brief Number of parameter groups.
 * @param opt The optimizer.
 * @param[out] count Receives the count (≥ 1).
 * @return ::DST_OK or ::DST_ERR_INVALID_ARGUMENT for NULL.
 * Thread safety: as for its context. @since v0.1
 */
DST_API dst_status dst_optimizer_num_groups(const dst_optimizer *opt, int *count);

/**
 * @brief Reads the hyperparameters of a group.
 * @param opt The optimizer.
 * @param index The group, 0 … count − 1.
 * @param[out] group Receives them; its `struct_size` must be set (dst_param_group_default() does) and only
 *             that many bytes are written.
 * @return ::DST_OK; ::DST_ERR_INVALID_ARGUMENT (NULL, index out of range, bad struct_size).
 * Thread safety: as for its context. @since v0.1
 */
DST_API dst_status dst_optimizer_get_group(const dst_optimizer *opt, int index, dst_param_group *group);

/**
 * @brief Changes the hyperparameters of a group; the next step uses them.
 *
 * An engine's schedule overrides the lr of every group (DeepSpeed's schedulers do the same).
 * @param opt The optimizer.
 * @param index The group.
 * @param group The new values; copied.
 * @return ::DST_OK; ::DST_ERR_INVALID_ARGUMENT (NULL, index out of range, a field out of range). On
 *         failure nothing changes.
 * Thread safety: as for its context. @since v0.1
 */
DST_API dst_status dst_optimizer_set_group(dst_optimizer *opt, int index, const dst_param_group *group);

/**
 * @brief Registers a tensor and its gradient with the optimizer.
 *
 * The optimizer allocates the tensor's fp32 state (zero moments, and a master copy of the current
 * values for FP16/BF16 parameters) and, from then on, updates `param` in place on every step, reading
 * `grad`. Inside an engine the parameter dtype must match the precision of its configuration: FP16
 * with fp16 enabled, BF16 with bf16 enabled, FP32 always.
 * @param opt The optimizer.
 * @param group Its parameter group.
 * @param name A unique name: the key of its state in saved files and checkpoints (UTF-8, 1 to 1024 bytes).
 * @param param The parameter: FP32, FP16 or BF16, 1 to ::DST_MAX_DIMS dimensions of extent ≥ 1, in the
 *              context's memory space, aligned to its element size.
 * @param grad Its gradient: the same shape, the parameter's dtype or FP32.
 * @return ::DST_OK; ::DST_ERR_INVALID_ARGUMENT (NULL, group out of range, a name that is empty, taken or not
 *         UTF-8, a bad shape or dtype, memory that overlaps the other view or a tensor registered before);
 *         ::DST_ERR_UNSUPPORTED (FP64 parameters; a dtype the engine's precision excludes);
 *         ::DST_ERR_OUT_OF_MEMORY. On failure nothing is registered.
 * Ownership: the optimizer keeps both pointers (unlike other calls, which never keep a view): the caller
 * keeps the memory alive and in place while the optimizer exists.
 * Thread safety: as for its context. @since v0.1
 */
DST_API dst_status dst_optimizer_add_tensor(dst_optimizer *opt, int group, const char *name,
                                            const dst_tensor *param, const dst_tensor *grad);

/**
 * @brief Registers the twelve parameters of a layer, each as one tensor.
 *
 * Parameter p is named `<prefix><name of p>` ("attn_qkvw" … "norm_b") and reads its gradient from the
 * layer's gradient arena. The four weight matrices go to `decay_group`; the biases and LayerNorm
 * parameters (the one-dimensional ones) to `no_decay_group`, the grouping of DeepSpeed's BERT example.
 * The trust ratio of LAMB is per parameter, as with separate tensors. When the caller binds other
 * arenas to the layer later, the next step uses them.
 * @param opt The optimizer.
 * @param layer A layer of the optimizer's context (FP32, FP16 or BF16).
 * @param prefix Name prefix, e.g. "bert.encoder.layer.3."; NULL gives "layer.<layer id>.".
 * @param decay_group Group of the weight matrices.
 * @param no_decay_group Group of the biases and LayerNorm parameters (may equal `decay_group`).
 * @return As dst_optimizer_add_tensor(); also ::DST_ERR_INVALID_ARGUMENT for a layer of another context.
 *         On failure none of the twelve is registered.
 * Ownership: the layer must outlive the optimizer. Thread safety: as for its context. @since v0.1
 */
DST_API dst_status dst_optimizer_add_layer(dst_optimizer *opt, dst_layer *layer, const char *prefix, int decay_group,
                                           int no_decay_group);

/**
 * @brief Number of registered tensors (a layer counts twelve).
 * @param opt The optimizer.
 * @param[out] count Receives the count.
 * @return ::DST_OK or ::DST_ERR_INVALID_ARGUMENT for NULL.
 * Thread safety: as for its context. @since v0.1
 */
DST_API dst_status dst_optimizer_num_tensors(const dst_optimizer *opt, int *count);

/**
 * @brief Index of a registered tensor, by name.
 * @param opt The optimizer.
 * @param name The name it was registered under.
 * @param[out] index Receives the index, 0 … count − 1 in registration order.
 * @return ::DST_OK; ::DST_ERR_INVALID_ARGUMENT (NULL, or no tensor of that name).
 * Thread safety: as for its context. @since v0.1
 */
DST_API dst_status dst_optimizer_find_tensor(const dst_optimizer *opt, const char *name, int *index);

/**
 * @brief Describes a registered tensor, with its step count and last LAMB trust ratio.
 *
 * Waits for the context's queued work (the counts live in device memory).
 * @param opt The optimizer.
 * @param index The tensor.
 * @param[out] info Receives the description; its `struct_size` must be set by the caller.
 * @return ::DST_OK; ::DST_ERR_INVALID_ARGUMENT (NULL, index out of range, bad struct_size); ::DST_ERR_BACKEND.
 * Thread safety: as for its context. @since v0.1
 */
DST_API dst_status dst_optimizer_get_tensor_info(const dst_optimizer *opt, int index, dst_optimizer_tensor_info *info);

/**
 * @brief A view of one fp32 state tensor of a registered tensor (its moments or master weights).
 * @param opt The optimizer.
 * @param index The tensor.
 * @param which ::DST_OPTIMIZER_STATE_EXP_AVG, ::DST_OPTIMIZER_STATE_EXP_AVG_SQ or ::DST_OPTIMIZER_STATE_MASTER.
 * @param[out] view Receives an FP32 view with the parameter's shape, in the context's memory space.
 * @return ::DST_OK; ::DST_ERR_INVALID_ARGUMENT (NULL, index out of range, an unknown `which`, or a master of
 *         an FP32 parameter, which is its own master).
 * Ownership: the memory belongs to the optimizer and stays valid while it exists. The caller may read and
 * write it between calls (dst_memcpy() for device memory); after changing FP16/BF16 parameters
 * directly, dst_optimizer_refresh_masters() copies them into the masters.
 * Thread safety: as for its context. @since v0.1
 */
DST_API dst_status dst_optimizer_get_state(dst_optimizer *opt, int index, dst_optimizer_state which, dst_tensor *view);

/**
 * @brief Sets the step count of a registered tensor (t of its next step is `step` + 1).
 * @param opt The optimizer.
 * @param index The tensor.
 * @param step The count, ≥ 0.
 * @return ::DST_OK; ::DST_ERR_INVALID_ARGUMENT (NULL, index out of range, negative step); ::DST_ERR_BACKEND.
 * Thread safety: as for its context. @since v0.1
 */
DST_API dst_status dst_optimizer_set_step(dst_optimizer *opt, int index, int64_t step);

/**
 * @brief Copies the current FP16/BF16 parameter values into their fp32 masters.
 *
 * For when the caller changed the parameters themselves (loaded weights, for instance); FP32
 * parameters are their own masters.
 * @param opt The optimizer.
 * @return ::DST_OK; ::DST_ERR_INVALID_ARGUMENT for NULL; ::DST_ERR_BACKEND.
 * Thread safety: as for its context. @since v0.1
 */
DST_API dst_status dst_optimizer_refresh_masters(dst_optimizer *opt);

/**
 * @brief Runs one optimizer step over every registered tensor.
 *
 * The gradients are divided by `grad_scale` (a loss scale the caller applied), then, when
 * `max_grad_norm` > 0, multiplied by min(1, max_grad_norm/(N + 1e-6)) with N the global L2 norm of the
 * divided gradients over every group. The gradients are read, not changed. On CUDA the call only
 * enqueues work on the context's stream (nothing waits, the norm stays on the device).
 * @param opt The optimizer.
 * @param grad_scale Finite and > 0; 1 when the gradients are not scaled.
 * @param max_grad_norm Global-norm clipping threshold, finite and ≥ 0; 0 disables it.
 * @return ::DST_OK; ::DST_ERR_INVALID_ARGUMENT (NULL, scale or norm out of range); ::DST_ERR_STATE (the
 *         optimizer of an engine: use dst_engine_step()); ::DST_ERR_OUT_OF_MEMORY (its first step after
 *         new tensors allocates their tables); ::DST_ERR_BACKEND.
 * Thread safety: as for its context. @since v0.1
 */
DST_API dst_status dst_optimizer_step(dst_optimizer *opt, float grad_scale, float max_grad_norm);

/**
 * @brief The global gradient norm of the last step (of the unscaled gradients, before clipping).
 *
 * Waits for the context's queued work.
 * @param opt The optimizer.
 * @param[out] norm Receives the norm; 0 when the last step computed none (no clipping, no loss scaling).
 * @return ::DST_OK; ::DST_ERR_INVALID_ARGUMENT for NULL; ::DST_ERR_BACKEND.
 * Thread safety: as for its context. @since v0.1
 */
DST_API dst_status dst_optimizer_get_grad_norm(const dst_optimizer *opt, float *norm);

/**
 * @brief Writes the optimizer's state to a safetensors file, atomically as dst_checkpoint_save() does.
 *
 * The file holds `exp_avg.<name>`, `exp_avg_sq.<name>` and (FP16/BF16) `master.<name>` of every tensor
 * in FP32, and in its metadata the configuration, the groups, every tensor's step count and trust
 * ratio, the device state (loss scaler, counters) and a checksum of the data. Parameters themselves
 * are not in it (dst_engine_save_checkpoint() writes both).
 * @param opt The optimizer.
 * @param path Destination file.
 * @return ::DST_OK; ::DST_ERR_INVALID_ARGUMENT (NULL or empty path); ::DST_ERR_IO (the old file is left as
 *         it was); ::DST_ERR_BACKEND.
 * Ownership: nothing is retained. Thread safety: as for its context. @since v0.1
 */
DST_API dst_status dst_optimizer_save(const dst_optimizer *opt, const char *path);

/**
 * @brief Reads the optimizer's state from a file written by dst_optimizer_save().
 *
 * The file must describe the same tensors (names, shapes, dtypes, groups) and the same number of groups;
 * the groups' hyperparameters are restored too. Everything is read and checked (checksum included)
 * before anything changes.
 * @param opt The optimizer.
 * @param path Source file.
 * @return ::DST_OK; ::DST_ERR_INVALID_ARGUMENT (NULL or empty path); ::DST_ERR_IO; ::DST_ERR_FORMAT (not an
 *         optimizer file, a checksum mismatch, a tensor missing, extra or of another shape, dtype or
 *         group: the message names it). On failure the optimizer is unchanged.
 * Ownership: nothing is retained. Thread safety: as for its context. @since v0.1
 */
DST_API dst_status dst_optimizer_load(dst_optimizer *opt, const char *path);
/** @} */

/**
 * @defgroup engine Training engine
 * @brief DeepSpeed's training engine for C trainers: a JSON configuration, loss scaling, gradient
 * accumulation, clipping, learning-rate schedules and training-state checkpoints around an optimizer.
 *
 * An engine is created from a DeepSpeed-style JSON configuration (the keys of DeepSpeed's
 * `ds_config`, checked strictly: an unknown or mistyped key is an error naming its JSON path; see
 * docs/engine.md). It owns an optimizer (dst_engine_get_optimizer()) with which the caller registers
 * the tensors it trains: layers and any caller tensors. A training loop, per micro-batch:
 * @code
 *   // forward; compute dL/d(output) of the micro-batch's mean loss into `dy` (context memory)
 *   dst_engine_scale_loss_gradient(engine, &dy);   // dy *= loss scale / gradient_accumulation_steps
 *   // backward with DST_GRAD_ACCUMULATE into the registered gradients
 *   dst_engine_step(engine);                       // every micro-batch; steps at the boundary
 * @endcode
 * At each accumulation boundary dst_engine_step() runs, on the device: the global gradient norm and the
 * inf/NaN check, the loss scaler, the skip of an overflowed step, unscaling and clipping, the
 * optimizer update with the scheduled learning rates, and zeroed gradients. The loss scale lives in
 * device memory: no call of a step waits for the device; only the queries (dst_engine_get_state(),
 * dst_engine_get_lr()) do. The engine works on any registered tensors, with or without layers.
 *
 * Checkpoints (dst_engine_save_checkpoint()) hold the registered tensors, the optimizer state, the
 * loss scaler, the schedule, the counters, the context's RNG state and a client state of any JSON value,
 * in `save_dir/<tag>/` with a `save_dir/latest` file, as DeepSpeed lays them out; loading one and
 * continuing gives the same losses and weights, bit for bit, as a run that never stopped.
 * @{
 */
/** @brief Opaque engine handle. */
typedef struct dst_engine dst_engine;

/**
 * @brief Checks a DeepSpeed-style JSON configuration without creating anything.
 *
 * Parses the text, checks every key, type and value, and resolves the batch sizes as DeepSpeed does:
 * any two of `train_batch_size`, `train_micro_batch_size_per_gpu` and `gradient_accumulation_steps`
 * determine the third with train_batch_size = micro × accumulation × world_size, and inconsistent
 * values are an error.
 * @param config_json The configuration, NUL-terminated JSON text (a JSON object).
 * @param world_size Data-parallel processes, ≥ 1 (engines of this version run with 1).
 * @param reason Buffer for the reason the configuration is refused ("" when it is accepted), or NULL;
 *        NUL-terminated, truncated to fit.
 * @param reason_size Size of that buffer.
 * @return ::DST_OK; ::DST_ERR_INVALID_ARGUMENT (NULL config_json, world_size < 1, malformed JSON with its
 *         position, an unknown key, a wrong type or a value out of range: the reason names the key's JSON
 *         path, e.g. `optimizer.params.betas[1]`); ::DST_ERR_UNSUPPORTED (a valid DeepSpeed setting this
 *         library does not implement, e.g. ZeRO stage 1 or the "lion" optimizer). The reason is also
 *         dst_last_error().
 * Thread safety: any thread. @since v0.1
 */
DST_API dst_status dst_engine_config_validate(const char *config_json, int world_size, char *reason,
                                              size_t reason_size);

/**
 * @brief Creates an engine from a DeepSpeed-style JSON configuration.
 *
 * The configuration is validated as by dst_engine_config_validate(); it must have an `optimizer`
 * section (adam, adamw or lamb, any case). Group 0 of the engine's optimizer gets the optimizer's
 * params. The engine zeroes the gradients of the tensors registered with it at each boundary; before
 * the first micro-batch the caller starts from zero gradients (dst_engine_zero_grads()).
 * @param ctx The context; the engine keeps it alive and uses its RNG state in checkpoints.
 * @param config_json The configuration (JSON text); copied (checkpoints store it).
 * @param world_size Data-parallel processes; must be 1 in this version.
 * @param[out] out Receives the engine; unchanged on failure.
 * @return ::DST_OK; ::DST_ERR_INVALID_ARGUMENT and ::DST_ERR_UNSUPPORTED as for
 *         dst_engine_config_validate() (also a missing optimizer section, world_size > 1);
 *         ::DST_ERR_OUT_OF_MEMORY.
 * Ownership: the caller owns the engine and frees it with dst_engine_destroy().
 * Thread safety: as for the context. @since v0.1
 */
DST_API dst_status dst_engine_create(dst_context *ctx, const char *config_json, int world_size, dst_engine **out);

/**
 * @brief Destroys an engine and its optimizer; registered tensors are not touched.
 * @param engine The engine, or NULL (no effect).
 * Thread safety: as for its context. @since v0.1
 */
DST_API void dst_engine_destroy(dst_engine *engine);

/**
 * @brief The engine's optimizer, to register tensors and groups with and to read its state.
 *
 * dst_optimizer_step() refuses it (the engine steps it); every other optimizer call accepts it.
 * @param engine The engine.
 * @param[out] opt Receives the optimizer.
 * @return ::DST_OK or ::DST_ERR_INVALID_ARGUMENT for NULL.
 * Ownership: owned by the engine and valid while it lives; dst_optimizer_destroy() ignores it.
 * Thread safety: as for its context. @since v0.1
 */
DST_API dst_status dst_engine_get_optimizer(dst_engine *engine, dst_optimizer **opt);

/**
 * @brief Adds a tensor that checkpoints save and load with the model but that is not trained.
 *
 * For model state outside the optimizer (a frozen pooler, buffers); its gradient, if any, is never
 * checked, clipped or zeroed by the engine.
 * @param engine The engine.
 * @param name Its name in checkpoints: unique among the model tensors and the optimizer's tensors.
 * @param tensor The tensor (any floating dtype or INT32), in the context's memory space.
 * @return ::DST_OK; ::DST_ERR_INVALID_ARGUMENT (NULL, a name that is empty, taken or not UTF-8, a bad shape,
 *         memory that overlaps a registered tensor). On failure nothing is registered.
 * Ownership: the engine keeps the pointer; the caller keeps the memory alive while the engine exists.
 * Thread safety: as for its context. @since v0.1
 */
DST_API dst_status dst_engine_add_model_tensor(dst_engine *engine, const char *name, const dst_tensor *tensor);

/**
 * @brief Multiplies the gradient of a micro-batch's loss by loss scale / gradient_accumulation_steps.
 *
 * What DeepSpeed's `engine.backward(loss)` does to the loss before backward: the factor is read from
 * device memory (the current dynamic, static or unit scale), so nothing waits. Call it on dL/d(output)
 * of the last op before backward through the layers.
 * @param engine The engine.
 * @param grad The tensor to scale in place (any floating dtype), in the context's memory space.
 * @return ::DST_OK; ::DST_ERR_INVALID_ARGUMENT (NULL, bad view); ::DST_ERR_BACKEND.
 * Ownership: the tensor stays the caller's. Thread safety: as for its context. @since v0.1
 */
DST_API dst_status dst_engine_scale_loss_gradient(dst_engine *engine, const dst_tensor *grad);

/**
 * @brief Where the engine keeps the current loss scale: one float in the context's memory space.
 *
 * For callers that scale losses in their own kernels; read it on the device (in stream order), not
 * from the host.
 * @param engine The engine.
 * @param[out] scale Receives the pointer.
 * @return ::DST_OK or ::DST_ERR_INVALID_ARGUMENT for NULL.
 * Ownership: owned by the engine, valid while it lives; read only. Thread safety: as for its context.
 * @since v0.1
 */
DST_API dst_status dst_engine_loss_scale_pointer(const dst_engine *engine, const float **scale);

/**
 * @brief Whether the next dst_engine_step() is an accumulation boundary (it updates the weights).
 * @param engine The engine.
 * @param[out] boundary Receives 1 when (micro steps + 1) is a multiple of gradient_accumulation_steps.
 * @return ::DST_OK or ::DST_ERR_INVALID_ARGUMENT for NULL. Nothing waits (a host counter).
 * Thread safety: as for its context. @since v0.1
 */
DST_API dst_status dst_engine_is_boundary(const dst_engine *engine, int *boundary);

/**
 * @brief Ends a micro-batch; at an accumulation boundary, runs the optimizer step.
 *
 * Call it after the backward of every micro-batch, as DeepSpeed's `engine.step()`. At a boundary:
 * global norm and overflow check of the registered gradients (fp16: an inf or NaN skips the step and
 * halves the dynamic scale), unscaling, clipping (`gradient_clipping`), the optimizer update with the
 * schedule's learning rate (not advanced by a skipped step), zeroed gradients; the global step and
 * sample counters advance either way. Nothing waits for the device.
 * @param engine The engine.
 * @return ::DST_OK; ::DST_ERR_INVALID_ARGUMENT for NULL; ::DST_ERR_STATE (no tensor registered);
 *         ::DST_ERR_OUT_OF_MEMORY (the first step after new tensors allocates their tables);
 *         ::DST_ERR_BACKEND.
 * Thread safety: as for its context. @since v0.1
 */
DST_API dst_status dst_engine_step(dst_engine *engine);

/**
 * @brief Sets the gradients of every tensor registered with the engine's optimizer to zero.
 * @param engine The engine.
 * @return ::DST_OK; ::DST_ERR_INVALID_ARGUMENT for NULL; ::DST_ERR_BACKEND.
 * Thread safety: as for its context. @since v0.1
 */
DST_API dst_status dst_engine_zero_grads(dst_engine *engine);

/**
 * @brief Whether dst_engine_step() sets the registered gradients to zero at each boundary (1, the
 * default, as DeepSpeed does) or leaves them for the next step's first backward to overwrite (0).
 *
 * Zeroing costs a write of every gradient per step, and the first micro-batch's backward then reads
 * the zeros back to add to them. A trainer that writes every gradient in the first micro-batch of a
 * step (::DST_GRAD_WRITE for its first contribution to each, ::DST_GRAD_ACCUMULATE after) saves both,
 * as PyTorch's `zero_grad(set_to_none=True)` does. With 0, after a boundary the gradients hold values
 * the caller must not use (today those of the step just taken, also when an overflow skipped it);
 * a gradient the next step only accumulates into would carry them, so the trainer must write each one.
 * dst_engine_zero_grads() still zeroes on request. The setting is not part of checkpoints.
 * @param engine The engine.
 * @param enabled 1 to zero at each boundary, 0 to leave the gradients to the caller.
 * @return ::DST_OK; ::DST_ERR_INVALID_ARGUMENT (NULL engine, `enabled` not 0 or 1; the setting is
 *         unchanged).
 * Thread safety: as for its context. @since v0.1
 */
DST_API dst_status dst_engine_set_zero_grads_on_step(dst_engine *engine, int enabled);

/**
 * @brief Reads the setting of dst_engine_set_zero_grads_on_step().
 * @param engine The engine.
 * @param[out] enabled Receives 1 (the gradients are zeroed at each boundary) or 0.
 * @return ::DST_OK or ::DST_ERR_INVALID_ARGUMENT for NULL.
 * Thread safety: as for its context. @since v0.1
 */
DST_API dst_status dst_engine_get_zero_grads_on_step(const dst_engine *engine, int *enabled);

/** @brief The resolved configuration and the counters of an engine (dst_engine_get_state()). */
typedef struct dst_engine_state {
    size_t struct_size;                        /**< Set by the caller to sizeof(dst_engine_state); only that
                                                    many bytes are written. */
    int32_t train_batch_size;                  /**< Resolved train_batch_size. */
    int32_t train_micro_batch_size_per_gpu;    /**< Resolved micro-batch size. */
    int32_t gradient_accumulation_steps;       /**< Resolved accumulation steps. */
    int32_t world_size;                        /**< Data-parallel processes. */
    dst_optimizer_kind optimizer;              /**< The optimizer's rule. */
    int32_t fp16_enabled;                      /**< fp16.enabled. */
    int32_t bf16_enabled;                      /**< bf16.enabled. */
    int32_t dynamic_loss_scale;                /**< fp16 with loss_scale 0. */
    int32_t steps_per_print;                   /**< steps_per_print (0 when absent); the library itself never
                                                    prints. */
    float gradient_clipping;                   /**< Global-norm clipping threshold (0: off). */
    int64_t micro_steps;                       /**< dst_engine_step() calls. */
    int64_t global_steps;                      /**< Boundary steps, skipped ones included. */
    int64_t global_samples;                    /**< global_steps × train_batch_size. */
    int64_t skipped_steps;                     /**< Boundary steps skipped for an overflow. */
    float loss_scale;                          /**< The current loss scale (1 without fp16). */
    float grad_norm;                           /**< Global norm of the last boundary's true gradients (0 when
                                                    none was computed). */
    int32_t last_step_applied;                 /**< The last boundary updated the weights (0 before any). */
    int32_t last_overflow;                     /**< The last boundary's gradients held inf or NaN. */
} dst_engine_state;

/**
 * @brief Reads the resolved configuration and the counters. Waits for the context's queued work.
 * @param engine The engine.
 * @param[out] state Receives them; its `struct_size` must be set by the caller.
 * @return ::DST_OK; ::DST_ERR_INVALID_ARGUMENT (NULL, bad struct_size); ::DST_ERR_BACKEND.
 * Thread safety: as for its context. @since v0.1
 */
DST_API dst_status dst_engine_get_state(const dst_engine *engine, dst_engine_state *state);

/**
 * @brief The learning rate the next optimizer step of a group will use. Waits for the context's queued work.
 * @param engine The engine.
 * @param group The parameter group.
 * @param[out] lr Receives the rate.
 * @return ::DST_OK; ::DST_ERR_INVALID_ARGUMENT (NULL, group out of range); ::DST_ERR_BACKEND.
 * Thread safety: as for its context. @since v0.1
 */
DST_API dst_status dst_engine_get_lr(const dst_engine *engine, int group, float *lr);

/**
 * @brief Saves the training state to `save_dir/<tag>/` and, optionally, names it in `save_dir/latest`.
 *
 * Writes `mp_rank_00_model_states.safetensors` (every registered tensor and model tensor, in its dtype,
 * under its name; the counters, schedule, RNG state, configuration and client state in the metadata)
 * and `mp_rank_00_optim_states.safetensors` (as dst_optimizer_save()), each with a checksum. The tag
 * folder is written under a temporary name and renamed into place, so `save_dir/<tag>` holds either
 * the previous checkpoint or the complete new one; `latest` (the tag, no newline) is replaced
 * atomically last. Call it at an accumulation boundary.
 * @param engine The engine.
 * @param save_dir Folder of the checkpoints; created when missing.
 * @param tag Name of this checkpoint (one path component: no '/', not starting with '.'), or NULL for
 *            "global_step<global steps>".
 * @param client_state_json Any JSON value (an object with the epoch, say), stored as it is and returned
 *            by dst_engine_load_checkpoint(); NULL stores {}.
 * @param save_latest Non-zero: write `save_dir/latest`.
 * @return ::DST_OK; ::DST_ERR_INVALID_ARGUMENT (NULL engine or save_dir, a bad tag, client state that is
 *         not JSON: the message gives the position); ::DST_ERR_STATE (between boundaries: gradients are
 *         not saved); ::DST_ERR_IO (the previous checkpoint of that tag is left as it was);
 *         ::DST_ERR_BACKEND.
 * Ownership: nothing is retained. Thread safety: as for its context. @since v0.1
 */
DST_API dst_status dst_engine_save_checkpoint(dst_engine *engine, const char *save_dir, const char *tag,
                                              const char *client_state_json, int save_latest);

/** @brief Options of dst_engine_load_checkpoint(). Fill with dst_engine_load_options_default(). */
typedef struct dst_engine_load_options {
    size_t struct_size;                 /**< sizeof(dst_engine_load_options) of the caller's header; set by
                                             default(). */
    int32_t load_optimizer_states;      /**< Load moments, masters, step counts, group hyperparameters and
                                             the loss scaler; when 0 the masters are refreshed from the loaded
                                             weights instead. Default 1. */
    int32_t load_lr_scheduler_states;   /**< Load the schedule's position. Default 1. */
    int32_t load_module_only;           /**< Load the tensors only (masters refreshed from them), nothing else.
                                             Default 0. */
    int32_t strict;                     /**< Every registered tensor must be in the checkpoint, and nothing
                                             else; when 0, missing ones keep their values and extra ones are
                                             ignored. Default 1. */
    int32_t restore_rng;                /**< Set the context's RNG state from the checkpoint. Default 1. */
} dst_engine_load_options;

/**
 * @brief Fills load options with the defaults listed on each field.
 * @param[out] options The struct to fill.
 * @return ::DST_OK or ::DST_ERR_INVALID_ARGUMENT for NULL.
 * Thread safety: any thread. @since v0.1
 */
DST_API dst_status dst_engine_load_options_default(dst_engine_load_options *options);

/**
 * @brief Loads a checkpoint written by dst_engine_save_checkpoint() and returns its client state.
 *
 * Both files are read and checked (framing, checksums, that they come from the same save, every
 * tensor's name, shape and dtype against the registered ones) before anything changes. Counters
 * (global steps, samples, skipped steps) are always restored. A schedule with `rewarm` restarts at
 * s = 0 on the first load of a checkpoint that was not itself written under that rewarmed schedule.
 * @param engine The engine, with the same tensors registered as when it was saved.
 * @param load_dir Folder of the checkpoints.
 * @param tag The checkpoint, or NULL for the one `load_dir/latest` names.
 * @param options Options, or NULL for the defaults.
 * @param client_state Buffer for the client state as JSON text, or NULL: truncated to client_state_size − 1
 *        bytes, then a NUL.
 * @param client_state_size Size of that buffer.
 * @param[out] client_state_len Receives the full length of the client state text, or NULL.
 * @return ::DST_OK; ::DST_ERR_INVALID_ARGUMENT (NULL engine or load_dir, a bad tag or options);
 *         ::DST_ERR_IO (no `latest` file, no such tag, unreadable files); ::DST_ERR_FORMAT (corrupt or
 *         mismatched files, a tensor missing, extra (strict) or of another shape or dtype: the message names
 *         it). On failure nothing changes: not the tensors, the optimizer, the RNG nor the buffer.
 * Ownership: nothing is retained. Thread safety: as for its context. @since v0.1
 */
DST_API dst_status dst_engine_load_checkpoint(dst_engine *engine, const char *load_dir, const char *tag,
                                              const dst_engine_load_options *options, char *client_state,
                                              size_t client_state_size, size_t *client_state_len);

/**
 * @brief Reads the tag that `dir/latest` names.
 * @param dir Folder of the checkpoints.
 * @param tag Buffer for the tag (NUL-terminated, truncated to fit), or NULL.
 * @param tag_size Size of that buffer.
 * @param[out] tag_len Receives the full length of the tag, or NULL.
 * @return ::DST_OK; ::DST_ERR_INVALID_ARGUMENT (NULL or empty dir); ::DST_ERR_IO (no `latest` file, or not a
 *         regular file); ::DST_ERR_FORMAT (its content is not a valid tag). On failure the buffer is
 *         unchanged.
 * Thread safety: any thread. @since v0.1
 */
DST_API dst_status dst_checkpoint_latest_tag(const char *dir, char *tag, size_t tag_size, size_t *tag_len);
/** @} */

#ifdef __cplusplus
}
#endif

#endif /* DSTRANSFORMER_DSTRANSFORMER_H */
