"""A tool's settings as its own parser reads them, each kept with where it was written: ``--name
value`` words of a command line, YAML with positions, and integers as an argument parser
reads them; shared by the readers of Megatron-LM's and accelerate's settings.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from meshconf.core.degrees import MAX_WORLD_SIZE
from meshconf.core.errors import describe_value
from meshconf.core.messages import shorten
from meshconf.features.convert.draft import ConversionError, Draft, integer_problem
from meshconf.features.convert.shell_words import Word, source_error, unexpanded
from meshconf.sources.yaml_reader import YamlDocument, YamlError, read_yaml

#: A size as an argument parser reads it: ASCII digits, with an optional plus.
_DIGITS = re.compile(r"\+?([0-9]+)")
#: Suffixes of the files read as YAML (JSON is YAML), not as a script or command line.
YAML_SUFFIXES = (".yaml", ".yml", ".json")
#: A training script's word, where a launcher's own options end.
PYTHON_SCRIPT = re.compile(r".*\.py$")


@dataclass(frozen=True)
class Setting:
    """One setting: its canonical name, the key as written, its value and its position."""

    name: str
    key: str
    value: Any
    position: tuple[int, int] | None


def settings_draft(
    settings: Mapping[str, Setting], world_size: int | None, gpus_per_node: int | None
) -> Draft:
    """A draft of settings read as text, which have no table: a problem with a setting is
    placed where it was written."""
    positions = {s.key: s.position for s in settings.values() if s.position is not None}
    return Draft("", world_size, gpus_per_node, positions=positions)


def destination(flag: str) -> str:
    """The name argparse stores an option under, and NeMo's YAML writes: ``--tp-size`` is
    ``tp_size``."""
    return flag[2:].replace("-", "_")


def option(name: str) -> str:
    """The option argparse stores under ``name``: ``tp_size`` is ``--tp-size``."""
    return f"--{name.replace('_', '-')}"


def settings_from_words(
    words: list[Word],
    valued: tuple[str, ...],
    switches: tuple[str, ...],
    *,
    tool: str,
    name_of: Callable[[str], str] = destination,
    listed: tuple[str, ...] = (),
) -> dict[str, Setting]:
    """``--name value``, ``--name=value`` and switches among ``words``, each named by
    ``name_of(flag)``; the last one wins, as with ``tool``'s argument parser (argparse's),
    which refuses a value given to a switch (``store_true``). An option of ``listed`` takes
    every word up to the next option, none or more, as argparse's ``nargs='*'`` does: its
    value is their tuple.

    Raises :class:`ConversionError` when a switch is given a value or an option lacks one.
    """
    found: dict[str, Setting] = {}
    index = 0
    while index < len(words):
        word = words[index]
        index += 1
        if not word.text.startswith("--"):
            continue
        flag, equals, inline = word.text.partition("=")
        name = name_of(flag)
        at = (word.line, word.column)
        if name in switches:
            if equals:
                raise source_error(
                    flag,
                    f"is a switch and takes no value, as {tool}'s parser refuses "
                    f"{shorten(word.text)!r}: give {flag} to turn it on, leave it out to keep it "
                    "off",
                    at,
                )
            found[name] = Setting(name, flag, True, at)
        elif equals and (name in listed or name in valued):
            given = (inline,) if name in listed else inline
            found[name] = Setting(name, flag, given, (word.line, word.column + len(flag) + 1))
        elif name in listed:
            start = index
            while index < len(words) and not words[index].text.startswith("--"):
                index += 1
            values = tuple(value.text for value in words[start:index])
            found[name] = Setting(name, flag, values, at)
        elif name in valued:
            if index >= len(words) or words[index].text.startswith("--"):
                raise source_error(flag, "needs a value", at)
            value = words[index]
            index += 1
            found[name] = Setting(name, flag, value.text, (value.line, value.column))
    return found


@functools.lru_cache(maxsize=1)
def _parsed(text: str) -> YamlDocument | YamlError:
    """``text`` read as YAML, or why it cannot be: a file given without ``--from`` is read
    by every source that might recognise it, and then converted, from one parse."""
    try:
        return read_yaml(text)
    except YamlError as error:
        return error


def yaml_document(text: str, what: str | None = None) -> YamlDocument:
    """``text`` read as YAML, with its positions; when ``what`` names it, a mapping.

    Raises :class:`ConversionError` for YAML that cannot be read, at its line and column, or
    that is not ``what``.
    """
    document = _parsed(text)
    if isinstance(document, YamlError):
        at = document.position
        position = None if at is None else (at.line, at.column)
        raise source_error(None, f"invalid YAML: {document.message}", position)
    if what is not None and not isinstance(document.data, Mapping):
        got = describe_value(document.data)
        raise source_error(None, f"expected {what}, a mapping, got {got}", (1, 1))
    return document


def located(document: YamlDocument, path: tuple[str | int, ...]) -> tuple[int, int] | None:
    """The line and column of the key at ``path``."""
    at = document.positions.get(path)
    return None if at is None else (at.line, at.column)


def nothing_found(what: str, expected: str) -> ConversionError:
    return source_error(None, f"no {what} found: expected {expected}", None)


def integer_setting(draft: Draft, setting: Setting) -> int | None:
    """A setting's integer as an argument parser reads it (Megatron-LM's, accelerate's), or
    None with the problem reported at the setting's key."""
    value = setting.value
    if isinstance(value, str):
        digits = _DIGITS.fullmatch(value.strip())
        if digits is None:
            left = unexpanded(value)
            why = "" if left is None else f": {left}; write the number"
            draft.fail(setting.key, f"expected an integer >= 1, got {describe_value(value)}{why}")
            return None
        if len(digits[1]) > len(str(MAX_WORLD_SIZE)):
            draft.fail(
                setting.key,
                f"an integer of {len(digits[1])} digits is larger than {MAX_WORLD_SIZE}, the "
                "most ranks torch can number",
            )
            return None
        value = int(digits[1])
    problem = integer_problem(value, auto=False)
    if problem is not None:
        draft.fail(setting.key, problem)
        return None
    return int(value)
