package org.dstransformer;

import java.lang.ref.Cleaner;
import java.nio.ByteBuffer;

import org.dstransformer.internal.SWIGTYPE_p_dst_context;
import org.dstransformer.internal.dstransformer_native;

/**
 * A context: a backend and its memory, the dropout random-number state and the layer counter
 * ({@code dst_context}).
 *
 * <p>Close it with {@link #close()} (idempotent; try-with-resources works). Layers keep their context
 * alive, so it may be closed before them: the native context goes when the last of them is closed. A
 * {@link Cleaner} releases a context that was never closed once it is unreachable.
 *
 * <p>Threads: a context and its layers may be used from any thread. Calls on them are serialised (the
 * C API allows one thread at a time), so sharing them between threads is safe but gains nothing; use
 * one context per thread to run in parallel.
 */
public final class Context implements AutoCloseable {
    /** The dropout random-number state: a Philox key and the next counter offset. */
    public record RngState(long seed, long offset) {
    }

    private final NativeContext nc;
    private final Cleaner.Cleanable cleanable;
    private final int device;
    private volatile boolean closed;

    /**
     * Creates a context ({@code dst_context_create}).
     *
     * @param backend the backend; {@link Backend#AUTO} picks CUDA when a GPU is usable
     * @param device the GPU ordinal; must be 0 for the CPU backend
     * @throws DstException {@link Status#UNSUPPORTED} when the backend is not available
     */
    public Context(Backend backend, int device) {
        long[] out = new long[1];
        dstransformer_native.dst_context_create(backend.raw(), device, out);
        SWIGTYPE_p_dst_context handle = new SWIGTYPE_p_dst_context(out[0], false);
        int[] resolved = new int[1];
        try {
            dstransformer_native.dst_context_get_backend(handle, resolved);
        } catch (RuntimeException e) {
            dstransformer_native.dst_context_destroy(handle);
            throw e;
        }
        this.nc = new NativeContext(handle, Backend.fromCode(resolved[0]));
        this.device = device;
        this.cleanable = NativeContext.CLEANER.register(this, nc::release);
    }

    /** A context on the CPU backend. */
    public static Context cpu() {
        return new Context(Backend.CPU, 0);
    }

    NativeContext nativeContext() {
        ensureOpen();
        return nc;
    }

    private void ensureOpen() {
        if (closed) {
            throw new IllegalStateException("the context is closed");
        }
    }

    /** The backend the context runs on ({@link Backend#AUTO} resolved). */
    public Backend backend() {
        return nc.backend;
    }

    /** The device ordinal the context was created with. */
    public int device() {
        return device;
    }

    /**
     * Sets the dropout random-number state ({@code dst_context_set_rng_state}).
     *
     * @param seed the Philox key (all 64 bits; Java's sign is ignored)
     * @param offset the first counter offset the next training forward uses
     */
    public void setRngState(long seed, long offset) {
        synchronized (nativeContext()) {
            dstransformer_native.dst_context_set_rng_state(nc.handle, seed, offset);
        }
    }

    /** The dropout random-number state ({@code dst_context_get_rng_state}). */
    public RngState rngState() {
        long[] seed = new long[1];
        long[] offset = new long[1];
        synchronized (nativeContext()) {
            dstransformer_native.dst_context_get_rng_state(nc.handle, seed, offset);
        }
        return new RngState(seed[0], offset[0]);
    }

    /**
     * The graph dropout counter: the word the next training forward run from a CUDA graph takes
     * ({@code dst_context_get_rng_graph_counter}; waits for the context's stream).
     */
    public long rngGraphCounter() {
        long[] counter = new long[1];
        synchronized (nativeContext()) {
            dstransformer_native.dst_context_get_rng_graph_counter(nc.handle, counter);
        }
        return counter[0];
    }

    /**
     * Sets the graph dropout counter ({@code dst_context_set_rng_graph_counter}).
     *
     * @param counter the word, 0 ... 2^32 - 1
     */
    public void setRngGraphCounter(long counter) {
        synchronized (nativeContext()) {
            dstransformer_native.dst_context_set_rng_graph_counter(nc.handle, counter);
        }
    }

    /** Sets the number of host threads of the CPU backend; 0 restores the default ({@code dst_context_set_num_threads}). */
    public void setNumThreads(int threads) {
        synchronized (nativeContext()) {
            dstransformer_native.dst_context_set_num_threads(nc.handle, threads);
        }
    }

    /** The host thread count in effect ({@code dst_context_get_num_threads}). */
    public int numThreads() {
        int[] threads = new int[1];
        synchronized (nativeContext()) {
            dstransformer_native.dst_context_get_num_threads(nc.handle, threads);
        }
        return threads[0];
    }

    /**
     * Chooses when the model ops check their index values: {@link IndexChecks#EAGER} (the default) or
     * {@link IndexChecks#DEFERRED} ({@code dst_context_set_index_checks}).
     */
    public void setIndexChecks(IndexChecks mode) {
        synchronized (nativeContext()) {
            dstransformer_native.dst_context_set_index_checks(nc.handle, mode.raw());
        }
    }

    /** When the model ops check their index values ({@code dst_context_get_index_checks}). */
    public IndexChecks indexChecks() {
        int[] mode = new int[1];
        synchronized (nativeContext()) {
            dstransformer_native.dst_context_get_index_checks(nc.handle, mode);
        }
        return IndexChecks.fromCode(mode[0]);
    }

    /** Waits until all work the context queued has finished ({@code dst_context_synchronize}). */
    public void synchronize() {
        synchronized (nativeContext()) {
            dstransformer_native.dst_context_synchronize(nc.handle);
        }
    }

    /** Current size of the activation workspace in bytes ({@code dst_context_workspace_bytes}). */
    public long workspaceBytes() {
        long[] bytes = new long[1];
        synchronized (nativeContext()) {
            dstransformer_native.dst_context_workspace_bytes(nc.handle, bytes);
        }
        return bytes[0];
    }

    /**
     * Gives a CPU context caller memory for its workspace ({@code dst_context_set_workspace}); null
     * returns to an owned workspace. The buffer is kept reachable while the context uses it.
     *
     * @param workspace a direct buffer whose start is 256-byte aligned ({@code ByteBuffer.allocateDirect(n + 255)}
     *     then {@code alignedSlice(256)}), or null
     */
    public void setWorkspace(ByteBuffer workspace) {
        synchronized (nativeContext()) {
            if (workspace == null) {
                dstransformer_native.dst_context_set_workspace(nc.handle, 0L, 0L);
            } else {
                if (nc.backend != Backend.CPU) {
                    throw new DstException(Status.INVALID_ARGUMENT,
                            "setWorkspace: a buffer in host memory is only usable by a CPU context");
                }
                HostData host = HostData.ofBytes(workspace);
                dstransformer_native.dst_context_set_workspace(nc.handle, host.address, host.bytes);
            }
            nc.workspaceKeepAlive = workspace;
        }
    }

    /** The CUDA stream ({@code cudaStream_t}) the context runs on, as an address; 0 for a CPU context. */
    public long stream() {
        long[] stream = new long[1];
        synchronized (nativeContext()) {
            dstransformer_native.dst_context_get_stream(nc.handle, stream);
        }
        return stream[0];
    }

    /**
     * Sets the CUDA stream the context runs on ({@code dst_context_set_stream}); 0 restores its own.
     * The caller keeps the stream alive while the context uses it. A CPU context accepts only 0.
     */
    public void setStream(long stream) {
        synchronized (nativeContext()) {
            dstransformer_native.dst_context_set_stream(nc.handle, stream);
        }
    }

    /** Releases this object's reference to the native context; idempotent. */
    @Override
    public void close() {
        closed = true;
        cleanable.clean();
    }

    @Override
    public String toString() {
        return "Context[" + nc.backend + ", device " + device + (closed ? ", closed]" : "]");
    }
}
