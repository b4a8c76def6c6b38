"""``meshconf schema``: print or write the JSON Schema (or the Markdown reference made from
it), or check that a committed copy is up to date."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from meshconf.cli.common import (
    EXIT_INVALID,
    EXIT_OK,
    UsageError,
    always_data,
    emit,
    one_of,
    write_file,
)
from meshconf.model.json_schema import FLAVORS, build_schema, render
from meshconf.model.reference import reference_markdown
from meshconf.sources.files import NotAFileError, TooLargeError, read_limited

#: The largest file ``--check`` compares, or ``--out`` reads before replacing: ten times the
#: size of the largest output.
MAX_SCHEMA_BYTES = 1 << 20

#: Where each output lives in meshconf's repository: what ``--check`` reads without ``--out``.
DEFAULT_OUT = {
    ("json", "plain"): "schemas/meshconf.schema.json",
    ("json", "hydra"): "schemas/meshconf.hydra.schema.json",
    ("markdown", "plain"): "docs/reference.md",
}


def run(args: argparse.Namespace) -> int:
    if args.format == "markdown" and args.flavor != "plain":
        raise UsageError("--format markdown documents the plain schema; drop --flavor hydra")
    schema = build_schema(args.flavor)
    text = reference_markdown(schema) if args.format == "markdown" else render(schema)
    if args.check:
        if args.out == "-":
            raise UsageError("--check needs a file to compare with, not --out -")
        out = args.out or DEFAULT_OUT[args.format, args.flavor]
        return _check(Path(out), text, _regenerate_command(args, out))
    out = args.out or "-"
    if out == "-":
        emit(lambda: print(text, end=""))
        return EXIT_OK
    try:
        if _committed(out) != text.encode("utf-8"):
            write_file(out, text, create_folder=True)
    except OSError as error:
        raise UsageError(f"{out}: cannot write: {error.strerror or error}") from None
    print(f"{out}: written")
    return EXIT_OK


def _committed(path: str) -> bytes | None:
    """What ``path`` holds now, None if nothing; only a regular file (a FIFO would block, a
    device never end) of at most ``MAX_SCHEMA_BYTES``.

    Raises:
        UsageError: ``path`` is not a regular file, or is larger.
        OSError: as ``read_limited``.
    """
    try:
        return read_limited(path, MAX_SCHEMA_BYTES, "schema file")
    except FileNotFoundError:
        return None
    except (NotAFileError, TooLargeError) as error:
        raise UsageError(f"{path}: {error}") from None


def _check(path: Path, text: str, command: str) -> int:
    try:
        raw = _committed(str(path))
        committed = None if raw is None else raw.decode("utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise UsageError(
            f"{path}: cannot read: {getattr(error, 'strerror', None) or error}"
        ) from None
    if committed is None:
        print(f"{path}: missing; run `{command}` to write it")
        return EXIT_INVALID
    if committed != text:
        print(f"{path}: out of date with the models; run `{command}` to regenerate it")
        return EXIT_INVALID
    print(f"{path}: up to date")
    return EXIT_OK


def _regenerate_command(args: argparse.Namespace, out: str) -> str:
    format_ = "" if args.format == "json" else f" --format {args.format}"
    flavor = "" if args.flavor == "plain" else f" --flavor {args.flavor}"
    return f"meshconf schema{format_}{flavor} --out {out}"


def add_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "schema",
        help="print or write the JSON Schema of the config (or check a committed copy)",
        description=(
            "Print the JSON Schema of meshconf configs, generated from the models, or write it "
            "with --out. Editors use it for completion and checking; formulas are checked by "
            "`meshconf validate`."
        ),
    )
    parser.add_argument(
        "--flavor",
        **one_of(FLAVORS),
        default="plain",
        help="plain: meshconf YAML files; hydra: also ${...} values, defaults and _target_",
    )
    parser.add_argument(
        "--format",
        **one_of(("json", "markdown")),
        default="json",
        help="json: the schema; markdown: the table of keys made from it",
    )
    parser.add_argument(
        "--out",
        metavar="FILE",
        help="write to FILE instead of standard output ('-' is standard output)",
    )
    parser.add_argument(
        "--check",
        action="store_true",
        help="write nothing; exit 1 if FILE differs from what would be written. Without "
        "--out, FILE is the copy in meshconf's repository: "
        + ", ".join(f"{path} ({fmt}, {flavor})" for (fmt, flavor), path in DEFAULT_OUT.items()),
    )
    # Its output is the schema; --check's verdict it prints itself, as validate does.
    parser.set_defaults(run=run, prints_data=always_data)
