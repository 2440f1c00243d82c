"""The labelling rule (studies/verdicts.py) on synthetic numbers a reader can check by hand."""

from __future__ import annotations

import math

import pytest

from studies.dose import NOT_TESTED
from studies.verdicts import (
    NOT_REPRODUCED,
    REPRODUCED,
    Claim,
    IntervalRule,
    bootstrap_interval,
    judge,
    label,
    t_interval,
    t_quantile,
    verdict_report,
)

GRPO = [0.40, 0.42, 0.38, 0.41, 0.39]
SEEDS = range(5)


def _runs(deltas: list[float], dose: float | None = 0.01, method: str = "clip_cov") -> dict:
    """GRPO's pass@64 per seed, and a method at GRPO + delta on each seed, with its dose."""
    return {"grpo": {s: {"pass@64": GRPO[s], "dose": None} for s in SEEDS},
            method: {s: {"pass@64": GRPO[s] + deltas[s], "dose": dose} for s in SEEDS}}


def _one(runs: dict, method: str = "clip_cov", direction: str = "higher", rule: IntervalRule | None = None):
    [v] = judge(runs, "grpo", {method: [Claim("pass@64", direction)]}, rule)
    return v


def test_t_interval_by_hand() -> None:
    # diffs 1..5: mean 3, sd sqrt(2.5), se sqrt(2.5)/sqrt(5) = 0.70711; t(4) = 2.776 -> 3 ± 1.96293
    lo, hi = t_interval([1.0, 2.0, 3.0, 4.0, 5.0])
    assert (lo, hi) == pytest.approx((3 - 2.776 * math.sqrt(0.5), 3 + 2.776 * math.sqrt(0.5)))
    assert t_quantile(4) == 2.776 and t_quantile(22) == 2.086 and t_quantile(500) == 1.96  # 22: the df 20 entry


def test_bootstrap_interval_by_hand_and_seeded() -> None:
    assert bootstrap_interval([0.1] * 5) == pytest.approx((0.1, 0.1))  # every resample has mean 0.1
    # two seeds, -1 and 1: a resample's mean is -1, 0 or 1 (1/4, 1/2, 1/4): the 2.5 % and 97.5 % points are -1, 1
    assert bootstrap_interval([-1.0, 1.0]) == pytest.approx((-1.0, 1.0))
    d = [0.3, -0.1, 0.2, 0.05, 0.1]
    assert bootstrap_interval(d, seed=3) == bootstrap_interval(d, seed=3)
    lo, hi = bootstrap_interval(d)
    assert min(d) <= lo < sum(d) / 5 < hi <= max(d)
    with pytest.raises(ValueError, match="at least 2 seeds"):
        bootstrap_interval([0.1])


def test_clear_gain_is_reproduced() -> None:
    v = _one(_runs([0.10] * 5))
    assert v.label == REPRODUCED and v.mean == pytest.approx(0.10) and v.interval == pytest.approx((0.10, 0.10))
    assert v.seeds == [0, 1, 2, 3, 4] and v.dose == pytest.approx(0.01)


def test_clear_loss_is_not_reproduced_against_the_claim() -> None:
    v = _one(_runs([-0.10, -0.12, -0.08, -0.11, -0.09]))
    assert (v.label, v.reason) == (NOT_REPRODUCED, "interval excludes 0 against the claim")
    assert _one(_runs([-0.10] * 5), direction="lower").label == REPRODUCED  # a claim that it falls


def test_noise_is_not_reproduced_with_an_interval_through_zero() -> None:
    for rule in (IntervalRule(), IntervalRule(kind="t")):
        v = _one(_runs([0.10, -0.10, 0.05, -0.05, 0.0]), rule=rule)
        assert (v.label, v.reason) == (NOT_REPRODUCED, "interval includes 0")
        assert v.interval[0] < 0 < v.interval[1]


def test_zero_dose_is_not_tested_whatever_the_interval() -> None:
    assert _one(_runs([0.10] * 5, dose=0.0)).label == NOT_TESTED
    assert _one(_runs([-0.10] * 5, dose=2e-4)).label == NOT_TESTED  # under the 1e-3 threshold
    assert _one(_runs([0.10] * 5, dose=None)).reason == "no dose logged"


def test_label_alone() -> None:
    assert label(0.01, 0.2, "higher", True)[0] == REPRODUCED
    assert label(-0.2, -0.01, "higher", True)[0] == NOT_REPRODUCED
    assert label(-0.2, -0.01, "lower", True)[0] == REPRODUCED
    assert label(0.01, 0.2, "higher", False)[0] == NOT_TESTED


def test_too_few_paired_seeds_get_no_verdict_and_the_report_prints_the_rule() -> None:
    runs = _runs([0.1] * 5)
    runs["clip_cov"] = {0: runs["clip_cov"][0], 9: {"pass@64": 0.9, "dose": 0.01}}  # seed 9: GRPO never ran it
    v = _one(runs)
    assert v.label == "no verdict" and v.seeds == [0]
    text = verdict_report(judge(_runs([0.1] * 5), "grpo", {"clip_cov": [Claim("pass@64")], "grpo": [Claim("pass@64")]},
                                settings={"clip_cov": "rho=0.01"}), "grpo")
    first, table = text.split("\n\n")
    assert "10,000 resamples" in first and NOT_TESTED in first and "`grpo`" in first
    assert table.splitlines()[2].startswith("| clip_cov | rho=0.01 | 0.0100 | pass@64 > baseline | 5 | +0.100 |")
    assert len(table.splitlines()) == 3  # the baseline is not judged against itself
    with pytest.raises(ValueError, match="direction"):
        Claim("pass@64", "up")
