package org.dstransformer;

import java.nio.charset.StandardCharsets;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.List;

import org.dstransformer.internal.SWIGTYPE_p_p_dst_layer;
import org.dstransformer.internal.dst_checkpoint_options;
import org.dstransformer.internal.dstransformer_native;

/**
 * safetensors checkpoints of one layer or a stack of layers ({@code dst_checkpoint_*}): layer i is
 * stored as {@code <prefix>layer.<i>.<name>} in DeepSpeed or Hugging Face BERT names.
 */
public final class Checkpoint {
    /** Serialises the calls that lock more than one context, so that two of them never deadlock. */
    private static final Object MULTI_CONTEXT_LOCK = new Object();

    private Checkpoint() {
    }

    private interface NativeCall {
        void run(SWIGTYPE_p_p_dst_layer array);
    }

    /** Runs {@code call} on a native array of the layers' handles, holding every context's monitor. */
    private static void withLayers(Layer[] layers, NativeCall call) {
        if (layers == null || layers.length == 0) {
            throw HostData.invalid("checkpoint: at least one layer is needed");
        }
        List<NativeContext> contexts = new ArrayList<>();
        for (Layer layer : layers) {
            NativeContext nc = layer.state().nc;
            if (!contexts.contains(nc)) {
                contexts.add(nc);
            }
        }
        synchronized (MULTI_CONTEXT_LOCK) {
            lockAndRun(contexts, 0, layers, call);
        }
    }

    private static void lockAndRun(List<NativeContext> contexts, int i, Layer[] layers, NativeCall call) {
        if (i < contexts.size()) {
            synchronized (contexts.get(i)) {
                lockAndRun(contexts, i + 1, layers, call);
            }
            return;
        }
        SWIGTYPE_p_p_dst_layer array = dstransformer_native.new_dst_layer_array(layers.length);
        try {
            for (int k = 0; k < layers.length; k++) {
                layers[k].state().check();
                dstransformer_native.dst_layer_array_setitem(array, k, layers[k].handle());
            }
            call.run(array);
        } finally {
            dstransformer_native.delete_dst_layer_array(array);
        }
    }

    private static String text(byte[] buf) {
        int end = 0;
        while (end < buf.length && buf[end] != 0) {
            end++;
        }
        return new String(buf, 0, end, StandardCharsets.UTF_8);
    }

    /**
     * Writes the parameters (and, with {@code includeGrads}, the gradients) of {@code layers} to a
     * safetensors file, replacing it atomically ({@code dst_checkpoint_save}).
     *
     * @param options the options, or null for the defaults
     * @throws DstException {@link Status#IO} when the file cannot be written
     */
    public static void save(Path path, CheckpointOptions options, Layer... layers) {
        dst_checkpoint_options raw = (options == null ? new CheckpointOptions() : options).toNative();
        try {
            withLayers(layers, array -> dstransformer_native.dst_checkpoint_save(array, layers.length,
                    path.toString(), raw));
        } finally {
            raw.delete();
        }
    }

    /**
     * Reads the parameters (and, with {@code includeGrads}, the gradients) of {@code layers} from a
     * safetensors file ({@code dst_checkpoint_load}); nothing changes on failure.
     *
     * @param options the options, or null for the defaults
     * @return the client state stored with the weights, or null when there is none
     * @throws DstException {@link Status#IO} or {@link Status#FORMAT}, naming the missing or bad tensor
     */
    public static String load(Path path, CheckpointOptions options, Layer... layers) {
        byte[] state = loadBytes(path, options, layers);
        return state == null ? null : new String(state, StandardCharsets.UTF_8);
    }

    /**
     * As {@link #load}, but returns the stored client state as its exact bytes.
     *
     * @param options the options, or null for the defaults
     * @return the client state's bytes, or null when there is none
     * @throws DstException {@link Status#IO} or {@link Status#FORMAT}, naming the missing or bad tensor
     */
    public static byte[] loadBytes(Path path, CheckpointOptions options, Layer... layers) {
        dst_checkpoint_options raw = (options == null ? new CheckpointOptions() : options).toNative();
        try {
            byte[][] buf = {new byte[4096]};
            long[] len = new long[1];
            while (true) {
                withLayers(layers, array -> dstransformer_native.dst_checkpoint_load(array, layers.length,
                        path.toString(), raw, buf[0], len));
                if (len[0] < buf[0].length) {
                    return len[0] == 0 ? null : java.util.Arrays.copyOf(buf[0], (int) len[0]);
                }
                // Truncated: load again (the same data) with room for the whole client state.
                if (len[0] >= Integer.MAX_VALUE) {
                    throw HostData.invalid("checkpoint client state of " + len[0] + " bytes is too large");
                }
                buf[0] = new byte[(int) len[0] + 1];
            }
        } finally {
            raw.delete();
        }
    }

    /**
     * Converts a checkpoint file between weight layouts without creating layers ({@code dst_checkpoint_convert}).
     *
     * @param inPrefix the source's layer-name prefix, or null to detect it
     * @param outPrefix the prefix to write, or null to keep the source's
     * @return the library's summary of what was read and written
     */
    public static String convert(Path in, WeightLayout inLayout, String inPrefix, Path out, WeightLayout outLayout,
            String outPrefix) {
        byte[] summary = new byte[16384];
        dstransformer_native.dst_checkpoint_convert(in.toString(), inLayout.raw(), inPrefix, out.toString(),
                outLayout.raw(), outPrefix, summary);
        return text(summary);
    }

    /**
     * Describes a checkpoint file without creating layers ({@code dst_checkpoint_describe}): sizes,
     * tensor count and dtypes, the layers found under each layout and prefix, and the metadata. Reads
     * only the header, which it validates.
     *
     * @return the library's description
     * @throws DstException {@link Status#IO} or {@link Status#FORMAT}
     */
    public static String describe(Path path) {
        byte[] buf = new byte[16384];
        long[] len = new long[1];
        while (true) {
            dstransformer_native.dst_checkpoint_describe(path.toString(), buf, len);
            if (len[0] < buf.length) {
                return text(buf);
            }
            if (len[0] >= Integer.MAX_VALUE) {
                throw HostData.invalid("checkpoint description of " + len[0] + " bytes is too large");
            }
            buf = new byte[(int) len[0] + 1];
        }
    }
}
