#!/usr/bin/env bash
# The SASS of a kernel file on the development machine, without the GPU machine: compiles FILE for
# sm_90a (as kernels/dev/lab.sh does; SASS_ARCH below) and prints, per kernel, its instruction count and opcode counts;
# with SASS_FUN=NAME (a mangled name, or a part of one) it prints that kernel's SASS instead.
#   bash kernels/dev/sass.sh kernels/sm90/attention_flash_wgmma.cu [nvcc options, e.g. -DDST_LAB_SM90A]
# With SASS_BASE=REV (a git revision) it compiles the file of that revision too (its whole tree, so
# that the headers are that revision's) and says, per kernel, whether the SASS is identical: a change
# meant to leave the kernels as they were (a refactor) shows that it does without a device run.
# SASS_ARCH (default 90a) picks the target, e.g. 90 for the objects the library builds for sm_90.
# FILE may also be an object a build made (FILE.o, e.g. build/CMakeFiles/dst_cutlass.dir/kernels/
# cutlass/gemm_gelu_fp16.cu.o, whose CUTLASS includes this script does not pass): its SASS is read as
# it is, nothing compiled (no SASS_BASE then).
# Static counts: what ptxas made of the code (moves it added, spills, a loop's instruction mix), not
# what runs. cuobjdump comes from the CUDA toolkit when it has one, else from NVIDIA's
# nvidia-cuda-cuobjdump and nvidia-cuda-nvdisasm wheels (PyPI), unpacked once under ${XDG_CACHE_HOME:-~/.cache}/dst-sass.
set -eu -o pipefail
file=${1:?usage: sass.sh FILE.cu [nvcc options]}
shift
cuobjdump=$(command -v cuobjdump || true)
[ -z "$cuobjdump" ] && [ -x /usr/local/cuda/bin/cuobjdump ] && cuobjdump=/usr/local/cuda/bin/cuobjdump
if [ -z "$cuobjdump" ]; then  # the wheels' cuobjdump and the nvdisasm it runs
    cache=${XDG_CACHE_HOME:-$HOME/.cache}/dst-sass
    if [ -z "$(find "$cache/x" -type f -name cuobjdump 2>/dev/null)" ] ||
       [ -z "$(find "$cache/x" -type f -name nvdisasm 2>/dev/null)" ]; then
        rm -rf "$cache" && mkdir -p "$cache"
        python3 -m pip download --quiet --no-deps -d "$cache" nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm
        for w in "$cache"/*.whl; do python3 -m zipfile -e "$w" "$cache/x"; done
        chmod +x "$cache"/x/nvidia/*/bin/*
    fi
    bin=$(dirname "$(find "$cache/x" -type f -name cuobjdump | head -1)")
    export PATH=$bin:$PATH
    cuobjdump=$bin/cuobjdump
fi
arch=${SASS_ARCH:-90a}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
compile() {  # compile ROOT OUT: the file of tree ROOT
    (cd "$1" && nvcc -O3 -std=c++17 -gencode "arch=compute_$arch,code=sm_$arch" -DDST_WITH_SM90A -I. -Icapi/include \
        -Xptxas -v "${opts[@]}" -c "$file" -o "$2") 2>&1 | grep -E 'spill stores' | grep -v ' 0 bytes spill stores' || true
}
listing() {  # listing OBJ: the SASS without the encodings; anonymous namespaces' path hashes made equal
    "$cuobjdump" -sass "$1" | sed -e 's@/\* 0x[0-9a-f]* \*/@@' -e 's/_GLOBAL__N__[0-9a-f]*_/_GLOBAL__N__/g'
}
opts=("$@")
root=$(pwd)
if [[ "$file" == *.o ]]; then
    [ -f "$file" ] || { echo "sass.sh: no object $file" >&2; exit 1; }
    [ -z "${SASS_BASE:-}" ] || { echo "sass.sh: SASS_BASE compiles sources; $file is an object" >&2; exit 1; }
    cp "$file" "$tmp/new.o"
else
    compile "$root" "$tmp/new.o"
fi
if [ -n "${SASS_BASE:-}" ]; then
    mkdir "$tmp/base"
    git -C "$root" archive "$SASS_BASE" | tar -x -C "$tmp/base"
    compile "$tmp/base" "$tmp/base.o"
    listing "$tmp/base.o" >"$tmp/base.sass"
    listing "$tmp/new.o" >"$tmp/new.sass"
    awk 'FNR == 1 { f++; name = "" } /Function :/ { name = $3; next } name != "" { body[f, name] = body[f, name] $0 "\n"; seen[name] = 1 }
         END { n = 0; for (k in seen) { same = body[1, k] == body[2, k]; n += !same
                   printf "%-9s %s\n", same ? "same" : (body[1, k] == "" ? "new" : (body[2, k] == "" ? "gone" : "DIFFERS")), k }
               printf "%d of the kernels differ from %s\n", n, base }' base="$SASS_BASE" "$tmp/base.sass" "$tmp/new.sass"
    exit 0
fi
if [ -n "${SASS_FUN:-}" ]; then
    name=$("$cuobjdump" -sass "$tmp/new.o" | awk '/Function :/ {print $3}' | grep -F -- "$SASS_FUN" | head -1)
    [ -n "$name" ] || { echo "sass.sh: no kernel matches $SASS_FUN" >&2; exit 1; }
    "$cuobjdump" -sass -fun "$name" "$tmp/new.o"
    exit 0
fi
"$cuobjdump" -sass "$tmp/new.o" | awk '
    /Function :/ { if (name != "") report(); name = $3; n = 0; delete ops; next }
    /^ *\/\*[0-9a-f]+\*\// {
        line = $0; sub(/^ *\/\*[0-9a-f]+\*\/ */, "", line); sub(/^@!?U?P[0-9T] */, "", line);
        split(line, w, /[ ;]/); if (w[1] == "") next; ops[w[1]]++; n++ }
    function report(   k, s) {
        s = ""; for (k in ops) s = s sprintf(" %s:%d", k, ops[k])
        printf "%s total %d |%s\n", name, n, s }
    END { if (name != "") report() }'
