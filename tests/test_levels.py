"""Levels above the node (``levels``, ``inside``): the layouts against a brute-force
statement of what keeping dims inside a level means, every rule's message, and the issue's
GB200 NVL72 examples."""

from __future__ import annotations

import json
import math
import re
from typing import Any

import pytest
from brute_force import errors
from hypothesis import HealthCheck, assume, given, settings, strategies as st

from meshconf import ConfigError, load_config
from meshconf.core.degrees import WORLD_FACTORS, divisors
from meshconf.core.layout import DomainLayout
from meshconf.core.levels import crossed_levels
from meshconf.features.plan.topology import config_warnings

# efsdp is left out: it can vary only the outer digits of tp, which the numbering keeps
# inside with the inner ones (docs/topology.md), so its brute-force group is smaller.
KEEPABLE = ("pp", "dp_replicate", "dp_shard", "cp", "tp", "ep", "etp", "batch", "fsdp", "loss")


@st.composite
def topologies(draw: st.DrawFn) -> dict[str, Any]:
    degrees = {name: draw(st.sampled_from([1, 1, 2, 3, 4])) for name in WORLD_FACTORS}
    world = math.prod(degrees.values())
    assume(world <= 192)
    lender = degrees["dp_shard"] * degrees["cp"] * degrees["tp"]
    degrees["etp"] = draw(st.sampled_from([1, degrees["tp"]]))
    degrees["ep"] = draw(st.sampled_from(divisors(lender // degrees["etp"])))
    sizes = [draw(st.sampled_from([1, 2, 3, 4, 6, 8]))]
    for _ in range(draw(st.integers(0, 2))):
        sizes.append(sizes[-1] * draw(st.sampled_from([1, 2, 3, 4])))
    names = ["node", "nvlink", "pod"][: len(sizes)]
    inside = {
        name: draw(st.lists(st.sampled_from(KEEPABLE), min_size=1, max_size=3, unique=True))
        for name in names
        if draw(st.booleans())
    }
    assume(inside)
    return {
        "world_size": world,
        "degrees": degrees,
        "levels": [{"name": n, "size": s} for n, s in zip(names, sizes, strict=True)],
        "inside": inside,
    }


def logical_layouts(config_data: dict[str, Any]) -> dict[str, DomainLayout]:
    """The default domains over the logical world: ranks numbered as the logical index."""
    plain = {key: value for key, value in config_data.items() if key not in ("levels", "inside")}
    config = load_config(plain)
    # A world factor in no domain still has groups: the ranks that differ only in it.
    factors = [(name, config.resolved_degrees[name]) for name in WORLD_FACTORS]
    return {**config.layouts, "factors": DomainLayout.row_major("factors", factors)}


def component_sizes(layouts: dict[str, DomainLayout], dims: list[str], world: int) -> set[int]:
    """The sizes of the sets of ranks that the groups of ``dims`` join, by union-find."""
    parent = list(range(world))

    def root(rank: int) -> int:
        while parent[rank] != rank:
            parent[rank] = parent[parent[rank]]
            rank = parent[rank]
        return rank

    for layout in layouts.values():
        for dim in layout.dims:
            if dim.name in dims:
                for rank in range(world):
                    parent[root(rank)] = root(layout.group(rank, dim.name).base)
    counts: dict[int, int] = {}
    for rank in range(world):
        counts[root(rank)] = counts.get(root(rank), 0) + 1
    return set(counts.values())


def intersections(layouts: dict[str, DomainLayout], world: int) -> dict[tuple[str, ...], list[int]]:
    """For every two dims of the config's domains, the sizes of the intersections of their
    groups over all ranks: a numbering that keeps the domains' meaning only renames ranks,
    which leaves these as they are."""
    dims = [(domain, dim) for domain, layout in layouts.items() for dim in layout.dim_names]
    dims = [entry for entry in dims if entry[0] != "factors"]
    return {
        (*first, *second): sorted(
            len(
                set(layouts[first[0]].group(rank, first[1]))
                & set(layouts[second[0]].group(rank, second[1]))
            )
            for rank in range(world)
        )
        for first in dims
        for second in dims
        if first < second
    }


def is_product(layouts: dict[str, DomainLayout], dim: str) -> bool:
    """Whether every group along ``dim`` in the logical world is the product of the world
    factors' values it takes: a set a numbering by factors can place."""
    factors = layouts["factors"]
    for layout in layouts.values():
        if dim in layout.dim_names:
            for rank in range(layout.world_size):
                members = layout.group(rank, dim)
                group = {tuple(factors.coordinate(member).values()) for member in members}
                values = [{member[axis] for member in group} for axis in range(len(WORLD_FACTORS))]
                if len(group) != math.prod(len(taken) for taken in values):
                    return False
    return True


@pytest.mark.slow  # a long generated sweep: the quick loop leaves it out
@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(topologies())
def test_dims_kept_inside_a_level_stay_inside_every_unit_of_it(data: dict[str, Any]) -> None:
    """Refused exactly when the ranks the kept dims join cannot tile a level's units; else
    every group stays inside one unit, the domains keep their meaning (one rank numbering
    for all), and ``crossed_levels`` is what the ranks show."""
    world = data["world_size"]
    levels = [(level["name"], level["size"]) for level in data["levels"]]
    logical = logical_layouts(data)
    kept: list[str] = []
    misfit = []
    for name, size in levels:
        kept += [dim for dim in data["inside"].get(name, ()) if dim not in kept]
        (joined,) = component_sizes(logical, kept, world)
        if name in data["inside"] and world > size and size % joined:
            misfit.append(name)
    uneven = [dim for dim in data["inside"].values() for dim in dim if not is_product(logical, dim)]
    try:
        config = load_config(data)
    except ConfigError as error:
        rendered = [diagnostic.render() for diagnostic in error.diagnostics]
        if uneven:
            assert any("unevenly" in line for line in rendered), rendered
            return
        if misfit:
            assert [line.split(":")[0] for line in rendered] == [f"inside.{n}" for n in misfit]
            return
        assert all("unevenly" in line for line in rendered), rendered
        return
    assert not misfit and not uneven, (misfit, uneven)
    assert intersections(config.layouts, world) == intersections(logical, world)
    for name, size in levels:
        for dim in [
            d
            for other, _ in levels[: levels.index((name, size)) + 1]
            for d in data["inside"].get(other, ())
        ]:
            for layout in config.layouts.values():
                if dim in layout.dim_names:
                    for rank in range(world):
                        units = {member // size for member in layout.group(rank, dim)}
                        assert len(units) == 1, (name, dim, rank)
        for layout in config.layouts.values():
            for dim in layout.dim_names:
                crosses = any(
                    len({member // size for member in layout.group(rank, dim)}) > 1
                    for rank in range(world)
                )
                assert (name in crossed_levels(layout, dim, config.topology)) == crosses


GB200 = {
    "world_size": 1024,
    "levels": [
        {"name": "node", "size": 4, "bandwidth_gb_s": 900},
        {"name": "nvlink", "size": 64, "bandwidth_gb_s": 900},
    ],
    "degrees": {"pp": 4, "dp_shard": -1, "tp": 4, "ep": 16},
    "inside": {"nvlink": ["tp", "ep"]},
}


def test_tp_and_ep_kept_inside_an_nvlink_domain_of_16_nodes() -> None:
    """On GB200 racks run 16 nodes of 4 GPUs at a time: tp stays in a node by itself, ep
    borrows tp and 4 of dp_shard and stays in the rack, crossing nodes."""
    config = load_config(GB200)
    sparse, dense = config.layout("sparse"), config.layout("dense")
    assert sparse.group(0, "ep").ranks() == list(range(16))
    assert dense.group(0, "tp").ranks() == [0, 1, 2, 3]
    assert crossed_levels(sparse, "ep", config.topology) == ("node",)
    assert crossed_levels(dense, "tp", config.topology) == ()
    assert crossed_levels(dense, "fsdp", config.topology) == ("node", "nvlink")
    assert config.node_size == 4


def test_a_dim_the_row_major_order_would_scatter_is_gathered_into_the_domain() -> None:
    """pp inside the rack: row-major puts pp outermost, 256 ranks apart; kept inside, each
    pipeline's 4 stages sit in one rack of 64, and the domains still mean the same dims."""
    data = {**GB200, "inside": {"nvlink": ["pp", "tp"]}}
    config = load_config(data)
    dense = config.layout("dense")
    assert dense.group(0, "pp").ranks() == [0, 4, 8, 12]
    assert crossed_levels(dense, "pp", config.topology) == ("node",)
    plain = load_config({key: v for key, v in GB200.items() if key != "inside"})
    assert plain.layout("dense").group(0, "pp").ranks() == [0, 256, 512, 768]


def test_the_issue_s_message_for_a_tp_and_ep_that_do_not_fit_a_rack() -> None:
    data = {
        "world_size": 1152,
        "levels": [{"name": "node", "size": 4}, {"name": "nvlink", "size": 72}],
        "degrees": {"dp_shard": -1, "tp": 8, "ep": 16, "etp": 8},
        "inside": {"nvlink": ["tp", "ep"]},
    }
    assert errors(data) == [
        "inside.nvlink: tp * ep = 128 (dp_shard(16) * tp(8)), which does not fit in one nvlink "
        "domain of 72 GPUs: make tp * ep a divisor of 72, make levels[1].size a multiple of "
        "128, or keep tp and ep inside a larger level"
    ]


def test_groups_that_fit_but_do_not_tile_a_full_rack_are_refused_with_the_fix() -> None:
    data = {
        **GB200,
        "world_size": 1152,
        "levels": [{"name": "node", "size": 4}, {"name": "nvlink", "size": 72}],
    }
    assert errors(data) == [
        "inside.nvlink: tp and ep span 16 ranks together (dp_shard(4) * tp(4)), and groups of "
        "16 cannot fill one nvlink domain of 72 GPUs: make the groups divide 72, or set the "
        "level's size to the ranks the job runs in each of its units"
    ]


def test_a_world_smaller_than_one_unit_keeps_everything_inside() -> None:
    data = {**GB200, "world_size": 48, "degrees": {"dp_shard": -1, "tp": 4, "ep": 16}}
    config = load_config(
        {**data, "levels": [{"name": "node", "size": 4}, {"name": "nvlink", "size": 72}]}
    )
    assert crossed_levels(config.layout("dense"), "fsdp", config.topology) == ("node",)


def test_a_partial_last_unit_is_allowed() -> None:
    """7 racks of 64 and 4 nodes of an eighth: groups of 16 tile every full rack and the
    part of the last one."""
    config = load_config(
        {**GB200, "world_size": 464, "degrees": {"dp_shard": -1, "tp": 4, "ep": 16}}
    )
    assert config.layout("sparse").group(463, "ep").ranks() == list(range(448, 464))


def test_every_level_rule_is_located() -> None:
    data = {
        "world_size": 64,
        "gpus_per_node": 4,
        "levels": [{"name": "node", "size": 8}, {"name": "nvlnk", "size": 70}],
        "degrees": {"dp_shard": -1, "tp": 4},
        "inside": {"nvlink": ["fdsp"], "rack": []},
        "inside_node": {"tp": 4},
    }
    assert errors(data) == [
        "levels[0].name: gpus_per_node already gives the node level; leave this one out or "
        "gpus_per_node",
        "levels[1].size: one nvlnk domain of 70 GPUs must hold whole units of the level below "
        "(one node of 8 GPUs): 70 is not a multiple of 8; make it one, such as 64 or 72",
        "inside: inside_node already places the world factors inside a node; inside keeps dims "
        "inside levels: give one of them",
        "inside.nvlink: unknown level 'nvlink' (did you mean 'nvlnk'?); levels are node, nvlnk: "
        "add {name: nvlink, size: N} to levels, N the GPUs of one nvlink domain",
        "inside.nvlink[0]: unknown dim 'fdsp' (did you mean 'fsdp'?); inside keeps the degrees and "
        "the derived dims: pp, dp_replicate, dp_shard, cp, tp, ep, etp, batch, fsdp, loss, efsdp",
        "inside.rack: unknown level 'rack'; levels are node, nvlnk: add {name: rack, size: N} to "
        "levels, N the GPUs of one rack domain",
        "inside.rack: lists no dims; leave the level out instead",
    ]


#: What a refusal says to do: an instruction after its colon or semicolon, the value it
#: expected, the bound it passed, the names allowed, or the name meant.
_FIX = re.compile(
    r"[:;] (set|make|add|give|leave|use|name|keep|start|remove|complete|write|change)\b"
    r"|expected |is larger than \d|; allowed: |did you mean |; inside keeps "
)


def carries_a_fix(message: str) -> bool:
    return _FIX.search(message) is not None


NAMES = st.sampled_from(["node", "nvlink", "pod", "rack", "", "1x", "n" * 80, "tp", "NODE"])
SIZES = st.one_of(
    st.integers(-2, 300), st.sampled_from([2**31, 2**70, 72, 1152]), st.text(max_size=3)
)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.fixed_dictionaries(
            {"name": NAMES, "size": SIZES},
            optional={"bandwidth_gb_s": st.one_of(st.floats(), st.integers(), st.none())},
        ),
        max_size=20,
    ),
    st.dictionaries(
        NAMES, st.lists(st.sampled_from([*KEEPABLE, "efsdp", "x", "dp"]), max_size=4), max_size=5
    ),
    st.sampled_from([None, 8, 1024, 2**20]),
)
def test_any_levels_and_inside_are_a_config_or_located_errors(
    levels: list[dict[str, Any]], inside: dict[str, list[str]], world_size: int | None
) -> None:
    """Generated levels and inside, sizes from negative to 2**70: a config, or one located
    line per problem; never another exception."""
    data: dict[str, Any] = {"levels": levels, "inside": inside, "degrees": {"tp": 4, "ep": 2}}
    if world_size is not None:
        data["world_size"] = world_size
    try:
        config = load_config(data)
    except ConfigError as error:
        for diagnostic in error.diagnostics:
            line = diagnostic.render()
            assert "\n" not in line and diagnostic.path, line
            assert diagnostic.path[0] in ("levels", "inside", "degrees", "world_size"), line
            if diagnostic.path[0] in ("levels", "inside"):
                assert carries_a_fix(diagnostic.message), line
        return
    if config.resolved_world_size is not None:
        assert all(
            layout.world_size == config.resolved_world_size for layout in config.layouts.values()
        )


@settings(max_examples=200, deadline=None)
@given(
    st.sampled_from([2, 4, 8]),
    st.sampled_from([2, 3, 4, 9]),
    st.fixed_dictionaries(
        {
            "pp": st.sampled_from([1, 2, 4]),
            "dp_shard": st.sampled_from([1, 2, 3, 8, 16]),
            "cp": st.sampled_from([1, 2]),
            "tp": st.sampled_from([1, 2, 4, 8, 16]),
        }
    ),
    st.dictionaries(
        st.sampled_from(["node", "nvlink", "pod"]),
        st.lists(st.sampled_from([*KEEPABLE, "efsdp"]), min_size=1, max_size=3, unique=True),
        max_size=3,
    ),
)
def test_every_refusal_of_well_formed_levels_and_inside_says_what_to_change(
    node: int, per_nvlink: int, degrees: dict[str, int], inside: dict[str, list[str]]
) -> None:
    """Levels and inside that read as a config, over generated degrees: each refusal of them
    ends with a fix."""
    world = math.prod(degrees.values())
    data = {
        "world_size": world,
        "levels": [{"name": "node", "size": node}, {"name": "nvlink", "size": node * per_nvlink}],
        "inside": inside,
        "degrees": {**degrees, "ep": 2 if degrees["tp"] % 2 == 0 else 1},
    }
    try:
        load_config(data)
    except ConfigError as error:
        for diagnostic in error.diagnostics:
            if diagnostic.path and diagnostic.path[0] in ("levels", "inside"):
                assert carries_a_fix(diagnostic.message), diagnostic.render()


def test_show_says_which_levels_each_group_crosses(run_cli) -> None:  # type: ignore[no-untyped-def]
    path = "examples/gb200_nvl72_moe.yaml"
    result = run_cli("show", path, "--domain", "sparse")
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[:14] == [
        "world_size 1024, levels node=4 nvlink=64; showing rank 0",
        "degrees: pp=4 dp_replicate=1 dp_shard=64 cp=1 tp=4 ep=16 etp=1",
        "derived: batch=64 fsdp=64 loss=64 efsdp=16",
        "kept inside one nvlink domain: tp, ep",
        "placed inside one nvlink domain: dp_shard=4 tp=4",
        "placed across nvlink domains: pp=4 dp_shard=16",
        "not shown (trivial; --all shows them): dims dp_replicate, etp (size 1)",
        "",
        "domain sparse [pp=4, dp_replicate=1, efsdp=16, ep=16, etp=1]",
        "  dim       size   stride   groups  crosses      group of rank 0",
        "  pp           4      256      256  node,nvlink  0, 256, 512, 768",
        "  efsdp       16       16       64  node,nvlink  0, 16, 32, ..., 240 (16 ranks)",
        "  ep          16        1       64  node         0, 1, 2, ..., 15 (16 ranks)",
        "  coordinate of rank 0: pp=0 efsdp=0 ep=0",
    ]
    report = json.loads(run_cli("show", path, "--format", "json").stdout)
    assert report["levels"] == [
        {"name": "node", "size": 4, "bandwidth_gb_s": 900.0},
        {"name": "nvlink", "size": 64, "bandwidth_gb_s": 900.0},
    ]
    assert report["inside"] == {"nvlink": ["tp", "ep"]}
    dense = {dim["name"]: dim["crosses"] for dim in report["domains"]["dense"]["dims"]}
    assert dense == {
        "pp": ["node", "nvlink"],
        "dp_replicate": [],
        "fsdp": ["node", "nvlink"],
        "tp": [],
    }


def test_render_outlines_every_level(run_cli, tmp_path) -> None:  # type: ignore[no-untyped-def]
    out = tmp_path / "sparse.svg"
    result = run_cli(
        "render", "examples/gb200_nvl72_moe.yaml", "--domain", "sparse", "-O", str(out)
    )
    assert result.returncode == 0, result.stderr
    svg = out.read_text()
    assert svg.count('class="node"') == 256
    assert svg.count('class="level-nvlink"') == 16
    assert "outlined: 16 nvlink domains of 64 GPUs" in svg
    assert "1024 ranks, 4 GPUs per node, nvlink domains of 64" in svg


def test_a_high_traffic_dim_inside_leaves_out_is_warned_with_the_inside_fix() -> None:
    data = {
        "world_size": 16,
        "levels": [{"name": "node", "size": 4}, {"name": "nvlink", "size": 16}],
        "degrees": {"dp_shard": 8, "tp": 2},
        "inside": {"nvlink": ["fsdp"]},
    }
    config = load_config(data)
    assert config.layout("dense").group(0, "tp").ranks() == [0, 8]
    assert [warning.message for warning in config_warnings(config)] == [
        "tp groups of 2 ranks are inter-node in domain 'dataloading' with 4 GPUs per node; "
        "tensor parallelism exchanges activations in every layer, so they belong on one "
        "node's fast links: keep it in a node with inside: {node: [tp]}, or in a larger level"
    ]
    kept = load_config({**data, "inside": {"nvlink": ["fsdp"], "node": ["tp"]}})
    assert config_warnings(kept) == []
    assert kept.layout("dense").group(0, "tp").ranks() == [0, 1]
