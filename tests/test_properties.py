"""Property tests: random degrees and world sizes up to 2**20.

Every generated config is either rejected with clean, located errors exactly when an
independent statement of the rules says it is invalid, or it has layouts in which each dim's
groups partition the world, coordinates and ranks round-trip, and shared dims agree.
"""

from __future__ import annotations

import math
from typing import Any

from hypothesis import HealthCheck, given, settings, strategies as st
from pydantic import ValidationError

from meshconf import MeshConfig
from meshconf.core.degrees import WORLD_FACTORS
from meshconf.core.layout import canonical_modes

MAX_WORLD = 2**20
factor = st.sampled_from([1, 1, 1, 2, 2, 3, 4, 8, 16, 32])


@st.composite
def configs(draw: st.DrawFn) -> tuple[dict[str, Any], int]:
    degrees = {name: draw(factor) for name in WORLD_FACTORS}
    product = math.prod(degrees.values())
    auto = draw(st.sampled_from([None, *WORLD_FACTORS]))
    if auto is not None:
        degrees[auto] = -1
    elif draw(st.booleans()):
        degrees.pop("dp_shard")  # then dp_shard defaults to -1
    degrees["ep"] = draw(st.sampled_from([1, 1, 2, 4, 8]))
    degrees["etp"] = draw(st.sampled_from([1, 1, 2, 4, 8]))
    world_size = draw(
        st.one_of(st.just(product), st.integers(1, MAX_WORLD), st.just(product * draw(factor)))
    )
    return {"world_size": min(world_size, MAX_WORLD), "degrees": degrees}, draw(
        st.integers(0, MAX_WORLD - 1)
    )


def expected_valid(data: dict[str, Any]) -> bool:
    """The rules of docs/configuration.md#rules for the default domains, stated independently."""
    degrees = {"dp_shard": -1, **data["degrees"]}
    world_size = data["world_size"]
    autos = [name for name in WORLD_FACTORS if degrees[name] == -1]
    known = math.prod(degrees[name] for name in WORLD_FACTORS if degrees[name] != -1)
    if autos:
        if world_size % known:
            return False
        degrees[autos[0]] = world_size // known
    elif known != world_size:
        return False
    if degrees["etp"] not in (1, degrees["tp"]):
        return False
    return (degrees["dp_shard"] * degrees["cp"] * degrees["tp"]) % (
        degrees["ep"] * degrees["etp"]
    ) == 0


def check_layouts(config: MeshConfig, sample_rank: int) -> None:
    world = config.resolved_world_size
    assert world is not None
    ranks = {0, world - 1, sample_rank % world, (sample_rank * 7919) % world}
    layouts = config.layouts
    for layout in layouts.values():
        assert math.prod(layout.shape) == world
        for rank in ranks:
            coordinate = layout.coordinate(rank)
            assert layout.rank_at(coordinate) == rank
            for dim in layout.dims:
                assert layout.num_groups(dim.name) * dim.size == world
                group = layout.group(rank, dim.name)
                members = group.ranks() if dim.size <= 4096 else None
                if members is None:
                    continue
                assert len(members) == dim.size and rank in members
                for member in members[:: max(1, dim.size // 16)]:
                    other = layout.coordinate(member)
                    assert {k: v for k, v in other.items() if k != dim.name} == {
                        k: v for k, v in coordinate.items() if k != dim.name
                    }
                    assert layout.group(member, dim.name).ranks() == members
                assert [layout.coordinate(m)[dim.name] for m in members[:16]] == list(
                    range(min(16, dim.size))
                )
    # A dim name in several domains denotes the same groups, in the same order.
    for name in {dim.name for layout in layouts.values() for dim in layout.dims}:
        holders = [layout for layout in layouts.values() if name in layout.dim_names]
        for rank in ranks:
            groups = {layout.group(rank, name) for layout in holders}
            described = {(group.base, canonical_modes(group.modes)) for group in groups}
            assert len(described) == 1, (name, rank, described)
            if layouts[next(iter(layouts))].world_size <= 4096:
                assert len({tuple(group) for group in groups}) == 1


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(configs())
def test_random_configs_validate_exactly_when_the_rules_hold(
    case: tuple[dict[str, Any], int],
) -> None:
    data, sample_rank = case
    try:
        config = MeshConfig.model_validate(data)
    except ValidationError as error:
        assert not expected_valid(data), error
        for item in error.errors():
            assert item["loc"] and isinstance(item["msg"], str) and item["msg"]
        return
    assert expected_valid(data), data
    check_layouts(config, sample_rank)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.sampled_from([1, 2, 3, 4]), min_size=1, max_size=5))
def test_small_worlds_partition_exactly(sizes: list[int]) -> None:
    names = [f"d{i}" for i in range(len(sizes))]
    data = {"degrees": {"dp_shard": math.prod(sizes)}, "domains": {"grid": ["dp_shard"]}}
    data["derived"] = {name: str(size) for name, size in zip(names, sizes, strict=True)}
    data["domains"] = {"grid": names}
    config = MeshConfig.model_validate(data)
    layout = config.layout("grid")
    world = math.prod(sizes)
    for name in names:
        groups = {tuple(layout.group(rank, name)) for rank in range(world)}
        assert sorted(rank for group in groups for rank in group) == list(range(world))
        assert len(groups) == layout.num_groups(name)
