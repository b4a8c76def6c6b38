"""``meshconf convert``'s options, and its output: a meshconf YAML config with a comment on
every semantic difference, or (``--to megatron``) Megatron-LM's arguments."""

from __future__ import annotations

import argparse
import os
import textwrap
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
from meshconf.cli.convert_input import conversion
from meshconf.core.errors import ConfigError
from meshconf.core.messages import spoken_list
from meshconf.features.convert import BY_NAME, SOURCES, Conversion, ConversionError
from meshconf.features.convert.megatron_export import megatron_arguments
from meshconf.sources.loading import load_located

#: Where ``meshconf schema`` writes the schema, relative to the repository root.
SCHEMA_PATH = "schemas/meshconf.schema.json"
#: Comment lines are wrapped to this width.
WIDTH = 92
#: Inline comments start in this column, as in the examples.
COMMENT_COLUMN = 21


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
    """A validated value as YAML writes it: booleans as true and false, lists in flow style."""
    if isinstance(value, list):
        return f"[{', '.join(str(item) for item in value)}]"
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _body(conversion: Conversion) -> list[str]:
    """The keys as YAML, nested mappings as blocks after a blank line."""
    lines: list[str] = []
    for key, value in conversion.data.items():
        if not isinstance(value, dict):
            lines.append(_key_line(f"{key}: {_scalar(value)}", conversion.comments.get(key)))
            continue
        if lines:
            lines.append("")
        lines.append(f"{key}:")
        for inner, inner_value in value.items():
            comment = conversion.comments.get(f"{key}.{inner}")
            lines.append(_key_line(f"  {inner}: {_scalar(inner_value)}", comment))
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


def _write(out: str | None, text: str) -> int:
    """The text to ``out``, or to standard output."""
    if out is None:
        emit(lambda: print(text, end=""))
        return EXIT_OK
    try:
        write_file(out, text, create_folder=True)
    except OSError as error:
        raise UsageError(f"{out}: cannot write: {error.strerror or error}") from None
    print(f"{out}: written")
    return EXIT_OK


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
    except ConfigError as error:
        # placed at the key the user wrote, as the config's own problems are
        raise ConfigError(
            [source.diagnostic(problem.path, problem.message) for problem in error.diagnostics]
        ) from None
    head = (
        f"# Megatron-LM's arguments for {args.path}, on {config.resolved_world_size} ranks; "
        "meshconf convert --from megatron reads them back.\n"
    )
    return _write(args.out, head + arguments.command_line())


def run(args: argparse.Namespace) -> int:
    if args.target is not None:
        return _to_megatron(args)
    where = "--args" if args.path is None else args.path
    try:
        converted = conversion(args)
    except ConversionError as error:
        raise InvalidInput([problem.render(where) for problem in error.problems]) from None
    source = "the command line of --args" if args.path is None else args.path
    return _write(args.out, render(converted, source, schema_reference(args.out)))


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
