package org.dstransformer;

import java.nio.Buffer;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.nio.DoubleBuffer;
import java.nio.FloatBuffer;
import java.nio.IntBuffer;
import java.nio.ShortBuffer;

import org.dstransformer.internal.dstransformer_native;

/**
 * Host memory for one call: a direct buffer's own memory (its position to its limit), or a direct
 * copy of a Java array (copied in before the call and, for outputs, back after it).
 */
final class HostData {
    /** Address of the first element. */
    final long address;
    /** Number of elements. */
    final long elements;
    /** Size in bytes. */
    final long bytes;
    /** Element type of the data; null for raw bytes. */
    final DType dtype;
    /** The memory: the caller's buffer or the copy of the array; keeps it reachable. */
    private final Buffer memory;
    /** The array to copy back into, or null. */
    private final Object array;

    private HostData(Buffer memory, long address, long elements, long bytes, DType dtype, Object array) {
        this.memory = memory;
        this.address = address;
        this.elements = elements;
        this.bytes = bytes;
        this.dtype = dtype;
        this.array = array;
    }

    static DstException invalid(String message) {
        return new DstException(Status.INVALID_ARGUMENT, message);
    }

    private static ByteBuffer direct(long bytes) {
        if (bytes > Integer.MAX_VALUE) {
            throw invalid("array of " + bytes + " bytes is too large for one call");
        }
        return ByteBuffer.allocateDirect((int) Math.max(bytes, 1)).order(ByteOrder.nativeOrder());
    }

    /**
     * A direct copy of an array.
     *
     * @param array a float[], double[], short[] (16-bit bits of {@code halfType}) or int[]
     * @param halfType the dtype of short[] data
     * @param copyIn whether the array's contents are needed (inputs); outputs are copied back by {@link #copyBack()}
     */
    static HostData ofArray(Object array, DType halfType, boolean copyIn, boolean output) {
        if (array == null) {
            throw new NullPointerException("array is null");
        }
        ByteBuffer copy;
        DType dtype;
        long n;
        if (array instanceof float[]) {
            float[] a = (float[]) array;
            dtype = DType.FP32;
            n = a.length;
            copy = direct(n * 4);
            if (copyIn) {
                copy.asFloatBuffer().put(a);
            }
        } else if (array instanceof double[]) {
            double[] a = (double[]) array;
            dtype = DType.FP64;
            n = a.length;
            copy = direct(n * 8);
            if (copyIn) {
                copy.asDoubleBuffer().put(a);
            }
        } else if (array instanceof short[]) {
            short[] a = (short[]) array;
            if (halfType == null || !halfType.isHalf()) {
                throw invalid("short[] data holds FP16 or BF16 values; this call needs "
                        + (halfType == null ? "another type" : halfType.name()));
            }
            dtype = halfType;
            n = a.length;
            copy = direct(n * 2);
            if (copyIn) {
                copy.asShortBuffer().put(a);
            }
        } else if (array instanceof int[]) {
            int[] a = (int[]) array;
            dtype = DType.INT32;
            n = a.length;
            copy = direct(n * 4);
            if (copyIn) {
                copy.asIntBuffer().put(a);
            }
        } else {
            throw new IllegalArgumentException("unsupported array type " + array.getClass().getName());
        }
        return new HostData(copy, dstransformer_native.dstj_buffer_address(copy), n, n * dtype.size(), dtype,
                output ? array : null);
    }

    /**
     * The memory of a direct buffer from its position to its limit.
     *
     * @param buffer a direct FloatBuffer (FP32), DoubleBuffer (FP64), IntBuffer (INT32), ShortBuffer
     *     (FP16/BF16 bits of {@code typeOfShortsAndBytes}) or ByteBuffer (elements of {@code typeOfShortsAndBytes}),
     *     in native byte order
     */
    static HostData ofBuffer(Buffer buffer, DType typeOfShortsAndBytes) {
        if (buffer == null) {
            throw new NullPointerException("buffer is null");
        }
        if (!buffer.isDirect()) {
            throw invalid("expected a direct buffer (ByteBuffer.allocateDirect), got a heap buffer");
        }
        DType dtype;
        ByteOrder order;
        if (buffer instanceof FloatBuffer) {
            dtype = DType.FP32;
            order = ((FloatBuffer) buffer).order();
        } else if (buffer instanceof DoubleBuffer) {
            dtype = DType.FP64;
            order = ((DoubleBuffer) buffer).order();
        } else if (buffer instanceof IntBuffer) {
            dtype = DType.INT32;
            order = ((IntBuffer) buffer).order();
        } else if (buffer instanceof ShortBuffer) {
            if (typeOfShortsAndBytes == null || !typeOfShortsAndBytes.isHalf()) {
                throw invalid("a ShortBuffer holds FP16 or BF16 values; this call needs "
                        + (typeOfShortsAndBytes == null ? "another type" : typeOfShortsAndBytes.name()));
            }
            dtype = typeOfShortsAndBytes;
            order = ((ShortBuffer) buffer).order();
        } else if (buffer instanceof ByteBuffer) {
            if (typeOfShortsAndBytes == null) {
                throw invalid("the element type of a ByteBuffer is unknown here");
            }
            dtype = typeOfShortsAndBytes;
            order = ((ByteBuffer) buffer).order();
        } else {
            throw new IllegalArgumentException("unsupported buffer type " + buffer.getClass().getName());
        }
        if (dtype.size() > 1 && order != ByteOrder.nativeOrder()) {
            throw invalid("the buffer is in " + order + " byte order; call order(ByteOrder.nativeOrder()) first");
        }
        long start = dstransformer_native.dstj_buffer_address(buffer);
        long n;
        long address;
        if (buffer instanceof ByteBuffer) {
            if (buffer.remaining() % dtype.size() != 0) {
                throw invalid("a ByteBuffer of " + buffer.remaining() + " bytes does not hold whole "
                        + dtype.name() + " elements");
            }
            n = buffer.remaining() / dtype.size();
            address = start + buffer.position();
        } else {
            n = buffer.remaining();
            address = start + (long) buffer.position() * dtype.size();
        }
        return new HostData(buffer, address, n, n * dtype.size(), dtype, null);
    }

    /** The bytes of a direct ByteBuffer from its position to its limit (any byte order), with no element type. */
    static HostData ofBytes(ByteBuffer buffer) {
        if (buffer == null) {
            throw new NullPointerException("buffer is null");
        }
        if (!buffer.isDirect()) {
            throw invalid("expected a direct buffer (ByteBuffer.allocateDirect), got a heap buffer");
        }
        long start = dstransformer_native.dstj_buffer_address(buffer);
        return new HostData(buffer, start + buffer.position(), buffer.remaining(), buffer.remaining(), null, null);
    }

    /** Copies the call's output back into the array (nothing for a buffer or an input). */
    void copyBack() {
        if (array == null) {
            return;
        }
        ByteBuffer copy = ((ByteBuffer) memory).duplicate().order(ByteOrder.nativeOrder());
        copy.clear();
        if (array instanceof float[]) {
            copy.asFloatBuffer().get((float[]) array);
        } else if (array instanceof double[]) {
            copy.asDoubleBuffer().get((double[]) array);
        } else if (array instanceof short[]) {
            copy.asShortBuffer().get((short[]) array);
        } else if (array instanceof int[]) {
            copy.asIntBuffer().get((int[]) array);
        }
    }
}
