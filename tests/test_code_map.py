"""CONTRIBUTING.md's map of the code is the code's: every module is in it, described by its
own docstring (scripts/code_map.py writes it)."""

from __future__ import annotations

import importlib.util
import re
from types import ModuleType

from conftest import REPO


def _code_map() -> ModuleType:
    spec = importlib.util.spec_from_file_location("code_map", REPO / "scripts" / "code_map.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_contributing_maps_every_module_as_its_docstring_says() -> None:
    code_map = _code_map()
    text = (REPO / "CONTRIBUTING.md").read_text(encoding="utf-8")
    assert code_map.with_map(text) == text, "run: python scripts/code_map.py"
    mapped = text[text.index(code_map.BEGIN) : text.index(code_map.END)]
    for path in sorted((REPO / "meshconf").rglob("*.py")):
        relative = path.relative_to(REPO / "meshconf")
        package, _, name = relative.as_posix().partition("/")
        if not name:
            assert f"| `meshconf/{package}` |" in mapped
        elif name != "__init__.py":
            section = mapped[mapped.index(f"### `meshconf/{package}/`") :]
            assert f"| `{name}` |" in section, f"{relative} is not in the map"


def test_every_module_says_what_it_holds() -> None:
    code_map = _code_map()
    empty = [
        str(path.relative_to(REPO))
        for path in (REPO / "meshconf").rglob("*.py")
        if not code_map.first_sentence(code_map.docstring(path))
    ]
    assert empty == []


def test_sentences_and_roles_read_as_markdown() -> None:
    code_map = _code_map()
    text = "Reads ``x`` with :func:`~meshconf.f`, e.g. twice. Then more.\n\nNot this."
    assert code_map.first_sentence(text) == "Reads `x` with `meshconf.f`, e.g. twice."
    assert not re.search(r"``|:\w+:`", code_map.code_map())
