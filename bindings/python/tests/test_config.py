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
