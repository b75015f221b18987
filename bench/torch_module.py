"""The PyTorch module's training step: dstransformer.torch.TransformerLayer as a user drops it in.

A 4-layer stack of BERT-Large layers (H=1024, 16 heads, I=4096, Pre-LN, dropout 0.1, fp16 by default),
an additive padding mask [B, 1, 1, S] as DeepSpeed's layer takes it (lengths uniform in [S/2, S], fixed
seed), forward then backward from a fixed output gradient, on torch's current stream. Rows, timed in
the same process:

  kept        the module as shipped: each backward keeps its forward's saved-activations object, memory
              included, for the next forward
  per step    TransformerLayer._keep_saved_objects = False: each backward destroys its object and each
              forward creates and fills a new one (a cudaMalloc and a cudaFree per layer and step;
              cudaFree makes the device wait)
  graph       the same step (kept objects) captured once with torch.cuda.graph after warm-up steps on a
              side stream, then replayed (each replay draws new dropout masks: docs/rng.md)

ms per layer, fwd+bwd: the median of REPS chunks of ITERS steps (the two rows' chunks alternate, each
starting with no kept objects, after WARMUP steps of each; the graph's REPS chunks of ITERS replays
follow), timed with CUDA events; the last columns are per step / kept and graph / kept. Needs the SWIG module (tools/run-python-gpu.sh builds it on
the GPU machine; it runs this script after the tests) and a GPU.

  python3 bench/torch_module.py [--dtype fp16|bf16] [--shapes 64x128,16x512] [--out DIR]
"""
import argparse
import json
import os
import statistics
import sys

LAYERS, WARMUP, REPS, ITERS = 4, 3, 5, 10
DTYPES = ("fp16", "bf16")


def stack(B, S, dname):
    import torch
    from dstransformer.torch import TransformerConfig, TransformerLayer

    cfg = TransformerConfig(batch_size=B, max_seq_length=S, hidden_size=1024, intermediate_size=4096, heads=16,
                            attn_dropout_ratio=0.1, hidden_dropout_ratio=0.1, num_hidden_layers=LAYERS,
                            initializer_range=0.02, pre_layer_norm=True, dtype=dname)
    return torch.nn.ModuleList([TransformerLayer(cfg, device="cuda") for _ in range(LAYERS)])


def time_modes(layers, x, mask, dy):
    """{mode: median ms per step}: the two modes alternate, REPS chunks of ITERS steps each (forward +
    backward of the stack), after WARMUP steps of each."""
    import torch

    from dstransformer.torch import TransformerLayer

    def step():
        h = x
        for layer in layers:
            h = layer(h, mask)
        h.backward(dy)

    def chunk(keep, iters, timed):
        TransformerLayer._keep_saved_objects = keep
        try:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda.synchronize()
            start.record()
            for _ in range(iters):
                step()
            end.record()
            torch.cuda.synchronize()
            return start.elapsed_time(end) / iters if timed else None
        finally:
            TransformerLayer._keep_saved_objects = True
            for layer in layers:  # each chunk starts with no kept objects
                layer.free_saved_memory()

    modes = {"kept": True, "per_step": False}
    for keep in modes.values():
        chunk(keep, WARMUP, False)
    times = {name: [] for name in modes}
    for _ in range(REPS):
        for name, keep in modes.items():
            times[name].append(chunk(keep, ITERS, True))
    return {name: statistics.median(t) for name, t in times.items()}


def time_graph(layers, x, mask, dy):
    """Median ms per replay of one captured training step of the stack (REPS chunks of ITERS replays)."""
    import torch

    def step():
        h = x
        for layer in layers:
            h = layer(h, mask)
        h.backward(dy)

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(WARMUP):
            step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    times = []
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for _ in range(REPS):
        torch.cuda.synchronize()
        start.record()
        for _ in range(ITERS):
            graph.replay()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / ITERS)
    del graph
    for layer in layers:
        layer.free_saved_memory(graphs=True)
    return statistics.median(times)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dtype", default="fp16", choices=DTYPES)
    ap.add_argument("--shapes", default="64x128,16x512", help="BxS,... (default 64x128,16x512)")
    ap.add_argument("--out", help="folder for torch_module.json")
    args = ap.parse_args()
    import torch

    import dstransformer as dst

    if not torch.cuda.is_available() or dst.cuda_device_count() == 0:
        print("torch_module: no CUDA device (torch or the library)", file=sys.stderr)
        return 2
    dt = {"fp16": torch.float16, "bf16": torch.bfloat16}[args.dtype]
    rows = []
    print(f"dstransformer.torch.TransformerLayer, {LAYERS}-layer BERT-Large stack, {args.dtype}, Pre-LN, dropout 0.1, "
          f"additive padding mask; fwd+bwd ms per layer (median of {REPS}x{ITERS} steps)")
    print(f"{'B x S':>8} | {'kept':>8} | {'per step':>8} | {'graph':>8} | per step / kept | graph / kept")
    for shape in args.shapes.split(","):
        B, S = (int(v) for v in shape.lower().split("x"))
        torch.manual_seed(1234)
        layers = stack(B, S, args.dtype)
        x = torch.randn(B, S, 1024, device="cuda", dtype=dt, requires_grad=True)
        dy = torch.randn(B, S, 1024, device="cuda", dtype=dt)
        lengths = torch.randint(S // 2, S + 1, (B,), device="cuda")
        keep = torch.arange(S, device="cuda")[None, :] < lengths[:, None]
        mask = torch.zeros(B, 1, 1, S, device="cuda", dtype=dt).masked_fill(~keep[:, None, None, :], -10000.0)
        result = {"B": B, "S": S, "dtype": args.dtype}
        result.update({name: ms / LAYERS for name, ms in time_modes(layers, x, mask, dy).items()})
        result["graph"] = time_graph(layers, x, mask, dy) / LAYERS
        rows.append(result)
        print(f"{B:>4} x {S:<3} | {result['kept']:8.3f} | {result['per_step']:8.3f} | {result['graph']:8.3f} | "
              f"{result['per_step'] / result['kept']:15.3f}x | {result['graph'] / result['kept']:.3f}x")
        del layers, x, dy, mask
        torch.cuda.empty_cache()
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "torch_module.json"), "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "layers": LAYERS, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
