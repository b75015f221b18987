#!/usr/bin/env bash
# CUTLASS's headers for the fused-epilogue GEMMs (kernels/cutlass/), from NVIDIA's PyPI wheel: Debian
# ships no CUTLASS, and PyPI is what the build machines reach. The wheel is pinned by version and
# SHA-256, downloaded with pip (no installation), checked, and only its C++ headers are kept:
#
#   bash tools/cutlass.sh [DEST]     # default DEST: .deps/cutlass at the repository root (git-ignored)
#
# gives DEST/include/{cutlass,cute}/ (with the utility headers, cutlass/util/), DEST/LICENSE.txt (BSD
# 3-clause) and DEST/VERSION. CMake looks there by default
# (DST_CUTLASS_INCLUDE_DIR, docs/building.md); a DEST that already holds this version is left as is.
# The GPU machine reaches no network: run this here and carry `.deps` with the call.
set -euo pipefail
version=4.2.0.0
sha256=f9599ada45c7bcb6bf53f7d3f0a7d154183e53451c01bfa59eecd37dd4a693f6
wheel=nvidia_cutlass-$version-py3-none-any.whl
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
dest=${1:-$root/.deps/cutlass}
python=${PYTHON:-/usr/bin/python3}
[ -x "$python" ] || python=$(command -v python3)

if [ -f "$dest/VERSION" ] && [ "$(cat "$dest/VERSION")" = "$version" ] && [ -f "$dest/LICENSE.txt" ] &&
    [ -f "$dest/include/cutlass/util/packed_stride.hpp" ]; then
    echo "cutlass: $version already in $dest"
    exit 0
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$python" -m pip download --quiet --no-deps --only-binary=:all: --dest "$work" "nvidia-cutlass==$version" || {
    echo "cutlass: pip could not download nvidia-cutlass==$version (is PyPI reachable?)" >&2
    exit 1
}
[ -f "$work/$wheel" ] || { echo "cutlass: pip did not produce $wheel" >&2; exit 1; }
got=$(sha256sum "$work/$wheel" | cut -d' ' -f1)
if [ "$got" != "$sha256" ]; then
    echo "cutlass: $wheel has SHA-256 $got, expected $sha256" >&2
    exit 1
fi
"$python" - "$work/$wheel" "$work/out" <<'EOF'
import sys, zipfile
import os
# The library's headers, and the utility headers (cutlass/util/: packed strides), merged into one tree.
prefixes = ["cutlass_library/source/include/", "cutlass_library/source/tools/util/include/"]
with zipfile.ZipFile(sys.argv[1]) as z:
    for prefix in prefixes:
        names = [n for n in z.namelist() if n.startswith(prefix) and not n.endswith("/")]
        if not names:
            sys.exit("cutlass: the wheel has no " + prefix)
        for n in names:
            target = sys.argv[2] + "/include/" + n[len(prefix):]
            os.makedirs(os.path.dirname(target), exist_ok=True)
            with z.open(n) as src, open(target, "wb") as dst:
                dst.write(src.read())
    # CUTLASS's license (BSD 3-clause), beside the headers whose templates the library compiles.
    lic = [n for n in z.namelist() if n.endswith("/LICENSE.txt") and ".dist-info/" in n]
    if not lic:
        sys.exit("cutlass: the wheel has no LICENSE.txt")
    with z.open(lic[0]) as src, open(sys.argv[2] + "/LICENSE.txt", "wb") as dst:
        dst.write(src.read())
EOF
[ -f "$work/out/include/cutlass/cutlass.h" ] && [ -f "$work/out/include/cute/tensor.hpp" ] &&
    [ -f "$work/out/include/cutlass/util/packed_stride.hpp" ] || {
    echo "cutlass: the headers are missing after unpacking" >&2
    exit 1
}
echo "$version" >"$work/out/VERSION"
rm -rf "$dest"
mkdir -p "$(dirname "$dest")"
mv "$work/out" "$dest"
echo "cutlass: $version -> $dest ($(du -sh "$dest" | cut -f1))"
