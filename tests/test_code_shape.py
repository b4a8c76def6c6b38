"""The shape of the house that CONTRIBUTING.md describes: a module name used once, no module
over 370 lines, a command line whose functions parse and print (60 lines at most) and
that spells no training setting, which the table of settings holds."""

from __future__ import annotations

import ast
from collections import Counter
from pathlib import Path

from conftest import REPO

from meshconf.core.settings import SETTINGS

PACKAGE = REPO / "meshconf"
MODULES = sorted(PACKAGE.rglob("*.py"))
#: ``meshconf/render.py`` is the documented import of the drawing API and ``cli/render.py``
#: the ``render`` verb, which ``cli/__init__.py`` imports by the verb's name.
SHARED_NAMES = {"__init__.py", "render.py"}


def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(encoding="utf-8"))


def test_each_module_name_is_used_once() -> None:
    names = Counter(path.name for path in MODULES)
    repeated = {name: count for name, count in names.items() if count > 1}
    assert set(repeated) <= SHARED_NAMES
    assert names["render.py"] == 2


def test_no_module_is_over_370_lines() -> None:
    long = {
        str(path.relative_to(REPO)): lines
        for path in MODULES
        if (lines := len(path.read_text(encoding="utf-8").splitlines())) > 370
    }
    assert long == {}


def test_no_command_line_function_is_over_60_lines() -> None:
    long = [
        f"{path.relative_to(REPO)}:{node.lineno} {node.name} ({node.end_lineno - node.lineno + 1})"
        for path in sorted((PACKAGE / "cli").glob("*.py"))
        for node in ast.walk(_tree(path))
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and node.end_lineno is not None
        and node.end_lineno - node.lineno + 1 > 60
    ]
    assert long == []


def _docstrings(tree: ast.Module) -> set[int]:
    found = set()
    for node in ast.walk(tree):
        documented = isinstance(node, ast.Module | ast.FunctionDef | ast.ClassDef)
        if documented and node.body and isinstance(node.body[0], ast.Expr):
            found.add(id(node.body[0].value))
    return found


def test_the_command_line_and_integrations_spell_no_training_setting() -> None:
    """A setting's key and option live in ``meshconf.core.settings`` only: a string of the
    command line or the Hydra integration that is one of them (docstrings aside) would be a
    second declaration."""
    spellings = {*SETTINGS, *(row.option for row in SETTINGS.values())}
    spelled = [
        f"{path.relative_to(REPO)}:{node.lineno} {node.value!r}"
        for folder in ("cli", "integrations")
        for path in sorted((PACKAGE / folder).glob("*.py"))
        for tree in [_tree(path)]
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant)
        and node.value in spellings
        and id(node) not in _docstrings(tree)
    ]
    assert spelled == []
