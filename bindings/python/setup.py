"""Builds the `dstransformer` package (its SWIG module) against an existing libdstransformer, and by default
bundles that library into the package, so that `pip wheel ./bindings/python` makes a wheel that installs
and runs anywhere the library's own dependencies are (OpenBLAS, libgomp; the CUDA runtime for a CUDA build)
without the build tree.

Where the library is found, in this order:
  1. DST_LIB_DIR (folder of libdstransformer.so) and DST_INCLUDE_DIR (folder holding dstransformer/);
  2. pkg-config dstransformer (an installed library; PKG_CONFIG_PATH for a staged install);
  3. an in-tree CMake build: <repo>/build, else the most recently built <repo>/build*/.
The include folder defaults to <repo>/capi/include when the package is built from the repository.

The wrapper C source comes from the pre-generated sources in DST_SWIG_OUT when that is set; else from SWIG
when `swig` is on PATH (the SWIG env var names another); else from <repo>/.swig-out/python (written by
the CMake build, and carried to machines without SWIG).
The module's run path is `$ORIGIN`, where libdstransformer.so.<major> is copied (set DST_BUNDLE_LIBRARY=0
to leave it out: the module's run path is then the library folder, for a package that uses an installed
library). Neither needs LD_LIBRARY_PATH at run time.
"""

import glob
import os
import re
import shutil
import subprocess

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
SWIG_DIR = os.path.join(ROOT, "bindings", "swig")
MODULE = "dstransformer_native"
WRAP_C = MODULE + "PYTHON_wrap.c"


def _pkg_config(*args):
    try:
        out = subprocess.run(["pkg-config", *args, "dstransformer"], check=True, capture_output=True, text=True)
        return out.stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return ""


def _has_lib(d):
    return bool(d) and bool(glob.glob(os.path.join(d, "libdstransformer.so*")))


def find_library():
    lib_dir = os.environ.get("DST_LIB_DIR", "")
    inc_dir = os.environ.get("DST_INCLUDE_DIR", "")
    if lib_dir and not _has_lib(lib_dir):
        raise SystemExit(f"dstransformer: DST_LIB_DIR={lib_dir} holds no libdstransformer.so")
    if not lib_dir:
        lib_dir = _pkg_config("--variable=libdir")
        if lib_dir and not inc_dir:
            inc_dir = _pkg_config("--variable=includedir")
    if not _has_lib(lib_dir):
        candidates = [os.path.join(ROOT, "build")]
        others = [d for d in glob.glob(os.path.join(ROOT, "build*")) if _has_lib(d) and d not in candidates]
        others.sort(key=lambda d: os.path.getmtime(glob.glob(os.path.join(d, "libdstransformer.so*"))[0]),
                    reverse=True)
        lib_dir = next((d for d in candidates + others if _has_lib(d)), "")
    if not lib_dir:
        raise SystemExit("dstransformer: libdstransformer.so not found. Build the library (cmake -S . -B build && "
                         "cmake --build build), or set DST_LIB_DIR and DST_INCLUDE_DIR, or install it where "
                         "pkg-config finds dstransformer.pc.")
    tree_inc = os.path.join(ROOT, "capi", "include")
    if not inc_dir:
        inc_dir = tree_inc
    if not os.path.exists(os.path.join(inc_dir, "dstransformer", "dstransformer.h")):
        raise SystemExit(f"dstransformer: dstransformer/dstransformer.h not found under {inc_dir}; set DST_INCLUDE_DIR")
    return os.path.abspath(lib_dir), os.path.abspath(inc_dir)


def version():
    header = os.path.join(ROOT, "capi", "include", "dstransformer", "dstransformer.h")
    try:
        with open(header) as f:
            text = f.read()
        parts = [re.search(rf"#define DST_VERSION_{p}\s+(\d+)", text).group(1) for p in ("MAJOR", "MINOR", "PATCH")]
        return ".".join(parts)
    except (OSError, AttributeError):
        return "0.0.0"


def bundle_library() -> bool:
    return os.environ.get("DST_BUNDLE_LIBRARY", "1") not in ("0", "no", "off", "false", "")


def soname_file(lib_dir):
    """The real file behind libdstransformer.so.<major> (what the module's NEEDED entry names), and that name."""
    names = sorted(n for n in os.listdir(lib_dir) if re.fullmatch(r"libdstransformer\.so\.\d+", n))
    if not names:
        raise SystemExit(f"dstransformer: no libdstransformer.so.<major> in {lib_dir}")
    return os.path.realpath(os.path.join(lib_dir, names[-1])), names[-1]


class BuildSwigExt(build_ext):
    """Generates (or picks up) the SWIG wrapper, compiles it, puts the generated .py next to it and, unless
    DST_BUNDLE_LIBRARY=0, copies libdstransformer.so.<major> beside the module."""

    def run(self):
        lib_dir, inc_dir = find_library()
        gen_dir = os.path.join(self.build_temp, "swig")
        os.makedirs(gen_dir, exist_ok=True)
        wrap_c, wrap_py = self._wrapper(inc_dir, gen_dir)
        bundle = bundle_library()
        for ext in self.extensions:
            ext.sources = [wrap_c]
            ext.include_dirs = [inc_dir]
            ext.library_dirs = [lib_dir]
            ext.runtime_library_dirs = ["$ORIGIN"] if bundle else [lib_dir]
            ext.libraries = ["dstransformer"]
        super().run()
        dest = os.path.join(HERE if self.inplace else self.build_lib, "dstransformer")
        os.makedirs(dest, exist_ok=True)
        shutil.copyfile(wrap_py, os.path.join(dest, MODULE + ".py"))
        if bundle:
            real, name = soname_file(lib_dir)
            self.announce(f"bundling {real} as dstransformer/{name}", level=2)
            shutil.copyfile(real, os.path.join(dest, name))

    def _wrapper(self, inc_dir, gen_dir):
        swig = os.environ.get("SWIG") or shutil.which("swig") or shutil.which("swig4.0")
        iface = os.path.join(SWIG_DIR, "dstransformer.i")
        if swig and os.path.exists(iface) and not os.environ.get("DST_SWIG_OUT"):
            wrap_c = os.path.join(gen_dir, WRAP_C)
            cmd = [swig, "-python", "-threads", f"-I{inc_dir}", f"-I{SWIG_DIR}", "-outdir", gen_dir, "-o", wrap_c, iface]
            self.announce(" ".join(cmd), level=2)
            subprocess.run(cmd, check=True)
            return wrap_c, os.path.join(gen_dir, MODULE + ".py")
        pre = os.environ.get("DST_SWIG_OUT") or os.path.join(ROOT, ".swig-out", "python")
        wrap_c, wrap_py = os.path.join(pre, WRAP_C), os.path.join(pre, MODULE + ".py")
        if not (os.path.exists(wrap_c) and os.path.exists(wrap_py)):
            raise SystemExit("dstransformer: SWIG is not installed and no pre-generated wrapper was found in "
                             f"{pre} (build the CMake target python_gpu_wrapper on a machine with SWIG, or set "
                             "DST_SWIG_OUT)")
        return wrap_c, wrap_py


setup(
    version=version(),
    ext_modules=[Extension("dstransformer._" + MODULE, sources=[WRAP_C])],
    cmdclass={"build_ext": BuildSwigExt},
)
