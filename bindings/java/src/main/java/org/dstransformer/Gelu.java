package org.dstransformer;

import org.dstransformer.internal.dst_gelu;

/** Form of the GELU activation ({@code dst_gelu}). */
public enum Gelu {
    /** Exact x·Φ(x) (Hugging Face BERT). The default. */
    ERF(dst_gelu.DST_GELU_ERF),
    /** The tanh approximation (DeepSpeed's kernel). */
    TANH(dst_gelu.DST_GELU_TANH);

    private final dst_gelu raw;

    Gelu(dst_gelu raw) {
        this.raw = raw;
    }

    dst_gelu raw() {
        return raw;
    }

    static Gelu fromRaw(dst_gelu raw) {
        return raw == dst_gelu.DST_GELU_TANH ? TANH : ERF;
    }
}
