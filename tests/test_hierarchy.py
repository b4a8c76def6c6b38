"""Hierarchical placement (``inside_node``): every rule's message, the layouts against a
brute-force statement of what the placement means, and the issue's known answers."""

from __future__ import annotations

import json
import math

import pytest
from brute_force import assert_refused_only_for_uneven_groups, brute_force_groups, errors
from hypothesis import HealthCheck, given, settings, strategies as st

from meshconf import ConfigError, load_config
from meshconf.core.degrees import WORLD_FACTORS, divisors
from meshconf.features.plan.topology import topology_warnings

DEFAULT_ORDER = list(WORLD_FACTORS)


@st.composite
def placements(draw: st.DrawFn) -> tuple[dict[str, int], dict[str, int], int]:
    degrees = {name: draw(st.sampled_from([1, 1, 2, 3, 4])) for name in WORLD_FACTORS}
    inside = {name: draw(st.sampled_from(divisors(degrees[name]))) for name in WORLD_FACTORS}
    lender = degrees["dp_shard"] * degrees["cp"] * degrees["tp"]
    degrees["etp"] = draw(st.sampled_from([1, degrees["tp"]]))
    degrees["ep"] = draw(st.sampled_from(divisors(lender // degrees["etp"])))
    return degrees, inside, math.prod(inside.values())


@pytest.mark.slow  # a long generated sweep: the quick loop leaves it out
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(placements())
def test_every_group_is_the_brute_force_group_in_rank_order(
    placement: tuple[dict[str, int], dict[str, int], int],
) -> None:
    degrees, inside, gpus = placement
    world = math.prod(degrees[name] for name in WORLD_FACTORS)
    data = {"world_size": world, "gpus_per_node": gpus, "degrees": degrees, "inside_node": inside}
    try:
        config = load_config(data)
    except ConfigError as error:
        assert_refused_only_for_uneven_groups(error, degrees, DEFAULT_ORDER, inside, gpus)
        return
    for domain, layout in config.layouts.items():
        sizes = list(layout.shape)
        for axis, dim in enumerate(layout.dims):
            groups = brute_force_groups(degrees, DEFAULT_ORDER, inside, gpus, sizes, axis)
            expected = {tuple(group) for group in groups.values()}
            actual = set()
            for rank in range(world):
                group = layout.group(rank, dim.name).ranks()
                assert group == sorted(group), (domain, dim.name, group)
                assert layout.coordinate(rank)[dim.name] == group.index(rank)
                actual.add(tuple(group))
            assert actual == expected, (domain, dim.name)
        for rank in range(world):
            assert layout.rank_at(layout.coordinate(rank)) == rank


ISSUE_EXAMPLE = {
    "world_size": 256,
    "gpus_per_node": 16,
    "degrees": {"dp_shard": 32, "tp": 8},
    "inside_node": {"dp_shard": 2, "tp": 8},
}


def test_the_issue_example_is_the_row_major_layout_stated_and_checked() -> None:
    """dp_shard = 2 inside x 16 across, tp = 8 inside, on 16-GPU nodes: what row-major
    already does, now written down, so that a change that moves it is an error."""
    hierarchical = load_config(ISSUE_EXAMPLE)
    plain = load_config({key: v for key, v in ISSUE_EXAMPLE.items() if key != "inside_node"})
    assert hierarchical.layouts == plain.layouts
    dense = hierarchical.layout("dense")
    assert dense.placement("tp", 16) == "intra-node"
    assert dense.placement("fsdp", 16) == "mixed"
    assert dense.group(0, "fsdp").ranks()[:4] == [0, 8, 16, 24]
    assert errors({**ISSUE_EXAMPLE, "degrees": {"dp_shard": 64, "tp": 4}}) == [
        "inside_node.tp: 8 ranks of tp inside a node must divide tp(4), so that the rest go "
        "across nodes in whole groups"
    ]


LONG_CONTEXT = {
    "world_size": 128,
    "gpus_per_node": 8,
    "degrees": {"dp_shard": 8, "cp": 4, "tp": 4},
    "inside_node": {"dp_shard": 2, "cp": 1, "tp": 4},
}


def test_cp_across_nodes_with_fsdp_partly_inside() -> None:
    """Row-major would put 2 of cp inside each node; this placement keeps cp across nodes
    and 2 FSDP shards inside: dp_shard is two parts, fsdp = dp_shard * cp three."""
    config = load_config(LONG_CONTEXT)
    dataloading, dense = config.layout("dataloading"), config.layout("dense")
    assert dataloading.group(0, "cp").ranks() == [0, 8, 16, 24]
    assert dataloading.group(0, "batch").ranks() == [0, 4, 32, 36, 64, 68, 96, 100]
    assert [(mode.size, mode.stride) for mode in dataloading.dim("batch").modes] == [
        (4, 32),
        (2, 4),
    ]
    # fsdp's parts, dp_shard across (32), dp_shard inside (4) and cp across (8), fuse into
    # one mode: every 4th rank.
    assert dense.group(5, "fsdp").ranks() == list(range(1, 128, 4))
    assert [dense.placement(dim, 8) for dim in dense.dim_names] == [
        "intra-node",
        "intra-node",
        "mixed",
        "intra-node",
    ]
    assert dataloading.placement("cp", 8) == "inter-node"
    assert topology_warnings(config, 8) == []
    plain = load_config({key: v for key, v in LONG_CONTEXT.items() if key != "inside_node"})
    assert plain.layout("dataloading").placement("cp", 8) == "mixed"


def test_a_high_traffic_dim_left_out_of_inside_node_is_warned_with_the_fix() -> None:
    inside = {"dp_shard": 2, "tp": 4}
    config = load_config({**LONG_CONTEXT, "inside_node": inside})
    assert [warning.message for warning in topology_warnings(config, 8)] == [
        "cp groups of 4 ranks are inter-node in domain 'dataloading' with 8 GPUs per node; "
        "context parallelism passes attention blocks around its ring in every layer, so they "
        "belong on one node's fast links: give cp its part in inside_node: cp: 4 puts it "
        "inside (shrink another part to keep their product 8), cp: 1 keeps it across nodes on "
        "purpose"
    ]


def test_inside_node_needs_gpus_per_node() -> None:
    data = {**ISSUE_EXAMPLE}
    del data["gpus_per_node"]
    assert errors(data) == [
        "inside_node: needs gpus_per_node: it places ranks inside nodes of that many GPUs "
        "(dp_shard(2) * tp(8): 16 per node)"
    ]


def test_inside_parts_must_fill_a_node() -> None:
    assert errors({**ISSUE_EXAMPLE, "inside_node": {"tp": 8}}) == [
        "inside_node: tp(8): 8 ranks per node != gpus_per_node 16; the parts inside a node "
        "must fill it exactly (a world factor left out has 1 inside)"
    ]
    assert errors({**ISSUE_EXAMPLE, "inside_node": {}}) == [
        "inside_node: no part above 1: 1 ranks per node != gpus_per_node 16; the parts inside "
        "a node must fill it exactly (a world factor left out has 1 inside)"
    ]


def test_inside_parts_must_divide_their_degree() -> None:
    data = {**ISSUE_EXAMPLE, "degrees": {"dp_shard": 8, "cp": 4, "tp": 8}}
    data["inside_node"] = {"cp": 2, "tp": 8}
    assert load_config(data).layout("dataloading").placement("cp", 16) == "mixed"
    data["degrees"] = {"dp_shard": 8, "cp": 3, "tp": 8}
    data["world_size"] = 192
    assert errors(data) == [
        "inside_node.cp: 2 ranks of cp inside a node must divide cp(3), so that the rest go "
        "across nodes in whole groups"
    ]


def test_a_minus_one_degree_is_checked_once_the_world_is_known() -> None:
    data = {
        "gpus_per_node": 8,
        "degrees": {"dp_shard": -1, "tp": 4},
        "inside_node": {"dp_shard": 2, "tp": 4},
    }
    assert "inside_node.dp_shard: divides the -1 degree dp_shard" in (
        load_config(data).pending_checks
    )
    assert load_config({**data, "world_size": 64}).layout("dense").placement("fsdp", 8) == "mixed"
    assert errors({**data, "world_size": 4}) == [
        "inside_node.dp_shard: 2 ranks of dp_shard inside a node must divide dp_shard(1), so "
        "that the rest go across nodes in whole groups"
    ]


def test_expert_degrees_are_not_placed() -> None:
    assert errors({**ISSUE_EXAMPLE, "inside_node": {"dp_shard": 2, "tp": 8, "ep": 2}}) == [
        "inside_node.ep: ep is not a world factor: experts borrow their ranks from "
        "dp_shard * cp * tp, so place those; inside_node takes pp, dp_replicate, dp_shard, cp, tp"
    ]


def test_inside_parts_are_integers_no_larger_than_a_node() -> None:
    assert errors({**ISSUE_EXAMPLE, "inside_node": {"tp": -1}}) == [
        "inside_node.tp: expected an integer >= 1, got -1"
    ]
    assert errors({**ISSUE_EXAMPLE, "inside_node": {"tp": 8192}}) == [
        "inside_node.tp: 8192 is larger than 4096, more than any node holds"
    ]


UNEVEN = {
    "world_size": 12,
    "gpus_per_node": 6,
    "degrees": {"dp_shard": 3, "cp": 2, "tp": 2, "ep": 3},
    "inside_node": {"dp_shard": 3, "tp": 2},
}


def test_a_dim_that_splits_a_part_unevenly_is_refused() -> None:
    """ep = 3 would take tp's 2 ranks inside a node and one of cp's 2 across: ranks 0, 1
    and 6 for one group, 7, 2 and 3 for the next; no layout describes that."""
    assert errors(UNEVEN) == [
        "inside_node: ep(3) in domain 'sparse' would split the 2 ranks of tp inside a node "
        "unevenly: it needs 3 ranks where 2 remain; a dim must take whole parts or an even "
        "share of one, so change inside_node or the size of ep"
    ]
    with_domains = {**UNEVEN, "domains": {"sparse": ["pp", "dp_replicate", "efsdp", "ep", "etp"]}}
    assert errors(with_domains)[0].startswith("domains.sparse[3]: ep(3) in domain 'sparse'")


def test_parts_that_run_on_split_together() -> None:
    """dp_shard's 3 inside and 2 across are contiguous (strides 2 and 6), so ep = 4 takes
    tp's 2 and 2 of that run of 6: the groups are ranks 0-3, 4-7 and 8-11."""
    config = load_config({**UNEVEN, "degrees": {"dp_shard": 6, "tp": 2, "ep": 4}})
    assert config.layout("sparse").group(5, "ep").ranks() == [4, 5, 6, 7]


def test_shared_dims_must_still_agree_across_domains() -> None:
    data = {
        **LONG_CONTEXT,
        "domains": {"a": ["pp", "batch", "cp", "tp"], "b": ["tp", "batch", "cp"]},
    }
    assert errors(data) == [
        "domains.b[0]: 'tp' has size 4 stride 32 here but size 4 stride 1 in domain 'a'; a dim "
        "must denote the same rank groups in every domain",
        "domains.b[1]: 'batch' has size 8 stride 4 here but size 4 stride 32 and size 2 stride "
        "4 in domain 'a'; a dim must denote the same rank groups in every domain",
        "domains.b[2]: 'cp' has size 4 stride 1 here but size 4 stride 8 in domain 'a'; a dim "
        "must denote the same rank groups in every domain",
    ]


def test_show_prints_the_split_and_each_part_s_stride(run_cli) -> None:  # type: ignore[no-untyped-def]
    path = "examples/hierarchical_long_context.yaml"
    result = run_cli("show", path, "--rank", "5", "--domain", "dataloading", "--all")
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[3:10] == [
        "inside each node: dp_shard=2 tp=4; across nodes: dp_shard=4 cp=4",
        "",
        "domain dataloading [pp=1, batch=8, cp=4, tp=4]",
        "  dim       size   stride   groups  placement   group of rank 5",
        "  pp           1      128      128  intra-node  5",
        "  batch        8     32,4       16  mixed       1, 5, 33, 37, 65, 69, 97, 101",
        "  cp           4        8       32  inter-node  5, 13, 21, 29",
    ]
    result = run_cli("show", path, "--rank", "5", "--format", "json")
    report = json.loads(result.stdout)
    assert report["inside_node"] == {"pp": 1, "dp_replicate": 1, "dp_shard": 2, "cp": 1, "tp": 4}
    batch = report["domains"]["dataloading"]["dims"][1]
    assert (batch["name"], batch["modes"], batch["stride"]) == ("batch", [[4, 32], [2, 4]], 4)
    assert report["warnings"] == []
