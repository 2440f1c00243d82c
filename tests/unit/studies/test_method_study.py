"""The method study's runner, table and figure (studies/method_study.py, scripts/study.py)."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

import pytest
from torch.utils.tensorboard import SummaryWriter

from lit_entropy.cli.train import FIT_FINISHED
from studies.method_study import (
    StudyPlan,
    lane_cores,
    lane_env,
    machine,
    parse_cells,
    run_dir,
    run_lock,
    run_study,
    run_summary,
    summarise,
    train_command,
)

ROOT = Path(__file__).resolve().parents[3]
END = f"print({FIT_FINISHED!r})\n"  # what scripts/train.py prints once its fit has returned
# the fake train scripts' first lines: the run folder ``d`` that the study passes as hydra.run.dir
RUN_FOLDER = ("import sys\nfrom pathlib import Path\n"
              "d = Path([a for a in sys.argv if a.startswith('hydra.run.dir=')][0].split('=', 1)[1])\n")


def _write_run(folder: Path, entropy: list[float], acc: list[float], band: list[float] | None = None,
               pass_at: tuple[float, float] | None = None) -> None:
    writer = SummaryWriter(str(folder / "tensorboard"))
    for i, (h, a) in enumerate(zip(entropy, acc, strict=True)):
        writer.add_scalar("rollout/entropy", h, i, walltime=100.0 + 2.0 * i)
        writer.add_scalar("rollout/accuracy", a, i, walltime=100.0 + 2.0 * i)
        if band is not None:
            writer.add_scalar("control/band_error", band[i], i)
    if pass_at is not None:
        writer.add_scalar("eval/pass@1", pass_at[0], len(entropy))
        writer.add_scalar("eval/pass@8", pass_at[1], len(entropy))
    writer.close()


def test_run_summary_reads_each_column(tmp_path: Path) -> None:
    acc = [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7]
    _write_run(tmp_path, [1.0, 0.9, 0.8, 0.7, 0.6, 0.5, 0.4], acc, band=[0.4, 0.3, 0.2, 0.1, 0.0, 0.0, 0.2],
               pass_at=(0.25, 0.75))
    s = run_summary(tmp_path)
    assert s["h_final"] == pytest.approx(0.4)
    assert s["acc_last5"] == pytest.approx(statistics.mean(acc[-5:]))
    assert s["pass@1"] == pytest.approx(0.25) and s["pass@8"] == pytest.approx(0.75)
    assert s["band_error"] == pytest.approx(statistics.mean([0.1, 0.0, 0.0, 0.2]))  # the second half
    assert s["s_per_it"] == pytest.approx(2.0) and s["s_per_it_median"] == pytest.approx(2.0)
    assert s["stopped_at"] is None  # ran to its end
    assert s["compute_seconds"] is None  # no stage times logged


def test_run_summary_sums_the_disjoint_stage_times_into_the_compute(tmp_path: Path) -> None:
    _write_run(tmp_path, [1.0, 0.9, 0.8], [0.1, 0.2, 0.3])
    writer = SummaryWriter(str(tmp_path / "tensorboard"))
    for i in range(3):
        for tag, seconds in (("time/generate", 10.0), ("time/score", 1.0), ("time/sync", 2.0), ("time/prepare", 4.0),
                             ("time/update", 20.0), ("time/evaluate", 5.0), ("time/forward", 3.0),
                             ("time/forward_backward", 15.0)):
            writer.add_scalar(tag, seconds, i)
    writer.close()
    assert run_summary(tmp_path)["compute_seconds"] == pytest.approx(3 * 42.0)  # forward(_backward) lie inside


def test_the_median_seconds_per_iteration_leaves_out_an_interruption(tmp_path: Path) -> None:
    writer = SummaryWriter(str(tmp_path / "tensorboard"))
    for i, t in enumerate([0.0, 50.0, 100.0, 3700.0, 3750.0, 3800.0]):  # an hour's gap between iterations 2 and 3
        writer.add_scalar("rollout/entropy", 1.0, i, walltime=t)
        writer.add_scalar("rollout/accuracy", 0.5, i, walltime=t)
    writer.close()
    s = run_summary(tmp_path)
    assert s["s_per_it_median"] == pytest.approx(50.0) and s["s_per_it"] == pytest.approx(760.0)


def test_run_summary_says_where_a_diverged_run_was_stopped(tmp_path: Path) -> None:
    _write_run(tmp_path, [2.0, 4.5, 5.0, 6.0], [0.0] * 4)
    writer = SummaryWriter(str(tmp_path / "tensorboard"))
    writer.add_scalar("stop/diverged", 1.0, 4)
    writer.close()
    assert run_summary(tmp_path)["stopped_at"] == 4


def test_table_ranks_cells_and_aggregates_seeds(tmp_path: Path) -> None:
    plan = StudyPlan(algos=["grpo", "dapo"], controllers=["none"], seeds=[0, 1])
    for seed, acc in [(0, 0.2), (1, 0.4)]:
        _write_run(run_dir(tmp_path, "grpo", "none", seed), [0.5] * 6, [acc] * 6)
        _write_run(run_dir(tmp_path, "dapo", "none", seed), [0.7] * 6, [acc + 0.3] * 6)
    table, cells = summarise(plan, tmp_path)
    rows = table.splitlines()[2:]
    assert rows[0].startswith("| dapo | none | 2 |") and rows[1].startswith("| grpo | none | 2 |")
    assert "0.300 ± 0.141" in rows[1]  # mean and sample sd of 0.2, 0.4
    assert "—" in rows[1]  # no band, no held-out evaluation logged
    assert len(cells["grpo+none"]) == 2


def test_train_command_sets_the_cell_and_evaluates_after_the_last_iteration(tmp_path: Path) -> None:
    plan = StudyPlan(algos=["dapo"], controllers=["adapo"], seeds=[2], iterations=7, overrides=["debug=smoke"])
    cmd = train_command(plan, "dapo", "adapo", 2, tmp_path, ROOT / "scripts" / "train.py")
    assert {"algo=dapo", "callbacks/entropy=adapo", "seed=2", "trainer.max_epochs=7",
            "callbacks/eval=periodic", "callbacks.eval.every_n_iterations=7", "debug=smoke"} <= set(cmd)
    assert f"hydra.run.dir={run_dir(tmp_path, 'dapo', 'adapo', 2)}" in cmd


@pytest.mark.slow
def test_a_real_study_runs_resumes_and_writes_its_table(tmp_path: Path) -> None:
    out = tmp_path / "study"
    cmd = [sys.executable, str(ROOT / "scripts" / "study.py"), "--algos", "grpo", "--controllers", "none",
           "--seeds", "0", "--iterations", "2", "--eval-problems", "4", "--out", str(out), "--",
           "debug=smoke", "batch.prompts_per_iter=4"]
    subprocess.run(cmd, check=True, cwd=tmp_path)
    done = out / "runs" / "grpo+none" / "seed0" / "done.json"
    assert json.loads(done.read_text())["returncode"] == 0
    table = (out / "study.md").read_text()
    assert "| grpo | none | 1 |" in table and (out / "study.png").stat().st_size > 0
    first = done.stat().st_mtime
    subprocess.run(cmd, check=True, cwd=tmp_path)  # resumes: nothing is run again
    assert done.stat().st_mtime == first


def test_variants_are_a_third_axis(tmp_path: Path) -> None:
    plan = StudyPlan(algos=["grpo"], controllers=["none"], seeds=[0],
                     variants={"bf16": ["rollout.engine.dtype=bfloat16", "correction=tis"], "exact": []})
    assert [a for a, _, _ in plan.runs()] == ["grpo@bf16", "grpo@exact"]
    plan.cells = [("ce_gppo", "gppo_beta")]  # an extra cell takes every variant too
    assert plan.grid()[2:] == [("ce_gppo@bf16", "gppo_beta"), ("ce_gppo@exact", "gppo_beta")]
    cmd = train_command(plan, "grpo@bf16", "none", 0, tmp_path, ROOT / "scripts" / "train.py")
    assert "algo=grpo" in cmd and cmd[-2:] == ["rollout.engine.dtype=bfloat16", "correction=tis"]
    assert f"hydra.run.dir={run_dir(tmp_path, 'grpo@bf16', 'none', 0)}" in cmd


def test_mismatch_columns_read_the_correction_metrics(tmp_path: Path) -> None:
    folder = run_dir(tmp_path, "grpo@tis", "none", 0)
    _write_run(folder, [0.5, 0.4], [0.2, 0.3])
    writer = SummaryWriter(str(folder / "tensorboard"))
    for i, (ess, masked, rejected) in enumerate([(0.9, 0.1, 0.0), (0.7, 0.2, 0.1)]):
        writer.add_scalar("rollout_corr/ess", ess, i)
        writer.add_scalar("rollout_corr/frac_masked", masked, i)
        writer.add_scalar("rollout_corr/frac_rejected", rejected, i)
        writer.add_scalar("diag/logp_mismatch_mean", 0.01 * (i + 1), i)
    writer.close()
    s = run_summary(folder)
    assert s["ess"] == pytest.approx(0.8) and s["masked"] == pytest.approx(0.2)
    assert s["mismatch"] == pytest.approx(0.015)
    plan = StudyPlan(algos=["grpo"], controllers=["none"], seeds=[0], variants={"tis": []})
    table, _ = summarise(plan, tmp_path, ("ess", "masked"))
    assert table.splitlines()[0] == "| algo | controller | seeds | ESS | masked frac |"
    with pytest.raises(ValueError, match="unknown study columns"):
        summarise(plan, tmp_path, ("accuracy",))


def test_an_unfinished_run_is_cleared_before_it_runs_again_and_left_out_until_then(tmp_path: Path) -> None:
    """A rerun into the folder of an interrupted run would merge two runs' event files: it starts clean."""
    plan = StudyPlan(algos=["grpo"], controllers=["none"], seeds=[0, 1], iterations=2)
    stale = run_dir(tmp_path, "grpo", "none", 0)
    _write_run(stale, [0.9, 0.9], [0.9, 0.9])  # an interrupted run: events, a log, no done.json
    (stale / "study_stdout.log").write_text("killed\n")
    assert "grpo" not in summarise(plan, tmp_path)[0].split("\n", 2)[-1]  # not in the table while unfinished
    fake = tmp_path / "fake_train.py"  # stands in for scripts/train.py: writes one fresh run
    fake.write_text(
        RUN_FOLDER + "from torch.utils.tensorboard import SummaryWriter\n"
        "w = SummaryWriter(str(d / 'tensorboard'))\n"
        "for i in range(2):\n    w.add_scalar('rollout/entropy', 0.4, i)\n    w.add_scalar('rollout/accuracy', 0.5, i)\n"
        "w.close()\n" + END)
    said: list[str] = []
    run_study(plan, tmp_path, fake, log=said.append)
    assert any("clearing the unfinished run" in line for line in said)
    for seed in (0, 1):
        assert (run_dir(tmp_path, "grpo", "none", seed) / "done.json").exists()
    assert run_summary(stale)["h_final"] == pytest.approx(0.4)  # only the new run's events (float32)
    assert "| grpo | none | 2 | 0.400 ± 0.000 |" in summarise(plan, tmp_path)[0]


def test_a_finished_runs_checkpoints_go_when_the_plan_keeps_none(tmp_path: Path) -> None:
    fake = tmp_path / "fake_train.py"  # a run that writes a checkpoint and its events
    fake.write_text(
        RUN_FOLDER + "from torch.utils.tensorboard import SummaryWriter\n"
        "(d / 'checkpoints').mkdir(parents=True)\n(d / 'checkpoints' / 'last.ckpt').write_text('x')\n"
        "w = SummaryWriter(str(d / 'tensorboard'))\nw.add_scalar('rollout/entropy', 0.4, 1)\n"
        "w.add_scalar('rollout/accuracy', 0.5, 1)\nw.close()\n" + END)
    for keep in (True, False):
        plan = StudyPlan(algos=["grpo"], controllers=["none"], seeds=[0], keep_checkpoints=keep)
        run_study(plan, tmp_path / str(keep), fake, log=lambda _: None)
        folder = run_dir(tmp_path / str(keep), "grpo", "none", 0)
        assert (folder / "done.json").exists() and (folder / "checkpoints").exists() == keep
        assert run_summary(folder)["h_final"] == pytest.approx(0.4)


def test_an_unfinished_run_with_a_checkpoint_continues_from_it_in_its_folder(tmp_path: Path) -> None:
    fake = tmp_path / "fake_train.py"  # records its arguments, then writes one run
    fake.write_text(
        RUN_FOLDER + "from torch.utils.tensorboard import SummaryWriter\n"
        "(d / 'argv.txt').write_text(' '.join(sys.argv))\n"
        "w = SummaryWriter(str(d / 'tensorboard'))\nw.add_scalar('rollout/entropy', 0.4, 1)\n"
        "w.add_scalar('rollout/accuracy', 0.5, 1)\nw.close()\n" + END)
    plan = StudyPlan(algos=["grpo"], controllers=["none"], seeds=[0])
    folder = run_dir(tmp_path, "grpo", "none", 0)
    (folder / "checkpoints").mkdir(parents=True)
    (folder / "checkpoints" / "last.ckpt").write_text("x")
    (folder / "study_stdout.log").write_text("killed at iteration 25\n")
    said: list[str] = []
    run_study(plan, tmp_path, fake, log=said.append)
    assert any("resuming the unfinished run from" in line for line in said)
    assert f"ckpt_path={(folder / 'checkpoints' / 'last.ckpt').resolve()}" in (folder / "argv.txt").read_text()
    assert (folder / "study_stdout.log").read_text().startswith("killed at iteration 25")  # kept, appended to
    assert (folder / "done.json").exists()


def test_a_run_that_exits_0_before_its_fit_returned_is_not_done_and_resumes_from_its_checkpoint(
        tmp_path: Path) -> None:
    """A run stopped by a signal whose handler exits cleanly (status 0) has not run to its end: no done.json,
    its checkpoint stays, and the next study run continues it from there."""
    stopped = tmp_path / "stopped_train.py"  # writes a checkpoint and events, then exits 0 without the end line
    stopped.write_text(
        RUN_FOLDER + "from torch.utils.tensorboard import SummaryWriter\n"
        "(d / 'checkpoints').mkdir(parents=True, exist_ok=True)\n(d / 'checkpoints' / 'last.ckpt').write_text('x')\n"
        "w = SummaryWriter(str(d / 'tensorboard'))\nw.add_scalar('rollout/entropy', 0.4, 1)\nw.close()\n"
        "print('iteration 1/2')\nraise SystemExit(0)\n")
    plan = StudyPlan(algos=["grpo"], controllers=["none"], seeds=[0], keep_checkpoints=False)
    folder = run_dir(tmp_path, "grpo", "none", 0)
    said: list[str] = []
    run_study(plan, tmp_path, stopped, log=said.append)
    assert not (folder / "done.json").exists() and (folder / "checkpoints" / "last.ckpt").is_file()
    failed = json.loads((folder / "failed.json").read_text())
    assert failed["returncode"] == 0 and failed["fit_finished"] is False
    assert any("exit 0 before its fit returned" in line for line in said)
    finishing = tmp_path / "finishing_train.py"  # the resumed attempt runs to its end
    finishing.write_text("import sys\nassert any(a.startswith('ckpt_path=') for a in sys.argv)\n" + END)
    run_study(plan, tmp_path, finishing, log=said.append)
    assert any("resuming the unfinished run from" in line for line in said)
    assert (folder / "done.json").exists() and not (folder / "checkpoints").exists()


def test_a_run_another_process_holds_is_skipped_and_its_training_process_holds_the_lock(tmp_path: Path) -> None:
    """Started again while a stopped study's run is still finishing, the study must not resume that run a second
    time into the same folder: it skips it. The lock lives in the training process as well as in the study's."""
    plan = StudyPlan(algos=["grpo"], controllers=["none"], seeds=[0, 1])
    busy, free = run_dir(tmp_path, "grpo", "none", 0), run_dir(tmp_path, "grpo", "none", 1)
    (busy / "checkpoints").mkdir(parents=True)
    (busy / "checkpoints" / "last.ckpt").write_text("x")
    fake = tmp_path / "fake_train.py"  # records whether it holds its folder's lock among its open files
    fake.write_text(
        "import os\n" + RUN_FOLDER +
        "lock = str(d.parent / f'.{d.name}.lock')\n"
        "held = [f for f in os.listdir('/proc/self/fd') if os.path.realpath(f'/proc/self/fd/{f}') == lock]\n"
        "(d / 'held.txt').write_text(str(len(held)))\n" + END)
    other = run_lock(busy)  # another study process's run
    assert other is not None and run_lock(busy) is None  # a second taker is refused, in this process too
    said: list[str] = []
    try:
        run_study(plan, tmp_path, fake, log=said.append)
    finally:
        os.close(other)
    assert any("skipped: another process is running it" in line for line in said)
    assert not any("resuming" in line for line in said)
    assert sorted(p.name for p in busy.iterdir()) == ["checkpoints"]  # untouched: no attempt recorded, no log
    assert (free / "done.json").exists() and (free / "held.txt").read_text() == "1"
    assert list(busy.parent.glob("seed0@*")) == []  # the lock is not taken for a pair's second run of the seed
    mine = run_lock(busy)  # released by both once they ended
    assert mine is not None
    os.close(mine)
    run_study(plan, tmp_path, fake, log=said.append)
    assert (busy / "done.json").exists()


def test_a_run_another_process_finished_after_this_study_listed_its_runs_is_left_as_it_is(tmp_path: Path) -> None:
    """Two study processes walk the same list of runs (a lane each). The one on an earlier run lists a later run as
    still to do; when it gets there the other lane has finished it and released its lock, and the finished run has no
    checkpoint left to resume from. It must be skipped, not cleared and trained again (a finished evaluation run of
    the verdicts study was lost so)."""
    plan = StudyPlan(algos=["grpo"], controllers=["none"], seeds=[0, 1])
    later = run_dir(tmp_path, "grpo", "none", 1)
    fake = tmp_path / "fake_train.py"  # seed 0's run; meanwhile "the other lane" finishes seed 1
    fake.write_text(
        "import json\n" + RUN_FOLDER +
        "other = d.parent / 'seed1'\n"
        "if d.name == 'seed0':\n"
        "    other.mkdir(parents=True, exist_ok=True)\n"
        "    (other / 'study_stdout.log').write_text('the other lane')\n"
        "    (other / 'done.json').write_text(json.dumps({'returncode': 0}))\n" + END)
    said: list[str] = []
    run_study(plan, tmp_path, fake, log=said.append)
    assert (run_dir(tmp_path, "grpo", "none", 0) / "done.json").exists()
    assert sorted(p.name for p in later.iterdir()) == ["done.json", "study_stdout.log"]  # untouched
    assert (later / "study_stdout.log").read_text() == "the other lane"
    assert any("skipped: another process finished it" in line for line in said)
    assert not any("clearing" in line for line in said)


def test_the_end_line_of_an_earlier_attempt_does_not_count_for_a_later_one(tmp_path: Path) -> None:
    """The resume appends to study_stdout.log: only what the attempt itself printed says whether it finished."""
    plan = StudyPlan(algos=["grpo"], controllers=["none"], seeds=[0])
    folder = run_dir(tmp_path, "grpo", "none", 0)
    (folder / "checkpoints").mkdir(parents=True)
    (folder / "checkpoints" / "last.ckpt").write_text("x")
    (folder / "study_stdout.log").write_text(FIT_FINISHED + "\n")  # e.g. a log copied over from elsewhere
    quiet = tmp_path / "quiet_train.py"
    quiet.write_text("print('iteration 2/2')\n")
    run_study(plan, tmp_path, quiet, log=lambda _: None)
    assert not (folder / "done.json").exists() and (folder / "failed.json").exists()


def test_runs_go_seed_by_seed_over_the_grid_and_the_extra_cells() -> None:
    """Every cell's first seed comes before any cell's second: a study cut short still covers every cell."""
    plan = StudyPlan(algos=["grpo", "dapo"], controllers=["none"], seeds=[0, 1],
                     cells=[("ce_gppo", "gppo_beta"), ("grpo", "none")])  # a repeat of a grid cell is dropped
    assert plan.runs() == [("grpo", "none", 0), ("dapo", "none", 0), ("ce_gppo", "gppo_beta", 0),
                           ("grpo", "none", 1), ("dapo", "none", 1), ("ce_gppo", "gppo_beta", 1)]
    assert parse_cells("ce_gppo+gppo_beta, grpo+adapo") == [("ce_gppo", "gppo_beta"), ("grpo", "adapo")]
    assert parse_cells("grpo@tis+bf16+none") == [("grpo@tis+bf16", "none")]  # a variant name may hold '+'
    with pytest.raises(ValueError, match="must be <algo>\\+<controller>"):
        parse_cells("grpo")


def test_lanes_split_the_cores_and_pin_the_openmp_threads() -> None:
    assert lane_cores(2, [0, 1, 2, 3]) == [[0, 1], [2, 3]]
    assert lane_cores(3, [4, 5, 6, 7]) == [[4], [5], [6]]  # a remainder core stays unused
    with pytest.raises(ValueError, match="--lanes 3 must be between 1 and the 2 usable CPU cores"):
        lane_cores(3, [0, 1])
    env = lane_env([2, 3], base={"PATH": "/bin"})
    assert env == {"PATH": "/bin", "OMP_NUM_THREADS": "2", "MKL_NUM_THREADS": "2", "VLLM_CPU_OMP_THREADS_BIND": "2,3"}


def test_two_lanes_run_each_run_pinned_to_its_own_core(tmp_path: Path, all_cores: list[int]) -> None:
    if len(all_cores) < 2:
        pytest.skip("two lanes need two usable cores")
    plan = StudyPlan(algos=["grpo", "dapo"], controllers=["none"], seeds=[0, 1], iterations=2)
    fake = tmp_path / "fake_train.py"  # records where it ran, then writes one run's events
    fake.write_text(
        "import json, os, time\nstart = time.time()\n" + RUN_FOLDER + "from torch.utils.tensorboard import SummaryWriter\n"
        "(d / 'pinned.json').write_text(json.dumps({'cores': sorted(os.sched_getaffinity(0)), 'start': start,"
        " 'omp': os.environ['OMP_NUM_THREADS'], 'bind': os.environ['VLLM_CPU_OMP_THREADS_BIND']}))\n"
        "time.sleep(1.0)\n"
        "w = SummaryWriter(str(d / 'tensorboard'))\n"
        "for i in range(2):\n    w.add_scalar('rollout/entropy', 0.4, i)\n    w.add_scalar('rollout/accuracy', 0.5, i)\n"
        "w.close()\n(d / 'end').write_text(str(time.time()))\n" + END)
    said: list[str] = []
    run_study(plan, tmp_path, fake, log=said.append, lanes=2)
    lanes = [c for c in lane_cores(2)]
    seen = []
    for algo, controller, seed in plan.runs():
        folder = run_dir(tmp_path, algo, controller, seed)
        pinned = json.loads((folder / "pinned.json").read_text())
        assert pinned["cores"] in lanes and pinned["omp"] == str(len(pinned["cores"]))
        assert pinned["bind"] == ",".join(map(str, pinned["cores"]))
        assert json.loads((folder / "done.json").read_text())["cores"] == pinned["cores"]
        seen.append((pinned["start"], float((folder / "end").read_text()), tuple(pinned["cores"])))
    assert {cores for _, _, cores in seen} == {tuple(c) for c in lanes}  # both lanes were used
    seen.sort()
    assert any(later[0] < earlier[1] for earlier, later in zip(seen, seen[1:], strict=False))  # runs overlapped
    assert "| grpo | none | 2 | 0.400 ± 0.000 |" in summarise(plan, tmp_path)[0]


def test_moving_mean_is_trailing() -> None:
    from studies.method_study import moving_mean

    assert moving_mean([1.0, 3.0, 5.0, 7.0], 2) == [1.0, 2.0, 4.0, 6.0]
    assert moving_mean([1.0, 3.0, 5.0], 5) == [1.0, 2.0, 3.0]


def test_train_command_passes_the_held_out_evaluation_settings(tmp_path: Path) -> None:
    plan = StudyPlan(algos=["grpo"], controllers=["none"], iterations=200, eval_n=64, eval_ks=(1, 16, 64),
                     eval_every=25, eval_problems=32)
    cmd = train_command(plan, "grpo", "none", 0, tmp_path, ROOT / "scripts" / "train.py")
    assert {"callbacks.eval.every_n_iterations=25", "callbacks.eval.n=64", "callbacks.eval.ks=[1,16,64]",
            "callbacks.eval.num_problems=32"} <= set(cmd)


def test_the_last_evaluation_may_draw_more_samples(tmp_path: Path) -> None:
    plan = StudyPlan(algos=["grpo"], controllers=["none"], eval_n=8, eval_ks=(1, 8), eval_final_n=64,
                     eval_final_ks=(1, 8, 64))
    cmd = train_command(plan, "grpo", "none", 0, tmp_path, ROOT / "scripts" / "train.py")
    assert {"callbacks.eval.n=8", "callbacks.eval.final_n=64", "callbacks.eval.final_ks=[1,8,64]"} <= set(cmd)
    assert not any("final" in a for a in train_command(StudyPlan(["grpo"], ["none"]), "grpo", "none", 0, tmp_path,
                                                       ROOT / "scripts" / "train.py"))


def test_a_task_with_splits_gives_each_splits_last_evaluation(tmp_path: Path) -> None:
    """The real-LM arithmetic logs eval/<split>/<greedy|sampled>/<metric>: the summary's ho_* and tr_* keys are the
    last evaluation's values (the one after the last iteration, not the one along the way)."""
    _write_run(tmp_path, [2.2, 2.0, 1.5], [0.0, 0.1, 0.2])
    writer = SummaryWriter(str(tmp_path / "tensorboard"))
    for step, scale in ((1, 0.5), (3, 1.0)):
        writer.add_scalar("eval/held_out/greedy/pass@1", 0.25 * scale, step)
        writer.add_scalar("eval/held_out/sampled/pass@64", 0.75 * scale, step)
        writer.add_scalar("eval/held_out/sampled/length", 40.0 * scale, step)
        writer.add_scalar("eval/transfer/sampled/pass@1", 0.125 * scale, step)
    writer.close()
    s = run_summary(tmp_path)
    assert (s["ho_greedy"], s["ho_pass@64"], s["ho_length"], s["tr_pass@1"]) == (0.25, 0.75, 40.0, 0.125)
    assert s["ho_pass@1"] is None and s["tr_greedy"] is None  # not logged: None, never 0
    assert (s["ho_greedy_mid"], s["tr_pass@1_mid"]) == (0.125, 0.0625)  # the evaluation along the way
    assert s["ho_pass@8_mid"] is None
    table, _ = summarise(StudyPlan(["grpo"], ["none"], seeds=[0]), tmp_path, ("ho_greedy", "tr_pass@1", "ho_greedy_mid"))
    assert "held-out greedy pass@1 | transfer pass@1 | held-out greedy pass@1 (mid)" in table


def test_the_predicted_entropy_change_is_paired_with_the_next_iterations_realised_one() -> None:
    from studies.method_study import predicted_entropy_change

    pred = [(1, 0.3), (2, -0.1), (3, 0.2), (4, -0.4), (5, 9.0)]  # the last prediction has no realisation yet
    actual = [(2, 0.03), (3, -0.01), (4, 0.02), (5, -0.05)]  # realised at k = 2..5: the updates of k-1
    got = predicted_entropy_change({"diag/dH_pred": pred, "diag/dH_actual": actual})
    assert got["dh_sign"] == 1.0
    assert got["dh_corr"] == pytest.approx(statistics.correlation([0.3, -0.1, 0.2, -0.4], [0.03, -0.01, 0.02, -0.05]))
    flipped = predicted_entropy_change({"diag/dH_pred": pred, "diag/dH_actual": [(s, -v) for s, v in actual]})
    assert flipped["dh_sign"] == 0.0 and flipped["dh_corr"] == pytest.approx(-got["dh_corr"])
    assert predicted_entropy_change({"diag/dH_pred": pred[:2], "diag/dH_actual": actual[:1]}) == {
        "dh_corr": None, "dh_sign": None}
    # iterations 1-2 logged twice (an unpurged restart) pair as once; the optimizer-step axis of older runs (4 a step)
    twice = predicted_entropy_change({"diag/dH_pred": pred[:2] + pred, "diag/dH_actual": actual[:1] + actual})
    assert twice == got
    older = predicted_entropy_change({"diag/dH_pred": [(4 * s, v) for s, v in pred],
                                      "diag/dH_actual": [(4 * s, v) for s, v in actual]})
    assert older == got


def test_law_ceiling_is_predicted_from_the_first_third_only() -> None:
    import math

    from studies.method_study import law_ceiling

    h = [0.6 - 0.01 * i for i in range(30)]
    exact = [0.8 - 0.5 * math.exp(x) for x in h[:10]]  # R = -a*exp(H) + b, a = 0.5, b = 0.8: ceiling 0.3
    later = [0.9] * 20  # what the rest of the run does cannot move the prediction
    assert law_ceiling(h, exact + later) == pytest.approx(0.3)
    assert law_ceiling([0.5] * 30, [0.2] * 30) is None  # a flat entropy predicts nothing
    assert law_ceiling(h[:2], exact[:2]) is None


def test_summary_reads_large_k_pass_at_and_its_peak_and_ranks_by_a_chosen_column(tmp_path: Path) -> None:
    plan = StudyPlan(algos=["grpo", "clip_cov"], controllers=["none"], seeds=[0])
    for algo, p64 in [("grpo", [0.6, 0.7, 0.5]), ("clip_cov", [0.6, 0.7, 0.75])]:
        folder = run_dir(tmp_path, algo, "none", 0)
        writer = SummaryWriter(str(folder / "tensorboard"))
        for i in range(30):
            writer.add_scalar("rollout/entropy", 0.5 - 0.01 * i, i)
            writer.add_scalar("rollout/accuracy", 0.6 if algo == "grpo" else 0.4, i)
        for j, v in enumerate(p64):
            writer.add_scalar("eval/pass@64", v, 10 * (j + 1))
        writer.close()
    s = run_summary(run_dir(tmp_path, "grpo", "none", 0))
    assert s["pass@64"] == pytest.approx(0.5) and s["pass@64_peak"] == pytest.approx(0.7)
    assert s["h_min"] == pytest.approx(0.21)
    by_acc, _ = summarise(plan, tmp_path, ("acc_last20", "pass@64"))
    by_p64, _ = summarise(plan, tmp_path, ("acc_last20", "pass@64"), sort_by="pass@64")
    assert by_acc.splitlines()[2].startswith("| grpo |") and by_p64.splitlines()[2].startswith("| clip_cov |")
    with pytest.raises(ValueError, match="unknown study columns"):
        summarise(plan, tmp_path, ("acc_last20",), sort_by="nonsense")


def test_eval_series_places_each_evaluation_at_its_iteration_and_the_start_at_0() -> None:
    from studies.study_plot import eval_series

    # 4 optimizer steps per iteration: iteration i's metrics at step 4i - 1; evaluations after 2 and 3
    scalars = {"rollout/entropy": [(4 * i - 1, 0.5) for i in range(1, 4)],
               "eval/pass@64": [(0, 0.9), (7, 0.6), (11, 0.5)]}
    assert eval_series(scalars, "eval/pass@64") == {0: 0.9, 2: 0.6, 3: 0.5}
    assert eval_series(scalars, "eval/pass@16") == {}
    # A run with the `iteration` marker (lit_entropy/utils/log_steps.py) logs iteration i's metrics at step i: the same map.
    scalars = {"rollout/entropy": [(i, 0.5) for i in range(1, 4)], "eval/pass@64": [(0, 0.9), (2, 0.6), (3, 0.5)]}
    assert eval_series(scalars, "eval/pass@64") == {0: 0.9, 2: 0.6, 3: 0.5}


def test_the_peak_of_pass_at_k_leaves_out_the_at_start_evaluation(tmp_path: Path) -> None:
    writer = SummaryWriter(str(tmp_path / "tensorboard"))
    for i in range(1, 7):
        writer.add_scalar("rollout/entropy", 0.5, i)
        writer.add_scalar("rollout/accuracy", 0.2, i)
    for step, v in [(0, 0.95), (3, 0.6), (6, 0.5)]:
        writer.add_scalar("eval/pass@64", v, step)
    writer.close()
    s = run_summary(tmp_path)
    assert s["pass@64_peak"] == pytest.approx(0.6) and s["pass@64"] == pytest.approx(0.5)


def test_the_figure_draws_the_held_out_and_retention_splits_where_the_runs_log_them(tmp_path: Path) -> None:
    from studies.study_plot import HELD_OUT_SAMPLED, RETENTION_SAMPLED, eval_prefix, plot

    plan = StudyPlan(algos=["grpo"], controllers=["none"], seeds=[0], eval_every=2, eval_ks=(1, 8))
    assert eval_prefix(plan, tmp_path) == "eval/"  # nothing finished yet
    folder = run_dir(tmp_path, "grpo", "none", 0)
    _write_run(folder, [2.0, 1.5, 1.0, 0.5], [0.1, 0.2, 0.3, 0.4])
    writer = SummaryWriter(str(folder / "tensorboard"))
    for step, v in ((2, 0.2), (4, 0.3)):
        writer.add_scalar(f"{HELD_OUT_SAMPLED}pass@1", v, step)
        writer.add_scalar(f"{HELD_OUT_SAMPLED}pass@8", 2 * v, step)
    writer.close()
    (folder / "done.json").write_text("{}")
    assert eval_prefix(plan, tmp_path) == HELD_OUT_SAMPLED
    titles = plot(plan, tmp_path, tmp_path / "study.png")
    assert (tmp_path / "study.png").stat().st_size > 10_000
    assert [t.split(";")[0] for t in titles[2:]] == ["held-out (disjoint) sampled pass@1",
                                                     "held-out (disjoint) sampled pass@8"]
    writer = SummaryWriter(str(folder / "tensorboard"))
    writer.add_scalar(f"{RETENTION_SAMPLED}pass@1", 0.4, 4)  # the kinds training never draws: what it forgets
    writer.close()
    titles = plot(plan, tmp_path, tmp_path / "study.png", start={f"{RETENTION_SAMPLED}pass@1": 0.5})
    assert titles[-1] == "retention (kinds never trained) sampled pass@1; mean over 1 seeds"
    # the runs drawn are the ones folder_of names (a protocol's: the run its cell table reads): here none finished
    titles = plot(plan, tmp_path, tmp_path / "study.png", folder_of=lambda *_: tmp_path / "elsewhere")
    assert titles[-1].endswith("mean over 0-0 seeds")


def test_the_last_panel_puts_final_pass_at_1_against_the_last_evaluations_largest_k(tmp_path: Path) -> None:
    from studies.study_plot import HELD_OUT_SAMPLED, last_eval, plot, trade_axes

    plan = StudyPlan(algos=["grpo"], controllers=["none"], seeds=[0, 1], eval_every=2, eval_ks=(1, 8),
                     eval_final_n=64, eval_final_ks=(1, 8, 64))
    assert trade_axes(plan, HELD_OUT_SAMPLED) == (f"{HELD_OUT_SAMPLED}pass@1", f"{HELD_OUT_SAMPLED}pass@64")
    assert trade_axes(StudyPlan(algos=["grpo"], controllers=["none"], eval_ks=(1, 8)), "eval/") is None
    assert trade_axes(StudyPlan(algos=["grpo"], controllers=["none"], eval_ks=(1, 8), eval_final_ks=(1, 8)), "eval/") is None
    for seed in plan.seeds:
        folder = run_dir(tmp_path, "grpo", "none", seed)
        _write_run(folder, [2.0, 1.5, 1.0, 0.5], [0.1, 0.2, 0.3, 0.4])
        writer = SummaryWriter(str(folder / "tensorboard"))
        writer.add_scalar(f"{HELD_OUT_SAMPLED}pass@1", 0.2, 2)
        writer.add_scalar(f"{HELD_OUT_SAMPLED}pass@1", 0.3 + seed / 10, 4)
        writer.add_scalar(f"{HELD_OUT_SAMPLED}pass@64", 0.5, 4)  # only the last evaluation has k = 64
        writer.close()
        (folder / "done.json").write_text("{}")
    from lit_entropy.analysis.runs import read_scalars

    scalars = read_scalars(run_dir(tmp_path, "grpo", "none", 1))
    assert last_eval(scalars, f"{HELD_OUT_SAMPLED}pass@1") == pytest.approx(0.4)
    assert last_eval(scalars, f"{HELD_OUT_SAMPLED}pass@64") == pytest.approx(0.5)
    assert last_eval(scalars, f"{HELD_OUT_SAMPLED}pass@16") is None
    start = {f"{HELD_OUT_SAMPLED}pass@1": 0.02, f"{HELD_OUT_SAMPLED}pass@64": 0.375}
    plot(plan, tmp_path, tmp_path / "study.png", start=start)
    from PIL import Image

    with Image.open(tmp_path / "study.png") as im:  # five panels and the legend: two rows of three
        assert im.size[1] > 8 * 100 and im.size[0] < 2 * im.size[1]


def test_the_machine_names_its_gpus_whose_kernels_differ_from_the_cpus(tmp_path: Path) -> None:
    cpu_only = machine(tmp_path / "absent")
    assert " cores" in cpu_only and "H100" not in cpu_only
    for i in range(2):
        (tmp_path / f"0000:0{i}:00.0").mkdir()
        (tmp_path / f"0000:0{i}:00.0" / "information").write_text("Model: \t\t NVIDIA H100 80GB HBM3\nIRQ: 1\n")
    assert machine(tmp_path) == cpu_only + " | 2x NVIDIA H100 80GB HBM3"
