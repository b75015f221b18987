#include "core/error.h"

#include <cstdarg>
#include <cstdio>

namespace dst {

namespace {
thread_local char g_last_error[1024] = "";
}

dst_status set_error(dst_status status, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    std::vsnprintf(g_last_error, sizeof g_last_error, fmt, ap);
    va_end(ap);
    return status;
}

const char *last_error() { return g_last_error; }

}  // namespace dst
