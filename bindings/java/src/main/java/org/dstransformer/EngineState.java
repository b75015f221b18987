package org.dstransformer;

/**
 * The resolved configuration, the counters and the loss scaler's state of an {@link Engine}
 * ({@code dst_engine_state}).
 *
 * @param trainBatchSize resolved train_batch_size
 * @param microBatchSize resolved train_micro_batch_size_per_gpu
 * @param gradientAccumulationSteps resolved gradient_accumulation_steps
 * @param fp16 fp16.enabled
 * @param bf16 bf16.enabled
 * @param dynamicLossScale fp16 with loss_scale 0
 * @param lossScale the current loss scale (1 without fp16)
 * @param gradientClipping the global-norm clipping threshold (0: off)
 * @param microSteps {@link Engine#step()} calls
 * @param globalSteps boundary steps, skipped ones included
 * @param globalSamples globalSteps × trainBatchSize
 * @param skippedSteps boundary steps skipped for an overflow
 * @param gradNorm the global norm of the last boundary's true gradients (0 when none was computed)
 * @param lastStepApplied the last boundary updated the weights
 * @param lastOverflow the last boundary's gradients held inf or NaN
 */
public record EngineState(int trainBatchSize, int microBatchSize, int gradientAccumulationSteps, boolean fp16,
                          boolean bf16, boolean dynamicLossScale, float lossScale, float gradientClipping,
                          long microSteps, long globalSteps, long globalSamples, long skippedSteps,
                          float gradNorm, boolean lastStepApplied, boolean lastOverflow) {
}
