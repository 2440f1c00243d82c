"""Weights & Biases (offline) and MLflow (local file store) beside TensorBoard: one real run writes all three."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from tests.helpers import ROOT, compose_train, read_scalars

pytestmark = pytest.mark.integration

TINY = ["trainer.max_epochs=2", "batch.prompts_per_iter=4", "batch.group_size=4", "rollout.max_new_tokens=8",
        "reward.mode=inline", "rollout.engine.show_progress=false", "batch.micro_batch_size=16"]


def test_logger_list_composes_every_chosen_logger():
    cfg = compose_train(["logger=[tensorboard,wandb,mlflow]"])
    logger = OmegaConf.to_container(cfg.logger, resolve=False)  # output_dir resolves only inside a run
    assert list(logger) == ["tensorboard", "wandb", "mlflow"]
    assert logger["wandb"]["offline"] is True
    assert logger["mlflow"]["tracking_uri"] == "file:${paths.output_dir}/mlruns"


@pytest.mark.slow  # one real run, ~75 s on a loaded 2-core machine
def test_wandb_offline_and_mlflow_file_store_write_their_metrics(tmp_path):
    pytest.importorskip("wandb", reason="the wandb extra is not installed")
    pytest.importorskip("mlflow", reason="the mlflow extra is not installed")
    run = tmp_path / "run"
    cmd = [sys.executable, str(ROOT / "scripts" / "train.py"), *TINY, "logger=[mlflow,wandb,tensorboard]",
           f"paths.log_dir={tmp_path}", f"hydra.run.dir={run}"]
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "WANDB_MODE": "offline", "WANDB_SILENT": "true"}
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]

    wandb_files = list((run / "wandb").glob("offline-run-*/run-*.wandb"))
    assert wandb_files and wandb_files[0].stat().st_size > 0, sorted(p.name for p in run.rglob("*"))
    assert b"rollout/entropy" in wandb_files[0].read_bytes()

    metric = [p for p in (run / "mlruns").rglob("metrics/rollout/entropy") if p.is_file()]
    assert metric, sorted(str(p.relative_to(run)) for p in (run / "mlruns").rglob("*"))
    rows = metric[0].read_text().split()
    assert len(rows) >= 2 * 3  # timestamp, value, step per iteration

    # TensorBoard is last in the list and still gets its scalars and the text samples.
    assert "rollout/entropy" in read_scalars(run)
    assert any(Path(run, "tensorboard").glob("events.out.tfevents.*"))
