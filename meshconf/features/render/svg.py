"""A ``Drawing`` as SVG text, with the standard library only. Cells carry their ranks
(``data-rank``) and their groups (``class="group-tp"``), so a script can read the picture."""

from __future__ import annotations

from xml.sax.saxutils import escape, quoteattr

from meshconf.core.layout import DomainLayout
from meshconf.features.render.picture import draw_domain
from meshconf.features.render.shapes import FONT, Drawing, Lines, Rect, Text


def _number(value: float) -> str:
    text = f"{value:.2f}".rstrip("0").rstrip(".")
    return "0" if text in ("", "-0") else text


def _element(
    tag: str,
    pairs: list[tuple[str, str]],
    css_class: str,
    data: tuple[tuple[str, str], ...] = (),
    inner: str | None = None,
) -> str:
    """An element with ``pairs`` for attributes, then its class and ``data-`` attributes."""
    if css_class:
        pairs.append(("class", css_class))
    attributes = "".join(f" {name}={quoteattr(value)}" for name, value in (*pairs, *data))
    return f"<{tag}{attributes}/>" if inner is None else f"<{tag}{attributes}>{inner}</{tag}>"


def _svg_rect(rect: Rect) -> str:
    pairs = [(name, _number(getattr(rect, name))) for name in ("x", "y", "width", "height")]
    pairs.append(("fill", rect.fill))
    if rect.stroke is not None:
        pairs += [("stroke", rect.stroke), ("stroke-width", _number(rect.stroke_width))]
    tooltip = None if rect.tooltip is None else f"<title>{escape(rect.tooltip)}</title>"
    return _element("rect", pairs, rect.css_class, rect.data, tooltip)


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
    return _element("text", pairs, text.css_class, inner=escape(text.text))


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
    return _element("path", pairs, lines.css_class, lines.data)


def to_svg(drawing: Drawing) -> str:
    width, height = _number(drawing.width), _number(drawing.height)
    head = (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" font-family={quoteattr(FONT)}>'
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


def render_svg(layout: DomainLayout, rank: int = 0, gpus_per_node: int | None = None) -> str:
    """``draw_domain``'s picture as SVG text; raises what ``draw_domain`` raises."""
    return to_svg(draw_domain(layout, rank, gpus_per_node))
