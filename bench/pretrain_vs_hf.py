#!/usr/bin/env python3
"""BERT pre-training throughput: `dst-pretrain train` against Hugging Face BertForPreTraining, one table.

Both train the same model on the same batches on the same GPU, in one run of this script:
  model     BERT-Large by default (24 layers, H=1024, 16 heads, I=4096, vocab 30528, 512 positions, dropout
            0.1, Post-LN, MLM + NSP heads): the one model both programs build (Hugging Face's BERT is
            Post-LN; --layers and --hidden make it smaller for a quick check)
  data      `dst-pretrain data --out` writes the batches its loader makes from the embedded corpus
            (tools/dst-pretrain/data/kjv.txt, its 4,000-token vocabulary) with --seed: the same token ids,
            segment ids, lengths, masked positions, labels and next-sentence labels that `dst-pretrain
            train` makes with the same settings (it runs with --eval-every 0, so no document is held out).
            Hugging Face gets them as input_ids, token_type_ids, attention_mask (1 up to the length),
            labels (-100 except at the masked positions) and next_sentence_label, copied to the GPU
            before its timing starts (its data loading is not timed; ours is: the loader thread)
  cases     --cases, dtype:S pairs: S=128 with micro-batch 64, S=512 with micro-batch 16 (the tutorial's),
            max predictions 20 and 80; one optimizer step per micro-batch (no accumulation), gradient
            clipping at 1.0
  ours      dst-pretrain train on the CUDA backend: fp16 (dynamic loss scaling from 2^16, fp32 master
            weights) or bf16; --optimizer adamw (lr 1e-4, betas 0.9/0.999, eps 1e-6, weight decay 0.01 on
            the weight matrices and tables: bing_bert's groups; default) or lamb (the tutorial's
            ds_lamb_seq128.json parameters); no checkpoint, no export; its layers as `--layers auto`
            (its default: on the real tokens only when at most 90 % of a batch's positions are real);
            --packed-layers adds a row "dst-pretrain packed" with `--layers packed` (always on the
            real tokens only, dst_layer_forward_packed), the same model; --eager-checks-row a row
            "dst-pretrain eager" with `--eager-checks` (the model ops' index checks wait for the GPU;
            by default they run on the GPU without waiting, dst_context_set_index_checks);
            --zero-grads-row a row "dst-pretrain zeroing" with `--zero-grads` (the engine zeroes the
            gradients at each step and every backward op adds to them; by default the first
            micro-batch of a step writes them, dst_engine_set_zero_grads_on_step); --nccl-row a row
            "dst-pretrain nccl" with `--comm nccl` (the gradients all-reduced through NCCL over the one
            rank, in place on a second stream, as a data-parallel run does; by default one process
            reduces nothing)
  HF        transformers.BertForPreTraining(attn_implementation="sdpa") with fp32 weights under
            torch.autocast(fp16|bf16) and torch.compile (default mode, one compilation per case, its
            seconds printed), torch.optim.AdamW(fused=True) with the same hyper-parameters and groups,
            torch.amp.GradScaler (init scale 2^16) for fp16, clip_grad_norm_(1.0)

Columns:
  samples/s       sequences per second over the timed steps (--steps, after --warmup steps; ours from the
                  elapsed_s and samples of its metrics.jsonl, HF with torch.cuda.synchronize around them)
  tokens/s        real (unpadded) tokens per second
  model TFLOP/s   samples/s × model FLOPs per sample / 1e12, one count for both: 3 × the forward FLOPs of
                  the padded sequence (the layers' linears 2·S·(4H² + 2HI) and attention products 4·S²·H,
                  per layer) plus the MLM head at the masked positions only (transform 2H², decoder 2HV per
                  position) and the NSP head. Hugging Face computes the decoder at every position, so it
                  executes more than it is credited with here
  vs HF           ours' samples/s / Hugging Face's (> 1: ours is faster; issue target ≥ 1.3)
  skipped         fp16 steps skipped by the loss scaler within the timed steps (overflow)
Then, per case, ours' time split from a second run with `dst-pretrain train --profile` (--profile-steps
after the warm-up; a synchronisation per phase, so not the run that gives samples/s): ms per step of
data (loader wait and the batch's copy), embeddings + heads, layers, optimizer, all-reduce wait, other.

Time: --budget SECONDS counts from the start. A part (ours, ours' profile, HF) is started only when its
predicted time fits: the same part at an earlier case scaled by the FLOPs, else a fixed first guess
(HF's compilation dominates it). A part that would not fit prints "(skipped: time budget)"; an error
is printed in its row and the run goes on. The table is printed at the end, also after SIGTERM; --out DIR
receives pretrain_vs_hf.json (rewritten after each case; it also records the host's CPU model, cores
and load average, printed under the first line); --work DIR (default OUT/work, else a folder in
/tmp) the configurations, batches, logs and metrics of each case, in <dtype>_<S>/.

usage: python3 bench/pretrain_vs_hf.py --prog build/tools/dst-pretrain/dst-pretrain
           [--cases fp16:128,bf16:128,fp16:512,bf16:512] [--warmup 3] [--steps 10] [--profile-steps 5]
           [--optimizer adamw|lamb] [--budget SECONDS] [--out DIR] [--work DIR] [--skip-hf] [--skip-ours]
           [--layers 24] [--hidden 1024] [--backend cuda|cpu] [--packed-layers] [--eager-checks-row]
           [--zero-grads-row] [--nccl-row]
The default needs a CUDA GPU and says so without one. --backend cpu runs both on the CPU (ours on its CPU
backend; use fp32 cases and a small --layers/--hidden): a check of the script's plumbing, not a benchmark.
"""
import argparse
import dataclasses
import json
import os
import shutil
import signal
import struct
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA = os.path.join(ROOT, "tools", "dst-pretrain", "data")
VOCAB_SIZE, POSITIONS, TYPES = 30528, 512, 2
BATCH = {128: 64, 512: 16}  # micro-batch per sequence length (the tutorial's)
MAX_PRED = {128: 20, 512: 80}
ADAMW = {"lr": 1e-4, "betas": [0.9, 0.999], "eps": 1e-6, "weight_decay": 0.01}
LAMB = {"lr": 4e-3, "weight_decay": 0.01, "bias_correction": False, "max_coeff": 0.3, "min_coeff": 0.01}
PHASES = ("data", "embeddings_head", "layers", "optimizer", "comm", "other")
FIRST_GUESS_S = {"ours": 45.0, "profile": 30.0, "hf": 150.0}  # a part's seconds before any was measured
SKIPPED = "(skipped: time budget)"


@dataclasses.dataclass
class Row:
    dtype: str
    S: int
    B: int
    impl: str
    samples_s: float | None = None
    tokens_s: float | None = None
    tflops: float | None = None
    vs_hf: float | None = None
    skipped_steps: int | None = None
    compile_s: float | None = None
    wall_s: float | None = None
    split_ms: dict | None = None  # ours: ms per step of each phase (--profile run)
    call_lines: list | None = None  # ours: the costliest call sites (--profile-calls run)
    note: str = ""


class OutOfBudget(Exception):
    pass


class Budget:
    def __init__(self, seconds):
        self.end = time.monotonic() + seconds

    def left(self):
        return self.end - time.monotonic()

    def need(self, seconds):
        if seconds > self.left():
            raise OutOfBudget()


# ---- the model, its FLOPs and the configurations ------------------------------------------------------

def host_info():
    """The host's CPU model, core count and load average: Hugging Face's torch.compile steps are partly
    bound by the host (its samples/s has moved by up to 37 % between calls on the same kind of GPU
    machine while ours moved by 1-2 %), so each run records the host it ran on."""
    model = None
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            model = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), None)
    except OSError:
        pass
    try:
        load = [round(x, 2) for x in os.getloadavg()]
    except OSError:
        load = None
    return {"cpu": model, "cores": os.cpu_count(), "loadavg": load}


def model_dims(args):
    H = args.hidden
    return dict(L=args.layers, H=H, heads=max(1, H // 64), I=4 * H, V=VOCAB_SIZE)


def flops_per_sample(d, S, masked_per_sample):
    """3 × the forward FLOPs of one padded sequence (see the module docstring)."""
    L, H, I, V = d["L"], d["H"], d["I"], d["V"]
    layers = L * (2 * S * (4 * H * H + 2 * H * I) + 4 * S * S * H)
    mlm = masked_per_sample * (2 * H * H + 2 * H * V)
    nsp = 2 * H * H + 2 * H * 2
    return 3 * (layers + mlm + nsp)


def hf_config_dict(d):
    """The model in Hugging Face's config.json form, as both programs read it."""
    return {"architectures": ["BertForPreTraining"], "model_type": "bert", "vocab_size": d["V"],
            "hidden_size": d["H"], "num_hidden_layers": d["L"], "num_attention_heads": d["heads"],
            "intermediate_size": d["I"], "hidden_act": "gelu", "hidden_dropout_prob": 0.1,
            "attention_probs_dropout_prob": 0.1, "max_position_embeddings": POSITIONS, "type_vocab_size": TYPES,
            "initializer_range": 0.02, "layer_norm_eps": 1e-12, "pad_token_id": 0}


def ds_config(dtype, B, optimizer):
    cfg = {"train_batch_size": B, "train_micro_batch_size_per_gpu": B, "steps_per_print": 1000,
           "gradient_clipping": 1.0}
    if optimizer == "lamb":
        cfg["optimizer"] = {"type": "Lamb", "params": LAMB}
    else:
        cfg["optimizer"] = {"type": "AdamW", "params": ADAMW}
    if dtype == "fp16":
        cfg["fp16"] = {"enabled": True, "loss_scale": 0, "initial_scale_power": 16}
    elif dtype == "bf16":
        cfg["bf16"] = {"enabled": True}
    return cfg


# ---- the batches (dst-pretrain data --out) ----------------------------------------------------------------

def read_batches(path):
    """The records of `dst-pretrain data --out` (docs/pretrain-data.md) as dicts of lists."""
    with open(path, "rb") as f:
        data = f.read()
    if data[:8] != b"DSTPBAT1":
        raise RuntimeError(f"{path}: not a dst-pretrain batch file (no DSTPBAT1)")
    at, out = 8, []
    while at < len(data):
        B, S, P, M = struct.unpack_from("<4i", data, at)
        at += 16
        arrays = []
        for n in (B * S, B * S, B, B, M, M):
            arrays.append(list(struct.unpack_from(f"<{n}i", data, at)))
            at += 4 * n
        out.append(dict(batch=B, seq=S, max_pred=P, nrows=M, ids=arrays[0], types=arrays[1], lengths=arrays[2],
                        nsp=arrays[3], rows=arrays[4], labels=arrays[5]))
    return out


def run_prog(cmd, log, timeout):
    """Runs dst-pretrain with its output into `log`; raises with the last lines on failure."""
    with open(log, "w") as f:
        f.write("$ " + " ".join(cmd) + "\n")
        f.flush()
        try:
            p = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, timeout=max(1.0, timeout))
        except subprocess.TimeoutExpired:
            raise OutOfBudget()
    if p.returncode != 0:
        with open(log) as f:
            tail = f.read().strip().splitlines()[-3:]
        raise RuntimeError(f"{os.path.basename(cmd[0])} {cmd[1]}: exit {p.returncode}: {' | '.join(tail)}")


def metrics(path, kind):
    with open(path) as f:
        return [r for r in map(json.loads, f) if r.get("type") == kind]


# ---- the parts of a case ----------------------------------------------------------------------------------

class Case:
    def __init__(self, args, dtype, S, work):
        self.args, self.dtype, self.S, self.B = args, dtype, S, BATCH[S]
        self.dims = model_dims(args)
        self.work = work
        os.makedirs(work, exist_ok=True)
        self.model_json = os.path.join(work, "model.json")
        self.ds_json = os.path.join(work, "ds.json")
        with open(self.model_json, "w") as f:
            json.dump(hf_config_dict(self.dims), f, indent=1)
        with open(self.ds_json, "w") as f:
            json.dump(ds_config(dtype, self.B, args.optimizer), f, indent=1)
        self.batches = None

    def steps_needed(self):
        return self.args.warmup + max(self.args.steps, self.args.profile_steps)

    def common(self):
        a = self.args
        return ["--vocab", os.path.join(DATA, "vocab.txt"), "--corpus", os.path.join(DATA, "kjv.txt"),
                "--seq", str(self.S), "--max-pred", str(MAX_PRED[self.S]), "--seed", str(a.seed)]

    def load_batches(self, budget):
        path = os.path.join(self.work, "batches.bin")
        run_prog([self.args.prog, "data"] + self.common() + ["--batch", str(self.B), "--batches",
                                                            str(self.steps_needed()), "--out", path],
                 os.path.join(self.work, "data.log"), budget.left())
        self.batches = read_batches(path)
        if len(self.batches) != self.steps_needed() or any(b["seq"] != self.S or b["batch"] != self.B
                                                           for b in self.batches):
            raise RuntimeError(f"{path}: unexpected batches ({len(self.batches)} of them)")

    def timed(self):
        w = self.args.warmup
        return self.batches[w:w + self.args.steps]

    def flops(self):
        """Model FLOPs per sample, the masked positions counted as the timed batches have them."""
        timed = self.timed()
        masked = sum(b["nrows"] for b in timed) / sum(b["batch"] for b in timed)
        return flops_per_sample(self.dims, self.S, masked)

    def real_tokens(self):
        return sum(sum(b["lengths"]) for b in self.timed())

    def train_ours(self, row, budget, profile, packed=False, flags=(), tag=""):
        a = self.args
        out = os.path.join(self.work, ("ours_profile" if profile else "ours") + ("_packed" if packed else "") + tag)
        shutil.rmtree(out, ignore_errors=True)
        steps = a.warmup + (a.profile_steps if profile else a.steps)
        cmd = [a.prog, "train", "--model-config", self.model_json, "--ds-config", self.ds_json] + self.common() + [
            "--steps", str(steps), "--eval-every", "0", "--no-export", "--no-checkpoint",
            "--backend", a.backend, "--output", out] + (["--layers", "packed"] if packed else []) + list(flags)
        if not (profile and a.profile_calls):
            cmd.append("--quiet")
        if profile:
            cmd.append("--profile-calls" if a.profile_calls else "--profile")
        run_prog(cmd, out + ".log", budget.left())
        path = os.path.join(out, "metrics.jsonl")
        if profile and a.profile_calls:
            with open(out + ".log", encoding="utf-8", errors="replace") as f:
                lines = f.read().splitlines()
            at = [i for i, line in enumerate(lines) if line.startswith("profile calls:")]
            row.call_lines = lines[at[0]:at[0] + 17] if at else ["profile calls: no table in " + out + ".log"]
        if profile:
            recs = [r for r in metrics(path, "profile") if r["step"] > a.warmup]
            if len(recs) != a.profile_steps:
                raise RuntimeError(f"{path}: {len(recs)} profile records after the warm-up, expected {a.profile_steps}")
            row.split_ms = {ph: 1e3 * sum(r[ph + "_s"] for r in recs) / len(recs) for ph in PHASES}
            return
        tr = {r["step"]: r for r in metrics(path, "train")}
        first, last = tr[a.warmup], tr[a.warmup + a.steps]
        dt = last["elapsed_s"] - first["elapsed_s"]
        row.samples_s = (last["samples"] - first["samples"]) / dt
        row.tokens_s = sum(tr[s]["tokens"] for s in range(a.warmup + 1, a.warmup + a.steps + 1)) / dt
        row.skipped_steps = sum(1 for s in range(a.warmup + 1, a.warmup + a.steps + 1) if tr[s]["skipped"])
        row.tflops = row.samples_s * self.flops() / 1e12

    def train_hf(self, row, budget):
        """The Hugging Face row; the model, optimizer and compiled graphs are released afterwards."""
        import gc

        import torch
        try:
            self.measure_hf(row, budget)
        finally:
            torch._dynamo.reset()
            gc.collect()
            if self.args.backend == "cuda":
                torch.cuda.empty_cache()

    def measure_hf(self, row, budget):
        import torch
        import transformers

        a, dev = self.args, ("cuda" if self.args.backend == "cuda" else "cpu")
        amp = {"fp16": torch.float16, "bf16": torch.bfloat16}.get(self.dtype)
        cfg = transformers.BertConfig(**{k: v for k, v in hf_config_dict(self.dims).items()
                                         if k not in ("architectures", "model_type")}, attn_implementation="sdpa")
        try:
            cfg._attn_implementation = "sdpa"
        except Exception:  # configs without the setter took the constructor argument
            pass
        torch.manual_seed(a.seed)
        model = transformers.BertForPreTraining(cfg).to(dev).train()
        impl = getattr(model.config, "_attn_implementation", "?")
        if impl != "sdpa":
            row.note = f"attention implementation {impl!r}, not sdpa"
        decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
        no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]  # biases and LayerNorm
        groups = [{"params": decay, "weight_decay": ADAMW["weight_decay"]}, {"params": no_decay, "weight_decay": 0.0}]
        opt = torch.optim.AdamW(groups, lr=ADAMW["lr"], betas=tuple(ADAMW["betas"]), eps=ADAMW["eps"],
                                fused=dev == "cuda")
        scaler = torch.amp.GradScaler(dev, init_scale=2.0 ** 16) if self.dtype == "fp16" else None
        fwd = torch.compile(model)
        inputs = []
        for b in self.batches:
            B, S = b["batch"], b["seq"]
            lengths = torch.tensor(b["lengths"], dtype=torch.long)
            labels = torch.full((B * S,), -100, dtype=torch.long)
            labels[torch.tensor(b["rows"], dtype=torch.long)] = torch.tensor(b["labels"], dtype=torch.long)
            inputs.append({k: v.to(dev) for k, v in {
                "input_ids": torch.tensor(b["ids"], dtype=torch.long).view(B, S),
                "token_type_ids": torch.tensor(b["types"], dtype=torch.long).view(B, S),
                "attention_mask": (torch.arange(S)[None, :] < lengths[:, None]).long(),
                "labels": labels.view(B, S),
                "next_sentence_label": torch.tensor(b["nsp"], dtype=torch.long)}.items()})
        skipped = [0]

        def step(batch):
            with torch.autocast(dev, dtype=amp, enabled=amp is not None):
                loss = fwd(**batch).loss
            if scaler is not None:
                scaler.scale(loss).backward()
                scaler.unscale_(opt)
            else:
                loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0, foreach=True)
            if scaler is not None:
                before = scaler.get_scale()
                scaler.step(opt)
                scaler.update()
                skipped[0] += scaler.get_scale() < before  # a skipped step lowers the scale
            else:
                opt.step()
            opt.zero_grad(set_to_none=True)

        def sync():
            if dev == "cuda":
                torch.cuda.synchronize()

        t0 = time.monotonic()
        step(inputs[0])  # compiles forward and backward
        sync()
        row.compile_s = time.monotonic() - t0
        for batch in inputs[1:a.warmup]:
            step(batch)
        sync()
        # the first timed step says whether the others fit (the compilation is behind us)
        skipped[0] = 0
        t1 = time.monotonic()
        step(inputs[a.warmup])
        sync()
        budget.need((time.monotonic() - t1) * (a.steps - 1))
        for batch in inputs[a.warmup + 1:a.warmup + a.steps]:
            step(batch)
        sync()
        dt = time.monotonic() - t1
        row.samples_s = a.steps * self.B / dt
        row.tokens_s = self.real_tokens() / dt
        row.tflops = row.samples_s * self.flops() / 1e12
        row.skipped_steps = skipped[0] if scaler is not None else 0


# ---- running within the budget ------------------------------------------------------------------------

class Runner:
    def __init__(self, budget):
        self.budget = budget
        self.last = {}  # part -> (seconds, FLOPs per sample · samples of that case)

    def predict(self, part, case):
        if part not in self.last:
            return FIRST_GUESS_S[part]
        seconds, work = self.last[part]
        return seconds * (case.flops() * case.B) / work

    def run(self, part, row, case, fn):
        t0 = time.monotonic()
        try:
            self.budget.need(self.predict(part, case))
            fn()
            self.last[part] = (time.monotonic() - t0, case.flops() * case.B)
        except OutOfBudget:
            row.note = (row.note + " " if row.note else "") + (SKIPPED if part != "profile" else "(split skipped: time budget)")
        except Exception as e:  # out of memory, a failed run: noted in the row, the run goes on
            lines = str(e).strip().splitlines()
            msg = f"{'split ' if part == 'profile' else ''}error: {type(e).__name__}: {lines[0] if lines else ''}"
            row.note = ((row.note + " " if row.note else "") + msg)[:240]
        except BaseException:
            row.note = "(stopped)"
            raise
        finally:
            if part != "profile":
                row.wall_s = time.monotonic() - t0


# ---- the table ------------------------------------------------------------------------------------------

HEADER = (f"{'dtype':5} {'S×B':7} {'row':20} {'samples/s':>9} {'tokens/s':>9} {'TFLOP/s':>8} {'vs HF':>6} "
          f"{'skipped':>7} {'compile s':>9}  note")


def fmt(v, spec):
    return "-" if v is None else format(v, spec)


def row_line(r):
    return (f"{r.dtype:5} {f'{r.S}×{r.B}':7} {r.impl:20} {fmt(r.samples_s, '.1f'):>9} {fmt(r.tokens_s, '.0f'):>9} "
            f"{fmt(r.tflops, '.1f'):>8} {fmt(r.vs_hf, '.2f'):>6} {fmt(r.skipped_steps, 'd'):>7} "
            f"{fmt(r.compile_s, '.1f'):>9}  {r.note}").rstrip()


def split_line(r):
    if not r.split_ms:
        return None
    total = sum(r.split_ms.values())
    parts = ", ".join(f"{ph} {v:.1f} ({100 * v / total:.0f}%)" for ph, v in r.split_ms.items())
    line = f"{'':13} dst-pretrain split, ms/step (--profile): {parts}; total {total:.1f}"
    if r.call_lines:  # over that run's steps from the second on (the warm-up's later steps included)
        line += "\n" + "\n".join(f"{'':13} {c}" for c in r.call_lines)
    return line


LEGEND = [
    "samples/s, tokens/s (real, unpadded tokens): over the timed steps; TFLOP/s: model FLOPs (3 × forward of the",
    "  padded sequence, MLM decoder at the masked positions only) × samples/s; vs HF: ours' samples/s / HF's;",
    "  skipped: fp16 steps the loss scaler skipped among the timed ones; compile s: HF's first step.",
    "split: dst-pretrain train --profile (a device synchronisation per phase): data = loader wait + batch copy,",
    "  embeddings_head = embeddings, final LN, MLM/NSP heads and losses; HF's data are on the GPU before timing.",
]


class Report:
    def __init__(self, out, info):
        self.out, self.info, self.cases = out, info, []

    def print_table(self):
        print(f"\n{HEADER}\n{'-' * len(HEADER)}")
        for rows in self.cases:
            for r in rows:
                print(row_line(r))
                if split_line(r):
                    print(split_line(r))
        print("\n".join(LEGEND), flush=True)

    def write(self, wall_s):
        if not self.out:
            return
        os.makedirs(self.out, exist_ok=True)
        path = os.path.join(self.out, "pretrain_vs_hf.json")
        with open(path + ".tmp", "w") as f:
            json.dump(dict(self.info, wall_s=wall_s, rows=[dataclasses.asdict(r) for rows in self.cases for r in rows]),
                      f, indent=1)
        os.replace(path + ".tmp", path)


def parse_args():
    def cases(text):
        out = []
        for item in text.split(","):
            dtype, _, s = item.partition(":")
            if dtype not in ("fp16", "bf16", "fp32") or s not in ("128", "512"):
                raise argparse.ArgumentTypeError(f"expected dtype:S items (fp16|bf16|fp32 : 128|512), got {item!r}")
            out.append((dtype, int(s)))
        return out

    ap = argparse.ArgumentParser(description="dst-pretrain against Hugging Face BertForPreTraining (see the module "
                                             "docstring)")
    ap.add_argument("--prog", default=os.environ.get("DST_PRETRAIN",
                                                     os.path.join(ROOT, "build", "tools", "dst-pretrain", "dst-pretrain")),
                    help="the dst-pretrain program (default $DST_PRETRAIN, else build/tools/dst-pretrain/dst-pretrain)")
    ap.add_argument("--cases", type=cases, default="fp16:128,bf16:128,fp16:512,bf16:512",
                    help="dtype:S, comma-separated, in order (default %(default)s)")
    ap.add_argument("--warmup", type=int, default=3, help="untimed steps first (default %(default)s)")
    ap.add_argument("--steps", type=int, default=10, help="timed steps (default %(default)s)")
    ap.add_argument("--profile-steps", type=int, default=5,
                    help="steps of ours' --profile run after the warm-up (default %(default)s; 0: no split)")
    ap.add_argument("--profile-calls", action="store_true",
                    help="the split run with --profile-calls: also the costliest library call sites of the model")
    ap.add_argument("--optimizer", choices=("adamw", "lamb"), default="adamw",
                    help="ours' optimizer (HF always runs fused AdamW; default %(default)s)")
    ap.add_argument("--budget", type=float, default=480.0, help="seconds for the whole run (default %(default).0f)")
    ap.add_argument("--out", default=None, help="folder for pretrain_vs_hf.json and work/")
    ap.add_argument("--work", default=None, help="folder for each case's files (default OUT/work, else in /tmp)")
    ap.add_argument("--skip-hf", action="store_true", help="no Hugging Face rows")
    ap.add_argument("--eager-checks-row", action="store_true",
                    help="also a row of dst-pretrain --eager-checks (the model ops' index checks waiting for the GPU)")
    ap.add_argument("--zero-grads-row", action="store_true",
                    help="also a row of dst-pretrain --zero-grads (the engine zeroing the gradients at each step)")
    ap.add_argument("--nccl-row", action="store_true",
                    help="also a row of dst-pretrain --comm nccl (the all-reduce over one rank through NCCL)")
    ap.add_argument("--skip-ours", action="store_true", help="no dst-pretrain rows")
    ap.add_argument("--packed-layers", action="store_true",
                    help="also a dst-pretrain row with --layers packed (the layers on the real tokens only)")
    ap.add_argument("--layers", type=int, default=24, help="layers (default %(default)s)")
    ap.add_argument("--hidden", type=int, default=1024, help="hidden size, heads of 64, I = 4H (default %(default)s)")
    ap.add_argument("--backend", choices=("cuda", "cpu"), default="cuda",
                    help="cpu: a check of the script without a GPU, with a small model (default %(default)s)")
    ap.add_argument("--seed", type=int, default=42, help="data, weights and dropout (default %(default)s)")
    args = ap.parse_args()
    if args.warmup < 1 or args.steps < 1 or args.profile_steps < 0:
        ap.error("--warmup and --steps must be ≥ 1, --profile-steps ≥ 0")
    if args.layers < 1 or args.hidden < 64 or args.hidden % 64:
        ap.error("--layers must be ≥ 1 and --hidden a multiple of 64")
    return args


def main():
    args = parse_args()
    t0, budget = time.monotonic(), Budget(args.budget)
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(f"pretrain_vs_hf: stopped by signal {signum}"))
    if not args.skip_ours and not os.access(args.prog, os.X_OK):
        sys.exit(f"pretrain_vs_hf: --prog {args.prog}: no such program (build dst-pretrain first)")
    torch_version = device = None
    if not args.skip_hf or args.backend == "cuda":
        try:
            import torch
        except ImportError:
            sys.exit("pretrain_vs_hf: needs PyTorch (and transformers for the Hugging Face rows)")
        torch_version = torch.__version__
        if args.backend == "cuda":
            if not torch.cuda.is_available():
                sys.exit("pretrain_vs_hf: no CUDA device is usable (torch.cuda.is_available() is false); "
                         "--backend cpu checks the script on the CPU with a small --layers/--hidden")
            device = torch.cuda.get_device_name()
            torch.backends.cuda.matmul.allow_tf32 = False
            torch.backends.cudnn.allow_tf32 = False
    if not args.skip_hf:
        try:
            import transformers
        except ImportError:
            sys.exit("pretrain_vs_hf: the Hugging Face rows need transformers (--skip-hf runs without them)")
        hf_version = transformers.__version__
    else:
        hf_version = None
    dims = model_dims(args)
    info = {"torch": torch_version, "transformers": hf_version, "device": device or "cpu", "model": dims,
            "optimizer": args.optimizer, "warmup": args.warmup, "steps": args.steps,
            "profile_steps": args.profile_steps, "budget_s": args.budget, "seed": args.seed,
            "cases": [f"{d}:{s}" for d, s in args.cases], "host": host_info()}
    print(f"BERT {dims['L']} layers, H={dims['H']}, {dims['heads']} heads, I={dims['I']}, vocab {dims['V']}, Post-LN, "
          f"MLM+NSP; ours: {args.optimizer}, HF: fused AdamW + torch.compile; torch {torch_version}, transformers "
          f"{hf_version}, {info['device']}; {args.warmup} warm-up + {args.steps} timed steps; budget {args.budget:.0f} s")
    h = info["host"]
    print(f"host: {h['cpu']}, {h['cores']} cores, load average {h['loadavg']}")
    print(HEADER, flush=True)
    work = args.work or (os.path.join(args.out, "work") if args.out else f"/tmp/pretrain_vs_hf.{os.getpid()}")
    report, runner = Report(args.out, info), Runner(budget)
    try:
        for dtype, S in args.cases:
            case = Case(args, dtype, S, os.path.join(work, f"{dtype}_{S}"))
            ours, hf = Row(dtype, S, case.B, "dst-pretrain"), Row(dtype, S, case.B, "HF compile + SDPA")
            packed = Row(dtype, S, case.B, "dst-pretrain packed")
            # The rows of ours with one flag more, each in its own run: (wanted, row, flags, output tag).
            variants = [(args.eager_checks_row, Row(dtype, S, case.B, "dst-pretrain eager"), ["--eager-checks"], "_eager"),
                        (args.zero_grads_row, Row(dtype, S, case.B, "dst-pretrain zeroing"), ["--zero-grads"], "_zeroing"),
                        (args.nccl_row, Row(dtype, S, case.B, "dst-pretrain nccl"), ["--comm", "nccl"], "_nccl")]
            variants = [v[1:] for v in variants if v[0]]
            rows = ([] if args.skip_ours else [ours] + ([packed] if args.packed_layers else []) +
                    [v[0] for v in variants]) + ([] if args.skip_hf else [hf])
            report.cases.append(rows)
            try:
                case.load_batches(budget)
            except (OutOfBudget, Exception) as e:
                for r in rows:
                    r.note = SKIPPED if isinstance(e, OutOfBudget) else f"error: batches: {e}"[:200]
                    print(row_line(r), flush=True)
                continue
            if not args.skip_ours:
                runner.run("ours", ours, case, lambda: case.train_ours(ours, budget, profile=False))
                if args.profile_steps and ours.samples_s is not None:
                    runner.run("profile", ours, case, lambda: case.train_ours(ours, budget, profile=True))
                if args.packed_layers:
                    runner.run("ours", packed, case, lambda: case.train_ours(packed, budget, profile=False, packed=True))
                for row, flags, tag in variants:
                    runner.run("ours", row, case, lambda: case.train_ours(row, budget, profile=False, flags=flags, tag=tag))
            if not args.skip_hf:
                runner.run("hf", hf, case, lambda: case.train_hf(hf, budget))
            for r in [ours, packed] + [v[0] for v in variants]:
                if r.samples_s is not None and hf.samples_s is not None:
                    r.vs_hf = r.samples_s / hf.samples_s
            for r in rows:
                print(row_line(r), flush=True)
                if split_line(r):
                    print(split_line(r), flush=True)
            report.write(time.monotonic() - t0)
    finally:
        wall_s = time.monotonic() - t0
        report.print_table()
        report.write(wall_s)
        print(f"total wall time: {wall_s:.1f} s", flush=True)


if __name__ == "__main__":
    main()
