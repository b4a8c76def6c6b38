"""The vocabulary of a picture: rectangles, texts and line paths in pixels, and the style
(fonts, fills, the colour of each dim) that the picture and both writers share."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

TEXT_PX = 12.0
LINE_PX = 18.0
MIN_LABEL_PX = 5.0
CHAR_WIDTH = 0.62  # width of a character, in font sizes (generous for digits in sans fonts)

FONT = "DejaVu Sans, Verdana, Arial, sans-serif"
CELL_FILL = "#e6e6e6"
RANK_FILL = "#222222"
NODE_STROKE = "#333333"
#: The outlines of the levels above the node (an NVLink domain, a pod), inner to outer:
#: colours apart from the dims' fills, and drawn wider than a node's.
LEVEL_STROKES = ("#d6604d", "#4393c3", "#5aae61", "#8073ac")
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
    """A whole picture: its size in pixels, its shapes in drawing order, and its grid of cells
    (``columns`` x ``rows``, each cell ``ranks_per_cell`` consecutive ranks)."""

    width: float
    height: float
    shapes: tuple[Shape, ...]
    columns: int
    rows: int
    ranks_per_cell: int

    @property
    def cells(self) -> int:
        return self.columns * self.rows


def text_width(text: str, size: float) -> float:
    return len(text) * CHAR_WIDTH * size


def dim_colours(names: Sequence[str]) -> dict[str, str]:
    """A colour for each dim: the usual dims their own, the others what is left over."""
    colours = {name: _DIM_COLOURS[name] for name in names if name in _DIM_COLOURS}
    spare = [c for c in _PALETTE if c not in colours.values()] or list(_PALETTE)
    others = [name for name in names if name not in colours]
    colours.update({name: spare[i % len(spare)] for i, name in enumerate(others)})
    return colours
