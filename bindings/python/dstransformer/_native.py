"""The raw SWIG module (``dstransformer_native``): a complete, unidiomatic wrapping of the C API.

Every ``dst_*`` function, struct and enum of ``dstransformer/dstransformer.h`` is here under its C name.
Data pointers are ints; a failed status raises the exception classes of :mod:`dstransformer`; scalar
out-parameters are returned. The :mod:`dstransformer` classes are built on it; use it directly only
for what they do not cover.
"""
try:
    from .dstransformer_native import *  # noqa: F401,F403  (every public name starts with dst/DST/new_/delete_)
    from . import dstransformer_native as module  # noqa: F401
except ImportError as e:  # pragma: no cover - depends on the installation
    raise ImportError(
        "dstransformer: the compiled module _dstransformer_native could not be loaded "
        f"({e}). Build it with CMake (-DDST_BUILD_PYTHON=ON) or `pip install bindings/python`, and make "
        "sure libdstransformer.so is found (rpath, LD_LIBRARY_PATH or DST_LIB_DIR at build time)."
    ) from e
