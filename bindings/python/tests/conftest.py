import os
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(__file__))

import dstransformer as dst  # noqa: E402


def small_config(**kw):
    """A tiny layer with dropout off (so that results can be compared with the NumPy reference)."""
    base = dict(hidden_size=16, heads=4, intermediate_size=24, batch_size=4, max_seq_length=8,
                attn_dropout_ratio=0.0, hidden_dropout_ratio=0.0, num_hidden_layers=2, dtype="fp64")
    base.update(kw)
    return dst.LayerConfig(**base)


_FIGURES = []


@pytest.fixture(scope="session")
def figures():
    """Lines for the end-of-run summary: measured figures worth reading even when every test passes."""
    return _FIGURES


def pytest_terminal_summary(terminalreporter):
    if _FIGURES:
        terminalreporter.section("measured figures")
        for line in _FIGURES:
            terminalreporter.write_line(line)


@pytest.fixture
def ctx():
    with dst.Context("cpu") as c:
        c.num_threads = 1
        yield c


@pytest.fixture
def rng():
    return np.random.default_rng(1234)


def randomize(layer, rng, scale=0.3):
    """Fresh random values for every parameter (LN γ around 1), returned as fp64 dict."""
    vals = {}
    for name in dst.PARAM_NAMES:
        info = layer.param_info(name)
        v = rng.standard_normal(info.shape) * scale
        if name in ("attn_nw", "norm_w"):
            v = 1.0 + 0.2 * v
        layer.set_param(name, v)
        vals[name] = layer.param(name, "fp64")
    return vals
