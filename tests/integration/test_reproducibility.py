"""Seeded runs reproduce exactly: the default run, shortened to a few iterations, twice in fresh processes.

Default sizes throughout (128 prompts x G = 8, four minibatches, 128-row micro-batches, vLLM, the default
callbacks with their background checkpoint writes): only ``trainer.max_epochs`` is cut. Every TensorBoard
scalar except ``time/*`` must be equal to the last bit at every step. The cheap guard for the cause found
(the shared-prompt gather's backward) is ``tests/unit/policy/test_prefix.py``.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import ROOT, read_scalars

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ITERATIONS = 2


def train(run: Path) -> dict[str, list[tuple[int, float]]]:
    cmd = [sys.executable, str(ROOT / "scripts" / "train.py"), f"trainer.max_epochs={ITERATIONS}",
           "task_name=reproducibility", f"paths.log_dir={run.parent}", f"hydra.run.dir={run}"]
    proc = subprocess.run(cmd, cwd=ROOT, env={**os.environ, "PYTHONUNBUFFERED": "1"}, capture_output=True,
                          text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    return {tag: points for tag, points in read_scalars(run).items() if not tag.startswith("time/")}


def test_two_fresh_default_runs_log_identical_scalars(tmp_path):
    first, second = train(tmp_path / "first"), train(tmp_path / "second")
    assert "train/grad_norm" in first and len(first["train/grad_norm"]) == 4 * ITERATIONS
    assert sorted(first) == sorted(second)
    differing = {tag: next((a, b) for a, b in zip(first[tag], second[tag], strict=True) if a != b)
                 for tag in first if first[tag] != second[tag]}
    assert not differing, f"{len(differing)} of {len(first)} tags differ (first differing point): {differing}"
