"""The core benchmark script runs and prints its tables (timings are never asserted)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parent.parent / "benchmarks" / "core_speed.py"


def _run_quick(script: Path) -> str:
    done = subprocess.run(
        [sys.executable, str(script), "--quick"],
        capture_output=True,
        env={**os.environ, "PYTHONIOENCODING": "utf-8"},
        timeout=120,
        check=False,
    )
    out = done.stdout.decode("utf-8")
    assert done.returncode == 0, out + done.stderr.decode("utf-8", "replace")
    return out


def test_core_speed_quick_runs_and_prints_tables() -> None:
    out = _run_quick(SCRIPT)
    assert "Command: `python " in out and "--quick" in out
    for header in (
        "| what | best | median |",
        "| what | per file | x 100 files |",
        "| query | per call (median) | per call (best) |",
        "| what | median | best |",
        "| world_size | dp_shard | model_validate | coordinate |",
    ):
        assert header in out, f"missing table header {header!r}"


VALIDATE_SCRIPT = SCRIPT.parent / "validate_speed.py"
MESHCONF_ROW = "`meshconf validate`"
CHECK_JSONSCHEMA_ROW = "`check-jsonschema --schemafile schemas/meshconf.schema.json`"
DIRECT_HEADER = (
    "| files | command (one process) | best | median | median / file | CPU (median) "
    "| formula-broken files flagged | valid files flagged |"
)


def _table_rows(out: str, first_cell: str) -> dict[str, list[str]]:
    """Rows of the Markdown tables whose first cell is ``first_cell``, by their second cell."""
    rows = {}
    for line in out.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if line.startswith("|") and cells[0] == first_cell:
            rows[cells[1]] = cells
    return rows


def test_validate_speed_quick_runs_and_counts_flagged_files() -> None:
    """Timings are not asserted; the flagged-file counts are: meshconf flags each of the 10
    formula-broken files among the 100, check-jsonschema (which cannot see formulas) none."""
    out = _run_quick(VALIDATE_SCRIPT)
    assert "## Validating files: meshconf validate vs check-jsonschema" in out
    assert "Command: `python " in out and "--quick" in out
    assert DIRECT_HEADER in out
    assert "### 2. As pre-commit hooks" not in out  # --quick skips pre-commit

    rows = _table_rows(out, "100")
    assert set(rows) == {MESHCONF_ROW, CHECK_JSONSCHEMA_ROW}
    # The last two cells: formula-broken files flagged, valid files flagged.
    assert rows[MESHCONF_ROW][-2:] == ["10 of 10", "0"]
    assert rows[CHECK_JSONSCHEMA_ROW][-2:] == ["0 of 10", "0"]
