"""The seed papers' own claims (studies/seed_claims.py): a level, or one cell against another."""

from __future__ import annotations

import pytest

from studies.seed_claims import SeedClaim, judge_seed_claims, law_table, seed_claims_table
from studies.verdicts import IntervalRule

T = IntervalRule(kind="t")


def test_a_level_claim_judges_the_values_minus_the_level():
    claim = SeedClaim("003", "correlates", "grpo", "dh_corr", above=0.0)
    runs = {"grpo": {0: {"dh_corr": 0.5}, 1: {"dh_corr": 0.6}, 2: {"dh_corr": 0.4}}}
    (v,) = judge_seed_claims([claim], runs, T)
    assert v.mean == pytest.approx(0.5) and v.label == "reproduced" and v.seeds == [0, 1, 2]
    half = 4.303 * 0.1 / 3 ** 0.5  # t(2) · sd / √n
    assert v.interval == pytest.approx((0.5 - half, 0.5 + half))
    (low,) = judge_seed_claims([SeedClaim("001", "fits", "grpo", "dh_corr", above=0.55)], runs, T)
    assert low.label == "not reproduced" and low.reason == "interval includes 0"


def test_a_comparison_is_paired_by_the_seeds_both_cells_finished():
    claim = SeedClaim("000", "eps_high over a bonus", "dapo", "h_final", versus="entropy_bonus")
    runs = {"dapo": {0: {"h_final": 1.0}, 1: {"h_final": 1.2}, 2: {"h_final": 0.9}, 3: {"h_final": 2.0}},
            "entropy_bonus": {0: {"h_final": 0.5}, 1: {"h_final": 0.6}, 2: {"h_final": 0.5}, 7: {"h_final": 0.0}}}
    (v,) = judge_seed_claims([claim], runs, T)
    assert v.seeds == [0, 1, 2] and v.mean == pytest.approx(0.5) and v.label == "reproduced"
    lower = SeedClaim("000", "eps_high under a bonus", "dapo", "h_final", direction="lower", versus="entropy_bonus")
    assert judge_seed_claims([lower], runs, T)[0].reason == "interval excludes 0 against the claim"


def test_a_cell_without_its_dose_is_not_tested_and_one_seed_gets_no_verdict():
    claim = SeedClaim("000", "eps_high over a bonus", "dapo", "h_final", versus="entropy_bonus")
    runs = {"dapo": {s: {"h_final": 1.0 + s / 10, "dose": 0.0} for s in range(3)},
            "entropy_bonus": {s: {"h_final": 0.5} for s in range(3)}}
    (v,) = judge_seed_claims([claim], runs, T, dose_of={"dapo": "dapo"})
    assert v.label == "not tested at this dose"
    (one,) = judge_seed_claims([claim], {"dapo": {0: {"h_final": 1.0}}, "entropy_bonus": {0: {"h_final": 0.5}}}, T)
    assert one.label == "no verdict" and one.mean is None
    table = seed_claims_table([v, one])
    assert "| 000 | eps_high over a bonus | dapo | h_final > | entropy_bonus | 3 |" in table
    assert "| **no verdict** | 1 seed(s); the interval needs 2 |" in table


@pytest.mark.parametrize("kwargs,match", [
    ({}, "exactly one of `above`"),
    ({"above": 0.0, "versus": "grpo"}, "exactly one of `above`"),
    ({"above": 0.0, "direction": "up"}, "direction='up'"),
])
def test_a_malformed_claim_names_itself(kwargs, match):
    with pytest.raises(ValueError, match=match):
        SeedClaim("003", "correlates", "grpo", "dh_corr", **kwargs)


def test_the_law_table_sets_each_runs_predicted_ceiling_beside_its_measured_end():
    claims = [SeedClaim("001", "law fits", "grpo", "law_r2", above=0.5),
              SeedClaim("003", "correlates", "grpo", "dh_corr", above=0.0)]
    runs = {"grpo": {1: {"law_r2": 0.8, "law_ceiling": 0.7, "acc_last20": 0.5, "h_final": 0.1},
                     0: {"law_r2": 0.6, "law_ceiling": None, "acc_last20": 0.4, "h_final": 0.2}}}
    rows = law_table(claims, runs).splitlines()
    assert rows[2:] == ["| grpo | 0 | 0.600 | — | 0.400 | — | 0.200 |", "| grpo | 1 | 0.800 | 0.700 | 0.500 | +0.200 | 0.100 |"]
    assert law_table(claims[1:], runs) == ""  # no claim reads the law
