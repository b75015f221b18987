package org.dstransformer;

import java.lang.ref.Cleaner;

import org.dstransformer.internal.SWIGTYPE_p_dst_saved;
import org.dstransformer.internal.dstransformer_native;

/**
 * The activations one training forward keeps for its backward ({@code dst_saved}), for having several
 * forwards of a layer in flight (one object per micro-batch). Each layer also has a default one, used
 * by the {@code forward}/{@code backward} overloads without this argument.
 *
 * <p>Close it when done (idempotent); closing its layer closes it too. It keeps its layer reachable.
 */
public final class SavedActivations implements AutoCloseable {
    /** The native object; its clean-up is registered with the cleaner and run at most once. */
    static final class State implements Runnable {
        final Layer.State layer;
        final SWIGTYPE_p_dst_saved handle;
        private boolean destroyed;

        State(Layer.State layer, SWIGTYPE_p_dst_saved handle) {
            this.layer = layer;
            this.handle = handle;
        }

        /** Destroys the native object; called with the context's monitor held. */
        void destroyNative() {
            if (!destroyed) {
                dstransformer_native.dst_saved_destroy(handle);
                destroyed = true;
            }
        }

        boolean destroyed() {
            return destroyed;
        }

        @Override
        public void run() {
            synchronized (layer.nc) {
                if (!layer.destroyed()) {
                    destroyNative();
                    layer.saved.remove(this);
                }
                destroyed = true;
            }
        }
    }

    private final Layer layer;
    final State state;
    private final Cleaner.Cleanable cleanable;

    /**
     * Creates an empty saved-activations object for {@code layer} ({@code dst_saved_create}); memory is
     * allocated by the forward that fills it.
     */
    public SavedActivations(Layer layer) {
        this.layer = layer;
        this.state = layer.createSaved();
        this.cleanable = NativeContext.CLEANER.register(this, state);
    }

    /** The layer this object serves. */
    public Layer layer() {
        return layer;
    }

    private void ensureOpen() {
        if (state.destroyed()) {
            throw new IllegalStateException("the saved activations are closed (or their layer is)");
        }
    }

    /** Frees the activations held; a forward must fill it again before a backward ({@code dst_saved_release}). */
    public void release() {
        synchronized (state.layer.nc) {
            ensureOpen();
            dstransformer_native.dst_saved_release(state.handle);
        }
    }

    /** Bytes of activations currently held; 0 when empty ({@code dst_saved_bytes}). */
    public long bytes() {
        long[] bytes = new long[1];
        synchronized (state.layer.nc) {
            ensureOpen();
            dstransformer_native.dst_saved_bytes(state.handle, bytes);
        }
        return bytes[0];
    }

    /** Destroys the native object and its memory; idempotent. */
    @Override
    public void close() {
        cleanable.clean();
    }
}
