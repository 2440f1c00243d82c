"""The seed papers' own claims, judged by code on a protocol's evaluation runs.

The protocol's verdicts (:mod:`studies.verdicts`) compare each method with the baseline. Some claims
of the seed papers have another shape, and a protocol lists them under ``seed_claims``:

* **a level**: a method's metric is above a level (``above``), e.g. the predicted entropy change correlates
  positively with the realised one (``dh_corr`` above 0, seed 003). The per-seed values minus the level get the
  protocol's interval of their mean.
* **a comparison of two cells**: a method's metric against another method's or a control's (``versus``), paired by
  seed, e.g. DAPO's ε_high against an entropy bonus (seed 000), GRPO all in fp32 against bf16 (seed 004).

The label is the protocol's rule (:func:`studies.verdicts.label`): *reproduced* when the interval
excludes 0 in the claimed direction, and *not tested at this dose* when the method (the first cell) did not act.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any

from studies.dose import METHOD_DOSE, dose_given
from studies.verdicts import DIRECTIONS, IntervalRule, label


@dataclass(frozen=True)
class SeedClaim:
    """One claim of a seed paper, as a protocol declares it."""

    seed: str
    """The seed paper it comes from (``"003"``)."""
    text: str
    """The claim in words, as the report prints it."""
    method: str
    """The cell whose runs are judged: a protocol method, or a control's point name (``grpo-precisionfp32``)."""
    metric: str
    """A run-summary column (:data:`studies.method_study.COLUMNS`)."""
    direction: str = "higher"
    above: float | None = None
    """A level: the claim is that the metric's mean over seeds is above (or, ``lower``, below) it."""
    versus: str | None = None
    """Another cell: the claim is that the method's metric is higher (or lower) than that cell's, seed by seed."""

    def __post_init__(self) -> None:
        if self.direction not in DIRECTIONS:
            raise ValueError(f"seed claim {self.seed} ({self.text}): direction={self.direction!r}; choose one of {DIRECTIONS}")
        if (self.above is None) == (self.versus is None):
            raise ValueError(f"seed claim {self.seed} ({self.text}): give exactly one of `above` (a level) and "
                             "`versus` (another cell)")

    @property
    def reference(self) -> str:
        return f"{self.versus}" if self.versus is not None else f"{self.above:g}"


@dataclass
class SeedVerdict:
    claim: SeedClaim
    seeds: list[int]
    mean: float | None
    """The mean over seeds of the metric minus the level, or of the paired differences."""
    interval: tuple[float, float] | None
    label: str
    reason: str


def judge_seed_claims(claims: list[SeedClaim], runs: dict[str, dict[int, dict[str, Any]]], rule: IntervalRule,
                      dose_of: dict[str, str] | None = None) -> list[SeedVerdict]:
    """Each claim's verdict. ``runs``: cell (method or control point name) -> seed -> run summary with its ``dose``;
    ``dose_of``: cell -> the :data:`~studies.dose.METHOD_DOSE` entry it is dosed by (default: none)."""
    out = []
    for c in claims:
        mine, other = runs.get(c.method, {}), runs.get(c.versus, {}) if c.versus else {}
        seeds = sorted(s for s in mine if mine[s].get(c.metric) is not None
                       and (c.versus is None or (s in other and other[s].get(c.metric) is not None)))
        values = [mine[s][c.metric] - (other[s][c.metric] if c.versus else c.above) for s in seeds]
        if len(values) < 2:
            out.append(SeedVerdict(c, seeds, None, None, "no verdict", f"{len(values)} seed(s); the interval needs 2"))
            continue
        dosed_by = (dose_of or {}).get(c.method)
        dosed = dose_given(dosed_by, [mine[s].get("dose") for s in seeds]) if dosed_by in METHOD_DOSE else True
        lo, hi = rule.interval(values)
        text, reason = label(lo, hi, c.direction, dosed)
        out.append(SeedVerdict(c, seeds, statistics.mean(values), (lo, hi), text, reason))
    return out


def seed_claims_table(verdicts: list[SeedVerdict]) -> str:
    """The Markdown table of the seed papers' claims: one row per claim."""
    lines = ["| seed | claim | cell | metric | against | seeds | mean difference | 95 % interval | label | why |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for v in verdicts:
        c = v.claim
        sign = ">" if c.direction == "higher" else "<"
        mean = f"{v.mean:+.3f}" if v.mean is not None else "—"
        ci = f"[{v.interval[0]:+.3f}, {v.interval[1]:+.3f}]" if v.interval else "—"
        lines.append(f"| {c.seed} | {c.text} | {c.method} | {c.metric} {sign} | {c.reference} | {len(v.seeds)} | "
                     f"{mean} | {ci} | **{v.label}** | {v.reason} |")
    return "\n".join(lines)


def law_table(claims: list[SeedClaim], runs: dict[str, dict[int, dict[str, Any]]]) -> str:
    """Seed 001's law per run of each cell whose claim reads ``law_r2``: the fit's R² over the whole run, the
    ceiling the fit on the first third predicts for H = 0 (``law_ceiling``, b − a) beside the measured accuracy of
    the last 20 iterations and the final entropy; "" when no claim reads the law."""
    cells = list(dict.fromkeys(c.method for c in claims if c.metric == "law_r2"))
    lines = ["| cell | seed | law R² (whole run) | predicted ceiling (fit on the first third) | measured acc (last 20) | "
             "ceiling − measured | H final |", "|---|---|---|---|---|---|---|"]

    def f(x: Any, fmt: str = ".3f") -> str:
        return "—" if x is None else format(x, fmt)

    for cell in cells:
        for seed, r in sorted(runs.get(cell, {}).items()):
            ceil, acc = r.get("law_ceiling"), r.get("acc_last20")
            gap = None if ceil is None or acc is None else ceil - acc
            lines.append(f"| {cell} | {seed} | {f(r.get('law_r2'))} | {f(ceil)} | {f(acc)} | {f(gap, '+.3f')} | "
                         f"{f(r.get('h_final'))} |")
    return "\n".join(lines) if len(lines) > 2 else ""

