"""The generated arithmetic task: a seeded generator with difficulty knobs, and a verifier that reads the
answer from free text without evaluating it (hostile inputs included)."""

from __future__ import annotations

import time

import pytest

from lit_entropy.data.prompts import ArithmeticPrompts
from lit_entropy.tasks.arithmetic import (
    ArithmeticConfig,
    arithmetic_reward,
    extract_answer,
    format_prompt,
    generate_problems,
    value_of,
)


def test_generator_is_seeded_and_answers_are_exact():
    cfg = ArithmeticConfig(num_operands=4, max_operand=30, ops="+-*")
    a, b = generate_problems(50, seed=3, config=cfg), generate_problems(50, seed=3, config=cfg)
    assert a == b and a != generate_problems(50, seed=4, config=cfg)
    for p in a:
        assert len(p.operands) == 4 and all(1 <= x <= 30 for x in p.operands)
        # the same expression in Python's own precedence rules (trusted, generated text only)
        expr = " ".join(f"{x} {op}" for x, op in zip(p.operands[:-1], p.ops, strict=True)) + f" {p.operands[-1]}"
        assert p.answer == eval(expr)  # noqa: S307 - our own generated digits and operators
        assert p.answer >= 0 and expr in p.text


@pytest.mark.parametrize("ops", ["+", "-", "*", "+-"])
def test_knobs_shape_the_problems(ops):
    for p in generate_problems(40, seed=0, config=ArithmeticConfig(min_operand=5, max_operand=9, ops=ops)):
        assert set(p.ops) <= set(ops) and all(5 <= x <= 9 for x in p.operands)


def test_negative_answers_only_when_allowed():
    neg = generate_problems(200, 1, ArithmeticConfig(ops="-", allow_negative=True))
    assert any(p.answer < 0 for p in neg)
    assert all(p.answer >= 0 for p in generate_problems(200, 1, ArithmeticConfig(ops="-", num_operands=3)))
    assert value_of((3, 5, 4), ("-", "+")) == (2, -2)  # a partial result below zero counts as negative


def test_word_style_and_bad_configs():
    p = generate_problems(1, 0, ArithmeticConfig(style="word"))[0]
    assert str(p.operands[0]) in p.text and "?" in p.text and not p.text.startswith("What is")
    for bad in ({"num_operands": 1}, {"num_operands": 7}, {"ops": "/"}, {"ops": ""}, {"min_operand": -1},
                {"min_operand": 5, "max_operand": 4}, {"style": "poem"}, {"style": "word", "num_operands": 3},
                {"allow_negative": "no"}):
        with pytest.raises(ValueError):
            ArithmeticConfig(**bad)
    with pytest.raises(RuntimeError, match="cannot draw"):
        generate_problems(5, 0, ArithmeticConfig(num_operands=6, min_operand=1, max_operand=1, ops="-"))


def test_prompt_source_is_a_pure_function_of_seed_and_iteration():
    src = ArithmeticPrompts({"max_operand": 50}, seed=7)
    assert src.sample(8, 3) == src.sample(8, 3) and src.sample(8, 3) != src.sample(8, 4)
    assert src.sample(8, 3) != src.sample(8, 3, round=1)
    prompt = src.sample(1, 0)[0]
    assert "\\boxed{}" in prompt.text and isinstance(prompt.reference, int)
    assert src.reward_fn(prompt.text, f"so \\boxed{{{prompt.reference}}}", prompt.reference, **src.reward_kwargs) == 1.0
    assert format_prompt(generate_problems(1, 0, ArithmeticConfig())[0], "none").endswith("?")
    with pytest.raises(ValueError):
        ArithmeticPrompts(answer_format="essay")


@pytest.mark.parametrize("text,want", [
    ("12 + 7 = 19", 19), ("The answer is \\boxed{19}.", 19), ("\\boxed{ $19$ }", 19), ("\\boxed{1,234}", 1234),
    ("so 19.0", 19), ("It is -4.", -4), ("10-5=5", 5), ("first 3 then \\boxed{4} then 9", 4),
    ("answer: 7, done", 7), ("I have $1,000,000.", 1000000),
    ("no number here", None), ("", None), ("3.5", None), ("1e5", None), ("\\boxed{\\frac{1}{2}}", None),
    ("\\boxed{19 or 20}", None), ("\\boxed{19", 19), ("x" * 30 + "7", None), ("9" * 40, None),
])
def test_extract_answer(text, want):
    assert extract_answer(text) == want


def test_reward_and_hostile_inputs():
    assert arithmetic_reward("p", "12 + 7 = 19", 19) == 1.0
    assert arithmetic_reward("p", "12 + 7 = 18", 19) == 0.0
    assert arithmetic_reward("p", "19", 19, require_boxed=True) == 0.0
    assert arithmetic_reward("p", "\\boxed{19}", 19, require_boxed=True) == 1.0
    assert arithmetic_reward("p", "__import__('os').system('true') or 19", 19) == 1.0  # text, never run
    assert arithmetic_reward("p", None, 19) == 0.0
    with pytest.raises(ValueError):
        arithmetic_reward("p", "19", "19")  # the reference is the int answer: a pipeline bug, counted
    t0 = time.perf_counter()
    for hostile in ("\\boxed{" * 20_000, "{" * 100_000 + "1", "1," * 50_000, "-" * 100_000 + "5",
                    "\\boxed{" + "9" * 10_000 + "}", "1." * 50_000, "\x00\uffff" * 10_000 + "3"):
        extract_answer(hostile)
        arithmetic_reward("p", hostile, 3)
    assert time.perf_counter() - t0 < 2.0
