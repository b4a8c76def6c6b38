"""The JSON Schema: committed copies are fresh, it is a valid draft-07 and 2020-12 schema, every
field is documented, and check-jsonschema agrees with meshconf on structure.

check-jsonschema runs as a subprocess on the committed schema, as a user's pre-commit would.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from meshconf.model.json_schema import build_schema

ROOT = Path(__file__).resolve().parent.parent
SCHEMA = ROOT / "schemas" / "meshconf.schema.json"
HYDRA_SCHEMA = ROOT / "schemas" / "meshconf.hydra.schema.json"
EXAMPLES = ROOT / "examples"
INVALID = sorted((EXAMPLES / "invalid").glob("*.yaml"))
HYDRA_OPTIONS = sorted((EXAMPLES / "hydra_app" / "conf" / "parallelism").glob("*.yaml"))
CHECK_JSONSCHEMA = Path(sys.executable).with_name("check-jsonschema")


def _check_jsonschema(schema: Path, *files: Path) -> dict[str, Any]:
    """check-jsonschema's JSON report: which files failed, and how."""
    result = subprocess.run(
        [str(CHECK_JSONSCHEMA), "--schemafile", str(schema), "-o", "JSON", *map(str, files)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    report: dict[str, Any] = json.loads(result.stdout)
    assert result.returncode == (0 if report["status"] == "ok" else 1), result.stderr
    return report


def _failed(report: dict[str, Any]) -> set[str]:
    return {Path(error["filename"]).name for error in report["errors"]} | {
        Path(error["filename"]).name for error in report["parse_errors"]
    }


@pytest.mark.parametrize(
    "args",
    [(), ("--flavor", "hydra"), ("--format", "markdown")],
    ids=["plain", "hydra", "markdown"],
)
def test_committed_files_are_fresh(run_cli, args: tuple[str, ...]) -> None:
    result = run_cli("schema", "--check", *args)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.endswith(": up to date\n")


def test_check_fails_on_a_stale_file(run_cli, tmp_path: Path) -> None:
    stale = tmp_path / "meshconf.schema.json"
    stale.write_text(SCHEMA.read_text().replace("Tensor-parallel ranks.", "TP."))
    result = run_cli("schema", "--check", "--out", str(stale))
    assert result.returncode == 1
    assert result.stdout == (
        f"{stale}: out of date with the models; run `meshconf schema --out {stale}` "
        "to regenerate it\n"
    )


def test_check_fails_on_a_missing_file(run_cli, tmp_path: Path) -> None:
    result = run_cli("schema", "--check", "--flavor", "hydra", "--out", str(tmp_path / "x.json"))
    assert result.returncode == 1
    assert result.stdout == (
        f"{tmp_path / 'x.json'}: missing; run `meshconf schema --flavor hydra "
        f"--out {tmp_path / 'x.json'}` to write it\n"
    )


def test_writing_makes_the_check_pass(run_cli, tmp_path: Path) -> None:
    out = tmp_path / "nested" / "schema.json"
    assert run_cli("schema", "--out", str(out)).stdout == f"{out}: written\n"
    assert out.read_text() == SCHEMA.read_text()
    assert run_cli("schema", "--check", "--out", str(out)).returncode == 0


def test_stdout_and_usage_errors(run_cli) -> None:
    assert json.loads(run_cli("schema").stdout) == build_schema()
    assert run_cli("schema", "--out", "-").stdout == run_cli("schema").stdout
    assert run_cli("schema", "--flavor", "hydra").stdout == HYDRA_SCHEMA.read_text()
    assert (
        run_cli("schema", "--format", "markdown").stdout
        == (ROOT / "docs" / "reference.md").read_text()
    )
    result = run_cli("schema", "--format", "markdown", "--flavor", "hydra")
    assert result.returncode == 2
    assert result.stderr == (
        "meshconf: error: --format markdown documents the plain schema; drop --flavor hydra\n"
    )
    result = run_cli("schema", "--check", "--out", "-")
    assert result.returncode == 2
    assert "--check needs a file" in result.stderr


@pytest.mark.parametrize("flavor", ["plain", "hydra"])
def test_schema_is_valid_draft_07_and_2020_12(flavor: str) -> None:
    schema = build_schema(flavor)  # type: ignore[arg-type]
    assert schema["$schema"] == "http://json-schema.org/draft-07/schema#"
    jsonschema.Draft7Validator.check_schema(schema)
    jsonschema.Draft202012Validator.check_schema(schema)
    assert "checked by `meshconf validate`, not by this schema" in schema["description"]


def test_unknown_flavor_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown schema flavor 'nope'; flavors: plain, hydra"):
        build_schema("nope")  # type: ignore[arg-type]


def _fields(schema: dict[str, Any], path: str = "") -> list[tuple[str, dict[str, Any]]]:
    found = []
    for name, value in schema.get("properties", {}).items():
        found.append((f"{path}{name}", value))
        found += _fields(value, f"{path}{name}.")
    return found


def test_every_field_has_a_description_and_an_example() -> None:
    schema = build_schema()
    fields = _fields(schema)
    for name, level in _fields(schema["properties"]["levels"]["anyOf"][0]["items"]):
        fields.append((f"levels[].{name}", level))
    assert len(fields) == 72
    for name, value in fields:
        assert value.get("description"), name
        assert value.get("examples"), name
        validator = jsonschema.Draft7Validator(value)
        for example in value["examples"]:
            assert validator.is_valid(example), (name, example)


def _valid(instance: Any, flavor: str = "plain") -> bool:
    return jsonschema.Draft7Validator(build_schema(flavor)).is_valid(instance)  # type: ignore[arg-type]


def test_order_is_a_permutation_of_the_world_factors() -> None:
    assert _valid({"order": ["dp_replicate", "dp_shard", "pp", "cp", "tp"]})
    assert not _valid({"order": ["dp_replicate", "dp_shard", "pp", "cp"]})
    assert not _valid({"order": ["dp_replicate", "dp_shard", "pp", "cp", "cp"]})
    assert not _valid({"order": ["dp", "dp_shard", "pp", "cp", "tp"]})
    assert not _valid({"order": "tp-cp-dp-pp"})


def test_the_auto_sentinel_is_exact() -> None:
    assert _valid({"degrees": {"tp": -1, "dp_shard": 4}})
    assert not _valid({"degrees": {"tp": -2}})
    assert not _valid({"degrees": {"ep": -1}})
    assert not _valid({"degrees": {"tp": -1, "dp_shard": -1}})
    assert not _valid({"degrees": {"pp": -1, "cp": -1}})
    assert not _valid({"degrees": {"tp": 0}})
    assert not _valid({"degrees": {"tp": True}})


def test_domain_lists_and_names_are_exact() -> None:
    assert _valid({"domains": {"mine": ["pp", "fsdp_tp"]}, "derived": {"fsdp_tp": "fsdp * tp"}})
    assert not _valid({"domains": {}})
    assert not _valid({"domains": {"mine": []}})
    assert not _valid({"domains": {"mine": ["tp", "tp"]}})
    assert not _valid({"domains": {"mine": "pp, tp"}})
    assert not _valid({"domains": {"9lives": ["tp"]}})
    assert not _valid({"derived": {"tp": "dp_shard"}})
    assert not _valid({"derived": {"x": "dp_shard + cp"}})
    assert not _valid({"runtime": {"device": "cpu", "backend": "nccl"}})
    assert _valid({"runtime": {"device": "auto", "backend": "nccl"}})


def test_hydra_flavor_accepts_interpolations_defaults_and_target() -> None:
    config = {
        "defaults": ["_meshconf_schema", "_self_"],
        "_target_": "meshconf.integrations.hydra.build_config",
        "world_size": "${oc.decode:${oc.env:WORLD_SIZE}}",
        "degrees": {"tp": "${tp}", "dp_shard": -1},
        "domains": {"dense": ["pp", "${inner}"]},
        "gpus_per_node": "???",
    }
    assert _valid(config, "hydra")
    assert not _valid(config, "plain")
    assert not _valid({"degrees": {"tp": "eight"}}, "hydra")


@pytest.mark.slow  # runs check-jsonschema
def test_check_jsonschema_accepts_every_valid_example() -> None:
    valid = sorted(EXAMPLES.glob("*.yaml")) + sorted((EXAMPLES / "migration").glob("*.yaml"))
    assert _check_jsonschema(SCHEMA, *valid)["status"] == "ok"
    assert _check_jsonschema(HYDRA_SCHEMA, *valid, *HYDRA_OPTIONS)["status"] == "ok"
    experiment_schema = EXAMPLES / "experiments" / "experiment.schema.json"
    experiment = EXAMPLES / "experiments" / "experiment_with_parallelism_key.yaml"
    assert _check_jsonschema(experiment_schema, experiment)["status"] == "ok"


@pytest.mark.slow  # runs check-jsonschema
def test_check_jsonschema_rejects_exactly_the_structural_errors() -> None:
    """Each invalid example says whether the schema can see its problem; formulas it cannot."""
    failed = _failed(_check_jsonschema(SCHEMA, *INVALID))
    for path in INVALID:
        marker = path.read_text(encoding="utf-8").splitlines()[2]
        rejects = marker == "# json-schema: rejects"
        assert (path.name in failed) == rejects, (path.name, marker)
    assert len(failed) >= 20
    formulas = [p for p in INVALID if "formula rule" in p.read_text(encoding="utf-8")]
    assert len(formulas) >= 12


@pytest.mark.slow  # runs check-jsonschema
def test_hydra_options_fail_the_plain_schema(tmp_path: Path) -> None:
    """The Hydra options use `defaults`, which only the hydra flavor knows."""
    shutil.copy(HYDRA_OPTIONS[0], tmp_path / "option.yaml")
    assert _check_jsonschema(SCHEMA, tmp_path / "option.yaml")["status"] == "fail"
