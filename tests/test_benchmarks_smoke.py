"""The core benchmark script runs and prints its tables (timings are never asserted)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parent.parent / "benchmarks" / "core_speed.py"


def test_core_speed_quick_runs_and_prints_tables() -> None:
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--quick"],
        capture_output=True,
        env={**os.environ, "PYTHONIOENCODING": "utf-8"},
        timeout=120,
        check=False,
    )
    out = done.stdout.decode("utf-8")
    assert done.returncode == 0, out + done.stderr.decode("utf-8", "replace")
    assert "Command: `python " in out and "--quick" in out
    for header in (
        "| what | best | median |",
        "| what | µs per file | x 100 files |",
        "| query | µs/call (median) | µs/call (best) |",
        "| what | median | best |",
        "| world_size | dp_shard | model_validate | coordinate |",
    ):
        assert header in out, f"missing table header {header!r}"
