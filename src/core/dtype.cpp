#include "core/dtype.h"

#include <cmath>
#include <cstring>

#include "core/half.h"

namespace dst {

size_t dtype_size(dst_dtype dt) {
    switch (dt) {
    case DST_DTYPE_FP32: return 4;
    case DST_DTYPE_FP16: return 2;
    case DST_DTYPE_BF16: return 2;
    case DST_DTYPE_FP64: return 8;
    case DST_DTYPE_INT32: return 4;
    }
    return 0;
}

bool is_float_dtype(dst_dtype dt) {
    return dt == DST_DTYPE_FP32 || dt == DST_DTYPE_FP16 || dt == DST_DTYPE_BF16 || dt == DST_DTYPE_FP64;
}

bool is_storage_dtype(dst_dtype dt) { return is_float_dtype(dt); }

namespace {

double load(const void *p, dst_dtype dt, size_t i) {
    switch (dt) {
    case DST_DTYPE_FP32: return static_cast<const float *>(p)[i];
    case DST_DTYPE_FP64: return static_cast<const double *>(p)[i];
    case DST_DTYPE_FP16: return static_cast<float>(static_cast<const half_t *>(p)[i]);
    case DST_DTYPE_BF16: return static_cast<float>(static_cast<const bf16_t *>(p)[i]);
    case DST_DTYPE_INT32: return static_cast<const int32_t *>(p)[i];
    }
    return 0.0;
}

// double -> float rounded to odd: narrowing that to 16 bits afterwards rounds correctly (no double
// rounding), since float keeps more than two extra bits over fp16 and bf16.
float to_float_round_odd(double v) {
    float f = static_cast<float>(v);
    if (static_cast<double>(f) == v || std::isnan(v) || std::isinf(f)) return f;
    if ((float_bits(f) & 1u) == 0u) f = std::nextafter(f, v > static_cast<double>(f) ? INFINITY : -INFINITY);
    return f;
}

void store(void *p, dst_dtype dt, size_t i, double v) {
    switch (dt) {
    case DST_DTYPE_FP32: static_cast<float *>(p)[i] = static_cast<float>(v); break;
    case DST_DTYPE_FP64: static_cast<double *>(p)[i] = v; break;
    case DST_DTYPE_FP16: static_cast<half_t *>(p)[i] = half_t(to_float_round_odd(v)); break;
    case DST_DTYPE_BF16: static_cast<bf16_t *>(p)[i] = bf16_t(to_float_round_odd(v)); break;
    case DST_DTYPE_INT32: static_cast<int32_t *>(p)[i] = static_cast<int32_t>(v); break;
    }
}

}  // namespace

void convert_host(const void *src, dst_dtype src_dt, void *dst, dst_dtype dst_dt, size_t n) {
    if (src_dt == dst_dt) {
        std::memcpy(dst, src, n * dtype_size(src_dt));
        return;
    }
    for (size_t i = 0; i < n; ++i) store(dst, dst_dt, i, load(src, src_dt, i));
}

}  // namespace dst
