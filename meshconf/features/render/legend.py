"""The words of a domain's picture: its title, notes and legend."""

from __future__ import annotations

from dataclasses import dataclass

from meshconf.core.levels import NODE
from meshconf.features.render.grid import FULL_LIMIT, Axis, Grid, rank_digits
from meshconf.features.render.shapes import (
    LINE_PX,
    NODE_STROKE,
    RANK_FILL,
    TEXT_PX,
    Rect,
    Shape,
    Text,
    level_stroke,
    text_width,
)


@dataclass(frozen=True)
class _LegendLine:
    text: str
    fill: str | None = None  # the swatch's colour; None for no swatch
    outline: str | None = None  # a swatch drawn as an outline of this colour


def _plural(count: int, noun: str) -> str:
    return f"{count} {noun}" if count == 1 else f"{count} {noun}s"


def _legend_lines(grid: Grid, colours: dict[str, str]) -> list[_LegendLine]:
    layout, rank, per_node = grid.layout, grid.rank, grid.gpus_per_node
    coordinate = " ".join(f"{k}={v}" for k, v in layout.coordinate(rank).items())
    where = "" if grid.per_cell == 1 else " (its cell)"
    lines = [_LegendLine(f"rank {rank}{where}: {coordinate}", RANK_FILL)]
    drawn = {digit.dim for digit in grid.digits}
    for dim in layout.dims:
        strides = " and ".join(str(mode.stride) for mode in dim.modes)
        placed = "" if per_node is None else f", {layout.placement(dim.name, per_node)}"
        facts = (
            f"{dim.name}: size {dim.size}, stride{'s' if len(dim.modes) > 1 else ''} {strides}, "
            f"{_plural(layout.num_groups(dim.name), 'group')}{placed}"
        )
        if dim.size == 1:
            lines.append(_LegendLine(f"{facts}; groups of one rank"))
        elif dim.name in drawn:
            text = f"{facts}; coloured: rank {rank}'s group"
            lines.append(_LegendLine(text, colours[dim.name]))
        else:
            text = f"{facts}; rank {rank}'s group lies inside its cell"
            lines.append(_LegendLine(text, colours[dim.name]))
    if per_node is None:
        lines.append(_LegendLine("nodes: unknown (set gpus_per_node or pass --gpus-per-node)"))
    else:
        lines.append(_unit_line(grid, NODE, "node", per_node, NODE_STROKE))
    outlined = grid.outlined_levels
    for level in grid.levels:
        stroke = level_stroke(outlined.index(level)) if level in outlined else ""
        lines.append(_unit_line(grid, level.name, f"{level.name} domain", level.size, stroke))
    return lines


def _unit_line(grid: Grid, name: str, noun: str, size: int, stroke: str) -> _LegendLine:
    """The legend's line for the units of ``size`` GPUs of the node or a level (``name``)."""
    units = f"{_plural(-(-grid.layout.world_size // size), noun)} of {_plural(size, 'GPU')}"
    if name in grid.repeated:
        return _LegendLine(f"{units}; not outlined: each is {grid.repeated[name]}")
    if grid.cells_per_unit(size) is not None:
        return _LegendLine(f"outlined: {units}", outline=stroke)
    if name == NODE and grid.per_cell % size == 0:
        whole = _plural(grid.per_cell // size, "whole node")
        return _LegendLine(f"{units}; not outlined: each cell is {whole}")
    across = "nodes" if name == NODE else "them"
    return _LegendLine(f"{units}; not outlined: cells of {grid.per_cell} ranks cut across {across}")


def summary_note(grid: Grid) -> str | None:
    """For a summarised world, what one cell holds."""
    if grid.per_cell == 1:
        return None
    inside = []
    for digit in rank_digits(grid.layout):
        if digit.stride * digit.size <= grid.per_cell:
            inside.append(f"{digit.dim}={digit.size}")
        elif digit.stride < grid.per_cell:
            inside.append(f"{grid.per_cell // digit.stride} of {digit.dim}={digit.size}")
    return (
        f"summary: {grid.layout.world_size} ranks is more than {FULL_LIMIT}; each cell is "
        f"{grid.per_cell} consecutive ranks ({' x '.join(inside)}), labelled with its first rank"
    )


def arrangement(grid: Grid) -> str:
    """Which dims run along the columns and which along the rows."""

    def names(axis: Axis) -> str:
        return ", ".join(dict.fromkeys(digit.dim for digit in axis.digits))

    if not grid.x.digits:
        return "a single cell"
    rows = f"; rows: {names(grid.y)}" if grid.y.digits else ""
    return f"columns: {names(grid.x)}{rows} (inner to outer)"


def title_lines(grid: Grid) -> tuple[str, str]:
    """The picture's title and the line under it."""
    layout = grid.layout
    shape = ", ".join(f"{dim.name}={dim.size}" for dim in layout.dims)
    nodes = "" if grid.gpus_per_node is None else f", {grid.gpus_per_node} GPUs per node"
    nodes += "".join(f", {level.name} domains of {level.size}" for level in grid.levels)
    return (
        f"domain {layout.name} [{shape}]",
        f"{layout.world_size} ranks{nodes}; coloured: the groups of rank {grid.rank}",
    )


def legend_shapes(
    grid: Grid, colours: dict[str, str], left: float, top: float
) -> tuple[list[Shape], float, float]:
    """The legend's swatches and lines from (``left``, ``top``), its width and its height."""
    shapes: list[Shape] = []
    widest = 0.0
    swatch = TEXT_PX
    lines = _legend_lines(grid, colours)
    for number, line in enumerate(lines):
        y = top + number * LINE_PX
        if line.outline is not None:
            shapes.append(Rect(left, y - swatch / 2, swatch, swatch, "none", line.outline, 2.0))
        elif line.fill is not None:
            shapes.append(Rect(left, y - swatch / 2, swatch, swatch, line.fill))
        shapes.append(Text(left + swatch + 6, y, line.text, TEXT_PX, "start", css_class="legend"))
        widest = max(widest, swatch + 6 + text_width(line.text, TEXT_PX))
    return shapes, widest, LINE_PX * len(lines)
