#!/usr/bin/env bash
# Two or more builds of libdstransformer timed against each other by bench/bench_layer, in alternating
# processes (A B C, A B C, ...), so that a drift of the machine during the call reaches every build
# alike. For the GPU machine, with libraries built on the development machine and carried (the device's
# build time saved): every library is a libdstransformer.so.0.1.0 of the same SONAME, preloaded in turn.
#
#   bash tools/bench-ab.sh OUTDIR BENCH_LAYER ROUNDS SHAPES NAME=LIB [NAME=LIB ...]
#   e.g. bash tools/bench-ab.sh "$OUT" /tmp/ab/bench_layer 3 8x128,64x128,16x512 \
#            before=/tmp/ab/lib_before.so after=/tmp/ab/lib_after.so
#
# OUTDIR/bench_ab.txt receives, per round and library, bench_layer's rows (dtype, B, S, fwd+bwd and
# inference ms per layer, tokens/s, host CPU µs per step and per inference forward); compare a column
# across the libraries within the same round, and the rounds for the spread (bench/RESULTS.md has
# examples). Exit status 2 for bad arguments, 1 when a run fails.
set -u -o pipefail
if [ $# -lt 6 ]; then
    echo "usage: $0 OUTDIR BENCH_LAYER ROUNDS SHAPES NAME=LIB NAME=LIB [NAME=LIB ...]" >&2
    exit 2
fi
out=$1 bench=$2 rounds=$3 shapes=$4
shift 4
if ! [ -x "$bench" ]; then
    echo "$0: BENCH_LAYER '$bench' is not an executable file" >&2
    exit 2
fi
if ! [[ "$rounds" =~ ^[1-9][0-9]*$ ]]; then
    echo "$0: ROUNDS must be a positive integer, got '$rounds'" >&2
    exit 2
fi
names=() libs=()
for spec in "$@"; do
    name=${spec%%=*} lib=${spec#*=}
    if [ -z "$name" ] || [ "$name" = "$spec" ] || ! [ -f "$lib" ]; then
        echo "$0: expected NAME=LIB with LIB an existing library file, got '$spec'" >&2
        exit 2
    fi
    names+=("$name") libs+=("$(cd "$(dirname "$lib")" && pwd)/$(basename "$lib")")
done
mkdir -p "$out"
log=$out/bench_ab.txt
: >"$log"
status=0
for ((r = 1; r <= rounds; ++r)); do
    for i in "${!names[@]}"; do
        echo "== round $r lib ${names[$i]}" | tee -a "$log"
        if LD_PRELOAD=${libs[$i]} timeout 120 "$bench" --shapes "$shapes" >"$out/.run.txt" 2>&1; then
            grep -E "^(fp16|bf16|fp32|fp64) " "$out/.run.txt" | tee -a "$log"
        else
            echo "run failed:" | tee -a "$log"
            tail -5 "$out/.run.txt" | tee -a "$log"
            status=1
        fi
    done
done
rm -f "$out/.run.txt"
exit "$status"
