#!/usr/bin/env bash
# Python binding on the GPU machine, from the repository root (the tree must carry .swig-out/):
#
#   bash tools/run-python-gpu.sh [OUTDIR]
#
# 1. configures and builds libdstransformer with CUDA (Release, sm_90, bindings off: no SWIG there) into
#    DST_GPU_BUILD_DIR (default /tmp/dst-gpu-build, shared with tools/gpu-check.sh, same options);
# 2. compiles the carried SWIG wrapper against the Python there (tools/build-python-gpu.sh);
# 3. runs the whole pytest suite of bindings/python/tests: the CPU tests, and the torch tests on CUDA
#    (TransformerLayer vs plain PyTorch in fp32/fp16/bf16, the 4-layer AdamW run) and on the CPU, and
#    tests/gpu_python/test_engine_gpu.py (dstransformer.initialize on CUDA: fp32, fp16, bf16);
# 4. bench/torch_module.py: the PyTorch module's training step, with and without keeping the saved
#    activations between steps (skipped with DST_TORCH_BENCH=0).
# Logs go to OUTDIR (default ./python-gpu-out): configure.log, build.log, wrapper.log, pytest.log,
# pytest.xml, torch_module.txt, torch_module.json, summary.txt (8 files). The summary is printed last. Exit status 0 when every step passed.
# Environment: DST_GPU_BUILD_DIR, DST_GPU_JOBS (16), PYTHON (python3), PYTEST_ARGS (extra pytest args),
# DST_GPU_CMAKE_ARGS (extra configure args, e.g. -DDST_ENABLE_CUDA=OFF to try the script without a GPU).
set -euo pipefail

out=${1:-python-gpu-out}
mkdir -p "$out"
out=$(cd "$out" && pwd)
src=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${DST_GPU_BUILD_DIR:-/tmp/dst-gpu-build}
jobs=${DST_GPU_JOBS:-16}
py=${PYTHON:-python3}
pkg_dir=$build/python-gpu
summary=()
status=0

step() {  # step NAME LOG CMD...: runs CMD with output to LOG, records PASS/FAIL and seconds
    local name=$1 log=$2; shift 2
    local t0=$SECONDS rc=0
    echo "==> $name (log: $log)"
    "$@" >"$log" 2>&1 || rc=$?
    local dt=$((SECONDS - t0))
    if [ $rc -eq 0 ]; then
        summary+=("$(printf '%-10s PASS  %4ds' "$name" "$dt")")
    else
        summary+=("$(printf '%-10s FAIL  %4ds  (rc %d, see %s)' "$name" "$dt" "$rc" "$(basename "$log")")")
        status=1
        tail -n 25 "$log" | sed 's/^/    /'
    fi
    return $rc
}

finish() {
    {
        echo "== run-python-gpu: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
        nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null ||
            echo "(nvidia-smi unavailable)"
        "$py" -c 'import sys, numpy; print("python", sys.version.split()[0], "| numpy", numpy.__version__)' 2>/dev/null || true
        "$py" -c 'import torch; print("torch", torch.__version__, "| cuda", torch.version.cuda, "| available", torch.cuda.is_available())' 2>/dev/null ||
            echo "(torch not importable)"
        printf '%s\n' "${summary[@]}"
        if [ -f "$out/pytest.log" ]; then
            grep -E "^(FAILED|ERROR) " "$out/pytest.log" | head -40 || true
            grep -E "^SKIPPED" "$out/pytest.log" | head -20 || true
            tail -n 1 "$out/pytest.log"
        fi
    } | tee "$out/summary.txt"
    exit $status
}
trap 'summary+=("aborted by an unexpected error (line $LINENO)"); status=1; finish' ERR

cd "$src"
# shellcheck disable=SC2086  # DST_GPU_CMAKE_ARGS is a list of arguments
step configure "$out/configure.log" cmake -S "$src" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_CUDA_ARCHITECTURES=90 -DDST_BUILD_EXAMPLES=OFF -DDST_BUILD_PRETRAIN=OFF -DPython_EXECUTABLE="$(command -v "$py")" \
    ${DST_GPU_CMAKE_ARGS:-} || finish
step build "$out/build.log" ninja -C "$build" -j"$jobs" dstransformer || finish
step wrapper "$out/wrapper.log" env PYTHON="$py" bash "$src/tools/build-python-gpu.sh" "$build" "$pkg_dir" || finish
tail -n 2 "$out/wrapper.log"
# shellcheck disable=SC2086  # PYTEST_ARGS is a list of arguments
step pytest "$out/pytest.log" env PYTHONPATH="$pkg_dir" PYTHONDONTWRITEBYTECODE=1 \
    "$py" -m pytest -q -p no:cacheprovider -rs --durations=10 --junitxml="$out/pytest.xml" \
    ${PYTEST_ARGS:-} "$src/bindings/python/tests" "$src/tests/gpu_python/test_engine_gpu.py" || true
if [ "${DST_TORCH_BENCH:-1}" != 0 ]; then
    step bench "$out/torch_module.txt" env PYTHONPATH="$pkg_dir" PYTHONDONTWRITEBYTECODE=1 \
        "$py" "$src/bench/torch_module.py" --out "$out" || true
    cat "$out/torch_module.txt"
fi
trap - ERR
finish
