// The exception barrier of the extern "C" shims: no C++ exception crosses the ABI.
#ifndef DST_CAPI_GUARD_H
#define DST_CAPI_GUARD_H

#include <exception>
#include <new>

#include "core/error.h"  // defines: set_error

// Returns DST_ERR_INVALID_ARGUMENT with "<fn>: <ptr> is NULL" from the enclosing function when `ptr` is NULL.
#define DST_REQUIRE(fn, ptr)                                                                     \
    do {                                                                                         \
        if (!(ptr)) return ::dst::set_error(DST_ERR_INVALID_ARGUMENT, "%s: %s is NULL", fn, #ptr); \
    } while (0)

namespace dst::capi {

// Runs `body` and turns any C++ exception into a status with a message naming `fn`.
template <class F>
dst_status guarded(const char *fn, F &&body) noexcept {
    try {
        return body();
    } catch (const std::bad_alloc &) {
        return set_error(DST_ERR_OUT_OF_MEMORY, "%s: out of host memory", fn);
    } catch (const std::exception &e) {
        return set_error(DST_ERR_INTERNAL, "%s: internal error: %s", fn, e.what());
    } catch (...) {
        return set_error(DST_ERR_INTERNAL, "%s: internal error (unknown exception)", fn);
    }
}

}  // namespace dst::capi

#endif  // DST_CAPI_GUARD_H
