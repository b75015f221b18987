#!/usr/bin/env bash
# Everything the GPU machine checks, in few calls (device time is short). From the repository root:
#
#   bash tools/gpu-session.sh tests OUTDIR   # build, ctest -L cuda, compute-sanitizer subsets
#                                            # (tools/gpu-check.sh full), the Python binding and the
#                                            # PyTorch layer (tools/run-python-gpu.sh), the demo, and
#                                            # the Hugging Face interop test on the CUDA backend
#   bash tools/gpu-session.sh bench OUTDIR   # bench/bench_layer and bench/compare_torch.py (fp16 and
#                                            # bf16, 64x128 to 1x16384, within the time that is left)
#                                            # (DST_COMPARE_ARGS: more options for it, e.g.
#                                            # "--shapes 64x128,16x512" to leave time for the padded,
#                                            # CUDA-graph and sweep parts)
#   bash tools/gpu-session.sh pretrain OUTDIR [CASES]
#                                            # dst-pretrain (DST_BUILD_PRETRAIN=ON against .gpu-deps/,
#                                            # which tools/gpu-deps.sh makes on the development machine:
#                                            # carry it), its cuda-labelled ctest entries, then
#                                            # bench/pretrain_vs_hf.py for CASES (default
#                                            # fp16:128,fp16:512; bf16:128,bf16:512 in a second call,
#                                            # with DST_PRETRAIN_CTEST=0 to skip the tests there;
#                                            # DST_PRETRAIN_ARGS: more arguments for it, such as
#                                            # "--skip-hf --profile-calls")
#   bash tools/gpu-session.sh gemm-gelu OUTDIR
#                                            # the fused GELU GEMMs (CUTLASS: run tools/cutlass.sh on the
#                                            # development machine and carry .deps): kernels/dev/gemm_gelu_lab
#                                            # (checks and times), their op and layer tests in
#                                            # test_cuda_ops, then the CudaLayer tests of the 16-bit
#                                            # types with DST_FUSED_GEMM=0 (the layer grid through the
#                                            # separate GEMM and GELU kernels; the default runs fused)
#   bash tools/gpu-session.sh layernorm-lab OUTDIR
#                                            # kernels/dev/layernorm_lab (the LayerNorm backward's passes
#                                            # against one-pass forms: checks and times), the same under
#                                            # compute-sanitizer memcheck at 1031 rows, the LayerNorm op
#                                            # tests (one-pass cases included) and the linear_fwd_add
#                                            # ones, then the CudaLayer tests
#                                            # with the forms other than the default's 4 warps per row
#                                            # (DST_LN_ONE_PASS=0: the separate passes, then 2)
#   bash tools/gpu-session.sh profile OUTDIR # bench/profile_layer.py: the kernels of one fwd+bwd step
#                                            # and of one inference forward of the 4-layer stack, per
#                                            # kernel (DST_PROFILE_ARGS: its options, default
#                                            # "--shapes 64x128,16x512 --dtypes fp16")
#   bash tools/gpu-session.sh multi OUTDIR   # on a host with several GPUs (carry .gpu-deps): dst-pretrain
#                                            # and test_cuda_layer built, the two-device layer tests, then
#                                            # bench/multi_gpu.py (correctness against one GPU, scaling
#                                            # with and without overlap, a killed rank and the resume;
#                                            # DST_MULTI_ARGS: more arguments for it, e.g. "--parts scale")
#
# Both share the build folder DST_GPU_BUILD_DIR (default /tmp/dst-gpu-build); `bench` and `profile` build
# it when missing (`profile` with DST_LIB set to a library built elsewhere, e.g. on the development
# machine for sm_90 and carried, builds nothing: the device's build time saved); `pretrain` reconfigures it with dst-pretrain on (the library's objects stay). Each step has a
# time limit so that the whole call returns inside the device's 10-minute limit. OUTDIR receives a few
# files (the device returns at most 8): summary.txt and one log per step (pretrain: and pretrain_vs_hf.json).
set -u -o pipefail
mode=${1:-tests}
out=${2:-gpu-session-out}
mkdir -p "$out"
out=$(cd "$out" && pwd)
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
export DST_GPU_BUILD_DIR=${DST_GPU_BUILD_DIR:-/tmp/dst-gpu-build}
lib=$DST_GPU_BUILD_DIR/libdstransformer.so
tmp=/tmp/dst-gpu-session
mkdir -p "$tmp"
summary=()
cd "$root" || exit 1

step() {  # step NAME SECONDS LOG CMD...: runs CMD under a time limit, output to LOG
    local name=$1 limit=$2 log=$3; shift 3
    local t0=$SECONDS rc=0
    echo "==> $name (limit ${limit}s)"
    timeout --kill-after=20 "$limit" "$@" >"$log" 2>&1 || rc=$?
    summary+=("$(printf '%-14s %-6s %4ds%s' "$name" "$([ $rc -eq 0 ] && echo PASS || echo FAIL)" \
        $((SECONDS - t0)) "$([ $rc -eq 124 ] && echo '  (time limit)' || { [ $rc -ne 0 ] && echo "  (rc $rc)"; })")")
    tail -n 4 "$log"
    return 0
}

case "$mode" in
tests)
    step gpu-check 420 "$out/gpu-check.log" bash tools/gpu-check.sh full "$tmp/check"
    cp "$tmp/check/ctest.log" "$out/ctest.log" 2>/dev/null
    cat "$tmp/check/sanitizer.log" "$tmp/check/racecheck.log" >"$out/sanitizer.log" 2>/dev/null
    step python 120 "$out/python.log" bash tools/run-python-gpu.sh "$tmp/py"
    cp "$tmp/py/pytest.log" "$out/pytest.log" 2>/dev/null
    # The main demo on the GPU (AUTO picks CUDA), built against the library of step 1.
    step demo 20 "$out/demo.log" bash -c "cc -std=c99 -O2 examples/demo/dst_demo.c -Icapi/include \
        -L'$DST_GPU_BUILD_DIR' -ldstransformer -lm -o '$tmp/dst_demo' && \
        LD_LIBRARY_PATH='$DST_GPU_BUILD_DIR' '$tmp/dst_demo'"
    step hf-interop 45 "$out/hf_interop.log" env DST_LIB="$lib" DST_BACKEND=cuda PYTHONUNBUFFERED=1 \
        python3 -m pytest -p no:cacheprovider -q -s -rs tests/gpu_python/test_hf_interop.py
    ;;
bench)
    if [ ! -f "$lib" ] || [ ! -x "$DST_GPU_BUILD_DIR/bench/bench_layer" ]; then
        step build 200 "$out/build.log" bash -c "cmake -S . -B '$DST_GPU_BUILD_DIR' -G Ninja \
            -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 -DDST_BUILD_EXAMPLES=OFF -DDST_BUILD_PRETRAIN=OFF \
            -DDST_BUILD_TESTS=OFF -DPython_EXECUTABLE=\$(command -v python3) && \
            ninja -C '$DST_GPU_BUILD_DIR' -j16 dstransformer bench_layer"
    fi
    step bench_layer 90 "$out/bench_layer.txt" "$DST_GPU_BUILD_DIR/bench/bench_layer" --json "$out/bench_layer.json"
    # compare_torch gets what is left of the call (570 s of its 600, at most 420 s); its --budget makes it
    # start no row it cannot finish 40 s before that limit, which leaves time to print the table.
    limit=$((570 - SECONDS))
    [ "$limit" -gt 420 ] && limit=420
    [ "$limit" -lt 60 ] && limit=60
    # shellcheck disable=SC2086  # DST_COMPARE_ARGS is a list of options
    step compare_torch "$limit" "$out/compare_torch.txt" env DST_LIB="$lib" PYTHONUNBUFFERED=1 \
        python3 bench/compare_torch.py --budget $((limit - 40)) --out "$out" ${DST_COMPARE_ARGS:-}
    ;;
gemm-gelu)
    if [ ! -f "$root/.deps/cutlass/include/cutlass/util/packed_stride.hpp" ]; then
        echo "gpu-session: .deps/cutlass lacks CUTLASS's headers: run bash tools/cutlass.sh on the development" \
             "machine and carry .deps" >&2
        exit 2
    fi
    step build 320 "$out/build.log" bash -c "cmake -S . -B '$DST_GPU_BUILD_DIR' -G Ninja \
        -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 -DDST_BUILD_EXAMPLES=OFF -DDST_BUILD_PRETRAIN=OFF \
        -DDST_BUILD_KERNEL_LAB=ON -DPython_EXECUTABLE=\$(command -v python3) && \
        ninja -C '$DST_GPU_BUILD_DIR' -j16 gemm_gelu_lab test_cuda_ops test_cuda_layer"
    step gemm_gelu_lab 90 "$out/gemm_gelu_lab.txt" "$DST_GPU_BUILD_DIR/kernels/dev/gemm_gelu_lab"
    step fused-ops 150 "$out/fused_ops.log" "$DST_GPU_BUILD_DIR/tests/cuda/test_cuda_ops" \
        --gtest_filter='*fused*:*Fused*:*linear_bwd_data_gelu*:*linear_fwd*:*gelu*'
    limit=$((570 - SECONDS))
    [ "$limit" -lt 60 ] && limit=60
    step layer-unfused "$limit" "$out/layer_unfused.log" env DST_FUSED_GEMM=0 OMP_NUM_THREADS=2 OPENBLAS_NUM_THREADS=2 \
        ctest --test-dir "$DST_GPU_BUILD_DIR" -L cuda \
        -R 'CudaLayer\.MatchesCpuFp64/.*_(fp16|bf16)_|CudaLayer(Determinism|Graphs|Streams|Packed)\.' \
        --output-on-failure -j8 --timeout 180
    ;;
layernorm-lab)
    # The lab (one translation unit that includes the kernels' files) first, then the tests.
    step build-lab 120 "$out/build.log" bash -c "cmake -S . -B '$DST_GPU_BUILD_DIR' -G Ninja \
        -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 -DDST_BUILD_EXAMPLES=OFF -DDST_BUILD_PRETRAIN=OFF \
        -DDST_BUILD_KERNEL_LAB=ON -DPython_EXECUTABLE=\$(command -v python3) && \
        ninja -C '$DST_GPU_BUILD_DIR' -j16 layernorm_lab"
    step layernorm_lab 60 "$out/layernorm_lab.txt" "$DST_GPU_BUILD_DIR/kernels/dev/layernorm_lab"
    # memcheck on a row count that ends inside a chunk (every version's indexing)
    step memcheck 90 "$out/layernorm_lab_memcheck.txt" "$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)" \
        --tool memcheck --error-exitcode 1 "$DST_GPU_BUILD_DIR/kernels/dev/layernorm_lab" 1031 1024
    step build-tests 200 "$out/build_tests.log" ninja -C "$DST_GPU_BUILD_DIR" -j16 test_cuda_ops test_cuda_layer
    # (with the linear_fwd_add cases, written in the same session as the one-pass form)
    step ln-ops 90 "$out/ln_ops.log" "$DST_GPU_BUILD_DIR/tests/cuda/test_cuda_ops" \
        --gtest_filter='*layernorm*:*OnePass*:*BiasGradients*:*LayerNorm*:*linear_fwd_add*'
    for split in 0 2; do  # the default (4) runs in every other CudaLayer test
        limit=$((570 - SECONDS))
        [ "$limit" -lt 30 ] && break
        step "layer-split$split" "$limit" "$out/layer_split$split.log" env DST_LN_ONE_PASS=$split OMP_NUM_THREADS=2 \
            OPENBLAS_NUM_THREADS=2 ctest --test-dir "$DST_GPU_BUILD_DIR" -L cuda -R 'CudaLayer' --output-on-failure \
            -j8 --timeout 180
    done
    ;;
pretrain|multi)
    cases=${3:-fp16:128,fp16:512}
    deps=$root/.gpu-deps/usr
    if [ ! -f "$deps/include/jansson.h" ] || [ ! -f "$deps/include/utf8proc.h" ]; then
        echo "gpu-session: $deps lacks jansson.h/utf8proc.h: run bash tools/gpu-deps.sh on the development" \
             "machine and carry .gpu-deps" >&2
        exit 2
    fi
    multiarch=$(gcc -print-multiarch 2>/dev/null || echo x86_64-linux-gnu)
    export LD_LIBRARY_PATH=$deps/lib/$multiarch${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
    # The configuration of tools/gpu-check.sh (the library's objects are shared with it) with dst-pretrain on,
    # its libraries from the carried prefix; only dst-pretrain is built (its cuda tests run the program).
    step build 240 "$out/build.log" bash -c "cmake -S . -B '$DST_GPU_BUILD_DIR' -G Ninja \
        -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 -DDST_BUILD_EXAMPLES=OFF -DDST_BUILD_TESTS=ON -DDST_BUILD_PRETRAIN=ON \
        -DCMAKE_PREFIX_PATH='$deps' -DPython_EXECUTABLE=\$(command -v python3) \
        -DPython3_EXECUTABLE=\$(command -v python3) && ninja -C '$DST_GPU_BUILD_DIR' -j16 dst-pretrain \
        $([ "$mode" = multi ] && echo test_cuda_layer)"
    prog=$DST_GPU_BUILD_DIR/tools/dst-pretrain/dst-pretrain
    if [ ! -x "$prog" ]; then
        echo "gpu-session: the build did not produce $prog (see $out/build.log)" >&2
    elif [ "$mode" = multi ]; then
        export NCCL_NVLS_ENABLE=0  # NVLink multicast stays off (the machine's rule)
        step two-device 60 "$out/two_device.log" "$DST_GPU_BUILD_DIR/tests/cuda/test_cuda_layer" \
            --gtest_filter='*AnotherDevice*:*TwoDevice*'
        limit=$((570 - SECONDS))
        [ "$limit" -lt 60 ] && limit=60
        # shellcheck disable=SC2086  # DST_MULTI_ARGS is a list of options
        step multi_gpu "$limit" "$out/multi_gpu.txt" env PYTHONUNBUFFERED=1 python3 bench/multi_gpu.py \
            --prog "$prog" --out "$out" --work "$tmp/multi" --budget $((limit - 30)) ${DST_MULTI_ARGS:-}
    else
        if [ "${DST_PRETRAIN_CTEST:-1}" != 0 ]; then
            step pretrain-ctest 150 "$out/pretrain_ctest.log" ctest --test-dir "$DST_GPU_BUILD_DIR" -L cuda \
                -R '^pretrain_' --no-tests=error --output-on-failure --timeout 140
        fi
        # The benchmark gets what is left of the call (570 s of its 600); its --budget makes it start no
        # part it cannot finish 40 s before that limit, which leaves time to print the table.
        limit=$((570 - SECONDS))
        [ "$limit" -lt 60 ] && limit=60
        step pretrain_vs_hf "$limit" "$out/pretrain_vs_hf.txt" env PYTHONUNBUFFERED=1 python3 bench/pretrain_vs_hf.py \
            --prog "$prog" --cases "$cases" --budget $((limit - 40)) --out "$out" --work "$tmp/pretrain-work" \
            ${DST_PRETRAIN_ARGS:-}
    fi
    ;;
profile)
    plib=${DST_LIB:-$lib}
    if [ ! -f "$plib" ]; then
        step build 200 "$out/build.log" bash -c "cmake -S . -B '$DST_GPU_BUILD_DIR' -G Ninja \
            -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 -DDST_BUILD_EXAMPLES=OFF -DDST_BUILD_PRETRAIN=OFF \
            -DDST_BUILD_TESTS=OFF -DPython_EXECUTABLE=\$(command -v python3) && \
            ninja -C '$DST_GPU_BUILD_DIR' -j16 dstransformer"
    fi
    # shellcheck disable=SC2086  # DST_PROFILE_ARGS is a list of options
    step profile-train 150 "$out/profile_train.txt" env DST_LIB="$plib" PYTHONUNBUFFERED=1 \
        python3 bench/profile_layer.py ${DST_PROFILE_ARGS:---shapes 64x128,16x512 --dtypes fp16}
    # shellcheck disable=SC2086
    step profile-infer 120 "$out/profile_infer.txt" env DST_LIB="$plib" PYTHONUNBUFFERED=1 \
        python3 bench/profile_layer.py ${DST_PROFILE_ARGS:---shapes 64x128,16x512 --dtypes fp16} --inference
    ;;
*) echo "usage: $0 tests|bench|profile|gemm-gelu|layernorm-lab|pretrain|multi [OUTDIR] [CASES]" >&2; exit 2 ;;
esac
{
    echo "== gpu-session $mode: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
    nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null
    printf '%s\n' "${summary[@]}"
} | tee "$out/summary.txt"
