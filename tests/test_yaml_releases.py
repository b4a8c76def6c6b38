"""meshconf's own YAML messages hold whichever PyYAML reads the file.

PyYAML's releases differ: libyaml in 6.0.4 stops flow nesting at 1,000 levels while reading
ahead, which 6.0.3 does not, and 6.0.4 changed which of several merged mappings wins. Each
case here is generated and states what a user gets: meshconf's located line for nesting
deeper than 64 levels, the YAML merge spec's result for ``<<``. CI runs this module under
every supported PyYAML release, with libyaml and with the pure-Python parser
(``MESHCONF_TEST_YAML=pure``, see tests/conftest.py), and expects the same lines from each.
"""

from __future__ import annotations

import os
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings, strategies as st

from meshconf import ConfigError, load_config
from meshconf.sources.yaml_reader import MAX_DEPTH, Position, YamlError, read_yaml

GENERATED = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
MODE = os.environ.get("MESHCONF_TEST_YAML", "libyaml")


def test_the_parser_is_the_one_asked_for() -> None:
    # A stage meant for the pure-Python parser must not test libyaml by mistake.
    assert yaml.__with_libyaml__ is (MODE != "pure")


# --- Nesting ------------------------------------------------------------------------------


@dataclass
class Nesting:
    text: str
    depth: int
    #: Where the collection one level deeper than meshconf allows starts.
    first_too_deep: Position | None


class _Text:
    def __init__(self) -> None:
        self.parts: list[str] = []
        self.line, self.column = 1, 1

    def add(self, part: str) -> Position:
        """Append ``part`` and return the position of its first character."""
        here = Position(self.line, self.column)
        self.parts.append(part)
        breaks = part.count("\n")
        self.line += breaks
        self.column = len(part) - part.rfind("\n") if breaks else self.column + len(part)
        return here


#: Text before the nesting: whether it holds keys of the top mapping (which then starts there).
PREFIXES = [
    ("", False),
    ("# a comment\n", False),
    ("world_size: 8\n", True),
    ("note: 'déjà vu, € and 😀'\n", True),
    ("a: 1\nb: [1, 2]\n", True),
]
# Text after the deepest collection: its closers, or a mistake (an unterminated quote, a
# stray closer, a character that cannot start a token) that a parser may meet while reading
# ahead, before it has handed out the events that reach meshconf's limit.
# None of them opens a collection of its own.
ENDINGS = ["close", "'open quote", '"open quote', "]}]}", "@", "`x", "x, y", "", "&a *a"]


@st.composite
def nestings(draw: st.DrawFn) -> Nesting:
    """The value of a top-level key nested ``depth`` levels deep in all (counting the top
    mapping): block mappings and lists first, then flow lists and mappings."""
    depth = draw(st.integers(2, 3000) | st.integers(MAX_DEPTH - 2, MAX_DEPTH + 3))
    block_levels = draw(st.integers(1, min(depth, MAX_DEPTH + 8)))
    prefix, has_keys = draw(st.sampled_from(PREFIXES))
    rng = random.Random(draw(st.integers(0, 2**32)))  # the choices of each of up to 3,000 levels
    text = _Text()
    text.add(prefix)
    key = text.add("n:")
    starts = [Position(1, 1) if has_keys else key]
    closers: list[str] = []
    for level in range(1, depth):
        if level < block_levels:
            part = f"k{level}:" if rng.random() < 0.5 else "-"
            text.add("\n" + "  " * level)
            starts.append(text.add(part))
            continue
        if level > block_levels and rng.random() < 0.1:
            # A flow collection broken over lines, indented past every block level.
            text.add("\n" + "  " * (block_levels + 1))
        elif level == block_levels:
            text.add(" ")
        if rng.random() < 0.5:
            starts.append(text.add("["))
            closers.append("]")
        else:
            starts.append(text.add("{"))
            text.add(f"k{level}: ")
            closers.append("}")
    ending = draw(st.sampled_from(ENDINGS))
    if not closers:
        text.add(" x" if ending == "close" else " " + ending)
    elif ending == "close":
        text.add("x" + "".join(reversed(closers)))
    else:
        text.add(ending)
    text.add("\n")
    too_deep = starts[MAX_DEPTH] if depth > MAX_DEPTH else None
    return Nesting("".join(text.parts), depth, too_deep)


@GENERATED
@given(nestings())
def test_nesting_deeper_than_the_limit_gets_meshconfs_line_at_the_first_collection_too_deep(
    case: Nesting,
) -> None:
    if case.first_too_deep is None:
        try:
            read_yaml(case.text)
        except YamlError as error:  # a generated mistake after a shallow nesting
            assert "nested deeper" not in str(error)
        return
    with pytest.raises(YamlError) as caught:
        read_yaml(case.text)
    assert (caught.value.position, str(caught.value)) == (
        case.first_too_deep,
        f"nested deeper than {MAX_DEPTH} levels",
    )


def test_the_nesting_that_pyyaml_6_0_4_stopped_first_gets_meshconfs_line(tmp_path: Path) -> None:
    path = tmp_path / "deep.yaml"
    path.write_text("a: " + "[" * 100_000 + "]" * 100_000 + "\n")
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    assert [d.render() for d in caught.value.diagnostics] == [
        f"{path}:1:67: nested deeper than 64 levels"
    ]


def test_nesting_up_to_the_limit_is_read() -> None:
    text = "a: " + "[" * (MAX_DEPTH - 1) + "x" + "]" * (MAX_DEPTH - 1) + "\n"
    data: Any = read_yaml(text).data["a"]
    for _ in range(MAX_DEPTH - 2):
        data = data[0]
    assert data == ["x"]


# --- Merge keys ---------------------------------------------------------------------------

KEYS = ["pp", "tp", "cp", "ep"]


@dataclass
class Merge:
    text: str
    expected: dict[str, int]
    #: Line of the key each merged value comes from.
    lines: dict[str, int]


@st.composite
def merges(draw: st.DrawFn) -> Merge:
    """Anchored mappings, some merging earlier ones, and a target that merges a list of them
    and sets keys of its own; the expected result is the YAML merge spec's, written out here:
    the target's own keys win, then the first mapping listed, and so on."""
    count = draw(st.integers(1, 5))
    lines: list[str] = []
    anchors: list[tuple[dict[str, int], dict[str, int]]] = []  # (values, lines) per anchor
    for index in range(count):
        values: dict[str, int] = {}
        where: dict[str, int] = {}
        merged = draw(st.lists(st.integers(0, index - 1), max_size=2)) if index else []
        lines.append(f"m{index}: &m{index}")
        if merged:
            lines.append("  <<: [" + ", ".join(f"*m{i}" for i in merged) + "]")
        own = draw(st.dictionaries(st.sampled_from(KEYS), st.integers(1, 64), min_size=1))
        for key, value in own.items():
            lines.append(f"  {key}: {value}")
            values[key], where[key] = value, len(lines)
        for source in merged:
            for key, value in anchors[source][0].items():
                if key not in values:
                    values[key], where[key] = value, anchors[source][1][key]
        anchors.append((values, where))
    listed = draw(st.lists(st.integers(0, count - 1), min_size=1, max_size=4))
    lines.append("target:")
    lines.append("  <<: " + ("[" + ", ".join(f"*m{i}" for i in listed) + "]"))
    expected: dict[str, int] = {}
    expected_lines: dict[str, int] = {}
    for key, value in draw(st.dictionaries(st.sampled_from(KEYS), st.integers(1, 64))).items():
        lines.append(f"  {key}: {value}")
        expected[key], expected_lines[key] = value, len(lines)
    for source in listed:
        for key, value in anchors[source][0].items():
            if key not in expected:
                expected[key], expected_lines[key] = value, anchors[source][1][key]
    return Merge("\n".join(lines) + "\n", expected, expected_lines)


@pytest.mark.slow  # a long generated sweep: the quick loop leaves it out
@GENERATED
@given(merges())
def test_merge_keys_follow_the_merge_spec(case: Merge) -> None:
    document = read_yaml(case.text)
    assert document.data["target"] == case.expected
    assert {key: document.positions[("target", key)].line for key in case.expected} == case.lines


def test_the_first_mapping_listed_wins_where_pyyaml_6_0_4_takes_the_last(tmp_path: Path) -> None:
    path = tmp_path / "merge.yaml"
    path.write_text(
        "small: &small {tp: 2}\nlarge: &large {tp: 4}\n"
        "parallelism:\n  world_size: 8\n  degrees:\n    <<: [*small, *large]\n"
    )
    config = load_config(path, key="parallelism")
    assert config.resolved_degrees["tp"] == 2


def test_a_second_merge_key_is_a_duplicate(tmp_path: Path) -> None:
    path = tmp_path / "merge.yaml"
    path.write_text(
        "a: &a {tp: 2}\nb: &b {tp: 4}\nmesh:\n  world_size: 8\n  degrees:\n    <<: *a\n    <<: *b\n"
    )
    with pytest.raises(ConfigError) as caught:
        load_config(path, key="mesh")
    assert [d.render() for d in caught.value.diagnostics] == [
        f"{path}:7:5: mesh.degrees: a second merge key (first given at line 6); list every "
        "mapping to merge after one <<, as in <<: [*a, *b]"
    ]


@pytest.mark.parametrize(("value", "column"), [("3", 7), ("[*a, 3]", 12), ("[[1]]", 8)])
def test_a_merge_of_something_else_than_mappings_is_refused(value: str, column: int) -> None:
    with pytest.raises(YamlError) as caught:
        read_yaml(f"a: &a {{tp: 2}}\nb:\n  <<: {value}\n")
    assert (caught.value.position, str(caught.value)) == (
        Position(3, column),
        "a merge key (<<) takes a mapping or a list of mappings",
    )
