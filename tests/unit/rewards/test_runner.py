"""RewardRunner: misbehaving rewards score 0, are counted, and never take the runner down."""

from __future__ import annotations

import math
import sys
import time
from pathlib import Path

import pytest

from lit_entropy.rewards import RewardRunner, RewardStats
from lit_entropy.tasks.countdown import CountdownProblem, countdown_reward, format_prompt

# Spawned workers inherit sys.path, so they can import the fixtures as top-level `reward_fixtures`.
sys.path.insert(0, str(Path(__file__).resolve().parent))
import reward_fixtures as rf  # noqa: E402


def test_validation_names_the_argument():
    with pytest.raises(ValueError, match="mode"):
        RewardRunner(rf.length_reward, mode="thread")
    for bad in (0, -1.0, float("nan"), float("inf"), "5"):
        with pytest.raises(ValueError, match="timeout_s"):
            RewardRunner(rf.length_reward, timeout_s=bad)
    with pytest.raises(ValueError, match="num_workers"):
        RewardRunner(rf.length_reward, num_workers=0)
    with pytest.raises(ValueError, match="picklable"):
        RewardRunner(lambda p, c, r: 1.0, mode="process")
    with pytest.raises(ValueError, match="prompts"):
        RewardRunner(rf.length_reward, mode="inline").score(["a", "b"], ["x"])


def test_inline_mode_isolates_errors_and_odd_values():
    runner = RewardRunner(rf.odd_values_reward, mode="inline")
    rewards, stats = runner.score(["p"] * 6, ["nan", "inf", "str", "none", "bool", "x"])
    assert rewards == [0.0, 0.0, 0.0, 0.0, 1.0, 0.5]
    assert stats == RewardStats(calls=6, errors=2, timeouts=0, non_finite=2)

    runner = RewardRunner(rf.raising_reward, mode="inline")
    assert runner.score(["p", "p"], ["boom", "ok"]) == ([0.0, 1.0], RewardStats(2, 1, 0, 0))
    runner = RewardRunner(rf.sys_exit_reward, mode="inline")
    assert runner.score(["p"], ["x"]) == ([0.0], RewardStats(1, 1, 0, 0))
    assert runner.total == RewardStats(1, 1, 0, 0)


@pytest.fixture(scope="module")
def odd_runner():
    with RewardRunner(rf.odd_values_reward, mode="process", timeout_s=5.0) as runner:
        yield runner


def test_process_mode_nan_and_non_numeric(odd_runner):
    rewards, stats = odd_runner.score(["p"] * 5, ["nan", "inf", "str", "x", "none"])
    assert rewards == [0.0, 0.0, 0.0, 0.5, 0.0]
    assert stats == RewardStats(calls=5, errors=2, timeouts=0, non_finite=2)
    rewards, stats = odd_runner.score([], [])
    assert rewards == [] and stats == RewardStats(0, 0, 0, 0)


def test_process_mode_fn_kwargs_and_order():
    completions = ["a" * k for k in range(40)]
    with RewardRunner(rf.length_reward, fn_kwargs={"scale": 0.5}) as runner:
        rewards, stats = runner.score(["p"] * 40, completions)
    assert rewards == [0.5 * k for k in range(40)]
    assert stats == RewardStats(40, 0, 0, 0)


def test_raising_reward_scores_zero_and_counts():
    with RewardRunner(rf.raising_reward, timeout_s=5.0) as runner:
        rewards, stats = runner.score(["p"] * 3, ["ok", "boom", "ok"])
        assert rewards == [1.0, 0.0, 1.0]
        assert stats == RewardStats(calls=3, errors=1, timeouts=0, non_finite=0)
        rewards, stats = runner.score(["p"], ["fine"])
        assert rewards == [1.0] and stats.errors == 0


def test_hanging_reward_times_out_quickly_and_runner_recovers():
    with RewardRunner(rf.hanging_reward, timeout_s=0.5, num_workers=2) as runner:
        runner.score(["p"], ["warm"])  # pool start-up is not part of the timing below
        start = time.monotonic()
        rewards, stats = runner.score(["p"] * 6, ["ok", "hang", "ok", "ok", "ok", "ok"])
        elapsed = time.monotonic() - start
        assert rewards == [1.0, 0.0, 1.0, 1.0, 1.0, 1.0]
        assert stats == RewardStats(calls=6, errors=0, timeouts=1, non_finite=0)
        assert elapsed < 4.0, elapsed
        # Two hung calls hang in parallel on the two workers: about one timeout, not two.
        start = time.monotonic()
        rewards, stats = runner.score(["p"] * 3, ["hang", "hang", "ok"])
        assert rewards == [0.0, 0.0, 1.0] and stats.timeouts == 2
        assert time.monotonic() - start < 5.0
        # The hung workers were killed; a fresh pool serves the next call.
        assert runner.score(["p", "p"], ["ok", "ok"]) == ([1.0, 1.0], RewardStats(2, 0, 0, 0))
        assert runner.total.timeouts == 3


def test_os_exit_scores_zero_and_spares_the_other_calls():
    with RewardRunner(rf.exiting_reward, timeout_s=5.0) as runner:
        rewards, stats = runner.score(["p"] * 4, ["ok", "exit", "ok", "ok"])
        assert rewards == [1.0, 0.0, 1.0, 1.0]
        assert stats == RewardStats(calls=4, errors=1, timeouts=0, non_finite=0)
        assert runner.score(["p"], ["ok"]) == ([1.0], RewardStats(1, 0, 0, 0))


def test_sys_exit_in_worker_is_an_error():
    with RewardRunner(rf.sys_exit_reward, timeout_s=5.0, num_workers=1) as runner:
        assert runner.score(["p"], ["x"]) == ([0.0], RewardStats(1, 1, 0, 0))


def test_countdown_reward_through_process_runner():
    problem = CountdownProblem((3, 5, 2), 16)
    prompt = format_prompt(problem)
    completions = ["(3+5)*2", "2*(5+3)", "3+5*2", "3*5+2", "__import__('os')", "9" * 10000]
    with RewardRunner(countdown_reward, mode="process", fn_kwargs={"format_reward": 0.1}) as runner:
        rewards, stats = runner.score([prompt] * len(completions), completions)
        assert rewards == [1.0, 1.0, 0.1, 0.1, 0.0, 0.0]
        assert stats == RewardStats(len(completions), 0, 0, 0)
        # A malformed prompt is a pipeline bug: counted as an error, scored 0.
        rewards, stats = runner.score(["garbage"], ["(3+5)*2"], [None])
        assert rewards == [0.0] and stats.errors == 1
        # The problem can come from the reference instead of the prompt.
        rewards, _ = runner.score(["garbage"], ["(3+5)*2"], [problem])
        assert rewards == [1.0]
    assert all(math.isfinite(r) for r in rewards)


def test_a_hang_inside_a_chunk_keeps_the_chunks_finished_calls_and_reruns_the_rest():
    completions = ["ok"] * 5 + ["hang"] + ["ok"] * 6
    with RewardRunner(rf.hanging_reward, timeout_s=0.5, num_workers=2, chunk_size=4) as runner:
        rewards, stats = runner.score(["p"] * len(completions), completions)
    assert rewards == [1.0] * 5 + [0.0] + [1.0] * 6
    assert stats == RewardStats(calls=12, errors=0, timeouts=1, non_finite=0)


def test_a_crash_inside_a_chunk_spares_the_other_calls_of_the_chunk():
    completions = ["ok", "ok", "exit", "ok", "ok", "ok", "ok"]
    with RewardRunner(rf.exiting_reward, timeout_s=5.0, num_workers=2, chunk_size=3) as runner:
        rewards, stats = runner.score(["p"] * len(completions), completions)
    assert rewards == [1.0, 1.0, 0.0, 1.0, 1.0, 1.0, 1.0]
    assert stats == RewardStats(calls=7, errors=1, timeouts=0, non_finite=0)


def test_chunks_cover_every_call_once_and_keep_the_order():
    runner = RewardRunner(rf.length_reward, num_workers=2)
    assert [len(c) for c in runner._chunks(list(range(1024)))] == [64] * 16
    assert runner._chunks(list(range(5))) == [[0], [1], [2], [3], [4]]
    with RewardRunner(rf.length_reward, chunk_size=7) as runner:
        rewards, _ = runner.score(["p"] * 30, ["a" * k for k in range(30)])
    assert rewards == [float(k) for k in range(30)]


def test_auto_mode_runs_trusted_verifiers_inline_and_everything_else_in_processes():
    assert RewardRunner(countdown_reward).mode == "inline"
    assert RewardRunner(rf.length_reward).mode == "process"
    assert RewardRunner(countdown_reward, mode="process").mode == "process"


def test_inline_calls_over_the_timeout_score_zero_as_timeouts():
    runner = RewardRunner(rf.slow_reward, mode="inline", timeout_s=0.1)
    rewards, stats = runner.score(["p"] * 3, ["ok", "slow", "ok"])
    assert rewards == [1.0, 0.0, 1.0]
    assert stats == RewardStats(calls=3, errors=0, timeouts=1, non_finite=0)


def test_start_launches_the_pool_without_waiting_and_score_uses_it():
    with RewardRunner(rf.length_reward, num_workers=2) as runner:
        runner.start()
        assert runner._pool is not None and runner._starting is not None  # not waited for yet
        pool = runner._pool
        assert runner.score(["p", "p"], ["ab", "abc"])[0] == [2.0, 3.0]
        assert runner._pool is pool and runner._starting is None


def test_one_unpicklable_reference_fails_only_its_own_call():
    import threading

    refs = [None, None, threading.Lock(), None, None]  # a lock cannot be sent to a worker
    with RewardRunner(rf.length_reward, num_workers=1, chunk_size=5) as runner:
        rewards, stats = runner.score(["p"] * 5, ["a", "bb", "ccc", "dddd", "eeeee"], refs)
    assert rewards == [1.0, 2.0, 0.0, 4.0, 5.0]
    assert stats == RewardStats(calls=5, errors=1, timeouts=0, non_finite=0)
