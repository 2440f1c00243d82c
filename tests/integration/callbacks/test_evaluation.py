"""The optional in-training validation loop logs eval/* from a real run (in-process, tests/harness.py)."""

from __future__ import annotations

import math

import pytest

pytestmark = pytest.mark.integration


def test_periodic_eval_logs_pass_at_k(tmp_path, harness):
    scalars = harness.fit(["rollout=hf", "callbacks/eval=periodic", "callbacks.eval.every_n_iterations=2",
                           "callbacks.eval.num_problems=4", "callbacks.eval.n=4", "callbacks.eval.ks=[1,4]"],
                          tmp_path).scalars
    for tag in ("eval/accuracy", "eval/mean@1", "eval/pass@1", "eval/pass@4"):
        assert tag in scalars, sorted(scalars)
        values = [v for _, v in scalars[tag]]
        assert len(values) == 2  # after iteration 2 and after the last (3rd) one
        assert all(math.isfinite(v) and 0 <= v <= 1 for v in values)
    p1 = [v for _, v in scalars["eval/pass@1"]]
    p4 = [v for _, v in scalars["eval/pass@4"]]
    assert all(a <= b + 1e-9 for a, b in zip(p1, p4, strict=True))


def test_the_evaluation_is_timed_apart_from_the_update(tmp_path, harness, monkeypatch):
    """An evaluation made 1.5 s slower shows in time/evaluate and not in that iteration's time/update."""
    import time

    import lit_entropy.callbacks.evaluation as periodic

    plain = periodic.evaluate  # what the callback calls for the lab's prompts (no evaluation splits)

    def slow(*args, **kwargs):
        time.sleep(1.5)
        return plain(*args, **kwargs)

    monkeypatch.setattr(periodic, "evaluate", slow)
    scalars = harness.fit(["rollout=hf", "callbacks/eval=periodic", "callbacks.eval.every_n_iterations=2",
                           "callbacks.eval.num_problems=4", "callbacks.eval.n=4", "callbacks.eval.ks=[1,4]"],
                          tmp_path).scalars
    evaluated = dict(scalars["time/evaluate"])
    assert sorted(evaluated) == [2, 3] and all(v >= 1.5 for v in evaluated.values())
    update = dict(scalars["time/update"])
    assert all(update[step] < 1.5 for step in evaluated), (update, evaluated)


def test_periodic_eval_at_start_logs_the_starting_policy_at_step_0(tmp_path, harness):
    scalars = harness.fit(["rollout=hf", "callbacks/eval=periodic", "callbacks.eval.every_n_iterations=3",
                           "callbacks.eval.num_problems=4", "callbacks.eval.n=4", "callbacks.eval.ks=[1,4]",
                           "callbacks.eval.at_start=true"], tmp_path).scalars
    steps = [s for s, _ in scalars["eval/pass@4"]]
    assert len(steps) == 2 and steps[0] == 0 < steps[1]  # before the first update, then after the last
    assert min(s for s, _ in scalars["rollout/entropy"]) > 0  # every iteration's metrics come after it
    assert all(0 <= v <= 1 for _, v in scalars["eval/pass@1"])


def test_the_last_evaluation_draws_final_n_samples_and_reports_final_ks(tmp_path, harness):
    """pass@8 exists only after the last iteration (8 samples there), pass@4 along the way and at the end."""
    scalars = harness.fit(["rollout=hf", "callbacks/eval=periodic", "callbacks.eval.every_n_iterations=2",
                           "callbacks.eval.num_problems=4", "callbacks.eval.n=4", "callbacks.eval.ks=[1,4]",
                           "callbacks.eval.final_n=8", "callbacks.eval.final_ks=[1,4,8]"], tmp_path).scalars
    last = max(s for s, _ in scalars["rollout/entropy"])
    assert [s for s, _ in scalars["eval/pass@8"]] == [last]
    assert len(scalars["eval/pass@4"]) == 2 and scalars["eval/pass@4"][-1][1] <= scalars["eval/pass@8"][0][1] + 1e-9


def test_final_ks_beyond_final_n_fail_at_start_up():
    from lit_entropy.callbacks.evaluation import PeriodicEvalCallback

    with pytest.raises(ValueError, match=r"callbacks.eval.final_ks=\[1, 16\]: every k must be in \[1, 8\]"):
        PeriodicEvalCallback(n=4, ks=(1, 4), final_n=8, final_ks=(1, 16))


def test_per_problem_counts_are_written_for_every_evaluation(tmp_path, harness):
    import json

    run = harness.fit(["rollout=hf", "callbacks/eval=periodic", "callbacks.eval.every_n_iterations=2",
                       "callbacks.eval.num_problems=4", "callbacks.eval.n=4", "callbacks.eval.ks=[1,4]",
                       "callbacks.eval.per_problem=true"], tmp_path)
    files = sorted((run.run_dir / "eval_problems").glob("*.json"))
    assert [f.name for f in files] == ["iteration-0002.json", "iteration-0003.json"]
    last = json.loads(files[-1].read_text())["splits"]["all"]["sampled"]
    assert last["num_samples"] == [4] * 4 and len(last["problem"]) == 4
    assert sum(last["num_correct"]) / 16 == pytest.approx(run.values("eval/accuracy")[-1])


def test_named_splits_fail_at_start_up_where_they_cannot_run():
    from lit_entropy.callbacks.evaluation import PeriodicEvalCallback

    with pytest.raises(ValueError, match="counts must be >= 0, one at least > 0"):
        PeriodicEvalCallback(num_problems={"held_out": 0})
