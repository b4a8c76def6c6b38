"""Plan degree assignments for a world size: enumerate, check, rank.

``meshconf plan`` lists every assignment of the world factors (``pp``, ``dp_replicate``,
``dp_shard``, ``cp``, ``tp``) whose product is the world size, under the degrees the user
pins (``cp`` stays 1 unless pinned). Without a model it ranks them so that the dims with the
most traffic keep their groups inside a node; with one, layouts that fit in memory come
first, by estimated step time (``meshconf.features.plan.estimate``), node locality breaking ties;
those that do not fit follow, closest to fitting first.
This module is the pure logic: no torch, no command line, no I/O.

Speed: a highly composite world has many assignments (65,536 = 2**16 has 969 with cp 1), so
the ranking never builds a config per assignment: :class:`NodeLocality` answers locality
by arithmetic on the degrees and the order. Only the rows that are shown or emitted are
built as :class:`MeshConfig` and so checked by every rule of meshconf. The request and its
checks are in ``meshconf.features.plan.request``, the enumeration in
``meshconf.features.plan.assignments``.
"""

from __future__ import annotations

import dataclasses
import heapq
import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from meshconf.core.degrees import EXPERT_DEGREES, WORLD_FACTORS
from meshconf.core.levels import crossed_levels
from meshconf.features.plan.assignments import ValidAssignments
from meshconf.features.plan.estimate.communication import level_bandwidths
from meshconf.features.plan.estimate.step import Estimate, estimate
from meshconf.features.plan.estimate.training import Parallelism
from meshconf.features.plan.locality import EXPERT_DIMS, RANKED_DIMS, NodeLocality, home_domain
from meshconf.features.plan.request import PlanError, Request, check_request
from meshconf.model.config import MeshConfig


@dataclass(frozen=True)
class Assignment:
    """One valid assignment: every degree, the key it was ranked by (smaller first), and
    with a model its estimate."""

    degrees: Mapping[str, int]
    key: tuple[float, ...]
    estimate: Estimate | None = None


@dataclass(frozen=True)
class Plan:
    """The best assignments, best first, how many valid assignments exist in all, how many
    fit (with a model), and how many the order alone leaves out (its expert dims would split
    world factors unevenly)."""

    request: Request
    total: int
    best: tuple[Assignment, ...]
    fitting: int | None = None
    left_out_by_order: int = 0


@dataclass(frozen=True)
class DimLocality:
    """One dim of a row's rationale: its group size, whether its groups cross nodes, and
    the levels they cross (the node first)."""

    name: str
    size: int
    crosses_nodes: bool | None
    crossed: tuple[str, ...] = ()


def make_plan(request: Request, count: int) -> Plan:
    """The ``count`` best assignments under ``request``, and the number of valid ones.

    Raises :class:`PlanError` when the order is not a permutation of the world factors, or
    the pins or ranges admit no assignment."""
    check_request(request)
    locality = NodeLocality(
        request.world_size,
        request.gpus_per_node,
        request.experts,
        request.rank_order,
        [level.size for level in request.levels],
    )
    valid = ValidAssignments(request)
    if request.model is None:
        # plain tuples compare fastest; keys end with every degree, so they never tie
        ranked = ((_locality_key(request, locality, degrees), degrees) for degrees in valid)
        best = [_Ranked(key, degrees) for key, degrees in heapq.nsmallest(count, ranked)]
        fitting = None
    else:
        fits = _FitCounter()
        bandwidths = level_bandwidths(request.topology, request.training)
        estimated = (
            fits.count(_estimated(request, locality, bandwidths, degrees)) for degrees in valid
        )
        best = heapq.nsmallest(count, estimated)
        fitting = fits.fitting
    if valid.seen == 0:
        raise PlanError(valid.no_assignment_message())
    assignments = tuple(Assignment(row.degrees, row.key, row.estimate) for row in best)
    return Plan(request, valid.seen, assignments, fitting, valid.left_out)


@dataclass(frozen=True, order=True)
class _Ranked:
    key: tuple[float, ...]
    degrees: dict[str, int] = field(compare=False)
    estimate: Estimate | None = field(default=None, compare=False)


class _FitCounter:
    """Counts the estimated rows that fit as they pass, so that no list of them is kept."""

    def __init__(self) -> None:
        self.fitting = 0

    def count(self, row: _Ranked) -> _Ranked:
        if row.estimate is not None and row.estimate.fits:
            self.fitting += 1
        return row


def _locality_key(
    request: Request, locality: NodeLocality, degrees: Mapping[str, int]
) -> tuple[float, ...]:
    """Without a model: a model that needs tensor parallelism rarely fits in a replica, so
    with ``--tp`` > 1 a layout of replicas alone (no FSDP shards) comes after the others."""
    needs_tp = request.pins.get("tp", 1) > 1
    replicas_only = needs_tp and degrees["dp_replicate"] > 1 and degrees["dp_shard"] == 1
    return (int(replicas_only), *locality.key(degrees))


def _estimated(
    request: Request,
    locality: NodeLocality,
    bandwidths: tuple[float, ...],
    degrees: dict[str, int],
) -> _Ranked:
    """With a model: layouts that fit first, by step time; those that do not, after them,
    closest to fitting first, so that a plan where nothing fits leads with what needs the
    least change. Among layouts that fit equally, those that reach the global batch without
    overshooting it come first, then the faster, then by node locality."""
    assert request.model is not None
    crosses = locality.crossings(degrees)
    found = estimate(request.model, Parallelism.of(degrees), request.training, crosses, bandwidths)
    wanted = request.training.global_batch_tokens
    overshoot = wanted is not None and found.batch_tokens > wanted
    # With --mfu over the step, the steps that reach it are equal: the layout whose compute
    # needs the smaller share of the peak to reach it comes first.
    needed = math.inf if found.compute_mfu is None else found.compute_mfu
    # a pipeline that cannot be split or scheduled is further from running than any size
    over = math.inf if found.problem else max(0.0, -found.headroom)
    key = (
        int(not found.fits),
        over,
        int(overshoot),
        found.step_seconds,
        needed,
        *locality.key(degrees, crosses),
    )
    return _Ranked(key, degrees, found)


def build_config(request: Request, degrees: Mapping[str, int]) -> MeshConfig:
    """The assignment as a validated config; every rule of meshconf runs on it."""
    return MeshConfig.model_validate(config_data(request, degrees))


def config_data(request: Request, degrees: Mapping[str, int]) -> dict[str, object]:
    """The config of an assignment as plain data: every world factor explicit, ep and etp
    only when pinned (otherwise they keep their default, 1), the order when given."""
    data: dict[str, object] = {"world_size": request.world_size}
    if request.gpus_per_node is not None:
        data["gpus_per_node"] = request.gpus_per_node
    if request.levels:
        data["levels"] = [
            {key: value for key, value in dataclasses.asdict(level).items() if value is not None}
            for level in request.levels
        ]
    if request.order is not None:
        data["order"] = list(request.order)
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
        layout = layouts[home_domain(name)]
        crossed = crossed_levels(layout, name, config.topology)
        crosses = None if request.gpus_per_node is None else bool(crossed)
        shown.append(DimLocality(name, sizes[name], crosses, crossed))
    return shown
