"""libdstransformer from Python: build a BERT layer, run forward and backward on random data with a
padding mask, and read the gradients.

    PYTHONPATH=build/python /usr/bin/python3 examples/python/layer_example.py

Runs on the best available backend ("auto": CUDA when a GPU is usable, else the CPU reference);
NumPy arrays are copied to and from the device by the binding.
"""
import numpy as np

import dstransformer as dst

B, S, H, HEADS = 4, 32, 64, 4

with dst.Context("auto") as ctx:
    ctx.rng_state = (2024, 0)  # dropout: Philox seed and offset
    cfg = dst.LayerConfig(batch_size=B, max_seq_length=S, hidden_size=H, heads=HEADS,
                          attn_dropout_ratio=0.1, hidden_dropout_ratio=0.1, pre_layer_norm=True)
    with dst.Layer(ctx, cfg) as layer:
        rng = np.random.default_rng(0)
        x = rng.standard_normal((B, S, H)).astype(np.float32)
        lengths = np.array([S, S - 5, S // 2, 1], dtype=np.int32)  # valid keys per sequence
        y = layer.forward(x, dst.Mask.lengths(lengths))
        # Loss = 1/2 ||y||^2, so dL/dy = y.
        dx = layer.backward(y)
        for name in ("attn_qkvw", "norm_w"):
            print(f"|d {name}| = {np.linalg.norm(layer.grad(name)):.4f}")
        print(f"backend {ctx.backend}, output {y.shape}, |dx| = {np.linalg.norm(dx):.4f}")
        assert np.all(np.isfinite(y)) and np.all(np.isfinite(dx))
