"""The ``reward`` group: how completions are scored (runner, time limits, shaping, what counts as correct)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from lit_entropy.rewards.runner import MODES


@dataclass
class RewardConfig:
    """Scoring settings shared by training rollouts and evaluation."""

    mode: str = "auto"
    """``auto``: in-process for trusted verifiers (Countdown), an isolated worker pool otherwise;
    ``inline`` or ``process`` force one."""
    timeout_s: float = 5.0
    """Seconds one reward call may take; a call that takes longer scores 0 and is counted."""
    workers: int = 2
    """Processes of the isolated reward pool."""
    correct_threshold: float = 1.0
    """A completion whose reward reaches this counts as correct (``rollout/accuracy``, pass@k)."""
    overlong_buffer: int = 0
    """> 0: DAPO's soft overlong punishment over the last this many of ``rollout.max_new_tokens``."""
    overlong_penalty: float = 1.0
    """The overlong punishment's size at ``rollout.max_new_tokens``."""

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"reward.mode={self.mode!r} must be one of {MODES}")
        t = self.timeout_s
        if isinstance(t, bool) or not (isinstance(t, int | float) and math.isfinite(t) and t > 0):
            raise ValueError(f"reward.timeout_s={t!r} must be a finite number > 0")
        if isinstance(self.workers, bool) or not isinstance(self.workers, int) or self.workers < 1:
            raise ValueError(f"reward.workers={self.workers!r} must be an integer >= 1")
        if self.overlong_buffer < 0:
            raise ValueError(f"reward.overlong_buffer={self.overlong_buffer} must be >= 0")
        if self.overlong_penalty < 0:
            raise ValueError(f"reward.overlong_penalty={self.overlong_penalty} must be >= 0")
