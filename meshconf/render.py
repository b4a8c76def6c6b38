"""Pictures of a domain's rank grid: the public names of :mod:`meshconf.features.render`."""

from meshconf.features.render import Drawing, draw_domain, render_svg, to_png, to_svg

__all__ = ["Drawing", "draw_domain", "render_svg", "to_png", "to_svg"]
