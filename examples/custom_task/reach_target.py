"""A task of your own for lit-entropy: "reach the target" arithmetic, read from a JSONL file.

Each row of the file is one problem, e.g. ``{"problem": "3,5,2=16", "target": 16}``: the policy sees
``3,5,2=16:`` and should answer with an arithmetic expression (``+ - * /`` and parentheses) that equals the
target, using each given number at most once (unlike the lab's Countdown, it need not use them all).

Two pieces make a task:

* a **prompt source**: here :class:`ReachTargetPrompts`, which reuses ``JSONLPrompts`` (reading, checking
  and a seeded, resumable order of the rows) and only swaps its reward;
* a **reward function**: :func:`reach_target_reward`, a top-level function
  ``(prompt, completion, reference, **reward_kwargs) -> float`` that the reward runner calls once per
  completion.

The reward parses the completion with the lab's hand-written parser (it never runs text as Python) and is
bounded in time and memory, so it is marked ``@trusted_reward`` and runs in the trainer's process under
``reward.mode=auto``. Remove the mark (or run ``reward.mode=process``) to score in the isolated worker pool.

The module must be importable by the trainer and by the pool's workers: put its folder on ``PYTHONPATH``
or install it. docs/custom_task.md walks through it.
"""

from __future__ import annotations

from collections import Counter
from fractions import Fraction

from lit_entropy.rewards import trusted_reward
from lit_entropy.tasks.countdown_expr import evaluate, numbers_used, parse_expression
from lit_entropy.tasks.math_sources import JSONLPrompts


def given_numbers(prompt: str) -> list[int]:
    """The numbers of a prompt ``a,b,c=target:`` (ValueError if it is not one)."""
    head, sep, _ = prompt.strip().partition("=")
    if not sep:
        raise ValueError(f"not a reach-the-target prompt: {prompt!r}")
    return [int(x) for x in head.split(",")]


@trusted_reward  # bounded parser, nothing executed: safe to score in the trainer's process
def reach_target_reward(prompt: str, completion: str, reference: str, *, near_credit: float = 0.0) -> float:
    """1.0 when ``completion`` equals the target (``reference``) using each given number at most once.

    A well-formed expression that uses only given numbers but misses scores
    ``near_credit * max(0, 1 - |value - target| / target)`` (0 by default: a binary reward); anything
    else scores 0.
    """
    node = parse_expression(completion)
    if node is None:
        return 0.0
    if Counter(numbers_used(node)) - Counter(given_numbers(prompt)):  # a number not given, or used twice
        return 0.0
    value, target = evaluate(node), Fraction(reference)
    if value is None:  # divided by zero
        return 0.0
    if value == target:
        return 1.0
    return float(near_credit) * max(0.0, 1.0 - float(abs(value - target)) / max(float(target), 1.0))


class ReachTargetPrompts(JSONLPrompts):
    """Rows ``{"problem": "3,5,2=16", "target": 16}`` from a JSONL file, scored by :func:`reach_target_reward`.

    ``JSONLPrompts`` does the rest: every row is checked when the file is read (a bad row fails naming
    its line), and iteration ``i`` takes a seeded slice of a shuffled pass over the rows, so a resumed run
    sees the same prompts.
    """

    def __init__(self, path: str, question_field: str = "problem", answer_field: str = "target",
                 template: str = "{question}:", seed: int = 1234, shuffle: bool = True,
                 reward_kwargs: dict | None = None) -> None:
        super().__init__(path, question_field=question_field, answer_field=answer_field, template=template,
                         seed=seed, shuffle=shuffle, reward_kwargs=reward_kwargs)
        self.reward_fn = reach_target_reward
