"""The tuning protocol (studies/protocol.py, conf/protocol/collapse.yaml, scripts/study.py --protocol):
its grids are the issue's, every cell's overrides are real config keys, tuning picks by the declared criterion,
evaluation judges the picks on fresh seeds."""

from __future__ import annotations

import contextlib
import importlib.util
import io
import json
import shutil
from pathlib import Path

import pytest
from torch.utils.tensorboard import SummaryWriter

from studies.method_study import run_dir
from studies.protocol import current_tuning_points, evaluation_points, load_protocol, pick, picked_points
from studies.protocol_phases import evaluation_report, tuning_table
from studies.protocol_preview import check_points, dry_run
from tests.helpers import CONF, ROOT

COLLAPSE = CONF / "protocol" / "collapse.yaml"
TINY = """
name: tiny
iterations: 2
eval: {every: 2, n: 8, ks: [1, 8], problems: 4}
tuning_seeds: [10, 11]
evaluation_seeds: [0, 1, 2]
min_evaluation_seeds: 3
criterion: [pass@1, pass@8]
claims: [{metric: pass@8, direction: higher}]
methods:
  grpo: {grid: {optim.lr: [1.0e-4, 2.0e-4]}}
  clip_cov: {grid: {algo.selection_args.rho: [0.01, 0.05]}}
"""


def _tiny(tmp_path: Path, text: str = TINY):
    f = tmp_path / "tiny.yaml"
    f.write_text(text)
    return load_protocol(f)


def _picks(*chosen: tuple[str, object]) -> dict:
    """A picks.json for the given (method, point) pairs, as tuning writes it."""
    return {"methods": {m: {"point": pt.name, "algo": pt.algo, "controller": pt.controller,
                            "overrides": list(pt.overrides), "setting": pt.setting} for m, pt in chosen}}


def _run(folder: Path, p1: float, p8: float, masked: float | None = None) -> None:
    writer = SummaryWriter(str(folder / "tensorboard"))
    for i in range(2):
        writer.add_scalar("rollout/entropy", 0.3, i)
        writer.add_scalar("rollout/accuracy", 0.2, i)
        if masked is not None:
            writer.add_scalar("train/masked_frac_clip_cov", masked, i)
    writer.add_scalar("eval/pass@1", p1, 2)
    writer.add_scalar("eval/pass@8", p8, 2)
    writer.close()


def test_the_collapse_protocol_has_the_issues_grids_and_fresh_evaluation_seeds() -> None:
    p = load_protocol(COLLAPSE)
    grids = {name: {k: v for k, v in m.grid.items()} for name, m in p.methods.items()}
    assert grids["clip_cov"] == {"algo.selection_args.rho": [2e-3, 1e-2, 5e-2]}
    assert grids["kl_cov"] == {"algo.selection_args.k": [1e-2, 5e-2], "algo.selection_args.beta": [1.0, 5.0, 20.0]}
    assert grids["repo_r"] == {"callbacks.entropy.lam_max": [0.5, 1.0]}
    assert "callbacks.entropy.lam_min=0.01" in p.methods["repo_r"].fixed
    assert (p.methods["adapo"].algo, p.methods["adapo"].fixed) == ("dapo", ["batch.ppo_epochs=2"])
    assert grids["adapo"] == {"callbacks.entropy.eps_max": [0.4, 0.8]}
    assert grids["entrocraft"] == {"callbacks.entropy.gamma": [3.0, 10.0]}
    assert grids["clip_b"] == {"algo.selection_args.mu": [1.5, 2.0, 2.5, 3.0]}
    assert grids["grpo"] == {"optim.lr": [2.5e-4, 5e-4, 1e-3]}
    assert grids["cispo"] == {"algo.eps_high": [2.0, 4.0]} and not p.methods["sapo"].grid  # the 2026 objectives
    assert grids["stare"] == {"callbacks.entropy.target": [0.3, 0.45], "callbacks.entropy.w": [1.1, 1.5]}
    assert grids["aepo"] == {"callbacks.entropy.target": [0.25, 0.4],
                             "callbacks.entropy.rows_frac": [0.0234375, 0.09375]}
    assert not p.methods["topr"].grid  # issue 50's methods
    assert len(p.all_points()) == 46 and len(p.tuning_seeds) == 2
    assert len(p.tuning_points()) == 36  # the nine one-setting methods are not tuned
    assert len(p.evaluation_seeds) >= 5 and not set(p.tuning_seeds) & set(p.evaluation_seeds)
    assert p.criterion == ["pass@1", "pass@64"] and p.baseline == "grpo"
    assert p.interval.kind == "bootstrap" and p.interval.resamples == 10_000
    assert len({pt.name for pt in p.all_points()}) == 45  # each its own run folder; the control is named like lr 5e-4


def test_every_cell_of_the_collapse_protocol_composes_and_builds() -> None:
    """Each override is a real config key (Hydra refuses others) and each value passes start-up checks."""
    p = load_protocol(COLLAPSE)
    assert check_points(p, p.all_points()) == 46


def test_a_bad_override_fails_the_check_by_point(tmp_path: Path) -> None:
    p = _tiny(tmp_path, TINY.replace("optim.lr:", "optim.learning_rate:"))
    with pytest.raises(ValueError, match="point grpo-learning_rate0.0001"):
        check_points(p, p.tuning_points()[:1])


def test_a_point_that_fails_to_build_names_itself_and_leaves_hydra_clear(monkeypatch) -> None:
    """A value that composes but fails at build time: the point is named, and Hydra's global context is closed
    behind it (a later compose in the process must not find it initialised)."""
    from hydra.core.global_hydra import GlobalHydra

    import lit_entropy.train

    def refuse(*_a, **_k):
        raise RuntimeError("a bad value")

    monkeypatch.setattr(lit_entropy.train, "instantiate_callbacks", refuse)
    p = load_protocol(COLLAPSE)
    with pytest.raises(ValueError, match=f"point {p.tuning_points()[0].name}: a bad value") as err:
        check_points(p, p.tuning_points()[:2])
    assert not GlobalHydra.instance().is_initialized()  # even while the traceback (`err`) holds the check's frame
    assert err.value.__cause__ is not None


@pytest.mark.parametrize("change,match", [
    (("evaluation_seeds: [0, 1, 2]", "evaluation_seeds: [0, 1, 10]"), "also tuning seeds"),
    (("min_evaluation_seeds: 3", "min_evaluation_seeds: 5"), "fewer than min_evaluation_seeds=5"),
    (("criterion: [pass@1, pass@8]", "criterion: [pass@1, pass@64]"), "needs 64 in the tune evaluation's ks"),
    (("name: tiny", "name: tiny\ntune: {eval: {ks: [1]}}"), "pass@8 needs 8 in the tune evaluation's ks"),
    (("name: tiny", "name: tiny\ncolumns: [ho_pass@64]"), "ho_pass@64 needs 64 in the evaluate evaluation's ks"),
    (("name: tiny", "name: tiny\ntune: {length: 3}"), "tune keys \\['length'\\]"),
    (("name: tiny", "name: tiny\ncalibrate: [optim.eps]"), "calibrate \\['optim.eps'\\] are not keys of grpo's grid"),
    (("clip_cov: {grid", "clip_cov: {evaluation_seeds: [0, 1, 10], grid"), "clip_cov.evaluation_seeds \\[0, 1, 10\\]"),
    (("clip_cov: {grid", "clip_cov: {evaluation_seeds: [0, 1], grid"), "must be at least 3 seeds"),
    (("name: tiny", "name: tiny\nseed_claims: [{seed: 3, text: t, method: dapo, metric: h_final, above: 0}]"),
     "seed claim 3 \\(t\\) names \\['dapo'\\], not a method or control"),
    (("name: tiny", "name: tiny\nseed_claims: [{seed: 3, text: t, method: grpo, metric: dh, above: 0}]"),
     "'dh' is not a run-summary column"),
    (("criterion: [pass@1, pass@8]", "criterion: [pass@1, accuracy]"), "not a run-summary column"),
    (("name: tiny", "name: tiny\nseeds: [1]"), "unknown protocol keys \\['seeds'\\]"),
    (("clip_cov: {grid", "clip_cov: {grids"), "methods.clip_cov: unknown keys"),
    (("  grpo: {grid: {optim.lr: [1.0e-4, 2.0e-4]}}\n", ""), "baseline 'grpo' is not one of its methods"),
    (("name: tiny", "name: tiny\ncontrols: [optim.lr=1.0e-4]"), "controls entry 'optim.lr=1.0e-4' is not a list"),
    (("name: tiny", "name: tiny\ncontrols: [[optim.lr]]"), "is not a list of key=value overrides"),
    (("name: tiny", "name: tiny\nrecommend: [pass@1]"), "recommend \\['pass@1'\\] is not a claim of any method"),
])
def test_protocol_errors_name_themselves(tmp_path: Path, change: tuple[str, str], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        _tiny(tmp_path, TINY.replace(*change))


def test_without_declared_claims_the_criterion_is_claimed_higher(tmp_path: Path) -> None:
    p = _tiny(tmp_path, TINY.replace("claims: [{metric: pass@8, direction: higher}]\n", ""))
    assert [(c.metric, c.direction) for c in p.claims_of("clip_cov")] == [("pass@1", "higher"), ("pass@8", "higher")]


def test_tune_picks_by_the_criterion_and_leaves_unfinished_methods_without_a_pick(tmp_path: Path) -> None:
    p = _tiny(tmp_path)
    lo, hi, rho1, rho5 = p.tuning_points()
    assert (lo.name, hi.name, rho1.name) == ("grpo-lr0.0001", "grpo-lr0.0002", "clip_cov-rho0.01")
    for seed in (10, 11):
        _run(run_dir(tmp_path, *lo.cell, seed), 0.2, 0.5)  # criterion 0.35
        _run(run_dir(tmp_path, *hi.cell, seed), 0.3, 0.6)  # criterion 0.45: the pick
        _run(run_dir(tmp_path, *rho1.cell, seed), 0.4, 0.7, masked=0.02)
    _run(run_dir(tmp_path, *rho5.cell, 10), 0.9, 0.9)  # one of two tuning seeds: clip_cov unfinished
    picks = pick(p, tmp_path)
    assert picks["methods"]["grpo"]["point"] == "grpo-lr0.0002"
    assert picks["methods"]["grpo"]["mean"] == pytest.approx(0.45)
    assert picks["methods"]["grpo"]["overrides"] == ["optim.lr=0.0002"]
    assert "clip_cov" not in picks["methods"] and picks["incomplete"]["clip_cov"] == ["clip_cov-rho0.05 seed 11"]
    table = tuning_table(json.loads(json.dumps(picks)))  # as read back from picks.json (seed keys as strings)
    assert "| grpo | optim.lr=0.0002 | 10: 0.450, 11: 0.450 | 0.450 | — | **pick** |" in table
    assert "| clip_cov | — | unfinished: clip_cov-rho0.05 seed 11 | — | — | none |" in table
    with pytest.raises(ValueError, match="no pick for \\['clip_cov'\\]"):
        picked_points(picks, p)
    _run(run_dir(tmp_path, *rho5.cell, 11), 0.1, 0.1)  # finished: its mean 0.5 < rho0.01's 0.55
    picks = pick(p, tmp_path)
    assert picks["methods"]["clip_cov"]["point"] == "clip_cov-rho0.01"
    assert picks["methods"]["clip_cov"]["dose"] == pytest.approx(0.02)


def test_evaluate_judges_the_picks_on_the_evaluation_seeds(tmp_path: Path) -> None:
    p = _tiny(tmp_path)
    picks = _picks(("grpo", p.tuning_points()[1]), ("clip_cov", p.tuning_points()[2]))
    base = [0.40, 0.42, 0.38]
    for seed in (0, 1, 2):
        _run(run_dir(tmp_path, "grpo@grpo-lr0.0002", "none", seed), 0.2, base[seed])
        _run(run_dir(tmp_path, "clip_cov@clip_cov-rho0.01", "none", seed), 0.2, base[seed] + 0.1, masked=0.02)
    report = evaluation_report(p, picks, tmp_path)
    assert report.index("| algo | controller | seeds |") < report.index("**Labelling rule**")
    assert "dose of `clip_cov`" in report
    row = [line for line in report.splitlines() if line.startswith("| clip_cov | algo.selection_args.rho=0.01 |")]
    assert len(row) == 1 and "| +0.100 | [+0.100, +0.100] | **reproduced** |" in row[0]
    assert "With a paired t interval instead of the declared one, no label changes." in report


def _finished_cells(tmp_path: Path):
    """The tiny protocol with GRPO and Clip-Cov picked and three finished evaluation seeds of each (Clip-Cov at 0)."""
    p = _tiny(tmp_path)
    picks = _picks(("grpo", p.tuning_points()[1]), ("clip_cov", p.tuning_points()[2]))
    for seed in (0, 1, 2):
        _run(run_dir(tmp_path, "grpo@grpo-lr0.0002", "none", seed), 0.2, 0.4)
        _run(run_dir(tmp_path, "clip_cov@clip_cov-rho0.01", "none", seed), 0.0, 0.0, masked=0.02)
    return p, picks


def test_the_report_names_the_runs_stopped_as_diverged(tmp_path: Path) -> None:
    p, picks = _finished_cells(tmp_path)
    assert "Stopped as diverged" not in evaluation_report(p, picks, tmp_path)
    writer = SummaryWriter(str(run_dir(tmp_path, "clip_cov@clip_cov-rho0.01", "none", 1) / "tensorboard"))
    writer.add_scalar("stop/diverged", 1.0, 2)
    writer.close()
    report = evaluation_report(p, picks, tmp_path)
    assert "**Stopped as diverged** (`callbacks/stop=diverged`" in report
    assert ": clip_cov-rho0.01 seed 1 after iteration 2." in report


def test_the_report_sums_the_compute_of_the_finished_runs(tmp_path: Path) -> None:
    p, picks = _finished_cells(tmp_path)
    assert "**Compute**" not in evaluation_report(p, picks, tmp_path)  # no run logged its stage times
    writer = SummaryWriter(str(run_dir(tmp_path, "grpo@grpo-lr0.0002", "none", 0) / "tensorboard"))
    for i in range(2):  # 2 iterations of 1800 s: generate 600 + update 1200 (forward lies inside prepare: left out)
        writer.add_scalar("time/generate", 600.0, i)
        writer.add_scalar("time/update", 1200.0, i)
        writer.add_scalar("time/forward", 999.0, i)
    writer.close()
    report = evaluation_report(p, picks, tmp_path)
    assert ": 1 runs, 1.0 lane-hours (grpo-lr0.0002 1.0 h over 1)." in report


def test_a_phase_without_running_reports_the_finished_runs_and_starts_none(tmp_path: Path) -> None:
    """``scripts/study.py --protocol … --summarise-only``: run_phase(run=False) on a study with seed 2 unfinished."""
    from studies.protocol_phases import run_phase

    p = _tiny(tmp_path)
    picks = _picks(("grpo", p.tuning_points()[1]), ("clip_cov", p.tuning_points()[2]))
    (tmp_path / "picks.json").write_text(json.dumps(picks))
    for seed in (0, 1):
        _run(run_dir(tmp_path / "evaluate", "grpo@grpo-lr0.0002", "none", seed), 0.2, 0.4)
        _run(run_dir(tmp_path / "evaluate", "clip_cov@clip_cov-rho0.01", "none", seed), 0.2, 0.5, masked=0.02)
    report = run_phase(p, "evaluate", tmp_path, tmp_path / "no_such_train.py", run=False)
    assert "| clip_cov | algo.selection_args.rho=0.01 | 0.0200 | pass@8 > baseline | 2 | +0.100 |" in report
    assert not run_dir(tmp_path / "evaluate", "grpo@grpo-lr0.0002", "none", 2).exists()  # nothing started
    assert (tmp_path / "evaluate.md").read_text() == report + "\n"


def test_the_report_names_the_labels_the_other_interval_would_change(tmp_path: Path) -> None:
    """Differences +0.30, +0.01, +0.02: every bootstrap mean is > 0 (reproduced), the t interval reaches below 0."""
    p = _tiny(tmp_path)
    picks = _picks(("grpo", p.tuning_points()[1]), ("clip_cov", p.tuning_points()[2]))
    for seed, gain in zip((0, 1, 2), (0.30, 0.01, 0.02), strict=True):
        _run(run_dir(tmp_path, "grpo@grpo-lr0.0002", "none", seed), 0.2, 0.4)
        _run(run_dir(tmp_path, "clip_cov@clip_cov-rho0.01", "none", seed), 0.2, 0.4 + gain, masked=0.02)
    report = evaluation_report(p, picks, tmp_path)
    assert "| clip_cov | algo.selection_args.rho=0.01 | 0.0200 | pass@8 > baseline | 3 | +0.110 |" in report
    assert "these labels change: clip_cov pass@8: reproduced → not reproduced ([-0." in report


def test_dry_run_lists_every_cell_with_its_overrides_and_the_cost(tmp_path: Path) -> None:
    p = load_protocol(COLLAPSE)
    text = dry_run(p, "tune", tmp_path, ROOT / "scripts" / "train.py")
    assert "72 runs (36 cells x 2 seeds)" in text
    assert "(one setting, not tuned: entrocraft_hard, sapo, dppo_tv, dppo_kl, maxrl, lite_ppo, topr, stare_iteration, topr_paper)" in text
    assert "algo=kl_cov callbacks/entropy=none" in text and "algo.selection_args.k=0.05 algo.selection_args.beta=20.0" in text
    assert "algo=dapo callbacks/entropy=adapo" in text and "batch.ppo_epochs=2 callbacks.entropy.eps_max=0.8" in text
    text = dry_run(p, "evaluate", tmp_path, ROOT / "scripts" / "train.py")  # before tuning: one pick per method
    assert "no " in text and "110 runs (22 cells x 5 seeds)" in text
    assert "grpo: control at optim.lr=0.0005" in text


def test_dry_run_counts_the_finished_runs_and_estimates_only_what_is_left(tmp_path: Path) -> None:
    """A study restarted in its folder: the dry run says how far it is and estimates the runs not finished."""
    p = _tiny(tmp_path)
    out = tmp_path / "out"
    points = current_tuning_points(p, out / "tune")
    assert "8 runs (4 cells x 2 seeds), about" in dry_run(p, "tune", out, ROOT / "scripts" / "train.py")
    done = run_dir(out / "tune", *points[0].cell, 10)
    done.mkdir(parents=True)
    (done / "done.json").write_text("{}")
    going = run_dir(out / "tune", *points[1].cell, 10) / "checkpoints"
    going.mkdir(parents=True)
    (going / "last.ckpt").write_text("x")
    (run_dir(out / "tune", *points[2].cell, 10) / "checkpoints").mkdir(parents=True)  # an empty folder: not started
    text = dry_run(p, "tune", out, ROOT / "scripts" / "train.py")
    assert f"in {out / 'tune'}: 1 finished, 1 under way (each resumes from its last checkpoint), 6 not started" in text
    hours = p.seconds(7, "tune") / 3600
    assert f"8 runs (4 cells x 2 seeds), 7 not finished, about {hours:.1f} h on one core" in text


def test_the_script_takes_the_protocol(tmp_path: Path) -> None:
    spec = importlib.util.spec_from_file_location("study_script", ROOT / "scripts" / "study.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert script.main(["--protocol", str(COLLAPSE), "--phase", "tune", "--dry-run", "--out", str(tmp_path)]) == 0
    assert "protocol collapse, phase tune" in out.getvalue() and not (tmp_path / "tune").exists()
    with pytest.raises(SystemExit), contextlib.redirect_stderr(io.StringIO()):
        script.main(["--protocol", str(COLLAPSE), "--dry-run"])  # no phase


def test_a_one_setting_method_is_not_tuned_and_its_setting_is_the_pick(tmp_path: Path) -> None:
    hard = "  hard: {algo: grpo, controller: entrocraft_hard, fixed: ['callbacks.entropy.band.end=[0.1,0.2]']}\n"
    p = _tiny(tmp_path, TINY + "  sapo: {}\n" + hard)
    assert [pt.method for pt in p.tuning_points()] == ["grpo", "grpo", "clip_cov", "clip_cov"]
    assert [pt.name for pt in p.all_points()][-2] == "sapo-preset"
    picks = pick(p, tmp_path)  # no run at all: only the one-setting methods have a pick
    assert list(picks["methods"]) == ["sapo", "hard"] and picks["methods"]["sapo"]["overrides"] == []
    assert "| sapo | preset | one setting: not tuned | — | — | **pick** |" in tuning_table(picks)
    assert "| hard | callbacks.entropy.band.end=[0.1,0.2] | one setting: not tuned |" in tuning_table(picks)


def test_a_control_runs_on_the_evaluation_seeds_and_the_report_rejudges_against_it(tmp_path: Path) -> None:
    """GRPO's pick at lr 2e-4 and a control at 1e-4: clip_cov's +0.1 over the pick is a +0.0 over the control."""
    p = _tiny(tmp_path, TINY + "controls: [[optim.lr=1.0e-4]]\n")
    (control,) = p.control_points()
    assert (control.name, control.overrides, control.setting) == ("grpo-lr0.0001", ("optim.lr=1.0e-4",), "optim.lr=0.0001")
    assert control in p.all_points() and control not in p.tuning_points()
    picks = _picks(("grpo", p.tuning_points()[1]), ("clip_cov", p.tuning_points()[2]))
    for seed, noise in zip((0, 1, 2), (0.0, 0.01, -0.01), strict=True):
        _run(run_dir(tmp_path, "grpo@grpo-lr0.0002", "none", seed), 0.2, 0.4)
        _run(run_dir(tmp_path, "grpo@grpo-lr0.0001", "none", seed), 0.2, 0.5 + noise)
        _run(run_dir(tmp_path, "clip_cov@clip_cov-rho0.01", "none", seed), 0.2, 0.5, masked=0.02)
    report = evaluation_report(p, picks, tmp_path)
    assert "| grpo@grpo-lr0.0001 | none | 3 |" in report  # the control's row in the table
    assert ("Against the control grpo at optim.lr=0.0001 instead of the pick, these labels change: clip_cov pass@8: "
            "reproduced → not reproduced.") in report
    assert "| clip_cov | pass@8 higher | +0.000 | [-0.0" in report
    text = dry_run(p, "evaluate", tmp_path, ROOT / "scripts" / "train.py")
    assert "9 runs (3 cells x 3 seeds)" in text  # before tuning: two picks + the control
    (tmp_path / "picks.json").write_text(json.dumps({"methods": {"grpo": picks["methods"]["grpo"]},
                                                     "incomplete": {"clip_cov": ["clip_cov-rho0.01 seed 100"]}}))
    text = dry_run(p, "evaluate", tmp_path, ROOT / "scripts" / "train.py")  # picked while tuning was unfinished
    assert "9 runs (3 cells x 3 seeds)" in text and "no picks of every method" in text


def test_tuning_has_its_own_length_and_evaluation_and_the_baseline_its_own_seeds(tmp_path: Path) -> None:
    """``tune`` overrides the run length and the evaluation of the tuning runs only; a method's
    ``evaluation_seeds`` add runs for it alone (seed by seed, after every cell's shared seeds)."""
    text = TINY.replace("evaluation_seeds: [0, 1, 2]", "evaluation_seeds: [0, 1, 2]\ntune: {iterations: 5, eval: "
                        "{every: 5, n: 16, problems: 2}}").replace(
        "grpo: {grid", "grpo: {evaluation_seeds: [0, 1, 2, 3, 4], grid")
    p = _tiny(tmp_path, text)
    tune = p.plan(p.tuning_points(), p.tuning_seeds, phase="tune")
    assert (tune.iterations, tune.eval_n, tune.eval_ks, tune.eval_problems, tune.eval_every) == (5, 16, (1, 8), 2, 5)
    assert (p.iterations_of("tune"), p.iterations_of("evaluate")) == (5, 2)
    picks = _picks(("grpo", p.tuning_points()[1]), ("clip_cov", p.tuning_points()[2]))
    plan = p.plan(picked_points(picks, p), p.all_evaluation_seeds())
    assert (plan.iterations, plan.eval_n, plan.eval_ks) == (2, 8, (1, 8))
    assert [(a.split("@")[0], s) for a, _, s in plan.runs()] == [
        ("grpo", 0), ("clip_cov", 0), ("grpo", 1), ("clip_cov", 1), ("grpo", 2), ("clip_cov", 2), ("grpo", 3), ("grpo", 4)]
    text = dry_run(p, "evaluate", tmp_path, ROOT / "scripts" / "train.py")
    assert "8 runs (each cell on its seeds of [0, 1, 2, 3, 4])" in text


def test_a_calibrated_key_of_the_baselines_pick_is_given_to_every_other_method(tmp_path: Path) -> None:
    p = _tiny(tmp_path, TINY.replace("name: tiny", "name: tiny\ncalibrate: [optim.lr]")
              + "  own_lr: {algo: grpo, controller: repo_r, fixed: [optim.lr=3.0e-4]}\n")
    picks = _picks(("grpo", p.tuning_points()[1]), ("clip_cov", p.tuning_points()[2]),
                   ("own_lr", p.methods["own_lr"].points()[0]))
    got = {pt.method: pt.overrides for pt in picked_points(picks, p)}
    assert got == {"grpo": ("optim.lr=0.0002",), "clip_cov": ("optim.lr=0.0002", "algo.selection_args.rho=0.01"),
                   "own_lr": ("optim.lr=3.0e-4",)}  # a method that sets the key keeps its own
    p.controls.append(["precision=fp32"])
    control = evaluation_points(picks, p)[-1]
    assert (control.name, control.overrides) == ("grpo-precisionfp32", ("optim.lr=0.0002", "precision=fp32"))


def test_calibrate_first_tunes_the_others_at_the_baselines_pick_and_picks_from_those_runs_only(tmp_path: Path) -> None:
    p = _tiny(tmp_path, TINY.replace("name: tiny", "name: tiny\ncalibrate: [optim.lr]\ntune: {calibrate_first: true}"))
    lo, hi = p.tuning_points()  # before the baseline's pick: its grid alone
    assert current_tuning_points(p, tmp_path) == [lo, hi]
    _run(run_dir(tmp_path, *p.methods["clip_cov"].points()[0].cell, 10), 0.9, 0.9)  # at the preset's rate: never read
    picks = pick(p, tmp_path)
    assert picks["incomplete"]["clip_cov"] == ["waits for grpo's pick of optim.lr"] and not picks["methods"]
    assert "(then, at grpo's pick of optim.lr: clip_cov; tune.calibrate_first)" in dry_run(
        p, "tune", tmp_path, ROOT / "scripts" / "train.py")
    for seed in (10, 11):
        _run(run_dir(tmp_path, *lo.cell, seed), 0.3, 0.6)  # criterion 0.45: the pick
        _run(run_dir(tmp_path, *hi.cell, seed), 0.2, 0.5)
    points = current_tuning_points(p, tmp_path)
    assert [pt.name for pt in points] == ["grpo-lr0.0001", "grpo-lr0.0002", "clip_cov-rho0.01_lr0.0001",
                                          "clip_cov-rho0.05_lr0.0001"]
    assert points[2].overrides == ("algo.selection_args.rho=0.01", "optim.lr=0.0001")
    picks = pick(p, tmp_path)
    assert picks["methods"]["grpo"]["point"] == "grpo-lr0.0001"
    assert picks["incomplete"]["clip_cov"] == ["clip_cov-rho0.01_lr0.0001 seed 10", "clip_cov-rho0.01_lr0.0001 seed 11",
                                               "clip_cov-rho0.05_lr0.0001 seed 10", "clip_cov-rho0.05_lr0.0001 seed 11"]
    for seed in (10, 11):
        _run(run_dir(tmp_path, *points[2].cell, seed), 0.2, 0.3)
        _run(run_dir(tmp_path, *points[3].cell, seed), 0.4, 0.5)  # the pick; the preset-rate run above scored more
    picks = pick(p, tmp_path)
    assert picks["methods"]["clip_cov"]["point"] == "clip_cov-rho0.05_lr0.0001"
    assert list(picks["methods"]) == ["grpo", "clip_cov"] and not picks["incomplete"]
    got = {pt.method: pt.overrides for pt in picked_points(picks, p)}
    assert got["clip_cov"] == ("algo.selection_args.rho=0.05", "optim.lr=0.0001")  # evaluated at the rate it was tuned at
    with pytest.raises(ValueError, match="tune.calibrate_first needs calibrate"):
        _tiny(tmp_path, TINY.replace("name: tiny", "name: tiny\ntune: {calibrate_first: true}"))


def test_while_tuning_the_evaluation_runs_the_methods_whose_setting_is_final_and_waits_for_the_rest(
        tmp_path: Path) -> None:
    """``--phase evaluate --while-tuning``: nothing before the baseline's calibration; then the baseline and the
    method with nothing to tune, at the calibrated rate, paired seed by seed, while the tuned method waits; no
    picks.json or report until every method has its pick (a finished run shows as a row, no claim), and then the
    phase as usual."""
    from studies.pair_schedule import schedule
    from studies.protocol_phases import MissingPicks, run_phase
    from studies.protocol_preview import phase_points

    train = ROOT / "scripts" / "train.py"
    p = _tiny(tmp_path, TINY.replace("name: tiny", "name: tiny\ncalibrate: [optim.lr]\ntune: {calibrate_first: true}")
              + "  sapo: {}\n")
    out = tmp_path / "study"
    with pytest.raises(MissingPicks, match="grpo has no pick yet"):
        run_phase(p, "evaluate", out, train, run=False, while_tuning=True)
    lo, hi = p.tuning_points()
    for seed in (10, 11):
        _run(run_dir(out / "tune", *lo.cell, seed), 0.3, 0.6)  # the pick
        _run(run_dir(out / "tune", *hi.cell, seed), 0.2, 0.5)
    text = run_phase(p, "evaluate", out, train, run=False, while_tuning=True)
    assert "evaluated while tuning: grpo, sapo (6 runs planned); waiting for their tuning: clip_cov" in text
    assert not (out / "picks.json").exists() and not (out / "evaluate.md").exists()
    points, seeds = phase_points(p, "evaluate", out, while_tuning=True)
    assert [(pt.method, pt.overrides) for pt in points] == [("grpo", ("optim.lr=0.0001",)),
                                                            ("sapo", ("optim.lr=0.0001",))]
    todo = schedule(p.plan(points, seeds), out / "evaluate", points[0].cell, "a machine @ a commit")
    assert [(run[0].partition("@")[0], run[2]) for run in todo] == [(m, k) for k in (0, 1, 2) for m in ("grpo", "sapo")]
    assert "(while tuning: waiting for the tuning of clip_cov)" in dry_run(p, "evaluate", out, train, while_tuning=True)
    assert "Finished so far" not in text
    _run(run_dir(out / "evaluate", *points[0].cell, 0), 0.4, 0.7)  # the first evaluation run: a row, no claim
    text = run_phase(p, "evaluate", out, train, run=False, while_tuning=True)
    assert "**Finished so far: 1 of 6 runs, no claim**" in text and f"| {points[0].name} | 0 | " in text
    assert not (out / "evaluate.md").exists()
    (out / "picks.json").write_text(json.dumps(pick(p, out / "tune")))  # as tuning wrote it, clip_cov unfinished
    for pt in current_tuning_points(p, out / "tune")[2:]:  # clip_cov's grid at the pick: then every method has one
        for seed in (10, 11):
            _run(run_dir(out / "tune", *pt.cell, seed), 0.2, 0.3)
    assert "evaluated while tuning" not in run_phase(p, "evaluate", out, train, run=False, while_tuning=True)
    assert (out / "evaluate.md").is_file()
    assert list(json.loads((out / "picks.json").read_text())["methods"]) == ["grpo", "clip_cov", "sapo"]


def test_while_tuning_goes_with_the_evaluation_phase_only(tmp_path: Path) -> None:
    spec = importlib.util.spec_from_file_location("study_script", ROOT / "scripts" / "study.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    with pytest.raises(SystemExit) as stop, contextlib.redirect_stderr(io.StringIO()) as err:
        script.main(["--protocol", str(COLLAPSE), "--phase", "tune", "--while-tuning", "--out", str(tmp_path)])
    assert stop.value.code == 2 and "--while-tuning goes with --phase evaluate" in err.getvalue()


def test_the_real_lm_protocol_calibrates_the_step_and_every_cell_composes(tmp_path: Path) -> None:
    """conf/protocol/real_lm.yaml: only GRPO's learning rate is tuned (one tuning seed), its pick goes to every
    method and the fp32 control, GRPO gets five evaluation seeds and the rest three, and every cell composes and
    builds on top of experiment=real_lm."""
    p = load_protocol(CONF / "protocol" / "real_lm.yaml")
    assert [pt.name for pt in p.tuning_points()] == ["grpo-lr2e-05", "grpo-lr5e-05"] and p.tuning_seeds == [100]
    assert p.calibrate == ["optim.lr"] and p.seeds_of("grpo") == [0, 1, 2, 3, 4] and p.seeds_of("dapo") == [0, 1, 2]
    assert "callbacks/stop=diverged" in p.overrides  # the amendment: a diverged run stops (docs/real_lm_study.md)
    start = json.loads((ROOT / p.start).read_text())  # the base model's evaluation, the figure's iteration 0
    assert 0 < start["eval/held_out/sampled/pass@1"] < start["eval/held_out/sampled/pass@64"] <= 1
    tune = p.plan(p.tuning_points(), p.tuning_seeds, phase="tune")
    assert (tune.eval_final_n, tune.eval_final_ks) == (8, (1, 8))
    picks = pick(p, tmp_path)  # no tuning run yet: the one-setting methods only
    picks["methods"]["grpo"] = {"point": "grpo-lr2e-05", "algo": "grpo", "controller": "none",
                                "overrides": ["optim.lr=2.0e-05"], "setting": "optim.lr=2.0e-05"}
    points = evaluation_points(picks, p)
    assert all("optim.lr=2.0e-05" in pt.overrides for pt in points)
    assert points[-1].overrides[-2:] == ("precision=fp32", "correction=none")
    plan = p.plan(points, p.all_evaluation_seeds())
    assert (plan.eval_final_n, plan.eval_final_ks, plan.iterations) == (64, (1, 8, 64), 60)
    assert len(plan.runs()) == 5 + 9 * 3 + 5  # GRPO and its control on five seeds, the other nine on three (STARE since issue 50)
    assert check_points(p, points) == len(points)


def test_the_evaluation_report_judges_the_seed_claims_with_the_protocols_interval(tmp_path: Path) -> None:
    """A level claim on the baseline and a comparison of a method with the control, in the report's last table."""
    text = TINY + "controls: [[optim.lr=1.0e-4]]\nseed_claims:\n" + (
        "  - {seed: '001', text: grpo above a level, method: grpo, metric: pass@8, above: 0.3}\n"
        "  - {seed: '004', text: clip_cov over the control, method: clip_cov, versus: grpo-lr0.0001, metric: pass@8}\n")
    p = _tiny(tmp_path, text)
    picks = _picks(("grpo", p.tuning_points()[1]), ("clip_cov", p.tuning_points()[2]))
    for seed, noise in zip((0, 1, 2), (0.0, 0.01, -0.01), strict=True):
        _run(run_dir(tmp_path, "grpo@grpo-lr0.0002", "none", seed), 0.2, 0.4 + noise)
        _run(run_dir(tmp_path, "grpo@grpo-lr0.0001", "none", seed), 0.2, 0.45)
        _run(run_dir(tmp_path, "clip_cov@clip_cov-rho0.01", "none", seed), 0.2, 0.5 + noise, masked=0.02)
    report = evaluation_report(p, picks, tmp_path)
    assert "**The seed papers' own claims**" in report
    assert "| 001 | grpo above a level | grpo | pass@8 > | 0.3 | 3 | +0.100 |" in report
    assert "| 004 | clip_cov over the control | clip_cov | pass@8 > | grpo-lr0.0001 | 3 | +0.050 |" in report


def test_the_methods_nearest_the_baseline_get_its_extra_seeds_once_chosen(tmp_path: Path) -> None:
    from studies.protocol_phases import nearest_methods

    text = TINY.replace("grpo: {grid", "grpo: {evaluation_seeds: [0, 1, 2, 3], grid") + (
        "  far: {algo: grpo, controller: repo_r}\n"
        "nearest: {methods: 1, seeds: [3], metric: pass@8}\n")
    p = _tiny(tmp_path, text)
    picks = _picks(("grpo", p.tuning_points()[1]), ("clip_cov", p.tuning_points()[2]),
                   ("far", p.methods["far"].points()[0]))
    for seed in (0, 1, 2):
        _run(run_dir(tmp_path, "grpo@grpo-lr0.0002", "none", seed), 0.2, 0.40)
        _run(run_dir(tmp_path, "clip_cov@clip_cov-rho0.01", "none", seed), 0.2, 0.42, masked=0.02)  # gap 0.02
        _run(run_dir(tmp_path, "grpo@far-preset", "repo_r", seed), 0.2, 0.60)  # gap 0.20
    assert nearest_methods(p, picks, tmp_path) == ["clip_cov"]
    assert p.seeds_of("clip_cov") == [0, 1, 2, 3] and p.seeds_of("far") == [0, 1, 2]
    plan = p.plan(picked_points(picks, p), p.all_evaluation_seeds())
    assert [(a.split("@")[1], s) for a, _, s in plan.runs() if s == 3] == [("grpo-lr0.0002", 3), ("clip_cov-rho0.01", 3)]
    _run(run_dir(tmp_path, "grpo@far-preset", "repo_r", 0), 0.2, 0.40)  # later runs do not change the choice
    fresh = _tiny(tmp_path, text)
    assert nearest_methods(fresh, picks, tmp_path) == ["clip_cov"] and fresh.seeds_of("clip_cov") == [0, 1, 2, 3]
    with pytest.raises(ValueError, match="nearest"):
        _tiny(tmp_path, text.replace("seeds: [3]", "seeds: [7]"))  # not among the baseline's seeds


def test_the_report_names_the_nearest_choice_and_every_gap(tmp_path: Path) -> None:
    from studies.protocol_phases import nearest_line

    text = TINY.replace("grpo: {grid", "grpo: {evaluation_seeds: [0, 1, 2, 3], grid") + (
        "nearest: {methods: 1, seeds: [3], metric: pass@8}\n")
    p = _tiny(tmp_path, text)
    assert nearest_line(p, tmp_path) == ""  # not chosen yet
    (tmp_path / "nearest.json").write_text(json.dumps(
        {"metric": "pass@8", "gaps": {"far": 0.2, "clip_cov": 0.02}, "methods": ["clip_cov"]}))
    line = nearest_line(p, tmp_path)
    assert line.startswith("**Nearest grpo**") and "clip_cov, which also run seeds 3." in line
    assert line.endswith("Gaps: clip_cov 0.020, far 0.200.")


def test_the_report_lists_every_finished_run_on_its_own_row(tmp_path: Path) -> None:
    p, picks = _finished_cells(tmp_path)
    writer = SummaryWriter(str(run_dir(tmp_path, "grpo@grpo-lr0.0002", "none", 2) / "tensorboard"))
    writer.add_scalar("eval/pass@8", 0.9, 3)  # seed 2's last evaluation differs from its seeds'
    writer.close()
    report = evaluation_report(p, picks, tmp_path)
    lines = report.splitlines()
    head = lines.index("**Run by run** (the cell table's columns for each finished run):")
    assert report.index("| algo | controller | seeds |") < report.index("**Run by run**") < report.index("**Labelling rule**")
    assert lines[head + 2].startswith("| cell | seed | H final | H min |")
    rows = [line for line in lines[head + 4:] if line.startswith("| ")][:6]
    assert [r.split(" | ")[:2] for r in rows] == [["| grpo-lr0.0002", str(s)] for s in (0, 1, 2)] + \
        [["| clip_cov-rho0.01", str(s)] for s in (0, 1, 2)]
    assert "| 0.900 |" in rows[2] and "| 0.900 |" not in rows[1]


def test_the_report_follows_each_methods_dose_over_the_run(tmp_path: Path) -> None:
    p, picks = _finished_cells(tmp_path)  # Clip-Cov's masked fraction 0.02 at both optimizer steps, 2 iterations
    folder = run_dir(tmp_path, "clip_cov@clip_cov-rho0.01", "none", 2)
    shutil.rmtree(folder)
    _run(folder, 0.0, 0.0, masked=0.05)  # seed 2 at 0.05
    report = evaluation_report(p, picks, tmp_path)
    lines = report.splitlines()
    head = next(i for i, line in enumerate(lines) if line.startswith("**Dose over the run**"))
    assert lines[head + 2] == "| method | scalar | seeds | iterations 1–2 |"
    assert lines[head + 4] == "| clip_cov | train/masked_frac_clip_cov | 3 | 0.0300 |"  # (0.02 + 0.02 + 0.05) / 3
    assert len([line for line in lines[head + 4:] if line.startswith("| grpo")]) == 0  # GRPO has no dose


VERDICTS = CONF / "protocol" / "verdicts.yaml"


def test_the_verdicts_protocol_declares_a_plan_that_can_decide() -> None:
    """Issue 77's plan: every primary claim can survive Holm at the declared seeds, tuning reads the tuning split
    alone and the evaluation never does, and the runs record what the problem-level bootstrap and pairing need."""
    from studies.significance import p_floor, seeds_needed

    p = load_protocol(VERDICTS)
    methods = [m for m in p.methods if m != p.baseline]
    family = sum(len(p.claims_of(m)) for m in methods)
    assert len(methods) == 8 and family == 24
    assert [c.metric for c in p.claims] == ["ho_pass@1", "ho_pass@64", "re_pass@1"]
    assert (p.interval.kind, p.interval.correction, p.interval.alpha) == ("sign_flip", "holm", 0.05)
    assert len(p.evaluation_seeds) >= seeds_needed(family) and p_floor(len(p.evaluation_seeds)) <= 0.05 / family
    assert not set(p.tuning_seeds) & set(p.evaluation_seeds) and p.min_evaluation_seeds == len(p.evaluation_seeds)
    assert p.phase_eval("tune")["problems"] == {"tuning": 128} and all(c.startswith("tu_") for c in p.criterion)
    evaluate = p.phase_eval("evaluate")
    assert evaluate["problems"] == {"held_out": 256, "retention": 64} and evaluate["final_n"] >= 64
    assert {"callbacks.eval.per_problem=true", "data.prompts.task.retention=true"} <= set(p.overrides)
    assert {pt.method for pt in p.tuning_points()} == {"grpo"}  # the candidates wait for its learning rate
    at = {pt.name for pt in p.tuning_points(calibrated=(("optim.lr", 1.0e-5),))}
    assert {n for n in at if not n.startswith("grpo-")} == {
        "dapo_kl_cov-k0.002_lr1e-05", "dapo_kl_cov-k0.01_lr1e-05", "dapo_stare-w1.2_lr1e-05", "dapo_stare-w1.5_lr1e-05",
        "dapo_repo_r-lam_max0.3_lr1e-05", "dapo_repo_r-lam_max1_lr1e-05"}

def test_every_cell_of_the_verdicts_protocol_composes_and_builds() -> None:
    p = load_protocol(VERDICTS)
    assert check_points(p, p.all_points()) == 14


X86_AVX2, X86_BF16 = {"x86": True, "half_units": False}, {"x86": True, "half_units": True}


@pytest.mark.parametrize("cells, on_cpu, support, shim, slow", [
    ({("bf16-mixed", "bfloat16")}, True, X86_AVX2, False, True),    # the crawl the check exists for
    ({("32-true", "bfloat16")}, True, X86_AVX2, False, True),       # an engine in bf16 is enough
    ({("32-true", "float32")}, True, X86_AVX2, False, False),       # fp32 everywhere
    ({("bf16-mixed", "bfloat16")}, False, X86_AVX2, False, False),  # on a GPU
    ({("bf16-mixed", "bfloat16")}, True, X86_BF16, False, False),   # AVX512-BF16 or AMX
    ({("bf16-mixed", "bfloat16")}, True, X86_AVX2, True, False),    # the shim installed
    ({("16-mixed", "float16")}, True, X86_AVX2, True, True),        # which does nothing for fp16
])
def test_a_study_that_would_crawl_is_named_before_it_runs(cells, on_cpu, support, shim, slow) -> None:
    from studies.protocol_preview import slow_precision_reason

    reason = slow_precision_reason(cells, on_cpu, support, shim)
    assert (reason is not None) == slow
    if slow:
        assert "--allow-slow-bf16" in reason and "LIT_ENTROPY_BF16_VIA_FP32" in reason


def test_the_verdicts_protocol_trains_and_samples_in_bf16() -> None:
    from studies.protocol_preview import precisions

    p = load_protocol(ROOT / "conf" / "protocol" / "verdicts.yaml")
    assert precisions(p.plan(p.all_points(), p.tuning_seeds)) == {("bf16-mixed", "bfloat16")}
    start = json.loads((ROOT / p.start).read_text())  # the base model on both splits: the figure's iteration 0
    for split in ("held_out", "retention"):
        assert 0 < start[f"eval/{split}/sampled/pass@1"] < start[f"eval/{split}/sampled/pass@64"] <= 1


def test_the_study_script_refuses_bf16_runs_that_would_crawl_before_any_run(monkeypatch, tmp_path) -> None:
    """``scripts/study.py --protocol conf/protocol/verdicts.yaml --phase tune`` on a CPU without bf16 units and
    without the shim: a usage error naming the way out, and no run folder."""
    import contextlib
    import importlib.util
    import io

    import torch

    import lit_entropy.policy.precision
    from studies import bf16_via_fp32

    spec = importlib.util.spec_from_file_location("study_script", ROOT / "scripts" / "study.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    monkeypatch.setattr(lit_entropy.policy.precision, "cpu_half_support", lambda: X86_AVX2)
    monkeypatch.setattr(bf16_via_fp32, "installed", lambda: False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    args = ["--protocol", str(ROOT / "conf" / "protocol" / "verdicts.yaml"), "--phase", "tune", "--out", str(tmp_path)]
    with pytest.raises(SystemExit) as stop, contextlib.redirect_stderr(io.StringIO()) as err:
        script.main(args)
    assert stop.value.code == 2 and "--allow-slow-bf16" in err.getvalue() and "bf16" in err.getvalue()
    assert not (tmp_path / "tune").exists()


def test_tuning_runs_show_the_criterions_metrics_their_greedy_score_and_entropy() -> None:
    """The tuning report's run-by-run columns: the criterion's metrics, the greedy score of the split they read
    (sampled and greedy apart), entropy; a criterion without a split (the lab's) has no greedy column."""
    from studies.protocol_phases import tuning_columns

    verdicts = load_protocol(ROOT / "conf" / "protocol" / "verdicts.yaml")
    assert tuning_columns(verdicts) == ("tu_pass@1", "tu_pass@8", "tu_greedy", "h_final", "acc_last20",
                                        "s_per_it_median", "dose")
    collapse = load_protocol(ROOT / "conf" / "protocol" / "collapse.yaml")
    assert "greedy" not in " ".join(tuning_columns(collapse)) and tuning_columns(collapse)[-4] == "h_final"
