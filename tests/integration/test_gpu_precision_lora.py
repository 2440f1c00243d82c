"""CUDA versions of the precision and LoRA checks (``gpu``-marked: skipped without a GPU)."""

from __future__ import annotations

import math

import pytest
import torch

from tests.helpers import read_scalars
from tests.integration.test_train_smoke import run_train

pytestmark = [pytest.mark.integration, pytest.mark.gpu]


@pytest.mark.parametrize("overrides", [["precision=bf16"], ["precision=fp16"], ["model.lora={r: 4, alpha: 8}"]],
                         ids=["bf16", "fp16", "lora"])
def test_gpu_lab_run(tmp_path, overrides):
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    run_train(tmp_path, "trainer=gpu", "rollout=vllm", "trainer.max_epochs=2", *overrides)
    scalars = read_scalars(tmp_path / "run")
    assert sorted(scalars["train/ratio_mean"])[0][1] == pytest.approx(1.0, abs=1e-6)
    assert all(math.isfinite(v) for _, v in scalars["train/loss"])
    bound = 1e-4 if "lora" in overrides[0] else 1.0  # bf16/fp16 kernels differ between vLLM and the trainer
    assert max(v for _, v in scalars["diag/logp_mismatch_max"]) <= bound
