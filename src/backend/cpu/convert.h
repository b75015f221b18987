// Storage <-> compute conversions for the CPU backend. Every op is a template over the storage type
// T (double, float, half_t, bf16_t); it loads elements as compute_t<T> (double for double, float
// otherwise), does its arithmetic there and rounds once on store. dispatch() maps a runtime
// dst_dtype onto the template and keeps exceptions (std::bad_alloc from scratch buffers) from
// crossing the Backend interface.
#ifndef DST_BACKEND_CPU_CONVERT_H
#define DST_BACKEND_CPU_CONVERT_H

#include <cstdint>
#include <new>
#include <type_traits>

#include "core/error.h"
#include "core/half.h"

namespace dst {
namespace cpu {

template <typename T>
using compute_t = typename std::conditional<std::is_same<T, double>::value, double, float>::type;

// Element i of a storage buffer, as the compute type.
template <typename T>
inline compute_t<T> load(const void *p, int64_t i) {
    return static_cast<compute_t<T>>(static_cast<const T *>(p)[i]);
}

// Rounds v to the storage type and writes element i.
template <typename T>
inline void store(void *p, int64_t i, compute_t<T> v) {
    static_cast<T *>(p)[i] = T(v);
}

// Element i of a buffer whose dtype is only known at run time (attention masks), as double.
inline double load_any(dst_dtype dt, const void *p, int64_t i) {
    switch (dt) {
        case DST_DTYPE_FP64: return static_cast<const double *>(p)[i];
        case DST_DTYPE_FP32: return static_cast<const float *>(p)[i];
        case DST_DTYPE_FP16: return static_cast<float>(static_cast<const half_t *>(p)[i]);
        case DST_DTYPE_BF16: return static_cast<float>(static_cast<const bf16_t *>(p)[i]);
        case DST_DTYPE_INT32: return static_cast<const int32_t *>(p)[i];
    }
    return 0.0;
}

// Calls f(T{}) with the storage type of dt; returns f's status. Unknown dtypes and exceptions
// become statuses with a message.
template <typename F>
dst_status dispatch(dst_dtype dt, const char *op, F &&f) {
    try {
        switch (dt) {
            case DST_DTYPE_FP64: return f(double{});
            case DST_DTYPE_FP32: return f(float{});
            case DST_DTYPE_FP16: return f(half_t{});
            case DST_DTYPE_BF16: return f(bf16_t{});
            default: break;
        }
        return set_error(DST_ERR_INVALID_ARGUMENT, "cpu backend: %s: unsupported dtype %d", op,
                         static_cast<int>(dt));
    } catch (const std::bad_alloc &) {
        return set_error(DST_ERR_OUT_OF_MEMORY, "cpu backend: %s: out of host memory for scratch", op);
    } catch (...) {
        return set_error(DST_ERR_INTERNAL, "cpu backend: %s: unexpected exception", op);
    }
}

}  // namespace cpu
}  // namespace dst

#endif  // DST_BACKEND_CPU_CONVERT_H
