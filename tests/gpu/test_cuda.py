"""The CUDA and NCCL path on one GPU (marker ``cuda``; skipped where torch sees no GPU).

Each case runs in its own process (see cases.py): ``pytest -m cuda tests/gpu -s`` on a
machine with a GPU, ``-s`` to see the build timings.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


def run_case(name: str) -> str:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
    }
    result = subprocess.run(
        [sys.executable, str(HERE / "cases.py"), name],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        cwd=REPO,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.endswith("ok\n"), result.stdout
    return result.stdout


@pytest.mark.timeout(320)  # a fresh process imports torch and starts CUDA
@pytest.mark.parametrize(
    "case",
    [
        "nccl_default_group",
        "every_domain_on_cuda",
        "fsdp2_step",
        "dtensor_on_tp_of_one",
        "simulate_65536",
    ],
)
def test_case(case: str) -> None:
    run_case(case)


@pytest.mark.timeout(320)  # a fresh process imports torch and starts CUDA
def test_build_timing_is_reported() -> None:
    output = run_case("build_timing")
    print(output)
    lines = output.splitlines()
    assert lines[0].startswith("one GPU: construction with every domain built ")
    assert lines[1].startswith("simulated 65,536 ranks on cuda: ")


@pytest.mark.timeout(320)  # a fresh process imports torch and starts CUDA
def test_runtime_terms_are_measured_beside_the_published_figures() -> None:
    """Printed for docs/runtime.md, beside the figures the estimate cites (never asserted
    against them: they are another GPU's)."""
    output = run_case("runtime_terms")
    print(output)
    lines = output.splitlines()
    assert lines[0].startswith("CUDA context: ")
    assert lines[1].startswith("NCCL: ")
