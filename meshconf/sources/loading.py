"""``load_config``: from a file, a mapping or an OmegaConf node to a validated MeshConfig.

Steps: read (YAML with key positions) -> apply overrides and resolve ``${...}`` (OmegaConf,
only when used) -> pick the ``key`` block -> validate. Every problem comes back as a
:class:`~meshconf.core.errors.Diagnostic` placed at ``file:line:column`` or on the override that
set the key.
"""

from __future__ import annotations

import copy
import dataclasses
import os
import re
import sys
import typing
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from meshconf.core.errors import (
    ConfigError,
    Diagnostic,
    KeyPath,
    SourceError,
    argument_type_error,
    describe_value,
    format_key,
    printable,
)
from meshconf.core.messages import did_you_mean
from meshconf.model.config import MeshConfig
from meshconf.sources.bounds import LimitError, check_plain
from meshconf.sources.files import NotAFileError, TooLargeError, read_limited
from meshconf.sources.overrides import (
    InterpolationError,
    Override,
    apply,
    parse_key,
    parse_override,
)
from meshconf.sources.pydantic_messages import key_hint, model_at, translate
from meshconf.sources.yaml_reader import (
    MAX_BYTES,
    MAX_INT_DIGITS,
    Position,
    YamlError,
    decode,
    read_yaml,
    too_large,
)


@dataclass
class _Source:
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


def _interpolations(data: Any, path: KeyPath = ()) -> dict[KeyPath, str]:
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
        for found, text in _interpolations(value, (*path, key)).items()
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


def _integers_from_interpolation(source: _Source) -> None:
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


def _read(source: Any) -> _Source:
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
        return _Source(
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
                return _Source(
                    resolve(source),
                    interpolated=_interpolations(unresolved),
                    location=node_location(source),
                )
            except InterpolationError as error:
                raise ConfigError([Diagnostic(_safe_key(error.key), error.message)]) from None
    if isinstance(source, Mapping):
        try:
            check_plain(source)
        except LimitError as error:
            raise ConfigError([Diagnostic(error.path, error.message)]) from None
        data = copy.deepcopy(dict(source))
        return _Source(data, has_interpolation=bool(_interpolations(data)))
    raise SourceError(
        f"cannot load a config from {describe_value(source)}; pass a path, a mapping or an "
        "OmegaConf DictConfig"
    )


def _unreadable(error: YamlError, name: str) -> ConfigError:
    return ConfigError([_yaml_diagnostic(error, name)])


def _yaml_diagnostic(error: YamlError, name: str | None) -> Diagnostic:
    position = error.position
    line, column = (position.line, position.column) if position else (None, None)
    return Diagnostic(error.path, error.message, name, line, column)


def _in_file_order(diagnostics: Sequence[Diagnostic]) -> ConfigError:
    """One error of every problem, by line and column; those without a place last."""
    unplaced = float("inf")
    return ConfigError(
        sorted(diagnostics, key=lambda d: (d.line or unplaced, d.column or unplaced))
    )


def _safe_key(text: str) -> KeyPath:
    try:
        return parse_key(text) if text else ()
    except ValueError:
        return ()


def _exists(data: Any, path: KeyPath) -> bool:
    """Whether ``path`` names a value in plain nested containers."""
    for part in path:
        in_mapping = isinstance(data, Mapping) and part in data
        in_list = isinstance(data, list) and isinstance(part, int) and 0 <= part < len(data)
        if not (in_mapping or in_list):
            return False
        data = data[part]
    return True


def _block_path(key: str | None) -> KeyPath:
    if key is None:
        return ()
    try:
        return parse_key(key)
    except ValueError as error:
        raise SourceError(f"--key: {error}") from None


def _select(source: _Source, key: str | None, prefix: KeyPath) -> None:
    if key is None:
        return
    data = source.data
    for depth, part in enumerate(prefix):
        if not isinstance(data, Mapping) or part not in data:
            keys = [str(k) for k in data] if isinstance(data, Mapping) else []
            where = f" under {format_key(prefix[:depth])}" if depth else ""
            raise SourceError(
                f"{source.name or 'config'}: --key {key}: no key {part!r}{where}"
                f"{did_you_mean(str(part), keys)}"
            )
        data = data[part]
    source.data, source.prefix = data, prefix


def _check_override_targets(source: _Source, key: str | None, prefix: KeyPath) -> None:
    """With ``--key``, a plain ``key=value`` that names no key of the file but starts with a
    meshconf key means that key of the block (``-o degrees.tp=4`` with ``--key parallelism``
    sets ``parallelism.degrees.tp``); any other must name a key that exists, so that it is
    not silently a no-op."""
    targets = []
    for override in source.overrides:
        outside = override.action == "set" and override.path[: len(prefix)] != prefix
        if not outside or _exists(source.data, override.path):
            targets.append(override)
        elif prefix and override.path[0] in MeshConfig.model_fields:
            targets.append(dataclasses.replace(override, path=prefix + override.path))
        else:
            inside = format_key(prefix + override.path)
            raise SourceError(
                f"override {override.text!r}: {override.key} is not in "
                f"{source.name or 'the config'} and lies outside the --key {key} block; "
                f"did you mean {inside}=...? (+{override.key}=... adds a key outside the block)"
            )
    source.overrides = tuple(targets)


def _validate(source: _Source, world_size: int | None) -> MeshConfig:
    if not isinstance(source.data, Mapping):
        what = "empty" if source.data is None else f"{describe_value(source.data)}, not a mapping"
        raise source.error((), f"expected a mapping of meshconf keys; the config is {what}")
    try:
        config = MeshConfig.model_validate(source.data)
        return config if world_size is None else config.with_world_size(world_size)
    except ValidationError as error:
        found = _config_error(error, source)
        independent = all(_outside_rules(item) for item in error.errors(include_url=False))
    # The formula rules run once every field is valid. When the only problems are in keys
    # the rules do not read (runtime, unknown top-level keys), run them without those keys,
    # so that one run reports every problem.
    if independent:
        kept = {k: v for k, v in source.data.items() if k in _RULE_KEYS}
        try:
            rules_only = MeshConfig.model_validate(kept)
            if world_size is not None:
                rules_only.with_world_size(world_size)
        except ValidationError as rules:
            more = _config_error(rules, source).diagnostics
            raise _in_file_order([*found.diagnostics, *more]) from None
    raise found from None


#: The keys the formula rules read.
_RULE_KEYS = frozenset(MeshConfig.model_fields) - {"runtime"}


def _outside_rules(item: Mapping[str, Any]) -> bool:
    loc = tuple(item["loc"])
    return bool(loc) and (
        loc[0] == "runtime" or (item["type"] == "extra_forbidden" and len(loc) == 1)
    )


def _config_error(error: ValidationError, source: _Source) -> ConfigError:
    diagnostics = []
    for item in error.errors(include_url=False):
        path, message = translate(item)
        if (
            item["type"] == "extra_forbidden"
            and len(path) == 1
            and isinstance(source.data, Mapping)
        ):
            message += key_hint(source.data.get(path[0]), path[0])
        written = source.interpolated.get(source.prefix + path)
        if written is not None:
            # A hint about how the YAML was written does not apply to an interpolated value.
            hint = item.get("ctx", {}).get("hint")
            message = message.replace(hint, "") if hint else message
            message += f" (resolved from {written})"
        diagnostics.append(source.diagnostic(path, message))
    unplaced = float("inf")
    diagnostics.sort(key=lambda d: (d.line or unplaced, d.column or unplaced))
    return ConfigError(diagnostics)


def at_world_size(config: MeshConfig, world_size: int) -> MeshConfig:
    """``config`` at the world size the launcher gave, or a ConfigError saying why not."""
    try:
        return config.with_world_size(world_size)
    except ValidationError as error:
        raise _config_error(error, _Source(None)) from None


def _check_argument_types(overrides: object, key: object, world_size: object) -> None:
    wanted = "a list of 'key=value' strings such as ['degrees.tp=2']"
    if isinstance(overrides, str | bytes) or not isinstance(overrides, Sequence):
        raise argument_type_error("overrides", wanted, overrides)
    for text in overrides:
        if not isinstance(text, str):
            raise argument_type_error("overrides", wanted, text)
    if key is not None and not isinstance(key, str):
        raise argument_type_error("key", "a dotted key such as 'parallelism', or None", key)
    if world_size is not None and (isinstance(world_size, bool) or not isinstance(world_size, int)):
        raise argument_type_error("world_size", "an integer, or None", world_size)


def load_config(
    source: str | os.PathLike[str] | Mapping[str, Any] | Any,
    overrides: Sequence[str] = (),
    key: str | None = None,
    *,
    world_size: int | None = None,
) -> MeshConfig:
    """Load and validate a mesh config.

    ``source`` is a YAML file path, a mapping, or an OmegaConf ``DictConfig``. ``overrides``
    are ``key=value`` strings applied to the whole document before ``key`` picks the meshconf
    block out of a larger file. ``world_size`` supplies the world size when the config has
    none (and must agree with it when it has one).

    Raises :class:`~meshconf.core.errors.ConfigError` (one diagnostic per problem) for an invalid
    config, :class:`~meshconf.core.errors.SourceError` when there is nothing to validate, and
    :class:`~meshconf.core.errors.ArgumentTypeError` (a ``TypeError``) when an argument is of
    another type than these.
    """
    _check_argument_types(overrides, key, world_size)
    parsed = tuple(parse_override(text) for text in overrides)
    prefix = _block_path(key)
    source_data = _read(source)
    # Keys given twice are reported with every other problem the file has, in one run.
    try:
        config = _load(source_data, parsed, key, prefix, world_size)
    except ConfigError as error:
        if not source_data.duplicates:
            raise
        raise _with_duplicates(error.diagnostics, source_data) from None
    if source_data.duplicates:
        raise _with_duplicates((), source_data)
    return config


def _with_duplicates(diagnostics: Sequence[Diagnostic], source: _Source) -> ConfigError:
    found = [_yaml_diagnostic(error, source.name) for error in source.duplicates]
    return _in_file_order([*found, *diagnostics])


def _load(
    source_data: _Source,
    parsed: tuple[Override, ...],
    key: str | None,
    prefix: KeyPath,
    world_size: int | None,
) -> MeshConfig:
    source_data.overrides = parsed
    _check_override_targets(source_data, key, prefix)
    targeted = source_data.overrides
    if targeted or source_data.has_interpolation:
        source_data.interpolated.update(_interpolations(source_data.data))
        for override in targeted:
            source_data.interpolated.update(_interpolations(override.value, override.path))
        try:
            source_data.data = apply(source_data.data, targeted)
        except InterpolationError as error:
            path = _safe_key(error.key)
            diagnostic = source_data.diagnostic(path, error.message)
            raise ConfigError([diagnostic]) from None
    _select(source_data, key, prefix)
    _integers_from_interpolation(source_data)
    return _validate(source_data, world_size)
