"""``meshconf render PATH --out FILE``: a picture of one domain's rank grid (SVG, or PNG)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from meshconf.cli.common import (
    EXIT_OK,
    UsageError,
    add_gpus_per_node_option,
    add_rank_options,
    add_source_options,
    emit,
    load_for_rank,
    write_file,
)
from meshconf.core.levels import NODE
from meshconf.core.messages import install_command
from meshconf.features.render import draw_domain, to_png, to_svg

_FORMATS = (".svg", ".png")
_PREFERRED_DOMAIN = "dense"


def _check_output(out: str) -> None:
    """Raises UsageError for a suffix meshconf cannot draw, or PNG without matplotlib."""
    suffix = Path(out).suffix.lower()
    if suffix not in _FORMATS:
        raise UsageError(f"--out {out}: the file name must end in .svg or .png")
    if suffix == ".png" and not _has_matplotlib():
        raise UsageError(
            f"writing PNG needs matplotlib, which is not installed: {install_command('png')}"
        )


def _has_matplotlib() -> bool:
    # Imported only to ask: matplotlib is optional and not a dependency of meshconf.
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def run(args: argparse.Namespace) -> int:
    _check_output(args.out)
    config = load_for_rank(args)
    layouts = config.layouts
    domain = args.domain
    if domain is None:
        domain = _PREFERRED_DOMAIN if _PREFERRED_DOMAIN in layouts else next(iter(layouts))
    above_node = tuple(level for level in config.topology if level.name != NODE)
    drawing = draw_domain(layouts[domain], args.rank, config.node_size, above_node)
    out = Path(args.out)
    try:
        write_file(args.out, to_png(drawing) if out.suffix.lower() == ".png" else to_svg(drawing))
    except OSError as error:
        raise UsageError(f"cannot write {args.out}: {error.strerror or error}") from None
    world_size = layouts[domain].world_size
    cells = f"{drawing.columns} x {drawing.rows} cells"
    what = f"{world_size} ranks in {cells}"
    if drawing.ranks_per_cell > 1:
        what = f"{world_size} ranks summarised in {cells} of {drawing.ranks_per_cell} ranks"
    emit(lambda: print(f"wrote {args.out}: domain {domain}, {what}, groups of rank {args.rank}"))
    return EXIT_OK


def add_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "render",
        help="draw a domain's rank grid as SVG or PNG",
        description="Draw one domain's ranks as a grid (the dims unflattened row-major), with "
        "nodes and the config's other levels outlined and one rank's group along each dim "
        "coloured. Worlds of more than 4096 ranks are summarised, one cell per block of "
        "consecutive ranks.",
    )
    parser.add_argument(
        "-O",
        "--out",
        required=True,
        metavar="FILE",
        help="picture to write: .svg, or .png (needs matplotlib)",
    )
    parser.add_argument(
        "--domain", metavar="D", help="domain to draw (default: dense, else the first)"
    )
    add_rank_options(parser, "whose groups to colour")
    add_gpus_per_node_option(parser, "to outline nodes")
    add_source_options(parser, formats=False)
    parser.set_defaults(run=run)
