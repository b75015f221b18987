"""Minimal ctypes view of the libdstransformer C API for benchmarks and GPU-machine checks.

It mirrors the structs of <dstransformer/dstransformer.h> and checks their sizes against the
library at load time; it is not the Python binding (bindings/python is).
"""
import ctypes
import os

DST_OK = 0
DTYPE = {"fp32": 0, "fp16": 1, "bf16": 2, "fp64": 3, "int32": 4}
BACKEND_CPU, BACKEND_CUDA = 1, 2
MASK_NONE, MASK_ADDITIVE, MASK_KEY_LENGTHS = 0, 1, 2


class LayerConfig(ctypes.Structure):
    _fields_ = [
        ("struct_size", ctypes.c_size_t),
        ("hidden_size", ctypes.c_int32), ("heads", ctypes.c_int32), ("intermediate_size", ctypes.c_int32),
        ("attn_dropout_ratio", ctypes.c_float), ("hidden_dropout_ratio", ctypes.c_float),
        ("num_hidden_layers", ctypes.c_int32),
        ("initializer_range", ctypes.c_float), ("layer_norm_eps", ctypes.c_float),
        ("seed", ctypes.c_uint64),
        ("pre_layer_norm", ctypes.c_int32), ("normalize_invertible", ctypes.c_int32),
        ("gelu_checkpoint", ctypes.c_int32), ("attn_dropout_checkpoint", ctypes.c_int32),
        ("adjust_init_range", ctypes.c_int32), ("stochastic_mode", ctypes.c_int32), ("training", ctypes.c_int32),
        ("dtype", ctypes.c_int), ("max_batch_tokens", ctypes.c_int64), ("max_seq_len", ctypes.c_int32),
        ("gelu", ctypes.c_int), ("causal", ctypes.c_int32), ("allow_tf32", ctypes.c_int32),
    ]


class Tensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("dtype", ctypes.c_int), ("ndim", ctypes.c_int32),
                ("shape", ctypes.c_int64 * 4)]


class Mask(ctypes.Structure):
    _fields_ = [("kind", ctypes.c_int), ("tensor", Tensor)]


class DstError(RuntimeError):
    pass


class Lib:
    def __init__(self, path=None):
        path = path or os.environ.get("DST_LIB", "libdstransformer.so")
        self.lib = L = ctypes.CDLL(path)
        P = ctypes.c_void_p
        L.dst_last_error.restype = ctypes.c_char_p
        L.dst_version_string.restype = ctypes.c_char_p
        L.dst_context_create.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.POINTER(P)]
        L.dst_context_destroy.argtypes = [P]
        L.dst_context_destroy.restype = None
        L.dst_context_set_stream.argtypes = [P, P]
        L.dst_context_synchronize.argtypes = [P]
        L.dst_context_set_rng_state.argtypes = [P, ctypes.c_uint64, ctypes.c_uint64]
        L.dst_layer_config_default.argtypes = [ctypes.POINTER(LayerConfig)]
        L.dst_layer_config_saved_bytes.argtypes = [ctypes.POINTER(LayerConfig), ctypes.c_int64, ctypes.c_int64,
                                                   ctypes.POINTER(ctypes.c_size_t)]
        L.dst_layer_config_workspace_bytes.argtypes = L.dst_layer_config_saved_bytes.argtypes
        L.dst_layer_create.argtypes = [P, ctypes.POINTER(LayerConfig), ctypes.POINTER(P)]
        L.dst_layer_destroy.argtypes = [P]
        L.dst_layer_destroy.restype = None
        L.dst_layer_set_training.argtypes = [P, ctypes.c_int]
        L.dst_layer_set_param.argtypes = [P, ctypes.c_char_p, P, ctypes.c_int, ctypes.c_size_t]
        L.dst_layer_get_grad.argtypes = [P, ctypes.c_char_p, P, ctypes.c_int, ctypes.c_size_t]
        L.dst_layer_forward.argtypes = [P, P, ctypes.POINTER(Tensor), ctypes.POINTER(Mask), ctypes.POINTER(Tensor)]
        L.dst_layer_backward.argtypes = [P, P, ctypes.POINTER(Tensor), ctypes.POINTER(Tensor), ctypes.c_int]
        L.dst_saved_create.argtypes = [P, ctypes.POINTER(P)]
        L.dst_saved_destroy.argtypes = [P]
        L.dst_saved_destroy.restype = None
        L.dst_cuda_device_count.argtypes = [ctypes.POINTER(ctypes.c_int)]
        cfg = LayerConfig()
        self.check(L.dst_layer_config_default(ctypes.byref(cfg)))
        if cfg.struct_size != ctypes.sizeof(LayerConfig):
            raise DstError(f"dst_layer_config is {cfg.struct_size} bytes in the library, "
                           f"{ctypes.sizeof(LayerConfig)} here: dst_ctypes.py is out of date")

    def check(self, status):
        if status != DST_OK:
            raise DstError(f"status {status}: {self.lib.dst_last_error().decode()}")

    def version(self):
        return self.lib.dst_version_string().decode()

    def config(self, **fields):
        cfg = LayerConfig()
        self.check(self.lib.dst_layer_config_default(ctypes.byref(cfg)))
        for k, v in fields.items():
            if k == "dtype" and isinstance(v, str):
                v = DTYPE[v]
            setattr(cfg, k, v)
        return cfg

    def saved_bytes(self, cfg, B, S):
        n = ctypes.c_size_t()
        self.check(self.lib.dst_layer_config_saved_bytes(ctypes.byref(cfg), B, S, ctypes.byref(n)))
        return n.value

    def workspace_bytes(self, cfg, B, S):
        n = ctypes.c_size_t()
        self.check(self.lib.dst_layer_config_workspace_bytes(ctypes.byref(cfg), B, S, ctypes.byref(n)))
        return n.value

    def context(self, backend):
        h = ctypes.c_void_p()
        self.check(self.lib.dst_context_create(backend, 0, ctypes.byref(h)))
        return h

    def layer(self, ctx, cfg):
        h = ctypes.c_void_p()
        self.check(self.lib.dst_layer_create(ctx, ctypes.byref(cfg), ctypes.byref(h)))
        return h

    def saved(self, layer):
        """A new, empty dst_saved for `layer`; destroy it with lib.dst_saved_destroy before the layer."""
        h = ctypes.c_void_p()
        self.check(self.lib.dst_saved_create(layer, ctypes.byref(h)))
        return h


def tensor(ptr, dtype, shape):
    t = Tensor()
    t.data = ptr
    t.dtype = DTYPE[dtype] if isinstance(dtype, str) else dtype
    t.ndim = len(shape)
    for i, s in enumerate(shape):
        t.shape[i] = s
    return t


def mask(kind, ptr=None, dtype="fp32", shape=()):
    m = Mask()
    m.kind = kind
    if kind != MASK_NONE:
        m.tensor = tensor(ptr, dtype, shape)
    return m
