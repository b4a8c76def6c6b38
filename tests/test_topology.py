"""Topology: where each dim's groups sit relative to nodes, and the warnings of ``show``.

Known answers from the textbook seed: 32 nodes of 8 GPUs with dp=32, tp=8 keeps every tp
group inside a node; 512 ranks as dp=8, pp=8, tp=8.
"""

from __future__ import annotations

import json
from pathlib import Path

from meshconf import load_config
from meshconf.core.errors import format_key
from meshconf.features.plan.topology import topology_warnings


def _placements(config_data: dict, domain: str, gpus_per_node: int) -> dict[str, str]:  # type: ignore[type-arg]
    layout = load_config(config_data).layout(domain)
    return {name: layout.placement(name, gpus_per_node) for name in layout.dim_names}


def _warnings(config_data: dict) -> list[str]:  # type: ignore[type-arg]
    config = load_config(config_data)
    assert config.gpus_per_node is not None
    return [
        f"{format_key(w.path)}: {w.message}"
        for w in topology_warnings(config, config.gpus_per_node)
    ]


def test_textbook_32_nodes_dp32_tp8() -> None:
    config = {
        "world_size": 256,
        "gpus_per_node": 8,
        "degrees": {"dp_replicate": 32, "dp_shard": 1, "tp": 8},
        "domains": {"textbook": ["dp_replicate", "tp"]},
    }
    assert _placements(config, "textbook", 8) == {
        "dp_replicate": "inter-node",
        "tp": "intra-node",
    }
    assert _warnings(config) == []


def test_textbook_512_ranks_dp8_pp8_tp8() -> None:
    config = {
        "world_size": 512,
        "gpus_per_node": 8,
        "degrees": {"dp_replicate": 8, "pp": 8, "tp": 8, "dp_shard": 1},
        "domains": {"textbook": ["dp_replicate", "pp", "tp"]},
    }
    assert _placements(config, "textbook", 8) == {
        "dp_replicate": "inter-node",
        "pp": "inter-node",
        "tp": "intra-node",
    }
    # On nodes of 16, pp's stride of 8 puts ranks 0 and 8 of one group on the first node.
    assert _placements(config, "textbook", 16)["pp"] == "mixed"
    assert _placements(config, "textbook", 4)["tp"] == "mixed"


def test_default_domains_with_fsdp_across_nodes() -> None:
    config = {"world_size": 64, "gpus_per_node": 8, "degrees": {"tp": 4, "cp": 2}}
    assert _placements(config, "dense", 8) == {
        "pp": "intra-node",
        "dp_replicate": "intra-node",
        "fsdp": "mixed",
        "tp": "intra-node",
    }
    assert _placements(config, "dataloading", 8)["cp"] == "intra-node"
    assert _warnings(config) == []


def test_tp_larger_than_a_node_is_warned_with_a_fix() -> None:
    config = {"world_size": 64, "gpus_per_node": 8, "degrees": {"tp": 16}}
    assert _warnings(config) == [
        "degrees.tp: tp groups of 16 ranks are mixed in domain 'dataloading' with 8 GPUs per "
        "node; tensor parallelism exchanges activations in every layer, so they belong on one "
        "node's fast links: use a tp that divides 8"
    ]


def test_tp_not_innermost_is_warned_with_a_fix() -> None:
    config = {
        "world_size": 32,
        "gpus_per_node": 8,
        "degrees": {"tp": 4, "cp": 2},
        "domains": {"dense": ["pp", "dp_replicate", "tp", "fsdp"]},
    }
    assert _warnings(config) == [
        "degrees.tp: tp groups of 4 ranks are inter-node in domain 'dense' with 8 GPUs per "
        "node; tensor parallelism exchanges activations in every layer, so they belong on one "
        "node's fast links: put tp innermost in domain 'dense' (only dims of size 1 after it)"
    ]


def test_cp_and_etp_across_nodes_are_warned() -> None:
    config = {
        "world_size": 64,
        "gpus_per_node": 4,
        "degrees": {"cp": 8, "tp": 2, "ep": 2, "etp": 2},
    }
    warnings = _warnings(config)
    assert [warning.split(":")[0] for warning in warnings] == ["degrees.cp"]
    assert "context parallelism passes attention blocks around its ring" in warnings[0]
    assert "use a cp that divides 4" in warnings[0]
    config = {"world_size": 64, "gpus_per_node": 4, "degrees": {"tp": 8, "ep": 2, "etp": 8}}
    assert [warning.split(":")[0] for warning in _warnings(config)] == [
        "degrees.tp",
        "degrees.etp",
    ]


def test_world_not_filling_whole_nodes_is_warned() -> None:
    config = {"world_size": 100, "gpus_per_node": 8, "degrees": {"tp": 4}}
    assert _warnings(config) == [
        "world_size: world_size 100 is not a multiple of gpus_per_node 8: the last node would "
        "run 4 ranks, but launchers start the same number on every node; use a multiple of 8, "
        "or set gpus_per_node to the ranks each node runs"
    ]


def test_show_marks_placement_and_warns(run_cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "mesh.yaml"
    path.write_text("world_size: 64\ndegrees: {tp: 16}\n")
    result = run_cli("show", str(path), "--gpus-per-node", "8", "--domain", "dense")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == "world_size 64, 8 GPUs per node; showing rank 0"
    assert lines[3].startswith("warning: degrees.tp: tp groups of 16 ranks are mixed")
    assert "  tp         16        1        4  mixed       0, 1, 2, ..., 15 (16 ranks)" in lines
    assert "  fsdp        4       16       16  inter-node  0, 16, 32, 48" in lines

    result = run_cli("show", str(path), "--gpus-per-node", "8", "--format", "json")
    report = json.loads(result.stdout)
    assert report["gpus_per_node"] == 8
    assert [w["key"] for w in report["warnings"]] == ["degrees.tp"]
    assert {d["name"]: d["placement"] for d in report["domains"]["dense"]["dims"]} == {
        "pp": "intra-node",
        "dp_replicate": "intra-node",
        "fsdp": "inter-node",
        "tp": "mixed",
    }


def test_gpus_per_node_option_must_agree_with_the_file(run_cli) -> None:  # type: ignore[no-untyped-def]
    result = run_cli("show", "examples/llama3_70b_512gpu.yaml", "--gpus-per-node", "4")
    assert result.returncode == 2
    assert result.stderr == (
        "meshconf: error: --gpus-per-node 4 disagrees with gpus_per_node 8 in "
        "examples/llama3_70b_512gpu.yaml\n"
    )
    result = run_cli("show", "examples/single_gpu.yaml", "--gpus-per-node", "5000")
    assert result.returncode == 2
    assert result.stderr == (
        "meshconf: error: --gpus-per-node: 5000 is larger than 4096, more than any node holds\n"
    )
