// Error reporting inside the library: every fallible function returns dst_status and, on failure,
// leaves a message in the thread-local last-error slot that dst_last_error() returns.
#ifndef DST_CORE_ERROR_H
#define DST_CORE_ERROR_H

#include "dstransformer/dstransformer.h"  // defines: dst_status

namespace dst {

// Formats the message (printf-style) into the thread-local slot and returns `status`.
dst_status set_error(dst_status status, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;

const char *last_error();

}  // namespace dst

// Returns from the enclosing function when `expr` yields a status other than DST_OK.
#define DST_TRY(expr)                          \
    do {                                       \
        const dst_status dst_try_s_ = (expr);  \
        if (dst_try_s_ != DST_OK) return dst_try_s_; \
    } while (0)

#endif  // DST_CORE_ERROR_H
