// The versioned structs of the public header (dst_layer_config, dst_checkpoint_options): each starts
// with `size_t struct_size` and only ever grows by appending fields. A caller built against an older
// header passes its own, smaller struct_size; it is accepted when it is the size of a prefix of the
// current struct that ends after one of its fields (trailing padding included, as the older header's
// sizeof was), and the fields past it keep their defaults. A larger struct_size comes from a newer
// header whose fields this library would silently ignore, and is refused.
#ifndef DST_CORE_VERSIONED_H
#define DST_CORE_VERSIONED_H

#include <cstddef>

#include "dstransformer/dstransformer.h"  // defines: dst_status

namespace dst {

// The accepted layouts of one struct.
struct StructVersions {
    const char *type;      // "dst_layer_config"
    const char *filler;    // "dst_layer_config_default", named in messages
    size_t size;           // sizeof in this header
    const size_t *sizes;   // every accepted struct_size (the prefix sizes; the largest is `size`)
    size_t count;
};

// sizeof a struct T cut after a field that ends at byte `end`: rounded up to T's alignment.
template <class T>
constexpr size_t prefix_size(size_t end) {
    return (end + alignof(T) - 1) / alignof(T) * alignof(T);
}
#define DST_PREFIX_SIZE(T, field) ::dst::prefix_size<T>(offsetof(T, field) + sizeof(static_cast<T *>(nullptr)->field))

// Checks a caller's struct_size against `v`; messages name `fn` and `arg` ("config", "options").
dst_status versioned_check(const char *fn, const char *arg, const StructVersions &v, size_t struct_size);

// Copies the caller's struct `in` (its struct_size bytes, checked first) over `out`, which holds the
// defaults, and sets out's struct_size to this header's size. Reads nothing past in->struct_size.
dst_status versioned_copy_in(const char *fn, const char *arg, const StructVersions &v, const void *in, void *out);

}  // namespace dst

#endif  // DST_CORE_VERSIONED_H
