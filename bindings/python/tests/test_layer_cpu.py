"""Layer on the CPU backend with NumPy: parameters (copies and views), forward/backward against a NumPy
reference and finite differences, masks, saved activations, argument checks and library errors."""

import numpy as np
import pytest

import dstransformer as dst
from conftest import randomize, small_config
from reference import forward as ref_forward
from reference import rel_l2


# ---- parameters ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype,npdt,tol", [("fp32", np.float32, 1e-7), ("fp16", np.float16, 1e-3),
                                            ("bf16", None, 8e-3), ("fp64", np.float64, 0.0)])
def test_param_round_trip_each_dtype(ctx, rng, dtype, npdt, tol):
    with dst.Layer(ctx, small_config(dtype=dtype)) as layer:
        assert layer.dtype == dtype
        for name in dst.PARAM_NAMES:
            info = layer.param_info(name)
            v = rng.standard_normal(info.shape)
            layer.set_param(name, v)  # fp64 in, converted to the layer dtype
            back = layer.param(name, "fp64")
            assert back.shape == info.shape
            assert rel_l2(back, v) <= tol, name
            same = layer.param(name)  # layer dtype
            expected = dst.bf16_numpy_dtype() if dtype == "bf16" else np.dtype(npdt)
            assert same.dtype == expected
            if dtype != "bf16":
                layer.set_param(name, same)  # round trip in the layer dtype is exact
                assert np.array_equal(layer.param(name), same)
        # every source dtype is accepted and converted
        info = layer.param_info("attn_ob")
        for src in (np.float32, np.float16, np.float64):
            layer.set_param("attn_ob", np.full(info.shape, 0.5, dtype=src))
            assert np.all(layer.param("attn_ob", "fp32") == 0.5)


def test_bf16_as_uint16_bits(ctx):
    with dst.Layer(ctx, small_config(dtype="bf16")) as layer:
        info = layer.param_info("norm_b")
        vals = np.linspace(-2, 2, info.numel).astype(np.float32)
        bits = (vals.view(np.uint32) >> 16).astype(np.uint16)  # exact bf16 values: truncation is exact here
        exact = (bits.astype(np.uint32) << 16).view(np.float32)
        layer.set_param("norm_b", bits)
        assert np.array_equal(layer.param("norm_b", "fp32"), exact)
        got = layer.param("norm_b")
        assert np.array_equal(got.view(np.uint16), bits)


def test_param_names_and_info(ctx):
    with dst.Layer(ctx, small_config()) as layer:
        H, I = 16, 24
        shapes = {n: layer.param_info(n).shape for n in dst.PARAM_NAMES}
        assert shapes["attn_qkvw"] == (3 * H, H) and shapes["inter_w"] == (I, H) and shapes["output_w"] == (H, I)
        infos = [layer.param_info(n) for n in dst.PARAM_NAMES]
        assert all(i.offset_bytes % 256 == 0 for i in infos)
        assert layer.arena_bytes >= max(i.offset_bytes + i.size_bytes for i in infos)
        assert layer.param_info("bert.encoder.layer.3.attn_ow").name == "attn_ow"
        assert layer.param_info(2).name == "attn_ow"
        with pytest.raises(dst.InvalidArgumentError, match="attn_bogus"):
            layer.param_info("attn_bogus")
        with pytest.raises(ValueError, match="shape"):
            layer.set_param("attn_ob", np.zeros(H + 1))
        with pytest.raises(TypeError, match="dtype"):
            layer.set_param("attn_ob", np.zeros(H, dtype=np.complex64))


def test_views_versus_copies(ctx):
    with dst.Layer(ctx, small_config()) as layer:
        copy = layer.param("norm_b")
        view = layer.param_view("norm_b")
        assert not np.shares_memory(copy, view)
        copy[:] = 7.0  # a copy: the layer does not see it
        assert np.all(layer.param("norm_b") == 0.0)
        view[:] = 3.0  # a view: the layer sees it
        assert np.all(layer.param("norm_b") == 3.0)
        layer.set_param("norm_b", np.arange(16.0))
        assert np.array_equal(view, np.arange(16.0))  # and the view sees set_param
        assert view.ctypes.data == layer.param_arena_ptr + layer.param_info("norm_b").offset_bytes
        g = layer.grad_view("inter_w")
        assert g.shape == (24, 16) and g.ctypes.data == layer.grad_arena_ptr + layer.param_info("inter_w").offset_bytes


def test_bind_arenas_with_numpy(ctx, rng):
    with dst.Layer(ctx, small_config()) as layer:
        vals = randomize(layer, rng)
        arena = dst.aligned_empty(layer.arena_bytes)
        layer.bind_param_arena(arena, copy_current=True)
        assert layer.param_arena_ptr == arena.ctypes.data
        info = layer.param_info("attn_qkvw")
        w = arena[info.offset_bytes:info.offset_bytes + info.size_bytes].view(np.float64).reshape(info.shape)
        assert np.array_equal(w, vals["attn_qkvw"])
        w *= 2.0  # writes through the caller's memory reach the layer
        assert np.array_equal(layer.param("attn_qkvw"), 2.0 * vals["attn_qkvw"])
        garena = dst.aligned_empty(layer.arena_bytes, dtype=np.float64)
        garena[:] = 0.0
        layer.bind_grad_arena(garena)
        x = rng.standard_normal((2, 5, 16))
        layer.forward(x)
        layer.backward(np.ones_like(x))
        assert np.abs(garena).sum() > 0
        assert np.array_equal(layer.grad("inter_b").ravel(),
                              garena[layer.param_info("inter_b").offset_bytes // 8:][:24])
        with pytest.raises(dst.InvalidArgumentError):
            layer.bind_param_arena(dst.aligned_empty(layer.arena_bytes - 256))  # too short
        with pytest.raises(dst.InvalidArgumentError):
            layer.bind_param_arena(dst.aligned_empty(layer.arena_bytes + 256)[8:8 + layer.arena_bytes])


# ---- forward / backward against NumPy -------------------------------------------------------------------
@pytest.mark.parametrize("pre_ln", [True, False])
@pytest.mark.parametrize("mask_kind", ["none", "additive2", "additive4", "lengths"])
def test_forward_matches_numpy_fp64(ctx, rng, pre_ln, mask_kind):
    with dst.Layer(ctx, small_config(pre_layer_norm=pre_ln)) as layer:
        p = randomize(layer, rng)
        B, S = 3, 7
        x = rng.standard_normal((B, S, 16))
        mask = None
        if mask_kind == "additive2":
            mask = rng.standard_normal((B, S))
        elif mask_kind == "additive4":
            mask = rng.standard_normal((B, 1, 1, S))
        elif mask_kind == "lengths":
            mask = np.array([7, 2, 5], dtype=np.int32)
        y = layer.forward(x, mask)
        ref = ref_forward(x, p, 4, pre_ln=pre_ln, eps=float(np.float32(1e-12)), mask=mask)
        assert y.shape == x.shape and y.dtype == np.float64
        assert rel_l2(y, ref) < 1e-12
        if mask is not None and mask_kind != "lengths":
            y2 = layer.forward(x, dst.Mask.additive(mask))
            assert np.array_equal(y, y2)
        if mask_kind == "lengths":
            assert np.array_equal(layer.forward(x, dst.Mask.lengths([7, 2, 5])), y)


def test_causal_and_tanh_match_numpy(ctx, rng):
    with dst.Layer(ctx, small_config(causal=True, gelu="tanh")) as layer:
        p = randomize(layer, rng)
        x = rng.standard_normal((2, 6, 16))
        y = layer.forward(x)
        ref = ref_forward(x, p, 4, eps=float(np.float32(1e-12)), causal=True, gelu_form="tanh")
        assert rel_l2(y, ref) < 1e-12


@pytest.mark.parametrize("pre_ln", [True, False])
def test_gradients_by_finite_differences(ctx, rng, pre_ln):
    """d(sum(w·y))/dθ from backward against central differences, fp64, tiny layer."""
    cfg = small_config(hidden_size=8, heads=2, intermediate_size=12, pre_layer_norm=pre_ln)
    with dst.Layer(ctx, cfg) as layer:
        randomize(layer, rng)
        B, S = 2, 3
        x = rng.standard_normal((B, S, 8))
        mask = rng.standard_normal((B, S))
        w = rng.standard_normal((B, S, 8))

        def loss():
            return float(np.sum(layer.forward(x, mask) * w))

        layer.forward(x, mask)
        dx = layer.backward(w)
        grads = layer.grads()
        eps = 1e-6
        # dX: every element
        num = np.zeros_like(x)
        for idx in np.ndindex(x.shape):
            old = x[idx]
            x[idx] = old + eps
            lp = loss()
            x[idx] = old - eps
            lm = loss()
            x[idx] = old
            num[idx] = (lp - lm) / (2 * eps)
        assert rel_l2(dx, num) < 1e-6
        # parameters: a few elements of each
        for name in dst.PARAM_NAMES:
            base = layer.param(name)
            flat_idx = rng.choice(base.size, size=min(4, base.size), replace=False)
            for fi in flat_idx:
                idx = np.unravel_index(fi, base.shape)
                v = base.copy()
                v[idx] += eps
                layer.set_param(name, v)
                lp = loss()
                v[idx] -= 2 * eps
                layer.set_param(name, v)
                lm = loss()
                layer.set_param(name, base)
                g = (lp - lm) / (2 * eps)
                assert abs(grads[name][idx] - g) <= 1e-6 * max(1.0, abs(g)), (name, idx, grads[name][idx], g)


def test_accumulate_and_zero_grads(ctx, rng):
    with dst.Layer(ctx, small_config()) as layer:
        randomize(layer, rng)
        x = rng.standard_normal((2, 4, 16))
        dy = rng.standard_normal((2, 4, 16))
        layer.forward(x)
        layer.backward(dy)
        g1 = layer.grad("attn_qkvw")
        layer.backward(dy, accumulate=True)  # saved activations stay valid: backward may repeat
        assert np.allclose(layer.grad("attn_qkvw"), 2 * g1, rtol=1e-12, atol=0)
        layer.zero_grads()
        assert not np.any(layer.grad("attn_qkvw"))


def test_several_forwards_in_flight(ctx, rng):
    with dst.Layer(ctx, small_config()) as layer:
        randomize(layer, rng)
        xa, xb = rng.standard_normal((2, 4, 16)), rng.standard_normal((3, 5, 16))
        dya, dyb = rng.standard_normal(xa.shape), rng.standard_normal(xb.shape)
        with dst.SavedActivations(layer) as sa, layer.saved_activations() as sb:
            assert sa.nbytes == 0
            layer.forward(xa, saved=sa)
            layer.forward(xb, saved=sb)
            assert sa.nbytes == layer.saved_bytes(2, 4) and sb.nbytes == layer.saved_bytes(3, 5)
            dxb = layer.backward(dyb, saved=sb)
            gb = layer.grads()
            dxa = layer.backward(dya, saved=sa)
            ga = layer.grads()
            sa.release()
            assert sa.nbytes == 0
            with pytest.raises(dst.StateError, match="no training forward"):
                layer.backward(dya, saved=sa)
        # the same results one at a time on the default saved object
        layer.forward(xa)
        assert np.array_equal(layer.backward(dya), dxa) and np.array_equal(layer.grad("inter_w"), ga["inter_w"])
        layer.forward(xb)
        assert np.array_equal(layer.backward(dyb), dxb) and np.array_equal(layer.grad("inter_w"), gb["inter_w"])


def test_dropout_training_and_eval(ctx, rng):
    cfg = small_config(attn_dropout_ratio=0.2, hidden_dropout_ratio=0.2, dtype="fp32")
    with dst.Layer(ctx, cfg) as layer:
        x = rng.standard_normal((2, 8, 16)).astype(np.float32)
        ctx.rng_state = (99, 0)
        y1 = layer.forward(x)
        seed, off = ctx.rng_state
        assert seed == 99 and off > 0  # a training forward takes RNG offsets
        ctx.rng_state = (99, 0)
        assert np.array_equal(layer.forward(x), y1)  # same (seed, offset): same masks
        assert ctx.rng_graph_counter == 0  # eager calls leave the CUDA-graph counter alone
        ctx.rng_graph_counter = 2**32 - 1
        assert ctx.rng_graph_counter == 2**32 - 1
        with pytest.raises(dst.InvalidArgumentError, match="counter"):
            ctx.rng_graph_counter = 2**32
        ctx.rng_state = (99, 0)
        assert ctx.rng_graph_counter == 0  # set_rng_state resets it
        ctx.rng_state = (99, 0)
        assert np.array_equal(layer.forward(x), y1)
        assert not np.array_equal(layer.forward(x), y1)  # next offsets: other masks
        layer.eval()
        assert not layer.training
        off = ctx.rng_state[1]
        e1 = layer.forward(x)
        assert ctx.rng_state[1] == off and np.array_equal(layer.forward(x), e1)  # no dropout, no RNG use
        layer.train()
        assert layer.training


def test_layer_ids_and_config(ctx):
    a = dst.Layer(ctx, small_config())
    b = dst.Layer(ctx, small_config(), )
    c = dst.Layer(ctx, hidden_size=16, heads=2, max_seq_length=4, batch_size=1)  # kwargs form
    assert (a.layer_id, b.layer_id, c.layer_id) == (0, 1, 2)
    assert c.config.intermediate_size == 64 and c.config.max_batch_tokens == 4
    assert "Layer(id=0" in repr(a)
    for l in (a, b, c):
        l.close()


# ---- argument checks (before the call) and library errors -------------------------------------------------
def test_argument_checks_name_the_argument(ctx, rng):
    with dst.Layer(ctx, small_config(dtype="fp32")) as layer:
        x = rng.standard_normal((2, 4, 16)).astype(np.float32)
        with pytest.raises(TypeError, match=r"x: dtype is fp64, expected fp32"):
            layer.forward(x.astype(np.float64))
        with pytest.raises(ValueError, match=r"x: shape is \(2, 4, 15\)"):
            layer.forward(x[..., :15])
        with pytest.raises(ValueError, match=r"x: shape is \(8, 16\)"):
            layer.forward(x.reshape(8, 16))
        with pytest.raises(TypeError, match="mask: additive mask dtype is fp64"):
            layer.forward(x, np.zeros((2, 4)))
        with pytest.raises(ValueError, match="mask: additive mask shape"):
            layer.forward(x, np.zeros((2, 1, 4), dtype=np.float32))
        with pytest.raises(ValueError, match="mask: key lengths have shape"):
            layer.forward(x, np.array([4, 4, 4], dtype=np.int32))
        with pytest.raises(ValueError, match="mask: key lengths must lie in 1..4"):
            layer.forward(x, np.array([0, 4], dtype=np.int32))
        with pytest.raises(TypeError, match="boolean"):
            layer.forward(x, np.ones((2, 4), dtype=bool))
        with pytest.raises(ValueError, match=r"out: shape is"):
            layer.forward(x, out=np.empty((2, 5, 16), dtype=np.float32))
        with pytest.raises(ValueError, match="out: expected a C-contiguous"):
            layer.forward(x, out=np.empty((2, 16, 4), dtype=np.float32).transpose(0, 2, 1))
        layer.forward(x)
        with pytest.raises(TypeError, match="dy: dtype"):
            layer.backward(x.astype(np.float16))
        with pytest.raises(TypeError, match="saved must be"):
            layer.forward(x, saved=object())
        # a non-contiguous input is copied, and gives the same result
        xt = np.ascontiguousarray(x.transpose(1, 0, 2)).transpose(1, 0, 2)
        assert not xt.flags.c_contiguous
        layer.eval()
        assert np.array_equal(layer.forward(xt), layer.forward(x))
        out = np.empty_like(x)
        assert layer.forward(x, out=out) is out


def test_library_errors_carry_messages(ctx, rng):
    cfg = small_config(dtype="fp32", batch_size=2, max_seq_length=4)
    with dst.Layer(ctx, cfg) as layer, dst.Layer(ctx, cfg) as other:
        x = rng.standard_normal((2, 4, 16)).astype(np.float32)
        with pytest.raises(dst.CapacityError) as ei:
            layer.forward(rng.standard_normal((3, 4, 16)).astype(np.float32))
        assert ei.value.status == 3 and "max_batch_tokens" in ei.value.message
        with pytest.raises(dst.CapacityError, match="max_seq_len"):
            layer.forward(rng.standard_normal((1, 5, 16)).astype(np.float32))
        with pytest.raises(dst.StateError) as ei:
            layer.backward(x)
        assert isinstance(ei.value, RuntimeError) and "dst_layer_backward" in ei.value.message
        with pytest.raises(dst.InvalidArgumentError, match="expected"):
            layer.forward(x)
            layer.backward(rng.standard_normal((1, 4, 16)).astype(np.float32))
        with other.saved_activations() as s:
            with pytest.raises(ValueError, match="another layer"):
                layer.forward(x, saved=s)
        with pytest.raises(dst.InvalidArgumentError) as ei:
            dst.Layer(ctx, small_config(max_seq_length=0, max_batch_tokens=8))
        assert "max_seq_len" in ei.value.message and isinstance(ei.value, ValueError)


def test_unsupported_and_out_of_memory():
    if dst.cuda_device_count() == 0:
        with pytest.raises(dst.UnsupportedError) as ei:
            dst.Context("cuda")
        assert ei.value.status == 2 and ei.value.message
    with dst.Context("cpu") as c:
        with pytest.raises(dst.OutOfMemoryError) as ei:
            c._malloc(1 << 62)
        assert isinstance(ei.value, MemoryError) and ei.value.status == 4
        with pytest.raises(dst.InvalidArgumentError):
            c.set_stream(12345)  # a stream on a CPU context
        c.set_stream(None)
        assert c.stream == 0


def test_context_properties():
    with dst.Context("cpu") as c:
        assert c.backend == "cpu" and c.device == 0 and not c.is_cuda
        c.set_rng_state(5, 9)
        assert c.rng_state == (5, 9)
        c.num_threads = 2
        assert c.num_threads == 2
        c.num_threads = 0
        assert c.num_threads >= 1
        with pytest.raises(dst.InvalidArgumentError):
            c.num_threads = -1
        # Once accepted, and the next call died with SIGSEGV inside OpenMP.
        with pytest.raises(dst.InvalidArgumentError, match="threads"):
            c.num_threads = 1 << 20
        assert c.num_threads >= 1
        assert c.index_checks == "eager"
        c.index_checks = "deferred"
        assert c.index_checks == "deferred"
        with pytest.raises(ValueError, match="index_checks"):
            c.index_checks = "later"
        assert c.index_checks == "deferred"
        c.index_checks = "eager"
        assert c.index_checks == "eager"
        c.synchronize()
        assert c.workspace_bytes == 0
        ws = dst.aligned_empty(1 << 20)
        c.set_workspace(ws)
        c.set_workspace(None)
        m = c.empty((2, 3), "fp16")
        assert m.dtype == np.float16 and m.shape == (2, 3)
        a = np.arange(6.0)
        b = np.zeros(6)
        c.memcpy(b.ctypes.data, a.ctypes.data, a.nbytes, "within")
        assert np.array_equal(a, b)
    with pytest.raises(ValueError, match="backend"):
        dst.Context("tpu")


def test_workspace_capacity(ctx, rng):
    with dst.Layer(ctx, small_config(dtype="fp32")) as layer:
        x = rng.standard_normal((2, 4, 16)).astype(np.float32)
        need = layer.workspace_bytes(2, 4)
        ctx.set_workspace(dst.aligned_empty(max(need, 256)))
        layer.forward(x)
        if need > 256:
            ctx.set_workspace(dst.aligned_empty(256))
            with pytest.raises(dst.CapacityError):
                layer.forward(x)
        ctx.set_workspace(None)
        layer.forward(x)


# ---- packed sequences ---------------------------------------------------------------------------------
def test_packed_rows_match_the_padded_layer(ctx, rng):
    lengths = [3, 8, 1, 5]
    B, S, H = len(lengths), 8, 16
    cu = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    N = int(cu[-1])
    x, dy = rng.standard_normal((N, H)), rng.standard_normal((N, H))
    xp, dyp = np.zeros((B, S, H)), np.zeros((B, S, H))
    for b, n in enumerate(lengths):
        xp[b, :n], dyp[b, :n] = x[cu[b]:cu[b + 1]], dy[cu[b]:cu[b + 1]]
    cfg = small_config(attn_dropout_ratio=0.1, hidden_dropout_ratio=0.1, batch_size=4, max_seq_length=8)
    with dst.Layer(ctx, cfg) as layer:
        randomize(layer, rng)
        ctx.rng_state = (11, 0)
        yp = layer.forward(xp, mask=np.array(lengths, dtype=np.int32))
        dxp = layer.backward(dyp)
        gp = layer.grads()
        ctx.rng_state = (11, 0)
        y = layer.forward_packed(x, cu)  # max_seqlen from the host offsets: 8
        dx = layer.backward_packed(dy)
        g = layer.grads()
    # Up to GEMM rounding (the BLAS kernel may round the rows at the edge of a block differently), with
    # the same dropout masks: fp64 within 1e-11 per sequence, where another mask is off by O(1).
    def rel(a, b):
        return np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-300)

    assert np.isfinite(y).all() and np.isfinite(dx).all()
    for b, n in enumerate(lengths):
        assert rel(y[cu[b]:cu[b + 1]], yp[b, :n]) <= 1e-11, b
        assert rel(dx[cu[b]:cu[b + 1]], dxp[b, :n]) <= 1e-11, b
    for name in dst.PARAM_NAMES:
        assert rel(g[name], gp[name]) <= 1e-11, name


def test_packed_bad_offsets_raise(ctx, rng):
    with dst.Layer(ctx, small_config()) as layer:
        x = rng.standard_normal((6, 16))
        with pytest.raises(ValueError, match="cu_seqlens"):
            layer.forward_packed(x, np.array([0, 2, 5], dtype=np.int32), max_seqlen=8)  # ends at 5, not N = 6
        with pytest.raises(TypeError, match="cu_seqlens"):
            layer.forward_packed(x, np.array([0.0, 6.0]), max_seqlen=8)
        with pytest.raises(ValueError, match=r"\[N, 16\]"):
            layer.forward_packed(rng.standard_normal((2, 3, 16)), np.array([0, 6], dtype=np.int32))
        with pytest.raises(dst.StateError, match="packed"):
            layer.forward(x.reshape(1, 6, 16))
            layer.backward_packed(x)
