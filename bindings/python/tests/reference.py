"""Plain NumPy reference of the layer (fp64), written from its dataflow (docs/api.md, "What a layer computes"),
for the CPU tests."""

import math

import numpy as np

_erf = np.frompyfunc(math.erf, 1, 1)


def gelu(x, form="erf"):
    if form == "tanh":
        return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))
    return 0.5 * x * (1.0 + _erf(x / math.sqrt(2.0)).astype(np.float64))


def layer_norm(x, g, b, eps):
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * g + b


def additive_from(mask, B, S):
    """The [B, S] additive key mask of any mask form the binding accepts (None, additive, lengths)."""
    if mask is None:
        return np.zeros((B, S))
    m = np.asarray(mask)
    if m.dtype.kind in "iu":
        out = np.zeros((B, S))
        for b in range(B):
            out[b, int(m[b]):] = -np.inf
        return out
    return m.reshape(B, S).astype(np.float64)


def forward(x, p, heads, pre_ln=True, eps=1e-12, mask=None, causal=False, gelu_form="erf"):
    """y = layer(x) with parameters ``p`` (DeepSpeed names, [out, in] weights), no dropout."""
    x = np.asarray(x, dtype=np.float64)
    B, S, H = x.shape
    d = H // heads
    add = additive_from(mask, B, S)
    h = layer_norm(x, p["norm_w"], p["norm_b"], eps) if pre_ln else x
    qkv = h @ p["attn_qkvw"].T + p["attn_qkvb"]
    q, k, v = qkv[..., :H], qkv[..., H:2 * H], qkv[..., 2 * H:]

    def split(t):
        return t.reshape(B, S, heads, d).transpose(0, 2, 1, 3)

    q, k, v = split(q), split(k), split(v)
    scores = q @ k.transpose(0, 1, 3, 2) / math.sqrt(d) + add[:, None, None, :]
    if causal:
        scores = scores + np.triu(np.full((S, S), -np.inf), 1)[None, None]
    scores = scores - scores.max(-1, keepdims=True)
    e = np.exp(scores)
    probs = e / e.sum(-1, keepdims=True)
    ctx = (probs @ v).transpose(0, 2, 1, 3).reshape(B, S, H)
    a = ctx @ p["attn_ow"].T + p["attn_ob"]
    r = x + a
    h2 = layer_norm(r, p["attn_nw"], p["attn_nb"], eps)
    f = gelu(h2 @ p["inter_w"].T + p["inter_b"], gelu_form) @ p["output_w"].T + p["output_b"]
    if pre_ln:
        return r + f
    return layer_norm(h2 + f, p["norm_w"], p["norm_b"], eps)


def rel_l2(a, ref):
    a = np.asarray(a, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    n = np.linalg.norm(ref)
    return float(np.linalg.norm(a - ref) / (n if n > 0 else 1.0))
