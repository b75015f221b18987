package org.dstransformer;

import org.dstransformer.internal.dstransformer_native;
import org.dstransformer.internal.dstransformer_nativeConstants;

/** Library-wide queries: versions and the CUDA device count. */
public final class Library {
    /** Version of the header this binding was generated from: major·10000 + minor·100 + patch. */
    public static final int HEADER_VERSION = dstransformer_nativeConstants.DST_VERSION_NUMBER;

    private Library() {
    }

    /** Version of the library loaded at run time ({@code dst_version}); compare with {@link #HEADER_VERSION}. */
    public static int version() {
        return dstransformer_native.dst_version();
    }

    /** Version of the library loaded at run time as "major.minor.patch" ({@code dst_version_string}). */
    public static String versionString() {
        return dstransformer_native.dst_version_string();
    }

    /** Number of CUDA devices usable by this build; 0 without a CUDA backend or GPU ({@code dst_cuda_device_count}). */
    public static int cudaDeviceCount() {
        int[] count = new int[1];
        dstransformer_native.dst_cuda_device_count(count);
        return count[0];
    }
}
