"""What the rules read and what they find, as plain values: the inputs of the rules
(:class:`MeshSpec`) and their findings (:class:`Analysis`), shared by :mod:`.rules` and
:mod:`.numbering`."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from meshconf.core.degrees import WORLD_FACTORS
from meshconf.core.errors import MAX_PROBLEMS, KeyPath, Problem
from meshconf.core.hierarchy import Band, NodePart
from meshconf.core.layout import DomainLayout
from meshconf.core.levels import Level, all_levels


@dataclass(frozen=True)
class MeshSpec:
    """The inputs of the rules, as plain values; by default, those of no config's keys."""

    world_size: int | None = None
    gpus_per_node: int | None = None
    inside_node: Mapping[str, int] | None = None
    degrees: Mapping[str, int] = field(default_factory=dict)
    explicit_degrees: frozenset[str] = frozenset()
    derived: Mapping[str, str] = field(default_factory=dict)
    user_derived: frozenset[str] = frozenset()
    domains: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    user_domains: bool = False
    order: tuple[str, ...] | None = None
    #: The levels above the node, inner to outer (the node itself when gpus_per_node is None).
    levels: tuple[Level, ...] = ()
    #: The dims each level keeps inside its units, by level name.
    inside: Mapping[str, tuple[str, ...]] | None = None

    @property
    def topology(self) -> tuple[Level, ...]:
        """Every level inner to outer, the node of gpus_per_node first when it is given."""
        return all_levels(self.gpus_per_node, self.levels)


@dataclass
class Analysis:
    """What the rules found, and the values they computed on the way."""

    world_size: int | None = None
    world_size_from_degrees: bool = False
    degrees: dict[str, int] | None = None
    sizes: dict[str, int] = field(default_factory=dict)
    layouts: dict[str, DomainLayout] = field(default_factory=dict)
    #: The parts of the world factors that inside_node or inside place, when either does.
    node_parts: tuple[NodePart, ...] | None = None
    #: The bands of that numbering, inner to outer (:func:`meshconf.core.levels.band_numbering`).
    bands: tuple[Band, ...] | None = None
    #: The rank order of the world factors; None while the one given is not valid.
    order: tuple[str, ...] | None = WORLD_FACTORS
    problems: list[Problem] = field(default_factory=list)
    pending: list[str] = field(default_factory=list)
    waiting_for_world: bool = False

    def fail(self, path: KeyPath, message: str) -> None:
        self.problems.append(Problem(path, message))

    @property
    def brief(self) -> bool:
        """Past the problems a config reports (only counted), messages skip costly hints."""
        return len(self.problems) >= MAX_PROBLEMS

    def wait(self, check: str) -> None:
        """Note a check that cannot run until the world size is known."""
        if self.waiting_for_world:
            self.pending.append(check)
