package org.dstransformer;

import org.dstransformer.internal.dst_param_group;

/**
 * Hyperparameters of one parameter group of an optimizer ({@code dst_param_group}).
 *
 * @param lr learning rate (an engine's schedule overrides it)
 * @param beta1 β1, in [0, 1)
 * @param beta2 β2, in [0, 1)
 * @param eps ε, ≥ 0
 * @param weightDecay weight decay, ≥ 0
 */
public record ParamGroup(float lr, float beta1, float beta2, float eps, float weightDecay) {
    /** FusedAdam's defaults ({@code dst_param_group_default}). */
    public static ParamGroup defaults() {
        dst_param_group raw = new dst_param_group();
        try {
            return fromNative(raw);
        } finally {
            raw.delete();
        }
    }

    /** A copy with another weight decay. */
    public ParamGroup withWeightDecay(float value) {
        return new ParamGroup(lr, beta1, beta2, eps, value);
    }

    /** A copy with another learning rate. */
    public ParamGroup withLr(float value) {
        return new ParamGroup(value, beta1, beta2, eps, weightDecay);
    }

    static ParamGroup fromNative(dst_param_group raw) {
        return new ParamGroup(raw.getLr(), raw.getBeta1(), raw.getBeta2(), raw.getEps(), raw.getWeight_decay());
    }

    /** A native struct with these values; the caller deletes it. */
    dst_param_group toNative() {
        dst_param_group raw = new dst_param_group();
        raw.setLr(lr);
        raw.setBeta1(beta1);
        raw.setBeta2(beta2);
        raw.setEps(eps);
        raw.setWeight_decay(weightDecay);
        return raw;
    }
}
