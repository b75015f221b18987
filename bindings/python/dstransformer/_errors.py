"""Exceptions: one class per family of ``dst_status``, carrying ``dst_last_error()``'s text."""

from __future__ import annotations

__all__ = [
    "DstError",
    "InvalidArgumentError",
    "UnsupportedError",
    "CapacityError",
    "OutOfMemoryError",
    "StateError",
    "BackendError",
    "DstIOError",
    "FormatError",
    "InternalError",
    "STATUS_NAMES",
]

#: Numeric values of ``dst_status`` (fixed by the C API) and their names.
STATUS_NAMES = {
    0: "DST_OK",
    1: "DST_ERR_INVALID_ARGUMENT",
    2: "DST_ERR_UNSUPPORTED",
    3: "DST_ERR_CAPACITY",
    4: "DST_ERR_OUT_OF_MEMORY",
    5: "DST_ERR_STATE",
    6: "DST_ERR_BACKEND",
    7: "DST_ERR_IO",
    8: "DST_ERR_FORMAT",
    99: "DST_ERR_INTERNAL",
}


class DstError(Exception):
    """A libdstransformer call failed.

    Attributes:
        status: the ``dst_status`` value (int), e.g. 3 for ``DST_ERR_CAPACITY``.
        message: the library's message (``dst_last_error()``), naming the function and the argument.
    """

    def __init__(self, status: int, message: str = ""):
        self.status = int(status)
        self.message = str(message)
        # OSError takes its arguments specially; keep args to the message for every class.
        Exception.__init__(self, self.message)

    @property
    def status_name(self) -> str:
        """The status as its C name, e.g. ``"DST_ERR_CAPACITY"``."""
        return STATUS_NAMES.get(self.status, "DST_ERR_UNKNOWN")

    def __str__(self) -> str:
        return f"{self.status_name}: {self.message}" if self.message else self.status_name

    def __reduce__(self):
        return (type(self), (self.status, self.message))


class InvalidArgumentError(DstError, ValueError):
    """``DST_ERR_INVALID_ARGUMENT``: an argument is missing, out of range, or of the wrong dtype/shape."""


class UnsupportedError(DstError):
    """``DST_ERR_UNSUPPORTED``: valid request that this build or backend cannot serve."""


class CapacityError(DstError):
    """``DST_ERR_CAPACITY``: B·S or S exceeds the maxima the layer was created with."""


class OutOfMemoryError(DstError, MemoryError):
    """``DST_ERR_OUT_OF_MEMORY``: a host or device allocation failed."""


class StateError(DstError, RuntimeError):
    """``DST_ERR_STATE``: call out of order, e.g. backward without a training forward."""


class BackendError(DstError):
    """``DST_ERR_BACKEND``: BLAS, CUDA or cuBLAS reported an error."""


class DstIOError(DstError, OSError):
    """``DST_ERR_IO``: a file could not be read or written."""

    def __init__(self, status: int, message: str = ""):
        DstError.__init__(self, status, message)


class FormatError(DstError):
    """``DST_ERR_FORMAT``: a file or buffer is malformed or does not match the target."""


class InternalError(DstError):
    """``DST_ERR_INTERNAL``: a bug in the library; please report it with the message."""


ERROR_CLASSES = {
    1: InvalidArgumentError,
    2: UnsupportedError,
    3: CapacityError,
    4: OutOfMemoryError,
    5: StateError,
    6: BackendError,
    7: DstIOError,
    8: FormatError,
    99: InternalError,
}
