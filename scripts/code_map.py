"""The map of meshconf's code in CONTRIBUTING.md, made from the docstrings of its packages and
modules, so that it cannot go stale.

    python scripts/code_map.py           # rewrite the map in CONTRIBUTING.md
    python scripts/code_map.py --check   # exit 1 if the map differs from the code

tests/test_code_map.py runs the check: a module added, removed or redescribed without the map
following fails the suite.
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PACKAGE = REPO / "meshconf"
CONTRIBUTING = REPO / "CONTRIBUTING.md"
BEGIN = "<!-- code-map: begin (made by scripts/code_map.py from the docstrings; do not edit) -->"
END = "<!-- code-map: end -->"
#: The order packages are listed in: the layers, bottom up, then those beside them.
ORDER = (
    "core",
    "model",
    "trainers",
    "sources",
    "features",
    "runtime",
    "compat",
    "integrations",
    "cli",
)
_SENTENCE_END = re.compile(r"(?<!e\.g)(?<!i\.e)\.(\s|$)")
_ROLE = re.compile(r":\w+:`~?([^`]+)`")


def docstring(path: Path) -> str:
    """The module's docstring, or an empty string."""
    return ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) or ""


def markdown(text: str) -> str:
    """reStructuredText's roles and literals as Markdown code: ``x`` and :mod:`x` as `x`."""
    return _ROLE.sub(r"`\1`", text.replace("``", "`"))


def first_sentence(text: str) -> str:
    """The docstring's first sentence, on one line, in Markdown."""
    paragraph = markdown(" ".join(text.split("\n\n")[0].split()))
    found = _SENTENCE_END.search(paragraph)
    return paragraph if found is None else paragraph[: found.start() + 1]


def _paragraphs(text: str) -> list[str]:
    return [markdown(" ".join(part.split())) for part in text.split("\n\n") if part.strip()]


def _package_section(folder: Path) -> list[str]:
    relative = folder.relative_to(REPO).as_posix()
    lines = [f"### `{relative}/`", ""]
    lines += [f"{paragraph}\n" for paragraph in _paragraphs(docstring(folder / "__init__.py"))]
    lines += ["| Module | What it holds |", "|---|---|"]
    for path in sorted(folder.rglob("*.py")):
        if path.name == "__init__.py" and path.parent == folder:
            continue
        name = path.relative_to(folder).as_posix()
        lines.append(f"| `{name}` | {first_sentence(docstring(path)) or '(no docstring)'} |")
    return [*lines, ""]


def code_map() -> str:
    """The map: the top-level modules, then each package in :data:`ORDER`."""
    lines = ["| Module | What it holds |", "|---|---|"]
    for path in sorted(PACKAGE.glob("*.py")):
        text = docstring(path) or "(no docstring)"
        lines.append(f"| `meshconf/{path.name}` | {first_sentence(text)} |")
    lines.append("")
    packages = sorted(path.parent.name for path in PACKAGE.glob("*/__init__.py"))
    unknown = sorted(set(packages) - set(ORDER))
    if unknown:
        raise SystemExit(f"scripts/code_map.py: add {', '.join(unknown)} to ORDER")
    for name in ORDER:
        lines += _package_section(PACKAGE / name)
    return "\n".join(lines).rstrip("\n") + "\n"


def with_map(text: str) -> str:
    """CONTRIBUTING.md's text with the map between its markers replaced."""
    start, end = text.index(BEGIN) + len(BEGIN), text.index(END)
    return f"{text[:start]}\n{code_map()}{text[end:]}"


def main(argv: list[str]) -> int:
    text = CONTRIBUTING.read_text(encoding="utf-8")
    updated = with_map(text)
    if argv == ["--check"]:
        if updated != text:
            print("CONTRIBUTING.md: the map of the code is stale; run python scripts/code_map.py")
            return 1
        return 0
    CONTRIBUTING.write_text(updated, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
