"""What ``meshconf convert`` is given, read: the file's text, its TOML, its source when
``--from`` does not name it, and the conversion of what was read."""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from meshconf.cli.common import InvalidInput, UsageError
from meshconf.core.messages import spoken_list
from meshconf.features.convert import (
    BY_NAME,
    SOURCES,
    TOML_SOURCES,
    Conversion,
    Source,
    looks_like,
    recognise,
)
from meshconf.features.convert.arguments import YAML_SUFFIXES
from meshconf.sources.files import NotAFileError, TooLargeError, read_limited
from meshconf.sources.yaml_reader import MAX_BYTES, too_large
from meshconf.sources.yaml_schema import MAX_INT_DIGITS

if sys.version_info >= (3, 14):
    import tomllib
else:
    import tomli as tomllib


def conversion(args: argparse.Namespace) -> Conversion:
    """The conversion of the input ``meshconf convert``'s arguments name.

    Raises:
        ConversionError: the settings read do not convert, each problem at its key.
        InvalidInput: the file cannot be read as its source's.
        UsageError: the arguments name no input, or one no source recognises.
    """
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
_NOT_TOML = (*YAML_SUFFIXES, ".sh", ".bash")


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
    if document is not None:  # the TOML tables of no source, or of more than one
        tables = spoken_list(
            [f"a [{source.table}] table ({source.tool})" for source in TOML_SOURCES]
        )
        has = f"both {tables}" if found else f"neither {tables.replace(' and ', ' nor ')}"
        toml_choices = " or ".join(f"--from {source.name}" for source in TOML_SOURCES)
        others = ", ".join(
            f"--from {source.name} for {source.tool}'s arguments"
            for source in SOURCES
            if source.table is None
        )
        raise UsageError(f"{path}: has {has}; pass {toml_choices} (or {others})")
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
