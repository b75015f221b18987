package org.dstransformer;

import org.dstransformer.internal.dst_copy_kind;

/**
 * Host data made visible to a context for one call: the host memory itself on the CPU backend, a
 * temporary copy in the context's memory elsewhere. Used with the context's monitor held.
 */
final class Staged implements AutoCloseable {
    /** The address to give the library. */
    final long address;
    private final NativeContext nc;
    private final HostData host;
    private final long device;

    Staged(NativeContext nc, HostData host, boolean copyIn) {
        this.nc = nc;
        this.host = host;
        if (nc.backend == Backend.CPU) {
            this.device = 0;
            this.address = host.address;
        } else {
            long mem = nc.malloc(host.bytes);
            try {
                if (copyIn) {
                    nc.copy(mem, host.address, host.bytes, dst_copy_kind.DST_COPY_HOST_TO_CONTEXT);
                }
            } catch (RuntimeException e) {
                nc.free(mem);
                throw e;
            }
            this.device = mem;
            this.address = mem;
        }
    }

    /** Copies the device copy back to host memory (nothing to do on the CPU backend). */
    void copyOut() {
        if (device != 0) {
            nc.copy(host.address, device, host.bytes, dst_copy_kind.DST_COPY_CONTEXT_TO_HOST);
        }
    }

    @Override
    public void close() {
        if (device != 0) {
            nc.free(device);
        }
    }
}
