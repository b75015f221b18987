"""A minimal ctypes view of libdstransformer's C API, for benchmarks and checks that must not depend on the
SWIG binding (bench/compare_torch.py, tests/gpu_python/test_hf_interop.py); it is not the Python binding
(bindings/python is).

The struct layouts and enum values below the imports are generated from the header by
bindings/gen_fields.py (a ctest entry fails when they are stale), and the sizes of the two configuration
structs are checked against the ``struct_size`` the library's ``*_default()`` functions report when a
:class:`Lib` is made. Tensors are passed as raw addresses (``data_ptr()`` of a torch tensor, ``ctypes.data``
of a NumPy array). Import it with this folder on ``sys.path``.
"""
import ctypes
import os
from ctypes import POINTER, byref, c_char_p, c_int, c_size_t, c_void_p

# BEGIN GENERATED structs (bindings/gen_fields.py from dstransformer.h; do not edit)
# Enum values of the header (DST_ prefix dropped).
# dst_status
OK = 0
ERR_INVALID_ARGUMENT = 1
ERR_UNSUPPORTED = 2
ERR_CAPACITY = 3
ERR_OUT_OF_MEMORY = 4
ERR_STATE = 5
ERR_BACKEND = 6
ERR_IO = 7
ERR_FORMAT = 8
ERR_INTERNAL = 99
# dst_dtype
DTYPE_FP32 = 0
DTYPE_FP16 = 1
DTYPE_BF16 = 2
DTYPE_FP64 = 3
DTYPE_INT32 = 4
# dst_backend
BACKEND_AUTO = 0
BACKEND_CPU = 1
BACKEND_CUDA = 2
# dst_copy_kind
COPY_HOST_TO_CONTEXT = 0
COPY_CONTEXT_TO_HOST = 1
COPY_CONTEXT_TO_CONTEXT = 2
# dst_index_checks
INDEX_CHECKS_EAGER = 0
INDEX_CHECKS_DEFERRED = 1
# dst_gelu
GELU_ERF = 0
GELU_TANH = 1
# dst_param
PARAM_ATTN_QKVW = 0
PARAM_ATTN_QKVB = 1
PARAM_ATTN_OW = 2
PARAM_ATTN_OB = 3
PARAM_ATTN_NW = 4
PARAM_ATTN_NB = 5
PARAM_INTER_W = 6
PARAM_INTER_B = 7
PARAM_OUTPUT_W = 8
PARAM_OUTPUT_B = 9
PARAM_NORM_W = 10
PARAM_NORM_B = 11
PARAM_COUNT = 12
# dst_mask_kind
MASK_NONE = 0
MASK_ADDITIVE = 1
MASK_KEY_LENGTHS = 2
# dst_grad_mode
GRAD_WRITE = 0
GRAD_ACCUMULATE = 1
# dst_activation
ACTIVATION_NONE = 0
ACTIVATION_GELU_ERF = 1
ACTIVATION_GELU_TANH = 2
ACTIVATION_TANH = 3
# dst_model_op
MODEL_OP_EMBEDDING_BACKWARD = 0
MODEL_OP_DENSE = 1
MODEL_OP_SCATTER_ROWS = 2
MODEL_OP_LINEAR_CROSS_ENTROPY = 3
# dst_weight_layout
LAYOUT_DEEPSPEED = 0
LAYOUT_HF_BERT = 1
# dst_optimizer_kind
OPTIMIZER_ADAM = 0
OPTIMIZER_ADAMW = 1
OPTIMIZER_LAMB = 2
# dst_optimizer_state
OPTIMIZER_STATE_EXP_AVG = 0
OPTIMIZER_STATE_EXP_AVG_SQ = 1
OPTIMIZER_STATE_MASTER = 2
MAX_DIMS = 4


class Tensor(ctypes.Structure):
    """``dst_tensor``."""

    _fields_ = [
        ('data', ctypes.c_void_p),
        ('dtype', ctypes.c_int),
        ('ndim', ctypes.c_int32),
        ('shape', ctypes.c_int64 * MAX_DIMS),
    ]


class Mask(ctypes.Structure):
    """``dst_mask``."""

    _fields_ = [
        ('kind', ctypes.c_int),
        ('tensor', Tensor),
    ]


class ParamInfo(ctypes.Structure):
    """``dst_param_info``."""

    _fields_ = [
        ('name', ctypes.c_char_p),
        ('ndim', ctypes.c_int32),
        ('shape', ctypes.c_int64 * 2),
        ('numel', ctypes.c_int64),
        ('offset_bytes', ctypes.c_size_t),
        ('size_bytes', ctypes.c_size_t),
    ]


class LayerConfig(ctypes.Structure):
    """``dst_layer_config``."""

    _fields_ = [
        ('struct_size', ctypes.c_size_t),
        ('hidden_size', ctypes.c_int32),
        ('heads', ctypes.c_int32),
        ('intermediate_size', ctypes.c_int32),
        ('attn_dropout_ratio', ctypes.c_float),
        ('hidden_dropout_ratio', ctypes.c_float),
        ('num_hidden_layers', ctypes.c_int32),
        ('initializer_range', ctypes.c_float),
        ('layer_norm_eps', ctypes.c_float),
        ('seed', ctypes.c_uint64),
        ('pre_layer_norm', ctypes.c_int32),
        ('normalize_invertible', ctypes.c_int32),
        ('gelu_checkpoint', ctypes.c_int32),
        ('attn_dropout_checkpoint', ctypes.c_int32),
        ('adjust_init_range', ctypes.c_int32),
        ('stochastic_mode', ctypes.c_int32),
        ('training', ctypes.c_int32),
        ('dtype', ctypes.c_int),
        ('max_batch_tokens', ctypes.c_int64),
        ('max_seq_len', ctypes.c_int32),
        ('gelu', ctypes.c_int),
        ('causal', ctypes.c_int32),
        ('allow_tf32', ctypes.c_int32),
    ]


class CheckpointOptions(ctypes.Structure):
    """``dst_checkpoint_options``."""

    _fields_ = [
        ('struct_size', ctypes.c_size_t),
        ('layout', ctypes.c_int),
        ('prefix', ctypes.c_char_p),
        ('include_grads', ctypes.c_int32),
        ('save_dtype', ctypes.c_int32),
        ('restore_rng', ctypes.c_int32),
        ('client_state', ctypes.c_char_p),
        ('client_state_len', ctypes.c_size_t),
    ]
# END GENERATED structs

DST_OK = OK
#: dtype names -> dst_dtype values.
DTYPE = {"fp32": DTYPE_FP32, "fp16": DTYPE_FP16, "bf16": DTYPE_BF16, "fp64": DTYPE_FP64, "int32": DTYPE_INT32}
PARAM_NAMES = ["attn_qkvw", "attn_qkvb", "attn_ow", "attn_ob", "attn_nw", "attn_nb",
               "inter_w", "inter_b", "output_w", "output_b", "norm_w", "norm_b"]


class DstError(RuntimeError):
    pass


_SIGNATURES = {
    "dst_version_string": (c_char_p, []),
    "dst_status_string": (c_char_p, [c_int]),
    "dst_last_error": (c_char_p, []),
    "dst_cuda_device_count": (c_int, [POINTER(c_int)]),
    "dst_context_create": (c_int, [c_int, c_int, POINTER(c_void_p)]),
    "dst_context_destroy": (None, [c_void_p]),
    "dst_context_set_stream": (c_int, [c_void_p, c_void_p]),
    "dst_context_synchronize": (c_int, [c_void_p]),
    "dst_context_set_rng_state": (c_int, [c_void_p, ctypes.c_uint64, ctypes.c_uint64]),
    "dst_layer_config_default": (c_int, [POINTER(LayerConfig)]),
    "dst_layer_config_saved_bytes": (c_int, [POINTER(LayerConfig), ctypes.c_int64, ctypes.c_int64,
                                             POINTER(c_size_t)]),
    "dst_layer_config_workspace_bytes": (c_int, [POINTER(LayerConfig), ctypes.c_int64, ctypes.c_int64,
                                                 POINTER(c_size_t)]),
    "dst_layer_create": (c_int, [c_void_p, POINTER(LayerConfig), POINTER(c_void_p)]),
    "dst_layer_destroy": (None, [c_void_p]),
    "dst_layer_set_training": (c_int, [c_void_p, c_int]),
    "dst_layer_param_info": (c_int, [c_void_p, c_int, POINTER(ParamInfo)]),
    "dst_layer_set_param": (c_int, [c_void_p, c_char_p, c_void_p, c_int, c_size_t]),
    "dst_layer_get_param": (c_int, [c_void_p, c_char_p, c_void_p, c_int, c_size_t]),
    "dst_layer_get_grad": (c_int, [c_void_p, c_char_p, c_void_p, c_int, c_size_t]),
    "dst_layer_forward": (c_int, [c_void_p, c_void_p, POINTER(Tensor), POINTER(Mask), POINTER(Tensor)]),
    "dst_layer_backward": (c_int, [c_void_p, c_void_p, POINTER(Tensor), POINTER(Tensor), c_int]),
    "dst_layer_forward_packed": (c_int, [c_void_p, c_void_p, POINTER(Tensor), POINTER(Tensor), ctypes.c_int64,
                                         POINTER(Tensor)]),
    "dst_layer_backward_packed": (c_int, [c_void_p, c_void_p, POINTER(Tensor), POINTER(Tensor), c_int]),
    "dst_saved_create": (c_int, [c_void_p, POINTER(c_void_p)]),
    "dst_saved_destroy": (None, [c_void_p]),
    "dst_checkpoint_options_default": (c_int, [POINTER(CheckpointOptions)]),
    "dst_checkpoint_load": (c_int, [POINTER(c_void_p), c_int, c_char_p, POINTER(CheckpointOptions), c_char_p,
                                    c_size_t, POINTER(c_size_t)]),
    "dst_checkpoint_save": (c_int, [POINTER(c_void_p), c_int, c_char_p, POINTER(CheckpointOptions)]),
}


class Lib:
    """The loaded library (``DST_LIB``, else ``libdstransformer.so`` on the loader's path) with typed entry
    points in ``.lib``; :meth:`check` turns a status into a :class:`DstError`."""

    def __init__(self, path=None):
        path = path or os.environ.get("DST_LIB", "libdstransformer.so")
        self.lib = L = ctypes.CDLL(path)
        for name, (res, args) in _SIGNATURES.items():
            fn = getattr(L, name)
            fn.restype = res
            fn.argtypes = args
        cfg = LayerConfig()
        self.check(L.dst_layer_config_default(byref(cfg)), "dst_layer_config_default")
        opt = CheckpointOptions()
        self.check(L.dst_checkpoint_options_default(byref(opt)), "dst_checkpoint_options_default")
        for what, got, want in (("dst_layer_config", cfg.struct_size, ctypes.sizeof(LayerConfig)),
                                ("dst_checkpoint_options", opt.struct_size, ctypes.sizeof(CheckpointOptions))):
            if got != want:
                raise DstError(f"{what} is {got} bytes in the library, {want} here: run bindings/gen_fields.py")

    def check(self, status, what=None):
        if status != DST_OK:
            name = self.lib.dst_status_string(status).decode()
            msg = self.lib.dst_last_error().decode(errors="replace")
            raise DstError(f"{what + ': ' if what else ''}{name}: {msg}")

    def version(self):
        return self.lib.dst_version_string().decode()

    def cuda_devices(self):
        n = c_int(0)
        self.check(self.lib.dst_cuda_device_count(byref(n)), "dst_cuda_device_count")
        return n.value

    def config(self, **fields):
        """A ``dst_layer_config`` with the library's defaults and the given fields (``dtype`` may be a name)."""
        cfg = LayerConfig()
        self.check(self.lib.dst_layer_config_default(byref(cfg)), "dst_layer_config_default")
        for k, v in fields.items():
            if k == "dtype" and isinstance(v, str):
                v = DTYPE[v]
            setattr(cfg, k, v)
        return cfg

    def saved_bytes(self, cfg, B, S):
        n = c_size_t()
        self.check(self.lib.dst_layer_config_saved_bytes(byref(cfg), B, S, byref(n)), "dst_layer_config_saved_bytes")
        return n.value

    def workspace_bytes(self, cfg, B, S):
        n = c_size_t()
        self.check(self.lib.dst_layer_config_workspace_bytes(byref(cfg), B, S, byref(n)),
                   "dst_layer_config_workspace_bytes")
        return n.value

    def context(self, backend):
        h = c_void_p()
        self.check(self.lib.dst_context_create(backend, 0, byref(h)), "dst_context_create")
        return h

    def layer(self, ctx, cfg):
        h = c_void_p()
        self.check(self.lib.dst_layer_create(ctx, byref(cfg), byref(h)), "dst_layer_create")
        return h

    def saved(self, layer):
        """A new, empty dst_saved for `layer`; destroy it with lib.dst_saved_destroy before the layer."""
        h = c_void_p()
        self.check(self.lib.dst_saved_create(layer, byref(h)), "dst_saved_create")
        return h

    def load(self, layers, path, layout=LAYOUT_HF_BERT, prefix=None):
        opt = CheckpointOptions()
        self.check(self.lib.dst_checkpoint_options_default(byref(opt)), "dst_checkpoint_options_default")
        opt.layout = layout
        opt.prefix = prefix.encode() if prefix is not None else None
        arr = (c_void_p * len(layers))(*[h.value for h in layers])
        self.check(self.lib.dst_checkpoint_load(arr, len(layers), str(path).encode(), byref(opt), None, 0, None),
                   "dst_checkpoint_load")

    def forward(self, layer, x, mask, y, saved=None):
        self.check(self.lib.dst_layer_forward(layer, saved, byref(x), byref(mask) if mask is not None else None,
                                              byref(y)), "dst_layer_forward")

    def backward(self, layer, dy, dx, saved=None, mode=GRAD_WRITE):
        self.check(self.lib.dst_layer_backward(layer, saved, byref(dy), byref(dx), mode), "dst_layer_backward")

    def param_numel(self, layer, p):
        info = ParamInfo()
        self.check(self.lib.dst_layer_param_info(layer, p, byref(info)), "dst_layer_param_info")
        return info.numel

    def get_grad(self, layer, name, ptr, dtype, count):
        self.check(self.lib.dst_layer_get_grad(layer, name.encode(), ptr, dtype, count), "dst_layer_get_grad")

    def get_param(self, layer, name, ptr, dtype, count):
        self.check(self.lib.dst_layer_get_param(layer, name.encode(), ptr, dtype, count), "dst_layer_get_param")


def tensor(ptr, dtype, shape):
    """A ``dst_tensor`` view; ``dtype`` is a name ("fp32", ...) or a dst_dtype value."""
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


def additive_mask(ptr, dtype, shape):
    return mask(MASK_ADDITIVE, ptr, dtype, shape)
