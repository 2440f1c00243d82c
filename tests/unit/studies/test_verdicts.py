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
    Verdict,
    bootstrap_interval,
    judge,
    label,
    recommended,
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


SIGN_FLIP = IntervalRule(kind="sign_flip")


def _many(n_methods: int, deltas: list[float], seeds: int = 8) -> dict:
    """GRPO and ``n_methods`` methods, each at GRPO + delta_s on seed s."""
    base = [0.4 + 0.01 * (s % 3) for s in range(seeds)]
    runs = {"grpo": {s: {"pass@64": base[s], "dose": None} for s in range(seeds)}}
    for m in range(n_methods):
        runs[f"m{m}"] = {s: {"pass@64": base[s] + deltas[s], "dose": 0.01} for s in range(seeds)}
    return runs


def test_sign_flip_three_agreeing_seeds_are_not_reproduced_the_degenerate_case() -> None:
    """Three seeds that agree (what the bootstrap called reproduced: its interval is [min, max]) give p = 1/8."""
    runs = _runs([0.05, 0.02, 0.04, 0.0, 0.0])
    for r in runs.values():
        for s in (3, 4):
            r.pop(s)
    assert _one(runs).label == REPRODUCED  # the percentile bootstrap of three values
    v = _one(runs, rule=SIGN_FLIP)
    assert (v.p, v.p_adjusted, v.label) == (0.125, 0.125, NOT_REPRODUCED) and v.reason == "adjusted p > 0.05"


def test_sign_flip_with_holm_across_the_reports_claims() -> None:
    """Eight seeds all agreeing: p = 1/256 each. Alone it survives; among 16 claims Holm needs 0.05/16 = 0.003125
    of the smallest, and 1/256 = 0.0039 misses it: the seeds and the claims are chosen together."""
    gain = [0.05, 0.02, 0.04, 0.03, 0.06, 0.01, 0.02, 0.03]
    [alone] = judge(_many(1, gain), "grpo", {"m0": [Claim("pass@64")]}, SIGN_FLIP)
    assert alone.p == 1 / 256 and alone.label == REPRODUCED
    claims = {f"m{m}": [Claim("pass@64")] for m in range(16)}
    crowd = judge(_many(16, gain), "grpo", claims, SIGN_FLIP)
    assert all(v.p == 1 / 256 and v.p_adjusted == pytest.approx(16 / 256) and v.label == NOT_REPRODUCED
               for v in crowd)
    assert all(v.label == REPRODUCED for v in judge(_many(16, [*gain, 0.02], seeds=9), "grpo", claims, SIGN_FLIP))
    uncorrected = judge(_many(16, gain), "grpo", claims, IntervalRule(kind="sign_flip", correction="none"))
    assert all(v.label == REPRODUCED for v in uncorrected)


def test_sign_flip_labels_a_claim_that_falls_and_keeps_the_dose_rule() -> None:
    v = _one(_runs([-0.10, -0.12, -0.08, -0.11, -0.09]), direction="lower", rule=SIGN_FLIP)
    assert v.p == 1 / 32 and v.label == REPRODUCED and v.interval[1] < 0  # the t interval, printed for scale
    assert _one(_runs([0.10] * 5, dose=0.0), rule=SIGN_FLIP).label == NOT_TESTED


def test_sign_flip_report_prints_its_rule_and_the_p_columns() -> None:
    verdicts = judge(_many(2, [0.05] * 8), "grpo", {"m0": [Claim("pass@64")], "m1": [Claim("pass@64")]}, SIGN_FLIP)
    first, table = verdict_report(verdicts, "grpo", SIGN_FLIP).split("\n\n")
    assert "sign-flip" in first and "Holm" in first and "does not decide" in first
    header, _, row = table.splitlines()[:3]
    assert "| p (one-sided) | adjusted p |" in header
    assert "| 0.0039 | 0.0078 | **reproduced** |" in row
    with pytest.raises(ValueError, match="correction"):
        IntervalRule(kind="sign_flip", correction="bonferroni")


def _verdict(method: str, metric: str, label_: str, mean: float) -> Verdict:
    return Verdict(method, Claim(metric), list(range(10)), mean, (mean - 0.01, mean + 0.01), 0.01, label_, "")


def test_the_recommendation_is_a_method_reproduced_on_every_named_claim_else_the_baseline() -> None:
    both = ["ho_pass@1", "ho_pass@64"]
    one = [_verdict("a", "ho_pass@1", REPRODUCED, 0.05), _verdict("a", "ho_pass@64", NOT_REPRODUCED, 0.02),
           _verdict("b", "ho_pass@1", NOT_TESTED, 0.09), _verdict("b", "ho_pass@64", REPRODUCED, 0.04)]
    assert recommended(one, "grpo", both) == "grpo"  # each wins one claim: neither both
    assert recommended(one, "grpo", ["ho_pass@1"]) == "a"
    two = [_verdict("c", "ho_pass@1", REPRODUCED, 0.03), _verdict("c", "ho_pass@64", REPRODUCED, 0.02),
           _verdict("d", "ho_pass@1", REPRODUCED, 0.06), _verdict("d", "ho_pass@64", REPRODUCED, 0.01)]
    assert recommended(one + two, "grpo", both) == "d"  # both win: the larger pass@1 difference
    retains = [_verdict("c", "re_pass@1", REPRODUCED, 0.02), _verdict("d", "re_pass@1", NOT_REPRODUCED, 0.0)]
    assert recommended(one + two + retains, "grpo", both) == "c"  # more of its claims reproduced comes first
    assert recommended([], "grpo", both) == "grpo"
