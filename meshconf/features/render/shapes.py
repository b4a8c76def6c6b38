"""The vocabulary of a picture: rectangles, texts and line paths in pixels, and the style
(fonts, fills, the colour of each dim) that the picture and both writers share."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

TEXT_PX = 12.0
LINE_PX = 18.0
MIN_LABEL_PX = 5.0

FONT = "DejaVu Sans, Verdana, Arial, sans-serif"
#: The advance width of each printable ASCII character (space to tilde) in DejaVu Sans Book,
#: in 2048ths of the font size: the font's own metrics, read from the DejaVuSans.ttf that
#: matplotlib ships, which writes the PNG (tests/test_render.py reads them again). A viewer
#: without DejaVu Sans uses the next font named; the labels leave room for the difference.
_ADVANCES = (
    651, 821, 942, 1716, 1303, 1946, 1597, 563, 799, 799, 1024, 1716, 651, 739, 651, 690,
    1303, 1303, 1303, 1303, 1303, 1303, 1303, 1303, 1303, 1303, 690, 690, 1716, 1716, 1716,
    1087, 2048, 1401, 1405, 1430, 1577, 1294, 1178, 1587, 1540, 604, 604, 1343, 1141, 1767,
    1532, 1612, 1235, 1612, 1423, 1300, 1251, 1499, 1401, 2025, 1403, 1251, 1403, 799, 690,
    799, 1716, 1024, 1024, 1255, 1300, 1126, 1300, 1260, 721, 1300, 1298, 569, 569, 1186,
    569, 1995, 1298, 1253, 1300, 1300, 842, 1067, 803, 1298, 1212, 1675, 1212, 1212, 1075,
    1303, 690, 1303, 1716,
)  # fmt: skip
_EM = 2048
#: DejaVu Sans Bold is at most this much wider than Book, character by character.
_BOLD_RATIO = 1.27

CELL_FILL = "#e6e6e6"
RANK_FILL = "#222222"
NODE_STROKE = "#333333"
#: The outlines of the levels above the node (an NVLink domain, a pod), inner to outer: the
#: darkest colours of Paul Tol's "muted" scheme (indigo, purple, green, wine), which stay
#: apart from the dims' fills and from each other for readers with any of the three kinds
#: of colour blindness (tests/test_render.py simulates them), and drawn wider than a node's.
LEVEL_STROKES = ("#332288", "#aa4499", "#117733", "#882255")
#: The dims' fills: Paul Tol's "light" scheme, made for cells that carry black text and told
#: apart by readers with any of the three kinds of colour blindness, less its pale grey
#: (too close to the cells outside the groups). The usual dims keep one colour in every
#: picture, chosen so that the dims of each default domain stay apart under simulated
#: protanopia, deuteranopia and tritanopia (tests/test_render.py); other dims take the
#: colours a picture leaves over.
_PALETTE = (
    "#44bb99",  # mint
    "#ee8866",  # orange
    "#99ddff",  # light cyan
    "#aaaa00",  # olive
    "#eedd88",  # light yellow
    "#77aadd",  # light blue
    "#ffaabb",  # pink
    "#bbcc33",  # pear
)
_DIM_COLOURS = {
    "tp": "#44bb99",
    "ep": "#44bb99",
    "fsdp": "#ee8866",
    "efsdp": "#ee8866",
    "dp_shard": "#ee8866",
    "cp": "#ee8866",
    "loss": "#ee8866",
    "dp_replicate": "#99ddff",
    "batch": "#99ddff",
    "pp": "#aaaa00",
    "etp": "#eedd88",
}

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
    data: tuple[tuple[str, str], ...] = ()


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


def text_width(text: str, size: float, bold: bool = False) -> float:
    """The width of ``text`` at ``size`` pixels in DejaVu Sans (a character outside ASCII
    counts as one em, wider than any of the font's letters)."""
    units = sum(_ADVANCES[ord(char) - 32] if " " <= char <= "~" else _EM for char in text)
    return units / _EM * size * (_BOLD_RATIO if bold else 1.0)


def dim_colours(names: Sequence[str]) -> dict[str, str]:
    """A colour for each dim, no two alike while the palette lasts: the usual dims their own
    where no earlier dim of the picture has taken it, the others what is left over."""
    colours: dict[str, str] = {}
    for name in names:
        preferred = _DIM_COLOURS.get(name)
        if preferred is not None and preferred not in colours.values():
            colours[name] = preferred
    spare = [colour for colour in _PALETTE if colour not in colours.values()]
    for name in names:
        if name not in colours:
            colours[name] = spare.pop(0) if spare else _PALETTE[len(colours) % len(_PALETTE)]
    return {name: colours[name] for name in names}


def level_stroke(index: int) -> str:
    """The outline colour of the ``index``-th level above the node (inner to outer); past
    the four colours, they come round again, on ever wider lines."""
    return LEVEL_STROKES[index % len(LEVEL_STROKES)]
