"""``meshconf convert PATH``: a torchtitan or KempnerForge TOML table as a meshconf YAML
config, with a comment on every semantic difference."""

from __future__ import annotations

import argparse
import os
import re
import sys
import textwrap
from pathlib import Path
from typing import Any

from meshconf.cli.common import (
    EXIT_INVALID,
    EXIT_OK,
    EXIT_USAGE,
    emit,
    gpus_per_node,
    output_is_input,
    positive_int,
    usage_error,
    write_file,
)
from meshconf.features.convert import (
    SOURCES,
    TABLES,
    TOOL_NAMES,
    Conversion,
    ConversionError,
    convert,
)
from meshconf.sources.files import NotAFileError, TooLargeError, read_limited
from meshconf.sources.yaml_reader import MAX_BYTES, too_large

if sys.version_info >= (3, 11):
    import tomllib
else:
    import tomli as tomllib  # type: ignore[import-not-found, unused-ignore]

#: Where ``meshconf schema`` writes the schema, relative to the repository root.
SCHEMA_PATH = "schemas/meshconf.schema.json"
#: Comment lines are wrapped to this width.
WIDTH = 92
#: Inline comments start in this column, as in the examples.
COMMENT_COLUMN = 21
_POSITION = re.compile(r"(?P<message>.*) \(at line (?P<line>\d+), column (?P<column>\d+)\)")


class _Failure(Exception):
    """Reading the input failed; ``code`` is the exit code, the message is printed."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


def _read_toml(path: str) -> dict[str, Any]:
    try:
        raw = read_limited(path, MAX_BYTES)
    except TooLargeError as error:
        raise _Failure(EXIT_INVALID, f"{path}: {too_large(error.size).message}") from None
    except NotAFileError as error:
        what = "is a directory, not a TOML file" if error.directory else str(error)
        raise _Failure(EXIT_USAGE, f"{path}: {what}") from None
    except OSError as error:
        raise _Failure(EXIT_USAGE, f"{path}: cannot read: {error.strerror or error}") from None
    try:
        document: dict[str, Any] = tomllib.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as error:
        line = raw.count(b"\n", 0, error.start) + 1
        column = error.start - raw.rfind(b"\n", 0, error.start)
        raise _Failure(EXIT_INVALID, f"{path}:{line}:{column}: invalid TOML: not UTF-8") from None
    except tomllib.TOMLDecodeError as error:
        raise _Failure(EXIT_INVALID, _toml_error(path, str(error))) from None
    except RecursionError:
        raise _Failure(EXIT_INVALID, f"{path}: invalid TOML: nested too deeply") from None
    return document


def _toml_error(path: str, text: str) -> str:
    """tomllib's message, with its position moved to the front as ``FILE:LINE:COLUMN``."""
    match = _POSITION.fullmatch(text)
    if match is None:
        return f"{path}: invalid TOML: {text}"
    return f"{path}:{match['line']}:{match['column']}: invalid TOML: {match['message']}"


def _pick_source(args: argparse.Namespace, document: dict[str, Any]) -> str:
    if args.source is not None:
        return str(args.source)
    present = [source for source in SOURCES if TABLES[source] in document]
    if len(present) == 1:
        return present[0]
    tables = [f"a [{TABLES[source]}] table ({TOOL_NAMES[source]})" for source in SOURCES]
    has = f"both {tables[0]} and {tables[1]}" if present else f"neither {tables[0]} nor {tables[1]}"
    raise _Failure(
        EXIT_USAGE, f"{args.path}: has {has}; pass --from torchtitan or --from kempnerforge"
    )


def schema_reference(out: str | None) -> str:
    """The schema's path for the modeline: relative to ``out``'s folder, taking the schema
    to be where ``meshconf schema`` writes it from the current directory; for standard
    output, that path itself."""
    if out is None:
        return SCHEMA_PATH
    folder = os.path.dirname(os.path.abspath(out))
    try:
        relative = os.path.relpath(os.path.abspath(SCHEMA_PATH), folder)
    except ValueError:  # Windows: the output is on another drive than the schema
        relative = os.path.abspath(SCHEMA_PATH)
    return Path(relative).as_posix()


def _comment(text: str, first: str, rest: str) -> list[str]:
    return textwrap.wrap(
        text,
        WIDTH,
        initial_indent=first,
        subsequent_indent=rest,
        break_long_words=False,
        break_on_hyphens=False,
    )


def _key_line(text: str, comment: str | None) -> str:
    if comment is None:
        return text
    return f"{text.ljust(COMMENT_COLUMN - 2)}  # {comment}"


def _body(conversion: Conversion) -> list[str]:
    """The keys as YAML, nested mappings as blocks after a blank line."""
    lines: list[str] = []
    for key, value in conversion.data.items():
        if not isinstance(value, dict):
            lines.append(_key_line(f"{key}: {value}", conversion.comments.get(key)))
            continue
        if lines:
            lines.append("")
        lines.append(f"{key}:")
        for inner, inner_value in value.items():
            comment = conversion.comments.get(f"{key}.{inner}")
            lines.append(_key_line(f"  {inner}: {inner_value}", comment))
    return lines


def render(conversion: Conversion, source_path: str, schema: str) -> str:
    """The YAML file: modeline, what it came from, one paragraph per note, then the keys."""
    tool = TOOL_NAMES[conversion.source]
    lines = [f"# yaml-language-server: $schema={schema}"]
    lines += _comment(
        f"Converted by meshconf convert from the [{conversion.table}] table of {source_path} "
        f"({tool}). What differs from {tool}:",
        "# ",
        "# ",
    )
    for note in conversion.notes:
        lines.append("#")
        lines += _comment(note, "# - ", "#   ")
    lines.append("")
    lines += _body(conversion)
    return "\n".join(lines) + "\n"


def _write(out: str, text: str) -> int:
    try:
        write_file(out, text, create_folder=True)
    except OSError as error:
        return usage_error(f"{out}: cannot write: {error.strerror or error}")
    print(f"{out}: written")
    return EXIT_OK


def run(args: argparse.Namespace) -> int:
    if args.out is not None and output_is_input(args.out, [args.path]) is not None:
        return usage_error(f"--out {args.out} is the input TOML; choose another file")
    try:
        document = _read_toml(args.path)
        source = _pick_source(args, document)
    except _Failure as failure:
        message = str(failure)
        if failure.code == EXIT_INVALID:
            emit(lambda: print(message))
            return EXIT_INVALID
        return usage_error(message)
    try:
        conversion = convert(
            source,
            document.get(TABLES[source]),
            world_size=args.world_size,
            gpus_per_node=args.gpus_per_node,
        )
    except ConversionError as error:
        lines = "\n".join(f"{args.path}: {p.where}: {p.message}" for p in error.problems)
        emit(lambda: print(lines))
        return EXIT_INVALID
    text = render(conversion, args.path, schema_reference(args.out))
    if args.out is not None:
        return _write(args.out, text)
    emit(lambda: print(text, end=""))
    return EXIT_OK


def add_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "convert",
        help="convert a torchtitan [parallelism] or KempnerForge [distributed] table to YAML",
        description="Convert the parallelism settings of a torchtitan job TOML "
        "([parallelism]) or a KempnerForge TOML ([distributed]) into a validated meshconf "
        "config, with a comment on every semantic difference. Exit 0 when written, 1 if the "
        "input is invalid, 2 on a usage error.",
    )
    parser.add_argument("path", metavar="PATH", help="the TOML file")
    parser.add_argument(
        "--from",
        dest="source",
        choices=SOURCES,
        help="the tool the file is for; default: found from the table it has",
    )
    parser.add_argument(
        "--world-size",
        type=positive_int,
        metavar="N",
        help="the job's world size (the TOML has none): written into the config and checked",
    )
    parser.add_argument(
        "--gpus-per-node",
        type=gpus_per_node,
        metavar="G",
        help="ranks per node, written into the config",
    )
    parser.add_argument(
        "--out", metavar="FILE", help="write the config to FILE; default: standard output"
    )
    parser.set_defaults(run=run)
