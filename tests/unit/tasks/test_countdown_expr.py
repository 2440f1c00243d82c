"""Countdown's expressions (lit_entropy.tasks.countdown_expr): the parser on hostile input and its nesting limit,
the tree helpers, the canonical form the solver dedups by. The verifier and the solver: test_countdown.py."""

from __future__ import annotations

from fractions import Fraction

from lit_entropy.tasks import countdown_expr
from lit_entropy.tasks.countdown import CountdownProblem, count_solutions, solve, verify
from lit_entropy.tasks.countdown_expr import (
    MAX_DEPTH,
    BinOp,
    Num,
    canonical_form,
    evaluate,
    numbers_used,
    parse_expression,
)
from tests.unit.tasks.test_countdown import P


def test_parse_expression_hostile_inputs_return_none():
    for text in (None, "", "9" * 10000, "1e5", "2**10", "0x10", "-3+5", "(" * 10000 + "1" + ")" * 10000, "a"):
        assert parse_expression(text) is None
    assert parse_expression("3/(5-5)") is not None  # syntactically fine; only evaluation fails
    assert evaluate(parse_expression("3/(5-5)")) is None
    depth_ok = "(" * MAX_DEPTH + "1" + ")" * MAX_DEPTH
    assert parse_expression(depth_ok) == Num(1)
    assert parse_expression("(" + depth_ok + ")") is None


def test_depth_limit_holds_without_length_limit(monkeypatch):
    # The nesting limit alone must stop runaway recursion, whatever the length limit is.
    monkeypatch.setattr(countdown_expr, "MAX_EXPR_CHARS", 10**7)
    deep = "(" * 100_000 + "1" + ")" * 100_000
    assert parse_expression(deep) is None
    assert parse_expression("1" + "+1" * 5000) is not None  # long flat chains are iterative
    assert verify(deep, P) is False


def test_tree_helpers():
    node = parse_expression("(3+5)*2-8/4")
    assert node == BinOp("-", BinOp("*", BinOp("+", Num(3), Num(5)), Num(2)), BinOp("/", Num(8), Num(4)))
    assert numbers_used(node) == [3, 5, 2, 8, 4]
    assert evaluate(node) == Fraction(14)
    assert evaluate(parse_expression("1-2-3")) == -4  # left associative
    assert evaluate(parse_expression("8/4/2")) == 1


def test_canonical_form_dedups_commutative_swaps():
    assert canonical_form("3+2") == canonical_form("2+3") == "2+3"
    assert canonical_form("(5+3)*2") == canonical_form("2*(3+5)")
    assert canonical_form("5-3") != canonical_form("3-5")
    assert canonical_form("1-(2-3)") == "1-(2-3)" and canonical_form("1-2-3") == "1-2-3"
    assert canonical_form("garbage") is None
    assert solve(CountdownProblem((2, 3), 5)) == ["2+3"]
    assert count_solutions(CountdownProblem((2, 3), 5)) == 1
    assert count_solutions(CountdownProblem((2, 2), 4)) == 2  # 2+2 and 2*2
    assert count_solutions(CountdownProblem((2, 3, 4), 9)) == 3  # 2+(3+4), 2+3+4, 2+4+3
