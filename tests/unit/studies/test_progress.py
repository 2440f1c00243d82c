"""Where a protocol's runs stand (studies/progress.py, ``scripts/study.py --protocol P --progress``): each run's
state read from its folder, the sizes of final evaluations and their chunks, the totals and the estimate."""

from __future__ import annotations

import contextlib
import importlib.util
import io
import json
from dataclasses import replace
from pathlib import Path

import pytest
import yaml
from torch.utils.tensorboard import SummaryWriter

from lit_entropy.callbacks.evaluation import CHUNKS
from studies.method_study import run_dir
from studies.progress import (
    RunProgress,
    by_machine,
    chunk_completions,
    final_completions,
    progress_report,
    run_progress,
    seconds_left,
    seconds_per_completion,
)
from studies.protocol import current_tuning_points, load_protocol
from tests.helpers import ROOT
from tests.unit.studies.test_protocol import TINY as TWO_ITERATIONS

EVAL = {"num_problems": {"held_out": 256, "retention": 64}, "n": 8, "final_n": 64, "greedy": True,
        "prompts_per_chunk": 64}
MACHINE = "AMD EPYC | avx2 | 2 cores"
TINY = TWO_ITERATIONS.replace("iterations: 2\neval: {every: 2,", "iterations: 4\neval: {every: 4,")
"""test_protocol's tiny protocol (two methods of two points each, tuning seeds 10 and 11) at 4 iterations."""


def _run(folder: Path, iterations: int, seconds: float, *, evaluate_s: float | None = None, done: bool = False,
         eval_cfg: dict | None = None) -> Path:
    """A run folder as scripts/train.py and the study leave it: ``iterations`` logged ``seconds`` apart (each
    with 10 s of time/update), its config, one attempt, and with ``done`` its done.json."""
    writer = SummaryWriter(str(folder / "tensorboard"))
    for i in range(iterations):
        writer.add_scalar("rollout/entropy", 0.5, i + 1, walltime=1000.0 + i * seconds)
        writer.add_scalar("time/update", 10.0, i + 1, walltime=1000.0 + i * seconds)
    if evaluate_s is not None:
        writer.add_scalar("time/evaluate", evaluate_s, iterations, walltime=1000.0 + iterations * seconds)
    writer.close()
    (folder / ".hydra").mkdir(parents=True, exist_ok=True)
    (folder / ".hydra" / "config.yaml").write_text(yaml.safe_dump({"callbacks": {"eval": eval_cfg or EVAL}}))
    attempts = [{"machine": MACHINE, "commit": "1d431ff" + "0" * 33}]
    (folder / "attempts.json").write_text(json.dumps(attempts))
    if done:
        (folder / "done.json").write_text(json.dumps({"returncode": 0, "attempts": attempts}))
    return folder


def test_a_final_evaluation_counts_its_completions_and_each_chunk_its_share() -> None:
    assert final_completions(EVAL) == 320 * 64 + 320  # the verdicts study's: 20,800
    assert final_completions({**EVAL, "greedy": False}) == 320 * 64
    assert final_completions({"num_problems": 100, "n": 8}) == 100 * 9  # no final_n: every evaluation's n
    assert final_completions({"n": 8}) is None
    assert chunk_completions(EVAL, Path("held_out-sampled-0003.json")) == 64 * 64
    assert chunk_completions(EVAL, Path("retention-greedy-0000.json")) == 64
    assert chunk_completions(EVAL, Path("held_out-sampled-0004.json")) == 0  # past the split's 256 problems
    short = {"num_problems": 100, "n": 8, "prompts_per_chunk": 64}
    assert chunk_completions(short, Path("all-0001.json")) == 36 * 8  # the last chunk holds what is left
    chunks = [f"{split}-{mode}-{j:04d}.json" for split, count in EVAL["num_problems"].items()
              for mode in ("sampled", "greedy") for j in range(count // 64)]
    assert sum(chunk_completions(EVAL, Path(c)) for c in chunks) == final_completions(EVAL)


def test_a_run_reads_as_its_folder_shows_it(tmp_path: Path) -> None:
    assert run_progress(tmp_path / "none", "c/seed0", "grpo", 4).state == "not started"
    training = run_progress(_run(tmp_path / "training", 2, 100.0), "c/seed1", "grpo", 4)
    assert (training.state, training.logged, training.seconds_per_iteration) == ("training", 2, 100.0)
    assert training.compute_seconds == 20.0 and training.pairing == f"{MACHINE} @ 1d431ff" + "0" * 33
    assert training.completions == 20_800 and training.evaluated_share is None

    evaluating = _run(tmp_path / "evaluating", 4, 100.0)
    assert run_progress(evaluating, "c/seed2", "grpo", 4).evaluated_share == 0.0  # trained, no chunk kept yet
    kept = evaluating / CHUNKS / "iteration-0004-0123456789abcdef"
    kept.mkdir(parents=True)
    for name in ("held_out-sampled-0000.json", "held_out-sampled-0001.json"):
        (kept / name).write_text("{}")
    (evaluating / CHUNKS / "iteration-0002-fedcba9876543210").mkdir()  # another evaluation's: not this one's
    state = run_progress(evaluating, "c/seed2", "grpo", 4)
    assert state.state == "final evaluation" and state.evaluated_share == pytest.approx(2 * 64 * 64 / 20_800)

    done = run_progress(_run(tmp_path / "done", 4, 100.0, evaluate_s=2080.0, done=True), "c/seed3", "grpo", 4)
    assert done.state == "finished" and done.final_evaluation_seconds == 2080.0 and done.compute_seconds == 2120.0
    assert seconds_per_completion([done, state]) == pytest.approx(0.1)


def test_what_is_left_is_the_iterations_and_completions_at_the_measured_rates() -> None:
    runs = [
        RunProgress("a/seed0", "grpo", 10, logged=10, finished=True, completions=100, seconds_per_iteration=50.0,
                    final_evaluation_seconds=20.0),
        RunProgress("a/seed1", "grpo", 10, logged=4, started=True, completions=100, seconds_per_iteration=60.0),
        RunProgress("b/seed0", "dapo", 10, logged=10, started=True, evaluated_share=0.25, completions=100,
                    seconds_per_iteration=90.0),
        RunProgress("b/seed1", "dapo", 10),  # not started: its algorithm's pace, the phase's evaluation size
        RunProgress("c/seed0", "maxrl", 10),  # no run of its algorithm: the median pace of all
    ]
    per_completion = seconds_per_completion(runs)
    assert per_completion == 0.2
    seconds, iterations, completions = seconds_left(runs, per_completion)
    assert (iterations, completions) == (6 + 0 + 10 + 10, 0 + 100 + 75 + 100 + 100)
    assert seconds == pytest.approx(6 * 60 + 10 * 90 + 10 * 60 + 375 * 0.2)
    assert seconds_left(runs, None)[0] == pytest.approx(6 * 60 + 10 * 90 + 10 * 60)  # no evaluation timed yet


def test_what_is_left_at_each_machines_pace_moves_every_run_there() -> None:
    """Two machines, one three times faster: each estimate runs everything left at that machine's pace, a run
    under way on the other machine included; a machine whose finished runs timed no final evaluation gives none."""
    slow, fast = "AMD EPYC | avx2 | 2 cores", "AMD EPYC | avx512_bf16 | 2 cores"
    runs = [
        RunProgress("a/seed0", "grpo", 10, logged=10, finished=True, pairing=f"{slow} @ c1", completions=100,
                    seconds_per_iteration=150.0, final_evaluation_seconds=30.0),
        RunProgress("a/seed0@x", "grpo", 10, logged=10, finished=True, pairing=f"{fast} @ c1", completions=100,
                    seconds_per_iteration=50.0, final_evaluation_seconds=10.0),
        RunProgress("b/seed0", "grpo", 10, logged=4, started=True, pairing=f"{slow} @ c1", completions=100,
                    seconds_per_iteration=160.0),
        RunProgress("b/seed1", "grpo", 10),
    ]
    assert by_machine(runs, runs) == [
        (slow, 1, pytest.approx((6 * 160 + 100 * 0.3 + 10 * 155 + 100 * 0.3) / 3600)),
        (fast, 1, pytest.approx((6 * 50 + 100 * 0.1 + 10 * 50 + 100 * 0.1) / 3600))]  # in name order
    untimed = [replace(r, final_evaluation_seconds=None) if r.name == "a/seed0" else r for r in runs]
    assert [m for m, _, _ in by_machine(untimed, untimed)] == [fast]


def test_the_report_counts_each_phase_and_names_what_waits(tmp_path: Path) -> None:
    f = tmp_path / "tiny.yaml"
    f.write_text(TINY)
    protocol = load_protocol(f)
    out = tmp_path / "out"
    points = current_tuning_points(protocol, out / "tune")
    tiny_eval = {"num_problems": 4, "n": 8, "greedy": True, "prompts_per_chunk": 64}
    _run(run_dir(out / "tune", *points[0].cell, 10), 4, 30.0, evaluate_s=18.0, done=True, eval_cfg=tiny_eval)
    _run(run_dir(out / "tune", *points[1].cell, 10), 2, 40.0, eval_cfg=tiny_eval)
    text = progress_report(protocol, out)
    assert "## tune: 1 of 8 runs finished, 1 under way, 6 not started; 0.0 lane-hours logged" in text
    row = f"| {points[1].cell[0]}+{points[1].cell[1]}/seed10 | training | 2/4 | — | AMD EPYC \\| avx2 \\| 2 cores @ 1d431ff |"
    assert row in text
    assert f"{points[0].cell[0]}+{points[0].cell[1]} seed 11;" in text  # the not started, by cell
    # left: 2 iterations at 40 s, 6 runs x 4 at the median pace (30 and 40: 35 s), 7 x 36 completions at 0.5 s
    assert "Left: 26 iterations and 252 completions in final evaluations, about 0 lane-hours" in text
    assert "(0.50 s a completion, the median of the finished runs' final evaluations)." in text  # one machine
    assert "## evaluate: 0 of 0 runs finished" in text and "waiting for their tuning: grpo, clip_cov" in text


def test_the_script_prints_the_progress(tmp_path: Path) -> None:
    spec = importlib.util.spec_from_file_location("study_script", ROOT / "scripts" / "study.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    f = tmp_path / "tiny.yaml"
    f.write_text(TINY)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert script.main(["--protocol", str(f), "--progress", "--out", str(tmp_path / "out")]) == 0
    assert "# Progress of protocol tiny" in out.getvalue() and "## tune: 0 of 8 runs finished" in out.getvalue()
    assert not (tmp_path / "out").exists()  # reading writes nothing
    err = io.StringIO()
    with contextlib.redirect_stderr(err), pytest.raises(SystemExit) as stop:
        script.main(["--algos", "grpo", "--progress"])
    assert stop.value.code == 2 and "--progress goes with --protocol" in err.getvalue()
