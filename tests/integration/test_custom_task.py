"""docs/custom_task.md's worked example, run as written: a JSONL file of problems, a reward function and a
data preset of one's own (examples/custom_task/), trained with the command line's overrides (in-process,
tests/harness.py: the same composition and Trainer as scripts/train.py) on the lab's policy."""

from __future__ import annotations

import json
import math
import os
import sys
from pathlib import Path

import pytest

from tests.helpers import ROOT

EXAMPLE = ROOT / "examples" / "custom_task"
pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def reach_target():
    sys.path.insert(0, str(EXAMPLE))
    try:
        import reach_target

        yield reach_target
    finally:
        sys.path.remove(str(EXAMPLE))


def write_problems(path: Path, n: int = 64) -> Path:
    """The file a user brings: one JSON object per line (here solvable problems from the lab's generator)."""
    from lit_entropy.tasks.countdown import CountdownConfig, generate_problems

    with path.open("w") as fh:
        for p in generate_problems(n, seed=7, config=CountdownConfig()):
            fh.write(json.dumps({"problem": ",".join(map(str, p.numbers)) + f"={p.target}", "target": p.target}) + "\n")
    return path


@pytest.mark.parametrize(("completion", "reward"), [
    ("3*5+2", 1.0),  # every number
    ("(2+5)*2", 0.0),  # 2 is given once
    ("3*5", 0.0),  # a miss: 15, binary by default
    ("8*2", 0.0),  # 8 is not given
    ("3*5+", 0.0),  # malformed
    ("__import__('os')", 0.0),  # text is parsed, never run
])
def test_reach_target_reward_by_hand(reach_target, completion, reward):
    assert reach_target.reach_target_reward("3,5,2=17:", completion, "17") == reward


def test_reach_target_reward_partial_credit_and_subsets(reach_target):
    assert reach_target.reach_target_reward("3,5,2=16:", "3*5", "16", near_credit=0.5) == pytest.approx(0.5 * 15 / 16)
    assert reach_target.reach_target_reward("3,5,8=16:", "8+8", "16") == 0.0
    assert reach_target.reach_target_reward("3,5,8=15:", "3*5", "15") == 1.0  # a subset of the numbers is fine
    assert reach_target.reach_target_reward("5,5,2=17:", "2/(5-5)", "17") == 0.0  # divides by zero
    assert reach_target.reach_target_reward.trusted_reward is True


def test_prompt_source_reads_the_file_and_fails_naming_a_bad_line(reach_target, tmp_path):
    src = reach_target.ReachTargetPrompts(write_problems(tmp_path / "problems.jsonl", 16))
    first = src.sample(4, iteration=0)
    assert all(p.text.endswith(":") and "=" in p.text for p in first)
    assert [p.text for p in src.sample(4, iteration=0)] == [p.text for p in first]  # deterministic per iteration
    assert src.reward_fn is reach_target.reach_target_reward
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"problem": "3,5,2=17", "target": 17}\n{"problem": "3,5,2=17"}\n')
    with pytest.raises(ValueError, match="line 2: missing field 'target'"):
        reach_target.ReachTargetPrompts(bad)


def test_the_worked_example_trains_through_the_command_line(tmp_path, harness, monkeypatch):
    problems = write_problems(tmp_path / "problems.jsonl")
    # As docs/custom_task.md has it: the user's module importable (PYTHONPATH, which the reward pool inherits).
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(EXAMPLE), os.environ.get("PYTHONPATH")])))
    monkeypatch.syspath_prepend(str(EXAMPLE))
    scalars = harness.fit([f"hydra.searchpath=[file://{EXAMPLE / 'conf'}]", "data=reach_target",
                           f"data.prompts.path={problems}", "trainer.max_epochs=2", "rollout=hf",
                           "reward.mode=process", "callbacks/diagnostics=none", "callbacks/law=none"],
                          tmp_path).scalars
    assert len(scalars["rollout/entropy"]) == 2
    # The reward ran in the isolated pool (reward.mode=process), which imported the user's module: no
    # errors, and the warm-started policy reaches some targets.
    assert all(v == 0 for _, v in scalars["rollout/reward_errors"]), scalars["rollout/reward_errors"]
    assert max(v for _, v in scalars["rollout/reward_mean"]) > 0
    assert all(math.isfinite(v) for _, v in scalars["train/loss"])
