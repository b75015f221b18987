// Defaults shared by every backend, and the device count of builds without CUDA.
#include "backend/backend.h"

#include "core/error.h"  // defines: set_error

namespace dst {

dst_status Backend::set_stream(void *stream) {
    if (stream)
        return set_error(DST_ERR_INVALID_ARGUMENT, "stream is not NULL, but this backend has no streams");
    return DST_OK;
}

#if !defined(DST_WITH_CUDA)
dst_status cuda_device_count(int *count) {
    *count = 0;
    return DST_OK;
}

size_t cuda_scratch_bytes(const ScratchNeeds &n) {
    (void)n;
    return 0;
}
#endif

}  // namespace dst
