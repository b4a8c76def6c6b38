"""``meshconf plan``: enumeration, ranking by node locality, --emit, and usage errors."""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path

import pytest
from pydantic import ValidationError

from meshconf.core.degrees import WORLD_FACTORS
from meshconf.core.layout import DomainLayout
from meshconf.features.plan.assignments import ValidAssignments
from meshconf.features.plan.locality import RANKED_DIMS, NodeLocality, home_domain
from meshconf.features.plan.ranking import build_config, make_plan, rationale
from meshconf.features.plan.request import PlanError, Request
from meshconf.model.config import MeshConfig

# --- known answers ------------------------------------------------------------------------


def test_textbook_32_nodes_of_8_with_tp_8_keeps_tp_groups_in_a_node() -> None:
    plan = make_plan(Request(256, 8, {"tp": 8}), 100)
    best = plan.best[0]
    config = build_config(plan.request, best.degrees)
    assert not config.layout("dense").crosses_nodes("tp", 8)
    # dp = 32 across the nodes: a model that needs tp 8 needs its state sharded, so FSDP
    # first and pure DDP, whose locality alone would put it first, last of the pp 1 rows.
    assert [dict(a.degrees) for a in plan.best[:2]] == [
        {"pp": 1, "dp_replicate": 1, "dp_shard": 32, "cp": 1, "tp": 8, "ep": 1, "etp": 1},
        {"pp": 1, "dp_replicate": 2, "dp_shard": 16, "cp": 1, "tp": 8, "ep": 1, "etp": 1},
    ]
    pp_1 = [dict(a.degrees) for a in plan.best if a.degrees["pp"] == 1]
    assert pp_1[-1] == {
        "pp": 1,
        "dp_replicate": 32,
        "dp_shard": 1,
        "cp": 1,
        "tp": 8,
        "ep": 1,
        "etp": 1,
    }
    # 32 = 2**5 split over pp, dp_replicate and dp_shard (cp is 1 unless pinned): C(7, 2).
    assert plan.total == math.comb(7, 2)


def test_cp_is_enumerated_only_when_pinned() -> None:
    unpinned = make_plan(Request(64, 8, {"tp": 8}), 1000)
    assert {a.degrees["cp"] for a in unpinned.best} == {1}
    pinned = make_plan(Request(64, 8, {"tp": 8, "cp": 2}), 1000)
    assert {a.degrees["cp"] for a in pinned.best} == {2}
    assert pinned.total == math.comb(4, 2)  # 4 = 2**2 over pp, dp_replicate, dp_shard


def test_without_tp_pinned_replicas_alone_keep_their_locality_rank() -> None:
    best = make_plan(Request(64, 8, {}), 1).best[0]
    assert (best.degrees["dp_replicate"], best.degrees["dp_shard"], best.degrees["tp"]) == (8, 1, 8)


def test_textbook_512_ranks_as_dp_8_pp_8_tp_8(run_cli) -> None:
    result = run_cli(
        "plan", "--world-size", "512", "--gpus-per-node", "8", "--tp", "8", "--pp", "8"
    )
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    assert result.stdout.splitlines() == [
        "world_size 512 = 64 nodes x 8 GPUs; pinned: pp=8 tp=8",
        "4 valid assignments; all, best first (ranking: docs/plan.md)",
        "#  pp  dp_replicate  dp_shard  cp  tp  groups cross nodes             groups stay in a node",
        "1   8             1         8   1   8  pp(8) fsdp(8)                  tp(8)",
        "2   8             2         4   1   8  pp(8) dp_replicate(2) fsdp(4)  tp(8)",
        "3   8             4         2   1   8  pp(8) dp_replicate(4) fsdp(2)  tp(8)",
        "4   8             8         1   1   8  pp(8) dp_replicate(8)          tp(8)",
    ]


def test_textbook_512_lists_every_split_of_dp_8_and_with_cp_pinned_free_every_split() -> None:
    plan = make_plan(Request(512, 8, {"tp": 8, "pp": 8}), 100)
    listed = {(a.degrees["dp_replicate"], a.degrees["dp_shard"]) for a in plan.best}
    assert listed == {(r, s) for r, s in itertools.product([1, 2, 4, 8], repeat=2) if r * s == 8}
    assert plan.total == 4


def _documented_ranking(
    world: int, gpus_per_node: int, order: tuple[str, ...] | None = None
) -> list[dict[str, int]]:
    """Every assignment of the world factors, sorted by the rules of docs/plan.md, each rule
    read off the validated config's own layouts (no plan code), in ``order`` if given."""
    ordered = {} if order is None else {"order": list(order)}
    rows = []
    divisors_of_world = [d for d in range(1, world + 1) if world % d == 0]
    for values in itertools.product(divisors_of_world, repeat=len(WORLD_FACTORS)):
        if math.prod(values) != world:
            continue
        degrees = dict(zip(WORLD_FACTORS, values, strict=True))
        if degrees["cp"] != 1:  # cp is enumerated only when pinned
            continue
        config = MeshConfig(world_size=world, degrees=degrees, **ordered)
        dense, dataloading = config.layout("dense"), config.layout("dataloading")

        def crosses(layout: DomainLayout, dim: str) -> bool:
            return layout.dim(dim).size > 1 and layout.crosses_nodes(dim, gpus_per_node)

        key = (
            crosses(dense, "tp"),  # 1
            crosses(dataloading, "cp"),  # 2
            degrees["pp"],  # 4
            crosses(dense, "fsdp"),  # 5
            crosses(dense, "dp_replicate"),  # 6
            degrees["dp_replicate"],  # 7
            degrees["cp"],
            degrees["dp_shard"],
        )
        rows.append((key, degrees))
    return [degrees for _, degrees in sorted(rows, key=lambda row: row[0])]


def test_the_ranking_follows_the_documented_rules_in_turn() -> None:
    plan = make_plan(Request(64, 8, {}), 1000)
    ranked = [{name: a.degrees[name] for name in WORLD_FACTORS} for a in plan.best]
    assert ranked == _documented_ranking(64, 8)
    # Best: tp fills the node, no pipeline, one replica per node (DDP across nodes).
    assert dict(plan.best[0].degrees) == {
        "pp": 1,
        "dp_replicate": 8,
        "dp_shard": 1,
        "cp": 1,
        "tp": 8,
        "ep": 1,
        "etp": 1,
    }
    # The last ones put tp across nodes (key[0] is 0 here: tp is not pinned).
    assert plan.best[-1].key[:2] == (0, 1)


@pytest.mark.parametrize(
    "order",
    [
        ("dp_replicate", "dp_shard", "pp", "cp", "tp"),  # Llama 3's: data parallelism outermost
        tuple(reversed(WORLD_FACTORS)),
        ("dp_shard", "tp", "pp", "dp_replicate", "cp"),
    ],
    ids="-".join,
)
def test_under_any_order_the_ranking_follows_the_documented_rules(order: tuple[str, ...]) -> None:
    plan = make_plan(Request(96, 8, {}, order=order), 1000)
    ranked = [{name: a.degrees[name] for name in WORLD_FACTORS} for a in plan.best]
    assert ranked == _documented_ranking(96, 8, order)


def test_without_gpus_per_node_fewer_stages_replicas_cp_and_shards_win() -> None:
    plan = make_plan(Request(8), 3)
    assert [tuple(a.degrees[name] for name in WORLD_FACTORS) for a in plan.best] == [
        (1, 1, 1, 1, 8),
        (1, 1, 2, 1, 4),
        (1, 1, 4, 1, 2),
    ]


# --- every row is a valid config, and the fast flags are its layouts' ---------------------

REQUESTS = [
    Request(256, 8, {"tp": 8}),
    Request(512, 8, {"tp": 8, "pp": 8}),
    Request(64, 8, {}),
    Request(48, 6, {}),
    Request(12, 8, {}),
    Request(8, 16, {}),
    Request(60, 4, {"cp": 3}),
    Request(64, 8, {"ep": 4}),
    Request(64, 8, {"ep": 2, "etp": 4}),
    Request(96, 8, {"ep": 3, "etp": 2}),
    Request(32, None, {"dp_shard": 4}),
]


@pytest.mark.parametrize("request_", REQUESTS, ids=str)
def test_every_assignment_validates_and_its_flags_are_the_layouts(request_: Request) -> None:
    plan = make_plan(request_, 10**6)
    assert len(plan.best) == plan.total
    locality = NodeLocality(request_.world_size, request_.gpus_per_node, experts=True)
    for assignment in plan.best:
        config = build_config(request_, assignment.degrees)  # raises if a rule fails
        assert config.resolved_degrees == dict(assignment.degrees)
        if request_.gpus_per_node is None:
            continue
        flags = locality.crossings(assignment.degrees)
        for name, block in locality.blocks(assignment.degrees).items():
            modes = config.layout(home_domain(name)).dim(name).modes
            assert block == max(
                (mode.size * mode.stride for mode in modes if mode.size > 1), default=1
            )
            expected = config.layout(home_domain(name)).crosses_nodes(name, request_.gpus_per_node)
            assert flags[name] == expected, (assignment, name)


def test_rationale_reads_the_config_layouts() -> None:
    request = Request(64, 8, {"ep": 8})
    config = build_config(request, make_plan(request, 1).best[0].degrees)
    dims = rationale(request, config)
    assert [dim.name for dim in dims] == list(RANKED_DIMS)
    assert {dim.name: dim.crosses_nodes for dim in dims if dim.size > 1} == {
        "dp_replicate": True,
        "tp": False,
        "ep": False,
    }


# --- the count equals a brute force over every tuple -------------------------------------


def _brute_force_count(world: int, pins: dict[str, int], order: list[str] | None) -> int:
    """Every 5-tuple in [1, world]^5, kept when its product is the world, it keeps the pins
    (cp is 1 unless pinned), and MeshConfig accepts it with the pinned ep and etp, in
    ``order`` when one is given."""
    ordered = {} if order is None else {"order": order}
    experts = {name: pins[name] for name in ("ep", "etp") if name in pins}
    count = 0
    divisors = [size for size in range(1, world + 1) if world % size == 0]
    for values in itertools.product(divisors, repeat=len(WORLD_FACTORS)):
        if math.prod(values) != world:
            continue
        degrees = dict(zip(WORLD_FACTORS, values, strict=True))
        if any(degrees[name] != value for name, value in pins.items() if name in degrees):
            continue
        if degrees["cp"] != pins.get("cp", 1):
            continue
        try:
            MeshConfig(world_size=world, degrees={**degrees, **experts}, **ordered)
        except ValidationError:
            continue
        count += 1
    return count


REVERSED = list(reversed(WORLD_FACTORS))


@pytest.mark.parametrize(
    ("world", "pins", "order"),
    [
        (12, {}, None),
        (16, {}, None),
        (16, {"tp": 2}, None),
        (18, {"cp": 3, "pp": 2}, None),
        (16, {"ep": 4}, None),
        (12, {"ep": 2, "etp": 2}, None),
        (24, {"ep": 3, "etp": 4}, None),
        # Orders that keep apart world factors an expert dim must share: fewer are valid.
        (12, {"ep": 2}, REVERSED),
        (24, {"ep": 4}, ["tp", "pp", "dp_shard", "dp_replicate", "cp"]),
        (36, {"cp": 3, "ep": 2}, ["cp", "pp", "dp_replicate", "tp", "dp_shard"]),
    ],
)
def test_the_count_equals_a_brute_force(
    world: int, pins: dict[str, int], order: list[str] | None
) -> None:
    request = Request(world, 4, pins, order=None if order is None else tuple(order))
    plan = make_plan(request, 1)
    assert plan.total == _brute_force_count(world, pins, order)
    assert plan.total == sum(1 for _ in ValidAssignments(request))


# --- --emit -----------------------------------------------------------------------------


def test_emit_prints_a_config_that_validates(run_cli, tmp_path: Path) -> None:
    args = ["--world-size", "64", "--gpus-per-node", "8", "--ep", "4", "--etp", "2", "--emit", "1"]
    result = run_cli("plan", *args)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [
        "# meshconf plan --world-size 64 --gpus-per-node 8 --ep 4 --etp 2 --emit 1 (assignment 1 of 10)",
        "# groups cross nodes: dp_replicate(8); stay in a node: fsdp(4) tp(2) ep(4) etp(2)",
        "world_size: 64",
        "gpus_per_node: 8",
        "inside:",
        "  node: [fsdp, tp, ep, etp]",
        "degrees:",
        "  pp: 1",
        "  dp_replicate: 8",
        "  dp_shard: 4",
        "  cp: 1",
        "  tp: 2",
        "  ep: 4",
        "  etp: 2",
    ]
    path = tmp_path / "planned.yaml"
    path.write_text(result.stdout)
    checked = run_cli("validate", str(path))
    assert checked.returncode == 0, checked.stdout
    assert checked.stdout == f"{path}: ok (world_size 64)\n"


@pytest.mark.parametrize("index", ["1", "5", "21"])
def test_every_emitted_row_validates(run_cli, tmp_path: Path, index: str) -> None:
    result = run_cli(
        "plan", "--world-size", "256", "--gpus-per-node", "8", "--tp", "8", "--emit", index
    )
    assert result.returncode == 0, result.stderr
    path = tmp_path / "planned.yaml"
    path.write_text(result.stdout)
    assert run_cli("validate", str(path)).returncode == 0


def test_emit_without_gpus_per_node_leaves_out_the_key_and_the_locality_line(run_cli) -> None:
    result = run_cli("plan", "--world-size", "8", "--tp", "2", "--emit", "1")
    assert result.stdout.splitlines()[:3] == [
        "# meshconf plan --world-size 8 --tp 2 --emit 1 (assignment 1 of 6)",
        "world_size: 8",
        "degrees:",
    ]


# --- output forms -------------------------------------------------------------------------


def test_json_lists_the_rows_with_their_dims(run_cli) -> None:
    result = run_cli(
        "plan",
        "--world-size",
        "4",
        "--gpus-per-node",
        "2",
        "--tp",
        "2",
        "--limit",
        "1",
        "--format",
        "json",
    )
    assert result.returncode == 0
    assert json.loads(result.stdout) == {
        "world_size": 4,
        "gpus_per_node": 2,
        "pins": {"tp": 2},
        "order": ["pp", "dp_replicate", "dp_shard", "cp", "tp"],
        "total": 3,
        "left_out_by_order": 0,
        "left_out": {},
        "tried": {},
        "assignments": [
            {
                "index": 1,
                "degrees": {
                    "pp": 1,
                    "dp_replicate": 1,
                    "dp_shard": 2,
                    "cp": 1,
                    "tp": 2,
                    "ep": 1,
                    "etp": 1,
                },
                "dims": [
                    {"name": "pp", "size": 1, "crosses_nodes": False},
                    {"name": "dp_replicate", "size": 1, "crosses_nodes": False},
                    {"name": "fsdp", "size": 2, "crosses_nodes": True},
                    {"name": "cp", "size": 1, "crosses_nodes": False},
                    {"name": "tp", "size": 2, "crosses_nodes": False},
                ],
            }
        ],
    }


def test_a_world_that_does_not_fill_its_last_node_is_planned_with_a_warning(run_cli) -> None:
    result = run_cli("plan", "--world-size", "12", "--gpus-per-node", "8", "--limit", "1")
    assert result.returncode == 0
    assert result.stderr == (
        "meshconf: warning: --world-size 12 is not a multiple of --gpus-per-node 8: "
        "the last node holds 4 ranks\n"
    )
    assert result.stdout.splitlines()[-1].split()[:6] == ["1", "1", "3", "1", "1", "4"]


def test_a_node_larger_than_the_world_is_planned_with_a_warning(run_cli) -> None:
    result = run_cli("plan", "--world-size", "8", "--gpus-per-node", "16", "--limit", "1")
    assert result.returncode == 0
    assert result.stderr == (
        "meshconf: warning: --gpus-per-node 16 is more than --world-size 8: all ranks are in "
        "one node, so no group crosses nodes\n"
    )


# --- usage errors ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--world-size", "8", "--tp", "3"], "--tp 3 does not divide --world-size 8"),
        (
            ["--world-size", "64", "--tp", "16", "--pp", "8"],
            "--pp 8 --tp 16 do not fit --world-size 64: pp(8) * tp(16) = 128 does not divide 64",
        ),
        (
            [
                "--world-size",
                "16",
                "--pp",
                "1",
                "--dp-replicate",
                "2",
                "--dp-shard",
                "2",
                "--cp",
                "1",
                "--tp",
                "2",
            ],
            "--pp 1 --dp-replicate 2 --dp-shard 2 --cp 1 --tp 2 do not fit --world-size 16: "
            "pp(1) * dp_replicate(2) * dp_shard(2) * cp(1) * tp(2) = 8 != 16, and no degree is "
            "left free to take the rest",
        ),
        (
            ["--world-size", "64", "--tp", "8", "--etp", "4"],
            "--tp 8 --etp 4 conflict: etp(4) must be 1 or equal to tp(8)",
        ),
        (
            ["--world-size", "16", "--pp", "2", "--ep", "16"],
            "--pp 2 --ep 16 conflict at --world-size 16: no assignment has ep(16) * etp(1) = 16 "
            "dividing dp_shard * cp * tp; with ep 16, pp may be 1; with pp 2, ep may be 1, 2, "
            "4 or 8",
        ),
        (
            ["--world-size", "16", "--ep", "8", "--etp", "4"],
            "--ep 8 --etp 4 conflict at --world-size 16: no assignment has ep(8) * etp(4) = 32 "
            "dividing dp_shard * cp * tp (and tp = etp(4)); with etp 4, ep may be 1, 2 or 4; "
            "with ep 8, etp may be 1 or 2",
        ),
        (["--world-size", "0"], "--world-size: expected an integer >= 1, got '0'"),
        (["--world-size", "8", "--tp", "-2"], "--tp: expected an integer >= 1, got '-2'"),
        (["--world-size", "8", "--cp", "two"], "--cp: expected an integer >= 1, got 'two'"),
        (["--world-size", "8", "--limit", "0"], "--limit: expected an integer >= 1, got '0'"),
        (["--tp", "2"], "--world-size N is required (or a CONFIG with world_size)"),
        (
            ["--world-size", "8", "--emit", "99"],
            "--emit 99 is not a row: there are 20 valid assignments",
        ),
        (
            ["--world-size", "8", "--emit", "1", "--format", "json"],
            "--emit prints a YAML config; leave out --format json",
        ),
        (
            ["--world-size", "8", "--gpus-per-node", "5000"],
            "--gpus-per-node 5000 is more than any node holds (at most 4096)",
        ),
        (
            ["--world-size", "4294967296"],
            "--world-size: 4294967296 is larger than 2147483647, the most ranks torch can number",
        ),
    ],
)
def test_usage_errors_are_one_line_and_exit_2(run_cli, args: list[str], message: str) -> None:
    result = run_cli("plan", *args)
    assert result.returncode == 2
    assert result.stdout == ""
    assert result.stderr == f"meshconf: error: {message}\n"


def test_plan_error_is_a_value_error() -> None:
    with pytest.raises(PlanError, match="does not divide"):
        make_plan(Request(8, None, {"pp": 3}), 1)


# --- large worlds (their timings are in docs/plan.md, not asserted here) ----------------------


@pytest.mark.parametrize("world", [2**16, 2**20])
def test_highly_composite_worlds_count_every_assignment(world: int) -> None:
    # With cp 1, 2**16 has C(19, 3) = 969 assignments and 2**20 has C(23, 3) = 1771.
    plan = make_plan(Request(world, 8), 10)
    exponent = world.bit_length() - 1
    assert plan.total == math.comb(exponent + 3, 3)


@pytest.mark.parametrize("number", [1, 2, 12, 97, 360, 720720, 2**20, 2 * 1_000_003])
def test_divisors_match_trial_division(number: int) -> None:
    from meshconf.core.degrees import divisors

    small = [d for d in range(1, math.isqrt(number) + 1) if number % d == 0]
    assert divisors(number) == sorted({*small, *(number // d for d in small)})
