"""The console entry points in-process: the config tree they find, Hydra overrides and flags, a user's
config folder on ``hydra.searchpath``, outputs under the current folder, and the compare figure."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import yaml
from hydra.core.global_hydra import GlobalHydra
from omegaconf import OmegaConf

from lit_entropy.cli import config_dir
from lit_entropy.cli import train as train_cli
from tests.helpers import CONF


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


def test_config_dir_is_the_checkouts_conf_folder():
    assert config_dir() == CONF.resolve()


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


def test_eval_rejects_flags_with_a_hint():
    from lit_entropy.cli.evaluate import main as eval_main

    with pytest.raises(SystemExit, match="Hydra overrides"):
        eval_main(["--n", "16"])


class RecordingAxes:
    """Records what is drawn on it, as far as the entropy panel's extras go."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, tuple]] = []

    def fill_between(self, *args, **kwargs) -> None:
        self.calls.append(("band", args))

    def plot(self, *args, **kwargs) -> None:
        self.calls.append(("target", args))


def test_the_entropy_panel_shows_the_controllers_band_or_target():
    from lit_entropy.analysis.compare import draw_controller_aim

    epoch_of = {1: 0.0, 3: 1.0}
    band = {"control/band_low": [(1, 0.45), (3, 0.44)], "control/band_high": [(1, 0.55), (3, 0.54)]}
    ax = RecordingAxes()
    draw_controller_aim(ax, band, epoch_of, "C0")
    assert ax.calls == [("band", ([1.0, 2.0], [0.45, 0.44], [0.55, 0.54]))]  # against the iteration (epoch + 1)
    ax = RecordingAxes()
    draw_controller_aim(ax, {"control/target_entropy": [(1, 0.5), (3, 0.5)]}, epoch_of, "C0")
    assert ax.calls == [("target", ([1.0, 2.0], [0.5, 0.5]))]
    # A run with the `iteration` marker logged its band at the iteration already: its steps are used as they are.
    ax = RecordingAxes()
    draw_controller_aim(ax, {**band, "iteration": [(1, 1.0), (3, 3.0)]}, {1: 5.0, 3: 7.0}, "C0")
    assert ax.calls == [("band", ([1, 3], [0.45, 0.44], [0.55, 0.54]))]
    ax = RecordingAxes()
    draw_controller_aim(ax, {}, epoch_of, "C0")
    assert ax.calls == []


def test_compare_writes_one_named_figure_of_a_run(tmp_path, capsys):
    from torch.utils.tensorboard import SummaryWriter

    from lit_entropy.cli.compare import main as compare_main

    run = tmp_path / "runs" / "r"
    writer = SummaryWriter(log_dir=str(run / "tensorboard"))
    for it in range(4):
        writer.add_scalar("epoch", it, it)
        for tag, value in (("rollout/entropy", 0.5 - 0.02 * it), ("rollout/accuracy", 0.2 + 0.05 * it),
                           ("control/band_low", 0.45 - 0.01 * it), ("control/band_high", 0.55 - 0.01 * it)):
            writer.add_scalar(tag, value, it)
    writer.close()
    out = tmp_path / "img"
    assert compare_main([str(run), "--metrics", "rollout/entropy,rollout/accuracy", "--out", str(out),
                         "--name", "default_run", "--title", "The default run"]) == 0
    assert (out / "default_run.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "| r |" in (out / "default_run.md").read_text()
    assert "wrote" in capsys.readouterr().out
