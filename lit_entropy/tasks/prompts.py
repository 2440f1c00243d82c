"""Prompt sources: where each iteration's prompts (and the reward that scores them) come from."""

from __future__ import annotations

import random
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from lit_entropy.tasks.countdown import CountdownConfig, countdown_reward, format_prompt, generate_problems


@dataclass
class Prompt:
    text: str
    """What the policy sees."""
    reference: Any = None
    """What the reward compares against (a gold answer; for Countdown the prompt says it all)."""


class PromptSource(ABC):
    """Draws prompts deterministically per iteration, so a resumed run sees the same stream."""

    reward_fn: Callable[..., float]
    """Top-level (picklable) ``(prompt, completion, reference, **reward_kwargs) -> float``."""
    reward_kwargs: dict[str, Any]

    @abstractmethod
    def sample(self, n: int, iteration: int, round: int = 0) -> list[Prompt]:
        """``n`` prompts for RL iteration ``iteration`` (``round`` > 0: dynamic sampling's refills)."""


class CountdownPrompts(PromptSource):
    """Freshly generated Countdown problems (docs/design.md §10): an endless, seeded stream."""

    def __init__(self, task: CountdownConfig | dict | None = None, seed: int = 1234, format_reward: float = 0.0):
        self.task = task if isinstance(task, CountdownConfig) else CountdownConfig(**(task or {}))
        self.seed = seed
        self.reward_fn = countdown_reward
        self.reward_kwargs = {"use_all": self.task.use_all, "format_reward": format_reward}

    def sample(self, n: int, iteration: int, round: int = 0) -> list[Prompt]:
        key = f"{self.seed}:{iteration}" if round == 0 else f"{self.seed}:{iteration}:{round}"
        seed = random.Random(key).randrange(2**31)
        return [Prompt(format_prompt(p)) for p in generate_problems(n, seed=seed, config=self.task)]


class ArithmeticPrompts(PromptSource):
    """Generated arithmetic (:mod:`lit_entropy.tasks.arithmetic`): an endless, seeded stream of sums and
    differences for small instruct models; the reference is the integer answer.

    ``sample`` draws training problems only (never one of the held-out side, when the task has a split);
    ``eval_splits`` gives the evaluation problems: ``held_out`` (the other side of the split, when there is
    one) and ``transfer`` (more operands than training uses), drawn under a fixed seed of their own; with the
    task's ``tuning_share`` also ``tuning`` (held out, apart from ``held_out``: for calibration and tuning) and with
    ``retention`` the ``retention`` split (kinds of problem never trained)."""

    def __init__(self, task: Any = None, seed: int = 1234, answer_format: str = "boxed", require_boxed: bool = False):
        from lit_entropy.tasks.arithmetic import ANSWER_FORMATS, ArithmeticConfig, arithmetic_reward

        self.task = task if isinstance(task, ArithmeticConfig) else ArithmeticConfig(**(task or {}))
        if answer_format not in ANSWER_FORMATS:
            raise ValueError(f"answer_format must be one of {sorted(ANSWER_FORMATS)}, got {answer_format!r}")
        self.seed = seed
        self.answer_format = answer_format
        self.reward_fn = arithmetic_reward
        self.reward_kwargs = {"require_boxed": bool(require_boxed)}

    def sample(self, n: int, iteration: int, round: int = 0) -> list[Prompt]:
        key = f"{self.seed}:{iteration}" if round == 0 else f"{self.seed}:{iteration}:{round}"
        return self.problems(n, random.Random(key).randrange(2**31), "train")

    def problems(self, n: int, seed: int, split: str) -> list[Prompt]:
        """``n`` prompts of ``split`` (``train``, ``held_out``, ``tuning``, ``transfer``, ``retention``) under
        ``seed``."""
        from lit_entropy.tasks.arithmetic import format_prompt, generate_problems

        return [Prompt(format_prompt(p, self.answer_format), reference=p.answer)
                for p in generate_problems(n, seed=seed, config=self.task, split=split)]

    def eval_splits(self, n: int, seed: int = 0) -> dict[str, list[Prompt]]:
        """``n`` evaluation problems per split: ``held_out`` (only when the task holds a share out: disjoint from
        every training problem by construction) and ``transfer``, then ``tuning`` and ``retention`` when on.
        ``seed`` is the evaluation's own, not the run's:
        every seed of a study is evaluated on the same problems."""
        splits = ("held_out", "transfer") if self.task.held_out_fraction > 0 else ("transfer",)
        splits += ("tuning",) * (self.task.tuning_share > 0) + ("retention",) * self.task.retention
        return {split: self.problems(n, seed, split) for split in splits}

    @staticmethod
    def answer_stats(completion: str, reference: Any) -> dict[str, float]:
        """Format and lenient skill of one completion (:func:`lit_entropy.tasks.arithmetic.answer_stats`)."""
        from lit_entropy.tasks.arithmetic import answer_stats

        return answer_stats(completion, reference)
