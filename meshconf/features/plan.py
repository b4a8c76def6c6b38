"""Plan degree assignments for a world size: enumerate, check, rank.

``meshconf plan`` lists every assignment of the world factors (``pp``, ``dp_replicate``,
``dp_shard``, ``cp``, ``tp``) whose product is the world size, under the degrees the user
pins (``cp`` stays 1 unless pinned). Without a model it ranks them so that the dims with the
most traffic keep their groups inside a node; with one, layouts that fit in memory come
first, by estimated step time (``meshconf.features.estimate``), node locality breaking ties.
This module is the pure logic: no torch, no command line, no I/O.

Speed: a highly composite world has many assignments (65,536 = 2**16 has 969 with cp 1), so
the ranking never builds a config per assignment: :class:`NodeLocality` answers locality
from ``(size, stride)`` pairs. Only the rows that are shown or emitted are built as
:class:`MeshConfig` and so checked by every rule of meshconf.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

from meshconf.core.degrees import EXPERT_DEGREES, MAX_WORLD_SIZE, WORLD_FACTORS, divisors
from meshconf.core.errors import MeshconfError, Problem
from meshconf.features.estimate.architecture import Architecture
from meshconf.features.estimate.step import Estimate, estimate
from meshconf.features.estimate.training import Parallelism, Training
from meshconf.features.locality import EXPERT_DIMS, RANKED_DIMS, NodeLocality, home_domain
from meshconf.model.config import MeshConfig
from meshconf.model.fields import MAX_GPUS_PER_NODE
from meshconf.model.rules import Analysis, MeshSpec, check_etp, check_expert_borrow

#: An assignment of the world factors, in WORLD_FACTORS order (pp outermost).
Factors = tuple[int, int, int, int, int]


#: A plan ranks at most this many assignments; past it, a degree must be pinned.
MAX_ASSIGNMENTS = 1_000_000


class PlanError(MeshconfError, ValueError):
    """Pins that no assignment satisfies, or values out of range; the message says which."""


@dataclass(frozen=True)
class Request:
    """What the user asked for: a world, optionally nodes, and the pinned degrees."""

    world_size: int
    gpus_per_node: int | None = None
    pins: Mapping[str, int] = field(default_factory=dict)
    model: Architecture | None = None
    training: Training = field(default_factory=Training)

    @property
    def experts(self) -> bool:
        """Whether the model has experts: only then are ep, etp and efsdp ranked."""
        if self.model is not None and self.model.experts is not None:
            return True
        return any(name in self.pins for name in EXPERT_DEGREES)

    @property
    def ep(self) -> int:
        return self.pins.get("ep", 1)

    @property
    def etp(self) -> int:
        return self.pins.get("etp", 1)


@dataclass(frozen=True)
class Assignment:
    """One valid assignment: every degree, the key it was ranked by (smaller first), and
    with a model its estimate."""

    degrees: Mapping[str, int]
    key: tuple[float, ...]
    estimate: Estimate | None = None


@dataclass(frozen=True)
class Plan:
    """The best assignments, best first, and how many valid assignments exist in all."""

    request: Request
    total: int
    best: tuple[Assignment, ...]
    fitting: int | None = None


@dataclass(frozen=True)
class DimLocality:
    """One dim of a row's rationale: its group size and whether its groups cross nodes."""

    name: str
    size: int
    crosses_nodes: bool | None


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


def make_plan(request: Request, count: int) -> Plan:
    """The ``count`` best assignments under ``request``, and the number of valid ones.

    Raises :class:`PlanError` when the pins or ranges admit no assignment."""
    _check_ranges(request)
    _check_pins_fit(request)
    _check_count(request)
    locality = NodeLocality(request.world_size, request.gpus_per_node, request.experts)
    valid = _Counter(_valid(request))
    if request.model is None:
        # plain tuples compare fastest; keys end with every degree, so they never tie
        ranked = ((_locality_key(request, locality, degrees), degrees) for degrees in valid)
        best = [_Ranked(key, degrees) for key, degrees in heapq.nsmallest(count, ranked)]
        fitting = None
    else:
        estimated = [_estimated(request, locality, degrees) for degrees in valid]
        best = heapq.nsmallest(count, estimated)
        fitting = sum(1 for row in estimated if row.estimate is not None and row.estimate.fits)
    if valid.seen == 0:
        raise PlanError(_no_assignment_message(request))
    assignments = tuple(Assignment(row.degrees, row.key, row.estimate) for row in best)
    return Plan(request, valid.seen, assignments, fitting)


@dataclass(frozen=True, order=True)
class _Ranked:
    key: tuple[float, ...]
    degrees: dict[str, int] = field(compare=False)
    estimate: Estimate | None = field(default=None, compare=False)


def _locality_key(
    request: Request, locality: NodeLocality, degrees: Mapping[str, int]
) -> tuple[float, ...]:
    """Without a model: a model that needs tensor parallelism rarely fits in a replica, so
    with ``--tp`` > 1 a layout of replicas alone (no FSDP shards) comes after the others."""
    needs_tp = request.pins.get("tp", 1) > 1
    replicas_only = needs_tp and degrees["dp_replicate"] > 1 and degrees["dp_shard"] == 1
    return (int(replicas_only), *locality.key(degrees))


def _estimated(request: Request, locality: NodeLocality, degrees: dict[str, int]) -> _Ranked:
    """With a model: layouts that fit first, then those that reach the global batch without
    overshooting it, then by step time, then by node locality."""
    assert request.model is not None
    crosses = locality.crosses(degrees)
    found = estimate(request.model, Parallelism.of(degrees), request.training, crosses)
    wanted = request.training.global_batch_tokens
    overshoot = wanted is not None and found.batch_tokens > wanted
    key = (int(not found.fits), int(overshoot), found.step_seconds, *locality.key(degrees, crosses))
    return _Ranked(key, degrees, found)


def build_config(request: Request, degrees: Mapping[str, int]) -> MeshConfig:
    """The assignment as a validated config; every rule of meshconf runs on it."""
    return MeshConfig.model_validate(config_data(request, degrees))


def config_data(request: Request, degrees: Mapping[str, int]) -> dict[str, object]:
    """The config of an assignment as plain data: every world factor explicit, ep and etp
    only when pinned (otherwise they keep their default, 1)."""
    data: dict[str, object] = {"world_size": request.world_size}
    if request.gpus_per_node is not None:
        data["gpus_per_node"] = request.gpus_per_node
    names = WORLD_FACTORS + tuple(name for name in EXPERT_DEGREES if name in request.pins)
    data["degrees"] = {name: degrees[name] for name in names}
    return data


def rationale(request: Request, config: MeshConfig) -> list[DimLocality]:
    """The shown dims of a validated config, read from its own layouts: size and whether
    their groups cross nodes (``None`` without ``gpus_per_node``)."""
    layouts = config.layouts
    sizes = config.dim_sizes
    shown: list[DimLocality] = []
    for name in RANKED_DIMS:
        if name in EXPERT_DIMS and not request.experts:
            continue
        crosses = (
            None
            if request.gpus_per_node is None
            else layouts[home_domain(name)].crosses_nodes(name, request.gpus_per_node)
        )
        shown.append(DimLocality(name, sizes[name], crosses))
    return shown


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


def _pins_text(request: Request, names: tuple[str, ...]) -> str:
    pinned = (name for name in names if name in request.pins)
    return " ".join(f"{option_flag(name)} {request.pins[name]}" for name in pinned)


def _check_pins_fit(request: Request) -> None:
    """Pinned world factors must divide the world, together; etp must be 1 or a pinned tp."""
    world = request.world_size
    pinned = tuple(name for name in WORLD_FACTORS if name in request.pins)
    for name in pinned:
        if world % request.pins[name]:
            raise PlanError(
                f"{option_flag(name)} {request.pins[name]} does not divide --world-size {world}"
            )
    product = math.prod(request.pins[name] for name in pinned)
    written = " * ".join(f"{name}({request.pins[name]})" for name in pinned)
    if world % product:
        raise PlanError(
            f"{_pins_text(request, pinned)} do not fit --world-size {world}: "
            f"{written} = {product} does not divide {world}"
        )
    if len(pinned) == len(WORLD_FACTORS) and product != world:
        raise PlanError(
            f"{_pins_text(request, pinned)} do not fit --world-size {world}: {written} = "
            f"{product} != {world}, and no degree is left free to take the rest"
        )
    if "tp" in request.pins and request.etp not in (1, request.pins["tp"]):
        raise PlanError(
            f"{_pins_text(request, ('tp', 'etp'))} conflict: etp({request.etp}) must be 1 or "
            f"equal to tp({request.pins['tp']})"
        )


def _no_assignment_message(request: Request) -> str:
    """Only the expert rule can leave nothing once the world-factor pins fit."""
    names = WORLD_FACTORS + EXPERT_DEGREES
    tp_note = "" if "tp" in request.pins or request.etp == 1 else f" (and tp = etp({request.etp}))"
    return (
        f"{_pins_text(request, names)} conflict at --world-size {request.world_size}: no "
        f"assignment has ep({request.ep}) * etp({request.etp}) = {request.ep * request.etp} "
        f"dividing dp_shard * cp * tp{tp_note}"
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
    count, prime = 1, 2
    while prime * prime <= rest:
        exponent = 0
        while rest % prime == 0:
            rest //= prime
            exponent += 1
        count *= math.comb(exponent + free - 1, free - 1)
        prime += 1
    return count * (free if rest > 1 else 1)


def _check_count(request: Request) -> None:
    count = assignment_count(request)
    if count > MAX_ASSIGNMENTS:
        raise PlanError(
            f"--world-size {request.world_size} splits into {count} assignments of pp, "
            f"dp_replicate, dp_shard, cp and tp, more than the {MAX_ASSIGNMENTS} a plan ranks; "
            "pin a degree (such as --tp 8) to narrow them"
        )


class _Divisors:
    """Divisors of the divisors of one world, computed from the world's own once."""

    def __init__(self, world_size: int) -> None:
        self._world = divisors(world_size)
        self._cache: dict[int, list[int]] = {}

    def of(self, number: int) -> list[int]:
        found = self._cache.get(number)
        if found is None:
            found = [d for d in self._world if d <= number and number % d == 0]
            self._cache[number] = found
        return found


def _assignments(request: Request) -> Iterator[Factors]:
    """Every tuple of world factors (in WORLD_FACTORS order) with product world_size that
    keeps the pins: nested loops over divisors, tp outermost."""
    divisors = _Divisors(request.world_size)
    pins = request.pins

    def options(name: str, remaining: int) -> list[int]:
        pinned = pins.get(name)
        if pinned is None:
            return divisors.of(remaining)
        return [pinned] if remaining % pinned == 0 else []

    world = request.world_size
    for tp in options("tp", world):
        # a sequence split is for long contexts: only when asked for
        for cp in options("cp", world // tp) if "cp" in pins else [1]:
            for dp_shard in options("dp_shard", world // (tp * cp)):
                rest = world // (tp * cp * dp_shard)
                for dp_replicate in options("dp_replicate", rest):
                    pp = rest // dp_replicate
                    # pp takes what is left; a pin must equal it.
                    if pins.get("pp", pp) == pp:
                        yield (pp, dp_replicate, dp_shard, cp, tp)


def _valid(request: Request) -> Iterator[dict[str, int]]:
    """The assignments that also pass meshconf's expert rules, as every degree."""
    experts = _ExpertRules(request)
    for factors in _assignments(request):
        if experts.allow(factors):
            yield _degrees(request, factors)


class _ExpertRules:
    """meshconf's own rules on ep and etp (``check_etp``, ``check_expert_borrow``), asked
    once per distinct (dp_shard, cp, tp): the only world factors they read."""

    def __init__(self, request: Request) -> None:
        self._request = request
        self._answers: dict[tuple[int, int, int], bool] = {}

    def allow(self, factors: Factors) -> bool:
        if not any(name in self._request.pins for name in EXPERT_DEGREES):
            return True
        inner = factors[2:]
        answer = self._answers.get(inner)
        if answer is None:
            answer = not _expert_problems(_degrees(self._request, factors))
            self._answers[inner] = answer
        return answer


def _expert_problems(degrees: dict[str, int]) -> list[Problem]:
    spec = MeshSpec(
        world_size=None,
        gpus_per_node=None,
        inside_node=None,
        degrees=degrees,
        explicit_degrees=frozenset(degrees),
        derived={},
        user_derived=frozenset(),
        domains={},
        user_domains=False,
    )
    result = Analysis(degrees=dict(degrees))
    check_etp(spec, result)
    check_expert_borrow(spec, result)
    return result.problems


def _degrees(request: Request, factors: Factors) -> dict[str, int]:
    """Every degree of an assignment: its world factors, and ep and etp as requested."""
    return {**dict(zip(WORLD_FACTORS, factors, strict=True)), "ep": request.ep, "etp": request.etp}


class _Counter:
    """Passes items through and counts them, so one pass both ranks and counts."""

    def __init__(self, items: Iterator[dict[str, int]]) -> None:
        self._items = items
        self.seen = 0

    def __iter__(self) -> Iterator[dict[str, int]]:
        for item in self._items:
            self.seen += 1
            yield item
