"""The layer contracts in pyproject.toml hold: no module imports a layer above its own."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_import_contracts_are_kept() -> None:
    result = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; from importlinter.cli import lint_imports_command; "
            "sys.exit(lint_imports_command())",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "5 kept, 0 broken" in result.stdout


def test_every_layer_package_says_what_it_may_import() -> None:
    for package in (
        "core",
        "model",
        "trainers",
        "sources",
        "features",
        "cli",
        "runtime",
        "compat",
        "integrations",
    ):
        docstring = (ROOT / "meshconf" / package / "__init__.py").read_text().split('"""')[1]
        assert "import" in docstring, package
