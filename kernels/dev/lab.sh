#!/usr/bin/env bash
# Builds and runs the attention kernel lab on the GPU machine, from the repository root:
#   bash kernels/dev/lab.sh OUTDIR [lab arguments: check, time, fp16, bf16]
# Compiles the flash kernel files and the lab in parallel with nvcc (sm_90), then runs the lab;
# the log goes to OUTDIR/lab.log.
set -u -o pipefail
out=${1:-lab-out}
shift || true
mkdir -p "$out"
obj=/tmp/dst-lab
mkdir -p "$obj"
flags=(-O3 -std=c++17 -gencode arch=compute_90,code=sm_90 -I. -Xcompiler -fopenmp -Xptxas -v)
t0=$SECONDS
pids=()
for f in kernels/attention_flash.cu kernels/attention_flash_fwd.cu kernels/attention_flash_dkdv.cu \
         kernels/attention_flash_dq.cu kernels/dev/attention_lab.cu; do
    nvcc "${flags[@]}" -c "$f" -o "$obj/$(basename "$f").o" >"$obj/$(basename "$f").log" 2>&1 &
    pids+=($!)
done
rc=0
for p in "${pids[@]}"; do wait "$p" || rc=1; done
cat "$obj"/*.log >"$out/lab-build.log"
if [ $rc -ne 0 ]; then echo "lab build failed"; tail -40 "$out/lab-build.log"; exit 1; fi
nvcc -Xcompiler -fopenmp "$obj"/*.cu.o -lcublas -o "$obj/attention_lab" || exit 1
echo "lab built in $((SECONDS - t0)) s"
OMP_NUM_THREADS=$(nproc) "$obj/attention_lab" "$@" 2>&1 | tee "$out/lab.log"
