"""Countdown: hostile verifier inputs, solver/verifier agreement, generator determinism, prompts."""

from __future__ import annotations

import pickle
import random
import time

import pytest

from lit_entropy.tasks.countdown import (
    COUNTDOWN_ALPHABET,
    CountdownConfig,
    CountdownProblem,
    count_solutions,
    countdown_reward,
    format_prompt,
    generate_problems,
    parse_prompt,
    problem_stream,
    random_solution,
    solve,
    verify,
)
from lit_entropy.tasks.countdown_expr import (
    MAX_DEPTH,
    canonical_form,
    evaluate,
    parse_expression,
)

P = CountdownProblem((3, 5, 2), 16)

HOSTILE = [
    None,
    16,
    b"(3+5)*2",
    ["(3+5)*2"],
    "",
    "   ",
    "\n\t",
    "9" * 10000,
    "9" * 7,
    "3/(5-5)*2",
    "(3+5)*2/0",
    "__import__('os').system('x')",
    "__import__('os')",
    "(" * 10000 + "1" + ")" * 10000,
    "(" * 100_000 + "3+5)*2",
    "(" * (MAX_DEPTH + 1) + "3" + ")" * (MAX_DEPTH + 1) + "*5*2",
    "(3+5)\u22172",  # asterisk operator look-alike
    "(３+５)*２",  # fullwidth digits
    "(٣+5)*2",  # Arabic-Indic digit
    "(3+5)*2\x00",
    "\x00",
    "1e5",
    "2**10",
    "0x10",
    "-3+5",
    "3+-5*2",
    "(3+5)*2;",
    "(3+5)*2)",
    "((3+5)*2",
    "()",
    "3 5 2",
    "(3+5)*2 = 16",
    "16",
    "03+5*2",
    "(3+5)\t*2",
    "3.0+5*2",
    "lambda: 16",
]


@pytest.mark.parametrize("text", HOSTILE, ids=range(len(HOSTILE)))
def test_verify_rejects_hostile_input_without_raising(text):
    assert verify(text, P) is False
    assert verify(text, P, use_all=False) is False
    assert countdown_reward(format_prompt(P), text) in (0.0,)


def test_correct_answers_verify():
    for text in ["(3+5)*2", "2*(5+3)", " (3 + 5) * 2 ", "(3+5)\u00d72", "2\u00d7(3+5)", "\n(5+3)*2\n"]:
        assert verify(text, P), text
    assert verify("(3/2)*4", CountdownProblem((3, 2, 4), 6))  # rational intermediates are fine
    assert verify("8\u00f7(3-8\u00f73)", CountdownProblem((8, 3, 8, 3), 24))
    assert verify("7*7*1", CountdownProblem((7, 7, 1), 49))


def test_wrong_answers_do_not_verify():
    for text in ["3+5*2", "(3+5)*3", "(3+5+2)", "3*5+2", "(3+5)*2*1", "16", "(3+3)*2+4"]:
        assert not verify(text, P), text


def test_use_all_versus_subset_rules():
    prob = CountdownProblem((4, 6, 2), 10)
    assert verify("4+6", prob, use_all=False)
    assert not verify("4+6", prob, use_all=True)
    assert verify("4+6*2/2", prob, use_all=False) is False  # 2 used twice
    assert verify("6*2-4/2", prob, use_all=False) is False  # value 10 but 2 used twice
    assert verify("4*2+2", CountdownProblem((4, 2, 2), 10), use_all=True)
    assert not verify("10", CountdownProblem((10, 3, 7), 10), use_all=False)  # one number is not enough
    assert verify("3+7", CountdownProblem((10, 3, 7), 10), use_all=False)


def test_solver_and_verifier_agree_on_generated_problems():
    rng = random.Random(0)
    for use_all in (True, False):
        config = CountdownConfig(num_numbers=4, max_target=200, use_all=use_all)
        for problem in generate_problems(25, seed=1, config=config):
            solutions = solve(problem, use_all=use_all)
            assert len(solutions) == count_solutions(problem, use_all) > 0
            assert len(set(solutions)) == len(solutions)
            for text in solutions:
                assert verify(text, problem, use_all=use_all), (problem, text)
                assert canonical_form(text) == text
                assert set(text) <= set(COUNTDOWN_ALPHABET)
            # Random expressions over the numbers verify exactly when they evaluate to the target.
            solved = set(solutions)
            for _ in range(20):
                text = _random_expression(problem.numbers, rng)
                value = evaluate(parse_expression(text))
                should = value == problem.target
                assert verify(text, problem, use_all=use_all) == should
                if use_all:
                    assert (canonical_form(text) in solved) == should
                assert not verify(text, CountdownProblem(problem.numbers, problem.target + 1000))


def _random_expression(numbers: tuple[int, ...], rng: random.Random) -> str:
    items = [str(x) for x in numbers]
    while len(items) > 1:
        a, b = (items.pop(rng.randrange(len(items))) for _ in range(2))
        items.append(f"({a}{rng.choice('+-*/')}{b})")
    return items[0]


def test_solve_options_and_random_solution():
    problem = CountdownProblem((3, 5, 2, 4), 24)
    everything = solve(problem)
    assert solve(problem, max_solutions=3) == everything[:3]
    assert len(solve(problem, use_all=False)) >= len(everything)
    picks = {random_solution(problem, random.Random(s)) for s in range(200)}
    assert picks <= set(everything) and len(picks) > len(everything) // 2
    assert random_solution(CountdownProblem((2, 2), 7), random.Random(0)) is None
    assert solve(CountdownProblem((5, 3, 2, 4), 24)) == everything  # order of numbers is irrelevant


def test_solver_is_fast_for_four_numbers():
    problem = CountdownProblem((7, 9, 4, 6), 63)
    start = time.perf_counter()
    count_solutions(problem, use_all=False)
    assert time.perf_counter() - start < 0.5


def test_generation_is_seeded_and_valid():
    config = CountdownConfig(num_numbers=3, max_target=50)
    first = generate_problems(30, seed=7, config=config)
    assert first == generate_problems(30, seed=7, config=config)
    assert first != generate_problems(30, seed=8, config=config)
    stream = problem_stream(7, config)
    assert [next(stream) for _ in range(30)] == first
    for problem in first:
        assert len(problem.numbers) == 3 and all(1 <= x <= 9 for x in problem.numbers)
        assert 1 <= problem.target <= 50
        assert count_solutions(problem) >= 1
    subset = CountdownConfig(use_all=False, min_solutions=3, num_numbers=4)
    for problem in generate_problems(20, seed=3, config=subset):
        assert problem.target not in problem.numbers
        assert count_solutions(problem, use_all=False) >= 3
    assert generate_problems(0, seed=0, config=config) == []


def test_config_validation_names_fields():
    for kwargs, field in [
        ({"num_numbers": 1}, "num_numbers"),
        ({"num_numbers": 7}, "num_numbers"),
        ({"min_number": 0}, "min_number"),
        ({"min_number": 5, "max_number": 4}, "max_number"),
        ({"max_target": 0}, "max_target"),
        ({"min_solutions": 0}, "min_solutions"),
    ]:
        with pytest.raises(ValueError, match=field):
            CountdownConfig(**kwargs)


def test_prompt_round_trip_and_alphabet():
    config = CountdownConfig(num_numbers=5, max_number=25, max_target=999)
    for problem in generate_problems(30, seed=2, config=config):
        prompt = format_prompt(problem)
        assert parse_prompt(prompt) == problem
        assert set(prompt) <= set(COUNTDOWN_ALPHABET)
    assert format_prompt(P) == "3,5,2=16:"
    for bad in ["", "3,5,2=16", "3=16:", "3,5,2=:", "3,-5,2=16:", "3,5,2=16:(3+5)*2", "a,b=c:"]:
        with pytest.raises(ValueError):
            parse_prompt(bad)


def test_countdown_reward_values_and_picklable():
    prompt = format_prompt(P)
    assert countdown_reward(prompt, "(3+5)*2") == 1.0
    assert countdown_reward(prompt, "3+5*2") == 0.0
    assert countdown_reward(prompt, "3+5*2", format_reward=0.1) == 0.1
    assert countdown_reward(prompt, "3+5*", format_reward=0.1) == 0.0
    assert countdown_reward(prompt, "4+6", use_all=False) == 0.0
    assert countdown_reward("", "(3+5)*2", P) == 1.0
    assert pickle.loads(pickle.dumps(countdown_reward)) is countdown_reward
