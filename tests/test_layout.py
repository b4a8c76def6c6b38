"""Layout math against an independent reference: enumerate the row-major world by hand."""

from __future__ import annotations

import itertools
import math

import pytest
from hypothesis import given, settings, strategies as st

from meshconf.core.layout import DimLayout, DomainLayout, LayoutError, Mode, process_group_count


def dim(name: str, modes: list[tuple[int, int]]) -> DimLayout:
    return DimLayout(name, tuple(Mode(size, stride) for size, stride in modes))


def reference_groups(sizes: list[int], axis: int) -> list[list[int]]:
    """Groups along ``axis`` of ``arange(prod(sizes)).reshape(sizes)``, by brute force."""
    groups: dict[tuple[int, ...], list[int]] = {}
    for rank, coordinate in enumerate(itertools.product(*(range(s) for s in sizes))):
        key = coordinate[:axis] + coordinate[axis + 1 :]
        groups.setdefault(key, []).append(rank)
    return list(groups.values())


def test_textbook_256_ranks_dp8_pp4_tp8() -> None:
    layout = DomainLayout.row_major("mesh", [("dp", 8), ("pp", 4), ("tp", 8)])
    assert layout.world_size == 256
    assert layout.group(0, "tp").ranks() == [0, 1, 2, 3, 4, 5, 6, 7]
    assert layout.group(8, "tp").ranks() == list(range(8, 16))
    assert layout.group(0, "pp").ranks() == [0, 8, 16, 24]
    assert layout.group(1, "pp").ranks() == [1, 9, 17, 25]
    assert layout.group(0, "dp").ranks() == [0, 32, 64, 96, 128, 160, 192, 224]
    assert [layout.num_groups(d) for d in ("dp", "pp", "tp")] == [32, 64, 32]
    assert layout.group(64, ["pp", "tp"]).ranks() == list(range(64, 96))
    assert [layout.dim(d).stride for d in ("dp", "pp", "tp")] == [32, 8, 1]


def test_textbook_topology_32_nodes_of_8() -> None:
    layout = DomainLayout.row_major("mesh", [("dp", 32), ("tp", 8)])
    assert not layout.crosses_nodes("tp", 8)
    assert layout.crosses_nodes("dp", 8)
    wrong_way = DomainLayout.row_major("mesh", [("tp", 8), ("dp", 32)])
    assert wrong_way.crosses_nodes("tp", 8)


@pytest.mark.parametrize("sizes", [[2, 3, 4], [4, 1, 2, 2], [1, 1, 1], [5, 7], [2, 2, 2, 2, 2]])
def test_groups_match_brute_force(sizes: list[int]) -> None:
    names = [f"d{i}" for i in range(len(sizes))]
    layout = DomainLayout.row_major("mesh", list(zip(names, sizes, strict=True)))
    for axis, name in enumerate(names):
        expected = reference_groups(sizes, axis)
        for group in expected:
            for rank in group:
                assert layout.group(rank, name).ranks() == group
        assert layout.num_groups(name) == len(expected)
    for rank, coordinate in enumerate(itertools.product(*(range(s) for s in sizes))):
        assert layout.coordinate(rank) == dict(zip(names, coordinate, strict=True))
        assert layout.rank_at(dict(zip(names, coordinate, strict=True))) == rank


def test_multi_dim_group_is_a_row_major_submesh() -> None:
    layout = DomainLayout.row_major(
        "dense", [("pp", 2), ("dp_replicate", 2), ("fsdp", 2), ("tp", 2)]
    )
    assert layout.group(0, ["dp_replicate", "fsdp"]).ranks() == [0, 2, 4, 6]
    assert layout.group(9, ["dp_replicate", "fsdp"]).ranks() == [9, 11, 13, 15]
    assert layout.group(9, ["fsdp", "dp_replicate"]).ranks() == [9, 13, 11, 15]
    assert layout.num_groups(["dp_replicate", "fsdp"]) == 4


def test_multi_mode_dim() -> None:
    # dp split into 2 inside a node (stride 4) and 2 across (stride 16); tp 4 innermost.
    layout = DomainLayout(
        "h",
        32,
        (
            dim("dp", [(2, 16), (2, 4)]),
            dim("pp", [(2, 8)]),
            dim("tp", [(4, 1)]),
        ),
    )
    assert layout.group(0, "dp").ranks() == [0, 4, 16, 20]
    assert layout.coordinate(20) == {"dp": 3, "pp": 0, "tp": 0}
    assert layout.rank_at({"dp": 3, "pp": 1, "tp": 2}) == 16 + 4 + 8 + 2
    assert not layout.crosses_nodes("tp", 8)
    assert layout.crosses_nodes("dp", 8)


def test_layout_must_be_a_bijection() -> None:
    with pytest.raises(LayoutError, match="one to one"):
        DomainLayout("bad", 8, (dim("a", [(2, 1)]), dim("b", [(4, 1)])))
    with pytest.raises(LayoutError, match="cover 8 ranks, not world_size 16"):
        DomainLayout.row_major("bad", [("a", 2), ("b", 4)], 16)


def test_queries_reject_bad_input() -> None:
    layout = DomainLayout.row_major("dense", [("pp", 2), ("tp", 4)])
    with pytest.raises(LayoutError, match=r"rank 8 is outside the world \[0, 8\)"):
        layout.coordinate(8)
    with pytest.raises(LayoutError, match="has no dim 'cp'; its dims are \\['pp', 'tp'\\]"):
        layout.group(0, "cp")
    with pytest.raises(LayoutError, match="index 4 of dim 'tp' is outside"):
        layout.rank_at({"pp": 0, "tp": 4})
    with pytest.raises(LayoutError, match="missing \\['tp'\\]"):
        layout.rank_at({"pp": 0})
    messages = {
        "repeated dim": (
            lambda: DomainLayout.row_major("d", [("a", 2), ("a", 2)]),
            "domain 'd' repeats a dim: ['a', 'a']",
        ),
        "unknown dim in a coordinate": (
            lambda: layout.rank_at({"pp": 0, "tp": 0, "cp": 1}),
            "a coordinate of domain 'dense' needs exactly the dims ['pp', 'tp']; missing [], "
            "unknown ['cp']",
        ),
        "repeated dim in a query": (
            lambda: layout.group(0, ["tp", "tp"]),
            "dims ['tp', 'tp'] repeat a name",
        ),
        "no node": (lambda: layout.crosses_nodes("tp", 0), "gpus_per_node must be >= 1, got 0"),
    }
    for call, message in messages.values():
        with pytest.raises(LayoutError) as caught:
            call()
        assert str(caught.value) == message


def test_group_counts_are_integers() -> None:
    layout = DomainLayout.row_major("dense", [("pp", 2), ("tp", 4)])
    counts = [layout.num_groups("tp"), layout.num_groups("pp"), layout.num_groups(["pp", "tp"])]
    assert counts == [2, 4, 1] and all(type(count) is int for count in counts)


@pytest.mark.parametrize("gpus_per_node", [1, 2, 3, 4, 5, 6, 8, 12, 16, 24, 64])
@pytest.mark.parametrize("sizes", [[4, 6], [6, 4], [2, 3, 4], [3, 2, 2, 2], [8, 3]])
def test_crosses_nodes_matches_brute_force(sizes: list[int], gpus_per_node: int) -> None:
    names = [f"d{i}" for i in range(len(sizes))]
    layout = DomainLayout.row_major("mesh", list(zip(names, sizes, strict=True)))
    for axis, name in enumerate(names):
        expected = any(
            len({rank // gpus_per_node for rank in group}) > 1
            for group in reference_groups(sizes, axis)
        )
        assert layout.crosses_nodes(name, gpus_per_node) == expected, (name, sizes, gpus_per_node)


@st.composite
def mixed_radix_layouts(draw: st.DrawFn) -> DomainLayout:
    """Any layout: digits of sizes 1-6 numbering the world in mixed radix, dealt out to up to
    three dims in any order, so a dim may own digits that are far apart."""
    sizes = draw(st.lists(st.integers(1, 6), min_size=1, max_size=5))
    strides = [math.prod(sizes[:index]) for index in range(len(sizes))]
    owners = draw(st.lists(st.integers(0, 2), min_size=len(sizes), max_size=len(sizes)))
    dims = []
    for owner in sorted(set(owners)):
        modes = [
            (size, stride)
            for size, stride, held_by in zip(sizes, strides, owners, strict=True)
            if held_by == owner
        ]
        dims.append(dim(f"d{owner}", sorted(modes, key=lambda mode: -mode[1])))
    return DomainLayout("mesh", math.prod(sizes), tuple(dims))


@pytest.mark.slow  # a long generated sweep: the quick loop leaves it out
@settings(max_examples=400, deadline=None)
@given(mixed_radix_layouts(), st.integers(1, 40), st.data())
def test_crosses_nodes_of_any_dims_of_any_layout_matches_brute_force(
    layout: DomainLayout, gpus_per_node: int, data: st.DataObject
) -> None:
    """Nodes of any size, dividing the world or not (the last node then holds fewer)."""
    names = data.draw(st.lists(st.sampled_from(layout.dim_names), min_size=1, unique=True))
    grouped: set[int] = set()
    expected = False
    for rank in range(layout.world_size):
        if rank not in grouped:  # each group once
            group = layout.group(rank, names).ranks()
            grouped.update(group)
            expected = expected or len({member // gpus_per_node for member in group}) > 1
    assert layout.crosses_nodes(names, gpus_per_node) == expected


def _brute_force_placement(groups: list[list[int]], gpus_per_node: int) -> str:
    nodes = [[rank // gpus_per_node for rank in group] for group in groups]
    if all(len(set(members)) == 1 for members in nodes):
        return "intra-node"
    if all(len(set(members)) == len(members) for members in nodes):
        return "inter-node"
    return "mixed"


@pytest.mark.parametrize("gpus_per_node", [1, 2, 3, 4, 6, 8, 16])
@pytest.mark.parametrize(
    "dims",
    [
        # Row-major dims, and dims placed partly inside and partly across nodes.
        {"a": [(4, 6)], "b": [(6, 1)]},
        {"a": [(2, 6), (2, 1)], "b": [(3, 2)]},
        {"a": [(2, 16)], "b": [(2, 8), (2, 2)], "c": [(2, 4), (2, 1)]},
        {"a": [(3, 8)], "b": [(2, 4)], "c": [(2, 2), (2, 1)]},
        {"a": [(2, 12)], "b": [(2, 6), (3, 1)], "c": [(2, 3)]},
    ],
)
def test_placement_matches_brute_force(
    dims: dict[str, list[tuple[int, int]]], gpus_per_node: int
) -> None:
    layout = DomainLayout(
        "mesh",
        math.prod(size for modes in dims.values() for size, _ in modes),
        tuple(dim(name, modes) for name, modes in dims.items()),
    )
    for name in dims:
        groups = {tuple(layout.group(rank, name).ranks()) for rank in range(layout.world_size)}
        expected = _brute_force_placement([list(group) for group in groups], gpus_per_node)
        assert layout.placement(name, gpus_per_node) == expected, (dims, name, gpus_per_node)


def test_textbook_placement() -> None:
    layout = DomainLayout.row_major("mesh", [("dp", 32), ("tp", 8)])
    assert layout.placement("tp", 8) == "intra-node"
    assert layout.placement("dp", 8) == "inter-node"
    assert layout.placement("dp", 4) == "inter-node"
    assert layout.placement("tp", 4) == "mixed"


def test_queries_at_a_million_ranks_need_no_enumeration() -> None:
    world = 2**20
    layout = DomainLayout.row_major(
        "dense", [("pp", 16), ("dp_replicate", 4), ("fsdp", 2048), ("tp", 8)]
    )
    assert layout.world_size == world
    rank = world - 1
    assert layout.coordinate(rank) == {"pp": 15, "dp_replicate": 3, "fsdp": 2047, "tp": 7}
    assert layout.rank_at(layout.coordinate(123_457)) == 123_457
    group = layout.group(rank, "pp")
    assert group.size == 16 and group.base == rank - 15 * 65536
    assert layout.num_groups("fsdp") == world // 2048
    assert layout.crosses_nodes("fsdp", 8) and not layout.crosses_nodes("tp", 8)
    assert layout.crosses_nodes("tp", 6)


def test_process_group_count_deduplicates_across_domains() -> None:
    dataloading = DomainLayout.row_major(
        "dataloading", [("pp", 1), ("batch", 4), ("cp", 1), ("tp", 2)]
    )
    dense = DomainLayout.row_major(
        "dense", [("pp", 1), ("dp_replicate", 2), ("fsdp", 2), ("tp", 2)]
    )
    world = DomainLayout.row_major("world", [("everything", 8)])
    # tp (same in both), batch, dp_replicate, fsdp, and the whole world once.
    assert process_group_count([dataloading, dense], 0) == 4
    assert process_group_count([dataloading, dense, world], 0) == 5
    single = DomainLayout.row_major("one", [("pp", 1), ("tp", 1)])
    assert process_group_count([single], 0) == 0


def test_group_identity_ignores_order() -> None:
    dense = DomainLayout.row_major("dense", [("a", 2), ("b", 2)])
    assert dense.group(0, ["a", "b"]).identity == dense.group(0, ["b", "a"]).identity
    assert dense.group(0, ["a", "b"]).ranks() != dense.group(0, ["b", "a"]).ranks()
    assert math.prod(dense.shape) == 4
