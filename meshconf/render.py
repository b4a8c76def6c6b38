"""Pictures of a domain's rank grid: the public names of :mod:`meshconf.features.render`.

``from meshconf.render import draw_domain`` is the documented import (docs/render.md); it
stays here so that the drawing code can move inside ``features`` without breaking it."""

from meshconf.features.render import Drawing, draw_domain, render_svg, to_png, to_svg

__all__ = ["Drawing", "draw_domain", "render_svg", "to_png", "to_svg"]
