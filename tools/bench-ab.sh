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
# examples). Then a summary, also on stdout: per shape and library the median over the rounds of the
# fwd+bwd and inference ms, and their ratios to the first library's medians (below 1: faster).
# Exit status 2 for bad arguments, 1 when a run fails.
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
# The summary: the rows keyed by (dtype, B, S) per library, in the order they first appeared.
summary=$(awk -v first="${names[0]}" '
    function median(key, col,   n, i, j, t, v) {
        n = split(vals[key, col], v, " ")
        for (i = 2; i <= n; ++i) for (j = i; j > 1 && v[j - 1] + 0 > v[j] + 0; --j) { t = v[j]; v[j] = v[j - 1]; v[j - 1] = t }
        return n % 2 ? v[(n + 1) / 2] : (v[n / 2] + v[n / 2 + 1]) / 2
    }
    /^== round [0-9]+ lib / { lib = $5; if (!(lib in seen_lib)) { seen_lib[lib] = 1; libs[++nl] = lib }; next }
    NF >= 5 && $1 ~ /^(fp16|bf16|fp32|fp64)$/ {
        shape = $1 " " $2 "x" $3
        if (!(shape in seen_shape)) { seen_shape[shape] = 1; shapes[++ns] = shape }
        vals[shape SUBSEP lib, 4] = vals[shape SUBSEP lib, 4] " " $4
        vals[shape SUBSEP lib, 5] = vals[shape SUBSEP lib, 5] " " $5
    }
    END {
        if (ns == 0) exit
        printf "== summary: medians over the rounds; ratios to %s\n", first
        printf "%-14s %-12s %14s %14s %10s %10s\n", "shape", "library", "fwd+bwd ms", "infer ms", "fwd+bwd", "infer"
        for (s = 1; s <= ns; ++s)
            for (l = 1; l <= nl; ++l) {
                key = shapes[s] SUBSEP libs[l]
                if (!((key, 4) in vals)) continue
                f = median(key, 4); i = median(key, 5)
                base = shapes[s] SUBSEP first
                if ((base, 4) in vals) { bf = median(base, 4); bi = median(base, 5) } else { bf = 0; bi = 0 }
                rf = (bf > 0) ? sprintf("%.3f", f / bf) : "-"
                ri = (bi > 0) ? sprintf("%.3f", i / bi) : "-"
                printf "%-14s %-12s %14.3f %14.3f %10s %10s\n", shapes[s], libs[l], f, i, rf, ri
            }
    }' "$log")
[ -n "$summary" ] && printf '%s\n' "$summary" | tee -a "$log"
exit "$status"
