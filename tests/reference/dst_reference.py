"""Independent float64 NumPy reference of one libdstransformer encoder layer (forward + hand-derived backward).

Written from the layer's specification only (its dataflow, now in docs/api.md "What a layer computes", and
the op definitions of DeepSpeed's kernel; no C++ of this repository was consulted), so that it can check
the library independently.  Everything is float64; no autograd is used: every
backward step is derived by hand in the comments next to it and checked by `finite_difference_check`.

Conventions (shared bit for bit with the C++ library where stated):
  * Parameters follow nn.Linear, y = x·Wᵀ + b with W stored [out, in]:
      attn_qkvw [3H,H] (Q rows, then K rows, then V rows; head h owns rows h·d..h·d+d-1 of each block),
      attn_qkvb [3H], attn_ow [H,H], attn_ob [H], attn_nw [H], attn_nb [H], inter_w [I,H], inter_b [I],
      output_w [H,I], output_b [H], norm_w [H], norm_b [H].
  * Pre-LN:  h = LN(x; norm); qkv = h·Wqkvᵀ+b; ctx = attn(qkv); a = ctx·Woᵀ+bo; r = x + drop1(a);
             h2 = LN(r; attn_n); u = h2·Wiᵀ+bi; g = GELU(u); o = g·Woutᵀ+bout; y = r + drop2(o).
  * Post-LN: qkv = x·Wqkvᵀ+b; ... h2 = LN(r; attn_n); ... z = h2 + drop2(o); y = LN(z; norm).
  * LayerNorm: population variance, y = γ·(x-μ)/sqrt(var+eps) + β.
  * Attention: scores = q·kᵀ/sqrt(d) + mask; additive mask m[b,j] added to every query row; key lengths put -inf
    on keys j >= len[b]; causal puts -inf on j > i; softmax in float64 (max subtracted; an all -inf row gives
    P = 0); P̃ = drop0(P); ctx = P̃·v; heads merged back in the same column layout.
  * Dropout (bit exact): ratio p is rounded to float32 and widened to double; threshold =
    min(2^32-1, ceil(p·2^32)) (p == 0: no dropout); element e of a site with counter offset `off` keeps iff its
    Philox word (see philox.py) >= threshold; kept values are multiplied by 1/(1-p) (double).
    Sites of a training forward with RNG state (seed, offset):
      site 0 attention probabilities, offset+0, e = ((b·heads+h)·S+i)·S+j, ratio attn_dropout_ratio;
      site 1 attention output,        offset+1, e = token·H + c,          ratio hidden_dropout_ratio;
      site 2 FFN output,              offset+2, e = token·H + c,          ratio hidden_dropout_ratio.
  * GELU: "erf" 0.5x(1+erf(x/√2)) or "tanh" 0.5x(1+tanh(√(2/π)(x+0.044715x³))).

Main entry points: `LayerConfig`, `param_shapes`, `init_params`, `forward`, `backward`, `dropout_multiplier`,
`finite_difference_check`.  Run this file directly for a finite-difference self-test.
"""

import math
from dataclasses import dataclass

import numpy as np

try:  # works both as a package module and as a plain script / pytest rootdir module
    from .philox import philox_words
except ImportError:  # pragma: no cover
    from philox import philox_words

PARAM_NAMES = (
    "attn_qkvw", "attn_qkvb", "attn_ow", "attn_ob", "attn_nw", "attn_nb",
    "inter_w", "inter_b", "output_w", "output_b", "norm_w", "norm_b",
)


@dataclass(frozen=True)
class LayerConfig:
    hidden_size: int
    heads: int
    intermediate_size: int
    attn_dropout_ratio: float = 0.0
    hidden_dropout_ratio: float = 0.0
    pre_layer_norm: bool = True
    layer_norm_eps: float = 1e-12
    gelu: str = "erf"  # "erf" or "tanh"
    causal: bool = False

    def __post_init__(self):
        if self.hidden_size % self.heads != 0:
            raise ValueError("hidden_size must be a multiple of heads")
        if self.gelu not in ("erf", "tanh"):
            raise ValueError("gelu must be 'erf' or 'tanh'")

    @property
    def head_size(self):
        return self.hidden_size // self.heads


def param_shapes(cfg):
    """Name -> shape of the 12 parameters, in DeepSpeed order."""
    H, I = cfg.hidden_size, cfg.intermediate_size
    return {
        "attn_qkvw": (3 * H, H), "attn_qkvb": (3 * H,),
        "attn_ow": (H, H), "attn_ob": (H,),
        "attn_nw": (H,), "attn_nb": (H,),
        "inter_w": (I, H), "inter_b": (I,),
        "output_w": (H, I), "output_b": (H,),
        "norm_w": (H,), "norm_b": (H,),
    }


def init_params(cfg, rng):
    """Random test parameters with O(1) activations: weights N(0, min(0.2, 1/sqrt(fan_in))), LN γ = 1 + 0.1·N(0,1),
    LN β and all biases 0.1·N(0,1).  Drawn in PARAM_NAMES order from the numpy Generator `rng`."""
    p = {}
    for name, shape in param_shapes(cfg).items():
        if len(shape) == 2:
            std = min(0.2, 1.0 / math.sqrt(shape[1]))
            p[name] = rng.normal(0.0, std, size=shape)
        elif name in ("attn_nw", "norm_w"):
            p[name] = 1.0 + 0.1 * rng.standard_normal(shape)
        else:
            p[name] = 0.1 * rng.standard_normal(shape)
    return p


# ----------------------------------------------------------------------------------------------------------------
# Dropout
# ----------------------------------------------------------------------------------------------------------------

def dropout_ratio_as_double(ratio):
    """The ratio as the library sees it: a float32 value widened to double."""
    return float(np.float32(ratio))


def dropout_threshold(ratio):
    """Keep iff word >= threshold.  threshold = min(2^32-1, ceil(p·2^32)); 0 (keep all) when p == 0.
    p·2^32 is exact in double (scaling by a power of two), so the ceil is exact too."""
    p = dropout_ratio_as_double(ratio)
    if not (0.0 <= p < 1.0):
        raise ValueError("dropout ratio must be in [0, 1)")
    return min(2**32 - 1, math.ceil(p * 2.0**32))


def dropout_multiplier(ratio, seed, offset, shape):
    """Per-element multiplier keep/(1-p) of one dropout site, shape `shape` (element index = C-order flat index).
    Returns all ones when the ratio is 0 (no dropout)."""
    n = int(np.prod(shape, dtype=np.int64))
    thr = dropout_threshold(ratio)
    if thr == 0:
        return np.ones(shape)
    p = dropout_ratio_as_double(ratio)
    scale = 1.0 / (1.0 - p)
    keep = philox_words(seed, offset, n) >= np.uint64(thr)
    return np.where(keep, scale, 0.0).reshape(shape)


# ----------------------------------------------------------------------------------------------------------------
# Building blocks, each with its backward
# ----------------------------------------------------------------------------------------------------------------

def linear_fwd(x, w, b):
    """y = x·Wᵀ + b over the last axis; W is [out, in]."""
    return x @ w.T + b


def linear_bwd(dy, x, w):
    """Backward of y = x·Wᵀ + b.
    y_nk = Σ_i x_ni W_ki + b_k  ⇒  ∂L/∂x_ni = Σ_k dy_nk W_ki   (dx = dy·W),
                                   ∂L/∂W_ki = Σ_n dy_nk x_ni   (dW = dyᵀ·x),
                                   ∂L/∂b_k  = Σ_n dy_nk        (db = column sums of dy),
    with n running over all leading axes (tokens)."""
    x2 = x.reshape(-1, x.shape[-1])
    dy2 = dy.reshape(-1, dy.shape[-1])
    dx = (dy2 @ w).reshape(x.shape)
    dw = dy2.T @ x2
    db = dy2.sum(axis=0)
    return dx, dw, db


def layernorm_fwd(x, gamma, beta, eps):
    """LN over the last axis with population variance.  Returns y and the cache (x̂, r) with r = 1/sqrt(var+eps)."""
    mu = x.mean(axis=-1, keepdims=True)
    xc = x - mu
    var = (xc * xc).mean(axis=-1, keepdims=True)
    rstd = 1.0 / np.sqrt(var + eps)
    xhat = xc * rstd
    return gamma * xhat + beta, (xhat, rstd)


def layernorm_bwd(dy, gamma, cache):
    """Backward of y = γ·x̂ + β, x̂ = (x-μ)·r, r = (v+ε)^(-1/2), v = (1/H)Σ(x-μ)², per row of H features.

    dγ_j = Σ_rows dy_j x̂_j,  dβ_j = Σ_rows dy_j.   Let g = γ⊙dy (the gradient w.r.t. x̂).
    ∂μ/∂x_j = 1/H;  ∂v/∂x_j = (2/H)(x_j-μ) (the μ-term vanishes because Σ(x-μ) = 0);
    ∂r/∂x_j = -½(v+ε)^(-3/2)·(2/H)(x_j-μ) = -r²x̂_j/H;
    ∂x̂_k/∂x_j = r(δ_kj - 1/H) + (x_k-μ)·(-r²x̂_j/H) = r(δ_kj - 1/H - x̂_k x̂_j/H).
    ⇒ dx_j = Σ_k g_k ∂x̂_k/∂x_j = r·(g_j - mean(g) - x̂_j·mean(g⊙x̂)).
    """
    xhat, rstd = cache
    H = dy.shape[-1]
    dgamma = (dy * xhat).reshape(-1, H).sum(axis=0)
    dbeta = dy.reshape(-1, H).sum(axis=0)
    g = gamma * dy
    dx = rstd * (g - g.mean(axis=-1, keepdims=True) - xhat * (g * xhat).mean(axis=-1, keepdims=True))
    return dx, dgamma, dbeta


_erf = np.vectorize(math.erf, otypes=[np.float64])
_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
_GELU_C = 0.044715


def gelu_fwd(u, kind):
    if kind == "erf":
        return 0.5 * u * (1.0 + _erf(u / math.sqrt(2.0)))
    t = np.tanh(_SQRT_2_OVER_PI * (u + _GELU_C * u ** 3))
    return 0.5 * u * (1.0 + t)


def gelu_grad(u, kind):
    """dGELU/du.
    erf:  GELU = u·Φ(u), Φ(u) = ½(1+erf(u/√2))  ⇒  Φ(u) + u·φ(u),  φ(u) = exp(-u²/2)/√(2π).
    tanh: GELU = ½u(1+t), t = tanh(s), s = √(2/π)(u + c u³), dt/du = (1-t²)·√(2/π)(1 + 3c u²)
          ⇒  ½(1+t) + ½u(1-t²)√(2/π)(1 + 3c u²)."""
    if kind == "erf":
        cdf = 0.5 * (1.0 + _erf(u / math.sqrt(2.0)))
        pdf = np.exp(-0.5 * u * u) / math.sqrt(2.0 * math.pi)
        return cdf + u * pdf
    t = np.tanh(_SQRT_2_OVER_PI * (u + _GELU_C * u ** 3))
    return 0.5 * (1.0 + t) + 0.5 * u * (1.0 - t * t) * _SQRT_2_OVER_PI * (1.0 + 3.0 * _GELU_C * u * u)


def _split_heads(t, heads):
    """[B,S,H] -> [B,heads,S,d] (column h·d + j of the block is element j of head h)."""
    B, S, H = t.shape
    return t.reshape(B, S, heads, H // heads).transpose(0, 2, 1, 3)


def _merge_heads(t):
    """[B,heads,S,d] -> [B,S,heads·d], inverse of _split_heads."""
    B, nH, S, d = t.shape
    return t.transpose(0, 2, 1, 3).reshape(B, S, nH * d)


def attention_bias(B, S, mask, mask_kind, causal):
    """Additive bias [B,1,S,S] (broadcast over heads) from the mask and the causal flag; -inf marks forbidden keys."""
    bias = np.zeros((B, 1, S, S))
    if mask_kind == "additive":
        bias = bias + np.asarray(mask, dtype=np.float64).reshape(B, 1, 1, S)  # same for every query row i
    elif mask_kind == "lengths":
        lens = np.asarray(mask).reshape(B)
        key_out = np.arange(S)[None, :] >= lens[:, None]  # [B,S]: key j >= len[b]
        bias = np.where(key_out[:, None, None, :], -np.inf, bias)
    if causal:
        future = np.arange(S)[None, :] > np.arange(S)[:, None]  # [S,S]: j > i
        bias = np.where(future[None, None], -np.inf, bias)
    return bias


def attention_fwd(qkv, heads, bias, drop0):
    """qkv [B,S,3H] -> ctx [B,S,H]; `bias` [B,1,S,S] additive, `drop0` [B,heads,S,S] dropout multipliers."""
    H = qkv.shape[-1] // 3
    d = H // heads
    q = _split_heads(qkv[..., 0:H], heads)
    k = _split_heads(qkv[..., H:2 * H], heads)
    v = _split_heads(qkv[..., 2 * H:3 * H], heads)
    scale = 1.0 / math.sqrt(d)
    z = np.einsum("bhid,bhjd->bhij", q, k) * scale + bias
    # Max-subtracted softmax.  A row with every key at -inf has max -inf: subtract 0 instead, all exp() are 0,
    # the sum is 0, and the row of P is defined as 0.
    m = z.max(axis=-1, keepdims=True)
    m = np.where(np.isfinite(m), m, 0.0)
    e = np.exp(z - m)
    s = e.sum(axis=-1, keepdims=True)
    P = e / np.where(s > 0.0, s, 1.0)
    Pt = P * drop0
    ctx = np.einsum("bhij,bhjd->bhid", Pt, v)
    cache = dict(q=q, k=k, v=v, P=P, Pt=Pt, drop0=drop0, scale=scale)
    return _merge_heads(ctx), cache


def attention_bwd(dctx, cache):
    """Backward of attention_fwd, returns dqkv [B,S,3H].

    ctx_i = Σ_j P̃_ij v_j          ⇒ dP̃_ij = ⟨dctx_i, v_j⟩,  dv_j = Σ_i P̃_ij dctx_i.
    P̃ = P ⊙ D0 (D0 fixed)        ⇒ dP = dP̃ ⊙ D0.
    P_ij = exp(z_ij)/Σ_k exp(z_ik) ⇒ ∂P_ij/∂z_ik = P_ij(δ_jk - P_ik)
                                  ⇒ dz_ik = P_ik·(dP_ik - Σ_j dP_ij P_ij)  (masked keys: P = 0 ⇒ dz = 0).
    z_ij = α⟨q_i, k_j⟩ + bias_ij   ⇒ dq_i = α Σ_j dz_ij k_j,  dk_j = α Σ_i dz_ij q_i  (the mask gets no gradient).
    """
    q, k, v, P, Pt, drop0, scale = (cache[n] for n in ("q", "k", "v", "P", "Pt", "drop0", "scale"))
    heads = q.shape[1]
    dc = _split_heads(dctx, heads)
    dPt = np.einsum("bhid,bhjd->bhij", dc, v)
    dv = np.einsum("bhij,bhid->bhjd", Pt, dc)
    dP = dPt * drop0
    dz = P * (dP - (dP * P).sum(axis=-1, keepdims=True))
    dq = np.einsum("bhij,bhjd->bhid", dz, k) * scale
    dk = np.einsum("bhij,bhid->bhjd", dz, q) * scale
    return np.concatenate([_merge_heads(dq), _merge_heads(dk), _merge_heads(dv)], axis=-1)


# ----------------------------------------------------------------------------------------------------------------
# The layer
# ----------------------------------------------------------------------------------------------------------------

def infer_mask_kind(mask):
    if mask is None:
        return "none"
    return "lengths" if np.issubdtype(np.asarray(mask).dtype, np.integer) else "additive"


def forward(cfg, params, x, mask=None, *, training=True, rng_seed=0, rng_offset=0):
    """One layer forward in float64.

    x: [B,S,H].  mask: None, float [B,S] (additive key mask) or integer [B] (key lengths).
    training: dropout on (with the RNG state (rng_seed, rng_offset), sites at offset+0/1/2) or off.
    Returns (y [B,S,H], cache for `backward`).
    """
    x = np.asarray(x, dtype=np.float64)
    B, S, H = x.shape
    assert H == cfg.hidden_size
    pr = {n: np.asarray(params[n], dtype=np.float64) for n in PARAM_NAMES}
    mask_kind = infer_mask_kind(mask)
    nH = cfg.heads
    if training:
        D0 = dropout_multiplier(cfg.attn_dropout_ratio, rng_seed, rng_offset + 0, (B, nH, S, S))
        D1 = dropout_multiplier(cfg.hidden_dropout_ratio, rng_seed, rng_offset + 1, (B, S, H))
        D2 = dropout_multiplier(cfg.hidden_dropout_ratio, rng_seed, rng_offset + 2, (B, S, H))
    else:
        D0, D1, D2 = np.ones((B, nH, S, S)), np.ones((B, S, H)), np.ones((B, S, H))

    c = dict(x=x, D1=D1, D2=D2)
    if cfg.pre_layer_norm:
        h, c["ln_in"] = layernorm_fwd(x, pr["norm_w"], pr["norm_b"], cfg.layer_norm_eps)
    else:
        h = x
    c["h"] = h
    qkv = linear_fwd(h, pr["attn_qkvw"], pr["attn_qkvb"])
    bias = attention_bias(B, S, mask, mask_kind, cfg.causal)
    ctx, c["attn"] = attention_fwd(qkv, nH, bias, D0)
    c["ctx"] = ctx
    a = linear_fwd(ctx, pr["attn_ow"], pr["attn_ob"])
    r = x + D1 * a
    h2, c["ln_attn"] = layernorm_fwd(r, pr["attn_nw"], pr["attn_nb"], cfg.layer_norm_eps)
    c["h2"] = h2
    u = linear_fwd(h2, pr["inter_w"], pr["inter_b"])
    g = gelu_fwd(u, cfg.gelu)
    c["u"], c["g"] = u, g
    o = linear_fwd(g, pr["output_w"], pr["output_b"])
    if cfg.pre_layer_norm:
        y = r + D2 * o
    else:
        zsum = h2 + D2 * o
        y, c["ln_out"] = layernorm_fwd(zsum, pr["norm_w"], pr["norm_b"], cfg.layer_norm_eps)
    c["cfg"], c["params"] = cfg, pr
    return y, c


def backward(cache, dy):
    """Gradients of L = Σ y⊙dy.  Returns (dx [B,S,H], {param name: gradient}).  Derivation step by step below."""
    cfg, pr = cache["cfg"], cache["params"]
    dy = np.asarray(dy, dtype=np.float64)
    grads = {}
    if cfg.pre_layer_norm:
        # y = r + D2⊙o: the residual passes dy unchanged to r, the branch gets dy⊙D2.
        dr = dy.copy()
        do = dy * cache["D2"]
    else:
        # y = LN(z; norm_w, norm_b)  (layernorm_bwd), then z = h2 + D2⊙o.
        dz, grads["norm_w"], grads["norm_b"] = layernorm_bwd(dy, pr["norm_w"], cache["ln_out"])
        do = dz * cache["D2"]
    # o = g·Woutᵀ + bout
    dg, grads["output_w"], grads["output_b"] = linear_bwd(do, cache["g"], pr["output_w"])
    # g = GELU(u): element-wise chain rule.
    du = dg * gelu_grad(cache["u"], cfg.gelu)
    # u = h2·Wiᵀ + bi
    dh2, grads["inter_w"], grads["inter_b"] = linear_bwd(du, cache["h2"], pr["inter_w"])
    if not cfg.pre_layer_norm:
        # Post-LN: h2 also feeds z = h2 + D2⊙o directly, so its two gradients add.
        dh2 = dh2 + dz
    # h2 = LN(r; attn_nw, attn_nb)
    dr_ln, grads["attn_nw"], grads["attn_nb"] = layernorm_bwd(dh2, pr["attn_nw"], cache["ln_attn"])
    # Pre-LN: r also feeds y directly (dr from above); Post-LN: r only feeds the LN.
    dr = dr + dr_ln if cfg.pre_layer_norm else dr_ln
    # r = x + D1⊙a: x gets dr (residual), a gets dr⊙D1.
    dx = dr.copy()
    da = dr * cache["D1"]
    # a = ctx·Woᵀ + bo
    dctx, grads["attn_ow"], grads["attn_ob"] = linear_bwd(da, cache["ctx"], pr["attn_ow"])
    # ctx = attention(qkv)
    dqkv = attention_bwd(dctx, cache["attn"])
    # qkv = h·Wqkvᵀ + b  (h = LN(x) in Pre-LN, h = x in Post-LN)
    dh, grads["attn_qkvw"], grads["attn_qkvb"] = linear_bwd(dqkv, cache["h"], pr["attn_qkvw"])
    if cfg.pre_layer_norm:
        # h = LN(x; norm_w, norm_b); x's total gradient = residual part + LN part.
        dx_ln, grads["norm_w"], grads["norm_b"] = layernorm_bwd(dh, pr["norm_w"], cache["ln_in"])
        dx = dx + dx_ln
    else:
        dx = dx + dh
    return dx, {n: grads[n] for n in PARAM_NAMES}


# ----------------------------------------------------------------------------------------------------------------
# Finite-difference check
# ----------------------------------------------------------------------------------------------------------------

def rel_l2(a, b):
    """‖a - b‖ / ‖b‖ (‖a - b‖ itself when b is zero)."""
    nb = float(np.linalg.norm(b))
    diff = float(np.linalg.norm(np.asarray(a) - np.asarray(b)))
    return diff / nb if nb > 0.0 else diff


def finite_difference_check(cfg=None, batch=2, seq=4, mask_kind="none", *, seed=0, rng_seed=77, rng_offset=5,
                            step=1e-5, params=None, x=None, mask=None):
    """Compare the analytic gradients of L = Σ y⊙G (G random) with central differences (L(θ+h)-L(θ-h))/2h taken
    element by element over the input and all 12 parameters (training mode: the dropout masks are fixed by the
    RNG state, so L is a smooth function).  Returns {tensor name: relative L2 error}; "input" is dX.

    mask_kind "additive" pads (-10000) the last key of every batch row but the first, "lengths" uses lengths
    S, S-1, S-2, ... (at least 1); masks can also be given explicitly.
    """
    if cfg is None:
        cfg = LayerConfig(hidden_size=8, heads=2, intermediate_size=12, attn_dropout_ratio=0.25,
                          hidden_dropout_ratio=0.25, pre_layer_norm=True, layer_norm_eps=1e-5)
    rng = np.random.default_rng(seed)
    H = cfg.hidden_size
    if params is None:
        params = init_params(cfg, rng)
    if x is None:
        x = rng.standard_normal((batch, seq, H))
    batch, seq = x.shape[0], x.shape[1]
    if mask is None and mask_kind == "additive":
        mask = np.zeros((batch, seq))
        mask[1:, -1] = -10000.0
    elif mask is None and mask_kind == "lengths":
        mask = np.maximum(seq - np.arange(batch), 1).astype(np.int32)
    G = rng.standard_normal((batch, seq, H))

    def loss(xx, pp):
        yy, _ = forward(cfg, pp, xx, mask, training=True, rng_seed=rng_seed, rng_offset=rng_offset)
        return float(np.sum(yy * G))

    _, cache = forward(cfg, params, x, mask, training=True, rng_seed=rng_seed, rng_offset=rng_offset)
    dx, grads = backward(cache, G)

    def numeric(t, f):
        """Central difference of f() w.r.t. every element of array t (perturbed in place, then restored)."""
        out = np.zeros_like(t)
        flat, oflat = t.reshape(-1), out.reshape(-1)
        for i in range(flat.size):
            old = flat[i]
            flat[i] = old + step
            lp = f()
            flat[i] = old - step
            lm = f()
            flat[i] = old
            oflat[i] = (lp - lm) / (2.0 * step)
        return out

    params = {n: np.array(params[n], dtype=np.float64) for n in PARAM_NAMES}
    x = np.array(x, dtype=np.float64)
    errors = {"input": rel_l2(dx, numeric(x, lambda: loss(x, params)))}
    for n in PARAM_NAMES:
        errors[n] = rel_l2(grads[n], numeric(params[n], lambda: loss(x, params)))
    return errors


if __name__ == "__main__":
    worst = 0.0
    for pre in (True, False):
        for kind in ("none", "additive", "lengths"):
            cfg = LayerConfig(hidden_size=8, heads=2, intermediate_size=12, attn_dropout_ratio=0.25,
                              hidden_dropout_ratio=0.25, pre_layer_norm=pre, layer_norm_eps=1e-5,
                              gelu="erf" if pre else "tanh", causal=(kind == "lengths"))
            err = finite_difference_check(cfg, batch=2, seq=4, mask_kind=kind)
            m = max(err.values())
            worst = max(worst, m)
            print(f"pre_ln={pre!s:5} mask={kind:8} causal={cfg.causal!s:5} max rel err {m:.2e}")
    print("finite-difference self-test", "passed" if worst < 1e-6 else "FAILED")
    raise SystemExit(0 if worst < 1e-6 else 1)
