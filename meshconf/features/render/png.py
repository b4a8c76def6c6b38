"""A ``Drawing`` as PNG, through matplotlib: an optional dependency, imported only when a PNG
is written, so that SVG and the rest of meshconf never need it."""

from __future__ import annotations

import io

from meshconf.features.render.shapes import Drawing, Rect, Text


def to_png(drawing: Drawing, scale: float = 2.0) -> bytes:
    """The same picture as PNG, through matplotlib (an optional library: ``ImportError`` when
    it is not installed)."""
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
