"""The package stays ruff- and mypy --strict-clean (configured in pyproject.toml)."""

from __future__ import annotations

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
    """The imports of meshconf/__init__.py are the one list of public names: each loads, and
    each has its place in docs/python-api.md."""
    import meshconf

    docs = (REPO / "docs" / "python-api.md").read_text()
    names = [*meshconf.__all__, "DistributedContext"]
    assert names[0] == "__version__" and "MeshConfig" in names and "load_config" in names
    undocumented = [name for name in names if not re.search(rf"`(meshconf\.)?{name}\b", docs)]
    assert undocumented == []
    for name in names:
        assert getattr(meshconf, name) is not None
