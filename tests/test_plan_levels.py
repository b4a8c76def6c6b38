"""``meshconf plan --level`` and the estimate on levels above the node: every row's level
counts against its config's layouts, bandwidth charged per level, and the command's output."""

from __future__ import annotations

import json
import math

import pytest
import yaml
from hypothesis import HealthCheck, given, settings, strategies as st

from meshconf import load_config
from meshconf.core.degrees import WORLD_FACTORS
from meshconf.core.levels import Level, crossed_levels
from meshconf.features.plan.estimate.communication import level_bandwidths, traffic
from meshconf.features.plan.estimate.presets import PRESETS
from meshconf.features.plan.estimate.step_inputs import Parallelism, Training
from meshconf.features.plan.locality import NodeLocality, home_domain
from meshconf.features.plan.ranking import build_config, make_plan
from meshconf.features.plan.request import PlanError, Request

ORDERS = [
    WORLD_FACTORS,
    ("dp_replicate", "dp_shard", "pp", "cp", "tp"),
    ("tp", "cp", "dp_shard", "dp_replicate", "pp"),
]


@st.composite
def requests(draw: st.DrawFn) -> Request:
    world = draw(st.sampled_from([16, 24, 48, 64, 96, 128]))
    gpus = draw(st.sampled_from([2, 4, 8]))
    sizes = [gpus * draw(st.sampled_from([2, 3, 4]))]
    if draw(st.booleans()):
        sizes.append(sizes[-1] * draw(st.sampled_from([2, 4])))
    levels = tuple(Level(f"level{index}", size) for index, size in enumerate(sizes))
    pins = {"ep": draw(st.sampled_from([1, 2, 4]))} if draw(st.booleans()) else {}
    return Request(world, gpus, pins, order=draw(st.sampled_from(ORDERS)), levels=levels)


@pytest.mark.slow  # a long generated sweep: the quick loop leaves it out
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(requests())
def test_every_row_s_level_counts_are_its_layouts(request_: Request) -> None:
    """The plan's arithmetic (no layout built) says how many levels each dim's groups cross;
    the validated config of the row says the same through its layouts."""
    plan = make_plan(request_, 10**6)
    sizes = [level.size for level in request_.levels]
    locality = NodeLocality(
        request_.world_size, request_.gpus_per_node, True, request_.rank_order, sizes
    )
    for assignment in plan.best:
        config = build_config(request_, assignment.degrees)
        assert [level.name for level in config.topology] == [
            "node",
            *(level.name for level in request_.levels),
        ]
        counts = locality.crossings(assignment.degrees)
        for name, count in counts.items():
            layout = config.layout(home_domain(name))
            assert count == len(crossed_levels(layout, name, config.topology)), (assignment, name)


def test_traffic_is_charged_at_the_smallest_level_that_holds_the_group() -> None:
    """ep inside an NVLink domain of 64 rides NVLink (900 GB/s); fsdp across domains the
    network; tp inside a node the node's links."""
    training = Training(intra_node_gb_s=900, inter_node_gb_s=50)
    levels = (Level("node", 4), Level("nvlink", 64, 900.0))
    bandwidths = level_bandwidths(levels, training)
    assert bandwidths == (900, 900.0, 50)
    par = Parallelism.of(
        {"pp": 4, "dp_replicate": 1, "dp_shard": 64, "cp": 1, "tp": 4, "ep": 16, "etp": 1}
    )
    flows = traffic(
        PRESETS["deepseek-v3"], par, training, {"tp": 0, "ep": 1, "fsdp": 2}, None, bandwidths
    )
    assert flows["tp"].gb_s == 900 and flows["ep"].gb_s == 900 and flows["fsdp"].gb_s == 50
    assert math.isclose(flows["ep"].seconds, flows["ep"].bytes / 900e9)
    without_level = traffic(PRESETS["deepseek-v3"], par, training, {"tp": 0, "ep": 1, "fsdp": 1})
    assert without_level["ep"].gb_s == 50
    assert without_level["ep"].seconds == pytest.approx(flows["ep"].seconds * 18)


def test_a_level_without_bandwidth_is_the_node_s_for_nvlink_and_the_network_s_above() -> None:
    training = Training(intra_node_gb_s=450, inter_node_gb_s=50)
    levels = (Level("node", 8), Level("nvlink", 72), Level("pod", 1152), Level("rack", 2304, 100.0))
    assert level_bandwidths(levels, training) == (450, 450, 50, 100.0, 50)


def test_plan_table_and_emit_with_an_nvlink_level(run_cli) -> None:  # type: ignore[no-untyped-def]
    args = ["plan", "--world-size", "1024", "--gpus-per-node", "4", "--level", "nvlink=64@900"]
    result = run_cli(*args, "--pp", "4", "--ep", "16", "--limit", "2")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert (
        lines[2].split("  ")[-3:]
        == [
            "groups cross nvlink domains",
            "cross nodes, in one nvlink domain",
            "groups stay in a node",
        ]
        or "groups cross nvlink domains" in lines[2]
    ), lines[2]
    first = lines[3].split()
    # pp, dp_replicate, dp_shard, cp, tp, then ep and etp, which experts are planned over
    assert first[:8] == ["1", "4", "16", "4", "1", "4", "16", "1"]
    assert first[8:] == ["pp(4)", "dp_replicate(16)", "fsdp(4)", "ep(16)", "tp(4)"]
    emitted = run_cli(*args, "--pp", "4", "--ep", "16", "--emit", "1")
    assert emitted.stdout.splitlines()[1] == (
        "# groups cross nvlink domains: pp(4) dp_replicate(16); cross nodes, in one nvlink "
        "domain: fsdp(4) ep(16); stay in a node: tp(4)"
    )
    config = yaml.safe_load(emitted.stdout)
    assert config["levels"] == [{"name": "nvlink", "size": 64, "bandwidth_gb_s": 900.0}]
    assert load_config(config).topology == (Level("node", 4), Level("nvlink", 64, 900.0))
    report = json.loads(run_cli(*args, "--pp", "4", "--ep", "16", "--format", "json").stdout)
    assert report["levels"] == [{"name": "nvlink", "size": 64, "bandwidth_gb_s": 900.0}]
    dims = {dim["name"]: dim["crosses"] for dim in report["assignments"][0]["dims"]}
    assert dims["ep"] == ["node"] and dims["pp"] == ["node", "nvlink"] and dims["tp"] == []


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["--level", "nvlink=64"],
            "--level nvlink=64 needs the node's size: add --level node=N (or --gpus-per-node "
            "N); a level holds whole nodes",
        ),
        (
            ["--gpus-per-node", "4", "--level", "nvlink=70"],
            "--level nvlink=70: one nvlink domain of 70 GPUs must hold whole units of the level "
            "below (one node of 4 GPUs): 70 is not a multiple of 4",
        ),
        (
            ["--gpus-per-node", "4", "--level", "nv link=64"],
            "--level 'nv link=64': expected NAME=SIZE or NAME=SIZE@GB/S, such as nvlink=72@900 "
            "(NAME: letters, digits and '_')",
        ),
        (
            ["--gpus-per-node", "4", "--level", "nvlink=64@nan"],
            "--level 'nvlink=64@nan': expected a number from 0.01 to 100000, got 'nan'",
        ),
        (
            ["--gpus-per-node", "4", "--level", "nvlink=" + "9" * 5000],
            "--level 'nvlink=999999999999999999999999999999...': an integer of 5,000 digits is "
            "larger than 2147483647, the most ranks torch can number",
        ),
        (
            ["--gpus-per-node", "4", "--level", "nvlink=64", "--level", "nvlink=128"],
            "--level nvlink=128: level 'nvlink' appears twice",
        ),
        (
            ["--level", "node=8", "--level", "node=4"],
            "--level node=4: level 'node' appears twice; give each level once",
        ),
    ],
)
def test_bad_levels_are_one_line_and_exit_2(run_cli, args: list[str], message: str) -> None:  # type: ignore[no-untyped-def]
    result = run_cli("plan", "--world-size", "1024", *args)
    assert result.returncode == 2
    (line,) = result.stderr.splitlines()
    assert line.startswith(f"meshconf: error: {message}"), line


def test_a_request_s_levels_are_checked_like_a_config_s() -> None:
    with pytest.raises(PlanError, match="must hold whole units"):
        make_plan(Request(64, 8, levels=(Level("nvlink", 12),)), 1)
