"""The generated prompt sources (lit_entropy/tasks/prompts.py): each iteration's prompts are a function of the
source's seed, the iteration and the refill round, so a resumed run draws the same stream; the reference and the
reward come with them. The JSONL and named math sets: test_math_sources.py; the task's splits: test_arithmetic.py."""

from __future__ import annotations

import pytest

from lit_entropy.tasks.arithmetic import arithmetic_reward
from lit_entropy.tasks.countdown import countdown_reward
from lit_entropy.tasks.prompts import ArithmeticPrompts, CountdownPrompts, Prompt, PromptSource

SOURCES = {"countdown": lambda seed: CountdownPrompts(seed=seed), "arithmetic": lambda seed: ArithmeticPrompts(seed=seed)}


@pytest.mark.parametrize("name", sorted(SOURCES))
def test_the_stream_is_a_function_of_seed_iteration_and_round(name):
    a, b = SOURCES[name](7), SOURCES[name](7)
    first = a.sample(6, iteration=3)
    assert all(isinstance(p, Prompt) for p in first) and len(first) == 6
    assert [p.text for p in first] == [p.text for p in b.sample(6, iteration=3)]  # a fresh source, the same draw
    assert [p.text for p in first] == [p.text for p in a.sample(6, iteration=3)]  # drawing is not consumed
    assert [p.text for p in first] != [p.text for p in a.sample(6, iteration=4)]
    assert [p.text for p in first] != [p.text for p in a.sample(6, iteration=3, round=1)]  # a refill differs
    assert [p.text for p in first] != [p.text for p in SOURCES[name](8).sample(6, iteration=3)]


def test_each_source_brings_its_reward_and_references():
    arithmetic, countdown = ArithmeticPrompts(seed=0, require_boxed=True), CountdownPrompts(format_reward=0.1)
    assert isinstance(arithmetic, PromptSource) and isinstance(countdown, PromptSource)
    assert arithmetic.reward_fn is arithmetic_reward and arithmetic.reward_kwargs == {"require_boxed": True}
    assert countdown.reward_fn is countdown_reward and countdown.reward_kwargs["format_reward"] == 0.1
    p = arithmetic.sample(1, iteration=0)[0]
    assert isinstance(p.reference, int)  # the integer answer
    assert arithmetic.reward_fn(p.text, f"\\boxed{{{p.reference}}}", p.reference) == 1.0
    assert CountdownPrompts().sample(1, iteration=0)[0].reference is None  # the prompt says it all
    with pytest.raises(ValueError, match="answer_format"):
        ArithmeticPrompts(answer_format="essay")
