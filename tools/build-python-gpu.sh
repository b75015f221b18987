#!/usr/bin/env bash
# Compiles the Python binding on a machine without SWIG (the GPU machine), from the wrapper sources that
# the CMake build wrote on the development machine into .swig-out/python (carry that folder along).
#
#   bash tools/build-python-gpu.sh LIB_DIR [OUT_DIR]
#
# LIB_DIR: the folder holding libdstransformer.so (a CMake build folder). OUT_DIR (default
# LIB_DIR/python) receives the package: OUT_DIR/dstransformer/{*.py, _dstransformer_native<EXT>}, so that
# PYTHONPATH=OUT_DIR imports it. Environment: PYTHON (default python3), CC (default gcc),
# DST_SWIG_OUT (default <repo>/.swig-out/python).
set -euo pipefail

die() { echo "build-python-gpu: error: $*" >&2; exit 1; }

[ $# -ge 1 ] || die "usage: $0 LIB_DIR [OUT_DIR]"
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
lib_dir=$(cd "$1" 2>/dev/null && pwd) || die "LIB_DIR '$1' does not exist"
out=${2:-$lib_dir/python}
py=${PYTHON:-python3}
cc=${CC:-gcc}
wrap=${DST_SWIG_OUT:-$root/.swig-out/python}
wrap_c=$wrap/dstransformer_nativePYTHON_wrap.c
wrap_py=$wrap/dstransformer_native.py

ls "$lib_dir"/libdstransformer.so >/dev/null 2>&1 || die "no libdstransformer.so in $lib_dir (build the library first)"
if [ ! -f "$wrap_c" ] || [ ! -f "$wrap_py" ]; then
    die "no wrapper sources in $wrap: on the development machine run
  cmake --build <build> --target python_gpu_wrapper   (configured with -DDST_BUILD_PYTHON=ON)
and carry the .swig-out folder with the tree"
fi
if [ -f "$wrap/inputs.sha256" ]; then
    (cd "$root" && sha256sum --quiet -c "$wrap/inputs.sha256") ||
        die "the wrapper in $wrap is stale: the .i files or the header changed since SWIG ran; regenerate it"
else
    echo "build-python-gpu: warning: $wrap/inputs.sha256 missing, cannot check that the wrapper is current" >&2
fi
command -v "$py" >/dev/null || die "python '$py' not found"
command -v "$cc" >/dev/null || die "C compiler '$cc' not found"

py_inc=$("$py" -c 'import sysconfig; print(sysconfig.get_paths()["include"])')
ext=$("$py" -c 'import sysconfig; print(sysconfig.get_config_var("EXT_SUFFIX") or ".so")')
[ -f "$py_inc/Python.h" ] || die "Python.h not found in $py_inc (the Python development headers of $py are needed)"

pkg=$out/dstransformer
mkdir -p "$pkg"
cp "$root"/bindings/python/dstransformer/*.py "$pkg"/
cp "$wrap_py" "$pkg"/
rm -f "$pkg"/_dstransformer_native*.so
echo "build-python-gpu: compiling the wrapper for $("$py" -c 'import sys; print(sys.version.split()[0])') ($ext)"
"$cc" -shared -fPIC -O2 -fvisibility=hidden -w \
    -I"$py_inc" -I"$root/capi/include" "$wrap_c" \
    -L"$lib_dir" -ldstransformer -Wl,-rpath,"$lib_dir" \
    -o "$pkg/_dstransformer_native$ext"
PYTHONPATH=$out "$py" -c '
import dstransformer as d
print("build-python-gpu: import ok: dstransformer", d.version(), "from", d.__file__, "| CUDA devices:", d.cuda_device_count())
'
echo "build-python-gpu: done; use PYTHONPATH=$out"
