#!/usr/bin/python3
"""Write (or check) the golden files of libdstransformer's layer: tests/data/golden_<name>.safetensors.

Each file holds one layer configuration, its random inputs and parameters, and the float64 reference results of
dst_reference.py (output, grad_input and the 12 parameter gradients of L = Σ output⊙grad_output) for one training
forward + backward with the file's RNG state (rng_seed, rng_offset).

Usage:
    /usr/bin/python3 tests/reference/make_golden.py [OUTDIR]     # write the files (default OUTDIR: tests/data)
    /usr/bin/python3 tests/reference/make_golden.py --check      # regenerate into a temporary directory and
                                                                 # compare with tests/data; non-zero exit on any
                                                                 # difference

safetensors is written and read by hand (no safetensors package): an 8-byte little-endian u64 header length N,
N bytes of UTF-8 JSON padded with spaces to a multiple of 8, then the raw little-endian tensor data, contiguous
in the order written.  The JSON holds "__metadata__" (string -> string) and, per tensor,
{"dtype": "F64"|"I32", "shape": [...], "data_offsets": [begin, end]} relative to the data section.
"""

import argparse
import json
import os
import struct
import sys
import tempfile
from collections import OrderedDict

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import dst_reference as ref  # noqa: E402

DEFAULT_DIR = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "data"))

# Computed tensors may differ between machines only by the summation order of BLAS (matmul / einsum) reductions,
# i.e. by a few ulps of float64 each: relative L2 error 1e-12 per tensor allows for that and nothing else.
# Everything drawn from the random generator (inputs, mask, grad_output, parameters) must be bit-identical.
COMPUTED_RTOL = 1e-12

_DTYPES = {"F64": np.dtype("<f8"), "F32": np.dtype("<f4"), "I32": np.dtype("<i4")}


# ----------------------------------------------------------------------------------------------------------------
# safetensors by hand
# ----------------------------------------------------------------------------------------------------------------

def write_safetensors(path, tensors, metadata):
    """tensors: ordered name -> ndarray (float64, float32 or int32); metadata: str -> str."""
    header = OrderedDict()
    header["__metadata__"] = OrderedDict((str(k), str(v)) for k, v in metadata.items())
    blobs, pos = [], 0
    for name, arr in tensors.items():
        arr = np.asarray(arr)
        if arr.dtype == np.float32:
            tag = "F32"
        elif arr.dtype.kind == "f":
            tag = "F64"
        elif arr.dtype.kind in "iu":
            tag = "I32"
        else:
            raise TypeError(f"{name}: unsupported dtype {arr.dtype}")
        data = np.ascontiguousarray(arr, dtype=_DTYPES[tag]).tobytes()
        header[name] = OrderedDict([("dtype", tag), ("shape", list(arr.shape)),
                                    ("data_offsets", [pos, pos + len(data)])])
        blobs.append(data)
        pos += len(data)
    hjson = json.dumps(header, separators=(",", ":")).encode("utf-8")
    hjson += b" " * ((-len(hjson)) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(hjson)))
        f.write(hjson)
        for b in blobs:
            f.write(b)


def read_safetensors(path):
    """Returns (metadata dict, ordered name -> ndarray, ordered name -> (dtype tag, shape))."""
    with open(path, "rb") as f:
        raw = f.read()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n].decode("utf-8"), object_pairs_hook=OrderedDict)
    data = raw[8 + n:]
    meta = dict(header.pop("__metadata__", {}))
    tensors, info = OrderedDict(), OrderedDict()
    for name, h in header.items():
        b, e = h["data_offsets"]
        dt = _DTYPES[h["dtype"]]
        tensors[name] = np.frombuffer(data[b:e], dtype=dt).reshape(h["shape"]).copy()
        info[name] = (h["dtype"], tuple(h["shape"]))
    return meta, tensors, info


# ----------------------------------------------------------------------------------------------------------------
# Configurations
# ----------------------------------------------------------------------------------------------------------------

def _additive(B, S, padded_per_batch):
    """Additive key mask [B,S]: 0 on kept keys, -10000 on the last padded_per_batch[b] keys of batch b."""
    m = np.zeros((B, S))
    for b, n in enumerate(padded_per_batch):
        if n:
            m[b, S - n:] = -10000.0
    return m


# name: layer config, batch, seq, mask kind, mask, rng state, generator seed of the file.
CONFIGS = OrderedDict([
    ("preln_additive", dict(
        cfg=ref.LayerConfig(20, 4, 36, 0.1, 0.1, True, 1e-12, "erf", False),
        B=3, S=5, mask_kind="additive", mask=_additive(3, 5, [0, 2, 1]), rng_seed=1234, rng_offset=0,
        gen_seed=101)),
    ("postln_lengths", dict(
        cfg=ref.LayerConfig(30, 3, 120, 0.1, 0.1, False, 1e-5, "tanh", False),
        B=3, S=13, mask_kind="lengths", mask=np.array([13, 7, 1], dtype=np.int32), rng_seed=99, rng_offset=17,
        gen_seed=102)),
    ("preln_causal_nodrop", dict(
        cfg=ref.LayerConfig(16, 2, 64, 0.0, 0.0, True, 1e-12, "erf", True),
        B=2, S=7, mask_kind="none", mask=None, rng_seed=5, rng_offset=0,
        gen_seed=103)),
    ("postln_s1", dict(
        cfg=ref.LayerConfig(12, 3, 40, 0.2, 0.15, False, 1e-12, "erf", False),
        B=3, S=1, mask_kind="additive", mask=np.zeros((3, 1)), rng_seed=7, rng_offset=3,
        gen_seed=104)),
    ("preln_lengths_causal", dict(
        cfg=ref.LayerConfig(21, 7, 50, 0.1, 0.1, True, 1e-12, "tanh", True),
        B=2, S=9, mask_kind="lengths", mask=np.array([9, 4], dtype=np.int32), rng_seed=2024, rng_offset=1000000,
        gen_seed=105)),
    ("postln_big_h", dict(
        cfg=ref.LayerConfig(64, 4, 160, 0.1, 0.1, False, 1e-12, "erf", False),
        B=2, S=6, mask_kind="additive", mask=_additive(2, 6, [0, 2]), rng_seed=11, rng_offset=0,
        gen_seed=106)),
])

INPUT_NAMES = ("input", "mask", "grad_output") + ref.PARAM_NAMES  # drawn / given: must be bit-identical


def round_to(a, kind):
    """a (float64) rounded to the nearest fp16 or bf16 value (ties to even), returned as float64."""
    a = np.asarray(a, dtype=np.float64)
    if kind == "fp16":
        return a.astype(np.float16).astype(np.float64)
    m, e = np.frexp(a)  # a = m * 2^e, 0.5 <= |m| < 1: bf16 keeps 8 significant bits
    return np.ldexp(np.rint(m * 256.0) / 256.0, e)


# A layer that stores in fp16 or bf16 first rounds its inputs and parameters; that rounding alone moves
# the outputs by about the dtype's precision. The "<dtype>." references are the float64 layer run on
# exactly those rounded values, so the C++ tests measure the error of the 16-bit computation itself.
REDUCED = ("fp16", "bf16")


def build(name):
    """(metadata, ordered tensors) of one golden file."""
    c = CONFIGS[name]
    cfg, B, S = c["cfg"], c["B"], c["S"]
    H = cfg.hidden_size
    rng = np.random.default_rng(c["gen_seed"])
    # Draw order: input, grad_output, then the parameters in DeepSpeed order.
    x = rng.standard_normal((B, S, H))
    dy = rng.standard_normal((B, S, H))
    params = ref.init_params(cfg, rng)
    mask = c["mask"]
    y, cache = ref.forward(cfg, params, x, mask, training=True, rng_seed=c["rng_seed"], rng_offset=c["rng_offset"])
    dx, grads = ref.backward(cache, dy)

    meta = OrderedDict([
        ("format", "dst-golden-1"),
        ("hidden_size", str(H)),
        ("heads", str(cfg.heads)),
        ("intermediate_size", str(cfg.intermediate_size)),
        # Shortest string that round-trips the float32 ratio (numpy's float32 repr): "0.1", "0.15", "0.0".
        ("attn_dropout_ratio", str(np.float32(cfg.attn_dropout_ratio))),
        ("hidden_dropout_ratio", str(np.float32(cfg.hidden_dropout_ratio))),
        ("pre_layer_norm", "1" if cfg.pre_layer_norm else "0"),
        ("layer_norm_eps", repr(float(cfg.layer_norm_eps))),
        ("gelu", cfg.gelu),
        ("causal", "1" if cfg.causal else "0"),
        ("rng_seed", str(c["rng_seed"])),
        ("rng_offset", str(c["rng_offset"])),
        ("batch", str(B)),
        ("seq", str(S)),
        ("mask_kind", c["mask_kind"]),
    ])
    t = OrderedDict()
    t["input"] = x
    if mask is not None:
        t["mask"] = np.asarray(mask, dtype=np.int32 if c["mask_kind"] == "lengths" else np.float64)
    t["grad_output"] = dy
    for n in ref.PARAM_NAMES:
        t[n] = params[n]
    t["output"] = y
    t["grad_input"] = dx
    for n in ref.PARAM_NAMES:
        t["grad." + n] = grads[n]
    for kind in REDUCED:
        rmask = mask if (mask is None or c["mask_kind"] == "lengths") else round_to(mask, kind)
        rparams = {n: round_to(params[n], kind) for n in ref.PARAM_NAMES}
        ry, rcache = ref.forward(cfg, rparams, round_to(x, kind), rmask, training=True, rng_seed=c["rng_seed"],
                                 rng_offset=c["rng_offset"])
        rdx, rgrads = ref.backward(rcache, round_to(dy, kind))
        # Stored as float32: compared at 1e-3 / 1e-2, float32's 6e-8 is far below that.
        t[kind + ".output"] = ry.astype(np.float32)
        t[kind + ".grad_input"] = rdx.astype(np.float32)
        for n in ref.PARAM_NAMES:
            t[kind + ".grad." + n] = rgrads[n].astype(np.float32)
    return meta, t


def file_name(name):
    return f"golden_{name}.safetensors"


def write_all(outdir):
    os.makedirs(outdir, exist_ok=True)
    paths = []
    for name in CONFIGS:
        meta, t = build(name)
        path = os.path.join(outdir, file_name(name))
        write_safetensors(path, t, meta)
        paths.append(path)
    return paths


def compare_files(new_path, old_path):
    """List of (ok, message) for every check of one file: metadata, tensor list, then each tensor."""
    results = []
    fname = os.path.basename(old_path)
    if not os.path.exists(old_path):
        return [(False, f"{fname}: missing in {os.path.dirname(old_path)}")]
    m_new, t_new, i_new = read_safetensors(new_path)
    m_old, t_old, i_old = read_safetensors(old_path)
    if m_new == m_old:
        results.append((True, f"{fname}: metadata"))
    else:
        keys = sorted(k for k in set(m_new) | set(m_old) if m_new.get(k) != m_old.get(k))
        results.append((False, f"{fname}: metadata differs in {keys}"))
    if list(i_new) != list(i_old):
        results.append((False, f"{fname}: tensor list differs: expected {list(i_new)}, file has {list(i_old)}"))
    for name, (dtag, shape) in i_new.items():
        if name not in i_old:
            continue
        if i_old[name] != (dtag, shape):
            results.append((False, f"{fname}: tensor '{name}' is {i_old[name]}, expected {(dtag, shape)}"))
            continue
        a, b = t_new[name], t_old[name]
        if name in INPUT_NAMES:
            same = a.tobytes() == b.tobytes()
            results.append((same, f"{fname}: tensor '{name}' " + ("bit-identical" if same else
                                                                     "is NOT bit-identical to the regenerated one")))
        else:
            err = ref.rel_l2(b, a)
            ok = bool(np.all(np.isfinite(b))) and err <= COMPUTED_RTOL
            results.append((ok, f"{fname}: tensor '{name}' relative L2 difference {err:.3e}"
                                + ("" if ok else f" exceeds {COMPUTED_RTOL:g}")))
    return results


def check(datadir):
    passed = failed = 0
    with tempfile.TemporaryDirectory(prefix="dst_golden_") as tmp:
        write_all(tmp)
        for name in CONFIGS:
            for ok, msg in compare_files(os.path.join(tmp, file_name(name)), os.path.join(datadir, file_name(name))):
                if ok:
                    passed += 1
                else:
                    failed += 1
                    print("FAIL:", msg)
    extra = sorted(f for f in os.listdir(datadir) if f.startswith("golden_") and f.endswith(".safetensors")
                   and f not in {file_name(n) for n in CONFIGS}) if os.path.isdir(datadir) else []
    for f in extra:
        print(f"warning: {f} in {datadir} is not produced by make_golden.py")
    print(f"golden check of {len(CONFIGS)} files in {datadir}: {passed} passed, {failed} failed")
    if failed:
        print("The golden files differ from what tests/reference/make_golden.py produces. If the reference changed "
              "on purpose, regenerate with: /usr/bin/python3 tests/reference/make_golden.py")
    return 1 if failed else 0


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("outdir", nargs="?", default=DEFAULT_DIR, help="output directory (default: tests/data)")
    ap.add_argument("--check", action="store_true",
                    help="regenerate into a temporary directory and compare with OUTDIR (default tests/data)")
    args = ap.parse_args(argv)
    if args.check:
        return check(args.outdir)
    paths = write_all(args.outdir)
    total = sum(os.path.getsize(p) for p in paths)
    for p in paths:
        print(f"wrote {p} ({os.path.getsize(p)} bytes)")
    print(f"total {total} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
