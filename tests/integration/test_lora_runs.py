"""LoRA on the lab end to end: only adapters change, vLLM follows the merged weights, resume restores adapters."""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.helpers import ROOT, read_scalars

pytestmark = pytest.mark.integration

LAB = ["batch.prompts_per_iter=8", "batch.group_size=4", "rollout.max_new_tokens=16", "reward.mode=inline",
       "rollout.engine.show_progress=false", "callbacks/entropy=adapo", "batch.micro_batch_size=16",
       "model.lora={r: 4, alpha: 8}", "optim.lr=1e-3"]


def _train(run: Path, *overrides: str) -> None:
    cmd = [sys.executable, str(ROOT / "scripts" / "train.py"), *LAB, f"paths.log_dir={run.parent}",
           f"hydra.run.dir={run}", *overrides]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]


def test_lora_trains_adapters_only_and_syncs_vllm(tmp_path):
    from safetensors.torch import load_file

    _train(tmp_path / "full", "trainer.max_epochs=3")
    scalars = read_scalars(tmp_path / "full")
    assert max(v for _, v in scalars["diag/logp_mismatch_max"]) <= 1e-4  # merged weights reach vLLM
    assert all(math.isfinite(v) for _, v in scalars["train/loss"])

    ckpt = torch.load(tmp_path / "full" / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)
    state = ckpt["state_dict"]
    adapters = {k: v for k, v in state.items() if "lora_" in k}
    assert adapters and any(float(v.abs().max()) > 0 for k, v in adapters.items() if "lora_B" in k)
    cache = ROOT / ".cache" / "lit_entropy" / "warmstart"
    base = {k.removeprefix("model.base_model.model.").replace(".base_layer.", "."): v
            for k, v in state.items() if "lora_" not in k}
    match = [f for f in cache.glob("*/model.safetensors") if set(load_file(str(f))) <= set(base)]
    assert match, "no warm-start checkpoint with these weight names"
    unchanged = [all(torch.equal(base[k], v) for k, v in load_file(str(f)).items()) for f in match]
    assert any(unchanged)  # every base weight is exactly the warm start: only the adapters trained


@pytest.mark.slow
def test_lora_resume_restores_adapters_bit_for_bit(tmp_path):
    _train(tmp_path / "full", "trainer.max_epochs=3")
    scalars = read_scalars(tmp_path / "full")
    _train(tmp_path / "part", "trainer.max_epochs=2")
    ckpt_path = tmp_path / "part" / "checkpoints" / "last.ckpt"
    _train(tmp_path / "resumed", "trainer.max_epochs=3", f"ckpt_path={ckpt_path}")
    resumed = read_scalars(tmp_path / "resumed")
    for tag in ("rollout/entropy", "control/eps_high"):
        assert resumed[tag] == scalars[tag][2:], tag
