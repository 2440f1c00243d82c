"""A protocol's phases run and reported (:mod:`studies.protocol` defines the protocol and its picks):
``tune`` writes ``picks.json`` and the tuning table, ``evaluate`` the study table with each method's dose, the
verdicts by :mod:`studies.verdicts` and the figure."""

from __future__ import annotations

import copy
import hashlib
import json
import statistics
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from studies.dose import dose_cell, dose_legend, dose_series, method_of, window_means
from studies.lab_to_real import compare_verdicts
from studies.method_study import COLUMNS, cell_name, cell_table, run_dir, run_study
from studies.pair_schedule import here, schedule
from studies.protocol import (
    Point,
    Protocol,
    collect,
    current_tuning_points,
    eval_columns,
    evaluation_points,
    load_protocol,
    pass_k,
    pick,
    picked_points,
    waiting_methods,
)
from studies.seed_claims import judge_seed_claims, law_table, seed_claims_table
from studies.verdicts import IntervalRule, Verdict, judge, recommended, verdict_report


def tuning_table(picks: dict[str, Any]) -> str:
    """The tuning result: every point's criterion per seed and mean, its dose, and the pick."""
    lines = [f"Criterion (declared before the runs): mean of {', '.join(picks['criterion'])} after the last "
             f"iteration; tuning seeds {picks['tuning_seeds']}.", "",
             "| method | setting | criterion per seed | mean | dose | pick |", "|---|---|---|---|---|---|"]
    for method, chosen in picks["methods"].items():
        if not chosen["grid"]:
            lines.append(f"| {method} | {chosen['setting']} | one setting: not tuned | — | — | **pick** |")
        for row in chosen["grid"]:
            seeds = ", ".join(f"{s}: {v:.3f}" for s, v in sorted(row["scores"].items(), key=lambda kv: int(kv[0])))
            dose = f"{row['dose']:.4f}" if row["dose"] is not None else "—"
            mark = "**pick**" if row["point"] == chosen["point"] else ""
            lines.append(f"| {method} | {row['setting']} | {seeds} | {row['mean']:.3f} | {dose} | {mark} |")
    for method, missing in picks["incomplete"].items():
        lines.append(f"| {method} | — | unfinished: {', '.join(missing[:3])}{' …' if len(missing) > 3 else ''} | — | — | none |")
    return "\n".join(lines)


def tuning_columns(protocol: Protocol) -> tuple[str, ...]:
    """The tuning runs' columns: the criterion's metrics, the greedy score of their split where they read one
    (``tu_greedy``: sampled and greedy apart), then final entropy, last-20 training accuracy, median seconds an
    iteration and the dose."""
    splits = dict.fromkeys(m.split("_", 1)[0] for m in protocol.criterion if "_" in m and pass_k(m))
    return (*protocol.criterion, *(f"{s}_greedy" for s in splits if f"{s}_greedy" in COLUMNS), "h_final",
            "acc_last20", "s_per_it_median", "dose")


def tuning_runs_table(protocol: Protocol, out: Path) -> str:
    """Every finished tuning run under ``out`` (the tuning phase's folder) on its own row, at the points the phase
    runs now (with ``tune.calibrate_first``, the others' at the baseline's pick): what the criterion's one number
    hides, entropy first. "" when none is finished."""
    points = current_tuning_points(protocol, out)
    runs = collect(protocol.plan(points, protocol.tuning_seeds, phase="tune"), out, points)
    return runs_table(points, runs, tuning_columns(protocol)).replace(
        "the cell table's columns for each finished run", "each finished tuning run", 1)


def nearest_methods(protocol: Protocol, picks: dict[str, Any], out: Path) -> list[str]:
    """``protocol.nearest``'s methods, chosen once from the runs under ``out`` and kept in ``out/nearest.json`` (a
    resumed study keeps its choice); their extra seeds are set on ``protocol.extra_seeds``."""
    f = out / "nearest.json"
    if f.is_file():
        chosen = json.loads(f.read_text())["methods"]
    else:
        points = picked_points(picks, protocol)
        runs = collect(protocol.plan(points, protocol.all_evaluation_seeds()), out, points)
        base, metric = runs.get(points[0].name, {}), protocol.nearest["metric"]
        gaps = {}
        for p in points[1:]:
            mine = runs.get(p.name, {})
            diffs = [mine[s][metric] - base[s][metric] for s in sorted(set(mine) & set(base))
                     if mine[s].get(metric) is not None and base[s].get(metric) is not None]
            if diffs:
                gaps[p.method] = abs(sum(diffs) / len(diffs))
        chosen = sorted(gaps, key=lambda m: (gaps[m], m))[: protocol.nearest["methods"]]
        f.write_text(json.dumps({"metric": metric, "gaps": gaps, "methods": chosen}, indent=1))
    protocol.extra_seeds = {m: list(protocol.nearest["seeds"]) for m in chosen}
    return chosen


def nearest_line(protocol: Protocol, out: Path) -> str:
    """The methods chosen as nearest the baseline (``out/nearest.json``), with every method's gap; "" before the
    choice."""
    f = out / "nearest.json"
    if not protocol.nearest or not f.is_file():
        return ""
    choice = json.loads(f.read_text())
    gaps = ", ".join(f"{m} {g:.3f}" for m, g in sorted(choice["gaps"].items(), key=lambda mg: (mg[1], mg[0])))
    return (f"**Nearest {protocol.baseline}** (`nearest.json`, chosen once by code when every method's first seeds "
            f"were in: the smallest |mean paired difference| in {COLUMNS.get(choice['metric'], choice['metric'])}): "
            f"{', '.join(choice['methods'])}, which also run seeds {', '.join(map(str, protocol.nearest['seeds']))}. "
            f"Gaps: {gaps}.")


def evaluation_report(protocol: Protocol, picks: dict[str, Any], out: Path, extra: list[str] = (),
                      runs: dict[str, dict[int, dict[str, Any]]] | None = None) -> str:
    """The evaluation table (with dose) and the verdicts below the rule's text; then which labels the other
    interval, and each control as the baseline, would change; the seed papers' claims; the lab's verdicts beside
    these (``lab``). ``runs``: the evaluation points' runs, collected already (:func:`studies.protocol.collect`);
    read here when None."""
    if protocol.nearest and (out / "nearest.json").is_file():
        nearest_methods(protocol, picks, out)
    points = picked_points(picks, protocol)
    controls = protocol.control_points()
    plan = protocol.plan([*points, *controls], protocol.all_evaluation_seeds(), extra)
    columns = tuple(protocol.columns or eval_columns(protocol.eval["ks"]))
    if runs is None:
        runs = collect(plan, out, [*points, *controls])
    cells: dict[str, list[dict[str, Any]]] = {}
    for algo, controller, seed in plan.runs():  # each seed's run in front (collect): one machine's where it has two
        if seed in runs.get(algo.partition("@")[2], {}):
            cells.setdefault(cell_name(algo, controller), []).append(runs[algo.partition("@")[2]][seed])
    table = cell_table(cells, columns, sort_by=next((c for c in reversed(columns) if pass_k(c)), "acc_last20"))
    by_method = {p.method: runs.get(p.name, {}) for p in points}
    dose_of = {p.method: method_of(p.algo, p.controller) for p in points}
    verdicts = _judged(protocol, picks, by_method, by_method[protocol.baseline], protocol.interval, dose_of)
    legend = dose_legend(list(dose_of.values()))
    other = IntervalRule(kind="t") if protocol.interval.kind == "bootstrap" else IntervalRule()
    check = _judged(protocol, picks, by_method, by_method[protocol.baseline], other, dose_of, labels_only=True)
    against = [control_line(verdicts, _judged(protocol, picks, by_method, runs.get(c.name, {}), protocol.interval,
                                              dose_of, labels_only=True), protocol.baseline, c)
               for c in controls]
    seeds = ""
    if protocol.seed_claims:
        cells = {**by_method, **{c.name: runs.get(c.name, {}) for c in controls}}
        seeds = ("**The seed papers' own claims** (studies/seed_claims.py): a cell's metric against a level "
                 "(its per-seed values minus the level) or against another cell (paired by seed), the same interval and "
                 "labels.\n\n" + seed_claims_table(judge_seed_claims(protocol.seed_claims, cells, protocol.interval,
                                                                    dose_of)))
        law = law_table(protocol.seed_claims, cells)
        if law:
            seeds += "\n\n**The entropy–performance law per run** (R = −a·exp(H) + b; seed 001):\n\n" + law
    lab = lab_table(protocol, verdicts) if protocol.lab else ""
    missing = unfinished(protocol.plan(points, protocol.all_evaluation_seeds(), extra), runs)
    blocks = (table.split("\n\n")[0], runs_table([*points, *controls], runs, columns), stopped_line(runs),
              fp32_kernels_line(runs), compute_line(runs), nearest_line(protocol, out), legend, dose_trajectory_table(points, runs, out, protocol.iterations),
              verdict_report(verdicts, protocol.baseline, protocol.interval), sensitivity(verdicts, check, other.kind),
              recommendation_line(protocol, verdicts, missing), *against, seeds, lab)
    return "\n\n".join(x for x in blocks if x)


def unfinished(plan, runs: dict[str, dict[int, dict[str, Any]]]) -> int:
    """How many of ``plan``'s runs (a protocol plan: cells ``algo@point``) have no finished run in ``runs``
    (:func:`studies.protocol.collect`'s point -> seed -> summary)."""
    return sum(1 for algo, _, seed in plan.runs() if seed not in runs.get(algo.partition("@")[2], {}))


def recommendation_line(protocol: Protocol, verdicts: list[Verdict], missing: int) -> str:
    """The study's recommendation by its declared rule (``recommend``), or why there is none yet: '' for a
    protocol that declares no rule."""
    if not protocol.recommend:
        return ""
    rule = (f"**The recommendation** (the rule declared in the protocol: a method *reproduced* on "
            f"{' and '.join(protocol.recommend)}; of several, the most claims reproduced, then the largest mean "
            f"difference in {protocol.recommend[0]}; none: {protocol.baseline}): ")
    if missing:
        return rule + f"none yet, {missing} evaluation run(s) unfinished; until then {protocol.baseline}."
    chosen = recommended(verdicts, protocol.baseline, protocol.recommend)
    return rule + (f"**{chosen}**." if chosen != protocol.baseline else f"no method wins: **{chosen}**.")


def study_recommendation(protocol_path: Path, records: Path) -> Point:
    """The picked point the protocol recommends (``recommend``) from its records file alone: the baseline's until
    every method has its pick and every evaluation run is in (a study under way recommends nothing new), then
    :func:`studies.verdicts.recommended` on the verdicts. What ``experiment=real_lm`` follows (issue 77)."""
    protocol = load_protocol(protocol_path)
    picks, points, plan, runs = _from_records(protocol, records, ready_only=True)
    if waiting_methods(picks, protocol) or not protocol.recommend or unfinished(plan, runs):
        return points[0]
    verdicts = _records_verdicts(protocol, picks, points, runs, labels_only=True)
    chosen = recommended(verdicts, protocol.baseline, protocol.recommend)
    return next(p for p in points if p.method == chosen)


def seed_runs(seed: int, front: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """(name, summary) of each run of one cell's seed: the run in front (:func:`studies.protocol.collect`), then its
    ``alternates``; a run in a ``seed{k}@…`` folder (the seed run again on another machine) is named
    ``<seed> (<folder>)``, the plain folder's run ``<seed>``."""
    return [(f"{seed} ({s['folder']})" if "folder" in s else f"{seed}", s) for s in (front, *front.get("alternates", ()))]


def every_run(runs: dict[str, dict[int, dict[str, Any]]]) -> list[tuple[str, str, dict[str, Any]]]:
    """(cell, seed's name, summary) of every finished run, in cell and seed order (:func:`seed_runs`)."""
    return [(cell, name, s) for cell, seeds in sorted(runs.items()) for seed, front in sorted(seeds.items())
            for name, s in seed_runs(seed, front)]


def runs_table(points: list[Point], runs: dict[str, dict[int, dict[str, Any]]], columns: tuple[str, ...]) -> str:
    """Every finished run on its own row (cell in the protocol's order, then seed): the cell table's means hide
    which seed did what, and a run the stop rule ended or a cell whose seeds disagree shows here. ""
    when no run is finished."""
    keys = [c for c in columns if not c.endswith("_mid")]  # the mid-run evaluations stay in the cell table
    if "h_min" not in keys:  # the lowest entropy: a fall the run undid before its end
        keys[keys.index("h_final") + 1 if "h_final" in keys else 0:0] = ["h_min"]
    lines = ["**Run by run** (the cell table's columns for each finished run):", "",
             "| cell | seed | " + " | ".join(COLUMNS[k] for k in keys) + " |", "|" + "---|" * (2 + len(keys))]
    for p in points:
        for seed, front in sorted(runs.get(p.name, {}).items()):
            for name, s in seed_runs(seed, front):  # a seed run again on another machine: its own row
                cells = [dose_cell(method_of(p.algo, p.controller), [s.get(k)]) if k == "dose"
                         else "—" if s.get(k) is None else f"{s[k]:.3f}" for k in keys]
                lines.append(f"| {p.name} | {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines) if len(lines) > 4 else ""


DOSE_WINDOW = 10
"""Iterations per column of the dose-over-the-run table."""


def dose_trajectory_table(points: list[Point], runs: dict[str, dict[int, dict[str, Any]]], out: Path,
                          iterations: int, window: int = DOSE_WINDOW) -> str:
    """The dose's course over the run (λ's sign and its bound, a clip fraction that dies out, a band entered
    late), which its mean in the cell table hides: per method, the scalars behind its dose
    (:func:`studies.dose.dose_series`), each seed's mean over every ``window`` iterations, averaged over the
    seeds that reached the window. "" when no finished run has a dose scalar."""
    from lit_entropy.analysis.runs import read_scalars, values

    spans = [(a + 1, min(a + window, iterations)) for a in range(0, iterations, window)]
    lines = []
    for p in points:
        method = method_of(p.algo, p.controller)
        per_name: dict[str, list[list[float]]] = {}
        for seed in sorted(runs.get(p.name, {})):
            s = {tag: values(pts) for tag, pts in read_scalars(run_dir(out, *p.cell, seed)).items()}
            done = len(s.get("rollout/entropy", []))
            for name, xs in dose_series(method, s):
                per_name.setdefault(name, []).append(window_means(xs, done, window))
        for name, seeds in per_name.items():
            cells = []
            for w in range(len(spans)):
                got = [m[w] for m in seeds if w < len(m)]
                cells.append(f"{statistics.mean(got):.4f}" if got else "—")
            lines.append(f"| {p.method} | {name} | {len(seeds)} | " + " | ".join(cells) + " |")
    if not lines:
        return ""
    head = [f"**Dose over the run** (the scalars behind each method's dose: each seed's mean over every {window} "
            "iterations, averaged over the seeds that reached them; REPO's λ signed, Entrocraft's the fraction of "
            "iterations with m ≠ 0):", "",
            "| method | scalar | seeds | " + " | ".join(f"iterations {a}–{b}" for a, b in spans) + " |",
            "|" + "---|" * (3 + len(spans))]
    return "\n".join(head + lines)


def stopped_line(runs: dict[str, dict[int, dict[str, Any]]]) -> str:
    """The runs ``callbacks/stop=diverged`` ended early (each summary's ``stopped_at``), or "" when none was: their
    columns are read at the stop, the final evaluation included."""
    stopped = [f"{cell} seed {seed} after iteration {s['stopped_at']}" for cell, seed, s in every_run(runs)
               if s.get("stopped_at") is not None]
    if not stopped:
        return ""
    return ("**Stopped as diverged** (`callbacks/stop=diverged`; their columns are read at the stop, the final "
            "evaluation included): " + "; ".join(stopped) + ".")


def fp32_kernels_line(runs: dict[str, dict[int, dict[str, Any]]]) -> str:
    """The runs whose bf16 linear layers ran through fp32 kernels (each summary's ``bf16_via_fp32``), or "" when
    none did."""
    marked = [f"{cell} seed {seed}" for cell, seed, s in every_run(runs) if s.get("bf16_via_fp32")]
    if not marked:
        return ""
    return ("**bf16 linear layers through fp32 kernels** (on a CPU without bf16 units, `studies/bf16_via_fp32.py`: "
            "the bf16-rounded operands multiplied by the fp32 GEMM, its output rounded to bf16; the rest of the "
            "run as declared): " + "; ".join(marked) + ".")


def compute_line(runs: dict[str, dict[int, dict[str, Any]]]) -> str:
    """The compute of the finished runs (each summary's ``compute_seconds``; a seed run again on another machine
    counts too), in total and per cell, or "" when no run logged its stage times."""
    cells: dict[str, list[float]] = {}
    for cell, _, s in every_run(runs):
        if s.get("compute_seconds") is not None:
            cells.setdefault(cell, []).append(s["compute_seconds"])
    if not cells:
        return ""
    total = sum(sum(secs) for secs in cells.values())
    per_cell = "; ".join(f"{cell} {sum(secs) / 3600:.1f} h over {len(secs)}" for cell, secs in cells.items())
    return (f"**Compute** (time/generate + score + sync + prepare + update + evaluate summed over every logged "
            f"iteration of the finished runs, the evaluations included; start-up, checkpoint saves and the work an "
            f"interruption lost are not in it): "
            f"{sum(len(s) for s in cells.values())} runs, {total / 3600:.1f} lane-hours ({per_cell}).")


def lab_table(protocol: Protocol, verdicts: list[Verdict]) -> str:
    """The block that sets the ``lab`` protocol's verdicts, rebuilt from its records, beside ``verdicts``."""
    lab = records_verdicts(_from_root(protocol.lab["protocol"]), _from_root(protocol.lab["records"]))
    return (f"**The lab's verdicts beside these** ({protocol.lab['protocol']}, rebuilt from {protocol.lab['records']}; "
            f"studies/lab_to_real.py):\n\n" + compare_verdicts(lab, verdicts))


def _judged(protocol: Protocol, picks: dict[str, Any], by_method: dict[str, dict[int, dict[str, Any]]],
            baseline_runs: dict[int, dict[str, Any]], rule: IntervalRule, dose_of: dict[str, str],
            labels_only: bool = False) -> list[Verdict]:
    """Every method's claims against ``baseline_runs`` (the baseline's, or a control's) by ``rule``;
    ``labels_only``: without the problem-level intervals (a check that compares labels)."""
    settings = {m: picks["methods"][m]["setting"] for m in by_method}
    claims = {m: protocol.claims_of(m) for m in by_method}
    return judge({**by_method, protocol.baseline: baseline_runs}, protocol.baseline, claims, rule, settings,
                 dose_of=dose_of, problem_intervals=not labels_only)


_REBUILT_VERDICTS: dict[tuple[str, ...], list[Verdict]] = {}
""":func:`records_verdicts`' results by the sha256 digests of (protocol file, records file)."""


def records_verdicts(protocol_path: Path, records: Path) -> list[Verdict]:
    """A protocol's verdicts against its baseline, rebuilt from its records file (picked again, nothing run).

    A pure function of the two files' bytes, so a process rebuilds each pair once (the real-LM report, the relabel
    pages and the lab-to-real table all set the lab's verdicts beside theirs): remembered by the files' digests."""
    key = tuple(hashlib.sha256(Path(file).read_bytes()).hexdigest() for file in (protocol_path, records))
    if key not in _REBUILT_VERDICTS:
        _REBUILT_VERDICTS[key] = _rebuild_verdicts(protocol_path, records)
    return copy.deepcopy(_REBUILT_VERDICTS[key])


def _rebuild_verdicts(protocol_path: Path, records: Path) -> list[Verdict]:
    protocol = load_protocol(protocol_path)
    picks, points, _, runs = _from_records(protocol, records)
    return _records_verdicts(protocol, picks, points, runs)


def _from_records(protocol: Protocol, records: Path, ready_only: bool = False):
    """``(picks, picked points, evaluation plan, collected runs)`` of a protocol from its records file alone
    (imported into a temporary folder, picked again, nothing run); ``ready_only``: the methods with a pick only."""
    from studies.records import import_records

    with tempfile.TemporaryDirectory() as tmp:
        import_records(records, Path(tmp))
        picks = json.loads(json.dumps(pick(protocol, Path(tmp) / "tune")))  # as read back from picks.json
        points = picked_points(picks, protocol, ready_only=ready_only)
        plan = protocol.plan(points, protocol.all_evaluation_seeds())
        return picks, points, plan, collect(plan, Path(tmp) / "evaluate", points)


def _records_verdicts(protocol: Protocol, picks: dict[str, Any], points: list[Point],
                      runs: dict[str, dict[int, dict[str, Any]]], labels_only: bool = False) -> list[Verdict]:
    by_method = {p.method: runs.get(p.name, {}) for p in points}
    dose_of = {p.method: method_of(p.algo, p.controller) for p in points}
    return _judged(protocol, picks, by_method, by_method[protocol.baseline], protocol.interval, dose_of, labels_only)


def _from_root(path: str) -> Path:
    """A path of a protocol file: as given where it exists (relative to the working folder), else from the
    checkout's root."""
    return Path(path) if Path(path).exists() else Path(__file__).resolve().parents[1] / path


def control_line(verdicts: list[Verdict], others: list[Verdict], baseline: str, control: Point) -> str:
    """Every claim judged against ``control`` (the baseline at another setting) by the same rule, and which
    labels that changes."""
    changed = [f"{v.method} {v.claim.metric}: {v.label} → {o.label}"
               for v, o in zip(verdicts, others, strict=True) if v.label != o.label]
    head = f"Against the control {baseline} at {control.setting} instead of the pick"
    lines = [f"{head}, no label changes." if not changed else f"{head}, these labels change: " + "; ".join(changed) + ".",
             "", "| method | claim | Δ vs control (mean) | 95 % interval | label against the control |", "|---|---|---|---|---|"]
    for o in others:
        mean = "—" if o.mean is None else f"{o.mean:+.3f}"
        interval = "—" if o.interval is None else f"[{o.interval[0]:+.3f}, {o.interval[1]:+.3f}]"
        lines.append(f"| {o.method} | {o.claim.metric} {o.claim.direction} | {mean} | {interval} | {o.label} |")
    return "\n".join(lines)


def sensitivity(verdicts: list[Verdict], others: list[Verdict], kind: str) -> str:
    """A line saying which labels the other interval (``t`` for a bootstrap protocol, and back) would change:
    the rule stays the declared one; this says how much a verdict leans on it."""
    changed = [f"{v.method} {v.claim.metric}: {v.label} → {o.label} ([{o.interval[0]:+.3f}, {o.interval[1]:+.3f}])"
               for v, o in zip(verdicts, others, strict=True) if v.label != o.label and o.interval is not None]
    head = f"With a paired {'t' if kind == 't' else 'bootstrap'} interval instead of the declared one"
    return f"{head}, no label changes." if not changed else f"{head}, these labels change: " + "; ".join(changed) + "."


def _run_paired(protocol: Protocol, plan, baseline: tuple[str, str], out: Path, train_script: Path, log,
                lanes: int) -> None:
    """The evaluation runs, each seed's pairs on one machine at one commit where the protocol pairs so
    (:mod:`studies.pair_schedule`), else every planned run in its one folder."""
    if protocol.interval.pairing != "seed_machine_commit":
        run_study(plan, out, train_script, log=log, lanes=lanes)
        return
    pairing = here(train_script)
    runs = schedule(plan, out, baseline, pairing)
    log(f"[study] {len(runs)} runs on {pairing} (pairs by machine and commit)")
    run_study(plan, out, train_script, log=log, lanes=lanes, runs=runs)


def evaluate_ready(protocol: Protocol, picks: dict[str, Any], out: Path, train_script: Path, lanes: int = 1,
                   extra: list[str] = (), log=print, run: bool = True) -> str:
    """The evaluation runs of the methods that have their pick while the others' tuning goes on: the baseline's
    (its calibration done) and every method whose grid has finished at it, or that has nothing to tune. A pick is
    final once its method's tuning runs are finished (the criterion reads those runs only), so these runs are the
    ones the whole phase would do; they pair by seed, machine and commit as in the whole phase, and the methods
    still tuning add theirs later, beside the baseline's runs of the same machine and commit. Writes
    no ``picks.json`` and no report: both wait for every method's pick. Returns a line on what runs and waits, and
    below it every finished evaluation run of the ready methods, one row each (:func:`runs_table`), marked as no
    claim."""
    if protocol.nearest:
        raise ValueError("--while-tuning: a protocol with 'nearest' chooses its extra seeds from every method's runs; "
                         "run the evaluation phase after tuning")
    if protocol.baseline not in picks["methods"]:
        raise MissingPicks(f"--while-tuning: {protocol.baseline} has no pick yet ({picks['incomplete']}); its "
                           "calibration comes first")
    points = picked_points(picks, protocol, ready_only=True)
    waiting = waiting_methods(picks, protocol)
    plan = protocol.plan(points, protocol.all_evaluation_seeds(), extra)
    log(f"[study] evaluating while tuning: {', '.join(p.method for p in points)}; waiting for their tuning: "
        f"{', '.join(waiting)}")
    if run:
        _run_paired(protocol, plan, points[0].cell, out / "evaluate", train_script, log, lanes)
    line = (f"evaluated while tuning: {', '.join(p.method for p in points)} ({len(plan.runs())} runs planned); "
            f"waiting for their tuning: {', '.join(waiting)}. The report and figure are written by --phase evaluate "
            "once every method has its pick.")
    runs = collect(plan, out / "evaluate", points)
    table = runs_table(points, runs, tuple(protocol.columns or eval_columns(protocol.eval["ks"])))
    if not table:
        return line
    done = sum(len(seeds) for seeds in runs.values())
    return (f"{line}\n\n**Finished so far: {done} of {len(plan.runs())} runs, no claim** (the verdicts need every "
            f"method's pick and every seed; these are single runs):\n\n{table}")


class MissingPicks(ValueError):
    """``picks.json`` is missing and cannot be picked again: a tuning run it reads has not finished."""


def _picks(protocol: Protocol, out: Path, log=print) -> dict[str, Any]:
    """``<out>/picks.json``; where it is missing (a study resumed from imported records on another machine), picked
    again from the finished tuning runs under ``<out>/tune`` and written, as the tuning phase writes it."""
    f = out / "picks.json"
    if f.is_file():
        return json.loads(f.read_text())
    picks = pick(protocol, out / "tune")
    if picks["incomplete"]:
        missing = "; ".join(f"{m}: {', '.join(runs)}" for m, runs in picks["incomplete"].items())
        raise MissingPicks(f"{f} is missing and the tuning runs it is picked from are not all finished under "
                           f"{out / 'tune'} ({missing}): run --phase tune first")
    f.write_text(json.dumps(picks, indent=1))
    log(f"[study] {f} picked again from the finished tuning runs under {out / 'tune'}")
    return picks


def run_phase(protocol: Protocol, phase: str, out: Path, train_script: Path, lanes: int = 1,
              extra: list[str] = (), log=print, run: bool = True, while_tuning: bool = False) -> str:
    """Run one phase (resumable) and write its report; return the report. ``run=False`` runs nothing: the report
    of the runs finished so far (``scripts/study.py --summarise-only``, e.g. on imported records).
    ``while_tuning`` (``evaluate`` only): while some methods' tuning runs go on, run the evaluation runs of the
    methods whose setting is final (:func:`evaluate_ready`); once every method has its pick, the phase as usual."""
    if phase == "evaluate" and while_tuning:
        picks = pick(protocol, out / "tune")
        if waiting_methods(picks, protocol):
            return evaluate_ready(protocol, picks, out, train_script, lanes, extra, log, run)
        f = out / "picks.json"  # every pick is in: a picks.json the tuning phase wrote before its end is replaced
        if not f.is_file() or waiting_methods(json.loads(f.read_text()), protocol):
            f.write_text(json.dumps(picks, indent=1))
    if phase == "tune":
        if run:
            if protocol.tune.get("calibrate_first"):  # the baseline's grid first: the others run at its pick
                run_study(protocol.plan(protocol.tuning_points(), protocol.tuning_seeds, extra, phase="tune"),
                          out / "tune", train_script, log=log, lanes=lanes)
            points = current_tuning_points(protocol, out / "tune")
            run_study(protocol.plan(points, protocol.tuning_seeds, extra, phase="tune"), out / "tune", train_script,
                      log=log, lanes=lanes)
        picks = pick(protocol, out / "tune")
        (out / "picks.json").write_text(json.dumps(picks, indent=1))
        report = "\n\n".join(x for x in (tuning_table(picks), tuning_runs_table(protocol, out / "tune")) if x)
        (out / "tune.md").write_text(report + "\n")
        return report
    picks = _picks(protocol, out, log)
    if protocol.nearest and (out / "evaluate" / "nearest.json").is_file():  # chosen before: its seeds are planned
        nearest_methods(protocol, picks, out / "evaluate")
    points = evaluation_points(picks, protocol)
    plan = protocol.plan(points, protocol.all_evaluation_seeds(), extra)
    if run:
        _run_paired(protocol, plan, points[0].cell, out / "evaluate", train_script, log, lanes)
        if protocol.nearest:
            near = nearest_methods(protocol, picks, out / "evaluate")
            log(f"[study] nearest {protocol.baseline} by {protocol.nearest['metric']}: {near}; "
                f"seeds {protocol.nearest['seeds']}")
            plan = protocol.plan(points, protocol.all_evaluation_seeds(), extra)
            _run_paired(protocol, plan, points[0].cell, out / "evaluate", train_script, log, lanes)
    runs = collect(plan, out / "evaluate", points)  # read once: the report and the figure show the same runs
    report = evaluation_report(protocol, picks, out / "evaluate", extra, runs)
    (out / "evaluate.md").write_text(report + "\n")
    from studies.study_plot import plot

    start = None
    if protocol.start:  # the starting policy's evaluation, at iteration 0 of the eval panels
        start = {k: float(v) for k, v in json.loads(_from_root(protocol.start).read_text()).items()
                 if k.startswith("eval/")}
    plot(plan, out / "evaluate", out / "evaluate.png", start=start,  # entropy, accuracy and eval pass@k per pick
         folder_of=front_folders(runs, out / "evaluate"))
    return report


def front_folders(runs: dict[str, dict[int, dict[str, Any]]], out: Path) -> Callable[[str, str, int], Path]:
    """``(algo, controller, seed) -> folder`` of the run in front of each seed in ``runs``
    (:func:`studies.protocol.collect` of the evaluation folder ``out``), the one the cell table reads: the figure
    draws the same runs. A seed with no finished run keeps its ``seed{k}`` folder (the figure leaves it out)."""
    def folder_of(algo: str, controller: str, seed: int) -> Path:
        front = runs.get(algo.partition("@")[2], {}).get(seed, {})
        return run_dir(out, algo, controller, seed).parent / front.get("folder", f"seed{seed}")

    return folder_of
