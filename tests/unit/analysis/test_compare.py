"""scripts/compare.py and scripts/study_table.py on tiny fake runs, and lit_entropy.analysis: the runs found and
labelled, the comparison figure and its pieces. scripts/fit_entropy_law.py: test_entropy_law_fit.py."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from lit_entropy.analysis.runs import find_runs, read_scalars, run_labels

ROOT = Path(__file__).resolve().parents[3]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
A, B = 0.3, 0.9


def fake_run(path: Path, overrides: list[str], h0: float, iters: int = 12, steps_per_iter: int = 2) -> Path:
    """A Hydra-like run folder: .hydra/overrides.yaml and TensorBoard events laid out as the module logs them."""
    from torch.utils.tensorboard import SummaryWriter

    (path / ".hydra").mkdir(parents=True)
    (path / ".hydra" / "overrides.yaml").write_text("".join(f"- {o}\n" for o in overrides))
    writer = SummaryWriter(log_dir=str(path / "tensorboard"))
    for it in range(iters):
        for k in range(steps_per_iter):
            step = it * steps_per_iter + k
            writer.add_scalar("train/loss", 1.0 / (1 + step), step)
            writer.add_scalar("epoch", it, step)
        end = (it + 1) * steps_per_iter - 1
        h = h0 - 0.05 * it
        writer.add_scalar("rollout/entropy", h, end)
        writer.add_scalar("rollout/accuracy", -A * math.exp(h) + B, end)
    writer.close()
    return path


def two_fake_runs(root: Path) -> list[Path]:
    """Two fake runs under ``root`` (a multirun folder): no controller, and ADAPO with three steps an iteration."""
    return [
        fake_run(root / "0", ["task_name=t", "callbacks/entropy=none"], h0=0.9),
        fake_run(root / "1", ["task_name=t", "callbacks/entropy=adapo"], h0=0.8, steps_per_iter=3),
    ]


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> list[Path]:
    return two_fake_runs(tmp_path_factory.mktemp("multirun"))


def script(name: str, *args: str | Path) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / name), *map(str, args)],
                          capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    return proc


def is_png(path: Path) -> bool:
    return path.is_file() and path.read_bytes()[:8] == PNG_MAGIC


def test_tb_reader_and_run_discovery(runs):
    root = runs[0].parent
    assert find_runs([root]) == runs
    assert find_runs([runs[1], runs[0], runs[0]]) == runs
    s = read_scalars(runs[1])
    assert [p[0] for p in s["rollout/entropy"]] == [3 * i + 2 for i in range(12)]
    assert s["rollout/entropy"][0][1] == pytest.approx(0.8)
    assert run_labels(runs) == {runs[0]: "callbacks/entropy=none", runs[1]: "callbacks/entropy=adapo"}


def test_find_runs_without_hydra(tmp_path):
    from torch.utils.tensorboard import SummaryWriter

    for name in ("version_0", "version_1"):
        w = SummaryWriter(log_dir=str(tmp_path / "lightning_logs" / name))
        w.add_scalar("x", 1.0, 0)
        w.close()
    assert [p.name for p in find_runs([tmp_path])] == ["version_0", "version_1"]
    assert find_runs([tmp_path / "lightning_logs" / "version_0"]) == [tmp_path / "lightning_logs" / "version_0"]
    with pytest.raises(FileNotFoundError):
        find_runs([tmp_path / "missing"])


def test_compare_script(runs, tmp_path):
    out = tmp_path / "cmp"
    proc = script("compare.py", runs[0].parent, "--metrics", "rollout/entropy,rollout/accuracy,train/loss",
                  "--smooth", "3", "--out", out)
    assert is_png(out / "compare.png")
    md = (out / "compare.md").read_text()
    rows = [line for line in md.splitlines() if line.startswith("| ") and "---" not in line][1:]
    assert len(rows) == 2
    assert "callbacks/entropy=none" in rows[0] and "callbacks/entropy=adapo" in rows[1]
    # run 0: entropy 0.9 → 0.35 over 12 iterations (final only: no best); accuracy best = max; train/loss best = min
    head = [c.strip() for c in md.splitlines()[0].strip("|").split("|")]
    assert head[2:] == ["rollout/entropy final", "rollout/accuracy final", "rollout/accuracy best",
                        "train/loss final", "train/loss best"]
    cells = [c.strip() for c in rows[0].strip("|").split("|")]
    assert float(cells[2]) == pytest.approx(0.35, abs=1e-3)
    assert float(cells[4]) == pytest.approx(-A * math.exp(0.35) + B, abs=1e-3)  # the last iteration's, the highest
    assert float(cells[5]) == pytest.approx(1 / 24, rel=1e-3) and float(cells[6]) == pytest.approx(1 / 24, rel=1e-3)
    assert md.splitlines()[0] in proc.stdout


def test_compare_places_runs_with_the_iteration_marker_at_their_steps_and_older_runs_through_epoch():
    from lit_entropy.analysis.compare import by_iteration

    # As the module logs now (lit_entropy/utils/log_steps.py): 3 iterations of 2 optimizer steps, eval at start and after 3.
    new = {"iteration": [(1, 1.0), (2, 2.0), (3, 3.0)], "epoch": [(s, float(s // 2)) for s in range(6)],
           "rollout/entropy": [(1, 0.5), (2, 0.4), (3, 0.3)], "train/loss_epoch": [(1, 1.0), (2, 0.9), (3, 0.8)],
           "eval/pass@1": [(0, 0.1), (3, 0.3)], "train/loss": [(s, 1.0 / (1 + s)) for s in range(6)]}
    assert by_iteration("rollout/entropy", new) == new["rollout/entropy"]  # not through `epoch` (steps 1, 2: epoch 0, 1)
    assert by_iteration("train/loss_epoch", new) == new["train/loss_epoch"]
    assert by_iteration("eval/pass@1", new) == new["eval/pass@1"]
    assert by_iteration("train/loss", new) is None  # per optimizer step
    # The same run logged before the marker: every value at the optimizer step, per-iteration ones at the epoch's
    # last step; it lands on the same iterations.
    old = {"epoch": new["epoch"], "rollout/entropy": [(1, 0.5), (3, 0.4), (5, 0.3)],
           "eval/pass@1": [(0, 0.1), (5, 0.3)], "train/loss": new["train/loss"]}
    for metric in ("rollout/entropy", "eval/pass@1"):
        assert by_iteration(metric, old) == by_iteration(metric, new), metric
    assert by_iteration("train/loss", old) is None
    # One optimizer step per iteration: train/* has as many points as iterations and is still per step.
    one = {"iteration": [(1, 1.0), (2, 2.0)], "train/loss": [(0, 1.0), (1, 0.5)], "rollout/entropy": [(1, 0.5), (2, 0.4)]}
    assert by_iteration("train/loss", one) is None and by_iteration("rollout/entropy", one) == one["rollout/entropy"]


def test_study_table_names_controllers_with_their_mode_and_scores_the_second_half(tmp_path):
    entrocraft = {"_target_": "lit_entropy.callbacks.entrocraft.EntrocraftCallback"}
    configs = {
        "0": {"callbacks": {"entropy": {**entrocraft, "mode": "hard"}}},
        "1": {"callbacks": {"entropy": {**entrocraft, "mode": "paper"}}},
        "2": {"callbacks": {"entropy": {"_target_": "lit_entropy.callbacks.repo.REPOCallback", "variant": "r"}}},
        "3": {"callbacks": {"entropy": None}},
    }
    for name, cfg in configs.items():
        run = fake_run(tmp_path / name, [], h0=0.9)  # entropy 0.9, 0.85, ... 0.35 over 12 iterations
        (run / ".hydra" / "config.yaml").write_text(json.dumps(cfg))  # JSON is YAML
    out = tmp_path / "study.md"
    table = script("study_table.py", tmp_path, "--target", "0.5", "--out", out).stdout
    assert out.read_text().strip() == table.strip()
    for label in ("EntrocraftCallback (hard)", "EntrocraftCallback (paper)", "REPOCallback (r)", "| none |"):
        assert label in table
    second_half = [0.9 - 0.05 * it for it in range(6, 12)]
    mae = sum(abs(h - 0.5) for h in second_half) / 6
    assert f"| {mae:.4f} |" in table and table.count("| 12 |") == 4


def test_compare_helpers_pick_best_smooth_and_reindex_by_iteration():
    from lit_entropy.analysis.compare import against_iteration, best, moving_average

    assert best("train/loss", [3.0, 1.0, math.nan]) == 1.0 and best("rollout/accuracy", [0.1, 0.4]) == 0.4
    assert math.isnan(best("rollout/accuracy", [math.nan]))
    assert math.isnan(best("rollout/entropy", [0.5, 0.9])) and math.isnan(best("rollout/response_len_mean", [3.0]))
    assert best("eval/held_out/sampled/pass@8", [0.2, 0.5]) == 0.5 and best("control/band_error", [0.2, 0.1]) == 0.1
    assert moving_average([1.0, 2.0, 3.0, 4.0], 2) == [1.0, 1.5, 2.5, 3.5]
    # A run logged before the `iteration` marker: a value written in epoch e is iteration e + 1.
    assert against_iteration([(1, 5.0), (3, 6.0)], {1: 0, 3: 1}) == [(1, 5.0), (2, 6.0)]
    assert against_iteration([(0, 5.0), (1, 6.0)], {0: 0, 1: 0}) is None  # two values in one iteration: per step
    # ...but an eval metric's value at step 0, before epoch 0 ended, is the evaluation at start: iteration 0.
    epochs = {0: 0, 1: 0, 2: 1, 3: 1}
    assert against_iteration([(0, 0.2), (3, 0.4)], epochs, at_start=True) == [(0, 0.2), (2, 0.4)]
    assert against_iteration([(0, 0.2), (3, 0.4)], epochs) == [(1, 0.2), (2, 0.4)]


def hydra_run(path: Path, task_name: str, controller: str, seed: int) -> Path:
    """A run folder as Hydra writes it: the composed config, its choices and overrides that name the task only."""
    from tests.helpers import compose_train

    fake_run(path, [f"task_name={task_name}"], h0=0.9, iters=3)
    cfg = compose_train([f"callbacks/entropy={controller}", f"seed={seed}", f"task_name={task_name}"])
    (path / ".hydra" / "config.yaml").write_text(OmegaConf.to_yaml(cfg))
    choices = {"algo": "grpo", "callbacks/entropy": controller, "hydra/launcher": "basic", "paths": "default"}
    (path / ".hydra" / "hydra.yaml").write_text(OmegaConf.to_yaml({"hydra": {"runtime": {"choices": choices}}}))
    return path


def test_runs_are_labelled_by_the_settings_that_differ_not_their_task_name(tmp_path):
    a = hydra_run(tmp_path / "a", "mine_a", "none", 0)
    b = hydra_run(tmp_path / "b", "mine_b", "adapo", 0)
    assert run_labels([a, b]) == {a: "callbacks/entropy=none", b: "callbacks/entropy=adapo"}
    c = hydra_run(tmp_path / "c", "mine_c", "none", 1)
    assert run_labels([a, c]) == {a: "seed=0", c: "seed=1"}


def test_the_figure_reads_integer_ticks_markers_and_a_labelled_band(tmp_path, monkeypatch):
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    from lit_entropy.analysis.compare import compare_runs

    figures = []
    monkeypatch.setattr(Figure, "savefig", lambda self, *a, **k: figures.append(self))
    runs = []
    for name, controller in (("a", "none"), ("b", "entrocraft_hard")):
        run = hydra_run(tmp_path / name, "t", controller, 0)
        if controller != "none":
            from torch.utils.tensorboard import SummaryWriter

            writer = SummaryWriter(log_dir=str(run / "tensorboard" / "band"))
            for it in range(3):
                writer.add_scalar("control/band_low", 0.4, it * 2 + 1)
                writer.add_scalar("control/band_high", 0.6, it * 2 + 1)
                writer.add_scalar("epoch", it, it * 2 + 1)
            writer.close()
        runs.append(run)
    _, missing = compare_runs(runs, ["rollout/entropy", "rollout/acuracy"], 1, tmp_path / "out")
    assert len(missing) == 1 and missing[0].startswith("no run logged 'rollout/acuracy'; did you mean rollout/accuracy")
    (fig,) = figures
    ax = fig.axes[0]
    assert isinstance(ax.xaxis.get_major_locator(), MaxNLocator) and ax.xaxis.get_major_locator()._integer
    markers = [line.get_marker() for line in ax.get_lines() if line.get_label().startswith("callbacks")]
    assert len(markers) == 2 and len(set(markers)) == 2  # each run its own shape
    legend = [t.get_text() for t in fig.legends[0].get_texts()]
    assert "callbacks/entropy=entrocraft_hard: band" in legend, legend


def test_the_compare_help_is_whole():
    proc = script("compare.py", "--help")
    assert "Runs are labelled by what differs" in proc.stdout and "nearest tags" in proc.stdout


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
