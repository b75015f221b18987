package org.dstransformer;

import org.dstransformer.internal.dst_dtype;

/**
 * Element type of a tensor or of a layer's storage ({@code dst_dtype}).
 *
 * <p>In Java, FP32 data is {@code float[]}/{@code FloatBuffer}, FP64 {@code double[]}/{@code DoubleBuffer},
 * FP16 and BF16 their bits in {@code short[]}/{@code ShortBuffer}, INT32 {@code int[]}/{@code IntBuffer};
 * a direct {@code ByteBuffer} in native byte order holds any of them.
 */
public enum DType {
    /** IEEE binary32. */
    FP32(dst_dtype.DST_DTYPE_FP32),
    /** IEEE binary16. */
    FP16(dst_dtype.DST_DTYPE_FP16),
    /** bfloat16 (the upper half of a binary32). */
    BF16(dst_dtype.DST_DTYPE_BF16),
    /** IEEE binary64 (reference computations). */
    FP64(dst_dtype.DST_DTYPE_FP64),
    /** 32-bit signed integer (key-length masks). */
    INT32(dst_dtype.DST_DTYPE_INT32);

    private final dst_dtype raw;

    DType(dst_dtype raw) {
        this.raw = raw;
    }

    dst_dtype raw() {
        return raw;
    }

    /** Size of one element in bytes ({@code dst_dtype_size}). */
    public int size() {
        return (int) org.dstransformer.internal.dstransformer_native.dst_dtype_size(raw);
    }

    /** The library's name, e.g. {@code "bf16"} ({@code dst_dtype_string}). */
    public String libraryName() {
        return org.dstransformer.internal.dstransformer_native.dst_dtype_string(raw);
    }

    /** Whether this is FP16 or BF16. */
    public boolean isHalf() {
        return this == FP16 || this == BF16;
    }

    static DType fromRaw(dst_dtype raw) {
        for (DType d : values()) {
            if (d.raw == raw) {
                return d;
            }
        }
        throw new IllegalArgumentException("unknown dtype " + raw);
    }
}
