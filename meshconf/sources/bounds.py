"""Limits on data that does not come from a YAML file: mappings given to ``load_config``, and
what ``${...}`` interpolation would expand to. A YAML file gets the same limits from the
reader; these apply them to everything else, before the work that would blow up."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from typing import Any

from meshconf.core.errors import KeyPath, describe_value
from meshconf.sources.yaml_reader import MAX_BYTES, MAX_DEPTH, MAX_NODES

#: ``${`` inside ``${`` at most this deep, in one value.
MAX_INTERPOLATION_NESTING = 16
#: ``${...}`` evaluations resolving a config may take; OmegaConf resolves a key again
#: wherever it is named, at about half a millisecond each.
MAX_RESOLUTIONS = 2000
#: A value may name a value that names a value ... this many times.
MAX_INTERPOLATION_CHAIN = 32
#: Characters all strings may hold once interpolations are resolved.
MAX_RESOLVED_CHARS = 4 * MAX_BYTES

_PLAIN_SCALARS = (str, int, float, bool, type(None))
# oc.create builds a config from YAML text (an environment value, say) with aliases expanded
# and none of the reader's limits.
_UNBOUNDED_RESOLVER = re.compile(r"\$\{\s*oc\.create\s*:")
_BRACES = re.compile(r"\$\{|\}")
# ${oc.env:NAME} and ${oc.env:NAME,default}. ${oc.decode:...} resolves the interpolations in
# the text it is given, so a value is measured with the environment's text in their place.
_ENVIRONMENT = re.compile(
    r"\$\{\s*oc\.env\s*:\s*([A-Za-z_][A-Za-z0-9_]*)\s*(?:,\s*([^${}]*?)\s*)?\}"
)
# Key paths inside an interpolation: ``a.b[0]``, ``.sibling``, ``..uncle.x``.
_REFERENCE = re.compile(r"\.*[A-Za-z0-9_\-]+(?:\.[A-Za-z0-9_\-]+|\[[0-9]+\])*")


class LimitError(Exception):
    """Data past a limit; ``path`` is where, ``message`` says which limit."""

    def __init__(self, path: KeyPath, message: str) -> None:
        super().__init__(message)
        self.path = path
        self.message = message


def check_plain(data: Any) -> None:
    """Refuse data that is not plain, finite, ordered and small: a container that holds
    itself, nesting past :data:`MAX_DEPTH`, more than :data:`MAX_NODES` values, sets, null
    keys. Iterative, so any depth is safe. Raises :class:`LimitError`."""
    nodes = 0
    stack: list[tuple[Any, KeyPath, tuple[int, ...]]] = [(data, (), ())]
    while stack:
        value, path, holders = stack.pop()
        nodes += 1
        if nodes > MAX_NODES:
            raise LimitError(path, f"more than {MAX_NODES} values; this is not a mesh config")
        if isinstance(value, _PLAIN_SCALARS):
            continue
        if isinstance(value, set | frozenset):
            raise LimitError(path, "a set has no order; give a list")
        if not isinstance(value, Mapping | list | tuple):
            continue  # the models name the type in their message
        if id(value) in holders:
            raise LimitError(path, "contains itself")
        if len(holders) >= MAX_DEPTH:
            raise LimitError(path, f"nested deeper than {MAX_DEPTH} levels")
        inner = (*holders, id(value))
        items = value.items() if isinstance(value, Mapping) else enumerate(value)
        for key, child in items:
            if key is None:
                raise LimitError(path, "a key must be a name, not null")
            # an integer key Python could not write out as text (past 4,300 digits)
            too_long = isinstance(key, int) and key.bit_length() > 100
            if not isinstance(key, str | int) or isinstance(key, bool) or too_long:
                raise LimitError(
                    path, f"a key must be a name, not {describe_value(key)}; write it as text"
                )
            stack.append((child, (*path, key), inner))


def _nesting(text: str) -> int:
    depth = deepest = 0
    for token in _BRACES.finditer(text):
        if token.group() == "${":
            depth += 1
            deepest = max(deepest, depth)
        elif depth:
            depth -= 1
    return deepest


def _references(text: str, path: KeyPath) -> list[tuple[str, ...]]:
    """Every key path ``text`` may name, absolute and relative to ``path``'s parent."""
    found = []
    for match in _REFERENCE.finditer(text[text.index("${") :]):
        token = match.group()
        dots = len(token) - len(token.lstrip("."))
        parts = tuple(re.split(r"\.|\[|\]\.?", token.lstrip(".").rstrip("]")))
        if dots:
            base = path[: max(0, len(path) - dots)]
            found.append(tuple(map(str, base)) + parts)
        else:
            found.append(parts)
    return found


def check_interpolation(data: Any) -> None:
    """Refuse ``${...}`` values past the limits above: values, characters, evaluations,
    references in a chain, or ``${`` nesting. Counts what each key expands to once
    (memoized), so the check is linear however the references multiply. Raises
    :class:`LimitError`."""
    index: dict[tuple[str, ...], tuple[KeyPath, Any]] = {}
    walk: list[tuple[KeyPath, Any]] = [((), data)]
    while walk:
        path, value = walk.pop()
        index[tuple(map(str, path))] = (path, value)
        if isinstance(value, Mapping):
            walk.extend(((*path, key), child) for key, child in value.items())
        elif isinstance(value, list | tuple):
            walk.extend(((*path, key), child) for key, child in enumerate(value))
    sizes: dict[tuple[str, ...], _Size] = {}
    for start in index:
        _measure(start, index, sizes)


#: Values, characters, the longest chain of references and the ``${...}`` evaluations, of
#: what a key resolves to.
_Size = tuple[int, int, int, int]
#: The most of each, and the message past it.
_EXPANSION_LIMITS = (
    (MAX_NODES, "expands to more than {} values through ${{...}} interpolation"),
    (MAX_RESOLVED_CHARS, "expands to more than {} characters through ${{...}} interpolation"),
    (
        MAX_INTERPOLATION_CHAIN,
        "more than {} ${{...}} references in a chain (this value names a value that names a "
        "value ...)",
    ),
    (
        MAX_RESOLUTIONS,
        "resolving takes more than {} ${{...}} evaluations (a value is resolved again "
        "wherever it is named)",
    ),
)


def _with_environment(text: str) -> str:
    """``text`` as it reads once ``${oc.env:...}`` is resolved (the environment as it is now,
    which is what OmegaConf will read)."""
    if "oc.env" not in text:
        return text
    return _ENVIRONMENT.sub(lambda match: os.environ.get(match[1], match[2] or ""), text)


def _parts(key: tuple[str, ...], path: KeyPath, value: Any, index: dict[Any, Any]) -> list[Any]:
    if isinstance(value, Mapping | list | tuple):
        names = value if isinstance(value, Mapping) else range(len(value))
        return [(*key, str(child)) for child in names]
    if isinstance(value, str) and "${" in value:
        if _UNBOUNDED_RESOLVER.search(value):
            raise LimitError(
                path,
                "${oc.create:...} is not supported: it reads YAML (aliases included) outside "
                "meshconf's limits; write the value in the config",
            )
        if _nesting(value) > MAX_INTERPOLATION_NESTING:
            raise LimitError(path, f"interpolations nested deeper than {MAX_INTERPOLATION_NESTING}")
        return [ref for ref in _references(value, path) if ref in index]
    return []


def _measure(
    start: tuple[str, ...],
    index: dict[tuple[str, ...], tuple[KeyPath, Any]],
    sizes: dict[tuple[str, ...], _Size],
) -> None:
    """Post-order over the key and what it refers to; a key being measured counts 1 (a
    cycle, which the resolver reports)."""
    stack: list[tuple[tuple[str, ...], list[tuple[str, ...]] | None]] = [(start, None)]
    while stack:
        key, parts = stack.pop()
        if key in sizes and parts is None:
            continue
        path, value = index[key]
        if isinstance(value, str):
            value = _with_environment(value)
        if parts is None:
            sizes[key] = (1, 1, 0, 0)  # in progress
            parts = _parts(key, path, value, index)
            stack.append((key, parts))
            stack.extend((part, None) for part in parts if part not in sizes)
            continue
        below = [sizes[part] for part in parts]
        nodes = sum(size[0] for size in below)
        chars = sum(size[1] for size in below)
        chain = max((size[2] for size in below), default=0)
        work = sum(size[3] for size in below)
        if isinstance(value, str):
            work += value.count("${")
            whole = value.startswith("${") and value.endswith("}") and len(below) == 1
            # One ${key} is that key's value; text around references makes one string.
            nodes = nodes if whole else 1
            chars += len(value)
            chain += 1 if below else 0
        else:
            nodes += 1
            chars += 1
        size = (nodes, chars, chain, work)
        for amount, (limit, message) in zip(size, _EXPANSION_LIMITS, strict=True):
            if amount > limit:
                raise LimitError(path, message.format(limit))
        sizes[key] = size
