"""Imports an installed `dstransformer` and runs a tiny layer; the package and the libdstransformer.so it
loads must both come from under ROOT (an install prefix, or a virtual environment the wheel went into),
never from the build tree.

    python check_python_install.py ROOT
"""
import os
import sys

import numpy as np

import dstransformer as dst


def loaded_library():
    with open("/proc/self/maps") as f:
        paths = {line.split()[-1] for line in f if "libdstransformer.so" in line}
    if len(paths) != 1:
        sys.exit(f"expected one libdstransformer.so in the process, found {sorted(paths) or 'none'}")
    return paths.pop()


def main():
    root = os.path.realpath(sys.argv[1])
    pkg = os.path.realpath(os.path.dirname(dst.__file__))
    with dst.Context("cpu") as ctx:
        cfg = dst.LayerConfig(batch_size=2, max_seq_length=4, hidden_size=8, heads=2)
        with dst.Layer(ctx, cfg) as layer:
            y = layer.forward(np.ones((2, 4, 8), np.float32))
            assert y.shape == (2, 4, 8) and np.isfinite(y).all()
    lib = os.path.realpath(loaded_library())
    for what, path in (("the package", pkg), ("libdstransformer.so", lib)):
        if os.path.commonpath([root, path]) != root:
            sys.exit(f"{what} comes from {path}, not from under {root}")
    print(f"installed dstransformer {dst.version()}: package {pkg}, library {lib}")


if __name__ == "__main__":
    main()
