"""Levels of a cluster above the GPU, and which ranks a placement keeps inside each.

A *level* is a unit of GPUs that hold consecutive ranks, ``size`` of them: a node, an NVLink
domain (a GB200 NVL72 rack: 72 GPUs), a pod. Levels are listed inner to outer, and each
holds whole units of the one below. The world need not fill the outermost units: its last
unit may be partial, as when a job takes 7 racks and 2 nodes of an eighth.

Keeping dims inside a level is a statement about the *logical* world (the row-major number
of the world factors' indices, :mod:`meshconf.core.hierarchy`): a dim's groups vary some
inner digits of the world factors, and the numbering places those digits inside the level.
Only a factor's inner part can be placed (its index is ``across * inside + inside_index``),
so a dim that varies a factor's outer digits keeps the inner ones inside too.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from meshconf.core.degrees import WORLD_FACTORS
from meshconf.core.hierarchy import Band, order_strides
from meshconf.core.layout import DomainLayout, Mode

NODE = "node"
#: The level of an NVLink domain, which the runtime finds on the machine.
NVLINK = "nvlink"
#: The environment variables that tell a rank its unit of each level:
#: ``MESHCONF_LEVEL_NVLINK=rack07``.
ENVIRONMENT_PREFIX = "MESHCONF_LEVEL_"


def environment_name(level: str) -> str:
    """``MESHCONF_LEVEL_NVLINK`` for ``nvlink``: level names that differ only in case read
    one variable, so meshconf compares level names this way."""
    return ENVIRONMENT_PREFIX + level.upper()


@dataclass(frozen=True)
class Level:
    """A unit of ``size`` GPUs holding consecutive ranks, and the bandwidth (GB/s per GPU)
    of the links between GPUs inside one unit, when known."""

    name: str
    size: int
    bandwidth_gb_s: float | None = None


def all_levels(gpus_per_node: int | None, levels: Sequence[Level]) -> tuple[Level, ...]:
    """The levels inner to outer: the node of ``gpus_per_node`` first, when given."""
    node = () if gpus_per_node is None else (Level(NODE, gpus_per_node),)
    return (*node, *levels)


def node_size(levels: Sequence[Level]) -> int | None:
    """GPUs per node: the size of the level named node, if there is one."""
    return next((level.size for level in levels if level.name == NODE), None)


def logical_strides(degrees: Mapping[str, int]) -> dict[str, int]:
    """The stride of each world factor in the logical index (pp outermost, tp innermost)."""
    return order_strides(degrees, WORLD_FACTORS)


def inner_parts(modes: Iterable[Mode], degrees: Mapping[str, int]) -> dict[str, int]:
    """The inner part of each world factor that logical ``modes`` reach into (1 for a factor
    they leave alone): a mode whose digits end inside a factor needs the factor's digits up
    to there, the inner ones included."""
    strides = logical_strides(degrees)
    parts = dict.fromkeys(WORLD_FACTORS, 1)
    for mode in modes:
        if mode.size == 1:
            continue
        top = mode.size * mode.stride
        for name in WORLD_FACTORS:
            start, end = strides[name], strides[name] * degrees[name]
            if mode.stride < end and top > start:
                parts[name] = math.lcm(parts[name], min(top, end) // start)
    return parts


def uneven_factor(mode: Mode, degrees: Mapping[str, int]) -> str | None:
    """The world factor whose digits a logical ``mode`` cuts inside (it varies part of one
    of the factor's values, as ep 4 does of tp 3 * cp 2), or None: such a dim's groups are
    no product of factor parts, so no numbering by factors keeps them inside a level."""
    strides = logical_strides(degrees)
    top = mode.size * mode.stride
    for name in WORLD_FACTORS:
        start, end = strides[name], strides[name] * degrees[name]
        if mode.size > 1 and mode.stride < end and top > start:
            reach = min(top, end)
            if reach % start or max(mode.stride, start) % start or end % reach:
                return name
    return None


def kept_parts(
    dims: Iterable[str],
    logical_layouts: Mapping[str, DomainLayout],
    degrees: Mapping[str, int],
) -> dict[str, int]:
    """The inner part of each world factor that the groups of ``dims`` vary, in any domain
    that has them. ``logical_layouts`` are the domains unflattened from the logical world."""
    modes = [
        mode
        for layout in logical_layouts.values()
        for dim in layout.dims
        if dim.name in dims
        for mode in dim.modes
    ]
    return inner_parts(modes, degrees)


def parts_text(parts: Mapping[str, int]) -> str:
    """``dp_shard(16) * tp(8)``: the parts above 1, in the logical order."""
    placed = [f"{name}({parts[name]})" for name in WORLD_FACTORS if parts[name] > 1]
    return " * ".join(placed) or "no ranks"


def level_bands(
    degrees: Mapping[str, int], inside: Sequence[Mapping[str, int]], levels: Sequence[Level]
) -> tuple[Band, ...]:
    """The bands of the numbering, inner to outer, when ``inside[k]`` (one mapping per
    level, each part dividing the next level's and its degree) must stay inside a unit of
    ``levels[k]``: what each level adds to the parts inside the one below, then the rest."""
    bands: list[Band] = []
    below = dict.fromkeys(WORLD_FACTORS, 1)
    for level, parts in zip(levels, inside, strict=True):
        added = {name: parts[name] // below[name] for name in WORLD_FACTORS}
        bands.append((f"inside {unit_article(level.name)}", added))
        below = dict(parts)
    outermost = levels[-1].name if levels else NODE
    rest = {name: degrees[name] // below[name] for name in WORLD_FACTORS}
    bands.append((f"across {plural_units(outermost)}", rest))
    return tuple(bands)


def unit_name(level: str) -> str:
    """What one unit of a level is called: ``node``, ``nvlink domain``."""
    return NODE if level == NODE else f"{level} domain"


def unit_article(level: str) -> str:
    """``a node``, ``one nvlink domain``."""
    return f"{'a' if level == NODE else 'one'} {unit_name(level)}"


def plural_units(level: str) -> str:
    return f"{unit_name(level)}s"


def crossed_levels(
    layout: DomainLayout, dims: str | Sequence[str], levels: Sequence[Level]
) -> tuple[str, ...]:
    """The levels some group along ``dims`` crosses: it holds ranks of two of their units."""
    return tuple(level.name for level in levels if layout.crosses_nodes(dims, level.size))
