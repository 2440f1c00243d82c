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
  (:mod:`studies.verdicts`); ``<out>/evaluate.png`` the curves. A *control* (``controls``: the
  baseline at another setting, e.g. at the step size the other methods run at) also runs on every evaluation
  seed; it is never a pick, and the report says which labels would change were it the baseline.

Per phase, ``tune`` may give its own run length and a cheaper evaluation to pick by; ``calibrate`` names keys of the
baseline's grid (a learning rate) whose pick every other method then runs with in ``evaluate``; with
``tune.calibrate_first`` the other methods are tuned at it too: the baseline's grid runs first, and each other grid
runs once the baseline has its pick, at the picked values (its points named with them, ``clip_cov-rho0.01_lr0.0002``),
and only those runs choose its pick. A method may have its own ``evaluation_seeds`` (more for the baseline and the
methods nearest it).

Runs go through :func:`studies.method_study.run_study` (resumable, seed by seed, ``lanes`` at a
time); a point is a *variant* of its algo, so a run folder is ``<out>/<phase>/runs/<algo>@<point>+<controller>/seed<s>``.
The phases run and write their reports in :mod:`studies.protocol_phases`.
"""

from __future__ import annotations

import itertools
import re
import statistics
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from studies.dose import method_dose, method_of
from studies.method_study import (
    COLUMNS,
    StudyPlan,
    finished,
    run_summary,
)
from studies.pair_schedule import folders_of
from studies.seed_claims import SeedClaim
from studies.verdicts import Claim, IntervalRule

PHASES = ("tune", "evaluate")


def eval_columns(ks: list[int]) -> tuple[str, ...]:
    """The evaluation table's columns: final entropy, each eval pass@k the study has a column for, the
    last-20 training accuracy, the dose and seconds per iteration."""
    return ("h_final", *(f"pass@{k}" for k in ks if f"pass@{k}" in COLUMNS), "acc_last20", "dose", "s_per_it")


def pass_k(metric: str) -> int | None:
    """The k of a pass@k summary metric (``pass@64``, ``ho_pass@64``, ``pass@64_peak``), else None."""
    found = re.search(r"(?:^|_)pass@(\d+)", metric)
    return int(found.group(1)) if found else None


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
    evaluation_seeds: list[int] | None = None
    """This method's evaluation seeds where they differ from the protocol's (more for the baseline, say)."""

    @property
    def tuned(self) -> bool:
        """More than one setting: tuning chooses among them (a method with one has nothing to choose)."""
        return len(self.points()) > 1

    def points(self, calibrated: tuple[tuple[str, Any], ...] = ()) -> list[Point]:
        """Every combination of the grid's values, the first key varying slowest; with ``calibrated`` (the
        baseline's picked values of some keys) each also runs at those of them this method does not set itself,
        and its name carries them."""
        keys = list(self.grid)
        own = {*keys, *(o.partition("=")[0] for o in self.fixed)}
        given = tuple((k, v) for k, v in calibrated if k not in own)
        out = []
        for combo in itertools.product(*(self.grid[k] for k in keys)):
            values = (*zip(keys, combo, strict=True), *given)
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
    tune: dict[str, Any] = field(default_factory=dict)
    """The tuning phase's own ``iterations`` and ``eval`` where they differ from the evaluation's (a cheaper
    evaluation to pick by, say); the criterion is read from that evaluation."""
    calibrate: list[str] = field(default_factory=list)
    """Keys of the baseline's grid whose picked values every other method runs with in ``evaluate`` (a learning
    rate with no meaning across scales is calibrated on the baseline once), unless the method sets the key itself."""
    columns: list[str] | None = None
    """The evaluation table's columns (default :func:`eval_columns` of ``eval.ks``)."""
    keep_checkpoints: bool = True
    """False: each finished run's checkpoints are deleted (what resume needs is kept until the run is done)."""
    seed_claims: list[SeedClaim] = field(default_factory=list)
    """The seed papers' claims that are not a method against the baseline (:mod:`studies.seed_claims`)."""
    nearest: dict[str, Any] = field(default_factory=dict)
    """``{methods: M, seeds: [...], metric: m}``: once every method has run on its evaluation seeds, the M methods
    whose ``metric`` is nearest the baseline's (smallest |mean paired difference|) also run on ``seeds``, which the
    baseline has: the cells hardest to tell from it get the baseline's number of seeds."""
    extra_seeds: dict[str, list[int]] = field(default_factory=dict)
    """Seeds added to methods after a first evaluation (``nearest``); read back from ``nearest.json``."""
    start: str | None = None
    """A JSON file (path from the checkout's root) of the ``eval/*`` values of the policy every cell starts from
    (``scripts/evaluate.py``'s output), drawn at iteration 0 in the figure where runs do not evaluate at start."""
    recommend: list[str] = field(default_factory=list)
    """Metrics of the claims a method must win, each *reproduced* under ``interval``, to be the study's
    recommendation (:func:`studies.verdicts.recommended`: of several, the most claims reproduced, then the largest
    mean difference on the first metric); none wins, or the evaluation is unfinished: the baseline."""
    lab: dict[str, str] = field(default_factory=dict)
    """``{protocol: P, records: R}``: another protocol (paths from the checkout's root) whose verdicts, rebuilt from
    its shipped records, the report sets beside this one's on the claims both judged
    (:mod:`studies.lab_to_real`)."""

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
        claimed = {c.metric for m in self.methods if m != self.baseline for c in self.claims_of(m)}
        if set(self.recommend) - claimed:
            raise ValueError(f"protocol {self.name}: recommend {sorted(set(self.recommend) - claimed)} is not a claim "
                             f"of any method (the claims: {sorted(claimed)})")
        for m in self.methods.values():
            seeds = set(self.seeds_of(m.name))
            if seeds & set(self.tuning_seeds) or len(seeds) < self.min_evaluation_seeds:
                raise ValueError(f"protocol {self.name}: methods.{m.name}.evaluation_seeds {sorted(seeds)} must be at least "
                                 f"{self.min_evaluation_seeds} seeds, none of them a tuning seed")
        tune_keys = {"iterations", "eval", "calibrate_first"}
        if set(self.tune) - tune_keys:
            raise ValueError(f"protocol {self.name}: tune keys {sorted(set(self.tune) - tune_keys)}; "
                             f"the keys are {sorted(tune_keys)}")
        if self.tune.get("calibrate_first") and not self.calibrate:
            raise ValueError(f"protocol {self.name}: tune.calibrate_first needs calibrate (the keys of "
                             f"{self.baseline}'s grid the other methods are tuned at)")
        if self.nearest and (set(self.nearest) != {"methods", "seeds", "metric"} or self.nearest["metric"] not in COLUMNS
                             or not set(self.nearest["seeds"]) <= set(self.seeds_of(self.baseline))):
            raise ValueError(f"protocol {self.name}: nearest {self.nearest} must give methods, seeds (among "
                             f"{self.baseline}'s) and metric (a run-summary column)")
        if self.lab and set(self.lab) != {"protocol", "records"}:
            raise ValueError(f"protocol {self.name}: lab {self.lab} must give protocol and records (two paths)")
        loose = set(self.calibrate) - set(self.methods[self.baseline].grid)
        if loose:
            raise ValueError(f"protocol {self.name}: calibrate {sorted(loose)} are not keys of {self.baseline}'s grid")
        for c in self.controls:
            if not isinstance(c, list) or not c or any(not isinstance(o, str) or "=" not in o for o in c):
                raise ValueError(f"protocol {self.name}: controls entry {c!r} is not a list of key=value overrides")
        cells = {*self.methods, *(c.name for c in self.control_points())}
        for sc in self.seed_claims:
            unknown = [x for x in (sc.method, sc.versus) if x is not None and x not in cells]
            if unknown:
                raise ValueError(f"protocol {self.name}: seed claim {sc.seed} ({sc.text}) names {unknown}, not a method "
                                 f"or control of the protocol ({sorted(cells)})")
        claimed = [c.metric for m in self.methods.values() for c in self.claims_of(m.name)]
        claimed += [sc.metric for sc in self.seed_claims]
        for metrics, phase in ((self.criterion, "tune"), ([*claimed, *(self.columns or [])], "evaluate")):
            ev = self.phase_eval(phase)
            ks = set(ev.get("final_ks") or ev["ks"])  # the summary reads the last evaluation
            for metric in metrics:
                if metric not in COLUMNS:
                    raise ValueError(f"protocol {self.name}: {metric!r} is not a run-summary column ({list(COLUMNS)})")
                if pass_k(metric) is not None and pass_k(metric) not in ks:
                    raise ValueError(f"protocol {self.name}: {metric} needs {pass_k(metric)} in the {phase} "
                                     f"evaluation's ks {sorted(ks)}")

    def phase_eval(self, phase: str) -> dict[str, Any]:
        """The periodic evaluation of ``phase``: ``eval``, with ``tune.eval`` over it when tuning."""
        return {**self.eval, **(self.tune.get("eval") or {})} if phase == "tune" else dict(self.eval)

    def seeds_of(self, method: str) -> list[int]:
        """A method's evaluation seeds: its own, else the protocol's."""
        own = self.methods[method].evaluation_seeds
        seeds = list(own) if own is not None else list(self.evaluation_seeds)
        return seeds + [s for s in self.extra_seeds.get(method, []) if s not in seeds]

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

    def iterations_of(self, phase: str) -> int:
        """The iterations a run of ``phase`` declares: ``tune.iterations`` where tuning sets its own, else
        ``iterations``."""
        return self.tune.get("iterations", self.iterations) if phase == "tune" else self.iterations

    def claims_of(self, method: str) -> list[Claim]:
        own = self.methods[method].claims
        return list(own) if own is not None else list(self.claims)

    def plan(self, points: list[Point], seeds: list[int], extra: list[str] = (), phase: str = "evaluate") -> ProtocolPlan:
        """The study plan that runs ``points`` on ``seeds`` with ``phase``'s length and evaluation; in ``evaluate``
        a method with its own ``evaluation_seeds`` runs on those of ``seeds`` only."""
        ev = self.phase_eval(phase)
        iterations = self.iterations_of(phase)
        seeds_of = {} if phase == "tune" else {p.cell: [s for s in seeds if s in self.seeds_of(p.method)]
                                                 for p in points if p.method in self.methods}
        return ProtocolPlan(algos=[], controllers=[], seeds=list(seeds), iterations=iterations,
                            eval_problems=ev["problems"], eval_n=ev["n"], eval_ks=tuple(ev["ks"]),
                            eval_every=ev["every"], eval_final_n=ev.get("final_n"),
                            eval_final_ks=tuple(ev.get("final_ks") or ()), overrides=[*self.overrides, *extra],
                            variants={p.name: list(p.overrides) for p in points}, explicit=[p.cell for p in points],
                            seeds_of=seeds_of, keep_checkpoints=self.keep_checkpoints)

    def all_evaluation_seeds(self) -> list[int]:
        """Every seed some method is evaluated on, in order."""
        return sorted({s for m in self.methods for s in self.seeds_of(m)})

    def all_points(self) -> list[Point]:
        """Every point of every method (what ``--check`` composes)."""
        return [p for m in self.methods.values() for p in m.points()] + self.control_points()

    def tuning_points(self, calibrated: tuple[tuple[str, Any], ...] | None = None) -> list[Point]:
        """The points tuning runs: those of methods with more than one setting. A method with one setting has
        nothing to choose; its pick is that setting, and it first runs in ``evaluate``.

        With ``tune.calibrate_first``: the baseline's points, and, once ``calibrated`` gives the baseline's picked
        values of the ``calibrate`` keys (:func:`calibrated_values`), every other method's points at them."""
        tuned = [m for m in self.methods.values() if m.tuned]
        if not self.tune.get("calibrate_first"):
            return [p for m in tuned for p in m.points()]
        first = [p for m in tuned if m.name == self.baseline for p in m.points()]
        if calibrated is None:
            return first
        return first + [p for m in tuned if m.name != self.baseline for p in m.points(calibrated)]

    def seconds(self, runs: int, phase: str = "evaluate") -> float:
        """The protocol's estimate of ``runs`` runs of ``phase`` on one core: iterations, plus each periodic
        evaluation (at start, when ``experiment=collapse`` asks for it, and every ``eval.every`` iterations)."""
        iterations = self.iterations_of(phase)
        evals = iterations // self.phase_eval(phase)["every"] + 1
        return runs * (iterations * self.cost["seconds_per_iteration"] + evals * self.cost["seconds_per_evaluation"])


@dataclass
class ProtocolPlan(StudyPlan):
    """A study plan over an explicit list of cells (each point's ``algo@point``, ``controller``)."""

    explicit: list[tuple[str, str]] = field(default_factory=list)
    seeds_of: dict[tuple[str, str], list[int]] = field(default_factory=dict)
    """A cell's seeds where they are fewer than ``seeds``."""

    def grid(self) -> list[tuple[str, str]]:
        return list(dict.fromkeys(self.explicit))

    def runs(self) -> list[tuple[str, str, int]]:
        return [(a, c, s) for a, c, s in super().runs() if s in self.seeds_of.get((a, c), [s])]


_KEYS = {"name", "methods", "tuning_seeds", "evaluation_seeds", "criterion", "baseline", "claims", "overrides",
         "iterations", "eval", "interval", "out", "min_evaluation_seeds", "cost", "controls", "tune", "calibrate",
         "columns", "keep_checkpoints", "seed_claims", "nearest", "lab", "start", "recommend"}
_METHOD_KEYS = {"algo", "controller", "fixed", "grid", "claims", "evaluation_seeds"}


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
                                   list(spec.get("fixed") or []), grid, claims, spec.get("evaluation_seeds"))
    claims = [Claim(**c) for c in raw.pop("claims", None) or []]
    seed_claims = [SeedClaim(**{k: str(v) if k == "seed" else v for k, v in c.items()})
                   for c in raw.pop("seed_claims", None) or []]
    interval = IntervalRule(**(raw.pop("interval", None) or {}))
    return Protocol(methods=methods, claims=claims, interval=interval, seed_claims=seed_claims, **raw)


# ------------------------------------------------------------------------------------------------ phases


def criterion_score(summary: dict[str, Any], metrics: list[str]) -> float | None:
    """The mean of ``metrics`` in one run's summary (None when one is missing)."""
    xs = [summary.get(m) for m in metrics]
    return None if any(x is None for x in xs) else statistics.mean(xs)


def collect(plan: StudyPlan, out: Path, points: list[Point]) -> dict[str, dict[int, dict[str, Any]]]:
    """Point name -> seed -> run summary (with the method's ``dose``), over the finished runs. A seed run again on
    another machine (``seed{k}@…``, :mod:`studies.pair_schedule`) has its runs in one of them and its ``alternates``,
    each with its ``folder``: in front, read by the cell's table, the run that pairs with the most runs of the other
    cells' same seed (:func:`_primary_first`); :func:`studies.verdicts.judge` takes whichever pairs."""
    got: dict[str, dict[int, list[dict[str, Any]]]] = {}
    for p in points:
        for seed in plan.seeds:
            summaries = []
            for folder in folders_of(out, *p.cell, seed):
                summary = run_summary(folder) if folder.exists() and finished(folder) else None
                if summary is not None:
                    summary["dose"] = method_dose(method_of(p.algo, p.controller), summary)
                    if folder.name != f"seed{seed}":  # a seed run again on another machine
                        summary["folder"] = folder.name
                    summaries.append(summary)
            if summaries:
                got.setdefault(p.name, {})[seed] = summaries
    return {name: {seed: _primary_first(name, seed, summaries, got) for seed, summaries in seeds.items()}
            for name, seeds in got.items()}


def _primary_first(name: str, seed: int, summaries: list[dict[str, Any]],
                   got: dict[str, dict[int, list[dict[str, Any]]]]) -> dict[str, Any]:
    """The run of one cell's seed that the cell's table reads, with the others in its ``alternates``: the run that
    shares its machine and commit (``pairing``) with the most runs of the other cells' same seed (the runs the
    verdicts pair it with), the first finished on a tie. Without it a seed run on a second machine for its pairs
    would leave the table reading the first machine's run, which pairs with nothing."""
    def partners(summary: dict[str, Any]) -> int:
        key = summary.get("pairing")
        return 0 if key is None else sum(1 for other, seeds in got.items() if other != name
                                         for s in seeds.get(seed, ()) if s.get("pairing") == key)

    primary = max(summaries, key=partners)  # max keeps the first of equals
    if len(summaries) > 1:
        primary["alternates"] = [s for s in summaries if s is not primary]
    return primary


def calibrated_values(protocol: Protocol, picks: dict[str, Any]) -> tuple[tuple[str, Any], ...] | None:
    """The baseline's picked values of the ``calibrate`` keys; None while the baseline has no pick."""
    chosen = picks["methods"].get(protocol.baseline)
    if chosen is None:
        return None
    [point] = [p for p in protocol.methods[protocol.baseline].points() if p.name == chosen["point"]]
    return tuple((k, v) for k, v in point.values if k in protocol.calibrate)


def current_tuning_points(protocol: Protocol, out: Path) -> list[Point]:
    """What the tuning phase runs now: every tuning point; with ``tune.calibrate_first``, the baseline's, then the
    others' at the baseline's pick once the tuning runs under ``out`` give it."""
    if not protocol.tune.get("calibrate_first"):
        return protocol.tuning_points()
    return protocol.tuning_points(calibrated_values(protocol, pick(protocol, out)))


def pick(protocol: Protocol, out: Path) -> dict[str, Any]:
    """The picks of the tuning runs under ``out``: per method the best point by the criterion, and every point's scores.
    With ``tune.calibrate_first`` a method other than the baseline is picked from its runs at the baseline's picked
    values only, and has no pick before the baseline has one."""
    picks: dict[str, Any] = {"protocol": protocol.name, "criterion": protocol.criterion,
                             "tuning_seeds": protocol.tuning_seeds, "methods": {}, "incomplete": {}}
    if not protocol.tune.get("calibrate_first"):
        _pick_methods(protocol, out, picks, list(protocol.methods))
        return picks
    _pick_methods(protocol, out, picks, [protocol.baseline])
    calibrated = calibrated_values(protocol, picks)
    others = [m for m in protocol.methods if m != protocol.baseline]
    if calibrated is None:  # the others' grids have not started: they run at the baseline's pick
        for m in others:
            if protocol.methods[m].tuned:
                picks["incomplete"][m] = [f"waits for {protocol.baseline}'s pick of {', '.join(protocol.calibrate)}"]
        others = [m for m in others if m not in picks["incomplete"]]
    _pick_methods(protocol, out, picks, others, calibrated or ())
    picks["methods"] = {m: picks["methods"][m] for m in protocol.methods if m in picks["methods"]}
    return picks


def _pick_methods(protocol: Protocol, out: Path, picks: dict[str, Any], methods: list[str],
                  calibrated: tuple[tuple[str, Any], ...] = ()) -> None:
    """Pick each of ``methods`` (its points at ``calibrated``) into ``picks``."""
    points = [p for m in methods if protocol.methods[m].tuned for p in protocol.methods[m].points(calibrated)]
    runs = collect(protocol.plan(points, protocol.tuning_seeds, phase="tune"), out, points)
    for method in methods:
        spec = protocol.methods[method]
        if not spec.tuned:  # nothing to tune: the one setting is the pick, with no tuning runs
            p = spec.points()[0]
            picks["methods"][method] = {"point": p.name, "algo": p.algo, "controller": p.controller,
                                        "overrides": list(p.overrides), "setting": p.setting, "scores": {},
                                        "mean": None, "dose": None, "grid": []}
            continue
        rows, missing = [], []
        for p in spec.points(calibrated):
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


def picked_points(picks: dict[str, Any], protocol: Protocol, ready_only: bool = False) -> list[Point]:
    """The picked point of each protocol method (the baseline first); a method without a pick fails by name.
    ``ready_only``: only the methods that have their pick, which needs the baseline's (the methods still tuning are
    left out; :func:`waiting_methods` names them)."""
    absent = [m for m in protocol.methods if m not in picks["methods"]]
    if absent and (not ready_only or protocol.baseline in absent):
        raise ValueError(f"no pick for {absent} (unfinished tuning: {picks.get('incomplete', {})}); "
                         "run --phase tune to the end first")
    order = [m for m in (protocol.baseline, *(m for m in protocol.methods if m != protocol.baseline))
             if m not in absent]
    chosen = picks["methods"][protocol.baseline]["overrides"]
    calibrated = [o for o in chosen if o.partition("=")[0] in protocol.calibrate]

    def overrides(m: str) -> tuple[str, ...]:
        own = picks["methods"][m]["overrides"]
        keys = {o.partition("=")[0] for o in own}
        return (*(o for o in calibrated if m != protocol.baseline and o.partition("=")[0] not in keys), *own)

    return [Point(m, picks["methods"][m]["point"], picks["methods"][m]["algo"], picks["methods"][m]["controller"],
                  overrides(m)) for m in order]


def waiting_methods(picks: dict[str, Any], protocol: Protocol) -> list[str]:
    """The protocol's methods without a pick yet (their tuning runs, or the baseline's, are unfinished)."""
    return [m for m in protocol.methods if m not in picks["methods"]]


def evaluation_points(picks: dict[str, Any], protocol: Protocol) -> list[Point]:
    """What ``evaluate`` runs: each method's pick, then the controls (with the calibrated keys of the baseline's
    pick, as every method)."""
    points = picked_points(picks, protocol)
    calibrated = [o for o in points[0].overrides if o.partition("=")[0] in protocol.calibrate]

    def calibrate(c: Point) -> Point:
        keys = {o.partition("=")[0] for o in c.overrides}
        return replace(c, overrides=(*(o for o in calibrated if o.partition("=")[0] not in keys), *c.overrides))

    return [*points, *map(calibrate, protocol.control_points())]
