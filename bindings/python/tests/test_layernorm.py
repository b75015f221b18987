"""The standalone LayerNorm (Context.layernorm_forward/backward) against NumPy in fp64."""

import numpy as np
import pytest

import dstransformer as dst


def reference(x, g, b, dy, eps):
    mu = x.mean(-1, keepdims=True)
    rstd = 1.0 / np.sqrt(((x - mu) ** 2).mean(-1, keepdims=True) + eps)
    xhat = (x - mu) * rstd
    gdy = g * dy
    dx = rstd * (gdy - gdy.mean(-1, keepdims=True) - xhat * (gdy * xhat).mean(-1, keepdims=True))
    axes = tuple(range(x.ndim - 1))
    return g * xhat + b, mu.reshape(-1), rstd.reshape(-1), dx, (dy * xhat).sum(axes), dy.sum(axes)


def to_dtype(a, dtype):
    """fp64 values rounded to `dtype`; bf16 as raw bits when NumPy has no bfloat16 (round to nearest even)."""
    if dtype == np.uint16:
        u = a.astype(np.float32).view(np.uint32)
        return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    return a.astype(dtype)


def to_f64(a):
    if a.dtype == np.uint16:
        return (a.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    return a.astype(np.float64)


def data(rng, shape, dtype):
    x = rng.standard_normal(shape) * 2.0 + 0.5
    g = 1.0 + 0.3 * rng.standard_normal(shape[-1])
    b = 0.3 * rng.standard_normal(shape[-1])
    dy = rng.standard_normal(shape)
    return [to_dtype(a, dtype) for a in (x, g, b, dy)]


def test_forward_backward_fp64(ctx, rng):
    eps = 1e-5
    x, g, b, dy = data(rng, (3, 5, 7), np.float64)
    y, stats = ctx.layernorm_forward(x, g, b, eps)
    ry, rmu, rrstd, rdx, rdg, rdb = reference(x, g, b, dy, eps)
    assert y.shape == x.shape and y.dtype == np.float64
    assert stats.shape == (2, 15) and stats.dtype == np.float64
    np.testing.assert_allclose(y, ry, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(stats[0], rmu, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(stats[1], rrstd, rtol=1e-12)
    dx, dg, db = ctx.layernorm_backward(dy, x, g, b, stats)
    np.testing.assert_allclose(dx, rdx, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(dg, rdg, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(db, rdb, rtol=1e-10, atol=1e-12)
    # accumulate adds to the given dgamma/dbeta; dx is written
    dx2, dg2, db2 = ctx.layernorm_backward(dy, x, g, b, stats, dgamma=dg.copy(), dbeta=db.copy(), accumulate=True)
    np.testing.assert_allclose(dg2, 2 * rdg, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(db2, 2 * rdb, rtol=1e-10, atol=1e-12)
    np.testing.assert_array_equal(dx2, dx)
    # inference keeps no statistics; preallocated outputs are filled and returned
    out = np.full_like(x, np.nan)
    y2, none = ctx.layernorm_forward(x, g, b, eps, out=out, training=False)
    assert y2 is out and none is None
    np.testing.assert_array_equal(out, y)


@pytest.mark.parametrize("dtype,tol", [("fp32", 1e-5), ("fp16", 1e-3), ("bf16", 1e-2)])
def test_reduced_precision_against_fp64(ctx, rng, dtype, tol):
    npdt = np.float32 if dtype == "fp32" else np.float16 if dtype == "fp16" else dst.bf16_numpy_dtype()
    x, g, b, dy = data(rng, (4, 33, 96), npdt)  # one rounding to the dtype; the reference uses these values
    y, stats = ctx.layernorm_forward(x, g, b)
    assert y.dtype == npdt and stats.dtype == np.float32
    dx, dg, db = ctx.layernorm_backward(dy, x, g, b, stats)
    ref = reference(*(to_f64(a) for a in (x, g, b, dy)), 1e-12)

    def rel(a, r):
        return np.linalg.norm(to_f64(a) - r) / np.linalg.norm(r)

    for got, r in zip((y, dx, dg, db), (ref[0], ref[3], ref[4], ref[5])):
        assert rel(got, r) <= tol


def test_bad_arguments(ctx, rng):
    x, g, b, dy = data(rng, (2, 3, 8), np.float32)
    with pytest.raises(dst.InvalidArgumentError, match="gamma"):
        ctx.layernorm_forward(x, g[:5], b)
    with pytest.raises(dst.InvalidArgumentError, match="eps"):
        ctx.layernorm_forward(x, g, b, eps=0.0)
    with pytest.raises(dst.InvalidArgumentError, match="beta"):
        ctx.layernorm_forward(x, g, b.astype(np.float64))
    with pytest.raises(ValueError, match="dimensions"):
        ctx.layernorm_forward(x.reshape(1, 1, 1, 2, 24), g, b)
    y, stats = ctx.layernorm_forward(x, g, b)
    with pytest.raises(dst.InvalidArgumentError, match="stats"):
        ctx.layernorm_backward(dy, x, g, b, stats[:, :3])
    with pytest.raises(ValueError, match="accumulate"):
        ctx.layernorm_backward(dy, x, g, b, stats, accumulate=True)
    keep = np.full((2, 2, 8), 7.0, dtype=np.float32)
    with pytest.raises(dst.InvalidArgumentError, match="shape"):
        ctx.layernorm_forward(x, g, b, out=keep)
    assert (keep == 7.0).all()
