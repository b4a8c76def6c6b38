"""The rules on levels above the GPU (``levels``, ``inside``) and the numbering they give:
levels hold whole units of the level below, and the dims kept inside a level fill its units
in whole groups (:mod:`meshconf.core.levels`)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from meshconf.core.degrees import AUTO, DEGREE_NAMES, WORLD_FACTORS
from meshconf.core.errors import format_key
from meshconf.core.hierarchy import band_numbering
from meshconf.core.layout import DomainLayout, LayoutError
from meshconf.core.levels import (
    NODE,
    Level,
    environment_name,
    kept_parts,
    level_bands,
    parts_text,
    uneven_factor,
    unit_name,
)
from meshconf.core.messages import did_you_mean, name_list
from meshconf.model.analysis import Analysis, MeshSpec

if TYPE_CHECKING:
    from meshconf.core.errors import KeyPath


def unit_text(level: str, size: int) -> str:
    """``one node of 8 GPUs``, ``one nvlink domain of 72 GPUs``."""
    return f"one {unit_name(level)} of {size} GPU{'s' if size != 1 else ''}"


def _level_path(spec: MeshSpec, index: int, key: str) -> KeyPath:
    """Where the level at ``index`` of ``spec.topology`` was written."""
    if spec.gpus_per_node is not None:
        if index == 0:
            return ("gpus_per_node",)
        index -= 1
    return ("levels", index, key)


def check_levels(spec: MeshSpec, result: Analysis) -> None:
    """Level names are distinct; each level holds whole units of the one below."""
    levels = spec.topology
    seen: dict[str, str] = {}
    for index, level in enumerate(levels):
        variable = environment_name(level.name)
        first = seen.get(variable)
        if first == level.name:
            written_twice = (
                "gpus_per_node already gives the node level; leave this one out or gpus_per_node"
                if level.name == NODE and spec.gpus_per_node is not None
                else f"level {level.name!r} appears twice; give each level once"
            )
            result.fail(_level_path(spec, index, "name"), written_twice)
        elif first is not None:
            result.fail(
                _level_path(spec, index, "name"),
                f"level {level.name!r} and level {first!r} differ only in case, and both read "
                f"{variable} at run time; give them names apart",
            )
        seen.setdefault(variable, level.name)
        if index == 0:
            continue
        below = levels[index - 1]
        if level.size % below.size:
            lower = level.size // below.size * below.size
            near = " or ".join(str(size) for size in (lower, lower + below.size) if size)
            result.fail(
                _level_path(spec, index, "size"),
                f"{unit_text(level.name, level.size)} must hold whole units of the level "
                f"below ({unit_text(below.name, below.size)}): {level.size} is not a multiple "
                f"of {below.size}; make it one, such as {near}",
            )


def _check_inside_names(spec: MeshSpec, result: Analysis) -> bool:
    """``inside`` names known levels and dims that some domain has; False if it does not."""
    assert spec.inside is not None
    before = len(result.problems)
    levels = list(dict.fromkeys(level.name for level in spec.topology))
    if spec.inside_node is not None:
        result.fail(
            ("inside",),
            "inside_node already places the world factors inside a node; inside keeps dims "
            "inside levels: give one of them",
        )
    in_domains = {dim for dims in spec.domains.values() for dim in dims}
    dims = list(DEGREE_NAMES) + [name for name in spec.derived if name not in DEGREE_NAMES]
    for level, names in spec.inside.items():
        if level not in levels:
            known = f"; levels are {', '.join(levels)}" if levels else "; there are no levels"
            add = (
                "give gpus_per_node (or add {name: node, size: N} to levels), N the GPUs of "
                "one node"
                if level == NODE
                else f"add {{name: {level}, size: N}} to levels, N the GPUs of one "
                f"{unit_name(level)}"
            )
            result.fail(
                ("inside", level),
                f"unknown level {level!r}{did_you_mean(level, levels)}{known}: {add}",
            )
        if not names:
            result.fail(("inside", level), "lists no dims; leave the level out instead")
        for index, name in enumerate(names):
            path: KeyPath = ("inside", level, index)
            if name not in dims:
                result.fail(
                    path,
                    f"unknown dim {name!r}{did_you_mean(name, dims)}; inside keeps the degrees "
                    f"and the derived dims: {name_list(dims)}",
                )
            elif name not in in_domains and name not in WORLD_FACTORS:
                result.fail(
                    path,
                    f"{name!r} is in no domain, so it has no groups to keep inside {level!r}: "
                    "add it to a domain, or leave it out of inside",
                )
    return len(result.problems) == before


def check_inside(spec: MeshSpec, result: Analysis) -> None:
    """The dims kept inside each level fill its units in whole groups; then the ranks are
    numbered so that they do."""
    if not spec.inside or not _check_inside_names(spec, result) or result.problems:
        return
    if result.degrees is None or any(result.degrees[name] == AUTO for name in WORLD_FACTORS):
        result.wait("inside: the dims kept inside each level fill its units in whole groups")
        return
    assert result.world_size is not None and result.order is not None
    degrees = result.degrees
    logical: dict[str, DomainLayout] = {}
    for domain, dims in spec.domains.items():
        if any(dim not in result.sizes for dim in dims):
            return  # reported by the domain rules
        try:
            logical[domain] = DomainLayout.row_major(
                domain, [(dim, result.sizes[dim]) for dim in dims], result.world_size
            )
        except LayoutError:
            return  # reported by check_domain_products
    levels = spec.topology
    kept: list[dict[str, int]] = []
    inside = dict.fromkeys(WORLD_FACTORS, 1)
    for position, level in enumerate(levels):
        names = spec.inside.get(level.name, ())
        if _uneven(spec, result, level.name, names, logical, degrees):
            return
        parts = kept_parts(names, logical, degrees)
        for name in names:
            if name in WORLD_FACTORS:  # a world factor in no domain still has its groups
                parts[name] = degrees[name]
        inside = {name: math.lcm(inside[name], parts[name]) for name in WORLD_FACTORS}
        kept.append(inside)
        block = math.prod(inside.values())
        if not names or result.world_size <= level.size or level.size % block == 0:
            continue
        below = levels[: position + 1]
        listed = list(dict.fromkeys(n for other in below for n in spec.inside.get(other.name, ())))
        key = format_key(_level_path(spec, position, "size"))
        result.fail(
            ("inside", level.name), _misfit_text(listed, result.sizes, inside, block, level, key)
        )
    if not result.problems:
        result.bands = level_bands(degrees, kept, levels)
        result.node_parts = band_numbering(result.bands, result.order)


def _uneven(
    spec: MeshSpec,
    result: Analysis,
    level: str,
    names: tuple[str, ...],
    logical: dict[str, DomainLayout],
    degrees: dict[str, int],
) -> bool:
    """Report the dims at ``level`` whose groups cut a world factor's values; True if any."""
    found = False
    for index, name in enumerate(names):
        for layout in logical.values():
            if name not in layout.dim_names:
                continue
            cut = [uneven_factor(mode, degrees) for mode in layout.dim(name).modes]
            factor = next((factor for factor in cut if factor is not None), None)
            if factor is not None:
                size = result.sizes[name]
                result.fail(
                    ("inside", level, index),
                    f"{name}({size}) cuts {factor}({degrees[factor]}) unevenly: its groups take "
                    f"part of some {factor} values and not others, which no numbering by world "
                    f"factors keeps inside a level; make {name}'s ranks whole parts of the "
                    "factors it spans",
                )
                found = True
                break
    return found


def _misfit_text(
    dims: list[str],
    sizes: dict[str, int],
    parts: dict[str, int],
    block: int,
    level: Level,
    size_key: str,
) -> str:
    product = math.prod(sizes[dim] for dim in dims)
    span = (
        f"{' * '.join(dims)} = {block}"
        if product == block
        else f"{dims[0]} spans {block} ranks"
        if len(dims) == 1
        else f"{' and '.join(dims)} span {block} ranks together"
    )
    unit = unit_text(level.name, level.size)
    if block > level.size:
        what = f"set {dims[0]} to" if len(dims) == 1 else f"make {' * '.join(dims)}"
        return (
            f"{span} ({parts_text(parts)}), which does not fit in {unit}: {what} a divisor of "
            f"{level.size}, make {size_key} a multiple of {block}, or keep "
            f"{' and '.join(dims)} inside a larger level"
        )
    return (
        f"{span} ({parts_text(parts)}), and groups of {block} cannot fill {unit}: make the "
        f"groups divide {level.size}, or set the level's size to the ranks the job runs in "
        "each of its units"
    )
