"""API surface: every C function, enum and struct is in the raw module; the package's public names."""

import os
import re

import pytest

import dstransformer as dst
from dstransformer import _native

HEADER = os.path.join(os.path.dirname(__file__), "..", "..", "..", "capi", "include", "dstransformer",
                      "dstransformer.h")


def header_text():
    if not os.path.exists(HEADER):
        pytest.skip("public header not found next to the tests")
    with open(HEADER) as f:
        return f.read()


def test_every_function_of_the_header_is_bound():
    names = re.findall(r"DST_API\s+[^;(]*?\b(dst_\w+)\s*\(", header_text())
    assert len(names) >= 50
    missing = [n for n in names if not callable(getattr(_native, n, None))]
    assert not missing, f"not in the SWIG module: {missing}"


def test_every_enum_constant_and_struct_is_bound():
    text = header_text()
    consts = set(re.findall(r"^\s+(DST_[A-Z0-9_]+)\s*=", text, re.M))
    assert {"DST_OK", "DST_ERR_INTERNAL", "DST_DTYPE_INT32", "DST_MASK_KEY_LENGTHS"} <= consts
    missing = [c for c in consts if not hasattr(_native, c)]
    assert not missing
    for struct in re.findall(r"typedef struct (dst_\w+) \{", text):
        assert hasattr(_native, struct), struct
    assert _native.DST_VERSION_NUMBER == dst.HEADER_VERSION


def test_version_and_strings():
    assert dst.version() == dst.__version__
    major, minor, patch = (int(p) for p in dst.version().split("."))
    assert dst.version_number() == major * 10000 + minor * 100 + patch == dst.HEADER_VERSION
    assert dst.status_string(3) == "DST_ERR_CAPACITY"
    assert dst.status_string(12345) == "DST_ERR_UNKNOWN"
    assert [dst.dtype_size(d) for d in ("fp32", "fp16", "bf16", "fp64")] == [4, 2, 2, 8]
    assert _native.dst_dtype_string(_native.DST_DTYPE_BF16) == "bf16"
    assert dst.cuda_device_count() >= 0


def test_public_names():
    for name in ("Context", "Layer", "LayerConfig", "SavedActivations", "Mask", "DstError", "InvalidArgumentError",
                 "UnsupportedError", "CapacityError", "OutOfMemoryError", "StateError", "BackendError",
                 "DstIOError", "FormatError", "InternalError", "save_checkpoint", "load_checkpoint", "convert",
                 "PARAM_NAMES", "aligned_empty", "DeviceArray"):
        assert name in dst.__all__ and hasattr(dst, name), name
    assert len(dst.PARAM_NAMES) == 12


def test_exception_hierarchy():
    assert issubclass(dst.InvalidArgumentError, dst.DstError) and issubclass(dst.InvalidArgumentError, ValueError)
    assert issubclass(dst.OutOfMemoryError, MemoryError)
    assert issubclass(dst.StateError, RuntimeError)
    assert issubclass(dst.DstIOError, OSError)
    for cls in (dst.UnsupportedError, dst.CapacityError, dst.BackendError, dst.FormatError, dst.InternalError):
        assert issubclass(cls, dst.DstError)
    e = dst.DstIOError(7, "dst_checkpoint_load: cannot open x")
    assert e.status == 7 and e.message.endswith("cannot open x") and "DST_ERR_IO" in str(e)


def test_raw_module_outputs_and_pointers():
    ctx = _native.dst_context_create(_native.DST_BACKEND_CPU, 0)
    try:
        assert _native.dst_context_get_backend(ctx) == _native.DST_BACKEND_CPU
        _native.dst_context_set_rng_state(ctx, 2**64 - 1, 7)
        assert list(_native.dst_context_get_rng_state(ctx)) == [2**64 - 1, 7]
        ptr = _native.dst_malloc(ctx, 1024)
        assert isinstance(ptr, int) and ptr % 256 == 0
        _native.dst_free(ctx, ptr)
        assert _native.dst_context_get_stream(ctx) == 0
        t = _native.dst_tensor(0x1000, _native.DST_DTYPE_FP16, 3, 2, 5, 8)
        assert (t.data, t.ndim, t.getDim(0), t.getDim(1), t.getDim(2), t.getDim(4)) == (0x1000, 3, 2, 5, 8, -1)
        with pytest.raises(TypeError):
            _native.dst_tensor("not an address", _native.DST_DTYPE_FP16, 1, 1)
    finally:
        _native.dst_context_destroy(ctx)
    _native.dst_context_destroy(None)  # NULL is accepted


def test_raw_error_carries_library_message():
    with pytest.raises(dst.InvalidArgumentError) as ei:
        _native.dst_context_create(77, 0)
    assert ei.value.status == _native.DST_ERR_INVALID_ARGUMENT
    assert "dst_context_create" in ei.value.message and "backend" in ei.value.message
    assert dst.last_error() == ei.value.message


def test_dlpack_host_producer_with_a_stream():
    """A host DLPack producer is read without the stream it would refuse (NumPy raises on one)."""
    np = pytest.importorskip("numpy")
    from dstransformer import _arrays

    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    if not hasattr(a, "__dlpack__"):
        pytest.skip("this NumPy has no DLPack")
    info = _arrays._from_dlpack(a, "x", 7)
    assert info.device == "cpu" and info.shape == (2, 3) and info.ptr == a.ctypes.data
    with pytest.raises(TypeError, match="host"):
        _arrays.describe(a, "x", on_device=True, stream=7)
