"""dstransformer.torch.TransformerLayer against a plain PyTorch implementation of the same layer.

Skipped when torch is absent. CPU tests use the CPU backend (fp32, fp64); CUDA tests (fp32, fp16, bf16) run
when torch sees a GPU and the library was built with CUDA. Tolerances (relative L2 per tensor, reference
in fp64 from the same rounded inputs and weights): fp64 1e-10, fp32 1e-5, fp16 1e-3, bf16 1e-2. The 5-step
AdamW training of a 4-layer stack (fp32, dropout 0) must give every loss within 1e-4 (relative) of the plain
implementation's.
"""

import copy
import math

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn
F = torch.nn.functional

import dstransformer as dst  # noqa: E402
from dstransformer.torch import TransformerConfig, TransformerLayer  # noqa: E402

TOL = {torch.float64: 1e-10, torch.float32: 1e-5, torch.float16: 1e-3, torch.bfloat16: 1e-2}
NAMES = {torch.float64: "fp64", torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}
HAVE_CUDA = torch.cuda.is_available() and dst.cuda_device_count() > 0


def cases():
    out = [("cpu", torch.float32), ("cpu", torch.float64)]
    for dt in (torch.float32, torch.float16, torch.bfloat16):
        out.append(pytest.param("cuda", dt, marks=pytest.mark.skipif(not HAVE_CUDA, reason="no CUDA device")))
    return out


class RefLayer(nn.Module):
    """The same layer written with plain PyTorch modules (docs/api.md, "What a layer computes"), no dropout."""

    def __init__(self, H, heads, I, pre_ln, eps):
        super().__init__()
        self.heads, self.pre_ln = heads, pre_ln
        self.qkv = nn.Linear(H, 3 * H)
        self.attn_out = nn.Linear(H, H)
        self.attn_ln = nn.LayerNorm(H, eps=eps)
        self.inter = nn.Linear(H, I)
        self.out = nn.Linear(I, H)
        self.norm = nn.LayerNorm(H, eps=eps)

    MAP = {"attn_qkvw": "qkv.weight", "attn_qkvb": "qkv.bias", "attn_ow": "attn_out.weight",
           "attn_ob": "attn_out.bias", "attn_nw": "attn_ln.weight", "attn_nb": "attn_ln.bias",
           "inter_w": "inter.weight", "inter_b": "inter.bias", "output_w": "out.weight", "output_b": "out.bias",
           "norm_w": "norm.weight", "norm_b": "norm.bias"}

    def load_deepspeed(self, sd):
        own = dict(self.named_parameters())
        with torch.no_grad():
            for ds_name, name in self.MAP.items():
                own[name].copy_(sd[ds_name])

    def grads(self):
        own = dict(self.named_parameters())
        return {ds: own[name].grad for ds, name in self.MAP.items()}

    def forward(self, x, mask=None):
        B, S, H = x.shape
        d = H // self.heads
        h = self.norm(x) if self.pre_ln else x
        q, k, v = self.qkv(h).split(H, dim=-1)
        q, k, v = (t.view(B, S, self.heads, d).transpose(1, 2) for t in (q, k, v))
        scores = q @ k.transpose(-1, -2) / math.sqrt(d)
        if mask is not None:
            scores = scores + mask.reshape(B, 1, 1, S).to(scores.dtype)
        probs = torch.softmax(scores, dim=-1)
        ctx = (probs @ v).transpose(1, 2).reshape(B, S, H)
        r = x + self.attn_out(ctx)
        h2 = self.attn_ln(r)
        f = self.out(F.gelu(self.inter(h2)))
        return r + f if self.pre_ln else self.norm(h2 + f)


def flat_grad(layer):
    """The twelve gradients of a TransformerLayer, concatenated in DeepSpeed's order."""
    return torch.cat([p.grad.reshape(-1) for p in layer.parameters()]).clone()


def clear_grads(module):
    for p in module.parameters():
        p.grad = None


def rel(a, b):
    a, b = a.detach().double(), b.detach().double()
    n = b.norm().item()
    return (a - b).norm().item() / (n if n > 0 else 1.0)


def make_config(torch_dtype, **kw):
    base = dict(batch_size=4, max_seq_length=40, hidden_size=64, intermediate_size=96, heads=4,
                attn_dropout_ratio=0.0, hidden_dropout_ratio=0.0, num_hidden_layers=2, initializer_range=0.05,
                seed=7, pre_layer_norm=True, dtype=NAMES[torch_dtype])
    base.update(kw)
    return TransformerConfig(**base)


def randomize_(layer, gen_seed=0):
    g = torch.Generator().manual_seed(gen_seed)
    sd = layer.state_dict()
    new = {}
    for k, v in sd.items():
        r = torch.randn(v.shape, generator=g, dtype=torch.float64) * 0.2
        if k in ("attn_nw", "norm_w"):
            r = 1.0 + r
        new[k] = r.to(v.dtype)
    layer.load_state_dict(new)


def padding_mask(B, S, device, dtype=torch.float32):
    m = torch.zeros(B, 1, 1, S, dtype=dtype, device=device)
    for b in range(B):
        m[b, ..., S - 3 * b:] = -10000.0 if b else 0.0
    return m


@pytest.mark.parametrize("pre_ln", [True, False])
@pytest.mark.parametrize("device,dtype", cases())
def test_matches_plain_pytorch(device, dtype, pre_ln, figures):
    torch.manual_seed(0)
    cfg = make_config(dtype, pre_layer_norm=pre_ln)
    layer = TransformerLayer(cfg, device=device)
    randomize_(layer)
    B, S, H = 3, 37, 64
    x = torch.randn(B, S, H, device=device).to(dtype).requires_grad_()
    mask = padding_mask(B, S, device)
    w = torch.randn(B, S, H, device=device, dtype=torch.float64)
    y = layer(x, mask)
    assert y.dtype == dtype and y.shape == x.shape
    (y.double() * w).sum().backward()

    ref = RefLayer(H, 4, 96, pre_ln, cfg.layer_norm_eps).to(device=device, dtype=torch.float64)
    ref.load_deepspeed({k: v.double() for k, v in layer.state_dict().items()})
    x64 = x.detach().double().requires_grad_()
    y_ref = ref(x64, mask.double())
    (y_ref * w).sum().backward()

    tol = TOL[dtype]
    errors = {"output": rel(y, y_ref), "dX": rel(x.grad, x64.grad)}
    for name, g in ref.grads().items():
        errors[name] = rel(layer.param_grad(name), g)
    bounds = {k: tol for k in errors}
    if dtype in (torch.float16, torch.bfloat16):
        # A whole layer forward and backward in 16 bits reaches the tests/common/bounds.h bound on its
        # deepest gradients whoever computes it. The rule for fused GEMM chains then: no worse than twice
        # the plain PyTorch layer in the same dtype, where that is above the bound (per tensor).
        naive = RefLayer(H, 4, 96, pre_ln, cfg.layer_norm_eps).to(device=device, dtype=dtype)
        naive.load_deepspeed({k: v.to(dtype) for k, v in layer.state_dict().items()})
        xn = x.detach().clone().requires_grad_()
        (naive(xn, mask.to(dtype)).double() * w).sum().backward()
        nerr = {"output": rel(naive(xn, mask.to(dtype)), y_ref), "dX": rel(xn.grad, x64.grad)}
        for name, g in ref.grads().items():
            nerr[name] = rel(naive.grads()[name], g)
        bounds = {k: max(tol, 2.0 * nerr[k]) for k in errors}
    worst = max(errors, key=lambda k: errors[k] / bounds[k])
    figures.append("TransformerLayer vs plain PyTorch fp64, %s %-14s %s-LN: output %.2e, dX %.2e, worst %s "
                   "%.2e (bound %.1e)" % (device, str(dtype).replace("torch.", ""), "pre" if pre_ln else "post",
                                          errors["output"], errors["dX"], worst, errors[worst], bounds[worst]))
    bad = {k: (v, bounds[k]) for k, v in errors.items() if not v <= bounds[k]}
    assert not bad, f"relative L2 errors above their bounds (error, bound): {bad}"


@pytest.mark.parametrize("device,dtype", cases()[:1] + cases()[2:3])
def test_masks_and_return_tuple(device, dtype):
    cfg = make_config(dtype, return_tuple=True)
    layer = TransformerLayer(cfg, device=device).eval()
    B, S = 3, 11
    x = torch.randn(B, S, 64, device=device, dtype=dtype)
    lengths = torch.tensor([11, 4, 7], dtype=torch.int32, device=device)
    add = torch.zeros(B, S, device=device)
    for b, n in enumerate(lengths.tolist()):
        add[b, n:] = -10000.0
    with torch.no_grad():
        (y4,) = layer(x, add.view(B, 1, 1, S))
        (y2,) = layer(x, add)
        (yl,) = layer(x, lengths)
        (yn,) = layer(x)
    assert torch.equal(y4, y2)
    assert rel(yl, y4) < 1e-6
    assert rel(yn, y4) > 1e-3
    with pytest.raises(ValueError, match="attention_mask: shape"):
        layer(x, add.view(B, 1, S))
    with pytest.raises(TypeError, match="boolean"):
        layer(x, add.bool())
    with pytest.raises(TypeError, match="dtype"):
        layer(x.double() if dtype != torch.float64 else x.float())


def test_layer_id_state_dict_and_initial_weights():
    first = TransformerLayer.layer_id
    cfg = make_config(torch.float32)
    a = TransformerLayer(cfg, device="cpu")
    b = TransformerLayer(cfg, device="cpu")
    # as in DeepSpeed, the shared config object ends up with the last id
    assert (a._my_layer_id, b._my_layer_id, a.config.layer_id, TransformerLayer.layer_id) == (
        first, first + 1, first + 1, first + 2)
    assert not torch.equal(a.attn_qkvw, b.attn_qkvw)  # per-layer weight seeds
    sd = a.state_dict()
    assert list(sd) == list(dst.PARAM_NAMES)
    assert sd["attn_qkvw"].shape == (192, 64) and sd["inter_w"].shape == (96, 64)
    # the twelve DeepSpeed parameters, each an nn.Parameter viewing the one arena the native layer binds
    named = dict(a.named_parameters())
    assert list(named) == list(dst.PARAM_NAMES)
    arena = a.flat_params
    assert not isinstance(arena, nn.Parameter)
    for name, p in named.items():
        off, n, shape = a._layout.entries[name]
        assert tuple(p.shape) == tuple(shape) and p.is_leaf and p.requires_grad, name
        assert p.data_ptr() == arena.data_ptr() + off * arena.element_size(), name
    assert a.native.param_arena_ptr == arena.data_ptr()
    # the BERT script's no-decay grouping finds the biases and LayerNorm parameters by name
    no_decay = ["bias", "LayerNorm.bias", "LayerNorm.weight", "attn_nw", "attn_nb", "norm_w", "norm_b",
                "attn_qkvb", "attn_ob", "inter_b", "output_b"]
    decay = [n for n, _ in nn.Sequential(a).named_parameters() if not any(nd in n for nd in no_decay)]
    assert decay == ["0.attn_qkvw", "0.attn_ow", "0.inter_w", "0.output_w"]
    b.load_state_dict(sd)
    assert all(torch.equal(b.state_dict()[k], sd[k]) for k in sd)
    with pytest.raises(RuntimeError, match="Unexpected"):
        b.load_state_dict({**sd, "bogus": torch.zeros(1)})
    with pytest.raises(RuntimeError, match="Missing"):
        b.load_state_dict({k: v for k, v in sd.items() if k != "norm_b"})
    # nested: keys get the submodule prefix
    seq = nn.Sequential(a)
    assert "0.attn_ow" in seq.state_dict()
    # DeepSpeed's test constructor: 8 weights and 8 biases, QKV bias forced to zero
    H, I = 64, 96
    ws = [torch.randn(H, H), torch.randn(H, H), torch.randn(H, H), torch.randn(H, H), torch.rand(H),
          torch.randn(I, H), torch.randn(H, I), torch.rand(H)]
    bs = [torch.randn(H), torch.randn(H), torch.randn(H), torch.randn(H), torch.randn(H), torch.randn(I),
          torch.randn(H), torch.randn(H)]
    c = TransformerLayer(cfg, [nn.Parameter(w) for w in ws], [nn.Parameter(v) for v in bs], device="cpu")
    assert torch.equal(c.attn_qkvw, torch.cat(ws[:3]))
    assert not c.attn_qkvb.any()
    assert torch.equal(c.output_w, ws[6]) and torch.equal(c.norm_b, bs[7])
    # assigning a DeepSpeed name copies into the arena
    c.attn_ob = torch.ones(H)
    assert torch.equal(c.attn_ob, torch.ones(H))
    assert c.native.param("attn_ob").sum() == H


def test_dropout_train_eval_and_no_grad():
    cfg = make_config(torch.float32, attn_dropout_ratio=0.3, hidden_dropout_ratio=0.3)
    layer = TransformerLayer(cfg, device="cpu")
    x = torch.randn(2, 9, 64)
    layer.train()
    assert layer.native.training
    y1, y2 = layer(x), layer(x)
    assert not torch.equal(y1, y2)
    with torch.no_grad():  # DeepSpeed: dropout only when training AND grad is enabled
        n1, n2 = layer(x), layer(x)
    assert torch.equal(n1, n2)
    layer.eval()
    assert not layer.native.training
    e1, e2 = layer(x), layer(x)
    assert torch.equal(e1, e2) and torch.equal(e1, n1)
    xr = x.clone().requires_grad_()
    with pytest.raises(RuntimeError, match="training-mode forward"):
        layer(xr).sum().backward()


def test_several_forwards_in_flight_and_deepcopy():
    cfg = make_config(torch.float64)
    layer = TransformerLayer(cfg, device="cpu")
    randomize_(layer, 3)
    xa = torch.randn(2, 5, 64, dtype=torch.float64, requires_grad=True)
    xb = torch.randn(3, 8, 64, dtype=torch.float64, requires_grad=True)
    ya, yb = layer(xa), layer(xb)
    yb.square().sum().backward()
    gb = flat_grad(layer)
    clear_grads(layer)
    ya.sum().backward()
    ga = flat_grad(layer)
    # one at a time gives the same
    clear_grads(layer)
    layer(xb.detach()).square().sum().backward()
    assert torch.allclose(flat_grad(layer), gb, rtol=1e-12, atol=1e-14)
    # a second backward adds into the same gradient tensors, in place
    ptrs = [p.grad.data_ptr() for p in layer.parameters()]
    layer(xb.detach()).square().sum().backward()
    assert [p.grad.data_ptr() for p in layer.parameters()] == ptrs
    assert torch.allclose(flat_grad(layer), 2 * gb, rtol=1e-12, atol=1e-14)
    # deepcopy: an independent layer with the same values, its parameters views into its own arena
    twin = copy.deepcopy(layer)
    assert twin.flat_params.data_ptr() != layer.flat_params.data_ptr()
    assert twin.attn_ow.data_ptr() - twin.flat_params.data_ptr() == \
        layer.attn_ow.data_ptr() - layer.flat_params.data_ptr()
    assert all(p.grad is None for p in twin.parameters())
    ya2 = twin(xa.detach())
    assert torch.equal(ya2, ya.detach())
    ya2.sum().backward()
    assert torch.allclose(flat_grad(twin), ga, rtol=1e-12, atol=1e-14)
    with torch.no_grad():
        twin.flat_params.add_(1.0)
    assert not torch.equal(twin(xa.detach()), layer(xa.detach()))
    # pickling (torch.save of a module) drops the native layer; it is rebuilt on the next call
    import pickle

    clone = pickle.loads(pickle.dumps(layer))
    assert torch.equal(clone(xa.detach()), layer(xa.detach()))


def test_backward_keeps_the_saved_activations_for_the_next_forward():
    # Freeing device memory makes the device wait (cudaFree synchronises), so a backward hands its
    # forward's saved activations back to the module, and the next forward reuses them.
    cfg = make_config(torch.float64)
    layer = TransformerLayer(cfg, device="cpu")
    randomize_(layer, 3)
    x = torch.randn(2, 5, 64, dtype=torch.float64)
    layer(x).square().sum().backward()
    pool = layer._saved_pool
    assert len(pool) == 1
    kept = pool[0]
    held = kept.nbytes
    assert held > 0, "the kept object still holds its memory"
    g1 = flat_grad(layer)
    clear_grads(layer)
    y = layer(x)
    assert layer._saved_pool == [], "the forward took the kept object"
    y.square().sum().backward()
    assert layer._saved_pool == [kept] and kept.nbytes == held
    assert torch.equal(flat_grad(layer), g1)
    # Two forwards in flight take two objects, and give both back.
    clear_grads(layer)
    ya, yb = layer(x), layer(x * 2)
    assert layer._saved_pool == []
    (ya.sum() + yb.sum()).backward()
    assert len(layer._saved_pool) == 2 and kept in layer._saved_pool
    # Inference takes none.
    with torch.no_grad():
        layer(x)
    assert len(layer._saved_pool) == 2
    layer.free_saved_memory()
    assert layer._saved_pool == []
    with pytest.raises(ValueError, match="closed"):
        kept.handle
    layer(x).sum().backward()  # a new object again
    assert len(layer._saved_pool) == 1 and layer._saved_pool[0] is not kept
    # The kept objects make no reference cycle: the native layer goes with the module, without the
    # cyclic garbage collector.
    import gc
    import weakref

    native = weakref.ref(layer._native)
    del y, ya, yb, kept, pool
    gc.disable()
    try:
        del layer
        assert native() is None
    finally:
        gc.enable()


def test_dtype_conversion_capacity_growth_and_alignment():
    cfg = make_config(torch.float32, max_seq_length=8, batch_size=1)
    layer = TransformerLayer(cfg, device="cpu").eval()
    x = torch.randn(2, 20, 64)  # larger than the configured capacity: the native layer grows
    y32 = layer(x)
    layer.double()
    assert layer.flat_params.dtype == torch.float64
    y64 = layer(x.double())  # the native layer follows: fp64, repacked and 256-byte aligned
    assert layer.flat_params.data_ptr() % 256 == 0 and layer.native.dtype == "fp64"
    assert rel(y32, y64) < 1e-5
    for name, p in layer.named_parameters():  # still views into the converted arena
        assert p.dtype == torch.float64
        assert p.data_ptr() == layer.flat_params.data_ptr() + layer._layout.entries[name][0] * 8, name
    # a misaligned replacement of the arena is realigned before use
    arena = layer.flat_params
    raw = torch.zeros(arena.numel() + 1, dtype=arena.dtype)
    raw[1:].copy_(arena)
    layer._set_arena(raw[1:])
    assert layer.flat_params.data_ptr() % 256 != 0
    assert torch.equal(layer(x.double()), y64)
    assert layer.flat_params.data_ptr() % 256 == 0
    # a parameter whose .data other code replaced is copied back into the arena at the next call
    q = layer.inter_w
    q.data = q.data.clone() * 0.5
    assert q.data_ptr() != layer.flat_params.data_ptr() + layer._layout.entries["inter_w"][0] * 8
    y_half = layer(x.double())
    assert not torch.equal(y_half, y64)
    assert q.data_ptr() == layer.flat_params.data_ptr() + layer._layout.entries["inter_w"][0] * 8
    assert torch.equal(torch.as_tensor(layer.native.param("inter_w")), q.detach())


def build_stacks(device, n_layers=4, pre_ln=True):
    cfg = make_config(torch.float32, num_hidden_layers=n_layers, pre_layer_norm=pre_ln)
    ours = nn.ModuleList([TransformerLayer(cfg, device=device) for _ in range(n_layers)])
    ref = nn.ModuleList([RefLayer(64, 4, 96, pre_ln, cfg.layer_norm_eps) for _ in range(n_layers)]).to(device)
    for o, r in zip(ours, ref):
        r.load_deepspeed(o.state_dict())
    return ours, ref


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not HAVE_CUDA,
                                                                                        reason="no CUDA device"))])
def test_adamw_training_matches_plain_pytorch(device, figures):
    torch.manual_seed(5)
    ours, ref = build_stacks(device)
    opt_o = torch.optim.AdamW(ours.parameters(), lr=1e-3, weight_decay=0.01)
    opt_r = torch.optim.AdamW(ref.parameters(), lr=1e-3, weight_decay=0.01)
    B, S = 4, 24
    mask = padding_mask(B, S, device)
    losses = []
    for step in range(5):
        x = torch.randn(B, S, 64, device=device)
        target = torch.randn(B, S, 64, device=device)
        out = []
        for model, opt in ((ours, opt_o), (ref, opt_r)):
            h = x
            for layer in model:
                h = layer(h, mask)
            loss = F.mse_loss(h, target)
            opt.zero_grad()
            loss.backward()
            opt.step()
            out.append(loss.item())
        losses.append(out)
    figures.append("4-layer AdamW, %s: losses ours/plain %s; largest relative difference %.1e" % (
        device, " ".join("%.5f/%.5f" % (lo, lr_) for lo, lr_ in losses),
        max(abs(lo - lr_) / abs(lr_) for lo, lr_ in losses)))
    for step, (lo, lr_) in enumerate(losses):
        assert abs(lo - lr_) <= 1e-4 * abs(lr_), f"step {step}: ours {lo}, plain {lr_}"
    assert losses[-1][0] < losses[0][0]  # it trains


@pytest.mark.skipif(not HAVE_CUDA, reason="no CUDA device")
def test_cuda_side_stream_and_local_rank():
    cfg = make_config(torch.float16, local_rank=0)
    layer = TransformerLayer(cfg)  # local_rank selects cuda:0
    assert layer.flat_params.device == torch.device("cuda", 0)
    x = torch.randn(2, 16, 64, device="cuda", dtype=torch.float16)
    y_main = layer.eval()(x)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        y_side = layer(x)
        assert layer.native.context.stream == s.cuda_stream
    torch.cuda.current_stream().wait_stream(s)
    assert torch.equal(y_main, y_side)
    # raw Layer API on CUDA with torch tensors: no copies, results as torch tensors; it runs on the
    # context's stream, so point that at torch's (default) stream first
    native = layer.native
    native.context.set_stream(torch.cuda.current_stream().cuda_stream or dst.Context.LEGACY_DEFAULT_STREAM)
    y = native.forward(x)
    assert isinstance(y, torch.Tensor) and y.is_cuda and torch.equal(y, y_main)
    v = native.param_view("attn_ow")
    assert torch.equal(torch.as_tensor(v, device="cuda"), layer.attn_ow)


def test_graph_forwards_take_kept_objects_for_the_graph_alone():
    # A forward captured into a CUDA graph cannot allocate, and the graph's replays write and read its
    # saved activations: it takes an object an eager backward kept, which then belongs to the graph.
    # The bookkeeping (the capture itself is test_cuda_graph_capture_of_training_steps).
    layer = TransformerLayer(make_config(torch.float64), device="cpu")
    native = layer.native
    with pytest.raises(RuntimeError, match="before capturing"):
        layer._take_saved(native, graph=True)  # nothing kept yet
    x = torch.randn(2, 5, 64, dtype=torch.float64)
    layer(x).sum().backward()
    kept = layer._saved_pool[0]
    assert layer._take_saved(native, graph=True) is kept
    assert layer._saved_pool == [] and layer._graph_saved == [kept]
    layer(x).sum().backward()  # eager steps use other objects
    assert len(layer._saved_pool) == 1 and layer._saved_pool[0] is not kept
    layer.free_saved_memory()
    assert layer._graph_saved == [kept] and kept.nbytes > 0, "the graph's object outlives free_saved_memory()"
    layer.free_saved_memory(graphs=True)
    assert layer._graph_saved == []
    with pytest.raises(ValueError, match="closed"):
        kept.handle
    assert copy.deepcopy(layer)._graph_saved == []


def test_captured_steps_keep_their_objects_and_failed_ones_give_them_back(monkeypatch):
    # The autograd function's side of the graph objects, on the CPU backend with the capture test
    # answering yes: a "captured" step's backward does not return its object to the pool, and a
    # "captured" forward that the library refuses (here: a key length beyond S) gives it back.
    import dstransformer.torch as dtorch

    layer = TransformerLayer(make_config(torch.float64), device="cpu")
    x = torch.randn(2, 5, 64, dtype=torch.float64)
    layer(x).sum().backward()  # the warm-up step
    kept = layer._saved_pool[0]
    monkeypatch.setattr(dtorch, "_capturing", lambda t: True)
    with pytest.raises(dst.DstError, match="key-length"):
        layer(x, torch.tensor([5, 6], dtype=torch.int32))
    assert layer._saved_pool == [kept] and layer._graph_saved == []
    layer(x).sum().backward()
    assert layer._saved_pool == [] and layer._graph_saved == [kept]
    with pytest.raises(RuntimeError, match="warm-up"):
        layer(x)  # a second captured forward: nothing kept for it
    with pytest.raises(RuntimeError, match="pass max_seqlen"):
        layer(x.reshape(10, 64), cu_seqlens=torch.tensor([0, 4, 10]))  # the offsets' maximum would be read
    monkeypatch.undo()
    layer.free_saved_memory(graphs=True)


@pytest.mark.skipif(not HAVE_CUDA, reason="no CUDA device")
@pytest.mark.parametrize("dropout", [0.0, 0.1])
def test_cuda_graph_capture_of_training_steps(dropout):
    # A 2-layer stack's training step (forward, loss, backward) captured with torch.cuda.graph after
    # warm-up steps on a side stream, as PyTorch's documentation does it. Without dropout a replay gives
    # the loss and every gradient of an eager step bit for bit (the backward is deterministic); with
    # dropout each replay draws new masks from the context's graph dropout counter (docs/rng.md), two per
    # replay here. Eager steps between replays use other saved-activation objects than the graph's.
    torch.manual_seed(0)
    cfg = make_config(torch.float16, attn_dropout_ratio=dropout, hidden_dropout_ratio=dropout)
    stack = [TransformerLayer(cfg) for _ in range(2)]
    for i, layer in enumerate(stack):
        randomize_(layer, 20 + i)
    params = [p for layer in stack for p in layer.parameters()]
    x = torch.randn(3, 40, 64, device="cuda", dtype=torch.float16)
    lens = torch.tensor([40, 17, 1], dtype=torch.int32, device="cuda")

    def step():
        h = x
        for layer in stack:
            h = layer(h, lens)
        loss = h.float().square().mean()
        loss.backward()
        return loss

    def clear():
        for p in params:
            p.grad = None

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            clear()
            step()
    torch.cuda.current_stream().wait_stream(side)
    clear()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_loss = step()
    static_grads = [p.grad for p in params]
    owned = [layer._graph_saved[0] for layer in stack]
    assert all(len(layer._graph_saved) == 1 for layer in stack)
    ctx = stack[0].native.context
    counter = ctx.rng_graph_counter
    results = []
    for _ in range(2):
        graph.replay()
        torch.cuda.synchronize()
        results.append((static_loss.clone(), [g.clone() for g in static_grads]))
        clear()  # an eager step between replays
        eager_loss = step()
        torch.cuda.synchronize()
        assert all(o not in layer._saved_pool for o, layer in zip(owned, stack))
        assert torch.isfinite(results[-1][0]) and all(torch.isfinite(g).all() for g in results[-1][1])
        if dropout == 0.0:
            assert torch.equal(results[-1][0], eager_loss), "the replay's loss differs from an eager step's"
            for g, p in zip(results[-1][1], params):
                assert torch.equal(g, p.grad), "a replay's gradient differs from an eager step's"
    if dropout:
        assert not torch.equal(results[0][0], results[1][0]), "two replays drew the same masks"
        assert ctx.rng_graph_counter == counter + 4, "two replays of two captured forwards"
    for layer in stack:
        layer.free_saved_memory(graphs=True)


@pytest.mark.skipif(not HAVE_CUDA, reason="no CUDA device")
def test_cuda_make_graphed_callables_matches_eager():
    # torch.cuda.make_graphed_callables captures the forward and the backward as two graphs (after its
    # own warm-up); a call through them gives the output and every gradient of an eager call of a copy
    # of the layer, bit for bit (no dropout, deterministic backward).
    torch.manual_seed(1)
    layer = TransformerLayer(make_config(torch.float16))
    randomize_(layer, 31)
    ref = copy.deepcopy(layer)
    x = torch.randn(3, 40, 64, device="cuda", dtype=torch.float16, requires_grad=True)
    lens = torch.tensor([40, 9, 33], dtype=torch.int32, device="cuda")
    graphed = torch.cuda.make_graphed_callables(layer, (x, lens))
    assert len(layer._graph_saved) == 1
    for _ in range(2):
        for m in (layer, ref):
            clear_grads(m)
        xg, xr = x.detach().clone().requires_grad_(), x.detach().clone().requires_grad_()
        yg, yr = graphed(xg, lens), ref(xr, lens)
        yg.float().square().sum().backward()
        yr.float().square().sum().backward()
        torch.cuda.synchronize()
        assert torch.equal(yg, yr)
        assert torch.equal(xg.grad, xr.grad)
        assert torch.equal(flat_grad(layer), flat_grad(ref))
    layer.free_saved_memory(graphs=True)


@pytest.mark.skipif(not HAVE_CUDA, reason="no CUDA device")
def test_cuda_raw_api_dlpack_and_device_arrays():
    import numpy as np

    with dst.Context("cuda", 0) as ctx:
        ctx.set_stream(dst.Context.LEGACY_DEFAULT_STREAM)  # torch's default stream
        cfg = make_config(torch.bfloat16)
        layer = dst.Layer(ctx, cfg).eval()
        x = torch.randn(2, 8, 64, device="cuda", dtype=torch.bfloat16)
        y = layer.forward(x)  # bf16 has no __cuda_array_interface__ in torch: goes through __dlpack__
        assert isinstance(y, torch.Tensor) and y.dtype == torch.bfloat16 and y.shape == x.shape
        # DeviceArray in, DeviceArray out (no torch involved), host copies agree
        x32 = np.random.default_rng(0).standard_normal((2, 8, 64)).astype(np.float32)
        layer32 = dst.Layer(ctx, make_config(torch.float32)).eval()
        dx = ctx.to_context(x32)
        dy = layer32.forward(dx)
        assert isinstance(dy, dst.DeviceArray) and dy.shape == (2, 8, 64)
        ty = layer32.forward(torch.as_tensor(x32, device="cuda"))
        torch.cuda.synchronize()
        assert np.array_equal(dy.to_numpy(), ty.cpu().numpy())
        assert layer32.param("attn_ow").shape == (64, 64)  # host copies work on CUDA layers too
        with pytest.raises(TypeError, match="host"):
            layer32.forward(x32)
        layer.close()
        layer32.close()


@pytest.mark.parametrize("device,dtype", cases())
def test_standalone_layernorm_matches_torch(device, dtype, figures):
    """Context.layernorm_forward/backward on torch tensors (device memory on CUDA, no copies) against
    torch's layer_norm in fp64 on the same rounded values."""
    torch.manual_seed(3)
    B, S, H, eps = 3, 29, 96, 1e-12
    x = (torch.randn(B, S, H, dtype=torch.float64) * 2 + 0.5).to(device=device, dtype=dtype)
    g = (1 + 0.3 * torch.randn(H, dtype=torch.float64)).to(device=device, dtype=dtype)
    b = (0.3 * torch.randn(H, dtype=torch.float64)).to(device=device, dtype=dtype)
    dy = torch.randn(B, S, H, dtype=torch.float64).to(device=device, dtype=dtype)
    with dst.Context("cuda" if device == "cuda" else "cpu", 0) as ctx:
        if device == "cuda":
            ctx.set_stream(torch.cuda.current_stream().cuda_stream)
        y, stats = ctx.layernorm_forward(x, g, b, eps)
        dx, dg, db = ctx.layernorm_backward(dy, x, g, b, stats)
        if device == "cuda":
            ctx.synchronize()
    if device == "cuda":  # outputs where the inputs live; a CPU context returns NumPy arrays
        assert isinstance(y, torch.Tensor) and y.dtype == dtype and y.device == x.device
        assert isinstance(dg, torch.Tensor) and stats.dtype == torch.float32
    else:
        y, stats, dx, dg, db = (torch.as_tensor(a) for a in (y, stats, dx, dg, db))
        assert y.dtype == dtype and stats.dtype == (torch.float64 if dtype == torch.float64 else torch.float32)
    assert tuple(stats.shape) == (2, B * S)
    x64, g64, b64 = (t.detach().double().cpu().requires_grad_() for t in (x, g, b))
    y64 = torch.nn.functional.layer_norm(x64, (H,), g64, b64, eps)
    y64.backward(dy.double().cpu())
    errors = {"y": rel(y.cpu(), y64), "dx": rel(dx.cpu(), x64.grad), "dgamma": rel(dg.cpu(), g64.grad),
              "dbeta": rel(db.cpu(), b64.grad)}
    figures.append("standalone LayerNorm vs torch fp64, %s %s: %s" % (
        device, str(dtype).replace("torch.", ""), ", ".join("%s %.1e" % kv for kv in errors.items())))
    tol = TOL[dtype]
    assert all(e <= tol for e in errors.values()), errors


# ---- DeepSpeed's test hook: forward(..., grads=list) -----------------------------------------------------------

HOOK_NAMES = ["V_W", "V_B", "O_W", "O_B", "N2_W", "N2_B", "int_W", "int_B", "out_W", "out_B", "norm_W", "norm_B"]


def _hooked(name, g, H):
    """What DeepSpeed appends for parameter ``name`` given its full gradient ``g``: the V rows of the QKV ones."""
    return g[2 * H:3 * H] if name in ("attn_qkvw", "attn_qkvb") else g


@pytest.mark.parametrize("pre_ln", [True, False])
@pytest.mark.parametrize("device,dtype", [("cpu", torch.float64),
                                          pytest.param("cuda", torch.float32, marks=pytest.mark.skipif(
                                              not HAVE_CUDA, reason="no CUDA device"))])
def test_grads_hook_order_names_and_values(device, dtype, pre_ln):
    """A stack used as DeepSpeed's backward test uses it (grads= on every layer, a "hidden_state" hook on every
    output): per layer, last first, the test's hidden_state entry and then the 12 of GRAD_HOOK_NAMES; the
    values are the layer's own gradients and agree with a plain PyTorch stack in fp64."""
    from dstransformer.torch import GRAD_HOOK_NAMES

    assert [n for _, n in GRAD_HOOK_NAMES] == HOOK_NAMES
    assert [p for p, _ in GRAD_HOOK_NAMES] == list(dst.PARAM_NAMES)
    torch.manual_seed(11)
    L, B, S, H = 3, 2, 7, 64
    cfg = make_config(dtype, pre_layer_norm=pre_ln, num_hidden_layers=L)
    layers = [TransformerLayer(cfg, device=device) for _ in range(L)]
    for i, layer in enumerate(layers):
        randomize_(layer, 20 + i)
    x = torch.randn(B, S, H, device=device, dtype=torch.float64)
    w = torch.randn(B, S, H, device=device, dtype=torch.float64)
    mask = padding_mask(B, S, device)

    grads = []
    h = x.to(dtype).requires_grad_()
    for layer in layers:
        h = layer(h, mask, grads=grads)
        h.register_hook(lambda g: grads.append([g, "hidden_state"]))
    assert grads == []  # nothing before the backward
    (h.double() * w).sum().backward()

    assert [n for _, n in grads] == (["hidden_state"] + HOOK_NAMES) * L
    assert all(type(e) is list and len(e) == 2 and isinstance(e[0], torch.Tensor) for e in grads)
    # the k-th entry of a name (the key DeepSpeed's check_equal uses) belongs to the k-th layer from the end
    for k, layer in enumerate(reversed(layers)):
        block = grads[13 * k + 1:13 * k + 13]
        for (param, name), (got, got_name) in zip(GRAD_HOOK_NAMES, block):
            want = _hooked(param, layer.param_grad(param), H)
            assert got_name == name and got.dtype == dtype and got.device == x.device
            assert got.shape == want.shape and torch.equal(got, want), name
        assert block[0][0].shape == (H, H) and block[1][0].shape == (H,)

    # the same values from a plain PyTorch stack in fp64 (V rows really are rows 2H..3H)
    refs = []
    for layer in layers:
        ref = RefLayer(H, 4, 96, pre_ln, cfg.layer_norm_eps).to(device=device, dtype=torch.float64)
        ref.load_deepspeed({k: v.double() for k, v in layer.state_dict().items()})
        refs.append(ref)
    ref_hidden = []
    r = x.clone().requires_grad_()
    for ref in refs:
        r = ref(r, mask.double())
        r.register_hook(lambda g: ref_hidden.append(g))
    (r * w).sum().backward()
    tol = TOL[dtype]
    for k, ref in enumerate(reversed(refs)):
        block = grads[13 * k:13 * k + 13]
        assert rel(block[0][0], ref_hidden[k]) <= tol, ("hidden_state", k)
        for (param, name), (got, _) in zip(GRAD_HOOK_NAMES, block[1:]):
            assert rel(got, _hooked(param, ref.grads()[param], H)) <= tol, (name, k)


def test_grads_hook_is_per_call_and_checks_its_argument():
    cfg = make_config(torch.float64)
    layer = TransformerLayer(cfg, device="cpu")
    randomize_(layer, 4)
    x = torch.randn(2, 5, 64, dtype=torch.float64)
    grads = []
    layer(x, grads=grads)  # no backward for this call: nothing appended
    with torch.no_grad():
        layer(x, grads=grads)
    assert grads == []

    layer(x, grads=grads).sum().backward()
    assert [n for _, n in grads] == HOOK_NAMES
    first = [t.clone() for t, _ in grads]
    # a second call appends its own gradients; the first ones stay as they were although .grad accumulates
    layer(2 * x, grads=grads).square().sum().backward()
    assert [n for _, n in grads] == HOOK_NAMES * 2
    assert all(torch.equal(a, t) for a, (t, _) in zip(first, grads[:12]))
    assert not torch.equal(grads[2][0], grads[14][0])
    total = layer.param_grad("attn_ow")
    assert torch.allclose(grads[2][0] + grads[14][0], total, rtol=1e-12, atol=1e-12)
    # copies: writing the layer's gradient buffer (still bound to the native layer) leaves them alone
    layer.native.zero_grads()
    assert all(t.abs().sum() > 0 for t, _ in grads[12:])
    # a call without grads= appends nothing
    layer(x).sum().backward()
    assert len(grads) == 24

    with pytest.raises(TypeError, match="grads must be a list"):
        layer(x, grads=(1, 2))
    layer.requires_grad_(False)
    with pytest.raises(RuntimeError, match="requires grad"):
        layer(x, grads=[])


def test_given_weights_create_the_native_layer_on_first_use():
    """With initial weights (DeepSpeed's test constructor) the library's own weight draw is skipped: the
    native layer is created on the first run, in the layout planned for it (no repacking)."""
    from dstransformer.torch import _Layout

    H, I = 64, 96
    g = torch.Generator().manual_seed(2)
    ws = [torch.randn(H, H, generator=g) for _ in range(4)] + [torch.rand(H, generator=g),
                                                                torch.randn(I, H, generator=g),
                                                                torch.randn(H, I, generator=g),
                                                                torch.rand(H, generator=g)]
    bs = [torch.randn(H, generator=g) for _ in range(5)] + [torch.randn(I, generator=g),
                                                            torch.randn(H, generator=g), torch.randn(H, generator=g)]
    layer = TransformerLayer(make_config(torch.float32), ws, bs, device="cpu")
    assert layer._native is None
    ptr = layer.flat_params.data_ptr()
    twin = copy.deepcopy(layer)
    y = layer(torch.randn(2, 5, H))
    assert layer._native is not None and layer.flat_params.data_ptr() == ptr
    assert _Layout(layer._native).entries == layer._layout.entries
    for name in dst.PARAM_NAMES:
        assert torch.equal(torch.as_tensor(layer.native.param(name)), layer.param_view(name)), name
    assert torch.equal(twin(torch.zeros(1, 1, H)), layer(torch.zeros(1, 1, H)))
    assert y.shape == (2, 5, H)
    # the configuration is still checked at construction
    bad = make_config(torch.float32)
    bad.heads = 5
    with pytest.raises(dst.InvalidArgumentError, match="heads"):
        TransformerLayer(bad, ws, bs, device="cpu")


@pytest.mark.parametrize("dtype", ["fp32", "fp16", "bf16", "fp64"])
@pytest.mark.parametrize("H,I", [(64, 96), (20, 36), (24, 0)])
def test_planned_layout_is_the_librarys(dtype, H, I):
    from dstransformer.torch import _Layout

    cfg = TransformerConfig(hidden_size=H, heads=4, intermediate_size=I, batch_size=1, max_seq_length=4, dtype=dtype,
                            attn_dropout_ratio=0.0, hidden_dropout_ratio=0.0, initializer_range=0.02,
                            num_hidden_layers=2)
    with dst.Context("cpu") as ctx:
        native = dst.Layer(ctx, cfg)
        got = _Layout(native)
        plan = _Layout.planned(cfg, dtype)
        assert (plan.entries, plan.arena_bytes, plan.numel) == (got.entries, got.arena_bytes, got.numel)
        native.close()


# ---- DeepSpeed fidelity: errors where DeepSpeed errors, Hugging Face masks, checkpoints of torch layers ----
def test_unset_deepspeed_sizes_are_an_error():
    cfg = TransformerConfig()  # DeepSpeed's defaults: -1 sizes, which its layer cannot use either
    with pytest.raises(ValueError, match="hidden_size, heads, .* not set"):
        TransformerLayer(cfg, device="cpu")
    cfg.hidden_size, cfg.heads, cfg.intermediate_size = 64, 4, 96
    cfg.attn_dropout_ratio = cfg.hidden_dropout_ratio = 0.0
    cfg.initializer_range, cfg.num_hidden_layers = 0.02, 2
    layer = TransformerLayer(cfg, device="cpu")  # completed attribute by attribute, as DeepSpeed's tests do
    assert layer.flat_params.dtype == torch.float32


@pytest.mark.skipif(HAVE_CUDA, reason="checks the machine without a usable CUDA device")
def test_gpu_layer_without_cuda_raises():
    with pytest.raises(RuntimeError, match="local_rank=0 asks for cuda:0"):
        TransformerLayer(make_config(torch.float16, local_rank=0, fp16=True, dtype=None))
    layer = TransformerLayer(make_config(torch.float16, local_rank=-1, fp16=True, dtype=None))
    assert layer.flat_params.device.type == "cpu"  # DeepSpeed's default local_rank: the CPU backend here


@pytest.mark.parametrize("device,dtype", cases()[:1] + cases()[2:3])
def test_hugging_face_integer_mask(device, dtype):
    layer = TransformerLayer(make_config(dtype), device=device).eval()
    B, S = 3, 9
    x = torch.randn(B, S, 64, device=device, dtype=dtype)
    hf = torch.ones(B, S, dtype=torch.int64, device=device)
    hf[1, 5:] = 0
    hf[2, 2:] = 0
    with torch.no_grad():
        y_hf = layer(x, hf)
        y_add = layer(x, ((1.0 - hf.float()) * -10000.0).view(B, 1, 1, S))
        y_len = layer(x, hf.sum(-1).int())
    assert torch.equal(y_hf, y_add)
    assert rel(y_hf, y_len) < 1e-6
    with pytest.raises(ValueError, match="Hugging Face's \\[B, S\\]"):
        layer(x, hf.view(B, 1, 1, S))
    with pytest.raises(TypeError, match="mask.long\\(\\)"):
        layer(x, hf.bool())


def test_checkpoint_functions_take_torch_layers(tmp_path):
    a = nn.ModuleList([TransformerLayer(make_config(torch.float32), device="cpu") for _ in range(2)])
    b = nn.ModuleList([TransformerLayer(make_config(torch.float32), device="cpu") for _ in range(2)])
    for i, layer in enumerate(a):
        randomize_(layer, gen_seed=i + 1)
    path = tmp_path / "stack.safetensors"
    dst.save_checkpoint(a, path, client_state="step=3")
    assert dst.load_checkpoint(b, path) == "step=3"
    for la, lb in zip(a, b):
        assert all(torch.equal(la.state_dict()[k], lb.state_dict()[k]) for k in la.state_dict())
    dst.save_checkpoint(a[0], tmp_path / "one.safetensors")  # a single layer too
    dst.load_checkpoint(b[1], tmp_path / "one.safetensors")
    assert torch.equal(b[1].attn_qkvw, a[0].attn_qkvw)


@pytest.mark.parametrize("device, dtype", cases())
def test_packed_sequences_match_the_padded_layer(device, dtype):
    """cu_seqlens: [N, H] tokens of B sequences end to end give each row the padded layer's values up to GEMM
    rounding (the same dropout masks), forward and backward (the twelve parameter gradients too), with dropout
    on and the same RNG state."""
    lengths = [7, 1, 11, 4]
    B, S, H = len(lengths), 11, 64
    cu = torch.tensor([0] + list(torch.tensor(lengths).cumsum(0)), dtype=torch.int32)
    N = int(cu[-1])
    cfg = make_config(dtype, attn_dropout_ratio=0.1, hidden_dropout_ratio=0.1)
    base = TransformerLayer(cfg, device=device).train()
    padded_layer, packed_layer = copy.deepcopy(base), copy.deepcopy(base)
    g = torch.Generator().manual_seed(3)
    xs = torch.randn(N, H, generator=g).to(device=device, dtype=dtype)
    dys = torch.randn(N, H, generator=g).to(device=device, dtype=dtype)
    xp = torch.zeros(B, S, H, device=device, dtype=dtype)
    dyp = torch.zeros(B, S, H, device=device, dtype=dtype)
    for b, n in enumerate(lengths):
        xp[b, :n], dyp[b, :n] = xs[cu[b]:cu[b + 1]], dys[cu[b]:cu[b + 1]]

    def run(layer, x, dy, **kw):
        layer.native.context.set_rng_state(19, 0)
        x = x.clone().requires_grad_(True)
        y = layer(x, **kw)
        y.backward(dy)
        return y.detach(), x.grad, {n: p.grad.clone() for n, p in layer.named_parameters()}

    yp, dxp, gp = run(padded_layer, xp, dyp, attention_mask=torch.tensor(lengths, dtype=torch.int32, device=device))
    ys, dxs, gs = run(packed_layer, xs, dys, cu_seqlens=cu.to(device), max_seqlen=S)
    # Per sequence within the dtype's bound; a different dropout mask would be off by O(1).
    bound = {torch.float64: 1e-11, torch.float32: 2e-5}.get(dtype, 3e-2)

    def rel(a, b):
        return float((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-300))

    assert torch.isfinite(ys).all() and torch.isfinite(dxs).all()
    for b, n in enumerate(lengths):
        assert rel(ys[cu[b]:cu[b + 1]], yp[b, :n]) <= bound, b
        assert rel(dxs[cu[b]:cu[b + 1]], dxp[b, :n]) <= bound, b
    for name in gp:
        assert rel(gs[name], gp[name]) <= bound, name
    # max_seqlen read from the offsets; inference; bad arguments
    with torch.no_grad():
        packed_layer.eval()
        y_eval = packed_layer(xs, cu_seqlens=cu.to(device))
        assert y_eval.shape == (N, H)
    with pytest.raises(ValueError, match="attention_mask must be None"):
        packed_layer(xs, attention_mask=torch.ones(1), cu_seqlens=cu.to(device))
    with pytest.raises(ValueError, match=r"\[N, 64\]"):
        packed_layer(xp, cu_seqlens=cu.to(device))
    with pytest.raises(ValueError, match="cu_seqlens"):
        packed_layer(xs, cu_seqlens=torch.tensor([0.0, float(N)], device=device))
