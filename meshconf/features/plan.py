"""Plan degree assignments for a world size: enumerate, check, rank by node locality.

``meshconf plan`` lists every assignment of the world factors (``pp``, ``dp_replicate``,
``dp_shard``, ``cp``, ``tp``) whose product is the world size, under the degrees the user
pins, and ranks them so that the dims with the most traffic keep their groups inside a node.
This module is the pure logic: no torch, no command line, no I/O.

Speed: a highly composite world has many assignments (65,536 = 2**16 has 4,845), so the
ranking never builds a config per assignment. In the default domains every dim is a single
row-major block, whose groups depend only on its size and on the product of the dims inside
it (its stride); :class:`_NodeLocality` asks :meth:`DomainLayout.crosses_nodes` once per
distinct ``(size, stride)`` and remembers the answer. Only the rows that are shown or
emitted are built as :class:`MeshConfig` and so checked by every rule of meshconf.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

from meshconf.core.degrees import EXPERT_DEGREES, MAX_WORLD_SIZE, WORLD_FACTORS, divisors
from meshconf.core.domains import DATALOADING, DENSE, SPARSE
from meshconf.core.errors import MeshconfError, Problem
from meshconf.core.layout import DomainLayout
from meshconf.model.config import MeshConfig
from meshconf.model.fields import MAX_GPUS_PER_NODE
from meshconf.model.rules import Analysis, MeshSpec, check_etp, check_expert_borrow

#: Dims whose groups carry the most traffic, most first: their locality is ranked before the
#: number of pipeline stages. ``etp`` and ``ep`` count only for a mixture of experts.
HEAVY_DIMS = ("tp", "cp", "etp", "ep")
#: Dims with less traffic, most first: their locality is ranked after the pipeline stages.
LIGHT_DIMS = ("fsdp", "efsdp", "dp_replicate")
#: The dims shown in a row's rationale, outer to inner, with the default domain each is
#: read from; the expert dims only when ep or etp is pinned.
SHOWN_DIMS: Mapping[str, str] = {
    "pp": DENSE,
    "dp_replicate": DENSE,
    "fsdp": DENSE,
    "cp": DATALOADING,
    "tp": DENSE,
    "efsdp": SPARSE,
    "ep": SPARSE,
    "etp": SPARSE,
}
_EXPERT_DIMS = frozenset({"efsdp", "ep", "etp"})

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

    @property
    def experts(self) -> bool:
        """Whether the model has experts: only then are ep, etp and efsdp ranked."""
        return any(name in self.pins for name in EXPERT_DEGREES)

    @property
    def ep(self) -> int:
        return self.pins.get("ep", 1)

    @property
    def etp(self) -> int:
        return self.pins.get("etp", 1)


@dataclass(frozen=True)
class Assignment:
    """One valid assignment: every degree, and the key it was ranked by (smaller first)."""

    degrees: Mapping[str, int]
    key: tuple[int, ...]


@dataclass(frozen=True)
class Plan:
    """The best assignments, best first, and how many valid assignments exist in all."""

    request: Request
    total: int
    best: tuple[Assignment, ...]


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
    """The ``count`` best assignments under ``request``, and the number of valid ones."""
    _check_ranges(request)
    _check_pins_fit(request)
    _check_count(request)
    locality = _NodeLocality(request)
    valid = _Counter(_valid(request))
    best = heapq.nsmallest(count, ((locality.key(factors), factors) for factors in valid))
    if valid.seen == 0:
        raise PlanError(_no_assignment_message(request))
    assignments = tuple(Assignment(_degrees(request, factors), key) for key, factors in best)
    return Plan(request, valid.seen, assignments)


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
    for name, domain in SHOWN_DIMS.items():
        if name in _EXPERT_DIMS and not request.experts:
            continue
        crosses = (
            None
            if request.gpus_per_node is None
            else layouts[domain].crosses_nodes(name, request.gpus_per_node)
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
        for cp in options("cp", world // tp):
            for dp_shard in options("dp_shard", world // (tp * cp)):
                rest = world // (tp * cp * dp_shard)
                for dp_replicate in options("dp_replicate", rest):
                    pp = rest // dp_replicate
                    # pp takes what is left; a pin must equal it.
                    if pins.get("pp", pp) == pp:
                        yield (pp, dp_replicate, dp_shard, cp, tp)


def _valid(request: Request) -> Iterator[Factors]:
    """The assignments that also pass meshconf's expert rules."""
    experts = _ExpertRules(request)
    return (factors for factors in _assignments(request) if experts.allow(factors))


class _ExpertRules:
    """meshconf's own rules on ep and etp (``check_etp``, ``check_expert_borrow``), asked
    once per distinct (dp_shard, cp, tp): the only world factors they read."""

    def __init__(self, request: Request) -> None:
        self._request = request
        self._answers: dict[tuple[int, int, int], bool] = {}

    def allow(self, factors: Factors) -> bool:
        if not self._request.experts:
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

    def __init__(self, items: Iterator[Factors]) -> None:
        self._items = items
        self.seen = 0

    def __iter__(self) -> Iterator[Factors]:
        for item in self._items:
            self.seen += 1
            yield item


class _NodeLocality:
    """The ranking key of an assignment, from the node locality of its dims.

    Smaller is better: heavy dims inside a node (tp, cp, etp, ep in turn), then fewer
    pipeline stages, then light dims inside a node (fsdp, efsdp, dp_replicate), then fewer
    replicas, then fewer context-parallel ranks, then fewer FSDP shards: what is left goes to
    tp, the innermost dim. Each flag is 1 when the dim's groups cross nodes.
    """

    def __init__(self, request: Request) -> None:
        self._request = request
        experts = request.experts
        self._heavy = tuple(name for name in HEAVY_DIMS if experts or name not in _EXPERT_DIMS)
        self._light_inner = tuple(
            name
            for name in LIGHT_DIMS
            if name != "dp_replicate" and (experts or name not in _EXPERT_DIMS)
        )
        self._crossings: dict[tuple[int, int], int] = {}
        self._inner: dict[tuple[int, int, int], tuple[tuple[int, ...], tuple[int, ...]]] = {}

    def key(self, factors: Factors) -> tuple[int, ...]:
        pp, dp_replicate, dp_shard, cp, tp = factors
        heavy, light = self._inner_flags(dp_shard, cp, tp)
        replicate = self._crosses(dp_replicate, dp_shard * cp * tp)
        # cp before dp_shard: a sequence split is for long contexts, so one not asked for
        # is the last thing to add.
        return (*heavy, pp, *light, replicate, dp_replicate, cp, dp_shard, tp)

    def _inner_flags(
        self, dp_shard: int, cp: int, tp: int
    ) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """Flags of the dims inside dp_replicate, which depend on dp_shard, cp and tp only;
        remembered, since many assignments share them."""
        found = self._inner.get((dp_shard, cp, tp))
        if found is None:
            blocks = _row_major_blocks(dp_shard, cp, tp, self._request.ep, self._request.etp)
            found = (
                tuple(self._crosses(*blocks[name]) for name in self._heavy),
                tuple(self._crosses(*blocks[name]) for name in self._light_inner),
            )
            self._inner[dp_shard, cp, tp] = found
        return found

    def _crosses(self, size: int, stride: int) -> int:
        """1 if the groups of a row-major dim of this size and stride cross nodes, else 0;
        0 for every dim without gpus_per_node."""
        gpus = self._request.gpus_per_node
        if gpus is None or size == 1:
            return 0
        answer = self._crossings.get((size, stride))
        if answer is None:
            world = self._request.world_size
            outer = world // (size * stride)
            block = DomainLayout.row_major(
                "block", [("outer", outer), ("dim", size), ("inner", stride)], world
            )
            answer = int(block.crosses_nodes("dim", gpus))
            self._crossings[size, stride] = answer
        return answer


def _row_major_blocks(
    dp_shard: int, cp: int, tp: int, ep: int, etp: int
) -> dict[str, tuple[int, int]]:
    """``(size, stride)`` of the ranked dims inside dp_replicate in the default domains,
    which lay their dims out row-major, pp outermost: dense ``[pp, dp_replicate, fsdp, tp]``,
    dataloading ``[pp, batch, cp, tp]``, sparse ``[pp, dp_replicate, efsdp, ep, etp]``. The
    sizes are the default derived formulas (``fsdp = dp_shard * cp``,
    ``efsdp = dp_shard * cp * tp / (ep * etp)``); dp_replicate is ``(dp_replicate,
    dp_shard * cp * tp)``. tests/test_plan.py checks every flag against the layouts of the
    validated config."""
    return {
        "tp": (tp, 1),
        "cp": (cp, tp),
        "etp": (etp, 1),
        "ep": (ep, etp),
        "fsdp": (dp_shard * cp, tp),
        "efsdp": (dp_shard * cp * tp // (ep * etp), ep * etp),
    }
