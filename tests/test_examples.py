"""The example configs: the valid ones validate, each invalid one fails with exactly the
lines its ``# expect:`` comments promise.

Each file in ``examples/invalid/`` breaks one rule. It starts with ``# rule: ...`` and lists,
in ``# expect: ...`` lines, every line ``meshconf validate examples/invalid/<file>`` prints
when run from the repository root. The CLI runs through ``main(argv)``, in this process.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from conftest import run_in_process

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
INVALID = EXAMPLES / "invalid"
EXPERIMENT = EXAMPLES / "experiments" / "experiment_with_parallelism_key.yaml"

VALID_FILES = sorted(EXAMPLES.glob("*.yaml")) + sorted((EXAMPLES / "migration").glob("*.yaml"))
INVALID_FILES = sorted(INVALID.glob("*.yaml"))
ALL_EXAMPLES = VALID_FILES + sorted((EXAMPLES / "experiments").glob("*.yaml"))

EXPECT = "# expect: "
RULE = "# rule: "
JSON_SCHEMA = "# json-schema: "


def _relative(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def _validate(*args: str) -> subprocess.CompletedProcess[str]:
    return run_in_process("validate", *args, cwd=ROOT)


def _comment_lines(path: Path, prefix: str) -> list[str]:
    return [
        line[len(prefix) :]
        for line in path.read_text(encoding="utf-8").splitlines()
        if line.startswith(prefix)
    ]


def test_there_are_enough_examples() -> None:
    assert len(VALID_FILES) >= 9
    assert EXPERIMENT.is_file()
    assert len(INVALID_FILES) >= 30


def test_all_valid_examples_validate_together() -> None:
    result = _validate(*(_relative(path) for path in VALID_FILES))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Traceback" not in result.stdout + result.stderr
    for path in VALID_FILES:
        assert f"{_relative(path)}: ok" in result.stdout


def test_world_size_from_launcher_reports_pending_checks() -> None:
    result = _validate("examples/world_size_from_launcher.yaml")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "wait for the world size" in result.stdout
    assert "degrees.dp_shard" in result.stdout


def test_experiment_validates_with_key() -> None:
    result = _validate(_relative(EXPERIMENT), "--key", "parallelism")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Traceback" not in result.stdout + result.stderr


def test_experiment_needs_its_key() -> None:
    result = _validate(_relative(EXPERIMENT))
    assert result.returncode == 1
    assert "unknown key 'parallelism'" in result.stdout


@pytest.mark.parametrize("path", INVALID_FILES, ids=lambda path: path.stem)
def test_invalid_example_fails_with_expected_lines(path: Path) -> None:
    expected = _comment_lines(path, EXPECT)
    result = _validate(_relative(path))
    assert "Traceback" not in result.stdout
    assert "Traceback" not in result.stderr
    assert result.returncode == 1, result.stdout + result.stderr
    assert result.stdout.splitlines() == expected


@pytest.mark.parametrize("path", INVALID_FILES, ids=lambda path: path.stem)
def test_invalid_example_documents_its_rule(path: Path) -> None:
    lines = path.read_text(encoding="utf-8").splitlines()
    assert lines[1].startswith(RULE), "the line after the schema line must be '# rule: ...'"
    assert lines[2].startswith(JSON_SCHEMA), f"the third line must be '{JSON_SCHEMA}...'"
    assert len(_comment_lines(path, RULE)) == 1
    assert len(_comment_lines(path, EXPECT)) >= 1


@pytest.mark.parametrize("path", ALL_EXAMPLES, ids=lambda path: path.stem)
def test_example_says_what_it_is(path: Path) -> None:
    second = path.read_text(encoding="utf-8").splitlines()[1]
    assert second.startswith("# ") and len(second) > 10, second


def _schema_line_paths() -> list[Path]:
    app_config = EXAMPLES / "hydra_app" / "conf" / "config.yaml"
    # Megatron's and accelerate's own files, the input of `meshconf convert`, are not configs.
    others = (EXAMPLES / "migration" / "megatron", EXAMPLES / "migration" / "accelerate")
    return sorted(
        path
        for path in EXAMPLES.rglob("*.yaml")
        if path != app_config and not any(tool in path.parents for tool in others)
    )


@pytest.mark.parametrize("path", _schema_line_paths(), ids=_relative)
def test_example_starts_with_its_schema(path: Path) -> None:
    """Editors with the YAML language server check and complete every example as it is typed."""
    first = path.read_text(encoding="utf-8").splitlines()[0]
    prefix = "# yaml-language-server: $schema="
    assert first.startswith(prefix), first
    schema = (path.parent / first[len(prefix) :]).resolve()
    in_hydra_group = "hydra_app" in path.parts
    expected = "meshconf.hydra.schema.json" if in_hydra_group else "meshconf.schema.json"
    if path.parent.name == "experiments":
        expected = "experiment.schema.json"
    assert schema.name == expected
    assert schema.is_file(), schema
