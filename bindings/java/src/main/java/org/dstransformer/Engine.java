package org.dstransformer;

import java.lang.ref.Cleaner;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.nio.FloatBuffer;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.List;

import org.dstransformer.internal.SWIGTYPE_p_dst_engine;
import org.dstransformer.internal.SWIGTYPE_p_dst_optimizer;
import org.dstransformer.internal.dst_dtype;
import org.dstransformer.internal.dst_engine_state;
import org.dstransformer.internal.dst_param_group;
import org.dstransformer.internal.dst_tensor;
import org.dstransformer.internal.dstransformer_native;

/**
 * The library's training engine ({@code dst_engine_*}, docs/engine.md): a DeepSpeed JSON configuration,
 * its optimizer (Adam, AdamW, LAMB) in parameter groups, dynamic loss scaling, gradient accumulation,
 * clipping, learning-rate schedules and checkpoints with a JSON client state.
 *
 * <p>Register the layers to train ({@link #addLayer}), then per micro-batch: forward, the loss gradient
 * scaled by {@link #scaleLossGradient}, backward with {@link GradMode#ACCUMULATE}, {@link #step()}.
 * {@link #close()} frees it (idempotent; try-with-resources works; the garbage collector is a safety
 * net). A layer registered with an engine must stay open while the engine is used: a step with a closed
 * one throws {@link IllegalStateException}. Failures throw {@link DstException} with the library's
 * message (a configuration error names the key's JSON path).
 */
public final class Engine implements AutoCloseable {
    static final class State implements Runnable {
        final NativeContext nc;
        final SWIGTYPE_p_dst_engine handle;
        private boolean destroyed;

        State(NativeContext nc, SWIGTYPE_p_dst_engine handle) {
            this.nc = nc;
            this.handle = handle;
        }

        @Override
        public void run() {
            synchronized (nc) {
                if (destroyed) {
                    return;
                }
                dstransformer_native.dst_engine_destroy(handle);
                destroyed = true;
            }
            nc.release();
        }
    }

    private final State state;
    private final Cleaner.Cleanable cleanable;
    private final SWIGTYPE_p_dst_optimizer optimizer;
    private final Backend backend;
    private final List<Layer> layers = new ArrayList<>();

    /**
     * Checks a DeepSpeed-style JSON configuration without creating anything ({@code dst_engine_config_validate}).
     *
     * @throws DstException {@link Status#INVALID_ARGUMENT} naming the bad key's path, or
     *         {@link Status#UNSUPPORTED} for a setting the library does not implement
     */
    public static void validateConfig(String configJson) {
        dstransformer_native.dst_engine_config_validate(configJson, 1, null);
    }

    /** Creates an engine in {@code context} from DeepSpeed's JSON configuration (world size 1). */
    public Engine(Context context, String configJson) {
        NativeContext nc = context.nativeContext();
        nc.retain();
        long[] out = new long[1];
        long[] opt = new long[1];
        try {
            synchronized (nc) {
                dstransformer_native.dst_engine_create(nc.handle, configJson, 1, out);
            }
        } catch (RuntimeException e) {
            nc.release();
            throw e;
        }
        this.state = new State(nc, new SWIGTYPE_p_dst_engine(out[0], false));
        this.cleanable = NativeContext.CLEANER.register(this, state);
        synchronized (nc) {
            dstransformer_native.dst_engine_get_optimizer(state.handle, opt);
        }
        this.optimizer = new SWIGTYPE_p_dst_optimizer(opt[0], false);
        this.backend = context.backend();
    }

    private void check() {
        if (state.destroyed) {
            throw new IllegalStateException("the engine is closed");
        }
    }

    /** Adds a parameter group; returns its index (1, 2, …). */
    public int addGroup(ParamGroup group) {
        dst_param_group raw = group.toNative();
        int[] index = new int[1];
        try {
            synchronized (state.nc) {
                check();
                dstransformer_native.dst_optimizer_add_group(optimizer, raw, index);
            }
        } finally {
            raw.delete();
        }
        return index[0];
    }

    /** The hyperparameters of group {@code index}. */
    public ParamGroup group(int index) {
        dst_param_group raw = new dst_param_group();
        try {
            synchronized (state.nc) {
                check();
                dstransformer_native.dst_optimizer_get_group(optimizer, index, raw);
            }
            return ParamGroup.fromNative(raw);
        } finally {
            raw.delete();
        }
    }

    /**
     * Registers the twelve parameters of a layer: the weight matrices in {@code decayGroup}, the biases
     * and LayerNorm parameters in {@code noDecayGroup} ({@code dst_optimizer_add_layer}).
     */
    public void addLayer(Layer layer, String prefix, int decayGroup, int noDecayGroup) {
        synchronized (state.nc) {
            check();
            dstransformer_native.dst_optimizer_add_layer(optimizer, layer.handle(), prefix, decayGroup, noDecayGroup);
            layers.add(layer);
        }
    }

    /** Sets every registered gradient to zero (before the first micro-batch). */
    public void zeroGrads() {
        synchronized (state.nc) {
            check();
            dstransformer_native.dst_engine_zero_grads(state.handle);
        }
    }

    /**
     * Multiplies the gradient of a micro-batch's loss by loss scale / gradient_accumulation_steps
     * ({@code dst_engine_scale_loss_gradient}); a direct FP32 buffer (position to limit) on the CPU backend.
     */
    public void scaleLossGradient(FloatBuffer grad) {
        if (backend != Backend.CPU) {
            throw new IllegalArgumentException("scaleLossGradient: host memory needs a CPU context; on CUDA call "
                + "dstransformer_native.dst_engine_scale_loss_gradient on device memory");
        }
        if (!grad.isDirect() || grad.remaining() == 0) {
            throw new IllegalArgumentException("scaleLossGradient: expected a non-empty direct FloatBuffer");
        }
        long address = dstransformer_native.dstj_buffer_address(grad) + 4L * grad.position();
        dst_tensor t = new dst_tensor(address, dst_dtype.DST_DTYPE_FP32, 1, grad.remaining(), 1, 1, 1);
        try {
            synchronized (state.nc) {
                check();
                dstransformer_native.dst_engine_scale_loss_gradient(state.handle, t);
            }
        } finally {
            t.delete();
        }
    }

    /** As {@link #scaleLossGradient(FloatBuffer)}, on an array (copied through a direct buffer). */
    public void scaleLossGradient(float[] grad) {
        FloatBuffer buf = ByteBuffer.allocateDirect(4 * grad.length).order(ByteOrder.nativeOrder()).asFloatBuffer();
        buf.put(grad).flip();
        scaleLossGradient(buf);
        buf.get(grad);
    }

    /** Whether the next {@link #step()} is an accumulation boundary. */
    public boolean isBoundary() {
        int[] b = new int[1];
        synchronized (state.nc) {
            check();
            dstransformer_native.dst_engine_is_boundary(state.handle, b);
        }
        return b[0] != 0;
    }

    /**
     * Chooses whether {@link #step()} sets the registered gradients to zero at each accumulation boundary:
     * {@code true} (the default, as DeepSpeed) or {@code false}, which leaves them for the next step's first
     * backward to overwrite ({@code dst_engine_set_zero_grads_on_step}). Off saves a write of every gradient
     * per step and the first micro-batch's reads of the zeros, but then that backward must write every
     * gradient ({@link GradMode#WRITE} for its first contribution to each): after a boundary they hold values
     * not to be used. {@link #zeroGrads()} still zeroes on request; checkpoints do not hold the setting.
     */
    public void setZeroGradsOnStep(boolean enabled) {
        synchronized (state.nc) {
            check();
            dstransformer_native.dst_engine_set_zero_grads_on_step(state.handle, enabled ? 1 : 0);
        }
    }

    /**
     * Whether {@link #step()} sets the registered gradients to zero at each boundary
     * ({@code dst_engine_get_zero_grads_on_step}).
     */
    public boolean zeroGradsOnStep() {
        int[] enabled = new int[1];
        synchronized (state.nc) {
            check();
            dstransformer_native.dst_engine_get_zero_grads_on_step(state.handle, enabled);
        }
        return enabled[0] != 0;
    }

    /** Ends a micro-batch; at an accumulation boundary, runs the optimizer step ({@code dst_engine_step}). */
    public void step() {
        synchronized (state.nc) {
            check();
            for (Layer l : layers) {
                if (l.isClosedLocked()) {
                    throw new IllegalStateException("a layer registered with the engine was closed");
                }
            }
            dstransformer_native.dst_engine_step(state.handle);
        }
    }

    /** The resolved configuration, the counters and the loss scaler's state. */
    public EngineState state() {
        dst_engine_state s = new dst_engine_state();
        try {
            synchronized (state.nc) {
                check();
                dstransformer_native.dst_engine_get_state(state.handle, s);
            }
            return new EngineState(s.getTrain_batch_size(), s.getTrain_micro_batch_size_per_gpu(),
                s.getGradient_accumulation_steps(), s.getFp16_enabled() != 0, s.getBf16_enabled() != 0,
                s.getDynamic_loss_scale() != 0, s.getLoss_scale(), s.getGradient_clipping(), s.getMicro_steps(),
                s.getGlobal_steps(), s.getGlobal_samples(), s.getSkipped_steps(), s.getGrad_norm(),
                s.getLast_step_applied() != 0, s.getLast_overflow() != 0);
        } finally {
            s.delete();
        }
    }

    /** The learning rate the next step of a group uses (the schedule's). */
    public float lr(int group) {
        float[] lr = new float[1];
        synchronized (state.nc) {
            check();
            dstransformer_native.dst_engine_get_lr(state.handle, group, lr);
        }
        return lr[0];
    }

    /**
     * Saves the training state to {@code saveDir/<tag>/} (tag null: "global_step&lt;N&gt;") and names it in
     * {@code saveDir/latest}; {@code clientStateJson} is any JSON value (null: {}).
     */
    public void saveCheckpoint(String saveDir, String tag, String clientStateJson) {
        synchronized (state.nc) {
            check();
            dstransformer_native.dst_engine_save_checkpoint(state.handle, saveDir, tag, clientStateJson, 1);
        }
    }

    /** Loads a checkpoint (tag null: the one {@code loadDir/latest} names); returns its client state (JSON). */
    public String loadCheckpoint(String loadDir, String tag) {
        byte[] buf = new byte[1 << 16];
        while (true) {
            long[] len = new long[1];
            synchronized (state.nc) {
                check();
                dstransformer_native.dst_engine_load_checkpoint(state.handle, loadDir, tag, null, buf, len);
            }
            if (len[0] < buf.length) {
                return new String(buf, 0, (int) len[0], StandardCharsets.UTF_8);
            }
            buf = new byte[(int) len[0] + 1]; // truncated: loading again gives the same state and all the text
        }
    }

    /** Destroys the engine (idempotent); registered layers are not touched. */
    @Override
    public void close() {
        cleanable.clean();
    }
}
