"""The layouts a model can run: each rule's exact message, plans whose every row the model
can run (and whose rows and left-out layouts add up to every layout enumerated), ep and etp
explored for a model with experts, pins that leave no row named where they came from, and
`show` and `validate` refusing a config's layout at the degree."""

from __future__ import annotations

import json
import tempfile
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from subprocess import CompletedProcess

import pytest
import yaml
from hypothesis import HealthCheck, given, settings, strategies as st

from meshconf.core.degrees import WORLD_FACTORS, divisors
from meshconf.core.messages import either
from meshconf.core.schedules import Schedule
from meshconf.features.plan.estimate.architecture import Architecture, GroupedQueryAttention
from meshconf.features.plan.estimate.model_file import load_model_file
from meshconf.features.plan.estimate.presets import PRESETS
from meshconf.features.plan.estimate.step_inputs import Training
from meshconf.features.plan.ranking import config_data, make_plan
from meshconf.features.plan.request import PlanError, Request
from meshconf.features.plan.runnable import Unrunnable, unrunnable

DSV3 = PRESETS["deepseek-v3"]
LLAMA = PRESETS["llama3-8b"]


# --- each rule's message ------------------------------------------------------------------


def test_tp_must_divide_the_attention_heads_of_latent_attention() -> None:
    assert unrunnable(DSV3, {"tp": 24}, Training()) == [
        Unrunnable(
            "tp",
            "tp does not divide deepseek-v3's 128 attention heads",
            "24 does not divide deepseek-v3's 128 attention heads; use 1, 2, 4, 8, 16, 32, 64 "
            "or 128",
        )
    ]


def test_tp_and_the_kv_heads_must_divide_one_another() -> None:
    # 48 heads and 16 KV heads: tp 24 divides the heads, and neither divides the other
    arch = replace(LLAMA, name="gqa", attention=GroupedQueryAttention(48, 16, 128), ffn=48)
    assert unrunnable(arch, {"tp": 24}, Training()) == [
        Unrunnable(
            "tp",
            "tp and gqa's 16 KV heads do not divide one another",
            "24 and gqa's 16 KV heads do not divide one another; use 1, 2, 4, 8, 16 or 48",
        )
    ]
    # a tp above the KV heads replicates them
    assert unrunnable(arch, {"tp": 48}, Training()) == []


def test_tp_must_divide_the_dense_and_the_shared_expert_feed_forward() -> None:
    dense = replace(LLAMA, name="narrow", ffn=14330)
    (problem,) = unrunnable(dense, {"tp": 4}, Training())
    assert problem.message == (
        "4 does not divide narrow's dense feed-forward width of 14330; use 1 or 2"
    )
    assert DSV3.experts is not None
    shared = replace(DSV3, name="shared", experts=replace(DSV3.experts, ffn=2047, dense_layers=0))
    (problem,) = unrunnable(shared, {"tp": 2}, Training())
    assert problem == Unrunnable(
        "tp",
        "tp does not divide shared's shared-expert feed-forward width of 2047",
        "2 does not divide shared's shared-expert feed-forward width of 2047; use 1",
    )


def test_ep_must_divide_the_routed_experts_and_needs_experts() -> None:
    assert unrunnable(DSV3, {"ep": 72}, Training()) == [
        Unrunnable(
            "ep",
            "ep does not divide deepseek-v3's 256 routed experts",
            "72 does not divide deepseek-v3's 256 routed experts; use 1, 2, 4, 8, 16, 32, 64, "
            "128 or 256",
        )
    ]
    assert unrunnable(LLAMA, {"ep": 2}, Training()) == [
        Unrunnable("ep", "ep needs experts, and llama3-8b has none", "2 needs experts, and "
                   "llama3-8b has none; use 1")
    ]  # fmt: skip


def test_etp_is_1_or_tp_and_divides_the_expert_feed_forward() -> None:
    (problem,) = unrunnable(DSV3, {"tp": 4, "etp": 2}, Training())
    assert problem == Unrunnable("etp", "etp is neither 1 nor tp", "2 is neither 1 nor tp (4); "
                                 "use 1 or 4")  # fmt: skip
    qwen = PRESETS["qwen3-30b-a3b"]
    assert qwen.experts is not None
    odd = replace(qwen, name="odd", experts=replace(qwen.experts, ffn=776))  # 8 * 97
    assert unrunnable(odd, {"tp": 8, "etp": 8}, Training()) == []
    (problem,) = unrunnable(odd, {"tp": 16, "etp": 16}, Training())
    assert problem == Unrunnable(
        "etp",
        "etp does not divide odd's expert feed-forward width of 776",
        "16 does not divide odd's expert feed-forward width of 776; use 1",
    )


def test_every_pipeline_chunk_keeps_a_layer_after_the_pipeline_options() -> None:
    (problem,) = unrunnable(LLAMA, {"pp": 64}, Training())
    assert problem == Unrunnable(
        "pp",
        "pp cannot split llama3-8b's 32 layers",
        "64 cannot split llama3-8b's 32 layers: 64 pipeline chunks for 32 layers: some chunk "
        "holds none; use 1 to 32",
    )
    looped = Training(schedule="interleaved", virtual_stages=4)
    (problem,) = unrunnable(LLAMA, {"pp": 16}, looped)
    assert problem.message == (
        "16 cannot split llama3-8b's 32 layers: 64 pipeline chunks for 32 layers: some chunk "
        "holds none; use 1 to 8"
    )
    ends = Training(first_stage_layers=30, last_stage_layers=1)
    (problem,) = unrunnable(LLAMA, {"pp": 4}, ends)
    assert problem.message == (
        "4 cannot split llama3-8b's 32 layers: first and last chunks of 30 and 1 layers leave 1 "
        "of 32 layers for the other 2 pipeline chunks: each needs at least one; use 3"
    )


def test_cp_splits_the_sequence_into_twice_cp_equal_chunks() -> None:
    (problem,) = unrunnable(LLAMA, {"cp": 3}, Training(seq_len=8192))
    assert problem == Unrunnable(
        "cp",
        "cp does not split the 8192-token sequence into 2 * cp equal chunks",
        "3 does not split the 8192-token sequence into 2 * 3 = 6 equal chunks, as load-balanced "
        "causal attention needs; use 1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048 or 4096",
    )
    assert unrunnable(LLAMA, {"cp": 4096}, Training(seq_len=8192)) == []


def test_each_degree_reports_its_first_problem_in_degree_order() -> None:
    found = unrunnable(DSV3, {"tp": 3, "ep": 3, "pp": 62, "cp": 5}, Training(seq_len=4096))
    assert [problem.degree for problem in found] == ["tp", "ep", "pp", "cp"]


# --- plans: every row runs, and the counts add up ---------------------------------------


def _model_file(draw: st.DrawFn) -> Architecture:
    """A model file as a user writes one, read by meshconf's reader."""
    heads = draw(st.sampled_from([4, 6, 8, 12, 16, 24]))
    kv = draw(st.sampled_from([d for d in divisors(heads)]))
    data: dict[str, object] = {
        "name": "drawn",
        "layers": draw(st.integers(1, 12)),
        "hidden": heads * 16,
        "ffn": draw(st.sampled_from([48, 64, 96, 100])),
        "vocab": 512,
        "attention": {"heads": heads, "kv_heads": kv},
    }
    if draw(st.booleans()):
        data["experts"] = {
            "routed": draw(st.sampled_from([2, 4, 6, 8, 12])),
            "top_k": 2,
            "ffn": draw(st.sampled_from([24, 32, 36])),
            "shared": draw(st.integers(0, 1)),
            "dense_layers": draw(st.integers(0, 1)),
        }
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "model.yaml"
        path.write_text(yaml.safe_dump(data))
        return load_model_file(str(path))


@st.composite
def _requests(draw: st.DrawFn) -> Request:
    if draw(st.booleans()):
        model = PRESETS[draw(st.sampled_from(sorted(PRESETS)))]
        worlds = [16, 24, 48, 64, 96]
    else:
        model = _model_file(draw)
        worlds = [4, 6, 8, 12, 16, 24]
    world = draw(st.sampled_from(worlds))
    schedule: Schedule = draw(st.sampled_from(["1f1b", "interleaved", "dualpipe", "zbv"]))
    training = Training(
        seq_len=draw(st.sampled_from([4096, 4098, 6000])),
        schedule=schedule,
        virtual_stages=2 if schedule == "interleaved" else 1,
    )
    pins = {}
    if draw(st.booleans()):
        pins["cp"] = draw(st.sampled_from([d for d in divisors(world) if d <= 4]))
    if draw(st.booleans()):
        pins["ep"] = draw(st.sampled_from([1, 2, 3, 4]))
    return Request(world, draw(st.sampled_from([None, 4, 8])), pins, model, training)


def _enumerated(request: Request) -> int:
    """Every layout the plan enumerates before the model's rules, counted by brute force:
    world factors that multiply to the world and keep the pins, ep and etp as pinned or
    (with experts) every divisor of the routed experts and 1 or tp, under meshconf's expert
    rules."""
    model = request.model
    assert model is not None
    pins = request.pins
    count = 0
    for values in _tuples(request.world_size, len(WORLD_FACTORS)):
        degrees = dict(zip(WORLD_FACTORS, values, strict=True))
        if any(pins.get(name, value) != value for name, value in degrees.items()):
            continue
        if "cp" not in pins and degrees["cp"] != 1:
            continue
        experts = model.experts
        eps = [pins["ep"]] if "ep" in pins else divisors(experts.routed) if experts else [1]
        etps = [1] if experts is None else sorted({1, degrees["tp"]})
        lender = degrees["dp_shard"] * degrees["cp"] * degrees["tp"]
        count += sum(1 for ep in eps for etp in etps if lender % (ep * etp) == 0)
    return count


def _tuples(world: int, length: int) -> list[tuple[int, ...]]:
    if length == 1:
        return [(world,)]
    return [(d, *rest) for d in divisors(world) for rest in _tuples(world // d, length - 1)]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_requests())
def test_every_row_of_a_plan_is_a_layout_its_model_can_run(request: Request) -> None:
    try:
        plan = make_plan(request, 10**6)
    except PlanError as error:
        # nothing is left: then every layout enumerated was left out for the model's rules
        assert "can run" in str(error) or "conflict" in str(error), str(error)
        return
    model = request.model
    assert model is not None
    for row in plan.best:
        assert unrunnable(model, row.degrees, request.training) == [], row.degrees
        # the emitted config writes the expert degrees the row was planned with
        written = config_data(request, row.degrees)["degrees"]
        assert isinstance(written, dict)
        assert all(written.get(name, 1) == row.degrees[name] for name in ("ep", "etp"))
    assert len(plan.best) == plan.total
    assert plan.total + sum(plan.left_out.values()) == _enumerated(request)


def test_a_plan_counts_its_left_out_layouts_by_reason() -> None:
    request = Request(96, 8, {}, LLAMA, Training())
    plan = make_plan(request, 1)
    assert plan.left_out == {
        "tp does not divide llama3-8b's 32 attention heads": 56,
        "pp cannot split llama3-8b's 32 layers": 4,
    }
    assert plan.total + sum(plan.left_out.values()) == _enumerated(request)


def test_a_model_s_plan_that_the_order_alone_empties_says_so() -> None:
    # counting the rows before estimating them must keep the uneven split it found
    mixtral = PRESETS["mixtral-8x7b"]
    assert isinstance(mixtral.attention, GroupedQueryAttention)
    model = replace(mixtral, attention=replace(mixtral.attention, heads=24, kv_heads=12))
    pins = {"dp_shard": 2, "tp": 3, "ep": 2, "etp": 1}
    order = ("pp", "dp_replicate", "cp", "tp", "dp_shard")
    request = Request(12, None, pins, model, Training(), order=order)
    with pytest.raises(PlanError, match=r"ep\(2\) needs 2 ranks where the 3 ranks of tp remain"):
        make_plan(request, 1)


# --- experts explored ------------------------------------------------------------------


def test_a_model_with_experts_is_planned_at_every_ep_its_experts_and_the_rules_allow() -> None:
    request = Request(1024, 8, {"pp": 16}, DSV3, Training(seq_len=4096))
    plan = make_plan(request, 10**6)
    eps = {row.degrees["ep"] for row in plan.best}
    assert eps == {1, 2, 4, 8, 16, 32, 64}
    assert plan.tried == {"ep": (1, 2, 4, 8, 16, 32, 64), "etp": (1, 2, 4, 8, 16, 32, 64)}
    for row in plan.best:
        degrees = row.degrees
        lender = degrees["dp_shard"] * degrees["cp"] * degrees["tp"]
        assert lender % (degrees["ep"] * degrees["etp"]) == 0
        assert degrees["etp"] in (1, degrees["tp"])
    # the best row splits the experts
    assert plan.best[0].degrees["ep"] > 1


def test_the_emitted_config_of_a_row_writes_its_expert_degrees() -> None:
    request = Request(64, 8, {"pp": 4}, PRESETS["mixtral-8x7b"], Training())
    data = config_data(request, {"pp": 4, "dp_replicate": 1, "dp_shard": 8, "cp": 1, "tp": 2,
                                 "ep": 8, "etp": 2})  # fmt: skip
    assert data["degrees"] == {
        "pp": 4, "dp_replicate": 1, "dp_shard": 8, "cp": 1, "tp": 2, "ep": 8, "etp": 2
    }  # fmt: skip


# --- the command line ------------------------------------------------------------------


GB200 = """\
world_size: 1152
levels:
  - {name: node, size: 4, bandwidth_gb_s: 900}
  - {name: nvlink, size: 72, bandwidth_gb_s: 900}
degrees:
  pp: 16
  dp_shard: -1
"""
GB200_OPTIONS = ["--gpu", "gb200", "--model", "deepseek-v3", "--seq-len", "4096"]
GB200_OPTIONS += ["--global-batch-tokens", "62914560", "--pp-schedule", "dualpipe"]


def test_the_header_says_what_was_left_out_and_which_experts_were_tried(
    run_cli: Callable[..., CompletedProcess[str]],
    tmp_path: Path,
) -> None:
    path = tmp_path / "gb200.yaml"
    path.write_text(GB200)
    result = run_cli("plan", str(path), *GB200_OPTIONS, "--limit", "1")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[4:6] == [
        "150 left out: tp does not divide deepseek-v3's 128 attention heads",
        "ep tried: 1, 2, 4, 8; etp: 1, 2, 4, 8",
    ]
    report = json.loads(run_cli("plan", str(path), *GB200_OPTIONS, "--format", "json").stdout)
    assert report["left_out"] == {"tp does not divide deepseek-v3's 128 attention heads": 150}
    assert report["tried"] == {"ep": [1, 2, 4, 8], "etp": [1, 2, 4, 8]}
    tp = [row["degrees"]["tp"] for row in report["assignments"]]
    assert set(tp) <= set(divisors(128))


def test_a_pin_that_leaves_no_row_says_where_each_pin_came_from(
    run_cli: Callable[..., CompletedProcess[str]],
    tmp_path: Path,
) -> None:
    path = tmp_path / "gb200.yaml"
    path.write_text(GB200)
    result = run_cli("plan", str(path), *GB200_OPTIONS, "--ep", "64")
    assert (result.returncode, result.stdout) == (2, "")
    assert result.stderr == (
        f"meshconf: error: {path}:6: degrees.pp 16 and --ep 64 conflict at --world-size 1152: "
        "no assignment has ep(64) * etp(1) = 64 dividing dp_shard * cp * tp; with ep 64, pp "
        "may be 1, 2, 6 or 18; with pp 16, ep may be 1, 2, 4 or 8\n"
    )


def test_a_tp_the_model_cannot_run_is_refused_with_the_tps_it_can(run_cli) -> None:  # type: ignore[no-untyped-def]
    args = ["--world-size", "96", "--gpus-per-node", "8", "--model", "llama3-8b", "--tp", "24"]
    result = run_cli("plan", *args)
    assert (result.returncode, result.stdout) == (2, "")
    assert result.stderr == (
        "meshconf: error: --tp 24 leaves no layout llama3-8b can run at --world-size 96: tp 24 "
        "does not divide llama3-8b's 32 attention heads; use 1, 2, 4, 8, 16 or 32\n"
    )


BAD = """\
world_size: 96
gpus_per_node: 8
degrees:
  tp: 24
  dp_shard: -1
"""


@pytest.mark.parametrize("verb", ["show", "validate"])
def test_show_and_validate_refuse_a_layout_the_model_cannot_run_at_the_degree(
    run_cli: Callable[..., CompletedProcess[str]],
    tmp_path: Path,
    verb: str,
) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(BAD)
    result = run_cli(verb, str(path), "--model", "deepseek-v3")
    # the tp values offered divide the heads and the world of 96
    assert (result.returncode, result.stdout) == (
        1,
        f"{path}:4:3: degrees.tp: 24 does not divide deepseek-v3's 128 attention heads; use 1, "
        "2, 4, 8, 16 or 32\n",
    )


def test_validate_places_each_degree_a_model_file_cannot_run(  # type: ignore[no-untyped-def]
    run_cli, tmp_path: Path
) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(BAD)
    model = tmp_path / "model.yaml"
    model.write_text(
        "name: tiny\nlayers: 4\nhidden: 256\nffn: 1024\nvocab: 1000\n"
        "attention: {heads: 8, kv_heads: 2}\nexperts: {routed: 8, top_k: 2, ffn: 128}\n"
    )
    result = run_cli(
        "validate", str(path), "--model-file", str(model), "-o", "degrees.tp=2",
        "-o", "degrees.ep=3", "-o", "degrees.pp=8", "--format", "json",
    )  # fmt: skip
    assert result.returncode == 1
    (entry,) = json.loads(result.stdout)["files"]
    assert [error["text"] for error in entry["errors"]] == [
        "override 'degrees.ep=3': degrees.ep: 3 does not divide tiny's 8 routed experts; use 1, "
        "2, 4 or 8",
        "override 'degrees.pp=8': degrees.pp: 8 cannot split tiny's 4 layers: 8 pipeline chunks "
        "for 4 layers: some chunk holds none; use 1 to 4",
    ]


def test_validate_without_a_model_keeps_its_verdict(run_cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "bad.yaml"
    path.write_text(BAD)
    result = run_cli("validate", str(path))
    assert result.returncode == 0
    assert result.stdout.endswith(f"{path}: ok (world_size 96), 1 warning (--strict fails on it)\n")


def test_either_writes_runs_and_lists() -> None:
    assert either([1, 2, 4, 8]) == "1, 2, 4 or 8"
    assert either(list(range(1, 62))) == "1 to 61"
    assert either([1, 2, 3, 6, 9, 18]) == "1, 2, 3, 6, 9 or 18"
    assert either([5]) == "5"
