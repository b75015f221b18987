// Small helpers over dst_tensor views shared by the shim files of capi/ (called after the views'
// ndim and shapes were checked).
#ifndef DST_CAPI_TENSOR_VIEW_H
#define DST_CAPI_TENSOR_VIEW_H

#include <cstddef>
#include <cstdint>

#include "core/dtype.h"  // defines: dtype_size

namespace dst::capi {

// Bytes a dense view covers.
inline size_t view_bytes(const dst_tensor *t) {
    int64_t n = 1;
    for (int i = 0; i < t->ndim; ++i) n *= t->shape[i];
    return static_cast<size_t>(n) * dtype_size(t->dtype);
}

// Whether two views share any byte.
inline bool views_overlap(const dst_tensor *a, const dst_tensor *b) {
    const auto pa = reinterpret_cast<uintptr_t>(a->data), pb = reinterpret_cast<uintptr_t>(b->data);
    return pa < pb + view_bytes(b) && pb < pa + view_bytes(a);
}

}  // namespace dst::capi

#endif  // DST_CAPI_TENSOR_VIEW_H
