"""Generated arithmetic: seeded sums and differences, as expressions, stories and spoken steps, with a
held-out split by rule and a transfer split.

The task for small instruct models (SmolLM2-135M-Instruct has signal on it where GSM8K and MATH give
none; docs/results.md, "A real LM"). Each problem is a chain of ``num_operands`` integers drawn from
``[min_operand, max_operand]`` joined by operators from ``ops``; the answer is its exact integer value
(left to right, ``*`` before ``+``/``-``). Difficulty knobs: the number of operands, the operand range, the
operators and whether negative results are allowed; ``style`` words it (:mod:`lit_entropy.tasks.arithmetic_text`).

**Splits.** A problem's side is a hash of its canonical form (the sorted terms added and subtracted), so
``a + b`` and ``b + a``, or a story and its expression, share a side. ``held_out_fraction`` of the space is held
out: the training stream rejects those problems as it draws them, so it can never emit one, and the held-out
stream draws only them. ``tuning_share`` of the held-out side (by a second, independent hash) is the ``tuning``
split instead, for calibration and tuning alone: disjoint from the evaluation's ``held_out`` and from training by
the same construction. The ``transfer`` split has more operands than training ever uses. The ``retention`` split
(``retention: true``) holds kinds of problem the task never trains (products and exact quotients of small numbers,
several wordings, digits or words): what training on sums does to what the model could already do.

The verifier never evaluates the completion: it takes the last ``\\boxed{...}`` if there is one, else the
last number in the text, parses it as an integer by hand (``1,234``, ``-7``, ``12.0`` accepted) and compares
it with the reference. Inputs are length-bounded, so a hostile completion costs microseconds.
"""

from __future__ import annotations

import hashlib
import itertools
import random
import re
from dataclasses import dataclass, field

from lit_entropy.rewards.runner import trusted_reward
from lit_entropy.tasks.arithmetic_text import PHRASINGS, RETENTION_KINDS, STYLES, phrase, retention_text

OPS = ("+", "-", "*")
SPLITS = ("train", "held_out", "tuning", "transfer", "retention")
MAX_COMPLETION_CHARS = 20_000
"""Completions are cut to their last this-many characters before parsing (the answer sits at the end)."""
MAX_ANSWER_DIGITS = 18
SPLIT_SALT = "lit-entropy-arithmetic-split-v1"
"""Part of the split's hash: fixed, so every run and every seed puts a problem on the same side."""
TUNING_SALT = "lit-entropy-arithmetic-tuning-v1"
"""The second hash, which cuts the held-out side into ``tuning`` and ``held_out`` independently of the first."""

_BOXED = re.compile(r"\\boxed\s*\{")
_NUMBER = re.compile(r"(?<![\w.])-?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?!\w|,\d|\.\d)")
_BOXED_NUMBER = re.compile(r"\s*\$?\s*(-?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?)\s*\$?\s*\.?\s*")
_BARE = re.compile(r"\s*(?:\\boxed\s*\{\s*-?[\d,]+(?:\.0+)?\s*\}|\$?-?[\d,]+(?:\.0+)?\$?)\s*\.?\s*")


@dataclass(frozen=True)
class ArithmeticProblem:
    operands: tuple[int, ...]
    ops: tuple[str, ...]
    answer: int
    text: str
    """The question as the prompt states it (before the answer instruction)."""

    @property
    def canonical(self) -> str:
        """What the problem is, apart from its wording and the order of its terms: the sorted terms added and
        the sorted terms subtracted (a product term as its sorted factors). ``a + b`` and ``b + a``, or a story
        and the expression it tells, have one canonical form, so the split puts them on one side."""
        return canonical_form(self.operands, self.ops)


@dataclass
class ArithmeticConfig:
    """The default is the real-LM task (``conf/data/arithmetic.yaml``); ``conf/data/arithmetic_easy.yaml`` sets
    sums of two numbers in 1..20."""

    num_operands: int | list[int] = field(default_factory=lambda: [2, 3])
    """Numbers per problem: an int (2..6), or ``[lo, hi]`` for a count drawn uniformly per problem."""
    min_operand: int = 1
    """Smallest operand (>= 0)."""
    max_operand: int = 60
    """Largest operand (<= 10**6)."""
    ops: str = "+-"
    """Operators to draw from, a string over ``+-*``."""
    allow_negative: bool = False
    """False: problems whose answer (or any partial result) is negative are redrawn."""
    style: str | list[str] = field(default_factory=lambda: ["expression", "story", "steps"])
    """How problems are worded (:mod:`lit_entropy.tasks.arithmetic_text`): ``expression``, ``word`` (one
    sentence, two numbers), ``story`` (a story of several steps), ``steps`` (spoken instructions); a list (or a
    comma-separated string) draws one per problem."""
    phrasing: str = "varied"
    """``expression`` only: ``fixed`` ("What is …?") or ``varied`` (one of several question forms)."""
    held_out_fraction: float = 0.1
    """Share of the problem space on the held-out side of the split (by a hash of the canonical form); training
    never draws a problem from that side. 0: no split (every problem is a training problem)."""
    transfer_extra_operands: int = 1
    """The transfer split's problems have this many operands more than training's largest count."""
    tuning_share: float = 0.0
    """Share of the held-out side that is the ``tuning`` split (calibration and tuning read it, the evaluation's
    ``held_out`` never holds it); 0: no tuning split, the held-out side as before."""
    retention: bool = False
    """Evaluate the ``retention`` split too: products and exact quotients of 2..12, which training never draws
    (refused when ``ops`` has ``*``: products would then be trained)."""

    def __post_init__(self) -> None:
        counts = self.operand_counts
        if not 2 <= counts[0] <= counts[-1] <= 6:
            raise ValueError(f"num_operands must be in 2..6 (or [lo, hi] within it), got {self.num_operands}")
        if not 0 <= self.min_operand <= self.max_operand <= 10**6:
            raise ValueError(f"need 0 <= min_operand <= max_operand <= 10**6, got {self.min_operand}, {self.max_operand}")
        if not self.ops or any(op not in OPS for op in self.ops):
            raise ValueError(f"ops must be a non-empty string over {''.join(OPS)!r}, got {self.ops!r}")
        bad = [s for s in self.styles if s not in STYLES]
        if bad or not self.styles:
            raise ValueError(f"style must be one or more of {STYLES}, got {self.style!r}")
        if "word" in self.styles and counts != (2,):
            raise ValueError("style='word' needs num_operands=2")
        if {"story", "steps"} & set(self.styles) and "*" in self.ops:
            raise ValueError(f"styles 'story' and 'steps' tell sums and differences only; ops={self.ops!r} has '*'")
        if self.phrasing not in PHRASINGS:
            raise ValueError(f"phrasing must be one of {PHRASINGS}, got {self.phrasing!r}")
        if not isinstance(self.allow_negative, bool):
            raise ValueError(f"allow_negative must be a bool, got {self.allow_negative!r}")
        if not 0.0 <= self.held_out_fraction < 1.0:
            raise ValueError(f"held_out_fraction must be in [0, 1), got {self.held_out_fraction}")
        if not 1 <= self.transfer_extra_operands <= 4:
            raise ValueError(f"transfer_extra_operands must be in 1..4, got {self.transfer_extra_operands}")
        if not 0.0 <= self.tuning_share < 1.0 or (self.tuning_share > 0 and self.held_out_fraction <= 0):
            raise ValueError(f"tuning_share must be in [0, 1) and needs held_out_fraction > 0, got "
                             f"{self.tuning_share} (held_out_fraction {self.held_out_fraction})")
        if self.retention and "*" in self.ops:
            raise ValueError(f"retention: true needs training without products, but ops={self.ops!r} has '*'")

    @property
    def operand_counts(self) -> tuple[int, ...]:
        """Every operand count training draws, ascending."""
        n = self.num_operands
        if isinstance(n, int) and not isinstance(n, bool):
            return (n,)
        lo, hi = (int(x) for x in list(n))
        if lo > hi:
            raise ValueError(f"num_operands=[lo, hi] needs lo <= hi, got {list(n)}")
        return tuple(range(lo, hi + 1))

    @property
    def styles(self) -> tuple[str, ...]:
        s = self.style
        return tuple(x.strip() for x in s.split(",")) if isinstance(s, str) else tuple(str(x) for x in s)


def value_of(operands: tuple[int, ...], ops: tuple[str, ...]) -> tuple[int, int]:
    """The exact value of ``a0 op0 a1 op1 ...`` with ``*`` binding tighter, and the smallest running
    value of the sum of terms (negative when a partial result goes below zero)."""
    total, lowest = 0, 0
    for sign, term in _signed_terms(operands, ops):
        total += sign * term[0]
        lowest = min(lowest, total)
    return total, lowest


def _signed_terms(operands: tuple[int, ...], ops: tuple[str, ...]) -> list[tuple[int, tuple[int, list[int]]]]:
    """``(sign, (value, factors))`` of each term of the sum, ``*`` binding tighter."""
    terms: list[tuple[int, tuple[int, list[int]]]] = [(1, (operands[0], [operands[0]]))]
    for op, b in zip(ops, operands[1:], strict=True):
        if op not in OPS:
            raise ValueError(f"no canonical form for the operator {op!r} (a retention problem has none)")
        if op == "*":
            sign, (value, factors) = terms[-1]
            terms[-1] = (sign, (value * b, [*factors, b]))
        else:
            terms.append((1 if op == "+" else -1, (b, [b])))
    return terms


def canonical_form(operands: tuple[int, ...], ops: tuple[str, ...]) -> str:
    """See :attr:`ArithmeticProblem.canonical`: ``+12,7|-3`` sorted, e.g. ``+7,12|-3`` for 12 + 7 - 3."""
    parts: dict[int, list[str]] = {1: [], -1: []}
    for sign, (_, factors) in _signed_terms(operands, ops):
        parts[sign].append("*".join(str(f) for f in sorted(factors)))
    return "+" + ",".join(sorted(parts[1], key=_term_key)) + "|-" + ",".join(sorted(parts[-1], key=_term_key))


def _term_key(term: str) -> tuple[int, ...]:
    return tuple(int(f) for f in term.split("*"))


def _unit(salt: str, canonical: str) -> float:
    """A number in [0, 1) that only ``salt`` and ``canonical`` decide."""
    return int.from_bytes(hashlib.sha256(f"{salt}:{canonical}".encode()).digest()[:8], "big") / 2**64


def split_of(canonical: str, held_out_fraction: float, tuning_share: float = 0.0) -> str:
    """``train``, ``held_out`` or ``tuning``: a hash of the canonical form against ``held_out_fraction``, then a
    second hash of the held-out ones against ``tuning_share`` (fixed salts, so the side of a problem never depends
    on a seed, a run or the Python process; with ``tuning_share`` 0 the held-out side is as before)."""
    if held_out_fraction <= 0 or _unit(SPLIT_SALT, canonical) >= held_out_fraction:
        return "train"
    return "tuning" if tuning_share > 0 and _unit(TUNING_SALT, canonical) < tuning_share else "held_out"


def _draw(rng: random.Random, cfg: ArithmeticConfig, count: int) -> ArithmeticProblem | None:
    operands = tuple(rng.randint(cfg.min_operand, cfg.max_operand) for _ in range(count))
    ops = tuple(rng.choice(cfg.ops) for _ in range(count - 1))
    answer, lowest = value_of(operands, ops)
    if not cfg.allow_negative and lowest < 0:
        return None
    styles = cfg.styles
    style = styles[0] if len(styles) == 1 else rng.choice(styles)
    return ArithmeticProblem(operands, ops, answer, phrase(rng, style, operands, ops, cfg.phrasing))


def generate_problems(n: int, seed: int, config: ArithmeticConfig, split: str = "train") -> list[ArithmeticProblem]:
    """``n`` problems of ``split``, a pure function of ``seed``, ``config`` and ``split``.

    ``train`` and ``held_out`` draw from the configured space and keep only problems on their side of the split
    (rejection at generation: a training stream never holds a held-out problem); ``transfer`` draws problems with
    ``transfer_extra_operands`` more operands than training ever uses, same ranges and wordings."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    if split == "held_out" and config.held_out_fraction <= 0:
        raise ValueError("this task has no held-out split (held_out_fraction=0)")
    if split == "tuning" and config.tuning_share <= 0:
        raise ValueError("this task has no tuning split (tuning_share=0)")
    rng = random.Random(f"arithmetic:{seed}" if split == "train" else f"arithmetic:{split}:{seed}")
    if split == "retention":
        return [retention_problem(rng) for _ in range(n)]
    counts = config.operand_counts
    if split == "transfer":
        counts = (counts[-1] + config.transfer_extra_operands,)
    out: list[ArithmeticProblem] = []
    tries = 0
    while len(out) < n:
        tries += 1
        if tries > 1000 * (n + 10):
            raise RuntimeError(f"cannot draw {n} {split} problems from {config} (too few non-negative ones)")
        count = counts[0] if len(counts) == 1 else rng.choice(counts)
        problem = _draw(rng, config, count)
        if problem is None:
            continue
        if split != "transfer" and split_of(problem.canonical, config.held_out_fraction, config.tuning_share) != split:
            continue
        out.append(problem)
    return out


def retention_problem(rng: random.Random) -> ArithmeticProblem:
    """One problem of a kind the task never trains: ``a × b`` or ``(a·b) ÷ b`` with ``a, b`` in 2..12, worded by
    :func:`~lit_entropy.tasks.arithmetic_text.retention_text` (digits or words, several forms)."""
    kind = rng.choice(RETENTION_KINDS)
    a, b = rng.randint(2, 12), rng.randint(2, 12)
    if kind == "product":
        return ArithmeticProblem((a, b), ("*",), a * b, retention_text(rng, kind, a, b))
    return ArithmeticProblem((a * b, b), ("/",), a, retention_text(rng, kind, a * b, b))


def count_problems(config: ArithmeticConfig) -> int:
    """How many distinct problems (canonical forms) the training space of a ``+``/``-`` config holds, counted by
    enumeration (seconds for 3 operands of 90 values): the size that memorising would have to cover."""
    if "*" in config.ops:
        raise ValueError("count_problems counts sums and differences only")
    values = range(config.min_operand, config.max_operand + 1)
    total = 0
    for count in config.operand_counts:
        for k in range(1, count + 1):  # k terms added (the first is always added), count - k subtracted
            if k < count and "-" not in config.ops or k > 1 and "+" not in config.ops:
                continue
            for neg in itertools.combinations_with_replacement(values, count - k):
                for pos in itertools.combinations_with_replacement(values, k):
                    if not config.allow_negative and sum(pos) < sum(neg):
                        continue
                    canonical = canonical_form((*pos, *neg), ("+",) * (k - 1) + ("-",) * (count - k))
                    total += split_of(canonical, config.held_out_fraction) == "train"
    return total


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


def first_number(completion: str) -> int | None:
    """The first number of a completion (a lenient reading: right when the model says the answer first and
    then rambles on), None when there is none."""
    if not isinstance(completion, str):
        return None
    match = _NUMBER.search(completion[:MAX_COMPLETION_CHARS])
    return _to_int(match.group(0)) if match else None


def is_bare_answer(completion: str) -> bool:
    """Whether a completion is the answer alone: one number or one ``\\boxed{number}``, an optional full stop,
    nothing else (the format the task asks for, apart from whether the number is right)."""
    return isinstance(completion, str) and len(completion) <= 100 and _BARE.fullmatch(completion) is not None


def answer_stats(completion: str, reference: int) -> dict[str, float]:
    """Format and skill apart, for evaluation: ``format`` (a bare answer), ``first_number`` (the first number
    equals the reference)."""
    return {"format": float(is_bare_answer(completion)), "first_number": float(first_number(completion) == reference)}


# --------------------------------------------------------------------------- prompts and reward

ANSWER_FORMATS = {
    "boxed": "Put the final answer in \\boxed{}.",
    "number": "Answer with the final number only.",
    "none": "",
    "mixed": None,
}
"""The instruction after the question; ``mixed`` picks ``number`` or ``boxed`` per problem (by its text's hash,
so a problem keeps its instruction), and the verifier accepts either."""


def format_prompt(problem: ArithmeticProblem, answer_format: str = "boxed") -> str:
    if answer_format not in ANSWER_FORMATS:
        raise ValueError(f"answer_format must be one of {sorted(ANSWER_FORMATS)}, got {answer_format!r}")
    if answer_format == "mixed":
        answer_format = ("number", "boxed")[hashlib.sha256(problem.text.encode()).digest()[0] % 2]
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
