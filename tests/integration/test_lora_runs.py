"""LoRA on the lab end to end: only adapters change, vLLM follows the merged weights, resume restores adapters.

In-process on tests/harness.py (the shared vLLM engine takes the merged weights like any other fit's)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.integration

LAB = ["batch.prompts_per_iter=8", "batch.group_size=4", "rollout.max_new_tokens=16", "reward.mode=inline",
       "rollout.engine.show_progress=false", "callbacks/entropy=adapo", "batch.micro_batch_size=16",
       "model.lora={r: 4, alpha: 8}", "optim.lr=1e-3", "callbacks.checkpoint.keep_iterations=true"]


@pytest.fixture(scope="module")
def full(harness, tmp_path_factory):
    """Three LoRA iterations, shared by both tests (the resume starts from its own iteration-2 checkpoint)."""
    return harness.fit([*LAB, "trainer.max_epochs=3"], tmp_path_factory.mktemp("lora"), smoke=False, name="full")


def test_lora_trains_adapters_only_and_syncs_vllm(full):
    from safetensors.torch import load_file

    scalars = full.scalars
    assert max(v for _, v in scalars["diag/logp_mismatch_max"]) <= 1e-4  # merged weights reach vLLM
    assert all(math.isfinite(v) for _, v in scalars["train/loss"])

    ckpt = torch.load(full.last_ckpt, map_location="cpu", weights_only=True)
    state = ckpt["state_dict"]
    adapters = {k: v for k, v in state.items() if "lora_" in k}
    assert adapters and any(float(v.abs().max()) > 0 for k, v in adapters.items() if "lora_B" in k)
    base = {k.removeprefix("model.base_model.model.").replace(".base_layer.", "."): v
            for k, v in state.items() if "lora_" not in k}
    start = load_file(str(Path(full.module.policy_path) / "model.safetensors"))  # the warm start it began from
    assert set(start) <= set(base), "the warm start's weight names are not the base model's"
    assert all(torch.equal(base[k], v) for k, v in start.items())  # every base weight is exactly the warm start


@pytest.mark.slow
def test_lora_resume_restores_adapters_bit_for_bit(full, harness, tmp_path):
    resumed = harness.fit([*LAB, "trainer.max_epochs=3", f"ckpt_path={full.ckpt(2)}"], tmp_path, smoke=False)
    for tag in ("rollout/entropy", "control/eps_high"):
        assert resumed.scalars[tag] == full.scalars[tag][2:], tag
