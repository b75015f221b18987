"""dstransformer.initialize: DeepSpeed's engine API over the library's engine, for torch models.

Skipped without torch. The scenarios (``run_*``) take a device and a precision; the CPU tests here run
them on the CPU backend, tests/gpu_python/test_engine_gpu.py runs them on CUDA. Checked: the loss falls;
save -> load -> continue gives the same losses and weights, bit for bit, as an uninterrupted run (dropout
on in the library's layers, gradient accumulation 2, a schedule); AdamW (and Adam in L2 mode) match
torch.optim within 1e-5 relative over several steps with two parameter groups, accumulation and
clipping; the client state is any JSON value; configuration errors name the key's JSON path; fp16
dynamic loss scaling skips an overflowed step and halves the scale; the zero_grads_on_step setting.
"""

import argparse
import copy
import json
import math
import os

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn

import dstransformer as deepspeed  # noqa: E402  (the point: DeepSpeed's API under this name)
from dstransformer.torch import TransformerConfig, TransformerLayer  # noqa: E402

H, HEADS, I, S = 32, 4, 48, 7
DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


class TinyEncoder(nn.Module):
    """Embeddings + two library layers + a final LayerNorm + a tied decoder: enough of a BERT to train."""

    def __init__(self, device, dtype_name="fp32", dropout=0.1, vocab=40, seed=5):
        super().__init__()
        torch.manual_seed(seed)
        self.embed = nn.Embedding(vocab, H)
        cfg = TransformerConfig(batch_size=4, max_seq_length=16, hidden_size=H, intermediate_size=I, heads=HEADS,
                                attn_dropout_ratio=dropout, hidden_dropout_ratio=dropout, num_hidden_layers=2,
                                initializer_range=0.05, seed=seed, pre_layer_norm=True, dtype=dtype_name)
        self.layers = nn.ModuleList([TransformerLayer(cfg, device=device) for _ in range(2)])
        self.norm = nn.LayerNorm(H)
        self.bias = nn.Parameter(torch.zeros(vocab))
        nn.init.normal_(self.embed.weight, std=0.1)
        self.to(device)

    def forward(self, batch):
        ids, labels = batch
        h = self.embed(ids)
        for layer in self.layers:
            h = layer(h)
        logits = self.norm(h) @ self.embed.weight.t() + self.bias
        return nn.functional.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), labels.reshape(-1))


@pytest.fixture(autouse=True)
def _cpu_accelerator(monkeypatch):
    """The tests of this file are the CPU backend's (tests/gpu_python/test_engine_gpu.py runs the scenarios on
    CUDA): on a machine with a GPU, DeepSpeed's rule would move their models there."""
    monkeypatch.setenv("DS_ACCELERATOR", "cpu")


def batches(n, device, vocab=40, seed=11):
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        ids = torch.randint(0, vocab, (4, S), generator=g)
        out.append((ids.to(device), ((ids + 1) % vocab).to(device)))  # predict the next id: learnable
    return out


def config(precision="fp32", gas=2, **extra):
    cfg = {
        "train_micro_batch_size_per_gpu": 4,
        "gradient_accumulation_steps": gas,
        "optimizer": {"type": "Adam", "params": {"lr": 3e-3, "weight_decay": 0.01, "bias_correction": True}},
        "scheduler": {"type": "WarmupLR",
                      "params": {"warmup_min_lr": 0, "warmup_max_lr": 3e-3, "warmup_num_steps": 4}},
        "gradient_clipping": 1.0,
    }
    if precision == "fp16":
        cfg["fp16"] = {"enabled": True, "loss_scale": 0, "initial_scale_power": 12, "loss_scale_window": 4}
    elif precision == "bf16":
        cfg["bf16"] = {"enabled": True}
    cfg.update(extra)
    return cfg


def no_decay_groups(model):
    named = list(model.named_parameters())
    plain = ["bias", "norm", "attn_nw", "attn_nb", "norm_w", "norm_b", "attn_qkvb", "attn_ob", "inter_b",
             "output_b"]
    return [{"params": [p for n, p in named if not any(k in n for k in plain)], "weight_decay": 0.01},
            {"params": [p for n, p in named if any(k in n for k in plain)], "weight_decay": 0.0}]


def train(engine, data, first, last):
    losses = []
    for i in range(first, last):
        loss = engine(data[i % len(data)])
        engine.backward(loss)
        engine.step()
        losses.append(float(loss))
    return losses


def make_engine(device, precision, dropout=0.1, base=None, **extra):
    """An engine over a fresh TinyEncoder, or over a deep copy of ``base`` (the same weights: fresh
    library layers draw theirs with a per-layer seed that counts the layers made so far)."""
    model = TinyEncoder(device, precision, dropout) if base is None else copy.deepcopy(base)
    # The layers of one device share a context, whose dropout stream runs on from model to model in a
    # process: start it at the same place for every engine of a test.
    model.layers[0].native.context.set_rng_state(5, 0)
    engine, opt, loader, sched = deepspeed.initialize(model=model, model_parameters=no_decay_groups(model),
                                                      config=config(precision, **extra))
    return engine, opt, sched


# ---- scenarios (also run on CUDA by tests/gpu_python/test_engine_gpu.py) -------------------------------
def run_loss_falls(device, precision):
    engine, _, _ = make_engine(device, precision, dropout=0.0)
    data = batches(6, engine.device)
    losses = train(engine, data, 0, 60)
    first, last = sum(losses[:6]) / 6, sum(losses[-6:]) / 6
    assert all(math.isfinite(v) for v in losses), losses
    assert last < 0.8 * first, (first, last)
    assert engine.global_steps == 30 and engine.skipped_steps <= (2 if precision == "fp16" else 0)
    return first, last


def run_resume_bit_identical(device, precision, tmp_path):
    data = batches(5, device)
    base = TinyEncoder(device, precision)
    whole, _, _ = make_engine(device, precision, base=base)
    ref = train(whole, data, 0, 16)
    ref_state = {k: v.detach().clone() for k, v in whole.module.state_dict().items()}

    first, _, _ = make_engine(device, precision, base=base)
    before = train(first, data, 0, 8)
    assert before == ref[:8]
    first.save_checkpoint(tmp_path, "half", client_state={"epoch": 1, "seen": [1, [2, 3]]})
    del first
    second, _, _ = make_engine(device, precision)  # fresh weights: the checkpoint replaces them
    path, client = second.load_checkpoint(tmp_path)  # the tag from tmp_path/latest
    assert path.endswith(os.path.join("half", "mp_rank_00_model_states.safetensors"))
    assert client == {"epoch": 1, "seen": [1, [2, 3]]}
    assert second.global_steps == 4 and second.micro_steps == 8
    after = train(second, data, 8, 16)
    assert after == ref[8:], (after, ref[8:])
    for k, v in second.module.state_dict().items():
        assert torch.equal(v, ref_state[k]), k


# The fp32 bound of tests/common/bounds.h. Measured: AdamW 1.8e-7, Adam-L2 1.0e-6 (its first update is
# lr·g'/(|g'| + eps) with g' = g + wd·p: elements whose g' is near eps turn the last-bit difference of g'
# (the library adds in fp32 with wd as a float, torch with a double alpha) into a visible share of lr).
ADAM_TOL = 1e-5


def run_adamw_matches_torch(device, weight_decay_mode="adamw"):
    """The library's AdamW (or Adam in L2 mode) against torch.optim with clipping and two groups, fp32:
    first one boundary step (2 micro-batches) on the model's own gradients, then 4 more on given random
    gradients. Only the first step uses computed gradients: attn_qkvb's K rows have a gradient that is
    zero in exact arithmetic (softmax ignores a per-query constant), so after the weights differ by
    rounding, Adam normalises two different rounding noises into updates of size ~lr and the runs part
    there for reasons outside the optimizer. Given gradients keep the comparison on the update rule."""
    torch.manual_seed(3)
    model = TinyEncoder(device, "fp32", dropout=0.0)
    ref = copy.deepcopy(model)
    if weight_decay_mode == "adamw":
        opt_cfg = {"type": "AdamW", "params": {"lr": 2e-2, "betas": [0.8, 0.99], "eps": 1e-7, "weight_decay": 0.1}}
        torch_cls = torch.optim.AdamW
    else:
        opt_cfg = {"type": "Adam", "params": {"lr": 2e-2, "betas": [0.8, 0.99], "eps": 1e-7, "weight_decay": 0.1,
                                              "adam_w_mode": False}}
        torch_cls = torch.optim.Adam
    cfg = {"train_batch_size": 8, "gradient_accumulation_steps": 2, "gradient_clipping": 0.5, "optimizer": opt_cfg}
    groups = no_decay_groups(model)
    groups[1]["lr"] = 5e-3
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=groups, config=cfg)
    # group values override the configuration's (weight decay 0.01 and 0, lr 5e-3 for the second group)
    pg = engine.optimizer.param_groups
    assert pg[0]["weight_decay"] == pytest.approx(0.01) and pg[0]["lr"] == pytest.approx(2e-2)
    assert pg[1]["weight_decay"] == 0.0 and pg[1]["lr"] == pytest.approx(5e-3)
    assert pg[0]["betas"] == pytest.approx((0.8, 0.99)) and pg[1]["eps"] == pytest.approx(1e-7)
    rgroups = no_decay_groups(ref)
    rgroups[1]["lr"] = 5e-3
    topt = torch_cls(rgroups, lr=2e-2, betas=(0.8, 0.99), eps=1e-7)
    data = batches(2, engine.device)
    gen = torch.Generator().manual_seed(9)
    worst = 0.0
    for step in range(5):
        topt.zero_grad()
        for micro in range(2):
            if step == 0:
                engine.backward(engine(data[micro]))
                (ref(data[micro]) / 2).backward()
            else:
                for p, q in zip(model.parameters(), ref.parameters()):
                    g = (torch.randn(p.shape, generator=gen) * 0.3).to(p.device)
                    if micro == 0:
                        p.grad = g.clone()  # replaces the engine's buffer: copied back at the step
                        q.grad = g.clone()
                    else:
                        p.grad.add_(g)
                        q.grad.add_(g)
            engine.step()
        torch.nn.utils.clip_grad_norm_(ref.parameters(), 0.5)
        topt.step()
        for (n, p), q in zip(model.named_parameters(), ref.parameters()):
            err = float((p.detach() - q.detach()).norm() / q.detach().norm().clamp_min(1e-30))
            worst = max(worst, err)
            assert err < ADAM_TOL, (step, n, err)
    assert engine.global_steps == 5
    return worst


# ---- CPU tests ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_loss_falls(precision, figures):
    first, last = run_loss_falls("cpu", precision)
    figures.append(f"engine, cpu {precision}: mean loss of the first 6 micro-batches {first:.4f}, last 6 {last:.4f}")


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_resume_is_bit_identical(precision, tmp_path):
    run_resume_bit_identical("cpu", precision, tmp_path)


@pytest.mark.parametrize("mode", ["adamw", "l2"])
def test_adam_matches_torch_optim(mode, figures):
    worst = run_adamw_matches_torch("cpu", mode)
    figures.append(f"engine {mode} vs torch.optim, cpu fp32, 5 steps: worst relative error {worst:.1e} (bound {ADAM_TOL:g})")


def test_engine_api_and_gradients_in_the_arena():
    engine, opt, sched = make_engine("cpu", "fp32")
    assert (engine.train_batch_size(), engine.train_micro_batch_size_per_gpu(),
            engine.gradient_accumulation_steps()) == (8, 4, 2)
    assert not engine.fp16_enabled() and engine.optimizer_name() == "adam"
    assert opt is engine.optimizer and sched is engine.lr_scheduler and sched.name == "WarmupLR"
    assert [len(g["params"]) for g in opt.param_groups] == [1 + 4 * 2, 8 * 2 + 2 + 1]
    # the gradients of a TransformerLayer are views into one gradient arena, registered with the library
    layer = engine.module.layers[0]
    ptrs = [p.grad.data_ptr() for p in layer.parameters()]
    base = ptrs[0]
    es = layer.attn_qkvw.element_size()
    assert [p - base for p in ptrs] == [layer._layout.entries[n][0] * es for n in deepspeed.PARAM_NAMES]
    data = batches(4, "cpu")
    engine.backward(engine(data[0]))
    assert [p.grad.data_ptr() for p in layer.parameters()] == ptrs  # backward added in place
    assert layer.attn_qkvw.grad.abs().sum() > 0
    assert not engine.is_gradient_accumulation_boundary()
    engine.step()
    # zero_grad(set_to_none=True) by the script: the next backward lands in the registered buffers again
    engine.module.zero_grad(set_to_none=True)
    before = layer.attn_ow.detach().clone()
    engine.backward(engine(data[1]))
    assert engine.is_gradient_accumulation_boundary()
    engine.step()
    assert [p.grad.data_ptr() for p in layer.parameters()] == ptrs
    assert torch.equal(layer.attn_ow.detach(), before)  # WarmupLR's first step has lr 0
    assert float(layer.attn_ow.grad.abs().sum()) == 0.0  # zeroed at the boundary
    assert engine.global_steps == 1 and engine.was_step_applied()
    # WarmupLR (log, 4 steps): the n-th applied step uses i = n - 1, so the second uses ln(1)/ln(4) = 0,
    # the third ln(2)/ln(4) = 1/2 of the maximum
    assert engine.get_lr() == [0.0, 0.0]
    engine.backward(engine(data[2]))
    engine.step()
    engine.backward(engine(data[3]))
    engine.step()
    assert engine.get_lr() == pytest.approx([1.5e-3, 1.5e-3], rel=1e-6)
    engine.backward(engine(data[0]))
    engine.step()
    engine.backward(engine(data[1]))
    engine.step()
    assert not torch.equal(layer.attn_ow.detach(), before)  # updated in place, through its data pointer
    assert engine.global_steps == 3 and engine.micro_steps == 6
    with pytest.raises(RuntimeError, match="stepped by the engine"):
        opt.step()


def test_param_group_lr_written_by_the_script_reaches_the_library():
    model = TinyEncoder("cpu", "fp32", dropout=0.0)
    cfg = {"train_batch_size": 4, "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}}}
    engine, opt, _, _ = deepspeed.initialize(model=model, config=cfg)
    for g in opt.param_groups:  # what bing_bert does before every boundary step
        g["lr"] = 4e-4
    engine.backward(engine(batches(1, "cpu")[0]))
    engine.step()
    assert engine.get_lr() == pytest.approx([4e-4])


@pytest.mark.parametrize("client_state", [
    {"epoch": 3, "last_global_step": 120, "nested": [[1, 2.5, None], {"k": [True, "ü"]}]},
    [1, [2, [3]]], "text", 7, None])
def test_client_state_is_any_json(client_state, tmp_path):
    engine, _, _ = make_engine("cpu", "fp32")
    engine.save_checkpoint(tmp_path, client_state=client_state)
    assert (tmp_path / "latest").read_text() == "global_step0"
    _, back = engine.load_checkpoint(tmp_path, "global_step0")
    assert back == ({} if client_state is None else client_state)
    with pytest.raises(TypeError, match="JSON"):
        engine.save_checkpoint(tmp_path, "bad", client_state={"t": torch.zeros(1)})


def test_load_without_latest_warns_and_returns_none(tmp_path):
    engine, _, _ = make_engine("cpu", "fp32")
    with pytest.warns(UserWarning, match="latest"):
        assert engine.load_checkpoint(tmp_path) == (None, None)
    with pytest.raises(deepspeed.DstIOError):
        engine.load_checkpoint(tmp_path, "nope")


@pytest.mark.parametrize("bad, path", [
    ({"optimizer": {"type": "Adam", "params": {"weight_decy": 0.01}}}, "optimizer.params.weight_decy"),
    ({"fp16": {"enabled": True, "loss_scael": 0}}, "fp16.loss_scael"),
    ({"optimizer": {"type": "Adam", "params": {"betas": [0.9, "x"]}}}, r"optimizer.params.betas\[1\]"),
    ({"train_batch_size": 6}, "train_batch_size"),
])
def test_bad_config_names_the_key(bad, path):
    cfg = {"train_batch_size": 8, "train_micro_batch_size_per_gpu": 4,
           "optimizer": {"type": "Adam", "params": {"lr": 1e-3}}}
    for k, v in bad.items():
        cfg[k] = v
    model = TinyEncoder("cpu", "fp32")
    with pytest.raises(deepspeed.InvalidArgumentError, match=path):
        deepspeed.initialize(model=model, config=cfg)
    with pytest.raises(deepspeed.InvalidArgumentError, match=path):
        deepspeed.DeepSpeedConfig(cfg)


def test_config_sources_and_arguments(tmp_path):
    cfg = config("fp32")
    path = tmp_path / "ds_config.json"
    path.write_text(json.dumps(cfg))
    parser = deepspeed.add_config_arguments(argparse.ArgumentParser())
    args = parser.parse_args(["--deepspeed", "--deepspeed_config", str(path)])
    assert args.deepspeed and args.deepspeed_config == str(path)
    model = TinyEncoder("cpu", "fp32")
    engine, _, _, _ = deepspeed.initialize(args=args, model=model)
    assert engine.train_batch_size() == 8
    with pytest.raises(ValueError, match="given twice"):
        deepspeed.initialize(args=args, model=TinyEncoder("cpu", "fp32"), config=cfg)
    with pytest.raises(ValueError, match="no configuration"):
        deepspeed.initialize(model=TinyEncoder("cpu", "fp32"))
    ds = deepspeed.DeepSpeedConfig(str(path))
    assert (ds.train_batch_size, ds.train_micro_batch_size_per_gpu, ds.gradient_accumulation_steps,
            ds.fp16_enabled, ds.bf16_enabled) == (8, 4, 2, False, False)
    # the tutorial's file: max_grad_norm in optimizer.params is global clipping; TB 4096 / MB 64 -> GAS 64
    tutorial = {"train_batch_size": 4096, "train_micro_batch_size_per_gpu": 64, "steps_per_print": 1000,
                "optimizer": {"type": "Adam", "params": {"lr": 2e-4, "max_grad_norm": 1.0, "weight_decay": 0.01,
                                                         "bias_correction": False}},
                "fp16": {"enabled": True, "loss_scale": 0, "initial_scale_power": 16}}
    ds = deepspeed.DeepSpeedConfig(tutorial)
    assert ds.gradient_accumulation_steps == 64 and ds.fp16_enabled


def test_init_distributed_is_world_size_one(monkeypatch):
    deepspeed.init_distributed(dist_backend="nccl")
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(deepspeed.UnsupportedError, match="WORLD_SIZE=2"):
        deepspeed.init_distributed()
    monkeypatch.delenv("WORLD_SIZE")
    with pytest.raises(deepspeed.UnsupportedError, match="a client optimizer"):
        m = TinyEncoder("cpu", "fp32")
        deepspeed.initialize(model=m, optimizer=torch.optim.SGD(m.parameters(), lr=0.1), config=config())


def test_fp16_dynamic_loss_scale_skips_an_overflow():
    """fp16 on the CPU backend (a model of library layers only: torch's CPU kernels lack fp16 matmuls):
    the loss is scaled by 2^12; an infinite loss overflows, the step is skipped and the scale halves."""
    cfg = TransformerConfig(batch_size=4, max_seq_length=8, hidden_size=H, intermediate_size=I, heads=HEADS,
                            attn_dropout_ratio=0.0, hidden_dropout_ratio=0.0, num_hidden_layers=1,
                            initializer_range=0.05, seed=2, pre_layer_norm=True, dtype="fp16")
    model = nn.Sequential(TransformerLayer(cfg, device="cpu"))
    engine, _, _, _ = deepspeed.initialize(model=model, config={
        "train_batch_size": 4, "optimizer": {"type": "Adam", "params": {"lr": 1e-3}},
        "fp16": {"enabled": True, "loss_scale": 0, "initial_scale_power": 12, "loss_scale_window": 2}})
    assert engine.loss_scale == 4096.0
    x = torch.randn(4, 5, H).half()
    layer = model[0]
    w0 = layer.attn_qkvw.detach().clone()
    scaled = engine.backward(model(x).float().square().mean())
    assert layer.attn_qkvw.grad.abs().max() > 0
    assert float(scaled) == pytest.approx(float(model(x).float().square().mean()) * 4096, rel=1e-3)
    engine.step()
    assert engine.was_step_applied() and not torch.equal(layer.attn_qkvw.detach(), w0)
    w1 = layer.attn_qkvw.detach().clone()
    engine.backward(model(x).float().square().mean() * float("inf"))
    engine.step()
    assert not engine.was_step_applied() and engine.skipped_steps == 1
    assert torch.equal(layer.attn_qkvw.detach(), w1)  # skipped: the weights did not change
    assert engine.loss_scale == 2048.0
    assert float(layer.attn_qkvw.grad.abs().max()) == 0.0  # zeroed after the skipped step too


def test_zero_grads_on_step_setting():
    """``engine.zero_grads_on_step``: True by default (the gradients zeroed at each boundary, as DeepSpeed);
    False leaves them to the next step's first backward (``dst_engine_set_zero_grads_on_step``); anything
    but a bool is refused, the setting unchanged."""
    model = nn.Linear(4, 3)
    engine, _, _, _ = deepspeed.initialize(model=model, config={
        "train_batch_size": 2, "optimizer": {"type": "Adam", "params": {"lr": 1e-3}}})
    x = torch.randn(2, 4, generator=torch.Generator().manual_seed(3))
    assert engine.zero_grads_on_step is True
    engine.zero_grads_on_step = False
    assert engine.zero_grads_on_step is False
    engine.backward(engine(x).square().mean())
    engine.step()
    assert engine.global_steps == 1 and engine.was_step_applied()
    assert float(model.weight.grad.abs().sum()) > 0  # not zeroed at the boundary
    engine.zero_grad()  # still zeroes on request
    assert float(model.weight.grad.abs().sum()) == 0.0
    for bad in (0, 1, "no", None, 0.0):
        with pytest.raises(TypeError, match="zero_grads_on_step must be a bool"):
            engine.zero_grads_on_step = bad
        assert engine.zero_grads_on_step is False
    with pytest.raises(deepspeed.InvalidArgumentError):  # the C API refuses values other than 0 and 1
        deepspeed._native.dst_engine_set_zero_grads_on_step(engine._handle, 2)
    assert engine.zero_grads_on_step is False
    engine.zero_grads_on_step = True
    assert engine.zero_grads_on_step is True
    engine.backward(engine(x).square().mean())
    assert float(model.weight.grad.abs().sum()) > 0
    engine.step()
    assert engine.global_steps == 2
    assert float(model.weight.grad.abs().sum()) == 0.0  # zeroed at the boundary again
