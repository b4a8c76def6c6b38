"""Derived-dim formulas: a tiny, safe arithmetic language.

Grammar (``*`` and ``/`` bind equally and associate to the left)::

    expr   := factor (("*" | "/") factor)*
    factor := NAME | INTEGER | "(" expr ")"

Division must be exact at every step: sizes of mesh dims are integers, and a formula that
only works out by rounding describes a mesh that does not exist. Nothing here calls ``eval``.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass

from meshconf.core.errors import MeshconfError

MAX_FORMULA_LENGTH = 500
MAX_NESTING = 32
MAX_LITERAL_DIGITS = 12

_TOKEN = re.compile(
    r"\s*(?:(?P<int>[0-9]+)|(?P<name>[A-Za-z_][A-Za-z0-9_]*)|(?P<op>[*/()])|(?P<bad>\S))"
)


class FormulaError(MeshconfError, ValueError):
    """A formula that cannot be parsed or evaluated; the message says why."""


@dataclass(frozen=True)
class Name:
    name: str


@dataclass(frozen=True)
class Literal:
    value: int


@dataclass(frozen=True)
class BinaryOp:
    operator: str  # "*" or "/"
    left: Expr
    right: Expr


Expr = Name | Literal | BinaryOp


@dataclass(frozen=True)
class _Token:
    kind: str
    text: str
    column: int


def _tokenize(text: str) -> list[_Token]:
    tokens: list[_Token] = []
    position = 0
    while position < len(text):
        match = _TOKEN.match(text, position)
        if match is None:  # only trailing whitespace is left
            break
        kind = match.lastgroup
        assert kind is not None
        value = match.group(kind)
        column = match.start(kind) + 1
        if kind == "bad":
            raise FormulaError(
                f"unexpected {value!r} at column {column}; formulas use dim names, "
                "integers, '*', '/' and parentheses"
            )
        tokens.append(_Token(kind, value, column))
        position = match.end()
    return tokens


class _Parser:
    def __init__(self, text: str) -> None:
        self._tokens = _tokenize(text)
        self._index = 0

    def _peek(self) -> _Token | None:
        return self._tokens[self._index] if self._index < len(self._tokens) else None

    def parse(self) -> Expr:
        if not self._tokens:
            raise FormulaError("empty formula")
        expr = self._expr(depth=0)
        extra = self._peek()
        if extra is not None:
            raise FormulaError(f"unexpected {extra.text!r} at column {extra.column}")
        return expr

    def _expr(self, depth: int) -> Expr:
        expr = self._factor(depth)
        while (token := self._peek()) is not None and token.text in ("*", "/"):
            self._index += 1
            expr = BinaryOp(token.text, expr, self._factor(depth))
        return expr

    def _factor(self, depth: int) -> Expr:
        token = self._peek()
        if token is None:
            raise FormulaError("formula ends where a name, number or '(' was expected")
        self._index += 1
        if token.kind == "name":
            return Name(token.text)
        if token.kind == "int":
            if len(token.text) > MAX_LITERAL_DIGITS:
                raise FormulaError(
                    f"integer at column {token.column} has more than {MAX_LITERAL_DIGITS} digits"
                )
            return Literal(int(token.text))
        if token.text == "(":
            if depth >= MAX_NESTING:
                raise FormulaError(f"parentheses nested deeper than {MAX_NESTING}")
            inner = self._expr(depth + 1)
            closing = self._peek()
            if closing is None or closing.text != ")":
                raise FormulaError(f"'(' at column {token.column} is never closed")
            self._index += 1
            return inner
        raise FormulaError(
            f"unexpected {token.text!r} at column {token.column}; expected a name, number or '('"
        )


def parse(text: str) -> Expr:
    """Parse a formula such as ``dp_shard * cp * tp / (ep * etp)``."""
    if len(text) > MAX_FORMULA_LENGTH:
        raise FormulaError(f"formula longer than {MAX_FORMULA_LENGTH} characters")
    return _Parser(text).parse()


def names(expr: Expr) -> Iterator[str]:
    """The names a formula uses, left to right, repeats included."""
    if isinstance(expr, Name):
        yield expr.name
    elif isinstance(expr, BinaryOp):
        yield from names(expr.left)
        yield from names(expr.right)


def render(expr: Expr, values: Mapping[str, int] | None = None) -> str:
    """Write a formula back out; with ``values``, each name shows its value: ``tp(8)``."""
    if isinstance(expr, Name):
        if values is not None and expr.name in values:
            return f"{expr.name}({values[expr.name]})"
        return expr.name
    if isinstance(expr, Literal):
        return str(expr.value)
    right = render(expr.right, values)
    if isinstance(expr.right, BinaryOp):
        right = f"({right})"
    return f"{render(expr.left, values)} {expr.operator} {right}"


def evaluate(expr: Expr, values: Mapping[str, int]) -> int:
    """Compute a formula; every division must come out exact.

    Raises :class:`FormulaError` naming the division that does not, e.g.
    ``4 / 8 is not an integer``. Every name must be in ``values``.
    """
    return compile_formula(expr)(values)


def compile_formula(expr: Expr) -> Callable[[Mapping[str, int]], int]:
    """:func:`evaluate` of ``expr`` as a function of the values, for a formula computed many
    times (a plan computes the default formulas for every assignment it ranks).

    The function raises :class:`FormulaError` as :func:`evaluate` does.
    """
    if isinstance(expr, Name):
        name = expr.name
        return lambda values: values[name]
    if isinstance(expr, Literal):
        value = expr.value
        return lambda values: value
    left, right = compile_formula(expr.left), compile_formula(expr.right)
    if expr.operator == "*":
        return lambda values: left(values) * right(values)

    def divide(values: Mapping[str, int]) -> int:
        numerator, denominator = left(values), right(values)
        if denominator == 0:
            raise FormulaError(f"{numerator} / 0 divides by zero")
        if numerator % denominator:
            raise FormulaError(f"{numerator} / {denominator} is not an integer")
        return numerator // denominator

    return divide
