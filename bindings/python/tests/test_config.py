"""LayerConfig: DeepSpeed-style kwargs, defaults, dict/JSON round trips, validation by the library."""

import json

import pytest

import dstransformer as dst


DS_KWARGS = dict(batch_size=8, hidden_size=64, intermediate_size=256, heads=4, attn_dropout_ratio=0.1,
                 hidden_dropout_ratio=0.1, num_hidden_layers=4, initializer_range=0.02, layer_norm_eps=1e-12,
                 local_rank=-1, seed=1234, fp16=True, pre_layer_norm=False, normalize_invertible=True,
                 gelu_checkpoint=True, adjust_init_range=True, attn_dropout_checkpoint=True,
                 stochastic_mode=False, return_tuple=True, training=True)


def test_deepspeed_kwargs():
    c = dst.LayerConfig(**DS_KWARGS)
    for k, v in DS_KWARGS.items():
        assert getattr(c, k) == v
    assert c.resolved_dtype == "fp16"
    assert c.resolved_max_batch_tokens == 8 * c.max_seq_length
    n = c.to_native()
    assert (n.hidden_size, n.heads, n.intermediate_size, n.num_hidden_layers) == (64, 4, 256, 4)
    assert n.dtype == dst._native.DST_DTYPE_FP16 and n.pre_layer_norm == 0 and n.normalize_invertible == 1
    assert n.gelu_checkpoint == 1 and n.attn_dropout_checkpoint == 1 and n.seed == 1234


def test_defaults_and_our_fields():
    c = dst.LayerConfig()
    assert (c.hidden_size, c.heads, c.max_seq_length, c.seed) == (1024, 16, 512, 42)
    assert c.resolved_dtype == "fp32" and c.gelu == "erf" and not c.causal
    assert c.to_native().intermediate_size == 0  # -1 (DeepSpeed's "unset") means 4·H
    c = dst.LayerConfig(hidden_size=32, heads=2, dtype="bf16", max_batch_tokens=100, max_seq_length=50,
                        gelu="tanh", causal=True, allow_tf32=True, seed=-1)
    n = c.to_native()
    assert n.dtype == dst._native.DST_DTYPE_BF16 and n.max_batch_tokens == 100 and n.max_seq_len == 50
    assert n.gelu == dst._native.DST_GELU_TANH and n.causal == 1 and n.allow_tf32 == 1
    assert n.seed == 2**64 - 1  # DeepSpeed's -1 seed as an unsigned 64-bit value


def test_validation_uses_library_message():
    with pytest.raises(dst.InvalidArgumentError) as ei:
        dst.LayerConfig(hidden_size=30, heads=4)
    assert "heads (4) must divide config->hidden_size (30)" in ei.value.message
    with pytest.raises(dst.InvalidArgumentError, match="attn_dropout_ratio"):
        dst.LayerConfig(attn_dropout_ratio=1.5)
    c = dst.LayerConfig(hidden_size=64, heads=4)
    c.layer_norm_eps = 0.0  # attributes may be changed, DeepSpeed style; validate() checks them
    with pytest.raises(dst.InvalidArgumentError, match="layer_norm_eps"):
        c.validate()
    with pytest.raises(TypeError, match="max_seq_len"):
        dst.LayerConfig(max_seq_len=3)  # the C name is not a keyword: ours is max_seq_length
    with pytest.raises(ValueError, match="conflicts"):
        dst.LayerConfig(fp16=True, dtype="bf16")
    with pytest.raises(ValueError, match="gelu"):
        dst.LayerConfig(gelu="relu")


def test_dict_round_trip():
    c = dst.LayerConfig(**DS_KWARGS)
    d = c.to_dict()
    assert d["hidden_size"] == 64 and "layer_id" not in d
    c2 = dst.LayerConfig.from_dict(d)
    assert c2 == c
    # DeepSpeed's from_dict keeps unknown keys as attributes
    c3 = dst.LayerConfig.from_dict({**d, "vocab_size": 30522})
    assert c3.vocab_size == 30522 and c3.to_dict()["vocab_size"] == 30522
    with pytest.raises(dst.InvalidArgumentError):
        dst.LayerConfig.from_dict({"hidden_size": 10, "heads": 3})


@pytest.mark.parametrize("encoding", ["utf-8", "utf-16"])
def test_from_json_file(tmp_path, encoding):
    path = tmp_path / "cfg.json"
    path.write_bytes(json.dumps(DS_KWARGS).encode(encoding))
    c = dst.LayerConfig.from_json_file(str(path))
    assert c.hidden_size == 64 and c.fp16 and c.return_tuple
    assert json.loads(c.to_json_string())["heads"] == 4


def test_saved_and_workspace_bytes_queries():
    c = dst.LayerConfig(hidden_size=64, heads=4, attn_dropout_checkpoint=False)
    full = c.saved_bytes(2, 16)
    c.normalize_invertible = True
    c.gelu_checkpoint = True
    c.attn_dropout_checkpoint = True
    assert 0 < c.saved_bytes(2, 16) < full
    assert c.workspace_bytes(2, 16) >= 0
    with pytest.raises(dst.InvalidArgumentError):
        c.saved_bytes(0, 16)


# ---- the generated field lists and DeepSpeed's TransformerConfig (no torch needed) ----------------------
from dstransformer import _fields  # noqa: E402
import inspect  # noqa: E402


def test_header_defaults_are_the_librarys():
    """The defaults the generated lists take from the header's comments are what dst_layer_config_default
    writes, so the signatures, docstrings and the other bindings' docs tell the truth."""
    c = dst._native.dst_layer_config()
    dst._native.dst_layer_config_default(c)
    for name, want in _fields.C_DEFAULTS.items():
        got = getattr(c, name)
        if name == "dtype":
            got = dst._config.dtype_name(int(got))
        elif name == "gelu":
            got = "tanh" if got == dst._native.DST_GELU_TANH else "erf"
        elif isinstance(want, bool):
            got = bool(got)
        if isinstance(want, float):
            assert got == pytest.approx(want, rel=1e-6), name
        else:
            assert got == want, name
    # every C field (but struct_size) is in the Python field list
    c_fields = [n for n in dir(c) if not n.startswith("_") and n not in ("this", "thisown", "struct_size")]
    assert sorted(c_fields) == sorted(f[1] for f in _fields.LAYER_CONFIG_FIELDS if f[1])


@pytest.mark.parametrize("cls", [dst.LayerConfig, dst.TransformerConfig])
def test_real_signatures(cls):
    params = inspect.signature(cls).parameters
    kinds = {p.kind for p in params.values()}
    assert inspect.Parameter.VAR_KEYWORD not in kinds and inspect.Parameter.VAR_POSITIONAL not in kinds
    assert list(params) == [f[0] for f in _fields.LAYER_CONFIG_FIELDS]  # DeepSpeed's order, then ours
    import pydoc

    text = pydoc.render_doc(cls, renderer=pydoc.plaintext)
    for name in ("hidden_size", "attn_dropout_ratio", "max_seq_length", "return_tuple", "allow_tf32"):
        assert name in text


def test_transformer_config_is_deepspeeds():
    T = dst.TransformerConfig
    params = inspect.signature(T).parameters
    positional = [n for n, p in params.items() if p.kind == inspect.Parameter.POSITIONAL_OR_KEYWORD]
    assert tuple(positional) == _fields.DEEPSPEED_ORDER
    assert [params[n].default for n in ("batch_size", "hidden_size", "heads", "attn_dropout_ratio", "seed")] == \
        [-1, -1, -1, -1, -1]
    # DeepSpeed's tests build an empty config and set attributes: allowed, but a layer needs the sizes
    cfg = T()
    with pytest.raises(ValueError, match="hidden_size, heads, attn_dropout_ratio, hidden_dropout_ratio, "
                                         "initializer_range, num_hidden_layers not set"):
        cfg.validate()
    with pytest.raises(ValueError, match="not set"), dst.Context("cpu") as ctx:
        dst.Layer(ctx, cfg)
    cfg.hidden_size, cfg.heads, cfg.attn_dropout_ratio, cfg.hidden_dropout_ratio = 64, 4, 0.0, 0.0
    cfg.initializer_range = 0.02
    with pytest.raises(ValueError, match="^TransformerConfig: num_hidden_layers not set"):
        cfg.validate()
    cfg.adjust_init_range = False  # num_hidden_layers is read only by the init rule
    cfg.validate()
    cfg.adjust_init_range, cfg.num_hidden_layers = True, 2
    n = cfg.validate().to_native()
    assert (n.hidden_size, n.heads, n.intermediate_size, n.seed) == (64, 4, 0, 2**64 - 1)
    # positional, in DeepSpeed's order; complete, so validated at once by the library
    c = T(8, 64, 256, 4, 0.1, 0.1, 2, 0.02)
    assert (c.batch_size, c.intermediate_size, c.num_hidden_layers, c.resolved_max_batch_tokens) == (8, 256, 2, 4096)
    with pytest.raises(dst.InvalidArgumentError, match="heads"):
        T(8, 30, 256, 4, 0.1, 0.1, 2, 0.02)
    with pytest.raises(TypeError):
        T(8, 64, 256, 4, 0.1, 0.1, 2, 0.02, 1e-12, -1, 1, False, True, False, False, True, False, False,
          False, True, 512)  # the library's fields are keywords only
    d = T.from_dict({"hidden_size": 64, "heads": 4})
    assert d.attn_dropout_ratio == -1 and d.missing_fields() == ["attn_dropout_ratio", "hidden_dropout_ratio",
                                                                 "initializer_range", "num_hidden_layers"]


def test_checkpoint_functions_cover_every_option():
    save = inspect.signature(dst.save_checkpoint).parameters
    load = inspect.signature(dst.load_checkpoint).parameters
    keywords = {n for n, p in list(save.items()) + list(load.items()) if p.kind == inspect.Parameter.KEYWORD_ONLY}
    assert keywords == set(_fields.CHECKPOINT_OPTIONS_FIELDS)
