package org.dstransformer;

/**
 * A call of libdstransformer failed: the {@link Status} and the library's message, which names the
 * function, the argument and what was expected ({@code dst_last_error}).
 *
 * <p>Every status other than {@code DST_OK} is thrown as this exception, by the raw layer
 * ({@code org.dstransformer.internal}) as well as by the classes of this package. Checks this binding
 * makes before calling the library (an array of the wrong length) throw it too, with
 * {@link Status#INVALID_ARGUMENT}.
 */
public class DstException extends RuntimeException {
    private static final long serialVersionUID = 1L;

    private final int code;
    private final String libraryMessage;

    /**
     * Creates the exception of a status code and a message (the raw layer calls this from JNI).
     *
     * @param code the {@code dst_status} value
     * @param message the library's message
     */
    public DstException(int code, String message) {
        super(Status.nameOf(code) + (message == null || message.isEmpty() ? "" : ": " + message));
        this.code = code;
        this.libraryMessage = message == null ? "" : message;
    }

    /**
     * Creates the exception of a status and a message.
     *
     * @param status the status; not {@link Status#UNKNOWN}
     * @param message the message
     */
    public DstException(Status status, String message) {
        this(status.code(), message);
    }

    /** The status of the failure. */
    public Status status() {
        return Status.fromCode(code);
    }

    /** The numeric status code (also for codes {@link Status} does not know). */
    public int statusCode() {
        return code;
    }

    /** The library's message without the status name ({@link #getMessage()} has both). */
    public String message() {
        return libraryMessage;
    }
}
