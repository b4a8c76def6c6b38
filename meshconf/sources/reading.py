"""A config's data as read from a YAML file, a mapping or an OmegaConf node, with what it
takes to place an error in it: each key's line and column, the overrides that set keys, and
the values written as ``${...}``.
"""

from __future__ import annotations

import os
import re
import sys
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from meshconf.core.errors import (
    ConfigError,
    Diagnostic,
    KeyPath,
    SourceError,
    describe_value,
    printable,
)
from meshconf.sources.bounds import LimitError, check_plain
from meshconf.sources.files import NotAFileError, TooLargeError, read_limited
from meshconf.sources.overrides import InterpolationError, Override, parse_key
from meshconf.sources.pydantic_messages import model_at
from meshconf.sources.yaml_reader import (
    MAX_BYTES,
    Position,
    YamlError,
    decode,
    read_yaml,
    too_large,
)
from meshconf.sources.yaml_schema import MAX_INT_DIGITS


@dataclass
class Source:
    """Data read from somewhere, and what is needed to place errors in it."""

    data: Any
    name: str | None = None
    positions: dict[KeyPath, Position] = field(default_factory=dict)
    has_interpolation: bool = False
    overrides: tuple[Override, ...] = ()
    prefix: KeyPath = ()
    #: Keys whose value was written as ``${...}``, and what was written.
    interpolated: dict[KeyPath, str] = field(default_factory=dict)
    #: Keys the file gives twice (the last one is kept, and each is reported).
    duplicates: tuple[YamlError, ...] = ()
    #: Where the data itself sits, when it is a node of a larger OmegaConf config: messages
    #: name each key by its full path there (``parallelism.degrees.tp``).
    location: KeyPath = ()

    def diagnostic(self, path: KeyPath, message: str) -> Diagnostic:
        full = self.prefix + path
        shown = self.location + full
        for override in reversed(self.overrides):
            # The override set this key (or one above it), or created it: it is not in the file.
            set_here = full[: len(override.path)] == override.path
            created = override.path[: len(full)] == full and full not in self.positions
            if set_here or created:
                return Diagnostic(shown, message, override=override.text)
        if self.overrides:
            applied = ", ".join(override.text for override in self.overrides)
            message = f"{message} (with overrides: {applied})"
        for length in range(len(full), -1, -1):
            position = self.positions.get(full[:length])
            if position is not None:
                return Diagnostic(shown, message, self.name, position.line, position.column)
        return Diagnostic(shown, message, self.name)

    def error(self, path: KeyPath, message: str) -> ConfigError:
        return ConfigError([self.diagnostic(path, message)])


def interpolations(data: Any, path: KeyPath = ()) -> dict[KeyPath, str]:
    """Every value written as ``${...}``, by key path."""
    if isinstance(data, str):
        return {path: data} if "${" in data else {}
    items: Any = ()
    if isinstance(data, Mapping):
        items = data.items()
    elif isinstance(data, list | tuple):
        items = enumerate(data)
    return {
        found: text
        for key, value in items
        for found, text in interpolations(value, (*path, key)).items()
    }


_DECIMAL = re.compile(r"-?(0|[1-9][0-9]*)")
# A resolver call such as ${oc.env:TP}. A plain ${key} keeps the type of the value it names,
# so a string it names stays a string.
_RESOLVER_CALL = re.compile(r"\$\{\s*[A-Za-z_][\w.]*:")


def _integer_field(path: KeyPath) -> bool:
    """Whether the key at ``path`` (inside the meshconf block) holds an integer."""
    model = model_at(path[:-1]) if path else None
    info = model.model_fields.get(str(path[-1])) if model else None
    if info is None:
        return False
    options = typing.get_args(info.annotation) or (info.annotation,)
    return any(
        option is int
        or (typing.get_origin(option) is typing.Annotated and option.__origin__ is int)
        for option in options
    )


def integers_from_interpolation(source: Source) -> None:
    """``${oc.env:TP}`` resolves to the string ``"4"``; where the field is an integer, the
    value the user meant is the integer. Written strings (``"4"`` in the file, or named by a
    plain ``${key}``) stay strings."""
    block = len(source.prefix)
    for path, written in source.interpolated.items():
        inner = path[block:]
        if path[:block] != source.prefix or not _RESOLVER_CALL.search(written):
            continue
        if not _integer_field(inner):
            continue
        parent = source.data
        for part in inner[:-1]:
            parent = parent.get(part) if isinstance(parent, Mapping) else None
        value = parent.get(inner[-1]) if isinstance(parent, Mapping) else None
        if (
            isinstance(value, str)
            and len(value) <= MAX_INT_DIGITS + 1
            and _DECIMAL.fullmatch(value)
        ):
            parent[inner[-1]] = int(value)


def read_source(source: Any) -> Source:
    """The data of a YAML file's path, a mapping or an OmegaConf node.

    Raises:
        SourceError: the file cannot be read, or ``source`` is of another kind.
        ConfigError: the YAML or the mapping is malformed or past the bounds, or an
            interpolation of the OmegaConf node does not resolve.
    """
    if isinstance(source, str | os.PathLike):
        path = Path(source)
        name = str(source)
        try:
            raw = read_limited(path, MAX_BYTES)
        except TooLargeError as error:
            raise _unreadable(too_large(error.size), name) from None
        except NotAFileError as error:
            raise SourceError(f"{printable(name)}: {error}") from None
        except OSError as error:
            raise SourceError(
                f"{printable(name)}: cannot read: {error.strerror or error}"
            ) from None
        try:
            document = read_yaml(decode(raw), keep_going=True)
        except YamlError as error:
            raise _unreadable(error, name) from None
        return Source(
            document.data,
            name,
            document.positions,
            document.has_interpolation,
            duplicates=document.duplicates,
        )
    if "omegaconf" in sys.modules:
        from omegaconf import Container

        if isinstance(source, Container):
            from omegaconf import OmegaConf

            from meshconf.sources.overrides import node_location, resolve

            unresolved = OmegaConf.to_container(source, resolve=False)
            try:
                return Source(
                    resolve(source),
                    interpolated=interpolations(unresolved),
                    location=node_location(source),
                )
            except InterpolationError as error:
                raise ConfigError([Diagnostic(safe_key(error.key), error.message)]) from None
    if isinstance(source, Mapping):
        try:
            check_plain(source)
        except LimitError as error:
            raise ConfigError([Diagnostic(error.path, error.message)]) from None
        data = _copied(source)
        return Source(data, has_interpolation=bool(interpolations(data)))
    raise SourceError(
        f"cannot load a config from {describe_value(source)}; pass a path, a mapping or an "
        "OmegaConf DictConfig"
    )


def _copied(value: Any) -> Any:
    """The mappings, lists and tuples of plain data copied, so that the config holds none of
    the caller's; anything else kept as it is, for the models to accept or name (a generator
    or a memoryview cannot be deep-copied, and a config of one is refused, not a crash).
    ``check_plain`` bounds the depth first."""
    if isinstance(value, Mapping):
        return {key: _copied(item) for key, item in value.items()}
    if isinstance(value, tuple):
        return tuple(_copied(item) for item in value)
    if isinstance(value, list):
        return [_copied(item) for item in value]
    return value


def _unreadable(error: YamlError, name: str) -> ConfigError:
    return ConfigError([yaml_diagnostic(error, name)])


def yaml_diagnostic(error: YamlError, name: str | None) -> Diagnostic:
    """A problem of the YAML reader as a diagnostic at its line and column."""
    position = error.position
    line, column = (position.line, position.column) if position else (None, None)
    return Diagnostic(error.path, error.message, name, line, column)


def safe_key(text: str) -> KeyPath:
    """The key path ``text`` names, or the root when it names none."""
    try:
        return parse_key(text) if text else ()
    except ValueError:
        return ()
