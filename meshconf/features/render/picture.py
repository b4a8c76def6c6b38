"""A domain's picture: the cells, their rank labels, node and level outlines, headers and
legend, laid out as shapes in pixels (``Drawing``), ready for either writer."""

from __future__ import annotations

from meshconf.core.errors import InvalidArgumentError
from meshconf.core.layout import DomainLayout
from meshconf.core.levels import Level
from meshconf.features.render.grid import Digit, Grid, make_grid
from meshconf.features.render.legend import arrangement, legend_shapes, summary_note, title_lines
from meshconf.features.render.shapes import (
    CELL_FILL,
    LEVEL_STROKES,
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
    text_width,
)

_MARGIN = 14.0
_MIN_HEADER_PX = 7.0


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
    for index, (x, y, _, _) in enumerate(grid.placements):
        x, y = left + x, top + y
        groups = grid.groups_of(index)
        selected = index == home
        fill = RANK_FILL if selected else colours[groups[0]] if groups else CELL_FILL
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


def _cell_tooltip(grid: Grid, first: int) -> str:
    if grid.per_cell > 1:
        return f"ranks {first}-{first + grid.per_cell - 1}"
    coordinate = " ".join(f"{k}={v}" for k, v in grid.layout.coordinate(first).items())
    return f"rank {first}: {coordinate}"


def _outline_shapes(grid: Grid, left: float, top: float) -> list[Shape]:
    """The outlines of the nodes, then of each level above them, each wider than the last."""
    width = min(2.5, max(1.0, grid.cell * 0.1))
    shapes = _unit_shapes(grid, left, top, grid.cells_per_node, NODE_STROKE, width, "node")
    for level, stroke in zip(grid.levels, LEVEL_STROKES, strict=False):
        width += 1.5
        cells = grid.cells_per_unit(level.size)
        shapes += _unit_shapes(grid, left, top, cells, stroke, width, f"level-{level.name}")
    return shapes


def _unit_shapes(
    grid: Grid,
    left: float,
    top: float,
    per_node: int | None,
    stroke: str,
    width: float,
    css_class: str,
) -> list[Shape]:
    """One path per unit of ``per_node`` cells: the cell edges where the neighbour is in
    another unit or across a gap."""
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
    return [
        Lines(tuple(segments), stroke, width, css_class=css_class)
        for _, segments in sorted(outlines.items())
    ]


def _apart(grid: Grid, first: int, second: int) -> bool:
    """Whether a block gap separates two cells that are neighbours in the grid."""
    first_x, first_y, _, _ = grid.placements[first]
    second_x, second_y, _, _ = grid.placements[second]
    dx, dy = abs(first_x - second_x), abs(first_y - second_y)
    return max(dx, dy) > grid.cell * 1.001


def _header_font(grid: Grid) -> float:
    return max(7.0, min(11.0, grid.cell * 0.42))


def _column_headers(grid: Grid, left: float, top: float, row_height: float) -> list[Shape]:
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
    font = _header_font(grid)
    widths = []
    for digit in grid.y.digits:
        longest = max((digit.label(v)[0] for v in range(digit.size)), key=len)
        widths.append(text_width(longest, font) + 8)
    return widths


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
    return Drawing(
        round(width + _MARGIN),
        round(height + _MARGIN),
        tuple(shapes),
        grid.x.count,
        grid.y.count,
        grid.per_cell,
    )
