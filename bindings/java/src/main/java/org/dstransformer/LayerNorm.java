package org.dstransformer;

import org.dstransformer.internal.dst_tensor;
import org.dstransformer.internal.dstransformer_native;

/**
 * The standalone LayerNorm of the C API ({@code dst_layernorm_forward} / {@code dst_layernorm_backward}):
 * the final LayerNorm a Pre-LN stack needs after its last layer. Data is {@code rows × hidden}, row-major,
 * in FP32 ({@code float[]}) or FP64 ({@code double[]}); the statistics ({@code 2 × rows}: the row means,
 * then the inverse deviations) are in the same type. On a CUDA context the arrays are staged through
 * device memory for the call.
 */
public final class LayerNorm {
    private LayerNorm() {
    }

    /**
     * {@code y = gamma * (x - mean) / sqrt(var + eps) + beta} per row.
     *
     * @param stats {@code 2 × rows}, written (what {@link #backward} needs), or null when not training
     * @throws DstException {@link Status#INVALID_ARGUMENT} for a bad eps or array length, naming it
     */
    public static void forward(Context ctx, float[] x, float[] gamma, float[] beta, float eps, float[] y,
            float[] stats, int rows, int hidden) {
        forwardImpl(ctx, x, gamma, beta, eps, y, stats, rows, hidden);
    }

    /** As {@link #forward(Context, float[], float[], float[], float, float[], float[], int, int)}, in FP64. */
    public static void forward(Context ctx, double[] x, double[] gamma, double[] beta, float eps, double[] y,
            double[] stats, int rows, int hidden) {
        forwardImpl(ctx, x, gamma, beta, eps, y, stats, rows, hidden);
    }

    /**
     * Gradients of {@link #forward} from its statistics: writes {@code dx}; overwrites {@code dgamma} and
     * {@code dbeta}, or adds to them with {@link GradMode#ACCUMULATE}.
     */
    public static void backward(Context ctx, float[] dy, float[] x, float[] gamma, float[] beta, float[] stats,
            float[] dx, float[] dgamma, float[] dbeta, int rows, int hidden, GradMode mode) {
        backwardImpl(ctx, dy, x, gamma, beta, stats, dx, dgamma, dbeta, rows, hidden, mode);
    }

    /** As {@link #backward(Context, float[], float[], float[], float[], float[], float[], float[], float[], int, int, GradMode)}, in FP64. */
    public static void backward(Context ctx, double[] dy, double[] x, double[] gamma, double[] beta, double[] stats,
            double[] dx, double[] dgamma, double[] dbeta, int rows, int hidden, GradMode mode) {
        backwardImpl(ctx, dy, x, gamma, beta, stats, dx, dgamma, dbeta, rows, hidden, mode);
    }

    /** One array argument: its host data, checked to hold {@code want} elements. */
    private static HostData arg(String name, Object array, long want, boolean copyIn, boolean output) {
        HostData h = HostData.ofArray(array, null, copyIn, output);
        if (h.elements != want) {
            throw HostData.invalid("layernorm: " + name + " has " + h.elements + " elements, expected " + want);
        }
        return h;
    }

    private static void checkDims(int rows, int hidden) {
        if (rows < 1 || hidden < 1) {
            throw HostData.invalid("layernorm: rows " + rows + " and hidden " + hidden + " must be at least 1");
        }
    }

    private static dst_tensor view(Staged s, HostData h, int dim0, int dim1) {
        return dim1 > 0 ? new dst_tensor(s.address, h.dtype.raw(), 2, dim0, dim1, 1, 1)
                : new dst_tensor(s.address, h.dtype.raw(), 1, dim0, 1, 1, 1);
    }

    private static void forwardImpl(Context ctx, Object x, Object gamma, Object beta, float eps, Object y,
            Object stats, int rows, int hidden) {
        checkDims(rows, hidden);
        long n = (long) rows * hidden;
        HostData hx = arg("x", x, n, true, false);
        HostData hg = arg("gamma", gamma, hidden, true, false);
        HostData hb = arg("beta", beta, hidden, true, false);
        HostData hy = arg("y", y, n, false, true);
        HostData hs = stats == null ? null : arg("stats", stats, 2L * rows, false, true);
        NativeContext nc = ctx.nativeContext();
        synchronized (nc) {
            try (Staged sx = new Staged(nc, hx, true);
                    Staged sg = new Staged(nc, hg, true);
                    Staged sb = new Staged(nc, hb, true);
                    Staged sy = new Staged(nc, hy, false);
                    Staged ss = hs == null ? null : new Staged(nc, hs, false)) {
                dst_tensor tx = view(sx, hx, rows, hidden), tg = view(sg, hg, hidden, 0), tb = view(sb, hb, hidden, 0),
                        ty = view(sy, hy, rows, hidden), ts = ss == null ? null : view(ss, hs, 2, rows);
                try {
                    dstransformer_native.dst_layernorm_forward(nc.handle, tx, tg, tb, eps, ty, ts);
                    sy.copyOut();
                    if (ss != null) {
                        ss.copyOut();
                    }
                } finally {
                    for (dst_tensor t : new dst_tensor[] {tx, tg, tb, ty, ts}) {
                        if (t != null) {
                            t.delete();
                        }
                    }
                }
            }
        }
        hy.copyBack();
        if (hs != null) {
            hs.copyBack();
        }
    }

    private static void backwardImpl(Context ctx, Object dy, Object x, Object gamma, Object beta, Object stats,
            Object dx, Object dgamma, Object dbeta, int rows, int hidden, GradMode mode) {
        checkDims(rows, hidden);
        long n = (long) rows * hidden;
        boolean accumulate = mode == GradMode.ACCUMULATE;
        HostData hdy = arg("dy", dy, n, true, false);
        HostData hx = arg("x", x, n, true, false);
        HostData hg = arg("gamma", gamma, hidden, true, false);
        HostData hb = arg("beta", beta, hidden, true, false);
        HostData hs = arg("stats", stats, 2L * rows, true, false);
        HostData hdx = arg("dx", dx, n, false, true);
        HostData hdg = arg("dgamma", dgamma, hidden, accumulate, true);
        HostData hdb = arg("dbeta", dbeta, hidden, accumulate, true);
        NativeContext nc = ctx.nativeContext();
        synchronized (nc) {
            try (Staged sdy = new Staged(nc, hdy, true);
                    Staged sx = new Staged(nc, hx, true);
                    Staged sg = new Staged(nc, hg, true);
                    Staged sb = new Staged(nc, hb, true);
                    Staged ss = new Staged(nc, hs, true);
                    Staged sdx = new Staged(nc, hdx, false);
                    Staged sdg = new Staged(nc, hdg, accumulate);
                    Staged sdb = new Staged(nc, hdb, accumulate)) {
                dst_tensor tdy = view(sdy, hdy, rows, hidden), tx = view(sx, hx, rows, hidden),
                        tg = view(sg, hg, hidden, 0), tb = view(sb, hb, hidden, 0), ts = view(ss, hs, 2, rows),
                        tdx = view(sdx, hdx, rows, hidden), tdg = view(sdg, hdg, hidden, 0),
                        tdb = view(sdb, hdb, hidden, 0);
                try {
                    dstransformer_native.dst_layernorm_backward(nc.handle, tdy, tx, tg, tb, ts, tdx, tdg, tdb,
                            mode.raw());
                    sdx.copyOut();
                    sdg.copyOut();
                    sdb.copyOut();
                } finally {
                    for (dst_tensor t : new dst_tensor[] {tdy, tx, tg, tb, ts, tdx, tdg, tdb}) {
                        t.delete();
                    }
                }
            }
        }
        hdx.copyBack();
        hdg.copyBack();
        hdb.copyBack();
    }
}
