// The structs behind the opaque handles of the public header, shared by the shim files of capi/.
#ifndef DST_CAPI_HANDLES_H
#define DST_CAPI_HANDLES_H

#include <memory>

#include "core/context.h"  // defines: Context
#include "layer/layer.h"   // defines: Layer, Saved

struct dst_context {
    std::shared_ptr<dst::Context> impl;
};
struct dst_layer {
    std::unique_ptr<dst::Layer> impl;
};
struct dst_saved {
    dst::Saved *impl = nullptr;
};

#endif  // DST_CAPI_HANDLES_H
