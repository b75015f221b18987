// The structs behind the opaque handles of the public header, shared by the shim files of capi/.
#ifndef DST_CAPI_HANDLES_H
#define DST_CAPI_HANDLES_H

#include <memory>

#include "core/context.h"     // defines: Context
#include "core/error.h"       // defines: set_error
#include "layer/layer.h"      // defines: Layer, Saved
#include "optim/optimizer.h"  // defines: Optimizer
#include "train/engine.h"     // defines: Engine

struct dst_context {
    std::shared_ptr<dst::Context> impl;
};
struct dst_layer {
    std::unique_ptr<dst::Layer> impl;
};
struct dst_saved {
    dst::Saved *impl = nullptr;
};
// An engine's optimizer is a handle inside the engine (engine_owned): dst_optimizer_destroy ignores it.
struct dst_optimizer {
    std::shared_ptr<dst::Optimizer> impl;
    bool engine_owned = false;
};
struct dst_engine {
    std::unique_ptr<dst::Engine> impl;
    dst_optimizer optimizer;
};

namespace dst::capi {

// The start of a call that queues work on a context: the context is not NULL, then a failed
// device-side check of an earlier call on it is reported (once) before anything is done.
inline dst_status begin_context_call(const char *fn, dst_context *ctx) {
    if (!ctx) return set_error(DST_ERR_INVALID_ARGUMENT, "%s: ctx is NULL", fn);
    return ctx->impl->backend->take_deferred_error(fn);
}

}  // namespace dst::capi

#endif  // DST_CAPI_HANDLES_H
