package org.dstransformer;

import java.nio.Buffer;
import java.nio.ByteBuffer;
import java.nio.IntBuffer;
import java.util.Objects;

/**
 * An attention mask for {@link Layer#forward}: none, an additive key mask {@code [B, S]}, or key
 * lengths {@code [B]}. The data is read at each forward (host memory; copied to the device as needed).
 */
public final class Mask {
    /** Kind of mask ({@code dst_mask_kind}). */
    public enum Kind {
        /** Every key is visible. */
        NONE,
        /** Added to the attention scores: 0 keeps a key, a large negative value (-10000) masks it. */
        ADDITIVE,
        /** Keys j ≥ len[b] are masked; values in 1..S. The fast form. */
        KEY_LENGTHS
    }

    private static final Mask NONE = new Mask(Kind.NONE, null, null);

    private final Kind kind;
    /** A Java array or a direct buffer, or null for NONE. */
    private final Object data;
    /** Element type of a ByteBuffer; null means "the layer's dtype" for short data. */
    private final DType byteType;

    private Mask(Kind kind, Object data, DType byteType) {
        this.kind = kind;
        this.data = data;
        this.byteType = byteType;
    }

    /** No mask: every key is visible. */
    public static Mask none() {
        return NONE;
    }

    /** An additive FP32 mask {@code [B, S]} (DeepSpeed's {@code [B, 1, 1, S]} is the same memory). */
    public static Mask additive(float[] mask) {
        return new Mask(Kind.ADDITIVE, Objects.requireNonNull(mask, "mask"), null);
    }

    /** An additive FP64 mask {@code [B, S]} (for FP64 layers). */
    public static Mask additive(double[] mask) {
        return new Mask(Kind.ADDITIVE, Objects.requireNonNull(mask, "mask"), null);
    }

    /** An additive mask {@code [B, S]} of FP16 or BF16 bits in the layer's dtype (for 16-bit layers). */
    public static Mask additive(short[] mask) {
        return new Mask(Kind.ADDITIVE, Objects.requireNonNull(mask, "mask"), null);
    }

    /**
     * An additive mask {@code [B, S]} in a direct buffer in native byte order: a FloatBuffer (FP32),
     * DoubleBuffer (FP64) or ShortBuffer (the layer's 16-bit dtype).
     */
    public static Mask additive(Buffer mask) {
        if (mask instanceof ByteBuffer) {
            throw new IllegalArgumentException("give the element type of a ByteBuffer mask: additive(buffer, dtype)");
        }
        return new Mask(Kind.ADDITIVE, Objects.requireNonNull(mask, "mask"), null);
    }

    /** An additive mask {@code [B, S]} of {@code dtype} elements in a direct ByteBuffer in native byte order. */
    public static Mask additive(ByteBuffer mask, DType dtype) {
        return new Mask(Kind.ADDITIVE, Objects.requireNonNull(mask, "mask"), Objects.requireNonNull(dtype, "dtype"));
    }

    /** Key lengths {@code [B]}: for sequence b, keys j ≥ lengths[b] are masked. */
    public static Mask keyLengths(int[] lengths) {
        return new Mask(Kind.KEY_LENGTHS, Objects.requireNonNull(lengths, "lengths"), null);
    }

    /** Key lengths {@code [B]} in a direct IntBuffer in native byte order. */
    public static Mask keyLengths(IntBuffer lengths) {
        return new Mask(Kind.KEY_LENGTHS, Objects.requireNonNull(lengths, "lengths"), null);
    }

    /** The kind of mask. */
    public Kind kind() {
        return kind;
    }

    /** The mask's host data for a layer of {@code layerType}; null for {@link Kind#NONE}. */
    HostData hostData(DType layerType) {
        if (data == null) {
            return null;
        }
        if (data instanceof Buffer) {
            return HostData.ofBuffer((Buffer) data, byteType != null ? byteType : layerType);
        }
        return HostData.ofArray(data, layerType, true, false);
    }

    @Override
    public String toString() {
        return "Mask[" + kind + "]";
    }
}
