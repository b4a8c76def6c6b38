"""The package stays ruff- and mypy --strict-clean (configured in pyproject.toml)."""

from __future__ import annotations

import ast
import re
import shutil
import subprocess
import sys

import pytest
from conftest import REPO


def test_ruff_is_clean() -> None:
    ruff = shutil.which("ruff", path=str(REPO / ".venv" / "bin")) or shutil.which("ruff")
    assert ruff, "ruff is part of the dev extra"
    result = subprocess.run(
        [ruff, "check", "meshconf", "tests", "benchmarks"], cwd=REPO, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout + result.stderr
    result = subprocess.run(
        [ruff, "format", "--check", "meshconf", "tests", "benchmarks", "examples"],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stdout + result.stderr


# A cold mypy run takes half a minute alone, and over two beside the other workers and CI's
# other stages on 2 cores; the limit is there for a hang.
@pytest.mark.timeout(300)
def test_mypy_strict_is_clean() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "mypy", "meshconf"], cwd=REPO, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_public_name_is_documented_and_loads() -> None:
    """meshconf/__init__.py's written-out names each load, and each has its place in
    docs/python-api.md; ``__all__`` is every one of them but the runtime's, which imports
    torch."""
    import meshconf

    docs = (REPO / "docs" / "python-api.md").read_text()
    names = [*meshconf.__all__, "DistributedContext"]
    assert "__version__" in names and "MeshConfig" in names and "load_config" in names
    assert set(names) == {"__version__", *meshconf._HOMES}
    undocumented = [name for name in names if not re.search(rf"`(meshconf\.)?{name}\b", docs)]
    assert undocumented == []
    for name in names:
        assert getattr(meshconf, name) is not None


def test_the_exports_and_the_imports_type_checkers_read_agree() -> None:
    """Each public name is written twice in meshconf/__init__.py: as an import for type
    checkers, and with its module for lazy loading; the two say the same."""
    import meshconf

    tree = ast.parse((REPO / "meshconf" / "__init__.py").read_text())
    block = next(node for node in tree.body if isinstance(node, ast.If))
    imported = {
        alias.asname or alias.name: node.module
        for node in block.body
        if isinstance(node, ast.ImportFrom)
        for alias in node.names
    }
    assert imported == meshconf._HOMES
