"""Read YAML into plain data plus the line and column of every key.

Differences from ``yaml.safe_load``, each deliberate:

* Scalars resolve as in YAML 1.2's core schema. ``yes``, ``on``, ``010``, ``1:00``, ``1_000``
  and dates stay strings, so the models can refuse them with the reason instead of silently
  reading ``010`` as 8.
* A key given twice in one mapping is an error (PyYAML keeps the last one silently); so is
  a second ``<<`` merge key.
* Merge keys follow the YAML merge spec whatever PyYAML's release does (6.0.4 changed which
  of several merged mappings wins): keys written in the mapping win, then the first mapping
  listed after ``<<``.
* Hostile input fails fast with a located message: more than ``MAX_BYTES`` bytes, nesting
  deeper than ``MAX_DEPTH``, aliases that expand past ``MAX_NODES`` nodes or refer to
  themselves, integers with more than ``MAX_INT_DIGITS`` digits, characters YAML forbids.
  These messages are meshconf's own, whichever PyYAML release reads the file: a limit of the
  parser's own that it hits while reading ahead (libyaml in PyYAML 6.0.4 stops flow nesting
  at 1,000 levels) does not hide a limit of meshconf's that the text before it exceeds.
* An explicit tag must agree with its text (``!!int abc`` is an error, not a crash), and only
  the tags of plain data are accepted: ``!!set`` (no order), ``!!timestamp``, ``!!binary``,
  ``!!omap``, ``!!pairs`` and every application tag are refused. A key must not be null.

libyaml's C parser is used when PyYAML has it; the pure-Python one otherwise.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any

import yaml
from yaml.constructor import ConstructorError
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from meshconf.core.errors import KeyPath, MeshconfError
from meshconf.sources.yaml_schema import (
    MERGE_TAG,
    NULL_TAG,
    Loader,
    forbidden_character,
    merge_sources,
    tag_problem,
)

MAX_BYTES = 4 * 1024 * 1024
MAX_DEPTH = 64
MAX_NODES = 100_000


@dataclass(frozen=True)
class Position:
    """1-based line and column."""

    line: int
    column: int


class YamlError(MeshconfError, ValueError):
    """Unreadable YAML; ``position`` says where, when known."""

    def __init__(self, message: str, position: Position | None = None, path: KeyPath = ()) -> None:
        super().__init__(message)
        self.message = message
        self.position = position
        self.path = path


@dataclass(frozen=True)
class YamlDocument:
    data: Any
    positions: dict[KeyPath, Position]
    has_interpolation: bool
    #: Keys given twice in one mapping, when read with ``keep_going`` (the last one is kept).
    duplicates: tuple[YamlError, ...] = ()


def _position(mark: Any) -> Position:
    return Position(mark.line + 1, mark.column + 1)


def _syntax_error(error: yaml.YAMLError) -> YamlError:
    mark = getattr(error, "problem_mark", None)
    problem = getattr(error, "problem", None) or str(error)
    if isinstance(error, ConstructorError):
        return YamlError(problem, _position(mark) if mark is not None else None)
    context = getattr(error, "context", None)
    context_mark = getattr(error, "context_mark", None)
    if (
        context
        and context.startswith("while")
        and context_mark is not None
        and mark is not None
        and _position(context_mark) != _position(mark)
    ):
        opened = _position(context_mark)
        context += f" (from line {opened.line}, column {opened.column})"
    message = f"YAML syntax: {context}, {problem}" if context else f"YAML syntax: {problem}"
    return YamlError(message, _position(mark) if mark is not None else None)


def _check_depth(text: str) -> None:
    """Refuse nesting deeper than ``MAX_DEPTH`` before the composer (which recurses) sees it.

    A parser reads tokens ahead of the events it hands out, up to about 1,024 characters on a
    line, and a release may enforce a limit of its own in that look-ahead (libyaml in PyYAML
    6.0.4 stops at 1,000 flow levels). When the parser fails, the text before the point of
    failure is walked once more: there the look-ahead ends with the text, and the events of
    every complete token come out, so meshconf's own limit is found if that text exceeds it.
    """
    try:
        _walk_depth(text)
    except yaml.YAMLError as error:
        # Cut where the parser failed, and if need be before the token it was reading (a quoted
        # scalar left open fails at the end of the text; its context mark is where it began).
        marks = [getattr(error, name, None) for name in ("problem_mark", "context_mark")]
        for cut in sorted({mark.index for mark in marks if mark is not None}, reverse=True):
            if 0 < cut < len(text):
                with contextlib.suppress(yaml.YAMLError):  # the cut text may fail on its own
                    _walk_depth(text[:cut])
        raise


def _walk_depth(text: str) -> None:
    """Walk the event stream (no recursion), counting open collections."""
    depth = 0
    loader = Loader(text)
    try:
        while loader.check_event():
            event = loader.get_event()
            if isinstance(event, yaml.CollectionStartEvent):
                depth += 1
                if depth > MAX_DEPTH:
                    raise YamlError(
                        f"nested deeper than {MAX_DEPTH} levels", _position(event.start_mark)
                    )
            elif isinstance(event, yaml.CollectionEndEvent):
                depth -= 1
    finally:
        loader.dispose()


class _Walker:
    """Checks the composed node graph and records where each key is."""

    def __init__(self, *, keep_going: bool) -> None:
        self.positions: dict[KeyPath, Position] = {}
        self.has_interpolation = False
        self.keep_going = keep_going
        self.duplicates: list[YamlError] = []
        self._expanded: dict[int, tuple[int, int]] = {}  # node id -> (node count, depth)
        self._open: set[int] = set()

    def measure(self, node: Node) -> tuple[int, int]:
        """Node count and depth of ``node`` with every alias expanded (memoized, so linear)."""
        key = id(node)
        if key in self._expanded:
            return self._expanded[key]
        if key in self._open:
            raise YamlError(
                "an alias refers to a node that contains it", _position(node.start_mark)
            )
        problem = tag_problem(node)
        if problem is not None:
            raise YamlError(problem, _position(node.start_mark))
        self._open.add(key)
        # Depth counts collections, as the event walk does: a scalar adds no level.
        count, depth = 1, 0
        children: list[Node] = []
        if isinstance(node, MappingNode):
            children = [part for pair in node.value for part in pair]
        elif isinstance(node, SequenceNode):
            children = list(node.value)
        for child in children:
            child_count, child_depth = self.measure(child)
            count += child_count
            depth = max(depth, child_depth)
        if isinstance(node, (MappingNode, SequenceNode)):
            depth += 1
        self._open.discard(key)
        if count > MAX_NODES:
            raise YamlError(
                f"expands to more than {MAX_NODES} nodes through aliases",
                _position(node.start_mark),
            )
        if depth > MAX_DEPTH:
            raise YamlError(
                f"nested deeper than {MAX_DEPTH} levels through aliases", _position(node.start_mark)
            )
        self._expanded[key] = (count, depth)
        return count, depth

    def walk(self, node: Node, path: KeyPath) -> None:
        if isinstance(node, ScalarNode):
            if "${" in str(node.value):
                self.has_interpolation = True
        elif isinstance(node, SequenceNode):
            for index, item in enumerate(node.value):
                self.positions.setdefault((*path, index), _position(item.start_mark))
                self.walk(item, (*path, index))
        elif isinstance(node, MappingNode):
            self._walk_mapping(node, path)

    def _walk_mapping(self, node: MappingNode, path: KeyPath) -> None:
        first_seen: dict[tuple[str, str], Position] = {}
        merged: list[MappingNode] = []
        merge_key: Position | None = None
        for key_node, value_node in node.value:
            if key_node.tag == MERGE_TAG:
                here = _position(key_node.start_mark)
                if merge_key is not None:
                    self._duplicate(
                        YamlError(
                            f"a second merge key (first given at line {merge_key.line}); list "
                            "every mapping to merge after one <<, as in <<: [*a, *b]",
                            here,
                            path,
                        )
                    )
                else:
                    merge_key = here
                merged.extend(n for n in merge_sources(value_node) if isinstance(n, MappingNode))
                continue
            here = _position(key_node.start_mark)
            if not isinstance(key_node, ScalarNode):
                raise YamlError("a key must be a plain name, not a list or mapping", here, path)
            if key_node.tag == NULL_TAG:
                raise YamlError("a key must be a name, not null", here, path)
            identity = (key_node.tag, key_node.value)
            if identity in first_seen:
                self._duplicate(
                    YamlError(
                        f"duplicate key (first given at line {first_seen[identity].line})",
                        here,
                        (*path, _key_value(key_node)),
                    )
                )
            else:
                first_seen[identity] = here
            child: KeyPath = (*path, _key_value(key_node))
            self.positions[child] = here
            self.walk(value_node, child)
        # Keys pulled in with ``<<`` point at their definition, unless given explicitly here;
        # among merged mappings the first listed wins, as it does in construction.
        for source in merged:
            self._walk_merged(source, path)

    def _duplicate(self, error: YamlError) -> None:
        if not self.keep_going:
            raise error
        self.duplicates.append(error)

    def _walk_merged(self, source: MappingNode, path: KeyPath) -> None:
        nested: list[MappingNode] = []
        for key_node, value_node in source.value:
            if key_node.tag == MERGE_TAG:
                nested.extend(n for n in merge_sources(value_node) if isinstance(n, MappingNode))
            elif isinstance(key_node, ScalarNode):
                child = (*path, _key_value(key_node))
                if child not in self.positions:
                    self.positions[child] = _position(key_node.start_mark)
                    self.walk(value_node, child)
        for node in nested:
            self._walk_merged(node, path)


def _key_value(node: ScalarNode) -> str | int:
    if node.tag == "tag:yaml.org,2002:int":
        text = str(node.value)
        return int(text) if text.lstrip("+-").isdigit() else text
    return str(node.value)


def too_large(size: int) -> YamlError:
    return YamlError(
        f"{size} bytes, more than the {MAX_BYTES // (1024 * 1024)} MiB a config may have; "
        "this is not a mesh config"
    )


def _check_characters(text: str) -> None:
    index = forbidden_character(text)
    if index is not None:
        line = text.count("\n", 0, index) + 1
        column = index - (text.rfind("\n", 0, index) + 1) + 1
        raise YamlError(
            f"character U+{ord(text[index]):04X} is not allowed in YAML", Position(line, column)
        )


def read_yaml(text: str, *, keep_going: bool = False) -> YamlDocument:
    """Parse one YAML document, checking it on the way (see the module docstring).

    ``keep_going``: a key given twice is not an error here but one of the document's
    ``duplicates``, so that the caller reports it with every other problem of the file.

    Raises :class:`YamlError`, with a position where there is one.
    """
    if len(text) > MAX_BYTES // 4 and len(text.encode("utf-8", "surrogatepass")) > MAX_BYTES:
        raise too_large(len(text.encode("utf-8", "surrogatepass")))
    _check_characters(text)
    try:
        _check_depth(text)
        loader = Loader(text)
        try:
            node = loader.get_single_node()
            if node is None:
                return YamlDocument(None, {}, False)
            walker = _Walker(keep_going=keep_going)
            walker.measure(node)
            walker.positions[()] = _position(node.start_mark)
            walker.walk(node, ())
            data = loader.construct_document(node)
        finally:
            loader.dispose()
    except yaml.YAMLError as error:
        raise _syntax_error(error) from None
    duplicates = tuple(walker.duplicates)
    return YamlDocument(data, walker.positions, walker.has_interpolation, duplicates)


def parse_value(text: str) -> Any:
    """Read one value the way a file would (``4`` is an int, ``[pp, tp]`` a list)."""
    return read_yaml(text).data


def decode(raw: bytes) -> str:
    """Decode UTF-8 (with or without a BOM), naming the first bad byte."""
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as error:
        line = raw[: error.start].count(b"\n") + 1
        column = error.start - (raw.rfind(b"\n", 0, error.start) + 1) + 1
        raise YamlError("not UTF-8 text", Position(line, column)) from None
