package org.dstransformer;

import java.nio.charset.StandardCharsets;
import java.util.Objects;

import org.dstransformer.internal.dst_checkpoint_options;

/**
 * Options of {@link Checkpoint#save} and {@link Checkpoint#load} ({@code dst_checkpoint_options}); a new
 * object holds the library's defaults. Setters return {@code this}. A plain Java object.
 */
public final class CheckpointOptions {
    private WeightLayout layout;
    private String prefix;
    private boolean includeGrads;
    private DType saveDtype;
    private boolean restoreRng;
    private byte[] clientState;

    /** Options holding the library's defaults ({@code dst_checkpoint_options_default}). */
    public CheckpointOptions() {
        dst_checkpoint_options raw = new dst_checkpoint_options();
        try {
            layout = WeightLayout.fromRaw(raw.getLayout());
            prefix = raw.getPrefix();
            includeGrads = raw.getInclude_grads() != 0;
            int save = raw.getSave_dtype();
            saveDtype = null;
            for (DType d : DType.values()) {
                if (save >= 0 && d.raw().swigValue() == save) {
                    saveDtype = d;
                }
            }
            restoreRng = raw.getRestore_rng() != 0;
            clientState = null;  // the default: none
        } finally {
            raw.delete();
        }
    }

    /** A native struct holding these options; the caller deletes it (which frees its strings). */
    dst_checkpoint_options toNative() {
        dst_checkpoint_options raw = new dst_checkpoint_options();
        raw.setLayout(layout.raw());
        raw.setPrefix(prefix);
        raw.setInclude_grads(includeGrads ? 1 : 0);
        raw.setSave_dtype(saveDtype == null ? -1 : saveDtype.raw().swigValue());
        raw.setRestore_rng(restoreRng ? 1 : 0);
        raw.set_client_state_bytes(clientState);
        return raw;
    }

    /** Naming scheme. Default {@link WeightLayout#DEEPSPEED}. */
    public WeightLayout getLayout() {
        return layout;
    }

    /** Sets the naming scheme; returns this. */
    public CheckpointOptions setLayout(WeightLayout layout) {
        this.layout = Objects.requireNonNull(layout, "layout");
        return this;
    }

    /**
     * Prepended to {@code layer.<i>.}; null for none. Loading a Hugging Face file also accepts the
     * prefixes {@code bert.encoder.} and {@code encoder.} when this is null. Default null.
     */
    public String getPrefix() {
        return prefix;
    }

    /** Sets the prefix (null for none); returns this. */
    public CheckpointOptions setPrefix(String prefix) {
        this.prefix = prefix;
        return this;
    }

    /** Save: also write the gradients. Load: also read them (they must be present). Default false. */
    public boolean getIncludeGrads() {
        return includeGrads;
    }

    /** Sets whether gradients are written or read; returns this. */
    public CheckpointOptions setIncludeGrads(boolean includeGrads) {
        this.includeGrads = includeGrads;
        return this;
    }

    /** Save: the dtype to convert to; null keeps each layer's dtype. Default null. */
    public DType getSaveDtype() {
        return saveDtype;
    }

    /** Sets the dtype to save in (null keeps each layer's); returns this. */
    public CheckpointOptions setSaveDtype(DType saveDtype) {
        this.saveDtype = saveDtype;
        return this;
    }

    /** Load: set the first layer's context RNG state from the file. Default true. */
    public boolean getRestoreRng() {
        return restoreRng;
    }

    /** Sets whether loading restores the RNG state; returns this. */
    public CheckpointOptions setRestoreRng(boolean restoreRng) {
        this.restoreRng = restoreRng;
        return this;
    }

    /** Save: the client state as text (its bytes decoded as UTF-8); null for none. Default null. */
    public String getClientState() {
        return clientState == null ? null : new String(clientState, StandardCharsets.UTF_8);
    }

    /** Sets the client state to save as text, stored as its UTF-8 bytes (null for none); returns this. */
    public CheckpointOptions setClientState(String clientState) {
        this.clientState = clientState == null ? null : clientState.getBytes(StandardCharsets.UTF_8);
        return this;
    }

    /** Save: the client state's bytes, or null for none. Default null. */
    public byte[] getClientStateBytes() {
        return clientState == null ? null : clientState.clone();
    }

    /**
     * Sets the client state to save as any bytes, kept exactly (text that is not UTF-8, NUL bytes and
     * binary data included); null for none. Returns this.
     */
    public CheckpointOptions setClientStateBytes(byte[] clientState) {
        this.clientState = clientState == null ? null : clientState.clone();
        return this;
    }
}
