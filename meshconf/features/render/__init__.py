"""Pictures of one domain's rank grid: a ``DomainLayout`` in, a ``Drawing`` (shapes in pixels)
out, then SVG or PNG. Both writers draw the same ``Drawing``, so both formats show the same
picture. The package imports the core math and nothing else of meshconf; matplotlib only
inside ``to_png``.
"""

from meshconf.features.render.picture import draw_domain
from meshconf.features.render.png import to_png
from meshconf.features.render.shapes import Drawing
from meshconf.features.render.svg import render_svg, to_svg

__all__ = ["Drawing", "draw_domain", "render_svg", "to_png", "to_svg"]
