"""Reward workers die with the trainer, even when the trainer is killed with SIGKILL."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import psutil

from tests.helpers import ROOT

PARENT = """
import sys, time, psutil
sys.path.insert(0, {root!r})
from lit_entropy.rewards.runner import RewardRunner
from tests.unit.rewards.reward_fixtures import hanging_reward
runner = RewardRunner(hanging_reward, timeout_s=60, mode="process", num_workers=2)
runner._get_pool()
print(" ".join(str(c.pid) for c in psutil.Process().children(recursive=True)), flush=True)
runner.score(["p"], ["hang"])  # a hung reward: the worker's main thread is busy when the parent dies
"""


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() not in (psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD)
    except psutil.NoSuchProcess:
        return False


def test_workers_exit_when_the_trainer_is_sigkilled():
    parent = subprocess.Popen([sys.executable, "-c", PARENT.format(root=str(ROOT))], cwd=ROOT,
                              stdout=subprocess.PIPE, text=True)
    try:
        pids = [int(p) for p in parent.stdout.readline().split()]
        assert pids, "the parent reported no children"
        time.sleep(1.0)  # the hung call is running in a worker now
        assert any(alive(p) for p in pids)
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait(timeout=10)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and any(alive(p) for p in pids):
            time.sleep(0.2)
        assert not [p for p in pids if alive(p)], "orphaned reward workers survived their parent"
    finally:
        if parent.poll() is None:
            parent.kill()
