#!/usr/bin/env python3
"""dst-pretrain on several GPUs of one host: correctness against one GPU, scaling, a stopped rank.

Runs on the GPU machine (tools/gpu-session.sh multi), one process per GPU started with DeepSpeed's
launcher variables (RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT), NVLink multicast off
(NCCL_NVLS_ENABLE=0). Data: the embedded corpus and vocabulary. Parts, each skipped when the budget
(--budget seconds from the start) cannot hold it:

  correct   BERT-Large, fp32, dropout 0, global batch 16·N: one GPU with accumulation N against N GPUs of
            micro-batch 16, 20 steps; every step's MLM and NSP loss within --tol (relative), the N-GPU run
            with --check-replicas (the weights' checksum equal on every rank after every step)
  scale     BERT-Large S=128 fp16, micro-batch 64 per GPU, N = 1, 2, 4, 8 (as many as the host has): samples/s
            per GPU over the timed steps (after --warmup), with the all-reduce overlapped with the backward
            and with --no-overlap; efficiency = per-GPU samples/s at N / at 1 (one process all-reduces
            nothing: dst-pretrain's --comm auto, so N = 1 is the plain one-GPU speed)
  fault     N GPUs with checkpoints every 4 steps and --comm-timeout 45; the last rank is killed (SIGKILL) once
            rank 0 has logged step 6 (four layers, bf16); every other rank must exit with status 6 and its message within
            --fault-limit seconds; then the same N resume from the last checkpoint to step 12, and their
            losses must equal an uninterrupted N-GPU run's bit for bit

    python3 bench/multi_gpu.py --prog BUILD/tools/dst-pretrain/dst-pretrain --out OUT [--work DIR] [--parts correct,scale,fault]
       [--gpus N] [--budget 540] [--backend cuda|cpu] [--layers 24] [--hidden 1024]

--backend cpu with --gpus 1 runs the plumbing on one process (a smoke test on a machine without GPUs:
tiny model, N = 1 only, no fault part). Writes OUT/multi_gpu.json and prints the tables; the runs' folders
(metrics, logs, checkpoints) go under --work (default OUT).
"""
import argparse
import json
import os
import signal
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
DATA = os.path.join(HERE, "..", "tools", "dst-pretrain", "data")
ADAMW = {"lr": 1e-4, "betas": [0.9, 0.999], "eps": 1e-6, "weight_decay": 0.01}


def model_json(path, layers, hidden, dropout):
    cfg = {"architectures": ["BertForPreTraining"], "model_type": "bert", "vocab_size": 4096,
           "hidden_size": hidden, "num_hidden_layers": layers, "num_attention_heads": max(1, hidden // 64),
           "intermediate_size": 4 * hidden, "hidden_act": "gelu", "hidden_dropout_prob": dropout,
           "attention_probs_dropout_prob": dropout, "max_position_embeddings": 512, "type_vocab_size": 2,
           "initializer_range": 0.02, "layer_norm_eps": 1e-12, "pad_token_id": 0}
    with open(path, "w") as f:
        json.dump(cfg, f, indent=1)
    return path


def ds_json(path, global_batch, micro, dtype):
    cfg = {"train_batch_size": global_batch, "train_micro_batch_size_per_gpu": micro, "steps_per_print": 1000,
           "gradient_clipping": 1.0, "optimizer": {"type": "AdamW", "params": ADAMW}}
    if dtype == "fp16":
        cfg["fp16"] = {"enabled": True, "loss_scale": 0, "initial_scale_power": 16}
    elif dtype == "bf16":
        cfg["bf16"] = {"enabled": True}
    with open(path, "w") as f:
        json.dump(cfg, f, indent=1)
    return path


def records(out, kind="train"):
    path = os.path.join(out, "metrics.jsonl")
    if not os.path.exists(path):
        return []
    recs = []
    with open(path) as f:
        for line in f:
            try:
                r = json.loads(line)
            except json.JSONDecodeError:  # a line being written
                continue
            if r.get("type") == kind:
                recs.append(r)
    return recs


class Runner:
    def __init__(self, args):
        self.args = args
        self.t0 = time.time()
        self.port = 29500 + os.getpid() % 1000

    def left(self):
        return self.args.budget - (time.time() - self.t0)

    def start(self, n, out, extra, log):
        """N processes of `dst-pretrain train`, rank r on GPU r; returns the Popen objects."""
        os.makedirs(out, exist_ok=True)
        self.port += 1
        procs = []
        for r in range(n):
            env = dict(os.environ, NCCL_NVLS_ENABLE="0", RANK=str(r), LOCAL_RANK=str(r), WORLD_SIZE=str(n),
                       MASTER_ADDR="127.0.0.1", MASTER_PORT=str(self.port))
            if self.args.backend == "cpu":
                env.pop("RANK"), env.pop("LOCAL_RANK"), env.pop("WORLD_SIZE")
            cmd = [self.args.prog, "train", "--vocab", os.path.join(DATA, "vocab.txt"), "--corpus",
                   os.path.join(DATA, "kjv.txt"), "--output", out, "--backend", self.args.backend, "--quiet",
                   "--no-export", "--eval-every", "0"] + extra
            f = open(f"{log}.rank{r}.log", "w")
            procs.append((subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, env=env), f))
        return procs

    def wait(self, procs, limit):
        codes = []
        for p, f in procs:
            try:
                codes.append(p.wait(timeout=max(1.0, limit)))
            except subprocess.TimeoutExpired:
                p.kill()
                codes.append(p.wait())
            f.close()
        return codes

    def train(self, n, out, extra, log, limit):
        codes = self.wait(self.start(n, out, extra, log), limit)
        if any(c != 0 for c in codes):
            raise RuntimeError(f"{log}: exit statuses {codes} (see {log}.rank*.log)")
        return records(out)


def part_correct(run, a, n, res):
    work = os.path.join(a.work, "correct")
    os.makedirs(work, exist_ok=True)
    micro, steps = 16, 20
    model = model_json(os.path.join(work, "model.json"), a.layers, a.hidden, 0.0)
    one = run.train(1, os.path.join(work, "one"),
                    ["--model-config", model, "--ds-config", ds_json(os.path.join(work, "ds1.json"), micro * n, micro,
                                                                     "fp32"),
                     "--steps", str(steps), "--no-checkpoint", "--seq", "128"], os.path.join(work, "one"), run.left())
    many = run.train(n, os.path.join(work, f"n{n}"),
                     ["--model-config", model, "--ds-config", ds_json(os.path.join(work, "dsn.json"), micro * n, micro,
                                                                      "fp32"),
                      "--steps", str(steps), "--no-checkpoint", "--seq", "128", "--check-replicas"],
                     os.path.join(work, f"n{n}"), run.left())
    reps = records(os.path.join(work, f"n{n}"), "replicas")
    rows, worst = [], 0.0
    for r1, rn in zip(one, many):
        d = max(abs(rn[k] - r1[k]) / max(abs(r1[k]), 1e-12) for k in ("mlm_loss", "nsp_loss"))
        worst = max(worst, d)
        rows.append({"step": r1["step"], "one": r1["loss"], "n": rn["loss"], "rel": d})
    ok = (len(one) == steps and len(many) == steps and worst <= a.tol and len(reps) == steps
          and all(r["same"] and r["ranks"] == n for r in reps))
    res["correct"] = {"gpus": n, "steps": steps, "worst_rel": worst, "replicas_same": [r["same"] for r in reps],
                      "rows": rows, "pass": ok}
    print(f"correct: {n} GPUs against 1 (accumulation {n}), fp32, dropout 0, {steps} steps: worst relative loss "
          f"difference {worst:.2e} (tolerance {a.tol:g}); weights identical on every rank after "
          f"{sum(1 for r in reps if r['same'])}/{len(reps)} steps -> {'PASS' if ok else 'FAIL'}", flush=True)
    return ok


def throughput(recs, warmup):
    timed = [r for r in recs if r["step"] > warmup]
    if len(timed) < 2:
        return float("nan")
    return (timed[-1]["samples"] - timed[0]["samples"]) / (timed[-1]["elapsed_s"] - timed[0]["elapsed_s"])


def part_scale(run, a, ns, res):
    work = os.path.join(a.work, "scale")
    os.makedirs(work, exist_ok=True)
    micro = 64 if a.backend == "cuda" else 4
    model = model_json(os.path.join(work, "model.json"), a.layers, a.hidden, 0.1)
    rows = []
    for n in ns:
        for overlap in (True, False):
            if run.left() < 60:
                print(f"scale: N={n} {'overlap' if overlap else 'no overlap'} skipped (budget)", flush=True)
                continue
            out = os.path.join(work, f"n{n}_{'overlap' if overlap else 'serial'}")
            steps = a.warmup + a.steps
            recs = run.train(n, out, ["--model-config", model,
                                      "--ds-config", ds_json(os.path.join(work, f"ds{n}.json"), micro * n, micro, "fp16"),
                                      "--steps", str(steps), "--no-checkpoint", "--seq", "128"]
                             + ([] if overlap else ["--no-overlap"]), out, run.left())
            sps = throughput(recs, a.warmup)
            rows.append({"gpus": n, "overlap": overlap, "samples_s": sps, "per_gpu": sps / n})
    base = {r["overlap"]: r["per_gpu"] for r in rows if r["gpus"] == 1}
    for r in rows:
        r["efficiency"] = r["per_gpu"] / base[r["overlap"]] if r["overlap"] in base else float("nan")
    res["scale"] = rows
    print("scale: BERT-Large S=128 fp16, micro-batch 64 per GPU" if a.backend == "cuda" else "scale (smoke test)")
    print(f"  {'GPUs':>4} {'all-reduce':>12} {'samples/s':>10} {'per GPU':>9} {'efficiency':>10}")
    for r in rows:
        print(f"  {r['gpus']:>4} {'overlapped' if r['overlap'] else 'after bwd':>12} {r['samples_s']:>10.1f} "
              f"{r['per_gpu']:>9.1f} {r['efficiency']:>10.1%}", flush=True)


def part_fault(run, a, n, res):
    work = os.path.join(a.work, "fault")
    os.makedirs(work, exist_ok=True)
    micro, save, kill_after, end = 16, 4, 6, 12
    # four layers: checkpoints every 4 steps stay small and quick
    model = model_json(os.path.join(work, "model.json"), min(a.layers, 4), a.hidden, 0.1)
    ds = ds_json(os.path.join(work, "ds.json"), micro * n, micro, "bf16")
    common = ["--model-config", model, "--ds-config", ds, "--seq", "128", "--comm-timeout", "45"]
    out = os.path.join(work, "killed")
    procs = run.start(n, out, common + ["--steps", "100000", "--save-every", str(save)], os.path.join(work, "killed"))
    t_kill = None
    while run.left() > 30:
        recs = records(out)
        if recs and recs[-1]["step"] >= kill_after:
            procs[-1][0].send_signal(signal.SIGKILL)
            t_kill = time.time()
            break
        if any(p.poll() is not None for p, _ in procs):
            break
        time.sleep(0.5)
    if t_kill is None:
        run.wait(procs, 1)
        res["fault"] = {"pass": False, "why": "rank 0 never reached step %d" % kill_after}
        print("fault: rank 0 never reached step", kill_after, flush=True)
        return False
    codes, times = [], []
    for p, f in procs[:-1]:
        try:
            codes.append(p.wait(timeout=a.fault_limit))
        except subprocess.TimeoutExpired:
            p.kill()
            codes.append(p.wait())
        times.append(time.time() - t_kill)
        f.close()
    procs[-1][0].wait()
    procs[-1][1].close()
    msgs = []
    for r in range(n - 1):
        with open(os.path.join(work, f"killed.rank{r}.log")) as f:
            msgs += [line.strip() for line in f if "stopping (exit" in line]
    stopped_ok = all(c == 6 for c in codes) and max(times) <= a.fault_limit and len(msgs) == n - 1
    # the resume: the last checkpoint, the same N, to step `end`; against an uninterrupted run
    latest = records(out)[-1]["step"] // save * save
    resumed = run.train(n, out, common + ["--steps", str(end), "--resume"], os.path.join(work, "resumed"), run.left())
    straight = run.train(n, os.path.join(work, "straight"), common + ["--steps", str(end), "--no-checkpoint"],
                         os.path.join(work, "straight"), run.left())
    want = {r["step"]: (r["mlm_loss"], r["nsp_loss"]) for r in straight}
    got = {r["step"]: (r["mlm_loss"], r["nsp_loss"]) for r in resumed if r["step"] > latest}
    resume_ok = bool(got) and all(want.get(s) == v for s, v in got.items()) and max(got) == end
    res["fault"] = {"gpus": n, "exit_codes": codes, "seconds_to_exit": times, "messages": msgs,
                    "resumed_from": latest, "resumed_steps": sorted(got), "pass": stopped_ok and resume_ok}
    print(f"fault: rank {n - 1} of {n} killed after step {kill_after}: the others exited with {codes} within "
          f"{max(times):.1f} s (limit {a.fault_limit:g}); message: {msgs[0] if msgs else 'none'}", flush=True)
    print(f"fault: resumed from step {latest} to {end} on {n} GPUs: losses "
          f"{'equal' if resume_ok else 'NOT equal'} to an uninterrupted run's", flush=True)
    return stopped_ok and resume_ok


def gpu_count():
    try:
        out = subprocess.run(["nvidia-smi", "-L"], stdout=subprocess.PIPE, text=True, timeout=30).stdout
        return sum(1 for line in out.splitlines() if line.startswith("GPU "))
    except (OSError, subprocess.SubprocessError):
        return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prog", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--work", default=None, help="folder of the runs (default: --out)")
    ap.add_argument("--parts", default="correct,scale,fault")
    ap.add_argument("--gpus", type=int, default=0, help="GPUs to use (default: all of the host)")
    ap.add_argument("--budget", type=float, default=540.0)
    ap.add_argument("--backend", choices=("cuda", "cpu"), default="cuda")
    ap.add_argument("--layers", type=int, default=24)
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--tol", type=float, default=1e-3, help="relative loss difference allowed (fp32)")
    ap.add_argument("--fault-limit", type=float, default=90.0, help="seconds the other ranks may take to exit")
    a = ap.parse_args()
    a.prog = os.path.abspath(a.prog)
    a.work = a.work or a.out
    os.makedirs(a.out, exist_ok=True)
    os.makedirs(a.work, exist_ok=True)
    n = a.gpus or (gpu_count() if a.backend == "cuda" else 1)
    parts = a.parts.split(",")
    res = {"gpus": n, "parts": parts}
    run = Runner(a)
    ok = True
    print(f"multi_gpu: {n} GPU(s), parts {parts}, budget {a.budget:g} s", flush=True)
    if n < 2 and a.backend == "cuda":
        print("multi_gpu: this host has fewer than two GPUs: nothing to compare", flush=True)
        res["skipped"] = "fewer than two GPUs"
    else:
        try:
            if "correct" in parts:
                ok &= part_correct(run, a, n, res)
            if "scale" in parts:
                part_scale(run, a, [k for k in (1, 2, 4, 8) if k <= n], res)
            if "fault" in parts and n >= 2:
                ok &= part_fault(run, a, n, res)
        except RuntimeError as e:
            print("multi_gpu: " + str(e), flush=True)
            res["error"] = str(e)
            ok = False
    res["wall_s"] = time.time() - run.t0
    with open(os.path.join(a.out, "multi_gpu.json"), "w") as f:
        json.dump(res, f, indent=1)
    if "skipped" in res:
        print("multi_gpu: SKIPPED (exit 77)")
        return 77
    print(f"multi_gpu: {'PASS' if ok else 'FAIL'} ({res['wall_s']:.0f} s)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
