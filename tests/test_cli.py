"""The command line, through a subprocess as users run it."""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO, TEXTBOOK, run_in_process
from hypothesis import given, strategies as st

import meshconf
from meshconf.cli import VERBS, build_parser
from meshconf.cli.simulate import rank_list
from meshconf.core.degrees import MAX_WORLD_SIZE

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
        "group_size": 8,
        "group_last": 71,
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
        "group_size": 4,
        "group_last": 88,
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
        "group_size": 1,
        "group_last": 5,
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
    assert (result.returncode, result.stderr) == (
        2,
        "meshconf: error: the following arguments are required: PATH\n",
    )


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
    assert result.returncode == 1 and "degrees.tp: tp(8) leaves no whole number" in result.stdout
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
        "parallelism.world_size=7",
        "--format",
        "json",
    )
    assert result.returncode == 1
    report = json.loads(result.stdout)
    assert report["valid"] is False
    (error,) = report["files"][0]["errors"]
    assert error["key"] == "parallelism.degrees.tp"
    # The failing key was not overridden itself, so the error sits in the file and names
    # the overrides that were in force.
    assert error["override"] is None and error["line"] == 4
    assert error["text"].startswith(f"{path}:4:13: parallelism.degrees.tp: tp(2) leaves no whole")
    assert error["text"].endswith("(with overrides: parallelism.world_size=7)")
    result = run_cli("validate", path, "--key", "parallelism", "--format", "json")
    report = json.loads(result.stdout)
    assert report == {
        "valid": True,
        "files": [
            {
                "path": path,
                "valid": True,
                "errors": [],
                "world_size": 8,
                "pending_checks": [],
                "warnings": [],
            }
        ],
    }
    result = run_cli("validate", path, "-o", "degrees.tp")
    assert result.returncode == 2 and "expected key=value" in result.stderr


TP16_WARNING = (
    "degrees.tp: tp groups of 16 ranks are mixed in domain 'dataloading' with 8 GPUs per node; "
    "tensor parallelism exchanges activations in every layer, so they belong on one node's fast "
    "links: use a tp that divides 8"
)


def test_validate_reports_the_warnings_of_show(run_cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """The gate that pre-commit runs warns of what show warns of, from the same code; --strict
    fails on it."""
    path = write(tmp_path, "world_size: 64\ngpus_per_node: 8\ndegrees: {dp_shard: 8, tp: 8}\n")
    show = run_cli("show", path, "-o", "degrees.tp=16", "-o", "degrees.dp_shard=4")
    assert f"warning: {TP16_WARNING}" in show.stdout.splitlines()
    result = run_cli("validate", path, "-o", "degrees.tp=16", "-o", "degrees.dp_shard=4")
    assert (result.returncode, result.stdout.splitlines()) == (
        0,
        [
            f"{path}: warning: {TP16_WARNING}",
            f"{path}: ok (world_size 64), 1 warning (--strict fails on it)",
        ],
    )
    strict = ("--strict", "-o", "degrees.tp=16", "-o", "degrees.dp_shard=4")
    result = run_cli("validate", path, *strict)
    assert (result.returncode, result.stdout.splitlines()) == (
        1,
        [f"{path}: warning: {TP16_WARNING}", f"{path}: fails --strict: 1 warning"],
    )
    report = json.loads(run_cli("validate", path, *strict, "--format", "json").stdout)
    key, message = TP16_WARNING.split(": ", 1)
    assert report["valid"] is False
    assert report["files"][0]["warnings"] == [{"key": key, "message": message}]
    # A config without a warning passes --strict; a world that leaves the last node short
    # is a warning too.
    assert run_cli("validate", path, "--strict").stdout == f"{path}: ok (world_size 64)\n"
    short = write(tmp_path, "world_size: 12\ngpus_per_node: 8\n", "short.yaml")
    result = run_cli("validate", short, "--strict")
    assert result.returncode == 1
    assert result.stdout.splitlines()[0].startswith(
        f"{short}: warning: world_size: world_size 12 is not a multiple of gpus_per_node 8"
    )


@pytest.mark.slow  # starts Python processes
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


def _parsers() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    (subparsers,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return {
        "meshconf": parser,
        **{f"meshconf {verb}": sub for verb, sub in subparsers.choices.items()},
    }


def test_every_option_and_argument_has_help_text() -> None:
    missing = [
        f"{name} {action.option_strings[0] if action.option_strings else action.metavar or action.dest}"
        for name, parser in _parsers().items()
        for action in parser._actions
        if not isinstance(action, argparse._SubParsersAction) and not (action.help or "").strip()
    ]
    assert missing == []
    assert set(_parsers()) == {"meshconf", *(f"meshconf {verb}" for verb in VERBS)}


@pytest.mark.slow  # starts Python processes
def test_simulate_several_ranks_in_one_process(run_cli) -> None:  # type: ignore[no-untyped-def]
    result = run_cli(
        "simulate",
        "examples/llama3_70b_512gpu.yaml",
        "--rank",
        "0,77,511",
        "--rank",
        "5",
        "--rank",
        "77",
    )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].startswith(
        "simulated ranks 0, 77, 511, 5 of 512 against torch's fake process group: 4 domains each, built in "
    )
    counters = (
        "7 new_group calls, 6 real groups, 1 fake (size-1) groups, 0 reuses of the default "
        "group, 9 dims served by an existing group"
    )
    assert lines[1:] == [
        "  dataloading [pp=4, batch=16, cp=1, tp=8]: groups ok",
        "  dense [pp=4, dp_replicate=2, fsdp=8, tp=8]: groups ok",
        "  sparse [pp=4, dp_replicate=2, efsdp=64, ep=1, etp=1]: groups ok",
        "  loss [pp=4, loss=16, tp=8]: groups ok",
        *(f"process groups of rank {rank}: {counters}" for rank in (0, 77, 511, 5)),
        "every group and local rank equals the rank arithmetic of the degrees, computed apart from the layouts",
    ]
    result = run_cli("simulate", "examples/llama3_70b_512gpu.yaml", "--rank", "0,512")
    assert (result.returncode, result.stderr) == (
        2,
        "meshconf: error: --rank 512 is outside the world [0, 512)\n",
    )
    result = run_cli("simulate", "examples/llama3_70b_512gpu.yaml", "--rank", "0,,5")
    assert result.returncode == 2
    assert result.stderr == (
        "meshconf: error: --rank: expected ranks (integers >= 0) separated by commas, got '0,,5'\n"
    )


@given(
    st.lists(
        st.text(alphabet="0123456789²٣ ,+-x", max_size=12) | st.integers(0, 10**40).map(str),
        min_size=1,
        max_size=4,
    ).map(",".join)
)
def test_simulate_reads_any_rank_list_as_ranks_or_one_usage_message(text: str) -> None:
    """Digits other than ASCII, signs and integers of any length: ranks within what torch
    numbers, or argparse's usage message, never a conversion error."""
    try:
        ranks = rank_list(text)
    except argparse.ArgumentTypeError as error:
        message = str(error)
        assert message.startswith("expected ranks (integers >= 0) separated by commas, got ") or (
            message.endswith(" is larger than 2147483647, the most ranks torch can number")
        )
    else:
        assert ranks == [int(part) for part in text.split(",")]
        assert all(0 <= rank <= MAX_WORLD_SIZE for rank in ranks)


def test_show_leaves_out_trivial_dims_and_domains_unless_all(run_cli) -> None:  # type: ignore[no-untyped-def]
    shown = run_cli("show", "examples/llama3_70b_512gpu.yaml").stdout
    everything = run_cli("show", "examples/llama3_70b_512gpu.yaml", "--all").stdout
    assert shown.splitlines()[3] == (
        "not shown (trivial; --all shows them): dims cp, ep, etp (size 1); domain sparse (ep is 1)"
    )
    assert "\ndomain sparse [" not in shown and "\ndomain sparse [" in everything
    assert "  cp           1        8      512  intra-node  0" in everything.splitlines()
    assert not [
        line for line in shown.splitlines() if line.startswith(("  cp ", "  ep ", "  etp "))
    ]
    assert "  coordinate of rank 0: pp=0 batch=0 tp=0" in shown.splitlines()
    assert "not shown" not in everything
    # Expert parallelism on: the sparse domain is shown, without its size-1 dims.
    moe = run_cli("show", "examples/moe_ep8_etp1.yaml").stdout.splitlines()
    assert (
        moe[3] == "not shown (trivial; --all shows them): dims pp, cp, dp_replicate, etp (size 1)"
    )
    assert "domain sparse [pp=1, dp_replicate=1, efsdp=4, ep=8, etp=1]" in moe
    # One GPU: every domain is trivial; a domain asked for by name is shown all the same.
    single = run_cli("show", "examples/single_gpu.yaml").stdout.splitlines()
    assert single[3] == (
        "not shown (trivial; --all shows them): dims pp, batch, cp, tp, dp_replicate, fsdp, "
        "efsdp, ep, etp, loss (size 1); domains dataloading, dense, sparse, loss (only dims of size 1)"
    )
    assert not [line for line in single if line.startswith("domain ")]
    sparse = run_cli("show", "examples/single_gpu.yaml", "--domain", "sparse").stdout.splitlines()
    assert sparse[-4:] == [
        "domain sparse [pp=1, dp_replicate=1, efsdp=1, ep=1, etp=1]",
        "  every dim has size 1: rank 0 is alone in each of its groups",
        "",
        "rank 0 belongs to 0 distinct process groups of more than one rank across all domains",
    ]
    # JSON is data: it always has every dim and domain.
    report = json.loads(
        run_cli("show", "examples/llama3_70b_512gpu.yaml", "--format", "json").stdout
    )
    assert list(report["domains"]) == ["dataloading", "dense", "sparse", "loss"]
    assert [dim["name"] for dim in report["domains"]["sparse"]["dims"]] == [
        "pp",
        "dp_replicate",
        "efsdp",
        "ep",
        "etp",
    ]


def test_version() -> None:
    result = run_in_process("--version")
    assert (result.returncode, result.stdout) == (0, f"meshconf {meshconf.__version__}\n")
    assert re.fullmatch(r"\d+\.\d+\.\d+", meshconf.__version__)
