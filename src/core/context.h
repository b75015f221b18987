// The state behind a dst_context handle: the backend, the dropout RNG state, the layer counter and
// the activation workspace that all layers of the context share (calls on a context are
// sequential, so one workspace serves every layer). Layers hold a shared_ptr to the context, so it
// outlives its handle while layers use it.
#ifndef DST_CORE_CONTEXT_H
#define DST_CORE_CONTEXT_H

#include <cstdint>
#include <memory>

#include "backend/backend.h"  // defines: Backend
#include "core/error.h"       // defines: set_error, DST_TRY

namespace dst {

// RNG offsets one training forward takes: one per dropout site (attention probabilities, attention
// output, FFN output).
constexpr uint64_t kRngOffsetsPerForward = 3;

struct Context {
    std::unique_ptr<Backend> backend;
    uint64_t rng_seed = 0;
    uint64_t rng_offset = 0;
    int next_layer_id = 0;
    // The model ops' index checks: queued on the device without waiting (dst_context_set_index_checks).
    bool deferred_index_checks = false;
    // The graph dropout counter (kernels/philox.h): backend memory holding the offset word the next
    // training forward captured into a CUDA graph takes (Backend::rng_take, as the call runs). Made,
    // zeroed, by the first training forward with dropout (ensure_graph_rng); zeroed again by
    // dst_context_set_rng_state.
    uint32_t *graph_rng = nullptr;
    // Tests only: every training forward with dropout draws as a captured one does, so that backends
    // without graphs (the CPU's) run that path too.
    bool graph_rng_eager = false;

    void *workspace = nullptr;
    size_t workspace_capacity = 0;
    bool workspace_owned = true;

    Context() = default;
    Context(const Context &) = delete;
    Context &operator=(const Context &) = delete;
    ~Context() {
        if (!backend) return;
        if (workspace_owned) backend->free(workspace);
        backend->free(graph_rng);
    }

    // Makes the graph dropout counter, zeroed, unless it exists. Not while capturing (an allocation
    // would end the caller's capture): DST_ERR_STATE then, naming `fn`.
    dst_status ensure_graph_rng(const char *fn) {
        if (graph_rng) return DST_OK;
        if (backend->capturing())
            return set_error(DST_ERR_STATE,
                             "%s: the stream is capturing a CUDA graph and the context has no dropout counter yet, "
                             "which needs an allocation: make one training call of a layer with dropout on this "
                             "context before capturing", fn);
        void *p = nullptr;
        DST_TRY(backend->alloc(sizeof(uint32_t), &p));
        const dst_status st = backend->zero(p, sizeof(uint32_t));
        if (st != DST_OK) {
            backend->free(p);
            return st;
        }
        graph_rng = static_cast<uint32_t *>(p);
        return DST_OK;
    }

    // The whole dropout RNG state: seed, host offset and the graph dropout counter's word
    // (dst_context_set_rng_state: 0; a checkpoint load: the stored word).
    dst_status set_rng_state(uint64_t seed, uint64_t offset, const char *fn, uint32_t graph_word = 0) {
        DST_TRY(set_graph_rng_counter(graph_word, fn));
        rng_seed = seed;
        rng_offset = offset;
        return DST_OK;
    }

    // The graph dropout counter's word (0 before the counter exists). Waits for the stream; refused
    // while it captures a graph (waiting would end the capture).
    dst_status graph_rng_counter(uint32_t *word, const char *fn) const {
        *word = 0;
        if (!graph_rng) return DST_OK;
        if (backend->capturing())
            return set_error(DST_ERR_UNSUPPORTED,
                             "%s: the stream is capturing a CUDA graph; reading the dropout counter waits for the "
                             "device, which would end the capture", fn);
        return backend->copy(word, graph_rng, sizeof(uint32_t), CopyKind::DeviceToHost);
    }
    // Sets the graph dropout counter's word, making the counter when the word is not 0 (0 needs no
    // counter: it is made zeroed). Refused while the stream captures a graph, where the write would run
    // at every replay. 0, every reset, is queued without waiting; another word is copied from the host.
    dst_status set_graph_rng_counter(uint32_t word, const char *fn) {
        if (!graph_rng && word == 0) return DST_OK;
        if (backend->capturing())
            return set_error(DST_ERR_UNSUPPORTED,
                             "%s: the stream is capturing a CUDA graph; setting the context's dropout counter "
                             "there would set it again at every replay: set it before capturing", fn);
        DST_TRY(ensure_graph_rng(fn));
        if (word == 0) return backend->zero(graph_rng, sizeof(uint32_t));
        return backend->copy(graph_rng, &word, sizeof(uint32_t), CopyKind::HostToDevice);
    }

    // Reserves `count` consecutive RNG offsets and returns the first.
    uint64_t take_offsets(uint64_t count) {
        const uint64_t first = rng_offset;
        rng_offset += count;
        return first;
    }

    // Makes the workspace at least `bytes` large (growing an owned one; a caller-owned one that is
    // too small is an error) and returns it.
    dst_status ensure_workspace(size_t bytes, char **out) {
        if (bytes > workspace_capacity) {
            if (!workspace_owned)
                return set_error(DST_ERR_CAPACITY,
                                 "the caller-provided workspace has %zu bytes; this call needs %zu "
                                 "(dst_layer_config_workspace_bytes)", workspace_capacity, bytes);
            void *p = nullptr;
            DST_TRY(backend->alloc(bytes, &p));
            backend->free(workspace);
            workspace = p;
            workspace_capacity = bytes;
        }
        *out = static_cast<char *>(workspace);
        return DST_OK;
    }

    // Uses caller memory as the workspace (nullptr returns to an owned, grown-on-demand one).
    void set_workspace(void *data, size_t bytes) {
        if (workspace_owned) backend->free(workspace);
        workspace = data;
        workspace_capacity = data ? bytes : 0;
        workspace_owned = data == nullptr;
    }
};

}  // namespace dst

#endif  // DST_CORE_CONTEXT_H
