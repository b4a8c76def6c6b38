"""How ranks are numbered: the rank order of the world factors, and hierarchical placement.

The domains unflatten the *logical* world: the row-major number of the world factors'
indices in their default order (pp outermost, tp innermost), so that a default derived dim
such as ``fsdp = dp_shard * cp`` always means the same factors. A *numbering* maps that
logical index to ranks, as modes for :meth:`DomainLayout.unflatten`, one per world factor
(or per part of one), listed in the default order.

``order`` names the world factors outer to inner as the ranks number them: the rank is the
row-major number of the factors' indices in that order (:func:`rank_numbering`).

Hierarchical placement splits each world factor into a part inside a node and a part across
nodes, as MaxText's ICI and DCN axes split a JAX mesh. Nodes hold consecutive ranks,
``gpus_per_node`` each. Inside a node, the local rank is the row-major number of the inside
parts; the node's index is the row-major number of the across parts; both in ``order``. A
degree's index is ``across * inside_size + inside``: its across part is the outer digit
(:func:`node_numbering`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from meshconf.core.degrees import WORLD_FACTORS
from meshconf.core.layout import Mode


@dataclass(frozen=True)
class NodePart:
    """One part of a degree: ``mode.size`` of its ranks, and where they are placed
    (``inside a node``, ``across nodes``)."""

    degree: str
    place: str
    mode: Mode


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


def order_strides(sizes: Mapping[str, int], order: Sequence[str]) -> dict[str, int]:
    """The stride of each name when ranks number ``sizes`` row-major in ``order``."""
    strides: dict[str, int] = {}
    stride = 1
    for name in reversed(order):
        strides[name] = stride
        stride *= sizes[name]
    return strides


def rank_numbering(degrees: Mapping[str, int], order: Sequence[str]) -> tuple[Mode, ...]:
    """The numbering of the logical world when ranks follow ``order`` (outer to inner).

    ``order`` must be a permutation of the world factors; with the default order the
    numbering is the identity, and every domain is the world reshaped.
    """
    strides = order_strides(degrees, order)
    return tuple(Mode(degrees[name], strides[name]) for name in WORLD_FACTORS)


def node_numbering(
    degrees: Mapping[str, int],
    inside: Mapping[str, int],
    gpus_per_node: int,
    order: Sequence[str] = WORLD_FACTORS,
) -> tuple[NodePart, ...]:
    """The parts of every world factor, outer to inner in the logical index.

    ``inside`` must be valid for ``degrees`` (the rules check it first): each part divides
    its degree, and together they multiply to ``gpus_per_node``. ``order`` numbers the inside
    parts within a node and the across parts across nodes.
    """
    inner, outer = split_degrees(degrees, inside)
    inside_strides = order_strides(inner, order)
    across_strides = order_strides(outer, order)
    parts: list[NodePart] = []
    for name in WORLD_FACTORS:
        across = Mode(outer[name], across_strides[name] * gpus_per_node)
        parts.append(NodePart(name, "across nodes", across))
        parts.append(NodePart(name, "inside a node", Mode(inner[name], inside_strides[name])))
    return tuple(parts)
