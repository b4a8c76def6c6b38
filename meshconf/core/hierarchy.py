"""Hierarchical placement: each world factor split into a part inside a node and a part
across nodes, as MaxText's ICI and DCN axes split a JAX mesh.

Nodes hold consecutive ranks, ``gpus_per_node`` each. Inside a node, the local rank is the
row-major number of the world factors' inside parts; the node's index is the row-major
number of their across parts; both in world-factor order (pp outermost, tp innermost). A
degree's index is ``across * inside_size + inside``: its across part is the outer digit.

The domains then unflatten the *logical* world, the row-major number of the degrees'
indices, exactly as plain domains unflatten the ranks. :func:`node_numbering` is the map
from that logical index to ranks, as modes for :meth:`DomainLayout.unflatten`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from meshconf.core.degrees import WORLD_FACTORS
from meshconf.core.layout import Mode


@dataclass(frozen=True)
class NodePart:
    """One part of a degree: ``mode.size`` of its ranks, placed inside or across nodes."""

    degree: str
    where: Literal["inside", "across"]
    mode: Mode

    @property
    def place(self) -> str:
        return "inside a node" if self.where == "inside" else "across nodes"


def describe_parts(parts: Sequence[NodePart]) -> str:
    """``the 3 ranks of dp_shard inside a node``, or of several parts that run on together."""
    size = math.prod(part.mode.size for part in parts)
    return f"the {size} ranks of " + " and ".join(f"{part.degree} {part.place}" for part in parts)


def split_degrees(
    degrees: Mapping[str, int], inside: Mapping[str, int]
) -> tuple[dict[str, int], dict[str, int]]:
    """Each world factor's part inside a node (1 when ``inside`` leaves it out) and across."""
    inner = {name: inside.get(name, 1) for name in WORLD_FACTORS}
    return inner, {name: degrees[name] // inner[name] for name in WORLD_FACTORS}


def node_numbering(
    degrees: Mapping[str, int], inside: Mapping[str, int], gpus_per_node: int
) -> tuple[NodePart, ...]:
    """The parts of every world factor, outer to inner in the logical index.

    ``inside`` must be valid for ``degrees`` (the rules check it first): each part divides
    its degree, and together they multiply to ``gpus_per_node``.
    """
    inner, outer = split_degrees(degrees, inside)
    parts: list[NodePart] = []
    inside_stride, across_stride = 1, gpus_per_node
    for name in reversed(WORLD_FACTORS):
        parts.append(NodePart(name, "inside", Mode(inner[name], inside_stride)))
        parts.append(NodePart(name, "across", Mode(outer[name], across_stride)))
        inside_stride *= inner[name]
        across_stride *= outer[name]
    return tuple(reversed(parts))
