#!/usr/bin/env bash
# The two commands of libdstransformer, for a fresh Debian 12 machine:
#   ./run.sh demo   install what is missing, build (Release), run the main job: dst-pretrain pre-trains a
#                   small BERT on the embedded corpus (CUDA when a GPU is usable, else the CPU)
#   ./run.sh test   install what is missing, build, run every ctest entry, then rebuild the CPU
#                   backend with AddressSanitizer + UndefinedBehaviorSanitizer and run the cpu tests,
#                   with ThreadSanitizer and run the threaded tests, and fuzz the checkpoint reader
# .ci/run calls `./run.sh test`. docs/building.md describes the options.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")"
ROOT=$(pwd)

JOBS=$(nproc)
PACKAGES=(build-essential cmake ninja-build pkgconf ccache libopenblas-dev nlohmann-json3-dev
          libgtest-dev libgmock-dev python3-numpy python3-pytest python3-dev python3-venv python3-pip
          python3-setuptools python3-wheel python3-torch doxygen libhdf5-dev libutf8proc-dev libjansson-dev
          swig default-jdk-headless junit5 bindgen clang libclang-rt-14-dev libomp-14-dev)
# The Rust tests need cargo: the machine's own (rustup) when present, else Debian's.
command -v cargo >/dev/null 2>&1 || PACKAGES+=(cargo)
# python3 on PATH may be another interpreter (pyenv) without numpy: the Debian one has the packages.
PYTHON=/usr/bin/python3

SUMMARY=()
say() { printf '\n==> %s\n' "$*"; }
record() { SUMMARY+=("$(printf '%-34s %s' "$1" "$2")"); }
print_summary() {
    printf '\n==> summary\n'
    local line
    for line in "${SUMMARY[@]}"; do printf '  %s\n' "$line"; done
}
elapsed() { echo "$((SECONDS - $1))s"; }

usage() {
    echo "usage: $0 demo|test" >&2
    exit 2
}

ensure_packages() {
    local missing=() p
    for p in "${PACKAGES[@]}"; do
        if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
            missing+=("$p")
        fi
    done
    if [ ${#missing[@]} -eq 0 ]; then
        record "dependencies" "ok (all ${#PACKAGES[@]} Debian packages present)"
        return
    fi
    say "installing missing Debian packages: ${missing[*]}"
    local sudo=()
    if [ "$(id -u)" -ne 0 ]; then
        if command -v sudo >/dev/null 2>&1; then
            sudo=(sudo)
        else
            echo "error: not root and no sudo; please install: ${missing[*]}" >&2
            exit 1
        fi
    fi
    local t=$SECONDS
    "${sudo[@]}" apt-get update
    "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive \
        apt-get install -y --no-install-recommends "${PACKAGES[@]}"
    record "dependencies" "installed ${missing[*]} ($(elapsed $t))"
}

# CUDA: the top-level CMakeLists.txt builds the CUDA backend whenever it finds nvcc. Help it find
# the toolkit's default prefix when nvcc is not on PATH.
cuda_args() {
    if ! command -v nvcc >/dev/null 2>&1 && [ -z "${CUDACXX:-}" ] && [ -x /usr/local/cuda/bin/nvcc ]; then
        echo "-DCMAKE_CUDA_COMPILER=/usr/local/cuda/bin/nvcc"
    fi
}

# CUTLASS's headers for the fused GELU GEMMs (sm_90a), from its pinned PyPI wheel (tools/cutlass.sh):
# only when CUDA is built. Without network the library builds without those kernels.
ensure_cutlass() {
    command -v nvcc >/dev/null 2>&1 || [ -n "${CUDACXX:-}" ] || [ -x /usr/local/cuda/bin/nvcc ] || return 0
    local t=$SECONDS
    if PYTHON="$PYTHON" bash tools/cutlass.sh; then
        record "cutlass headers" "ok ($(elapsed $t))"
    else
        record "cutlass headers" "unavailable: fused GELU GEMMs not built ($(elapsed $t))"
    fi
}

build_main() {
    ensure_cutlass
    say "configure + build: build/ (Release)"
    local t=$SECONDS
    # shellcheck disable=SC2046  # cuda_args prints zero or one word
    cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DPython_EXECUTABLE="$PYTHON" \
        -DDST_BUILD_DOCS=ON -DDST_BUILD_PYTHON=ON -DDST_BUILD_JAVA=ON \
        -DDST_BUILD_RUST=ON $(cuda_args)
    cmake --build build -j"$JOBS"
    local cuda
    cuda=$(sed -n 's/^DST_ENABLE_CUDA:BOOL=//p' build/CMakeCache.txt)
    record "build (Release, CUDA=${cuda:-?})" "ok ($(elapsed $t))"
}

# The main job: dst-pretrain pre-trains a small BERT on the embedded corpus (KJV, 4000-token vocabulary;
# tools/dst-pretrain/data), on CUDA when a GPU is usable, else on the CPU (about two minutes on two cores).
run_demo() {
    local out=build/pretrain-demo prog=./build/tools/dst-pretrain/dst-pretrain
    say "demo: $prog train --output $out"
    local t=$SECONDS rc=0
    rm -rf "$out"
    mkdir -p "$out"
    # OpenMP's idle workers spin by default; on a machine with few cores they take the cycles of
    # dst-pretrain's loader thread and of OpenBLAS (docs/pretrain.md). A value set by the caller wins.
    OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive} "$prog" train --output "$out" 2>&1 | tee "$out/log.txt" || rc=$?
    local done_line
    done_line=$(sed -n 's/^done: .*; \(mlm loss .*(step [0-9]*)\).*/\1/p' "$out/log.txt" | head -n 1)
    if [ "$rc" -eq 0 ]; then
        record "demo (dst-pretrain)" "ok ($(elapsed $t)): ${done_line:-see $out/log.txt}"
        record "demo outputs" "$out/metrics.jsonl, $out/metrics.svg, $out/checkpoints/, $out/hf/"
    else
        record "demo (dst-pretrain)" "FAILED (exit $rc, $(elapsed $t))"
    fi
    return "$rc"
}

# Runs ctest with the given arguments and records "<phase>: <ctest's summary line> (time)".
# Returns ctest's exit status.
run_ctest() {
    local phase=$1
    shift
    local t=$SECONDS log rc line
    log=$(mktemp)
    set +e
    ctest "$@" --output-on-failure -j"$JOBS" 2>&1 | tee "$log"
    rc=${PIPESTATUS[0]}
    set -e
    line=$(grep -E 'tests passed|No tests were found' "$log" | tail -n 1 || true)
    rm -f "$log"
    # A selection that matches nothing checks nothing: a failure, not a pass.
    case "$line" in *"No tests were found"*) rc=1 ;; esac
    if [ "$rc" -eq 0 ]; then
        record "$phase" "ok: ${line:-no summary} ($(elapsed $t))"
    else
        record "$phase" "FAILED: ${line:-ctest exited $rc} ($(elapsed $t))"
    fi
    return "$rc"
}

# Runs one build step (a function or command) and records "<phase>: ok|FAILED (time)"; returns its
# status. run_tests runs in a condition (`run_tests || status=$?`), where `set -e` does not stop at
# a failed command, so every build there goes through this.
run_build() {
    local phase=$1
    shift
    local t=$SECONDS rc=0
    "$@" || rc=$?
    if [ "$rc" -eq 0 ]; then record "$phase" "ok ($(elapsed $t))"
    else record "$phase" "FAILED (exit $rc, $(elapsed $t))"; fi
    return "$rc"
}

build_asan() {
    cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
        -DPython_EXECUTABLE="$PYTHON" -DDST_ENABLE_CUDA=OFF -DDST_BUILD_DOCS=OFF \
        -DDST_SANITIZE=address,undefined &&
        cmake --build build-asan -j"$JOBS"
}

build_tsan() {
    cmake -S . -B build-tsan -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_C_COMPILER=clang \
        -DCMAKE_CXX_COMPILER=clang++ -DPython_EXECUTABLE="$PYTHON" -DDST_ENABLE_CUDA=OFF \
        -DDST_SANITIZE=thread -DDST_BUILD_DOCS=OFF -DDST_BUILD_EXAMPLES=OFF -DDST_BUILD_BENCH=OFF &&
        cmake --build build-tsan -j"$JOBS" --target test_threads test_hostile test_pretrain_data
}

build_fuzz() {
    cmake -S . -B build-fuzz -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_C_COMPILER=clang \
        -DCMAKE_CXX_COMPILER=clang++ -DPython_EXECUTABLE="$PYTHON" -DDST_ENABLE_CUDA=OFF \
        -DDST_BUILD_FUZZ=ON -DDST_BUILD_EXAMPLES=OFF -DDST_BUILD_BENCH=OFF &&
        cmake --build build-fuzz -j"$JOBS" --target fuzz_safetensors
}

run_tests() {
    local failed=0
    say "ctest: build/ (all labels)"
    run_ctest "ctest build/ (all labels)" --test-dir build || failed=1

    say "configure + build: build-asan/ (CPU only, address,undefined)"
    run_build "build-asan (RelWithDebInfo)" build_asan || failed=1

    say "ctest: build-asan/ (label cpu, ASan + UBSan)"
    local lsan=""
    # OpenBLAS's and libgomp's thread pools live until exit; tools/lsan.supp (when present) names
    # those allocations only, never the library's own code.
    [ -f tools/lsan.supp ] && lsan="suppressions=$ROOT/tools/lsan.supp:print_suppressions=0"
    ASAN_OPTIONS=detect_leaks=1 LSAN_OPTIONS="$lsan" \
    UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
        run_ctest "ctest build-asan/ (label cpu)" --test-dir build-asan -L cpu || failed=1

    # The threading contract under ThreadSanitizer: clang, with LLVM's OpenMP runtime and its archer
    # tool, which tells TSan about OpenMP's synchronisation. Only the library's CPU parts and three
    # test binaries are built; the tests are the threaded ones (Threads.*, dst-pretrain's loader thread
    # PretrainLoader.* and PretrainShards.*) and the quick Hostile.*.
    say "configure + build: build-tsan/ (clang, CPU only, thread)"
    run_build "build-tsan (clang, thread)" build_tsan || failed=1
    say "ctest: build-tsan/ (Threads.*, Hostile.*, PretrainLoader.*, PretrainShards.*, ThreadSanitizer)"
    # ignore_noninstrumented_modules: accesses inside the uninstrumented OpenMP and BLAS libraries are
    # not reported (archer's advice); the library's own code is instrumented and fully checked.
    local archer
    archer=$(clang -print-resource-dir)/../../libarcher.so
    [ -f "$archer" ] || archer=/usr/lib/llvm-14/lib/libarcher.so
    TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1:ignore_noninstrumented_modules=1" \
    OMP_TOOL_LIBRARIES="$archer" \
        run_ctest "ctest build-tsan/ (threads)" --test-dir build-tsan -R '^(Threads|Hostile|PretrainLoader|PretrainShards)\.' || failed=1

    # The checkpoint parser under libFuzzer (clang, ASan + UBSan) for a bounded time.
    say "configure + build: build-fuzz/ (clang, libFuzzer)"
    run_build "build-fuzz (clang)" build_fuzz || failed=1
    run_ctest "ctest build-fuzz/ (label fuzz)" --test-dir build-fuzz -L fuzz || failed=1
    return "$failed"
}

# A failure that stops the script early (configure or build) still prints what ran so far.
# shellcheck disable=SC2317  # called through the EXIT trap
on_exit() {
    local rc=$?
    if [ "$rc" -ne 0 ] && [ -z "${SUMMARY_PRINTED:-}" ]; then
        record "stopped" "exit $rc after $(elapsed "$START")"
        print_summary
    fi
}

[ $# -eq 1 ] || usage
START=$SECONDS
trap on_exit EXIT
status=0
case "$1" in
    demo)
        ensure_packages
        build_main
        run_demo || status=$?
        ;;
    test)
        ensure_packages
        build_main
        run_tests || status=$?
        ;;
    *) usage ;;
esac
record "total" "$(elapsed "$START")"
print_summary
SUMMARY_PRINTED=1
[ "$status" -eq 0 ] || echo "run.sh $1: FAILED" >&2
exit "$status"
