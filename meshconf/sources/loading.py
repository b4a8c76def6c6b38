"""``load_config``: from a file, a mapping or an OmegaConf node to a validated MeshConfig.

Steps: read (YAML with key positions) -> apply overrides and resolve ``${...}`` (OmegaConf,
only when used) -> pick the ``key`` block -> validate. Every problem comes back as a
:class:`~meshconf.core.errors.Diagnostic` placed at ``file:line:column`` or on the override that
set the key.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping, Sequence
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
)
from meshconf.core.messages import did_you_mean, shorten
from meshconf.model.config import MeshConfig
from meshconf.sources.overrides import (
    InterpolationError,
    Override,
    apply,
    parse_key,
    parse_override,
)
from meshconf.sources.pydantic_messages import key_hint, translate
from meshconf.sources.reading import (
    Source,
    integers_from_interpolation,
    interpolations,
    read_source,
    safe_key,
    yaml_diagnostic,
)


def _in_file_order(diagnostics: Sequence[Diagnostic]) -> ConfigError:
    """One error of every problem, by line and column; those without a place last."""
    unplaced = float("inf")
    return ConfigError(
        sorted(diagnostics, key=lambda d: (d.line or unplaced, d.column or unplaced))
    )


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


def _select(source: Source, key: str | None, prefix: KeyPath) -> None:
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


def _check_override_targets(source: Source, key: str | None, prefix: KeyPath) -> None:
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
                f"override {shorten(override.text)!r}: {override.key} is not in "
                f"{source.name or 'the config'} and lies outside the --key {key} block; "
                f"did you mean {inside}=...? (+{override.key}=... adds a key outside the block)"
            )
    source.overrides = tuple(targets)


def _validate(source: Source, world_size: int | None) -> MeshConfig:
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


def _config_error(error: ValidationError, source: Source) -> ConfigError:
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
    return _in_file_order(diagnostics)


def at_world_size(config: MeshConfig, world_size: int) -> MeshConfig:
    """``config`` at the world size the launcher gave, or a ConfigError saying why not."""
    try:
        return config.with_world_size(world_size)
    except ValidationError as error:
        raise _config_error(error, Source(None)) from None


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
    return load_located(source, overrides, key, world_size=world_size)[0]


def load_located(
    source: str | os.PathLike[str] | Mapping[str, Any] | Any,
    overrides: Sequence[str] = (),
    key: str | None = None,
    *,
    world_size: int | None = None,
) -> tuple[MeshConfig, Source]:
    """:func:`load_config`, with the source it read: its ``diagnostic(path, message)``
    places a problem found later in the config (a layout its model cannot run) as the
    config's own problems are placed, at the key's line and column or on the override that
    set it.

    Raises what :func:`load_config` raises."""
    _check_argument_types(overrides, key, world_size)
    parsed = tuple(parse_override(text) for text in overrides)
    prefix = _block_path(key)
    source_data = read_source(source)
    # Keys given twice are reported with every other problem the file has, in one run.
    try:
        config = _load(source_data, parsed, key, prefix, world_size)
    except ConfigError as error:
        if not source_data.duplicates:
            raise
        raise _with_duplicates(error.diagnostics, source_data) from None
    if source_data.duplicates:
        raise _with_duplicates((), source_data)
    return config, source_data


def _with_duplicates(diagnostics: Sequence[Diagnostic], source: Source) -> ConfigError:
    found = [yaml_diagnostic(error, source.name) for error in source.duplicates]
    return _in_file_order([*found, *diagnostics])


def _load(
    source_data: Source,
    parsed: tuple[Override, ...],
    key: str | None,
    prefix: KeyPath,
    world_size: int | None,
) -> MeshConfig:
    source_data.overrides = parsed
    _check_override_targets(source_data, key, prefix)
    targeted = source_data.overrides
    if targeted or source_data.has_interpolation:
        source_data.interpolated.update(interpolations(source_data.data))
        for override in targeted:
            source_data.interpolated.update(interpolations(override.value, override.path))
        try:
            source_data.data = apply(source_data.data, targeted)
        except InterpolationError as error:
            path = safe_key(error.key)
            diagnostic = source_data.diagnostic(path, error.message)
            raise ConfigError([diagnostic]) from None
    _select(source_data, key, prefix)
    integers_from_interpolation(source_data)
    return _validate(source_data, world_size)
