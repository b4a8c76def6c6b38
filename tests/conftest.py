from __future__ import annotations

import contextlib
import io
import os
import subprocess
import sys
import warnings
from collections.abc import Callable
from pathlib import Path

import pytest

from meshconf.cli import main

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


#: Test modules that start other processes or tools (torchrun, pre-commit, mypy, pip, the
#: docs' commands): `pytest -m "not slow"` leaves them out for a quick signal, and `pytest`
#: runs them.
SLOW_MODULES = frozenset(
    {
        "test_benchmarks_smoke",
        "test_code_quality",
        "test_compat_d9d",
        "test_compat_torchtitan",
        "test_compat_torchtitan_v0_2",
        "test_docs",
        "test_layers",
        "test_order_runtime",
        "test_plan_memory_gloo",
        "test_precommit",
        "test_runtime_failures",
        "test_runtime_gloo",
        "test_runtime_oracle",
        "test_runtime_single",
        "test_runtime_training",
        "test_wheel",
    }
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.path.stem in SLOW_MODULES:
            item.add_marker(pytest.mark.slow)


def run_in_process(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess[str]:
    """Run ``meshconf ARGS`` through ``main(argv)`` in this process, with warnings as errors,
    and return what a subprocess would: the exit code and the text of stdout and stderr."""
    stdout, stderr = io.StringIO(), io.StringIO()
    here = os.getcwd()
    os.chdir(cwd)
    try:
        with (
            contextlib.redirect_stdout(stdout),
            contextlib.redirect_stderr(stderr),
            warnings.catch_warnings(),
        ):
            warnings.simplefilter("error")
            try:
                code = main(list(args))
            except SystemExit as exit:  # argparse: usage errors, --help, --version
                code = exit.code if isinstance(exit.code, int) else 0 if exit.code is None else 1
    finally:
        os.chdir(here)
    return subprocess.CompletedProcess(list(args), code, stdout.getvalue(), stderr.getvalue())


def run_in_subprocess(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess[str]:
    """Run ``python -m meshconf ARGS`` as a user would."""
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


@pytest.fixture
def run_cli() -> Callable[..., subprocess.CompletedProcess[str]]:
    """Run ``meshconf ARGS``: in this process, except ``simulate``, which starts torch's
    (fake) default process group, and a process holds only one."""

    def run(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess[str]:
        if args and args[0] == "simulate":
            return run_in_subprocess(*args, cwd=cwd)
        return run_in_process(*args, cwd=cwd)

    return run
