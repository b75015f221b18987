"""safetensors checkpoints through dst_checkpoint_save/load/convert/describe."""

import json
import struct

import numpy as np
import pytest

import dstransformer as dst
from conftest import randomize, small_config


def header_of(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        return json.loads(f.read(n))


def test_save_load_round_trip_with_client_state(ctx, rng, tmp_path):
    path = tmp_path / "stack.safetensors"
    layers = [dst.Layer(ctx, small_config()) for _ in range(3)]
    vals = [randomize(l, rng) for l in layers]
    ctx.rng_state = (77, 12)
    dst.save_checkpoint(layers, path, client_state='{"epoch": 3}')
    keys = set(header_of(path))
    assert "layer.2.attn_qkvw" in keys and "layer.0.norm_b" in keys
    targets = [dst.Layer(ctx, small_config()) for _ in range(3)]
    ctx.rng_state = (1, 1)
    state = dst.load_checkpoint(targets, path)
    assert state == '{"epoch": 3}'
    assert ctx.rng_state == (77, 12)  # restore_rng defaults to on
    for t, v in zip(targets, vals):
        for name in dst.PARAM_NAMES:
            assert np.array_equal(t.param(name, "fp64"), v[name]), name
    # one layer, prefix, converting dtype, no client state
    single = tmp_path / "one.safetensors"
    layers[1].save(single, prefix="bert.encoder.", save_dtype="fp32")
    assert "bert.encoder.layer.0.attn_ow" in header_of(single)
    t32 = dst.Layer(ctx, small_config(dtype="fp32"))
    assert t32.load(single, prefix="bert.encoder.", restore_rng=False) is None
    assert np.allclose(t32.param("attn_ow", "fp64"), vals[1]["attn_ow"], rtol=1e-6, atol=1e-7)


def test_binary_client_state_round_trips(ctx, rng, tmp_path):
    # Bytes that are not UTF-8, NULs included, once made the save fail with an internal JSON error.
    path = tmp_path / "bin.safetensors"
    layer = dst.Layer(ctx, small_config())
    state = b"\xff\xfe\x00step=\x80\x00"
    dst.save_checkpoint(layer, path, client_state=state)
    assert "client_state_base64" in header_of(path)["__metadata__"]
    assert dst.load_checkpoint(dst.Layer(ctx, small_config()), path) == state
    dst.save_checkpoint(layer, path, client_state="caf\u00e9")
    assert dst.load_checkpoint(dst.Layer(ctx, small_config()), path) == "caf\u00e9"
    with pytest.raises(TypeError):
        dst.save_checkpoint(layer, path, client_state=3)


def test_long_client_state_and_grads(ctx, rng, tmp_path):
    path = tmp_path / "g.safetensors"
    layer = dst.Layer(ctx, small_config())
    randomize(layer, rng)
    x = rng.standard_normal((2, 3, 16))
    layer.forward(x)
    layer.backward(x)
    long_state = "s" * 100_000  # longer than the first read buffer
    layer.save(path, include_grads=True, client_state=long_state)
    assert any(k.startswith("grad.layer.0.") for k in header_of(path))
    other = dst.Layer(ctx, small_config())
    assert other.load(path, include_grads=True) == long_state
    assert np.array_equal(other.grad("inter_w"), layer.grad("inter_w"))
    text = dst.describe_checkpoint(path)  # longer than its first buffer too
    assert "\n  client_state: " + long_state + "\n" in text
    assert 'layers: 1 (layout deepspeed, prefix "", 12 tensors)' in text
    assert 'layers: 1 gradient sets (layout deepspeed, prefix "", 12 tensors)' in text


def test_hf_layout_and_convert(ctx, rng, tmp_path):
    post = dst.Layer(ctx, small_config(pre_layer_norm=False))
    vals = randomize(post, rng)
    hf = tmp_path / "hf.safetensors"
    post.save(hf, layout="hf_bert", prefix="bert.encoder.")
    keys = set(header_of(hf))
    assert "bert.encoder.layer.0.attention.self.query.weight" in keys
    ds = tmp_path / "ds.safetensors"
    summary = dst.convert(hf, ds, in_layout="hf_bert", out_layout="deepspeed", out_prefix="")
    assert isinstance(summary, str) and summary
    assert "layer.0.attn_qkvw" in header_of(ds)
    back = dst.Layer(ctx, small_config(pre_layer_norm=False))
    back.load(ds)
    for name in dst.PARAM_NAMES:
        assert np.array_equal(back.param(name, "fp64"), vals[name]), name
    pre = dst.Layer(ctx, small_config(pre_layer_norm=True))
    with pytest.raises(dst.InvalidArgumentError, match="(?i)pre"):
        pre.save(tmp_path / "x.safetensors", layout="hf_bert")


def test_checkpoint_errors(ctx, tmp_path):
    layer = dst.Layer(ctx, small_config())
    with pytest.raises(dst.DstIOError) as ei:
        layer.load(tmp_path / "missing.safetensors")
    assert isinstance(ei.value, OSError) and ei.value.status == 7 and ei.value.message
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(struct.pack("<Q", 5) + b"{not json")
    with pytest.raises(dst.FormatError) as ei:
        layer.load(bad)
    assert ei.value.status == 8 and ei.value.message
    with pytest.raises(dst.FormatError, match="dst_checkpoint_describe"):
        dst.describe_checkpoint(bad)
    with pytest.raises(dst.DstIOError):
        dst.describe_checkpoint(tmp_path / "missing.safetensors")
    other_shape = tmp_path / "other.safetensors"
    dst.Layer(ctx, small_config(intermediate_size=32)).save(other_shape)
    with pytest.raises(dst.FormatError, match="inter_w"):
        layer.load(other_shape)
    with pytest.raises(dst.DstIOError):
        layer.save(tmp_path / "no" / "such" / "dir" / "x.safetensors")
    with pytest.raises(ValueError, match="layout"):
        layer.save(tmp_path / "y.safetensors", layout="onnx")
    with pytest.raises(TypeError):
        dst.save_checkpoint([layer, "not a layer"], tmp_path / "z.safetensors")


def test_objects_running_on_a_layer_are_accepted(tmp_path, ctx):
    """The checkpoint functions take anything whose ``native`` property is a Layer (what
    dstransformer.torch.TransformerLayer offers), alone or in a sequence."""

    class Wrapper:
        def __init__(self, layer):
            self._layer = layer

        @property
        def native(self):
            return self._layer

    cfg = small_config(dtype="fp32")
    with dst.Layer(ctx, cfg) as a, dst.Layer(ctx, cfg) as b:
        path = tmp_path / "w.safetensors"
        dst.save_checkpoint(Wrapper(a), path)
        dst.load_checkpoint([Wrapper(b)], path)
        assert np.array_equal(a.param("attn_qkvw"), b.param("attn_qkvw"))
        with pytest.raises(TypeError, match="layers\\[1\\] is a str"):
            dst.save_checkpoint([a, "b"], path)
