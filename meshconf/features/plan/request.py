"""What a plan is asked for, and the checks a request passes before any assignment is
listed: ranges, the order, pins that fit the world, and a bounded number of assignments."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from meshconf.core.degrees import (
    DEGREES,
    EXPERT_DEGREES,
    MAX_WORLD_SIZE,
    WORLD_FACTORS,
    prime_factors,
)
from meshconf.core.errors import MeshconfError
from meshconf.core.levels import NODE, Level
from meshconf.core.messages import spoken_list
from meshconf.features.plan.estimate.architecture import Architecture
from meshconf.features.plan.estimate.step_inputs import Training
from meshconf.model.analysis import Analysis, MeshSpec
from meshconf.model.fields import MAX_GPUS_PER_NODE
from meshconf.model.level_rules import check_levels
from meshconf.model.numbering import check_order

#: A plan ranks at most this many assignments; past it, a degree must be pinned.
MAX_ASSIGNMENTS = 1_000_000
#: With a model, each assignment is estimated (about 0.6 ms each, docs/plan.md "Speed"): at
#: most this many, so that a plan takes a few seconds at most.
MAX_ESTIMATED_ASSIGNMENTS = 5_000
#: With ``inside``, each assignment is numbered and checked as a whole config (about 2.5 ms
#: each): at most this many.
MAX_INSIDE_ASSIGNMENTS = 2_000


class PlanError(MeshconfError, ValueError):
    """A request that cannot be planned: no world size, pins that no assignment satisfies,
    or values out of range; the message says which."""


@dataclass(frozen=True)
class Request:
    """What the user asked for: a world, optionally nodes, the pinned degrees, and the rank
    order of the world factors (outer to inner; ``None`` for the default)."""

    world_size: int
    gpus_per_node: int | None = None
    pins: Mapping[str, int] = field(default_factory=dict)
    model: Architecture | None = None
    training: Training = field(default_factory=Training)
    order: tuple[str, ...] | None = None
    #: The levels above the node, inner to outer (``--level``).
    levels: tuple[Level, ...] = ()
    #: The bandwidth inside a node, GB/s per GPU, where the node level gives one.
    node_bandwidth_gb_s: float | None = None
    #: The dims every row keeps inside each level, as a config's ``inside``.
    inside: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    #: Where each pin came from, as a message names it (``gb200.yaml:6: degrees.pp 16``);
    #: a pin not in it was given as its option (``--pp 16``).
    pin_origins: Mapping[str, str] = field(default_factory=dict)

    @property
    def topology(self) -> tuple[Level, ...]:
        """The node (when ``gpus_per_node`` is given) and the levels above it."""
        if self.gpus_per_node is None:
            return ()
        return (Level(NODE, self.gpus_per_node, self.node_bandwidth_gb_s), *self.levels)

    @property
    def rank_order(self) -> tuple[str, ...]:
        return WORLD_FACTORS if self.order is None else self.order

    @property
    def experts(self) -> bool:
        """Whether the model has experts: only then are ep, etp and efsdp ranked."""
        if self.model is not None and self.model.experts is not None:
            return True
        return any(name in self.pins for name in EXPERT_DEGREES)


def node_warning(request: Request) -> str | None:
    """A note when the nodes do not tile the world; the plan is still made."""
    gpus = request.gpus_per_node
    if gpus is None or request.world_size % gpus == 0:
        return None
    if gpus > request.world_size:
        return (
            f"--gpus-per-node {gpus} is more than --world-size {request.world_size}: all ranks "
            "are in one node, so no group crosses nodes"
        )
    return (
        f"--world-size {request.world_size} is not a multiple of --gpus-per-node {gpus}: "
        f"the last node holds {request.world_size % gpus} ranks"
    )


def check_request(request: Request) -> None:
    """Raises :class:`PlanError`, naming the first check the request fails."""
    _check_ranges(request)
    _check_levels(request)
    _check_inside(request)
    _check_order(request)
    _check_pins_fit(request)
    _check_count(request)


def rule_inputs(degrees: dict[str, int], order: tuple[str, ...] | None = None) -> MeshSpec:
    """The inputs of the degree and order rules, with none of a config's other keys."""
    return MeshSpec(degrees=degrees, explicit_degrees=frozenset(degrees), order=order)


def level_text(level: Level) -> str:
    """A level as ``--level`` takes it: ``nvlink=72`` or ``nvlink=72@900``."""
    bandwidth = "" if level.bandwidth_gb_s is None else f"@{level.bandwidth_gb_s:g}"
    return f"{level.name}={level.size}{bandwidth}"


def _check_levels(request: Request) -> None:
    """Levels hold whole nodes, and whole units of the level below: a config's rule."""
    if not request.levels:
        return
    if request.gpus_per_node is None:
        raise PlanError(
            f"--level {level_text(request.levels[0])} needs the node's size: add --level "
            "node=N (or --gpus-per-node N); a level holds whole nodes"
        )
    spec = MeshSpec(gpus_per_node=request.gpus_per_node, levels=request.levels)
    result = Analysis()
    check_levels(spec, result)
    if result.problems:
        problem = result.problems[0]
        index = problem.path[1] if problem.path[0] == "levels" else 0
        assert isinstance(index, int)
        raise PlanError(f"--level {level_text(request.levels[index])}: {problem.message}")


def _check_inside(request: Request) -> None:
    """``inside`` names levels of the request; its dims are checked with each row."""
    names = [level.name for level in request.topology]
    for level in request.inside:
        if level not in names:
            raise PlanError(
                f"inside.{level}: the plan has no level {level!r} (levels: "
                f"{', '.join(names) or 'none'}); add --level {level}=SIZE, or leave "
                f"{level} out of inside"
            )


def _check_order(request: Request) -> None:
    """The order names every world factor once: the rule a config's ``order`` follows."""
    if request.order is None:
        return
    spec = MeshSpec(order=request.order)
    result = Analysis()
    check_order(spec, result)
    if result.problems:
        raise PlanError(f"--order: {result.problems[0].message}")


def _check_ranges(request: Request) -> None:
    if request.world_size > MAX_WORLD_SIZE:
        raise PlanError(
            f"--world-size {request.world_size} is more ranks than torch can number "
            f"({MAX_WORLD_SIZE})"
        )
    gpus = request.gpus_per_node
    if gpus is not None and gpus > MAX_GPUS_PER_NODE:
        raise PlanError(
            f"--gpus-per-node {gpus} is more than any node holds (at most {MAX_GPUS_PER_NODE})"
        )


def option_flag(name: str) -> str:
    """The command-line option of a request field: ``dp_replicate`` -> ``--dp-replicate``."""
    return "--" + name.replace("_", "-")


def pin_text(request: Request, name: str) -> str:
    """Where a pin came from: its config key with the file and line, or its option."""
    origin = request.pin_origins.get(name)
    return f"{option_flag(name)} {request.pins[name]}" if origin is None else origin


def pins_text(request: Request, names: tuple[str, ...]) -> str:
    """The pins among ``names``, each where it came from (:func:`pin_text`)."""
    pinned = [pin_text(request, name) for name in names if name in request.pins]
    return " ".join(pinned) if not request.pin_origins else spoken_list(pinned)


def _check_pins_fit(request: Request) -> None:
    """Pinned world factors must divide the world, together; etp must be 1 or a pinned tp."""
    world = request.world_size
    pinned = tuple(name for name in WORLD_FACTORS if name in request.pins)
    for name in pinned:
        if world % request.pins[name]:
            raise PlanError(f"{pin_text(request, name)} does not divide --world-size {world}")
    product = math.prod(request.pins[name] for name in pinned)
    written = " * ".join(f"{name}({request.pins[name]})" for name in pinned)
    if world % product:
        raise PlanError(
            f"{pins_text(request, pinned)} do not fit --world-size {world}: "
            f"{written} = {product} does not divide {world}"
        )
    if len(pinned) == len(WORLD_FACTORS) and product != world:
        raise PlanError(
            f"{pins_text(request, pinned)} do not fit --world-size {world}: {written} = "
            f"{product} != {world}, and no degree is left free to take the rest"
        )
    etp = request.pins.get("etp", 1)
    if "tp" in request.pins and etp not in (1, request.pins["tp"]):
        raise PlanError(
            f"{pins_text(request, ('tp', 'etp'))} conflict: etp({etp}) must be 1 or "
            f"equal to tp({request.pins['tp']})"
        )


def assignment_count(request: Request) -> int:
    """How many tuples of world factors multiply to the world and keep the world-factor pins
    (before the expert rules), from the prime factorization: each prime's exponent is shared
    among the free factors in C(e + k - 1, k - 1) ways."""
    rest = request.world_size // math.prod(
        request.pins[name] for name in WORLD_FACTORS if name in request.pins
    )
    free = sum(1 for name in WORLD_FACTORS if name not in request.pins)
    if free == 0:
        return 1 if rest == 1 else 0
    return math.prod(
        math.comb(exponent + free - 1, free - 1) for exponent in prime_factors(rest).values()
    )


def _check_count(request: Request) -> None:
    count = assignment_count(request)
    if request.inside and count > MAX_INSIDE_ASSIGNMENTS:
        raise PlanError(
            f"--world-size {request.world_size} with inside has {count} assignments to number "
            f"and check, more than the {MAX_INSIDE_ASSIGNMENTS} a plan checks; pin a degree "
            "(such as --tp 8) to narrow them"
        )
    if count > MAX_ASSIGNMENTS:
        raise PlanError(
            f"--world-size {request.world_size} splits into {count} assignments of "
            f"{spoken_list(WORLD_FACTORS)}, more than the {MAX_ASSIGNMENTS} a plan ranks; "
            "pin a degree (such as --tp 8) to narrow them"
        )
    if request.model is None:
        return
    # a degree planned only when pinned stays 1 otherwise, so only those are estimated
    unplanned = {degree.name: 1 for degree in DEGREES if degree.planned_when_pinned}
    estimated = assignment_count(replace(request, pins=unplanned | dict(request.pins)))
    if estimated > MAX_ESTIMATED_ASSIGNMENTS:
        raise PlanError(
            f"--world-size {request.world_size} with a model has {estimated} assignments to "
            f"estimate, more than the {MAX_ESTIMATED_ASSIGNMENTS} a plan estimates; pin a degree "
            "(such as --tp 8) to narrow them"
        )
