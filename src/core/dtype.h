// dtype helpers shared by the core: element sizes, the compute dtype of a storage dtype, and host
// conversions between floating dtypes (copy-in/copy-out of parameters).
#ifndef DST_CORE_DTYPE_H
#define DST_CORE_DTYPE_H

#include <cstddef>
#include <cstdint>

#include "dstransformer/dstransformer.h"  // defines: dst_dtype

namespace dst {

size_t dtype_size(dst_dtype dt);                 // 0 for an unknown value
bool is_float_dtype(dst_dtype dt);               // FP32, FP16, BF16, FP64
bool is_storage_dtype(dst_dtype dt);             // the dtypes a layer can store in (the float ones)
// Statistics (LayerNorm mean/rstd, attention log-sum-exp) are kept in the compute dtype:
// double for FP64 layers, float for the others.
inline size_t stat_size(dst_dtype dt) { return dt == DST_DTYPE_FP64 ? 8 : 4; }

// Converts n elements between floating dtypes on the host (round to nearest even when narrowing).
void convert_host(const void *src, dst_dtype src_dt, void *dst, dst_dtype dst_dt, size_t n);

}  // namespace dst

#endif  // DST_CORE_DTYPE_H
