"""The cell grid of a domain's picture: which ranks share a cell, and where each cell goes.

The ranks are drawn as the domain's dims unflattened row-major. Each mixed-radix digit of the
rank (one per mode of size > 1, innermost first) becomes one level of nested blocks along x or
y; a digit goes to the axis that is shorter so far, so the picture stays roughly square. A
digit longer than ``WRAP_SIZE`` is folded into two (an inner part along one axis, the rest
along the other), which keeps a long stride-1 dim from becoming a single row of cells.

Worlds of more than ``FULL_LIMIT`` ranks are summarised: a cell stands for a block of
consecutive ranks (all of the innermost digits, and part of the next one), so that at most
``SUMMARY_CELLS`` cells are drawn. Nothing here is proportional to the world size: the work
is proportional to the number of cells.
"""

from __future__ import annotations

import itertools
import math
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from functools import cached_property

from meshconf.core.degrees import divisors
from meshconf.core.layout import DomainLayout
from meshconf.core.levels import NODE, Level

FULL_LIMIT = 4096
SUMMARY_CELLS = 512
WRAP_SIZE = 16

_MAX_GRID_PX = 1100.0
_MAX_CELL_PX = 40.0
_GAP_RATIO = 0.5


@dataclass(frozen=True)
class Digit:
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


def rank_digits(layout: DomainLayout) -> list[Digit]:
    """The digits of a rank, innermost (stride 1) first; size-1 modes are left out."""
    digits: list[Digit] = []
    for dim in layout.dims:
        step = 1
        for mode in reversed(dim.modes):
            if mode.size > 1:
                digits.append(Digit(dim.name, mode.size, mode.stride, step, 1))
            step *= mode.size
    return sorted(digits, key=lambda digit: digit.stride)


def ranks_per_cell(layout: DomainLayout) -> int:
    """1 up to ``FULL_LIMIT`` ranks; beyond, the smallest block of consecutive ranks (the
    inner digits and a divisor of the next one) that leaves at most ``SUMMARY_CELLS`` cells."""
    world_size = layout.world_size
    if world_size <= FULL_LIMIT:
        return 1
    for digit in rank_digits(layout):
        # The digits form a complete mixed radix, so a digit's stride is the product of the
        # smaller digits' sizes: every candidate is a block of whole inner digits.
        for factor in divisors(digit.size):
            if world_size // (digit.stride * factor) <= SUMMARY_CELLS:
                return digit.stride * factor
    return world_size


def cell_digits(digits: Sequence[Digit], per_cell: int) -> list[Digit]:
    """The digits of the cell index, once ``per_cell`` consecutive ranks share a cell."""
    cells: list[Digit] = []
    for digit in digits:
        if digit.stride >= per_cell:
            cells.append(replace(digit, stride=digit.stride // per_cell))
        elif digit.stride * digit.size > per_cell:
            cut = per_cell // digit.stride
            cells.append(Digit(digit.dim, digit.size // cut, 1, digit.step * cut, cut))
    return cells


def fold(digit: Digit, inner: int) -> list[Digit]:
    """A digit as an inner part of ``inner`` values and an outer part."""
    outer = replace(digit, size=digit.size // inner, stride=digit.stride * inner)
    return [replace(digit, size=inner), replace(outer, step=digit.step * inner)]


def fold_options(digit: Digit, units: Sequence[int]) -> list[list[Digit]]:
    """The ways to fold a digit longer than ``WRAP_SIZE`` (one way, unfolded, for a short or
    prime one). ``units`` are the sizes in cells of the nodes and levels. Where one ends
    inside the digit, the inner part is one that makes each unit one block of it or whole
    blocks of it, a rectangle of the grid (an NVLink domain of 72 GPUs over tp 4 and fsdp 72
    folds fsdp as 36 x 2 or 18 x 4, not 9 x 8), those inside one block first. Otherwise
    the inner part is the smallest divisor at least the digit's square root."""
    candidates = [d for d in divisors(digit.size) if 1 < d < digit.size]
    if digit.size <= WRAP_SIZE or not candidates:
        return [[digit]]
    # the units that end inside the digit, in values of the digit
    cuts = {
        unit // digit.stride
        for unit in units
        if unit % digit.stride == 0
        and digit.stride < unit < digit.stride * digit.size
        and digit.size % (unit // digit.stride) == 0
    }
    if not cuts:
        return [fold(digit, next(d for d in candidates if d * d >= digit.size))]

    def fit(inner: int) -> tuple[int, int]:
        whole = sum(1 for cut in cuts if inner % cut == 0 or cut % inner == 0)
        within = sum(1 for cut in cuts if inner % cut == 0)
        return whole, within

    best = max(fit(inner) for inner in candidates)
    return [fold(digit, inner) for inner in candidates if fit(inner) == best]


def fold_digits(digits: Sequence[Digit], units: Sequence[int]) -> list[Digit]:
    """The digits with the long ones folded (:func:`fold_options`), inner to outer; where a
    digit may fold several ways, the one that leaves the grid squarest."""
    options = [fold_options(digit, units) for digit in digits]
    folded: list[Digit] = []
    for index, ways in enumerate(options):
        later = [part for way in options[index + 1 :] for part in way[0]]
        folded += min(ways, key=lambda way: _oblong([*folded, *way, *later]))
    return folded


def _oblong(digits: Sequence[Digit]) -> float:
    """How far the grid of ``digits`` is from square: its longer side over its shorter."""
    along_x, along_y = split_axes(digits)
    width = math.prod(digit.size for digit in along_x)
    height = math.prod(digit.size for digit in along_y)
    return max(width, height) / min(width, height)


def mark_solo(digits: Sequence[Digit]) -> list[Digit]:
    counts = Counter(digit.dim for digit in digits)
    return [replace(digit, solo=counts[digit.dim] == 1) for digit in digits]


def split_axes(digits: Sequence[Digit]) -> tuple[list[Digit], list[Digit]]:
    """Inner digits first; each goes to the axis with fewer cells so far (ties alternate)."""
    along_x: list[Digit] = []
    along_y: list[Digit] = []
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
class Axis:
    """Positions along one axis: digits inner to outer, each level's blocks a gap apart."""

    digits: tuple[Digit, ...]
    pitches: tuple[float, ...]  # distance between consecutive values of each digit
    units: tuple[float, ...]  # length of the block that one value of each digit covers
    extent: float

    @classmethod
    def build(cls, digits: Sequence[Digit], cell: float) -> Axis:
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


@dataclass(frozen=True)
class Grid:
    """Where each cell of a domain's picture goes, and which of ``rank``'s groups it shows."""

    layout: DomainLayout
    rank: int
    gpus_per_node: int | None
    per_cell: int
    x: Axis
    y: Axis
    cell: float
    #: The levels above the node, inner to outer, outlined too.
    levels: tuple[Level, ...] = ()

    @property
    def cells(self) -> int:
        return self.layout.world_size // self.per_cell

    @property
    def digits(self) -> tuple[Digit, ...]:
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
        return None if self.gpus_per_node is None else self.cells_per_unit(self.gpus_per_node)

    @cached_property
    def repeated(self) -> dict[str, str]:
        """The levels (by name, the node's ``node``) whose units the picture already shows,
        and what each unit is: an outline of them would add nothing but one line per unit."""
        return repeated_units(self.gpus_per_node, self.levels)

    @property
    def outlined_levels(self) -> tuple[Level, ...]:
        """The levels above the node that are outlined, inner to outer."""
        return tuple(level for level in self.levels if level.name not in self.repeated)

    def cells_per_unit(self, size: int) -> int | None:
        """Cells in a unit of ``size`` GPUs, or None when its edges do not fall on cells'."""
        return None if size % self.per_cell else size // self.per_cell

    def groups_of(self, cell: int) -> list[str]:
        """The dims along which ``cell`` holds a member of the rank's group."""
        home = self.rank // self.per_cell
        differing = {d.dim for d in self.digits if d.value(cell) != d.value(home)}
        if not differing:  # the rank's own cell: every dim's group passes through it
            return [dim.name for dim in self.layout.dims if dim.size > 1]
        return list(differing) if len(differing) == 1 else []


def repeated_units(gpus_per_node: int | None, levels: Sequence[Level]) -> dict[str, str]:
    """The levels among the node (``NODE``, of ``gpus_per_node``) and ``levels`` whose units
    are one GPU, one node, or an inner level's unit, each with what its unit is."""
    repeated: dict[str, str] = {}
    if gpus_per_node == 1:
        repeated[NODE] = "one GPU"
    seen: dict[int, str] = {} if gpus_per_node is None else {gpus_per_node: "one node"}
    seen[1] = "one GPU"
    for level in levels:
        if level.size in seen:
            repeated[level.name] = seen[level.size]
        else:
            seen[level.size] = f"one {level.name} domain"
    return repeated


def make_grid(
    layout: DomainLayout, rank: int, gpus_per_node: int | None, levels: tuple[Level, ...] = ()
) -> Grid:
    """The cells of ``layout`` on two axes, sized so the grid fits the picture; ``levels``
    are the levels above the node."""
    per_cell = ranks_per_cell(layout)
    repeated = repeated_units(gpus_per_node, levels)
    sizes = [level.size for level in levels if level.name not in repeated]
    if gpus_per_node is not None and NODE not in repeated:
        sizes.append(gpus_per_node)
    units = [size // per_cell for size in sizes if size % per_cell == 0]
    digits = cell_digits(rank_digits(layout), per_cell)
    digits = mark_solo(fold_digits(digits, units))
    along_x, along_y = split_axes(digits)
    # Lay both axes out with a 1-pixel cell, then scale the cell so the grid fits.
    unit_x = Axis.build(along_x, 1.0).extent
    unit_y = Axis.build(along_y, 1.0).extent
    cell = min(_MAX_CELL_PX, _MAX_GRID_PX / unit_x, _MAX_GRID_PX / unit_y)
    return Grid(
        layout,
        rank,
        gpus_per_node,
        per_cell,
        Axis.build(along_x, cell),
        Axis.build(along_y, cell),
        cell,
        levels,
    )
