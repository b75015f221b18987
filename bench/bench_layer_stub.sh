#!/usr/bin/env bash
# A stand-in for bench_layer in the test of tools/bench-ab.sh (bench/CMakeLists.txt): prints rows in
# bench_layer's format whose times depend on the preloaded library's name ("stub_half" in it: half) and on
# the invocation, counted in the file $DST_STUB_COUNTER (each library's rounds get 1.00, 1.30 and 0.95
# times its time, so that the summary's median is the first round's value and its mean is not).
set -eu
count=$(($(cat "$DST_STUB_COUNTER" 2>/dev/null || echo 0) + 1))
echo "$count" >"$DST_STUB_COUNTER"
case "${LD_PRELOAD:-}" in *stub_half*) f=0.5 ;; *) f=1.0 ;; esac
case $(((count - 1) / 2 % 3)) in 0) m=1.00 ;; 1) m=1.30 ;; *) m=0.95 ;; esac
echo "bench_layer stand-in"
awk -v f="$f" -v m="$m" 'BEGIN {
    printf "fp16     8   128  %14.3f %14.3f %12d %14.1f %14.1f\n", 0.290 * f * m, 0.080 * f * m, 1000, 1, 1
    printf "bf16    64   128  %14.3f %14.3f %12d %14.1f %14.1f\n", 1.400 * f * m, 0.420 * f * m, 1000, 1, 1 }'
