// CPU backend: memory ops (host memory, 256-byte aligned), thread count and the factory. The math
// lives in gemm.cpp, layernorm.cpp, elementwise.cpp and attention.cpp.
#include "backend/cpu/cpu_backend.h"

#include <omp.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <new>

#include "core/error.h"

namespace dst {

namespace {
constexpr std::align_val_t kAlign{256};
}

dst_status CpuBackend::alloc(size_t bytes, void **ptr) {
    *ptr = nullptr;
    if (bytes == 0) return DST_OK;
    // No object can be larger than PTRDIFF_MAX; the aligned allocation would round larger sizes up
    // past SIZE_MAX and succeed with a tiny block.
    if (bytes > static_cast<size_t>(PTRDIFF_MAX))
        return set_error(DST_ERR_OUT_OF_MEMORY,
                         "cpu backend: cannot allocate %zu bytes of host memory (more than any object can hold)",
                         bytes);
    try {
        *ptr = ::operator new(bytes, kAlign);
    } catch (const std::bad_alloc &) {
        return set_error(DST_ERR_OUT_OF_MEMORY, "cpu backend: cannot allocate %zu bytes of host memory",
                         bytes);
    }
    return DST_OK;
}

void CpuBackend::free(void *ptr) {
    if (ptr) ::operator delete(ptr, kAlign);
}

dst_status CpuBackend::zero(void *ptr, size_t bytes) {
    if (bytes) std::memset(ptr, 0, bytes);
    return DST_OK;
}

dst_status CpuBackend::copy(void *dst, const void *src, size_t bytes, CopyKind kind) {
    (void)kind;  // one memory space: every kind is a memcpy
    if (bytes && dst != src) std::memmove(dst, src, bytes);
    return DST_OK;
}

// The default follows OpenMP (OMP_NUM_THREADS), capped like an explicit count.
int CpuBackend::num_threads() const {
    return threads_ > 0 ? threads_ : std::min(omp_get_max_threads(), DST_MAX_NUM_THREADS);
}

dst_status make_cpu_backend(Backend **out) {
    *out = new (std::nothrow) CpuBackend();
    if (!*out) return set_error(DST_ERR_OUT_OF_MEMORY, "cpu backend: cannot allocate the backend");
    return DST_OK;
}

}  // namespace dst
