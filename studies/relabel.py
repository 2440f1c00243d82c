"""An earlier study's claims relabelled under the declared rule, beside the labels its own rule gave them (issue 77).

The real-LM study (``conf/protocol/real_lm.yaml``) and the lab's collapse protocol (``conf/protocol/collapse.yaml``)
labelled each claim with a percentile bootstrap of the per-seed paired differences. With 3 seeds that interval is
[smallest, largest] difference, so *reproduced* meant "the seeds agree in sign" (one-sided p = 1/8 under the exact
sign-flip test), and no correction was made across a study's claims. The verdicts study declares the rule that
replaces it (``conf/protocol/verdicts.yaml``), :data:`DECLARED`: per claim the exact one-sided paired sign-flip test
in the claimed direction (:func:`studies.significance.sign_flip_p`), Holm across every claim of the study at
α = 0.05 (:func:`studies.significance.holm`), *reproduced* when the adjusted p is at most α and the method got its
dose (:func:`studies.verdicts.label_by_test`).

:func:`records_claims` rebuilds a study's claims from its shipped records (picked again, nothing run), each with its
per-seed differences and the label the study's own rule gives it (its shipped report's label); :func:`relabel`
applies the declared rule; :func:`relabel_report` writes the page, with the floor of the test at the study's seed
counts. The studies' own reports stay as they are. The pages under ``docs/data/`` are rebuilt byte for byte from
the records by ``tests/unit/studies/test_relabel.py``::

    python -m studies.relabel conf/protocol/real_lm.yaml docs/data/real_lm_protocol.json.gz \\
        docs/data/relabel_real_lm.md
    python -m studies.relabel conf/protocol/collapse.yaml docs/data/collapse_protocol.json.gz \\
        docs/data/relabel_collapse.md

The family is every claim the study labelled, whatever its outcome: each method's claims against the baseline and
the seed papers' own claims (``seed_claims``: a cell against a level, its per-seed values minus the level, or
against another cell, paired by seed). A claim whose method was under its dose keeps its p in the family and is
labelled *not tested at this dose*, as :func:`studies.verdicts.judge` does; a claim with fewer than 2 paired seeds
had no verdict and stays out of it.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from studies.dose import NOT_TESTED
from studies.significance import holm, p_floor, seeds_needed, sign_flip_p
from studies.verdicts import REPRODUCED, IntervalRule, label_by_test

DECLARED = IntervalRule(kind="sign_flip", alpha=0.05, correction="holm")
"""The rule ``conf/protocol/verdicts.yaml`` declares (its ``interval`` key)."""


@dataclass(frozen=True)
class PairedClaim:
    """One claim of a study with what the declared rule reads: the per-seed differences in the claimed direction's
    metric, and the label the study's own rule gave it."""

    method: str
    """The cell judged (a method, or for a seed paper's claim the cell it names)."""
    claim: str
    """The claim as the page prints it, e.g. ``ho_pass@1 > grpo`` or ``law_r2 > 0.5 (seed 001)``."""
    direction: str
    seeds: tuple[int, ...]
    diffs: tuple[float, ...]
    """Per seed: the method's metric minus the baseline's (or the other cell's, or the level)."""
    old: str
    """The study's own label (its shipped report's)."""
    dosed: bool | None = True
    """Whether the method got its dose (False: under its threshold; None: no dose logged): the declared rule keeps
    the dose rule."""


@dataclass
class Relabelled:
    """A claim under the declared rule."""

    claim: PairedClaim
    mean: float | None
    p: float | None
    """The exact one-sided sign-flip p-value (None: under 2 paired seeds, no verdict)."""
    p_adjusted: float | None
    """``p`` adjusted across the study's claims (Holm), which the label reads."""
    label: str

    @property
    def n(self) -> int:
        return len(self.claim.diffs)


def relabel(claims: list[PairedClaim], rule: IntervalRule = DECLARED) -> list[Relabelled]:
    """Every claim under ``rule`` (a test: ``kind: sign_flip``), in the given order: its exact one-sided p, adjusted
    by ``rule.correction`` across every claim with at least 2 paired seeds, and the label from the adjusted p."""
    if not rule.is_test:
        raise ValueError(f"relabel applies a test (interval kind sign_flip), not {rule.kind!r}")
    ps = {i: sign_flip_p(c.diffs, c.direction) for i, c in enumerate(claims) if len(c.diffs) >= 2}
    if rule.correction == "holm":
        adjusted = {i: p for i, (p, _) in holm(ps, rule.alpha).items()} if ps else {}
    else:
        adjusted = dict(ps)
    out = []
    for i, c in enumerate(claims):
        if i not in ps:
            out.append(Relabelled(c, None, None, None, "no verdict"))
            continue
        text, _ = label_by_test(adjusted[i], rule.alpha, c.dosed)
        out.append(Relabelled(c, statistics.mean(c.diffs), ps[i], adjusted[i], text))
    return out


def floor_table(rows: list[Relabelled], alpha: float = DECLARED.alpha) -> str:
    """Per paired-seed count: how many claims have it, the test's floor ``1/2ⁿ`` and the smallest Holm-adjusted p
    a claim at that floor can get (``m/2ⁿ``, Holm's first step), and whether that is at most ``alpha``."""
    m = sum(r.p is not None for r in rows)
    counts = Counter(r.n for r in rows if r.p is not None)
    lines = ["| paired seeds n | claims | floor of the one-sided p (1/2ⁿ) | smallest Holm-adjusted p (m/2ⁿ, capped at 1) | "
             f"can a claim survive at α = {alpha:g}? |", "|---|---|---|---|---|"]
    for n in sorted(counts):
        best = min(1.0, m * p_floor(n))
        lines.append(f"| {n} | {counts[n]} | {p_floor(n):.4f} | {best:.4f} | {'yes' if best <= alpha else 'no'} |")
    return "\n".join(lines)


def summary(rows: list[Relabelled], alpha: float = DECLARED.alpha) -> dict:
    """The page's numbers: claims in the family, the old *reproduced* and which survive, the smallest p."""
    tested = [r for r in rows if r.p is not None]
    old = [r for r in tested if r.claim.old == REPRODUCED]
    best = min(tested, key=lambda r: r.p) if tested else None
    return {"claims": len(tested), "old_reproduced": len(old),
            "survive": [r for r in tested if r.label == REPRODUCED],
            "old_survive": [r for r in old if r.label == REPRODUCED],
            "raw_under_alpha": [r for r in tested if r.p <= alpha],
            "smallest": best,
            "can_survive": bool(tested) and len(tested) * p_floor(max(r.n for r in tested)) <= alpha,
            "seeds_needed": seeds_needed(len(tested), alpha) if tested else None}


def _count(n: int, one: str, many: str) -> str:
    return f"{n} {one if n == 1 else many}"


def _p(p: float | None) -> str:
    return "—" if p is None else f"{p:.4f}"


def relabel_table(rows: list[Relabelled]) -> str:
    """The Markdown table: claim, paired seeds, mean difference, p, Holm-adjusted p, new label, old label."""
    lines = ["| method | claim | n seeds | mean Δ | p (exact, one-sided) | Holm-adjusted p | label (declared rule) | "
             "old label |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        mean = "—" if r.mean is None else f"{r.mean:+.3f}"
        lines.append(f"| {r.claim.method} | {r.claim.claim} | {r.n} | {mean} | {_p(r.p)} | {_p(r.p_adjusted)} | "
                     f"**{r.label}** | {r.claim.old} |")
    return "\n".join(lines)


def relabel_report(name: str, protocol_file: str, records_file: str, rows: list[Relabelled],
                   old_rule: IntervalRule, rule: IntervalRule = DECLARED) -> str:
    """The page: how it is made, the rule, the floor at the study's seed counts, the counts, the table.
    ``old_rule``: the study's own (its ``interval``), named in the text."""
    if old_rule.kind == "bootstrap":
        old_text = (f"a {old_rule.level * 100:g} % percentile bootstrap interval of the mean difference "
                    f"({old_rule.resamples:,} resamples)")
    else:
        old_text = "a 95 % paired t interval" if old_rule.kind == "t" else "the sign-flip test"
    s = summary(rows, rule.alpha)
    m = s["claims"]
    methods = sum(1 for r in rows if r.p is not None and "(seed " not in r.claim.claim)
    family = f"{m} claims" + (f" ({methods} of the methods against the baseline, {m - methods} of the seed papers)"
                              if methods != m else "")
    smallest = s["smallest"]
    surv = ", ".join(f"{r.claim.method} {r.claim.claim}" for r in s["survive"]) or "none"
    lines = [
        f"# The {name} study's claims relabelled under the declared rule",
        "",
        f"Written by `python -m studies.relabel {protocol_file} {records_file} <this file>` from the study's records "
        f"(picked again, nothing run); `tests/unit/studies/test_relabel.py` rebuilds it byte for byte. The study's own "
        f"report is unchanged: its label is the *old label* column.",
        "",
        f"**The declared rule** (`conf/protocol/verdicts.yaml`, `interval: {{kind: {rule.kind}, alpha: {rule.alpha:g}, "
        f"correction: {rule.correction}}}`; `studies/relabel.py`). For each claim, the per-seed differences (the "
        "method's metric minus the baseline's on the same evaluation seed"
        + ("; for a seed paper's claim, minus the other cell's or the level" if methods != m else "")
        + "); the exact one-sided sign-flip p-value in the claimed direction (the "
        "share of the 2ⁿ sign assignments whose mean reaches the observed one); "
        + ("Holm across all " if rule.correction == "holm" else "no correction across the ")
        + f"{family} at α = {rule.alpha:g}. *{REPRODUCED}*: the adjusted p is at most {rule.alpha:g} and the method "
        f"got its dose; *{NOT_TESTED}*: the dose was under its threshold, whatever the test. The old label is the "
        f"study's own rule: {old_text} excluding 0 in the claimed direction, no correction across claims.",
        "",
        "**The floor at this study's seed counts.** The test cannot give p under 1/2ⁿ on n paired seeds, and Holm's "
        f"first step asks for p ≤ α/m = {rule.alpha:g}/{m} = {rule.alpha / m:.5f}:",
        "",
        floor_table(rows, rule.alpha),
        "",
        (f"So no claim of this study can survive the rule, whatever its data: that needs "
         f"{s['seeds_needed']} paired seeds (`studies.significance.seeds_needed({m})`)."
         if not s["can_survive"] else
         f"A claim can survive at the largest seed count here; {s['seeds_needed']} paired seeds is the least that "
         f"allows it (`studies.significance.seeds_needed({m})`)."),
        "",
        f"**Counts.** {m} claims; the old rule labelled {s['old_reproduced']} *{REPRODUCED}*; under the declared rule "
        f"{len(s['old_survive'])} of them survive{'' if not s['survive'] else f' ({surv})'}, and "
        f"{len(s['survive'])} claims in all are *{REPRODUCED}*. The smallest p is "
        + (f"{smallest.p:.4f} ({smallest.claim.method} {smallest.claim.claim}, {smallest.n} seeds; Holm-adjusted "
           f"{smallest.p_adjusted:.4f})" if smallest is not None else "—")
        + f". Without the correction, {_count(len(s['raw_under_alpha']), 'claim has', 'claims have')} "
          f"p ≤ {rule.alpha:g}.",
        "",
        relabel_table(rows),
    ]
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------------------------------------ from records


def records_claims(protocol_path: str | Path, records: str | Path) -> tuple[str, IntervalRule, list[PairedClaim]]:
    """A protocol's claims rebuilt from its records file: the study's name, its own rule and, in its report's
    order, each method's claims against the baseline, then its seed papers' claims, each with its per-seed
    differences and the label the protocol's own rule gives it (its report's). Nothing runs: the records are imported into a temporary folder,
    picked again, and the runs' summaries read as the evaluate phase reads them."""
    from studies.dose import method_of
    from studies.protocol import collect, load_protocol, pick, picked_points
    from studies.protocol_phases import nearest_methods
    from studies.records import import_records
    from studies.seed_claims import judge_seed_claims
    from studies.verdicts import judge

    protocol = load_protocol(protocol_path)
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        import_records(records, out)
        picks = json.loads(json.dumps(pick(protocol, out / "tune")))  # as read back from picks.json
        if protocol.nearest and (out / "evaluate" / "nearest.json").is_file():  # the extra seeds of the nearest
            nearest_methods(protocol, picks, out / "evaluate")
        points = picked_points(picks, protocol)
        controls = protocol.control_points()
        plan = protocol.plan([*points, *controls], protocol.all_evaluation_seeds())
        runs = collect(plan, out / "evaluate", [*points, *controls])
    by_method = {p.method: runs.get(p.name, {}) for p in points}
    dose_of = {p.method: method_of(p.algo, p.controller) for p in points}
    base = by_method[protocol.baseline]
    claims = []
    verdicts = judge(by_method, protocol.baseline, {m: protocol.claims_of(m) for m in by_method}, protocol.interval,
                     dose_of=dose_of)
    for v in verdicts:
        diffs = tuple(by_method[v.method][s][v.claim.metric] - base[s][v.claim.metric] for s in v.seeds)
        sign = ">" if v.claim.direction == "higher" else "<"
        claims.append(PairedClaim(v.method, f"{v.claim.metric} {sign} {protocol.baseline}", v.claim.direction,
                                  tuple(v.seeds), diffs, v.label, _dosed(v.label, v.reason)))
    cells = {**by_method, **{c.name: runs.get(c.name, {}) for c in controls}}
    for sv in judge_seed_claims(protocol.seed_claims, cells, protocol.interval, dose_of):
        c = sv.claim
        mine, other = cells.get(c.method, {}), cells.get(c.versus, {}) if c.versus else {}
        diffs = tuple(mine[s][c.metric] - (other[s][c.metric] if c.versus else c.above) for s in sv.seeds)
        sign = ">" if c.direction == "higher" else "<"
        claims.append(PairedClaim(c.method, f"{c.metric} {sign} {c.reference} (seed {c.seed})", c.direction,
                                  tuple(sv.seeds), diffs, sv.label, _dosed(sv.label, sv.reason)))
    return protocol.name, protocol.interval, claims


def _dosed(old_label: str, reason: str) -> bool | None:
    """The dose verdict behind an old label: the old rule labels *not tested* exactly when the dose was not given."""
    if old_label != NOT_TESTED:
        return True
    return False if "under" in reason else None


def shown(path: Path) -> str:
    """A path as the page prints it: relative to the checkout's root where it lies inside it (no machine path)."""
    root = Path(__file__).resolve().parents[1]
    try:
        return path.resolve().relative_to(root).as_posix()
    except ValueError:
        return path.name


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("protocol", type=Path, help="the study's protocol, e.g. conf/protocol/real_lm.yaml")
    ap.add_argument("records", type=Path, help="its records, e.g. docs/data/real_lm_protocol.json.gz")
    ap.add_argument("page", type=Path, help="the page to write, e.g. docs/data/relabel_real_lm.md")
    args = ap.parse_args(argv)
    name, old_rule, claims = records_claims(args.protocol, args.records)
    rows = relabel(claims)
    args.page.write_text(relabel_report(name, shown(args.protocol), shown(args.records), rows, old_rule))
    s = summary(rows)
    print(f"{args.page}: {s['claims']} claims, {s['old_reproduced']} reproduced by the old rule, "
          f"{len(s['old_survive'])} of them survive the declared rule")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
