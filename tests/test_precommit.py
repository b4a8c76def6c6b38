"""The pre-commit hook, through pre-commit itself.

A consumer repository points its .pre-commit-config.yaml at a copy of this repository and
runs the hook; ``pre-commit try-repo`` does the same without a config. Both build the hook's
environment the way a user's machine does (``pip install`` of meshconf from the package
index), so each takes 10 to 20 seconds. The repository's own .pre-commit-config.yaml is run
too, with the dev environment's tools.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
PRE_COMMIT = str(BIN / "pre-commit")
GOOD = "world_size: 8\ndegrees:\n  tp: 2\n"
BAD = "world_size: 8\ndegrees:\n  dp_shard: 2\n  tp: 3\n"
BAD_LINE = (
    "configs/bad.yaml:4:3: degrees.tp: pp(1) * dp_replicate(1) * dp_shard(2) * cp(1) * tp(3) "
    "= 6 != world_size 8"
)
IGNORED = ("*.egg-info", ".venv*", ".git", "__pycache__", ".*_cache", ".hypothesis")


def _git(*args: str, cwd: Path) -> str:
    identity = ["-c", "user.name=meshconf tests", "-c", "user.email=tests@meshconf.invalid"]
    result = subprocess.run(
        ["git", *identity, *args], cwd=cwd, capture_output=True, text=True, check=True
    )
    return result.stdout.strip()


def _pre_commit(*args: str, cwd: Path, home: Path) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "PRE_COMMIT_HOME": str(home),
        "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
    }
    return subprocess.run(
        [PRE_COMMIT, *args], cwd=cwd, capture_output=True, text=True, env=env, timeout=300
    )


@pytest.fixture(scope="module")
def hook_repo(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """This repository's files, committed in a fresh git repository (the working tree as it
    is, whether or not the checkout is itself a git repository)."""
    repo = tmp_path_factory.mktemp("meshconf-hooks") / "meshconf"
    shutil.copytree(ROOT, repo, ignore=shutil.ignore_patterns(*IGNORED))
    _git("init", "-q", cwd=repo)
    _git("add", "-A", cwd=repo)
    _git("commit", "-q", "-m", "meshconf", cwd=repo)
    return repo, _git("rev-parse", "HEAD", cwd=repo)


def _consumer(tmp_path: Path, config: str | None) -> Path:
    consumer = tmp_path / "consumer"
    (consumer / "configs").mkdir(parents=True)
    (consumer / "configs" / "good.yaml").write_text(GOOD)
    (consumer / "configs" / "bad.yaml").write_text(BAD)
    (consumer / "notes.txt").write_text("not a config\n")
    if config is not None:
        (consumer / ".pre-commit-config.yaml").write_text(config)
    _git("init", "-q", cwd=consumer)
    _git("add", "-A", cwd=consumer)
    return consumer


def test_consumer_repository_runs_the_hook(hook_repo: tuple[Path, str], tmp_path: Path) -> None:
    repo, revision = hook_repo
    config = (
        f"repos:\n  - repo: {repo}\n    rev: {revision}\n    hooks:\n"
        "      - id: meshconf-validate\n        files: ^configs/\n"
    )
    consumer = _consumer(tmp_path, config)
    result = _pre_commit("run", "--all-files", cwd=consumer, home=tmp_path / "home")
    assert result.returncode == 1, result.stdout + result.stderr
    assert "meshconf validate" in result.stdout and "Failed" in result.stdout
    assert "- exit code: 1" in result.stdout
    assert BAD_LINE in result.stdout.splitlines()
    assert "configs/good.yaml: ok (world_size 8)" in result.stdout.splitlines()

    (consumer / "configs" / "bad.yaml").write_text(GOOD)
    result = _pre_commit("run", "--all-files", cwd=consumer, home=tmp_path / "home")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Passed" in result.stdout


def test_try_repo(hook_repo: tuple[Path, str], tmp_path: Path) -> None:
    repo, _ = hook_repo
    consumer = _consumer(tmp_path, None)
    result = _pre_commit(
        "try-repo",
        str(repo),
        "meshconf-validate",
        "--files",
        "configs/good.yaml",
        "configs/bad.yaml",
        cwd=consumer,
        home=tmp_path / "home",
    )
    assert result.returncode == 1, result.stdout + result.stderr
    assert BAD_LINE in result.stdout.splitlines()


def test_the_repositorys_own_config(hook_repo: tuple[Path, str], tmp_path: Path) -> None:
    """ruff, meshconf validate on the examples and the schema freshness check pass on the
    committed tree, and the freshness check fails when a schema goes stale."""
    repo, _ = hook_repo
    result = _pre_commit("run", "--all-files", cwd=repo, home=tmp_path / "home")
    assert result.returncode == 0, result.stdout + result.stderr
    for hook in ("ruff check", "meshconf validate (examples)", "schemas and reference up to"):
        assert hook in result.stdout

    schema = repo / "schemas" / "meshconf.schema.json"
    original = schema.read_text()
    schema.write_text(original.replace("Tensor-parallel ranks.", "TP."))
    try:
        result = _pre_commit(
            "run", "meshconf-schema", "--all-files", cwd=repo, home=tmp_path / "home"
        )
    finally:
        schema.write_text(original)
    assert result.returncode == 1
    assert (
        "schemas/meshconf.schema.json: out of date with the models; run "
        "`meshconf schema --out schemas/meshconf.schema.json` to regenerate it"
    ) in result.stdout
