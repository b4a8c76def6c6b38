"""The rules on how ranks are numbered, and the numbering they give: ``order`` lists every
world factor once, ``inside_node`` splits the world factors into parts that fill a node; the
domains unflatten the logical world through :func:`numbering`."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from meshconf.core.degrees import AUTO, EXPERT_DEGREES, WORLD_FACTORS
from meshconf.core.hierarchy import band_numbering, describe_parts, rank_numbering, split_degrees
from meshconf.core.layout import Mode
from meshconf.core.levels import node_size
from meshconf.core.messages import did_you_mean
from meshconf.model.analysis import Analysis, MeshSpec

if TYPE_CHECKING:
    from meshconf.core.errors import KeyPath


def check_order(spec: MeshSpec, result: Analysis) -> None:
    """order lists every world factor once."""
    if spec.order is None:
        return
    factors = ", ".join(WORLD_FACTORS)
    before = len(result.problems)
    seen: set[str] = set()
    for index, name in enumerate(spec.order):
        path: KeyPath = ("order", index)
        if name in EXPERT_DEGREES:
            result.fail(
                path,
                f"{name} is not a world factor: experts borrow their ranks from dp_shard * cp * "
                f"tp, so their ranks follow those; order lists {factors}",
            )
        elif name == "dp":
            result.fail(
                path,
                "'dp' is not a world factor: data parallelism is dp_replicate (outer) and "
                "dp_shard (inner); list both, next to each other for one data-parallel block",
            )
        elif name not in WORLD_FACTORS:
            result.fail(
                path,
                f"unknown world factor {name!r}{did_you_mean(name, WORLD_FACTORS)}; order "
                f"lists {factors}",
            )
        elif name in seen:
            result.fail(path, f"{name!r} appears twice in order")
        seen.add(name)
    missing = [name for name in WORLD_FACTORS if name not in seen]
    # A misspelt or foreign name is the likelier cause of a missing factor; say only that.
    if missing and len(result.problems) == before:
        result.fail(
            ("order",),
            f"leaves out {', '.join(missing)}: order lists every world factor once, outer to "
            f"inner ({factors}); one of size 1 may go anywhere",
        )
    result.order = tuple(spec.order) if len(result.problems) == before else None


def check_inside_node(spec: MeshSpec, result: Analysis) -> None:
    """The inside-node parts divide their degrees and multiply to gpus_per_node."""
    if spec.inside_node is None:
        return
    inside = spec.inside_node
    placed = [name for name in WORLD_FACTORS if inside[name] > 1]
    product = math.prod(inside[name] for name in placed)
    written = " * ".join(f"{name}({inside[name]})" for name in placed) or "no part above 1"
    gpus_per_node = node_size(spec.topology)
    if gpus_per_node is None:
        result.fail(
            ("inside_node",),
            f"needs gpus_per_node: it places ranks inside nodes of that many GPUs "
            f"({written}: {product} per node)",
        )
        return
    if product != gpus_per_node:
        result.fail(
            ("inside_node",),
            f"{written}: {product} ranks per node != gpus_per_node {gpus_per_node}; the "
            "parts inside a node must fill it exactly (a world factor left out has 1 inside)",
        )
    degrees = result.degrees or spec.degrees
    for name in placed:
        if degrees[name] == AUTO:
            result.wait(f"inside_node.{name}: divides the -1 degree {name}")
        elif degrees[name] % inside[name]:
            result.fail(
                ("inside_node", name),
                f"{inside[name]} ranks of {name} inside a node must divide {name}"
                f"({degrees[name]}), so that the rest go across nodes in whole groups",
            )
    if not result.problems and result.degrees is not None and result.order is not None:
        inner, outer = split_degrees(result.degrees, inside)
        result.bands = (("inside a node", inner), ("across nodes", outer))
        result.node_parts = band_numbering(result.bands, result.order)


def numbering(spec: MeshSpec, result: Analysis) -> tuple[Mode, ...] | None:
    """The map from the logical world to ranks, or None while a rule it needs failed."""
    if result.order is None or result.degrees is None:
        return None
    if spec.inside_node is None and not spec.inside:
        return rank_numbering(result.degrees, result.order)
    if result.node_parts is None:
        return None
    return tuple(part.mode for part in result.node_parts)


def describe_split(result: Analysis, indices: tuple[int, ...]) -> str:
    if result.node_parts is not None:
        return describe_parts([result.node_parts[index] for index in indices])
    assert result.degrees is not None
    names = [WORLD_FACTORS[index] for index in indices]
    size = math.prod(result.degrees[name] for name in names)
    return f"the {size} ranks of " + " and ".join(names)


def placement_keys(spec: MeshSpec) -> str:
    given = {"order": spec.order, "inside_node": spec.inside_node, "inside": spec.inside}
    return " or ".join(key for key, value in given.items() if value)
