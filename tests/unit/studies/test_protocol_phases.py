"""A dress rehearsal of the verdicts study's end (studies/protocol_phases.py on conf/protocol/verdicts.yaml): its
9 tuning runs and 90 evaluation runs made by hand, with the tags, per-problem counts and attempts the real runs
write, then the evaluation phase without running anything (``--summarise-only``). The real runs take hundreds of
lane-hours; this proves now that their records will give the declared picks, the 24 claims under Holm, the problem
bootstrap, the pairing, the figure and the recommendation the README and ``experiment=real_lm`` follow."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
from torch.utils.tensorboard import SummaryWriter

from studies.method_study import run_dir
from studies.pair_schedule import pair_folder
from studies.pairs import pass_at_k
from studies.protocol import collect, load_protocol, pick, picked_points
from studies.protocol_phases import (
    compute_line,
    every_run,
    fp32_kernels_line,
    front_folders,
    recommendation_line,
    run_phase,
    stopped_line,
    study_recommendation,
)
from studies.records import export_records
from tests.helpers import CONF, ROOT

VERDICTS = CONF / "protocol" / "verdicts.yaml"
HELD_OUT, RETENTION, TUNING = 256, 64, 128
HERE = [{"machine": "AMD EPYC | avx2 | 2 cores", "commit": "1d431ff"}]


def _counts(rng: np.random.Generator, ease: np.ndarray, lift: float, n: int) -> list[int]:
    """Correct samples of ``n`` per problem: each problem's chance ``ease`` raised by ``lift`` (clipped)."""
    return [int(c) for c in rng.binomial(n, np.clip(ease + lift, 0.0, 1.0))]


def _run(folder: Path, splits: dict[str, tuple[np.ndarray, float, int]], seed: int, dose: dict[str, float],
         attempts: list[dict[str, str]] = HERE, iterations: int = 60) -> dict[str, float]:
    """One finished run: entropy and accuracy per iteration, the dose's tag, and after the last iteration each
    split's evaluation (greedy, and ``n`` samples a problem) logged and written per problem, as callbacks.eval
    does. ``splits``: split -> (the problems' ease, the run's lift, samples). Returns its tags' last values."""
    rng = np.random.default_rng(seed)
    writer = SummaryWriter(str(folder / "tensorboard"))
    for i in range(1, iterations + 1):
        writer.add_scalar("rollout/entropy", 0.4 + 1.8 * 0.95**i, i)
        writer.add_scalar("rollout/accuracy", 0.3 * (1 - 0.97**i), i)
        for tag, value in dose.items():
            writer.add_scalar(tag, value, i)
    logged, per_problem = {}, {}
    for split, (ease, lift, n) in splits.items():
        sampled, greedy = _counts(rng, ease, lift, n), _counts(rng, ease, lift, 1)
        problems = [f"{split} problem {j}" for j in range(len(ease))]
        per_problem[split] = {
            "sampled": {"problem": problems, "num_samples": [n] * len(ease), "num_correct": sampled},
            "greedy": {"problem": problems, "num_samples": [1] * len(ease), "num_correct": greedy}}
        for k in (k for k in (1, 8, 64) if k <= n):
            logged[f"eval/{split}/sampled/pass@{k}"] = float(np.mean([pass_at_k(n, c, k) for c in sampled]))
        logged[f"eval/{split}/greedy/pass@1"] = float(np.mean(greedy))
    for tag, value in logged.items():
        writer.add_scalar(tag, value, iterations)
    writer.close()
    (folder / "eval_problems").mkdir()
    (folder / "eval_problems" / f"iteration-{iterations:04d}.json").write_text(
        json.dumps({"iteration": iterations, "splits": per_problem}))
    (folder / "done.json").write_text(json.dumps({"returncode": 0, "seconds": 100.0, "attempts": attempts}))
    return logged


DOSE = {"dapo": {"train/clipfrac_high": 0.004}, "stare": {"train/stare_reweighted_frac": 0.03},
        "kl_cov": {"train/masked_frac_kl_cov": 0.009}, "repo_r": {"control/repo_lambda": 0.2}}
"""The tag and a value above its threshold of each dose the study's methods are judged by (MaxRL has none)."""

LIFTS = {  # method -> (held-out lift, retention lift), the same on every seed, and its dose
    "grpo": (0.0, 0.0, {}),
    "dapo": (0.0, 0.0, DOSE["dapo"]),                       # no effect: no claim survives
    "stare": (0.10, 0.0, DOSE["stare"]),                    # lifts held-out; seed 9 on another commit
    "kl_cov": (-0.06, 0.0, DOSE["kl_cov"]),                 # lowers held-out pass@1: the claim is rejected
    "repo_r": (0.12, 0.0, {"control/repo_lambda": 0.0}),    # a lift without its dose: not tested
    "maxrl": (0.0, 0.15, {}),                               # forgets less: no dose rule, judged as is
    "dapo_kl_cov": (0.12, 0.0, DOSE["kl_cov"]),             # lifts held-out
    "dapo_stare": (0.0, 0.0, DOSE["stare"]),
    "dapo_repo_r": (0.0, 0.0, DOSE["repo_r"]),
}


def _tune(out: Path, protocol) -> None:
    """The 9 tuning runs on the tuning split: GRPO's 1e-5 best, then each candidate's grid at it, the second
    point best for dapo_kl_cov (its k=0.01) and the first for the others."""
    ease = np.random.default_rng(7).uniform(0.0, 0.6, TUNING)
    grpo = {"grpo-lr1e-05": 0.05, "grpo-lr2e-05": 0.0, "grpo-lr5e-05": -0.1}
    for p in protocol.methods["grpo"].points():
        _run(run_dir(out / "tune", *p.cell, 100), {"tuning": (ease, grpo[p.name], 8)}, 100, {})
    for method in ("dapo_kl_cov", "dapo_stare", "dapo_repo_r"):
        for i, p in enumerate(protocol.methods[method].points((("optim.lr", 1.0e-5),))):
            lift = 0.1 if (i == 1) == (method == "dapo_kl_cov") else 0.0
            _run(run_dir(out / "tune", *p.cell, 100), {"tuning": (ease, lift, 8)}, 100,
                 LIFTS[method][2])


def test_the_verdicts_study_s_records_give_its_declared_report(tmp_path: Path) -> None:
    protocol = load_protocol(VERDICTS)
    _tune(tmp_path, protocol)
    rng = np.random.default_rng(0)
    ease = {"held_out": rng.uniform(0.0, 0.4, HELD_OUT), "retention": rng.uniform(0.1, 0.7, RETENTION)}
    picks = json.loads(json.dumps(pick(protocol, tmp_path / "tune")))  # as read back from picks.json
    assert {m: v["point"] for m, v in picks["methods"].items() if m.startswith(("grpo", "dapo_"))} == {
        "grpo": "grpo-lr1e-05", "dapo_kl_cov": "dapo_kl_cov-k0.01_lr1e-05", "dapo_stare": "dapo_stare-w1.2_lr1e-05",
        "dapo_repo_r": "dapo_repo_r-lam_max0.3_lr1e-05"}
    for index, p in enumerate(picked_points(picks, protocol)):
        held, kept, dose = LIFTS[p.method]
        for seed in protocol.evaluation_seeds:
            other = p.method == "stare" and seed == 9  # another commit: no pair with GRPO's seed 9
            _run(run_dir(tmp_path / "evaluate", *p.cell, seed),
                 {"held_out": (ease["held_out"], held, 64), "retention": (ease["retention"], kept, 64)},
                 seed * 100 + index, dose,
                 [{**HERE[0], "commit": "0000000"}] if other else HERE)
    report = run_phase(protocol, "evaluate", tmp_path, ROOT / "scripts" / "train.py", run=False)

    verdicts = report[report.index("| method | setting | dose | claim |"):].split("\n\n")[0].splitlines()[2:]
    rows = {(r[0], r[3]): r for r in ([c.strip() for c in line.strip("|").split("|")] for line in verdicts)}
    assert len(rows) == 24, sorted(rows)
    label = {key: r[-2].strip("*") for key, r in rows.items()}
    claim = lambda metric: next(k[1] for k in rows if k[1].startswith(metric))  # noqa: E731
    p1, p64, re1 = claim("ho_pass@1"), claim("ho_pass@64"), claim("re_pass@1")
    # a lift on all 10 seeds: p = 1/1024, under Holm's first step 0.05/24
    assert label[("dapo_kl_cov", p1)] == label[("dapo_kl_cov", p64)] == "reproduced"
    assert label[("maxrl", re1)] == "reproduced"
    # the lift on the 9 paired seeds: p = 1/512, Holm's sixth step 19/512 = 0.037 (five claims at 1/1024 before it,
    # repo_r's two among them: a claim without its dose still counts in the family); seed 9 is named as left out
    assert label[("stare", p1)] == "reproduced" and rows[("stare", p1)][8:10] == ["0.0020", "0.0371"]
    assert rows[("stare", p1)][4] == "9" and "seed(s) 9 left out" in rows[("stare", p1)][-1]
    assert label[("repo_r", p1)] == "not tested at this dose"
    assert label[("kl_cov", p1)] == "not reproduced" and rows[("kl_cov", p1)][5].startswith("-")
    assert all(label[("dapo", c)] == "not reproduced" for c in (p1, p64, re1))
    # beside each test, the two-level bootstrap over seeds and problems, from the per-problem counts
    assert all(float(rows[key][7].strip("[]").split(",")[0]) > 0.05 for key in (("stare", p1), ("dapo_kl_cov", p1)))
    assert all(r[7].startswith("[") for r in rows.values())
    assert (tmp_path / "evaluate.md").read_text() == report + "\n"
    assert (tmp_path / "evaluate.png").stat().st_size > 10_000
    # GRPO's seed 0 run first on another machine (its plain folder), then here beside the methods (seed0@…): the
    # cell table reads the run here, the one the verdicts pair, and the report's cells and verdicts stay as they were
    seed0 = run_dir(tmp_path / "evaluate", *picked_points(picks, protocol)[0].cell, 0)
    shutil.move(seed0, pair_folder(seed0, f"{HERE[0]['machine']} @ {HERE[0]['commit']}"))
    _run(seed0, {"held_out": (ease["held_out"], 0.3, 64), "retention": (ease["retention"], 0.3, 64)}, 0, {},
         [{"machine": "Intel Xeon | amx_tile | 2 cores", "commit": "1d431ff"}])
    again = run_phase(protocol, "evaluate", tmp_path, ROOT / "scripts" / "train.py", run=False)
    assert again.split("\n\n")[0] == report.split("\n\n")[0]  # the cell table
    block = lambda text: text[text.index("| method | setting | dose | claim |"):].split("\n\n")[0]  # noqa: E731
    assert block(again) == block(report)  # the verdicts
    plan = protocol.plan(picked_points(picks, protocol), protocol.all_evaluation_seeds())
    drawn = front_folders(collect(plan, tmp_path / "evaluate", picked_points(picks, protocol)),
                          tmp_path / "evaluate")  # the figure's runs
    assert drawn(*picked_points(picks, protocol)[0].cell, 0) == pair_folder(seed0, f"{HERE[0]['machine']} @ "
                                                                                   f"{HERE[0]['commit']}")
    assert drawn(*picked_points(picks, protocol)[1].cell, 0) == run_dir(tmp_path / "evaluate",
                                                                        *picked_points(picks, protocol)[1].cell, 0)
    shutil.rmtree(seed0)
    shutil.move(pair_folder(seed0, f"{HERE[0]['machine']} @ {HERE[0]['commit']}"), seed0)
    # the declared recommendation: dapo_kl_cov and stare win both held-out claims, dapo_kl_cov by the larger pass@1
    assert "then the largest mean difference in ho_pass@1; none: grpo): **dapo_kl_cov**." in report
    export_records(tmp_path, tmp_path / "records.json.gz")
    assert study_recommendation(VERDICTS, tmp_path / "records.json.gz").name == "dapo_kl_cov-k0.01_lr1e-05"
    # one evaluation run unfinished: nothing is recommended but the baseline
    last = run_dir(tmp_path / "evaluate", *picked_points(picks, protocol)[-1].cell, 9)
    (last / "done.json").unlink()  # the study started it (its log) and has not finished it
    (last / "study_stdout.log").write_text("iteration 59/60\n")
    assert recommendation_line(protocol, [], 1).endswith("none: grpo): none yet, 1 evaluation run(s) unfinished; "
                                                         "until then grpo.")
    export_records(tmp_path, tmp_path / "records.json.gz")
    assert study_recommendation(VERDICTS, tmp_path / "records.json.gz").name == "grpo-lr1e-05"


def test_a_seed_run_again_on_another_machine_counts_in_the_report_lines() -> None:
    """A seed's run on a second machine (``alternates``) is a run: its compute adds to the study's, and a flag it
    carries (the fp32 kernels, a stop) names it by its folder; the first run keeps its plain seed."""
    again = {"folder": "seed0@ab12cd34", "compute_seconds": 1800.0, "bf16_via_fp32": False, "stopped_at": 7}
    runs = {"grpo": {0: {"compute_seconds": 3600.0, "bf16_via_fp32": True, "alternates": [again]}},
            "dapo": {1: {"compute_seconds": 900.0}}}
    assert [(cell, seed) for cell, seed, _ in every_run(runs)] == [("dapo", "1"), ("grpo", "0"),
                                                                   ("grpo", "0 (seed0@ab12cd34)")]
    assert compute_line(runs).endswith("3 runs, 1.8 lane-hours (dapo 0.2 h over 1; grpo 1.5 h over 2).")
    assert fp32_kernels_line(runs).endswith("the rest of the run as declared): grpo seed 0.")
    assert stopped_line(runs).endswith(": grpo seed 0 (seed0@ab12cd34) after iteration 7.")

