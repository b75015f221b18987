package org.dstransformer;

import org.dstransformer.internal.dst_grad_mode;

/** How backward stores parameter gradients ({@code dst_grad_mode}). */
public enum GradMode {
    /** Overwrite the gradient arena. */
    WRITE(dst_grad_mode.DST_GRAD_WRITE),
    /** Add to the gradient arena (gradient accumulation). */
    ACCUMULATE(dst_grad_mode.DST_GRAD_ACCUMULATE);

    private final dst_grad_mode raw;

    GradMode(dst_grad_mode raw) {
        this.raw = raw;
    }

    dst_grad_mode raw() {
        return raw;
    }
}
