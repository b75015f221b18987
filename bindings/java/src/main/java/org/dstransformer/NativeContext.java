package org.dstransformer;

import java.lang.ref.Cleaner;

import org.dstransformer.internal.SWIGTYPE_p_dst_context;
import org.dstransformer.internal.dst_copy_kind;
import org.dstransformer.internal.dstransformer_native;

/**
 * The C context shared by a {@link Context} and its layers: the handle, a reference count (the
 * {@code Context} object holds one, each open layer one; the handle is destroyed when the last goes),
 * and the monitor that serialises every native call on the context, its layers and their saved
 * activations (the C API allows one thread at a time).
 */
final class NativeContext {
    /** Runs the safety-net clean-ups of objects that were not closed. */
    static final Cleaner CLEANER = Cleaner.create();

    final SWIGTYPE_p_dst_context handle;
    final Backend backend;
    private int refs = 1;
    /** Caller memory the context uses (a bound workspace), kept reachable while the context lives. */
    Object workspaceKeepAlive;

    NativeContext(SWIGTYPE_p_dst_context handle, Backend backend) {
        this.handle = handle;
        this.backend = backend;
    }

    synchronized boolean alive() {
        return refs > 0;
    }

    synchronized void retain() {
        if (refs <= 0) {
            throw new IllegalStateException("the context is closed");
        }
        refs++;
    }

    synchronized void release() {
        if (refs > 0 && --refs == 0) {
            dstransformer_native.dst_context_destroy(handle);
            workspaceKeepAlive = null;
        }
    }

    // The helpers below are called with this object's monitor held.

    long malloc(long bytes) {
        long[] ptr = new long[1];
        dstransformer_native.dst_malloc(handle, bytes, ptr);
        return ptr[0];
    }

    void free(long ptr) {
        dstransformer_native.dst_free(handle, ptr);
    }

    void copy(long dst, long src, long bytes, dst_copy_kind kind) {
        if (bytes > 0) {
            dstransformer_native.dst_memcpy(handle, dst, src, bytes, kind);
        }
    }
}
