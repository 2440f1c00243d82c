"""One labelling rule for a study's claims, applied by code: a paired interval against the baseline, and the dose.

For a method, a claim (a run-summary metric and the direction the paper claims, e.g. ``pass@64`` higher) and
the evaluation seeds both the method and the baseline (GRPO) finished, the per-seed differences
``d_s = metric(method, s) − metric(baseline, s)`` are paired by seed (same seed: same prompts, same start).
Their 95 % interval is a seeded percentile bootstrap of the mean (10,000 resamples of the seeds with
replacement; :func:`bootstrap_interval`) or a paired t interval (:func:`t_interval`). Then (:func:`label`):

* the method's dose (:mod:`studies.dose`) under its threshold, or not logged: *not tested at
  this dose*, whatever the interval;
* the interval above 0 in the claimed direction: *reproduced*;
* otherwise *not reproduced*: the interval excludes 0 against the claim, or includes 0.

With the rule ``kind: sign_flip`` the label comes from a test instead (:func:`label_by_test`): each claim's exact
one-sided paired sign-flip p-value (:func:`studies.significance.sign_flip_p`), adjusted by Holm across every claim
the report judges (the family is fixed by the protocol, not by the outcomes); *reproduced* when the adjusted p is
at most ``alpha``; the paired t interval is printed beside it.

:func:`verdict_report` prints :func:`rule_text` above the table, so that the page says which rule made it.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from typing import Any

from studies.dose import METHOD_DOSE, NOT_TESTED, dose_given
from studies.pairs import PAIRINGS, problem_scores
from studies.significance import holm, sign_flip_p, two_level_bootstrap

REPRODUCED, NOT_REPRODUCED = "reproduced", "not reproduced"
DIRECTIONS = ("higher", "lower")
INTERVALS = ("bootstrap", "t", "sign_flip")
CORRECTIONS = ("holm", "none")

_T975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262, 10: 2.228,
         11: 2.201, 12: 2.179, 13: 2.160, 14: 2.145, 15: 2.131, 16: 2.120, 17: 2.110, 18: 2.101, 19: 2.093,
         20: 2.086, 25: 2.060, 30: 2.042, 40: 2.021, 60: 2.000, 120: 1.980}
"""Two-sided 95 % quantiles of Student's t by degrees of freedom (between two entries the smaller df's,
which is the wider interval; above 120, 1.96)."""


@dataclass(frozen=True)
class Claim:
    """A paper's claim about a run-summary metric: it is ``higher`` (or ``lower``) than the baseline's."""

    metric: str
    direction: str = "higher"

    def __post_init__(self) -> None:
        if self.direction not in DIRECTIONS:
            raise ValueError(f"claim on {self.metric}: direction={self.direction!r}; choose one of {DIRECTIONS}")


@dataclass(frozen=True)
class IntervalRule:
    """How a claim is labelled: by an interval, ``bootstrap`` (``resamples``, ``seed``) or ``t``, at ``level``; or by
    the test ``sign_flip`` at ``alpha`` with the multiplicity ``correction`` (``holm`` or ``none``), its t interval
    printed beside it."""

    kind: str = "bootstrap"
    resamples: int = 10_000
    seed: int = 0
    level: float = 0.95
    alpha: float = 0.05
    correction: str = "holm"
    pairing: str = "seed"
    """How runs pair (:data:`studies.pairs.PAIRINGS`): by ``seed`` alone, or ``seed_machine_commit``: seed k of both,
    each run on one machine at one commit, the same for both (:func:`studies.pairs.run_pairing`)."""

    def __post_init__(self) -> None:
        if self.pairing not in PAIRINGS:
            raise ValueError(f"interval.pairing={self.pairing!r}; choose one of {PAIRINGS}")
        if self.kind not in INTERVALS:
            raise ValueError(f"interval={self.kind!r}; choose one of {INTERVALS}")
        if self.kind in ("t", "sign_flip") and self.level != 0.95:
            raise ValueError("the t interval is tabulated at level 0.95 only")
        if not 0 < self.level < 1 or self.resamples < 1:
            raise ValueError(f"interval level {self.level} must be in (0, 1) and resamples {self.resamples} >= 1")
        if not 0 < self.alpha < 1 or self.correction not in CORRECTIONS:
            raise ValueError(f"alpha {self.alpha} must be in (0, 1) and correction {self.correction!r} one of "
                             f"{CORRECTIONS}")

    @property
    def is_test(self) -> bool:
        """Labels come from a p-value (``sign_flip``), not from an interval."""
        return self.kind == "sign_flip"

    def interval(self, diffs: list[float]) -> tuple[float, float]:
        if self.kind in ("t", "sign_flip"):
            return t_interval(diffs)
        return bootstrap_interval(diffs, self.resamples, self.seed, self.level)


def bootstrap_interval(diffs: list[float], resamples: int = 10_000, seed: int = 0,
                       level: float = 0.95) -> tuple[float, float]:
    """Percentile bootstrap interval of the mean of ``diffs``: ``resamples`` draws of ``len(diffs)`` values with
    replacement from a ``numpy`` generator seeded with ``seed``; the ``(1 − level)/2`` and ``(1 + level)/2``
    quantiles of the resampled means (linear interpolation)."""
    import numpy as np

    d = np.asarray(diffs, dtype=np.float64)
    if d.size < 2:
        raise ValueError("a paired interval needs at least 2 seeds")
    idx = np.random.default_rng(seed).integers(0, d.size, size=(resamples, d.size))
    means = d[idx].mean(axis=1)
    lo, hi = np.quantile(means, [(1 - level) / 2, (1 + level) / 2])
    return float(lo), float(hi)


def t_quantile(df: int) -> float:
    """The two-sided 95 % quantile of Student's t with ``df`` degrees of freedom (:data:`_T975`)."""
    if df < 1:
        raise ValueError("a paired interval needs at least 2 seeds")
    return _T975[max(k for k in _T975 if k <= df)] if df <= 120 else 1.96


def t_interval(diffs: list[float]) -> tuple[float, float]:
    """Paired t 95 % interval: ``mean ± t(n − 1)·sd/√n`` (sd with ``n − 1``)."""
    if len(diffs) < 2:
        raise ValueError("a paired interval needs at least 2 seeds")
    mean, half = statistics.mean(diffs), t_quantile(len(diffs) - 1) * statistics.stdev(diffs) / math.sqrt(len(diffs))
    return mean - half, mean + half


def label(lo: float, hi: float, direction: str, dosed: bool | None) -> tuple[str, str]:
    """``(label, reason)`` of one claim from its interval ``[lo, hi]`` of the difference to the baseline, the
    claimed ``direction`` and whether the method got its dose (None: no dose logged)."""
    if dosed is not True:
        return NOT_TESTED, "dose under its threshold" if dosed is False else "no dose logged"
    lo, hi = (lo, hi) if direction == "higher" else (-hi, -lo)
    if lo > 0:
        return REPRODUCED, "interval excludes 0 in the claimed direction"
    if hi < 0:
        return NOT_REPRODUCED, "interval excludes 0 against the claim"
    return NOT_REPRODUCED, "interval includes 0"


def label_by_test(p_adjusted: float, alpha: float, dosed: bool | None) -> tuple[str, str]:
    """``(label, reason)`` of one claim from its multiplicity-adjusted one-sided p-value (rule ``sign_flip``)."""
    if dosed is not True:
        return NOT_TESTED, "dose under its threshold" if dosed is False else "no dose logged"
    if p_adjusted <= alpha:
        return REPRODUCED, f"adjusted p <= {alpha:g}"
    return NOT_REPRODUCED, f"adjusted p > {alpha:g}"


@dataclass
class Verdict:
    """One method's verdict on one claim."""

    method: str
    claim: Claim
    seeds: list[int]
    mean: float | None
    interval: tuple[float, float] | None
    dose: float | None
    label: str
    reason: str
    setting: str = ""
    p: float | None = None
    """Rule ``sign_flip``: the exact one-sided p-value of the claim."""
    p_adjusted: float | None = None
    """Rule ``sign_flip``: that p-value adjusted across the report's claims (Holm), which the label reads."""
    unpaired: list[int] = field(default_factory=list)
    """Seeds both finished that do not pair under the rule's ``pairing`` (another machine or commit): left out."""
    problem_interval: tuple[float, float] | None = None
    """The 95 % two-level bootstrap interval (seeds, then problems within each seed) of the mean difference, from the
    runs' per-problem counts, where every paired run has them for the claim's metric; beside the test, not deciding."""


def judge(runs: dict[str, dict[int, dict[str, Any]]], baseline: str, claims: dict[str, list[Claim]],
          rule: IntervalRule | None = None, settings: dict[str, str] | None = None,
          dose_of: dict[str, str] | None = None, problem_intervals: bool = True) -> list[Verdict]:
    """Every method's verdict on each of its claims. ``runs``: method -> seed -> run summary (with its ``dose``,
    :func:`studies.dose.method_dose`); ``claims``: method -> its claims (the baseline is not judged);
    ``dose_of``: method -> the :data:`~studies.dose.METHOD_DOSE` entry it is dosed by (default: its name);
    ``problem_intervals``: compute each claim's :func:`problem_interval` (False where only the labels are read: the
    bootstrap over 10 seeds x 256 problems takes about half a second a claim)."""
    rule = rule or IntervalRule()
    base = runs.get(baseline, {})
    out = []
    dosed_of: dict[tuple[str, Claim], bool | None] = {}  # rule sign_flip: labelled after the adjustment
    for method, claimed in claims.items():
        if method == baseline:
            continue
        mine = runs.get(method, {})
        doses = [mine[s].get("dose") for s in mine]
        dosed_by = (dose_of or {}).get(method, method)
        dosed = dose_given(dosed_by, doses) if dosed_by in METHOD_DOSE else True  # no lever to dose: judged as is
        known = [d for d in doses if d is not None]
        dose = statistics.mean(known) if known else None
        for claim in claimed:
            finished = sorted(s for s in set(mine) & set(base)
                              if mine[s].get(claim.metric) is not None and base[s].get(claim.metric) is not None)
            matched = {s: m for s in finished if (m := matching(mine[s], base[s], rule.pairing, claim.metric))}
            seeds = sorted(matched)
            unpaired = [s for s in finished if s not in seeds]
            diffs = [matched[s][0][claim.metric] - matched[s][1][claim.metric] for s in seeds]
            if len(diffs) < 2:
                out.append(Verdict(method, claim, seeds, None, None, dose, "no verdict",
                                   f"{len(diffs)} paired seed(s); the interval needs 2" + _left_out(unpaired),
                                   (settings or {}).get(method, ""), unpaired=unpaired))
                continue
            lo, hi = rule.interval(diffs)
            text, reason = label(lo, hi, claim.direction, dosed)
            reason += _left_out(unpaired)
            v = Verdict(method, claim, seeds, statistics.mean(diffs), (lo, hi), dose, text, reason,
                        (settings or {}).get(method, ""), unpaired=unpaired,
                        problem_interval=problem_interval([matched[s][0] for s in seeds],
                                                          [matched[s][1] for s in seeds], claim.metric)
                        if problem_intervals else None)
            if rule.is_test:
                v.p = sign_flip_p(diffs, claim.direction)
                dosed_of[(method, claim)] = dosed
            out.append(v)
    if rule.is_test:
        _adjust(out, rule, dosed_of)
    return out


def pairs(run: dict[str, Any], baseline_run: dict[str, Any], pairing: str) -> bool:
    """Whether two runs of one seed pair under ``pairing`` (their summaries' ``pairing``: machine and commit)."""
    if pairing == "seed":
        return True
    return run.get("pairing") is not None and run.get("pairing") == baseline_run.get("pairing")


def matching(run: dict[str, Any], baseline_run: dict[str, Any], pairing: str,
             metric: str) -> tuple[dict[str, Any], dict[str, Any]] | None:
    """The two runs of one seed that pair under ``pairing`` and both have ``metric``: ``run`` and ``baseline_run``
    where they do, else the first pair among them and their ``alternates`` (the seed run again on another machine,
    :func:`studies.protocol.collect`); None when none pairs."""
    for mine in (run, *run.get("alternates", ())):
        for base in (baseline_run, *baseline_run.get("alternates", ())):
            if mine.get(metric) is not None and base.get(metric) is not None and pairs(mine, base, pairing):
                return mine, base
    return None


def _left_out(unpaired: list[int]) -> str:
    return (f"; seed(s) {', '.join(map(str, unpaired))} left out: not run on one machine at one commit with the "
            "baseline's" if unpaired else "")


def problem_interval(runs: list[dict[str, Any]], baseline_runs: list[dict[str, Any]], metric: str,
                     resamples: int = 10_000, seed: int = 0) -> tuple[float, float] | None:
    """The two-level bootstrap interval of the mean paired difference of ``metric`` over the seeds and each seed's
    problems (:func:`studies.significance.two_level_bootstrap`), or None unless every run of both lists has the
    per-problem counts of the same problems for it."""
    mine = [problem_scores(r.get("problem_counts"), metric) for r in runs]
    base = [problem_scores(r.get("problem_counts"), metric) for r in baseline_runs]
    got = mine + base
    if len(runs) < 2 or any(g is None for g in got) or len({g[0] for g in got}) != 1 or len({len(g[1]) for g in got}) != 1:
        return None
    return two_level_bootstrap([m[1] for m in mine], [b[1] for b in base], resamples, seed)


def _adjust(verdicts: list[Verdict], rule: IntervalRule, dosed: dict[tuple[str, Claim], bool | None]) -> None:
    """Holm (or no correction) across every claim with a p-value, then each claim's label from its adjusted p."""
    tested = {(v.method, v.claim): v for v in verdicts if v.p is not None}
    if rule.correction == "holm":
        adjusted = {key: p for key, (p, _) in holm({k: v.p for k, v in tested.items()}, rule.alpha).items()}
    else:
        adjusted = {k: v.p for k, v in tested.items()}
    for key, v in tested.items():
        v.p_adjusted = adjusted[key]
        v.label, v.reason = label_by_test(v.p_adjusted, rule.alpha, dosed[key])
        v.reason += _left_out(v.unpaired)


def rule_text(baseline: str, rule: IntervalRule | None = None) -> str:
    """The labelling rule in words, with its parameters (printed above the verdict table)."""
    rule = rule or IntervalRule()
    if rule.is_test:
        family = "adjusted by Holm across every claim below" if rule.correction == "holm" else "not adjusted"
        return (f"**Labelling rule** (studies/verdicts.py). For each claim, the difference to `{baseline}` on each "
                f"evaluation seed both finished (paired by seed), and its exact one-sided sign-flip p-value (the share "
                f"of the 2^n sign assignments of the differences whose mean reaches the observed one in the claimed "
                f"direction), {family}. *{REPRODUCED}*: the adjusted p is at most {rule.alpha:g} and the method got "
                f"its dose. *{NOT_REPRODUCED}*: the method got its dose and the adjusted p is above {rule.alpha:g}. "
                f"*{NOT_TESTED}*: the method's dose (the `dose` column) is under its threshold or was not logged, "
                "whatever the test. The 95 % interval is the paired t interval, for scale; it does not decide.")
    how = (f"a percentile bootstrap of the mean difference ({rule.resamples:,} resamples of the seeds, "
           f"numpy generator seed {rule.seed})" if rule.kind == "bootstrap" else "a paired t interval")
    return (f"**Labelling rule** (studies/verdicts.py). For each claim, the difference to `{baseline}` "
            f"on each evaluation seed both finished (paired by seed), and its {rule.level:.0%} interval by {how}. "
            f"*{REPRODUCED}*: the interval excludes 0 in the claimed direction and the method got its dose. "
            f"*{NOT_REPRODUCED}*: the method got its dose and the interval excludes 0 against the claim or includes "
            f"0. *{NOT_TESTED}*: the method's dose (the `dose` column) is under its threshold or was not logged, "
            "whatever the interval.")


def verdict_table(verdicts: list[Verdict]) -> str:
    """The Markdown table: one row per method and claim."""
    tested = any(v.p is not None for v in verdicts)
    by_problem = any(v.problem_interval is not None for v in verdicts)  # only then: earlier reports keep their bytes
    extra = (" seeds × problems 95 % |" if by_problem else "") + (" p (one-sided) | adjusted p |" if tested else "")
    lines = ["| method | setting | dose | claim | seeds | Δ vs baseline (mean) | 95 % interval |" + extra + " label | why |",
             "|---|---|---|---|---|---|---|" + ("---|" if by_problem else "") + ("---|---|" if tested else "") + "---|---|"]
    for v in verdicts:
        sign = ">" if v.claim.direction == "higher" else "<"
        mean = f"{v.mean:+.3f}" if v.mean is not None else "—"
        ci = f"[{v.interval[0]:+.3f}, {v.interval[1]:+.3f}]" if v.interval else "—"
        dose = f"{v.dose:.4f}" if v.dose is not None else "—"
        pi = v.problem_interval
        ps = ((f" [{pi[0]:+.3f}, {pi[1]:+.3f}] |" if pi else " — |") if by_problem else "") + (
            f" {_p(v.p)} | {_p(v.p_adjusted)} |" if tested else "")
        lines.append(f"| {v.method} | {v.setting or '—'} | {dose} | {v.claim.metric} {sign} baseline | "
                     f"{len(v.seeds)} | {mean} | {ci} |{ps} **{v.label}** | {v.reason} |")
    return "\n".join(lines)


def _p(p: float | None) -> str:
    return "—" if p is None else f"{p:.4f}"


def verdict_report(verdicts: list[Verdict], baseline: str, rule: IntervalRule | None = None) -> str:
    """The rule's text, then the table."""
    return rule_text(baseline, rule) + "\n\n" + verdict_table(verdicts)


def recommended(verdicts: list[Verdict], baseline: str, metrics: list[str]) -> str:
    """The method the verdicts recommend by the declared rule (a protocol's ``recommend``): one *reproduced* on the
    claim of every metric in ``metrics``; of several, the one with the most of its claims reproduced, then the
    largest mean difference on the first metric, then the name; where none is, ``baseline``."""
    by_method: dict[str, dict[str, Verdict]] = {}
    for v in verdicts:
        by_method.setdefault(v.method, {})[v.claim.metric] = v
    winners = [m for m, claims in by_method.items()
               if all(metric in claims and claims[metric].label == REPRODUCED for metric in metrics)]
    if not winners:
        return baseline
    return min(winners, key=lambda m: (-sum(v.label == REPRODUCED for v in by_method[m].values()),
                                       -by_method[m][metrics[0]].mean, m))
