#!/usr/bin/env python3
"""Times libdstransformer against PyTorch on the same GPU, in one process, and prints one table.

The layer: BERT-Large (H=1024, 16 heads of 64, I=4096), Pre-LN, dropout 0.1 on the attention
probabilities and on both sub-layer outputs, run as a stack of 4 layers. Padding: sequence b keeps
all S keys when b is even and S - S//4 keys when b is odd (so B=1 is one full-length sequence); the
additive masks put -10000 on the other keys, the key-length mask gives those lengths.

Cases: every dtype of --dtypes (fp16, bf16; fp32 on request, TF32 off everywhere) with every shape B×S of --shapes (64×128, 16×512,
8×2048, 2×8192, 1×16384), all shapes of the first dtype first, shapes in the order given. Rows of a
case, in the order of the table:
  gemms alone                     the layer's GEMMs in the layer dtype through torch (cuBLAS, TF32
                                  off), all in one function per iteration: the four linears (QKV 3H×H,
                                  attention output H×H, FFN in I×H, FFN out H×I) forward, dX and dW
                                  over N=B·S tokens, and the six attention products on [B·16, S, 64]
                                  batches: Q·Kᵀ and P·V forward, dP=dO·Vᵀ, dV=Pᵀ·dO, dQ=dS·K and
                                  dK=dSᵀ·Q backward (one S×S buffer, allocated once). Its inference
                                  column is the forward GEMMs only (4 linears, Q·Kᵀ, P·V)
  torch eager SDPA                F.scaled_dot_product_attention with the additive mask
  torch.compile + SDPA            the same stack under torch.compile(dynamic=False): one compilation
                                  per case, whose seconds are printed (timings vary 7-13 % from one
                                  compilation to the next)
  torch eager plain attention     matmul, fp32 softmax, dropout, matmul; only for S <= 512 (it
                                  materialises S×S fp32 scores), "-" above
  ours, additive                  libdstransformer (CUDA backend, through ctypes) with the additive mask
  ours, key lengths               with the key-length mask
  ours, key lengths + 3 switches  and attn_dropout_checkpoint, normalize_invertible, gelu_checkpoint
  ours, key lengths, stochastic   and stochastic_mode=1 (non-deterministic fast paths allowed)
  ours, key lengths, unfused GEMMs  with --unfused-gemm-row: the key-length row on a context created
                                  with DST_FUSED_GEMM=0 (FC1 and GELU, FC2's dX and GELU', as separate
                                  kernels; the other rows take the library's default, one CUTLASS kernel each)
  ours, key lengths, LN passes    with --ln-passes-row: the key-length row on a context created with
                                  DST_LN_ONE_PASS=0: the LayerNorm backward as separate dx, γ/β and bias
                                  passes (the other rows take the library's default, the one-pass form
                                  at 4 warps per row, kernels/layernorm.cuh)
  ours, key lengths, dGELU column_sum  with --dgelu-colsum-row: the key-length row on a context created
                                  with DST_DGELU_TILE_SUMS=0: the FC1 bias gradient by column_sum's two
                                  passes over du (the default: the fused FC2 data gradient's epilogue
                                  sums each tile's columns, a small kernel adds the tiles)
  The three optional rows are A/B rows: each is timed in alternation with a second stack of the
  key-length row's (repetition by repetition, training and inference), and the case's summary gains
  a line "A/B in alternation: row / ours, key lengths" with both times and their ratio, which a drift
  of the GPU's clocks over the case (sustained load) cannot bias; the row's own columns are its
  times from that alternation.
torch.compile runs first in each case, so that every row printed as it is measured has its ratio.
Torch and the library share one CUDA stream, created for the run: torch's default stream is the
legacy NULL stream, which dst_context_set_stream would take as "the context's own stream", a
non-blocking stream that CUDA events recorded on torch's stream do not wait for.

Columns, per layer (a call of the 4-layer stack / 4; gemms alone: one layer's GEMMs):
  fwd+bwd ms/layer  a training forward and backward (torch: parameter gradients set to None before
                    each, as ours overwrites them); CUDA events, median over `reps` of the mean of
                    `iters` calls after `warm-up` calls: (reps, iters, warm-up) = (5, 10, 3) for
                    S <= 512, (3, 5, 2) for S <= 2048, (3, 2, 2) above
  ratio             the row's fwd+bwd time / torch.compile + SDPA's (< 1: faster than torch.compile);
                    each case ends with "speedup vs compile" = torch.compile's time / ours (> 1: ours
                    is faster) for "ours, key lengths", "ours, additive" and "ours, key lengths,
                    stochastic"
  infer ms/layer    a forward in inference mode (torch: eval() and no_grad; ours: training=0); for
                    torch.compile the first such call compiles the inference graph (its seconds are in
                    the JSON, infer_compile_s; the budget must hold half the training compilation for it;
                    --no-compile-inference leaves it out)
  saved MiB         activations kept for backward, MiB (2**20 bytes) per sample per layer; counted:
                    the library's count, dst_layer_config_saved_bytes / B; measured: for ours the drop
                    of the device's free memory (torch.cuda.mem_get_info) over one training forward of
                    the stack into fresh dst_saved objects, after the timed calls (the workspace has
                    grown by then); for torch the growth of torch.cuda.memory_allocated over a training
                    forward (it includes each layer's output)
  compile s         torch.compile: seconds of the first training call (compiles forward and backward)

More cases, after each dtype's dense shapes (each a part of the same table, with its own summary line):
  padded            --padded-shapes (default 64x128,16x512; none: off): lengths uniform in [S/4, S]
                    from a fixed seed (PADDING_SEED), rows "padded: torch eager SDPA" (the equivalent
                    additive mask), "padded: ours, key lengths" (summary: its time / ours dense, the
                    "ours, key lengths" row at the same shape) and "padded: ours packed" (the same
                    lengths as packed input: tokens [N, H] and cu_seqlens, dst_layer_forward_packed)
  graph             (--no-graphs: off) the stack at 8x128 with the table's dropout (replays draw new
                    masks from the context's device counter, docs/rng.md): "graph: ours eager", then
                    "graph: ours replay": the training call (forward + backward)
                    and the inference forward captured with torch.cuda.CUDAGraph on torch's current
                    stream, which is the library's, after eager calls sized the workspace, and replayed
                    (summary: replay / eager)
and last, for the first dtype, the batch-token sweep (--no-sweep: off): 1K, 2K, ... 64K tokens per call
at S=128 and S=512, fwd+bwd µs per token per layer of "ours, key lengths" and of torch.compile + SDPA
(one compilation per S with the batch dimension marked dynamic), (reps, iters, warm-up) = (3, 5, 2);
printed, in the JSON ("sweep"; "sweep_cliffs": points slower per token than 1.3× the next smaller
call; "sweep_steps": neighbouring points more than 1.3× apart per token either way), and plotted as --out/batch_token_sweep.svg (written by hand: no plotting library needed).
Without a CUDA device the script says so and exits with status 1 before measuring anything; --help
needs no GPU.

Time: --budget SECONDS counts from the start of main(). Before a row, its time is predicted from the
same row at an earlier case (setup, plus its calls scaled by the layer's FLOPs); after warm-up, from
the last warm-up call. A row that would not fit prints "(skipped: time budget)"; an error (out of
memory, a library error) is printed in its row and the run goes on. Rows are printed as they are
measured, the whole table at the end, also when the run is stopped by SIGTERM (`timeout`). --out DIR
receives compare_torch.json (and batch_token_sweep.svg), rewritten after each case: every number of the table, and per row the
library's workspace (dst_layer_config_workspace_bytes), setup seconds (compilation included) and wall
seconds; per case the compile seconds and speedups; the run's wall seconds.

usage: DST_LIB=path/libdstransformer.so python3 bench/compare_torch.py [--dtypes fp16,bf16[,fp32]]
           [--shapes 64x128,16x512,8x2048,2x8192,1x16384] [--skip-compile] [--skip-eager]
           [--no-compile-inference] [--padded-shapes 64x128,16x512|none] [--no-graphs] [--no-sweep]
           [--unfused-gemm-row] [--ln-passes-row] [--dgelu-colsum-row] [--budget SECONDS] [--out DIR]
"""
import argparse
import collections
import contextlib
import ctypes
import dataclasses
import functools
import gc
import html
import json
import math
import os
import signal
import statistics
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "bindings", "ctypes"))
import dst_ctypes as dc  # noqa: E402

H, HEADS, I, LAYERS, P = 1024, 16, 4096, 4, 0.1
D = H // HEADS
MIB = 2 ** 20
DEVICE = "cuda"
DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}
DEFAULT_DTYPES = "fp16,bf16"  # fp32 on request: torch and the library both without TF32
SHAPES = "64x128,16x512,8x2048,2x8192,1x16384"
PLAIN_MAX_S = 512

GEMMS, SDPA, COMPILE, PLAIN = "gemms alone", "torch eager SDPA", "torch.compile + SDPA", "torch eager plain attention"
OURS = [  # row name, key-length mask (else additive), configuration switches
    ("ours, additive", False, {}),
    ("ours, key lengths", True, {}),
    ("ours, key lengths + 3 switches", True, {"attn_dropout_checkpoint": 1, "normalize_invertible": 1,
                                              "gelu_checkpoint": 1}),
    ("ours, key lengths, stochastic", True, {"stochastic_mode": 1}),
]
# With --unfused-gemm-row: the key-length row on a context created with DST_FUSED_GEMM=0 (the FC1 forward
# and the FC2 data gradient as the cuBLASLt GEMM and a separate GELU kernel, instead of the default's
# CUTLASS kernels with GELU / GELU' in their epilogues, kernels/gemm_gelu.cuh).
# ("_env": environment variables set while the row's context is created, which the backend reads then.)
FUSED_GEMM = ("ours, key lengths, unfused GEMMs", True, {"_env": {"DST_FUSED_GEMM": "0"}})
# With --ln-passes-row: the key-length row with the LayerNorm backward as separate passes (the default
# is its one-pass form).
LN_PASSES = ("ours, key lengths, LN passes", True, {"_env": {"DST_LN_ONE_PASS": "0"}})
# With --dgelu-colsum-row: the key-length row with the FC1 bias gradient from column_sum over du (the
# default takes it from the fused FC2 data gradient's epilogue, per 128-row tile).
DGELU_COLSUM = ("ours, key lengths, dGELU column_sum", True, {"_env": {"DST_DGELU_TILE_SUMS": "0"}})
OPTIONAL_ROWS = (FUSED_GEMM[0], LN_PASSES[0], DGELU_COLSUM[0])  # in the speedup line only when run
SPEEDUP_ROWS = ("ours, key lengths", "ours, additive", "ours, key lengths, stochastic") + OPTIONAL_ROWS
SKIPPED = "(skipped: time budget)"
# The padding-distribution case: lengths uniform in [S/4, S] from this seed, at --padded-shapes.
PADDING_SEED = 1234
PADDED_SHAPES = "64x128,16x512"
PADDED_SDPA, PADDED_OURS, PADDED_PACKED = ("padded: torch eager SDPA", "padded: ours, key lengths",
                                           "padded: ours packed")
DENSE_REF = "ours, key lengths"  # the dense row a padded one is compared with
# The CUDA-graph case: the 4-layer stack at 8×128 with the table's dropout, eager and replayed.
GRAPH_SHAPE = (8, 128)
GRAPH_EAGER, GRAPH_REPLAY = "graph: ours eager", "graph: ours replay"
# The batch-token sweep: tokens per call 1K … 64K at these S, fwd+bwd per token, ours and torch.compile.
SWEEP_TOKENS = [1024 << k for k in range(7)]
SWEEP_S = (128, 512)
SWEEP_OURS, SWEEP_COMPILE = "ours, key lengths", "torch.compile + SDPA"
SWEEP_PLAN = None  # set below, after Plan
CLIFF = 1.3  # a sweep point above this × the per-token time of the next smaller call is flagged

Plan = collections.namedtuple("Plan", "reps iters warmup")
SWEEP_PLAN = Plan(3, 5, 2)


def plan_for(S):
    if S <= 512:
        return Plan(5, 10, 3)
    return Plan(3, 5, 2) if S <= 2048 else Plan(3, 2, 2)


def layer_flops(B, S):
    """Forward FLOPs of one layer: the four linears and the two attention products."""
    return 2 * B * S * (4 * H * H + 2 * H * I) + 4 * B * S * S * H


def key_lengths(B, S, padding="alternate"):
    """Keys each sequence keeps. "alternate": S for even b, S - S//4 for odd b; "uniform": lengths drawn
    uniformly from [S//4, S] by a generator seeded with PADDING_SEED (the padding-distribution case)."""
    if padding == "uniform":
        g = torch.Generator().manual_seed(PADDING_SEED)
        return torch.randint(max(1, S // 4), S + 1, (B,), generator=g, dtype=torch.int32).to(DEVICE)
    n = torch.full((B,), S, dtype=torch.int32, device=DEVICE)
    n[1::2] = S - S // 4
    return n


def additive_mask(B, S, dtype, padding="alternate"):
    """[B, S]: -10000 on the keys past key_lengths, 0 elsewhere."""
    padded = torch.arange(S, device=DEVICE) >= key_lengths(B, S, padding)[:, None]
    return torch.zeros(B, S, device=DEVICE, dtype=dtype).masked_fill_(padded, -10000.0)


class TorchLayer(nn.Module):
    def __init__(self, attn):
        super().__init__()
        self.attn = attn
        self.ln1 = nn.LayerNorm(H, eps=1e-12)
        self.qkv = nn.Linear(H, 3 * H)
        self.o = nn.Linear(H, H)
        self.ln2 = nn.LayerNorm(H, eps=1e-12)
        self.fc1 = nn.Linear(H, I)
        self.fc2 = nn.Linear(I, H)

    def forward(self, x, mask):  # mask: additive [B, 1, 1, S]
        B, S, _ = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(B, S, 3, HEADS, D).permute(2, 0, 3, 1, 4)
        if self.attn == "sdpa":
            ctx = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=P if self.training else 0.0)
        else:
            s = (q @ k.transpose(-1, -2)) * (1.0 / math.sqrt(D)) + mask
            p = F.dropout(torch.softmax(s.float(), dim=-1).to(x.dtype), P, self.training)
            ctx = p @ v
        r = x + F.dropout(self.o(ctx.transpose(1, 2).reshape(B, S, H)), P, self.training)
        return r + F.dropout(self.fc2(F.gelu(self.fc1(self.ln2(r)))), P, self.training)


# ---- the implementations a row measures -----------------------------------------------------------
# Each has `layers` (layers one call runs), `compile_s`, `workspace_mib`, and the methods train()
# (one training call), saved_mib() -> (counted, measured), inference() (switches to inference and
# returns the call to time, or None) and close().

class Gemms:
    """The layer's GEMMs alone, in the layer dtype, through torch (cuBLAS)."""
    layers, compile_s, workspace_mib = 1, None, None

    def __init__(self, dname, B, S):
        dtype, N, BH = DTYPES[dname], B * S, B * HEADS

        def rand(*shape):
            return torch.randn(*shape, device=DEVICE, dtype=dtype)

        # (input, weight, output gradient) of QKV, attention output, FFN in, FFN out
        self.linears = [(rand(N, k), rand(n, k), rand(N, n)) for n, k in ((3 * H, H), (H, H), (I, H), (H, I))]
        self.q, self.k, self.v, self.dout = (rand(BH, S, D) for _ in range(4))
        self.out = torch.empty(BH, S, D, device=DEVICE, dtype=dtype)
        self.ss = rand(BH, S, S)  # the S×S operand: scores and probabilities, then dP and dS

    def forward(self):
        for x, w, _ in self.linears:
            F.linear(x, w)
        torch.bmm(self.q, self.k.transpose(1, 2), out=self.ss)  # Q·Kᵀ
        torch.bmm(self.ss, self.v, out=self.out)  # P·V

    def train(self):
        self.forward()
        for x, w, dy in self.linears:
            torch.mm(dy, w)  # dX = dY·W
            torch.mm(dy.t(), x)  # dW = dYᵀ·X
        torch.bmm(self.dout, self.v.transpose(1, 2), out=self.ss)  # dP = dO·Vᵀ
        torch.bmm(self.ss.transpose(1, 2), self.dout)  # dV = Pᵀ·dO
        torch.bmm(self.ss, self.k)  # dQ = dS·K
        torch.bmm(self.ss.transpose(1, 2), self.q)  # dK = dSᵀ·Q

    def saved_mib(self):
        return None, None

    def inference(self):
        return self.forward

    def close(self):
        pass


class TorchStack:
    """A stack of TorchLayer, eager or under torch.compile."""
    layers, workspace_mib = LAYERS, None
    inference_compiled = True  # --no-compile-inference: no inference column for torch.compile

    def __init__(self, dname, B, S, attn, compiled, padding="alternate"):
        dtype = DTYPES[dname]
        self.B, self.compiled, self.compile_s, self.infer_compile_s = B, compiled, None, None
        self.stack = stack = nn.Sequential(*[TorchLayer(attn) for _ in range(LAYERS)]).to(DEVICE, dtype)
        self.x = torch.randn(B, S, H, device=DEVICE, dtype=dtype, requires_grad=True)
        self.dy = torch.randn(B, S, H, device=DEVICE, dtype=dtype)
        mask = additive_mask(B, S, dtype, padding).view(B, 1, 1, S)

        def run(x):
            for layer in stack:
                x = layer(x, mask)
            return x

        self.fwd = torch.compile(run, dynamic=False) if compiled else run
        if compiled:
            t0 = time.monotonic()
            self.train()
            torch.cuda.synchronize()
            self.compile_s = time.monotonic() - t0

    def train(self):
        self.x.grad = None
        self.stack.zero_grad()
        self.fwd(self.x).backward(self.dy)

    def saved_mib(self):
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        y = self.fwd(self.x)
        grown = torch.cuda.memory_allocated() - base
        del y
        return None, grown / self.B / LAYERS / MIB

    def inference(self):
        """Eager: eval() and no_grad. Compiled: the same, which makes torch.compile compile the inference
        graph on the first call (timed here, in infer_compile_s)."""
        if self.compiled and not self.inference_compiled:
            return None
        self.stack.eval()

        def forward():
            with torch.no_grad():
                self.fwd(self.x)

        if self.compiled:
            t0 = time.monotonic()
            forward()
            torch.cuda.synchronize()
            self.infer_compile_s = time.monotonic() - t0
        return forward

    def close(self):
        if self.compiled:
            torch._dynamo.reset()


class Ours:
    """A stack of libdstransformer layers on one CUDA context that runs on torch's current stream."""
    layers, compile_s = LAYERS, None

    def __init__(self, lib, dname, B, S, use_key_lengths, switches, padding="alternate"):
        self.lib, self.L, self.B, self.S, self.padding = lib, lib.lib, B, S, padding
        self.handles = []
        switches = dict(switches)
        # The backend reads its DST_* variables when the context is created (the optional rows' "_env").
        env = switches.pop("_env", {})
        before = {k: os.environ.get(k) for k in env}
        os.environ.update(env)
        try:
            self.ctx = lib.context(dc.BACKEND_CUDA)
        finally:
            for k, v in before.items():
                if v is None:
                    del os.environ[k]
                else:
                    os.environ[k] = v
        try:
            self.setup(dname, use_key_lengths, switches)
        except BaseException:
            self.close()
            raise

    def make_layers(self, dname, switches):
        """The context on torch's current stream, the configuration and the LAYERS layers."""
        lib, B, S = self.lib, self.B, self.S
        stream = torch.cuda.current_stream().cuda_stream
        if not stream:  # NULL would mean the context's own stream, which torch's CUDA events do not see
            raise RuntimeError("torch's current stream is the default stream; run on a created stream")
        lib.check(self.L.dst_context_set_stream(self.ctx, stream))
        fields = dict(hidden_size=H, heads=HEADS, intermediate_size=I, attn_dropout_ratio=P, hidden_dropout_ratio=P,
                      num_hidden_layers=LAYERS, dtype=dname, max_batch_tokens=B * S, max_seq_len=S, pre_layer_norm=1)
        fields.update(switches)  # switches may also set the dropout ratios (the CUDA-graph rows: 0)
        self.cfg = lib.config(**fields)
        self.workspace_mib = lib.workspace_bytes(self.cfg, B, S) / MIB
        for _ in range(LAYERS):
            self.handles.append(lib.layer(self.ctx, self.cfg))

    def setup(self, dname, use_key_lengths, switches):
        B, S, dtype = self.B, self.S, DTYPES[dname]
        self.make_layers(dname, switches)
        xs = [torch.randn(B, S, H, device=DEVICE, dtype=dtype)]
        xs += [torch.empty(B, S, H, device=DEVICE, dtype=dtype) for _ in range(LAYERS)]
        gs = [torch.empty(B, S, H, device=DEVICE, dtype=dtype) for _ in range(LAYERS)]
        gs += [torch.randn(B, S, H, device=DEVICE, dtype=dtype)]
        if use_key_lengths:
            self.mask_data = key_lengths(B, S, self.padding)
            self.mask = dc.mask(dc.MASK_KEY_LENGTHS, self.mask_data.data_ptr(), "int32", (B,))
        else:
            self.mask_data = additive_mask(B, S, dtype, self.padding)
            self.mask = dc.mask(dc.MASK_ADDITIVE, self.mask_data.data_ptr(), dname, (B, S))
        self.tensors = xs + gs  # the views below point into them
        self.tx = [dc.tensor(t.data_ptr(), dname, (B, S, H)) for t in xs]
        self.tg = [dc.tensor(t.data_ptr(), dname, (B, S, H)) for t in gs]

    def forward(self, saved=(None,) * LAYERS):
        for i, (layer, sv) in enumerate(zip(self.handles, saved)):
            self.lib.check(self.L.dst_layer_forward(layer, sv, ctypes.byref(self.tx[i]), ctypes.byref(self.mask),
                                                    ctypes.byref(self.tx[i + 1])))

    def train(self):
        self.forward()
        for i in reversed(range(LAYERS)):
            self.lib.check(self.L.dst_layer_backward(self.handles[i], None, ctypes.byref(self.tg[i + 1]),
                                                     ctypes.byref(self.tg[i]), 0))

    def saved_mib(self):
        counted = self.lib.saved_bytes(self.cfg, self.B, self.S) / self.B / MIB
        saved = []
        try:
            for layer in self.handles:
                saved.append(self.lib.saved(layer))
            torch.cuda.synchronize()
            free_before = torch.cuda.mem_get_info()[0]
            self.forward(saved)
            torch.cuda.synchronize()
            free_after = torch.cuda.mem_get_info()[0]
        finally:
            for sv in saved:
                self.L.dst_saved_destroy(sv)
        return counted, (free_before - free_after) / self.B / LAYERS / MIB

    def inference(self):
        for layer in self.handles:
            self.lib.check(self.L.dst_layer_set_training(layer, 0))
        return self.forward

    def close(self):
        for layer in self.handles:
            self.L.dst_layer_destroy(layer)
        self.handles = []
        if self.ctx:
            self.L.dst_context_destroy(self.ctx)
            self.ctx = None


class OursPacked(Ours):
    """Ours on packed input (dst_layer_forward_packed / dst_layer_backward_packed): the valid tokens of the
    batch, [N, H] with N = Σ key_lengths, and cu_seqlens [B + 1]; no padded tensor on the caller's side."""

    def setup(self, dname, use_key_lengths, switches):
        B, S, dtype = self.B, self.S, DTYPES[dname]
        self.make_layers(dname, switches)
        lengths = key_lengths(B, S, self.padding)
        self.cu = torch.zeros(B + 1, dtype=torch.int32, device=DEVICE)
        self.cu[1:] = torch.cumsum(lengths, 0)
        N, self.max_seqlen = int(self.cu[-1]), int(lengths.max())
        xs = [torch.randn(N, H, device=DEVICE, dtype=dtype)] + [torch.empty(N, H, device=DEVICE, dtype=dtype)
                                                               for _ in range(LAYERS)]
        gs = [torch.empty(N, H, device=DEVICE, dtype=dtype) for _ in range(LAYERS)]
        gs += [torch.randn(N, H, device=DEVICE, dtype=dtype)]
        self.tensors = xs + gs + [self.cu]  # the views below point into them
        self.tcu = dc.tensor(self.cu.data_ptr(), "int32", (B + 1,))
        self.tx = [dc.tensor(t.data_ptr(), dname, (N, H)) for t in xs]
        self.tg = [dc.tensor(t.data_ptr(), dname, (N, H)) for t in gs]

    def forward(self, saved=(None,) * LAYERS):
        for i, (layer, sv) in enumerate(zip(self.handles, saved)):
            self.lib.check(self.L.dst_layer_forward_packed(layer, sv, ctypes.byref(self.tx[i]), ctypes.byref(self.tcu),
                                                           self.max_seqlen, ctypes.byref(self.tx[i + 1])))

    def train(self):
        self.forward()
        for i in reversed(range(LAYERS)):
            self.lib.check(self.L.dst_layer_backward_packed(self.handles[i], None, ctypes.byref(self.tg[i + 1]),
                                                            ctypes.byref(self.tg[i]), 0))


class OursGraph(Ours):
    """Ours (key lengths, the table's dropout) captured into CUDA graphs with torch.cuda.CUDAGraph on torch's current
    stream, which is the library's (Ours.setup), and replayed: train() replays forward + backward,
    inference() a captured inference forward. Eager calls of the same shapes size the workspace and the
    saved activations before each capture, as the header's dst_layer_forward doc asks."""

    def __init__(self, lib, dname, B, S):
        super().__init__(lib, dname, B, S, True, {})
        try:
            for _ in range(2):
                Ours.train(self)
            self.train_graph = self.capture(lambda: Ours.train(self))
        except BaseException:
            self.close()
            raise

    @staticmethod
    def capture(fn):
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, stream=torch.cuda.current_stream()):
            fn()
        torch.cuda.synchronize()
        return g

    def train(self):
        self.train_graph.replay()

    def saved_mib(self):
        return self.lib.saved_bytes(self.cfg, self.B, self.S) / self.B / MIB, None

    def inference(self):
        super().inference()  # training off
        self.forward()
        self.infer_graph = self.capture(self.forward)
        return self.infer_graph.replay

    def close(self):
        self.train_graph = self.infer_graph = None  # the graphs before the layers whose memory they use
        super().close()


def row_specs(lib, kind, dname, B, S, args):
    """(row name, constructor of what it measures or None, why it is not run), in table order, for a case
    of `kind`: "dense" (the main table), "padded" (lengths uniform in [S/4, S]) or "graph"."""
    if kind == "padded":
        specs = []
        if not args.skip_eager:
            specs.append((PADDED_SDPA, functools.partial(TorchStack, dname, B, S, "sdpa", False, "uniform"), None))
        specs.append((PADDED_OURS, functools.partial(Ours, lib, dname, B, S, True, {}, "uniform"), None))
        specs.append((PADDED_PACKED, functools.partial(OursPacked, lib, dname, B, S, True, {}, "uniform"), None))
        return specs
    if kind == "graph":
        return [(GRAPH_EAGER, functools.partial(Ours, lib, dname, B, S, True, {}), None),
                (GRAPH_REPLAY, functools.partial(OursGraph, lib, dname, B, S), None)]
    specs = [(GEMMS, functools.partial(Gemms, dname, B, S), None)]
    if not args.skip_eager:
        specs.append((SDPA, functools.partial(TorchStack, dname, B, S, "sdpa", False), None))
    if not args.skip_compile:
        specs.append((COMPILE, functools.partial(TorchStack, dname, B, S, "sdpa", True), None))
    if not args.skip_eager:
        specs.append((PLAIN, functools.partial(TorchStack, dname, B, S, "plain", False) if S <= PLAIN_MAX_S else None,
                      f"not run: S > {PLAIN_MAX_S}"))
    specs += [(name, functools.partial(Ours, lib, dname, B, S, use_key_lengths, switches), None)
              for name, use_key_lengths, switches in OURS]
    # The optional A/B rows, each timed in alternation with a stack of DENSE_REF's of its own (Paired).
    ab = [FUSED_GEMM] if getattr(args, "unfused_gemm_row", False) else []
    ab += [LN_PASSES] if getattr(args, "ln_passes_row", False) else []
    ab += [DGELU_COLSUM] if getattr(args, "dgelu_colsum_row", False) else []
    specs += [(name, Paired(functools.partial(Ours, lib, dname, B, S, use_key_lengths, switches),
                            functools.partial(Ours, lib, dname, B, S, True, {})), None)
              for name, use_key_lengths, switches in ab]
    return specs


# ---- measuring ------------------------------------------------------------------------------------

@dataclasses.dataclass
class Row:
    dtype: str
    B: int
    S: int
    impl: str
    train_ms: float | None = None  # per layer
    ratio: float | None = None  # train_ms / torch.compile's
    infer_ms: float | None = None  # per layer
    saved_counted_mib: float | None = None  # per sample per layer
    saved_measured_mib: float | None = None  # per sample per layer
    compile_s: float | None = None
    infer_compile_s: float | None = None  # torch.compile: the first inference call (its compilation)
    workspace_mib: float | None = None  # the library's workspace (dst_layer_config_workspace_bytes), whole call
    setup_s: float | None = None  # construction, compilation included
    wall_s: float | None = None  # the whole row
    # A/B rows (Paired): DENSE_REF's stack timed in alternation with this row's, per layer
    pair_base_train_ms: float | None = None
    pair_base_infer_ms: float | None = None
    note: str = ""


class OutOfBudget(Exception):
    pass


class Budget:
    def __init__(self, seconds):
        self.end = time.monotonic() + seconds

    def need(self, seconds):
        if seconds > self.end - time.monotonic():
            raise OutOfBudget()


def time_ms(fn, plan, budget):
    """Median over plan.reps of the mean ms of plan.iters calls of fn (CUDA events), after
    plan.warmup calls; raises OutOfBudget when the last warm-up call says the timed calls won't fit."""
    return time_each_ms((fn,), plan, budget)[0]


def time_each_ms(fns, plan, budget):
    """time_ms of each of fns, measured in alternation: every repetition times plan.iters calls of each
    fn in turn (warm-up calls likewise), so a drift of the GPU's clocks over the measurement reaches
    them all alike. A tuple of medians, in the order of fns."""
    for _ in range(plan.warmup - 1):
        for fn in fns:
            fn()
    torch.cuda.synchronize()
    t0 = time.monotonic()
    for fn in fns:
        fn()
    torch.cuda.synchronize()
    budget.need((time.monotonic() - t0) * plan.reps * plan.iters)
    times = tuple([] for _ in fns)
    for _ in range(plan.reps):
        for fn, out in zip(fns, times):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(plan.iters):
                fn()
            end.record()
            end.synchronize()
            out.append(start.elapsed_time(end) / plan.iters)
    return tuple(statistics.median(t) for t in times)


class Paired:
    """An A/B row's constructors: its own stack (`make`) and a stack of the row it is compared with
    (`make_base`, DENSE_REF's), timed in alternation (time_each_ms) so that a drift of the GPU's clocks
    over the case (sustained load) cannot favour the row measured first."""

    def __init__(self, make, make_base):
        self.make, self.make_base = make, make_base


class Runner:
    """Measures rows within a time budget."""

    def __init__(self, budget):
        self.budget = budget
        self.last = {}  # row name -> (B, S, setup seconds, seconds of one training and one inference call)

    def predict(self, row, plan):
        """Seconds the row will take, from the same row at an earlier case (0 when there is none)."""
        if row.impl not in self.last:
            return 0.0
        B, S, setup_s, call_s = self.last[row.impl]
        calls = plan.warmup + plan.reps * plan.iters
        return setup_s + calls * call_s * layer_flops(row.B, row.S) / layer_flops(B, S)

    def run_row(self, row, make):
        t0 = time.monotonic()
        try:
            plan = plan_for(row.S)
            self.budget.need(self.predict(row, plan) * (2 if isinstance(make, Paired) else 1))
            self.measure(row, make, plan)
        except OutOfBudget:
            row.note = SKIPPED if row.train_ms is None else "(inference skipped: time budget)"
        except Exception as e:  # out of memory, a library error: noted in the row, the run goes on
            lines = str(e).strip().splitlines()
            row.note = f"error: {type(e).__name__}: {lines[0] if lines else ''}"
        except BaseException:  # SIGTERM (see main) or Ctrl-C: the table says where the run stopped
            row.note = "(stopped)"
            raise
        row.wall_s = time.monotonic() - t0
        gc.collect()  # what the row allocated is unreachable now that the exception, if any, is gone
        torch.cuda.empty_cache()

    def measure(self, row, make, plan):
        """Fills row from make's bench; for an A/B row (Paired), its bench and its base's stack are timed
        in alternation and the base's times go to the row's pair_base_* fields."""
        pair = make if isinstance(make, Paired) else None
        t0 = time.monotonic()
        benches = []
        try:
            benches.append(pair.make() if pair else make())
            if pair:
                benches.append(pair.make_base())
            bench = benches[0]
            row.setup_s = time.monotonic() - t0
            row.compile_s, row.workspace_mib = bench.compile_s, bench.workspace_mib
            train = time_each_ms(tuple(b.train for b in benches), plan, self.budget)
            row.train_ms = train[0] / bench.layers
            row.saved_counted_mib, row.saved_measured_mib = bench.saved_mib()
            if getattr(bench, "compiled", False):  # inference is a second compilation: about half the first
                self.budget.need(0.5 * (bench.compile_s or 0.0))
            infer = tuple(b.inference() for b in benches)
            row.infer_compile_s = getattr(bench, "infer_compile_s", None)
            if all(f is not None for f in infer):
                infer_ms = time_each_ms(infer, plan, self.budget)
                row.infer_ms = infer_ms[0] / bench.layers
                if pair:
                    row.pair_base_infer_ms = infer_ms[1] / benches[1].layers
            if pair:
                row.pair_base_train_ms = train[1] / benches[1].layers
        finally:
            for b in reversed(benches):
                b.close()
        call_s = (row.train_ms + (row.infer_ms or 0.0)) * bench.layers / 1e3  # one stack's
        self.last[row.impl] = (row.B, row.S, row.setup_s, call_s)


def run_case(rows, specs, measure, emit):
    """Fills the rows of one case (specs from row_specs, in the same order), torch.compile first since
    the others' ratios need it; emit(row) is called as each row is done."""
    ref = next((r for r in rows if r.impl == COMPILE), None)
    for row, (_, make, why_not) in sorted(zip(rows, specs), key=lambda pair: pair[0].impl != COMPILE):
        if make is None:
            row.note = why_not
        else:
            measure(row, make)
        if row.train_ms is not None and ref is not None and ref.train_ms is not None:
            row.ratio = row.train_ms / ref.train_ms
        emit(row)


# ---- the table --------------------------------------------------------------------------------------

HEADER = (f"{'dtype':5} {'B×S':9} {'row':30} {'fwd+bwd':>8} {'ratio':>6} {'infer':>8} {'saved MiB':>9} "
          f"{'saved MiB':>9} {'compile':>8}  note")
UNITS = f"{'':5} {'':9} {'':30} {'ms/layer':>8} {'':6} {'ms/layer':>8} {'counted':>9} {'measured':>9} {'s':>8}"
LEGEND = [
    "ms/layer: a 4-layer stack call / 4 (gemms alone: one layer's GEMMs); fwd+bwd: training forward + backward;",
    "  infer: inference forward (torch.compile: a second compilation, made by the first inference call).",
    "ratio = the row's fwd+bwd ms / torch.compile + SDPA's: < 1 is faster than torch.compile, > 1 slower.",
    "speedup vs compile = torch.compile + SDPA's fwd+bwd ms / ours: > 1 means ours is faster.",
    "saved MiB = 2**20 bytes per sample per layer; counted: dst_layer_config_saved_bytes; measured: ours, device",
    "  free memory used by a training forward into fresh dst_saved objects; torch, memory_allocated growth over",
    "  a training forward (includes each layer's output).",
    "compile s: the first training call of torch.compile (compilation of forward and backward), one per case.",
    "padded: lengths uniform in [S/4, S] (seed fixed); ours with key lengths, torch SDPA with the same lengths as",
    "  an additive mask; ours packed: the same lengths as tokens [N, H] + cu_seqlens (dst_layer_forward_packed).",
    "graph: eager calls, then the same calls captured with torch.cuda.CUDAGraph on the library's stream",
    "  (torch's current one) and replayed; dropout as in the table, new masks at every replay (docs/rng.md).",
    "sweep: fwd+bwd µs per token per layer, key-length mask (ours) / additive mask (torch.compile, batch",
    "  dimension dynamic: one compilation per S); plotted in batch_token_sweep.svg with --out.",
]


def fmt(value, spec):
    return "-" if value is None else format(value, spec)


def row_line(r):
    line = (f"{r.dtype:5} {f'{r.B}×{r.S}':9} {r.impl:30} {fmt(r.train_ms, '.3f'):>8} {fmt(r.ratio, '.2f'):>6} "
            f"{fmt(r.infer_ms, '.3f'):>8} {fmt(r.saved_counted_mib, '.2f'):>9} "
            f"{fmt(r.saved_measured_mib, '.2f'):>9} {fmt(r.compile_s, '.1f'):>8}  {r.note[:120]}")
    return line.rstrip()


def speedups(rows):
    """torch.compile's fwd+bwd time / ours, for SPEEDUP_ROWS (None where either is missing)."""
    by_name = {r.impl: r.train_ms for r in rows}
    ref = by_name.get(COMPILE)
    return {name: ref / by_name[name] if ref is not None and by_name.get(name) is not None else None
            for name in SPEEDUP_ROWS if name not in OPTIONAL_ROWS or name in by_name}


def speedup_line(rows):
    r = rows[0]
    parts = ", ".join(f"{'-' if v is None else f'{v:.2f}×'} ({name})" for name, v in speedups(rows).items())
    line = f"{r.dtype:5} {f'{r.B}×{r.S}':9} speedup vs compile: {parts}"
    pairs = [p for p in rows if p.pair_base_train_ms is not None]
    for p in pairs:  # the A/B rows: against DENSE_REF's stack timed in alternation with them
        line += (f"\n{r.dtype:5} {f'{r.B}×{r.S}':9} A/B in alternation: {p.impl} / {DENSE_REF} = fwd+bwd "
                 f"{p.train_ms:.3f} / {p.pair_base_train_ms:.3f} ms ({ratio_text(p.train_ms, p.pair_base_train_ms)})"
                 f", inference {fmt(p.infer_ms, '.3f')} / {fmt(p.pair_base_infer_ms, '.3f')} ms "
                 f"({ratio_text(p.infer_ms, p.pair_base_infer_ms)})")
    return line


def ratio_text(num, den):
    return "-" if num is None or den is None else f"{num / den:.2f}×"


def case_line(kind, rows, dense_ref):
    """The line that ends a case: speedups (dense), the padded rows against ours dense at the same shape
    (`dense_ref`: that row's fwd+bwd ms, or None), or the graph replay against eager."""
    if kind == "dense":
        return speedup_line(rows)
    r, by_name = rows[0], {x.impl: x for x in rows}
    head = f"{r.dtype:5} {f'{r.B}×{r.S}':9} "
    if kind == "padded":
        ours, sdpa, packed = by_name.get(PADDED_OURS), by_name.get(PADDED_SDPA), by_name.get(PADDED_PACKED)
        return (head + f"padded (lengths uniform in [S/4, S]): ours key lengths = "
                f"{ratio_text(ours and ours.train_ms, dense_ref)}, ours packed = "
                f"{ratio_text(packed and packed.train_ms, dense_ref)} ours dense ({DENSE_REF}); torch SDPA padded / ours = "
                f"{ratio_text(sdpa and sdpa.train_ms, ours and ours.train_ms)}")
    eager, replay = by_name.get(GRAPH_EAGER), by_name.get(GRAPH_REPLAY)
    return (head + f"CUDA graph replay / eager: fwd+bwd {ratio_text(replay and replay.train_ms, eager and eager.train_ms)}, "
            f"inference {ratio_text(replay and replay.infer_ms, eager and eager.infer_ms)}")


def dense_ref_ms(cases, dtype, B, S):
    """Ours' dense fwd+bwd ms (DENSE_REF) at dtype and B×S from the cases run so far, or None."""
    for kind, rows in cases:
        for r in rows:
            if kind == "dense" and r.impl == DENSE_REF and (r.dtype, r.B, r.S) == (dtype, B, S):
                return r.train_ms
    return None


# ---- the batch-token sweep ----------------------------------------------------------------------------

@dataclasses.dataclass
class SweepPoint:
    dtype: str
    S: int
    tokens: int
    B: int
    impl: str
    us_per_token: float | None = None  # fwd+bwd per layer, microseconds per token
    note: str = ""


class SweepCompile:
    """A torch.compile + SDPA stack of one S for every B of the sweep: one compilation, with the batch
    dimension marked dynamic (a compilation per point would not fit a GPU call)."""
    layers, compile_s = LAYERS, None

    def __init__(self, dname, S):
        self.dtype, self.S = DTYPES[dname], S
        self.stack = nn.Sequential(*[TorchLayer("sdpa") for _ in range(LAYERS)]).to(DEVICE, self.dtype)

        def run(x, mask):
            for layer in self.stack:
                x = layer(x, mask)
            return x

        self.fwd = torch.compile(run)  # dynamic=None: the dimensions marked below stay dynamic

    def at(self, B):
        """The training call at batch B."""
        x = torch.randn(B, self.S, H, device=DEVICE, dtype=self.dtype, requires_grad=True)
        dy = torch.randn(B, self.S, H, device=DEVICE, dtype=self.dtype)
        mask = additive_mask(B, self.S, self.dtype).view(B, 1, 1, self.S)
        torch._dynamo.mark_dynamic(x, 0)
        torch._dynamo.mark_dynamic(mask, 0)

        def train():
            x.grad = None
            self.stack.zero_grad()
            self.fwd(x, mask).backward(dy)

        return train

    def close(self):
        torch._dynamo.reset()


def sweep_shapes():
    return [(S, T, T // S) for S in SWEEP_S for T in SWEEP_TOKENS if T >= S]


def run_sweep(lib, dname, args, budget, emit):
    """Measures the sweep points in order (per S: ours, then torch.compile), within the budget."""
    points, compiled = [], {}
    last = {}  # impl -> (seconds of the last point, its tokens)
    try:
        for S, T, B in sweep_shapes():
            for impl in (SWEEP_OURS, SWEEP_COMPILE):
                if impl == SWEEP_COMPILE and args.skip_compile:
                    continue
                pt = SweepPoint(dname, S, T, B, impl)
                points.append(pt)
                t0 = time.monotonic()
                try:
                    if impl in last:
                        budget.need(last[impl][0] * T / last[impl][1])
                    if impl == SWEEP_OURS:
                        bench = Ours(lib, dname, B, S, True, {})
                        try:
                            ms = time_ms(bench.train, SWEEP_PLAN, budget)
                        finally:
                            bench.close()
                    else:
                        if S not in compiled:
                            budget.need(40.0)  # a first compilation (compare the "compile s" column)
                            compiled[S] = SweepCompile(dname, S)
                        ms = time_ms(compiled[S].at(B), SWEEP_PLAN, budget)
                    pt.us_per_token = ms / LAYERS * 1e3 / T
                    last[impl] = (time.monotonic() - t0, T)
                except OutOfBudget:
                    pt.note = SKIPPED
                except Exception as e:  # out of memory, a library error: noted, the sweep goes on
                    lines = str(e).strip().splitlines()
                    pt.note = f"error: {type(e).__name__}: {lines[0] if lines else ''}"[:120]
                gc.collect()
                torch.cuda.empty_cache()
                emit(pt)
    finally:
        for c in compiled.values():
            c.close()
    return points


def steps(points):
    """Issue 11's reading of the sweep: neighbouring measured calls of the same row and S whose per-token
    times differ by more than CLIFF× in either direction, as (point, neighbour, ratio) with the slower
    point first. Unlike cliffs(), a small call that is slower per token than the next larger one counts
    (launch- and wave-bound small calls)."""
    out = []
    for key in sorted({(p.impl, p.S) for p in points}):
        series = sorted((p for p in points if (p.impl, p.S) == key and p.us_per_token is not None),
                        key=lambda p: p.tokens)
        for p, q in zip(series, series[1:]):
            slow, fast = (p, q) if p.us_per_token >= q.us_per_token else (q, p)
            if slow.us_per_token > CLIFF * fast.us_per_token:
                out.append((slow, fast, slow.us_per_token / fast.us_per_token))
    return out


def cliffs(points):
    """Cliffs of the sweep: points whose per-token time exceeds CLIFF × that of the next smaller measured
    call of the same row and S (per-token time should fall, or stay, as calls grow): the steps() whose
    slower point is the larger call."""
    return [slow for slow, fast, _ in steps(points) if slow.tokens > fast.tokens]


def sweep_line(p):
    return (f"{p.dtype:5} S={p.S:<4} {p.tokens:>6} tokens (B={p.B:<4}) {p.impl:22} "
            f"{fmt(p.us_per_token, '.4f'):>8} µs/token/layer  {p.note}").rstrip()


def sweep_svg(points, title):
    """An SVG line plot of the sweep: fwd+bwd µs per token per layer over tokens per call (log 2), one line
    per (row, S). Written by hand: no plotting library is needed on the GPU machine."""
    series = {}
    for p in points:
        if p.us_per_token is not None:
            series.setdefault((p.impl, p.S), []).append((p.tokens, p.us_per_token))
    W, Hh, L, R, T, B = 720, 420, 70, 220, 40, 50
    xs = [math.log2(t) for t in SWEEP_TOKENS]
    ymax = max([y for pts in series.values() for _, y in pts] + [1e-9]) * 1.1

    def px(tokens):
        return L + (math.log2(tokens) - xs[0]) / (xs[-1] - xs[0]) * (W - L - R)

    def py(y):
        return Hh - B - y / ymax * (Hh - T - B)

    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{Hh}" font-family="sans-serif" '
           f'font-size="12">', f'<rect width="{W}" height="{Hh}" fill="white"/>',
           f'<text x="{L}" y="22" font-size="14">{html.escape(title)}</text>',
           f'<line x1="{L}" y1="{Hh - B}" x2="{W - R}" y2="{Hh - B}" stroke="black"/>',
           f'<line x1="{L}" y1="{T}" x2="{L}" y2="{Hh - B}" stroke="black"/>',
           f'<text x="{(L + W - R) / 2}" y="{Hh - 12}" text-anchor="middle">tokens per call (B·S)</text>',
           f'<text x="16" y="{(T + Hh - B) / 2}" transform="rotate(-90 16 {(T + Hh - B) / 2})" '
           f'text-anchor="middle">fwd+bwd µs per token per layer</text>']
    for t in SWEEP_TOKENS:
        out.append(f'<line x1="{px(t):.1f}" y1="{Hh - B}" x2="{px(t):.1f}" y2="{Hh - B + 5}" stroke="black"/>')
        out.append(f'<text x="{px(t):.1f}" y="{Hh - B + 18}" text-anchor="middle">{t // 1024}K</text>')
    for k in range(6):
        y = ymax / 1.1 * k / 5
        out.append(f'<line x1="{L - 5}" y1="{py(y):.1f}" x2="{W - R}" y2="{py(y):.1f}" stroke="#ddd"/>')
        out.append(f'<text x="{L - 8}" y="{py(y) + 4:.1f}" text-anchor="end">{y:.3f}</text>')
    colours = {(SWEEP_OURS, 128): "#1f77b4", (SWEEP_OURS, 512): "#17becf", (SWEEP_COMPILE, 128): "#d62728",
               (SWEEP_COMPILE, 512): "#ff9896"}
    for i, (key, pts) in enumerate(sorted(series.items())):
        c = colours.get(key, "#555")
        xy = " ".join(f"{px(t):.1f},{py(y):.1f}" for t, y in sorted(pts))
        out.append(f'<polyline points="{xy}" fill="none" stroke="{c}" stroke-width="2"/>')
        out += [f'<circle cx="{px(t):.1f}" cy="{py(y):.1f}" r="3" fill="{c}"/>' for t, y in pts]
        ly = T + 10 + 20 * i
        out.append(f'<line x1="{W - R + 15}" y1="{ly}" x2="{W - R + 40}" y2="{ly}" stroke="{c}" stroke-width="2"/>')
        out.append(f'<text x="{W - R + 46}" y="{ly + 4}">{html.escape(key[0])}, S={key[1]}</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


class Report:
    """The rows of all cases: the table, and compare_torch.json (and the sweep's SVG) in `out`."""

    def __init__(self, out, info):
        self.out, self.info, self.cases, self.sweep = out, info, [], []

    def print_table(self):
        print(f"\n{HEADER}\n{UNITS}\n{'-' * len(HEADER)}")
        for kind, rows in self.cases:
            for r in rows:
                print(row_line(r))
            print(case_line(kind, rows, dense_ref_ms(self.cases, rows[0].dtype, rows[0].B, rows[0].S)))
        if self.sweep:
            print("\nbatch-token sweep (fwd+bwd per token per layer):")
            for p in self.sweep:
                print(sweep_line(p))
            flagged = cliffs(self.sweep)
            print(f"cliffs (per-token time > {CLIFF}× the next smaller call's): "
                  + (", ".join(f"{p.impl} S={p.S} {p.tokens}" for p in flagged) if flagged else "none"))
            apart = steps(self.sweep)
            print(f"neighbours more than {CLIFF}× apart per token: "
                  + (", ".join(f"{a.impl} S={a.S} {a.tokens} ({r:.2f}× its {b.tokens}-token neighbour)"
                               for a, b, r in apart) if apart else "none"))
        print("\n".join(LEGEND), flush=True)

    def write(self, wall_s):
        if not self.out:
            return
        data = dict(self.info, wall_s=wall_s,
                    cases=[{"kind": kind, "dtype": rows[0].dtype, "B": rows[0].B, "S": rows[0].S,
                            "compile_s": next((r.compile_s for r in rows if r.impl == COMPILE), None),
                            "speedup_vs_compile": speedups(rows) if kind == "dense" else None,
                            "summary": case_line(kind, rows, dense_ref_ms(self.cases, rows[0].dtype, rows[0].B,
                                                                          rows[0].S))}
                           for kind, rows in self.cases],
                    rows=[dict(dataclasses.asdict(r), kind=kind) for kind, rows in self.cases for r in rows],
                    sweep=[dataclasses.asdict(p) for p in self.sweep],
                    sweep_cliffs=[dataclasses.asdict(p) for p in cliffs(self.sweep)],
                    sweep_steps=[{"impl": a.impl, "S": a.S, "tokens": a.tokens, "neighbour_tokens": b.tokens,
                                  "ratio": r} for a, b, r in steps(self.sweep)])
        os.makedirs(self.out, exist_ok=True)
        path = os.path.join(self.out, "compare_torch.json")
        with open(path + ".tmp", "w") as f:
            json.dump(data, f, indent=1)
        os.replace(path + ".tmp", path)  # a run stopped while writing keeps the previous file
        if any(p.us_per_token is not None for p in self.sweep):
            svg = os.path.join(self.out, "batch_token_sweep.svg")
            with open(svg + ".tmp", "w") as f:
                f.write(sweep_svg(self.sweep, f"libdstransformer {self.info.get('library')} vs torch.compile, "
                                              f"{self.sweep[0].dtype}, BERT-Large layer, {self.info.get('device')}"))
            os.replace(svg + ".tmp", svg)


# ---- self-test: the table from made-up numbers, without a GPU or the library -------------------------

def fake_measure(row, make):
    """Fills a row with made-up numbers; the last case gets an error and a skipped row; an A/B row
    (Paired) its pair's base too."""
    base = 1.5 + layer_flops(row.B, row.S) / layer_flops(64, 128) * (1.0 if row.dtype == "fp16" else 0.97)
    if row.S >= 16384 and row.impl == "ours, additive":
        row.note = "error: DstError: status 6: cuda backend: cannot allocate 34359738368 bytes on device 0"
        return
    if row.S >= 16384 and row.impl == "ours, key lengths, stochastic":
        row.note = SKIPPED
        return
    scale = {GEMMS: 0.6, SDPA: 1.15, COMPILE: 1.0, PLAIN: 1.5, "ours, key lengths": 1.2,
             "ours, key lengths + 3 switches": 1.3, "ours, key lengths, stochastic": 1.18, PADDED_OURS: 0.8,
             PADDED_SDPA: 1.1, GRAPH_EAGER: 1.1, GRAPH_REPLAY: 0.9}.get(row.impl, 1.25)
    row.train_ms = base * scale
    row.infer_ms = row.train_ms / 3
    if row.impl != GEMMS:
        row.saved_measured_mib = 0.032 * row.S * (1.1 if row.impl.startswith("torch") else 1.2)
    if "ours" in row.impl:
        row.saved_measured_mib *= 0.55 if "switches" in row.impl else 1.0
        row.saved_counted_mib = row.saved_measured_mib - 0.01
        row.workspace_mib = row.B * row.S * 0.05
    if row.impl == COMPILE:
        row.compile_s = 38.0 + row.S / 1000
        row.infer_compile_s = 20.0 + row.S / 1000
    if isinstance(make, Paired):
        row.pair_base_train_ms, row.pair_base_infer_ms = row.train_ms * 0.99, row.infer_ms * 1.01


def fake_sweep(dname, emit):
    """Made-up sweep points (one skipped, one with a cliff), for the self-test."""
    points = []
    for S, T, B in sweep_shapes():
        for impl in (SWEEP_OURS, SWEEP_COMPILE):
            p = SweepPoint(dname, S, T, B, impl)
            if S == 512 and T == SWEEP_TOKENS[-1] and impl == SWEEP_COMPILE:
                p.note = SKIPPED
            else:
                p.us_per_token = (0.5 if impl == SWEEP_OURS else 0.45) * (1 + 2048 / T) * (1.1 if S == 512 else 1.0)
                if impl == SWEEP_OURS and S == 128 and T == 8192:
                    p.us_per_token *= 1.6  # a cliff
            points.append(p)
            emit(p)
    return points


# ---- main ---------------------------------------------------------------------------------------------

def parse_args():
    def shapes(text, allow_none=False):
        if allow_none and text == "none":
            return []
        try:
            out = [tuple(int(v) for v in item.split("x")) for item in text.split(",")]
        except ValueError:
            out = []
        if not out or any(len(s) != 2 or min(s) < 1 for s in out):
            raise argparse.ArgumentTypeError(f"expected BxS[,BxS...] such as 64x128,16x512, got {text!r}")
        return out

    def dtypes(text):
        names = text.split(",")
        if any(n not in DTYPES for n in names):
            raise argparse.ArgumentTypeError(f"expected a list of {', '.join(DTYPES)}, got {text!r}")
        return names

    ap = argparse.ArgumentParser(description="libdstransformer against PyTorch, one table (see the module docstring)")
    ap.add_argument("--dtypes", type=dtypes, default=DEFAULT_DTYPES,
                    help="comma-separated, in order (default %(default)s)")
    ap.add_argument("--shapes", type=shapes, default=SHAPES,
                    help="BxS, comma-separated, in order (default %(default)s)")
    ap.add_argument("--skip-compile", action="store_true", help="no torch.compile rows")
    ap.add_argument("--skip-eager", action="store_true", help="no torch eager rows (SDPA and plain attention)")
    ap.add_argument("--no-compile-inference", action="store_true",
                    help="no inference column for torch.compile (its second compilation)")
    ap.add_argument("--padded-shapes", type=functools.partial(shapes, allow_none=True), default=PADDED_SHAPES,
                    help="BxS of the padding-distribution case, lengths uniform in [S/4, S] (default "
                         "%(default)s; none: no such case)")
    ap.add_argument("--unfused-gemm-row", action="store_true",
                    help="add the row 'ours, key lengths, unfused GEMMs' (a context with DST_FUSED_GEMM=0)")
    ap.add_argument("--ln-passes-row", action="store_true",
                    help="add the row 'ours, key lengths, LN passes' (a context with DST_LN_ONE_PASS=0)")
    ap.add_argument("--dgelu-colsum-row", action="store_true",
                    help="add the row 'ours, key lengths, dGELU column_sum' (a context with DST_DGELU_TILE_SUMS=0)")
    ap.add_argument("--no-graphs", action="store_true", help="no CUDA-graph case (the stack at 8x128)")
    ap.add_argument("--no-sweep", action="store_true", help="no batch-token sweep (1K-64K tokens at S=128 and 512)")
    ap.add_argument("--budget", type=float, default=400.0,
                    help="seconds for the whole run; rows that would not fit are skipped (default %(default).0f)")
    ap.add_argument("--out", default=None, help="folder for compare_torch.json and batch_token_sweep.svg")
    ap.add_argument("--selftest", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if isinstance(args.padded_shapes, str):  # argparse does not convert a string default through `type`
        args.padded_shapes = shapes(args.padded_shapes, allow_none=True)
    return args


def case_plan(args):
    """(kind, dtype, B, S) of every case, in run order: per dtype the dense shapes, the padded ones and the
    CUDA-graph case."""
    plan = []
    for dname in args.dtypes:
        plan += [("dense", dname, B, S) for B, S in args.shapes]
        plan += [("padded", dname, B, S) for B, S in args.padded_shapes]
        if not args.no_graphs:
            plan.append(("graph", dname) + GRAPH_SHAPE)
    return plan


def main():
    args = parse_args()
    t0, budget = time.monotonic(), Budget(args.budget)
    # `timeout` stops us with SIGTERM: leave through the finally below, which prints the table.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(f"compare_torch: stopped by signal {signum}"))
    if args.selftest:
        lib, measure, stream = None, fake_measure, contextlib.nullcontext()
        info = {"library": "selftest", "torch": torch.__version__, "device": "none"}
    else:
        if not torch.cuda.is_available():
            sys.exit("compare_torch: needs a CUDA GPU (torch.cuda.is_available() is false); nothing was measured")
        lib = dc.Lib()
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        measure = Runner(budget).run_row
        # torch's default stream is the legacy NULL stream, handle 0, which dst_context_set_stream takes
        # as "the context's own stream": a non-blocking stream that CUDA events on torch's stream do not
        # wait for. So torch and the library share one created stream.
        stream = torch.cuda.stream(torch.cuda.Stream())
        info = {"library": lib.version(), "torch": torch.__version__, "device": torch.cuda.get_device_name()}
    if args.no_compile_inference:
        TorchStack.inference_compiled = False
    info.update(dtypes=args.dtypes, shapes=[f"{B}x{S}" for B, S in args.shapes], budget_s=args.budget,
                padded_shapes=[f"{B}x{S}" for B, S in args.padded_shapes], padding_seed=PADDING_SEED,
                graphs=not args.no_graphs, sweep=not args.no_sweep,
                plans={f"S={S}": plan_for(S)._asdict() for S in sorted({S for _, S in args.shapes})})
    print(f"libdstransformer {info['library']}, torch {info['torch']}, {info['device']}; BERT-Large layer "
          f"(H={H}, {HEADS} heads of {D}, I={I}), Pre-LN, dropout {P}, {LAYERS}-layer stack; "
          f"budget {args.budget:.0f} s")
    print(f"{HEADER}\n{UNITS}", flush=True)
    report = Report(args.out, info)
    try:
        with stream:
            for kind, dname, B, S in case_plan(args):
                specs = row_specs(lib, kind, dname, B, S, args)
                rows = [Row(dname, B, S, name) for name, _, _ in specs]
                report.cases.append((kind, rows))  # filled in place: a run stopped mid-case still reports them
                run_case(rows, specs, measure, emit=lambda r: print(row_line(r), flush=True))
                print(case_line(kind, rows, dense_ref_ms(report.cases, dname, B, S)), flush=True)
                report.write(time.monotonic() - t0)
            if not args.no_sweep:
                dname = args.dtypes[0]
                print(f"batch-token sweep, {dname}: {', '.join(f'{t // 1024}K' for t in SWEEP_TOKENS)} tokens at "
                      f"S={' and '.join(map(str, SWEEP_S))}", flush=True)

                def emit(p):
                    report.sweep.append(p)
                    print(sweep_line(p), flush=True)

                if args.selftest:
                    fake_sweep(dname, emit)
                else:
                    run_sweep(lib, dname, args, budget, emit)
                report.write(time.monotonic() - t0)
    finally:
        wall_s = time.monotonic() - t0
        report.print_table()
        report.write(wall_s)
        print(f"total wall time: {wall_s:.1f} s", flush=True)


if __name__ == "__main__":
    main()
