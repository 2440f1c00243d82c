"""Which of the lab's verdicts hold on the real model: two protocols' verdicts on the same claims, side by side.

The lab (``conf/protocol/collapse.yaml``) and the real-LM study (``conf/protocol/real_lm.yaml``) judge the same
methods on claims of the same meaning under different names (the lab's ``pass@1`` is the real model's held-out
``ho_pass@1``). For each method and claim both judged, :func:`compare_verdicts` says what became of the lab's
verdict:

* *transfers*: the same label on both (reproduced on both, or not reproduced on both);
* *reverses*: one reproduced and the other's interval excludes 0 against the claim;
* *real LM cannot separate*: reproduced in the lab, and the real model's interval includes 0 (it may need more
  seeds or problems, or the effect may be smaller there);
* *separates on the real LM only*: reproduced on the real model where the lab's interval included 0;
* *not comparable*: either side was not tested at its dose or had too few seeds.
"""

from __future__ import annotations

from studies.dose import NOT_TESTED
from studies.verdicts import NOT_REPRODUCED, REPRODUCED, Verdict

METRIC_MAP = {"pass@1": "ho_pass@1", "pass@64": "ho_pass@64", "h_final": "h_final"}
"""The lab's claim metrics and the real-LM study's metric of the same meaning (held-out, disjoint split)."""
METHOD_MAP = {"stare_iteration": "stare", "stare": None}
"""Lab methods that ran another rule than the real-LM study's method of the same name -> the real-LM method they match
(None: none). The real-LM study's STARE ran ``rank: iteration``, the lab's ``stare_iteration`` row; the lab's ``stare``
ranks per micro-batch on the current policy since 2026-12-05 (docs/controllers/stare.md)."""


def outcome(lab: Verdict, real: Verdict) -> str:
    """What became of the lab's verdict on the real model (see the module docstring)."""
    if NOT_TESTED in (lab.label, real.label) or lab.interval is None or real.interval is None:
        return "not comparable"
    if lab.label == real.label:
        return "transfers"
    against = real if lab.label == REPRODUCED else lab  # the side that did not reproduce
    lo, hi = against.interval if against.claim.direction == "higher" else (-against.interval[1], -against.interval[0])
    if hi < 0 and against.label == NOT_REPRODUCED:
        return "reverses"
    return "real LM cannot separate" if against is real else "separates on the real LM only"


def compare_verdicts(lab: list[Verdict], real: list[Verdict], metric_map: dict[str, str] = METRIC_MAP,
                     method_map: dict[str, str | None] = METHOD_MAP) -> str:
    """The Markdown table: one row per method and claim that both studies judged under the same rule, in the lab's
    order (a lab method is matched by name, or through ``method_map``; the row names the real-LM method)."""
    by_key = {(v.method, v.claim.metric): v for v in real}
    lines = ["| method | claim | lab: Δ vs GRPO, label | real LM: Δ vs GRPO, label | outcome |", "|---|---|---|---|---|"]

    def cell(v: Verdict) -> str:
        return (f"{v.mean:+.3f}, " if v.mean is not None else "") + v.label

    for v in lab:
        method = method_map.get(v.method, v.method)
        other = by_key.get((method, metric_map.get(v.claim.metric, v.claim.metric)))
        if other is None:
            continue
        sign = ">" if v.claim.direction == "higher" else "<"
        name = method if method == v.method else f"{method} (lab: {v.method})"
        lines.append(f"| {name} | {v.claim.metric} {sign} GRPO | {cell(v)} | {cell(other)} | "
                     f"**{outcome(v, other)}** |")
    return "\n".join(lines)
