"""Countdown answers as expression trees: a hand-written tokenizer and parser (text is never evaluated as
Python), exact rational evaluation, the numbers an expression uses, and a canonical text form.

Literals are non-negative integers without leading zeros; there is no unary minus; ``×`` and ``÷`` are
accepted for ``*`` and ``/``. Division by zero makes an expression invalid (its value is None).
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction

MAX_EXPR_CHARS = 200
"""Longest expression text (after stripping surrounding whitespace) the parser looks at."""
MAX_LITERAL_DIGITS = 6
"""Longest integer literal the parser accepts."""
MAX_DEPTH = 32
"""Deepest parenthesis nesting the parser accepts (checked before any recursion)."""

_OP_ALIASES = {"+": "+", "-": "-", "*": "*", "/": "/", "\u00d7": "*", "\u00f7": "/"}
_PREC = {"+": 1, "-": 1, "*": 2, "/": 2}
_ATOM_PREC = 3

# --------------------------------------------------------------------------- expression trees


@dataclass(frozen=True)
class Num:
    value: int


@dataclass(frozen=True)
class BinOp:
    op: str
    left: Node
    right: Node


Node = Num | BinOp


def _tokenize(text: str) -> list[str] | None:
    """Split whitelisted text into tokens; None on any character or limit outside the whitelist."""
    tokens: list[str] = []
    depth = 0
    i, n = 0, len(text)
    while i < n:
        ch = text[i]
        if "0" <= ch <= "9":
            j = i
            while j < n and "0" <= text[j] <= "9":
                j += 1
            literal = text[i:j]
            if len(literal) > MAX_LITERAL_DIGITS or (len(literal) > 1 and literal[0] == "0"):
                return None
            tokens.append(literal)
            i = j
            continue
        if ch in _OP_ALIASES:
            tokens.append(_OP_ALIASES[ch])
        elif ch == "(":
            depth += 1
            if depth > MAX_DEPTH:
                return None
            tokens.append(ch)
        elif ch == ")":
            depth -= 1
            if depth < 0:
                return None
            tokens.append(ch)
        elif ch != " ":
            return None
        i += 1
    return tokens if depth == 0 else None


class _Parser:
    """Recursive descent: expr := term (('+'|'-') term)*; term := factor (('*'|'/') factor)*;
    factor := INT | '(' expr ')'. Recursion depth is bounded by MAX_DEPTH via `_tokenize`."""

    def __init__(self, tokens: list[str]) -> None:
        self.tokens = tokens
        self.pos = 0

    def peek(self) -> str | None:
        return self.tokens[self.pos] if self.pos < len(self.tokens) else None

    def expr(self) -> Node | None:
        return self._chain(self.term, "+-")

    def term(self) -> Node | None:
        return self._chain(self.factor, "*/")

    def _chain(self, operand, ops: str) -> Node | None:
        node = operand()
        while node is not None and (tok := self.peek()) is not None and tok in ops:
            self.pos += 1
            right = operand()
            node = None if right is None else BinOp(tok, node, right)
        return node

    def factor(self) -> Node | None:
        tok = self.peek()
        if tok is None:
            return None
        self.pos += 1
        if tok.isdigit():
            return Num(int(tok))
        if tok == "(":
            node = self.expr()
            if node is None or self.peek() != ")":
                return None
            self.pos += 1
            return node
        return None


def parse_expression(text: str) -> Node | None:
    """Parse a whitelisted arithmetic expression; None if `text` is not one (never raises)."""
    if not isinstance(text, str):
        return None
    text = text.strip()
    if not text or len(text) > MAX_EXPR_CHARS:
        return None
    tokens = _tokenize(text)
    if not tokens:
        return None
    parser = _Parser(tokens)
    node = parser.expr()
    return node if node is not None and parser.pos == len(tokens) else None


def evaluate(node: Node) -> Fraction | None:
    """Exact value of the tree; None if it divides by zero."""
    if isinstance(node, Num):
        return Fraction(node.value)
    left, right = evaluate(node.left), evaluate(node.right)
    if left is None or right is None:
        return None
    if node.op == "+":
        return left + right
    if node.op == "-":
        return left - right
    if node.op == "*":
        return left * right
    return None if right == 0 else left / right


def numbers_used(node: Node) -> list[int]:
    """The literals of the tree, left to right."""
    out: list[int] = []
    stack: list[Node] = [node]
    while stack:
        cur = stack.pop()
        if isinstance(cur, Num):
            out.append(cur.value)
        else:
            stack.extend((cur.right, cur.left))
    return out


def _join(op: str, left: tuple[str, int], right: tuple[str, int]) -> str:
    """Render `left op right` with just enough parentheses to parse back to the same tree."""
    prec = _PREC[op]
    ls = left[0] if left[1] >= prec else f"({left[0]})"
    rs = right[0] if right[1] > prec else f"({right[0]})"
    return ls + op + rs


def _canonical(node: Node) -> tuple[str, int]:
    if isinstance(node, Num):
        return str(node.value), _ATOM_PREC
    left, right = _canonical(node.left), _canonical(node.right)
    if node.op in "+*" and left[0] > right[0]:
        left, right = right, left
    return _join(node.op, left, right), _PREC[node.op]


def canonical_form(expr: str | Node) -> str | None:
    """Canonical ASCII text of an expression: operands of + and * sorted, minimal parentheses.

    Two answers that differ only by commutative swaps share a canonical form; `solve` returns
    canonical forms. None if `expr` does not parse.
    """
    node = parse_expression(expr) if isinstance(expr, str) else expr
    return None if node is None else _canonical(node)[0]
