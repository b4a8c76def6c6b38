"""The command line, through a subprocess as users run it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from conftest import REPO, TEXTBOOK

TORCHTITAN = """\
world_size: 8
degrees: {dp_replicate: 2, dp_shard: 2, tp: 2}
"""


def write(tmp_path: Path, text: str, name: str = "mesh.yaml") -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def show_json(run_cli, *args: str) -> dict:  # type: ignore[no-untyped-def, type-arg]
    result = run_cli("show", *args, "--format", "json")
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)  # type: ignore[no-any-return]


def dims(report: dict, domain: str) -> dict[str, dict]:  # type: ignore[type-arg]
    return {dim["name"]: dim for dim in report["domains"][domain]["dims"]}


def test_show_textbook_mesh(run_cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    report = show_json(run_cli, write(tmp_path, TEXTBOOK), "--rank", "64")
    textbook = dims(report, "textbook")
    assert textbook["tp"] == {
        "name": "tp",
        "size": 8,
        "stride": 1,
        "modes": [[8, 1]],
        "num_groups": 32,
        "group": list(range(64, 72)),
        "crosses_nodes": False,
        "placement": "intra-node",
    }
    assert textbook["pp"] == {
        "name": "pp",
        "size": 4,
        "stride": 8,
        "modes": [[4, 8]],
        "num_groups": 64,
        "group": [64, 72, 80, 88],
        "crosses_nodes": True,
        "placement": "inter-node",
    }
    assert textbook["dp_replicate"]["group"] == [0, 32, 64, 96, 128, 160, 192, 224]
    assert textbook["dp_replicate"]["stride"] == 32
    assert report["coordinates"] == {"textbook": {"dp_replicate": 2, "pp": 0, "tp": 0}}
    assert report["process_groups_per_rank"] == 3


def test_show_torchtitan_seed_example(run_cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    report = show_json(run_cli, write(tmp_path, TORCHTITAN), "--rank", "5")
    assert set(report) == {
        "world_size",
        "gpus_per_node",
        "inside_node",
        "order",
        "rank",
        "domains",
        "coordinates",
        "process_groups_per_rank",
        "warnings",
    }
    assert report["world_size"] == 8 and report["gpus_per_node"] is None and report["rank"] == 5
    assert report["inside_node"] is None
    dense = dims(report, "dense")
    assert [dense[n]["size"] for n in ("pp", "dp_replicate", "fsdp", "tp")] == [1, 2, 2, 2]
    assert dense["pp"] == {
        "name": "pp",
        "size": 1,
        "stride": 8,
        "modes": [[1, 8]],
        "num_groups": 8,
        "group": [5],
        "crosses_nodes": None,
        "placement": None,
    }
    assert dense["dp_replicate"]["group"] == [1, 5]
    assert dense["fsdp"]["group"] == [5, 7]
    assert dense["tp"]["group"] == [4, 5]
    assert dims(report, "dataloading")["batch"]["group"] == [1, 3, 5, 7]
    assert dims(report, "loss")["loss"]["group"] == [1, 3, 5, 7]
    sparse = dims(report, "sparse")
    assert sparse["efsdp"]["size"] == 4 and sparse["efsdp"]["group"] == [4, 5, 6, 7]
    assert report["coordinates"]["dense"] == {"pp": 0, "dp_replicate": 1, "fsdp": 0, "tp": 1}
    # tp, dp_replicate, fsdp, batch (= loss) and efsdp: five distinct groups.
    assert report["process_groups_per_rank"] == 5
    assert report["warnings"] == []


def test_show_a_million_ranks(run_cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    path = write(tmp_path, "gpus_per_node: 8\ndegrees: {pp: 16, dp_replicate: 4, tp: 8}\n")
    report = show_json(
        run_cli, path, "--world-size", str(2**20), "--rank", str(2**20 - 1), "--domain", "dense"
    )
    dense = dims(report, "dense")
    assert dense["fsdp"]["size"] == 2048 and dense["fsdp"]["stride"] == 8
    last = 2**20 - 1
    assert dense["fsdp"]["group"][:3] == [last - 8 * 2047, last - 8 * 2046, last - 8 * 2045]
    assert dense["pp"]["group"] == [last - 65536 * k for k in range(15, -1, -1)]
    assert dense["tp"]["crosses_nodes"] is False and dense["fsdp"]["crosses_nodes"] is True
    assert report["coordinates"]["dense"] == {"pp": 15, "dp_replicate": 3, "fsdp": 2047, "tp": 7}


def test_show_text(run_cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    result = run_cli("show", write(tmp_path, TEXTBOOK), "--rank", "64")
    assert result.returncode == 0
    assert "domain textbook [dp_replicate=8, pp=4, tp=8]" in result.stdout
    assert (
        "  tp                  8        1       32  intra-node  64, 65, 66, 67, 68, 69, 70, 71"
        in result.stdout
    )
    assert "rank 64 belongs to 3 distinct process groups" in result.stdout


def test_show_usage_errors(run_cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    path = write(tmp_path, TORCHTITAN)
    result = run_cli("show", path, "--rank", "8")
    assert result.returncode == 2 and "--rank 8 is outside the world [0, 8)" in result.stderr
    result = run_cli("show", path, "--domain", "dens")
    assert (
        result.returncode == 2
        and "unknown domain 'dens'; domains: dataloading, dense, sparse, loss" in result.stderr
    )
    result = run_cli("show", write(tmp_path, "degrees: {tp: 2}\n", "open.yaml"))
    assert result.returncode == 2
    assert (
        "the world size is unknown (degrees.dp_shard is -1); set world_size in the file or pass --world-size N"
        in result.stderr
    )
    result = run_cli("show", path, "--rank", "-1")
    assert result.returncode == 2 and "expected an integer >= 0, got '-1'" in result.stderr


def test_validate_exit_codes_and_lines(run_cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    good = write(tmp_path, TORCHTITAN, "good.yaml")
    bad = write(tmp_path, "world_size: 8\ndegrees:\n  tp: 3\n  dp_shard: 2\n", "bad.yaml")
    result = run_cli("validate", good)
    assert (result.returncode, result.stdout) == (0, f"{good}: ok (world_size 8)\n")
    result = run_cli("validate", good, bad)
    assert result.returncode == 1
    assert result.stdout.splitlines() == [
        f"{good}: ok (world_size 8)",
        f"{bad}:3:3: degrees.tp: pp(1) * dp_replicate(1) * dp_shard(2) * cp(1) * tp(3) = 6 != world_size 8",
    ]
    result = run_cli("validate", good, str(tmp_path / "missing.yaml"))
    assert result.returncode == 2 and "missing.yaml: cannot read" in result.stderr
    result = run_cli("validate")
    assert result.returncode == 2 and "usage:" in result.stderr


def test_validate_reports_checks_waiting_for_the_world_size(run_cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    path = write(tmp_path, "degrees: {tp: 8, ep: 4}\n")
    result = run_cli("validate", path)
    assert result.returncode == 0
    assert result.stdout.splitlines()[0] == (
        f"{path}: ok so far; 7 checks wait for the world size (set world_size or pass --world-size):"
    )
    assert "  degrees.dp_shard: fill -1 from world_size" in result.stdout.splitlines()
    result = run_cli("validate", path, "--world-size", "64")
    assert result.stdout == f"{path}: ok (world_size 64, checked with --world-size)\n"
    result = run_cli("validate", path, "--world-size", "12")
    assert result.returncode == 1 and "degrees.dp_shard: -1 cannot fill" in result.stdout
    result = run_cli("validate", write(tmp_path, TORCHTITAN, "t.yaml"), "--world-size", "16")
    assert result.returncode == 1
    assert result.stdout.endswith(
        "t.yaml:1:1: world_size: the config says 8, but the world size is 16\n"
    )


def test_validate_json_key_and_overrides(run_cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    path = write(tmp_path, "model: {}\nparallelism:\n  world_size: 8\n  degrees: {tp: 2}\n")
    result = run_cli(
        "validate",
        path,
        "--key",
        "parallelism",
        "-o",
        "parallelism.degrees.tp=3",
        "--format",
        "json",
    )
    assert result.returncode == 1
    report = json.loads(result.stdout)
    assert report["valid"] is False
    (error,) = report["files"][0]["errors"]
    assert error["key"] == "parallelism.degrees.dp_shard"
    # The failing key was not overridden itself, so the error sits in the file and names
    # the overrides that were in force.
    assert error["override"] is None and error["line"] == 4
    assert error["text"].startswith(f"{path}:4:3: parallelism.degrees.dp_shard: -1 cannot fill")
    assert error["text"].endswith("(with overrides: parallelism.degrees.tp=3)")
    result = run_cli("validate", path, "--key", "parallelism", "--format", "json")
    report = json.loads(result.stdout)
    assert report == {
        "valid": True,
        "files": [
            {"path": path, "valid": True, "errors": [], "world_size": 8, "pending_checks": []}
        ],
    }
    result = run_cli("validate", path, "-o", "degrees.tp")
    assert result.returncode == 2 and "expected key=value" in result.stderr


def test_no_torch_on_the_validate_path(tmp_path: Path) -> None:
    path = write(tmp_path, TORCHTITAN)
    code = (
        "import sys; from meshconf.cli import main; "
        f"main(['validate', {path!r}]); main(['show', {path!r}]); "
        "assert 'torch' not in sys.modules, 'torch imported'; print('clean')"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, check=False
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.endswith("clean\n")
    importtime = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", "import meshconf"],
        capture_output=True,
        text=True,
        check=True,
    )
    imported = {line.rsplit("|", 1)[-1].strip() for line in importtime.stderr.splitlines()}
    assert "meshconf" in imported
    assert not {name for name in imported if name == "torch" or name.startswith("torch.")}
    assert "omegaconf" not in imported
