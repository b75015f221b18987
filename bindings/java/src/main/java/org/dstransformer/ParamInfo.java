package org.dstransformer;

import java.util.Arrays;

/**
 * Shape and arena position of one parameter and of its gradient ({@code dst_param_info}).
 *
 * @param param which parameter
 * @param name DeepSpeed's name, e.g. {@code "attn_qkvw"}
 * @param shape the row-major shape ({@code [out, in]} for weights); a copy is returned by {@link #shape()}
 * @param numel the number of elements
 * @param offsetBytes the byte offset from the start of the arena (a multiple of 256)
 * @param sizeBytes numel × the layer dtype's size
 */
public record ParamInfo(Param param, String name, long[] shape, long numel, long offsetBytes, long sizeBytes) {
    /** Creates the record, copying {@code shape}. */
    public ParamInfo {
        shape = shape.clone();
    }

    /** The shape (a copy). */
    @Override
    public long[] shape() {
        return shape.clone();
    }

    @Override
    public boolean equals(Object other) {
        return other instanceof ParamInfo o && param == o.param && name.equals(o.name)
                && Arrays.equals(shape, o.shape) && numel == o.numel && offsetBytes == o.offsetBytes
                && sizeBytes == o.sizeBytes;
    }

    @Override
    public int hashCode() {
        return 31 * param.hashCode() + Arrays.hashCode(shape);
    }

    @Override
    public String toString() {
        return "ParamInfo[" + name + " " + Arrays.toString(shape) + ", offset " + offsetBytes + ", " + sizeBytes
                + " bytes]";
    }
}
