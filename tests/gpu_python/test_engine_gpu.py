"""dstransformer.initialize on the CUDA backend: the scenarios of bindings/python/tests/test_engine.py run
on cuda:0 in fp32, fp16 (dynamic loss scaling) and bf16, and the example BERT pre-training script with its
fp16 configuration.

Runs on the GPU machine (tools/run-python-gpu.sh runs it with the package built there on PYTHONPATH);
skips without torch, without a CUDA device or with a library built without CUDA. Checks: the loss falls;
save -> load -> continue repeats the uninterrupted run's losses and weights bit for bit (dropout on);
AdamW and Adam-L2 match torch.optim on the GPU within the CPU test's bound; the example exits 0 (loss
fell, resumed run identical).
"""
import os
import pathlib
import sys

import pytest

torch = pytest.importorskip("torch")
import dstransformer as deepspeed  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bindings" / "python" / "tests"))
import test_engine as scenarios  # noqa: E402

pytestmark = pytest.mark.skipif(not (torch.cuda.is_available() and deepspeed.cuda_device_count() > 0),
                                reason="needs a CUDA device and a CUDA build of the library")


@pytest.mark.parametrize("precision", ["fp32", "fp16", "bf16"])
def test_loss_falls_cuda(precision):
    first, last = scenarios.run_loss_falls("cuda", precision)
    print(f"engine, cuda {precision}: mean loss of the first 6 micro-batches {first:.4f}, last 6 {last:.4f}")


@pytest.mark.parametrize("precision", ["fp32", "fp16", "bf16"])
def test_resume_is_bit_identical_cuda(precision, tmp_path):
    scenarios.run_resume_bit_identical("cuda", precision, tmp_path)


@pytest.mark.parametrize("mode", ["adamw", "l2"])
def test_adam_matches_torch_optim_cuda(mode):
    worst = scenarios.run_adamw_matches_torch("cuda", mode)
    print(f"engine {mode} vs torch.optim, cuda fp32: worst relative error {worst:.1e} (bound {scenarios.ADAM_TOL:g})")


def test_bert_example_fp16_cuda():
    sys.path.insert(0, str(ROOT / "examples" / "python"))
    import bert_pretrain

    assert bert_pretrain.main(["--device", "cuda", "--steps", "100"]) == 0
