"""Options and helpers shared by the verbs."""

from __future__ import annotations

import argparse
import functools
import os
import re
import sys
import tempfile
from collections.abc import Callable, Iterable, Sequence
from typing import Any, NoReturn

from meshconf.core.degrees import MAX_WORLD_SIZE
from meshconf.core.errors import Problem, format_key, printable
from meshconf.core.messages import hint, nearest, not_one_of, shorten
from meshconf.model.config import MeshConfig
from meshconf.model.fields import MAX_GPUS_PER_NODE
from meshconf.sources.loading import load_config

EXIT_OK = 0
EXIT_INVALID = 1
EXIT_USAGE = 2


class UsageError(Exception):
    """A command line meshconf cannot run: one line that names the option or argument at
    fault, which ``main`` prints as it does a config that cannot be read."""


class InvalidInput(Exception):
    """Input other than the config that a command found invalid (a model file, the build a
    run measures, a file to convert): ``main`` prints ``lines``, on standard error when
    ``to_stderr`` or when the verb :func:`prints_data`."""

    def __init__(self, lines: Sequence[str], *, to_stderr: bool = False) -> None:
        super().__init__("\n".join(lines))
        self.lines = tuple(lines)
        self.to_stderr = to_stderr


class Parser(argparse.ArgumentParser):
    """argparse's parser, which raises a usage error as :class:`UsageError` where argparse
    prints the whole usage (34 lines for ``plan``) before it; each verb's parser is one too."""

    def __init__(self, **settings: Any) -> None:
        # A value that an option refuses then raises ArgumentError, which names the option.
        super().__init__(**{**settings, "exit_on_error": False})
        #: The parser of each verb, by name, on the parser of ``meshconf`` itself.
        self.verbs: dict[str, Parser] = {}

    def error(self, message: str) -> NoReturn:
        raise UsageError(message)

    def parse_command_line(self, words: Sequence[str]) -> argparse.Namespace:
        """The options and arguments ``words`` give.

        Raises:
            UsageError: a value that its option refuses, an argument missing, or a word that
                no option or argument takes (with the nearest option).
        """
        try:
            args, unknown = self.parse_known_args(words)
        except argparse.ArgumentError as error:
            where = f"{error.argument_name}: " if error.argument_name else ""
            raise UsageError(where + error.message) from None
        if unknown:
            raise UsageError(self.verbs.get(args.verb, self).unknown_word(unknown[0]))
        return args

    def unknown_word(self, word: str) -> str:
        """The message for ``word``, which none of this parser's options and arguments
        takes: the nearest option, or where the options are listed."""
        if not word.startswith("-"):
            return f"unexpected argument {shorten(word)!r}; see `{self.prog} --help`"
        option = word.split("=", 1)[0]
        # Compared without their dashes, which every option shares ('--bogus' is not near
        # '--gpu'); argparse lists its parser's options in no public field.
        options = {known.lstrip("-"): known for known in self._option_string_actions}
        closest = [options[bare] for bare in nearest(option.lstrip("-"), list(options))]
        return f"unknown option {shorten(option)!r}" + (
            hint(closest) or f"; see `{self.prog} --help`"
        )


def one_of(names: Iterable[str]) -> dict[str, Any]:
    """The ``type`` and ``choices`` of an option that takes one of ``names`` in any case
    (``--gpu GB200`` is gb200), as ``convert`` reads torchtitan's schedule names:
    ``add_argument("--gpu", **one_of(GPUS))``."""
    choices = tuple(names)
    by_lower = {name.lower(): name for name in choices}

    def choice(text: str) -> str:
        """Raises argparse.ArgumentTypeError, with the names and the nearest, for none."""
        name = by_lower.get(text.lower())
        if name is None:
            raise argparse.ArgumentTypeError(not_one_of(text, choices))
        return name

    return {"type": choice, "choices": choices}


_INTEGER = re.compile(r"\s*([0-9]+)\s*")
_DECIMAL = re.compile(r"\s*(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][-+]?[0-9]+)?\s*")


def bounded_int(
    text: str,
    *,
    minimum: int = 1,
    maximum: int = MAX_WORLD_SIZE,
    beyond: str = "the most ranks torch can number",
) -> int:
    """An integer option: ASCII digits only, checked against ``maximum`` before Python
    converts them (it refuses more than 4,300 digits).

    Raises:
        argparse.ArgumentTypeError: the message, for argparse's usage line.
    """
    expected = f"expected an integer >= {minimum}, got {shorten(text)!r}"
    match = _INTEGER.fullmatch(text)
    if match is None:
        raise argparse.ArgumentTypeError(expected)
    digits = match[1].lstrip("0") or "0"
    if len(digits) > len(str(maximum)) or int(digits) > maximum:
        shown = digits if len(digits) <= 20 else f"an integer of {len(digits):,} digits"
        raise argparse.ArgumentTypeError(f"{shown} is larger than {maximum}, {beyond}")
    if int(digits) < minimum:
        raise argparse.ArgumentTypeError(expected)
    return int(digits)


def bounded_number(text: str, *, minimum: float, maximum: float, beyond: str) -> float:
    """A decimal number option from ``minimum`` to ``maximum`` (no ``inf``, ``nan`` or
    hexadecimal; an exponent as in ``1e3``).

    Raises:
        argparse.ArgumentTypeError: the message, for argparse's usage line.
    """
    expected = f"expected a number from {minimum:g} to {maximum:g}, got {shorten(text)!r}"
    if _DECIMAL.fullmatch(text) is None:
        raise argparse.ArgumentTypeError(expected)
    value = float(text)
    if value > maximum:
        raise argparse.ArgumentTypeError(f"{text.strip()} is more than {maximum:g}: {beyond}")
    if not value >= minimum:
        raise argparse.ArgumentTypeError(expected)
    return value


positive_int = bounded_int
non_negative_int = functools.partial(bounded_int, minimum=0)
gpus_per_node = functools.partial(
    bounded_int, maximum=MAX_GPUS_PER_NODE, beyond="more than any node holds"
)


def add_source_options(parser: argparse.ArgumentParser, *, formats: bool = True) -> None:
    parser.add_argument(
        "--world-size",
        type=positive_int,
        metavar="N",
        help="world size to check against, when the config has none (must agree if it has one)",
    )
    add_key_options(parser, "before validation (repeatable): degrees.tp=4, +key=v, ~key")
    if formats:
        add_format_option(parser, "text for people (default) or json for programs")


def add_key_options(parser: argparse.ArgumentParser, when: str) -> None:
    """``--key`` and ``-o``, whose help ends in ``when``: when an override applies."""
    parser.add_argument(
        "--key", metavar="K", help="dotted key of the meshconf block inside a larger file"
    )
    parser.add_argument(
        "-o",
        "--override",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        dest="overrides",
        help=f"override a value {when}",
    )


def add_format_option(parser: argparse.ArgumentParser, help: str) -> None:
    parser.add_argument("--format", **one_of(("text", "json")), default="text", help=help)


def add_rank_options(parser: argparse.ArgumentParser, rank_help: str) -> None:
    parser.add_argument("path", metavar="PATH", help="the config file")
    parser.add_argument("--rank", type=non_negative_int, default=0, metavar="R", help=rank_help)


def refuse_overwrite(args: argparse.Namespace) -> None:
    """Check, before a command reads or writes anything, that its ``--out`` FILE is not its
    input PATH however either is spelled (``../``, through a symbolic or hard link): writing
    there would replace the input with what was made from it.

    Raises:
        UsageError: ``--out`` names the input; the message names both as given.
    """
    out: str | None = getattr(args, "out", None)
    source: str | None = getattr(args, "path", None)
    if out is None or source is None:
        return
    try:
        same = os.path.samefile(out, source)
    except (OSError, ValueError):
        # One of them does not exist yet: the same path once links are resolved.
        same = os.path.realpath(out) == os.path.realpath(source)
    if same:
        raise UsageError(f"--out {out} is the same file as the input {source}; choose another file")


def prints_data(args: argparse.Namespace) -> bool:
    """Whether the command's standard output is data (a config, a schema, JSON) that a
    program or ``> FILE`` takes: then its problems go to standard error, never mistaken for
    data. A verb says so with its parser's ``prints_data`` default, a function of its
    arguments; ``validate``, whose output is the problems, as a linter's is, says nothing."""
    says: Callable[[argparse.Namespace], bool] | None = getattr(args, "prints_data", None)
    return says is not None and says(args)


def prints_json(args: argparse.Namespace) -> bool:
    return bool(args.format == "json")


def always_data(args: argparse.Namespace) -> bool:
    return True


def write_file(out: str, content: str | bytes, *, create_folder: bool = False) -> None:
    """Write ``content`` beside ``out`` (through a link, beside its target), then rename it
    into place: a reader, or a write that fails midway, never sees a partial file. Raises
    ``OSError``."""
    target = os.path.realpath(out)
    folder = os.path.dirname(target)
    if create_folder:
        os.makedirs(folder, exist_ok=True)
    data = content.encode("utf-8") if isinstance(content, str) else content
    try:
        mode = os.stat(target).st_mode & 0o7777
    except FileNotFoundError:
        umask = os.umask(0)
        os.umask(umask)
        mode = 0o666 & ~umask
    fd, temporary = tempfile.mkstemp(dir=folder, prefix=f".{os.path.basename(target)}.")
    try:
        with os.fdopen(fd, "wb") as file:
            file.write(data)
            file.flush()
            os.fsync(file.fileno())
        os.chmod(temporary, mode)
        os.replace(temporary, target)
    except BaseException:
        os.unlink(temporary)
        raise


def warnings_json(warnings: Sequence[Problem]) -> list[dict[str, str]]:
    return [{"key": format_key(warning.path), "message": warning.message} for warning in warnings]


def table_lines(rows: Sequence[Sequence[str]], right: range) -> list[str]:
    """``rows`` in columns two spaces apart, each as wide as its widest cell; the columns in
    ``right`` aligned right, the others left."""
    widths = [max(len(row[column]) for row in rows) for column in range(len(rows[0]))]
    return [
        "  ".join(
            cell.rjust(width) if column in right else cell.ljust(width)
            for column, (cell, width) in enumerate(zip(row, widths, strict=True))
        ).rstrip()
        for row in rows
    ]


def usage_error(message: str) -> int:
    # One line, whatever file name or override text the message quotes.
    print(f"meshconf: error: {printable(message)}", file=sys.stderr)
    return EXIT_USAGE


def invalid(lines: Sequence[str], *, to_stderr: bool = False) -> int:
    text = "\n".join(lines)
    if to_stderr:
        print(text, file=sys.stderr)
    else:
        emit(lambda: print(text))
    return EXIT_INVALID


def emit(report: Callable[[], None]) -> None:
    """Print a report; if the reader went away (``| head``), stop printing quietly: the exit
    code still tells whether the config is valid."""
    try:
        report()
        sys.stdout.flush()
    except BrokenPipeError:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())


def load_for_rank(args: argparse.Namespace) -> MeshConfig:
    """Load ``args.path`` for a verb that looks at one rank of a known world.

    Raises:
        ConfigError: the config is invalid.
        SourceError: it cannot be read.
        UsageError: the world size is unknown, or an option names what the config lacks.
    """
    config = load_config(args.path, args.overrides, args.key, world_size=args.world_size)
    world_size = config.resolved_world_size
    if world_size is None:
        raise UsageError(
            f"{args.path}: the world size is unknown (degrees.{config.degrees.auto} is -1); "
            "set world_size in the file or pass --world-size N"
        )
    # simulate takes several ranks.
    ranks = args.rank if isinstance(args.rank, list) else [args.rank]
    outside = [rank for rank in ranks if rank >= world_size]
    if outside:
        raise UsageError(f"--rank {outside[0]} is outside the world [0, {world_size})")
    layouts = config.layouts
    domain = getattr(args, "domain", None)
    if domain is not None and domain not in layouts:
        raise UsageError(f"unknown domain {domain!r}; domains: {', '.join(layouts)}")
    given = getattr(args, "gpus_per_node", None)
    if given is None:
        return config
    if config.node_size not in (None, given):
        raise UsageError(
            f"--gpus-per-node {given} disagrees with gpus_per_node {config.node_size} in "
            f"{args.path}"
        )
    if config.levels is not None and config.node_size is None:
        raise UsageError(
            f"--gpus-per-node: {args.path} has levels; give the node there "
            "(levels: [{name: node, size: N}, ...])"
        )
    # The option is range-checked by its argparse type, and no rule depends on it.
    return config.model_copy(update={"gpus_per_node": given})


def add_gpus_per_node_option(parser: argparse.ArgumentParser, purpose: str) -> None:
    parser.add_argument(
        "--gpus-per-node",
        type=gpus_per_node,
        metavar="G",
        help=f"ranks per node, {purpose}, for a config without gpus_per_node "
        "(must agree if it has one)",
    )
