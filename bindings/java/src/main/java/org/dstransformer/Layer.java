package org.dstransformer;

import java.lang.ref.Cleaner;
import java.nio.Buffer;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.util.ArrayList;
import java.util.HashSet;
import java.util.List;
import java.util.Objects;
import java.util.Set;

import org.dstransformer.internal.SWIGTYPE_p_dst_layer;
import org.dstransformer.internal.SWIGTYPE_p_dst_saved;
import org.dstransformer.internal.dst_layer_config;
import org.dstransformer.internal.dst_mask;
import org.dstransformer.internal.dst_mask_kind;
import org.dstransformer.internal.dst_param_info;
import org.dstransformer.internal.dst_tensor;
import org.dstransformer.internal.dstransformer_native;

/**
 * One Transformer encoder layer ({@code dst_layer}): its parameters, gradients and default saved
 * activations, with forward and backward.
 *
 * <p>Data crosses as Java arrays (copied in and out), or as direct NIO buffers in native byte order (no
 * copy on the CPU backend): {@code float[]}/{@code FloatBuffer} for FP32 layers, {@code double[]}/{@code DoubleBuffer}
 * for FP64, {@code short[]}/{@code ShortBuffer} holding FP16 or BF16 bits for 16-bit layers, and a
 * {@code ByteBuffer} of the layer's dtype for any. Activations are {@code [B, S, H]}, row-major. On a
 * non-CPU context the data is copied to and from device memory around each call.
 *
 * <p>Every status other than {@code DST_OK} throws {@link DstException}. Close the layer when done
 * (idempotent; try-with-resources works); it also closes its {@link SavedActivations}. A layer keeps
 * its context alive. Calls are serialised with those of its context and sibling layers.
 */
public final class Layer implements AutoCloseable {
    /** The native layer; its clean-up is registered with the cleaner and run at most once. */
    static final class State implements Runnable {
        final NativeContext nc;
        final SWIGTYPE_p_dst_layer handle;
        /** Open saved-activation objects, destroyed before the layer. Guarded by nc. */
        final Set<SavedActivations.State> saved = new HashSet<>();
        /** Caller memory bound as arenas, kept reachable while the layer uses it. Guarded by nc. */
        Object paramArenaKeepAlive;
        Object gradArenaKeepAlive;
        private boolean destroyed;

        State(NativeContext nc, SWIGTYPE_p_dst_layer handle) {
            this.nc = nc;
            this.handle = handle;
        }

        /** Whether the native layer is gone; read with nc's monitor held. */
        boolean destroyed() {
            return destroyed;
        }

        /** Throws when the layer is closed; called with nc's monitor held. */
        void check() {
            if (destroyed) {
                throw new IllegalStateException("the layer is closed");
            }
        }

        @Override
        public void run() {
            synchronized (nc) {
                if (destroyed) {
                    return;
                }
                for (SavedActivations.State s : saved) {
                    s.destroyNative();
                }
                saved.clear();
                dstransformer_native.dst_layer_destroy(handle);
                destroyed = true;
                paramArenaKeepAlive = null;
                gradArenaKeepAlive = null;
            }
            nc.release();
        }
    }

    private final State state;
    private final Cleaner.Cleanable cleanable;
    private final int hidden;
    private final DType dtype;

    /**
     * Creates a layer in {@code context} and initialises its parameters ({@code dst_layer_create}).
     *
     * @throws DstException {@link Status#INVALID_ARGUMENT} naming a bad field of {@code config}
     */
    public Layer(Context context, LayerConfig config) {
        NativeContext nc = context.nativeContext();
        nc.retain();
        long[] out = new long[1];
        dst_layer_config raw = config.toNative();
        try {
            synchronized (nc) {
                dstransformer_native.dst_layer_create(nc.handle, raw, out);
            }
        } catch (RuntimeException e) {
            nc.release();
            throw e;
        } finally {
            raw.delete();
        }
        this.state = new State(nc, new SWIGTYPE_p_dst_layer(out[0], false));
        this.cleanable = NativeContext.CLEANER.register(this, state);
        LayerConfig actual = config();
        this.hidden = actual.getHiddenSize();
        this.dtype = actual.getDtype();
    }

    /** Whether the layer was closed; called with its context's monitor held (by {@link Engine}). */
    boolean isClosedLocked() {
        return state.destroyed();
    }

    /** The native handle, for calls of the raw layer ({@code org.dstransformer.internal}). */
    public SWIGTYPE_p_dst_layer handle() {
        return state.handle;
    }

    State state() {
        return state;
    }

    /** The layer's configuration, with {@code intermediateSize} resolved and the current training mode ({@code dst_layer_get_config}). */
    public LayerConfig config() {
        dst_layer_config raw = new dst_layer_config();
        try {
            dstransformer_native.dst_layer_config_default(raw);
            synchronized (state.nc) {
                state.check();
                dstransformer_native.dst_layer_get_config(state.handle, raw);
            }
            return LayerConfig.fromNative(raw);
        } finally {
            raw.delete();
        }
    }

    /** H, the model width. */
    public int hiddenSize() {
        return hidden;
    }

    /** Storage dtype of parameters and activations. */
    public DType dtype() {
        return dtype;
    }

    /** The backend of the layer's context. */
    public Backend backend() {
        return state.nc.backend;
    }

    /** The layer's id within its context, in creation order from 0 ({@code dst_layer_get_id}). */
    public int id() {
        int[] id = new int[1];
        synchronized (state.nc) {
            state.check();
            dstransformer_native.dst_layer_get_id(state.handle, id);
        }
        return id[0];
    }

    /** Switches between training (dropout on, activations saved) and inference ({@code dst_layer_set_training}). */
    public void setTraining(boolean training) {
        synchronized (state.nc) {
            state.check();
            dstransformer_native.dst_layer_set_training(state.handle, training ? 1 : 0);
        }
    }

    /** Training mode: {@code setTraining(true)}. */
    public void train() {
        setTraining(true);
    }

    /** Inference mode: {@code setTraining(false)}. */
    public void eval() {
        setTraining(false);
    }

    /** Whether the layer is in training mode. */
    public boolean isTraining() {
        return config().getTraining();
    }

    /** A new, empty {@link SavedActivations} for this layer. */
    public SavedActivations newSavedActivations() {
        return new SavedActivations(this);
    }

    SavedActivations.State createSaved() {
        long[] out = new long[1];
        synchronized (state.nc) {
            state.check();
            dstransformer_native.dst_saved_create(state.handle, out);
            SavedActivations.State s = new SavedActivations.State(state, new SWIGTYPE_p_dst_saved(out[0], false));
            state.saved.add(s);
            return s;
        }
    }

    // ---- forward ------------------------------------------------------------------------------------

    /**
     * Runs the layer forward on B = {@code batch} sequences of S = {@code seq} tokens ({@code dst_layer_forward}),
     * keeping the activations in the layer's default saved object (training mode).
     *
     * @param input {@code [B, S, H]}
     * @param output {@code [B, S, H]}, written
     * @param mask the attention mask, or null for none
     */
    public void forward(float[] input, float[] output, int batch, int seq, Mask mask) {
        forwardImpl(null, input, output, batch, seq, mask);
    }

    /** As {@link #forward(float[], float[], int, int, Mask)}, for FP64 layers. */
    public void forward(double[] input, double[] output, int batch, int seq, Mask mask) {
        forwardImpl(null, input, output, batch, seq, mask);
    }

    /** As {@link #forward(float[], float[], int, int, Mask)}, for FP16/BF16 layers (the values' bits). */
    public void forward(short[] input, short[] output, int batch, int seq, Mask mask) {
        forwardImpl(null, input, output, batch, seq, mask);
    }

    /** As {@link #forward(float[], float[], int, int, Mask)}, on direct buffers (position to limit). */
    public void forward(Buffer input, Buffer output, int batch, int seq, Mask mask) {
        forwardImpl(null, input, output, batch, seq, mask);
    }

    /** As {@link #forward(float[], float[], int, int, Mask)}, keeping the activations in {@code saved}. */
    public void forward(SavedActivations saved, float[] input, float[] output, int batch, int seq, Mask mask) {
        forwardImpl(saved, input, output, batch, seq, mask);
    }

    /** As {@link #forward(double[], double[], int, int, Mask)}, keeping the activations in {@code saved}. */
    public void forward(SavedActivations saved, double[] input, double[] output, int batch, int seq, Mask mask) {
        forwardImpl(saved, input, output, batch, seq, mask);
    }

    /** As {@link #forward(short[], short[], int, int, Mask)}, keeping the activations in {@code saved}. */
    public void forward(SavedActivations saved, short[] input, short[] output, int batch, int seq, Mask mask) {
        forwardImpl(saved, input, output, batch, seq, mask);
    }

    /** As {@link #forward(Buffer, Buffer, int, int, Mask)}, keeping the activations in {@code saved}. */
    public void forward(SavedActivations saved, Buffer input, Buffer output, int batch, int seq, Mask mask) {
        forwardImpl(saved, input, output, batch, seq, mask);
    }

    // ---- backward -----------------------------------------------------------------------------------

    /**
     * Runs the layer backward for the forward recorded in the default saved object ({@code dst_layer_backward}):
     * writes dL/dX into {@code gradInput} and the twelve parameter gradients into the gradient arena.
     *
     * @param gradOutput dL/dY, {@code [B, S, H]} with the B and S of that forward
     * @param gradInput dL/dX, {@code [B, S, H]}, written
     * @param mode overwrite or add to the gradients
     * @throws DstException {@link Status#STATE} when there is no matching training forward
     */
    public void backward(float[] gradOutput, float[] gradInput, int batch, int seq, GradMode mode) {
        backwardImpl(null, gradOutput, gradInput, batch, seq, mode);
    }

    /** As {@link #backward(float[], float[], int, int, GradMode)}, for FP64 layers. */
    public void backward(double[] gradOutput, double[] gradInput, int batch, int seq, GradMode mode) {
        backwardImpl(null, gradOutput, gradInput, batch, seq, mode);
    }

    /** As {@link #backward(float[], float[], int, int, GradMode)}, for FP16/BF16 layers. */
    public void backward(short[] gradOutput, short[] gradInput, int batch, int seq, GradMode mode) {
        backwardImpl(null, gradOutput, gradInput, batch, seq, mode);
    }

    /** As {@link #backward(float[], float[], int, int, GradMode)}, on direct buffers. */
    public void backward(Buffer gradOutput, Buffer gradInput, int batch, int seq, GradMode mode) {
        backwardImpl(null, gradOutput, gradInput, batch, seq, mode);
    }

    /** As {@link #backward(float[], float[], int, int, GradMode)}, for the forward recorded in {@code saved}. */
    public void backward(SavedActivations saved, float[] gradOutput, float[] gradInput, int batch, int seq,
            GradMode mode) {
        backwardImpl(saved, gradOutput, gradInput, batch, seq, mode);
    }

    /** As {@link #backward(double[], double[], int, int, GradMode)}, for the forward recorded in {@code saved}. */
    public void backward(SavedActivations saved, double[] gradOutput, double[] gradInput, int batch, int seq,
            GradMode mode) {
        backwardImpl(saved, gradOutput, gradInput, batch, seq, mode);
    }

    /** As {@link #backward(short[], short[], int, int, GradMode)}, for the forward recorded in {@code saved}. */
    public void backward(SavedActivations saved, short[] gradOutput, short[] gradInput, int batch, int seq,
            GradMode mode) {
        backwardImpl(saved, gradOutput, gradInput, batch, seq, mode);
    }

    /** As {@link #backward(Buffer, Buffer, int, int, GradMode)}, for the forward recorded in {@code saved}. */
    public void backward(SavedActivations saved, Buffer gradOutput, Buffer gradInput, int batch, int seq,
            GradMode mode) {
        backwardImpl(saved, gradOutput, gradInput, batch, seq, mode);
    }

    // ---- packed sequences ---------------------------------------------------------------------------

    /**
     * Runs the layer forward on packed sequences ({@code dst_layer_forward_packed}): B sequences laid end
     * to end, no padding, sequence b in rows {@code cuSeqlens[b]} .. {@code cuSeqlens[b+1] - 1} of
     * {@code input}. The layer runs on the N rows; each output row gets what
     * {@link #forward(float[], float[], int, int, Mask)} gives it in a padded {@code [B, maxSeqlen, H]}
     * batch with key lengths (up to the rounding of GEMMs over another row count, with the same dropout
     * masks for the same RNG state). B·maxSeqlen must fit {@code maxBatchTokens}. The activations go to the layer's default saved
     * object; the backward is {@link #backwardPacked(float[], float[], GradMode)}.
     *
     * @param input {@code [N, H]}, N ≥ 1
     * @param output {@code [N, H]}, written
     * @param cuSeqlens the offsets {@code [B + 1]}: 0 = cuSeqlens[0] &lt; … &lt; cuSeqlens[B] = N (host
     *     memory, copied to the device as needed)
     * @param maxSeqlen at least every sequence's length, 1..{@code maxSeqLen}
     * @throws DstException {@link Status#INVALID_ARGUMENT} for lengths and offsets (the message names
     *     the argument; on the CPU backend nothing is written then), {@link Status#CAPACITY} when
     *     maxSeqlen or B·maxSeqlen is above the layer's maxima
     */
    public void forwardPacked(float[] input, float[] output, int[] cuSeqlens, int maxSeqlen) {
        forwardPackedImpl(null, input, output, cuSeqlens, maxSeqlen);
    }

    /** As {@link #forwardPacked(float[], float[], int[], int)}, for FP64 layers. */
    public void forwardPacked(double[] input, double[] output, int[] cuSeqlens, int maxSeqlen) {
        forwardPackedImpl(null, input, output, cuSeqlens, maxSeqlen);
    }

    /** As {@link #forwardPacked(float[], float[], int[], int)}, for FP16/BF16 layers (the values' bits). */
    public void forwardPacked(short[] input, short[] output, int[] cuSeqlens, int maxSeqlen) {
        forwardPackedImpl(null, input, output, cuSeqlens, maxSeqlen);
    }

    /** As {@link #forwardPacked(float[], float[], int[], int)}, on direct buffers (position to limit). */
    public void forwardPacked(Buffer input, Buffer output, int[] cuSeqlens, int maxSeqlen) {
        forwardPackedImpl(null, input, output, cuSeqlens, maxSeqlen);
    }

    /** As {@link #forwardPacked(float[], float[], int[], int)}, keeping the activations in {@code saved}. */
    public void forwardPacked(SavedActivations saved, float[] input, float[] output, int[] cuSeqlens,
            int maxSeqlen) {
        forwardPackedImpl(saved, input, output, cuSeqlens, maxSeqlen);
    }

    /** As {@link #forwardPacked(double[], double[], int[], int)}, keeping the activations in {@code saved}. */
    public void forwardPacked(SavedActivations saved, double[] input, double[] output, int[] cuSeqlens,
            int maxSeqlen) {
        forwardPackedImpl(saved, input, output, cuSeqlens, maxSeqlen);
    }

    /** As {@link #forwardPacked(short[], short[], int[], int)}, keeping the activations in {@code saved}. */
    public void forwardPacked(SavedActivations saved, short[] input, short[] output, int[] cuSeqlens,
            int maxSeqlen) {
        forwardPackedImpl(saved, input, output, cuSeqlens, maxSeqlen);
    }

    /** As {@link #forwardPacked(Buffer, Buffer, int[], int)}, keeping the activations in {@code saved}. */
    public void forwardPacked(SavedActivations saved, Buffer input, Buffer output, int[] cuSeqlens,
            int maxSeqlen) {
        forwardPackedImpl(saved, input, output, cuSeqlens, maxSeqlen);
    }

    /**
     * Runs the layer backward for the packed forward recorded in the default saved object
     * ({@code dst_layer_backward_packed}): writes dL/dX into {@code gradInput} and the twelve parameter
     * gradients into the gradient arena.
     *
     * @param gradOutput dL/dY, {@code [N, H]} with the N of that forward
     * @param gradInput dL/dX, {@code [N, H]}, written
     * @param mode overwrite or add to the gradients
     * @throws DstException {@link Status#STATE} when there is no packed training forward to use (also when
     *     the saved object holds a padded one)
     */
    public void backwardPacked(float[] gradOutput, float[] gradInput, GradMode mode) {
        backwardPackedImpl(null, gradOutput, gradInput, mode);
    }

    /** As {@link #backwardPacked(float[], float[], GradMode)}, for FP64 layers. */
    public void backwardPacked(double[] gradOutput, double[] gradInput, GradMode mode) {
        backwardPackedImpl(null, gradOutput, gradInput, mode);
    }

    /** As {@link #backwardPacked(float[], float[], GradMode)}, for FP16/BF16 layers. */
    public void backwardPacked(short[] gradOutput, short[] gradInput, GradMode mode) {
        backwardPackedImpl(null, gradOutput, gradInput, mode);
    }

    /** As {@link #backwardPacked(float[], float[], GradMode)}, on direct buffers. */
    public void backwardPacked(Buffer gradOutput, Buffer gradInput, GradMode mode) {
        backwardPackedImpl(null, gradOutput, gradInput, mode);
    }

    /** As {@link #backwardPacked(float[], float[], GradMode)}, for the packed forward recorded in {@code saved}. */
    public void backwardPacked(SavedActivations saved, float[] gradOutput, float[] gradInput, GradMode mode) {
        backwardPackedImpl(saved, gradOutput, gradInput, mode);
    }

    /** As {@link #backwardPacked(double[], double[], GradMode)}, for the packed forward recorded in {@code saved}. */
    public void backwardPacked(SavedActivations saved, double[] gradOutput, double[] gradInput, GradMode mode) {
        backwardPackedImpl(saved, gradOutput, gradInput, mode);
    }

    /** As {@link #backwardPacked(short[], short[], GradMode)}, for the packed forward recorded in {@code saved}. */
    public void backwardPacked(SavedActivations saved, short[] gradOutput, short[] gradInput, GradMode mode) {
        backwardPackedImpl(saved, gradOutput, gradInput, mode);
    }

    /** As {@link #backwardPacked(Buffer, Buffer, GradMode)}, for the packed forward recorded in {@code saved}. */
    public void backwardPacked(SavedActivations saved, Buffer gradOutput, Buffer gradInput, GradMode mode) {
        backwardPackedImpl(saved, gradOutput, gradInput, mode);
    }

    private HostData host(Object data, boolean input) {
        if (data instanceof Buffer) {
            return HostData.ofBuffer((Buffer) data, dtype);
        }
        return HostData.ofArray(data, dtype, input, !input);
    }

    private long elements(int batch, int seq, String what) {
        if (batch < 0 || seq < 0) {
            throw HostData.invalid(what + ": batch " + batch + " and seq " + seq + " must not be negative");
        }
        return (long) batch * seq * hidden;
    }

    private static void checkCount(String what, long got, long want) {
        if (got != want) {
            throw HostData.invalid(what + " has " + got + " elements, expected " + want);
        }
    }

    /** N, the rows of packed tokens {@code [N, H]} of {@code elements} values. */
    private long packedRows(String what, long elements) {
        if (elements < hidden || elements % hidden != 0) {
            throw HostData.invalid(what + " has " + elements + " elements, expected [N, " + hidden
                    + "] (N >= 1 packed tokens)");
        }
        return elements / hidden;
    }

    private SWIGTYPE_p_dst_saved savedHandle(SavedActivations saved, String what) {
        if (saved == null) {
            return null;
        }
        if (saved.state.layer != state) {
            throw HostData.invalid(what + ": the saved activations belong to another layer");
        }
        if (saved.state.destroyed()) {
            throw new IllegalStateException("the saved activations are closed");
        }
        return saved.state.handle;
    }

    private void forwardImpl(SavedActivations saved, Object input, Object output, int batch, int seq, Mask mask) {
        long n = elements(batch, seq, "forward");
        HostData in = host(input, true);
        HostData out = host(output, false);
        checkCount("forward: input", in.elements, n);
        checkCount("forward: output", out.elements, n);
        HostData m = mask == null ? null : mask.hostData(dtype);
        if (m != null) {
            checkCount(mask.kind() == Mask.Kind.KEY_LENGTHS ? "forward: key lengths" : "forward: additive mask",
                    m.elements, mask.kind() == Mask.Kind.KEY_LENGTHS ? batch : (long) batch * seq);
        }
        synchronized (state.nc) {
            state.check();
            SWIGTYPE_p_dst_saved sh = savedHandle(saved, "forward");
            try (Staged x = new Staged(state.nc, in, true);
                    Staged y = new Staged(state.nc, out, false);
                    Staged ms = m == null ? null : new Staged(state.nc, m, true)) {
                dst_tensor tin = new dst_tensor(x.address, in.dtype.raw(), 3, batch, seq, hidden, 1);
                dst_tensor tout = new dst_tensor(y.address, out.dtype.raw(), 3, batch, seq, hidden, 1);
                dst_mask rawMask = null;
                try {
                    if (ms != null) {
                        boolean lengths = mask.kind() == Mask.Kind.KEY_LENGTHS;
                        rawMask = new dst_mask();
                        rawMask.setKind(lengths ? dst_mask_kind.DST_MASK_KEY_LENGTHS : dst_mask_kind.DST_MASK_ADDITIVE);
                        dst_tensor mt = lengths ? new dst_tensor(ms.address, m.dtype.raw(), 1, batch, 1, 1, 1)
                                : new dst_tensor(ms.address, m.dtype.raw(), 2, batch, seq, 1, 1);
                        try {
                            rawMask.setTensor(mt);
                        } finally {
                            mt.delete();
                        }
                    }
                    dstransformer_native.dst_layer_forward(state.handle, sh, tin, rawMask, tout);
                    y.copyOut();
                } finally {
                    tin.delete();
                    tout.delete();
                    if (rawMask != null) {
                        rawMask.delete();
                    }
                }
            }
        }
        out.copyBack();
    }

    private void forwardPackedImpl(SavedActivations saved, Object input, Object output, int[] cuSeqlens,
            int maxSeqlen) {
        HostData in = host(input, true);
        HostData out = host(output, false);
        long rows = packedRows("forwardPacked: input", in.elements);
        checkCount("forwardPacked: output", out.elements, in.elements);
        Objects.requireNonNull(cuSeqlens, "cuSeqlens");
        if (cuSeqlens.length < 2) {
            throw HostData.invalid("forwardPacked: cuSeqlens has " + cuSeqlens.length
                    + " elements, expected B + 1 >= 2 offsets");
        }
        HostData cu = HostData.ofArray(cuSeqlens, dtype, true, false);
        synchronized (state.nc) {
            state.check();
            SWIGTYPE_p_dst_saved sh = savedHandle(saved, "forwardPacked");
            try (Staged x = new Staged(state.nc, in, true);
                    Staged y = new Staged(state.nc, out, false);
                    Staged c = new Staged(state.nc, cu, true)) {
                dst_tensor tin = new dst_tensor(x.address, in.dtype.raw(), 2, rows, hidden, 1, 1);
                dst_tensor tout = new dst_tensor(y.address, out.dtype.raw(), 2, rows, hidden, 1, 1);
                dst_tensor tcu = new dst_tensor(c.address, cu.dtype.raw(), 1, cuSeqlens.length, 1, 1, 1);
                try {
                    dstransformer_native.dst_layer_forward_packed(state.handle, sh, tin, tcu, maxSeqlen, tout);
                    y.copyOut();
                } finally {
                    tin.delete();
                    tout.delete();
                    tcu.delete();
                }
            }
        }
        out.copyBack();
    }

    private void backwardImpl(SavedActivations saved, Object gradOutput, Object gradInput, int batch, int seq,
            GradMode mode) {
        long n = elements(batch, seq, "backward");
        HostData dy = host(gradOutput, true);
        HostData dx = host(gradInput, false);
        checkCount("backward: gradOutput", dy.elements, n);
        checkCount("backward: gradInput", dx.elements, n);
        runBackward(saved, dy, dx, mode, false, new long[] {batch, seq, hidden});
    }

    private void backwardPackedImpl(SavedActivations saved, Object gradOutput, Object gradInput, GradMode mode) {
        HostData dy = host(gradOutput, true);
        HostData dx = host(gradInput, false);
        long rows = packedRows("backwardPacked: gradOutput", dy.elements);
        checkCount("backwardPacked: gradInput", dx.elements, dy.elements);
        runBackward(saved, dy, dx, mode, true, new long[] {rows, hidden});
    }

    /** dst_layer_backward (or _packed) on {@code dy} and {@code dx} of {@code shape} (2 or 3 dimensions). */
    private void runBackward(SavedActivations saved, HostData dy, HostData dx, GradMode mode, boolean packed,
            long[] shape) {
        long d2 = shape.length > 2 ? shape[2] : 1;
        synchronized (state.nc) {
            state.check();
            SWIGTYPE_p_dst_saved sh = savedHandle(saved, packed ? "backwardPacked" : "backward");
            try (Staged sdy = new Staged(state.nc, dy, true); Staged sdx = new Staged(state.nc, dx, false)) {
                int nd = shape.length;
                dst_tensor tdy = new dst_tensor(sdy.address, dy.dtype.raw(), nd, shape[0], shape[1], d2, 1);
                dst_tensor tdx = new dst_tensor(sdx.address, dx.dtype.raw(), nd, shape[0], shape[1], d2, 1);
                try {
                    if (packed) {
                        dstransformer_native.dst_layer_backward_packed(state.handle, sh, tdy, tdx, mode.raw());
                    } else {
                        dstransformer_native.dst_layer_backward(state.handle, sh, tdy, tdx, mode.raw());
                    }
                    sdx.copyOut();
                } finally {
                    tdy.delete();
                    tdx.delete();
                }
            }
        }
        dx.copyBack();
    }

    // ---- parameters and gradients --------------------------------------------------------------------

    /** Shape and arena position of a parameter ({@code dst_layer_param_info}). */
    public ParamInfo paramInfo(Param param) {
        dst_param_info info = new dst_param_info();
        try {
            synchronized (state.nc) {
                state.check();
                dstransformer_native.dst_layer_param_info(state.handle, param.raw(), info);
            }
            long[] shape = new long[info.getNdim()];
            for (int i = 0; i < shape.length; i++) {
                shape[i] = info.getDim(i);
            }
            String name = info.getName();
            return new ParamInfo(param, name == null ? param.paramName() : name, shape, info.getNumel(),
                    info.getOffset_bytes(), info.getSize_bytes());
        } finally {
            info.delete();
        }
    }

    /** {@link #paramInfo(Param)} of a parameter given by name (see {@link Param#lookup(String)}). */
    public ParamInfo paramInfo(String name) {
        return paramInfo(Param.lookup(name));
    }

    /** {@link ParamInfo} of all twelve parameters, in DeepSpeed's order. */
    public List<ParamInfo> params() {
        List<ParamInfo> all = new ArrayList<>();
        for (Param p : Param.values()) {
            all.add(paramInfo(p));
        }
        return all;
    }

    private int numel(String name) {
        long n = paramInfo(name).numel();
        if (n > Integer.MAX_VALUE) {
            throw HostData.invalid(name + ": " + n + " elements do not fit in a Java array");
        }
        return (int) n;
    }

    private void setParamImpl(String name, HostData src) {
        synchronized (state.nc) {
            state.check();
            dstransformer_native.dst_layer_set_param(state.handle, name, src.address, src.dtype.raw(), src.elements);
        }
    }

    private void copyOut(String name, HostData dst, boolean grad) {
        synchronized (state.nc) {
            state.check();
            if (grad) {
                dstransformer_native.dst_layer_get_grad(state.handle, name, dst.address, dst.dtype.raw(), dst.elements);
            } else {
                dstransformer_native.dst_layer_get_param(state.handle, name, dst.address, dst.dtype.raw(), dst.elements);
            }
        }
        dst.copyBack();
    }

    /** Copies {@code values} into parameter {@code name}, converting to the layer's dtype ({@code dst_layer_set_param}). */
    public void setParam(String name, float[] values) {
        setParamImpl(name, HostData.ofArray(values, dtype, true, false));
    }

    /** As {@link #setParam(String, float[])}, from FP64 values. */
    public void setParam(String name, double[] values) {
        setParamImpl(name, HostData.ofArray(values, dtype, true, false));
    }

    /** As {@link #setParam(String, float[])}, from FP16/BF16 bits in the layer's dtype. */
    public void setParam(String name, short[] values) {
        setParamImpl(name, HostData.ofArray(values, dtype, true, false));
    }

    /** As {@link #setParam(String, float[])}, from a direct buffer (position to limit). */
    public void setParam(String name, Buffer values) {
        setParamImpl(name, HostData.ofBuffer(values, dtype));
    }

    /** Copies parameter {@code name} into {@code out}, converting to FP32 ({@code dst_layer_get_param}). */
    public void getParam(String name, float[] out) {
        copyOut(name, HostData.ofArray(out, dtype, false, true), false);
    }

    /** As {@link #getParam(String, float[])}, converting to FP64. */
    public void getParam(String name, double[] out) {
        copyOut(name, HostData.ofArray(out, dtype, false, true), false);
    }

    /** As {@link #getParam(String, float[])}, as FP16/BF16 bits in the layer's dtype. */
    public void getParam(String name, short[] out) {
        copyOut(name, HostData.ofArray(out, dtype, false, true), false);
    }

    /** As {@link #getParam(String, float[])}, into a direct buffer (position to limit). */
    public void getParam(String name, Buffer out) {
        copyOut(name, HostData.ofBuffer(out, dtype), false);
    }

    /** Parameter {@code name} as FP32 values. */
    public float[] getParam(String name) {
        float[] out = new float[numel(name)];
        getParam(name, out);
        return out;
    }

    /** Parameter {@code name} as FP64 values. */
    public double[] getParamDouble(String name) {
        double[] out = new double[numel(name)];
        getParam(name, out);
        return out;
    }

    /** Copies the gradient of parameter {@code name} into {@code out}, as FP32 ({@code dst_layer_get_grad}). */
    public void getGrad(String name, float[] out) {
        copyOut(name, HostData.ofArray(out, dtype, false, true), true);
    }

    /** As {@link #getGrad(String, float[])}, as FP64. */
    public void getGrad(String name, double[] out) {
        copyOut(name, HostData.ofArray(out, dtype, false, true), true);
    }

    /** As {@link #getGrad(String, float[])}, as FP16/BF16 bits in the layer's dtype. */
    public void getGrad(String name, short[] out) {
        copyOut(name, HostData.ofArray(out, dtype, false, true), true);
    }

    /** As {@link #getGrad(String, float[])}, into a direct buffer (position to limit). */
    public void getGrad(String name, Buffer out) {
        copyOut(name, HostData.ofBuffer(out, dtype), true);
    }

    /** The gradient of parameter {@code name} as FP32 values. */
    public float[] getGrad(String name) {
        float[] out = new float[numel(name)];
        getGrad(name, out);
        return out;
    }

    /** The gradient of parameter {@code name} as FP64 values. */
    public double[] getGradDouble(String name) {
        double[] out = new double[numel(name)];
        getGrad(name, out);
        return out;
    }

    /** Sets every gradient to zero ({@code dst_layer_zero_grads}). */
    public void zeroGrads() {
        synchronized (state.nc) {
            state.check();
            dstransformer_native.dst_layer_zero_grads(state.handle);
        }
    }

    // ---- arenas -------------------------------------------------------------------------------------

    /** Size of the parameter arena (and of the gradient arena) in bytes ({@code dst_layer_arena_bytes}). */
    public long arenaBytes() {
        long[] bytes = new long[1];
        synchronized (state.nc) {
            state.check();
            dstransformer_native.dst_layer_arena_bytes(state.handle, bytes);
        }
        return bytes[0];
    }

    /** Address of the parameter arena in the context's memory space ({@code dst_layer_param_arena}). */
    public long paramArenaAddress() {
        long[] data = new long[1];
        synchronized (state.nc) {
            state.check();
            dstransformer_native.dst_layer_param_arena(state.handle, data);
        }
        return data[0];
    }

    /** Address of the gradient arena in the context's memory space ({@code dst_layer_grad_arena}). */
    public long gradArenaAddress() {
        long[] data = new long[1];
        synchronized (state.nc) {
            state.check();
            dstransformer_native.dst_layer_grad_arena(state.handle, data);
        }
        return data[0];
    }

    private ByteBuffer arenaView(long address) {
        if (state.nc.backend != Backend.CPU) {
            throw new DstException(Status.UNSUPPORTED,
                    "the arena of a non-CPU layer is device memory; use paramArenaAddress()/gradArenaAddress()");
        }
        return dstransformer_native.dstj_wrap_address(address, arenaBytes()).order(ByteOrder.nativeOrder());
    }

    /**
     * A direct view of the parameter arena of a CPU layer (native byte order), for an optimizer step
     * between calls; {@link #paramInfo(Param)} gives where each parameter lies. The view is valid only
     * until the layer is closed or another arena is bound: using it afterwards is undefined.
     */
    public ByteBuffer paramArena() {
        return arenaView(paramArenaAddress());
    }

    /** As {@link #paramArena()}, for the gradient arena. */
    public ByteBuffer gradArena() {
        return arenaView(gradArenaAddress());
    }

    /**
     * Makes a CPU layer keep its parameters in {@code arena} ({@code dst_layer_bind_param_arena}); the
     * buffer is kept reachable while the layer uses it.
     *
     * @param arena a direct buffer of at least {@link #arenaBytes()} bytes from its position, which must be
     *     256-byte aligned ({@code ByteBuffer.allocateDirect(n + 255).alignedSlice(256)})
     * @param copyCurrent copy the current values into it first; otherwise it must hold valid parameters
     */
    public void bindParamArena(ByteBuffer arena, boolean copyCurrent) {
        HostData host = HostData.ofBytes(arena);
        synchronized (state.nc) {
            state.check();
            requireCpu("bindParamArena");
            dstransformer_native.dst_layer_bind_param_arena(state.handle, host.address, host.bytes, copyCurrent ? 1 : 0);
            state.paramArenaKeepAlive = arena;
        }
    }

    /** As {@link #bindParamArena(ByteBuffer, boolean)}, for the gradients (taken as they are). */
    public void bindGradArena(ByteBuffer arena) {
        HostData host = HostData.ofBytes(arena);
        synchronized (state.nc) {
            state.check();
            requireCpu("bindGradArena");
            dstransformer_native.dst_layer_bind_grad_arena(state.handle, host.address, host.bytes);
            state.gradArenaKeepAlive = arena;
        }
    }

    private void requireCpu(String what) {
        if (state.nc.backend != Backend.CPU) {
            throw new DstException(Status.INVALID_ARGUMENT, what + ": a buffer in host memory is only usable by a CPU layer");
        }
    }

    /** Destroys the layer and its saved activations and releases its context; idempotent. */
    @Override
    public void close() {
        cleanable.clean();
    }

    @Override
    public String toString() {
        return "Layer[H=" + hidden + ", " + dtype + ", " + state.nc.backend + "]";
    }
}
