/*
 * LayerExample.java — one training step of a Transformer layer through the Java binding, on the CPU.
 *
 * Builds a Pre-LN layer (H = 64, 4 heads), runs a training forward on random data with a padded batch
 * described by key lengths, takes the gradient of the loss L = ½‖y‖² (so dL/dy = y), runs backward and
 * reads two parameter gradients by name.
 *
 * Build and run from a build tree configured with -DDST_BUILD_JAVA=ON (ctest runs it as example_java_layer):
 *   java -Djava.library.path=build/java -cp build/java/dstransformer.jar:build/java/dstransformer-examples.jar LayerExample
 */
import java.util.Arrays;
import java.util.Random;

import org.dstransformer.Context;
import org.dstransformer.GradMode;
import org.dstransformer.Layer;
import org.dstransformer.LayerConfig;
import org.dstransformer.Library;
import org.dstransformer.Mask;
import org.dstransformer.ParamInfo;

public final class LayerExample {
    private LayerExample() {
    }

    private static double norm(float[] v) {
        double s = 0;
        for (float x : v) {
            s += (double) x * x;
        }
        return Math.sqrt(s);
    }

    public static void main(String[] args) {
        final int batch = 2;
        final int seq = 16;
        final int hidden = 64;

        // 1. A CPU context with a fixed dropout stream; 2. a Pre-LN layer, other fields at their defaults.
        try (Context ctx = Context.cpu();
                Layer layer = new Layer(ctx, new LayerConfig()
                        .setHiddenSize(hidden)
                        .setHeads(4)
                        .setMaxBatchTokens(batch * seq)
                        .setMaxSeqLen(seq)
                        .setPreLayerNorm(true))) {
            ctx.setRngState(2024, 0);
            System.out.printf("dstransformer %s — layer %d of H = %d, dtype %s%n", Library.versionString(), layer.id(),
                    layer.hiddenSize(), layer.dtype());

            // 3. Random input; the second sequence has 5 padded positions.
            Random random = new Random(7);
            float[] x = new float[batch * seq * hidden];
            for (int i = 0; i < x.length; i++) {
                x[i] = random.nextFloat() * 2 - 1;
            }
            float[] y = new float[x.length];
            layer.forward(x, y, batch, seq, Mask.keyLengths(new int[] {16, 11}));
            double n = norm(y);
            System.out.printf("forward: loss ½‖y‖² = %.4f%n", 0.5 * n * n);

            // 4. Backward with dL/dy = y.
            float[] dx = new float[x.length];
            layer.backward(y, dx, batch, seq, GradMode.WRITE);
            System.out.printf("backward: ‖dL/dx‖ = %.4f%n", norm(dx));

            // 5. Gradients by name.
            for (String name : new String[] {"attn_qkvw", "norm_w"}) {
                ParamInfo info = layer.paramInfo(name);
                float[] grad = layer.getGrad(name);
                System.out.printf("‖dL/d%s‖ = %.4f (shape %s)%n", name, norm(grad), Arrays.toString(info.shape()));
                for (float g : grad) {
                    if (!Float.isFinite(g)) {
                        System.err.println("non-finite gradient in " + name);
                        System.exit(1);
                    }
                }
            }
        }
    }
}
