#!/usr/bin/env python3
"""Times libdstransformer against plain PyTorch layers, in the same process, on the same GPU.

Per BERT-Large layer (H=1024, 16 heads, I=4096), Pre-LN, dropout 0.1, additive padding mask, a
stack of 4 layers, forward+backward and inference, for each shape and dtype:
  - torch eager, plain attention (matmul + fp32 softmax + dropout + matmul)
  - torch eager, scaled_dot_product_attention
  - torch.compile + SDPA
  - libdstransformer (CUDA backend, through ctypes on torch's current stream), additive mask and
    key-length mask
Reports ms/layer (median of 5 repetitions of 10 iterations, CUDA events; torch.compile inference is
not measured, to keep one compilation per case), the ratio of each baseline
to ours (> 1 means we are faster), and saved-activation MB per sample per layer (torch: measured
growth of allocated memory over a training forward, including each layer's output; ours: the
library's own count, dst_layer_config_saved_bytes, which includes the layer input copy it keeps).

usage: DST_LIB=path/libdstransformer.so python3 bench/compare_torch.py [--quick] [--out DIR]
"""
import argparse
import ctypes
import json
import math
import os
import statistics
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import dst_ctypes as dc  # noqa: E402

H, HEADS, I, LAYERS, P = 1024, 16, 4096, 4, 0.1


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
        d = H // HEADS
        q, k, v = self.qkv(self.ln1(x)).view(B, S, 3, HEADS, d).permute(2, 0, 3, 1, 4)
        if self.attn == "sdpa":
            ctx = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=P if self.training else 0.0)
        else:
            s = (q @ k.transpose(-1, -2)) * (1.0 / math.sqrt(d)) + mask
            p = F.dropout(torch.softmax(s.float(), dim=-1).to(x.dtype), P, self.training)
            ctx = p @ v
        r = x + F.dropout(self.o(ctx.transpose(1, 2).reshape(B, S, H)), P, self.training)
        return r + F.dropout(self.fc2(F.gelu(self.fc1(self.ln2(r)))), P, self.training)


def time_ms(fn, reps, iters):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(iters):
            fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) / iters)
    return statistics.median(times)


def torch_case(kind, dtype, B, S, reps, iters):
    stack = nn.Sequential(*[TorchLayer("plain" if kind == "eager" else "sdpa") for _ in range(LAYERS)])
    stack = stack.cuda().to(dtype)
    x = torch.randn(B, S, H, device="cuda", dtype=dtype, requires_grad=True)
    mask = torch.zeros(B, 1, 1, S, device="cuda", dtype=dtype)
    mask[B // 2:, ..., S - S // 4:] = -10000.0
    run = lambda inp: [inp := layer(inp, mask) for layer in stack][-1]  # noqa: E731
    fwd = torch.compile(run) if kind == "compile" else run
    dy = torch.randn(B, S, H, device="cuda", dtype=dtype)

    def train_step():
        x.grad = None
        fwd(x).backward(dy)

    stack.train()
    t_train = time_ms(train_step, reps, iters) / LAYERS
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    y = fwd(x)
    saved = (torch.cuda.memory_allocated() - base) / B / LAYERS
    del y
    stack.eval()
    if kind == "compile":  # a second compilation (eval, no grad) would double the run's time
        return t_train, float("nan"), saved
    with torch.no_grad():
        t_inf = time_ms(lambda: fwd(x), reps, iters) / LAYERS
    return t_train, t_inf, saved


def ours_case(lib, dtype, B, S, reps, iters, mask_kind, switches):
    L = lib.lib
    ctx = lib.context(dc.BACKEND_CUDA)
    lib.check(L.dst_context_set_stream(ctx, ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)))
    dname = {torch.float16: "fp16", torch.bfloat16: "bf16"}[dtype]
    cfg = lib.config(hidden_size=H, heads=HEADS, intermediate_size=I, attn_dropout_ratio=P, hidden_dropout_ratio=P,
                     num_hidden_layers=LAYERS, dtype=dname, max_batch_tokens=B * S, max_seq_len=S,
                     pre_layer_norm=1, **switches)
    layers = [lib.layer(ctx, cfg) for _ in range(LAYERS)]
    xs = [torch.randn(B, S, H, device="cuda", dtype=dtype)] + [torch.empty(B, S, H, device="cuda", dtype=dtype)
                                                               for _ in range(LAYERS)]
    gs = [torch.empty(B, S, H, device="cuda", dtype=dtype) for _ in range(LAYERS)] + [
        torch.randn(B, S, H, device="cuda", dtype=dtype)]
    if mask_kind == dc.MASK_ADDITIVE:
        mt = torch.zeros(B, S, device="cuda", dtype=dtype)
        mt[B // 2:, S - S // 4:] = -10000.0
        m = dc.mask(dc.MASK_ADDITIVE, mt.data_ptr(), dname, (B, S))
    else:
        mt = torch.full((B,), S, device="cuda", dtype=torch.int32)
        mt[B // 2:] = S - S // 4
        m = dc.mask(dc.MASK_KEY_LENGTHS, mt.data_ptr(), "int32", (B,))
    tx = [dc.tensor(t.data_ptr(), dname, (B, S, H)) for t in xs]
    tg = [dc.tensor(t.data_ptr(), dname, (B, S, H)) for t in gs]

    def forward():
        for i, lay in enumerate(layers):
            lib.check(L.dst_layer_forward(lay, None, ctypes.byref(tx[i]), ctypes.byref(m), ctypes.byref(tx[i + 1])))

    def train_step():
        forward()
        for i in reversed(range(LAYERS)):
            lib.check(L.dst_layer_backward(layers[i], None, ctypes.byref(tg[i + 1]), ctypes.byref(tg[i]), 0))

    t_train = time_ms(train_step, reps, iters) / LAYERS
    for lay in layers:
        lib.check(L.dst_layer_set_training(lay, 0))
    t_inf = time_ms(forward, reps, iters) / LAYERS
    saved = lib.saved_bytes(cfg, B, S) / B
    for lay in layers:
        L.dst_layer_destroy(lay)
    L.dst_context_destroy(ctx)
    return t_train, t_inf, saved


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="fewer iterations, fp16 only")
    ap.add_argument("--out", default=None, help="folder for compare_torch.json")
    args = ap.parse_args()
    reps, iters = (3, 5) if args.quick else (5, 10)
    lib = dc.Lib()
    torch.backends.cuda.matmul.allow_tf32 = False
    print(f"libdstransformer {lib.version()}, torch {torch.__version__}, {torch.cuda.get_device_name()}")
    rows = []
    dtypes = [torch.float16] if args.quick else [torch.float16, torch.bfloat16]
    for dtype in dtypes:
        for B, S in ((64, 128), (16, 512)):
            res = {}
            for kind in ("eager", "sdpa", "compile"):
                res[f"torch {kind}"] = torch_case(kind, dtype, B, S, reps, iters)
            res["dst additive"] = ours_case(lib, dtype, B, S, reps, iters, dc.MASK_ADDITIVE, {})
            res["dst lengths"] = ours_case(lib, dtype, B, S, reps, iters, dc.MASK_KEY_LENGTHS, {})
            res["dst lengths, attn ckpt"] = ours_case(lib, dtype, B, S, reps, iters, dc.MASK_KEY_LENGTHS,
                                                      {"attn_dropout_checkpoint": 1})
            ref = res["dst additive"]
            for name, (tt, ti, sv) in res.items():
                rows.append({"dtype": str(dtype).split(".")[-1], "B": B, "S": S, "impl": name,
                             "train_ms_per_layer": tt, "infer_ms_per_layer": ti, "saved_MB_per_sample_layer": sv / 1e6,
                             "train_ratio_vs_dst": tt / ref[0], "infer_ratio_vs_dst": ti / ref[1]})
    hdr = f"{'dtype':9} {'B':>3} {'S':>4}  {'impl':24} {'fwd+bwd ms':>10} {'ratio':>6} {'infer ms':>9} {'ratio':>6} {'saved MB':>8}"
    print(hdr)
    print("-" * len(hdr))
    for r in rows:
        print(f"{r['dtype']:9} {r['B']:>3} {r['S']:>4}  {r['impl']:24} {r['train_ms_per_layer']:10.3f} "
              f"{r['train_ratio_vs_dst']:6.2f} {r['infer_ms_per_layer']:9.3f} {r['infer_ratio_vs_dst']:6.2f} "
              f"{r['saved_MB_per_sample_layer']:8.2f}")
    print("ratio = that implementation's time / libdstransformer (additive mask); > 1 means libdstransformer is faster")
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "compare_torch.json"), "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
