"""ctest ctypes_mirror: the ctypes view (dst_ctypes.py) against the library of this build (DST_LIB): the struct
sizes agree, and a small CPU layer runs forward and backward through it. Standard library only."""
import array
import ctypes
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import dst_ctypes as dc  # noqa: E402


def main():
    lib = dc.Lib()  # checks the sizes of dst_layer_config and dst_checkpoint_options
    L = lib.lib
    B, S, H = 2, 5, 16
    cfg = lib.config(hidden_size=H, heads=4, intermediate_size=24, max_batch_tokens=B * S, max_seq_len=S,
                     attn_dropout_ratio=0.0, hidden_dropout_ratio=0.0, dtype="fp32")
    ctx = lib.context(dc.BACKEND_CPU)
    layer = lib.layer(ctx, cfg)
    n = B * S * H
    x = (ctypes.c_float * n)(*[((i * 7) % 13 - 6) / 10.0 for i in range(n)])
    y, dx = (ctypes.c_float * n)(), (ctypes.c_float * n)()
    lengths = (ctypes.c_int32 * B)(S, 3)
    shape = (B, S, H)
    lib.forward(layer, dc.tensor(ctypes.addressof(x), "fp32", shape),
                dc.mask(dc.MASK_KEY_LENGTHS, ctypes.addressof(lengths), "int32", (B,)),
                dc.tensor(ctypes.addressof(y), "fp32", shape))
    lib.backward(layer, dc.tensor(ctypes.addressof(y), "fp32", shape), dc.tensor(ctypes.addressof(dx), "fp32", shape))
    numel = lib.param_numel(layer, dc.PARAM_ATTN_QKVW)
    g = array.array("d", bytes(8 * numel))
    lib.get_grad(layer, "attn_qkvw", g.buffer_info()[0], dc.DTYPE_FP64, numel)
    assert numel == 3 * H * H and any(v != 0.0 for v in g), "no gradient"
    assert all(v == v for v in y) and any(v != 0.0 for v in dx), "bad forward/backward"
    try:
        lib.check(L.dst_context_create(99, 0, ctypes.byref(ctypes.c_void_p())), "dst_context_create")
        raise AssertionError("an unknown backend was accepted")
    except dc.DstError as e:
        assert "DST_ERR_INVALID_ARGUMENT" in str(e), e
    L.dst_layer_destroy(layer)
    L.dst_context_destroy(ctx)
    print(f"ctypes mirror ok: libdstransformer {lib.version()}, dst_layer_config {ctypes.sizeof(dc.LayerConfig)} "
          f"bytes, forward/backward of a [{B}, {S}, {H}] batch")


if __name__ == "__main__":
    main()
