"""Weights & Biases (offline) and MLflow (local file store) beside TensorBoard: one real run (in-process,
tests/harness.py) writes all three."""

from __future__ import annotations

from pathlib import Path

import pytest
from omegaconf import OmegaConf

from tests.helpers import compose_train, read_scalars

pytestmark = pytest.mark.integration

TINY = ["trainer.max_epochs=2", "batch.prompts_per_iter=4", "batch.group_size=4", "rollout.max_new_tokens=8",
        "reward.mode=inline", "rollout.engine.show_progress=false", "batch.micro_batch_size=16"]


def test_logger_list_composes_every_chosen_logger():
    cfg = compose_train(["logger=[tensorboard,wandb,mlflow]"])
    logger = OmegaConf.to_container(cfg.logger, resolve=False)  # output_dir resolves only inside a run
    assert list(logger) == ["tensorboard", "wandb", "mlflow"]
    assert logger["wandb"]["offline"] is True
    assert logger["mlflow"]["tracking_uri"] == "file:${paths.output_dir}/mlruns"


@pytest.mark.slow  # one real run with wandb's and MLflow's clients
def test_wandb_offline_and_mlflow_file_store_write_their_metrics(tmp_path, harness, monkeypatch):
    wandb = pytest.importorskip("wandb", reason="the wandb extra is not installed")
    pytest.importorskip("mlflow", reason="the mlflow extra is not installed")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    try:
        run = harness.fit([*TINY, "logger=[mlflow,wandb,tensorboard]"], tmp_path, smoke=False).run_dir
    finally:
        wandb.finish()  # a process would end its wandb run on exit

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
