"""The wandb and MLflow presets write their local files through a real (tiny) Lightning fit, in the default
test run (the whole training run with every logger at once is tests/integration/test_loggers.py, slow).
wandb runs offline and MLflow uses a file store: nothing leaves the machine."""

from __future__ import annotations

import time
from pathlib import Path

import lightning.pytorch as pl
import pytest
import torch
from omegaconf import OmegaConf

from lit_entropy.train import instantiate_loggers
from tests.helpers import compose_train


class TinyModule(pl.LightningModule):
    """One linear layer fitted on random data; logs one scalar per epoch, as the policy module does."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(2, 1)

    def training_step(self, batch, batch_idx):
        loss = self.layer(batch[0]).pow(2).mean()
        self.log("train/loss", loss, on_step=False, on_epoch=True)
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)

    def train_dataloader(self):
        return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(4, 2)), batch_size=2)


def fit_with(logger_choice: str, out: Path) -> list:
    cfg = compose_train([f"logger={logger_choice}", f"paths.output_dir={out}"])
    loggers = instantiate_loggers(cfg.logger)
    for lg in loggers:  # the full config, as ``build`` logs it
        lg.log_hyperparams(OmegaConf.to_container(cfg, resolve=True))
    trainer = pl.Trainer(max_epochs=2, logger=loggers, accelerator="cpu", devices=1, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(TinyModule())
    for lg in loggers:
        lg.finalize("success")
    return loggers


def test_wandb_offline_writes_its_run_file(tmp_path, monkeypatch):
    wandb = pytest.importorskip("wandb", reason="the wandb extra is not installed")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))  # the settings/cache folder too, not the home folder
    fit_with("wandb", tmp_path)
    wandb.finish()  # what the process's exit does in a run: writes the summary
    runs = list((tmp_path / "wandb").glob("offline-run-*"))
    assert len(runs) == 1, list(tmp_path.rglob("*"))
    data = list(runs[0].glob("run-*.wandb"))
    assert len(data) == 1
    # The run file is a log of protobuf records (what `wandb sync` uploads); metric names appear verbatim. wandb's
    # service process writes it: on a loaded machine the records can land a little after finish() returns.
    deadline = time.monotonic() + 60
    while b"train/loss" not in (raw := data[0].read_bytes()) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert b"train/loss" in raw and b"epoch" in raw


def test_mlflow_file_store_writes_metrics_and_params(tmp_path, monkeypatch):
    pytest.importorskip("mlflow", reason="the mlflow extra is not installed")
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "")  # so that the opt-in the loggers set is undone after
    monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE")
    (lg,) = fit_with("mlflow", tmp_path)
    run_dirs = [p for p in (tmp_path / "mlruns").rglob(lg.run_id) if p.is_dir()]
    assert run_dirs, list((tmp_path / "mlruns").rglob("*"))
    metric = run_dirs[0] / "metrics" / "train" / "loss"
    assert metric.exists(), list(run_dirs[0].rglob("*"))
    rows = metric.read_text().splitlines()
    assert len(rows) == 2  # one value per epoch
    assert (run_dirs[0] / "params" / "seed").read_text() == "0"
