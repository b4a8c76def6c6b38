"""A domain's picture: the cells, their rank labels, node and level outlines, headers and
legend, laid out as shapes in pixels (``Drawing``), ready for either writer."""

from __future__ import annotations

from meshconf.core.errors import InvalidArgumentError
from meshconf.core.layout import DomainLayout
from meshconf.core.levels import NODE, Level
from meshconf.features.render.grid import Digit, Grid, make_grid
from meshconf.features.render.legend import arrangement, legend_shapes, summary_note, title_lines
from meshconf.features.render.shapes import (
    CELL_FILL,
    LINE_PX,
    MIN_LABEL_PX,
    NODE_STROKE,
    RANK_FILL,
    TEXT_PX,
    Drawing,
    Lines,
    Rect,
    Shape,
    Text,
    dim_colours,
    level_stroke,
    text_width,
)

_MARGIN = 14.0
_MIN_HEADER_PX = 7.0
#: The smallest font a unit's tab is written in.
_MIN_TAB_PX = 6.0


def _fit_font(text: str, room: float, size: float) -> float | None:
    """The largest font up to ``size`` at which ``text`` fits in ``room``, if readable."""
    fitted = min(size, room * 0.8 / max(text_width(text, 1.0), 1e-9))
    return fitted if fitted >= MIN_LABEL_PX else None


def _cell_shapes(grid: Grid, colours: dict[str, str], left: float, top: float) -> list[Shape]:
    shapes: list[Shape] = []
    cell = grid.cell
    inset = cell * 0.06
    home = grid.rank // grid.per_cell
    widest = str(grid.layout.world_size - grid.per_cell)
    label_font = _fit_font(widest, cell, cell * 0.42)
    box = cell - 2 * inset
    half = cell / 2
    for index, (x, y, _, _) in enumerate(grid.placements):
        x, y = left + x, top + y
        groups = grid.groups_of(index)
        selected = index == home
        fill = RANK_FILL if selected else colours[groups[0]] if groups else CELL_FILL
        classes = ["cell", *(["selected"] if selected else []), *(f"group-{g}" for g in groups)]
        css = " ".join(classes)
        first = index * grid.per_cell
        ranks = f"{first}-{first + grid.per_cell - 1}"
        data = (("data-rank", str(first)),) if grid.per_cell == 1 else (("data-ranks", ranks),)
        tooltip = None if label_font is not None else _cell_tooltip(grid, first, ranks)
        shapes.append(
            Rect(x + inset, y + inset, box, box, fill, css_class=css, data=data, tooltip=tooltip)
        )
        if label_font is not None:
            colour = "#ffffff" if selected else "#000000"
            shapes.append(
                Text(x + half, y + half, str(first), label_font, fill=colour, css_class="rank")
            )
    return shapes


def _cell_tooltip(grid: Grid, first: int, ranks: str) -> str:
    if grid.per_cell > 1:
        return f"ranks {ranks}"
    coordinate = " ".join(f"{k}={v}" for k, v in grid.layout.coordinate(first).items())
    return f"rank {first}: {coordinate}"


def _outline_shapes(grid: Grid, left: float, top: float) -> list[Shape]:
    """The outlines of the nodes, then of each level above them, each wider than the last;
    each unit of a level above the node carries its name and index. A level whose units
    are already drawn (one GPU, one node, an inner level's) is not outlined again."""
    width = min(2.5, max(1.0, grid.cell * 0.1))
    outlines = _UnitOutlines(grid, left, top)
    shapes = []
    if NODE not in grid.repeated:
        shapes = outlines.shapes(grid.cells_per_node, NODE_STROKE, width, "node", None)
    for index, level in enumerate(grid.outlined_levels):
        width += 1.5
        cells = grid.cells_per_unit(level.size)
        shapes += outlines.shapes(cells, level_stroke(index), width, f"level-{level.name}", level)
    return shapes


Segment = tuple[float, float, float, float]


class _UnitOutlines:
    """One closed outline per unit of consecutive cells, around all of its cells: where a
    unit goes on across a gap between blocks, its outline goes round the gap too, so that
    a unit is never drawn as two boxes.

    Along each axis the grid alternates slots of cells and of the gaps between them (a gap
    of no width where two blocks touch). A unit fills the slots of its cells, the gap between
    two of its cells, and the corner between four; its outline is every side of a filled
    slot whose neighbour is not filled, joined into straight runs."""

    def __init__(self, grid: Grid, left: float, top: float) -> None:
        self.grid = grid
        columns: dict[int, float] = {}
        rows: dict[int, float] = {}
        self.at: dict[tuple[int, int], int] = {}
        for index, (x, y, column, row) in enumerate(grid.placements):
            columns[column], rows[row] = left + x, top + y
            self.at[(column, row)] = index
        self.xs = _slot_edges([columns[c] for c in range(len(columns))], grid.cell)
        self.ys = _slot_edges([rows[r] for r in range(len(rows))], grid.cell)

    def shapes(
        self, per_unit: int | None, stroke: str, width: float, css_class: str, level: Level | None
    ) -> list[Shape]:
        """The outline of every unit of ``per_unit`` cells (none when units do not fall on
        cells' edges), and for a ``level`` above the node a tab naming each unit."""
        if per_unit is None:
            return []
        filled: dict[int, set[tuple[int, int]]] = {}
        for (column, row), index in self.at.items():
            unit = index // per_unit
            slots = filled.setdefault(unit, set())
            slots.add((2 * column, 2 * row))
            right = self._unit_at(column + 1, row, per_unit)
            below = self._unit_at(column, row + 1, per_unit)
            if right == unit:
                slots.add((2 * column + 1, 2 * row))
            if below == unit:
                slots.add((2 * column, 2 * row + 1))
            if right == below == unit == self._unit_at(column + 1, row + 1, per_unit):
                slots.add((2 * column + 1, 2 * row + 1))
        shapes: list[Shape] = []
        for unit, slots in sorted(filled.items()):
            data = (("data-unit", str(unit)),)
            shapes.append(Lines(self._outline(slots), stroke, width, css_class, data))
            if level is not None:
                shapes += self._tab(slots, f"{level.name} {unit}", stroke, css_class)
        return shapes

    def _unit_at(self, column: int, row: int, per_unit: int) -> int | None:
        index = self.at.get((column, row))
        return None if index is None else index // per_unit

    def _outline(self, slots: set[tuple[int, int]]) -> tuple[Segment, ...]:
        xs, ys = self.xs, self.ys
        horizontal: dict[float, list[tuple[float, float]]] = {}
        vertical: dict[float, list[tuple[float, float]]] = {}
        for sx, sy in slots:
            x0, x1, y0, y1 = xs[sx], xs[sx + 1], ys[sy], ys[sy + 1]
            if (sx, sy - 1) not in slots:
                horizontal.setdefault(y0, []).append((x0, x1))
            if (sx, sy + 1) not in slots:
                horizontal.setdefault(y1, []).append((x0, x1))
            if (sx - 1, sy) not in slots:
                vertical.setdefault(x0, []).append((y0, y1))
            if (sx + 1, sy) not in slots:
                vertical.setdefault(x1, []).append((y0, y1))
        segments = [(a, y, b, y) for y, runs in horizontal.items() for a, b in _joined(runs)]
        segments += [(x, a, x, b) for x, runs in vertical.items() for a, b in _joined(runs)]
        return tuple(sorted(segments))

    def _tab(
        self, slots: set[tuple[int, int]], text: str, stroke: str, css_class: str
    ) -> list[Shape]:
        """A small label in the outline's colour at the unit's top left corner, when a font
        large enough to read fits a cell."""
        size = min(10.0, self.grid.cell * 0.34)
        if size < _MIN_TAB_PX:
            return []
        top = min(sy for _, sy in slots)
        left = min(sx for sx, sy in slots if sy == top)
        x, y = self.xs[left], self.ys[top]
        width, height = text_width(text, size) + size * 0.6, size * 1.3
        return [
            Rect(x, y - height / 2, width, height, stroke, css_class=f"{css_class} tab"),
            Text(x + width / 2, y, text, size, fill="#ffffff", css_class=f"{css_class} tab"),
        ]


def _slot_edges(starts: list[float], cell: float) -> list[float]:
    """The edges of the alternating cell and gap slots along an axis whose cells start at
    ``starts``: slot ``2 i`` is cell ``i``, slot ``2 i + 1`` the gap after it."""
    return [edge for position in starts for edge in (position, position + cell)]


def _joined(runs: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """Runs along one line, those that touch joined into one; runs of no length left out."""
    joined: list[tuple[float, float]] = []
    for start, end in sorted(runs):
        if joined and start <= joined[-1][1] + 1e-9:
            joined[-1] = (joined[-1][0], max(joined[-1][1], end))
        else:
            joined.append((start, end))
    return [(start, end) for start, end in joined if end - start > 1e-9]


def _header_font(grid: Grid) -> float:
    return max(7.0, min(11.0, grid.cell * 0.42))


def _column_headers(grid: Grid, left: float, top: float, row_height: float) -> list[Shape]:
    """Above the grid, one row per x digit, outermost on top, each label over its block."""
    shapes: list[Shape] = []
    levels = len(grid.x.digits)
    for level, digit in enumerate(grid.x.digits):
        y = top + (levels - 1 - level) * row_height + row_height / 2
        # a fifth of each block left free, so that neighbouring labels never touch
        room = grid.x.units[level] * 0.8
        choice = _header_style(digit, room, _header_font(grid))
        if choice is None:
            continue
        form, size = choice
        for value, start, length in grid.x.blocks(level):
            text = digit.label(value)[form]
            shapes.append(Text(left + start + length / 2, y, text, size, css_class="header"))
    return shapes


def _header_style(digit: Digit, room: float, font: float) -> tuple[int, float] | None:
    """Which label (0 full, 1 short) and font one row of headers uses, the same for all its
    blocks: the full labels, shrunk a little if need be; else the short ones; else none."""
    labels = [digit.label(value) for value in range(digit.size)]
    widest_full = max(text_width(full, 1.0) for full, _ in labels)
    size = min(font, room / widest_full)
    if size >= _MIN_HEADER_PX:
        return 0, size
    if max(text_width(short, font) for _, short in labels) <= room:
        return 1, font
    return None


def _row_header_widths(grid: Grid) -> list[float]:
    longest = (max((d.label(v)[0] for v in range(d.size)), key=len) for d in grid.y.digits)
    return [text_width(label, _header_font(grid)) + 8 for label in longest]


def _row_headers(grid: Grid, left: float, top: float) -> list[Shape]:
    """Left of the grid, one column per y digit, outermost leftmost."""
    shapes: list[Shape] = []
    widths = _row_header_widths(grid)
    font = _header_font(grid)
    for level, digit in enumerate(grid.y.digits):
        right = left + sum(widths[level:]) - 4
        for value, start, length in grid.y.blocks(level):
            size = min(font, length * 0.9)
            if size < MIN_LABEL_PX:
                continue
            text = digit.label(value)[0]
            shapes.append(
                Text(right, top + start + length / 2, text, size, "end", css_class="header")
            )
    return shapes


def draw_domain(
    layout: DomainLayout,
    rank: int = 0,
    gpus_per_node: int | None = None,
    levels: tuple[Level, ...] = (),
) -> Drawing:
    """The picture of ``layout``'s rank grid with ``rank``'s groups coloured, nodes and each
    of ``levels`` (the levels above the node, inner to outer) outlined.

    Raises ``LayoutError`` for a rank outside the world and ``ValueError`` for a
    ``gpus_per_node`` below 1.
    """
    if gpus_per_node is not None and gpus_per_node < 1:
        raise InvalidArgumentError(f"gpus_per_node must be >= 1, got {gpus_per_node}")
    layout.coordinate(rank)  # checks the rank
    grid = make_grid(layout, rank, gpus_per_node, levels)
    title, subtitle = title_lines(grid)
    colours = dim_colours([dim.name for dim in layout.dims if dim.size > 1])
    notes = [subtitle, arrangement(grid)]
    summary = summary_note(grid)
    if summary is not None:
        notes.append(summary)
    shapes: list[Shape] = [Text(_MARGIN, _MARGIN + 8, title, 15.0, "start", bold=True)]
    y = _MARGIN + 8 + LINE_PX + 2
    for note in notes:
        shapes.append(Text(_MARGIN, y, note, TEXT_PX, "start", fill="#333333"))
        y += LINE_PX
    header_row = _header_font(grid) * 1.7
    grid_top = y + header_row * len(grid.x.digits)
    grid_left = _MARGIN + sum(_row_header_widths(grid))
    shapes += _column_headers(grid, grid_left, y, header_row)
    shapes += _row_headers(grid, _MARGIN, grid_top)
    shapes += _cell_shapes(grid, colours, grid_left, grid_top)
    shapes += _outline_shapes(grid, grid_left, grid_top)
    legend_top = grid_top + grid.y.extent + LINE_PX
    legend, legend_width, legend_height = legend_shapes(grid, colours, _MARGIN, legend_top)
    shapes += legend
    texts = [title, *notes]
    width = max(
        grid_left + grid.x.extent,
        _MARGIN + legend_width,
        _MARGIN + max(text_width(text, TEXT_PX) for text in texts),
    )
    height = legend_top + legend_height
    size = (round(width + _MARGIN), round(height + _MARGIN))
    return Drawing(*size, tuple(shapes), grid.x.count, grid.y.count, grid.per_cell)
