#!/usr/bin/env python3
"""Where a 16-bit layer's error comes from: the library's Post-LN dataflow, one layer forward and backward,
emulated in fp64 with a rounding to the layer dtype at each point where the library stores a tensor in
that dtype, and the dX error measured with chosen roundings left out.

The dataflow and its storage points (dropout 0, an additive padding mask; each name below is rounded where
the library writes that tensor; the attention's softmax, its row statistics, LayerNorm statistics and
every GEMM accumulation stay exact, as they are fp32 in the library):

  forward   qkv = x·Wqkvᵀ + b; ctx = attention(qkv); t = ctx·Woᵀ + bo; r = x + t; h2 = LN2(r);
            u = h2·Wiᵀ + bi; g = GELU(u); t2 = g·Woutᵀ + bout; z = h2 + t2; y = LN(z)
  backward  dz = LN'(dy) (also the FFN branch's gradient); dg = dz·Wout; du = dg·GELU'(u);
            dh2 = du·Wi + dz; dr = LN2'(dh2); dctx = dr·Wo; dqkv = attention'(dctx); dx = dqkv·Wqkv + dr

The error is the relative L2 distance of dX (and y) from the same computation with no rounding at all, on
the weights and inputs as the library holds them (rounded to the dtype) — what
tests/gpu_python/test_hf_interop.py measures against transformers in fp64. Layer i of the pretrained
MiniLM encoder (the test's weights, .minilm/minilm_encoder.safetensors; docs/checkpoints.md says how to
make them), inputs as in the test's first layer (standard normal hidden state and gradient, seed 99).

    python3 bench/rounding_study.py [--dtype fp16|bf16] [--layer 0] [--weights PATH]

Prints the error (y, dX and attn_qkvw's gradient) with every rounding, with each one left out, and with
only a few kept; then with the CUDA attention kernels' 16-bit operands rounded too (FLASH below: the CPU
backend keeps them in fp32), and with each of those left out. Needs torch and safetensors (no GPU, no
transformers, not the library).
"""
import argparse
import math
import pathlib

import torch
from safetensors.torch import load_file

FORWARD = ["qkv", "ctx", "t", "r", "h2", "u", "g", "t2", "z", "y"]
BACKWARD = ["dz", "dg", "du", "dh2", "dr", "dctx", "dqkv", "dx"]
ALL = set(FORWARD + BACKWARD)
# The tensor-core attention's own 16-bit operands, rounded in registers (not stored): the forward's
# exp(s − row max) as the P·V operand, normalised after the product by the sum of the unrounded values
# ("P"), the backward's recomputed normalised P as the Pᵀ·dctx operand ("Pb") and dS as the dS·K and
# dSᵀ·Q operand ("dS"). The CPU backend keeps them in fp32; the CUDA kernels
# round them (kernels/attention_flash_*.cuh).
FLASH = ["P", "Pb", "dS"]
GPU = ALL | set(FLASH)


class Layer:
    def __init__(self, weights, i, dtype, heads):
        def w(n):  # the value the library holds: the checkpoint's fp32 rounded to the dtype
            return weights["encoder.layer.%d.%s" % (i, n)].to(dtype).double()
        self.wqkv = torch.cat([w("attention.self.%s.weight" % n) for n in ("query", "key", "value")])
        self.bqkv = torch.cat([w("attention.self.%s.bias" % n) for n in ("query", "key", "value")])
        self.wo, self.bo = w("attention.output.dense.weight"), w("attention.output.dense.bias")
        self.g2, self.b2 = w("attention.output.LayerNorm.weight"), w("attention.output.LayerNorm.bias")
        self.wi, self.bi = w("intermediate.dense.weight"), w("intermediate.dense.bias")
        self.wout, self.bout = w("output.dense.weight"), w("output.dense.bias")
        self.g3, self.b3 = w("output.LayerNorm.weight"), w("output.LayerNorm.bias")
        self.heads, self.dtype = heads, dtype

    def run(self, x, dy, mask, rounded, eps=1e-12):
        """y and dX with a rounding to the dtype at each storage point named in `rounded`."""
        def R(name, t):
            return t.to(self.dtype).double() if name in rounded else t

        B, S, H = x.shape
        nh, d = self.heads, H // self.heads

        def split(t):  # [B, S, H] -> [B, heads, S, d]
            return t.reshape(B, S, nh, d).transpose(1, 2)

        def merge(t):
            return t.transpose(1, 2).reshape(B, S, H)

        def ln(z, g, b):
            mu = z.mean(-1, keepdim=True)
            rs = 1.0 / torch.sqrt(((z - mu) ** 2).mean(-1, keepdim=True) + eps)
            xh = (z - mu) * rs
            return xh * g + b, xh, rs

        def ln_bwd(dyv, g, xh, rs):
            gd = dyv * g
            return rs * (gd - gd.mean(-1, keepdim=True) - xh * (gd * xh).mean(-1, keepdim=True))

        qkv = R("qkv", x @ self.wqkv.T + self.bqkv)
        q, k, v = (split(qkv[..., j * H:(j + 1) * H]) for j in range(3))
        logits = q @ k.transpose(-1, -2) / math.sqrt(d) + mask[:, None, None, :]
        E = torch.exp(logits - logits.amax(-1, keepdim=True))  # the forward's P before 1/l: the row max is 1
        l = E.sum(-1, keepdim=True)  # summed from the unrounded values (fp32 in the kernels)
        P = E / l
        ctx = R("ctx", merge((R("P", E) @ v) / l))
        t = R("t", ctx @ self.wo.T + self.bo)
        r = R("r", x + t)
        h2u, xh2, rs2 = ln(r, self.g2, self.b2)
        h2 = R("h2", h2u)
        u = R("u", h2 @ self.wi.T + self.bi)
        cdf = 0.5 * (1.0 + torch.erf(u / math.sqrt(2.0)))
        g = R("g", u * cdf)
        t2 = R("t2", g @ self.wout.T + self.bout)
        z = R("z", h2 + t2)
        yu, xh3, rs3 = ln(z, self.g3, self.b3)
        y = R("y", yu)

        dz = R("dz", ln_bwd(dy, self.g3, xh3, rs3))
        dg = R("dg", dz @ self.wout)
        du = R("du", dg * (cdf + u * torch.exp(-0.5 * u * u) / math.sqrt(2.0 * math.pi)))
        dh2 = R("dh2", du @ self.wi + dz)
        dr = R("dr", ln_bwd(dh2, self.g2, xh2, rs2))
        dctx = R("dctx", dr @ self.wo)
        do = split(dctx)
        dS = R("dS", P * (do @ v.transpose(-1, -2) - (do * split(ctx)).sum(-1, keepdim=True)))
        dq, dk = dS @ k / math.sqrt(d), dS.transpose(-1, -2) @ q / math.sqrt(d)
        dv = R("Pb", P).transpose(-1, -2) @ do
        dqkv = R("dqkv", torch.cat([merge(a) for a in (dq, dk, dv)], -1))
        dx = R("dx", dqkv @ self.wqkv + dr)
        dwqkv = dqkv.reshape(B * S, 3 * H).T @ x.reshape(B * S, H)  # attn_qkvw's gradient (fp32 accumulation)
        return y, dx, dwqkv


def rel(a, b):
    return ((a - b).norm() / b.norm()).item()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dtype", choices=("fp16", "bf16"), default="fp16")
    ap.add_argument("--layer", type=int, default=0)
    root = pathlib.Path(__file__).resolve().parents[1]
    ap.add_argument("--weights", default=str(root / ".minilm" / "minilm_encoder.safetensors"))
    a = ap.parse_args()
    dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}[a.dtype]
    layer = Layer(load_file(a.weights), a.layer, dtype, heads=12)
    B, S, H = 2, 24, layer.wo.shape[0]
    torch.manual_seed(99)
    x = torch.randn(B, S, H, dtype=torch.float64).to(dtype).double()
    dy = torch.randn(B, S, H, dtype=torch.float64).to(dtype).double()
    mask = torch.zeros(B, S, dtype=torch.float64)
    mask[1, 13:] = -10000.0
    y_ref, dx_ref, dw_ref = layer.run(x, dy, mask, set())

    def report(label, rounded):
        y, dx, dw = layer.run(x, dy, mask, rounded)
        print("%-58s y %.3e  dX %.3e  dWqkv %.3e" % (label, rel(y, y_ref), rel(dx, dx_ref), rel(dw, dw_ref)))

    print("MiniLM layer %d, %s: relative L2 error against the unrounded dataflow" % (a.layer, a.dtype))
    report("every storage point rounded (the CPU backend)", ALL)
    report("and the attention's 16-bit operands (the CUDA kernels)", GPU)
    for name in FLASH:
        report("  all but %s" % name, GPU - {name})
    report("  all but P and dS", GPU - {"P", "dS"})
    for name in FORWARD + BACKWARD:
        report("  all but %s" % name, ALL - {name})
    report("  all but the backward's gradients (kept in fp32)", ALL - set(BACKWARD[:-1]))
    report("  all but qkv and ctx", ALL - {"qkv", "ctx"})
    for kept in (["dx"], ["qkv"], ["qkv", "dx"], ["qkv", "ctx", "dx"], ["qkv", "ctx", "dqkv", "dx"]):
        report("only " + ", ".join(kept), set(kept))


if __name__ == "__main__":
    main()
