#!/usr/bin/env python3
"""Where the layer's time goes: the CUDA kernels of one fwd+bwd step of the benchmark's 4-layer stack,
from torch's profiler (CUPTI records every kernel of the process, the library's included).

The stack is bench/compare_torch.py's `Ours` (BERT-Large layer, Pre-LN, dropout 0.1, key lengths),
on torch's current stream. Per shape and dtype it prints, per kernel name (shortened), the calls and
the GPU µs per layer per step, sorted by time, with the share of the step's kernel time and the sum
of the GEMM kernels (cuBLAS/cuBLASLt) against the rest; --json FILE writes the same rows.

    python3 bench/profile_layer.py [--shapes 64x128,16x512] [--dtypes fp16] [--steps 5] [--json FILE]
       [--inference] [--padding alternate|uniform] [--packed] [--own-times]

--padding uniform gives the sequences compare_torch.py's padding-distribution lengths (uniform in
[S/4, S]; default: its alternating S and S - S/4); --packed runs the same lengths as packed input
(`OursPacked`: dst_layer_forward_packed on the real tokens only), so that a pair of runs shows where a
packed call's time differs from the padded one's.

Needs a CUDA GPU, torch and a CUDA build of the library (DST_LIB, as for compare_torch.py).
A kernel's time is its interval on the GPU; launch gaps are not in it. With programmatic dependent
launch (the library's default on compute capability 9.0+, docs/api.md's DST_PDL) a kernel launched as
a dependent is resident from its early launch and waits there for the kernel before it, and that wait
is in its interval: the kernel times then add up to more than the GPU's busy time (the line's
"overlap"), and a short kernel after a long one looks long. --own-times sets DST_PDL=0 for this
process (before the library's first launch), so that every interval is a kernel's own time, at the
cost of the boundaries PDL saves. The GPU's busy time (the union of the kernels' intervals) against
the span of the profiled steps shows the time between kernels (the profiler's own cost per launch
included).
"""
import argparse
import collections
import json
import os
import re
import sys

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import compare_torch as ct  # noqa: E402

GEMM_RE = re.compile(r"gemm|cutlass|sm90_xmma|nvjet|cublas", re.IGNORECASE)


def short(name):
    name = name.replace("(anonymous namespace)::", "")
    name = re.sub(r"\(.*", "", name)  # drop argument lists
    name = re.sub(r"<.*", "", name) if len(name) > 70 else name
    return name[:90]


def profile_case(lib, dname, B, S, steps, inference, padding="alternate", packed=False):
    ours = (ct.OursPacked if packed else ct.Ours)(lib, dname, B, S, True, {}, padding=padding)
    try:
        fn = ours.inference() if inference else ours.train
        for _ in range(3):
            fn()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(steps):
                fn()
            torch.cuda.synchronize()
    finally:
        ours.close()
    per = collections.defaultdict(lambda: [0, 0.0])
    spans = []
    for ev in prof.events():
        if ev.device_type != torch.autograd.DeviceType.CUDA:
            continue
        k = short(ev.name)
        per[k][0] += 1
        per[k][1] += ev.device_time_total if hasattr(ev, "device_time_total") else ev.cuda_time_total
        spans.append((ev.time_range.start, ev.time_range.end))
    scale = 1.0 / (steps * ct.LAYERS)
    rows = sorted(((k, c * scale, us * scale) for k, (c, us) in per.items()), key=lambda r: -r[2])
    # The GPU's busy time (the union of the kernels' intervals) and the span from the first kernel's
    # start to the last one's end: span − busy is the time the GPU sat between kernels.
    busy, end = 0.0, None
    for a, b in sorted(spans):
        if end is None or a > end:
            busy += b - a
            end = b
        elif b > end:
            busy += b - end
            end = b
    span = (max(b for _, b in spans) - min(a for a, _ in spans)) if spans else 0.0
    return rows, busy * scale, span * scale


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", default="64x128,16x512")
    ap.add_argument("--dtypes", default="fp16")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--inference", action="store_true", help="profile the inference forward instead")
    ap.add_argument("--padding", choices=("alternate", "uniform"), default="alternate",
                    help="the sequences' lengths (compare_torch.py's key_lengths)")
    ap.add_argument("--packed", action="store_true", help="the same lengths as packed input (OursPacked)")
    ap.add_argument("--own-times", action="store_true",
                    help="plain launches (DST_PDL=0), so that each kernel's interval is its own time")
    ap.add_argument("--json")
    a = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("profile_layer: needs a CUDA GPU")
        return 2
    if a.own_times:
        os.environ["DST_PDL"] = "0"  # read by the library at its first launch, which comes later
    pdl = os.environ.get("DST_PDL", "1") != "0" and torch.cuda.get_device_capability() >= (9, 0)
    lib = ct.dc.Lib()
    stream = torch.cuda.Stream()
    out = []
    with torch.cuda.stream(stream):
        for dname in a.dtypes.split(","):
            for shape in a.shapes.split(","):
                B, S = (int(v) for v in shape.split("x"))
                rows, busy, span = profile_case(lib, dname, B, S, a.steps, a.inference, a.padding, a.packed)
                total = sum(r[2] for r in rows)
                gemm = sum(r[2] for r in rows if GEMM_RE.search(r[0]))
                what = ("inference forward" if a.inference else "fwd+bwd") + (", packed" if a.packed else "") + \
                    f", {a.padding} lengths"
                launches = ("dependent launches: kernel times include their waits, overlap "
                            f"{max(total - busy, 0.0):.1f}" if pdl else "plain launches: kernel times are their own")
                print(f"\n{dname} {B}x{S}, {what}: kernel time {total:.1f} µs per layer "
                      f"(GEMM kernels {gemm:.1f}, others {total - gemm:.1f}); GPU busy {busy:.1f} of a "
                      f"{span:.1f} µs span per layer (idle between kernels {span - busy:.1f}); {launches}")
                print(f"  {'µs/layer':>9} {'share':>6} {'calls':>6}  kernel")
                for k, c, us in rows:
                    print(f"  {us:9.1f} {100 * us / total:5.1f}% {c:6.2f}  {k}")
                out.append(dict(dtype=dname, B=B, S=S, mode=what, total_us=total, gemm_us=gemm, busy_us=busy,
                                span_us=span, dependent_launch=pdl,
                                kernels=[dict(name=k, calls=c, us=us) for k, c, us in rows]))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
