"""pytest for the float64 NumPy reference of the libdstransformer layer (dst_reference.py, philox.py).

What is checked:
  * Philox4x32-10 against Random123's published known-answer vectors, and the per-element word layout of a
    dropout site (counter / key split of the element index, offset and seed);
  * the dropout threshold rule and the dropped fraction / scale of the masks;
  * the vectorised forward against a deliberately naive loop-by-loop forward written from the same contract
    (catches head-layout and dropout-indexing mistakes that a gradient check cannot see);
  * every analytic gradient (dX and the 12 parameters) by central finite differences, in both LN orders, with
    dropout on, for each mask kind (none / additive / key lengths), causal, both GELU forms, S = 1, and an
    all-masked query row;
  * structural properties (padded / future keys have no influence, lengths ≡ -inf additive mask);
  * the hand-written safetensors writer/reader and the metadata of the golden files in tests/data.
"""

import math
import os

import numpy as np
import pytest

import dst_reference as ref
import make_golden
from philox import philox4x32_10, philox_words

# ----------------------------------------------------------------------------------------------------------------
# Philox
# ----------------------------------------------------------------------------------------------------------------

KAT = [  # Random123 kat_vectors, philox4x32_10: (counter, key, expected output)
    ((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
    ((0xFFFFFFFF,) * 4, (0xFFFFFFFF, 0xFFFFFFFF), (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
    ((0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344), (0xA4093822, 0x299F31D0),
     (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1)),
]


@pytest.mark.parametrize("counter,key,expected", KAT)
def test_philox_known_answers(counter, key, expected):
    out = tuple(int(w) for w in philox4x32_10(counter, key))
    assert out == expected


def test_philox_vectorised_matches_scalar():
    rng = np.random.default_rng(3)
    cs = rng.integers(0, 2**32, size=(4, 50), dtype=np.uint64)
    ks = rng.integers(0, 2**32, size=(2, 50), dtype=np.uint64)
    vec = np.stack(philox4x32_10(tuple(cs), tuple(ks)))
    for i in range(50):
        one = philox4x32_10(tuple(int(c) for c in cs[:, i]), tuple(int(k) for k in ks[:, i]))
        assert tuple(int(w) for w in one) == tuple(int(w) for w in vec[:, i])


@pytest.mark.parametrize("seed,offset", [(0, 0), (1234, 17), (0x123456789ABCDEF0, (5 << 32) + 9)])
def test_philox_words_element_layout(seed, offset):
    """Element e: counter (e>>2 & 0xffffffff, e>>34, off lo, off hi), key (seed lo, seed hi), word e & 3."""
    n = 203  # not a multiple of 4
    words = philox_words(seed, offset, n)
    assert words.shape == (n,)
    for e in range(n):
        c = ((e >> 2) & 0xFFFFFFFF, e >> 34, offset & 0xFFFFFFFF, offset >> 32)
        k = (seed & 0xFFFFFFFF, seed >> 32)
        assert int(words[e]) == int(philox4x32_10(c, k)[e & 3]), e


# ----------------------------------------------------------------------------------------------------------------
# Dropout
# ----------------------------------------------------------------------------------------------------------------

def test_dropout_threshold_rule():
    assert ref.dropout_threshold(0.0) == 0
    assert ref.dropout_threshold(0.5) == 2**31
    p32 = float(np.float32(0.1))  # 0.100000001490116..., the float32 value widened to double
    assert p32 != 0.1
    assert ref.dropout_threshold(0.1) == math.ceil(p32 * 2**32) == 429496736
    assert ref.dropout_threshold(float(np.nextafter(np.float32(1), np.float32(0)))) == 2**32 - 256
    with pytest.raises(ValueError):
        ref.dropout_threshold(1.0)


@pytest.mark.parametrize("p", [0.1, 0.25, 0.5, 0.9])
def test_dropped_fraction_and_scale(p):
    n = 1 << 20
    m = ref.dropout_multiplier(p, 42, 7, (n,))
    frac = float(np.mean(m == 0.0))
    sigma = math.sqrt(p * (1 - p) / n)
    assert abs(frac - p) < 5 * sigma, (frac, p)
    kept = m[m != 0.0]
    assert np.all(kept == 1.0 / (1.0 - float(np.float32(p))))
    # a different counter offset (another site) gives a different mask
    m2 = ref.dropout_multiplier(p, 42, 8, (n,))
    assert np.mean((m == 0) != (m2 == 0)) > 0.5 * 2 * p * (1 - p)


def test_zero_ratio_keeps_everything():
    assert np.all(ref.dropout_multiplier(0.0, 1, 2, (7, 11)) == 1.0)


# ----------------------------------------------------------------------------------------------------------------
# Forward against a naive loop implementation of the contract
# ----------------------------------------------------------------------------------------------------------------

def _naive_forward(cfg, p, x, mask, seed, offset):
    """Element-by-element forward written directly from the contract, scalar Philox per dropped element."""
    B, S, H = x.shape
    nH, d, I = cfg.heads, cfg.hidden_size // cfg.heads, cfg.intermediate_size
    thr = ref.dropout_threshold
    key = (seed & 0xFFFFFFFF, seed >> 32)

    def keep_mul(ratio, off, e):
        t = thr(ratio)
        if t == 0:
            return 1.0
        w = int(philox4x32_10(((e >> 2) & 0xFFFFFFFF, e >> 34, off & 0xFFFFFFFF, off >> 32), key)[e & 3])
        return 1.0 / (1.0 - float(np.float32(ratio))) if w >= t else 0.0

    def ln(v, gam, bet):
        mu = sum(v) / len(v)
        var = sum((a - mu) ** 2 for a in v) / len(v)
        return [gam[j] * (v[j] - mu) / math.sqrt(var + cfg.layer_norm_eps) + bet[j] for j in range(len(v))]

    def lin(v, W, b):
        return [sum(W[o][i] * v[i] for i in range(len(v))) + b[o] for o in range(len(b))]

    def gelu(u):
        if cfg.gelu == "erf":
            return 0.5 * u * (1 + math.erf(u / math.sqrt(2)))
        return 0.5 * u * (1 + math.tanh(math.sqrt(2 / math.pi) * (u + 0.044715 * u ** 3)))

    P = {k: np.asarray(v).tolist() for k, v in p.items()}
    X = x.tolist()
    y = np.zeros((B, S, H))
    for b in range(B):
        hin = [ln(X[b][s], P["norm_w"], P["norm_b"]) if cfg.pre_layer_norm else X[b][s] for s in range(S)]
        qkv = [lin(hin[s], P["attn_qkvw"], P["attn_qkvb"]) for s in range(S)]
        ctx = [[0.0] * H for _ in range(S)]
        for h in range(nH):
            for i in range(S):
                sc = []
                for j in range(S):
                    z = sum(qkv[i][h * d + t] * qkv[j][H + h * d + t] for t in range(d)) / math.sqrt(d)
                    if mask is not None and np.issubdtype(np.asarray(mask).dtype, np.floating):
                        z += float(mask[b][j])
                    if mask is not None and np.issubdtype(np.asarray(mask).dtype, np.integer) and j >= mask[b]:
                        z = -math.inf
                    if cfg.causal and j > i:
                        z = -math.inf
                    sc.append(z)
                mx = max(sc)
                ex = [0.0 if s_ == -math.inf else math.exp(s_ - mx) for s_ in sc]
                tot = sum(ex)
                for j in range(S):
                    pij = ex[j] / tot if tot > 0 else 0.0
                    pij *= keep_mul(cfg.attn_dropout_ratio, offset, ((b * nH + h) * S + i) * S + j)
                    for t in range(d):
                        ctx[i][h * d + t] += pij * qkv[j][2 * H + h * d + t]
        for s in range(S):
            tok = b * S + s
            a = lin(ctx[s], P["attn_ow"], P["attn_ob"])
            r = [X[b][s][c] + keep_mul(cfg.hidden_dropout_ratio, offset + 1, tok * H + c) * a[c] for c in range(H)]
            h2 = ln(r, P["attn_nw"], P["attn_nb"])
            g = [gelu(u) for u in lin(h2, P["inter_w"], P["inter_b"])]
            o = lin(g, P["output_w"], P["output_b"])
            assert len(g) == I
            base = r if cfg.pre_layer_norm else h2
            zz = [base[c] + keep_mul(cfg.hidden_dropout_ratio, offset + 2, tok * H + c) * o[c] for c in range(H)]
            y[b, s] = zz if cfg.pre_layer_norm else ln(zz, P["norm_w"], P["norm_b"])
    return y


NAIVE_CASES = [
    (True, "additive", False, "erf"),
    (False, "lengths", False, "tanh"),
    (True, "lengths", True, "tanh"),
    (False, "none", True, "erf"),
]


@pytest.mark.parametrize("pre,mask_kind,causal,gelu", NAIVE_CASES)
def test_forward_matches_naive_loops(pre, mask_kind, causal, gelu):
    cfg = ref.LayerConfig(6, 3, 5, 0.3, 0.3, pre, 1e-5, gelu, causal)
    rng = np.random.default_rng(11)
    B, S = 2, 4
    params = ref.init_params(cfg, rng)
    x = rng.standard_normal((B, S, 6))
    mask = {"none": None, "additive": np.array([[0.0, 0.3, -1.0, 0.0], [0.0, 0.0, -10000.0, -10000.0]]),
            "lengths": np.array([4, 2], dtype=np.int32)}[mask_kind]
    seed, offset = (3 << 32) + 5, (1 << 32) + 12
    y, _ = ref.forward(cfg, params, x, mask, training=True, rng_seed=seed, rng_offset=offset)
    y_naive = _naive_forward(cfg, params, x, mask, seed, offset)
    assert ref.rel_l2(y, y_naive) < 1e-13


# ----------------------------------------------------------------------------------------------------------------
# Gradients by finite differences
# ----------------------------------------------------------------------------------------------------------------

FD_TOL = 1e-6  # central differences with h = 1e-5 in float64 reach ~1e-9 here; 1e-6 leaves margin


def _small_cfg(pre, gelu="erf", causal=False, p=0.25):
    return ref.LayerConfig(hidden_size=8, heads=2, intermediate_size=12, attn_dropout_ratio=p,
                           hidden_dropout_ratio=p, pre_layer_norm=pre, layer_norm_eps=1e-5, gelu=gelu,
                           causal=causal)


def _assert_fd(errors):
    assert set(errors) == {"input", *ref.PARAM_NAMES}
    bad = {k: v for k, v in errors.items() if not (v < FD_TOL)}
    assert not bad, f"finite-difference mismatch: {bad}"


def _assert_dropout_active(cfg, B, S, rng_seed=77, rng_offset=5):
    """The FD configurations must actually drop something at every site, or the masks would go untested."""
    H = cfg.hidden_size
    for site, (ratio, shape) in enumerate([(cfg.attn_dropout_ratio, (B, cfg.heads, S, S)),
                                           (cfg.hidden_dropout_ratio, (B, S, H)),
                                           (cfg.hidden_dropout_ratio, (B, S, H))]):
        m = ref.dropout_multiplier(ratio, rng_seed, rng_offset + site, shape)
        assert np.any(m == 0.0), f"site {site} drops nothing"


@pytest.mark.parametrize("pre", [True, False], ids=["preln", "postln"])
@pytest.mark.parametrize("mask_kind", ["none", "additive", "lengths"])
def test_gradients_finite_difference(pre, mask_kind):
    cfg = _small_cfg(pre)
    _assert_dropout_active(cfg, 2, 4)
    _assert_fd(ref.finite_difference_check(cfg, batch=2, seq=4, mask_kind=mask_kind, seed=1))


@pytest.mark.parametrize("pre", [True, False], ids=["preln", "postln"])
@pytest.mark.parametrize("mask_kind", ["none", "lengths"])
def test_gradients_finite_difference_causal_tanh(pre, mask_kind):
    cfg = _small_cfg(pre, gelu="tanh", causal=True)
    _assert_fd(ref.finite_difference_check(cfg, batch=2, seq=4, mask_kind=mask_kind, seed=2))


@pytest.mark.parametrize("pre", [True, False], ids=["preln", "postln"])
def test_gradients_finite_difference_seq1(pre):
    cfg = _small_cfg(pre)
    _assert_fd(ref.finite_difference_check(cfg, batch=3, seq=1, mask_kind="additive", seed=3))


def test_gradients_random_additive_mask_and_odd_heads():
    cfg = ref.LayerConfig(9, 3, 7, 0.2, 0.1, False, 1e-12, "erf", False)
    rng = np.random.default_rng(9)
    mask = rng.standard_normal((2, 5))  # random additive values, as DeepSpeed's own tests use
    _assert_fd(ref.finite_difference_check(cfg, mask=mask, x=rng.standard_normal((2, 5, 9)), seed=4))


def test_all_masked_row_gives_zero_probabilities():
    """Key length 0: every key of batch 1 is -inf, P = 0, ctx = 0; everything stays finite and differentiable."""
    cfg = _small_cfg(True)
    x = np.random.default_rng(5).standard_normal((2, 3, 8))
    lens = np.array([3, 0], dtype=np.int32)
    y, cache = ref.forward(cfg, ref.init_params(cfg, np.random.default_rng(6)), x, lens, rng_seed=1, rng_offset=2)
    assert np.all(np.isfinite(y))
    assert np.all(cache["attn"]["P"][1] == 0.0)
    _assert_fd(ref.finite_difference_check(cfg, x=x, mask=lens, seed=7))


# ----------------------------------------------------------------------------------------------------------------
# Structural properties of the forward
# ----------------------------------------------------------------------------------------------------------------

def _setup(pre, causal, p=0.2, B=2, S=5):
    cfg = ref.LayerConfig(12, 3, 20, p, p, pre, 1e-12, "erf", causal)
    rng = np.random.default_rng(21)
    return cfg, ref.init_params(cfg, rng), rng.standard_normal((B, S, 12))


@pytest.mark.parametrize("pre", [True, False])
def test_padded_keys_do_not_influence_other_tokens(pre):
    cfg, params, x = _setup(pre, False)
    lens = np.array([5, 3], dtype=np.int32)
    y0, _ = ref.forward(cfg, params, x, lens, rng_seed=4, rng_offset=0)
    x2 = x.copy()
    x2[1, 3:] += 10.0  # change the padded tokens of batch 1
    y1, _ = ref.forward(cfg, params, x2, lens, rng_seed=4, rng_offset=0)
    assert np.array_equal(y0[0], y1[0]) and np.array_equal(y0[1, :3], y1[1, :3])
    assert not np.allclose(y0[1, 3:], y1[1, 3:])


@pytest.mark.parametrize("pre", [True, False])
def test_causal_future_tokens_do_not_influence_past(pre):
    cfg, params, x = _setup(pre, True)
    y0, _ = ref.forward(cfg, params, x, None, rng_seed=4, rng_offset=0)
    x2 = x.copy()
    x2[:, 3] += 5.0
    y1, _ = ref.forward(cfg, params, x2, None, rng_seed=4, rng_offset=0)
    assert np.array_equal(y0[:, :3], y1[:, :3])
    assert not np.allclose(y0[:, 3:], y1[:, 3:])


def test_lengths_equal_infinite_additive_mask_and_inference_equals_zero_ratio():
    cfg, params, x = _setup(True, False)
    lens = np.array([5, 2], dtype=np.int32)
    add = np.where(np.arange(5)[None, :] >= lens[:, None], -np.inf, 0.0)
    ya, _ = ref.forward(cfg, params, x, lens, rng_seed=9, rng_offset=1)
    yb, _ = ref.forward(cfg, params, x, add, rng_seed=9, rng_offset=1)
    assert np.array_equal(ya, yb)
    cfg0 = ref.LayerConfig(12, 3, 20, 0.0, 0.0, True, 1e-12, "erf", False)
    yi, _ = ref.forward(cfg, params, x, lens, training=False)
    yz, _ = ref.forward(cfg0, params, x, lens, training=True, rng_seed=9, rng_offset=1)
    assert np.array_equal(yi, yz)
    ytrain, _ = ref.forward(cfg, params, x, lens, training=True, rng_seed=9, rng_offset=1)
    assert not np.allclose(yi, ytrain)


# ----------------------------------------------------------------------------------------------------------------
# safetensors and golden files
# ----------------------------------------------------------------------------------------------------------------

def test_safetensors_round_trip(tmp_path):
    t = {"a": np.arange(6, dtype=np.float64).reshape(2, 3) / 7, "n": np.array([3, -1], dtype=np.int32),
         "s": np.zeros((0,))}
    path = str(tmp_path / "x.safetensors")
    make_golden.write_safetensors(path, t, {"k": "v"})
    raw = open(path, "rb").read()
    n = int.from_bytes(raw[:8], "little")
    assert n % 8 == 0 and len(raw) == 8 + n + 6 * 8 + 2 * 4
    meta, back, info = make_golden.read_safetensors(path)
    assert meta == {"k": "v"} and list(back) == ["a", "n", "s"]
    assert info["n"] == ("I32", (2,)) and info["a"] == ("F64", (2, 3))
    for k in t:
        assert back[k].tobytes() == np.ascontiguousarray(t[k]).tobytes()


def test_golden_files_metadata():
    for name, c in make_golden.CONFIGS.items():
        path = os.path.join(make_golden.DEFAULT_DIR, make_golden.file_name(name))
        assert os.path.exists(path), path
        meta, t, info = make_golden.read_safetensors(path)
        cfg = c["cfg"]
        assert meta["format"] == "dst-golden-1"
        assert int(meta["hidden_size"]) == cfg.hidden_size and int(meta["heads"]) == cfg.heads
        assert meta["mask_kind"] == c["mask_kind"] and ("mask" in t) == (c["mask_kind"] != "none")
        assert float(np.float32(meta["attn_dropout_ratio"])) == float(np.float32(cfg.attn_dropout_ratio))
        assert info["output"] == ("F64", (c["B"], c["S"], cfg.hidden_size))
        if c["mask_kind"] == "lengths":
            assert info["mask"] == ("I32", (c["B"],))
        for n in ref.PARAM_NAMES:
            assert info["grad." + n][1] == info[n][1]
