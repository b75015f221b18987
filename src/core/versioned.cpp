#include "core/versioned.h"

#include <cstring>

#include "core/error.h"  // defines: set_error

namespace dst {

dst_status versioned_check(const char *fn, const char *arg, const StructVersions &v, size_t struct_size) {
    if (struct_size > v.size)
        return set_error(DST_ERR_UNSUPPORTED,
                         "%s: %s->struct_size is %zu, larger than this library's %s (%zu bytes): the caller's "
                         "header is newer than the library",
                         fn, arg, struct_size, v.type, v.size);
    for (size_t i = 0; i < v.count; ++i)
        if (v.sizes[i] == struct_size) return DST_OK;
    return set_error(DST_ERR_INVALID_ARGUMENT,
                     "%s: %s->struct_size is %zu, expected %zu (sizeof %s; fill it with %s) or the size of an "
                     "older header's %s, which ends after one of its fields",
                     fn, arg, struct_size, v.size, v.type, v.filler, v.type);
}

dst_status versioned_copy_in(const char *fn, const char *arg, const StructVersions &v, const void *in, void *out) {
    size_t size = 0;
    std::memcpy(&size, in, sizeof size);  // struct_size is the first member of every versioned struct
    DST_TRY(versioned_check(fn, arg, v, size));
    std::memcpy(out, in, size);
    std::memcpy(out, &v.size, sizeof v.size);
    return DST_OK;
}

}  // namespace dst
