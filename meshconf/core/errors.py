"""Problems found in a configuration, and the exceptions that carry them.

A :class:`Problem` is what a rule finds: a key path and a message. The loader turns problems
into :class:`Diagnostic` lines that also know the file, line and column (or the override) the
key came from. Lower layers produce problems; only the loader knows about files.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

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


def describe_value(value: object) -> str:
    """Name a value and its type for an error message: ``the string '8'``."""
    if isinstance(value, bool):
        return f"the boolean {str(value).lower()}"
    if isinstance(value, int):
        return f"the integer {value}"
    if isinstance(value, float):
        return f"the float {value!r}"
    if isinstance(value, str):
        shown = value if len(value) <= 40 else value[:37] + "..."
        return f"the string {shown!r}"
    if value is None:
        return "null"
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list | tuple):
        return "a list"
    return f"a {type(value).__name__}"


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
        if self.override is not None:
            return f"override '{self.override}': {what}"
        if self.source is not None and self.line is not None:
            return f"{self.source}:{self.line}:{self.column}: {what}"
        if self.source is not None:
            return f"{self.source}: {what}"
        return what


class MeshconfError(Exception):
    """Base class of every error meshconf raises on purpose."""


class ConfigError(MeshconfError, ValueError):
    """The configuration is invalid; ``diagnostics`` holds one entry per problem."""

    def __init__(self, diagnostics: Sequence[Diagnostic]) -> None:
        self.diagnostics = tuple(diagnostics)
        super().__init__("\n".join(d.render() for d in self.diagnostics))


class SourceError(MeshconfError):
    """A configuration source cannot be read at all (missing file, bad ``--key``, bad override)."""


class WorldSizeUnknownError(MeshconfError):
    """A question needs the world size, and neither the config nor the caller gave one."""
