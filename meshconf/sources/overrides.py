"""Command-line overrides (``-o degrees.tp=4``) and ``${...}`` interpolation, via OmegaConf.

Override grammar, as in Hydra:

* ``key=value``   set a key (created if missing)
* ``+key=value``  add a key that must not exist yet
* ``++key=value`` set a key whether or not it exists
* ``~key`` or ``~key=value``  delete a key (only if it has that value, when one is given)

Keys are dotted paths with optional list indices: ``domains.dense[2]``. Values are read as
YAML with the same rules as files (``4`` is an int, ``yes`` stays a string, ``[pp, tp]`` is a
list). OmegaConf is imported only when a config has overrides or interpolations.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from meshconf.core.errors import KeyPath, MeshconfError, SourceError, describe_value, format_key
from meshconf.core.messages import first_line, shorten
from meshconf.sources.bounds import LimitError, check_interpolation, check_plain
from meshconf.sources.yaml_reader import MAX_DEPTH, YamlError, parse_value

_SEGMENT = re.compile(r"(?P<name>[A-Za-z_][A-Za-z0-9_\-]*|[0-9]+)(?P<indices>(\[[0-9]+\])*)")
_INDEX = re.compile(r"\[([0-9]+)\]")


@dataclass(frozen=True)
class Override:
    text: str
    action: Literal["set", "add", "force", "delete"]
    path: KeyPath
    value: Any = None
    has_value: bool = True

    @property
    def key(self) -> str:
        return format_key(self.path)


def parse_key(text: str) -> KeyPath:
    """``domains.dense[2]`` -> ``("domains", "dense", 2)``."""
    path: list[str | int] = []
    for segment in text.split("."):
        match = _SEGMENT.fullmatch(segment)
        if match is None:
            raise ValueError(f"{text!r} is not a key path such as degrees.tp or domains.dense[2]")
        name = match.group("name")
        path.append(int(name) if name.isdigit() else name)
        path.extend(int(index) for index in _INDEX.findall(match.group("indices")))
    return tuple(path)


def parse_override(text: str) -> Override:
    body = text
    action: Literal["set", "add", "force", "delete"] = "set"
    for prefix, name in (("++", "force"), ("+", "add"), ("~", "delete")):
        if body.startswith(prefix):
            body, action = body[len(prefix) :], name  # type: ignore[assignment]
            break
    key, equals, value_text = body.partition("=")
    if not equals and action != "delete":
        raise SourceError(f"override {shorten(text)!r}: expected key=value, such as degrees.tp=4")
    try:
        path = parse_key(key.strip())
        if len(path) > MAX_DEPTH:
            raise ValueError(f"a key path of {len(path)} parts; configs nest at most {MAX_DEPTH}")
        value = parse_value(value_text) if equals else None
    except ValueError as error:
        detail = error.message if isinstance(error, YamlError) else str(error)
        raise SourceError(f"override {shorten(text)!r}: {detail}") from None
    return Override(text, action, path, value, bool(equals))


def apply(data: Any, overrides: Sequence[Override]) -> Any:
    """Apply overrides, then resolve interpolations; return plain containers."""
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    missing = object()
    # OmegaConf parses each ${...} as it creates or updates a node, recursing without bound,
    # so the file and every override value are checked before it sees them; resolve() then
    # checks what they add up to.
    try:
        check_interpolation(data)
        for override in overrides:
            check_interpolation(override.value)
    except LimitError as error:
        raise InterpolationError(format_key(error.path), error.message) from None
    try:
        config = OmegaConf.create(data)
    except OmegaConfBaseException as error:
        raise InterpolationError(
            getattr(error, "full_key", None) or "",
            f"cannot read the config as OmegaConf: {first_line(error)}; a value with '${{' "
            "starts an interpolation such as ${oc.env:TP}: complete it, or write \\${ for the "
            "text",
        ) from None
    for override in overrides:
        key = format_key(override.path)
        try:
            current = OmegaConf.select(config, key, default=missing, throw_on_missing=False)
            if override.action == "add" and current is not missing:
                raise SourceError(
                    f"override {shorten(override.text)!r}: {key} already exists; "
                    f"use {key}=... or ++{key}=... to change it"
                )
            if override.action == "delete":
                _delete(config, override, current is missing)
                continue
            OmegaConf.update(config, key, override.value, merge=False, force_add=True)
        except OmegaConfBaseException as error:
            raise SourceError(f"override {shorten(override.text)!r}: {first_line(error)}") from None
    return resolve(config)


def resolve(config: Any) -> Any:
    """Plain containers from an OmegaConf node, interpolations resolved, errors located."""
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    try:
        check_interpolation(OmegaConf.to_container(config, resolve=False))
        resolved = OmegaConf.to_container(config, resolve=True)
        check_plain(resolved)
    except LimitError as error:
        raise InterpolationError(format_key(error.path), error.message) from None
    except OmegaConfBaseException as error:
        raise InterpolationError(
            getattr(error, "full_key", None) or "", f"cannot resolve: {first_line(error)}"
        ) from None
    except RecursionError:
        raise InterpolationError("", "cannot resolve: interpolations nested too deeply") from None
    return resolved


class InterpolationError(MeshconfError, ValueError):
    """A ``${...}`` that cannot be resolved, or resolves past meshconf's limits."""

    def __init__(self, key: str, message: str) -> None:
        super().__init__(message)
        self.key = key
        self.message = message


def _delete(config: Any, override: Override, is_missing: bool) -> None:
    from omegaconf import OmegaConf

    if is_missing:
        raise SourceError(f"override {shorten(override.text)!r}: {override.key} does not exist")
    parent = config
    if len(override.path) > 1:
        parent = OmegaConf.select(config, format_key(override.path[:-1]))
    last = override.path[-1]
    if override.has_value and parent[last] != override.value:
        raise SourceError(
            f"override {shorten(override.text)!r}: {override.key} is "
            f"{_written(parent[last])}, not {_written(override.value)}"
        )
    if isinstance(last, int):
        parent.pop(last)
    else:
        del parent[last]


def node_location(node: Any) -> KeyPath:
    """Where an OmegaConf node sits in its config (``("parallelism",)``), or ``()``."""
    from omegaconf import Container

    # OmegaConf has no public way to ask a node where it sits; _get_full_key has been stable
    # from 2.1 to 2.4. Without it, errors are placed relative to the node.
    full_key = node._get_full_key(None) if isinstance(node, Container) else ""
    return tuple(str(full_key).split(".")) if full_key else ()


def _written(value: Any) -> str:
    """A value as a message quotes it: its repr, shortened; an integer too long to write
    out as text (Python refuses past 4,300 digits) described instead."""
    if isinstance(value, int) and value.bit_length() > 100:
        return describe_value(value)
    return shorten(repr(value))
