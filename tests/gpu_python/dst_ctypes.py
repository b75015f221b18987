"""Minimal ctypes access to libdstransformer's C API, for tests that must not depend on the SWIG binding.

Only what the Hugging Face interop test needs: contexts, layers, checkpoint loading, forward/backward
and parameter/gradient read-back. Tensors are passed as raw pointers (`data_ptr()` of a torch tensor or
`ctypes.data` of a numpy array); the struct layouts mirror dstransformer.h and are checked against the
`struct_size` the library's `*_default()` functions report.
"""
import ctypes
import os
from ctypes import POINTER, byref, c_char_p, c_float, c_int, c_int32, c_int64, c_size_t, c_uint64, c_void_p

DST_OK = 0
FP32, FP16, BF16, FP64, INT32 = 0, 1, 2, 3, 4
BACKEND_CPU, BACKEND_CUDA = 1, 2
LAYOUT_DEEPSPEED, LAYOUT_HF_BERT = 0, 1
MASK_NONE, MASK_ADDITIVE, MASK_KEY_LENGTHS = 0, 1, 2
GRAD_WRITE = 0
GELU_ERF = 0
PARAM_NAMES = ["attn_qkvw", "attn_qkvb", "attn_ow", "attn_ob", "attn_nw", "attn_nb",
               "inter_w", "inter_b", "output_w", "output_b", "norm_w", "norm_b"]


class Tensor(ctypes.Structure):
    _fields_ = [("data", c_void_p), ("dtype", c_int), ("ndim", c_int32), ("shape", c_int64 * 4)]


class Mask(ctypes.Structure):
    _fields_ = [("kind", c_int), ("tensor", Tensor)]


class LayerConfig(ctypes.Structure):
    _fields_ = [("struct_size", c_size_t), ("hidden_size", c_int32), ("heads", c_int32),
                ("intermediate_size", c_int32), ("attn_dropout_ratio", c_float),
                ("hidden_dropout_ratio", c_float), ("num_hidden_layers", c_int32),
                ("initializer_range", c_float), ("layer_norm_eps", c_float), ("seed", c_uint64),
                ("pre_layer_norm", c_int32), ("normalize_invertible", c_int32), ("gelu_checkpoint", c_int32),
                ("attn_dropout_checkpoint", c_int32), ("adjust_init_range", c_int32),
                ("stochastic_mode", c_int32), ("training", c_int32), ("dtype", c_int),
                ("max_batch_tokens", c_int64), ("max_seq_len", c_int32), ("gelu", c_int), ("causal", c_int32),
                ("allow_tf32", c_int32)]


class CheckpointOptions(ctypes.Structure):
    _fields_ = [("struct_size", c_size_t), ("layout", c_int), ("prefix", c_char_p), ("include_grads", c_int32),
                ("save_dtype", c_int32), ("restore_rng", c_int32), ("client_state", c_char_p),
                ("client_state_len", c_size_t)]


class ParamInfo(ctypes.Structure):
    _fields_ = [("name", c_char_p), ("ndim", c_int32), ("shape", c_int64 * 2), ("numel", c_int64),
                ("offset_bytes", c_size_t), ("size_bytes", c_size_t)]


class DstError(RuntimeError):
    pass


class Lib:
    """The loaded library with typed entry points; `check()` turns a status into an exception."""

    def __init__(self, path=None):
        path = path or os.environ.get("DST_LIB")
        if not path:
            raise FileNotFoundError("set DST_LIB to the path of libdstransformer.so")
        self.c = ctypes.CDLL(path)
        c = self.c
        sig = {
            "dst_version_string": (c_char_p, []),
            "dst_status_string": (c_char_p, [c_int]),
            "dst_last_error": (c_char_p, []),
            "dst_cuda_device_count": (c_int, [POINTER(c_int)]),
            "dst_context_create": (c_int, [c_int, c_int, POINTER(c_void_p)]),
            "dst_context_destroy": (None, [c_void_p]),
            "dst_context_synchronize": (c_int, [c_void_p]),
            "dst_layer_config_default": (c_int, [POINTER(LayerConfig)]),
            "dst_layer_create": (c_int, [c_void_p, POINTER(LayerConfig), POINTER(c_void_p)]),
            "dst_layer_destroy": (None, [c_void_p]),
            "dst_layer_param_info": (c_int, [c_void_p, c_int, POINTER(ParamInfo)]),
            "dst_layer_get_param": (c_int, [c_void_p, c_char_p, c_void_p, c_int, c_size_t]),
            "dst_layer_get_grad": (c_int, [c_void_p, c_char_p, c_void_p, c_int, c_size_t]),
            "dst_layer_forward": (c_int, [c_void_p, c_void_p, POINTER(Tensor), POINTER(Mask), POINTER(Tensor)]),
            "dst_layer_backward": (c_int, [c_void_p, c_void_p, POINTER(Tensor), POINTER(Tensor), c_int]),
            "dst_checkpoint_options_default": (c_int, [POINTER(CheckpointOptions)]),
            "dst_checkpoint_load": (c_int, [POINTER(c_void_p), c_int, c_char_p, POINTER(CheckpointOptions),
                                            c_char_p, c_size_t, POINTER(c_size_t)]),
            "dst_checkpoint_save": (c_int, [POINTER(c_void_p), c_int, c_char_p, POINTER(CheckpointOptions)]),
        }
        for name, (res, args) in sig.items():
            fn = getattr(c, name)
            fn.restype = res
            fn.argtypes = args
        cfg = LayerConfig()
        self.check(c.dst_layer_config_default(byref(cfg)), "dst_layer_config_default")
        assert cfg.struct_size == ctypes.sizeof(LayerConfig), "dst_layer_config layout mismatch"
        opt = CheckpointOptions()
        self.check(c.dst_checkpoint_options_default(byref(opt)), "dst_checkpoint_options_default")
        assert opt.struct_size == ctypes.sizeof(CheckpointOptions), "dst_checkpoint_options layout mismatch"

    def check(self, status, what):
        if status != DST_OK:
            raise DstError("%s: %s: %s" % (what, self.c.dst_status_string(status).decode(),
                                           self.c.dst_last_error().decode(errors="replace")))

    def cuda_devices(self):
        n = c_int(0)
        self.check(self.c.dst_cuda_device_count(byref(n)), "dst_cuda_device_count")
        return n.value

    def context(self, backend):
        ctx = c_void_p()
        self.check(self.c.dst_context_create(backend, 0, byref(ctx)), "dst_context_create")
        return ctx

    def config(self, **fields):
        cfg = LayerConfig()
        self.check(self.c.dst_layer_config_default(byref(cfg)), "dst_layer_config_default")
        for k, v in fields.items():
            setattr(cfg, k, v)
        return cfg

    def layer(self, ctx, cfg):
        layer = c_void_p()
        self.check(self.c.dst_layer_create(ctx, byref(cfg), byref(layer)), "dst_layer_create")
        return layer

    def load(self, layers, path, layout=LAYOUT_HF_BERT, prefix=None):
        opt = CheckpointOptions()
        self.check(self.c.dst_checkpoint_options_default(byref(opt)), "dst_checkpoint_options_default")
        opt.layout = layout
        opt.prefix = prefix.encode() if prefix is not None else None
        arr = (c_void_p * len(layers))(*[l.value for l in layers])
        self.check(self.c.dst_checkpoint_load(arr, len(layers), str(path).encode(), byref(opt), None, 0, None),
                   "dst_checkpoint_load")

    def forward(self, layer, x, mask, y):
        self.check(self.c.dst_layer_forward(layer, None, byref(x), byref(mask) if mask is not None else None,
                                            byref(y)), "dst_layer_forward")

    def backward(self, layer, dy, dx):
        self.check(self.c.dst_layer_backward(layer, None, byref(dy), byref(dx), GRAD_WRITE), "dst_layer_backward")

    def param_numel(self, layer, p):
        info = ParamInfo()
        self.check(self.c.dst_layer_param_info(layer, p, byref(info)), "dst_layer_param_info")
        return info.numel

    def get_grad(self, layer, name, ptr, dtype, count):
        self.check(self.c.dst_layer_get_grad(layer, name.encode(), ptr, dtype, count), "dst_layer_get_grad")

    def get_param(self, layer, name, ptr, dtype, count):
        self.check(self.c.dst_layer_get_param(layer, name.encode(), ptr, dtype, count), "dst_layer_get_param")


def tensor(ptr, dtype, shape):
    t = Tensor()
    t.data = ptr
    t.dtype = dtype
    t.ndim = len(shape)
    for i, s in enumerate(shape):
        t.shape[i] = s
    return t


def additive_mask(ptr, dtype, shape):
    m = Mask()
    m.kind = MASK_ADDITIVE
    m.tensor = tensor(ptr, dtype, shape)
    return m
