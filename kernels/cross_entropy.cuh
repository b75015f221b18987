// Softmax cross-entropy kernels of the fused linear + cross-entropy op (dst_linear_cross_entropy):
// the logits z = h·Wᵀ come from a cuBLASLt GEMM into the workspace (compute type, [m, v]); these
// kernels add the bias, take each row's log-sum-exp, loss and argmax, write the logit gradient
// g = grad_scale·(softmax − onehot)/count in the storage type, and reduce the loss. All reductions
// have a fixed order; no atomics.
#ifndef DST_KERNELS_CROSS_ENTROPY_CUH
#define DST_KERNELS_CROSS_ENTROPY_CUH

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "dstransformer/dstransformer.h"  // defines: dst_dtype

namespace dst {
namespace cuda {

// Workspace bytes of cross_entropy_rows + cross_entropy_reduce for m rows (row losses, hits, count).
size_t cross_entropy_workspace(dst_dtype dt, int64_t m);
// z: [m, v] logits in the compute type (bias not yet added); b: [v] storage or nullptr; labels [m]
// (−1, and any other value outside [0, v), ignored). g: [m, v] storage-type gradient output, or
// nullptr (no gradients); g may alias z when the storage type is the compute type. Writes loss[0]
// (compute type) and, when counts != nullptr, counts[0] = valid labels, counts[1] = rows whose first
// largest logit is the label.
cudaError_t cross_entropy(cudaStream_t stream, dst_dtype dt, const void *z, const void *b, const int32_t *labels,
                         int64_t m, int64_t v, double grad_scale, void *g, void *loss, int32_t *counts,
                         void *workspace);

}  // namespace cuda
}  // namespace dst

#endif  // DST_KERNELS_CROSS_ENTROPY_CUH
