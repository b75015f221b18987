#!/usr/bin/env python3
"""Runs DeepSpeed's Transformer-kernel unit tests, unmodified, against libdstransformer.

    python3 tools/deepspeed-conformance.py [--build DIR] [-k EXPR] [--timeout SECONDS] [--out DIR] DEEPSPEED_DIR

DEEPSPEED_DIR is a DeepSpeed source tree that the user supplies (nothing is fetched): a checkout, or a folder
holding tests/unit/..., or that tests folder itself. Its tests/unit/ops/accelerators/test_accelerator_forward.py
and test_accelerator_backward.py run through pytest with, first on PYTHONPATH, the ``deepspeed`` shim of
tools/deepspeed_shim (DeepSpeed's own ``deepspeed`` package is never imported), then libdstransformer's Python
package, then DeepSpeed's tests folder (for ``unit.modeling`` and ``unit.common``). DeepSpeed's conftest.py and
pytest.ini stay in force, except that pytest.ini's marker filter (which leaves the "sequential" forward class
to a separate run) is cleared so that every case of both files runs.

--build DIR: the CMake build folder holding libdstransformer.so (default $DST_GPU_BUILD_DIR, else
/tmp/dst-gpu-build, as tools/gpu-check.sh and tools/run-python-gpu.sh). The package is taken from
DIR/python-gpu (tools/run-python-gpu.sh) or DIR/python (the CMake build with DST_BUILD_PYTHON); when neither
exists but the library and the carried SWIG wrapper (.swig-out/python) do, it is compiled into DIR/python-gpu
with tools/build-python-gpu.sh. -k EXPR selects cases as pytest's -k. --timeout: seconds one case may take
(default 300); a case over it is stopped (its pytest process group is killed) and reported as "timeout", and
the remaining cases run in a new pytest process, as after a crash. DS_ACCELERATOR=cpu in the environment runs
the cases on the library's CPU backend.

Prints a table (case, outcome, seconds) and a summary; --out DIR (default: a new temporary folder) receives
the pytest logs, events.jsonl, results.json and summary.txt. Exit status: 0 when at least one case passed and
none failed, 1 otherwise (a failure, error, timeout or crash, or nothing passed), 2 for a usage or setup error.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SHIM = ROOT / "tools" / "deepspeed_shim"
TEST_FILES = ("unit/ops/accelerators/test_accelerator_forward.py", "unit/ops/accelerators/test_accelerator_backward.py")
HELPERS = ("unit/__init__.py", "unit/common.py", "unit/modeling.py", "unit/modelingpreln.py")
FAILING = ("failed", "error", "timeout", "crashed", "not run")


class SetupError(Exception):
    pass


def find_tests_dir(given: str) -> Path:
    base = Path(given).expanduser().resolve()
    for cand in (base / "tests", base):
        if all((cand / f).is_file() for f in TEST_FILES):
            needed = list(HELPERS)
            if "from .util import" in (cand / "unit/common.py").read_text(errors="replace"):
                needed.append("unit/util.py")  # newer DeepSpeed trees: common.py imports its helpers from util.py
            missing = [h for h in needed if not (cand / h).is_file()]
            if missing:
                raise SetupError(f"{cand} has the test files but not {', '.join(missing)}, which they import")
            return cand
    raise SetupError(f"{base} is not a DeepSpeed tree: expected {TEST_FILES[0]} and {TEST_FILES[1].rsplit('/', 1)[1]} "
                     f"under {base}/tests or {base}")


def refresh_sources(pkg: Path) -> None:
    """The package's pure-Python files are copies made when it was built: bring them up to date with
    bindings/python/dstransformer, as its build would, so that the run tests the tree's code."""
    stale = [src for src in sorted((ROOT / "bindings" / "python" / "dstransformer").glob("*.py"))
             if not (pkg / "dstransformer" / src.name).is_file()
             or (pkg / "dstransformer" / src.name).read_bytes() != src.read_bytes()]
    for src in stale:
        shutil.copyfile(src, pkg / "dstransformer" / src.name)
    if stale:
        print(f"deepspeed-conformance: updated {', '.join(s.name for s in stale)} in {pkg}/dstransformer "
              f"from bindings/python/dstransformer")


def find_package(build: Path, python: str, log: Path) -> Path:
    for cand in (build / "python-gpu", build / "python"):
        if (cand / "dstransformer" / "__init__.py").is_file():
            refresh_sources(cand)
            return cand
    lib = build / "libdstransformer.so"
    wrap = ROOT / ".swig-out" / "python" / "dstransformer_nativePYTHON_wrap.c"
    if lib.is_file() and wrap.is_file():
        out = build / "python-gpu"
        print(f"deepspeed-conformance: compiling the Python package into {out} (log: {log})")
        with open(log, "w") as f:
            rc = subprocess.call(["bash", str(ROOT / "tools" / "build-python-gpu.sh"), str(build), str(out)],
                                 stdout=f, stderr=subprocess.STDOUT, env={**os.environ, "PYTHON": python})
        if rc == 0:
            return out
        raise SetupError(f"tools/build-python-gpu.sh failed (exit {rc}); see {log}")
    raise SetupError(
        f"no dstransformer package under {build}/python-gpu or {build}/python"
        + ("" if lib.is_file() else f", and no libdstransformer.so in {build}")
        + ". Build it first: on the GPU machine `bash tools/run-python-gpu.sh OUTDIR` (library + package in "
          "$DST_GPU_BUILD_DIR), on a development machine `cmake --build BUILD` (DST_BUILD_PYTHON=ON), then pass "
          "--build BUILD")


def pytest_cmd(python: str, tests_dir: Path, args: list) -> list:
    # -P (Python >= 3.11): the working directory is not put first on sys.path.
    safe = ["-P"] if subprocess.run([python, "-P", "-c", ""], capture_output=True).returncode == 0 else []
    return [python, *safe, "-m", "pytest", "-p", "no:cacheprovider", "-p", "dst_conformance_plugin",
            "--rootdir", str(tests_dir), "-o", "addopts=", "--color=no", *args]


def read_events(path: Path, pos: int):
    """New complete lines of the events file from byte offset ``pos``: (records, new offset)."""
    if not path.exists():
        return [], pos
    with open(path, "rb") as f:
        f.seek(pos)
        data = f.read()
    end = data.rfind(b"\n") + 1
    return [json.loads(line) for line in data[:end].splitlines() if line.strip()], pos + end


def kill_group(proc: subprocess.Popen) -> None:
    for sig, wait in ((signal.SIGTERM, 15), (signal.SIGKILL, 15)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(wait)
            return
        except subprocess.TimeoutExpired:
            continue


def run_cases(ids: list, python: str, tests_dir: Path, env: dict, out: Path, events: Path, timeout: float) -> dict:
    results = {}
    remaining = list(ids)
    round_no = 0
    while remaining:
        round_no += 1
        log = out / f"pytest-{round_no}.log"
        pos = events.stat().st_size if events.exists() else 0
        current, started = None, 0.0
        progressed = False
        with open(log, "w") as f:
            proc = subprocess.Popen(pytest_cmd(python, tests_dir, remaining), cwd=tests_dir, env=env, stdout=f,
                                    stderr=subprocess.STDOUT, start_new_session=True)
            try:
                while True:
                    done = proc.poll() is not None
                    recs, pos = read_events(events, pos)
                    for r in recs:
                        if r["event"] == "start":
                            current, started, progressed = r["id"], time.monotonic(), True
                            print(f"  ... {short(current)}", flush=True)
                        elif r["event"] == "end":
                            results[r["id"]] = {k: r[k] for k in ("outcome", "duration", "message")}
                            current = None
                    if done:
                        break
                    if current is not None and time.monotonic() - started > timeout:
                        kill_group(proc)
                        results[current] = {"outcome": "timeout", "duration": round(time.monotonic() - started, 3),
                                            "message": f"over {timeout:g} s: its pytest process was stopped"}
                        current = None
                        break
                    time.sleep(0.5)
            except KeyboardInterrupt:
                kill_group(proc)
                raise
        if current is not None:  # started, never ended: pytest died under it
            results[current] = {"outcome": "crashed", "duration": round(time.monotonic() - started, 3),
                                "message": f"pytest exited with status {proc.returncode} during the case; "
                                           f"see {log.name}"}
        remaining = [i for i in remaining if i not in results]
        if remaining and not progressed:
            for i in remaining:
                results[i] = {"outcome": "not run", "duration": 0.0,
                              "message": f"pytest exited ({proc.returncode}) without running it; see {log.name}"}
            break
    return results


def short(nodeid: str) -> str:
    return nodeid.split("/")[-1]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 usage="%(prog)s [--build DIR] [-k EXPR] [--timeout SECONDS] [--out DIR] DEEPSPEED_DIR")
    ap.add_argument("deepspeed_dir", metavar="DEEPSPEED_DIR",
                    help="a DeepSpeed checkout, or a folder with tests/unit/...")
    ap.add_argument("--build", metavar="DIR", default=os.environ.get("DST_GPU_BUILD_DIR", "/tmp/dst-gpu-build"),
                    help="build folder with libdstransformer.so (default: $DST_GPU_BUILD_DIR or /tmp/dst-gpu-build)")
    ap.add_argument("-k", dest="keyword", metavar="EXPR", help="pytest -k expression selecting cases")
    ap.add_argument("--timeout", metavar="SECONDS", type=float, default=300.0, help="seconds one case may take (default 300)")
    ap.add_argument("--out", metavar="DIR", help="folder for logs and results (default: a new temporary folder)")
    ap.add_argument("--python", metavar="PYTHON", default=sys.executable, help="interpreter with torch and pytest (default: this one)")
    a = ap.parse_args()
    if a.timeout <= 0:
        ap.error("--timeout must be positive")

    t0 = time.monotonic()
    try:
        tests_dir = find_tests_dir(a.deepspeed_dir)
        out = Path(a.out).resolve() if a.out else Path(tempfile.mkdtemp(prefix="dst-conformance-"))
        out.mkdir(parents=True, exist_ok=True)
        events = out / "events.jsonl"
        events.unlink(missing_ok=True)
        build = Path(a.build).expanduser().resolve()
        pkg = find_package(build, a.python, out / "build-python.log")
    except SetupError as e:
        print(f"deepspeed-conformance: error: {e}", file=sys.stderr)
        return 2

    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(SHIM), str(pkg), str(tests_dir)]
                                        + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    env["LD_LIBRARY_PATH"] = os.pathsep.join([str(build)]
                                             + ([env["LD_LIBRARY_PATH"]] if env.get("LD_LIBRARY_PATH") else []))
    env["PYTHONDONTWRITEBYTECODE"] = "1"  # leave the DeepSpeed tree as it was
    env["PYTHONUNBUFFERED"] = "1"
    env["DST_CONFORMANCE_EVENTS"] = str(events)
    # DeepSpeed's harness has its own per-test limit, which ends the whole pytest run: keep it above ours.
    env["DS_UNITTEST_TIMEOUT"] = str(int(a.timeout) + 120)

    probe = ("import json, torch, dstransformer, deepspeed\n"
             "from deepspeed.accelerator import get_accelerator\n"
             "print(json.dumps({'deepspeed': deepspeed.__file__, 'dstransformer': dstransformer.__file__,"
             " 'version': dstransformer.version(), 'torch': torch.__version__,"
             " 'gpu': torch.cuda.get_device_name() if torch.cuda.is_available() else None,"
             " 'accelerator': get_accelerator().device_name(), 'compatible': deepspeed.ops.__compatible_ops__}))")
    p = subprocess.run([a.python, "-c", probe], cwd=tests_dir, env=env, capture_output=True, text=True)
    if p.returncode != 0:
        print(f"deepspeed-conformance: error: the shim or the library does not import:\n{p.stderr.strip()}",
              file=sys.stderr)
        return 2
    info = json.loads(p.stdout.strip().splitlines()[-1])
    if not Path(info["deepspeed"]).resolve().is_relative_to(SHIM):
        print(f"deepspeed-conformance: error: `import deepspeed` found {info['deepspeed']}, not the shim in {SHIM}",
              file=sys.stderr)
        return 2
    print(f"deepspeed-conformance: DeepSpeed tests {tests_dir}")
    print(f"  libdstransformer {info['version']} ({info['dstransformer']}), torch {info['torch']}, "
          f"GPU {info['gpu'] or 'none'}")
    print(f"  accelerator {info['accelerator']}, compatible ops {info['compatible']}, per-case limit {a.timeout:g} s")
    if not (tests_dir / "conftest.py").is_file():
        print("  note: no conftest.py in the tests folder: DeepSpeed's process harness is off, cases run in pytest's "
              "own process")

    collect = pytest_cmd(a.python, tests_dir, ["--collect-only", "-q", *TEST_FILES]
                         + (["-k", a.keyword] if a.keyword else []))
    try:
        with open(out / "collect.log", "w") as f:
            rc = subprocess.call(collect, cwd=tests_dir, env=env, stdout=f, stderr=subprocess.STDOUT,
                                 timeout=a.timeout)
    except subprocess.TimeoutExpired:
        rc = -1
    recs, _ = read_events(events, 0)
    ids = next((r["ids"] for r in recs if r["event"] == "collected"), None)
    if ids is None or rc not in (0, 5):
        print(f"deepspeed-conformance: error: collection failed (pytest exit {rc}); see {out / 'collect.log'}",
              file=sys.stderr)
        return 2
    print(f"  {len(ids)} cases{' matching -k ' + repr(a.keyword) if a.keyword else ''}; logs in {out}")

    results = run_cases(ids, a.python, tests_dir, env, out, events, a.timeout) if ids else {}

    width = max([len(short(i)) for i in ids] + [4])
    lines = [f"{'case':<{width}}  {'outcome':<8}  {'seconds':>8}", f"{'-' * width}  {'-' * 8}  {'-' * 8}"]
    for i in ids:
        r = results.get(i, {"outcome": "not run", "duration": 0.0, "message": ""})
        lines.append(f"{short(i):<{width}}  {r['outcome']:<8}  {r['duration']:8.1f}")
    counts = {}
    for i in ids:
        o = results.get(i, {"outcome": "not run"})["outcome"]
        counts[o] = counts.get(o, 0) + 1
    bad = sum(counts.get(o, 0) for o in FAILING)
    problems = [f"  {r['outcome']}: {short(i)}\n      {r['message']}" for i in ids
                if (r := results.get(i, {"outcome": "not run", "message": ""}))["outcome"] in FAILING
                or (r["outcome"] == "skipped" and r["message"])]
    detail = ", ".join(f"{counts[o]} {o}" for o in ("timeout", "crashed", "error", "not run") if counts.get(o))
    summary = (f"{counts.get('passed', 0)} passed, {bad} failed, {counts.get('skipped', 0)} skipped"
               + (f" ({detail})" if detail else "") + f" in {time.monotonic() - t0:.0f} s")
    text = "\n".join(lines + ([""] + ["failures and skips:"] + problems if problems else []) + ["", summary])
    print(text)
    (out / "summary.txt").write_text(text + "\n")
    (out / "results.json").write_text(json.dumps({"info": info, "cases": {i: results.get(i) for i in ids}}, indent=1))
    if not ids:
        print("deepspeed-conformance: no case selected", file=sys.stderr)
    return 0 if bad == 0 and counts.get("passed", 0) > 0 else 1


if __name__ == "__main__":
    sys.exit(main())
