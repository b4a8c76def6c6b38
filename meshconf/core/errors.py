"""Problems found in a configuration, and the exceptions that carry them.

A :class:`Problem` is what a rule finds: a key path and a message. The loader turns problems
into :class:`Diagnostic` lines that also know the file, line and column (or the override) the
key came from. Lower layers produce problems; only the loader knows about files.

Every error meshconf raises on purpose is a :class:`MeshconfError`; those that callers have
long caught as ``ValueError`` or ``KeyError`` are also that.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass

from meshconf.core.messages import shorten

KeyPath = tuple[str | int, ...]


def format_key(path: KeyPath) -> str:
    """Render a key path the way users write it: ``domains.dense[2]``."""
    text = ""
    for part in path:
        if isinstance(part, int):
            text += f"[{part}]"
        else:
            text += f".{part}" if text else part
    return text or "<root>"


#: A config reports at most this many problems; a last line counts the rest.
MAX_PROBLEMS = 50


def printable(text: str) -> str:
    """``text`` on one line: control characters, line breaks and non-characters escaped, so a
    file name or key cannot split or forge a message line."""
    if text.isprintable():
        return text
    return "".join(char if char.isprintable() else repr(char)[1:-1] for char in text)


def _digits(value: int) -> str:
    """How many digits ``value`` has, in words: Python refuses to write an integer of more
    than ``sys.get_int_max_str_digits()`` digits (4,300 by default) as text."""
    try:
        return str(len(str(abs(value))))
    except ValueError:
        return f"more than {sys.get_int_max_str_digits():,}"


def describe_value(value: object) -> str:
    """Name a value and its type for an error message: ``the string '8'``."""
    if isinstance(value, bool):
        return f"the boolean {str(value).lower()}"
    if isinstance(value, int):
        if value.bit_length() > 100:
            return f"an integer of {_digits(value)} digits"
        return f"the integer {value}"
    if isinstance(value, float):
        return f"the float {value!r}"
    if isinstance(value, str):
        return f"the string {shorten(value)!r}"
    if value is None:
        return "null"
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list | tuple):
        return "a list"
    name = type(value).__name__
    return f"{'an' if name[0].lower() in 'aeiou' else 'a'} {name}"


@dataclass(frozen=True)
class Problem:
    """One broken rule: where in the configuration, and what is wrong."""

    path: KeyPath
    message: str


@dataclass(frozen=True)
class Diagnostic:
    """A problem placed in its source: a file position, an override, or neither."""

    path: KeyPath
    message: str
    source: str | None = None
    line: int | None = None
    column: int | None = None
    override: str | None = None

    @property
    def key(self) -> str:
        return format_key(self.path)

    def render(self) -> str:
        what = f"{self.key}: {self.message}" if self.path else self.message
        what = printable(what)
        if self.override is not None:
            return f"override '{printable(self.override)}': {what}"
        source = None if self.source is None else printable(self.source)
        if source is not None and self.line is not None:
            return f"{source}:{self.line}:{self.column}: {what}"
        if source is not None:
            return f"{source}: {what}"
        return what


class MeshconfError(Exception):
    """Base class of every error meshconf raises on purpose."""


class ConfigError(MeshconfError, ValueError):
    """The configuration is invalid; ``diagnostics`` holds one entry per problem.

    Past :data:`MAX_PROBLEMS` problems, ``diagnostics`` keeps the first ones and ends with one
    entry that counts the rest; ``omitted`` is that count.
    """

    def __init__(self, diagnostics: Sequence[Diagnostic]) -> None:
        shown = tuple(diagnostics)
        self.omitted = max(0, len(shown) - MAX_PROBLEMS)
        if self.omitted:
            first = shown[0]
            shown = (
                *shown[:MAX_PROBLEMS],
                Diagnostic(
                    (),
                    f"{self.omitted} more problems not shown (at most {MAX_PROBLEMS} are "
                    "reported per config)",
                    first.source,
                    override=first.override if first.source is None else None,
                ),
            )
        self.diagnostics = shown
        super().__init__("\n".join(d.render() for d in self.diagnostics))


class SourceError(MeshconfError):
    """A configuration source cannot be read at all (missing file, bad ``--key``, bad override)."""


class WorldSizeUnknownError(MeshconfError):
    """A question needs the world size, and neither the config nor the caller gave one."""


class InvalidArgumentError(MeshconfError, ValueError):
    """A function of meshconf's API was given an argument outside what it accepts."""


class ArgumentTypeError(MeshconfError, TypeError):
    """A function of meshconf's API was given an argument of another type than it takes; the
    message names the argument, what it takes and what it got. Also a ``TypeError``."""


def argument_type_error(name: str, takes: str, value: object) -> ArgumentTypeError:
    """``overrides takes a list of 'key=value' strings, got the string 'tp=2'``."""
    return ArgumentTypeError(f"{name} takes {takes}, got {describe_value(value)}")


class UnknownDomainError(MeshconfError, KeyError, ValueError):
    """A domain name the config does not define. Also a ``KeyError`` (a lookup by name) and a
    ``ValueError`` (a bad argument), since callers catch either."""

    def __str__(self) -> str:
        # KeyError would quote the message as a repr.
        return str(self.args[0]) if self.args else ""
