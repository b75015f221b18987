package org.dstransformer;

import org.dstransformer.internal.dst_index_checks;

/** When a context's model ops check their index values ({@code dst_index_checks}). */
public enum IndexChecks {
    /** Before the call returns; a CUDA context waits for the device (the default). */
    EAGER(dst_index_checks.DST_INDEX_CHECKS_EAGER),
    /** On the device, without waiting; a later call on the context reports a failure. */
    DEFERRED(dst_index_checks.DST_INDEX_CHECKS_DEFERRED);

    private final dst_index_checks raw;

    IndexChecks(dst_index_checks raw) {
        this.raw = raw;
    }

    dst_index_checks raw() {
        return raw;
    }

    static IndexChecks fromCode(int code) {
        for (IndexChecks m : values()) {
            if (m.raw.swigValue() == code) {
                return m;
            }
        }
        throw new IllegalArgumentException("unknown index-check mode " + code);
    }
}
