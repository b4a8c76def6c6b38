"""``meshconf plan --model``: presets, published layouts, ranking by fit and step time, the
model file, and the options' errors. The estimator's formulas against real runs are in
tests/test_plan_memory_gloo.py and tests/test_plan_activations.py."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from meshconf.core.setting_values import GIB
from meshconf.features.plan.estimate.architecture import (
    Architecture,
    Experts,
    GroupedQueryAttention,
)
from meshconf.features.plan.estimate.memory import estimate_memory, rank_memory
from meshconf.features.plan.estimate.model_file import model_schema_text
from meshconf.features.plan.estimate.pipeline import candidate_ranks, rank_stage, stage_layers
from meshconf.features.plan.estimate.presets import PRESETS
from meshconf.features.plan.estimate.step import estimate
from meshconf.features.plan.estimate.step_inputs import Parallelism, Training
from meshconf.features.plan.ranking import make_plan
from meshconf.features.plan.request import PlanError, Request

ROOT = Path(__file__).resolve().parents[1]

# --- presets against their published sizes ------------------------------------------------

# (total parameters, parameters per token including the embedding), as each model's release
# states them, rounded as published.
PUBLISHED = {
    "llama3-8b": (8.03e9, None),
    "llama3-70b": (70.6e9, None),
    "llama3-405b": (405.9e9, None),
    "deepseek-v3": (671e9, 37e9),
    "mixtral-8x7b": (46.7e9, 12.9e9),
    "qwen3-30b-a3b": (30.5e9, 3.3e9),
}


@pytest.mark.parametrize("name", list(PUBLISHED))
def test_presets_have_their_published_parameter_counts(name: str) -> None:
    arch = PRESETS[name]
    total, active = PUBLISHED[name]
    assert arch.parameter_count() == pytest.approx(total, rel=0.005)
    if active is not None:
        embedding = arch.vocab * arch.hidden
        assert arch.active_parameter_count() + embedding == pytest.approx(active, rel=0.03)


def test_llama3_8b_has_exactly_its_release_parameter_count() -> None:
    # the sum of the tensor sizes in the Llama 3.1 8B safetensors index
    assert PRESETS["llama3-8b"].parameter_count() == 8_030_261_248


def test_the_first_and_last_stages_get_the_fewer_layers() -> None:
    # 126 layers on 16 stages: 7 on the first and last, 8 on the 14 others (as Llama 3 did)
    sizes = [len(chunks[0]) for chunks in stage_layers(126, 16, 1)]
    assert sizes == [7] + [8] * 14 + [7]
    interleaved = stage_layers(8, 2, 2)
    assert interleaved == [[[0, 1], [4, 5]], [[2, 3], [6, 7]]]


# --- published layouts ------------------------------------------------------------------

LLAMA_405B = Training(seq_len=8192, global_batch_tokens=16 * 2**20)


def test_llama3_405b_meta_layout_fits_in_80_gib_and_pinning_every_degree_gives_one_row() -> None:
    pins = {"pp": 16, "dp_replicate": 1, "dp_shard": 128, "cp": 1, "tp": 8}
    plan = make_plan(Request(16384, 8, pins, PRESETS["llama3-405b"], LLAMA_405B), 10)
    assert plan.total == 1
    (row,) = plan.best
    assert row.estimate is not None and row.estimate.fits
    assert row.estimate.memory.total < 80 * GIB
    assert row.estimate.microbatches == 16  # 2048 sequences over 128 data-parallel ranks


#: The settings The Llama 3 Herd of Models states for 405B at 8K (section 3.3.2): its
#: pipeline schedule (N = 5, the section's example) over 8 chunks a rank, the first chunk the
#: embedding alone and the last the output alone, ZeRO 2, no activation checkpointing, and the
#: tensor parallelism of Korthikanti et al. (MLSys 2023), which the section cites for it:
#: Megatron-LM's sequence parallelism.
LLAMA_405B_AS_TRAINED = replace(
    LLAMA_405B,
    schedule="llama3",
    virtual_stages=8,
    microbatch_group=5,
    first_stage_layers=0,
    last_stage_layers=0,
    zero_stage=2,
    checkpointing="none",
    sequence_parallel="megatron",
)


@pytest.mark.parametrize(("world", "dp_shard"), [(8192, 64), (16384, 128)])
def test_llama3_405b_meta_layout_fits_with_the_paper_s_settings_and_ranks_first(
    world: int, dp_shard: int
) -> None:
    """With only tp, cp and ep pinned, as docs/estimate.md's published runs ask: the layouts
    with fewer pipeline stages hold more layers' activations and do not fit."""
    pins = {"tp": 8, "cp": 1, "ep": 1}
    plan = make_plan(Request(world, 8, pins, PRESETS["llama3-405b"], LLAMA_405B_AS_TRAINED), 5)
    best = plan.best[0]
    assert dict(best.degrees) == {
        "pp": 16, "dp_replicate": 1, "dp_shard": dp_shard, "cp": 1, "tp": 8, "ep": 1, "etp": 1
    }  # fmt: skip
    assert best.estimate is not None and best.estimate.fits
    memory = best.estimate.memory
    # rank 0 holds 2 (16 - 1) + (8 - 1) 5 + 1 chunk-micro-batches, where Megatron's group of
    # 16 would hold 143
    assert (memory.pp_rank, memory.in_flight) == (0, 66)
    # 1.04 GiB per layer and micro-batch under torchtitan's sequence parallelism, 0.61 under
    # Megatron-LM's, which keeps the norms' outputs split (docs/estimate.md)
    assert round(memory.activations / GIB, 1) == 40.1
    assert memory.total <= 80 * GIB


def test_llama3_405b_rows_above_meta_layout_have_fewer_stages_and_fit() -> None:
    """docs/plan.md shows these rows: with FSDP traffic hidden behind compute, the only cost
    of a layout that changes with pp is the 1F1B bubble, (pp - 1) / 16 at 16 micro-batches;
    and under a pipeline FSDP keeps the rank's layers gathered, so pp 2 does not fit."""
    request = Request(16384, 8, {"tp": 8}, PRESETS["llama3-405b"], LLAMA_405B)
    plan = make_plan(request, 1000)
    meta = {"pp": 16, "dp_replicate": 1, "dp_shard": 128, "cp": 1, "tp": 8, "ep": 1, "etp": 1}
    position = [dict(row.degrees) for row in plan.best].index(meta)
    assert (position + 1, plan.total, plan.fitting) == (17, 63, 36)  # as docs/plan.md says
    above = plan.best[:position]
    assert all(row.estimate and row.estimate.fits for row in above)
    # 15 rows with fewer stages, then the same pipeline with replicas instead of shards
    assert [row.degrees["pp"] for row in above[:15]] == [1] * 8 + [8] * 7
    assert not any(
        row.estimate and row.estimate.fits for row in plan.best if row.degrees["pp"] in (2, 4)
    )
    twin = above[15].degrees
    assert (twin["pp"], twin["dp_replicate"], twin["dp_shard"]) == (16, 128, 1)
    assert above[15].estimate and plan.best[position].estimate
    assert above[15].estimate.step_seconds == plan.best[position].estimate.step_seconds
    assert plan.best[position].estimate.fits


def test_deepseek_v3_on_2048_gpus_with_pp16_ep64_fits() -> None:
    training = Training(seq_len=4096, global_batch_tokens=15360 * 4096)
    request = Request(2048, 8, {"pp": 16, "ep": 64, "tp": 1}, PRESETS["deepseek-v3"], training)
    plan = make_plan(request, 10)
    assert plan.total == 2
    assert plan.fitting == 2
    for row in plan.best:
        assert row.estimate is not None and row.estimate.fits


def test_pure_ddp_of_70b_on_1024_gpus_does_not_fit_and_ranks_last() -> None:
    request = Request(1024, 8, {}, PRESETS["llama3-70b"], Training())
    plan = make_plan(request, 10**4)
    ddp = {"pp": 1, "dp_replicate": 1024, "dp_shard": 1, "cp": 1, "tp": 1, "ep": 1, "etp": 1}
    rows = [dict(row.degrees) for row in plan.best]
    row = plan.best[rows.index(ddp)]
    assert row.estimate is not None and not row.estimate.fits
    # 70.6e9 parameters at 2 + 4 + 12 bytes: more than a terabyte per replica
    assert row.estimate.memory.total > 1000 * GIB
    fitting = [r for r in plan.best if r.estimate and r.estimate.fits]
    assert plan.best[: len(fitting)] == tuple(fitting)
    assert rows.index(ddp) >= len(fitting)


def test_rows_that_do_not_fit_follow_closest_to_fitting_first() -> None:
    # 8B in 12 GiB on 64 GPUs: some layouts fit, most do not, and pp 64 and tp 64 cannot
    # split the model, so they are no rows
    request = Request(64, 8, {}, PRESETS["llama3-8b"], Training(gpu_memory_gib=12))
    plan = make_plan(request, 10**4)
    assert plan.left_out == {
        "tp does not divide llama3-8b's 32 attention heads": 1,
        "pp cannot split llama3-8b's 32 layers": 1,
    }
    estimates = [row.estimate for row in plan.best if row.estimate is not None]
    assert len(estimates) == plan.total
    fitting = [found for found in estimates if found.fits]
    over = [found for found in estimates if not found.fits]
    assert fitting and over
    assert estimates == fitting + over
    steps = [found.step_seconds for found in fitting]
    assert steps == sorted(steps)
    totals = [found.memory.total for found in over]
    assert totals == sorted(totals)
    assert min(totals) > 12 * GIB


def test_model_state_of_8b_under_fsdp_8_is_18_bytes_per_parameter_over_8() -> None:
    arch = PRESETS["llama3-8b"]
    memory = estimate_memory(arch, Parallelism(dp_shard=8), Training())
    params = arch.parameter_count()
    assert memory.params == 2 * params // 8  # every tensor's rows divide by 8
    assert memory.grads == 4 * params // 8
    # two fp32 moments and an fp32 master copy, and one 4-byte step per tensor
    assert memory.optimizer == 12 * params // 8 + 4 * (32 * 9 + 3)


# --- the command line -------------------------------------------------------------------


def test_plan_json_gives_memory_fit_and_communication_per_row(run_cli) -> None:
    args = ["--world-size", "64", "--gpus-per-node", "8", "--tp", "8", "--pp", "1"]
    args += ["--dp-replicate", "1", "--dp-shard", "8", "--cp", "1", "--model", "llama3-70b"]
    result = run_cli("plan", *args, "--format", "json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["total"] == 1 and report["fitting"] == 1
    (row,) = report["assignments"]
    assert set(row["memory_gib"]) == {
        "params",
        "grads",
        "optimizer",
        "gathers",
        "activations",
        "runtime",
        "total",
        "total_without_runtime",
    }
    assert row["fits"] is True
    assert set(row["communication"]) == {"tp", "fsdp"}
    assert row["communication"]["fsdp"]["crosses_nodes"] is True
    assert row["communication"]["tp"]["crosses_nodes"] is False
    parts = sum(v for k, v in row["memory_gib"].items() if not k.startswith("total"))
    assert parts == pytest.approx(row["memory_gib"]["total"], abs=0.05)
    without = parts - row["memory_gib"]["runtime"]
    assert without == pytest.approx(row["memory_gib"]["total_without_runtime"], abs=0.05)
    # the CUDA context and NCCL's buffers of two communicators of 8 (tp, fsdp)
    assert row["runtime_gib"] == {
        "cuda_context": 0.28,
        "nccl": round(2 * 688e6 / 2**30, 2),
        "allocator": 2.74,
        "communicators": {"tp": 8, "fsdp": 8},
    }


def test_plan_text_marks_rows_that_do_not_fit(run_cli) -> None:
    args = ["--world-size", "1024", "--gpus-per-node", "8", "--dp-replicate", "1024"]
    result = run_cli("plan", *args, "--model", "llama3-70b")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[2] == (
        "gpu h100-sxm: 80 GiB, 989 TFLOP/s dense bf16 at MFU 0.4, 450 GB/s inside a node, 50 "
        "GB/s across nodes"
    )
    assert lines[3] == "1 valid assignment; 0 fit in 80 GiB"
    # 1204.7 GiB of training state, the CUDA context, dp_replicate's communicator and the
    # allocator's reserve
    assert lines[5].split()[6:8] == ["1359.2", "-1279.2"]


def test_a_layout_that_does_not_fit_names_its_largest_term_and_the_remedy(run_cli) -> None:  # type: ignore[no-untyped-def]
    overrides = ["-o", "degrees.dp_shard=1", "-o", "degrees.dp_replicate=512"]
    overrides += ["-o", "degrees.pp=1", "-o", "degrees.tp=1"]
    path = "examples/llama3_70b_512gpu.yaml"
    text = run_cli("show", path, "--model", "llama3-70b", *overrides).stdout
    assert text.splitlines()[-3].endswith(
        "does NOT fit in 80 GiB, 1279.21 GiB over; the largest term is optimizer (788.5): "
        "shard the optimizer state over more ranks (a larger dp_shard) or split it with tp or pp"
    )
    found = json.loads(
        run_cli("show", path, "--model", "llama3-70b", *overrides, "--format", "json").stdout
    )["estimate"]
    assert (found["headroom_gib"], found["largest_term"]) == (-1279.21, "optimizer")


def test_show_model_prints_the_memory_breakdown(run_cli) -> None:
    path = "examples/llama3_70b_512gpu.yaml"
    result = run_cli("show", path, "--model", "llama3-70b", "--format", "json")
    assert result.returncode == 0, result.stderr
    found = json.loads(result.stdout)["estimate"]
    assert found["model"] == "llama3-70b"
    assert found["fits"] is True
    text = run_cli("show", path, "--model", "llama3-70b").stdout
    # The first pipeline rank needs the most: under 1F1B it holds the block inputs of pp
    # micro-batches and one block's backward pass, more than the last rank's one
    # micro-batch and loss.
    assert f"memory per GPU (GiB, pipeline rank {found['memory_pp_rank']}): params " in text
    assert found["memory_pp_rank"] == 0


@pytest.mark.parametrize(
    ("tokens", "counted"), [("8192", "1 micro-batch,"), ("16384", "2 micro-batches,")]
)
def test_the_step_line_counts_its_micro_batches(run_cli, tokens: str, counted: str) -> None:  # type: ignore[no-untyped-def]
    text = run_cli(
        "plan", "--world-size", "1", "--model", "llama3-8b", "--global-batch-tokens", tokens,
        "--explain", "1",
    ).stdout  # fmt: skip
    assert f"step: {counted} compute " in text


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--seq-len", "4096"], "--seq-len needs --model or --model-file"),
        (
            ["--model", "gpt5"],
            "--model: expected one of llama3-8b, llama3-70b, llama3-405b, deepseek-v3, "
            "mixtral-8x7b or qwen3-30b-a3b, got 'gpt5'",
        ),
        (
            ["--model", "llama3-8b", "--model-file", "x.yaml"],
            "--model and --model-file exclude each other",
        ),
        (["--model", "llama3-8b", "--mfu", "2"], "--mfu: 2 is more than 1: more than the peak"),
        (
            ["--model", "llama3-8b", "--gpu-memory-gib", "lots"],
            "--gpu-memory-gib: expected a number from 0.125 to 16384, got 'lots'",
        ),
        (
            ["--model", "llama3-8b", "--pp-schedule", "interleaved"],
            "--pp-schedule interleaved needs --virtual-stages >= 2",
        ),
        (
            ["--model", "llama3-8b", "--virtual-stages", "2"],
            "--virtual-stages needs --pp-schedule interleaved, llama3 or loopedbfs",
        ),
        (["--model-file", "missing.yaml"], "missing.yaml: cannot read: No such file or directory"),
    ],
)
def test_model_option_errors_are_one_line_and_exit_2(run_cli, args, message) -> None:
    result = run_cli("plan", "--world-size", "8", *args)
    assert (result.returncode, result.stdout) == (2, "")
    assert result.stderr == f"meshconf: error: {message}\n"


# --- the model file ---------------------------------------------------------------------

TINY_MOE = """\
name: tiny-moe
layers: 4
hidden: 256
ffn: 1024
vocab: 1000
attention:
  heads: 8
  kv_heads: 2
experts:
  routed: 8
  top_k: 2
  ffn: 128
  dense_layers: 1
"""


def test_a_model_file_plans_like_a_preset(run_cli, tmp_path: Path) -> None:
    path = tmp_path / "moe.yaml"
    path.write_text(TINY_MOE)
    args = ["--world-size", "8", "--ep", "4", "--model-file", str(path), "--format", "json"]
    result = run_cli("plan", *args)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["model"] == "tiny-moe"
    assert all("ep" in row["communication"] for row in report["assignments"])


def test_a_bad_model_file_gives_located_errors_and_exit_1(run_cli, tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(
        TINY_MOE.replace("ffn: 1024", "ffn: '1024'")
        .replace("kv_heads: 2", "kv_heads: 2\n  window: 4")
        .replace("top_k: 2", "top_k: 9")
    )
    result = run_cli("plan", "--world-size", "8", "--model-file", str(path))
    assert (result.returncode, result.stdout) == (1, "")
    assert result.stderr.splitlines() == [
        f"{path}:4:1: ffn: expected an integer >= 1, got the string '1024' (a quoted number is a "
        "string; write the integer you mean, unquoted)",
        f"{path}:9:3: attention.window: unknown key 'window'; allowed: kind, heads, kv_heads, "
        "head_dim, qk_norm",
        f"{path}:10:1: experts: top_k (9) is more than routed (8)",
    ]


def test_the_committed_model_schema_is_fresh() -> None:
    committed = (ROOT / "schemas" / "meshconf.model.schema.json").read_text()
    assert committed == model_schema_text(), (
        "schemas/meshconf.model.schema.json is out of date; regenerate it with: python -c "
        '"from meshconf.features.plan.estimate.model_file import model_schema_text; '
        "open('schemas/meshconf.model.schema.json', 'w').write(model_schema_text())\""
    )


# --- the pipeline rank that needs the most ----------------------------------------------

SMALL_MOE = Architecture(
    "m", 13, 64, 128, 100, GroupedQueryAttention(4, 2, 16), Experts(8, 2, 32, 0, 3)
)


#: The splits: even, the end chunks' layers given (one or both), the ends counted as layers.
SPLITS: list[dict[str, int]] = [
    {},
    {"first_stage_layers": 1, "last_stage_layers": 0},
    {"first_stage_layers": 3},
    {"last_stage_layers": 2},
    {"embedding_as_layers": 1, "output_as_layers": 1},
    {"embedding_as_layers": 2},
]


@pytest.mark.parametrize("arch", [PRESETS["deepseek-v3"], PRESETS["llama3-405b"], SMALL_MOE])
@pytest.mark.parametrize("pp", [1, 2, 3, 5, 8, 16])
@pytest.mark.parametrize("virtual", [1, 2, 3])
@pytest.mark.parametrize("split", SPLITS)
def test_the_candidate_ranks_find_the_rank_every_rank_would(
    arch: Architecture, pp: int, virtual: int, split: dict[str, int]
) -> None:
    """estimate_memory looks at a few pipeline ranks only; the largest of all is among them."""
    for microbatches in (1, 3, 64):
        training = Training(
            schedule="interleaved" if virtual > 1 else "1f1b",
            virtual_stages=virtual,
            global_batch_tokens=microbatches * 8192,
            **split,  # type: ignore[arg-type]
        )
        par = Parallelism(pp=pp)
        training, _ = training.for_model(arch.layers, pp)
        ends = training.stage_ends
        every = max(
            (
                rank_memory(arch, par, training, rank_stage(arch, pp, virtual, rank, ends))
                for rank in range(pp)
            ),
            key=lambda memory: memory.total,
        )
        assert estimate_memory(arch, par, training).total == every.total


def test_a_split_of_the_ends_over_a_million_ranks_takes_a_few_ranks() -> None:
    """With the end chunks' layers given, the ranks looked at are found from the split, not
    by looking at every rank: a world of 2**20 pipeline ranks is estimated at once."""
    arch = PRESETS["llama3-8b"]
    ranks = candidate_ranks(arch, 2**20, 1024, (0, 0))
    # the embedding alone, the 32 chunks of a layer, the empty ones, the output alone
    assert ranks == [0, 1, 33, 2**20 - 1]
    found = estimate(arch, Parallelism(pp=2**20), Training(first_stage_layers=0), {})
    assert found.problem is not None


def test_more_pipeline_chunks_than_layers_do_not_fit_and_are_no_row() -> None:
    arch = PRESETS["llama3-8b"]  # 32 layers
    found = estimate(arch, Parallelism(pp=64), Training(), {})
    assert not found.fits
    assert found.problem == "64 pipeline chunks for 32 layers: some chunk holds none"
    with pytest.raises(PlanError) as raised:
        make_plan(Request(64, 8, {"pp": 64}, arch, Training()), 1)
    assert str(raised.value) == (
        "--pp 64 leaves no layout llama3-8b can run at --world-size 64: pp 64 cannot split "
        "llama3-8b's 32 layers: 64 pipeline chunks for 32 layers: some chunk holds none; use 1, "
        "2, 4, 8, 16 or 32"
    )


def test_emit_with_a_model_repeats_the_model_options_and_the_estimate(run_cli) -> None:
    args = ["--world-size", "64", "--gpus-per-node", "8", "--tp", "8", "--model", "llama3-70b"]
    result = run_cli("plan", *args, "--seq-len", "4096", "--emit", "1")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].startswith(
        "# meshconf plan --world-size 64 --gpus-per-node 8 --tp 8 --model llama3-70b "
        "--seq-len 4096 --emit 1 (assignment 1 of "
    )
    assert lines[2].startswith("# estimated: ") and "GiB per GPU (fits), step " in lines[2]


def test_show_with_a_bad_model_file_exits_1_with_located_errors(run_cli, tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(TINY_MOE.replace("layers: 4", "layers: 0"))
    result = run_cli("show", "examples/llama3_8b_8gpu_fsdp.yaml", "--model-file", str(path))
    assert (result.returncode, result.stdout) == (1, "")
    assert result.stderr == f"{path}:2:1: layers: expected an integer >= 1, got 0\n"


def test_show_model_reads_locality_from_a_config_with_its_own_domains(run_cli) -> None:
    # pp 2 x dp_shard 4 x tp 8 on 8 nodes of 8, with an extra "reward" domain
    args = ["examples/custom_domain.yaml", "--model", "llama3-8b"]
    result = run_cli("show", *args, "--format", "json")
    assert result.returncode == 0, result.stderr
    found = json.loads(result.stdout)["estimate"]
    assert found["fits"] is True
    crossing = {name: flow["crosses_nodes"] for name, flow in found["communication"].items()}
    assert crossing == {"tp": False, "pp": True, "fsdp": True}


def test_explain_gives_each_term_what_it_holds_and_its_source(run_cli) -> None:  # type: ignore[no-untyped-def]
    """plan --explain N and show --explain: the memory by term, with what each holds under the
    settings, its source, and what is not counted (with the communicators the layout uses)."""
    options = ("--model", "llama3-70b", "--pp", "4", "--tp", "8", "--dp-replicate", "1")
    planned = run_cli("plan", "--world-size", "256", "--gpus-per-node", "8", *options,
                      "--explain", "1")  # fmt: skip
    assert planned.returncode == 0, planned.stderr
    lines = planned.stdout.splitlines()
    assert lines[0] == "assignment 1 of 1: pp=4 dp_replicate=1 dp_shard=8 cp=1 tp=8"
    terms = [line.split()[0] for line in lines if line.startswith("  ") and "source:" not in line]
    assert terms == ["params", "grads", "optimizer", "gathers", "activations", "runtime"]
    gathers = next(line for line in lines if line.startswith("  gathers"))
    assert gathers.endswith(
        "every block of the rank gathered, and its gradients unsharded until the last "
        "micro-batch (no resharding under the pipeline)"
    )
    runtime = next(line for line in lines if line.startswith("  runtime"))
    assert runtime.endswith(
        "the CUDA context 0.28, NCCL's buffers for the 3 communicators the rank sends over "
        "(tp of 8, pp of 4, fsdp of 8) 1.92, the allocator's reserve 2.47 (0.1275 of the "
        "tensors' 19.41, reserved over allocated as published)"
    )
    assert lines[-1] == "not counted: temporaries of single ops beyond those named"
    shown = run_cli("show", "examples/llama3_70b_512gpu.yaml", "--model", "llama3-70b",
                    "--zero-stage", "1", "--explain", "--format", "json")  # fmt: skip
    estimate = json.loads(shown.stdout)["estimate"]
    by_term = {term["term"]: term for term in estimate["terms"]}
    assert by_term["gathers"]["holds"] == "nothing: ZeRO 1 keeps the weights whole"
    assert by_term["optimizer"]["gib"] == estimate["memory_gib"]["optimizer"]
    assert all(term["source"] for term in estimate["terms"])
    for args, message in [
        (("plan", "--world-size", "8", "--explain", "1"), "--explain needs --model or --model-file"),
        (("show", "examples/llama3_70b_512gpu.yaml", "--explain"),
         "--explain needs --model or --model-file"),
        (("plan", "--world-size", "8", "--model", "llama3-8b", "--explain", "99"),
         "--explain 99 is not a row: there are 20 valid assignments"),
    ]:  # fmt: skip
        failed = run_cli(*args)
        assert (failed.returncode, failed.stderr) == (2, f"meshconf: error: {message}\n")


def test_a_model_file_s_typo_names_the_key_missing_and_the_key_meant(
    run_cli, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "tiny.yaml"
    path.write_text(
        "name: tiny\nlayers: 2\nhiden: 64\nffn: 128\nvocab: 1000\n"
        "attention: {heads: 4, kv_head: 4}\n"
    )
    result = run_cli("plan", "--world-size", "8", "--model-file", str(path))
    assert (result.returncode, result.stdout) == (1, "")
    assert result.stderr.splitlines() == [
        f"{path}:1:1: required key 'hidden' missing",
        f"{path}:3:1: hiden: unknown key 'hiden' (did you mean 'hidden'?); allowed: name, "
        "layers, hidden, ffn, vocab, attention, experts, tied_embeddings",
        f"{path}:6:1: attention: required key 'kv_heads' missing",
        f"{path}:6:23: attention.kv_head: unknown key 'kv_head' (did you mean 'kv_heads'?); "
        "allowed: kind, heads, kv_heads, head_dim, qk_norm",
    ]


def test_an_oversized_model_file_is_an_invalid_file(run_cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "huge.yaml"
    path.write_text("name: x\n" + "# padding\n" * 8000)
    result = run_cli("plan", "--world-size", "8", "--model-file", str(path))
    assert (result.returncode, result.stdout) == (1, "")
    assert result.stderr == (
        f"{path}: {path.stat().st_size} bytes, more than the 65,536 a model file may have; "
        "this is not a model file\n"
    )


@pytest.mark.parametrize(
    "part", ["--cuda-context-gib", "--nccl-communicator-gib", "--allocator-gib"]
)
def test_the_runtime_total_and_one_of_its_parts_are_refused_together(run_cli, part: str) -> None:  # type: ignore[no-untyped-def]
    result = run_cli(
        "plan", "--world-size", "64", "--model", "llama3-8b", "--runtime-gib", "2", part, "3"
    )
    assert result.returncode == 2
    assert result.stderr.splitlines()[-1] == (
        f"meshconf: error: --runtime-gib and {part} exclude each other: the first is the whole "
        "runtime term, the second one of its parts; give the total or the parts"
    )
