package org.dstransformer;

import java.nio.charset.StandardCharsets;
import java.util.Objects;

import org.dstransformer.internal.dst_checkpoint_options;

/**
 * Options of {@link Checkpoint#save} and {@link Checkpoint#load} ({@code dst_checkpoint_options}); a new
 * object holds the library's defaults. Setters return {@code this}. A plain Java object.
 */
public final class CheckpointOptions {
    // BEGIN GENERATED fields (bindings/gen_fields.py from dstransformer.h; do not edit)
    private WeightLayout layout;
    private String prefix;
    private boolean includeGrads;
    private DType saveDtype;
    private boolean restoreRng;
    private byte[] clientState;
    // END GENERATED fields

    /** Options holding the library's defaults ({@code dst_checkpoint_options_default}). */
    public CheckpointOptions() {
        dst_checkpoint_options raw = new dst_checkpoint_options();
        try {
            // BEGIN GENERATED defaults (bindings/gen_fields.py from dstransformer.h; do not edit)
            layout = WeightLayout.fromRaw(raw.getLayout());
            prefix = raw.getPrefix();
            includeGrads = raw.getInclude_grads() != 0;
            saveDtype = optionalDType(raw.getSave_dtype());
            restoreRng = raw.getRestore_rng() != 0;
            clientState = null;
            // END GENERATED defaults
        } finally {
            raw.delete();
        }
    }

    /** The DType of a raw {@code save_dtype}; null for -1 (keep each layer's dtype) or an unknown value. */
    private static DType optionalDType(int raw) {
        for (DType d : DType.values()) {
            if (raw >= 0 && d.raw().swigValue() == raw) {
                return d;
            }
        }
        return null;
    }

    /** A native struct holding these options; the caller deletes it (which frees its strings). */
    dst_checkpoint_options toNative() {
        dst_checkpoint_options raw = new dst_checkpoint_options();
        // BEGIN GENERATED toNative (bindings/gen_fields.py from dstransformer.h; do not edit)
        raw.setLayout(layout.raw());
        raw.setPrefix(prefix);
        raw.setInclude_grads(includeGrads ? 1 : 0);
        raw.setSave_dtype(saveDtype == null ? -1 : saveDtype.raw().swigValue());
        raw.setRestore_rng(restoreRng ? 1 : 0);
        raw.set_client_state_bytes(clientState);
        // END GENERATED toNative
        return raw;
    }

    // BEGIN GENERATED accessors (bindings/gen_fields.py from dstransformer.h; do not edit)
    /** Naming scheme. Default {@link WeightLayout#DEEPSPEED}. */
    public WeightLayout getLayout() {
        return layout;
    }

    /** Sets {@code layout} (see {@link #getLayout()}); returns this. */
    public CheckpointOptions setLayout(WeightLayout value) {
        this.layout = Objects.requireNonNull(value, "layout");
        return this;
    }

    /**
     * Prepended to {@code layer.<i>.}; null for none. Loading a Hugging Face file also accepts the prefixes
     * {@code bert.encoder.} and {@code encoder.} when this is null. Default null.
     */
    public String getPrefix() {
        return prefix;
    }

    /** Sets {@code prefix} (see {@link #getPrefix()}); returns this. */
    public CheckpointOptions setPrefix(String value) {
        this.prefix = value;
        return this;
    }

    /** Save: also write the gradients. Load: also read them (they must be present). Default false. */
    public boolean getIncludeGrads() {
        return includeGrads;
    }

    /** Sets {@code includeGrads} (see {@link #getIncludeGrads()}); returns this. */
    public CheckpointOptions setIncludeGrads(boolean value) {
        this.includeGrads = value;
        return this;
    }

    /** Save: the dtype to convert to; null keeps each layer's dtype. Default null. */
    public DType getSaveDtype() {
        return saveDtype;
    }

    /** Sets {@code saveDtype} (see {@link #getSaveDtype()}); returns this. */
    public CheckpointOptions setSaveDtype(DType value) {
        this.saveDtype = value;
        return this;
    }

    /** Load: set the first layer's context RNG state from the file. Default true. */
    public boolean getRestoreRng() {
        return restoreRng;
    }

    /** Sets {@code restoreRng} (see {@link #getRestoreRng()}); returns this. */
    public CheckpointOptions setRestoreRng(boolean value) {
        this.restoreRng = value;
        return this;
    }

    /** Save: the client state as text (its bytes decoded as UTF-8); null for none. Default null. */
    public String getClientState() {
        return clientState == null ? null : new String(clientState, StandardCharsets.UTF_8);
    }

    /** Sets {@code clientState} as text, stored as its UTF-8 bytes (null for none); returns this. */
    public CheckpointOptions setClientState(String value) {
        this.clientState = value == null ? null : value.getBytes(StandardCharsets.UTF_8);
        return this;
    }

    /**
     * Save: opaque bytes stored with the weights (epoch, step…), kept exactly (UTF-8 text without NUL is
     * stored as text, anything else base64-encoded). Default null.
     */
    public byte[] getClientStateBytes() {
        return clientState == null ? null : clientState.clone();
    }

    /**
     * Sets {@code clientState} to any bytes (NUL bytes and binary data included), kept exactly; null for
     * none. Returns this.
     */
    public CheckpointOptions setClientStateBytes(byte[] value) {
        this.clientState = value == null ? null : value.clone();
        return this;
    }
    // END GENERATED accessors
}
