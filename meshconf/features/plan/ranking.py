"""Plan degree assignments for a world size: enumerate, check, rank.

``meshconf plan`` lists every assignment of the world factors (``pp``, ``dp_replicate``,
``dp_shard``, ``cp``, ``tp``) whose product is the world size, under the degrees the user
pins (``cp`` stays 1 unless pinned). Without a model it ranks them so that the dims with the
most traffic keep their groups inside a node; with one, layouts that fit in memory come
first, by estimated tokens per second per GPU (``meshconf.features.plan.estimate``), node
locality breaking ties; those that do not fit follow, closest to fitting first.

Speed: a highly composite world has many assignments (65,536 = 2**16 has 969 with cp 1), so
the ranking never builds a config per assignment: :class:`NodeLocality` answers locality
by arithmetic on the degrees and the order. Only the rows that are shown or emitted are
built as :class:`MeshConfig` and so checked by every rule of meshconf.
"""

from __future__ import annotations

import dataclasses
import heapq
import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field

from meshconf.core.degrees import EXPERT_DEGREES, WORLD_FACTORS
from meshconf.core.errors import ConfigError
from meshconf.core.levels import crossed_levels
from meshconf.features.plan.assignments import ValidAssignments
from meshconf.features.plan.estimate.communication import level_bandwidths
from meshconf.features.plan.estimate.step import Estimate, estimate
from meshconf.features.plan.estimate.step_inputs import Parallelism
from meshconf.features.plan.locality import EXPERT_DIMS, RANKED_DIMS, NodeLocality, home_domain
from meshconf.features.plan.request import (
    MAX_ESTIMATED_ASSIGNMENTS,
    PlanError,
    Request,
    check_request,
)
from meshconf.model.config import MeshConfig
from meshconf.sources.loading import load_config


@dataclass(frozen=True)
class Assignment:
    """One valid assignment: every degree, the key it was ranked by (smaller first), and
    with a model its estimate."""

    degrees: Mapping[str, int]
    key: tuple[float, ...]
    estimate: Estimate | None = None


@dataclass(frozen=True)
class Plan:
    """The best assignments, best first; how many are valid, fit (with a model), are left
    out by the order alone (its expert dims would split world factors unevenly) and by the
    model, by reason; and the values of each expert degree the plan chose in its rows."""

    request: Request
    total: int
    best: tuple[Assignment, ...]
    fitting: int | None = None
    left_out_by_order: int = 0
    left_out: Mapping[str, int] = field(default_factory=dict)
    tried: Mapping[str, tuple[int, ...]] = field(default_factory=dict)


@dataclass(frozen=True)
class DimLocality:
    """One dim of a row's rationale; the levels its groups cross, the node first."""

    name: str
    size: int
    crosses_nodes: bool | None
    crossed: tuple[str, ...] = ()


def make_plan(request: Request, count: int) -> Plan:
    """The ``count`` best assignments under ``request``, and the number of valid ones.

    Raises :class:`PlanError` when the request fails its checks, no assignment is left (or
    none the model can run), or there are too many to estimate."""
    check_request(request)
    locality = NodeLocality(
        request.world_size,
        request.gpus_per_node,
        request.experts,
        request.rank_order,
        [level.size for level in request.levels],
    )
    valid = ValidAssignments(request)
    if request.model is not None:
        _check_estimated(request, valid)
    rows: ValidAssignments | _KeptInside = valid
    crossings = locality.crossings
    if request.inside:
        rows = _KeptInside(request, valid)
        crossings = rows.crossings
    if request.model is None:
        # plain tuples compare fastest; keys end with every degree, so they never tie
        ranked = (
            (_locality_key(request, locality, degrees, crossings(degrees)), degrees)
            for degrees in rows
        )
        best = [_Ranked(key, degrees) for key, degrees in heapq.nsmallest(count, ranked)]
        fitting = None
    else:
        fits = _FitCounter()
        bandwidths = level_bandwidths(request.topology, request.training)
        estimated = (
            fits.count(_estimated(request, locality, bandwidths, degrees, crossings(degrees)))
            for degrees in rows
        )
        best = heapq.nsmallest(count, estimated)
        fitting = fits.fitting
    if valid.seen == 0:
        raise PlanError(valid.no_assignment_message())
    if rows.seen == 0:
        raise PlanError(rows.no_assignment_message())
    assignments = tuple(Assignment(row.degrees, row.key, row.estimate) for row in best)
    tried = {name: tuple(sorted(valid.tried[name])) for name in valid.explored}
    return Plan(
        request,
        rows.seen,
        assignments,
        fitting,
        valid.left_out,
        dict(valid.unrunnable.most_common()),
        tried,
    )


def _check_estimated(request: Request, valid: ValidAssignments) -> None:
    """Counted before any is estimated: with the expert degrees a model explores, they can
    be many more than the world factors' assignments."""
    count = valid.count()
    if count > MAX_ESTIMATED_ASSIGNMENTS:
        explored = " and ".join(valid.explored)
        pin = f"--{valid.explored[0]}" if valid.explored else "--tp"
        raise PlanError(
            f"--world-size {request.world_size} with a model has {count} assignments to "
            f"estimate{f' (with {explored} explored)' if explored else ''}, more than the "
            f"{MAX_ESTIMATED_ASSIGNMENTS} a plan estimates; pin a degree (such as {pin} 8) to "
            "narrow them"
        )


class _KeptInside:
    """The valid assignments whose config keeps the request's ``inside``: each built as a
    config, checked by every rule, its dims' crossings read from its own layouts."""

    def __init__(self, request: Request, valid: ValidAssignments) -> None:
        self._request = request
        self._valid = valid
        self._crossings: dict[tuple[int, ...], dict[str, int]] = {}
        self.seen = 0
        self._refusal: str | None = None

    def __iter__(self) -> Iterator[dict[str, int]]:
        for degrees in self._valid:
            try:
                config = build_config(self._request, degrees)
            except ConfigError as error:
                if self._refusal is None:
                    written = " ".join(f"{name}={degrees[name]}" for name in WORLD_FACTORS)
                    self._refusal = f"{written}: {error.diagnostics[0].render()}"
                continue
            self.seen += 1
            dims = rationale(self._request, config)
            self._crossings[_factors(degrees)] = {dim.name: len(dim.crossed) for dim in dims}
            yield degrees

    def crossings(self, degrees: Mapping[str, int]) -> dict[str, int]:
        return self._crossings[_factors(degrees)]

    def no_assignment_message(self) -> str:
        kept = "; ".join(
            f"{level}: [{', '.join(dims)}]" for level, dims in self._request.inside.items()
        )
        return (
            f"no assignment keeps inside {{{kept}}}: {self._valid.seen} are valid without it, "
            f"and each is refused with it, such as {self._refusal}"
        )


def _factors(degrees: Mapping[str, int]) -> tuple[int, ...]:
    return tuple(degrees[name] for name in WORLD_FACTORS)


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
    request: Request,
    locality: NodeLocality,
    degrees: Mapping[str, int],
    crosses: Mapping[str, int],
) -> tuple[float, ...]:
    """Without a model: a model that needs tensor parallelism rarely fits in a replica, so
    with ``--tp`` > 1 a layout of replicas alone (no FSDP shards) comes after the others."""
    needs_tp = request.pins.get("tp", 1) > 1
    replicas_only = needs_tp and degrees["dp_replicate"] > 1 and degrees["dp_shard"] == 1
    return (int(replicas_only), *locality.key(degrees, crosses))


def _estimated(
    request: Request,
    locality: NodeLocality,
    bandwidths: tuple[float, ...],
    degrees: dict[str, int],
    crosses: Mapping[str, int],
) -> _Ranked:
    """With a model: those that do not fit after those that do, closest to fitting first,
    so that a plan where nothing fits leads with what needs the least change."""
    assert request.model is not None
    found = estimate(request.model, Parallelism.of(degrees), request.training, crosses, bandwidths)
    # With --mfu over the step, the steps that reach it are equal: the layout whose compute
    # needs the smaller share of the peak to reach it comes first.
    needed = math.inf if found.compute_mfu is None else found.compute_mfu
    # a pipeline that cannot be split or scheduled is further from running than any size;
    # among those, the one whose memory also fits is the closer
    key = (
        int(not found.fits),
        int(found.problem is not None),
        max(0.0, -found.headroom),
        -found.tokens_per_second_per_gpu(request.world_size),
        needed,
        *locality.key(degrees, crosses),
    )
    return _Ranked(key, degrees, found)


def build_config(
    request: Request,
    degrees: Mapping[str, int],
    inside: Mapping[str, Sequence[str]] | None = None,
) -> MeshConfig:
    """The assignment as a validated config (with ``inside``, if given, in place of the
    request's); every rule of meshconf runs on it.

    Raises :class:`ConfigError`, one located diagnostic per problem, when a rule refuses it
    (only the request's ``inside`` can: the assignments pass the other rules)."""
    return load_config(config_data(request, degrees, inside))


def config_data(
    request: Request,
    degrees: Mapping[str, int],
    inside: Mapping[str, Sequence[str]] | None = None,
) -> dict[str, object]:
    """The config of an assignment as plain data: every world factor explicit, ep and etp
    when pinned or not 1 (otherwise they keep their default, 1), the order and ``inside`` (the
    request's, unless given) when there are any. A node with a bandwidth of its own is the
    first of ``levels``; otherwise ``gpus_per_node`` gives it."""
    data: dict[str, object] = {"world_size": request.world_size}
    written = [
        {key: value for key, value in dataclasses.asdict(level).items() if value is not None}
        for level in request.topology
    ]
    if request.node_bandwidth_gb_s is not None:
        data["levels"] = written
    elif written:
        data["gpus_per_node"] = request.gpus_per_node
        if written[1:]:
            data["levels"] = written[1:]
    kept = request.inside if inside is None else inside
    if kept:
        data["inside"] = {level: list(dims) for level, dims in kept.items()}
    if request.order is not None:
        data["order"] = list(request.order)
    names = WORLD_FACTORS + tuple(
        name for name in EXPERT_DEGREES if name in request.pins or degrees[name] != 1
    )
    data["degrees"] = {name: degrees[name] for name in names}
    return data


def kept_inside(request: Request, config: MeshConfig) -> dict[str, list[str]]:
    """``inside`` for a row's config: the request's, and each dim of more than one rank that
    the row keeps inside a level smaller than the world, named at the innermost level it
    stays inside, so that the runtime checks the placement the row was ranked on."""
    topology = request.topology
    kept = {level: list(dims) for level, dims in request.inside.items()}
    for dim in rationale(request, config):
        count = len(dim.crossed)
        if dim.size == 1 or count == len(topology):
            continue
        level = topology[count]
        if level.size >= request.world_size:
            continue
        below = {name for inner in topology[: count + 1] for name in kept.get(inner.name, ())}
        if dim.name not in below:
            kept.setdefault(level.name, []).append(dim.name)
    return {level.name: kept[level.name] for level in topology if kept.get(level.name)}


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
