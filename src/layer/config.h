// Layer configuration: validation (before anything is allocated) and the resolved view the
// dataflow uses.
#ifndef DST_LAYER_CONFIG_H
#define DST_LAYER_CONFIG_H

#include <cstdint>

#include "core/versioned.h"               // defines: StructVersions
#include "dstransformer/dstransformer.h"  // defines: dst_layer_config, dst_backend, dst_status

namespace dst {

// Fills every field with its documented default.
void config_defaults(dst_layer_config *cfg);

// The layouts of dst_layer_config a caller's header may have (core/versioned.h).
extern const StructVersions kConfigVersions;

// Copies a caller's config (which may be from an older header: struct_size bytes) over the defaults,
// then validates it. Messages name the field and the expected range; `fn` prefixes them.
dst_status config_load(const char *fn, const dst_layer_config *in, dst_backend backend,
                       dst_layer_config *out);

// Resolved dimensions of a validated config.
struct Dims {
    int64_t H = 0, heads = 0, d = 0, I = 0;
};
Dims config_dims(const dst_layer_config &cfg);

}  // namespace dst

#endif  // DST_LAYER_CONFIG_H
