package org.dstransformer;

import org.dstransformer.internal.dst_layer_config;
import org.dstransformer.internal.dstransformer_native;

/**
 * The configuration of a layer ({@code dst_layer_config}): every field, with the library's defaults
 * ({@code dst_layer_config_default}). Setters return {@code this}, so a configuration reads
 *
 * <pre>{@code
 * LayerConfig cfg = new LayerConfig().setHiddenSize(256).setHeads(4).setMaxBatchTokens(4096).setMaxSeqLen(512);
 * cfg.validate(Backend.CPU);
 * }</pre>
 *
 * <p>A plain Java object: it holds no native resource.
 */
public final class LayerConfig {
    // BEGIN GENERATED fields (bindings/gen_fields.py from dstransformer.h; do not edit)
    private int hiddenSize;
    private int heads;
    private int intermediateSize;
    private float attnDropoutRatio;
    private float hiddenDropoutRatio;
    private int numHiddenLayers;
    private float initializerRange;
    private float layerNormEps;
    private long seed;
    private boolean preLayerNorm;
    private boolean normalizeInvertible;
    private boolean geluCheckpoint;
    private boolean attnDropoutCheckpoint;
    private boolean adjustInitRange;
    private boolean stochasticMode;
    private boolean training;
    private DType dtype;
    private long maxBatchTokens;
    private int maxSeqLen;
    private Gelu gelu;
    private boolean causal;
    private boolean allowTf32;
    // END GENERATED fields

    /** A configuration holding the library's defaults. */
    public LayerConfig() {
        dst_layer_config raw = new dst_layer_config();
        try {
            dstransformer_native.dst_layer_config_default(raw);
            load(raw);
        } finally {
            raw.delete();
        }
    }

    /** A copy of {@code other}. */
    public LayerConfig(LayerConfig other) {
        dst_layer_config raw = other.toNative();
        try {
            load(raw);
        } finally {
            raw.delete();
        }
    }

    static LayerConfig fromNative(dst_layer_config raw) {
        LayerConfig cfg = new LayerConfig();
        cfg.load(raw);
        return cfg;
    }

    private void load(dst_layer_config raw) {
        // BEGIN GENERATED load (bindings/gen_fields.py from dstransformer.h; do not edit)
        hiddenSize = raw.getHidden_size();
        heads = raw.getHeads();
        intermediateSize = raw.getIntermediate_size();
        attnDropoutRatio = raw.getAttn_dropout_ratio();
        hiddenDropoutRatio = raw.getHidden_dropout_ratio();
        numHiddenLayers = raw.getNum_hidden_layers();
        initializerRange = raw.getInitializer_range();
        layerNormEps = raw.getLayer_norm_eps();
        seed = raw.getSeed();
        preLayerNorm = raw.getPre_layer_norm() != 0;
        normalizeInvertible = raw.getNormalize_invertible() != 0;
        geluCheckpoint = raw.getGelu_checkpoint() != 0;
        attnDropoutCheckpoint = raw.getAttn_dropout_checkpoint() != 0;
        adjustInitRange = raw.getAdjust_init_range() != 0;
        stochasticMode = raw.getStochastic_mode() != 0;
        training = raw.getTraining() != 0;
        dtype = DType.fromRaw(raw.getDtype());
        maxBatchTokens = raw.getMax_batch_tokens();
        maxSeqLen = raw.getMax_seq_len();
        gelu = Gelu.fromRaw(raw.getGelu());
        causal = raw.getCausal() != 0;
        allowTf32 = raw.getAllow_tf32() != 0;
        // END GENERATED load
    }

    /** A native struct holding this configuration; the caller deletes it. */
    dst_layer_config toNative() {
        dst_layer_config raw = new dst_layer_config();
        dstransformer_native.dst_layer_config_default(raw);
        // BEGIN GENERATED toNative (bindings/gen_fields.py from dstransformer.h; do not edit)
        raw.setHidden_size(hiddenSize);
        raw.setHeads(heads);
        raw.setIntermediate_size(intermediateSize);
        raw.setAttn_dropout_ratio(attnDropoutRatio);
        raw.setHidden_dropout_ratio(hiddenDropoutRatio);
        raw.setNum_hidden_layers(numHiddenLayers);
        raw.setInitializer_range(initializerRange);
        raw.setLayer_norm_eps(layerNormEps);
        raw.setSeed(seed);
        raw.setPre_layer_norm(preLayerNorm ? 1 : 0);
        raw.setNormalize_invertible(normalizeInvertible ? 1 : 0);
        raw.setGelu_checkpoint(geluCheckpoint ? 1 : 0);
        raw.setAttn_dropout_checkpoint(attnDropoutCheckpoint ? 1 : 0);
        raw.setAdjust_init_range(adjustInitRange ? 1 : 0);
        raw.setStochastic_mode(stochasticMode ? 1 : 0);
        raw.setTraining(training ? 1 : 0);
        raw.setDtype(dtype.raw());
        raw.setMax_batch_tokens(maxBatchTokens);
        raw.setMax_seq_len(maxSeqLen);
        raw.setGelu(gelu.raw());
        raw.setCausal(causal ? 1 : 0);
        raw.setAllow_tf32(allowTf32 ? 1 : 0);
        // END GENERATED toNative
        return raw;
    }

    /**
     * Checks the configuration for a backend without allocating anything ({@code dst_layer_config_validate});
     * {@link Backend#AUTO} checks the generic rules only.
     *
     * @return this configuration
     * @throws DstException {@link Status#INVALID_ARGUMENT} naming the offending field, or
     *     {@link Status#UNSUPPORTED} when the backend cannot run valid values
     */
    public LayerConfig validate(Backend backend) {
        dst_layer_config raw = toNative();
        try {
            dstransformer_native.dst_layer_config_validate(raw, backend.raw());
        } finally {
            raw.delete();
        }
        return this;
    }

    /** {@link #validate(Backend)} with {@link Backend#AUTO}. */
    public LayerConfig validate() {
        return validate(Backend.AUTO);
    }

    /** Bytes of activations one training forward of B = batch, S = seq keeps ({@code dst_layer_config_saved_bytes}). */
    public long savedBytes(long batch, long seq) {
        long[] bytes = new long[1];
        dst_layer_config raw = toNative();
        try {
            dstransformer_native.dst_layer_config_saved_bytes(raw, batch, seq, bytes);
        } finally {
            raw.delete();
        }
        return bytes[0];
    }

    /** Bytes of workspace a call of B = batch, S = seq needs ({@code dst_layer_config_workspace_bytes}). */
    public long workspaceBytes(long batch, long seq) {
        long[] bytes = new long[1];
        dst_layer_config raw = toNative();
        try {
            dstransformer_native.dst_layer_config_workspace_bytes(raw, batch, seq, bytes);
        } finally {
            raw.delete();
        }
        return bytes[0];
    }

    // BEGIN GENERATED accessors (bindings/gen_fields.py from dstransformer.h; do not edit)
    /** H, the model width. Default 1024. */
    public int getHiddenSize() {
        return hiddenSize;
    }

    /**
     * Sets {@code hiddenSize} (see {@link #getHiddenSize()}).
     *
     * @return this configuration
     */
    public LayerConfig setHiddenSize(int value) {
        this.hiddenSize = value;
        return this;
    }

    /** Attention heads; must divide H. Default 16. */
    public int getHeads() {
        return heads;
    }

    /**
     * Sets {@code heads} (see {@link #getHeads()}).
     *
     * @return this configuration
     */
    public LayerConfig setHeads(int value) {
        this.heads = value;
        return this;
    }

    /** FFN width I; 0 means 4·H. Default 0. */
    public int getIntermediateSize() {
        return intermediateSize;
    }

    /**
     * Sets {@code intermediateSize} (see {@link #getIntermediateSize()}).
     *
     * @return this configuration
     */
    public LayerConfig setIntermediateSize(int value) {
        this.intermediateSize = value;
        return this;
    }

    /** Dropout on attention probabilities, in [0, 1). Default 0.1. */
    public float getAttnDropoutRatio() {
        return attnDropoutRatio;
    }

    /**
     * Sets {@code attnDropoutRatio} (see {@link #getAttnDropoutRatio()}).
     *
     * @return this configuration
     */
    public LayerConfig setAttnDropoutRatio(float value) {
        this.attnDropoutRatio = value;
        return this;
    }

    /** Dropout on both sub-layer outputs, in [0, 1). Default 0.1. */
    public float getHiddenDropoutRatio() {
        return hiddenDropoutRatio;
    }

    /**
     * Sets {@code hiddenDropoutRatio} (see {@link #getHiddenDropoutRatio()}).
     *
     * @return this configuration
     */
    public LayerConfig setHiddenDropoutRatio(float value) {
        this.hiddenDropoutRatio = value;
        return this;
    }

    /** Layers in the model (for the init rule). Default 24. */
    public int getNumHiddenLayers() {
        return numHiddenLayers;
    }

    /**
     * Sets {@code numHiddenLayers} (see {@link #getNumHiddenLayers()}).
     *
     * @return this configuration
     */
    public LayerConfig setNumHiddenLayers(int value) {
        this.numHiddenLayers = value;
        return this;
    }

    /** Std. deviation of weight init. Default 0.02. */
    public float getInitializerRange() {
        return initializerRange;
    }

    /**
     * Sets {@code initializerRange} (see {@link #getInitializerRange()}).
     *
     * @return this configuration
     */
    public LayerConfig setInitializerRange(float value) {
        this.initializerRange = value;
        return this;
    }

    /** LayerNorm ε, added to the variance. Default 1e-12. */
    public float getLayerNormEps() {
        return layerNormEps;
    }

    /**
     * Sets {@code layerNormEps} (see {@link #getLayerNormEps()}).
     *
     * @return this configuration
     */
    public LayerConfig setLayerNormEps(float value) {
        this.layerNormEps = value;
        return this;
    }

    /** Seed of the initial weights (Philox key). Default 42. */
    public long getSeed() {
        return seed;
    }

    /**
     * Sets {@code seed} (see {@link #getSeed()}).
     *
     * @return this configuration
     */
    public LayerConfig setSeed(long value) {
        this.seed = value;
        return this;
    }

    /** Pre-LN (true) or Post-LN (false). Default true. */
    public boolean getPreLayerNorm() {
        return preLayerNorm;
    }

    /**
     * Sets {@code preLayerNorm} (see {@link #getPreLayerNorm()}).
     *
     * @return this configuration
     */
    public LayerConfig setPreLayerNorm(boolean value) {
        this.preLayerNorm = value;
        return this;
    }

    /** LayerNorm backward from its output; drops LN inputs. Default false. */
    public boolean getNormalizeInvertible() {
        return normalizeInvertible;
    }

    /**
     * Sets {@code normalizeInvertible} (see {@link #getNormalizeInvertible()}).
     *
     * @return this configuration
     */
    public LayerConfig setNormalizeInvertible(boolean value) {
        this.normalizeInvertible = value;
        return this;
    }

    /** Keep only the pre-GELU value; recompute GELU. Default false. */
    public boolean getGeluCheckpoint() {
        return geluCheckpoint;
    }

    /**
     * Sets {@code geluCheckpoint} (see {@link #getGeluCheckpoint()}).
     *
     * @return this configuration
     */
    public LayerConfig setGeluCheckpoint(boolean value) {
        this.geluCheckpoint = value;
        return this;
    }

    /**
     * Accepted for DeepSpeed configs; has no effect: attention is fused and never keeps anything S×S
     * (docs/memory.md). Default false.
     */
    public boolean getAttnDropoutCheckpoint() {
        return attnDropoutCheckpoint;
    }

    /**
     * Sets {@code attnDropoutCheckpoint} (see {@link #getAttnDropoutCheckpoint()}).
     *
     * @return this configuration
     */
    public LayerConfig setAttnDropoutCheckpoint(boolean value) {
        this.attnDropoutCheckpoint = value;
        return this;
    }

    /** Scale the output-projection init by 1/sqrt(2·layers). Default true. */
    public boolean getAdjustInitRange() {
        return adjustInitRange;
    }

    /**
     * Sets {@code adjustInitRange} (see {@link #getAdjustInitRange()}).
     *
     * @return this configuration
     */
    public LayerConfig setAdjustInitRange(boolean value) {
        this.adjustInitRange = value;
        return this;
    }

    /**
     * Allow non-deterministic fast paths (CUDA: the attention backward adds its partial dQs in arrival
     * order instead of a fixed order; results then differ in the last bits from run to run). Default false:
     * every backward is bit-reproducible.
     */
    public boolean getStochasticMode() {
        return stochasticMode;
    }

    /**
     * Sets {@code stochasticMode} (see {@link #getStochasticMode()}).
     *
     * @return this configuration
     */
    public LayerConfig setStochasticMode(boolean value) {
        this.stochasticMode = value;
        return this;
    }

    /** Initial mode: training (dropout, saved state) or inference. Default true. */
    public boolean getTraining() {
        return training;
    }

    /**
     * Sets {@code training} (see {@link #getTraining()}).
     *
     * @return this configuration
     */
    public LayerConfig setTraining(boolean value) {
        this.training = value;
        return this;
    }

    /** Storage type of parameters and activations. Default {@link DType#FP32}. */
    public DType getDtype() {
        return dtype;
    }

    /**
     * Sets {@code dtype} (see {@link #getDtype()}).
     *
     * @return this configuration
     */
    public LayerConfig setDtype(DType value) {
        this.dtype = java.util.Objects.requireNonNull(value, "dtype");
        return this;
    }

    /** Largest B·S of any call. Default 8192. */
    public long getMaxBatchTokens() {
        return maxBatchTokens;
    }

    /**
     * Sets {@code maxBatchTokens} (see {@link #getMaxBatchTokens()}).
     *
     * @return this configuration
     */
    public LayerConfig setMaxBatchTokens(long value) {
        this.maxBatchTokens = value;
        return this;
    }

    /** Largest S of any call. Default 512. */
    public int getMaxSeqLen() {
        return maxSeqLen;
    }

    /**
     * Sets {@code maxSeqLen} (see {@link #getMaxSeqLen()}).
     *
     * @return this configuration
     */
    public LayerConfig setMaxSeqLen(int value) {
        this.maxSeqLen = value;
        return this;
    }

    /** GELU form. Default {@link Gelu#ERF}. */
    public Gelu getGelu() {
        return gelu;
    }

    /**
     * Sets {@code gelu} (see {@link #getGelu()}).
     *
     * @return this configuration
     */
    public LayerConfig setGelu(Gelu value) {
        this.gelu = java.util.Objects.requireNonNull(value, "gelu");
        return this;
    }

    /** Causal attention (query i sees keys ≤ i). Default false. */
    public boolean getCausal() {
        return causal;
    }

    /**
     * Sets {@code causal} (see {@link #getCausal()}).
     *
     * @return this configuration
     */
    public LayerConfig setCausal(boolean value) {
        this.causal = value;
        return this;
    }

    /** Let FP32 GEMMs use TF32 tensor cores (CUDA). Default false. */
    public boolean getAllowTf32() {
        return allowTf32;
    }

    /**
     * Sets {@code allowTf32} (see {@link #getAllowTf32()}).
     *
     * @return this configuration
     */
    public LayerConfig setAllowTf32(boolean value) {
        this.allowTf32 = value;
        return this;
    }

    @Override
    public boolean equals(Object other) {
        if (this == other) {
            return true;
        }
        if (!(other instanceof LayerConfig)) {
            return false;
        }
        LayerConfig o = (LayerConfig) other;
        return hiddenSize == o.hiddenSize
                && heads == o.heads
                && intermediateSize == o.intermediateSize
                && Float.compare(attnDropoutRatio, o.attnDropoutRatio) == 0
                && Float.compare(hiddenDropoutRatio, o.hiddenDropoutRatio) == 0
                && numHiddenLayers == o.numHiddenLayers
                && Float.compare(initializerRange, o.initializerRange) == 0
                && Float.compare(layerNormEps, o.layerNormEps) == 0
                && seed == o.seed
                && preLayerNorm == o.preLayerNorm
                && normalizeInvertible == o.normalizeInvertible
                && geluCheckpoint == o.geluCheckpoint
                && attnDropoutCheckpoint == o.attnDropoutCheckpoint
                && adjustInitRange == o.adjustInitRange
                && stochasticMode == o.stochasticMode
                && training == o.training
                && dtype == o.dtype
                && maxBatchTokens == o.maxBatchTokens
                && maxSeqLen == o.maxSeqLen
                && gelu == o.gelu
                && causal == o.causal
                && allowTf32 == o.allowTf32;
    }

    @Override
    public int hashCode() {
        return java.util.Objects.hash(hiddenSize, heads, intermediateSize, attnDropoutRatio, hiddenDropoutRatio,
                numHiddenLayers, initializerRange, layerNormEps, seed, preLayerNorm, normalizeInvertible,
                geluCheckpoint, attnDropoutCheckpoint, adjustInitRange, stochasticMode, training, dtype,
                maxBatchTokens, maxSeqLen, gelu, causal, allowTf32);
    }

    @Override
    public String toString() {
        return "LayerConfig[" + "hiddenSize=" + hiddenSize + ", "
                + "heads=" + heads + ", "
                + "intermediateSize=" + intermediateSize + ", "
                + "attnDropoutRatio=" + attnDropoutRatio + ", "
                + "hiddenDropoutRatio=" + hiddenDropoutRatio + ", "
                + "numHiddenLayers=" + numHiddenLayers + ", "
                + "initializerRange=" + initializerRange + ", "
                + "layerNormEps=" + layerNormEps + ", "
                + "seed=" + seed + ", "
                + "preLayerNorm=" + preLayerNorm + ", "
                + "normalizeInvertible=" + normalizeInvertible + ", "
                + "geluCheckpoint=" + geluCheckpoint + ", "
                + "attnDropoutCheckpoint=" + attnDropoutCheckpoint + ", "
                + "adjustInitRange=" + adjustInitRange + ", "
                + "stochasticMode=" + stochasticMode + ", "
                + "training=" + training + ", "
                + "dtype=" + dtype + ", "
                + "maxBatchTokens=" + maxBatchTokens + ", "
                + "maxSeqLen=" + maxSeqLen + ", "
                + "gelu=" + gelu + ", "
                + "causal=" + causal + ", "
                + "allowTf32=" + allowTf32 + "]";
    }
    // END GENERATED accessors
}
