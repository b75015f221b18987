#!/usr/bin/env bash
# GPU check, run on the GPU machine from the repository root:
#   bash tools/gpu-check.sh [quick|full|bench] [OUTDIR]
#   quick: configure + build (Release, sm_90, bindings and examples off), then the CUDA op tests
#          (ctest -L cuda).
#   full:  quick, then compute-sanitizer memcheck and racecheck over short filtered subsets of the
#          op tests, and memcheck over the model ops' bad-index tests.
#   bench: quick, then the benchmark (not part of this version: reported as skipped).
# Logs go to OUTDIR (default ./gpu-check-out): configure.log, build.log, ctest.log, sanitizer.log,
# sanitizer_model_ops.log, racecheck.log, summary.txt. The summary is printed last. Exit status: 0
# when every step run passed.
# Environment: DST_GPU_BUILD_DIR (default /tmp/dst-gpu-build), DST_GPU_JOBS (16), DST_GPU_TARGETS
# (ninja targets, default: all; e.g. test_cuda_ops to build only what the cuda label needs).
set -u -o pipefail

mode=${1:-quick}
out=${2:-gpu-check-out}
case "$mode" in quick|full|bench) ;; *) echo "usage: $0 [quick|full|bench] [OUTDIR]" >&2; exit 2 ;; esac
mkdir -p "$out"
out=$(cd "$out" && pwd)
src=$(cd "$(dirname "$0")/.." && pwd)
build=${DST_GPU_BUILD_DIR:-/tmp/dst-gpu-build}
jobs=${DST_GPU_JOBS:-16}
summary=()
status=0

step() {  # step NAME LOG CMD... : runs CMD with output to LOG, records PASS/FAIL and seconds
    local name=$1 log=$2; shift 2
    local t0=$SECONDS rc
    "$@" >"$log" 2>&1
    rc=$?
    local dt=$((SECONDS - t0))
    if [ $rc -eq 0 ]; then summary+=("$(printf '%-12s PASS  %4ds' "$name" "$dt")")
    else summary+=("$(printf '%-12s FAIL  %4ds  (rc %d, see %s)' "$name" "$dt" "$rc" "$(basename "$log")")"); status=1; fi
    return $rc
}

finish() {
    {
        echo "== gpu-check $mode: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
        nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null || echo "(nvidia-smi unavailable)"
        printf '%s\n' "${summary[@]}"
        if [ -f "$out/ctest.log" ]; then grep -E "tests passed|tests failed|Total Test time" "$out/ctest.log"; fi
        if [ -f "$out/ctest.log" ]; then grep -E "^\s+[0-9]+ - .*\((Failed|SEGFAULT|Timeout|Subprocess|Not Run)" "$out/ctest.log" | head -40; fi
        if [ -f "$out/sanitizer.log" ]; then
            grep -E "^\[  (PASSED|FAILED)  \]|ERROR SUMMARY" "$out/sanitizer.log" | tail -4
        fi
        if [ -f "$out/sanitizer_model_ops.log" ]; then
            grep -E "^\[  (PASSED|FAILED)  \]|ERROR SUMMARY" "$out/sanitizer_model_ops.log" | tail -4
        fi
        if [ -f "$out/racecheck.log" ]; then
            grep -E "^\[  (PASSED|FAILED)  \]|RACECHECK SUMMARY|ERROR SUMMARY" "$out/racecheck.log" | tail -4
        fi
    } | tee "$out/summary.txt"
    exit $status
}


step configure "$out/configure.log" cmake -S "$src" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_CUDA_ARCHITECTURES=90 -DDST_BUILD_EXAMPLES=OFF -DDST_BUILD_PRETRAIN=OFF -DPython_EXECUTABLE="$(command -v python3)" \
    || finish
# shellcheck disable=SC2086  # DST_GPU_TARGETS is a list of target names
step build "$out/build.log" ninja -C "$build" -j"$jobs" ${DST_GPU_TARGETS:-all} || finish
# The whole-layer cases spend most of their time in the CPU reference: more processes, fewer threads each.
step ctest-cuda "$out/ctest.log" env OMP_NUM_THREADS=2 OPENBLAS_NUM_THREADS=2 ctest --test-dir "$build" -L cuda --output-on-failure \
    -j"$(( $(nproc) / 2 > 4 ? $(nproc) / 2 : 4 ))" --timeout 180

if [ "$mode" = full ]; then
    sanitizer=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
    bin=$(find "$build" -name test_cuda_ops -type f -perm -u+x | head -1)
    if [ -x "$sanitizer" ] && [ -n "$bin" ]; then
        # Small shapes of every op family, fp32 and fp16: enough to cover every kernel's indexing.
        filter='Ops/CudaOps.*/*fp32_n7_*:Ops/CudaOps.*/*fp16_n7_*:Ops/CudaOps.*/*_count7*:Ops/CudaOps.*/attention_*_fp32_b2_s7_*:Ops/CudaOps.*/attention_*_fp16_b3_s65_*:Ops/CudaOps.*/attention_*_fp32_b3_s100_*:Ops/CudaOps.*/layernorm_*_n37_h256*:Ops/CudaOps.*/layernorm_*_n5_h2048*:Ops/CudaOps.*/*misaligned*:Ops/CudaOps.*/attention_fwd_fp16_b1_s1088_*:CudaBackend.*'
        # API errors are not reported: the suite provokes some on purpose (out-of-memory test).
        step memcheck "$out/sanitizer.log" "$sanitizer" --tool memcheck --report-api-errors no \
            --error-exitcode 1 "$bin" --gtest_filter="$filter"
        # The model ops with bad indices under deferred checks: their kernels must skip what is out of range.
        mbin=$(find "$build" -name test_cuda_model_ops -type f -perm -u+x | head -1)
        [ -n "$mbin" ] && step memcheck-idx "$out/sanitizer_model_ops.log" "$sanitizer" --tool memcheck \
            --report-api-errors no --error-exitcode 1 "$mbin" --gtest_filter='CudaModelOpsErrors.*'
        # Shared-memory races in the tiled kernels (attention, reductions; s1088: the sm_90 forward's
        # TMA and mbarrier pipeline).
        step racecheck "$out/racecheck.log" "$sanitizer" --tool racecheck --report-api-errors no \
            --error-exitcode 1 "$bin" \
            --gtest_filter='Ops/CudaOps.*/attention_*_fp32_b3_s100_*:Ops/CudaOps.*/attention_*_fp16_b3_s65_*:Ops/CudaOps.*/attention_*_bf16_b2_s7_*:Ops/CudaOps.*/attention_*_fp64_b2_s7_*:Ops/CudaOps.*/layernorm_*_fp32_n7_*:Ops/CudaOps.*/linear_bwd_weight_fp32_n129_*:Ops/CudaOps.*/attention_fwd_bf16_b1_s1088_*'
    else
        summary+=("sanitizer    SKIP  (compute-sanitizer or test_cuda_ops not found)")
    fi
fi
if [ "$mode" = bench ]; then
    summary+=("bench        SKIP  (no benchmark in this version)")
fi
finish
