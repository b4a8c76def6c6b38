"""``meshconf schema``: write the JSON Schema (or the Markdown reference made from it), or
check that a committed copy is up to date."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from meshconf.cli.common import EXIT_INVALID, EXIT_OK, emit, usage_error, write_file
from meshconf.model.reference import reference_markdown
from meshconf.model.schema import FLAVORS, build_schema, render

#: Where each output lives in a repository that follows meshconf's layout.
DEFAULT_OUT = {
    ("json", "plain"): "schemas/meshconf.schema.json",
    ("json", "hydra"): "schemas/meshconf.hydra.schema.json",
    ("markdown", "plain"): "docs/reference.md",
}


def run(args: argparse.Namespace) -> int:
    if args.format == "markdown" and args.flavor != "plain":
        return usage_error("--format markdown documents the plain schema; drop --flavor hydra")
    schema = build_schema(args.flavor)
    text = reference_markdown(schema) if args.format == "markdown" else render(schema)
    out = args.out or DEFAULT_OUT[args.format, args.flavor]
    if out == "-":
        if args.check:
            return usage_error("--check needs a file to compare with, not --out -")
        emit(lambda: print(text, end=""))
        return EXIT_OK
    path = Path(out)
    if args.check:
        return _check(path, text, _regenerate_command(args))
    try:
        if not path.exists() or path.read_bytes() != text.encode("utf-8"):
            write_file(out, text, create_folder=True)
    except OSError as error:
        return usage_error(f"{out}: cannot write: {error.strerror or error}")
    print(f"{out}: written")
    return EXIT_OK


def _check(path: Path, text: str, command: str) -> int:
    try:
        committed = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        print(f"{path}: missing; run `{command}` to write it")
        return EXIT_INVALID
    except (OSError, UnicodeDecodeError) as error:
        return usage_error(f"{path}: cannot read: {getattr(error, 'strerror', None) or error}")
    if committed != text:
        print(f"{path}: out of date with the models; run `{command}` to regenerate it")
        return EXIT_INVALID
    print(f"{path}: up to date")
    return EXIT_OK


def _regenerate_command(args: argparse.Namespace) -> str:
    parts = ["meshconf schema"]
    if args.format != "json":
        parts.append(f"--format {args.format}")
    if args.flavor != "plain":
        parts.append(f"--flavor {args.flavor}")
    if args.out:
        parts.append(f"--out {args.out}")
    return " ".join(parts)


def add_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "schema",
        help="write the JSON Schema of the config (or check a committed copy)",
        description=(
            "Write the JSON Schema of meshconf configs, generated from the models. Editors use "
            "it for completion and checking; formulas are checked by `meshconf validate`."
        ),
    )
    parser.add_argument(
        "--flavor",
        choices=FLAVORS,
        default="plain",
        help="plain: meshconf YAML files; hydra: also ${...} values, defaults and _target_",
    )
    parser.add_argument(
        "--format",
        choices=("json", "markdown"),
        default="json",
        help="json: the schema; markdown: the table of keys made from it",
    )
    parser.add_argument(
        "--out",
        metavar="FILE",
        help="where to write ('-' for stdout); default: "
        + ", ".join(f"{path} ({fmt}, {flavor})" for (fmt, flavor), path in DEFAULT_OUT.items()),
    )
    parser.add_argument(
        "--check",
        action="store_true",
        help="write nothing; exit 1 if FILE differs from what would be written",
    )
    parser.set_defaults(run=run)
