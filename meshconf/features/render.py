"""Pictures of one domain's rank grid: a ``DomainLayout`` in, a list of shapes out, then SVG.

The ranks are drawn as the domain's dims unflattened row-major. Each mixed-radix digit of the
rank (one per mode of size > 1, innermost first) becomes one level of nested blocks along x or
y; a digit goes to the axis that is shorter so far, so the picture stays roughly square. A
digit longer than ``WRAP_SIZE`` is folded into two (an inner part along one axis, the rest
along the other), which keeps a long stride-1 dim from becoming a single row of cells.

Worlds of more than ``FULL_LIMIT`` ranks are summarised: a cell stands for a block of
consecutive ranks (all of the innermost digits, and part of the next one), so that at most
``SUMMARY_CELLS`` cells are drawn. Nothing here is proportional to the world size: the work
is proportional to the number of cells.

``draw_domain`` returns a ``Drawing`` (plain rectangles, texts and line paths in pixels);
``to_svg`` writes it with the standard library, and ``to_png`` with matplotlib, imported only
there, so both formats show the same picture.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from functools import cached_property
from typing import Literal
from xml.sax.saxutils import escape, quoteattr

from meshconf.core.degrees import divisors
from meshconf.core.errors import InvalidArgumentError
from meshconf.core.layout import DomainLayout

FULL_LIMIT = 4096
SUMMARY_CELLS = 512
WRAP_SIZE = 16

_MAX_GRID_PX = 1100.0
_MAX_CELL_PX = 40.0
_GAP_RATIO = 0.5
_MARGIN = 14.0
_TEXT_PX = 12.0
_LINE_PX = 18.0
_MIN_LABEL_PX = 5.0
_MIN_HEADER_PX = 7.0
_CHAR_WIDTH = 0.62  # width of a character, in font sizes (generous for digits in sans fonts)

_FONT = "DejaVu Sans, Verdana, Arial, sans-serif"
_CELL_FILL = "#e6e6e6"
_RANK_FILL = "#222222"
_NODE_STROKE = "#333333"
# The usual dims keep one colour in every picture; other dims take the colours left over.
_DIM_COLOURS = {
    "tp": "#82c07a",
    "fsdp": "#f5a85c",
    "dp_replicate": "#7aa6d6",
    "pp": "#c49cc0",
    "cp": "#8fcfc9",
    "ep": "#ec8a8c",
    "etp": "#f0d474",
    "efsdp": "#ffb8c0",
    "batch": "#bc9a88",
    "loss": "#b0b0b0",
    "dp_shard": "#f5a85c",
}
_PALETTE = tuple(dict.fromkeys(_DIM_COLOURS.values()))

Anchor = Literal["start", "middle", "end"]


@dataclass(frozen=True)
class Rect:
    x: float
    y: float
    width: float
    height: float
    fill: str
    stroke: str | None = None
    stroke_width: float = 0.0
    css_class: str = ""
    data: tuple[tuple[str, str], ...] = ()
    tooltip: str | None = None


@dataclass(frozen=True)
class Text:
    x: float
    y: float
    text: str
    size: float
    anchor: Anchor = "middle"
    fill: str = "#000000"
    bold: bool = False
    css_class: str = ""


@dataclass(frozen=True)
class Lines:
    """Separate straight segments ``(x1, y1, x2, y2)`` drawn as one path."""

    segments: tuple[tuple[float, float, float, float], ...]
    stroke: str
    stroke_width: float
    css_class: str = ""


Shape = Rect | Text | Lines


@dataclass(frozen=True)
class Drawing:
    width: float
    height: float
    shapes: tuple[Shape, ...]
    columns: int
    rows: int
    ranks_per_cell: int

    @property
    def cells(self) -> int:
        return self.columns * self.rows


# --- the cell grid -------------------------------------------------------------------------


@dataclass(frozen=True)
class _Digit:
    """One mixed-radix digit of the cell index, drawn as one level of blocks along an axis."""

    dim: str
    size: int
    stride: int  # in cells
    step: int  # how much one unit of this digit adds to the dim's coordinate
    span: int  # coordinates of the dim one unit covers (> 1 where a summary cell cuts the dim)
    solo: bool = True  # the dim's only digit, so its value is the dim's coordinate

    def value(self, cell: int) -> int:
        return cell // self.stride % self.size

    def label(self, value: int) -> tuple[str, str]:
        """A full label and a short one for the block of ``value``."""
        start = value * self.step
        if not self.solo:
            return f"{self.dim}+{start}", f"+{start}"
        if self.span > 1:
            return f"{self.dim}={start}-{start + self.span - 1}", str(start)
        return f"{self.dim}={start}", str(start)


def _rank_digits(layout: DomainLayout) -> list[_Digit]:
    """The digits of a rank, innermost (stride 1) first; size-1 modes are left out."""
    digits: list[_Digit] = []
    for dim in layout.dims:
        step = 1
        for mode in reversed(dim.modes):
            if mode.size > 1:
                digits.append(_Digit(dim.name, mode.size, mode.stride, step, 1))
            step *= mode.size
    return sorted(digits, key=lambda digit: digit.stride)


def ranks_per_cell(layout: DomainLayout) -> int:
    """1 up to ``FULL_LIMIT`` ranks; beyond, the smallest block of consecutive ranks (the
    inner digits and a divisor of the next one) that leaves at most ``SUMMARY_CELLS`` cells."""
    world_size = layout.world_size
    if world_size <= FULL_LIMIT:
        return 1
    for digit in _rank_digits(layout):
        # The digits form a complete mixed radix, so a digit's stride is the product of the
        # smaller digits' sizes: every candidate is a block of whole inner digits.
        for factor in divisors(digit.size):
            if world_size // (digit.stride * factor) <= SUMMARY_CELLS:
                return digit.stride * factor
    return world_size


def _cell_digits(digits: Sequence[_Digit], per_cell: int) -> list[_Digit]:
    """The digits of the cell index, once ``per_cell`` consecutive ranks share a cell."""
    cells: list[_Digit] = []
    for digit in digits:
        if digit.stride >= per_cell:
            cells.append(replace(digit, stride=digit.stride // per_cell))
        elif digit.stride * digit.size > per_cell:
            cut = per_cell // digit.stride
            cells.append(_Digit(digit.dim, digit.size // cut, 1, digit.step * cut, cut))
    return cells


def _fold(digit: _Digit) -> list[_Digit]:
    """A long digit as an inner part (at least its square root) and an outer part."""
    if digit.size <= WRAP_SIZE:
        return [digit]
    inner = next(d for d in divisors(digit.size) if d * d >= digit.size)
    if inner == digit.size:  # a prime size cannot be folded
        return [digit]
    outer = _Digit(
        digit.dim, digit.size // inner, digit.stride * inner, digit.step * inner, digit.span
    )
    return [replace(digit, size=inner), outer]


def _mark_solo(digits: Sequence[_Digit]) -> list[_Digit]:
    counts: dict[str, int] = {}
    for digit in digits:
        counts[digit.dim] = counts.get(digit.dim, 0) + 1
    return [replace(digit, solo=counts[digit.dim] == 1) for digit in digits]


def _split_axes(digits: Sequence[_Digit]) -> tuple[list[_Digit], list[_Digit]]:
    """Inner digits first; each goes to the axis with fewer cells so far (ties alternate)."""
    along_x: list[_Digit] = []
    along_y: list[_Digit] = []
    width = height = 1
    last_was_x = False
    for digit in digits:
        to_x = not along_x or width < height or (width == height and not last_was_x)
        if to_x:
            along_x.append(digit)
            width *= digit.size
        else:
            along_y.append(digit)
            height *= digit.size
        last_was_x = to_x
    return along_x, along_y


@dataclass(frozen=True)
class _Axis:
    """Positions along one axis: digits inner to outer, each level's blocks a gap apart."""

    digits: tuple[_Digit, ...]
    pitches: tuple[float, ...]  # distance between consecutive values of each digit
    units: tuple[float, ...]  # length of the block that one value of each digit covers
    extent: float

    @classmethod
    def build(cls, digits: Sequence[_Digit], cell: float) -> _Axis:
        pitches: list[float] = []
        units: list[float] = []
        extent = cell
        for level, digit in enumerate(digits):
            pitch = extent + _GAP_RATIO * cell * level
            pitches.append(pitch)
            units.append(extent)
            extent += (digit.size - 1) * pitch
        return cls(tuple(digits), tuple(pitches), tuple(units), extent)

    @property
    def count(self) -> int:
        return math.prod(digit.size for digit in self.digits)

    def position(self, cell: int) -> float:
        return sum(d.value(cell) * p for d, p in zip(self.digits, self.pitches, strict=True))

    def index(self, cell: int) -> int:
        index = 0
        for digit in reversed(self.digits):
            index = index * digit.size + digit.value(cell)
        return index

    def blocks(self, level: int) -> Iterator[tuple[int, float, float]]:
        """(value, start, length) of every block of digit ``level``, all outer values."""
        outer = self.digits[level:]
        pitches = self.pitches[level:]
        for values in itertools.product(*(range(digit.size) for digit in outer)):
            start = sum(value * pitch for value, pitch in zip(values, pitches, strict=True))
            yield values[0], start, self.units[level]


# --- the picture ---------------------------------------------------------------------------


def _text_width(text: str, size: float) -> float:
    return len(text) * _CHAR_WIDTH * size


@dataclass(frozen=True)
class _Grid:
    layout: DomainLayout
    rank: int
    gpus_per_node: int | None
    per_cell: int
    x: _Axis
    y: _Axis
    cell: float
    colours: dict[str, str]

    @property
    def cells(self) -> int:
        return self.layout.world_size // self.per_cell

    @property
    def digits(self) -> tuple[_Digit, ...]:
        return self.x.digits + self.y.digits

    @cached_property
    def placements(self) -> list[tuple[float, float, int, int]]:
        """(x, y, column, row) of every cell, the grid's top left corner at (0, 0)."""
        return [
            (self.x.position(cell), self.y.position(cell), self.x.index(cell), self.y.index(cell))
            for cell in range(self.cells)
        ]

    @property
    def cells_per_node(self) -> int | None:
        """Cells in one node, or None when nodes are unknown or do not fall on cell edges."""
        if self.gpus_per_node is None or self.gpus_per_node % self.per_cell:
            return None
        return self.gpus_per_node // self.per_cell

    def groups_of(self, cell: int) -> list[str]:
        """The dims along which ``cell`` holds a member of the rank's group."""
        home = self.rank // self.per_cell
        differing = {d.dim for d in self.digits if d.value(cell) != d.value(home)}
        if not differing:  # the rank's own cell: every dim's group passes through it
            return [dim.name for dim in self.layout.dims if dim.size > 1]
        return list(differing) if len(differing) == 1 else []


def _make_grid(layout: DomainLayout, rank: int, gpus_per_node: int | None) -> _Grid:
    per_cell = ranks_per_cell(layout)
    digits = _cell_digits(_rank_digits(layout), per_cell)
    digits = _mark_solo([part for digit in digits for part in _fold(digit)])
    along_x, along_y = _split_axes(digits)
    # Lay both axes out with a 1-pixel cell, then scale the cell so the grid fits.
    unit_x = _Axis.build(along_x, 1.0).extent
    unit_y = _Axis.build(along_y, 1.0).extent
    cell = min(_MAX_CELL_PX, _MAX_GRID_PX / unit_x, _MAX_GRID_PX / unit_y)
    colours = _dim_colours([dim.name for dim in layout.dims if dim.size > 1])
    return _Grid(
        layout,
        rank,
        gpus_per_node,
        per_cell,
        _Axis.build(along_x, cell),
        _Axis.build(along_y, cell),
        cell,
        colours,
    )


def _dim_colours(names: Sequence[str]) -> dict[str, str]:
    colours = {name: _DIM_COLOURS[name] for name in names if name in _DIM_COLOURS}
    spare = [c for c in _PALETTE if c not in colours.values()] or list(_PALETTE)
    others = [name for name in names if name not in colours]
    colours.update({name: spare[i % len(spare)] for i, name in enumerate(others)})
    return colours


def _fit_font(text: str, room: float, size: float) -> float | None:
    """The largest font up to ``size`` at which ``text`` fits in ``room``, if readable."""
    fitted = min(size, room * 0.8 / max(_text_width(text, 1.0), 1e-9))
    return fitted if fitted >= _MIN_LABEL_PX else None


def _cell_shapes(grid: _Grid, left: float, top: float) -> list[Shape]:
    shapes: list[Shape] = []
    cell = grid.cell
    inset = cell * 0.06
    home = grid.rank // grid.per_cell
    widest = str(grid.layout.world_size - grid.per_cell)
    label_font = _fit_font(widest, cell, cell * 0.42)
    for index, (x, y, _, _) in enumerate(grid.placements):
        x, y = left + x, top + y
        groups = grid.groups_of(index)
        selected = index == home
        fill = _RANK_FILL if selected else grid.colours[groups[0]] if groups else _CELL_FILL
        classes = ["cell", *(["selected"] if selected else []), *(f"group-{g}" for g in groups)]
        first = index * grid.per_cell
        if grid.per_cell == 1:
            data = (("data-rank", str(first)),)
        else:
            data = (("data-ranks", f"{first}-{first + grid.per_cell - 1}"),)
        tooltip = None if label_font is not None else _cell_tooltip(grid, first)
        shapes.append(
            Rect(
                x + inset,
                y + inset,
                cell - 2 * inset,
                cell - 2 * inset,
                fill,
                css_class=" ".join(classes),
                data=data,
                tooltip=tooltip,
            )
        )
        if label_font is not None:
            colour = "#ffffff" if selected else "#000000"
            shapes.append(
                Text(
                    x + cell / 2,
                    y + cell / 2,
                    str(first),
                    label_font,
                    fill=colour,
                    css_class="rank",
                )
            )
    return shapes


def _cell_tooltip(grid: _Grid, first: int) -> str:
    if grid.per_cell > 1:
        return f"ranks {first}-{first + grid.per_cell - 1}"
    coordinate = " ".join(f"{k}={v}" for k, v in grid.layout.coordinate(first).items())
    return f"rank {first}: {coordinate}"


def _node_shapes(grid: _Grid, left: float, top: float) -> list[Shape]:
    """One path per node: the cell edges where the neighbour is another node or a gap."""
    per_node = grid.cells_per_node
    if per_node is None:
        return []
    cell = grid.cell
    placements = grid.placements
    at = {(column, row): index for index, (_, _, column, row) in enumerate(placements)}
    outlines: dict[int, list[tuple[float, float, float, float]]] = {}
    for index, (x, y, column, row) in enumerate(placements):
        x, y = left + x, top + y
        node = index // per_node
        sides = (
            ((column - 1, row), (x, y, x, y + cell)),
            ((column + 1, row), (x + cell, y, x + cell, y + cell)),
            ((column, row - 1), (x, y, x + cell, y)),
            ((column, row + 1), (x, y + cell, x + cell, y + cell)),
        )
        for neighbour_at, segment in sides:
            neighbour = at.get(neighbour_at)
            if neighbour is None or neighbour // per_node != node or _apart(grid, index, neighbour):
                outlines.setdefault(node, []).append(segment)
    width = min(2.5, max(1.0, cell * 0.1))
    return [
        Lines(tuple(segments), _NODE_STROKE, width, css_class="node")
        for _, segments in sorted(outlines.items())
    ]


def _apart(grid: _Grid, first: int, second: int) -> bool:
    """Whether a block gap separates two cells that are neighbours in the grid."""
    first_x, first_y, _, _ = grid.placements[first]
    second_x, second_y, _, _ = grid.placements[second]
    dx, dy = abs(first_x - second_x), abs(first_y - second_y)
    return max(dx, dy) > grid.cell * 1.001


def _header_font(grid: _Grid) -> float:
    return max(7.0, min(11.0, grid.cell * 0.42))


def _column_headers(grid: _Grid, left: float, top: float, row_height: float) -> list[Shape]:
    """Above the grid, one row per x digit, outermost on top, each label over its block."""
    shapes: list[Shape] = []
    levels = len(grid.x.digits)
    for level, digit in enumerate(grid.x.digits):
        y = top + (levels - 1 - level) * row_height + row_height / 2
        room = grid.x.units[level] * 0.95
        choice = _header_style(digit, room, _header_font(grid))
        if choice is None:
            continue
        form, size = choice
        for value, start, length in grid.x.blocks(level):
            text = digit.label(value)[form]
            shapes.append(Text(left + start + length / 2, y, text, size, css_class="header"))
    return shapes


def _header_style(digit: _Digit, room: float, font: float) -> tuple[int, float] | None:
    """Which label (0 full, 1 short) and font one row of headers uses, the same for all its
    blocks: the full labels, shrunk a little if need be; else the short ones; else none."""
    labels = [digit.label(value) for value in range(digit.size)]
    widest_full = max(_text_width(full, 1.0) for full, _ in labels)
    size = min(font, room / widest_full)
    if size >= _MIN_HEADER_PX:
        return 0, size
    if max(_text_width(short, font) for _, short in labels) <= room:
        return 1, font
    return None


def _row_header_widths(grid: _Grid) -> list[float]:
    font = _header_font(grid)
    widths = []
    for digit in grid.y.digits:
        longest = max((digit.label(v)[0] for v in range(digit.size)), key=len)
        widths.append(_text_width(longest, font) + 8)
    return widths


def _row_headers(grid: _Grid, left: float, top: float) -> list[Shape]:
    """Left of the grid, one column per y digit, outermost leftmost."""
    shapes: list[Shape] = []
    widths = _row_header_widths(grid)
    font = _header_font(grid)
    for level, digit in enumerate(grid.y.digits):
        right = left + sum(widths[level:]) - 4
        for value, start, length in grid.y.blocks(level):
            size = min(font, length * 0.9)
            if size < _MIN_LABEL_PX:
                continue
            text = digit.label(value)[0]
            shapes.append(
                Text(right, top + start + length / 2, text, size, "end", css_class="header")
            )
    return shapes


def _locality(layout: DomainLayout, name: str, gpus_per_node: int | None) -> str:
    if gpus_per_node is None:
        return ""
    return f", {layout.placement(name, gpus_per_node)}"


@dataclass(frozen=True)
class _LegendLine:
    text: str
    fill: str | None = None  # the swatch's colour; None for no swatch
    outline: bool = False  # a swatch drawn as a node outline


def _plural(count: int, noun: str) -> str:
    return f"{count} {noun}" if count == 1 else f"{count} {noun}s"


def _legend_lines(grid: _Grid) -> list[_LegendLine]:
    layout, rank = grid.layout, grid.rank
    coordinate = " ".join(f"{k}={v}" for k, v in layout.coordinate(rank).items())
    where = "" if grid.per_cell == 1 else " (its cell)"
    lines = [_LegendLine(f"rank {rank}{where}: {coordinate}", _RANK_FILL)]
    drawn = {digit.dim for digit in grid.digits}
    for dim in layout.dims:
        strides = " and ".join(str(mode.stride) for mode in dim.modes)
        facts = (
            f"{dim.name}: size {dim.size}, stride{'s' if len(dim.modes) > 1 else ''} {strides}, "
            f"{_plural(layout.num_groups(dim.name), 'group')}"
            f"{_locality(layout, dim.name, grid.gpus_per_node)}"
        )
        if dim.size == 1:
            lines.append(_LegendLine(f"{facts}; groups of one rank"))
        elif dim.name not in drawn:
            text = f"{facts}; rank {rank}'s group lies inside its cell"
            lines.append(_LegendLine(text, grid.colours[dim.name]))
        else:
            text = f"{facts}; coloured: rank {rank}'s group"
            lines.append(_LegendLine(text, grid.colours[dim.name]))
    lines.append(_node_line(grid))
    return lines


def _node_line(grid: _Grid) -> _LegendLine:
    per_node = grid.gpus_per_node
    if per_node is None:
        return _LegendLine("nodes: unknown (set gpus_per_node or pass --gpus-per-node)")
    nodes = f"{_plural(-(-grid.layout.world_size // per_node), 'node')} of {per_node} GPUs"
    if grid.cells_per_node is not None:
        return _LegendLine(f"outlined: {nodes}", outline=True)
    if grid.per_cell % per_node == 0:
        whole = _plural(grid.per_cell // per_node, "whole node")
        return _LegendLine(f"{nodes}; not outlined: each cell is {whole}")
    return _LegendLine(f"{nodes}; not outlined: cells of {grid.per_cell} ranks cut across nodes")


def _summary_note(grid: _Grid) -> str | None:
    if grid.per_cell == 1:
        return None
    inside = []
    for digit in _rank_digits(grid.layout):
        if digit.stride * digit.size <= grid.per_cell:
            inside.append(f"{digit.dim}={digit.size}")
        elif digit.stride < grid.per_cell:
            inside.append(f"{grid.per_cell // digit.stride} of {digit.dim}={digit.size}")
    return (
        f"summary: {grid.layout.world_size} ranks is more than {FULL_LIMIT}; each cell is "
        f"{grid.per_cell} consecutive ranks ({' x '.join(inside)}), labelled with its first rank"
    )


def _arrangement(grid: _Grid) -> str:
    def names(axis: _Axis) -> str:
        return ", ".join(dict.fromkeys(digit.dim for digit in axis.digits))

    if not grid.x.digits:
        return "a single cell"
    rows = f"; rows: {names(grid.y)}" if grid.y.digits else ""
    return f"columns: {names(grid.x)}{rows} (inner to outer)"


def _title(grid: _Grid) -> tuple[str, str]:
    layout = grid.layout
    shape = ", ".join(f"{dim.name}={dim.size}" for dim in layout.dims)
    nodes = "" if grid.gpus_per_node is None else f", {grid.gpus_per_node} GPUs per node"
    return (
        f"domain {layout.name} [{shape}]",
        f"{layout.world_size} ranks{nodes}; coloured: the groups of rank {grid.rank}",
    )


def draw_domain(layout: DomainLayout, rank: int = 0, gpus_per_node: int | None = None) -> Drawing:
    """The picture of ``layout``'s rank grid with ``rank``'s groups coloured.

    Raises ``LayoutError`` for a rank outside the world and ``ValueError`` for a
    ``gpus_per_node`` below 1.
    """
    if gpus_per_node is not None and gpus_per_node < 1:
        raise InvalidArgumentError(f"gpus_per_node must be >= 1, got {gpus_per_node}")
    layout.coordinate(rank)  # checks the rank
    grid = _make_grid(layout, rank, gpus_per_node)
    title, subtitle = _title(grid)
    notes = [subtitle, _arrangement(grid)]
    summary = _summary_note(grid)
    if summary is not None:
        notes.append(summary)
    shapes: list[Shape] = [Text(_MARGIN, _MARGIN + 8, title, 15.0, "start", bold=True)]
    y = _MARGIN + 8 + _LINE_PX + 2
    for note in notes:
        shapes.append(Text(_MARGIN, y, note, _TEXT_PX, "start", fill="#333333"))
        y += _LINE_PX
    header_row = _header_font(grid) * 1.7
    grid_top = y + header_row * len(grid.x.digits)
    grid_left = _MARGIN + sum(_row_header_widths(grid))
    shapes += _column_headers(grid, grid_left, y, header_row)
    shapes += _row_headers(grid, _MARGIN, grid_top)
    shapes += _cell_shapes(grid, grid_left, grid_top)
    shapes += _node_shapes(grid, grid_left, grid_top)
    legend_top = grid_top + grid.y.extent + _LINE_PX
    legend, legend_width = _legend_shapes(grid, _MARGIN, legend_top)
    shapes += legend
    texts = [title, *notes]
    width = max(
        grid_left + grid.x.extent,
        _MARGIN + legend_width,
        _MARGIN + max(_text_width(text, _TEXT_PX) for text in texts),
    )
    height = legend_top + _LINE_PX * len(_legend_lines(grid))
    return Drawing(
        round(width + _MARGIN),
        round(height + _MARGIN),
        tuple(shapes),
        grid.x.count,
        grid.y.count,
        grid.per_cell,
    )


def _legend_shapes(grid: _Grid, left: float, top: float) -> tuple[list[Shape], float]:
    shapes: list[Shape] = []
    widest = 0.0
    swatch = _TEXT_PX
    for number, line in enumerate(_legend_lines(grid)):
        y = top + number * _LINE_PX
        if line.outline:
            shapes.append(Rect(left, y - swatch / 2, swatch, swatch, "none", _NODE_STROKE, 2.0))
        elif line.fill is not None:
            shapes.append(Rect(left, y - swatch / 2, swatch, swatch, line.fill))
        shapes.append(Text(left + swatch + 6, y, line.text, _TEXT_PX, "start", css_class="legend"))
        widest = max(widest, swatch + 6 + _text_width(line.text, _TEXT_PX))
    return shapes, widest


def render_svg(layout: DomainLayout, rank: int = 0, gpus_per_node: int | None = None) -> str:
    return to_svg(draw_domain(layout, rank, gpus_per_node))


# --- output formats ------------------------------------------------------------------------


def _number(value: float) -> str:
    text = f"{value:.2f}".rstrip("0").rstrip(".")
    return "0" if text in ("", "-0") else text


def _attributes(pairs: Sequence[tuple[str, str]]) -> str:
    return "".join(f" {name}={quoteattr(value)}" for name, value in pairs)


def _svg_rect(rect: Rect) -> str:
    pairs = [
        ("x", _number(rect.x)),
        ("y", _number(rect.y)),
        ("width", _number(rect.width)),
        ("height", _number(rect.height)),
        ("fill", rect.fill),
    ]
    if rect.stroke is not None:
        pairs += [("stroke", rect.stroke), ("stroke-width", _number(rect.stroke_width))]
    if rect.css_class:
        pairs.append(("class", rect.css_class))
    pairs += rect.data
    if rect.tooltip is None:
        return f"<rect{_attributes(pairs)}/>"
    return f"<rect{_attributes(pairs)}><title>{escape(rect.tooltip)}</title></rect>"


def _svg_text(text: Text) -> str:
    pairs = [
        ("x", _number(text.x)),
        ("y", _number(text.y)),
        ("font-size", _number(text.size)),
        ("text-anchor", text.anchor),
        ("dominant-baseline", "central"),
    ]
    if text.fill != "#000000":
        pairs.append(("fill", text.fill))
    if text.bold:
        pairs.append(("font-weight", "bold"))
    if text.css_class:
        pairs.append(("class", text.css_class))
    return f"<text{_attributes(pairs)}>{escape(text.text)}</text>"


def _svg_lines(lines: Lines) -> str:
    path = "".join(
        f"M{_number(x1)} {_number(y1)}L{_number(x2)} {_number(y2)}"
        for x1, y1, x2, y2 in lines.segments
    )
    pairs = [
        ("d", path),
        ("fill", "none"),
        ("stroke", lines.stroke),
        ("stroke-width", _number(lines.stroke_width)),
        ("stroke-linecap", "square"),
    ]
    if lines.css_class:
        pairs.append(("class", lines.css_class))
    return f"<path{_attributes(pairs)}/>"


def to_svg(drawing: Drawing) -> str:
    width, height = _number(drawing.width), _number(drawing.height)
    head = (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" font-family={quoteattr(_FONT)}>'
    )
    body = [f'<rect width="{width}" height="{height}" fill="#ffffff"/>']
    for shape in drawing.shapes:
        if isinstance(shape, Rect):
            body.append(_svg_rect(shape))
        elif isinstance(shape, Text):
            body.append(_svg_text(shape))
        else:
            body.append(_svg_lines(shape))
    return "\n".join([head, *body, "</svg>"]) + "\n"


def to_png(drawing: Drawing, scale: float = 2.0) -> bytes:
    """The same picture as PNG, through matplotlib (an optional library: ``ImportError`` when
    it is not installed)."""
    import io

    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.collections import LineCollection
    from matplotlib.figure import Figure
    from matplotlib.patches import Rectangle

    dpi = 100.0
    points = 72.0 / dpi  # matplotlib sizes fonts and lines in points, the drawing in pixels
    figure = Figure(figsize=(drawing.width / dpi, drawing.height / dpi), dpi=dpi)
    FigureCanvasAgg(figure)
    axes = figure.add_axes((0.0, 0.0, 1.0, 1.0))
    axes.set_xlim(0, drawing.width)
    axes.set_ylim(drawing.height, 0)
    axes.axis("off")
    alignment = {"start": "left", "middle": "center", "end": "right"}
    for shape in drawing.shapes:
        if isinstance(shape, Rect):
            axes.add_patch(
                Rectangle(
                    (shape.x, shape.y),
                    shape.width,
                    shape.height,
                    facecolor=shape.fill,
                    edgecolor=shape.stroke or "none",
                    linewidth=shape.stroke_width * points,
                )
            )
        elif isinstance(shape, Text):
            axes.text(
                shape.x,
                shape.y,
                shape.text,
                fontsize=shape.size * points,
                ha=alignment[shape.anchor],
                va="center",
                color=shape.fill,
                fontweight="bold" if shape.bold else "normal",
            )
        else:
            segments = [[(x1, y1), (x2, y2)] for x1, y1, x2, y2 in shape.segments]
            axes.add_collection(
                LineCollection(
                    segments, colors=shape.stroke, linewidths=shape.stroke_width * points
                )
            )
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=dpi * scale)
    return buffer.getvalue()
