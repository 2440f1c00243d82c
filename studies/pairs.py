"""What makes two runs a pair, and the problem-level scores a pair is bootstrapped over.

A method's seed k is compared with the baseline's seed k. The seed fixes the training problems, the sampler's seeds
and the start; the machine and the commit fix the kernels and the code. A protocol with
``interval.pairing: seed_machine_commit`` counts a pair only where both runs ran every attempt (a resumed run has
several, each recorded in its ``done.json``) on one machine at one commit, the same for both
(:func:`run_pairing`). Runs recorded before attempts were kept have no pairing and never pair under that rule.

The problem-level interval beside each test (:func:`studies.significance.two_level_bootstrap`) reads each run's last
evaluation's per-problem counts (``callbacks.eval.per_problem``; :func:`studies.records.last_problem_counts`):
:func:`problem_scores` turns them into one score per problem for a claim's metric, e.g. the unbiased pass@k of
each held-out problem for ``ho_pass@64``.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

PAIRINGS = ("seed", "seed_machine_commit")
"""``seed``: seed k against seed k (the earlier studies); ``seed_machine_commit``: and the same machine and commit."""

SPLIT_PREFIXES = {"ho": "held_out", "tr": "transfer", "tu": "tuning", "re": "retention"}
"""A split metric's prefix in a run summary (``ho_pass@64``) and the split it reads."""


def run_pairing(folder: str | Path) -> str | None:
    """``"<machine> @ <commit>"`` when every attempt of the run in ``folder`` ran on that machine at that commit;
    None when its attempts differ (or name no commit) or none was recorded."""
    done = Path(folder) / "done.json"
    attempts = json.loads(done.read_text()).get("attempts") if done.is_file() else None
    return pairing_of(attempts or [])


def pairing_of(attempts: list[dict[str, Any]]) -> str | None:
    """The one (machine, commit) of ``attempts``, as text, or None (no attempt, several, or a commit unknown)."""
    seen = {(a.get("machine"), a.get("commit")) for a in attempts}
    if len(seen) != 1:
        return None
    machine, commit = seen.pop()
    return None if not machine or not commit else f"{machine} @ {commit}"


def pass_at_k(n: int, c: int, k: int) -> float:
    """The unbiased pass@k of one problem with ``c`` correct of ``n`` samples (Chen et al. 2021):
    ``1 − C(n−c, k)/C(n, k)``."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass@{k} of {c} correct in {n} samples")
    return 1.0 if n - c < k else 1.0 - math.comb(n - c, k) / math.comb(n, k)


def problem_scores(counts: dict[str, Any] | None, metric: str) -> tuple[str, list[float]] | None:
    """``(problems_sha, one score per problem)`` for the summary metric ``metric`` (``ho_pass@64``: each held-out
    problem's unbiased pass@64; ``re_greedy``: each retention problem's greedy pass@1) from a run's last per-problem
    counts, or None where the run has none for it (or the metric is not a split's pass@k)."""
    prefix, _, name = metric.partition("_")
    split = SPLIT_PREFIXES.get(prefix)
    if counts is None or split is None:
        return None
    if name == "greedy":
        mode, k = "greedy", 1
    elif name.startswith("pass@") and name[5:].isdigit():
        mode, k = "sampled", int(name[5:])
    else:
        return None
    entry = (counts.get("splits") or {}).get(split, {}).get(mode)
    if not entry or any(n < k for n in entry["num_samples"]):
        return None
    scores = [pass_at_k(n, c, k) for n, c in zip(entry["num_samples"], entry["num_correct"], strict=True)]
    return entry.get("problems_sha", ""), scores
