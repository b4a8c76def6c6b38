from __future__ import annotations

import pytest

from meshconf.core import formulas


@pytest.mark.parametrize(
    ("text", "values", "expected"),
    [
        ("dp_replicate * dp_shard", {"dp_replicate": 2, "dp_shard": 4}, 8),
        (
            "dp_shard * cp * tp / (ep * etp)",
            {"dp_shard": 4, "cp": 2, "tp": 2, "ep": 4, "etp": 2},
            2,
        ),
        ("2 * (a / 3)", {"a": 9}, 6),
        ("a / 2 * 3", {"a": 4}, 6),
        ("  a  ", {"a": 5}, 5),
        ("7", {}, 7),
    ],
)
def test_evaluate(text: str, values: dict[str, int], expected: int) -> None:
    assert formulas.evaluate(formulas.parse(text), values) == expected


def test_render_shows_values_and_keeps_needed_parentheses() -> None:
    expr = formulas.parse("dp_shard*cp*tp/(ep*etp)")
    assert formulas.render(expr) == "dp_shard * cp * tp / (ep * etp)"
    values = {"dp_shard": 2, "cp": 1, "tp": 2, "ep": 8, "etp": 1}
    assert formulas.render(expr, values) == "dp_shard(2) * cp(1) * tp(2) / (ep(8) * etp(1))"
    assert list(formulas.names(expr)) == ["dp_shard", "cp", "tp", "ep", "etp"]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "empty formula"),
        (
            "a +",
            "unexpected '+' at column 3; formulas use dim names, integers, '*', '/' and parentheses",
        ),
        ("a * ", "formula ends where a name, number or '(' was expected"),
        ("(a * b", "'(' at column 1 is never closed"),
        ("a b", "unexpected 'b' at column 3"),
        ("a * )", "unexpected ')' at column 5; expected a name, number or '('"),
        ("__import__('os')", 'unexpected "\'" at column 12'),
        ("1" * 13, "integer at column 1 has more than 12 digits"),
        ("(" * 40 + "a" + ")" * 40, "parentheses nested deeper than 32"),
        ("a" * 501, "formula longer than 500 characters"),
    ],
)
def test_syntax_errors(text: str, message: str) -> None:
    with pytest.raises(formulas.FormulaError) as caught:
        formulas.parse(text)
    assert str(caught.value).startswith(message)


def test_division_must_be_exact_at_every_step() -> None:
    with pytest.raises(formulas.FormulaError, match=r"^4 / 8 is not an integer$"):
        formulas.evaluate(formulas.parse("a * b / c"), {"a": 2, "b": 2, "c": 8})
    with pytest.raises(formulas.FormulaError, match=r"^3 / 2 is not an integer$"):
        formulas.evaluate(formulas.parse("a / 2 * 2"), {"a": 3})
    with pytest.raises(formulas.FormulaError, match=r"^3 / 0 divides by zero$"):
        formulas.evaluate(formulas.parse("a / 0"), {"a": 3})


def test_limits_accept_up_to_their_bound() -> None:
    assert formulas.evaluate(formulas.parse("9" * 12), {}) == 999_999_999_999
    assert formulas.evaluate(formulas.parse("(" * 32 + "a" + ")" * 32), {"a": 3}) == 3
    with pytest.raises(formulas.FormulaError) as caught:
        formulas.parse("(" * 33 + "a" + ")" * 33)
    assert str(caught.value) == "parentheses nested deeper than 32"
    assert formulas.evaluate(formulas.parse("a" * 500), {"a" * 500: 2}) == 2
