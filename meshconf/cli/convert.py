"""``meshconf convert PATH``: a torchtitan or KempnerForge TOML table, Megatron-LM's
arguments or accelerate's settings, as a meshconf YAML config, with a comment on every
semantic difference."""

from __future__ import annotations

import argparse
import os
import re
import sys
import textwrap
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from meshconf.cli.common import (
    EXIT_OK,
    InvalidInput,
    UsageError,
    always_data,
    emit,
    gpus_per_node,
    one_of,
    positive_int,
    write_file,
)
from meshconf.core.messages import spoken_list
from meshconf.features.convert import (
    BY_NAME,
    SOURCES,
    TOML_SOURCES,
    Conversion,
    ConversionError,
    Source,
    looks_like,
    recognise,
)
from meshconf.features.convert.megatron_export import MegatronExportError, megatron_arguments
from meshconf.sources.files import NotAFileError, TooLargeError, read_limited
from meshconf.sources.loading import load_located
from meshconf.sources.yaml_reader import MAX_BYTES, too_large
from meshconf.sources.yaml_schema import MAX_INT_DIGITS

if sys.version_info >= (3, 14):
    import tomllib
else:
    import tomli as tomllib

#: Where ``meshconf schema`` writes the schema, relative to the repository root.
SCHEMA_PATH = "schemas/meshconf.schema.json"
#: Comment lines are wrapped to this width.
WIDTH = 92
#: Inline comments start in this column, as in the examples.
COMMENT_COLUMN = 21


def _read_text(path: str, what: str, invalid: str) -> str:
    """The file's text; ``invalid`` starts the message when it is not UTF-8."""
    try:
        raw = read_limited(path, MAX_BYTES)
    except TooLargeError as error:
        raise InvalidInput([f"{path}: {too_large(error.size).message}"]) from None
    except NotAFileError as error:
        what = f"is a directory, not {what}" if error.directory else str(error)
        raise UsageError(f"{path}: {what}") from None
    except OSError as error:
        raise UsageError(f"{path}: cannot read: {error.strerror or error}") from None
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as error:
        line = raw.count(b"\n", 0, error.start) + 1
        column = error.start - raw.rfind(b"\n", 0, error.start)
        raise InvalidInput([f"{path}:{line}:{column}: {invalid}not UTF-8"]) from None


#: A bare value of TOML: what may hold an integer, outside strings and comments.
_TOML_BARE = re.compile(r"[0-9A-Za-z_+.:-]+")


def _string_end(text: str, index: int) -> int:
    """Where the TOML string that opens at ``index`` ends: basic strings (``"``, ``\"\"\"``)
    escape with a backslash, literal ones (``'``, ``\'\'\'``) do not."""
    quote = text[index] * 3 if text.startswith(text[index] * 3, index) else text[index]
    position = index + len(quote)
    while position < len(text):
        if text[position] == "\\" and quote[0] == '"':
            position += 2
        elif text.startswith(quote, position):
            return position + len(quote)
        else:
            position += 1
    return len(text)


def _long_integer(text: str) -> tuple[int, int] | None:
    """Where (line, column) the first bare TOML value of more than ``MAX_INT_DIGITS`` digits
    is, outside strings and comments: tomllib would hand Python the digits to convert, which
    refuses past 4,300 of them."""
    index = 0
    while index < len(text):
        char = text[index]
        if char == "#":
            newline = text.find("\n", index)
            index = len(text) if newline < 0 else newline
        elif char in "\"'":
            index = _string_end(text, index)
        elif (bare := _TOML_BARE.match(text, index)) is not None:
            if sum(digit.isdigit() for digit in bare[0]) > MAX_INT_DIGITS:
                line = text.count("\n", 0, index) + 1
                return line, index - text.rfind("\n", 0, index)
            index = bare.end()
        else:
            index += 1
    return None


def _read_toml(path: str, text: str | None = None) -> dict[str, Any]:
    """The TOML document of ``path`` (whose ``text`` may have been read already).

    Raises:
        InvalidInput: the file is not TOML, or holds a number past meshconf's bound.
    """
    if text is None:
        text = _read_text(path, "a TOML file", "invalid TOML: ")
    long = _long_integer(text)
    if long is not None:
        raise InvalidInput(
            [
                f"{path}:{long[0]}:{long[1]}: invalid TOML: a number of more than "
                f"{MAX_INT_DIGITS} digits, more than any setting takes"
            ]
        )
    try:
        document: dict[str, Any] = tomllib.loads(text)
    except tomllib.TOMLDecodeError as error:
        raise InvalidInput(
            [f"{path}:{error.lineno}:{error.colno}: invalid TOML: {error.msg}"]
        ) from None
    except RecursionError:
        raise InvalidInput([f"{path}: invalid TOML: nested too deeply"]) from None
    return document


#: Suffixes of files that are never TOML: read by the sources that are not.
_NOT_TOML = (".yaml", ".yml", ".json", ".sh", ".bash")


def _recognise(path: str) -> tuple[Source, str, dict[str, Any] | None]:
    """The source of a file given without ``--from``, with its text and, for a TOML
    source, its document.

    Raises:
        UsageError: no source, or more than one, recognises the file: it says what the file
            looks like.
        InvalidInput: a ``.toml`` file that is not TOML.
    """
    suffix = Path(path).suffix.lower()
    toml = suffix == ".toml"
    text = _read_text(path, "a file to convert", "invalid TOML: " if toml else "")
    document: dict[str, Any] | None = None
    if toml:
        document = _read_toml(path, text)
    elif suffix not in _NOT_TOML:
        try:
            document = _read_toml(path, text)
        except InvalidInput:
            document = None
    found = recognise(text, suffix, document)
    if not found and document is not None and not toml:
        document = None  # not the TOML of any source: perhaps a one-line script
        found = recognise(text, suffix, document)
    if len(found) == 1:
        return found[0], text, document
    if document is not None:
        _detect(path, document)
    choices = " or ".join(f"--from {source.name}" for source in SOURCES)
    if found:
        tools = spoken_list([f"{source.tool}'s" for source in found])
        either = " or ".join(f"--from {source.name}" for source in found)
        raise UsageError(f"{path}: holds both {tools} settings; pass {either}")
    raise UsageError(
        f"{path}: cannot tell which tool's settings it holds: it looks like "
        f"{looks_like(text, suffix)}; pass {choices}"
    )


def _read_arguments(args: argparse.Namespace, source: Source) -> Mapping[str, Any]:
    """The settings of a source that is not TOML, from --args or from PATH."""
    assert source.read is not None
    if args.args is not None:
        return source.read(args.args, "")
    if args.path is None:
        raise UsageError(f"--from {args.source} needs PATH or --args")
    text = _read_text(args.path, "a script or YAML file", "")
    return source.read(text, Path(args.path).suffix)


def _detect(path: str, document: dict[str, Any]) -> Source:
    """The TOML source whose table the file has, when exactly one has."""
    present = [source for source in TOML_SOURCES if source.table in document]
    if len(present) == 1:
        return present[0]
    tables = [f"a [{source.table}] table ({source.tool})" for source in TOML_SOURCES]
    joined = spoken_list(tables)
    has = f"both {joined}" if present else f"neither {joined.replace(' and ', ' nor ')}"
    choices = " or ".join(f"--from {source.name}" for source in TOML_SOURCES)
    others = ", ".join(
        f"--from {source.name} for {source.tool}'s arguments"
        for source in SOURCES
        if source.table is None
    )
    raise UsageError(f"{path}: has {has}; pass {choices} (or {others})")


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


def _scalar(value: object) -> str:
    """A validated value as YAML writes it: booleans as true and false."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _body(conversion: Conversion) -> list[str]:
    """The keys as YAML, nested mappings as blocks after a blank line."""
    lines: list[str] = []
    for key, value in conversion.data.items():
        if isinstance(value, list):
            flow = f"[{', '.join(str(item) for item in value)}]"
            lines.append(_key_line(f"{key}: {flow}", conversion.comments.get(key)))
            continue
        if not isinstance(value, dict):
            lines.append(_key_line(f"{key}: {_scalar(value)}", conversion.comments.get(key)))
            continue
        if lines:
            lines.append("")
        lines.append(f"{key}:")
        for inner, inner_value in value.items():
            comment = conversion.comments.get(f"{key}.{inner}")
            text = (
                f"[{', '.join(str(item) for item in inner_value)}]"
                if isinstance(inner_value, list)
                else _scalar(inner_value)
            )
            lines.append(_key_line(f"  {inner}: {text}", comment))
    return lines


def render(conversion: Conversion, source_path: str, schema: str) -> str:
    """The YAML file: modeline, what it came from, one paragraph per note, then the keys."""
    tool = BY_NAME[conversion.source].tool
    lines = [f"# yaml-language-server: $schema={schema}"]
    tables = [f"[{name}]" for name in (conversion.table, *conversion.other_tables) if name]
    plural = "s" if len(tables) > 1 else ""
    origin = f"the {spoken_list(tables)} table{plural} of " if tables else ""
    lines += _comment(
        f"Converted by meshconf convert from {origin}{source_path} ({tool}). What differs "
        f"from {tool}:",
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
        raise UsageError(f"{out}: cannot write: {error.strerror or error}") from None
    print(f"{out}: written")
    return EXIT_OK


def _convert(args: argparse.Namespace) -> Conversion:
    """The conversion of the input the arguments name."""
    sizes = {"world_size": args.world_size, "gpus_per_node": args.gpus_per_node}
    chosen = None if args.source is None else BY_NAME[args.source]
    if chosen is not None and chosen.table is None:
        return chosen.convert(_read_arguments(args, chosen), **sizes)
    if args.args is not None:
        users = " or ".join(f"--from {s.name}" for s in SOURCES if s.table is None)
        raise UsageError(f"--args is for {users}")
    if args.path is None:
        raise UsageError("PATH is required: the file to convert")
    if chosen is None:
        chosen, text, document = _recognise(args.path)
        if document is None:
            assert chosen.read is not None, "a source recognised from text reads text"
            return chosen.convert(chosen.read(text, Path(args.path).suffix), **sizes)
    else:
        document = _read_toml(args.path)
    table = None if chosen.table is None else document.get(chosen.table)
    return chosen.convert(table, **sizes, document=document)


def _to_megatron(args: argparse.Namespace) -> int:
    """``--to megatron CONFIG``: the config as Megatron-LM's arguments."""
    if args.source is not None or args.args is not None:
        raise UsageError("--to megatron reads a meshconf config: leave out --from and --args")
    if args.path is None:
        raise UsageError("--to megatron needs CONFIG, the meshconf config to convert")
    config, source = load_located(args.path, world_size=args.world_size)
    if config.resolved_world_size is None:
        raise UsageError(
            f"{args.path}: the world size is unknown (degrees.{config.degrees.auto} is -1); "
            "set world_size in the file or pass --world-size N"
        )
    try:
        arguments = megatron_arguments(config)
    except MegatronExportError as error:
        # placed at the key the user wrote, as the config's own problems are
        raise MegatronExportError(
            [source.diagnostic(problem.path, problem.message) for problem in error.diagnostics]
        ) from None
    head = (
        f"# Megatron-LM's arguments for {args.path}, on {config.resolved_world_size} ranks; "
        "meshconf convert --from megatron reads them back.\n"
    )
    text = head + arguments.command_line()
    if args.out is not None:
        return _write(args.out, text)
    emit(lambda: print(text, end=""))
    return EXIT_OK


def run(args: argparse.Namespace) -> int:
    if args.target is not None:
        return _to_megatron(args)
    where = "--args" if args.path is None else args.path
    try:
        conversion = _convert(args)
    except ConversionError as error:
        raise InvalidInput([problem.render(where) for problem in error.problems]) from None
    source = "the command line of --args" if args.path is None else args.path
    text = render(conversion, source, schema_reference(args.out))
    if args.out is not None:
        return _write(args.out, text)
    emit(lambda: print(text, end=""))
    return EXIT_OK


def add_parser(subparsers: Any) -> None:
    tools = [source.tool for source in SOURCES]
    parser = subparsers.add_parser(
        "convert",
        help=f"convert {', '.join(tools[:-1])} or {tools[-1]} parallelism settings to YAML",
        description="Convert the parallelism settings of "
        + ", ".join(source.reads for source in SOURCES[:-1])
        + f" or {SOURCES[-1].reads} into a validated meshconf config, with a comment on every "
        "semantic difference. Exit 0 when written, 1 if the input is invalid, 2 on a usage "
        "error.",
    )
    argument_sources = " or ".join(f"--from {s.name}" for s in SOURCES if s.table is None)
    parser.add_argument(
        "path",
        metavar="PATH",
        nargs="?",
        help=f"the TOML file; for {argument_sources}, a launch script, a file holding the "
        "command line, or a YAML file (.yaml, .yml)",
    )
    parser.add_argument(
        "--from",
        dest="source",
        **one_of(source.name for source in SOURCES),
        help="the tool the file is for; default: recognised from the file (its TOML table, "
        "accelerate's config or launch line, NeMo's YAML or a Megatron-LM launch line)",
    )
    parser.add_argument(
        "--to",
        dest="target",
        **one_of(["megatron"]),
        help="the other way: PATH is a meshconf config, printed as that tool's arguments "
        "(checked by converting them back)",
    )
    parser.add_argument(
        "--args",
        metavar="TEXT",
        help=f"for {argument_sources}: the tool's command line itself, instead of PATH",
    )
    parser.add_argument(
        "--world-size",
        type=positive_int,
        metavar="N",
        help="the job's world size (a TOML has none; a launch line may): written into the "
        "config and checked",
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
    # Its output is a config, or arguments, that `> FILE` or the next command reads.
    parser.set_defaults(run=run, prints_data=always_data)
