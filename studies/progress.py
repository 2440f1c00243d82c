"""Where a protocol's runs stand while it runs: ``scripts/study.py --protocol P --progress``.

A study of hundreds of lane-hours lands its partial results with how many runs are done, the lane-hours spent and
what remains. This module reads those from the run folders themselves rather than from anyone's notes: per declared
run its state (not started, training at iteration i of N, in its final evaluation with the share of its samples
kept in finished chunks, finished), the machine and commit of its attempts, and the compute its TensorBoard logged;
then, per phase, the totals and an estimate of what is left at the pace logged so far.

The estimate is arithmetic on measured rates, not a promise: the iterations left times each run's own median
seconds an iteration (a run not started: the median of its algorithm's runs in the phase, else of the phase's), and
the completions left in final evaluations times the median seconds a completion of the finished runs' final
evaluations. Both rates carry whatever ran beside the lanes when they were measured, and an interrupted attempt's
lost work is in neither the compute logged nor the estimate. Where runs finished on several machines, the estimate
is given again at each machine's pace alone (:func:`by_machine`).
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from lit_entropy.analysis.runs import points_of, scalar_events, times_of
from lit_entropy.callbacks.evaluation import CHUNKS
from studies.dose import run_config
from studies.method_study import COMPUTE_TAGS, median_seconds_per_iteration
from studies.pair_schedule import folders_of, owner
from studies.protocol import Protocol
from studies.protocol_preview import phase_points


@dataclass(frozen=True)
class RunProgress:
    """One declared run of a phase, as its folder shows it."""

    name: str
    """``<cell>/<seed folder>``, as under ``<out>/<phase>/runs``."""
    algo: str
    """The run's algorithm (the cell's ``algo`` before its ``@point``): runs not started borrow its pace."""
    declared: int
    """Iterations the protocol declares for the run."""
    logged: int = 0
    """Iterations whose rollout entropy the run's TensorBoard holds."""
    finished: bool = False
    """Its ``done.json`` is written: trained, evaluated and summarised."""
    pairing: str | None = None
    """``"<machine> @ <commit>"`` of every attempt, None before the first (or where attempts differ)."""
    started: bool = False
    """An attempt was recorded (or the run finished)."""
    evaluated_share: float | None = None
    """While the final evaluation runs: the share of its completions in finished chunks (``eval_chunks``). The last
    iteration logs its entropy only after its evaluation, so a run shows as training at N-1 of N until the first
    chunk is kept (a chunk of the verdicts study's evaluation runs is 64 problems x 64 samples, ~20 minutes here)."""
    completions: int | None = None
    """Completions the final evaluation draws (problems × samples, plus one greedy each), from the run's config."""
    compute_seconds: float = 0.0
    """``time/*`` summed over the logged iterations (the finished evaluations included)."""
    seconds_per_iteration: float | None = None
    """The run's median wall-clock seconds between logged iterations."""
    final_evaluation_seconds: float | None = None
    """A finished run's ``time/evaluate`` at its last iteration (an evaluation resumed from chunks logs only the
    part its last attempt sampled)."""

    @property
    def state(self) -> str:
        if self.finished:
            return "finished"
        if self.evaluated_share is not None:
            return "final evaluation"
        if self.started or self.logged:
            return "training"
        return "not started"


def final_completions(eval_cfg: Mapping[str, Any]) -> int | None:
    """The completions of a run's final evaluation from its ``callbacks.eval`` config: each problem's
    ``final_n`` (else ``n``) samples, plus one greedy completion where ``greedy``; None without the keys."""
    problems = eval_cfg.get("num_problems")
    n = eval_cfg.get("final_n") or eval_cfg.get("n")
    if problems is None or not n:
        return None
    total = sum(int(v) for v in problems.values()) if isinstance(problems, Mapping) else int(problems)
    return total * (int(n) + (1 if eval_cfg.get("greedy", True) else 0))


def chunk_completions(eval_cfg: Mapping[str, Any], chunk_file: Path) -> int:
    """The completions in one finished chunk file of the final evaluation (``<split>-<mode>-<j>.json``, or
    ``all-<j>.json`` where the evaluation has no named splits): the chunk's problems times its samples."""
    size = int(eval_cfg.get("prompts_per_chunk", 64))
    problems = eval_cfg.get("num_problems")
    stem = chunk_file.stem  # e.g. held_out-sampled-0002
    head, _, j = stem.rpartition("-")
    split, _, mode = head.rpartition("-") if head != "all" else ("", "", "sampled")
    count = int(problems.get(split, 0)) if isinstance(problems, Mapping) else int(problems or 0)
    in_chunk = max(0, min(size, count - int(j) * size))
    samples = 1 if mode == "greedy" else int(eval_cfg.get("final_n") or eval_cfg.get("n") or 1)
    return in_chunk * samples


def run_progress(folder: Path, name: str, algo: str, declared: int) -> RunProgress:
    """What ``folder`` shows of one run (see :class:`RunProgress`)."""
    if not folder.is_dir():
        return RunProgress(name=name, algo=algo, declared=declared)
    events = scalar_events(folder)
    raw = points_of(events)
    logged = len(raw.get("rollout/entropy", []))
    finished = (folder / "done.json").is_file()
    started = finished or (folder / "attempts.json").is_file()
    compute = sum(v for tag in COMPUTE_TAGS for _, v in raw.get(tag, []))
    evaluate = raw.get("time/evaluate", [])
    final_s = evaluate[-1][1] if finished and evaluate and evaluate[-1][0] >= declared else None
    eval_cfg = run_config(folder).get("callbacks", {}).get("eval") or {}
    completions = final_completions(eval_cfg) if eval_cfg else None
    share = None
    chunks = sorted((folder / CHUNKS).glob(f"iteration-{declared:04d}-*"))
    if not finished and chunks and completions:
        done = sum(chunk_completions(eval_cfg, f) for f in chunks[-1].glob("*.json"))
        share = min(1.0, done / completions)
    elif not finished and logged >= declared:
        share = 0.0  # trained to the end, no chunk kept yet: the final evaluation is under way
    return RunProgress(name=name, algo=algo, declared=declared, logged=logged, finished=finished,
                       pairing=owner(folder), started=started, evaluated_share=share, completions=completions,
                       compute_seconds=compute,
                       seconds_per_iteration=median_seconds_per_iteration(times_of(events, "rollout/entropy")),
                       final_evaluation_seconds=final_s)


def phase_runs(protocol: Protocol, out: Path, phase: str) -> tuple[list[RunProgress], list[str]]:
    """Every declared run of ``phase`` under ``out`` (each seed's runs on every machine and commit; one row for a
    seed not started), and the methods whose evaluation runs wait for their tuning (``evaluate`` only)."""
    points, seeds = phase_points(protocol, phase, out, while_tuning=phase == "evaluate")
    if points is None:
        return [], list(protocol.methods)
    plan = protocol.plan(points, seeds, phase=phase)
    iterations = protocol.iterations_of(phase)
    rows = []
    for algo, controller, seed in plan.runs():
        folders = [f for f in folders_of(out / phase, algo, controller, seed) if f.is_dir()] or \
            folders_of(out / phase, algo, controller, seed)[:1]
        for folder in folders:
            name = f"{folder.parent.name}/{folder.name}"
            rows.append(run_progress(folder, name, algo.split("@", 1)[0], iterations))
    waiting = [m for m in protocol.methods if all(p.method != m for p in points)] if phase == "evaluate" else []
    return rows, waiting


def _median(xs: list[float]) -> float | None:
    return statistics.median(xs) if xs else None


def seconds_left(runs: list[RunProgress], per_completion: float | None,
                 pace_from: list[RunProgress] | None = None) -> tuple[float, int, int]:
    """The estimate of what ``runs`` have left (see the module docstring), the iterations left, and the
    completions left in final evaluations. A run not started borrows the median pace of its algorithm's runs in
    ``pace_from`` (default ``runs``; a study passes both phases: same iterations, same machine), else of all of them,
    and the final evaluation's size of a run in ``runs`` that has its config; with nothing to borrow it adds its
    iterations but no seconds."""
    pool = runs if pace_from is None else pace_from
    pace_all = _median([r.seconds_per_iteration for r in pool if r.seconds_per_iteration])
    pace = {a: _median([r.seconds_per_iteration for r in pool if r.algo == a and r.seconds_per_iteration])
            for a in {r.algo for r in pool}}
    size = next((r.completions for r in runs if r.completions), None)
    seconds, iterations, completions = 0.0, 0, 0
    for r in runs:
        if r.finished:
            continue
        left = max(0, r.declared - r.logged)
        rate = r.seconds_per_iteration or pace.get(r.algo) or pace_all
        iterations += left
        seconds += left * (rate or 0.0)
        todo = round((r.completions or size or 0) * (1 - (r.evaluated_share or 0.0)))
        completions += todo
        seconds += todo * (per_completion or 0.0)
    return seconds, iterations, completions


def seconds_per_completion(runs: list[RunProgress]) -> float | None:
    """The median seconds a completion of the finished runs' final evaluations."""
    return _median([r.final_evaluation_seconds / r.completions for r in runs
                    if r.final_evaluation_seconds and r.completions])


def machine_of(run: RunProgress) -> str | None:
    """The machine of a run's attempts (its pairing without the commit), None before its first."""
    return None if run.pairing is None else run.pairing.rpartition(" @ ")[0]


def by_machine(runs: list[RunProgress], every: list[RunProgress]) -> list[tuple[str, int, float]]:
    """(machine, runs finished there, lane-hours) of what ``runs`` have left as if every one of them ran on that
    machine, for each machine with a finished run among ``every``: its median pace an iteration per algorithm and a
    completion, where a run under way elsewhere borrows the pace too. A study that moves machines (an AVX2 one
    through the fp32 shim, another with native bf16, three times faster) plans with the machine it has."""
    out = []
    for machine in sorted({m for r in every if r.finished and (m := machine_of(r))}):
        there = [r for r in every if machine_of(r) == machine]
        per_completion = seconds_per_completion(there)
        if per_completion is None:
            continue
        moved = [r if machine_of(r) == machine else replace(r, seconds_per_iteration=None) for r in runs]
        out.append((machine, sum(r.finished for r in there), seconds_left(moved, per_completion, there)[0] / 3600))
    return out


def _cell(text: str) -> str:
    return text.replace("|", "\\|")  # a machine's name has bars ("AMD EPYC | avx2 | 2 cores")


def _pairing(pairing: str | None) -> str:
    """A run's machine and commit, the commit cut to 7 hex digits."""
    if pairing is None:
        return "—"
    machine, _, commit = pairing.rpartition(" @ ")
    return _cell(f"{machine} @ {commit[:7]}")


def not_started(runs: list[RunProgress]) -> str:
    """The runs not started, one entry a cell with its seeds (``grpo@grpo-lr1e-05+none seeds 1, 2``)."""
    cells: dict[str, list[str]] = {}
    for r in runs:
        if r.state == "not started":
            cell, _, folder = r.name.rpartition("/")
            cells.setdefault(cell, []).append(folder.removeprefix("seed"))
    return "; ".join(f"{cell} seed{'s' if len(seeds) > 1 else ''} {', '.join(seeds)}" for cell, seeds in cells.items())


def progress_report(protocol: Protocol, out: Path) -> str:
    """Both phases' runs as a Markdown table each (the runs started), with their totals and the estimate of what
    is left."""
    phases = {phase: phase_runs(protocol, out, phase) for phase in ("tune", "evaluate")}
    every = [r for runs, _ in phases.values() for r in runs]
    per_completion = seconds_per_completion(every)
    lines = [f"# Progress of protocol {protocol.name} ({out})", ""]
    for phase, (runs, waiting) in phases.items():
        done = sum(r.finished for r in runs)
        going = sum(r.state in ("training", "final evaluation") for r in runs)
        idle = len(runs) - done - going
        spent = sum(r.compute_seconds for r in runs) / 3600
        lines += [f"## {phase}: {done} of {len(runs)} runs finished, {going} under way, {idle} not started; "
                  f"{spent:.1f} lane-hours logged", ""]
        if waiting:
            lines += [f"Not yet planned, waiting for their tuning: {', '.join(waiting)}.", ""]
        shown = [r for r in runs if r.state != "not started"]
        if shown:
            lines += ["| run | state | iterations | final evaluation | machine @ commit | lane-hours | s/it (median) |",
                      "|---|---|---:|---:|---|---:|---:|"]
            for r in shown:
                evaluated = "done" if r.finished else (f"{r.evaluated_share:.0%}" if r.evaluated_share is not None
                                                       else "—")
                pace = f"{r.seconds_per_iteration:.0f}" if r.seconds_per_iteration else "—"
                lines.append(f"| {r.name} | {r.state} | {r.logged}/{r.declared} | {evaluated} | "
                             f"{_pairing(r.pairing)} | {r.compute_seconds / 3600:.2f} | {pace} |")
            lines.append("")
        if idle:
            lines += [f"Not started: {not_started(runs)}.", ""]
        if done < len(runs):
            seconds, iterations, completions = seconds_left(runs, per_completion, pace_from=every)
            rate = (f"{per_completion:.2f} s a completion, the median of the finished runs' final evaluations"
                    if per_completion else "no finished run's final evaluation to time, so none of them counted")
            besides = " (the runs waiting for their tuning besides)" if waiting else ""
            moved = len({machine_of(r) for r in every if r.finished} - {None}) > 1  # the pace logged mixes them
            each = "".join(f"; {hours:.0f} at the pace of {machine} alone ({n} run{'s' * (n > 1)} finished there)"
                           for machine, n, hours in by_machine(runs, every)) if moved else ""
            lines += [f"Left{besides}: {iterations:,} iterations and {completions:,} completions in final "
                      f"evaluations, about {seconds / 3600:.0f} lane-hours at the pace logged ({rate}){each}.", ""]
    return "\n".join(lines).rstrip() + "\n"
