"""Each precision end to end on the lab: the first on-policy ratio is exactly 1, fp16 has a live scaler."""

from __future__ import annotations

import math

import pytest
import torch

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("precision", ["fp32", "bf16", "fp16"])
def test_first_step_ratio_is_exactly_one_in_every_precision(tmp_path, harness, capfd, precision):
    run = harness.fit([f"precision={precision}", "rollout=hf", "trainer.max_epochs=1", "batch.num_minibatches=1"],
                      tmp_path)
    scalars = run.scalars
    first = sorted(scalars["train/ratio_mean"])[0][1]
    assert first == 1.0, (precision, first)  # pre-update pass and update under the same autocast
    assert all(math.isfinite(v) for _, v in scalars["train/loss"])
    ckpt = torch.load(run.last_ckpt, map_location="cpu", weights_only=True)
    if precision == "fp16":
        state = ckpt.get("MixedPrecision", {})
        assert state.get("scale", 0) > 0, ckpt.keys()  # the GradScaler's state is checkpointed
        printed = "".join(capfd.readouterr()) + "\n".join(run.warnings)  # what a process prints on stderr
        assert "AMP with fp16 is not supported on CPU" not in printed
