"""``meshconf plan`` for a real cluster: ``--gpu`` presets, bandwidths in GB/s, a config's
world, levels, ``inside``, order and pins (``plan CONFIG``), ``--level node=N``, and
``--emit`` writing the ``inside`` the row was ranked on, round-tripped through ``validate``
and ``show``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings, strategies as st

from meshconf.features.plan.estimate.gpus import GPUS
from meshconf.features.plan.locality import home_domain

RACK = """\
world_size: 1152
levels:
  - {name: node, size: 4}
  - {name: nvlink, size: 72}
inside:
  nvlink: [tp, ep]
order: [pp, dp_replicate, dp_shard, cp, tp]
degrees: {dp_shard: -1, tp: 4, ep: 8}
"""


def plan_json(run_cli: Any, *args: str) -> dict[str, Any]:
    result = run_cli("plan", *args, "--format", "json")
    assert result.returncode == 0, result.stderr
    report: dict[str, Any] = json.loads(result.stdout)
    return report


# --- --gpu ---------------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(GPUS))
def test_each_gpu_preset_is_the_hardware_of_the_estimate(run_cli, name: str) -> None:  # type: ignore[no-untyped-def]
    gpu = GPUS[name]
    args = ["--world-size", "64", "--gpus-per-node", "8", "--model", "llama3-8b", "--gpu", name]
    training = plan_json(run_cli, *args, "--limit", "1")["training"]
    assert (training["gpu"], training["gpu_memory_gib"], training["peak_tflops"]) == (
        name,
        gpu.memory_gib,
        gpu.peak_tflops,
    )
    assert (training["intra_node_gb_s"], training["inter_node_gb_s"]) == (
        gpu.scale_up_gb_s,
        gpu.network_gb_s,
    )
    text = run_cli("plan", *args, "--limit", "1").stdout.splitlines()
    assert text[1].endswith(f"{name}, {gpu.memory_gib:g} GiB per GPU")
    assert text[2].startswith(f"gpu {name}: {gpu.memory_gib:g} GiB, {gpu.peak_tflops:g} TFLOP/s")
    assert text[3].endswith(
        f"fit in {gpu.memory_gib:g} GiB; the best 1, best first (ranking: docs/plan.md)"
    )


def test_each_preset_cites_its_datasheet() -> None:
    for gpu in GPUS.values():
        assert "datasheet" in gpu.source or "data sheet" in gpu.source, gpu.name
        assert gpu.peak_tflops > 0 and gpu.memory_gib > 0 and gpu.scale_up_gb_s > 0


def test_options_replace_the_preset_s_figures(run_cli) -> None:  # type: ignore[no-untyped-def]
    args = ["--world-size", "64", "--gpus-per-node", "8", "--model", "llama3-8b", "--gpu", "gb200"]
    args += ["--gpu-memory-gib", "150", "--peak-tflops", "2000", "--inter-node-gb-s", "100"]
    training = plan_json(run_cli, *args, "--limit", "1")["training"]
    assert training["gpu"] == "gb200"
    assert (training["gpu_memory_gib"], training["peak_tflops"]) == (150, 2000)
    assert (training["intra_node_gb_s"], training["inter_node_gb_s"]) == (900, 100)


@pytest.mark.parametrize(("gpu", "units"), [("gb200", ["node", "nvlink"]), ("mi300x", ["node"])])
def test_a_moe_model_on_1152_gpus_is_planned_on_the_preset_s_own_levels(  # type: ignore[no-untyped-def]
    run_cli, gpu: str, units: list[str]
) -> None:
    args = ["plan", "--world-size", "1152", "--model", "deepseek-v3", "--gpu", gpu]
    args += ["--pp", "16", "--ep", "8", "--limit", "3"]
    result = run_cli(*args)
    assert result.returncode == 0, result.stderr
    preset = GPUS[gpu]
    levels = f"node={preset.gpus_per_node}"
    if preset.nvlink_domain is not None:
        levels += f" and nvlink={preset.nvlink_domain}@{preset.scale_up_gb_s:g}"
    assert (
        result.stderr
        == f"meshconf: note: --gpu {gpu}: levels {levels}, as its datasheet gives them\n"
    )
    lines = result.stdout.splitlines()
    assert lines[0].startswith(f"world_size 1152 = {1152 // preset.gpus_per_node} nodes x ")
    assert lines[2].startswith(f"gpu {gpu}: {preset.memory_gib:g} GiB")
    assert lines[3].startswith(f"12 valid assignments; 12 fit in {preset.memory_gib:g} GiB")
    assert lines[4:6] == [
        "15 left out: tp does not divide deepseek-v3's 128 attention heads",
        "etp tried: 1",
    ]
    report = plan_json(run_cli, *args[1:])
    assert [level["name"] for level in report.get("levels", [])] == units[1:]
    assert all(row["fits"] for row in report["assignments"])


def test_a_given_node_keeps_the_preset_s_levels_out(run_cli) -> None:  # type: ignore[no-untyped-def]
    result = run_cli("plan", "--world-size", "1152", "--gpu", "gb200", "--gpus-per-node", "4")
    assert result.returncode == 0 and result.stderr == ""
    assert "nvlink" not in result.stdout


# --- one unit of bandwidth ------------------------------------------------------------------


def test_the_old_gbps_options_are_gb_s_times_eight_with_a_note(run_cli) -> None:  # type: ignore[no-untyped-def]
    base = ["plan", "--world-size", "64", "--gpus-per-node", "8", "--model", "llama3-8b"]
    new = run_cli(*base, "--intra-node-gb-s", "300", "--inter-node-gb-s", "25")
    old = run_cli(*base, "--intra-node-gbps", "2400", "--inter-node-gbps", "200")
    assert old.stdout == new.stdout and new.stderr == ""
    assert old.stderr.splitlines() == [
        "meshconf: note: --intra-node-gbps takes Gb/s and goes away in the next release; use "
        "--intra-node-gb-s 300 (GB/s, as a level's bandwidth_gb_s)",
        "meshconf: note: --inter-node-gbps takes Gb/s and goes away in the next release; use "
        "--inter-node-gb-s 25 (GB/s, as a level's bandwidth_gb_s)",
    ]
    both = run_cli(*base, "--intra-node-gbps", "2400", "--intra-node-gb-s", "300")
    assert both.returncode == 2
    assert both.stderr.splitlines()[-1] == (
        "meshconf: error: --intra-node-gbps and --intra-node-gb-s exclude each other"
    )


# --- --level node=N -------------------------------------------------------------------------


@pytest.mark.parametrize("extra", [[], ["--emit", "2"], ["--format", "json"]])
def test_level_node_is_gpus_per_node(run_cli, extra: list[str]) -> None:  # type: ignore[no-untyped-def]
    base = ["plan", "--world-size", "256", "--tp", "4", *extra]
    by_level = run_cli(*base, "--level", "node=4", "--level", "nvlink=64")
    by_option = run_cli(*base, "--gpus-per-node", "4", "--level", "nvlink=64")
    assert by_level.returncode == 0, by_level.stderr
    assert by_level.stdout == by_option.stdout


def test_a_node_with_its_own_bandwidth_is_written_as_the_first_level(
    run_cli, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    result = run_cli("plan", "--world-size", "64", "--level", "node=4@900", "--emit", "1")
    assert result.returncode == 0, result.stderr
    config = yaml.safe_load(result.stdout)
    assert config["levels"] == [{"name": "node", "size": 4, "bandwidth_gb_s": 900.0}]
    assert "gpus_per_node" not in config
    assert result.stdout.startswith("# meshconf plan --world-size 64 --level node=4@900 --emit 1")


# --- plan CONFIG ----------------------------------------------------------------------------


def test_a_config_gives_world_levels_inside_order_and_pins(run_cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "rack.yaml"
    path.write_text(RACK)
    report = plan_json(run_cli, str(path), "--limit", "100")
    assert (report["world_size"], report["gpus_per_node"]) == (1152, 4)
    assert report["levels"] == [{"name": "nvlink", "size": 72, "bandwidth_gb_s": None}]
    assert report["pins"] == {"tp": 4, "ep": 8}
    assert report["order"] == ["pp", "dp_replicate", "dp_shard", "cp", "tp"]
    assert report["total"] == 90 and len(report["assignments"]) == 90
    for row in report["assignments"]:
        dims = {dim["name"]: dim["crosses"] for dim in row["dims"]}
        assert "nvlink" not in dims["tp"] and "nvlink" not in dims["ep"]


def test_an_option_beside_a_config_replaces_its_value_and_says_so(run_cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "rack.yaml"
    path.write_text(RACK)
    result = run_cli(
        "plan", str(path), "--tp", "2", "--world-size", "576", "--gpus-per-node", "8",
        "--order", "dp_replicate,pp,dp_shard,cp,tp", "--limit", "1",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert result.stderr.splitlines() == [
        f"meshconf: note: --world-size 576 replaces world_size 1152 of {path}",
        f"meshconf: note: --level node=8 replaces the node level node=4 of {path}",
        f"meshconf: note: --tp 2 replaces degrees.tp 4 of {path}",
        f"meshconf: note: --order dp_replicate,pp,dp_shard,cp,tp replaces order "
        f"pp,dp_replicate,dp_shard,cp,tp of {path}",
    ]
    assert result.stdout.startswith("world_size 576 = 72 nodes x 8 GPUs; pinned: tp=2 ep=8")


def test_a_config_inside_a_larger_file_and_its_overrides(run_cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "experiment.yaml"
    path.write_text(
        "lr: 0.1\nparallelism:\n" + "".join(f"  {line}\n" for line in RACK.splitlines())
    )
    report = plan_json(run_cli, str(path), "--key", "parallelism", "-o", "parallelism.degrees.tp=2")
    assert report["pins"] == {"tp": 2, "ep": 8}


def test_a_config_s_rows_keep_its_inside_or_are_left_out(run_cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    # dp_replicate fills the world, so dp_shard keeps its default (1) and is not pinned;
    # fsdp inside a node of 4: only dp_shard 1, 2 or 4 keeps it there
    path = tmp_path / "mesh.yaml"
    path.write_text(
        "world_size: 64\ngpus_per_node: 4\ninside: {node: [fsdp]}\ndegrees: {dp_replicate: -1}\n"
    )
    report = plan_json(run_cli, str(path), "--limit", "100")
    assert {row["degrees"]["dp_shard"] for row in report["assignments"]} == {1, 2, 4}
    assert report["total"] == len(report["assignments"])
    none = run_cli("plan", str(path), "--dp-shard", "8")
    assert none.returncode == 2
    assert none.stderr.startswith(
        "meshconf: error: no assignment keeps inside {node: [fsdp]}: 10 are valid without it, "
        "and each is refused with it, such as pp=8 dp_replicate=1 dp_shard=8 cp=1 tp=1: "
        "inside.node: fsdp = 8 (dp_shard(8)), which does not fit in one node of 4 GPUs"
    )


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "degrees: {tp: 4}\n",
            "meshconf: error: --world-size N is required: {path} has no world_size",
        ),
        (
            "world_size: 64\nlevels: [{name: nvlink, size: 8}]\ndegrees: {tp: 4}\n",
            "meshconf: error: --level nvlink=8 needs the node's size: add --level node=N (or "
            "--gpus-per-node N); a level holds whole nodes",
        ),
    ],
)
def test_what_a_config_cannot_plan_is_one_line(
    run_cli, tmp_path: Path, text: str, message: str
) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "mesh.yaml"
    path.write_text(text)
    result = run_cli("plan", str(path))
    assert result.returncode == 2
    assert result.stderr.splitlines() == [message.format(path=path)]


def test_an_invalid_config_is_reported_as_validate_reports_it(run_cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "mesh.yaml"
    path.write_text("world_size: 64\ndegrees: {tp: 3}\n")
    result = run_cli("plan", str(path))
    assert result.returncode == 1
    assert result.stdout == run_cli("validate", str(path)).stdout


def test_key_and_overrides_need_a_config(run_cli) -> None:  # type: ignore[no-untyped-def]
    result = run_cli("plan", "--world-size", "8", "-o", "degrees.tp=2")
    assert (result.returncode, result.stderr) == (
        2,
        "meshconf: error: -o needs a config: meshconf plan CONFIG -o ...\n",
    )


# --- --emit round trips ---------------------------------------------------------------------


def show_crossings(run_cli: Any, path: Path) -> dict[str, list[str]]:
    result = run_cli("show", str(path), "--format", "json")
    assert result.returncode == 0, result.stdout + result.stderr
    domains = json.loads(result.stdout)["domains"]
    return {
        dim["name"]: dim.get("crosses", ["node"] if dim["crosses_nodes"] else [])
        for domain, found in domains.items()
        for dim in found["dims"]
        if home_domain(dim["name"]) == domain
    }


@st.composite
def plans(draw: st.DrawFn) -> list[str]:
    world = draw(st.sampled_from([32, 64, 96, 128, 144]))
    node = draw(st.sampled_from([2, 4, 8]))
    args = ["--world-size", str(world), "--level", f"node={node}"]
    multiple = draw(st.sampled_from([2, 3, 4]))
    if world % (node * multiple) == 0 and draw(st.booleans()):
        args += ["--level", f"nvlink={node * multiple}"]
    if draw(st.booleans()):
        args += ["--ep", str(draw(st.sampled_from([2, 4])))]
    if draw(st.booleans()):
        args += [
            "--order",
            draw(
                st.sampled_from(
                    ["dp_replicate,dp_shard,pp,cp,tp", "tp,cp,dp_shard,dp_replicate,pp"]
                )
            ),
        ]
    return args


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(plans(), st.integers(1, 6))
def test_an_emitted_row_validates_and_shows_the_row_s_crossings(  # type: ignore[no-untyped-def]
    run_cli, tmp_path: Path, args: list[str], index: int
) -> None:
    report = plan_json(run_cli, *args, "--limit", str(index))
    if len(report["assignments"]) < index:
        return
    row = report["assignments"][index - 1]
    emitted = run_cli("plan", *args, "--emit", str(index))
    assert emitted.returncode == 0, emitted.stderr
    path = tmp_path / "planned.yaml"
    path.write_text(emitted.stdout)
    assert run_cli("validate", str(path)).returncode == 0
    config = yaml.safe_load(emitted.stdout)
    crossings = show_crossings(run_cli, path)
    sizes = [report["gpus_per_node"], *(level["size"] for level in report.get("levels", []))]
    kept = {name for names in config.get("inside", {}).values() for name in names}
    for dim in row["dims"]:
        crossed = dim.get("crosses", ["node"] if dim["crosses_nodes"] else [])
        assert crossings[dim["name"]] == crossed, (args, index, dim)
        # a dim of several ranks inside a level smaller than the world is kept inside it
        inner = len(crossed)
        if dim["size"] > 1 and inner < len(sizes) and sizes[inner] < report["world_size"]:
            assert dim["name"] in kept, (args, index, dim, config.get("inside"))
    again = run_cli(*emitted.stdout.splitlines()[0][2:].split(" (")[0].split()[1:])
    assert again.stdout == emitted.stdout


def test_an_emitted_row_of_a_config_keeps_its_inside(run_cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "rack.yaml"
    path.write_text(RACK)
    emitted = run_cli("plan", str(path), "--emit", "1")
    assert emitted.returncode == 0, emitted.stderr
    config = yaml.safe_load(emitted.stdout)
    assert config["inside"]["nvlink"][:2] == ["tp", "ep"]
    assert config["order"] == ["pp", "dp_replicate", "dp_shard", "cp", "tp"]
    planned = tmp_path / "planned.yaml"
    planned.write_text(emitted.stdout)
    assert run_cli("validate", str(planned)).returncode == 0
    again = run_cli(*emitted.stdout.splitlines()[0][2:].split(" (")[0].split()[1:])
    assert again.stdout == emitted.stdout
