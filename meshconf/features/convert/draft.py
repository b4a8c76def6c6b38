"""What every converter shares: the problems it reports, the conversion it returns, the
draft it builds, and the check of the result with meshconf's own rules."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from meshconf.core.degrees import AUTO, DEGREES
from meshconf.core.errors import ConfigError, KeyPath, MeshconfError, describe_value
from meshconf.core.messages import did_you_mean
from meshconf.model.config import MeshConfig
from meshconf.model.training import TrainingOptions
from meshconf.sources.loading import load_config

#: Every tool defaults every degree to what meshconf does, so a key left out of the source
#: and a degree left out of the config mean the same.
DEFAULT_DEGREES = {degree.name: degree.default for degree in DEGREES}

_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")
_INTEGER_TEXT = re.compile(r"[-+]?[0-9]+")


def toml_key(key: str) -> str:
    """A key as TOML writes it: bare when it can be, quoted otherwise."""
    if _BARE_KEY.fullmatch(key):
        return key
    escaped = key.replace("\\", "\\\\").replace('"', '\\"')
    return f'"{escaped}"'


@dataclass(frozen=True)
class SourceProblem:
    """A problem with one key of the source table, or with the table itself (``key`` None).

    A source read as text rather than as a TOML table (Megatron's arguments) has no table:
    its problems carry the key as written and, when known, its 1-based line and column.
    """

    table: str
    key: str | None
    message: str
    position: tuple[int, int] | None = None

    @property
    def where(self) -> str:
        if not self.table:
            return self.key or ""
        table = f"[{self.table}]"
        return table if self.key is None else f"{table}.{toml_key(self.key)}"

    def render(self, path: str) -> str:
        """``PATH:LINE:COLUMN: key: message``, or ``PATH: [table].key: message``."""
        where = path if self.position is None else f"{path}:{self.position[0]}:{self.position[1]}"
        if not self.table and self.key is None:
            return f"{where}: {self.message}"
        return f"{where}: {self.where}: {self.message}"


class ConversionError(MeshconfError):
    """The source table cannot be converted; ``problems`` holds one entry per problem."""

    def __init__(self, problems: Sequence[SourceProblem]) -> None:
        self.problems = tuple(problems)
        super().__init__("\n".join(f"{p.where}: {p.message}" for p in self.problems))


@dataclass(frozen=True)
class Conversion:
    """A converted, validated config, and what the reader of it needs to know."""

    source: str
    table: str
    #: The meshconf config, keys in the order they are to be written.
    data: dict[str, Any]
    #: Short remarks on values that changed, by dotted key (``degrees.dp_shard``).
    comments: dict[str, str]
    #: One paragraph per semantic difference between the tool and meshconf.
    notes: tuple[str, ...]
    #: The source's other tables that settings were read from.
    other_tables: tuple[str, ...] = ()


@dataclass
class Draft:
    """A conversion under way."""

    table: str
    world_size: int | None
    gpus_per_node: int | None
    #: The table's keys in file order, to report problems in that order.
    key_order: tuple[str, ...] = ()
    #: The degrees the table set, by meshconf name, as converted.
    degrees: dict[str, int] = field(default_factory=dict)
    runtime: dict[str, int | str] = field(default_factory=dict)
    training: dict[str, int | str] = field(default_factory=dict)
    comments: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    #: The source key of each meshconf key, to place meshconf's problems.
    origins: dict[KeyPath, str] = field(default_factory=dict)
    problems: list[SourceProblem] = field(default_factory=list)
    #: The rank order, when the source sets one other than meshconf's default.
    order: tuple[str, ...] | None = None
    #: The domains, when the defaults cannot express the source's groups.
    domains: dict[str, tuple[str, ...]] | None = None
    #: Where each source key was written, for sources read as text.
    positions: dict[str, tuple[int, int]] = field(default_factory=dict)
    #: The whole TOML document, for the settings a source keeps in its other tables; None
    #: when only the source's table was given.
    document: Mapping[str, Any] | None = None
    #: The other tables of ``document`` that settings were read from.
    other_tables: list[str] = field(default_factory=list)

    def fail(self, key: str | None, message: str, table: str | None = None) -> None:
        """A problem with ``key`` of the source's table, or of another ``table``."""
        position = None if key is None or table is not None else self.positions.get(key)
        self.problems.append(SourceProblem(table or self.table, key, message, position))

    def check(self) -> None:
        if self.problems:
            order = {key: index for index, key in enumerate(self.key_order)}
            # The table's own problems (key None) come first, then the keys in file order.
            raise ConversionError(
                sorted(
                    self.problems,
                    key=lambda problem: (
                        problem.position or (0, 0),
                        order.get(problem.key or "", -1),
                    ),
                )
            )

    def config_data(self, degrees: Mapping[str, int]) -> dict[str, Any]:
        data: dict[str, Any] = {}
        if self.world_size is not None:
            data["world_size"] = self.world_size
        if self.gpus_per_node is not None:
            data["gpus_per_node"] = self.gpus_per_node
        if self.order is not None:
            data["order"] = list(self.order)
        data["degrees"] = dict(degrees)
        if self.domains is not None:
            data["domains"] = {name: list(dims) for name, dims in self.domains.items()}
        if self.runtime:
            data["runtime"] = dict(self.runtime)
        if self.training:
            # in the block's own order, whatever order the source gave them in
            data["training"] = {
                key: self.training[key]
                for key in TrainingOptions.model_fields
                if key in self.training
            }
        return data

    def train(self, key: str, value: int | str, source_key: str) -> None:
        """``training.KEY``, its problems placed at ``source_key``."""
        self.training[key] = value
        self.origins[("training", key)] = source_key

    def conversion(self, source: str, notes: Sequence[str]) -> Conversion:
        """The validated draft as written out: every degree, the defaults included."""
        return Conversion(
            source=source,
            table=self.table,
            data=self.config_data(DEFAULT_DEGREES | self.degrees),
            comments=self.comments,
            notes=tuple(notes),
            other_tables=tuple(self.other_tables),
        )


def unknown_keys(
    draft: Draft, table: Mapping[str, Any], known: Sequence[str], what: str, listed: str = ""
) -> None:
    """A key that is not ``known`` is a problem: not ``what``, a close match, ``listed``."""
    for key in table:
        if key not in known:
            draft.fail(key, f"not {what}{did_you_mean(key, list(known))}{listed}")


def integer_problem(value: Any, *, auto: bool, hint: str = "") -> str | None:
    """Why ``value`` is not a degree (an integer >= 1, or -1 where ``auto``), if it is not;
    ``hint`` follows a -1 that is not allowed."""
    expected = "an integer >= 1" + (" or -1 (fill the remaining ranks)" if auto else "")
    if isinstance(value, bool) or not isinstance(value, int):
        quoted = isinstance(value, str) and _INTEGER_TEXT.fullmatch(value.strip())
        unquote = " (a quoted number is a string; write the integer unquoted)" if quoted else ""
        return f"expected {expected}, got {describe_value(value)}{unquote}"
    if value < 1 and not (auto and value == AUTO):
        return f"expected {expected}, got {value}{hint if value == AUTO else ''}"
    return None


def boolean_problem(value: Any) -> str | None:
    """Why ``value`` is not a switch (true or false), if it is not."""
    return (
        None if isinstance(value, bool) else f"expected true or false, got {describe_value(value)}"
    )


def integers(draft: Draft, table: Mapping[str, Any], keys: Mapping[str, str]) -> dict[str, int]:
    """The degrees among ``keys`` (source key -> meshconf name) that the table sets, by
    meshconf name; a bad value is a problem on its key. Only ``dp_shard`` may be -1 in
    either tool."""
    found: dict[str, int] = {}
    auto_key = next(key for key, name in keys.items() if name == "dp_shard")
    hint = f": only {auto_key} may be -1"
    for key, name in keys.items():
        if key not in table:
            continue
        problem = integer_problem(table[key], auto=name == "dp_shard", hint=hint)
        if problem is None:
            found[name] = table[key]
        else:
            draft.fail(key, problem)
    return found


def validate(draft: Draft) -> MeshConfig:
    """Validate what the table set (the defaults are the same in both), so that meshconf
    places a problem on a key the table has."""
    try:
        return load_config(draft.config_data(draft.degrees))
    except ConfigError as error:
        problems = []
        for diagnostic in error.diagnostics:
            key = draft.origins.get(diagnostic.path)
            text = diagnostic.message if key is not None else diagnostic.render()
            position = None if key is None else draft.positions.get(key)
            problems.append(SourceProblem(draft.table, key, text, position))
        raise ConversionError(problems) from None


def world_size_note(tool: str, draft: Draft, config: MeshConfig, where: str = "the TOML") -> str:
    where = f"world_size is not in {where}: {tool} takes it from the launcher."
    if draft.world_size is not None:
        return (
            f"{where} {draft.world_size} comes from --world-size; at start-up meshconf checks "
            "that the launcher's world size agrees."
        )
    if config.resolved_world_size is not None:
        return (
            f"{where} With no degree at -1, meshconf takes the product of the degrees, "
            f"{config.resolved_world_size}, and checks at start-up that the launcher's world "
            "size agrees."
        )
    return (
        f"{where} So does this config: meshconf fills the -1 degree from the launcher's world "
        "size at start-up. `meshconf validate FILE --world-size N` runs the checks that wait "
        "for it."
    )
