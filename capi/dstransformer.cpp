// The extern "C" shims of the public API: argument checks, the exception barrier, status mapping.
// No math here: every call validates, then hands over to the C++ core (src/).
#include "dstransformer/dstransformer.h"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <new>
#include <string>
#include <vector>

#include "backend/backend.h"  // defines: Backend, make_cpu_backend
#include "capi/guard.h"       // defines: guarded, DST_REQUIRE
#include "capi/handles.h"     // defines: dst_context, dst_layer, dst_saved
#include "capi/tensor_view.h" // defines: views_overlap
#include "core/context.h"     // defines: Context
#include "core/dtype.h"       // defines: dtype_size, convert_host
#include "core/error.h"       // defines: set_error, last_error
#include "layer/buffers.h"    // defines: make_plan
#include "core/versioned.h"   // defines: versioned_check
#include "layer/config.h"     // defines: config_load, config_defaults, kConfigVersions
#include "layer/layer.h"      // defines: Layer, Saved
#if defined(DST_WITH_CUDA)
#include "backend/cuda/cuda_backend.h"  // defines: make_cuda_backend, cuda_device_count
#endif

using dst::set_error;
using dst::capi::guarded;
using dst::capi::views_overlap;

namespace {

const char *dt_name(dst_dtype dt) { return dst_dtype_string(dt); }

// Checks a [B, S, H] activation in the layer dtype. `expect_B`/`expect_S` > 0 pin the shape.
dst_status check_activation(const char *fn, const char *arg, const dst_tensor *t, const dst::Layer &L,
                            int64_t expect_B, int64_t expect_S) {
    if (!t) return set_error(DST_ERR_INVALID_ARGUMENT, "%s: %s is NULL", fn, arg);
    if (!t->data) return set_error(DST_ERR_INVALID_ARGUMENT, "%s: %s->data is NULL", fn, arg);
    const dst_layer_config &c = L.config();
    if (t->dtype != c.dtype)
        return set_error(DST_ERR_INVALID_ARGUMENT, "%s: %s->dtype is %s, expected %s (the layer dtype)", fn, arg,
                         dt_name(t->dtype), dt_name(c.dtype));
    if (t->ndim != 3)
        return set_error(DST_ERR_INVALID_ARGUMENT, "%s: %s->ndim is %d, expected 3 ([B, S, H])", fn, arg,
                         (int)t->ndim);
    const int64_t B = t->shape[0], S = t->shape[1], H = t->shape[2];
    if (B < 1 || S < 1)
        return set_error(DST_ERR_INVALID_ARGUMENT, "%s: %s->shape is [%lld, %lld, %lld], expected B >= 1 and S >= 1",
                         fn, arg, (long long)B, (long long)S, (long long)H);
    if (H != L.dims().H)
        return set_error(DST_ERR_INVALID_ARGUMENT, "%s: %s->shape[2] is %lld, expected hidden_size %lld", fn, arg,
                         (long long)H, (long long)L.dims().H);
    if (expect_B > 0 && (B != expect_B || S != expect_S))
        return set_error(DST_ERR_INVALID_ARGUMENT,
                         "%s: %s->shape is [%lld, %lld, %lld], expected [%lld, %lld, %lld] as in the recorded forward",
                         fn, arg, (long long)B, (long long)S, (long long)H, (long long)expect_B,
                         (long long)expect_S, (long long)H);
    if (S > c.max_seq_len)
        return set_error(DST_ERR_CAPACITY, "%s: %s has S = %lld, above max_seq_len %d", fn, arg, (long long)S,
                         c.max_seq_len);
    if (B > c.max_batch_tokens || B * S > c.max_batch_tokens)
        return set_error(DST_ERR_CAPACITY, "%s: %s has B*S = %lld*%lld tokens, above max_batch_tokens %lld", fn, arg,
                         (long long)B, (long long)S, (long long)c.max_batch_tokens);
    return DST_OK;
}

// Checks a packed [N, H] activation in the layer dtype. `expect_N` > 0 pins N.
dst_status check_packed(const char *fn, const char *arg, const dst_tensor *t, const dst::Layer &L, int64_t expect_N) {
    if (!t) return set_error(DST_ERR_INVALID_ARGUMENT, "%s: %s is NULL", fn, arg);
    if (!t->data) return set_error(DST_ERR_INVALID_ARGUMENT, "%s: %s->data is NULL", fn, arg);
    if (t->dtype != L.config().dtype)
        return set_error(DST_ERR_INVALID_ARGUMENT, "%s: %s->dtype is %s, expected %s (the layer dtype)", fn, arg,
                         dt_name(t->dtype), dt_name(L.config().dtype));
    if (t->ndim != 2)
        return set_error(DST_ERR_INVALID_ARGUMENT, "%s: %s->ndim is %d, expected 2 ([N, H], packed tokens)", fn, arg,
                         (int)t->ndim);
    if (t->shape[0] < 1 || t->shape[1] != L.dims().H)
        return set_error(DST_ERR_INVALID_ARGUMENT, "%s: %s->shape is [%lld, %lld], expected [N, %lld] with N >= 1", fn,
                         arg, (long long)t->shape[0], (long long)t->shape[1], (long long)L.dims().H);
    if (expect_N > 0 && t->shape[0] != expect_N)
        return set_error(DST_ERR_INVALID_ARGUMENT, "%s: %s->shape[0] is %lld, expected N = %lld as in the recorded forward",
                         fn, arg, (long long)t->shape[0], (long long)expect_N);
    return DST_OK;
}

dst_status check_mask(const char *fn, const dst_mask *m, const dst::Layer &L, int64_t B, int64_t S,
                      dst::MaskArg *out) {
    *out = dst::MaskArg{};
    if (!m || m->kind == DST_MASK_NONE) return DST_OK;
    const dst_tensor &t = m->tensor;
    if (m->kind == DST_MASK_ADDITIVE) {
        if (!t.data) return set_error(DST_ERR_INVALID_ARGUMENT, "%s: mask->tensor.data is NULL", fn);
        if (t.dtype != DST_DTYPE_FP32 && t.dtype != L.config().dtype)
            return set_error(DST_ERR_INVALID_ARGUMENT,
                             "%s: additive mask->tensor.dtype is %s, expected fp32 or the layer dtype %s", fn,
                             dt_name(t.dtype), dt_name(L.config().dtype));
        const bool two = t.ndim == 2 && t.shape[0] == B && t.shape[1] == S;
        const bool four = t.ndim == 4 && t.shape[0] == B && t.shape[1] == 1 && t.shape[2] == 1 && t.shape[3] == S;
        if (!two && !four)
            return set_error(DST_ERR_INVALID_ARGUMENT,
                             "%s: additive mask->tensor must have shape [B, S] = [%lld, %lld] or [B, 1, 1, S]", fn,
                             (long long)B, (long long)S);
    } else if (m->kind == DST_MASK_KEY_LENGTHS) {
        if (!t.data) return set_error(DST_ERR_INVALID_ARGUMENT, "%s: mask->tensor.data is NULL", fn);
        if (t.dtype != DST_DTYPE_INT32)
            return set_error(DST_ERR_INVALID_ARGUMENT, "%s: key-length mask->tensor.dtype is %s, expected int32", fn,
                             dt_name(t.dtype));
        if (t.ndim != 1 || t.shape[0] != B)
            return set_error(DST_ERR_INVALID_ARGUMENT, "%s: key-length mask->tensor must have shape [B] = [%lld]",
                             fn, (long long)B);
        // Values 1..S: checked by the forward once its memory is in place (Layer::run_forward).
    } else {
        return set_error(DST_ERR_INVALID_ARGUMENT,
                         "%s: mask->kind is %d, expected DST_MASK_NONE, DST_MASK_ADDITIVE or DST_MASK_KEY_LENGTHS", fn,
                         (int)m->kind);
    }
    out->kind = m->kind;
    out->data = t.data;
    out->dtype = t.dtype;
    return DST_OK;
}

dst_status resolve_saved(const char *fn, dst_layer *layer, dst_saved *saved, dst::Saved **out) {
    if (!saved) {
        *out = layer->impl->default_saved();
        return DST_OK;
    }
    if (saved->impl->layer != layer->impl.get())
        return set_error(DST_ERR_INVALID_ARGUMENT, "%s: saved was created for another layer", fn);
    *out = saved->impl;
    return DST_OK;
}

// The start of every layer forward/backward: a deferred device-side failure of an earlier call, the
// capture rule of a forward (before the call queues its argument checks), and the saved-activations
// object to use.
dst_status begin_layer_call(const char *fn, dst_layer *layer, dst_saved *saved, bool forward, dst::Saved **sv) {
    DST_REQUIRE(fn, layer);
    dst::Layer &L = *layer->impl;
    DST_TRY(L.backend().take_deferred_error(fn));
    if (forward) DST_TRY(L.check_capture(fn));
    if (saved && !saved->impl->layer) return set_error(DST_ERR_STATE, "%s: saved outlived its layer", fn);
    return resolve_saved(fn, layer, saved, sv);
}

dst_status check_grad_mode(const char *fn, dst_grad_mode mode) {
    if (mode != DST_GRAD_WRITE && mode != DST_GRAD_ACCUMULATE)
        return set_error(DST_ERR_INVALID_ARGUMENT, "%s: mode is %d, expected DST_GRAD_WRITE or DST_GRAD_ACCUMULATE", fn,
                         (int)mode);
    return DST_OK;
}

dst_status make_backend(dst_backend kind, int device, std::unique_ptr<dst::Backend> *out) {
    dst::Backend *be = nullptr;
    if (kind == DST_BACKEND_CPU) {
        if (device != 0)
            return set_error(DST_ERR_INVALID_ARGUMENT, "dst_context_create: device is %d, expected 0 for the CPU backend",
                             device);
        DST_TRY(dst::make_cpu_backend(&be));
    } else {
#if defined(DST_WITH_CUDA)
        int count = 0;
        dst::cuda_device_count(&count);
        if (kind == DST_BACKEND_AUTO && count == 0) {
            if (device != 0)
                return set_error(DST_ERR_INVALID_ARGUMENT,
                                 "dst_context_create: device is %d, but no GPU is present (AUTO falls back to CPU, device 0)",
                                 device);
            DST_TRY(dst::make_cpu_backend(&be));
        } else {
            if (count == 0)
                return set_error(DST_ERR_UNSUPPORTED, "dst_context_create: DST_BACKEND_CUDA requested, but no CUDA "
                                                      "device is usable on this machine");
            if (device < 0 || device >= count)
                return set_error(DST_ERR_INVALID_ARGUMENT, "dst_context_create: device is %d, expected 0..%d", device,
                                 count - 1);
            DST_TRY(dst::make_cuda_backend(device, &be));
        }
#else
        if (kind == DST_BACKEND_CUDA)
            return set_error(DST_ERR_UNSUPPORTED,
                             "dst_context_create: DST_BACKEND_CUDA is not available: this build has no CUDA backend");
        if (device != 0)
            return set_error(DST_ERR_INVALID_ARGUMENT,
                             "dst_context_create: device is %d, expected 0 (AUTO resolves to the CPU backend)", device);
        DST_TRY(dst::make_cpu_backend(&be));
#endif
    }
    out->reset(be);
    return DST_OK;
}

}  // namespace

extern "C" {

// ---- version, errors, dtypes ----------------------------------------------------------------------

int dst_version(void) { return DST_VERSION_NUMBER; }

const char *dst_version_string(void) {
#define DST_STR2(x) #x
#define DST_STR(x) DST_STR2(x)
    return DST_STR(DST_VERSION_MAJOR) "." DST_STR(DST_VERSION_MINOR) "." DST_STR(DST_VERSION_PATCH);
}

const char *dst_status_string(dst_status s) {
    switch (s) {
    case DST_OK: return "DST_OK";
    case DST_ERR_INVALID_ARGUMENT: return "DST_ERR_INVALID_ARGUMENT";
    case DST_ERR_UNSUPPORTED: return "DST_ERR_UNSUPPORTED";
    case DST_ERR_CAPACITY: return "DST_ERR_CAPACITY";
    case DST_ERR_OUT_OF_MEMORY: return "DST_ERR_OUT_OF_MEMORY";
    case DST_ERR_STATE: return "DST_ERR_STATE";
    case DST_ERR_BACKEND: return "DST_ERR_BACKEND";
    case DST_ERR_IO: return "DST_ERR_IO";
    case DST_ERR_FORMAT: return "DST_ERR_FORMAT";
    case DST_ERR_INTERNAL: return "DST_ERR_INTERNAL";
    }
    return "DST_ERR_UNKNOWN";
}

const char *dst_last_error(void) { return dst::last_error(); }

size_t dst_dtype_size(dst_dtype dt) { return dst::dtype_size(dt); }

const char *dst_dtype_string(dst_dtype dt) {
    switch (dt) {
    case DST_DTYPE_FP32: return "fp32";
    case DST_DTYPE_FP16: return "fp16";
    case DST_DTYPE_BF16: return "bf16";
    case DST_DTYPE_FP64: return "fp64";
    case DST_DTYPE_INT32: return "int32";
    }
    return "unknown";
}

// ---- context --------------------------------------------------------------------------------------

dst_status dst_context_create(dst_backend backend, int device, dst_context **out) {
    static const char fn[] = "dst_context_create";
    return guarded(fn, [&]() -> dst_status {
        DST_REQUIRE(fn, out);
        if (backend != DST_BACKEND_AUTO && backend != DST_BACKEND_CPU && backend != DST_BACKEND_CUDA)
            return set_error(DST_ERR_INVALID_ARGUMENT, "%s: backend is %d, expected DST_BACKEND_AUTO, CPU or CUDA", fn,
                             (int)backend);
        if (device < 0)
            return set_error(DST_ERR_INVALID_ARGUMENT, "%s: device is %d, expected >= 0", fn, device);
        auto impl = std::make_shared<dst::Context>();
        DST_TRY(make_backend(backend, device, &impl->backend));
        *out = new dst_context{std::move(impl)};
        return DST_OK;
    });
}

void dst_context_destroy(dst_context *ctx) { delete ctx; }

dst_status dst_context_get_backend(const dst_context *ctx, dst_backend *backend) {
    static const char fn[] = "dst_context_get_backend";
    DST_REQUIRE(fn, ctx);
    DST_REQUIRE(fn, backend);
    *backend = ctx->impl->backend->kind();
    return DST_OK;
}

dst_status dst_context_set_rng_state(dst_context *ctx, uint64_t seed, uint64_t offset) {
    static const char fn[] = "dst_context_set_rng_state";
    DST_REQUIRE(fn, ctx);
    return ctx->impl->set_rng_state(seed, offset, fn);
}

dst_status dst_context_get_rng_state(const dst_context *ctx, uint64_t *seed, uint64_t *offset) {
    static const char fn[] = "dst_context_get_rng_state";
    DST_REQUIRE(fn, ctx);
    DST_REQUIRE(fn, seed);
    DST_REQUIRE(fn, offset);
    *seed = ctx->impl->rng_seed;
    *offset = ctx->impl->rng_offset;
    return DST_OK;
}

dst_status dst_context_get_rng_graph_counter(const dst_context *ctx, uint64_t *counter) {
    static const char fn[] = "dst_context_get_rng_graph_counter";
    DST_REQUIRE(fn, ctx);
    DST_REQUIRE(fn, counter);
    uint32_t word = 0;
    DST_TRY(ctx->impl->graph_rng_counter(&word, fn));
    *counter = word;
    return DST_OK;
}

dst_status dst_context_set_rng_graph_counter(dst_context *ctx, uint64_t counter) {
    static const char fn[] = "dst_context_set_rng_graph_counter";
    DST_REQUIRE(fn, ctx);
    if (counter > UINT32_MAX)
        return set_error(DST_ERR_INVALID_ARGUMENT, "%s: counter is %llu, expected 0 ... 2^32 - 1 (a 32-bit word)", fn,
                         (unsigned long long)counter);
    return ctx->impl->set_graph_rng_counter(static_cast<uint32_t>(counter), fn);
}

dst_status dst_context_set_num_threads(dst_context *ctx, int threads) {
    static const char fn[] = "dst_context_set_num_threads";
    DST_REQUIRE(fn, ctx);
    if (threads < 0 || threads > DST_MAX_NUM_THREADS)
        return set_error(DST_ERR_INVALID_ARGUMENT, "%s: threads is %d, expected 0 (the default) to %d (DST_MAX_NUM_THREADS)",
                         fn, threads, DST_MAX_NUM_THREADS);
    ctx->impl->backend->set_num_threads(threads);
    return DST_OK;
}

dst_status dst_context_get_num_threads(const dst_context *ctx, int *threads) {
    static const char fn[] = "dst_context_get_num_threads";
    DST_REQUIRE(fn, ctx);
    DST_REQUIRE(fn, threads);
    *threads = ctx->impl->backend->num_threads();
    return DST_OK;
}

dst_status dst_context_set_index_checks(dst_context *ctx, dst_index_checks mode) {
    static const char fn[] = "dst_context_set_index_checks";
    DST_REQUIRE(fn, ctx);
    if (mode != DST_INDEX_CHECKS_EAGER && mode != DST_INDEX_CHECKS_DEFERRED)
        return set_error(DST_ERR_INVALID_ARGUMENT,
                         "%s: mode is %d, expected DST_INDEX_CHECKS_EAGER or DST_INDEX_CHECKS_DEFERRED", fn, (int)mode);
    ctx->impl->deferred_index_checks = mode == DST_INDEX_CHECKS_DEFERRED;
    return DST_OK;
}

dst_status dst_context_get_index_checks(const dst_context *ctx, dst_index_checks *mode) {
    static const char fn[] = "dst_context_get_index_checks";
    DST_REQUIRE(fn, ctx);
    DST_REQUIRE(fn, mode);
    *mode = ctx->impl->deferred_index_checks ? DST_INDEX_CHECKS_DEFERRED : DST_INDEX_CHECKS_EAGER;
    return DST_OK;
}

dst_status dst_cuda_device_count(int *count) {
    DST_REQUIRE("dst_cuda_device_count", count);
    *count = 0;
    return dst::cuda_device_count(count);
}

dst_status dst_context_set_stream(dst_context *ctx, void *stream) {
    static const char fn[] = "dst_context_set_stream";
    DST_REQUIRE(fn, ctx);
    const dst_status s = ctx->impl->backend->set_stream(stream);
    if (s != DST_OK) {
        const std::string why = dst::last_error();  // set_error overwrites the slot it reads
        return set_error(s, "%s: %s", fn, why.c_str());
    }
    return DST_OK;
}

dst_status dst_context_get_stream(const dst_context *ctx, void **stream) {
    static const char fn[] = "dst_context_get_stream";
    DST_REQUIRE(fn, ctx);
    DST_REQUIRE(fn, stream);
    *stream = ctx->impl->backend->stream();
    return DST_OK;
}

dst_status dst_context_synchronize(dst_context *ctx) {
    static const char fn[] = "dst_context_synchronize";
    DST_REQUIRE(fn, ctx);
    return guarded(fn, [&] {
        DST_TRY(ctx->impl->backend->synchronize());
        return ctx->impl->backend->take_deferred_error(fn);
    });
}

dst_status dst_context_set_workspace(dst_context *ctx, void *data, size_t bytes) {
    static const char fn[] = "dst_context_set_workspace";
    DST_REQUIRE(fn, ctx);
    if (reinterpret_cast<uintptr_t>(data) % 256 != 0)
        return set_error(DST_ERR_INVALID_ARGUMENT, "%s: data is not aligned to 256 bytes", fn);
    ctx->impl->set_workspace(data, bytes);
    return DST_OK;
}

dst_status dst_context_workspace_bytes(const dst_context *ctx, size_t *bytes) {
    static const char fn[] = "dst_context_workspace_bytes";
    DST_REQUIRE(fn, ctx);
    DST_REQUIRE(fn, bytes);
    *bytes = ctx->impl->workspace_capacity;
    return DST_OK;
}

dst_status dst_malloc(dst_context *ctx, size_t bytes, void **ptr) {
    static const char fn[] = "dst_malloc";
    return guarded(fn, [&]() -> dst_status {
        DST_REQUIRE(fn, ctx);
        DST_REQUIRE(fn, ptr);
        *ptr = nullptr;
        // Every backend rounds sizes up to its alignment; larger sizes would wrap around.
        if (bytes > static_cast<size_t>(PTRDIFF_MAX))
            return set_error(DST_ERR_OUT_OF_MEMORY, "%s: bytes is %zu, more than any allocation can hold (at most %zu)",
                             fn, bytes, static_cast<size_t>(PTRDIFF_MAX));
        const dst_status s = ctx->impl->backend->alloc(bytes, ptr);
        if (s != DST_OK) {
            const std::string why = dst::last_error();  // set_error overwrites the slot it reads
            return set_error(s, "%s: bytes is %zu: %s", fn, bytes, why.c_str());
        }
        return DST_OK;
    });
}

void dst_free(dst_context *ctx, void *ptr) {
    if (ctx && ptr) ctx->impl->backend->free(ptr);
}

dst_status dst_memcpy(dst_context *ctx, void *dst, const void *src, size_t bytes, dst_copy_kind kind) {
    static const char fn[] = "dst_memcpy";
    return guarded(fn, [&]() -> dst_status {
        DST_REQUIRE(fn, ctx);
        if (bytes == 0) return DST_OK;
        DST_REQUIRE(fn, dst);
        DST_REQUIRE(fn, src);
        dst::CopyKind k;
        switch (kind) {
        case DST_COPY_HOST_TO_CONTEXT: k = dst::CopyKind::HostToDevice; break;
        case DST_COPY_CONTEXT_TO_HOST: k = dst::CopyKind::DeviceToHost; break;
        case DST_COPY_CONTEXT_TO_CONTEXT: k = dst::CopyKind::DeviceToDevice; break;
        default:
            return set_error(DST_ERR_INVALID_ARGUMENT, "%s: kind is %d, expected a dst_copy_kind value", fn, (int)kind);
        }
        DST_TRY(ctx->impl->backend->copy(dst, src, bytes, k));
        return ctx->impl->backend->synchronize();
    });
}

// ---- config ---------------------------------------------------------------------------------------

dst_status dst_layer_config_default(dst_layer_config *config) {
    DST_REQUIRE("dst_layer_config_default", config);
    dst::config_defaults(config);
    return DST_OK;
}

dst_status dst_layer_config_validate(const dst_layer_config *config, dst_backend backend) {
    static const char fn[] = "dst_layer_config_validate";
    return guarded(fn, [&]() -> dst_status {
        DST_TRY(dst::config_load(fn, config, backend, nullptr));
        if (backend == DST_BACKEND_CUDA) {
            int count = 0;
            DST_TRY(dst::cuda_device_count(&count));
            if (count == 0)
                return set_error(DST_ERR_UNSUPPORTED, "%s: DST_BACKEND_CUDA cannot run here: %s", fn,
#if defined(DST_WITH_CUDA)
                                 "no CUDA device is usable on this machine"
#else
                                 "this build has no CUDA backend"
#endif
                );
        }
        return DST_OK;
    });
}

// Shared checks of the size queries: a valid config, a non-NULL result, B and S in range.
static dst_status check_size_query(const char *fn, const dst_layer_config *config, int64_t batch, int64_t seq,
                                   const size_t *bytes, dst_layer_config *c) {
    DST_TRY(dst::config_load(fn, config, DST_BACKEND_AUTO, c));
    DST_REQUIRE(fn, bytes);
    if (batch < 1 || seq < 1 || batch > (int64_t(1) << 31) || seq > (int64_t(1) << 31))
        return set_error(DST_ERR_INVALID_ARGUMENT, "%s: batch = %lld and seq = %lld, expected 1..2^31 each", fn,
                         (long long)batch, (long long)seq);
    return DST_OK;
}

dst_status dst_layer_config_saved_bytes(const dst_layer_config *config, int64_t batch, int64_t seq,
                                        size_t *bytes) {
    static const char fn[] = "dst_layer_config_saved_bytes";
    return guarded(fn, [&]() -> dst_status {
        dst_layer_config c;
        DST_TRY(check_size_query(fn, config, batch, seq, bytes, &c));
        *bytes = dst::make_plan(c, batch, seq, true).saved_bytes;
        return DST_OK;
    });
}

dst_status dst_layer_config_workspace_bytes(const dst_layer_config *config, int64_t batch, int64_t seq,
                                            size_t *bytes) {
    static const char fn[] = "dst_layer_config_workspace_bytes";
    return guarded(fn, [&]() -> dst_status {
        dst_layer_config c;
        DST_TRY(check_size_query(fn, config, batch, seq, bytes, &c));
        // The layer's buffers, then the CUDA backend's scratch (the larger need of the two
        // backends; the CPU backend needs none) for the mask that needs the most: an additive mask
        // the kernels convert to their compute type (one in the layer dtype; fp32 for fp64 layers).
        // A packed call of up to batch·seq tokens (dst_layer_forward_packed) is covered too: its
        // attention stages padded copies, and its need grows with its token count.
        const dst::Plan t = dst::make_plan(c, batch, seq, true), i = dst::make_plan(c, batch, seq, false);
        const dst_dtype worst_mask = c.dtype == DST_DTYPE_FP64 ? DST_DTYPE_FP32 : c.dtype;
        const size_t padded = std::max(dst::scratch_offset(t), dst::scratch_offset(i)) +
                              dst::cuda_scratch_bytes(dst::scratch_needs(c, batch, seq, DST_MASK_ADDITIVE, worst_mask));
        const int64_t n = batch * seq;
        const dst::Plan pt = dst::make_plan(c, batch, seq, true, n), pi = dst::make_plan(c, batch, seq, false, n);
        const size_t packed = std::max(dst::scratch_offset(pt), dst::scratch_offset(pi)) +
                              dst::cuda_scratch_bytes(dst::scratch_needs(c, batch, seq, DST_MASK_KEY_LENGTHS,
                                                                         DST_DTYPE_INT32, n));
        *bytes = std::max(padded, packed);
        return DST_OK;
    });
}

// ---- layer ----------------------------------------------------------------------------------------

dst_status dst_layer_create(dst_context *ctx, const dst_layer_config *config, dst_layer **out) {
    static const char fn[] = "dst_layer_create";
    return guarded(fn, [&]() -> dst_status {
        DST_REQUIRE(fn, ctx);
        DST_REQUIRE(fn, out);
        dst_layer_config c;
        DST_TRY(dst::config_load(fn, config, ctx->impl->backend->kind(), &c));
        dst::Layer *L = nullptr;
        DST_TRY(dst::Layer::create(ctx->impl, c, &L));
        *out = new dst_layer{std::unique_ptr<dst::Layer>(L)};
        return DST_OK;
    });
}

void dst_layer_destroy(dst_layer *layer) { delete layer; }

dst_status dst_layer_get_config(const dst_layer *layer, dst_layer_config *config) {
    static const char fn[] = "dst_layer_get_config";
    DST_REQUIRE(fn, layer);
    DST_REQUIRE(fn, config);
    // A caller built against an older header gets the fields its struct has; nothing past them is written.
    size_t size = 0;
    std::memcpy(&size, config, sizeof size);
    DST_TRY(dst::versioned_check(fn, "config", dst::kConfigVersions, size));
    dst_layer_config c = layer->impl->config();
    c.struct_size = size;
    c.training = layer->impl->training();
    std::memcpy(config, &c, size);
    return DST_OK;
}

dst_status dst_layer_get_id(const dst_layer *layer, int *id) {
    static const char fn[] = "dst_layer_get_id";
    DST_REQUIRE(fn, layer);
    DST_REQUIRE(fn, id);
    *id = layer->impl->id();
    return DST_OK;
}

dst_status dst_layer_set_training(dst_layer *layer, int training) {
    DST_REQUIRE("dst_layer_set_training", layer);
    layer->impl->set_training(training != 0);
    return DST_OK;
}

dst_status dst_param_lookup(const char *name, dst_param *param) {
    static const char fn[] = "dst_param_lookup";
    DST_REQUIRE(fn, name);
    DST_REQUIRE(fn, param);
    const int p = dst::param_lookup(name);
    if (p < 0)
        return set_error(DST_ERR_INVALID_ARGUMENT, "%s: name \"%s\" is not a parameter (expected attn_qkvw, attn_qkvb, "
                         "attn_ow, attn_ob, attn_nw, attn_nb, inter_w, inter_b, output_w, output_b, norm_w or norm_b, "
                         "optionally after a prefix ending in '.')", fn, name);
    *param = static_cast<dst_param>(p);
    return DST_OK;
}

dst_status dst_layer_param_info(const dst_layer *layer, dst_param param, dst_param_info *info) {
    static const char fn[] = "dst_layer_param_info";
    DST_REQUIRE(fn, layer);
    DST_REQUIRE(fn, info);
    if (param < 0 || param >= DST_PARAM_COUNT)
        return set_error(DST_ERR_INVALID_ARGUMENT, "%s: param is %d, expected 0..%d", fn, (int)param,
                         DST_PARAM_COUNT - 1);
    const dst::Layer &L = *layer->impl;
    dst_param_info r;
    r.name = dst::param_name(param);
    L.param_shape(param, &r.ndim, r.shape);
    r.numel = L.param_numel(param);
    r.offset_bytes = L.param_offset(param);
    r.size_bytes = static_cast<size_t>(r.numel) * dst::dtype_size(L.config().dtype);
    *info = r;
    return DST_OK;
}

dst_status dst_layer_arena_bytes(const dst_layer *layer, size_t *bytes) {
    static const char fn[] = "dst_layer_arena_bytes";
    DST_REQUIRE(fn, layer);
    DST_REQUIRE(fn, bytes);
    *bytes = layer->impl->arena_bytes();
    return DST_OK;
}

dst_status dst_layer_param_arena(dst_layer *layer, void **data) {
    static const char fn[] = "dst_layer_param_arena";
    DST_REQUIRE(fn, layer);
    DST_REQUIRE(fn, data);
    *data = layer->impl->params();
    return DST_OK;
}

dst_status dst_layer_grad_arena(dst_layer *layer, void **data) {
    static const char fn[] = "dst_layer_grad_arena";
    DST_REQUIRE(fn, layer);
    DST_REQUIRE(fn, data);
    *data = layer->impl->grads();
    return DST_OK;
}

// Checks a caller arena for dst_layer_bind_{param,grad}_arena. The layer will use `data` for
// arena_bytes() bytes; that range may not overlap the layer's current arenas (binding would free or
// overwrite memory still in use), except that the caller's own currently bound arena of the same kind
// (`same`, when caller-owned) may be bound again.
static dst_status check_arena(const char *fn, const dst_layer *layer, const void *data, size_t bytes,
                              bool grads) {
    DST_REQUIRE(fn, layer);
    DST_REQUIRE(fn, data);
    const dst::Layer &L = *layer->impl;
    const size_t n = L.arena_bytes();
    if (bytes < n)
        return set_error(DST_ERR_INVALID_ARGUMENT, "%s: bytes is %zu, expected at least %zu (dst_layer_arena_bytes)",
                         fn, bytes, n);
    const uintptr_t a = reinterpret_cast<uintptr_t>(data);
    if (a % 256 != 0) return set_error(DST_ERR_INVALID_ARGUMENT, "%s: data is not aligned to 256 bytes", fn);
    if (a > UINTPTR_MAX - n)
        return set_error(DST_ERR_INVALID_ARGUMENT, "%s: data + %zu bytes runs past the end of the address space", fn, n);
    struct Current {
        const void *arena;
        bool owned;
        const char *name;
        bool same_kind;
    };
    const Current current[2] = {{L.params(), L.owns_params(), "parameter arena (dst_layer_param_arena)", !grads},
                                {L.grads(), L.owns_grads(), "gradient arena (dst_layer_grad_arena)", grads}};
    for (const Current &c : current) {
        const uintptr_t b = reinterpret_cast<uintptr_t>(c.arena);
        if (c.same_kind && !c.owned && b == a) continue;  // binding the caller's bound arena again
        if (a < b + n && b < a + n)
            return set_error(DST_ERR_INVALID_ARGUMENT,
                             "%s: data [%p, +%zu bytes) overlaps the layer's %s %s; bind memory the layer does "
                             "not use", fn, data, n, c.owned ? "own" : "caller-bound", c.name);
    }
    return DST_OK;
}

dst_status dst_layer_bind_param_arena(dst_layer *layer, void *data, size_t bytes, int copy_current) {
    static const char fn[] = "dst_layer_bind_param_arena";
    return guarded(fn, [&]() -> dst_status {
        DST_TRY(check_arena(fn, layer, data, bytes, false));
        return layer->impl->bind_params(data, copy_current != 0);
    });
}

dst_status dst_layer_bind_grad_arena(dst_layer *layer, void *data, size_t bytes) {
    static const char fn[] = "dst_layer_bind_grad_arena";
    return guarded(fn, [&]() -> dst_status {
        DST_TRY(check_arena(fn, layer, data, bytes, true));
        return layer->impl->bind_grads(data);
    });
}

// Shared checks of the host copy-in/copy-out calls; returns the parameter index in *p.
static dst_status check_host_copy(const char *fn, const dst_layer *layer, const char *name, const void *buf,
                                  const char *buf_name, dst_dtype dtype, size_t count, int *p) {
    DST_REQUIRE(fn, layer);
    DST_REQUIRE(fn, name);
    if (!buf) return set_error(DST_ERR_INVALID_ARGUMENT, "%s: %s (the host buffer) is NULL", fn, buf_name);
    *p = dst::param_lookup(name);
    if (*p < 0) return set_error(DST_ERR_INVALID_ARGUMENT, "%s: name \"%s\" is not a parameter", fn, name);
    if (!dst::is_float_dtype(dtype))
        return set_error(DST_ERR_INVALID_ARGUMENT, "%s: dtype is %s, expected fp32, fp16, bf16 or fp64", fn,
                         dt_name(dtype));
    const int64_t n = layer->impl->param_numel(*p);
    if (count != static_cast<size_t>(n))
        return set_error(DST_ERR_INVALID_ARGUMENT, "%s: count is %zu, expected %lld (elements of %s)", fn, count,
                         (long long)n, dst::param_name(*p));
    return DST_OK;
}

dst_status dst_layer_set_param(dst_layer *layer, const char *name, const void *src, dst_dtype dtype,
                               size_t count) {
    static const char fn[] = "dst_layer_set_param";
    return guarded(fn, [&]() -> dst_status {
        int p = -1;
        DST_TRY(check_host_copy(fn, layer, name, src, "src", dtype, count, &p));
        dst::Layer &L = *layer->impl;
        std::vector<char> buf(count * dst::dtype_size(L.config().dtype));
        dst::convert_host(src, dtype, buf.data(), L.config().dtype, count);
        DST_TRY(L.backend().copy(static_cast<char *>(L.params()) + L.param_offset(p), buf.data(), buf.size(),
                                 dst::CopyKind::HostToDevice));
        return L.backend().synchronize();
    });
}

static dst_status copy_out(const char *fn, const dst_layer *layer, const char *name, void *dst, dst_dtype dtype,
                           size_t count, bool grads) {
    return guarded(fn, [&]() -> dst_status {
        int p = -1;
        DST_TRY(check_host_copy(fn, layer, name, dst, "dst", dtype, count, &p));
        const dst::Layer &L = *layer->impl;
        std::vector<char> buf(count * dst::dtype_size(L.config().dtype));
        const char *arena = static_cast<const char *>(grads ? L.grads() : L.params());
        DST_TRY(L.backend().copy(buf.data(), arena + L.param_offset(p), buf.size(), dst::CopyKind::DeviceToHost));
        dst::convert_host(buf.data(), L.config().dtype, dst, dtype, count);
        return DST_OK;
    });
}

dst_status dst_layer_get_param(const dst_layer *layer, const char *name, void *dst, dst_dtype dtype, size_t count) {
    return copy_out("dst_layer_get_param", layer, name, dst, dtype, count, false);
}

dst_status dst_layer_get_grad(const dst_layer *layer, const char *name, void *dst, dst_dtype dtype, size_t count) {
    return copy_out("dst_layer_get_grad", layer, name, dst, dtype, count, true);
}

dst_status dst_layer_zero_grads(dst_layer *layer) {
    static const char fn[] = "dst_layer_zero_grads";
    DST_REQUIRE(fn, layer);
    return guarded(fn, [&] { return layer->impl->zero_grads(); });
}

// ---- saved activations ----------------------------------------------------------------------------

dst_status dst_saved_create(dst_layer *layer, dst_saved **out) {
    static const char fn[] = "dst_saved_create";
    return guarded(fn, [&]() -> dst_status {
        DST_REQUIRE(fn, layer);
        DST_REQUIRE(fn, out);
        std::unique_ptr<dst_saved> h(new dst_saved());
        DST_TRY(layer->impl->new_saved(&h->impl));
        *out = h.release();
        return DST_OK;
    });
}

void dst_saved_destroy(dst_saved *saved) {
    if (!saved) return;
    if (saved->impl->layer)
        saved->impl->layer->delete_saved(saved->impl);
    else
        delete saved->impl;
    delete saved;
}

dst_status dst_saved_release(dst_saved *saved) {
    DST_REQUIRE("dst_saved_release", saved);
    saved->impl->release();
    return DST_OK;
}

dst_status dst_saved_bytes(const dst_saved *saved, size_t *bytes) {
    static const char fn[] = "dst_saved_bytes";
    DST_REQUIRE(fn, saved);
    DST_REQUIRE(fn, bytes);
    *bytes = saved->impl->valid ? saved->impl->bytes : 0;
    return DST_OK;
}

// ---- forward / backward ---------------------------------------------------------------------------

dst_status dst_layer_forward(dst_layer *layer, dst_saved *saved, const dst_tensor *input, const dst_mask *mask,
                             dst_tensor *output) {
    static const char fn[] = "dst_layer_forward";
    return guarded(fn, [&]() -> dst_status {
        dst::Saved *sv = nullptr;
        DST_TRY(begin_layer_call(fn, layer, saved, true, &sv));
        dst::Layer &L = *layer->impl;
        DST_TRY(check_activation(fn, "input", input, L, 0, 0));
        const int64_t B = input->shape[0], S = input->shape[1];
        DST_TRY(check_activation(fn, "output", output, L, B, S));
        if (views_overlap(input, output))
            return set_error(DST_ERR_INVALID_ARGUMENT, "%s: output overlaps input", fn);
        dst::MaskArg m;
        DST_TRY(check_mask(fn, mask, L, B, S, &m));
        return L.forward(sv, input->data, B, S, m, output->data);
    });
}

dst_status dst_layer_backward(dst_layer *layer, dst_saved *saved, const dst_tensor *grad_output,
                              dst_tensor *grad_input, dst_grad_mode mode) {
    static const char fn[] = "dst_layer_backward";
    return guarded(fn, [&]() -> dst_status {
        dst::Saved *sv = nullptr;
        DST_TRY(begin_layer_call(fn, layer, saved, false, &sv));
        dst::Layer &L = *layer->impl;
        if (!sv->valid)
            return set_error(DST_ERR_STATE, "%s: saved holds no training forward (call dst_layer_forward in "
                                            "training mode with the same saved object first)", fn);
        if (sv->packed)
            return set_error(DST_ERR_STATE, "%s: saved holds a packed forward: use dst_layer_backward_packed", fn);
        DST_TRY(check_activation(fn, "grad_output", grad_output, L, sv->B, sv->S));
        DST_TRY(check_activation(fn, "grad_input", grad_input, L, sv->B, sv->S));
        if (views_overlap(grad_output, grad_input))
            return set_error(DST_ERR_INVALID_ARGUMENT, "%s: grad_input overlaps grad_output", fn);
        DST_TRY(check_grad_mode(fn, mode));
        return L.backward(sv, grad_output->data, grad_input->data, mode == DST_GRAD_ACCUMULATE);
    });
}

dst_status dst_layer_forward_packed(dst_layer *layer, dst_saved *saved, const dst_tensor *input,
                                    const dst_tensor *cu_seqlens, int64_t max_seqlen, dst_tensor *output) {
    static const char fn[] = "dst_layer_forward_packed";
    return guarded(fn, [&]() -> dst_status {
        dst::Saved *sv = nullptr;
        DST_TRY(begin_layer_call(fn, layer, saved, true, &sv));
        dst::Layer &L = *layer->impl;
        DST_TRY(check_packed(fn, "input", input, L, 0));
        const int64_t N = input->shape[0];
        DST_TRY(check_packed(fn, "output", output, L, N));
        if (views_overlap(input, output))
            return set_error(DST_ERR_INVALID_ARGUMENT, "%s: output overlaps input", fn);
        DST_REQUIRE(fn, cu_seqlens);
        if (!cu_seqlens->data) return set_error(DST_ERR_INVALID_ARGUMENT, "%s: cu_seqlens->data is NULL", fn);
        if (cu_seqlens->dtype != DST_DTYPE_INT32 || cu_seqlens->ndim != 1 || cu_seqlens->shape[0] < 2)
            return set_error(DST_ERR_INVALID_ARGUMENT,
                             "%s: cu_seqlens must be int32 of shape [B + 1] with B >= 1 (got %s, ndim %d%s%lld)", fn,
                             dt_name(cu_seqlens->dtype), (int)cu_seqlens->ndim, cu_seqlens->ndim >= 1 ? ", shape[0] " : "",
                             cu_seqlens->ndim >= 1 ? (long long)cu_seqlens->shape[0] : 0LL);
        const int64_t B = cu_seqlens->shape[0] - 1;
        const dst_layer_config &c = L.config();
        if (max_seqlen < 1 || max_seqlen > c.max_seq_len)
            return set_error(max_seqlen < 1 ? DST_ERR_INVALID_ARGUMENT : DST_ERR_CAPACITY,
                             "%s: max_seqlen is %lld, expected 1..max_seq_len = %d", fn, (long long)max_seqlen,
                             c.max_seq_len);
        if (N < B || N > B * max_seqlen)
            return set_error(DST_ERR_INVALID_ARGUMENT,
                             "%s: input has N = %lld rows, but %lld sequences of 1..max_seqlen = %lld tokens hold %lld..%lld",
                             fn, (long long)N, (long long)B, (long long)max_seqlen, (long long)B,
                             (long long)(B * max_seqlen));
        if (B * max_seqlen > c.max_batch_tokens)
            return set_error(DST_ERR_CAPACITY,
                             "%s: B*max_seqlen = %lld*%lld tokens (the padded layout of the attention) is above "
                             "max_batch_tokens %lld", fn, (long long)B, (long long)max_seqlen,
                             (long long)c.max_batch_tokens);
        return L.forward_packed(sv, input->data, N, static_cast<const int32_t *>(cu_seqlens->data), B, max_seqlen,
                                output->data);
    });
}

dst_status dst_layer_backward_packed(dst_layer *layer, dst_saved *saved, const dst_tensor *grad_output,
                                     dst_tensor *grad_input, dst_grad_mode mode) {
    static const char fn[] = "dst_layer_backward_packed";
    return guarded(fn, [&]() -> dst_status {
        dst::Saved *sv = nullptr;
        DST_TRY(begin_layer_call(fn, layer, saved, false, &sv));
        dst::Layer &L = *layer->impl;
        if (!sv->valid || !sv->packed)
            return set_error(DST_ERR_STATE, "%s: saved holds no packed training forward (call "
                                            "dst_layer_forward_packed in training mode with the same saved object "
                                            "first%s)", fn, sv->valid ? "; it holds a padded one: use dst_layer_backward" : "");
        DST_TRY(check_packed(fn, "grad_output", grad_output, L, sv->packed_n));
        DST_TRY(check_packed(fn, "grad_input", grad_input, L, sv->packed_n));
        if (views_overlap(grad_output, grad_input))
            return set_error(DST_ERR_INVALID_ARGUMENT, "%s: grad_input overlaps grad_output", fn);
        DST_TRY(check_grad_mode(fn, mode));
        return L.backward_packed(sv, grad_output->data, grad_input->data, mode == DST_GRAD_ACCUMULATE);
    });
}

}  // extern "C"
