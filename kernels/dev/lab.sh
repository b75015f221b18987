#!/usr/bin/env bash
# Builds and runs the attention kernel lab on the GPU machine, from the repository root:
#   bash kernels/dev/lab.sh OUTDIR [lab arguments: check, time, fp16, bf16, profile]
# Compiles the flash kernel files (kernels/sm90 included, as the library on sm_90 has them: the lab's
# "prod" rows are the library's path) and the lab in parallel with nvcc (sm_90a), then runs the lab;
# the log goes to OUTDIR/lab.log (OUTDIR/lab-TAG.log with LAB_TAG).
# Environment:
#   LAB_ROOT=DIR  take the kernel sources and the lab from DIR/kernels instead of ./kernels (a copy
#                 of an earlier version, to time before and after in one call); LAB_TAG names it.
#   LAB_NORUN=1   build only (the binary is /tmp/dst-lab-TAG/attention_lab).
#   LAB_TIMEOUT=S stop the lab after S seconds (default 420); its output is line-buffered.
#   LAB_DEFS="…"  more compiler options, e.g. -DDST_LAB_DROP_BITS=16 (or 8): the timing control in
#                 which one Philox word serves 2 (or 4) dropout elements, as a mapping with 16-bit
#                 (8-bit) thresholds would; with a LAB_TAG of its own, and `time` only (its dropped
#                 sets are not the library's, so `check` fails on them by design).
#   LAB_ONLY=w1,w9,b8  time only these numbered versions (the checks still run all of them).
#   LAB_ALL_SHAPES=1, LAB_LENGTHS=1  read by the lab itself: the versions timed at every shape, and
#                 with key lengths too (kernels/dev/attention_lab.cu).
#   LAB_SASS=1    also write OUTDIR/sass-TAG.txt: per kernel, its SASS instruction count and the
#                 count of every opcode (static counts: what the compiler made of each version);
#                 kernels/dev/sass.sh gives the same on the development machine, without device time,
#                 and with SASS_BASE=REV which kernels a change left identical to REV's.
set -u -o pipefail
shopt -s nullglob  # an earlier tree (LAB_ROOT) may have no kernels/sm90
out=${1:-lab-out}
shift || true
mkdir -p "$out"
root=${LAB_ROOT:-.}
tag=${LAB_TAG:-$(basename "$(cd "$root" && pwd)")}
obj=/tmp/dst-lab-$tag
mkdir -p "$obj"
# shellcheck disable=SC2206  # LAB_DEFS is a list of compiler options
flags=(-O3 -std=c++17 -gencode arch=compute_90a,code=sm_90a -DDST_LAB_SM90A -DDST_WITH_SM90A -I"$root" -I. -I"$root/capi/include"
       -Icapi/include -Xcompiler -fopenmp -Xptxas -v ${LAB_DEFS:-})
t0=$SECONDS
pids=()
rm -f "$obj"/*.o
for f in "$root"/kernels/attention_flash*.cu "$root"/kernels/sm90/*.cu "$root"/kernels/dev/attention_lab.cu; do
    nvcc "${flags[@]}" -c "$f" -o "$obj/$(basename "$f").o" >"$obj/$(basename "$f").log" 2>&1 &
    pids+=($!)
done
rc=0
for p in "${pids[@]}"; do wait "$p" || rc=1; done
cat "$obj"/*.log >"$out/lab-build-$tag.log"
if [ $rc -ne 0 ]; then echo "lab build failed"; tail -40 "$out/lab-build-$tag.log"; exit 1; fi
nvcc -Xcompiler -fopenmp "$obj"/*.o -lcublas -o "$obj/attention_lab" || exit 1
echo "lab ($tag) built in $((SECONDS - t0)) s"
if [ "${LAB_SASS:-0}" = 1 ]; then
    for f in "$obj"/attention_flash_*.cu.o; do
        cuobjdump -sass "$f" | awk -v file="$f" '
            /Function :/ { if (name != "") report(); name = $3; n = 0; delete ops; next }
            /^ *\/\*[0-9a-f]+\*\// {
                line = $0; sub(/^ *\/\*[0-9a-f]+\*\/ */, "", line); sub(/^@!?U?P[0-9T] */, "", line);
                split(line, w, /[ .;]/); if (w[1] == "") next; ops[w[1]]++; n++ }
            function report(   k, s) {
                s = ""; for (k in ops) s = s sprintf(" %s:%d", k, ops[k])
                printf "%s %s total %d |%s\n", file, name, n, s }
            END { if (name != "") report() }'
    done >"$out/sass-$tag.txt" 2>&1
fi
[ "${LAB_NORUN:-0}" = 1 ] && exit 0
# Line-buffered, and stopped after LAB_TIMEOUT seconds (default 420): a kernel that hangs still
# leaves every line printed before it, inside the device's 10-minute call.
OMP_NUM_THREADS=$(nproc) timeout "${LAB_TIMEOUT:-420}" stdbuf -oL "$obj/attention_lab" "$@" 2>&1 | tee "$out/lab-$tag.log"
