package org.dstransformer;

import org.dstransformer.internal.dst_param;
import org.dstransformer.internal.dstransformer_native;

/** The twelve parameters of a layer, in DeepSpeed's order ({@code dst_param}). */
public enum Param {
    /** {@code attn_qkvw} [3H, H]: rows Q, then K, then V. */
    ATTN_QKVW("attn_qkvw", dst_param.DST_PARAM_ATTN_QKVW),
    /** {@code attn_qkvb} [3H]. */
    ATTN_QKVB("attn_qkvb", dst_param.DST_PARAM_ATTN_QKVB),
    /** {@code attn_ow} [H, H], attention output projection. */
    ATTN_OW("attn_ow", dst_param.DST_PARAM_ATTN_OW),
    /** {@code attn_ob} [H]. */
    ATTN_OB("attn_ob", dst_param.DST_PARAM_ATTN_OB),
    /** {@code attn_nw} [H], γ of the LayerNorm after the attention residual. */
    ATTN_NW("attn_nw", dst_param.DST_PARAM_ATTN_NW),
    /** {@code attn_nb} [H], β of that LayerNorm. */
    ATTN_NB("attn_nb", dst_param.DST_PARAM_ATTN_NB),
    /** {@code inter_w} [I, H], FFN up-projection. */
    INTER_W("inter_w", dst_param.DST_PARAM_INTER_W),
    /** {@code inter_b} [I]. */
    INTER_B("inter_b", dst_param.DST_PARAM_INTER_B),
    /** {@code output_w} [H, I], FFN down-projection. */
    OUTPUT_W("output_w", dst_param.DST_PARAM_OUTPUT_W),
    /** {@code output_b} [H]. */
    OUTPUT_B("output_b", dst_param.DST_PARAM_OUTPUT_B),
    /** {@code norm_w} [H]: γ of the input LN (Pre-LN) or of the final LN (Post-LN). */
    NORM_W("norm_w", dst_param.DST_PARAM_NORM_W),
    /** {@code norm_b} [H]. */
    NORM_B("norm_b", dst_param.DST_PARAM_NORM_B);

    private final String paramName;
    private final dst_param raw;

    Param(String paramName, dst_param raw) {
        this.paramName = paramName;
        this.raw = raw;
    }

    /** DeepSpeed's name, e.g. {@code "attn_qkvw"}. */
    public String paramName() {
        return paramName;
    }

    dst_param raw() {
        return raw;
    }

    /**
     * Looks a parameter up by name ({@code dst_param_lookup}): DeepSpeed's names, optionally after a
     * prefix ending in '.', e.g. {@code "bert.encoder.layer.3.attn_qkvw"}.
     *
     * @throws DstException {@link Status#INVALID_ARGUMENT} for an unknown name
     */
    public static Param lookup(String name) {
        int[] id = new int[1];
        dstransformer_native.dst_param_lookup(name, id);
        for (Param p : values()) {
            if (p.raw.swigValue() == id[0]) {
                return p;
            }
        }
        throw new DstException(Status.INTERNAL, "dst_param_lookup returned unknown parameter id " + id[0]);
    }
}
