from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent

#: The textbook seed's exercise: 256 GPUs (32 nodes of 8) as dp=8, pp=4, tp=8, outer to inner.
TEXTBOOK = """\
# The textbook's exercise: 256 GPUs as dp=8, pp=4, tp=8, outer to inner.
world_size: 256
gpus_per_node: 8
degrees: {dp_replicate: 8, pp: 4, tp: 8, dp_shard: 1}
domains:
  textbook: [dp_replicate, pp, tp]
"""


@pytest.fixture
def run_cli():
    """Run ``python -m meshconf ARGS`` from the repository root, as a user would."""

    def run(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess[str]:
        env = {**os.environ, "PYTHONWARNINGS": "error"}
        result = subprocess.run(
            [sys.executable, "-m", "meshconf", *args],
            cwd=cwd,
            capture_output=True,
            text=True,
            timeout=120,
            env=env,
        )
        assert "Traceback" not in result.stdout + result.stderr, result.stdout + result.stderr
        return result

    return run
