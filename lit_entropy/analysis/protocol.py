"""One tuning protocol for a method study, as config (``conf/protocol/*.yaml``, run by ``scripts/study.py``).

A protocol declares, before any run: the runs' common overrides and length, the periodic evaluation, the
*tuning seeds* and the *evaluation seeds* (disjoint: a pick is never judged on a seed that chose it), the
*criterion* (the mean of some run-summary metrics after the last iteration, e.g. eval pass@1 and
pass@64), the baseline, the claims to judge, the interval rule and, per method, its cell (``algo`` preset,
``controller``), its fixed overrides and a *grid* over its key hyperparameters (every combination is a point).

* ``tune``: every point on every tuning seed; per method the point with the highest mean criterion over the
  tuning seeds (ties: the earlier point) is written to ``<out>/picks.json`` with every point's scores
  (``<out>/tune.md``). A method with an unfinished point gets no pick.
* ``evaluate``: each pick on every evaluation seed; ``<out>/evaluate.md`` holds the study table (with each
  method's dose) and, below the rule's text, a verdict per method and claim
  (:mod:`lit_entropy.analysis.verdicts`); ``<out>/evaluate.png`` the curves. A *control* (``controls``: the
  baseline at another setting, e.g. at the step size the other methods run at) also runs on every evaluation
  seed; it is never a pick, and the report says which labels would change were it the baseline.

Runs go through :func:`lit_entropy.analysis.method_study.run_study` (resumable, seed by seed, ``lanes`` at a
time); a point is a *variant* of its algo, so a run folder is ``<out>/<phase>/runs/<algo>@<point>+<controller>/seed<s>``.
"""

from __future__ import annotations

import itertools
import json
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lit_entropy.analysis.dose import dose_legend, method_dose, method_of
from lit_entropy.analysis.method_study import (
    COLUMNS,
    StudyPlan,
    finished,
    run_dir,
    run_study,
    run_summary,
    summarise,
)
from lit_entropy.analysis.verdicts import Claim, IntervalRule, Verdict, judge, verdict_report

PHASES = ("tune", "evaluate")


def eval_columns(ks: list[int]) -> tuple[str, ...]:
    """The evaluation table's columns: final entropy, each eval pass@k the study has a column for, the
    last-20 training accuracy, the dose and seconds per iteration."""
    return ("h_final", *(f"pass@{k}" for k in ks if f"pass@{k}" in COLUMNS), "acc_last20", "dose", "s_per_it")


def hydra_value(v: Any) -> str:
    """A value as a Hydra override writes it: ``true``, ``0.00025``, ``[0.4,0.5]``."""
    if isinstance(v, bool):
        return str(v).lower()
    if isinstance(v, list | tuple):
        return "[" + ",".join(hydra_value(x) for x in v) + "]"
    return repr(v) if isinstance(v, float) else str(v)


def _short(v: Any) -> str:
    if isinstance(v, list | tuple):
        return "-".join(_short(x) for x in v)
    return f"{v:g}" if isinstance(v, float) else str(v)


@dataclass(frozen=True)
class Point:
    """One setting of a method: its cell and the overrides that make it (fixed ones, then the grid's)."""

    method: str
    name: str
    algo: str
    controller: str
    overrides: tuple[str, ...]
    values: tuple[tuple[str, Any], ...] = ()

    @property
    def cell(self) -> tuple[str, str]:
        return f"{self.algo}@{self.name}", self.controller

    @property
    def setting(self) -> str:
        """The grid's values; for a method without a grid its fixed overrides, or ``preset``."""
        return ", ".join(f"{k}={hydra_value(v)}" for k, v in self.values) or ", ".join(self.overrides) or "preset"


@dataclass
class MethodSpec:
    """A method of the protocol: ``algo`` preset (default: its name, or ``grpo`` for a controller), ``controller``,
    fixed overrides, grid."""

    name: str
    algo: str
    controller: str = "none"
    fixed: list[str] = field(default_factory=list)
    grid: dict[str, list[Any]] = field(default_factory=dict)
    claims: list[Claim] | None = None

    def points(self) -> list[Point]:
        """Every combination of the grid's values, the first key varying slowest."""
        keys = list(self.grid)
        out = []
        for combo in itertools.product(*(self.grid[k] for k in keys)):
            values = tuple(zip(keys, combo, strict=True))
            label = "_".join(f"{k.rsplit('.', 1)[-1]}{_short(v)}" for k, v in values) or "preset"
            out.append(Point(self.name, f"{self.name}-{label}", self.algo, self.controller,
                             (*self.fixed, *(f"{k}={hydra_value(v)}" for k, v in values)), values))
        return out


@dataclass
class Protocol:
    """A tuning protocol (see the module docstring); :func:`load_protocol` reads and checks one."""

    name: str
    methods: dict[str, MethodSpec]
    tuning_seeds: list[int]
    evaluation_seeds: list[int]
    criterion: list[str] = field(default_factory=lambda: ["pass@1", "pass@64"])
    baseline: str = "grpo"
    claims: list[Claim] = field(default_factory=list)
    """Claims judged for every method that lists none of its own; empty: each criterion metric, higher."""
    overrides: list[str] = field(default_factory=list)
    iterations: int = 120
    eval: dict[str, Any] = field(default_factory=lambda: {"every": 30, "n": 64, "ks": [1, 16, 64], "problems": 64})
    interval: IntervalRule = field(default_factory=IntervalRule)
    out: str = "logs/protocol"
    min_evaluation_seeds: int = 5
    cost: dict[str, float] = field(default_factory=lambda: {"seconds_per_iteration": 1.45, "seconds_per_evaluation": 5})
    controls: list[list[str]] = field(default_factory=list)
    """Each a list of overrides making the baseline a control: run on the evaluation seeds, never picked; the report
    re-judges every claim against it."""

    def __post_init__(self) -> None:
        self.claims = self.claims or [Claim(m) for m in self.criterion]  # none declared: the criterion, higher
        if set(self.tuning_seeds) & set(self.evaluation_seeds):
            raise ValueError(f"protocol {self.name}: evaluation_seeds {sorted(set(self.tuning_seeds) & set(self.evaluation_seeds))} "
                             "are also tuning seeds; a pick must be judged on seeds that did not choose it")
        if len(set(self.evaluation_seeds)) < self.min_evaluation_seeds:
            raise ValueError(f"protocol {self.name}: {len(set(self.evaluation_seeds))} evaluation_seeds, fewer than "
                             f"min_evaluation_seeds={self.min_evaluation_seeds}")
        if not self.tuning_seeds:
            raise ValueError(f"protocol {self.name}: no tuning_seeds")
        if self.baseline not in self.methods:
            raise ValueError(f"protocol {self.name}: baseline {self.baseline!r} is not one of its methods {list(self.methods)}")
        for c in self.controls:
            if not isinstance(c, list) or not c or any(not isinstance(o, str) or "=" not in o for o in c):
                raise ValueError(f"protocol {self.name}: controls entry {c!r} is not a list of key=value overrides")
        ks = set(self.eval["ks"])
        for metric in [*self.criterion, *(c.metric for m in self.methods.values() for c in self.claims_of(m.name))]:
            if metric not in COLUMNS:
                raise ValueError(f"protocol {self.name}: {metric!r} is not a run-summary column ({list(COLUMNS)})")
            if metric.startswith("pass@") and int(metric.split("@")[1].split("_")[0]) not in ks:
                raise ValueError(f"protocol {self.name}: {metric} needs {metric.split('@')[1]} in eval.ks {sorted(ks)}")

    def control_points(self) -> list[Point]:
        """The baseline at each ``controls`` setting (its fixed overrides, then the control's), named like a grid
        point of the same values (``grpo-lr0.0005``)."""
        import yaml

        base = self.methods[self.baseline]
        out = []
        for overrides in self.controls:
            values = tuple((k, yaml.safe_load(v)) for k, _, v in (o.partition("=") for o in overrides))
            label = "_".join(f"{k.rsplit('.', 1)[-1]}{_short(v)}" for k, v in values)
            out.append(Point(base.name, f"{base.name}-{label}", base.algo, base.controller,
                             (*base.fixed, *overrides), values))
        return out

    def claims_of(self, method: str) -> list[Claim]:
        own = self.methods[method].claims
        return list(own) if own is not None else list(self.claims)

    def plan(self, points: list[Point], seeds: list[int], extra: list[str] = ()) -> ProtocolPlan:
        """The study plan that runs ``points`` on ``seeds``."""
        return ProtocolPlan(algos=[], controllers=[], seeds=list(seeds), iterations=self.iterations,
                            eval_problems=self.eval["problems"], eval_n=self.eval["n"], eval_ks=tuple(self.eval["ks"]),
                            eval_every=self.eval["every"], overrides=[*self.overrides, *extra],
                            variants={p.name: list(p.overrides) for p in points}, explicit=[p.cell for p in points])

    def all_points(self) -> list[Point]:
        """Every point of every method (what ``--check`` composes)."""
        return [p for m in self.methods.values() for p in m.points()] + self.control_points()

    def tuning_points(self) -> list[Point]:
        """The points tuning runs: those of methods with more than one setting. A method with one setting has
        nothing to choose; its pick is that setting, and it first runs in ``evaluate``."""
        return [p for m in self.methods.values() if len(m.points()) > 1 for p in m.points()]

    def seconds(self, runs: int) -> float:
        """The protocol's estimate of ``runs`` runs on one core: iterations, plus each periodic evaluation (at
        start, when ``experiment=collapse`` asks for it, and every ``eval.every`` iterations)."""
        evals = self.iterations // self.eval["every"] + 1
        return runs * (self.iterations * self.cost["seconds_per_iteration"] + evals * self.cost["seconds_per_evaluation"])


@dataclass
class ProtocolPlan(StudyPlan):
    """A study plan over an explicit list of cells (each point's ``algo@point``, ``controller``)."""

    explicit: list[tuple[str, str]] = field(default_factory=list)

    def grid(self) -> list[tuple[str, str]]:
        return list(dict.fromkeys(self.explicit))


_KEYS = {"name", "methods", "tuning_seeds", "evaluation_seeds", "criterion", "baseline", "claims", "overrides",
         "iterations", "eval", "interval", "out", "min_evaluation_seeds", "cost", "controls"}
_METHOD_KEYS = {"algo", "controller", "fixed", "grid", "claims"}


def load_protocol(path: str | Path) -> Protocol:
    """Read and check a protocol YAML file; unknown keys fail by name."""
    import yaml

    raw = yaml.safe_load(Path(path).read_text()) or {}
    unknown = set(raw) - _KEYS
    if unknown:
        raise ValueError(f"{path}: unknown protocol keys {sorted(unknown)}; the keys are {sorted(_KEYS)}")
    methods = {}
    for name, spec in (raw.pop("methods", None) or {}).items():
        spec = spec or {}
        bad = set(spec) - _METHOD_KEYS
        if bad:
            raise ValueError(f"{path}: methods.{name}: unknown keys {sorted(bad)}; the keys are {sorted(_METHOD_KEYS)}")
        grid = {k: v if isinstance(v, list) else [v] for k, v in (spec.get("grid") or {}).items()}
        claims = [Claim(**c) for c in spec["claims"]] if spec.get("claims") is not None else None
        controller = spec.get("controller", "none")  # a controller's method runs on grpo unless it says otherwise
        methods[name] = MethodSpec(name, spec.get("algo", name if controller == "none" else "grpo"), controller,
                                   list(spec.get("fixed") or []), grid, claims)
    claims = [Claim(**c) for c in raw.pop("claims", None) or []]
    interval = IntervalRule(**(raw.pop("interval", None) or {}))
    return Protocol(methods=methods, claims=claims, interval=interval, **raw)


# ------------------------------------------------------------------------------------------------ phases


def criterion_score(summary: dict[str, Any], metrics: list[str]) -> float | None:
    """The mean of ``metrics`` in one run's summary (None when one is missing)."""
    xs = [summary.get(m) for m in metrics]
    return None if any(x is None for x in xs) else statistics.mean(xs)


def collect(plan: StudyPlan, out: Path, points: list[Point]) -> dict[str, dict[int, dict[str, Any]]]:
    """Point name -> seed -> run summary (with the method's ``dose``), over the finished runs."""
    got: dict[str, dict[int, dict[str, Any]]] = {}
    for p in points:
        for seed in plan.seeds:
            folder = run_dir(out, *p.cell, seed)
            summary = run_summary(folder) if folder.exists() and finished(folder) else None
            if summary is not None:
                summary["dose"] = method_dose(method_of(p.algo, p.controller), summary)
                got.setdefault(p.name, {})[seed] = summary
    return got


def pick(protocol: Protocol, out: Path) -> dict[str, Any]:
    """The picks of the tuning runs under ``out``: per method the best point by the criterion, and every point's scores."""
    points = protocol.tuning_points()
    runs = collect(protocol.plan(points, protocol.tuning_seeds), out, points)
    picks: dict[str, Any] = {"protocol": protocol.name, "criterion": protocol.criterion,
                             "tuning_seeds": protocol.tuning_seeds, "methods": {}, "incomplete": {}}
    for method, spec in protocol.methods.items():
        if len(spec.points()) == 1:  # nothing to tune: the one setting is the pick, with no tuning runs
            p = spec.points()[0]
            picks["methods"][method] = {"point": p.name, "algo": p.algo, "controller": p.controller,
                                        "overrides": list(p.overrides), "setting": p.setting, "scores": {},
                                        "mean": None, "dose": None, "grid": []}
            continue
        rows, missing = [], []
        for p in spec.points():
            scores = {s: criterion_score(r, protocol.criterion) for s, r in runs.get(p.name, {}).items()}
            scores = {s: v for s, v in scores.items() if v is not None}
            missing += [f"{p.name} seed {s}" for s in protocol.tuning_seeds if s not in scores]
            doses = [r["dose"] for r in runs.get(p.name, {}).values() if r.get("dose") is not None]
            rows.append({"point": p.name, "algo": p.algo, "controller": p.controller, "overrides": list(p.overrides),
                         "setting": p.setting, "scores": scores,
                         "mean": statistics.mean(scores.values()) if scores else None,
                         "dose": statistics.mean(doses) if doses else None})
        if missing:
            picks["incomplete"][method] = missing
            continue
        best = max(rows, key=lambda r: r["mean"])  # max keeps the first of equal scores: the earlier point
        picks["methods"][method] = {**best, "grid": rows}
    return picks


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


def picked_points(picks: dict[str, Any], protocol: Protocol) -> list[Point]:
    """The picked point of each protocol method (the baseline first); a method without a pick fails by name."""
    absent = [m for m in protocol.methods if m not in picks["methods"]]
    if absent:
        raise ValueError(f"no pick for {absent} (unfinished tuning: {picks.get('incomplete', {})}); "
                         "run --phase tune to the end first")
    order = [protocol.baseline, *(m for m in protocol.methods if m != protocol.baseline)]
    return [Point(m, picks["methods"][m]["point"], picks["methods"][m]["algo"], picks["methods"][m]["controller"],
                  tuple(picks["methods"][m]["overrides"])) for m in order]


def evaluation_points(picks: dict[str, Any], protocol: Protocol) -> list[Point]:
    """What ``evaluate`` runs: each method's pick, then the controls."""
    return [*picked_points(picks, protocol), *protocol.control_points()]


def evaluation_report(protocol: Protocol, picks: dict[str, Any], out: Path, extra: list[str] = ()) -> str:
    """The evaluation table (with dose) and the verdicts below the rule's text; then which labels the other
    interval, and each control as the baseline, would change."""
    points = picked_points(picks, protocol)
    controls = protocol.control_points()
    plan = protocol.plan([*points, *controls], protocol.evaluation_seeds, extra)
    columns = eval_columns(protocol.eval["ks"])
    table, _ = summarise(plan, out, columns, sort_by=next((c for c in reversed(columns) if c.startswith("pass@")),
                                                          "acc_last20"))
    runs = collect(plan, out, [*points, *controls])
    by_method = {p.method: runs.get(p.name, {}) for p in points}
    settings = {m: picks["methods"][m]["setting"] for m in by_method}
    claims = {m: protocol.claims_of(m) for m in by_method}
    dose_of = {p.method: method_of(p.algo, p.controller) for p in points}

    def judged(baseline_runs: dict[int, dict[str, Any]], rule: IntervalRule) -> list[Verdict]:
        return judge({**by_method, protocol.baseline: baseline_runs}, protocol.baseline, claims, rule, settings,
                     dose_of=dose_of)

    verdicts = judged(by_method[protocol.baseline], protocol.interval)
    legend = dose_legend(list(dose_of.values()))
    other = IntervalRule(kind="t") if protocol.interval.kind == "bootstrap" else IntervalRule()
    check = judged(by_method[protocol.baseline], other)
    against = [control_line(verdicts, judged(runs.get(c.name, {}), protocol.interval), protocol.baseline, c)
               for c in controls]
    return "\n\n".join(x for x in (table.split("\n\n")[0], legend, verdict_report(verdicts, protocol.baseline,
                                                                                   protocol.interval),
                                    sensitivity(verdicts, check, other.kind), *against) if x)


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


def run_phase(protocol: Protocol, phase: str, out: Path, train_script: Path, lanes: int = 1,
              extra: list[str] = (), log=print) -> str:
    """Run one phase (resumable) and write its report; return the report."""
    if phase == "tune":
        points = protocol.tuning_points()
        run_study(protocol.plan(points, protocol.tuning_seeds, extra), out / "tune", train_script, log=log, lanes=lanes)
        picks = pick(protocol, out / "tune")
        (out / "picks.json").write_text(json.dumps(picks, indent=1))
        report = tuning_table(picks)
        (out / "tune.md").write_text(report + "\n")
        return report
    picks = json.loads((out / "picks.json").read_text())
    points = evaluation_points(picks, protocol)
    plan = protocol.plan(points, protocol.evaluation_seeds, extra)
    run_study(plan, out / "evaluate", train_script, log=log, lanes=lanes)
    report = evaluation_report(protocol, picks, out / "evaluate", extra)
    (out / "evaluate.md").write_text(report + "\n")
    from lit_entropy.analysis.study_plot import plot

    plot(plan, out / "evaluate", out / "evaluate.png")  # entropy, accuracy and eval pass@k per pick
    return report
