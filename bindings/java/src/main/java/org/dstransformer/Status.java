package org.dstransformer;

/** Result of a call of the C API ({@code dst_status}); the numeric codes are fixed and never reused. */
public enum Status {
    /** {@code DST_OK}: success. A {@link DstException} never carries it. */
    OK(0),
    /** {@code DST_ERR_INVALID_ARGUMENT}: an argument is out of range or of the wrong dtype or shape. */
    INVALID_ARGUMENT(1),
    /** {@code DST_ERR_UNSUPPORTED}: a valid request that this build or backend cannot serve. */
    UNSUPPORTED(2),
    /** {@code DST_ERR_CAPACITY}: B·S or S exceeds the maxima the layer was created with. */
    CAPACITY(3),
    /** {@code DST_ERR_OUT_OF_MEMORY}: an allocation failed (host or device). */
    OUT_OF_MEMORY(4),
    /** {@code DST_ERR_STATE}: a call out of order, e.g. backward without a training forward. */
    STATE(5),
    /** {@code DST_ERR_BACKEND}: a backend library (BLAS, CUDA, cuBLAS) reported an error. */
    BACKEND(6),
    /** {@code DST_ERR_IO}: a file could not be read or written. */
    IO(7),
    /** {@code DST_ERR_FORMAT}: a file or buffer is malformed or does not match the target. */
    FORMAT(8),
    /** {@code DST_ERR_INTERNAL}: a bug in the library. */
    INTERNAL(99),
    /** A code this version of the binding does not know (from a newer library). */
    UNKNOWN(-1);

    private final int code;

    Status(int code) {
        this.code = code;
    }

    /** The numeric code ({@code DST_OK} is 0; -1 for {@link #UNKNOWN}). */
    public int code() {
        return code;
    }

    /** The status of a numeric code; {@link #UNKNOWN} for a code that is not one. */
    public static Status fromCode(int code) {
        for (Status s : values()) {
            if (s.code == code) {
                return s;
            }
        }
        return UNKNOWN;
    }

    /** The library's name of a status code, e.g. {@code "DST_ERR_CAPACITY"} ({@code dst_status_string}). */
    public static String nameOf(int code) {
        return org.dstransformer.internal.dstransformer_native.dst_status_string(code);
    }
}
