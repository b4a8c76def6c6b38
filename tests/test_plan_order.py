"""``meshconf plan --order``: every row and flag under any rank order against configs that
meshconf validates, the emitted config, Llama 3's published layout, and located errors."""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings, strategies as st
from pydantic import ValidationError

from meshconf import load_config
from meshconf.core.degrees import WORLD_FACTORS, divisors
from meshconf.features.plan.locality import NodeLocality, home_domain
from meshconf.features.plan.ranking import build_config, make_plan
from meshconf.features.plan.request import PlanError, Request
from meshconf.model.config import MeshConfig

ORDERS = list(itertools.permutations(WORLD_FACTORS))
META = ("dp_replicate", "dp_shard", "pp", "cp", "tp")


def _brute_force_rows(request: Request) -> set[tuple[int, ...]]:
    """Every tuple of divisors whose product is the world, that keeps the pins (cp is 1
    unless pinned) and that MeshConfig accepts in the request's order."""
    world = request.world_size
    experts = {name: request.pins[name] for name in ("ep", "etp") if name in request.pins}
    rows = set()
    for values in itertools.product(divisors(world), repeat=len(WORLD_FACTORS)):
        degrees = dict(zip(WORLD_FACTORS, values, strict=True))
        if math.prod(values) != world or degrees["cp"] != request.pins.get("cp", 1):
            continue
        if any(
            degrees[name] != request.pins[name] for name in WORLD_FACTORS if name in request.pins
        ):
            continue
        try:
            MeshConfig(world_size=world, degrees={**degrees, **experts}, order=request.order)
        except ValidationError:
            continue
        rows.add(values)
    return rows


@st.composite
def ordered_requests(draw: st.DrawFn) -> Request:
    world = draw(st.sampled_from([8, 12, 16, 18, 24, 32, 36, 48]))
    pins: dict[str, int] = {}
    if draw(st.booleans()):
        pins["ep"] = draw(st.sampled_from(divisors(world)[1:]))
    if draw(st.booleans()):
        pins["cp"] = draw(st.sampled_from([d for d in divisors(world) if d <= 4]))
    gpus = draw(st.sampled_from([2, 3, 4, 6, 8, 16]))
    return Request(world, gpus, pins, order=draw(st.sampled_from(ORDERS)))


@pytest.mark.slow  # a long generated sweep: the quick loop leaves it out
@settings(max_examples=40, deadline=None)
@given(ordered_requests())
def test_under_any_order_the_rows_are_the_valid_configs_and_their_flags_the_layouts(
    request_: Request,
) -> None:
    expected = _brute_force_rows(request_)
    try:
        plan = make_plan(request_, 10**6)
    except PlanError as error:
        assert not expected, str(error)
        return
    assert {tuple(a.degrees[name] for name in WORLD_FACTORS) for a in plan.best} == expected
    assert request_.gpus_per_node is not None
    locality = NodeLocality(request_.world_size, request_.gpus_per_node, True, request_.order)
    for assignment in plan.best:
        config = build_config(request_, assignment.degrees)
        flags = locality.crossings(assignment.degrees)
        for name, crosses in flags.items():
            layout = config.layout(home_domain(name))
            assert crosses == layout.crosses_nodes(name, request_.gpus_per_node), (
                assignment.degrees,
                name,
            )


@pytest.mark.slow  # a long generated sweep: the quick loop leaves it out
@pytest.mark.parametrize("gpus_per_node", [2, 4, 8])
def test_every_order_of_a_mixture_of_experts_reads_each_expert_dim_from_its_layout(
    gpus_per_node: int,
) -> None:
    """ep 2 with tp 4 and cp 1: efsdp's run holds cp's place, a factor of one rank, which any
    order may put outermost."""
    for order in ORDERS:
        request = Request(16, gpus_per_node, {"ep": 2}, order=order)
        locality = NodeLocality(16, gpus_per_node, True, order)
        for assignment in make_plan(request, 10**6).best:
            config = build_config(request, assignment.degrees)
            for name, block in locality.blocks(assignment.degrees).items():
                modes = config.layout(home_domain(name)).dim(name).modes
                expected = max((m.size * m.stride for m in modes if m.size > 1), default=1)
                assert (type(block), block) == (int, expected), (order, assignment.degrees, name)


def test_without_nodes_no_group_crosses_one() -> None:
    locality = NodeLocality(64, None, True, tuple(reversed(WORLD_FACTORS)))
    degrees = {"pp": 2, "dp_replicate": 2, "dp_shard": 2, "cp": 2, "tp": 4, "ep": 2, "etp": 1}
    assert locality.crossings(degrees) == dict.fromkeys(locality.dims, 0)


def test_an_order_changes_which_groups_stay_in_a_node(run_cli) -> None:
    """Data parallelism outermost: two pipeline stages of tp 2 fit in a node of 8, where the
    default order puts the stages 16 ranks apart."""
    args = ["plan", "--world-size", "32", "--gpus-per-node", "8", "--tp", "2", "--limit", "6"]
    ordered = run_cli(*args, "--order", ",".join(META))
    assert ordered.returncode == 0, ordered.stderr
    assert ordered.stdout.splitlines() == [
        "world_size 32 = 4 nodes x 8 GPUs; pinned: tp=2; order: dp_replicate, dp_shard, pp, cp, tp",
        "15 valid assignments; the best 6, best first (ranking: docs/plan.md)",
        "#  pp  dp_replicate  dp_shard  cp  tp  groups cross nodes       groups stay in a node",
        "1   1             4         4   1   2  dp_replicate(4)          fsdp(4) tp(2)",
        "2   1             8         2   1   2  dp_replicate(8)          fsdp(2) tp(2)",
        "3   1             1        16   1   2  fsdp(16)                 tp(2)",
        "4   1             2         8   1   2  dp_replicate(2) fsdp(8)  tp(2)",
        "5   2             4         2   1   2  dp_replicate(4)          pp(2) fsdp(2) tp(2)",
        "6   2             1         8   1   2  fsdp(8)                  pp(2) tp(2)",
    ]
    default = run_cli(*args)
    assert default.stdout.splitlines()[7:] == [
        "5   2             2         4   1   2  pp(2) dp_replicate(2)    fsdp(4) tp(2)",
        "6   2             4         2   1   2  pp(2) dp_replicate(4)    fsdp(2) tp(2)",
    ]


def test_emit_writes_the_order_and_its_command_prints_the_same_config(
    run_cli, tmp_path: Path
) -> None:
    order = "tp,cp,dp_shard,pp,dp_replicate"
    args = ["plan", "--world-size", "64", "--gpus-per-node", "8", "--order", order, "--emit", "3"]
    result = run_cli(*args)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [
        "# meshconf plan --world-size 64 --gpus-per-node 8 --order tp,cp,dp_shard,pp,dp_replicate "
        "--emit 3 (assignment 3 of 84)",
        "# groups cross nodes: fsdp(32); stay in a node: dp_replicate(2)",
        "world_size: 64",
        "gpus_per_node: 8",
        "inside:",
        "  node: [dp_replicate]",
        "order: [tp, cp, dp_shard, pp, dp_replicate]",
        "degrees:",
        "  pp: 1",
        "  dp_replicate: 2",
        "  dp_shard: 32",
        "  cp: 1",
        "  tp: 1",
    ]
    again = run_cli(*result.stdout.splitlines()[0][2:].split(" (")[0].split()[1:])
    assert again.stdout == result.stdout
    path = tmp_path / "planned.yaml"
    path.write_text(result.stdout)
    config = load_config(path)
    assert config.order == tuple(order.split(","))
    # dp_replicate is innermost: its pairs are neighbours, inside a node.
    assert config.layout("dense").group(0, "dp_replicate").ranks() == [0, 1]


def test_llama3_405b_as_meta_trained_it_is_planned_and_emitted_as_the_example(
    run_cli, tmp_path: Path
) -> None:
    """TP 8, PP 16 and DP 128 on 16,384 GPUs with data parallelism outermost: pinning them
    under Meta's order gives one row, whose config lays out every domain exactly as
    examples/llama3_405b_16384gpu_meta_order.yaml does."""
    args = ["plan", "--world-size", "16384", "--gpus-per-node", "8", "--order", ",".join(META)]
    args += ["--tp", "8", "--pp", "16", "--dp-replicate", "1", "--cp", "1"]
    table = run_cli(*args)
    assert table.stdout.splitlines()[1:] == [
        "1 valid assignment",
        "#  pp  dp_replicate  dp_shard  cp  tp  groups cross nodes  groups stay in a node",
        "1  16             1       128   1   8  pp(16) fsdp(128)    tp(8)",
    ]
    emitted = run_cli(*args, "--emit", "1")
    path = tmp_path / "meta.yaml"
    path.write_text(emitted.stdout)
    example = load_config("examples/llama3_405b_16384gpu_meta_order.yaml")
    assert load_config(path).layouts == example.layouts
    # a pipeline is 16 stages of 8 consecutive ranks: 128 ranks, 16 nodes
    assert example.layout("dense").group(0, "pp").ranks() == list(range(0, 128, 8))


def test_with_a_model_the_estimate_reads_locality_through_the_order(run_cli) -> None:
    """Every traffic entry's node flag is the flag of its dim in the row's own config."""
    order = "tp,cp,dp_shard,pp,dp_replicate"
    result = run_cli(
        "plan", "--world-size", "64", "--gpus-per-node", "8", "--model", "llama3-8b",
        "--order", order, "--limit", "20", "--format", "json",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["order"] == order.split(",")
    checked = 0
    for row in report["assignments"]:
        config = MeshConfig(
            world_size=64, gpus_per_node=8, degrees=row["degrees"], order=order.split(",")
        )
        for name, flow in row["communication"].items():
            layout = config.layout(home_domain(name))
            assert flow["crosses_nodes"] == layout.crosses_nodes(name, 8), (row["degrees"], name)
            checked += 1
    assert checked >= 20


def test_rows_the_order_leaves_out_are_counted(run_cli) -> None:
    args = ["plan", "--world-size", "12", "--gpus-per-node", "4", "--ep", "2"]
    result = run_cli(*args, "--order", "tp,cp,dp_shard,dp_replicate,pp", "--limit", "1")
    assert result.stdout.splitlines()[:3] == [
        "world_size 12 = 3 nodes x 4 GPUs; pinned: ep=2; order: tp, cp, dp_shard, dp_replicate, pp",
        "25 valid assignments; the best 1, best first (ranking: docs/plan.md)",
        "3 more left out: under this order their expert dims would split world factors unevenly",
    ]
    assert make_plan(Request(12, 4, {"ep": 2}), 1).total == 28


@pytest.mark.parametrize(
    ("order", "message"),
    [
        (
            "tpp,cp,dp_shard,pp,dp_replicate",
            "--order: unknown world factor 'tpp' (did you mean 'pp' or 'tp'?); order lists pp, "
            "dp_replicate, dp_shard, cp, tp",
        ),
        (
            "tp,cp,dp,pp",
            "--order: 'dp' is not a world factor: data parallelism is dp_replicate (outer) and "
            "dp_shard (inner); list both, next to each other for one data-parallel block",
        ),
        (
            "tp,cp,dp_shard,pp,tp",
            "--order: 'tp' appears twice in order",
        ),
        (
            "tp,cp,dp_shard",
            "--order: leaves out pp, dp_replicate: order lists every world factor once, outer "
            "to inner (pp, dp_replicate, dp_shard, cp, tp); one of size 1 may go anywhere",
        ),
        (
            "pp,dp_replicate,dp_shard,ep,tp",
            "--order: ep is not a world factor: experts borrow their ranks from dp_shard * cp * "
            "tp, so their ranks follow those; order lists pp, dp_replicate, dp_shard, cp, tp",
        ),
        ("", "--order: unknown world factor ''; order lists pp, dp_replicate, dp_shard, cp, tp"),
    ],
)
def test_a_bad_order_is_one_line_and_exit_2(run_cli, order: str, message: str) -> None:
    result = run_cli("plan", "--world-size", "8", "--order", order)
    assert (result.returncode, result.stdout) == (2, "")
    assert result.stderr == f"meshconf: error: {message}\n"


def test_an_order_no_expert_layout_can_follow_says_why(run_cli) -> None:
    result = run_cli(
        "plan", "--world-size", "6", "--tp", "3", "--dp-shard", "2", "--ep", "2",
        "--order", "tp,pp,dp_replicate,cp,dp_shard",
    )  # fmt: skip
    assert (result.returncode, result.stdout) == (2, "")
    assert result.stderr == (
        "meshconf: error: --dp-shard 2 --tp 3 --ep 2 --order tp,pp,dp_replicate,cp,dp_shard "
        "conflict at --world-size 6: in every assignment that ep and etp divide, an expert dim "
        "would split world factors that this order numbers apart unevenly; with pp=1 "
        "dp_replicate=1 dp_shard=2 cp=1 tp=3, ep(2) needs 2 ranks where the 3 ranks of tp "
        "remain\n"
    )
    # the same degrees as a config are refused for the same reason
    with pytest.raises(ValidationError, match=r"ep\(2\) in domain 'sparse' would split"):
        MeshConfig(
            world_size=6,
            degrees={"dp_shard": 2, "tp": 3, "ep": 2},
            order=["tp", "pp", "dp_replicate", "cp", "dp_shard"],
        )


def test_the_emitted_order_round_trips_through_yaml(run_cli) -> None:
    result = run_cli("plan", "--world-size", "8", "--order", ",".join(META), "--emit", "1")
    assert yaml.safe_load(result.stdout)["order"] == list(META)
