"""IterationProgress: what a person reads on the terminal."""

from __future__ import annotations

from lit_entropy.callbacks.progress import describe, summary_table


def test_describe_names_entropy_accuracy_band_knob_and_seconds():
    line = describe({"rollout/entropy": 0.49391, "rollout/accuracy": 0.25, "control/band_low": 0.4,
                     "control/band_high": 0.55, "control/target_entropy": 0.475, "control/eps_high": 0.28,
                     "rollout/reward_errors": 2.0}, 2.345)
    assert line == "H 0.4939 | acc 0.250 | band [0.400, 0.550] | eps_high 0.28 | reward errors 2 | 2.35 s/it"
    assert describe({"rollout/entropy": 0.5, "control/target_entropy": 0.45}, None) == "H 0.5000 | target 0.450"


def test_summary_table_reports_curves_and_median_time_without_the_warm_up():
    history = [{"rollout/entropy": 0.5 - 0.01 * i, "rollout/accuracy": 0.2 + 0.01 * i, "time/iteration": t,
                "time/generate": t / 2, "rollout/reward_errors": float(i == 1)}
               for i, t in enumerate([9.0, 2.0, 3.0, 4.0])]
    text = summary_table(history)
    assert "Run summary: 4 iteration(s)" in text
    assert "| rollout/entropy | 0.5000 | 0.4700 | 0.4700 | 0.5000 |" in text
    assert "median of 3, the first excluded): 3.00" in text and "generate 1.50" in text
    assert "reward errors (crashed, hung or non-finite rewards scored 0): 1" in text
