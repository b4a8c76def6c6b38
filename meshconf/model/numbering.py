"""The rules on how ranks are numbered, and the numbering they give: ``order`` lists every
world factor once; the domains unflatten the logical world through :func:`numbering`."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from meshconf.core.degrees import EXPERT_DEGREES, WORLD_FACTORS
from meshconf.core.hierarchy import describe_parts, rank_numbering
from meshconf.core.layout import Mode
from meshconf.core.messages import did_you_mean

if TYPE_CHECKING:
    from meshconf.core.errors import KeyPath
    from meshconf.model.rules import Analysis, MeshSpec


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


def numbering(spec: MeshSpec, result: Analysis) -> tuple[Mode, ...] | None:
    """The map from the logical world to ranks, or None while a rule it needs failed."""
    if result.order is None or result.degrees is None:
        return None
    if spec.inside_node is None:
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
    keys = [
        key for key, value in (("order", spec.order), ("inside_node", spec.inside_node)) if value
    ]
    return " or ".join(keys)
