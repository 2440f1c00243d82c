"""The lab's verdicts against the real model's (lit_entropy/analysis/lab_to_real.py)."""

from __future__ import annotations

from lit_entropy.analysis.lab_to_real import compare_verdicts, outcome
from lit_entropy.analysis.verdicts import Claim, Verdict


def v(method: str, metric: str, interval: tuple[float, float] | None, label: str, direction: str = "higher") -> Verdict:
    mean = None if interval is None else sum(interval) / 2
    return Verdict(method, Claim(metric, direction), [0, 1, 2], mean, interval, 0.1, label, "")


def test_each_outcome():
    rep = v("repo_r", "h_final", (0.2, 0.4), "reproduced")
    assert outcome(rep, v("repo_r", "h_final", (0.1, 0.3), "reproduced")) == "transfers"
    assert outcome(rep, v("repo_r", "h_final", (-0.3, -0.1), "not reproduced")) == "reverses"
    assert outcome(rep, v("repo_r", "h_final", (-0.1, 0.3), "not reproduced")) == "cannot separate"
    assert outcome(rep, v("repo_r", "h_final", (0.1, 0.3), "not tested at this dose")) == "not comparable"
    assert outcome(rep, v("repo_r", "h_final", None, "no verdict")) == "not comparable"
    neg = v("dapo", "h_final", (-0.2, -0.1), "not reproduced")
    assert outcome(neg, v("dapo", "h_final", (-0.5, 0.1), "not reproduced")) == "transfers"
    assert outcome(neg, v("dapo", "h_final", (0.1, 0.2), "reproduced")) == "reverses"
    lower = v("x", "h_final", (0.1, 0.2), "not reproduced", direction="lower")  # a claim of lower, against it
    assert outcome(lower, v("x", "h_final", (-0.2, -0.1), "reproduced", direction="lower")) == "reverses"


def test_the_table_pairs_the_labs_metrics_with_the_held_out_ones():
    lab = [v("repo_r", "pass@64", (0.1, 0.3), "reproduced"), v("repo_r", "pass@1", (-0.2, -0.1), "not reproduced"),
           v("sapo", "pass@1", (0.0, 0.1), "not reproduced")]  # sapo: not in the real study
    real = [v("repo_r", "ho_pass@64", (-0.05, 0.02), "not reproduced"), v("repo_r", "ho_pass@1", (-0.3, -0.1),
                                                                           "not reproduced")]
    table = compare_verdicts(lab, real).splitlines()
    assert table[2] == ("| repo_r | pass@64 > GRPO | +0.200, reproduced | -0.015, not reproduced | "
                        "**cannot separate** |")
    assert table[3].endswith("| **transfers** |") and len(table) == 4
