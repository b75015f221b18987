// Optimizer kernels of the CUDA backend: the multi-tensor optimizer step (Adam, AdamW, LAMB over a
// table of tensors, with the global gradient norm, the overflow check, the loss scaler, clipping and
// the learning-rate schedule evaluated on the device), and two helpers of the training engine: the
// scaling of a tensor by a device scalar (the loss scale) and dtype conversion (fp32 masters).
// Every launcher takes the stream first, only enqueues work (never synchronizes, never allocates)
// and returns the launch's cudaError_t.
#ifndef DST_KERNELS_OPTIM_CUH
#define DST_KERNELS_OPTIM_CUH

#include <cuda_runtime_api.h>

#include <cstdint>

#include "dstransformer/dstransformer.h"  // defines: dst_dtype
#include "kernels/optim_args.h"            // defines: optim::StepArgs

namespace dst {
namespace cuda {

// One optimizer step: the passes of kernels/optim_args.h (norm, finalize, LAMB moments and ratios,
// update) as 2 to 5 kernels, however many tensors the table has. Skipping is decided on the device.
cudaError_t optim_step(cudaStream_t stream, const optim::StepArgs &a);
// x[i] ← x[i]·((*factor)·mult) over count elements of a floating dtype.
cudaError_t scale_by(cudaStream_t stream, dst_dtype dt, void *x, int64_t count, const float *factor, float mult);
// dst[i] = src[i] between floating dtypes (round to nearest even).
cudaError_t convert(cudaStream_t stream, dst_dtype src_dt, const void *src, dst_dtype dst_dt, void *dst,
                    int64_t count);

}  // namespace cuda
}  // namespace dst

#endif  // DST_KERNELS_OPTIM_CUH
