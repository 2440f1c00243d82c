"""Generated arithmetic: seeded sums and differences, as bare expressions or short word problems.

The task for small instruct models (SmolLM2-135M-Instruct has signal on it where GSM8K and MATH give
none; docs/results.md, "A real LM"). Each problem is a chain of ``num_operands`` integers drawn from
``[min_operand, max_operand]`` joined by operators from ``ops``; the answer is its exact integer value
(left to right, ``*`` before ``+``/``-``). Difficulty knobs: the number of operands, the operand range, the
operators and whether negative results are allowed; ``style=word`` wraps two-operand problems in a
one-sentence story.

The verifier never evaluates the completion: it takes the last ``\\boxed{...}`` if there is one, else the
last number in the text, parses it as an integer by hand (``1,234``, ``-7``, ``12.0`` accepted) and compares
it with the reference. Inputs are length-bounded, so a hostile completion costs microseconds.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass

from lit_entropy.rewards.runner import trusted_reward

OPS = ("+", "-", "*")
STYLES = ("expression", "word")
MAX_COMPLETION_CHARS = 20_000
"""Completions are cut to their last this-many characters before parsing (the answer sits at the end)."""
MAX_ANSWER_DIGITS = 18

_BOXED = re.compile(r"\\boxed\s*\{")
_NUMBER = re.compile(r"(?<![\w.])-?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?!\w|,\d|\.\d)")
_BOXED_NUMBER = re.compile(r"\s*\$?\s*(-?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?)\s*\$?\s*\.?\s*")

_WORDS = {
    "+": ["{name} has {a} {thing}s and gets {b} more. How many {thing}s does {name} have now?",
          "There are {a} {thing}s in a box and {b} more are put in. How many {thing}s are in the box?"],
    "-": ["{name} has {a} {thing}s and gives away {b}. How many {thing}s does {name} have left?",
          "There are {a} {thing}s in a box and {b} are taken out. How many {thing}s are left in the box?"],
    "*": ["{name} has {a} bags with {b} {thing}s in each bag. How many {thing}s does {name} have?",
          "There are {a} rows of {thing}s with {b} {thing}s in each row. How many {thing}s are there?"],
}
_NAMES = ("Tom", "Anna", "Sam", "Lily", "Ben", "Maya", "Leo", "Zoe")
_THINGS = ("apple", "marble", "book", "coin", "stamp", "pencil", "shell", "card")


@dataclass(frozen=True)
class ArithmeticProblem:
    operands: tuple[int, ...]
    ops: tuple[str, ...]
    answer: int
    text: str
    """The question as the prompt states it (before the answer instruction)."""


@dataclass
class ArithmeticConfig:
    num_operands: int = 2
    """Numbers per problem (2..6); ``style=word`` needs 2."""
    min_operand: int = 1
    """Smallest operand (>= 0)."""
    max_operand: int = 20
    """Largest operand (<= 10**6)."""
    ops: str = "+"
    """Operators to draw from, a string over ``+-*``."""
    allow_negative: bool = False
    """False: problems whose answer (or any partial result) is negative are redrawn."""
    style: str = "expression"
    """``expression``: "What is 12 + 7?"; ``word``: a one-sentence story."""

    def __post_init__(self) -> None:
        if not 2 <= self.num_operands <= 6:
            raise ValueError(f"num_operands must be in 2..6, got {self.num_operands}")
        if not 0 <= self.min_operand <= self.max_operand <= 10**6:
            raise ValueError(f"need 0 <= min_operand <= max_operand <= 10**6, got {self.min_operand}, {self.max_operand}")
        if not self.ops or any(op not in OPS for op in self.ops):
            raise ValueError(f"ops must be a non-empty string over {''.join(OPS)!r}, got {self.ops!r}")
        if self.style not in STYLES:
            raise ValueError(f"style must be one of {STYLES}, got {self.style!r}")
        if self.style == "word" and self.num_operands != 2:
            raise ValueError("style='word' needs num_operands=2")
        if not isinstance(self.allow_negative, bool):
            raise ValueError(f"allow_negative must be a bool, got {self.allow_negative!r}")


def value_of(operands: tuple[int, ...], ops: tuple[str, ...]) -> tuple[int, int]:
    """The exact value of ``a0 op0 a1 op1 ...`` with ``*`` binding tighter, and the smallest running
    value of the sum of terms (negative when a partial result goes below zero)."""
    terms: list[int] = [operands[0]]
    signs: list[int] = [1]
    for op, b in zip(ops, operands[1:], strict=True):
        if op == "*":
            terms[-1] *= b
        else:
            terms.append(b)
            signs.append(1 if op == "+" else -1)
    total, lowest = 0, 0
    for s, t in zip(signs, terms, strict=True):
        total += s * t
        lowest = min(lowest, total)
    return total, lowest


def _draw(rng: random.Random, cfg: ArithmeticConfig) -> ArithmeticProblem | None:
    operands = tuple(rng.randint(cfg.min_operand, cfg.max_operand) for _ in range(cfg.num_operands))
    ops = tuple(rng.choice(cfg.ops) for _ in range(cfg.num_operands - 1))
    answer, lowest = value_of(operands, ops)
    if not cfg.allow_negative and lowest < 0:
        return None
    if cfg.style == "word":
        template = rng.choice(_WORDS[ops[0]])
        text = template.format(name=rng.choice(_NAMES), thing=rng.choice(_THINGS), a=operands[0], b=operands[1])
    else:
        expr = " ".join(f"{a} {op}" for a, op in zip(operands[:-1], ops, strict=True)) + f" {operands[-1]}"
        text = f"What is {expr}?"
    return ArithmeticProblem(operands, ops, answer, text)


def generate_problems(n: int, seed: int, config: ArithmeticConfig) -> list[ArithmeticProblem]:
    """``n`` problems, a pure function of ``seed`` and ``config``."""
    rng = random.Random(f"arithmetic:{seed}")
    out: list[ArithmeticProblem] = []
    tries = 0
    while len(out) < n:
        tries += 1
        if tries > 1000 * (n + 10):
            raise RuntimeError(f"cannot draw {n} problems from {config} (too few non-negative ones)")
        problem = _draw(rng, config)
        if problem is not None:
            out.append(problem)
    return out


# --------------------------------------------------------------------------- answer extraction


def _last_boxed(text: str) -> str | None:
    """The content of the last ``\\boxed{...}`` when its braces balance, else None (one linear scan)."""
    starts = [m.end() for m in _BOXED.finditer(text)]
    if not starts:
        return None
    depth = 1
    for i in range(starts[-1], len(text)):
        if text[i] == "{":
            depth += 1
        elif text[i] == "}":
            depth -= 1
            if depth == 0:
                return text[starts[-1]:i]
    return None


def _to_int(token: str) -> int | None:
    token = token.replace(",", "")
    whole, _, frac = token.partition(".")
    if frac and set(frac) != {"0"}:
        return None
    digits = whole.lstrip("-")
    if not digits.isdigit() or len(digits) > MAX_ANSWER_DIGITS:
        return None
    return int(whole)


def extract_answer(completion: str) -> int | None:
    """The integer a completion answers: the last ``\\boxed{}`` if present (its last number), else the last
    number in the text; None when there is none. Never evaluates anything."""
    if not isinstance(completion, str):
        return None
    text = completion[-MAX_COMPLETION_CHARS:]
    boxed = _last_boxed(text)
    if boxed is not None:  # a boxed answer must be one number, nothing else
        match = _BOXED_NUMBER.fullmatch(boxed[:100])
        return _to_int(match.group(1)) if match and len(boxed) <= 100 else None
    numbers = _NUMBER.findall(text)
    return _to_int(numbers[-1]) if numbers else None


# --------------------------------------------------------------------------- prompts and reward

ANSWER_FORMATS = {
    "boxed": "Put the final answer in \\boxed{}.",
    "number": "Answer with the final number only.",
    "none": "",
}


def format_prompt(problem: ArithmeticProblem, answer_format: str = "boxed") -> str:
    if answer_format not in ANSWER_FORMATS:
        raise ValueError(f"answer_format must be one of {sorted(ANSWER_FORMATS)}, got {answer_format!r}")
    instruction = ANSWER_FORMATS[answer_format]
    return f"{problem.text}\n{instruction}" if instruction else problem.text


@trusted_reward  # own bounded parser, no eval
def arithmetic_reward(prompt: str, completion: str, reference: object = None, *, require_boxed: bool = False) -> float:
    """1.0 when the completion's answer equals ``reference`` (an int), else 0.0. ``require_boxed``: only a
    ``\\boxed{}`` answer counts."""
    if isinstance(reference, bool) or not isinstance(reference, int):
        raise ValueError(f"arithmetic_reward needs the integer answer as reference, got {reference!r}")
    if require_boxed and (not isinstance(completion, str) or _last_boxed(completion[-MAX_COMPLETION_CHARS:]) is None):
        return 0.0
    return 1.0 if extract_answer(completion) == reference else 0.0
