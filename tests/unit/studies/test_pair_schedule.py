"""Which evaluation runs a machine does so that seeds pair by machine and commit (studies/pair_schedule.py), and
the report reading a seed run on two machines (studies.protocol.collect)."""

from __future__ import annotations

import json
from pathlib import Path

from torch.utils.tensorboard import SummaryWriter

from lit_entropy.cli.train import FIT_FINISHED
from studies.method_study import StudyPlan, run_dir, run_study
from studies.pair_schedule import folders_of, owner, pair_folder, schedule, slot
from studies.protocol import Point, collect

A, B = "AMD EPYC | avx2 | 2 cores @ c1", "Intel Xeon | amx_tile | 2 cores @ c1"
BASE, METHOD = ("grpo", "none"), ("dapo", "none")
PLAN = StudyPlan(algos=["grpo", "dapo"], controllers=["none"], seeds=[0, 1])


def _started(folder: Path, *pairings: str, done: bool = False) -> Path:
    """A run with one attempt per pairing; finished (``done.json`` with them) or not (``attempts.json``)."""
    folder.mkdir(parents=True, exist_ok=True)
    attempts = [{"machine": p.split(" @ ")[0], "commit": p.split(" @ ")[1]} for p in pairings]
    (folder / "attempts.json").write_text(json.dumps(attempts))
    if done:
        (folder / "done.json").write_text(json.dumps({"returncode": 0, "attempts": attempts}))
    return folder


def _names(todo: list[tuple[str, str, int, Path]], out: Path) -> list[str]:
    return [f"{a} {s} {f.relative_to(out / 'runs' / (a + '+' + c)).as_posix()}" for a, c, s, f in todo]


def test_a_fresh_study_runs_each_seeds_baseline_before_its_methods(tmp_path: Path) -> None:
    assert _names(schedule(PLAN, tmp_path, BASE, A), tmp_path) == [
        "grpo 0 seed0", "dapo 0 seed0", "grpo 1 seed1", "dapo 1 seed1"]


def test_the_baseline_runs_again_here_when_its_seed_was_run_elsewhere(tmp_path: Path) -> None:
    _started(run_dir(tmp_path, *BASE, 0), B, done=True)
    _started(run_dir(tmp_path, *BASE, 1), A, done=True)
    todo = schedule(PLAN, tmp_path, BASE, A)
    assert _names(todo, tmp_path) == [f"grpo 0 {pair_folder(Path('seed0'), A).name}", "dapo 0 seed0", "dapo 1 seed1"]


def test_a_run_is_resumed_only_by_its_owner_and_another_machine_goes_on_with_the_rest(tmp_path: Path) -> None:
    _started(run_dir(tmp_path, *BASE, 0), B, done=True)
    _started(run_dir(tmp_path, *METHOD, 0), B)  # B's half-done method seed 0: left to B in pass 1
    todo = _names(schedule(PLAN, tmp_path, BASE, A), tmp_path)
    seed0_a = pair_folder(Path("seed0"), A).name
    assert todo == ["grpo 1 seed1", "dapo 1 seed1", f"grpo 0 {seed0_a}", f"dapo 0 {seed0_a}"]  # pass 2 last
    assert _names(schedule(PLAN, tmp_path, BASE, B), tmp_path)[:1] == ["dapo 0 seed0"]  # B resumes its own


def test_a_seed_paired_anywhere_is_not_run_again(tmp_path: Path) -> None:
    for seed in (0, 1):
        _started(run_dir(tmp_path, *BASE, seed), B, done=True)
        _started(run_dir(tmp_path, *METHOD, seed), B, done=True)
    assert schedule(PLAN, tmp_path, BASE, A) == []


def test_a_method_finished_here_gets_its_baseline_here(tmp_path: Path) -> None:
    _started(run_dir(tmp_path, *BASE, 0), B, done=True)
    _started(run_dir(tmp_path, *METHOD, 0), A, done=True)
    _started(run_dir(tmp_path, *METHOD, 1), B, done=True)  # B finished it without B's baseline 1
    todo = _names(schedule(PLAN, tmp_path, BASE, A), tmp_path)
    assert todo[0] == f"grpo 0 {pair_folder(Path('seed0'), A).name}"
    # seed 1: the baseline's first folder is free, so A takes it; the method runs again here in pass 2
    assert todo[1:] == ["grpo 1 seed1", f"dapo 1 {pair_folder(Path('seed1'), A).name}"]


def test_owner_and_slot(tmp_path: Path) -> None:
    first = run_dir(tmp_path, *BASE, 0)
    assert owner(first) is None and slot(tmp_path, *BASE, 0, A) == first  # nothing started: the first folder
    _started(first, A, B)  # moved machines: nobody's
    assert owner(first) is None and slot(tmp_path, *BASE, 0, A) == pair_folder(first, A)
    _started(pair_folder(first, A), A)
    assert slot(tmp_path, *BASE, 0, A) == pair_folder(first, A)  # its own, to resume
    assert folders_of(tmp_path, *BASE, 0) == [first, pair_folder(first, A)]


def test_the_schedule_runs_through_the_study_and_the_report_sees_both_runs_of_a_seed(tmp_path: Path) -> None:
    """End to end with a stand-in train.py: the baseline run here lands in seed0@…, collect keeps B's first run and this one as its
    alternate, each with the machine and commit it ran on."""
    base = ("grpo@g", "none")  # the baseline point's cell
    _started(run_dir(tmp_path, *base, 0), B, done=True)
    writer = SummaryWriter(str(run_dir(tmp_path, *base, 0) / "tensorboard"))
    writer.add_scalar("rollout/entropy", 0.9, 0)
    writer.add_scalar("rollout/accuracy", 0.5, 0)
    writer.close()
    fake = tmp_path / "fake_train.py"
    fake.write_text(
        "import sys\nfrom pathlib import Path\nfrom torch.utils.tensorboard import SummaryWriter\n"
        "d = Path([a for a in sys.argv if a.startswith('hydra.run.dir=')][0].split('=', 1)[1])\n"
        "w = SummaryWriter(str(d / 'tensorboard'))\nw.add_scalar('rollout/entropy', 0.4, 0)\n"
        "w.add_scalar('rollout/accuracy', 0.5, 0)\nw.close()\n"
        f"print({FIT_FINISHED!r})\n")
    plan = StudyPlan(algos=["grpo@g", "dapo@d"], controllers=["none"], seeds=[0])
    here = "Intel Xeon | amx_tile | 2 cores @ c9"  # the folder's name; the attempts record the real machine
    said: list[str] = []
    todo = schedule(plan, tmp_path, base, here)
    assert [(a, f.name) for a, _, _, f in todo] == [("grpo@g", pair_folder(Path("seed0"), here).name),
                                                    ("dapo@d", "seed0")]
    run_study(plan, tmp_path, fake, log=said.append, runs=todo)
    second = pair_folder(run_dir(tmp_path, *base, 0), here)
    assert (second / "done.json").is_file() and any(f"in {second.name}" in line for line in said)
    runs = collect(plan, tmp_path, [Point("grpo", "g", "grpo", "none", ()), Point("dapo", "d", "dapo", "none", ())])
    first = runs["g"][0]
    assert first["h_final"] > 0.8 and first["pairing"] == B  # the first folder's run
    [alt] = first["alternates"]
    assert alt["folder"] == second.name and abs(alt["h_final"] - 0.4) < 1e-6
    assert "alternates" not in runs["d"][0] and "folder" not in runs["d"][0]
    (run_dir(tmp_path, *base, 0) / "done.json").unlink()  # the first run unfinished: the second is the seed's
    (run_dir(tmp_path, *base, 0) / "study_stdout.log").write_text("killed\n")
    only = collect(plan, tmp_path, [Point("grpo", "g", "grpo", "none", ())])["g"][0]
    assert only["folder"] == second.name and "alternates" not in only



def _logged(folder: Path, pairing: str, entropy: float) -> None:
    """A finished run on ``pairing``'s machine and commit that logged one iteration."""
    _started(folder, pairing, done=True)
    writer = SummaryWriter(str(folder / "tensorboard"))
    writer.add_scalar("rollout/entropy", entropy, 0)
    writer.add_scalar("rollout/accuracy", 0.5, 0)
    writer.close()


def test_the_run_in_front_of_a_seed_is_the_one_its_pairs_share_a_machine_with(tmp_path: Path) -> None:
    """The baseline's seed 0 ran on B, then again on A where the method's seed 0 ran: the A run is in front (the one
    the cell table reads), B's is its alternate; with the method's run on B as well, the tie keeps the first."""
    base, method = ("grpo@g", "none"), ("dapo@d", "none")
    plan = StudyPlan(algos=["grpo@g", "dapo@d"], controllers=["none"], seeds=[0])
    points = [Point("grpo", "g", "grpo", "none", ()), Point("dapo", "d", "dapo", "none", ())]
    first = run_dir(tmp_path, *base, 0)
    _logged(first, B, 0.9)
    _logged(pair_folder(first, A), A, 0.4)
    _logged(run_dir(tmp_path, *method, 0), A, 0.3)
    front = collect(plan, tmp_path, points)["g"][0]
    assert front["pairing"] == A and front["folder"] == pair_folder(first, A).name
    assert [(s["pairing"], "folder" in s, "alternates" in s) for s in front["alternates"]] == [(B, False, False)]
    _logged(pair_folder(run_dir(tmp_path, *method, 0), B), B, 0.3)  # the method's seed on B too: one partner each
    front = collect(plan, tmp_path, points)["g"][0]
    assert front["pairing"] == B and [s["pairing"] for s in front["alternates"]] == [A]
