#!/usr/bin/env bash
# The libraries dst-pretrain needs that the GPU machine lacks (libjansson, libutf8proc; it has no Debian
# packages and nothing can be installed there), as a prefix that travels with the working tree. Run on the
# development machine (Debian, with apt), from anywhere:
#
#   bash tools/gpu-deps.sh [DEST]        # default DEST: .gpu-deps/ at the repository root (git-ignored)
#
# It downloads the Debian packages libjansson4, libjansson-dev, libutf8proc2 and libutf8proc-dev with
# `apt-get download` (no installation) and unpacks them into DEST, giving DEST/usr/include/{jansson,
# utf8proc}.h and DEST/usr/lib/<multiarch>/lib{jansson,utf8proc}.so*. Their pkg-config files are removed:
# they name /usr as their prefix, which is wrong once the tree is copied elsewhere, and without them
# dst-pretrain's CMake finds the headers and libraries through CMAKE_PREFIX_PATH (find_path/find_library).
# On the GPU machine (tools/gpu-session.sh pretrain does this):
#
#   cmake ... -DCMAKE_PREFIX_PATH=$PWD/.gpu-deps/usr
#   export LD_LIBRARY_PATH=$PWD/.gpu-deps/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
#
# The packages are Debian 12's, built for glibc 2.36; the GPU machine has glibc 2.39, which runs them.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
dest=${1:-$root/.gpu-deps}
packages=(libjansson4 libjansson-dev libutf8proc2 libutf8proc-dev)
if ! command -v apt-get >/dev/null || ! command -v dpkg-deb >/dev/null; then
    echo "gpu-deps: needs apt-get and dpkg-deb (a Debian or Ubuntu machine)" >&2
    exit 1
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
(cd "$work" && apt-get download "${packages[@]}") || {
    echo "gpu-deps: apt-get download ${packages[*]} failed (run apt-get update?)" >&2
    exit 1
}
rm -rf "$dest"
mkdir -p "$dest"
for deb in "$work"/*.deb; do
    dpkg-deb -x "$deb" "$dest"
done
find "$dest" -name '*.pc' -delete
find "$dest" -type d -name pkgconfig -empty -delete
rm -rf "$dest/usr/share/doc"
multiarch=$(dpkg-architecture -qDEB_HOST_MULTIARCH 2>/dev/null || gcc -print-multiarch)
for f in usr/include/jansson.h usr/include/utf8proc.h "usr/lib/$multiarch/libjansson.so" "usr/lib/$multiarch/libutf8proc.so"; do
    [ -e "$dest/$f" ] || { echo "gpu-deps: $dest/$f is missing after unpacking" >&2; exit 1; }
done
echo "gpu-deps: $(ls "$work" | tr '\n' ' ')-> $dest ($(du -sh "$dest" | cut -f1))"
echo "  configure with -DCMAKE_PREFIX_PATH=$dest/usr; run with LD_LIBRARY_PATH=$dest/usr/lib/$multiarch"
