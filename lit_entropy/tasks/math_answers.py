"""Final-answer extraction and a math-verify reward for math word problems (GSM8K, MATH, AIME, AMC).

A completion's answer is the content of its last ``\\boxed{...}`` (or ``\\fbox{...}``), else what follows
its last ``####`` (GSM8K style), else nothing. `math_reward` asks math-verify whether that answer equals
the reference (symbolically and numerically: ``\\frac{1}{2}`` = ``0.5``, ``\\left(3, \\frac{\\pi}{2}\\right)``
= ``(3,\\pi/2)``). Nothing is ever evaluated as Python.

math-verify bounds its parsing and comparison with ``signal.alarm``, which only works in a process's
main thread; `math_reward` turns those time-outs off elsewhere (the `RewardRunner`'s per-call timeout
still applies in process mode, where every call runs in a worker's main thread). When math-verify's
own limit (``verifier_timeout_s``) hits, `math_reward` raises `RewardTimeout`, so the call is counted
as a timeout in ``rollout/reward_errors`` instead of passing for a wrong answer.
"""

from __future__ import annotations

import logging
import math
import re
import threading
from functools import lru_cache
from typing import Any

from lit_entropy.rewards.runner import RewardTimeout

__all__ = ["extract_answer", "extract_boxed", "extract_gsm8k", "math_reward", "normalize_reference"]

MAX_ANSWER_CHARS = 1000
"""Longer extracted answers score 0 without being parsed (a runaway box is not an answer)."""

_BOX_RE = re.compile(r"\\(?:boxed|fbox)(?![A-Za-z])")

# math-verify logs a warning whenever parsing times out or the timeout is disabled; these are expected.
logging.getLogger("math_verify").setLevel(logging.ERROR)


def _balanced(text: str, start: int) -> str | None:
    """Content of the brace group opening at ``text[start] == '{'``; None if it never closes."""
    depth = 0
    i = start
    while i < len(text):
        ch = text[i]
        if ch == "\\" and i + 1 < len(text) and text[i + 1] in "{}":
            i += 2  # an escaped brace (\{ or \}) is content, not structure
            continue
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth == 0:
                return text[start + 1 : i]
        i += 1
    return None


def extract_boxed(text: str) -> str | None:
    """Content of the last complete ``\\boxed{...}`` / ``\\fbox{...}`` (balanced braces), stripped.

    ``\\boxed 5`` (no braces, as in some MATH solutions) gives ``5``. A box that never closes (a
    truncated completion) is skipped in favour of an earlier complete one. None if there is none.
    """
    if not isinstance(text, str):
        return None
    for match in reversed(list(_BOX_RE.finditer(text))):
        rest = match.end()
        while rest < len(text) and text[rest] in " \t":
            rest += 1
        if rest < len(text) and text[rest] == "{":
            inner = _balanced(text, rest)
            if inner is not None:
                return inner.strip()
        elif rest > match.end() and rest < len(text):
            # `\boxed 5`: the token up to whitespace or a closing `$`
            token = re.match(r"[^\s$]+", text[rest:])
            if token:
                return token.group(0)
    return None


def extract_gsm8k(text: str) -> str | None:
    """What follows the last ``####`` on its line, commas removed (``#### 1,000`` -> ``1000``); else None."""
    if not isinstance(text, str) or "####" not in text:
        return None
    tail = text.rsplit("####", 1)[1].strip()
    tail = tail.split("\n", 1)[0].replace(",", "").strip()
    tail = tail.rstrip(".").strip()
    return tail or None


def extract_answer(text: str) -> str | None:
    """The final answer of a completion: the last box, else the GSM8K ``####`` line, else None."""
    boxed = extract_boxed(text)
    return boxed if boxed is not None else extract_gsm8k(text)


def normalize_reference(reference: Any) -> str | None:
    """A gold answer as text: ints as is, integral floats without ``.0`` (27.0 -> "27"), strings stripped
    (a full GSM8K solution becomes the part after ``####``). None for anything else."""
    if isinstance(reference, bool) or reference is None:
        return None
    if isinstance(reference, int):
        return str(reference)
    if isinstance(reference, float):
        if not math.isfinite(reference):
            return None
        return str(int(reference)) if reference.is_integer() else repr(reference)
    if isinstance(reference, str):
        text = reference.strip()
        if "####" in text:
            return extract_gsm8k(text)
        return text or None
    return None


def _timeout(seconds: int = 5) -> int | None:
    # signal.alarm only works in the main thread; elsewhere run without math-verify's own timeout.
    return seconds if threading.current_thread() is threading.main_thread() else None


def _parse(answer: str, timeout: int | None) -> list:
    from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse

    return parse(
        "\\boxed{" + answer + "}",
        extraction_config=[LatexExtractionConfig(boxed_match_priority=0), ExprExtractionConfig()],
        parsing_timeout=timeout,
        raise_on_error=True,  # a timeout must reach math_reward (unparsable text raises too: scored 0)
    )


@lru_cache(maxsize=4096)
def _parse_gold(answer: str, timeout: int | None) -> tuple:
    return tuple(_parse(answer, timeout))


def math_reward(
    prompt: str, completion: str, reference: Any, verifier_timeout_s: int = 5, **kwargs: Any
) -> float:
    """1.0 if the completion's final answer (`extract_answer`) equals ``reference`` per math-verify, else 0.0.

    ``reference`` may be a string (LaTeX or plain), an int or a float. Never raises on malformed input;
    raises `RewardTimeout` when math-verify's own ``verifier_timeout_s`` runs out. Extra keyword
    arguments are accepted and ignored (reward kwargs of other sources).
    """
    del prompt, kwargs
    from math_verify import verify
    from math_verify.errors import TimeoutException  # a BaseException, not an Exception

    try:

        gold_text = normalize_reference(reference)
        answer = extract_answer(completion)
        if gold_text is None or answer is None or len(answer) > MAX_ANSWER_CHARS:
            return 0.0
        timeout = _timeout(verifier_timeout_s)
        gold = list(_parse_gold(gold_text, timeout))
        if not gold:
            return 0.0
        pred = _parse(answer, timeout)
        if not pred:
            return 0.0
        return 1.0 if verify(gold, pred, timeout_seconds=timeout, raise_on_error=True) else 0.0
    except TimeoutException as err:
        raise RewardTimeout(f"math-verify gave up after {verifier_timeout_s}s") from err
    except Exception:
        return 0.0
