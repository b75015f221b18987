package org.dstransformer;

import org.dstransformer.internal.dst_backend;

/** Compute backend of a context ({@code dst_backend}). */
public enum Backend {
    /** The best available: CUDA when a GPU is usable, else CPU. */
    AUTO(dst_backend.DST_BACKEND_AUTO),
    /** The reference backend: host memory, CBLAS GEMMs, OpenMP loops. */
    CPU(dst_backend.DST_BACKEND_CPU),
    /** NVIDIA GPUs. */
    CUDA(dst_backend.DST_BACKEND_CUDA);

    private final dst_backend raw;

    Backend(dst_backend raw) {
        this.raw = raw;
    }

    dst_backend raw() {
        return raw;
    }

    static Backend fromCode(int code) {
        for (Backend b : values()) {
            if (b.raw.swigValue() == code) {
                return b;
            }
        }
        throw new IllegalArgumentException("unknown backend code " + code);
    }
}
