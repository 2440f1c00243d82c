"""The Countdown lab task: seeded problems, an exhaustive solver and a whitelist verifier.

Expressions (parsing, evaluation, canonical form) are :mod:`lit_entropy.tasks.countdown_expr`.

A problem is a few numbers and a target; an answer is an arithmetic expression over the numbers
(``+ - * /`` and parentheses) whose exact rational value is the target. The solver and the verifier
share one set of rules:

* exact rational arithmetic (``fractions.Fraction``); intermediate values may be any rational,
  so ``(3/2)*4`` is a valid way to make 6; division by zero makes an expression invalid;
* ``use_all=True``: every given number is used exactly once; ``use_all=False``: a sub-multiset
  of at least two of the given numbers is used, each at most once;
* literals are non-negative integers written without leading zeros; there is no unary minus.

The verifier never evaluates text as Python: it tokenizes and parses it by hand.
"""

from __future__ import annotations

import random
import re
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from fractions import Fraction
from functools import lru_cache
from itertools import islice

from lit_entropy.rewards.runner import trusted_reward
from lit_entropy.tasks.countdown_expr import (
    _ATOM_PREC,
    _PREC,
    MAX_LITERAL_DIGITS,
    _join,
    evaluate,
    numbers_used,
    parse_expression,
)

COUNTDOWN_ALPHABET = "0123456789+-*/(),=:"
"""Every character that `format_prompt` and `solve` can produce."""

_PROMPT_RE = re.compile(r"([0-9]{1,6}(?:,[0-9]{1,6})+)=([0-9]{1,6}):")


@dataclass(frozen=True)
class CountdownProblem:
    numbers: tuple[int, ...]
    target: int


@dataclass
class CountdownConfig:
    num_numbers: int = 3
    """How many numbers each problem gives (2..6)."""
    min_number: int = 1
    """Smallest number that can be drawn (>= 1)."""
    max_number: int = 9
    """Largest number that can be drawn (>= min_number)."""
    max_target: int = 99
    """Targets lie in [1, max_target]."""
    use_all: bool = True
    """Each number must be used exactly once; if False, each at most once and at least two in all."""
    min_solutions: int = 1
    """Reject problems with fewer distinct solutions (values > 1 run the solver: slow for 6 numbers)."""

    def __post_init__(self) -> None:
        limit = 10**MAX_LITERAL_DIGITS - 1
        if not 2 <= self.num_numbers <= 6:
            raise ValueError(f"num_numbers must be in 2..6, got {self.num_numbers}")
        if self.min_number < 1:
            raise ValueError(f"min_number must be >= 1, got {self.min_number}")
        if not self.min_number <= self.max_number <= limit:
            raise ValueError(f"max_number must be in [min_number={self.min_number}, {limit}], got {self.max_number}")
        if not 1 <= self.max_target <= limit:
            raise ValueError(f"max_target must be in [1, {limit}], got {self.max_target}")
        if not isinstance(self.use_all, bool):
            raise ValueError(f"use_all must be a bool, got {self.use_all!r}")
        if self.min_solutions < 1:
            raise ValueError(f"min_solutions must be >= 1, got {self.min_solutions}")


# --------------------------------------------------------------------------- verifier


def _uses_numbers(used: list[int], given: tuple[int, ...], use_all: bool) -> bool:
    used_c, given_c = Counter(used), Counter(given)
    if use_all:
        return used_c == given_c
    return len(used) >= 2 and all(count <= given_c[k] for k, count in used_c.items())


def verify(completion: str, problem: CountdownProblem, use_all: bool = True) -> bool:
    """True iff `completion` (the expression only) is a correct answer to `problem`. Never raises."""
    try:
        node = parse_expression(completion)
        if node is None or not _uses_numbers(numbers_used(node), tuple(problem.numbers), use_all):
            return False
        value = evaluate(node)
        return value is not None and value == problem.target
    except Exception:  # the verifier must never take a training run down
        return False


# --------------------------------------------------------------------------- solver

_Entry = tuple[Fraction | int, str, int]  # value, canonical text, precedence of the top operator


def _div(a: Fraction | int, b: Fraction | int) -> Fraction | int:
    if isinstance(a, int) and isinstance(b, int) and a % b == 0:
        return a // b  # keep plain ints while exact: much faster than Fraction
    return Fraction(a) / b


def _combine(a: _Entry, b: _Entry, out: dict[str, _Entry], target: int | None) -> None:
    """Add every canonical expression `a op b` / `b op a` to `out` (only those equal to `target`)."""
    if a[1] > b[1]:
        a, b = b, a
    candidates = [("+", a, b, a[0] + b[0]), ("*", a, b, a[0] * b[0]),
                  ("-", a, b, a[0] - b[0]), ("-", b, a, b[0] - a[0])]
    if b[0] != 0:
        candidates.append(("/", a, b, _div(a[0], b[0])))
    if a[0] != 0:
        candidates.append(("/", b, a, _div(b[0], a[0])))
    for op, left, right, value in candidates:
        if target is None or value == target:
            text = _join(op, (left[1], left[2]), (right[1], right[2]))
            out[text] = (value, text, _PREC[op])


def _table(numbers: tuple[int, ...], memo: dict, target: int | None = None) -> list[_Entry]:
    """All canonical expressions using exactly the (sorted) multiset `numbers`."""
    if target is None and numbers in memo:
        return memo[numbers]
    if len(numbers) == 1:
        entries = [(numbers[0], str(numbers[0]), _ATOM_PREC)]
        return entries if target is None or numbers[0] == target else []
    m = len(numbers)
    splits = set()
    for mask in range(1, 1 << m, 2):  # bit 0 always on the left: each unordered split once
        if mask == (1 << m) - 1:
            continue
        left = tuple(x for i, x in enumerate(numbers) if mask >> i & 1)
        right = tuple(x for i, x in enumerate(numbers) if not mask >> i & 1)
        splits.add((min(left, right), max(left, right)))
    out: dict[str, _Entry] = {}
    for left, right in sorted(splits):
        right_table = _table(right, memo)
        for a in _table(left, memo):
            for b in right_table:
                _combine(a, b, out, target)
    entries = list(out.values())
    if target is None:
        memo[numbers] = entries
    return entries


@lru_cache(maxsize=4096)
def _solve_sorted(numbers: tuple[int, ...], target: int, use_all: bool) -> tuple[str, ...]:
    memo: dict = {}
    found = {text for _, text, _ in _table(numbers, memo, target)}
    if not use_all:
        for size in range(2, len(numbers)):
            for mask in range(1 << len(numbers)):
                if bin(mask).count("1") == size:
                    sub = tuple(x for i, x in enumerate(numbers) if mask >> i & 1)
                    found.update(text for value, text, _ in _table(sub, memo) if value == target)
    return tuple(sorted(found))


def solve(problem: CountdownProblem, use_all: bool = True, max_solutions: int | None = None) -> list[str]:
    """All distinct (canonical, see `canonical_form`) solutions, sorted; exhaustive search."""
    solutions = list(_solve_sorted(tuple(sorted(problem.numbers)), problem.target, use_all))
    return solutions if max_solutions is None else solutions[:max_solutions]


def count_solutions(problem: CountdownProblem, use_all: bool = True) -> int:
    return len(_solve_sorted(tuple(sorted(problem.numbers)), problem.target, use_all))


def random_solution(problem: CountdownProblem, rng: random.Random, use_all: bool = True) -> str | None:
    """A uniformly random distinct solution (for supervised warm-start data); None if unsolvable."""
    solutions = _solve_sorted(tuple(sorted(problem.numbers)), problem.target, use_all)
    return rng.choice(solutions) if solutions else None


# --------------------------------------------------------------------------- generator

_MAX_ATTEMPTS = 100_000


def _random_value(numbers: tuple[int, ...], rng: random.Random, use_all: bool) -> Fraction | None:
    """Value of a random expression tree over all numbers (or a random subset of >= 2 of them)."""
    values = [Fraction(x) for x in numbers]
    if not use_all:
        values = rng.sample(values, rng.randint(2, len(values)))
    while len(values) > 1:
        i, j = rng.sample(range(len(values)), 2)
        a, b = values[i], values[j]
        op = rng.choice("+-*/")
        if op == "/" and b == 0:
            return None
        value = a + b if op == "+" else a - b if op == "-" else a * b if op == "*" else a / b
        values = [v for k, v in enumerate(values) if k not in (i, j)] + [value]
    return values[0]


def problem_stream(seed: int, config: CountdownConfig) -> Iterator[CountdownProblem]:
    """Infinite deterministic stream of problems; `generate_problems` takes its first n."""
    rng = random.Random(seed)
    while True:
        for _ in range(_MAX_ATTEMPTS):
            numbers = tuple(rng.randint(config.min_number, config.max_number) for _ in range(config.num_numbers))
            value = _random_value(numbers, rng, config.use_all)
            if value is None or value.denominator != 1 or not 1 <= value <= config.max_target:
                continue
            problem = CountdownProblem(numbers, int(value))
            if not config.use_all and problem.target in numbers:
                continue
            if config.min_solutions > 1 and count_solutions(problem, config.use_all) < config.min_solutions:
                continue
            yield problem
            break
        else:
            raise RuntimeError(f"no valid Countdown problem in {_MAX_ATTEMPTS} attempts; loosen {config}")


def generate_problems(n: int, seed: int, config: CountdownConfig) -> list[CountdownProblem]:
    """`n` problems, deterministic in (`seed`, `config`). The target is always reachable."""
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    return list(islice(problem_stream(seed, config), n))


# --------------------------------------------------------------------------- prompts and reward


def format_prompt(problem: CountdownProblem) -> str:
    """E.g. ``"3,5,2=16:"``; the model's completion is the expression, then EOS."""
    return ",".join(str(x) for x in problem.numbers) + f"={problem.target}:"


def parse_prompt(text: str) -> CountdownProblem:
    """Inverse of `format_prompt` (surrounding whitespace ignored); ValueError if malformed."""
    match = _PROMPT_RE.fullmatch(text.strip()) if isinstance(text, str) else None
    if match is None:
        raise ValueError(f"not a Countdown prompt: {str(text)[:80]!r}")
    return CountdownProblem(tuple(int(x) for x in match.group(1).split(",")), int(match.group(2)))


@trusted_reward  # own parser (no eval), bounded input length and depth
def countdown_reward(
    prompt: str,
    completion: str,
    reference: object = None,
    *,
    use_all: bool = True,
    format_reward: float = 0.0,
) -> float:
    """1.0 for a correct answer, else `format_reward` for a well-formed expression, else 0.0.

    The problem comes from `reference` when it is a `CountdownProblem`, otherwise from the prompt;
    a malformed prompt raises ValueError (a pipeline bug, counted as an error by the reward runner).
    """
    problem = reference if isinstance(reference, CountdownProblem) else parse_prompt(prompt)
    if verify(completion, problem, use_all=use_all):
        return 1.0
    return float(format_reward) if parse_expression(completion) is not None else 0.0
