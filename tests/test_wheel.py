"""The wheel a user installs: built from the repository, installed into a fresh virtualenv
without the dev extra, and run from another folder. Needs the package index for hatchling and
the core dependencies (pydantic, PyYAML, omegaconf)."""

from __future__ import annotations

import email
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

import meshconf

REPO = Path(__file__).resolve().parent.parent
TOOK_S = 300  # pip may build hatchling's environment and fetch the core dependencies


def _run(*args: str | Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        [str(arg) for arg in args], cwd=cwd, capture_output=True, text=True, timeout=TOOK_S
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return result


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    dist = tmp_path_factory.mktemp("dist")
    _run(sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", dist, REPO, cwd=dist)
    (built,) = dist.glob("meshconf-*.whl")
    return built


def test_the_wheel_holds_the_package_and_its_metadata_only(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    dist_info = f"meshconf-{meshconf.__version__}.dist-info/"
    assert wheel.name == f"meshconf-{meshconf.__version__}-py3-none-any.whl"
    assert [name for name in names if not name.startswith(("meshconf/", dist_info))] == []
    assert {
        "meshconf/__init__.py",
        "meshconf/cli/__init__.py",
        "meshconf/runtime/context.py",
    } <= set(names)
    assert not [name for name in names if "/tests/" in name or name.startswith("tests/")]
    metadata = email.message_from_bytes(zipfile.ZipFile(wheel).read(f"{dist_info}METADATA"))
    assert metadata["Version"] == meshconf.__version__
    requires = metadata.get_all("Requires-Dist") or []
    # Only the dev extra pins torch; a user's extra takes the torch they have.
    torch_pins = [
        r for r in requires if re.split(r"[<>=!~;\[ ]", r)[0] == "torch" and "==" in r.split(";")[0]
    ]
    assert torch_pins == ["torch==2.13.0; extra == 'dev'"]
    assert "torch<2.15,>=2.13; extra == 'torch'" in requires
    # torch's wheels do not require NumPy, and without it every import of torch warns.
    assert "numpy<3,>=1.26; extra == 'torch'" in requires
    # Every runtime dependency is bounded above (pyproject.toml says why each bound is there).
    core = [r.split(";")[0] for r in requires if "extra ==" not in r]
    assert core and all("<" in requirement for requirement in core), core
    assert set(metadata.get_all("Provides-Extra") or []) == {
        "torch",
        "hydra",
        "png",
        "accelerate",
        "transformers",
        "peers",
        "dev",
    }


# Creates a virtualenv and installs the core dependencies into it from the package index.
@pytest.mark.timeout(2 * TOOK_S)
def test_the_wheel_installs_and_runs_from_another_folder(wheel: Path, tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    _run(sys.executable, "-m", "venv", venv, cwd=tmp_path)
    python, cli = venv / "bin" / "python", venv / "bin" / "meshconf"
    _run(python, "-m", "pip", "install", "-q", wheel, cwd=tmp_path)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    assert _run(cli, "--version", cwd=elsewhere).stdout == f"meshconf {meshconf.__version__}\n"
    version = _run(python, "-c", "import meshconf; print(meshconf.__version__)", cwd=elsewhere)
    assert version.stdout == f"{meshconf.__version__}\n"
    examples = sorted((REPO / "examples").glob("*.yaml"))
    validated = _run(cli, "validate", *examples, cwd=elsewhere).stdout.splitlines()
    assert [line.split(": ok")[0] for line in validated if ": ok" in line] == [
        str(path) for path in examples
    ]
    shown = _run(
        cli, "show", REPO / "examples" / "llama3_70b_512gpu.yaml", "--rank", "77", cwd=elsewhere
    )
    assert (
        "  tp                  8        1       64  intra-node  72, 73, 74, 75, 76, 77, 78, 79"
        in shown.stdout
    )
    installed = _run(python, "-m", "pip", "list", "--format", "freeze", cwd=elsewhere).stdout
    names = {line.split("==")[0].lower() for line in installed.splitlines()}
    assert not names & {"torch", "hydra-core", "matplotlib", "pytest"}
    # The runtime says what to install when torch is missing: the extra of the same wheel.
    simulate = subprocess.run(
        [cli, "simulate", REPO / "examples" / "single_gpu.yaml"],
        cwd=elsewhere,
        capture_output=True,
        text=True,
        timeout=TOOK_S,
    )
    assert simulate.returncode == 2
    assert simulate.stderr == (
        "meshconf: error: meshconf's runtime needs torch, which is not installed: "
        f"pip install '{wheel}[torch]'\n"
    )
    assert "Traceback" not in simulate.stderr
