// The accuracy bounds of the layer and its ops (relative L2 against FP64), shared by the test suites.
#ifndef DST_TESTS_COMMON_BOUNDS_H
#define DST_TESTS_COMMON_BOUNDS_H

#include "dstransformer/dstransformer.h"  // defines: dst_dtype

namespace dsttest {

// Relative L2 bound of a result in dtype `dt` against FP64 computed from the same (rounded) inputs:
// fp32 1e-5 (TF32 off), fp16 1e-3, bf16 1e-2, fp64 1e-12 (summation order only). One final rounding
// alone costs ~2^-11/√3 ≈ 2.8e-4 (fp16) and ~2^-8/√3 ≈ 2.3e-3 (bf16) relative RMS.
inline double design_tolerance(dst_dtype dt) {
    switch (dt) {
        case DST_DTYPE_FP64: return 1e-12;
        case DST_DTYPE_FP32: return 1e-5;
        case DST_DTYPE_FP16: return 1e-3;
        default: return 1e-2;
    }
}

}  // namespace dsttest

#endif  // DST_TESTS_COMMON_BOUNDS_H
