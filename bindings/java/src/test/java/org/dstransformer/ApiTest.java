package org.dstransformer;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNotEquals;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;
import static org.junit.jupiter.api.Assumptions.assumeTrue;

import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.nio.FloatBuffer;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.List;
import java.util.Random;

import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

/** API tests of the Java binding on the CPU backend: the same ground as the Python and Rust tests. */
class ApiTest {
    private static final int H = 8;

    private static LayerConfig tiny(DType dtype, float dropout) {
        return new LayerConfig()
                .setHiddenSize(H)
                .setHeads(2)
                .setIntermediateSize(16)
                .setMaxBatchTokens(64)
                .setMaxSeqLen(16)
                .setAttnDropoutRatio(dropout)
                .setHiddenDropoutRatio(dropout)
                .setInitializerRange(0.3f)
                .setLayerNormEps(1e-5f)
                .setDtype(dtype);
    }

    private static float[] randomFloats(Random r, int n) {
        float[] v = new float[n];
        for (int i = 0; i < n; i++) {
            v[i] = r.nextFloat() * 2 - 1;
        }
        return v;
    }

    private static double[] randomDoubles(Random r, int n) {
        double[] v = new double[n];
        for (int i = 0; i < n; i++) {
            v[i] = r.nextDouble() * 2 - 1;
        }
        return v;
    }

    private static double relErr(double[] a, double[] b) {
        double num = 0;
        double den = 0;
        for (int i = 0; i < a.length; i++) {
            num += (a[i] - b[i]) * (a[i] - b[i]);
            den += b[i] * b[i];
        }
        return Math.sqrt(num) / Math.max(Math.sqrt(den), 1e-300);
    }

    @Test
    void versionMatchesHeader() {
        assertEquals(Library.HEADER_VERSION, Library.version());
        String[] parts = Library.versionString().split("\\.");
        assertEquals(3, parts.length);
        int v = Integer.parseInt(parts[0]) * 10000 + Integer.parseInt(parts[1]) * 100 + Integer.parseInt(parts[2]);
        assertEquals(Library.HEADER_VERSION, v);
        assertTrue(Library.cudaDeviceCount() >= 0);
    }

    @Test
    void statusNamesAndLookup() {
        assertEquals(3, Status.CAPACITY.code());
        assertEquals(Status.CAPACITY, Status.fromCode(3));
        assertEquals("DST_ERR_CAPACITY", Status.nameOf(3));
        assertEquals(2, DType.BF16.size());
        assertEquals("bf16", DType.BF16.libraryName());
        assertEquals(Param.ATTN_QKVW, Param.lookup("bert.encoder.layer.3.attn_qkvw"));
        DstException e = assertThrows(DstException.class, () -> Param.lookup("nope"));
        assertEquals(Status.INVALID_ARGUMENT, e.status());
    }

    @Test
    void badConfigFieldThrowsWithMessage() {
        DstException e = assertThrows(DstException.class, () -> new LayerConfig().setHiddenSize(30).setHeads(4).validate());
        assertEquals(Status.INVALID_ARGUMENT, e.status());
        assertEquals(1, e.statusCode());
        assertTrue(e.message().contains("heads"), e.message());
        assertTrue(e.getMessage().startsWith("DST_ERR_INVALID_ARGUMENT: "), e.getMessage());

        try (Context ctx = Context.cpu()) {
            DstException e2 = assertThrows(DstException.class,
                    () -> new Layer(ctx, new LayerConfig().setLayerNormEps(0f)));
            assertEquals(Status.INVALID_ARGUMENT, e2.status());
            assertTrue(e2.message().contains("layer_norm_eps"), e2.message());
        }
        DstException e3 = assertThrows(DstException.class, () -> new Context(Backend.CPU, 3));
        assertEquals(Status.INVALID_ARGUMENT, e3.status());
    }

    @Test
    void configDefaultsAndRoundTrip() {
        LayerConfig d = new LayerConfig();
        assertEquals(1024, d.getHiddenSize());
        assertEquals(16, d.getHeads());
        assertEquals(42L, d.getSeed());
        assertTrue(d.getPreLayerNorm());
        assertEquals(DType.FP32, d.getDtype());
        assertEquals(Gelu.ERF, d.getGelu());
        assertTrue(tiny(DType.FP32, 0.1f).savedBytes(2, 4) > 0);
        assertTrue(tiny(DType.FP32, 0.1f).workspaceBytes(2, 4) > 0);
        try (Context ctx = Context.cpu(); Layer layer = new Layer(ctx, tiny(DType.FP32, 0.1f).setSeed(-5L).setGelu(Gelu.TANH))) {
            LayerConfig got = layer.config();
            assertEquals(16, got.getIntermediateSize());
            assertEquals(-5L, got.getSeed());
            assertEquals(Gelu.TANH, got.getGelu());
            assertEquals(tiny(DType.FP32, 0.1f).setSeed(-5L).setGelu(Gelu.TANH), got);
        }
    }

    @Test
    void contextState() {
        try (Context ctx = Context.cpu()) {
            assertEquals(Backend.CPU, ctx.backend());
            ctx.setRngState(1234, 77);
            assertEquals(new Context.RngState(1234, 77), ctx.rngState());
            assertEquals(0L, ctx.rngGraphCounter());
            ctx.setRngGraphCounter(4294967295L);
            assertEquals(4294967295L, ctx.rngGraphCounter());
            assertThrows(DstException.class, () -> ctx.setRngGraphCounter(1L << 32));
            ctx.setRngState(1234, 77);
            assertEquals(0L, ctx.rngGraphCounter());
            ctx.setNumThreads(1);
            assertEquals(1, ctx.numThreads());
            assertEquals(IndexChecks.EAGER, ctx.indexChecks());
            ctx.setIndexChecks(IndexChecks.DEFERRED);
            assertEquals(IndexChecks.DEFERRED, ctx.indexChecks());
            ctx.setIndexChecks(IndexChecks.EAGER);
            assertEquals(IndexChecks.EAGER, ctx.indexChecks());
            ctx.synchronize();
            assertEquals(0L, ctx.stream());
        }
    }

    @Test
    void capacityError() {
        try (Context ctx = Context.cpu(); Layer layer = new Layer(ctx, tiny(DType.FP32, 0.1f))) {
            int b = 5;
            int s = 16; // 80 tokens > max_batch_tokens 64
            float[] x = new float[b * s * H];
            float[] y = new float[b * s * H];
            DstException e = assertThrows(DstException.class, () -> layer.forward(x, y, b, s, null));
            assertEquals(Status.CAPACITY, e.status());
            assertTrue(e.message().contains("max_batch_tokens"), e.message());
        }
    }

    @Test
    void backwardWithoutForwardIsAStateError() {
        try (Context ctx = Context.cpu(); Layer layer = new Layer(ctx, tiny(DType.FP32, 0.1f))) {
            float[] dy = new float[2 * 4 * H];
            float[] dx = new float[2 * 4 * H];
            DstException e = assertThrows(DstException.class, () -> layer.backward(dy, dx, 2, 4, GradMode.WRITE));
            assertEquals(Status.STATE, e.status());
            assertFalse(e.message().isEmpty());
        }
    }

    @Test
    void lengthsAndTypesAreCheckedBeforeTheCall() {
        try (Context ctx = Context.cpu(); Layer layer = new Layer(ctx, tiny(DType.FP32, 0.1f))) {
            float[] y = new float[2 * 4 * H];
            DstException e = assertThrows(DstException.class, () -> layer.forward(new float[10], y, 2, 4, null));
            assertEquals(Status.INVALID_ARGUMENT, e.status());
            assertTrue(e.message().contains("input"), e.message());
            float[] x = new float[2 * 4 * H];
            e = assertThrows(DstException.class, () -> layer.forward(x, y, 2, 4, Mask.keyLengths(new int[] {4})));
            assertTrue(e.message().contains("key lengths"), e.message());
            // double[] data on an FP32 layer: the library refuses the dtype.
            e = assertThrows(DstException.class,
                    () -> layer.forward(new double[2 * 4 * H], new double[2 * 4 * H], 2, 4, null));
            assertEquals(Status.INVALID_ARGUMENT, e.status());
            // short[] data needs a 16-bit layer.
            e = assertThrows(DstException.class,
                    () -> layer.forward(new short[2 * 4 * H], new short[2 * 4 * H], 2, 4, null));
            assertEquals(Status.INVALID_ARGUMENT, e.status());
            // Heap and wrong-order buffers are refused.
            e = assertThrows(DstException.class,
                    () -> layer.forward(FloatBuffer.allocate(64), FloatBuffer.allocate(64), 2, 4, null));
            assertTrue(e.message().contains("direct"), e.message());
            ByteBuffer big = ByteBuffer.allocateDirect(4 * 64).order(ByteOrder.BIG_ENDIAN);
            if (ByteOrder.nativeOrder() != ByteOrder.BIG_ENDIAN) {
                e = assertThrows(DstException.class, () -> layer.forward(big, big.duplicate(), 2, 4, null));
                assertTrue(e.message().contains("byte order"), e.message());
            }
        }
    }

    @Test
    void forwardBackwardWithBothMaskKinds() {
        try (Context ctx = Context.cpu(); Layer layer = new Layer(ctx, tiny(DType.FP32, 0.1f))) {
            ctx.setRngState(7, 0);
            int b = 2;
            int s = 5;
            Random r = new Random(99);
            float[] x = randomFloats(r, b * s * H);
            float[] dy = randomFloats(r, b * s * H);
            float[] additive = new float[b * s];
            additive[s + 3] = -10000f;
            additive[s + 4] = -10000f;
            for (Mask mask : new Mask[] {Mask.none(), Mask.additive(additive), Mask.keyLengths(new int[] {5, 3}), null}) {
                float[] y = new float[b * s * H];
                float[] dx = new float[b * s * H];
                java.util.Arrays.fill(y, Float.NaN);
                java.util.Arrays.fill(dx, Float.NaN);
                layer.forward(x, y, b, s, mask);
                layer.backward(dy, dx, b, s, GradMode.WRITE);
                for (int i = 0; i < y.length; i++) {
                    assertTrue(Float.isFinite(y[i]) && Float.isFinite(dx[i]), String.valueOf(mask));
                }
                float[] g = layer.getGrad("attn_qkvw");
                assertEquals(3 * H * H, g.length);
                boolean nonzero = false;
                for (float v : g) {
                    assertTrue(Float.isFinite(v));
                    nonzero |= v != 0f;
                }
                assertTrue(nonzero);
            }
            // In inference both forms of masking the last two keys of sequence 1 agree.
            layer.eval();
            assertFalse(layer.isTraining());
            float[] y1 = new float[b * s * H];
            float[] y2 = new float[b * s * H];
            layer.forward(x, y1, b, s, Mask.additive(additive));
            layer.forward(x, y2, b, s, Mask.keyLengths(new int[] {5, 3}));
            assertArrayEquals(y1, y2, 1e-5f);

            // Direct buffers give the same result as arrays (no copy on the CPU).
            FloatBuffer xb = ByteBuffer.allocateDirect(4 * x.length).order(ByteOrder.nativeOrder()).asFloatBuffer();
            xb.put(x).flip();
            FloatBuffer yb = ByteBuffer.allocateDirect(4 * x.length).order(ByteOrder.nativeOrder()).asFloatBuffer();
            layer.forward(xb, yb, b, s, Mask.keyLengths(new int[] {5, 3}));
            float[] y3 = new float[x.length];
            yb.get(y3);
            assertArrayEquals(y2, y3, 0f);

            // Saved activations of their own: inference kept nothing, training fills them.
            layer.train();
            try (SavedActivations saved = layer.newSavedActivations()) {
                float[] dx = new float[b * s * H];
                DstException e = assertThrows(DstException.class, () -> layer.backward(saved, dy, dx, b, s, GradMode.WRITE));
                assertEquals(Status.STATE, e.status());
                layer.forward(saved, x, y1, b, s, Mask.none());
                assertTrue(saved.bytes() > 0);
                layer.backward(saved, dy, dx, b, s, GradMode.WRITE);
                saved.release();
                assertEquals(0L, saved.bytes());
            }
        }
    }

    /** Offsets [B + 1] of sequences of {@code lengths}. */
    private static int[] offsets(int[] lengths) {
        int[] cu = new int[lengths.length + 1];
        for (int b = 0; b < lengths.length; b++) {
            cu[b + 1] = cu[b] + lengths[b];
        }
        return cu;
    }

    /** ‖a − b‖ / ‖b‖ (0 when both are zero). */
    private static double relL2(float[] a, float[] b) {
        double num = 0, den = 0;
        for (int i = 0; i < a.length; i++) {
            num += ((double) a[i] - b[i]) * ((double) a[i] - b[i]);
            den += (double) b[i] * b[i];
        }
        return den > 0 ? Math.sqrt(num / den) : Math.sqrt(num);
    }

    // Packed rows agree with the padded layer up to GEMM rounding (the BLAS kernel may round the rows at
    // the edge of a block differently), with the same dropout masks: fp32 within 2e-5 per sequence, where
    // a different mask would be off by O(1).
    private static final double PACKED_BOUND = 2e-5;

    @Test
    void packedRowsMatchThePaddedLayer() {
        int[] lengths = {3, 8, 1, 5};
        int b = lengths.length;
        int s = 8;
        int[] cu = offsets(lengths);
        int n = cu[b];
        Random r = new Random(21);
        float[] x = randomFloats(r, n * H);
        float[] dy = randomFloats(r, n * H);
        float[] xp = new float[b * s * H];
        float[] dyp = new float[b * s * H];
        for (int i = 0; i < b; i++) {
            System.arraycopy(x, cu[i] * H, xp, i * s * H, lengths[i] * H);
            System.arraycopy(dy, cu[i] * H, dyp, i * s * H, lengths[i] * H);
        }
        try (Context ctx = Context.cpu(); Layer layer = new Layer(ctx, tiny(DType.FP32, 0.1f))) {
            // The padded reference: [B, S, H] with key lengths, dropout on.
            ctx.setRngState(11, 0);
            float[] yp = new float[b * s * H];
            float[] dxp = new float[b * s * H];
            layer.forward(xp, yp, b, s, Mask.keyLengths(lengths));
            layer.backward(dyp, dxp, b, s, GradMode.WRITE);
            float[][] gp = new float[Param.values().length][];
            for (Param p : Param.values()) {
                gp[p.ordinal()] = layer.getGrad(p.paramName());
            }

            // The same RNG state, packed, through a saved object of its own.
            ctx.setRngState(11, 0);
            float[] y = new float[n * H];
            float[] dx = new float[n * H];
            java.util.Arrays.fill(y, Float.NaN);
            java.util.Arrays.fill(dx, Float.NaN);
            try (SavedActivations saved = layer.newSavedActivations()) {
                layer.forwardPacked(saved, x, y, cu, s);
                layer.backwardPacked(saved, dy, dx, GradMode.WRITE);
            }
            for (int i = 0; i < y.length; i++) {
                assertTrue(Float.isFinite(y[i]) && Float.isFinite(dx[i]), "row " + i / H);
            }
            for (int i = 0; i < b; i++) {
                int rows = lengths[i] * H;
                double ey = relL2(java.util.Arrays.copyOfRange(y, cu[i] * H, cu[i] * H + rows),
                        java.util.Arrays.copyOfRange(yp, i * s * H, i * s * H + rows));
                assertTrue(ey <= PACKED_BOUND, "output of sequence " + i + ": " + ey);
                double ed = relL2(java.util.Arrays.copyOfRange(dx, cu[i] * H, cu[i] * H + rows),
                        java.util.Arrays.copyOfRange(dxp, i * s * H, i * s * H + rows));
                assertTrue(ed <= PACKED_BOUND, "dX of sequence " + i + ": " + ed);
            }
            for (Param p : Param.values()) {
                double e = relL2(layer.getGrad(p.paramName()), gp[p.ordinal()]);
                assertTrue(e <= PACKED_BOUND, p.paramName() + ": " + e);
            }

            // Dropout is on: another RNG state gives other masks, far outside the bound (not vacuous).
            ctx.setRngState(12, 0);
            float[] other = new float[n * H];
            layer.forwardPacked(x, other, cu, s);
            assertTrue(relL2(other, y) > 100 * PACKED_BOUND);
            // The default saved object now holds a packed forward: the padded backward refuses it.
            DstException e = assertThrows(DstException.class, () -> layer.backward(dyp, dxp, b, s, GradMode.WRITE));
            assertEquals(Status.STATE, e.status());
            assertTrue(e.message().contains("packed"), e.message());
            layer.backwardPacked(dy, dx, GradMode.WRITE);
        }
    }

    @Test
    void packedOffsetsAndLengthsAreChecked() {
        try (Context ctx = Context.cpu(); Layer layer = new Layer(ctx, tiny(DType.FP32, 0.1f))) {
            int n = 6;
            float[] x = randomFloats(new Random(3), n * H);
            float[] y = new float[n * H];
            java.util.Arrays.fill(y, 7f);
            // Offsets ending at 5, not N = 6: refused before anything is written.
            DstException e = assertThrows(DstException.class, () -> layer.forwardPacked(x, y, new int[] {0, 2, 5}, 8));
            assertEquals(Status.INVALID_ARGUMENT, e.status());
            assertTrue(e.message().contains("cu_seqlens"), e.message());
            for (float v : y) {
                assertEquals(7f, v);
            }
            // Offsets that go backwards (a negative length).
            e = assertThrows(DstException.class, () -> layer.forwardPacked(x, y, new int[] {0, 4, 2, 6}, 8));
            assertEquals(Status.INVALID_ARGUMENT, e.status());
            assertTrue(e.message().contains("cu_seqlens"), e.message());
            // A sequence longer than maxSeqlen (lengths 1 and 5, maxSeqlen 4).
            e = assertThrows(DstException.class, () -> layer.forwardPacked(x, y, new int[] {0, 1, 6}, 4));
            assertEquals(Status.INVALID_ARGUMENT, e.status());
            assertTrue(e.message().contains("cu_seqlens") && e.message().contains("max_seqlen"), e.message());
            // Checked by the binding: too few offsets, rows that are not [N, H], mismatched output.
            e = assertThrows(DstException.class, () -> layer.forwardPacked(x, y, new int[] {0}, 8));
            assertTrue(e.message().contains("cuSeqlens"), e.message());
            e = assertThrows(DstException.class, () -> layer.forwardPacked(new float[n * H - 1], y, new int[] {0, 6}, 8));
            assertTrue(e.message().contains("input") && e.message().contains("[N, " + H + "]"), e.message());
            e = assertThrows(DstException.class, () -> layer.forwardPacked(x, new float[H], new int[] {0, 6}, 8));
            assertTrue(e.message().contains("output"), e.message());
            assertThrows(NullPointerException.class, () -> layer.forwardPacked(x, y, null, 8));
            // max_seqlen above the layer's max_seq_len (16) is a capacity error.
            e = assertThrows(DstException.class, () -> layer.forwardPacked(x, y, new int[] {0, 6}, 17));
            assertEquals(Status.CAPACITY, e.status());
            // Backward: no packed forward yet, then a gradient of the wrong N.
            float[] dx = new float[n * H];
            e = assertThrows(DstException.class, () -> layer.backwardPacked(x, dx, GradMode.WRITE));
            assertEquals(Status.STATE, e.status());
            layer.forwardPacked(x, y, new int[] {0, 2, 6}, 4);
            e = assertThrows(DstException.class, () -> layer.backwardPacked(x, new float[2 * H], GradMode.WRITE));
            assertTrue(e.message().contains("gradInput"), e.message());
            e = assertThrows(DstException.class,
                    () -> layer.backwardPacked(new float[2 * H], new float[2 * H], GradMode.WRITE));
            assertEquals(Status.INVALID_ARGUMENT, e.status());
            assertTrue(e.message().contains("grad_output"), e.message());
            layer.backwardPacked(x, dx, GradMode.WRITE);
        }
    }

    @Test
    void paramRoundTripAndInfo() {
        try (Context ctx = Context.cpu(); Layer layer = new Layer(ctx, tiny(DType.FP32, 0.1f))) {
            ParamInfo info = layer.paramInfo("inter_w");
            assertEquals("inter_w", info.name());
            assertArrayEquals(new long[] {16, H}, info.shape());
            assertEquals(16L * H, info.numel());
            assertEquals(0L, info.offsetBytes() % 256);
            List<ParamInfo> all = layer.params();
            assertEquals(12, all.size());
            assertArrayEquals(new long[] {3 * H, H}, all.get(0).shape());

            float[] values = new float[16 * H];
            for (int i = 0; i < values.length; i++) {
                values[i] = i * 0.25f - 3f;
            }
            layer.setParam("inter_w", values);
            assertArrayEquals(values, layer.getParam("inter_w"), 0f);
            assertEquals(values[5], layer.getParamDouble("inter_w")[5], 0.0);
            ByteBuffer arena = layer.paramArena();
            assertEquals(layer.arenaBytes(), arena.capacity());
            assertEquals(values[5], arena.getFloat((int) info.offsetBytes() + 4 * 5), 0f);

            DstException e = assertThrows(DstException.class, () -> layer.setParam("inter_w", new float[3]));
            assertEquals(Status.INVALID_ARGUMENT, e.status());
            e = assertThrows(DstException.class, () -> layer.setParam("no_such", values));
            assertEquals(Status.INVALID_ARGUMENT, e.status());
            assertEquals(0, layer.id());
            try (Layer second = new Layer(ctx, tiny(DType.FP32, 0.1f))) {
                assertEquals(1, second.id());
            }
        }
    }

    @Test
    void halfLayerTakesShorts() {
        try (Context ctx = Context.cpu(); Layer layer = new Layer(ctx, tiny(DType.BF16, 0f))) {
            short[] ones = new short[H];
            java.util.Arrays.fill(ones, (short) 0x3F80); // 1.0 in bf16
            layer.setParam("norm_w", ones);
            float[] back = layer.getParam("norm_w");
            for (float v : back) {
                assertEquals(1f, v, 0f);
            }
            Random r = new Random(3);
            short[] x = new short[4 * H];
            for (int i = 0; i < x.length; i++) {
                x[i] = (short) (Float.floatToIntBits(r.nextFloat() - 0.5f) >>> 16);
            }
            short[] y = new short[4 * H];
            layer.forward(x, y, 1, 4, null);
            for (short v : y) {
                assertTrue(Float.isFinite(Float.intBitsToFloat((v & 0xFFFF) << 16)));
            }
        }
    }

    /** Loss L = Σ w·y for fixed random w, so dL/dy = w. */
    private static double loss(Layer layer, double[] x, double[] w, int b, int s, Mask mask) {
        double[] y = new double[x.length];
        layer.forward(x, y, b, s, mask);
        double l = 0;
        for (int i = 0; i < y.length; i++) {
            l += w[i] * y[i];
        }
        return l;
    }

    @Test
    void gradientsMatchFiniteDifferencesInFp64() {
        try (Context ctx = Context.cpu(); Layer layer = new Layer(ctx, tiny(DType.FP64, 0f))) {
            int b = 2;
            int s = 3;
            Random r = new Random(2024);
            // Non-trivial biases and LayerNorm parameters, so that every gradient is exercised.
            for (Param p : Param.values()) {
                ParamInfo info = layer.paramInfo(p);
                if (info.shape().length == 1) {
                    double[] v = randomDoubles(r, (int) info.numel());
                    boolean gamma = p == Param.ATTN_NW || p == Param.NORM_W;
                    for (int i = 0; i < v.length; i++) {
                        v[i] = gamma ? 1 + 0.3 * v[i] : 0.3 * v[i];
                    }
                    layer.setParam(p.paramName(), v);
                }
            }
            double[] x = randomDoubles(r, b * s * H);
            double[] w = randomDoubles(r, b * s * H);
            Mask mask = Mask.keyLengths(new int[] {3, 2});
            double[] y = new double[x.length];
            double[] dx = new double[x.length];
            layer.forward(x, y, b, s, mask);
            layer.backward(w, dx, b, s, GradMode.WRITE);

            double eps = 1e-6;
            int m = (x.length + 4) / 5;
            double[] fd = new double[m];
            double[] an = new double[m];
            for (int k = 0, i = 0; i < x.length; i += 5, k++) {
                double[] xp = x.clone();
                xp[i] += eps;
                double lp = loss(layer, xp, w, b, s, mask);
                xp[i] -= 2 * eps;
                double lm = loss(layer, xp, w, b, s, mask);
                fd[k] = (lp - lm) / (2 * eps);
                an[k] = dx[i];
            }
            double e = relErr(an, fd);
            assertTrue(e < 1e-6, "dX relative error " + e);

            for (Param p : Param.values()) {
                String name = p.paramName();
                double[] grad = layer.getGradDouble(name);
                double[] base = layer.getParamDouble(name);
                int step = base.length / 5 + 1;
                int count = (base.length + step - 1) / step;
                double[] pfd = new double[count];
                double[] pan = new double[count];
                for (int k = 0, j = 0; j < base.length; j += step, k++) {
                    double[] v = base.clone();
                    v[j] += eps;
                    layer.setParam(name, v);
                    double lp = loss(layer, x, w, b, s, mask);
                    v[j] -= 2 * eps;
                    layer.setParam(name, v);
                    double lm = loss(layer, x, w, b, s, mask);
                    pfd[k] = (lp - lm) / (2 * eps);
                    pan[k] = grad[j];
                }
                layer.setParam(name, base);
                double pe = relErr(pan, pfd);
                assertTrue(pe < 1e-6, name + ": relative error " + pe);
            }
        }
    }

    @Test
    void accumulateAddsToTheGradients() {
        try (Context ctx = Context.cpu(); Layer layer = new Layer(ctx, tiny(DType.FP64, 0f))) {
            Random r = new Random(5);
            double[] x = randomDoubles(r, 4 * H);
            double[] dy = randomDoubles(r, 4 * H);
            double[] y = new double[x.length];
            double[] dx = new double[x.length];
            layer.forward(x, y, 1, 4, null);
            layer.backward(dy, dx, 1, 4, GradMode.WRITE);
            double[] once = layer.getGradDouble("output_w");
            layer.backward(dy, dx, 1, 4, GradMode.ACCUMULATE);
            double[] twice = layer.getGradDouble("output_w");
            for (int i = 0; i < once.length; i++) {
                assertEquals(2 * once[i], twice[i], 1e-12 * (1 + Math.abs(once[i])));
            }
            layer.zeroGrads();
            for (double v : layer.getGradDouble("output_w")) {
                assertEquals(0.0, v, 0.0);
            }
        }
    }

    @Test
    void checkpointRoundTrip(@TempDir Path dir) {
        try (Context ctx = Context.cpu();
                Layer a = new Layer(ctx, tiny(DType.FP32, 0.1f));
                Layer b = new Layer(ctx, tiny(DType.FP32, 0.1f).setSeed(7))) {
            Path path = dir.resolve("layer.safetensors");
            Checkpoint.save(path, new CheckpointOptions().setClientState("step=12"), a);
            assertTrue(Files.exists(path));
            assertFalse(java.util.Arrays.equals(a.getParam("attn_qkvw"), b.getParam("attn_qkvw")));
            assertEquals("step=12", Checkpoint.load(path, null, b));
            assertArrayEquals(a.getParam("attn_qkvw"), b.getParam("attn_qkvw"), 0f);
            // Any bytes round-trip exactly; text outside the Basic Multilingual Plane too.
            byte[] binary = {(byte) 0xff, 0, 'x', (byte) 0x80, 0};
            Checkpoint.save(path, new CheckpointOptions().setClientStateBytes(binary), a);
            assertArrayEquals(binary, Checkpoint.loadBytes(path, null, b));
            String emoji = "epoch=3 \uD83D\uDE00";
            Checkpoint.save(path, new CheckpointOptions().setClientState(emoji), a);
            assertEquals(emoji, Checkpoint.load(path, null, b));
            Checkpoint.save(path, new CheckpointOptions().setPrefix("bert.encoder."), a);
            assertNull(Checkpoint.load(path, new CheckpointOptions().setPrefix("bert.encoder."), b));
            DstException e = assertThrows(DstException.class,
                    () -> Checkpoint.load(dir.resolve("missing.safetensors"), null, a));
            assertEquals(Status.IO, e.status());
        }
    }

    @Test
    void checkpointConvertToHuggingFaceAndBack(@TempDir Path dir) {
        LayerConfig postLn = tiny(DType.FP32, 0.1f).setPreLayerNorm(false);
        try (Context ctx = Context.cpu();
                Layer a = new Layer(ctx, postLn);
                Layer b = new Layer(ctx, new LayerConfig(postLn).setSeed(9))) {
            Path ds = dir.resolve("ds.safetensors");
            Path hf = dir.resolve("hf.safetensors");
            Checkpoint.save(ds, null, a);
            String summary = Checkpoint.convert(ds, WeightLayout.DEEPSPEED, null, hf, WeightLayout.HF_BERT, "bert.encoder.");
            assertFalse(summary.isEmpty());
            String info = Checkpoint.describe(hf);
            assertTrue(info.contains("layers: 1 (layout hf_bert, prefix \"bert.encoder.\", 16 tensors)"), info);
            String state = "s".repeat(40000);  // longer than describe's first buffer
            Checkpoint.save(ds, new CheckpointOptions().setClientState(state), a);
            assertTrue(Checkpoint.describe(ds).contains("\n  client_state: " + state + "\n"));
            assertEquals(Status.IO, assertThrows(DstException.class,
                    () -> Checkpoint.describe(dir.resolve("missing"))).status());
            Checkpoint.load(hf, new CheckpointOptions().setLayout(WeightLayout.HF_BERT), b);
            for (Param p : Param.values()) {
                assertArrayEquals(a.getParam(p.paramName()), b.getParam(p.paramName()), 0f, p.paramName());
            }
            DstException e = assertThrows(DstException.class, () -> Checkpoint.convert(dir.resolve("missing"),
                    WeightLayout.DEEPSPEED, null, hf, WeightLayout.HF_BERT, null));
            assertEquals(Status.IO, e.status());
        }
    }

    @Test
    void closeIsIdempotentAndUseAfterCloseThrows() {
        Context ctx = Context.cpu();
        Layer layer = new Layer(ctx, tiny(DType.FP32, 0.1f));
        SavedActivations saved = layer.newSavedActivations();
        ctx.close();
        ctx.close();
        assertThrows(IllegalStateException.class, () -> ctx.setRngState(1, 2));
        assertThrows(IllegalStateException.class, () -> new Layer(ctx, tiny(DType.FP32, 0.1f)));
        // The layer keeps the native context alive.
        float[] x = new float[3 * H];
        float[] y = new float[3 * H];
        layer.forward(saved, x, y, 1, 3, null);
        layer.close(); // also closes the saved activations
        layer.close();
        saved.close();
        assertThrows(IllegalStateException.class, () -> layer.forward(x, y, 1, 3, null));
        assertThrows(IllegalStateException.class, saved::bytes);
    }

    @Test
    void tryWithResourcesAndSavedOfAnotherLayer() {
        try (Context ctx = Context.cpu();
                Layer a = new Layer(ctx, tiny(DType.FP32, 0.1f));
                Layer b = new Layer(ctx, tiny(DType.FP32, 0.1f));
                SavedActivations savedOfB = new SavedActivations(b)) {
            assertEquals(b, savedOfB.layer());
            float[] x = new float[3 * H];
            float[] y = new float[3 * H];
            DstException e = assertThrows(DstException.class, () -> a.forward(savedOfB, x, y, 1, 3, null));
            assertTrue(e.message().contains("another layer"), e.message());
            assertNotEquals(a.id(), b.id());
        }
    }

    @Test
    void cudaContextWhenAvailable() {
        assumeTrue(Library.cudaDeviceCount() > 0, "no CUDA device");
        try (Context ctx = new Context(Backend.CUDA, 0); Layer layer = new Layer(ctx, tiny(DType.FP32, 0f))) {
            float[] x = randomFloats(new Random(1), 2 * 4 * H);
            float[] y = new float[x.length];
            layer.forward(x, y, 2, 4, Mask.keyLengths(new int[] {4, 2}));
            float[] dx = new float[x.length];
            layer.backward(y, dx, 2, 4, GradMode.WRITE);
            for (float v : dx) {
                assertTrue(Float.isFinite(v));
            }
        }
    }

    @Test
    void layerNormMatchesTheFormulaAndReportsBadArguments() {
        int rows = 6, hidden = 10;
        float eps = 1e-5f;
        Random rnd = new Random(11);
        double[] x = new double[rows * hidden], dy = new double[rows * hidden], g = new double[hidden],
                b = new double[hidden];
        for (int i = 0; i < x.length; i++) {
            x[i] = 2 * rnd.nextGaussian() + 0.5;
            dy[i] = rnd.nextGaussian();
        }
        for (int j = 0; j < hidden; j++) {
            g[j] = 1 + 0.3 * rnd.nextGaussian();
            b[j] = 0.3 * rnd.nextGaussian();
        }
        // Reference: the formula in double.
        double[] ry = new double[x.length], rdx = new double[x.length], rdg = new double[hidden],
                rdb = new double[hidden];
        for (int r = 0; r < rows; r++) {
            double mu = 0, var = 0, a = 0, c = 0;
            for (int j = 0; j < hidden; j++) {
                mu += x[r * hidden + j] / hidden;
            }
            for (int j = 0; j < hidden; j++) {
                var += (x[r * hidden + j] - mu) * (x[r * hidden + j] - mu) / hidden;
            }
            double rstd = 1 / Math.sqrt(var + eps);
            for (int j = 0; j < hidden; j++) {
                int i = r * hidden + j;
                double xhat = (x[i] - mu) * rstd;
                ry[i] = g[j] * xhat + b[j];
                rdg[j] += dy[i] * xhat;
                rdb[j] += dy[i];
                a += g[j] * dy[i] / hidden;
                c += g[j] * dy[i] * xhat / hidden;
            }
            for (int j = 0; j < hidden; j++) {
                int i = r * hidden + j;
                rdx[i] = rstd * (g[j] * dy[i] - a - (x[i] - mu) * rstd * c);
            }
        }
        try (Context ctx = Context.cpu()) {
            double[] y = new double[x.length], stats = new double[2 * rows], dx = new double[x.length],
                    dg = new double[hidden], db = new double[hidden];
            LayerNorm.forward(ctx, x, g, b, eps, y, stats, rows, hidden);
            LayerNorm.backward(ctx, dy, x, g, b, stats, dx, dg, db, rows, hidden, GradMode.WRITE);
            assertArrayEquals(ry, y, 1e-12);
            assertArrayEquals(rdx, dx, 1e-10);
            assertArrayEquals(rdg, dg, 1e-10);
            assertArrayEquals(rdb, db, 1e-10);
            LayerNorm.backward(ctx, dy, x, g, b, stats, dx, dg, db, rows, hidden, GradMode.ACCUMULATE);
            assertEquals(2 * rdb[3], db[3], 1e-10);

            float[] xf = new float[x.length], gf = new float[hidden], bf = new float[hidden],
                    yf = new float[x.length];
            for (int i = 0; i < x.length; i++) {
                xf[i] = (float) x[i];
            }
            for (int j = 0; j < hidden; j++) {
                gf[j] = (float) g[j];
                bf[j] = (float) b[j];
            }
            LayerNorm.forward(ctx, xf, gf, bf, eps, yf, null, rows, hidden);  // inference: no statistics
            for (int i = 0; i < x.length; i++) {
                assertEquals(ry[i], yf[i], 1e-5 * (1 + Math.abs(ry[i])));
            }
            float[] keep = new float[x.length];
            java.util.Arrays.fill(keep, 7f);
            DstException e = assertThrows(DstException.class,
                    () -> LayerNorm.forward(ctx, xf, gf, bf, 0f, keep, null, rows, hidden));
            assertEquals(Status.INVALID_ARGUMENT, e.status());
            assertTrue(e.getMessage().contains("eps"), e.getMessage());
            assertEquals(7f, keep[0]);
            e = assertThrows(DstException.class,
                    () -> LayerNorm.forward(ctx, xf, new float[3], bf, eps, keep, null, rows, hidden));
            assertTrue(e.getMessage().contains("gamma"), e.getMessage());
            e = assertThrows(DstException.class,
                    () -> LayerNorm.forward(ctx, xf, gf, bf, eps, keep, new float[3], rows, hidden));
            assertTrue(e.getMessage().contains("stats"), e.getMessage());
        }
    }
}
