"""``lit-entropy-train`` (lit_entropy.cli.train) in-process: Hydra overrides and flags, a user's config folder on
``hydra.searchpath``, outputs under the current folder, the line it prints once its fit returned."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import yaml
from hydra.core.global_hydra import GlobalHydra
from omegaconf import OmegaConf

from lit_entropy.cli import train as train_cli


@pytest.fixture
def in_tmp(tmp_path, monkeypatch) -> Path:
    """Run from an empty folder outside the repository, with a clean Hydra state after."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", ["lit-entropy-train"])
    monkeypatch.delenv("PROJECT_ROOT", raising=False)
    monkeypatch.delenv("LIT_ENTROPY_CACHE", raising=False)
    yield tmp_path
    GlobalHydra.instance().clear()


def printed_config(capsys, *argv: str) -> dict:
    train_cli.main(["--cfg", "job", *argv])
    return yaml.safe_load(capsys.readouterr().out)


def test_train_takes_the_scripts_overrides_from_any_folder(in_tmp, capsys):
    cfg = printed_config(capsys, "debug=smoke", "callbacks/entropy=none", "seed=3")
    assert cfg["task_name"] == "smoke" and cfg["seed"] == 3 and cfg["trainer"]["max_epochs"] == 3
    assert not cfg["callbacks"]["entropy"]  # the none option: no controller
    assert not any(in_tmp.iterdir())  # --cfg composes and prints; nothing is written


def test_a_user_config_folder_adds_groups_through_hydra_searchpath(in_tmp, capsys):
    mine = in_tmp / "my_conf"
    (mine / "experiment").mkdir(parents=True)
    (mine / "experiment" / "mine.yaml").write_text("# @package _global_\nseed: 123\ntask_name: mine\n")
    (mine / "algo").mkdir()
    (mine / "algo" / "my_grpo.yaml").write_text("defaults:\n  - grpo\neps_high: 0.31\n")
    cfg = printed_config(capsys, f"hydra.searchpath=[file://{mine}]", "experiment=mine", "algo=my_grpo")
    assert cfg["seed"] == 123 and cfg["task_name"] == "mine"
    assert cfg["algo"]["eps_high"] == 0.31


def test_hydra_run_dir_is_relative_to_the_current_folder(in_tmp, capsys):
    train_cli.main(["--cfg", "all"])
    cfg = OmegaConf.create(capsys.readouterr().out)
    assert OmegaConf.select(cfg, "hydra.run.dir").startswith("./logs/train/runs/")  # paths.root_dir = .
    assert OmegaConf.select(cfg, "paths.cache_dir") == "./.cache/lit_entropy"
    assert cfg.hydra.job.name == "train"  # as when scripts/train.py held the task function


def test_the_train_cli_prints_the_end_line_once_its_fit_returned(in_tmp, monkeypatch, capsys):
    """scripts/train.py's task prints :data:`~lit_entropy.cli.train.FIT_FINISHED` after ``run`` returns, and not
    when it raises."""
    import lit_entropy.train

    monkeypatch.setattr(lit_entropy.train, "run", lambda cfg: {"rollout/entropy": 0.5, "rollout/accuracy": 0.25})
    train_cli.main(["debug=smoke", f"hydra.run.dir={in_tmp / 'run'}"])
    out = capsys.readouterr().out
    assert "final rollout/entropy = 0.5000" in out and out.rstrip().endswith(train_cli.FIT_FINISHED)

    def stopped(cfg):
        raise SystemExit(0)

    monkeypatch.setattr(lit_entropy.train, "run", stopped)
    with pytest.raises(SystemExit):
        train_cli.main(["debug=smoke", f"hydra.run.dir={in_tmp / 'run2'}"])
    assert train_cli.FIT_FINISHED not in capsys.readouterr().out
