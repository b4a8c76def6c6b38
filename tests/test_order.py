"""``order:``: the rank order of the world factors. The groups of every dim against a
brute-force statement of what the order means (with and without ``inside_node``), every
rule's located message, and what ``show`` prints."""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path
from typing import Any

import pytest
from brute_force import assert_refused_only_for_uneven_groups, brute_force_groups, errors
from hypothesis import HealthCheck, given, settings, strategies as st

from meshconf import ConfigError, load_config
from meshconf.cli.show import build_report
from meshconf.core.degrees import WORLD_FACTORS, divisors
from meshconf.core.layout import LayoutError

ORDERS = list(itertools.permutations(WORLD_FACTORS))
META = ["dp_replicate", "dp_shard", "pp", "cp", "tp"]


@st.composite
def ordered_worlds(
    draw: st.DrawFn, placed: bool
) -> tuple[dict[str, int], list[str], dict[str, int], int]:
    degrees = {name: draw(st.sampled_from([1, 1, 2, 3, 4])) for name in WORLD_FACTORS}
    lender = degrees["dp_shard"] * degrees["cp"] * degrees["tp"]
    degrees["etp"] = draw(st.sampled_from([1, degrees["tp"]]))
    degrees["ep"] = draw(st.sampled_from(divisors(lender // degrees["etp"])))
    order = list(draw(st.sampled_from(ORDERS)))
    if not placed:
        return degrees, order, {}, 1
    inside = {name: draw(st.sampled_from(divisors(degrees[name]))) for name in WORLD_FACTORS}
    return degrees, order, inside, math.prod(inside.values())


def _check_against_brute_force(
    degrees: dict[str, int], order: list[str], inside: dict[str, int], gpus: int, rank_seed: int
) -> None:
    world = math.prod(degrees[name] for name in WORLD_FACTORS)
    data: dict[str, Any] = {"world_size": world, "degrees": degrees, "order": order}
    if inside:
        data.update(gpus_per_node=gpus, inside_node=inside)
    try:
        config = load_config(data)
    except ConfigError as error:
        assert_refused_only_for_uneven_groups(error, degrees, order, inside, gpus)
        return
    rank = rank_seed % world
    report = build_report(config, rank, list(config.layouts))
    assert report["order"] == order
    for domain, layout in config.layouts.items():
        sizes = list(layout.shape)
        for axis, dim in enumerate(layout.dims):
            expected = brute_force_groups(degrees, order, inside, gpus, sizes, axis)
            assert report["domains"][domain]["dims"][axis]["group"] == expected[rank]
            for other in range(world):
                assert layout.group(other, dim.name).ranks() == expected[other], (domain, dim)
        for other in range(world):
            assert layout.rank_at(layout.coordinate(other)) == other


@pytest.mark.slow  # a long generated sweep: the quick loop leaves it out
@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ordered_worlds(placed=False), st.integers(min_value=0))
def test_show_json_gives_the_row_major_groups_of_the_order(
    world: tuple[dict[str, int], list[str], dict[str, int], int], rank_seed: int
) -> None:
    _check_against_brute_force(*world, rank_seed)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ordered_worlds(placed=True), st.integers(min_value=0))
def test_order_composes_with_inside_node(
    world: tuple[dict[str, int], list[str], dict[str, int], int], rank_seed: int
) -> None:
    _check_against_brute_force(*world, rank_seed)


def test_every_order_of_a_world_with_all_factors_above_one() -> None:
    """All 120 orders of pp 2, dp_replicate 2, dp_shard 3, cp 2, tp 2, ep 2."""
    degrees = {"pp": 2, "dp_replicate": 2, "dp_shard": 3, "cp": 2, "tp": 2, "ep": 2, "etp": 1}
    for order in ORDERS:
        _check_against_brute_force(degrees, list(order), {}, 1, 17)


META_405B = {
    "world_size": 16384,
    "gpus_per_node": 8,
    "order": META,
    "degrees": {"pp": 16, "dp_shard": 128, "tp": 8},
}


def test_meta_order_keeps_the_derived_dims_and_numbers_dp_outermost() -> None:
    config = load_config(META_405B)
    dense = config.layout("dense")
    assert dense.group(0, "tp").ranks() == list(range(8))
    assert dense.group(0, "pp").ranks() == list(range(0, 128, 8))
    assert dense.group(0, "fsdp").ranks() == list(range(0, 16384, 128))
    assert dense.placement("tp", 8) == "intra-node"
    assert config.dim_sizes["fsdp"] == 128
    # The default order written out is the default: same meshes, same fingerprint.
    plain = {"world_size": 64, "degrees": {"pp": 2, "tp": 4}}
    assert load_config({**plain, "order": list(WORLD_FACTORS)}) == load_config(plain)
    assert load_config({**plain, "order": META}) != load_config(plain)


def test_a_derived_dim_whose_factors_are_apart_has_one_mode_per_factor() -> None:
    """fsdp = dp_shard * cp with pp between them: dp_shard stride 16, cp stride 2."""
    config = load_config(
        {"world_size": 64, "order": META, "degrees": {"pp": 4, "dp_shard": 4, "cp": 2, "tp": 2}}
    )
    fsdp = config.layout("dense").dim("fsdp")
    assert [(mode.size, mode.stride) for mode in fsdp.modes] == [(4, 16), (2, 2)]
    assert config.layout("dense").group(0, "fsdp").ranks() == [0, 2, 16, 18, 32, 34, 48, 50]


def test_order_lists_every_world_factor_once() -> None:
    data = {"world_size": 8, "order": ["dp", "pp", "tp", "ep", "pp", "tpp"]}
    assert errors(data) == [
        "order[0]: 'dp' is not a world factor: data parallelism is dp_replicate (outer) and "
        "dp_shard (inner); list both, next to each other for one data-parallel block",
        "order[3]: ep is not a world factor: experts borrow their ranks from dp_shard * cp * "
        "tp, so their ranks follow those; order lists pp, dp_replicate, dp_shard, cp, tp",
        "order[4]: 'pp' appears twice in order",
        "order[5]: unknown world factor 'tpp' (did you mean 'pp' or 'tp'?); order lists pp, "
        "dp_replicate, dp_shard, cp, tp",
    ]


def test_order_names_every_world_factor() -> None:
    assert errors({"world_size": 8, "order": ["dp_shard", "pp", "tp"]}) == [
        "order: leaves out dp_replicate, cp: order lists every world factor once, outer to "
        "inner (pp, dp_replicate, dp_shard, cp, tp); one of size 1 may go anywhere"
    ]


def test_order_is_a_list_of_names() -> None:
    assert errors({"order": "tp-cp-dp-pp"}) == [
        "order: expected a list of the world factors, outer to inner, such as "
        "[dp_replicate, dp_shard, pp, cp, tp], got the string 'tp-cp-dp-pp'"
    ]
    assert errors({"order": ["pp", 3]}) == ["order[1]: expected a name, got the integer 3"]


def test_an_order_that_splits_a_factor_unevenly_is_refused_on_order() -> None:
    """cp 3 and tp 2 are apart, so ep 3 would take tp's 2 ranks and half a cp step."""
    data = {
        "world_size": 6,
        "order": ["dp_shard", "pp", "tp", "dp_replicate", "cp"],
        "degrees": {"dp_shard": 1, "cp": 3, "tp": 2, "ep": 3},
    }
    assert errors(data) == [
        "order: ep(3) in domain 'sparse' would split the 2 ranks of tp unevenly: it needs 3 "
        "ranks where 2 remain; a dim must take whole parts or an even share of one, so change "
        "order or the size of ep"
    ]
    placed = {**data, "gpus_per_node": 3, "inside_node": {"cp": 3}}
    assert errors(placed) == [
        "inside_node: ep(3) in domain 'sparse' would split the 2 ranks of tp across nodes "
        "unevenly: it needs 3 ranks where 2 remain; a dim must take whole parts or an even "
        "share of one, so change order or inside_node or the size of ep"
    ]


def test_an_uneven_share_of_factors_that_run_on_names_them_all() -> None:
    """cp 2 and tp 3 are next to each other in the order, one run of 6 ranks, of which ep 4
    cannot take an even share."""
    data = {
        "order": ["pp", "dp_replicate", "cp", "tp", "dp_shard"],
        "degrees": {"dp_shard": 2, "cp": 2, "tp": 3, "ep": 4},
    }
    assert errors(data) == [
        "order: ep(4) in domain 'sparse' would split the 6 ranks of cp and tp unevenly: it "
        "needs 4 ranks where 6 remain; a dim must take whole parts or an even share of one, so "
        "change order or the size of ep"
    ]


def test_show_prints_the_order_and_the_strides_it_gives(run_cli) -> None:  # type: ignore[no-untyped-def]
    path = "examples/llama3_405b_16384gpu_meta_order.yaml"
    result = run_cli("show", path, "--rank", "9", "--domain", "dense", "--all")
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[:12] == [
        "world_size 16384, 8 GPUs per node; showing rank 9",
        "degrees: pp=16 dp_replicate=1 dp_shard=128 cp=1 tp=8 ep=1 etp=1",
        "derived: batch=128 fsdp=128 loss=128 efsdp=1024",
        "rank order, outer to inner: dp_replicate dp_shard pp cp tp",
        "",
        "domain dense [pp=16, dp_replicate=1, fsdp=128, tp=8]",
        "  dim              size   stride   groups  placement   group of rank 9",
        "  pp                 16        8     1024  inter-node  1, 9, 17, ..., 121 (16 ranks)",
        "  dp_replicate        1        8    16384  intra-node  9",
        "  fsdp              128      128      128  inter-node  9, 137, 265, ..., 16265 (128 ranks)",
        "  tp                  8        1     2048  intra-node  8, 9, 10, 11, 12, 13, 14, 15",
        "  coordinate of rank 9: pp=1 dp_replicate=0 fsdp=0 tp=1",
    ]
    report = json.loads(run_cli("show", path, "--rank", "9", "--format", "json").stdout)
    assert report["order"] == META
    assert report["domains"]["dense"]["dims"][0]["group"] == list(range(1, 128, 8))


def test_render_draws_the_groups_of_the_order(run_cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """tp outermost: the ep group that takes tp's 4 ranks is 4 ranks apart in the picture."""
    config = tmp_path / "experts.yaml"
    config.write_text(
        "world_size: 16\norder: [tp, dp_replicate, dp_shard, cp, pp]\n"
        "degrees: {dp_shard: 2, cp: 2, tp: 4, ep: 4}\n",
        encoding="utf-8",
    )
    out = tmp_path / "sparse.svg"
    result = run_cli("render", str(config), "--domain", "sparse", "-O", str(out))
    assert result.returncode == 0, result.stderr
    svg = out.read_text(encoding="utf-8")
    assert "ep: size 4, stride 4, 4 groups; coloured: rank 0's group" in svg
    assert "efsdp: size 4, stride 1, 4 groups" in svg


def test_a_layout_over_any_dims_numbers_the_ranks_as_the_config_does() -> None:
    """MeshConfig.layout_over: what a domain of those dims would have, order kept."""
    config = load_config(
        {
            "world_size": 16,
            "degrees": {"dp_replicate": 2, "dp_shard": 2, "cp": 2, "tp": 2},
            "order": ["tp", "pp", "dp_replicate", "dp_shard", "cp"],
        }
    )
    for domain, layout in config.layouts.items():
        assert config.layout_over(domain, layout.dim_names) == layout
    over = config.layout_over("accelerate", ["dp_replicate", "dp_shard", "cp", "tp"])
    assert over.name == "accelerate" and over.world_size == 16
    assert [over.group(5, dim).ranks() for dim in over.dim_names] == [
        [1, 5],
        [5, 7],
        [4, 5],
        [5, 13],
    ]
    assert over.group(5, ["dp_shard", "cp"]).ranks() == [4, 5, 6, 7]
    with pytest.raises(LayoutError) as raised:
        config.layout_over("x", ["tp", "nope", "also"])
    assert str(raised.value) == (
        "x: unknown dim 'nope'; dims are pp, dp_replicate, dp_shard, cp, tp, ep, etp, batch, "
        "fsdp, loss, efsdp"
    )
    with pytest.raises(LayoutError, match="do not number the ranks one to one"):
        config.layout_over("short", ["tp", "cp"])
