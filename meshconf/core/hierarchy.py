"""How ranks are numbered: the rank order of the world factors, and hierarchical placement.

The domains unflatten the *logical* world: the row-major number of the world factors'
indices in their default order (pp outermost, tp innermost), so that a default derived dim
such as ``fsdp = dp_shard * cp`` always means the same factors. A *numbering* maps that
logical index to ranks, as modes for :meth:`DomainLayout.unflatten`, one per world factor
(or per part of one), listed in the default order.

``order`` names the world factors outer to inner as the ranks number them: the rank is the
row-major number of the factors' indices in that order (:func:`rank_numbering`).

Hierarchical placement splits each world factor into parts, one per *band* of the ranks, as
MaxText's ICI and DCN axes split a JAX mesh: with ``inside_node``, a part inside a node and
a part across nodes; with ``inside``, one part per level (:mod:`meshconf.core.levels`). The
ranks number the bands inner band first, each band the row-major number of its parts in
``order``; a degree's index numbers its parts the same way, so ``across * inside_size +
inside`` for a node (:func:`band_numbering`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from meshconf.core.degrees import WORLD_FACTORS
from meshconf.core.layout import Mode

#: A band of the rank numbering: where its parts are placed, and each world factor's part.
Band = tuple[str, dict[str, int]]


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


def band_numbering(
    bands: Sequence[Band], order: Sequence[str] = WORLD_FACTORS
) -> tuple[NodePart, ...]:
    """The parts of every world factor, outer to inner in the logical index, when ranks are
    numbered in ``bands`` (inner to outer): a factor's index is the mixed-radix number of its
    parts, outer band first; the rank numbers the bands the same way, and ``order`` numbers
    the parts within a band. Each band's block is the product of the parts so far; when it
    divides a level's size (the rules check it), no group of those parts crosses its units.
    """
    modes: dict[str, list[NodePart]] = {name: [] for name in WORLD_FACTORS}
    block = 1
    for place, sizes in bands:
        strides = order_strides(sizes, order)
        for name in WORLD_FACTORS:
            part = NodePart(name, place, Mode(sizes[name], strides[name] * block))
            modes[name].insert(0, part)
        block *= math.prod(sizes.values())
    return tuple(part for name in WORLD_FACTORS for part in modes[name])
