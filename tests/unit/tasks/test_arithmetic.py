"""The generated arithmetic task: a seeded generator with difficulty knobs, and a verifier that reads the
answer from free text without evaluating it (hostile inputs included)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from lit_entropy.tasks.arithmetic import (
    ANSWER_FORMATS,
    ArithmeticConfig,
    answer_stats,
    arithmetic_reward,
    canonical_form,
    count_problems,
    extract_answer,
    first_number,
    format_prompt,
    generate_problems,
    is_bare_answer,
    split_of,
    value_of,
)
from lit_entropy.tasks.prompts import ArithmeticPrompts

EASY = {"num_operands": 2, "min_operand": 1, "max_operand": 20, "ops": "+", "style": "expression", "phrasing": "fixed"}
"""The task's first setting (``data=arithmetic_easy``, less its split)."""


def test_generator_is_seeded_and_answers_are_exact():
    cfg = ArithmeticConfig(num_operands=4, min_operand=1, max_operand=30, ops="+-*", style="expression")
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
    for p in generate_problems(40, seed=0, config=ArithmeticConfig(**{**EASY, "min_operand": 5, "max_operand": 9, "ops": ops})):
        assert set(p.ops) <= set(ops) and all(5 <= x <= 9 for x in p.operands)


def test_negative_answers_only_when_allowed():
    neg = generate_problems(200, 1, ArithmeticConfig(**{**EASY, "ops": "-", "allow_negative": True}))
    assert any(p.answer < 0 for p in neg)
    assert all(p.answer >= 0 for p in generate_problems(200, 1, ArithmeticConfig(**{**EASY, "ops": "-", "num_operands": 3})))
    assert value_of((3, 5, 4), ("-", "+")) == (2, -2)  # a partial result below zero counts as negative


def test_word_style_and_bad_configs():
    p = generate_problems(1, 0, ArithmeticConfig(**{**EASY, "style": "word"}))[0]
    assert str(p.operands[0]) in p.text and "?" in p.text and not p.text.startswith("What is")
    for bad in ({"num_operands": 1}, {"num_operands": 7}, {"ops": "/"}, {"ops": ""}, {"min_operand": -1},
                {"min_operand": 5, "max_operand": 4}, {"style": "poem"}, {"style": "word", "num_operands": 3, "ops": "+"},
                {"allow_negative": "no"}):
        with pytest.raises(ValueError):
            ArithmeticConfig(**bad)
    with pytest.raises(RuntimeError, match="cannot draw"):
        generate_problems(5, 0, ArithmeticConfig(**{**EASY, "num_operands": 6, "min_operand": 1, "max_operand": 1, "ops": "-"}))


def test_prompt_source_is_a_pure_function_of_seed_and_iteration():
    src = ArithmeticPrompts({"max_operand": 50}, seed=7)
    assert src.sample(8, 3) == src.sample(8, 3) and src.sample(8, 3) != src.sample(8, 4)
    assert src.sample(8, 3) != src.sample(8, 3, round=1)
    prompt = src.sample(1, 0)[0]
    assert "\\boxed{}" in prompt.text and isinstance(prompt.reference, int)
    assert src.reward_fn(prompt.text, f"so \\boxed{{{prompt.reference}}}", prompt.reference, **src.reward_kwargs) == 1.0
    assert format_prompt(generate_problems(1, 0, ArithmeticConfig(**EASY))[0], "none").endswith("?")
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


# --------------------------------------------------------------------------- splits, the default task's space

DEFAULT_TASK = OmegaConf.to_container(OmegaConf.load(Path(__file__).parents[3] / "conf/data/arithmetic.yaml"))[
    "data"]["prompts"]["task"]
"""The shipped default (``conf/data/arithmetic.yaml``), less its ``_target_``."""
DEFAULT_TASK.pop("_target_")


def test_canonical_form_ignores_order_and_wording():
    assert canonical_form((3, 5), ("+",)) == canonical_form((5, 3), ("+",)) == "+3,5|-"
    assert canonical_form((12, 7, 3), ("+", "-")) == canonical_form((7, 3, 12), ("-", "+")) == "+7,12|-3"
    assert canonical_form((12, 7, 3), ("+", "-")) != canonical_form((12, 3, 7), ("+", "-"))
    assert canonical_form((2, 3, 4), ("*", "+")) == canonical_form((4, 3, 2), ("+", "*")) == "+2*3,4|-"
    cfg = ArithmeticConfig(**{**DEFAULT_TASK, "num_operands": 3})
    stories = generate_problems(300, 0, cfg)
    for p in stories:  # every wording of a problem has its canonical form, so its side
        assert p.canonical == canonical_form(p.operands, p.ops)
        assert split_of(p.canonical, cfg.held_out_fraction) == "train"


def test_training_never_draws_a_held_out_problem():
    """The issue's bar: >= 10^5 training problems of the default task, none on the held-out side, and the held-out
    split's problems are none of them (by canonical form, so not even reordered or reworded)."""
    cfg = ArithmeticConfig(**DEFAULT_TASK)
    assert cfg.held_out_fraction > 0
    train = {p.canonical for seed in range(4) for p in generate_problems(25_000, seed, cfg)}
    held = {p.canonical for p in generate_problems(2_000, 0, cfg, split="held_out")}
    assert len(held) > 1_000 and not train & held
    assert all(split_of(c, cfg.held_out_fraction) == "train" for c in train)
    assert all(split_of(c, cfg.held_out_fraction) == "held_out" for c in held)
    # the side is a fixed hash, not drawn: about held_out_fraction of a uniform draw falls on the held-out side
    unsplit = generate_problems(20_000, 9, ArithmeticConfig(**{**DEFAULT_TASK, "held_out_fraction": 0.0}))
    share = sum(split_of(p.canonical, cfg.held_out_fraction) == "held_out" for p in unsplit) / len(unsplit)
    assert abs(share - cfg.held_out_fraction) < 0.02


def test_the_default_space_is_too_large_to_memorise():
    cfg = ArithmeticConfig(**DEFAULT_TASK)
    assert count_problems(cfg) >= 10**5
    tiny = ArithmeticConfig(num_operands=2, min_operand=1, max_operand=3, held_out_fraction=0.0)
    assert count_problems(tiny) == 6 + 6  # by hand: 1+1 .. 3+3 up to order, 1-1 .. 3-3 with a - b >= 0
    with pytest.raises(ValueError, match="sums and differences"):
        count_problems(ArithmeticConfig(ops="*", style="expression"))


def test_transfer_split_has_one_more_operand_and_the_same_ranges():
    cfg = ArithmeticConfig(**DEFAULT_TASK)
    top = cfg.operand_counts[-1]
    transfer = generate_problems(500, 0, cfg, split="transfer")
    assert all(len(p.operands) == top + 1 for p in transfer)
    assert all(cfg.min_operand <= x <= cfg.max_operand for p in transfer for x in p.operands)
    assert all(len(p.operands) <= top for p in generate_problems(2_000, 1, cfg))
    assert {len(p.operands) for p in generate_problems(2_000, 1, cfg)} == set(cfg.operand_counts)
    with pytest.raises(ValueError, match="no held-out split"):
        generate_problems(1, 0, ArithmeticConfig(held_out_fraction=0.0), split="held_out")
    with pytest.raises(ValueError, match="split must be"):
        generate_problems(1, 0, cfg, split="test")


def test_eval_splits_do_not_depend_on_the_run_seed_and_training_does():
    a, b = ArithmeticPrompts(DEFAULT_TASK, seed=0), ArithmeticPrompts(DEFAULT_TASK, seed=1)
    assert a.eval_splits(16) == b.eval_splits(16) and set(a.eval_splits(4)) == {"held_out", "transfer"}
    assert a.sample(16, 0) != b.sample(16, 0)
    assert set(ArithmeticPrompts({"held_out_fraction": 0.0}).eval_splits(4)) == {"transfer"}  # no share held out


@pytest.mark.parametrize("text,bare,first", [
    ("52", True, 52), ("52.", True, 52), ("\\boxed{52}", True, 52), (" 1,052 ", True, 1052), ("-3", True, -3),
    ("52\n\nIn that case, the next number is 11.", False, 52), ("The answer is 52.", False, 52),
    ("47 + 23 = 70, 70 - 18 = 52", False, 47), ("no", False, None), ("", False, None),
])
def test_format_and_first_number(text, bare, first):
    assert is_bare_answer(text) is bare
    assert first_number(text) == first
    assert answer_stats(text, 52) == {"format": float(bare), "first_number": float(first == 52)}


def test_mixed_answer_format_keeps_one_instruction_per_problem():
    problems = generate_problems(200, 0, ArithmeticConfig(**DEFAULT_TASK))
    prompts = [format_prompt(p, "mixed") for p in problems]
    assert prompts == [format_prompt(p, "mixed") for p in problems]
    assert {p.splitlines()[-1] for p in prompts} == {ANSWER_FORMATS["number"], ANSWER_FORMATS["boxed"]}


def test_the_tuning_split_is_apart_from_the_evaluation_and_from_training():
    """Issue 77: calibration and tuning read a held-out set of their own; the evaluation's ``held_out`` never holds
    one of its problems, nor does training (by canonical form, so not reordered or reworded either)."""
    cfg = ArithmeticConfig(**{**DEFAULT_TASK, "tuning_share": 0.5})
    train = {p.canonical for seed in range(2) for p in generate_problems(20_000, seed, cfg)}
    held = {p.canonical for p in generate_problems(1_000, 0, cfg, split="held_out")}
    tuning = {p.canonical for p in generate_problems(1_000, 0, cfg, split="tuning")}
    assert len(held) > 500 and len(tuning) > 500
    assert not held & tuning and not train & held and not train & tuning
    assert all(split_of(c, cfg.held_out_fraction, cfg.tuning_share) == "tuning" for c in tuning)
    # with no tuning share the held-out side is what it was, and training is the same either way
    plain = ArithmeticConfig(**DEFAULT_TASK)
    assert generate_problems(300, 3, plain) == generate_problems(300, 3, cfg)
    assert all(split_of(c, plain.held_out_fraction) == "held_out" for c in held | tuning)
    share = len([c for c in held | tuning if c in tuning]) / len(held | tuning)
    assert 0.4 < share < 0.6  # the second hash cuts the held-out side about at tuning_share
    with pytest.raises(ValueError, match="no tuning split"):
        generate_problems(1, 0, plain, split="tuning")
    with pytest.raises(ValueError, match="tuning_share"):
        ArithmeticConfig(held_out_fraction=0.0, tuning_share=0.5)


def test_the_retention_split_holds_kinds_training_never_draws():
    from lit_entropy.tasks.arithmetic_text import number_in_words

    cfg = ArithmeticConfig(**{**DEFAULT_TASK, "retention": True})
    problems = generate_problems(600, 0, cfg, split="retention")
    assert problems == generate_problems(600, 0, cfg, split="retention")  # seeded
    kinds = {p.ops for p in problems}
    assert kinds == {("*",), ("/",)}
    for p in problems:
        a, b = p.operands
        assert p.answer == (a * b if p.ops == ("*",) else a // b) and (p.ops == ("*",) or a % b == 0)
        assert all(str(x) in p.text or number_in_words(x) in p.text for x in (a, b))
    texts = {p.text.split(" ")[0] for p in problems}
    assert len(texts) >= 8  # several wordings
    assert any("times" in p.text and any(w in p.text for w in ("seven", "eight", "nine")) for p in problems)
    train_ops = {op for seed in range(3) for p in generate_problems(2_000, seed, cfg) for op in p.ops}
    assert train_ops <= {"+", "-"}  # products and quotients never trained
    assert [number_in_words(x) for x in (7, 20, 72, 100, 144)] == [
        "seven", "twenty", "seventy-two", "one hundred", "one hundred and forty-four"]
    with pytest.raises(ValueError, match="retention"):
        ArithmeticConfig(ops="+*", style="expression", retention=True)
    quotient = next(p for p in problems if p.ops == ("/",))
    with pytest.raises(ValueError, match="canonical"):
        _ = quotient.canonical  # no split hash for a kind the task never trains


def test_eval_splits_add_tuning_and_retention_when_asked():
    both = ArithmeticPrompts({**DEFAULT_TASK, "tuning_share": 0.5, "retention": True})
    splits = both.eval_splits(8)
    assert list(splits) == ["held_out", "transfer", "tuning", "retention"]
    assert all(len(v) == 8 and all(isinstance(p.reference, int) for p in v) for v in splits.values())
    assert [p.text for p in splits["retention"]] == [p.text for p in both.eval_splits(8)["retention"]]
    assert all(arithmetic_reward("", str(p.reference), p.reference) == 1.0 for p in splits["retention"])
