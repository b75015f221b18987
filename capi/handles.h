// The structs behind the opaque handles of the public header, shared by the shim files of capi/.
#ifndef DST_CAPI_HANDLES_H
#define DST_CAPI_HANDLES_H

#include <memory>

#include "core/context.h"     // defines: Context
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

#endif  // DST_CAPI_HANDLES_H
