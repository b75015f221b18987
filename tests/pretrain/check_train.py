#!/usr/bin/env python3
"""dst-pretrain's training command, end to end (ctest entries of tests/pretrain/CMakeLists.txt).

    check_train.py loss-falls  PROG OUT CONFIGS   a short run: the MLM loss falls; the outputs are all there
    check_train.py resume      PROG OUT MODEL DS  k steps + resume + N-k steps == N steps, bit for bit
    check_train.py interrupt   PROG OUT CONFIGS   SIGINT saves a checkpoint, exits 130, and the run resumes
    check_train.py errors      PROG OUT CONFIGS   bad configurations, data and arguments: messages, exit codes
    check_train.py hf-export   PROG OUT CONFIGS   the Hugging Face export: file layout, logits (NumPy;
                                                  transformers when importable)
    check_train.py cpu-vs-cuda PROG OUT CONFIGS   the first steps on CUDA match the CPU (exit 77 without a GPU)
    check_train.py packed-vs-padded PROG OUT CONFIGS   the layers on the real tokens (--layers packed) and on
                                                  the padded batch: the same losses up to rounding
    check_train.py nccl-world1 PROG OUT CONFIGS   world size 1 through NCCL == no communicator, bit for bit
                                                  (exit 77 without a GPU)
    check_train.py profile     PROG OUT CONFIGS   --profile: a time split per step that adds up to the step's
                                                  time, the same losses as without it; --no-checkpoint
    check_train.py data-out    PROG OUT CONFIGS   `data --out`: the batch records agree with the summary
                                                  lines and with the rules of the masking
    check_train.py zero-grads  PROG OUT CONFIGS   the first micro-batch of a step writing the gradients
                                                  (default) == --zero-grads, bit for bit; zero-grads-cuda
                                                  the same on CUDA (exit 77 without a GPU)

Standard library only, except NumPy for the logits of hf-export (a Debian package of the build).
Exit status 0 when the check passes, 1 when it fails, 77 when it is skipped.
"""

import json
import math
import os
import re
import shutil
import signal
import struct
import subprocess
import sys
import time
import xml.etree.ElementTree as ET

SKIP = 77


def fail(msg):
    print("FAIL: " + msg)
    sys.exit(1)


def run(prog, args, env=None, expect=0, timeout=600):
    cmd = [prog] + args
    print("$ " + " ".join(cmd), flush=True)
    e = dict(os.environ)
    e.update(env or {})
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=e, timeout=timeout)
    sys.stdout.write(p.stdout)
    sys.stdout.write(p.stderr)
    if p.returncode < 0:
        fail("%s was killed by signal %d (a crash)" % (prog, -p.returncode))
    if expect is not None and p.returncode != expect:
        fail("exit status %d, expected %d" % (p.returncode, expect))
    return p


def run_gpu(prog, args, env, what):
    """run() for a case that may need the GPU: skips the test (77) without a usable CUDA device, fails
    on any other non-zero exit status."""
    p = run(prog, args, env=env, expect=None)
    if p.returncode == 5 and "no usable CUDA device" in p.stderr:
        print("no usable CUDA device: skipped")
        sys.exit(SKIP)
    if p.returncode != 0:
        fail("%s: exit status %d" % (what, p.returncode))
    return p


def fresh(path):
    shutil.rmtree(path, ignore_errors=True)
    os.makedirs(path)
    return path


def metrics(out):
    recs = []
    with open(os.path.join(out, "metrics.jsonl")) as f:
        for line in f:
            recs.append(json.loads(line))
    return recs


def train_records(out):
    return [r for r in metrics(out) if r["type"] == "train"]


def safetensors(path):
    """{name: (dtype, shape, bytes)} and the metadata of a safetensors file."""
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    meta = header.pop("__metadata__", {})
    body = data[8 + n:]
    out = {}
    for name, t in header.items():
        b, e = t["data_offsets"]
        out[name] = (t["dtype"], tuple(t["shape"]), body[b:e])
    return out, meta


def tiny(configs, pre_ln=False):
    return ["--model-config", os.path.join(configs, "tiny_model_preln.json" if pre_ln else "tiny_model.json"),
            "--ds-config", os.path.join(configs, "tiny_ds.json"), "--seq", "32", "--max-pred", "5",
            "--eval-batches", "2", "--threads", "2"]


# ---- loss-falls ----------------------------------------------------------------------------------------
def loss_falls(prog, out, configs):
    o = fresh(os.path.join(out, "loss"))
    p = run(prog, ["train"] + tiny(configs) + ["--steps", "40", "--eval-every", "20", "--print-every", "10",
                                               "--output", o])
    tr = train_records(o)
    if [r["step"] for r in tr] != list(range(1, 41)):
        fail("metrics.jsonl does not hold steps 1..40: %s" % [r["step"] for r in tr])
    first, last5 = tr[0]["mlm_loss"], sum(r["mlm_loss"] for r in tr[-5:]) / 5
    print("MLM loss: step 1 %.4f, mean of steps 36-40 %.4f" % (first, last5))
    if not (abs(first - math.log(4000)) < 0.3):
        fail("the first loss %.4f is not about ln(4000) = %.4f (an untrained model)" % (first, math.log(4000)))
    if not (last5 < first - 1.0):
        fail("the MLM loss did not fall by 1 nat in 40 steps")
    ev = [r for r in metrics(o) if r["type"] == "eval"]
    if [r["step"] for r in ev] != [20, 40] or not all(math.isfinite(r["mlm_loss"]) for r in ev):
        fail("held-out evaluations: %s" % ev)
    lines = [l for l in p.stdout.splitlines() if l.startswith("step ")]
    if len(lines) != 4:
        fail("expected 4 progress lines, got %d" % len(lines))
    for field in ("loss", "mlm", "acc", "nsp", "lr", "scale", "samples/s", "tokens/s", "eta"):
        if field not in lines[-1]:
            fail("the progress line lacks '%s': %s" % (field, lines[-1]))
    for f in ("metrics.svg", "checkpoints/latest", "checkpoints/global_step40/mp_rank_00_model_states.safetensors",
              "hf/model.safetensors", "hf/config.json", "hf/vocab.txt"):
        if not os.path.isfile(os.path.join(o, f)):
            fail("missing " + f)
    svg = ET.parse(os.path.join(o, "metrics.svg")).getroot()
    polylines = [e for e in svg.iter() if e.tag.endswith("polyline")]
    if len(polylines) < 5:
        fail("the plot has %d polylines" % len(polylines))
    if "metrics.svg" not in p.stdout or "metrics.jsonl" not in p.stdout:
        fail("the run does not say where the metrics and the plot went")


# ---- resume ----------------------------------------------------------------------------------------------
def resume(prog, out, model, ds):
    common = ["--model-config", model, "--ds-config", ds, "--seq", "32", "--max-pred", "5", "--eval-every", "3",
              "--eval-batches", "2", "--threads", "2"]
    a, b = fresh(os.path.join(out, "straight")), fresh(os.path.join(out, "resumed"))
    run(prog, ["train"] + common + ["--steps", "8", "--output", a])
    run(prog, ["train"] + common + ["--steps", "5", "--output", b])
    p = run(prog, ["train"] + common + ["--steps", "8", "--output", b, "--resume"])
    if "(resumed)" not in p.stdout:
        fail("the resumed run does not say so")
    ta, tb = train_records(a), train_records(b)
    if [r["step"] for r in tb] != list(range(1, 9)):
        fail("the resumed run's metrics hold steps %s" % [r["step"] for r in tb])
    for ra, rb in zip(ta, tb):
        for k in ("loss", "mlm_loss", "nsp_loss", "lr", "loss_scale", "samples", "epoch", "tokens"):
            if ra[k] != rb[k]:
                fail("step %d: %s %r (straight) != %r (resumed)" % (ra["step"], k, ra[k], rb[k]))
    ea = [r for r in metrics(a) if r["type"] == "eval"]
    eb = [r for r in metrics(b) if r["type"] == "eval"]
    steps_a = {r["step"] for r in ea}  # the first part of the resumed run also evaluated at its last step
    eb = [r for r in eb if r["step"] in steps_a]
    if [(r["step"], r["mlm_loss"]) for r in ea] != [(r["step"], r["mlm_loss"]) for r in eb]:
        fail("held-out losses differ: %s vs %s" % (ea, eb))
    for name in ("mp_rank_00_model_states.safetensors", "mp_rank_00_optim_states.safetensors"):
        ma, _ = safetensors(os.path.join(a, "checkpoints", "global_step8", name))
        mb, _ = safetensors(os.path.join(b, "checkpoints", "global_step8", name))
        if sorted(ma) != sorted(mb):
            fail("%s: other tensors" % name)
        for t in ma:
            if ma[t] != mb[t]:
                fail("%s: tensor %s differs between the straight and the resumed run" % (name, t))
        print("%s: %d tensors bit-identical" % (name, len(ma)))
    ha, hb = os.path.join(a, "hf", "model.safetensors"), os.path.join(b, "hf", "model.safetensors")
    if os.path.exists(ha) and open(ha, "rb").read() != open(hb, "rb").read():
        fail("the Hugging Face exports differ")


# ---- interrupt -------------------------------------------------------------------------------------------
def interrupt(prog, out, configs):
    o = fresh(os.path.join(out, "interrupt"))
    cmd = [prog, "train"] + tiny(configs) + ["--steps", "1000000", "--print-every", "1", "--output", o]
    print("$ " + " ".join(cmd), flush=True)
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    seen = []
    for line in p.stdout:
        sys.stdout.write(line)
        seen.append(line)
        if line.startswith("step ") and "/1000000" in line and len([l for l in seen if l.startswith("step ")]) >= 3:
            p.send_signal(signal.SIGINT)
            break
    rest = p.stdout.read()
    sys.stdout.write(rest)
    rc = p.wait(timeout=300)
    if rc != 130:
        fail("exit status %d after SIGINT, expected 130" % rc)
    if "interrupted (SIGINT)" not in rest:
        fail("no 'interrupted' line")
    with open(os.path.join(o, "checkpoints", "latest")) as f:
        tag = f.read()
    step = int(tag.replace("global_step", ""))
    print("checkpoint after SIGINT: %s" % tag)
    run(prog, ["train"] + tiny(configs) + ["--steps", str(step + 2), "--output", o, "--resume"])
    if [r["step"] for r in train_records(o)] != list(range(1, step + 3)):
        fail("the resumed run's metrics hold steps %s" % [r["step"] for r in train_records(o)])


# ---- errors ----------------------------------------------------------------------------------------------
def errors(prog, out, configs):
    o = fresh(os.path.join(out, "errors"))

    def write(name, text, mode="w"):
        path = os.path.join(o, name)
        with open(path, mode) as f:
            f.write(text)
        return path

    model = json.load(open(os.path.join(configs, "tiny_model.json")))
    bad_key = dict(model, hiden_size=32)
    bad_value = dict(model, num_attention_heads=3)
    ds = json.load(open(os.path.join(configs, "tiny_ds.json")))
    ds_bad = json.loads(json.dumps(ds))
    ds_bad["optimizer"]["params"]["weight_decy"] = 0.1
    ds_triad = dict(ds, train_batch_size=12)
    cases = [
        (["train", "--model-config", write("k.json", json.dumps(bad_key))], 3, 'unknown key "hiden_size" (did you mean "hidden_size"?)'),
        (["train", "--model-config", write("v.json", json.dumps(bad_value))], 3, '"num_attention_heads"'),
        (["train", "--model-config", write("j.json", '{"hidden_size": 32,,}')], 3, "line 1, column"),
        (["train", "--model-config", os.path.join(o, "absent.json")], 3, "cannot open"),
        (["train", "--ds-config", write("d.json", json.dumps(ds_bad))], 3, "optimizer.params.weight_decy"),
        (["train", "--ds-config", write("t.json", json.dumps(ds_triad))], 3, "train_batch_size"),
        (["train", "--model-config", write("small.json", json.dumps(dict(model, vocab_size=100)))], 3, '"vocab_size" is 100'),
        (["train", "--seq", "100"], 3, "max_position_embeddings"),
        (["train", "--model-config", os.path.join(configs, "tiny_model_preln.json"), "--export-hf", o], 3, "Post-LN"),
        (["train", "--corpus", write("empty.txt", "")], 4, "no text"),
        (["train", "--corpus", write("latin1.txt", b"caf\xe9 au lait.\n", "wb")], 4, "not UTF-8"),
        (["train", "--corpus", write("tiny.txt", "One sentence only.\n")], 4, "held"),
        (["train", "--vocab", write("vocab.txt", "a\nb\n")], 4, "[PAD]"),
        (["train", "--hdf5", write("shard.hdf5", "not an HDF5 file\n")], 4, "shard.hdf5"),
        (["train", "--corpus", os.path.join(o, "absent.txt")], 4, "cannot open"),
        (["train", "--resume", "--output", os.path.join(o, "nothing")], 1, "latest"),
        (["train", "--init-from", os.path.join(o, "absent.safetensors"), "--steps", "1"], 1, "absent.safetensors"),
        (["train", "--backend", "gpu"], 2, "--backend"),
        (["train", "--steps", "-3"], 2, "--steps"),
        (["train", "--frobnicate"], 2, "--frobnicate"),
        (["train", "--corpus", "a.txt", "--hdf5", "b.h5"], 2, "not both"),
        (["frobnicate"], 2, "unknown command"),
        ([], 2, "usage"),
        (["logits", "--hf", o], 2, "--out"),
        (["logits", "--hf", o, "--out", os.path.join(o, "x"), "--ids", "2 x 3"], 2, "--ids"),
        (["export", "--checkpoint", os.path.join(o, "nothing"), "--out", os.path.join(o, "hf")], 1, "latest"),
    ]
    base = tiny(configs) + ["--steps", "2", "--output", os.path.join(o, "run"), "--no-export"]
    for args, code, text in cases:
        full = ["train"] + base + args[1:] if args and args[0] == "train" else args  # the case's options win
        p = run(prog, full, expect=code)
        if text not in p.stderr:
            fail("the message does not contain %r" % text)
    # Launches that cannot work are refused with the variable or the reason, before anything waits.
    master = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29517"}
    launches = [
        ({"WORLD_SIZE": "2", "RANK": "0"}, [], 2, "MASTER_ADDR"),
        ({"WORLD_SIZE": "2", "RANK": "3"}, [], 2, "RANK 3 is not below WORLD_SIZE 2"),
        ({"WORLD_SIZE": "two"}, [], 2, "WORLD_SIZE"),
        ({"WORLD_SIZE": "1", "RANK": "0", "LOCAL_RANK": "-1"}, [], 2, "LOCAL_RANK"),
        # tiny_ds.json: train_batch_size 16 = micro-batch 8 x accumulation 2 x world size 1
        (dict(master, WORLD_SIZE="3", RANK="0"), [], 3, "train_batch_size"),
        (dict(master, WORLD_SIZE="2", RANK="0"), ["--backend", "cpu"], 5, "needs NCCL and the CUDA backend"),
        ({}, ["--backend", "cpu", "--comm", "nccl"], 5, "NCCL needs the CUDA backend"),
        ({}, ["--comm", "mpi"], 2, "--comm"),
    ]
    for env, extra, code, text in launches:
        p = run(prog, ["train"] + base + extra, env=env, expect=code)
        if text not in p.stderr:
            fail("%s %s: the message does not contain %r" % (env, extra, text))
    # --help of each level.
    for args in (["--help"], ["train", "--help"]):
        p = run(prog, args, expect=0)
        if "usage:" not in p.stdout or "Exit status" not in p.stdout:
            fail("%s: no usage with the exit codes" % " ".join(args))
    # A resume that does not match the checkpoint's run.
    r = os.path.join(o, "mismatch")
    run(prog, ["train"] + tiny(configs) + ["--steps", "1", "--output", r, "--no-export"])
    p = run(prog, ["train"] + tiny(configs) + ["--steps", "2", "--output", r, "--no-export", "--resume", "--seed", "7"],
            expect=3)
    if "a resume continues the same run" not in p.stderr:
        fail("a resume with another seed is not refused")


# ---- hf-export -------------------------------------------------------------------------------------------
HF_NAMES = ["bert.embeddings.word_embeddings.weight", "bert.embeddings.position_embeddings.weight",
            "bert.embeddings.token_type_embeddings.weight", "bert.embeddings.LayerNorm.weight",
            "bert.embeddings.LayerNorm.bias", "cls.predictions.transform.dense.weight",
            "cls.predictions.transform.dense.bias", "cls.predictions.transform.LayerNorm.weight",
            "cls.predictions.transform.LayerNorm.bias", "cls.predictions.bias", "cls.predictions.decoder.weight",
            "cls.predictions.decoder.bias"]
HF_LAYER = ["attention.self.query.weight", "attention.self.query.bias", "attention.self.key.weight",
            "attention.self.key.bias", "attention.self.value.weight", "attention.self.value.bias",
            "attention.output.dense.weight", "attention.output.dense.bias", "attention.output.LayerNorm.weight",
            "attention.output.LayerNorm.bias", "intermediate.dense.weight", "intermediate.dense.bias",
            "output.dense.weight", "output.dense.bias", "output.LayerNorm.weight", "output.LayerNorm.bias"]


def numpy_bert_mlm(tensors, cfg, ids, types):
    """Hugging Face BertForMaskedLM's forward (eval mode, one sequence, no padding) by tensor name, in fp64."""
    import numpy as np

    def t(name):
        dtype, shape, raw = tensors[name]
        assert dtype == "F32", dtype
        return np.frombuffer(raw, dtype="<f4").astype(np.float64).reshape(shape)

    def ln(x, w, b, eps):
        mu = x.mean(-1, keepdims=True)
        var = ((x - mu) ** 2).mean(-1, keepdims=True)
        return (x - mu) / np.sqrt(var + eps) * w + b

    def gelu(x):
        if cfg["hidden_act"] == "gelu":
            from math import erf
            return 0.5 * x * (1.0 + np.vectorize(erf)(x / math.sqrt(2.0)))
        return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))

    eps, H, nh = cfg["layer_norm_eps"], cfg["hidden_size"], cfg["num_attention_heads"]
    d = H // nh
    S = len(ids)
    x = t("bert.embeddings.word_embeddings.weight")[ids] + t("bert.embeddings.position_embeddings.weight")[:S] + \
        t("bert.embeddings.token_type_embeddings.weight")[types]
    x = ln(x, t("bert.embeddings.LayerNorm.weight"), t("bert.embeddings.LayerNorm.bias"), eps)
    for i in range(cfg["num_hidden_layers"]):
        p = "bert.encoder.layer.%d." % i
        lin = lambda v, n: v @ t(p + n + ".weight").T + t(p + n + ".bias")
        q = lin(x, "attention.self.query").reshape(S, nh, d).transpose(1, 0, 2)
        k = lin(x, "attention.self.key").reshape(S, nh, d).transpose(1, 0, 2)
        v = lin(x, "attention.self.value").reshape(S, nh, d).transpose(1, 0, 2)
        s = q @ k.transpose(0, 2, 1) / math.sqrt(d)
        s = np.exp(s - s.max(-1, keepdims=True))
        s /= s.sum(-1, keepdims=True)
        c = (s @ v).transpose(1, 0, 2).reshape(S, H)
        x = ln(x + lin(c, "attention.output.dense"), t(p + "attention.output.LayerNorm.weight"),
               t(p + "attention.output.LayerNorm.bias"), eps)
        f = lin(gelu(lin(x, "intermediate.dense")), "output.dense")
        x = ln(x + f, t(p + "output.LayerNorm.weight"), t(p + "output.LayerNorm.bias"), eps)
    h = gelu(x @ t("cls.predictions.transform.dense.weight").T + t("cls.predictions.transform.dense.bias"))
    h = ln(h, t("cls.predictions.transform.LayerNorm.weight"), t("cls.predictions.transform.LayerNorm.bias"), eps)
    return h @ t("cls.predictions.decoder.weight").T + t("cls.predictions.bias")


def rel_l2(a, b):
    import numpy as np
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def hf_export(prog, out, configs):
    o = fresh(os.path.join(out, "hf"))
    run(prog, ["train"] + tiny(configs) + ["--steps", "6", "--output", o, "--eval-every", "0"])
    hf = os.path.join(o, "hf")
    cfg = json.load(open(os.path.join(hf, "config.json")))
    for k, v in (("architectures", ["BertForMaskedLM"]), ("model_type", "bert"), ("vocab_size", 4000),
                 ("hidden_size", 32), ("num_hidden_layers", 2), ("tie_word_embeddings", True)):
        if cfg.get(k) != v:
            fail("config.json: %s is %r, expected %r" % (k, cfg.get(k), v))
    tensors, meta = safetensors(os.path.join(hf, "model.safetensors"))
    want = set(HF_NAMES) | {"bert.encoder.layer.%d.%s" % (i, n) for i in range(2) for n in HF_LAYER}
    if set(tensors) != want:
        fail("tensors: missing %s, unexpected %s" % (sorted(want - set(tensors)), sorted(set(tensors) - want)))
    shapes = {"bert.embeddings.word_embeddings.weight": (4000, 32), "bert.embeddings.position_embeddings.weight": (64, 32),
              "bert.encoder.layer.1.attention.self.key.weight": (32, 32), "bert.encoder.layer.0.intermediate.dense.weight":
              (64, 32), "cls.predictions.bias": (4000,), "cls.predictions.decoder.weight": (4000, 32)}
    for n, s in shapes.items():
        if tensors[n][1] != s or tensors[n][0] != "F32":
            fail("%s is %s %s, expected F32 %s" % (n, tensors[n][0], tensors[n][1], s))
    if tensors["cls.predictions.decoder.weight"][2] != tensors["bert.embeddings.word_embeddings.weight"][2]:
        fail("the decoder is not the word embedding table")
    if meta.get("format") != "pt":
        fail("metadata format is %r, transformers expects 'pt'" % meta.get("format"))
    print("file layout: %d tensors as BertForMaskedLM names them; config.json ok" % len(tensors))

    ids, types = [2, 45, 4, 117, 9, 3, 300, 12, 3], [0, 0, 0, 0, 0, 0, 1, 1, 1]
    args = ["--ids", " ".join(map(str, ids)), "--types", " ".join(map(str, types)), "--threads", "2"]
    la, lh = os.path.join(o, "logits_ckpt.f32"), os.path.join(o, "logits_hf.f32")
    run(prog, ["logits", "--checkpoint", os.path.join(o, "checkpoints"), "--out", la] + args)
    run(prog, ["logits", "--hf", hf, "--out", lh] + args)
    if open(la, "rb").read() != open(lh, "rb").read():
        fail("the logits of the checkpoint and of its Hugging Face export differ")
    print("logits from the engine checkpoint and from the export (imported back): bit-identical")
    try:
        import numpy as np
    except ImportError:
        print("numpy is not importable: the numeric check is skipped")
        return
    prog_logits = np.fromfile(la, dtype="<f4").reshape(len(ids), 4000).astype(np.float64)
    ref = numpy_bert_mlm(tensors, cfg, ids, types)
    e = rel_l2(prog_logits, ref)
    print("logits vs a NumPy BertForMaskedLM over the exported tensors (fp64): relative L2 %.2e" % e)
    if not e <= 1e-5:  # tests/common/bounds.h: fp32 against an fp64 reference
        fail("the program's logits differ from the NumPy reference")
    try:
        import torch
        import transformers
    except ImportError:
        print("transformers is not importable: its check is skipped")
        return
    model = transformers.BertForMaskedLM.from_pretrained(hf).eval()
    with torch.no_grad():
        got = model(input_ids=torch.tensor([ids]), token_type_ids=torch.tensor([types])).logits[0].double().numpy()
    e = rel_l2(prog_logits, got)
    print("logits vs transformers %s BertForMaskedLM: relative L2 %.2e" % (transformers.__version__, e))
    if not e <= 1e-5:
        fail("the program's logits differ from transformers'")


# ---- cpu-vs-cuda -----------------------------------------------------------------------------------------
def cpu_vs_cuda(prog, out, configs):
    runs = {}
    for be in ("cpu", "cuda"):
        o = fresh(os.path.join(out, "backend_" + be))
        p = run(prog, ["train"] + tiny(configs) + ["--steps", "3", "--output", o, "--backend", be, "--eval-every", "0",
                                                   "--no-export"], expect=None)
        if be == "cuda" and p.returncode == 5:
            print("no usable CUDA device: skipped")
            sys.exit(SKIP)
        if p.returncode != 0:
            fail("%s run: exit status %d" % (be, p.returncode))
        runs[be] = train_records(o)
    for rc, rg in zip(runs["cpu"], runs["cuda"]):
        tol = 1e-5 if rc["step"] == 1 else 1e-3  # the same masks and data; after updates, GEMM rounding adds up
        for k in ("mlm_loss", "nsp_loss"):
            e = abs(rg[k] - rc[k]) / abs(rc[k])
            print("step %d %s: cpu %.9g cuda %.9g (rel %.1e)" % (rc["step"], k, rc[k], rg[k], e))
            if not e <= tol:
                fail("step %d: %s differs by %.1e (bound %.0e)" % (rc["step"], k, e, tol))


# ---- packed-vs-padded ------------------------------------------------------------------------------------
def packed_vs_padded(prog, out, configs, backend="cpu"):
    """The layers on the real tokens only (--layers packed) and on the padded batch: the same model, so the
    same losses up to the rounding of GEMMs over other row counts (and the batches do hold padding)."""
    # One verse per document: pairs of verses, shorter than the 64 tokens of the sequence.
    kjv = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools", "dst-pretrain", "data", "kjv.txt")
    with open(kjv, encoding="utf-8") as f:
        verses = [l.strip() for l in f if l.strip()][:600]
    corpus = os.path.join(fresh(os.path.join(out, "layers_corpus")), "verses.txt")
    with open(corpus, "w", encoding="utf-8") as f:
        f.write("\n\n".join(verses) + "\n")
    runs = {}
    for mode, extra in (("packed", ["--layers", "packed"]), ("padded", ["--layers", "padded"])):
        o = fresh(os.path.join(out, "layers_" + mode))
        run(prog, ["train"] + tiny(configs) + ["--seq", "64", "--corpus", corpus, "--steps", "4", "--output", o,
                                               "--backend", backend, "--eval-every", "0", "--no-export"] + extra)
        runs[mode] = train_records(o)
    real = sum(r["tokens"] for r in runs["packed"]) / (runs["packed"][-1]["samples"] * 64)  # samples: cumulative
    print("real tokens: %.1f %% of the padded batches" % (100 * real))
    if not real < 0.95:
        fail("the batches hold almost no padding: the comparison would not test the packed layers")
    for ra, rb in zip(runs["packed"], runs["padded"]):
        tol = 1e-6 if ra["step"] == 1 else 1e-4
        for k in ("mlm_loss", "nsp_loss"):
            e = abs(ra[k] - rb[k]) / abs(rb[k])
            print("step %d %s: packed %.9g padded %.9g (rel %.1e)" % (ra["step"], k, ra[k], rb[k], e))
            if not e <= tol:
                fail("step %d: %s differs by %.1e (bound %.0e)" % (ra["step"], k, e, tol))
    if len(runs["packed"]) != 4 or len(runs["padded"]) != 4:
        fail("expected 4 training records in each run")


# ---- nccl-world1 ---------------------------------------------------------------------------------------
def nccl_world1(prog, out, configs):
    """The all-reduce path with one rank: ncclAvg over one process is the identity, so the losses and the
    final weights equal a run without a communicator bit for bit (accumulation 2: the hook runs on the
    boundary micro-batch only; fp32 and Pre-LN with the final LayerNorm's bucket)."""
    runs = {}
    env = {"WORLD_SIZE": "1", "RANK": "0", "LOCAL_RANK": "0"}
    for pre_ln in (False, True):
        for comm in ("nccl", "none"):
            o = fresh(os.path.join(out, "nccl_%s_%s" % ("preln" if pre_ln else "postln", comm)))
            p = run_gpu(prog, ["train"] + tiny(configs, pre_ln) + ["--steps", "4", "--output", o, "--backend", "cuda",
                                                                   "--comm", comm, "--eval-every", "0", "--no-export"],
                        env, "--comm " + comm)
            if comm == "nccl" and "gradients averaged by nccl" not in p.stdout:
                fail("the run does not say that NCCL averages the gradients")
            tensors, _ = safetensors(os.path.join(o, "checkpoints", "global_step4", "mp_rank_00_model_states.safetensors"))
            runs[(pre_ln, comm)] = ([(r["step"], r["mlm_loss"], r["nsp_loss"]) for r in train_records(o)], tensors)
        a, b = runs[(pre_ln, "nccl")], runs[(pre_ln, "none")]
        if a[0] != b[0]:
            fail("losses differ: nccl %s, none %s" % (a[0], b[0]))
        if sorted(a[1]) != sorted(b[1]) or any(a[1][k] != b[1][k] for k in a[1]):
            fail("the weights after 4 steps differ between --comm nccl and --comm none")
        print("%s: 4 steps, losses and %d tensors identical" % ("Pre-LN" if pre_ln else "Post-LN", len(a[1])))
    # --comm auto (the default) with one rank reduces nothing: no NCCL line, "none" in the run record.
    o = fresh(os.path.join(out, "nccl_auto"))
    p = run_gpu(prog, ["train"] + tiny(configs, False) + ["--steps", "1", "--output", o, "--backend", "cuda",
                                                          "--eval-every", "0", "--no-export", "--no-checkpoint"],
                env, "--comm auto")
    run_rec = [r for r in metrics(o) if r["type"] == "run"]
    if "gradients averaged" in p.stdout or len(run_rec) != 1 or run_rec[0]["comm"] != "none":
        fail("--comm auto with one rank: expected no communicator, got %s" % (run_rec,))


# ---- zero-grads ------------------------------------------------------------------------------------------
def zero_grads(prog, out, configs, backend="cpu"):
    """By default the engine leaves the gradients at each step and the first micro-batch of the next step
    writes them; --zero-grads has the engine zero them and every backward op add to them. The same
    arithmetic: the losses and the weights after 4 steps of 2 micro-batches are identical, Post-LN and
    Pre-LN (its final LayerNorm), with padded and packed layers, dropout on."""
    for pre_ln in (False, True):
        for layers in ("padded", "packed"):
            runs = {}
            for name, extra in (("write", []), ("zero", ["--zero-grads"])):
                o = fresh(os.path.join(out, "zero_grads_%s_%s_%s_%s" % (backend, "preln" if pre_ln else "postln",
                                                                        layers, name)))
                run_gpu(prog, ["train"] + tiny(configs, pre_ln) + ["--steps", "4", "--output", o, "--backend", backend,
                                                                   "--eval-every", "0", "--no-export",
                                                                   "--layers", layers] + extra, None, name)
                tensors, _ = safetensors(os.path.join(o, "checkpoints", "global_step4",
                                                      "mp_rank_00_model_states.safetensors"))
                runs[name] = ([(r["step"], r["mlm_loss"], r["nsp_loss"]) for r in train_records(o)], tensors)
            a, b = runs["write"], runs["zero"]
            what = "%s, %s layers, %s" % ("Pre-LN" if pre_ln else "Post-LN", layers, backend)
            if len(a[0]) != 4:
                fail("%s: %d training records, expected 4" % (what, len(a[0])))
            if a[0] != b[0]:
                fail("%s: losses differ: written %s, zeroed %s" % (what, a[0], b[0]))
            if sorted(a[1]) != sorted(b[1]) or any(a[1][k] != b[1][k] for k in a[1]):
                fail("%s: the weights after 4 steps differ between writing and zeroing the gradients" % what)
            print("%s: 4 steps of 2 micro-batches, losses and %d tensors identical" % (what, len(a[1])))


# ---- replicas --------------------------------------------------------------------------------------------
def replicas(prog, out, configs, backend="cpu", env=None, comm=None):
    """--check-replicas writes one "replicas" record per step (one rank: always the same), whose checksum
    follows the weights (it changes once the learning rate is above 0, and with the seed); --no-overlap
    (the buckets reduced after the backward) changes no loss and no weight; bad --comm-timeout values are
    usage errors."""
    runs = {}
    extra = ["--comm", comm] if comm else []
    for name, args in (("overlap", []), ("no-overlap", ["--no-overlap"]), ("seed", ["--seed", "7"])):
        o = fresh(os.path.join(out, "replicas_" + name + ("_" + comm if comm else "")))
        run_gpu(prog, ["train"] + tiny(configs) + ["--steps", "4", "--output", o, "--backend", backend,
                                                   "--eval-every", "0", "--no-export", "--no-checkpoint",
                                                   "--check-replicas", "--comm-timeout", "120"] + extra + args,
                env, name)
        recs = [r for r in metrics(o) if r["type"] == "replicas"]
        if [r["step"] for r in recs] != [1, 2, 3, 4]:
            fail("%s: replicas records for steps %s, expected 1-4" % (name, [r["step"] for r in recs]))
        if any(r["ranks"] != 1 or r["same"] is not True or len(r["checksum"]) != 16 for r in recs):
            fail("%s: bad replicas record in %s" % (name, recs))
        runs[name] = ([r["checksum"] for r in recs], [(r["step"], r["mlm_loss"], r["nsp_loss"]) for r in train_records(o)])
    sums, losses = runs["overlap"]
    if len(set(sums)) < 2:
        fail("the checksum never changed over 4 steps: %s" % sums)
    if runs["no-overlap"] != runs["overlap"]:
        fail("--no-overlap changed the weights or the losses: %s vs %s" % (runs["no-overlap"], runs["overlap"]))
    if runs["seed"][0][0] == sums[0]:
        fail("another seed gives the same checksum: %s" % sums[0])
    for bad in ("-1", "x", "86401"):
        p = run(prog, ["train"] + tiny(configs) + ["--comm-timeout", bad, "--output", os.path.join(out, "bad")],
                expect=2)
        if "--comm-timeout" not in p.stdout + p.stderr:
            fail("--comm-timeout %s: the message does not name the option" % bad)
    print("replicas: 4 records per run, %d distinct checksums, --no-overlap identical" % len(set(sums)))


def replicas_nccl(prog, out, configs):
    """replicas through NCCL with one rank (the comparison of the checksum is an NCCL all-reduce then, and
    the watchdog thread runs)."""
    replicas(prog, out, configs, backend="cuda", env={"WORLD_SIZE": "1", "RANK": "0", "LOCAL_RANK": "0"},
             comm="nccl")


# ---- profile -------------------------------------------------------------------------------------------
PHASES = ("data", "embeddings_head", "layers", "comm", "optimizer", "other")


def profile(prog, out, configs):
    """--profile writes one "profile" record per optimizer step whose phases add up to the time between two
    steps, and changes no number; --profile-calls adds a table of the costliest library call sites, whose
    times fit inside the phases; --no-checkpoint writes no checkpoint."""
    runs = {}
    for mode in ("off", "on", "calls"):
        prof = mode != "off"
        o = fresh(os.path.join(out, "profile_%s" % mode))
        flag = {"off": [], "on": ["--profile"], "calls": ["--profile-calls"]}[mode]
        p = run(prog, ["train"] + tiny(configs) + ["--steps", "6", "--output", o, "--eval-every", "0", "--no-export",
                                                   "--no-checkpoint"] + flag)
        if os.path.exists(os.path.join(o, "checkpoints")) and os.listdir(os.path.join(o, "checkpoints")):
            fail("--no-checkpoint: %s/checkpoints is not empty" % o)
        recs = metrics(o)
        runs[mode] = [(r["step"], r["loss"], r["mlm_loss"], r["nsp_loss"]) for r in recs if r["type"] == "train"]
        prof_recs = [r for r in recs if r["type"] == "profile"]
        if not prof:
            if prof_recs or "profile:" in p.stdout or "profile calls:" in p.stdout:
                fail("profile output without --profile")
            continue
        if [r["step"] for r in prof_recs] != list(range(1, 7)):
            fail("profile records for steps %s, expected 1..6" % [r["step"] for r in prof_recs])
        train = {r["step"]: r for r in recs if r["type"] == "train"}
        for r in prof_recs:
            if r["micro_batches"] != 2:  # tiny_ds.json: accumulation 2
                fail("step %d: %s micro-batches, expected 2" % (r["step"], r["micro_batches"]))
            parts = [r[ph + "_s"] for ph in PHASES]
            if any(not (v >= 0.0 and math.isfinite(v)) for v in parts):
                fail("step %d: a phase time is negative or not finite: %s" % (r["step"], r))
            if not (r["layers_s"] > 0 and r["embeddings_head_s"] > 0 and r["optimizer_s"] > 0):
                fail("step %d: layers, embeddings/head and optimizer must each take some time: %s" % (r["step"], r))
            if r["step"] >= 2:  # the phases cover the loop from one step's optimizer to the next one's
                dt = train[r["step"]]["elapsed_s"] - train[r["step"] - 1]["elapsed_s"]
                total = sum(parts)
                print("step %d: phases %.4f s, between the steps %.4f s" % (r["step"], total, dt))
                if abs(total - dt) > 0.1 * dt + 0.005:
                    fail("step %d: the phases add up to %.4f s, the step took %.4f s" % (r["step"], total, dt))
        summary = [l for l in p.stdout.splitlines() if l.startswith("profile: 6 steps")]
        if len(summary) != 1 or not all(ph in summary[0] for ph in PHASES):
            fail("no profile summary naming every phase in the output")
        lines = p.stdout.splitlines()
        head = [i for i, l in enumerate(lines) if l.startswith("profile calls:")]
        if mode == "on":
            if head:
                fail("a call table without --profile-calls")
            continue
        if len(head) != 1:
            fail("--profile-calls: no 'profile calls:' table in the output")
        m = re.match(r"profile calls: (\d+) sites, ([0-9.]+) ms per step in all over steps 2-6 ", lines[head[0]])
        sites = []
        for l in lines[head[0] + 1:]:
            r = re.match(r"\s+([0-9.]+) ms/step\s+([0-9.]+) calls/step\s+(dst_\w+) \(model\.c:(\d+)\)$", l)
            if not r:
                break
            sites.append((float(r.group(1)), float(r.group(2)), r.group(3)))
        if not m or not sites or len(sites) > min(16, int(m.group(1))):
            fail("--profile-calls: a malformed table:\n%s" % "\n".join(lines[head[0]:head[0] + 18]))
        if [t for t, _, _ in sites] != sorted((t for t, _, _ in sites), reverse=True):
            fail("--profile-calls: the sites are not costliest first")
        names = {n for _, _, n in sites}
        if not {"dst_layer_forward", "dst_layer_backward"} <= names:
            fail("--profile-calls: the layers' calls are not among the costliest: %s" % sorted(names))
        later = [r for r in prof_recs if r["step"] >= 2]  # the table counts from step 2 on
        per_step = sum(sum(r[ph + "_s"] for ph in PHASES) for r in later) / len(later) * 1e3
        if not float(m.group(2)) <= per_step * 1.05 + 0.5:
            fail("--profile-calls: the call sites take %s ms per step, more than the %.3f ms of the phases"
                 % (m.group(2), per_step))
        print("--profile-calls: %s sites, %s of %.3f ms per step" % (m.group(1), m.group(2), per_step))
    if not runs["on"] == runs["off"] == runs["calls"]:
        fail("--profile changed the losses:\n%s\n%s\n%s" % (runs["on"], runs["off"], runs["calls"]))
    print("6 steps: the same losses without --profile, with it and with --profile-calls")


# ---- data-out ------------------------------------------------------------------------------------------
def read_batches(path):
    """The records of `dst-pretrain data --out` (docs/pretrain-data.md)."""
    with open(path, "rb") as f:
        data = f.read()
    if data[:8] != b"DSTPBAT1":
        fail("%s does not start with DSTPBAT1" % path)
    at, out = 8, []
    while at < len(data):
        B, S, P, M = struct.unpack_from("<4i", data, at)
        at += 16
        n = (B * S, B * S, B, B, M, M)
        arrays = []
        for k in n:
            arrays.append(list(struct.unpack_from("<%di" % k, data, at)))
            at += 4 * k
        out.append(dict(batch=B, seq=S, max_pred=P, nrows=M, ids=arrays[0], types=arrays[1], lengths=arrays[2],
                        nsp=arrays[3], rows=arrays[4], labels=arrays[5]))
    if at != len(data):
        fail("%s: %d bytes left after the last record" % (path, len(data) - at))
    return out


def data_out(prog, out, configs):
    o = fresh(os.path.join(out, "data_out"))
    path = os.path.join(o, "batches.bin")
    p = run(prog, ["data", "--batches", "5", "--batch", "6", "--seq", "48", "--max-pred", "7", "--seed", "3",
                   "--out", path])
    batches = read_batches(path)
    lines = [l for l in p.stdout.splitlines() if l.startswith("batch ")]
    firsts = [l for l in p.stdout.splitlines() if l.startswith("  first ids:")]
    if len(batches) != 5 or len(lines) != 5:
        fail("%d records and %d summary lines, expected 5" % (len(batches), len(lines)))
    vocab = sum(1 for _ in open(os.path.join(os.path.dirname(configs), "..", "..", "tools", "dst-pretrain", "data",
                                             "vocab.txt")))
    for i, (b, line, first) in enumerate(zip(batches, lines, firsts)):
        B, S = b["batch"], b["seq"]
        if (B, S, b["max_pred"]) != (6, 48, 7):
            fail("record %d: batch %d, seq %d, max_pred %d" % (i, B, S, b["max_pred"]))
        want = "batch %d (epoch 0): %d sequences of %d, %d tokens, %d masked" % (i, B, S, sum(b["lengths"]), b["nrows"])
        if not line.startswith(want) or not line.endswith("%d random next" % sum(b["nsp"])):
            fail("record %d does not match its summary line:\n  %s\n  expected %s ... %d random next"
                 % (i, line, want, sum(b["nsp"])))
        if first.split()[2:] != [str(v) for v in b["ids"][:min(16, b["lengths"][0])]]:
            fail("record %d: the first ids differ from the summary line" % i)
        if b["rows"] != sorted(b["rows"]) or len(set(b["rows"])) != b["nrows"] or b["nrows"] > B * 7:
            fail("record %d: masked rows not ascending and distinct, or more than batch x max_pred" % i)
        for s in range(B):
            n = b["lengths"][s]
            if not 1 <= n <= S:
                fail("record %d: sequence %d has length %d" % (i, s, n))
            if any(b["ids"][s * S + t] != 0 or b["types"][s * S + t] != 0 for t in range(n, S)):
                fail("record %d: sequence %d is not padded with [PAD] (0) and type 0 after its length" % (i, s))
        for r, lab in zip(b["rows"], b["labels"]):
            s, t = divmod(r, S)
            if not (0 < t < b["lengths"][s] and 0 <= lab < vocab):
                fail("record %d: masked row %d (sequence %d, position %d) or label %d out of range" % (i, r, s, t, lab))
    again = os.path.join(o, "again.bin")
    run(prog, ["data", "--batches", "5", "--batch", "6", "--seq", "48", "--max-pred", "7", "--seed", "3",
               "--out", again])
    if open(path, "rb").read() != open(again, "rb").read():
        fail("two runs with the same seed wrote different batches")
    run(prog, ["data", "--batches", "1", "--out", os.path.join(o, "no", "such", "dir", "b.bin")], expect=1)
    print("5 records agree with the summary lines; padding, masked rows and labels in range; deterministic")


def main():
    if len(sys.argv) < 4:
        print(__doc__)
        return 2
    what, prog, out = sys.argv[1], os.path.abspath(sys.argv[2]), os.path.abspath(sys.argv[3])
    rest = [os.path.abspath(a) for a in sys.argv[4:]]
    t = time.time()
    {"loss-falls": loss_falls, "resume": resume, "interrupt": interrupt, "errors": errors, "hf-export": hf_export,
     "cpu-vs-cuda": cpu_vs_cuda, "packed-vs-padded": packed_vs_padded, "nccl-world1": nccl_world1, "profile": profile, "data-out": data_out,
     "replicas": replicas, "replicas-nccl": replicas_nccl, "zero-grads": zero_grads,
     "zero-grads-cuda": lambda p, o, c: zero_grads(p, o, c, backend="cuda")}[what](
        prog, out, *rest)
    print("PASS: %s (%.1f s)" % (what, time.time() - t))
    return 0


if __name__ == "__main__":
    sys.exit(main())
