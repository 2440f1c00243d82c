"""Pairs by machine and commit, and the problem-level interval beside the test (studies/pairs.py, verdicts.judge)."""

from __future__ import annotations

import json
import math

import pytest

from studies.pairs import pairing_of, pass_at_k, problem_scores, run_pairing
from studies.significance import two_level_bootstrap
from studies.verdicts import NOT_REPRODUCED, REPRODUCED, Claim, IntervalRule, judge, verdict_table

STRICT = IntervalRule(kind="sign_flip", correction="none", pairing="seed_machine_commit")
A, B = "AMD EPYC | avx2 | 2 cores", "Intel Xeon | amx_tile | 2 cores"


def test_one_machine_and_one_commit_make_a_pairing(tmp_path) -> None:
    assert pairing_of([{"machine": A, "commit": "c1"}, {"machine": A, "commit": "c1"}]) == f"{A} @ c1"  # resumed
    assert pairing_of([{"machine": A, "commit": "c1"}, {"machine": B, "commit": "c1"}]) is None  # moved machines
    assert pairing_of([{"machine": A, "commit": "c1"}, {"machine": A, "commit": "c2"}]) is None  # moved commits
    assert pairing_of([{"machine": A, "commit": None}]) is None and pairing_of([]) is None
    assert run_pairing(tmp_path) is None  # no done.json: a run of the records before attempts were kept
    (tmp_path / "done.json").write_text(json.dumps({"returncode": 0, "attempts": [{"machine": A, "commit": "c1"}]}))
    assert run_pairing(tmp_path) == f"{A} @ c1"


def test_unbiased_pass_at_k_of_one_problem() -> None:
    assert pass_at_k(4, 0, 1) == 0.0 and pass_at_k(4, 4, 4) == 1.0 and pass_at_k(4, 1, 1) == 0.25
    assert pass_at_k(4, 1, 2) == pytest.approx(1 - math.comb(3, 2) / math.comb(4, 2))  # 0.5
    assert pass_at_k(64, 1, 64) == 1.0
    with pytest.raises(ValueError):
        pass_at_k(4, 5, 1)


def _counts(correct: list[int], n: int = 4, greedy: list[int] | None = None, sha: str = "abc") -> dict:
    splits = {"held_out": {"sampled": {"problems_sha": sha, "num_samples": [n] * len(correct), "num_correct": correct}}}
    if greedy is not None:
        splits["held_out"]["greedy"] = {"problems_sha": sha, "num_samples": [1] * len(greedy), "num_correct": greedy}
    return {"iteration": 60, "splits": splits}


def test_problem_scores_read_the_claims_split_mode_and_k() -> None:
    counts = _counts([0, 1, 4], greedy=[0, 1, 1])
    assert problem_scores(counts, "ho_pass@1") == ("abc", [0.0, 0.25, 1.0])
    assert problem_scores(counts, "ho_pass@4") == ("abc", [0.0, 1.0, 1.0])
    assert problem_scores(counts, "ho_greedy") == ("abc", [0.0, 1.0, 1.0])
    assert problem_scores(counts, "ho_pass@8") is None  # 4 samples cannot give pass@8
    assert problem_scores(counts, "re_pass@1") is None and problem_scores(counts, "h_final") is None
    assert problem_scores(None, "ho_pass@1") is None


def _runs(method_pairing: dict[int, str | None], seeds: int = 6) -> dict:
    base = {s: {"ho_pass@1": 0.30 + 0.01 * s, "pairing": f"{A} @ c1", "dose": None} for s in range(seeds)}
    mine = {s: {"ho_pass@1": 0.35 + 0.01 * s, "pairing": method_pairing.get(s, f"{A} @ c1"), "dose": None}
            for s in range(seeds)}
    return {"grpo": base, "maxrl": mine}


def test_strict_pairing_leaves_out_the_seeds_run_elsewhere_and_says_so() -> None:
    runs = _runs({1: f"{B} @ c1", 4: None})
    [v] = judge(runs, "grpo", {"maxrl": [Claim("ho_pass@1")]}, STRICT)
    assert v.seeds == [0, 2, 3, 5] and v.unpaired == [1, 4]
    assert v.p == 1 / 16 and v.label == NOT_REPRODUCED  # 4 pairs: the floor is 1/16
    assert "seed(s) 1, 4 left out: not run on one machine at one commit" in v.reason
    [loose] = judge(runs, "grpo", {"maxrl": [Claim("ho_pass@1")]}, IntervalRule(kind="sign_flip", correction="none"))
    assert loose.seeds == list(range(6)) and loose.unpaired == [] and loose.p == 1 / 64 and loose.label == REPRODUCED
    with pytest.raises(ValueError, match="pairing"):
        IntervalRule(pairing="machine")


def test_the_problem_interval_is_the_two_level_bootstrap_of_the_recorded_counts() -> None:
    runs = _runs({}, seeds=3)
    method_correct = [[1, 2, 4, 0], [2, 2, 3, 1], [1, 3, 4, 0]]
    base_correct = [[0, 2, 3, 0], [1, 2, 3, 0], [1, 1, 4, 0]]
    for s in range(3):
        runs["maxrl"][s]["problem_counts"] = _counts(method_correct[s])
        runs["grpo"][s]["problem_counts"] = _counts(base_correct[s])
    [v] = judge(runs, "grpo", {"maxrl": [Claim("ho_pass@1")]}, STRICT)
    expected = two_level_bootstrap([[c / 4 for c in row] for row in method_correct],
                                   [[c / 4 for c in row] for row in base_correct])
    assert v.problem_interval == pytest.approx(expected)
    header, _, row = verdict_table([v]).splitlines()
    assert "| seeds × problems 95 % |" in header and f"[{expected[0]:+.3f}, {expected[1]:+.3f}]" in row
    runs["grpo"][2]["problem_counts"] = _counts(base_correct[2], sha="other")  # other problems: no interval
    [v] = judge(runs, "grpo", {"maxrl": [Claim("ho_pass@1")]}, STRICT)
    assert v.problem_interval is None and "seeds × problems" not in verdict_table([v])


def test_a_seed_run_again_on_the_baselines_machine_pairs_through_its_alternates() -> None:
    """A method's seed 1 ran on B; the baseline's seed 1 ran on A and again on B (``seed1@…``): the B pair counts,
    its values (not the A run's) make the difference."""
    runs = _runs({1: f"{B} @ c1"}, seeds=4)
    runs["grpo"][1]["alternates"] = [{"ho_pass@1": 0.10, "pairing": f"{B} @ c1", "dose": None, "folder": "seed1@x"}]
    [v] = judge(runs, "grpo", {"maxrl": [Claim("ho_pass@1")]}, STRICT)
    assert v.seeds == [0, 1, 2, 3] and v.unpaired == []
    assert v.mean == pytest.approx((0.05 * 3 + (0.36 - 0.10)) / 4)
    runs["grpo"][1]["alternates"][0]["pairing"] = f"{B} @ c2"  # another commit: still no pair
    [v] = judge(runs, "grpo", {"maxrl": [Claim("ho_pass@1")]}, STRICT)
    assert v.seeds == [0, 2, 3] and v.unpaired == [1]
