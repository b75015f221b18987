package org.dstransformer;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.nio.file.Path;
import java.util.Random;

import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

/**
 * The training engine: the loss of one layer falls under LAMB, config errors, the zeroGradsOnStep setting,
 * loss scaler state, checkpoints.
 */
class EngineTest {
    private static LayerConfig small(DType dtype) {
        return new LayerConfig().setHiddenSize(16).setHeads(2).setIntermediateSize(24).setMaxBatchTokens(8)
                .setMaxSeqLen(4).setDtype(dtype);
    }

    @Test
    void lossFallsWithLamb() {
        try (Context ctx = Context.cpu(); Layer layer = new Layer(ctx, small(DType.FP32));
                Engine engine = new Engine(ctx, "{\"train_batch_size\": 2, \"optimizer\": {\"type\": \"LAMB\","
                        + " \"params\": {\"lr\": 5e-2, \"weight_decay\": 0.01}}}")) {
            engine.addLayer(layer, "", 0, 0);
            engine.zeroGrads();
            Random r = new Random(3);
            int n = 2 * 4 * 16;
            float[] x = new float[n], target = new float[n], y = new float[n], dy = new float[n], dx = new float[n];
            for (int i = 0; i < n; i++) {
                x[i] = r.nextFloat() * 2 - 1;
                target[i] = 0.3f * (r.nextFloat() - 0.5f);
            }
            double first = 0, last = 0;
            for (int step = 0; step < 60; step++) {
                layer.forward(x, y, 2, 4, Mask.none());
                double loss = 0;
                for (int i = 0; i < n; i++) {
                    loss += 0.5 * (y[i] - target[i]) * (y[i] - target[i]) / n;
                    dy[i] = (y[i] - target[i]) / n;
                }
                first = step == 0 ? loss : first;
                last = loss;
                engine.scaleLossGradient(dy);
                layer.backward(dy, dx, 2, 4, GradMode.ACCUMULATE);
                engine.step();
            }
            assertTrue(last < 0.8 * first, first + " -> " + last);
            assertEquals(60, engine.state().globalSteps());
        }
    }

    @Test
    void configErrorsCarryTheKeyPath() {
        DstException e = assertThrows(DstException.class, () -> Engine.validateConfig(
                "{\"train_batch_size\": 4, \"optimizer\": {\"type\": \"adam\", \"params\": {\"weight_decy\": 0}}}"));
        assertEquals(Status.INVALID_ARGUMENT, e.status());
        assertTrue(e.getMessage().contains("optimizer.params.weight_decy"), e.getMessage());
        try (Context ctx = Context.cpu()) {
            DstException u = assertThrows(DstException.class,
                    () -> new Engine(ctx, "{\"train_batch_size\": 4, \"optimizer\": {\"type\": \"lion\"}}"));
            assertEquals(Status.UNSUPPORTED, u.status());
        }
    }

    @Test
    void zeroGradsOnStepSetting() {
        try (Context ctx = Context.cpu()) {
            Engine engine = new Engine(ctx, "{\"train_batch_size\": 2, \"optimizer\": {\"type\": \"adam\"}}");
            assertTrue(engine.zeroGradsOnStep()); // the default: zeroed at each boundary, as DeepSpeed
            engine.setZeroGradsOnStep(false);
            assertFalse(engine.zeroGradsOnStep());
            engine.setZeroGradsOnStep(true);
            assertTrue(engine.zeroGradsOnStep());
            engine.setZeroGradsOnStep(false);
            assertFalse(engine.zeroGradsOnStep());
            engine.close();
            assertThrows(IllegalStateException.class, engine::zeroGradsOnStep);
            assertThrows(IllegalStateException.class, () -> engine.setZeroGradsOnStep(true));
        }
    }

    @Test
    void lossScalerStateGroupsAndCheckpoint(@TempDir Path dir) throws Exception {
        try (Context ctx = Context.cpu(); Layer layer = new Layer(ctx, small(DType.FP16));
                Engine engine = new Engine(ctx, "{\"train_batch_size\": 2, \"gradient_accumulation_steps\": 2,"
                        + " \"optimizer\": {\"type\": \"adamw\", \"params\": {\"lr\": 1e-3, \"weight_decay\": 0.1}},"
                        + " \"fp16\": {\"enabled\": true, \"loss_scale\": 0, \"initial_scale_power\": 10}}")) {
            int g = engine.addGroup(engine.group(0).withWeightDecay(0f));
            assertEquals(1, g);
            assertEquals(0f, engine.group(1).weightDecay());
            engine.addLayer(layer, "l.", 0, g);
            engine.zeroGrads();
            EngineState st = engine.state();
            assertTrue(st.fp16() && st.dynamicLossScale());
            assertEquals(1024f, st.lossScale());
            assertEquals(1, st.microBatchSize());
            float[] dy = {1f, 1f, 1f};
            engine.scaleLossGradient(dy);
            assertEquals(512f, dy[0]); // × 1024 / 2
            assertFalse(engine.isBoundary());
            engine.step();
            assertTrue(engine.isBoundary());
            engine.step();
            st = engine.state();
            assertEquals(1, st.globalSteps());
            assertTrue(st.lastStepApplied() && !st.lastOverflow());
            engine.saveCheckpoint(dir.toString(), "t1", "{\"epoch\": 2, \"list\": [1, [2]]}");
            assertThrows(DstException.class, () -> engine.saveCheckpoint(dir.toString(), "bad", "{oops"));
            assertEquals("{\"epoch\":2,\"list\":[1,[2]]}", engine.loadCheckpoint(dir.toString(), null));
            DstException io = assertThrows(DstException.class, () -> engine.loadCheckpoint(dir.toString(), "missing"));
            assertEquals(Status.IO, io.status());
            Layer other = new Layer(ctx, small(DType.FP16));
            engine.addLayer(other, "other.", 0, g);
            other.close(); // a registered layer closed while the engine lives: the next step refuses
            assertThrows(IllegalStateException.class, engine::step);
        }
    }
}
