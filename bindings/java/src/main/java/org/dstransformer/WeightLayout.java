package org.dstransformer;

import org.dstransformer.internal.dst_weight_layout;

/** Tensor naming scheme of a checkpoint ({@code dst_weight_layout}). */
public enum WeightLayout {
    /** DeepSpeed Transformer Kernel names ({@code attn_qkvw} … {@code norm_b}); the native layout. */
    DEEPSPEED(dst_weight_layout.DST_LAYOUT_DEEPSPEED),
    /** Hugging Face {@code BertLayer} names ({@code attention.self.query.weight} …); Post-LN only. */
    HF_BERT(dst_weight_layout.DST_LAYOUT_HF_BERT);

    private final dst_weight_layout raw;

    WeightLayout(dst_weight_layout raw) {
        this.raw = raw;
    }

    dst_weight_layout raw() {
        return raw;
    }

    static WeightLayout fromRaw(dst_weight_layout raw) {
        return raw == dst_weight_layout.DST_LAYOUT_HF_BERT ? HF_BERT : DEEPSPEED;
    }
}
