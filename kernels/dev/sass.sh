#!/usr/bin/env bash
# The SASS of a kernel file on the development machine, without the GPU machine: compiles FILE for
# sm_90a (as kernels/dev/lab.sh does) and prints, per kernel, its instruction count and opcode counts;
# with SASS_FUN=NAME (a mangled name, or a part of one) it prints that kernel's SASS instead.
#   bash kernels/dev/sass.sh kernels/sm90/attention_flash_wgmma.cu [nvcc options, e.g. -DDST_LAB_SM90A]
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
obj=$(mktemp --suffix=.o)
trap 'rm -f "$obj"' EXIT
nvcc -O3 -std=c++17 -gencode arch=compute_90a,code=sm_90a -DDST_WITH_SM90A -I. -Icapi/include -Xptxas -v \
    "$@" -c "$file" -o "$obj" 2>&1 | grep -E 'spill stores' | grep -v ' 0 bytes spill stores' || true
if [ -n "${SASS_FUN:-}" ]; then
    name=$("$cuobjdump" -sass "$obj" | awk '/Function :/ {print $3}' | grep -F -- "$SASS_FUN" | head -1)
    [ -n "$name" ] || { echo "sass.sh: no kernel matches $SASS_FUN" >&2; exit 1; }
    "$cuobjdump" -sass -fun "$name" "$obj"
    exit 0
fi
"$cuobjdump" -sass "$obj" | awk '
    /Function :/ { if (name != "") report(); name = $3; n = 0; delete ops; next }
    /^ *\/\*[0-9a-f]+\*\// {
        line = $0; sub(/^ *\/\*[0-9a-f]+\*\/ */, "", line); sub(/^@!?U?P[0-9T] */, "", line);
        split(line, w, /[ ;]/); if (w[1] == "") next; ops[w[1]]++; n++ }
    function report(   k, s) {
        s = ""; for (k in ops) s = s sprintf(" %s:%d", k, ops[k])
        printf "%s total %d |%s\n", name, n, s }
    END { if (name != "") report() }'
