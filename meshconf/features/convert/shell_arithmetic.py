"""Bash's arithmetic expansion over integers, within bounds: at most
:data:`MAX_ARITHMETIC_DIGITS` digits an integer, ``+ - * / %`` and parentheses, results below
2**63, and :data:`MAX_ARITHMETIC_CHARS` characters once the variables are substituted;
anything past them, or else, is left for the caller to keep as written."""

from __future__ import annotations

import ast
import operator
import re
from collections.abc import Callable, Mapping

#: Characters of one ``$(( ... ))`` once its variables are substituted.
MAX_ARITHMETIC_CHARS = 256
#: Digits of one integer in arithmetic, and the range of every result.
MAX_ARITHMETIC_DIGITS = 18
ARITHMETIC_RANGE = 2**63

_OPERATORS: dict[type, Callable[[int, int], int]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.FloorDiv: operator.floordiv,
    ast.Div: operator.floordiv,
    ast.Mod: operator.mod,
}
_SIGNS: dict[type, Callable[[int], int]] = {ast.USub: operator.neg, ast.UAdd: operator.pos}


def arithmetic(text: str, variables: Mapping[str, object]) -> str | None:
    """The value of ``$(( text ))``, or None when it is not arithmetic this reader does."""

    def value_of(match: re.Match[str]) -> str:
        value = variables.get(match[1])
        return value if isinstance(value, str) else match[0]

    expanded = re.sub(r"\$?\{?([A-Za-z_][A-Za-z0-9_]*)\}?", value_of, text).strip()
    if len(expanded) > MAX_ARITHMETIC_CHARS or re.search(
        rf"[0-9]{{{MAX_ARITHMETIC_DIGITS + 1}}}", expanded
    ):
        return None

    def evaluate(node: ast.AST) -> int:
        if isinstance(node, ast.Expression):
            result = evaluate(node.body)
        elif isinstance(node, ast.Constant) and type(node.value) is int:
            result = node.value
        elif isinstance(node, ast.UnaryOp) and type(node.op) in _SIGNS:
            result = _SIGNS[type(node.op)](evaluate(node.operand))
        elif isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
            result = _OPERATORS[type(node.op)](evaluate(node.left), evaluate(node.right))
        else:
            raise ValueError(text)
        if abs(result) >= ARITHMETIC_RANGE:
            raise ValueError(text)
        return result

    try:
        return str(evaluate(ast.parse(expanded, mode="eval")))
    except (SyntaxError, ValueError, ZeroDivisionError):
        return None
