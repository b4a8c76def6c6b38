"""The ``meshconf`` command line: argument parsing and dispatch to one module per verb.

The top layer: may import every layer below (``core``, ``model``, ``sources``, ``features``)
and, lazily, ``runtime``. Nothing in meshconf imports it.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from meshconf.cli import convert, plan, render, schema, show, simulate, validate

_VERBS = (validate, show, simulate, schema, render, plan, convert)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="meshconf",
        description="Validate and inspect declarative N-D parallel device-mesh configs.",
    )
    subparsers = parser.add_subparsers(dest="verb", metavar="VERB", required=True)
    for verb in _VERBS:
        verb.add_parser(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    code: int = args.run(args)
    return code


if __name__ == "__main__":
    raise SystemExit(main())
