import java.util.Random;

import org.dstransformer.Context;
import org.dstransformer.Engine;
import org.dstransformer.EngineState;
import org.dstransformer.GradMode;
import org.dstransformer.Layer;
import org.dstransformer.LayerConfig;
import org.dstransformer.Mask;

/**
 * Training a stack of two Transformer layers with the library's engine, on the CPU.
 *
 * <p>DeepSpeed's JSON configuration (AdamW, gradient accumulation 2, WarmupLR, clipping); the weight
 * matrices in a group with weight decay, the biases and LayerNorm parameters in one without. The task:
 * map random inputs to fixed random targets (loss ½‖y − t‖²/N). Prints the loss of every fifth boundary
 * step; exits with status 1 unless it fell. Run by ctest as example_java_engine.
 */
public final class EngineExample {
    static final String CONFIG = "{\"train_micro_batch_size_per_gpu\": 2, \"gradient_accumulation_steps\": 2,"
            + " \"gradient_clipping\": 1.0,"
            + " \"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 2e-3, \"weight_decay\": 0.01}},"
            + " \"scheduler\": {\"type\": \"WarmupLR\", \"params\": {\"warmup_max_lr\": 2e-3, \"warmup_num_steps\": 5}}}";

    private EngineExample() {
    }

    /** Trains for {@code steps} boundary steps; the mean loss of each step's micro-batches. */
    public static double[] train(int steps) {
        final int batch = 2, seq = 8, hidden = 32, n = batch * seq * hidden;
        LayerConfig cfg = new LayerConfig().setHiddenSize(hidden).setHeads(4).setIntermediateSize(64)
                .setMaxBatchTokens(batch * seq).setMaxSeqLen(seq).setPreLayerNorm(true);
        try (Context ctx = Context.cpu(); Layer l0 = new Layer(ctx, cfg); Layer l1 = new Layer(ctx, cfg);
                Engine engine = new Engine(ctx, CONFIG)) {
            ctx.setRngState(11, 0);
            int noDecay = engine.addGroup(engine.group(0).withWeightDecay(0f));
            engine.addLayer(l0, "encoder.layer.0.", 0, noDecay);
            engine.addLayer(l1, "encoder.layer.1.", 0, noDecay);
            engine.zeroGrads();
            int gas = engine.state().gradientAccumulationSteps();
            Random random = new Random(5);
            float[][] xs = new float[4][n], ts = new float[4][n];
            for (int d = 0; d < 4; d++) {
                for (int i = 0; i < n; i++) {
                    xs[d][i] = random.nextFloat() * 2 - 1;
                    ts[d][i] = random.nextFloat() - 0.5f;
                }
            }
            float[] h = new float[n], y = new float[n], dy = new float[n], dh = new float[n], dx = new float[n];
            double[] losses = new double[steps];
            double sum = 0;
            int step = 0;
            for (int micro = 0; micro < steps * gas; micro++) {
                float[] x = xs[micro % 4], t = ts[micro % 4];
                l0.forward(x, h, batch, seq, Mask.none());
                l1.forward(h, y, batch, seq, Mask.none());
                double loss = 0;
                for (int i = 0; i < n; i++) {
                    double diff = y[i] - t[i];
                    loss += 0.5 * diff * diff / n;
                    dy[i] = (float) (diff / n);
                }
                sum += loss;
                engine.scaleLossGradient(dy); // × loss scale / gradient_accumulation_steps
                l1.backward(dy, dh, batch, seq, GradMode.ACCUMULATE);
                l0.backward(dh, dx, batch, seq, GradMode.ACCUMULATE);
                boolean boundary = engine.isBoundary();
                engine.step();
                if (boundary) {
                    losses[step++] = sum / gas;
                    sum = 0;
                }
            }
            EngineState st = engine.state();
            System.out.printf("%d steps (%d skipped), lr %.3g, loss scale %.0f%n", st.globalSteps(), st.skippedSteps(),
                    engine.lr(0), st.lossScale());
            return losses;
        }
    }

    public static void main(String[] args) {
        double[] losses = train(40);
        for (int i = 0; i < losses.length; i += 5) {
            System.out.printf("step %3d: loss %.6f%n", i + 1, losses[i]);
        }
        double first = losses[0], last = losses[losses.length - 1];
        System.out.printf("loss %.6f -> %.6f%n", first, last);
        if (!(last < 0.7 * first)) {
            System.err.println("the loss did not fall");
            System.exit(1);
        }
    }
}
