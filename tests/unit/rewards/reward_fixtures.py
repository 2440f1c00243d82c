"""Module-level reward functions for the reward-runner tests.

Spawned worker processes import this module by name: the tests put `tests/unit` on `sys.path`
(spawned children inherit the parent's `sys.path`) and import it as top-level `reward_fixtures`.
"""

from __future__ import annotations

import os
import sys
import time


def length_reward(prompt: str, completion: str, reference: object = None, *, scale: float = 1.0) -> float:
    return scale * len(completion)


def raising_reward(prompt: str, completion: str, reference: object = None) -> float:
    if completion == "boom":
        raise RuntimeError("reward exploded")
    return 1.0


def sys_exit_reward(prompt: str, completion: str, reference: object = None) -> float:
    sys.exit(3)


def hanging_reward(prompt: str, completion: str, reference: object = None) -> float:
    if completion == "hang":
        time.sleep(1e6)
    return 1.0


def exiting_reward(prompt: str, completion: str, reference: object = None) -> float:
    if completion == "exit":
        os._exit(1)
    return 1.0


def odd_values_reward(prompt: str, completion: str, reference: object = None) -> object:
    return {"nan": float("nan"), "inf": float("-inf"), "str": "1.0", "none": None, "bool": True}.get(
        completion, 0.5
    )


def slow_reward(prompt: str, completion: str, reference: object = None) -> float:
    if completion == "slow":
        time.sleep(0.3)
    return 1.0
