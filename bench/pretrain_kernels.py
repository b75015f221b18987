#!/usr/bin/env python3
"""Where a dst-pretrain step's GPU time goes, kernel by kernel: runs `dst-pretrain train` under Nsight
Compute (ncu) with one-pass metrics (duration, DRAM bytes read and written), cuts the kernel sequence
into optimizer steps at the optimizer's update kernel, and prints, per kernel name over the last
complete steps: calls per step, µs per step, share of the step's kernel time and DRAM GB/s; then the
kernel time per step by family (GEMMs, attention, optimizer, the rest) against a wall-clock step time
given with --wall-ms (from an unprofiled run, e.g. bench/pretrain_vs_hf.py's samples/s), so that
wall − kernels is the time the GPU is idle between kernels.

    python3 bench/pretrain_kernels.py --prog build/tools/dst-pretrain/dst-pretrain --out DIR
        [--steps 5] [--wall-ms 36.3] [--ncu ncu] -- TRAIN-ARGS...

TRAIN-ARGS are dst-pretrain train's own (model and DeepSpeed configs, data, --seq ...); --steps, the
output folder and --quiet are added. ncu serializes the kernels and times each alone (caches not
flushed, clocks not locked: --cache-control none --clock-control none), so a kernel's time here is its
own, without the overlap of programmatic dependent launch; the sum is the GPU's busy time per step.
Writes DIR/kernels.csv (ncu's raw rows, its log file) and DIR/kernels.json (the per-name table).
"""
import argparse
import collections
import csv
import io
import json
import os
import re
import shutil
import subprocess
import sys

METRICS = ["gpu__time_duration.sum", "dram__bytes_read.sum", "dram__bytes_write.sum"]
FAMILIES = [("GEMM", re.compile(r"gemm|cutlass|sm90_xmma|nvjet|cublas", re.I)),
            ("attention", re.compile(r"flash|attention|rowdot", re.I)),
            ("optimizer", re.compile(r"norm_kernel|finalize_kernel|update_kernel|lamb_", re.I))]
STEP_MARK = "update_kernel"  # one launch per optimizer step (kernels/optim.cu)


def short(name):
    name = name.replace("(anonymous namespace)::", "")
    name = re.sub(r"\(.*", "", name)
    name = re.sub(r"<.*", "", name) if len(name) > 70 else name
    return name[:80]


def family(name):
    for fam, rx in FAMILIES:
        if rx.search(name):
            return fam
    return "other"


def parse(text):
    """ncu --csv --page raw --print-units base: a header row, a units row, then one row per kernel."""
    rows = list(csv.reader(io.StringIO(text[text.index('"ID"'):])))
    head = rows[0]
    col = {k: head.index(k) for k in ["Kernel Name"] + METRICS}
    out = []
    for r in rows[1:]:
        if len(r) != len(head) or not r[0].strip().isdigit():
            continue  # the units row, ncu's own messages
        def num(k):
            v = r[col[k]].replace(",", "")
            return float(v) if v not in ("", "n/a") else 0.0
        out.append({"name": r[col["Kernel Name"]], "ns": num(METRICS[0]), "rd": num(METRICS[1]), "wr": num(METRICS[2])})
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--prog", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--steps", type=int, default=5, help="optimizer steps to run (default %(default)s)")
    ap.add_argument("--last", type=int, default=2, help="complete steps averaged at the end (default %(default)s)")
    ap.add_argument("--wall-ms", type=float, default=None, help="the unprofiled step time, ms")
    ap.add_argument("--ncu", default="ncu")
    ap.add_argument("--train-out", default=None, help="dst-pretrain's --output (default OUT/train)")
    ap.add_argument("--top", type=int, default=40)
    ap.add_argument("train_args", nargs=argparse.REMAINDER)
    a = ap.parse_args()
    targs = a.train_args[1:] if a.train_args[:1] == ["--"] else a.train_args
    if a.steps < a.last + 1:
        ap.error("--steps must exceed --last (the first step holds the GEMM timing)")
    if not shutil.which(a.ncu):
        sys.exit(f"pretrain_kernels: no {a.ncu} on PATH (Nsight Compute; it needs a CUDA GPU and a CUDA build of dst-pretrain)")
    if not os.access(a.prog, os.X_OK):
        sys.exit(f"pretrain_kernels: --prog {a.prog}: no such program (build dst-pretrain first)")
    os.makedirs(a.out, exist_ok=True)
    log = os.path.join(a.out, "kernels.csv")
    cmd = [a.ncu, "--csv", "--page", "raw", "--print-units", "base", "--cache-control", "none", "--log-file", log,
           "--clock-control", "none", "--metrics", ",".join(METRICS), a.prog, "train"] + targs + [
           "--steps", str(a.steps), "--quiet", "--output", a.train_out or os.path.join(a.out, "train")]
    print("$", " ".join(cmd), flush=True)
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    text = open(log, encoding="utf-8", errors="replace").read() if os.path.exists(log) else ""
    if p.returncode != 0 or '"ID"' not in text:
        sys.stderr.write(p.stdout[-4000:] + text[-2000:])
        sys.exit(f"pretrain_kernels: ncu exited {p.returncode} without a kernel table")
    ks = parse(text)
    marks = [i for i, k in enumerate(ks) if STEP_MARK in k["name"]]
    if len(marks) < a.last + 1:
        sys.exit(f"pretrain_kernels: {len(marks)} optimizer steps seen, need {a.last + 1}")
    lo, hi = marks[-a.last - 1] + 1, marks[-1] + 1  # the last `last` steps, each ending with its update
    per = collections.defaultdict(lambda: [0, 0.0, 0.0])
    for k in ks[lo:hi]:
        e = per[short(k["name"])]
        e[0] += 1
        e[1] += k["ns"]
        e[2] += k["rd"] + k["wr"]
    total = sum(e[1] for e in per.values()) / a.last
    rows = sorted(per.items(), key=lambda kv: -kv[1][1])
    table = []
    print(f"\nkernels of the last {a.last} steps ({hi - lo} launches), per step:")
    print(f"{'kernel':80} {'calls':>6} {'µs':>9} {'share':>6} {'GB/s':>7}")
    for name, (n, ns, by) in rows:
        us = ns / 1e3 / a.last
        gbs = by / ns if ns else 0.0
        table.append({"kernel": name, "calls": n / a.last, "us": us, "share": us / (total / 1e3), "gb_s": gbs,
                      "family": family(name)})
    for r in table[:a.top]:
        print(f"{r['kernel']:80} {r['calls']:6.0f} {r['us']:9.1f} {100 * r['share']:5.1f}% {r['gb_s']:7.0f}")
    fam = collections.defaultdict(float)
    for r in table:
        fam[r["family"]] += r["us"]
    print("\nby family, ms per step: " + ", ".join(f"{k} {v / 1e3:.2f}" for k, v in sorted(fam.items(), key=lambda kv: -kv[1])))
    print(f"kernel time per step: {total / 1e6:.2f} ms over {(hi - lo) / a.last:.0f} launches")
    if a.wall_ms:
        print(f"wall step (unprofiled) {a.wall_ms:.2f} ms: GPU idle between kernels ~{a.wall_ms - total / 1e6:.2f} ms "
              f"({100 * (1 - total / 1e6 / a.wall_ms):.1f} %)")
    with open(os.path.join(a.out, "kernels.json"), "w") as f:
        json.dump({"steps": a.last, "kernel_ms_per_step": total / 1e6, "launches_per_step": (hi - lo) / a.last,
                   "families_ms": {k: v / 1e3 for k, v in fam.items()}, "kernels": table}, f, indent=1)


if __name__ == "__main__":
    main()
