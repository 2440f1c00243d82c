"""CUDA versions of the precision and LoRA checks (``gpu``-marked: skipped without a GPU).

Each check runs with the HF engine (always) and with vLLM (where it imports), so a GPU machine without vLLM runs
the tier instead of failing it. GPU kernels are not bit-deterministic across batch shapes, so the sampler/trainer
log-prob mismatch gets a bound per precision (below), not the CPU tests' exactness.
"""

from __future__ import annotations

import math

import pytest
import torch

from tests.helpers import GPU_ENGINES as ENGINES
from tests.helpers import read_scalars
from tests.integration.test_train_smoke import run_train

pytestmark = [pytest.mark.integration, pytest.mark.gpu]

RUNS = {"fp32": ["precision=fp32"], "bf16": ["precision=bf16"], "fp16": ["precision=fp16"],
        "lora": ["model.lora={r: 4, alpha: 8}"]}
MISMATCH = {"fp32": 1e-3, "lora": 1e-3, "bf16": 1.0, "fp16": 1.0}
"""Largest |sampler − trainer| log-prob allowed per run: fp32 kernels differ only in summation order between the
engine's cached decode and the trainer's whole-sequence pass; 16-bit ones round each differently."""


def needs_cuda() -> None:
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("run", list(RUNS))
def test_gpu_lab_run(tmp_path, run, engine):
    needs_cuda()
    run_train(tmp_path, "trainer=gpu", f"rollout={engine}", "trainer.max_epochs=2", *RUNS[run])
    scalars = read_scalars(tmp_path / "run")
    assert sorted(scalars["train/ratio_mean"])[0][1] == pytest.approx(1.0, abs=1e-6)  # first step: on-policy
    assert all(math.isfinite(v) for _, v in scalars["train/loss"])
    assert max(v for _, v in scalars["diag/logp_mismatch_max"]) <= MISMATCH[run]
    ckpt = torch.load(tmp_path / "run" / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)
    state = ckpt["state_dict"]
    assert state and all(torch.isfinite(t).all() for t in state.values() if t.is_floating_point())
    if run == "fp16":  # the loss scaler is live and checkpointed
        assert math.isfinite(ckpt["MixedPrecision"]["scale"]) and ckpt["MixedPrecision"]["scale"] > 0


@pytest.mark.parametrize("engine", ENGINES)
def test_gpu_resume_puts_the_state_back_on_the_gpu(tmp_path, engine):
    """A CUDA run's checkpoint (written from host copies by the background writer) resumes onto the GPU."""
    needs_cuda()
    run_train(tmp_path, "trainer=gpu", f"rollout={engine}", "trainer.max_epochs=1")
    last = tmp_path / "run" / "checkpoints" / "last.ckpt"
    resumed = tmp_path / "resumed"
    run_train(resumed, "trainer=gpu", f"rollout={engine}", "trainer.max_epochs=2", f"ckpt_path={last}")
    assert len(read_scalars(resumed / "run")["rollout/entropy"]) == 1  # only the missing iteration
