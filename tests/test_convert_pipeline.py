"""The pipeline's schedule and split, read by ``meshconf convert``: torchtitan's
``pipeline_parallel_schedule``, ``pipeline_parallel_first_stage_less_layers`` and
``pipeline_parallel_last_stage_less_layers`` (1 each by default, so a torchtitan job with
pp always counts its embedding and output as a layer each), and Megatron-LM's
``--account-for-embedding-in-pipeline-split`` and ``--account-for-loss-in-pipeline-split``."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings, strategies as st
from test_convert_recompute import toml_values

import meshconf
from meshconf.features.convert import BY_NAME, MEGATRON, TORCHTITAN
from meshconf.features.convert.draft import ConversionError
from meshconf.features.convert.megatron_input import read_command_line, read_nemo_yaml

PIPELINE = {"pipeline_parallel_degree": 4, "data_parallel_shard_degree": 2}


def _torchtitan(table: dict[str, object]) -> tuple[dict[str, object], tuple[str, ...]]:
    """The training block and the notes converted from a ``[parallelism]`` table with pp 4."""
    conversion = BY_NAME[TORCHTITAN].convert(PIPELINE | table, world_size=8)
    return conversion.data.get("training") or {}, conversion.notes


@pytest.mark.parametrize(
    ("table", "expected"),
    [
        ({}, {"pp_schedule": "1f1b", "embedding_as_layers": 1, "output_as_layers": 1}),
        (
            {"pipeline_parallel_first_stage_less_layers": 0,
             "pipeline_parallel_last_stage_less_layers": 3},
            {"pp_schedule": "1f1b", "embedding_as_layers": 0, "output_as_layers": 3},
        ),
        (
            {"pipeline_parallel_schedule": "Interleaved1F1B"},
            {"pp_schedule": "interleaved", "virtual_stages": 2, "embedding_as_layers": 1,
             "output_as_layers": 1},
        ),
        ({"pipeline_parallel_schedule": "gpipe"},
         {"pp_schedule": "gpipe", "embedding_as_layers": 1, "output_as_layers": 1}),
        # torchtitan's default for a schedule of several chunks a rank: 2
        ({"pipeline_parallel_schedule": "LoopedBFS"},
         {"pp_schedule": "loopedbfs", "virtual_stages": 2, "embedding_as_layers": 1,
          "output_as_layers": 1}),
        ({"pipeline_parallel_schedule": "ZBVZeroBubble"},
         {"pp_schedule": "zbv", "embedding_as_layers": 1, "output_as_layers": 1}),
        (
            {"pipeline_parallel_schedule": "dualpipev", "pipeline_parallel_layers_per_stage": 2},
            {"pp_schedule": "dualpipev", "layers_per_stage": 2, "embedding_as_layers": 1,
             "output_as_layers": 1},
        ),
        (
            {"pipeline_parallel_schedule": "Interleaved1F1B",
             "pipeline_parallel_layers_per_stage": 4},
            {"pp_schedule": "interleaved", "layers_per_stage": 4, "embedding_as_layers": 1,
             "output_as_layers": 1},
        ),
    ],
)  # fmt: skip
def test_torchtitan_s_split_and_schedule_are_converted(
    table: dict[str, object], expected: dict[str, object]
) -> None:
    training, _ = _torchtitan(table)
    assert training == expected


def test_without_a_pipeline_nothing_of_it_is_written() -> None:
    table = {"pipeline_parallel_schedule": "Interleaved1F1B", "data_parallel_shard_degree": 8}
    conversion = BY_NAME[TORCHTITAN].convert(table, world_size=8)
    assert "training" not in conversion.data


@pytest.mark.parametrize(
    ("table", "note"),
    [
        (
            {"pipeline_parallel_schedule": "InterleavedZeroBubble"},
            'pipeline_parallel_schedule = "InterleavedZeroBubble" is not converted: the estimate '
            "models 1F1B, Interleaved1F1B, LoopedBFS, GPipe, ZBVZeroBubble and DualPipeV; give "
            "--pp-schedule and --virtual-stages to plan and show.",
        ),
        (
            {"module_fqns_per_model_part": [["tok_embeddings", "layers.0"], ["layers.1"]]},
            "module_fqns_per_model_part names the modules of each model chunk, and torchtitan "
            "splits the pipeline by it: the training block leaves the split and the schedule "
            "out; give --pp-schedule, --virtual-stages and --first-stage-layers and "
            "--last-stage-layers to plan and show.",
        ),
    ],
)  # fmt: skip
def test_what_the_estimate_cannot_say_is_left_with_a_note(
    table: dict[str, object], note: str
) -> None:
    training, notes = _torchtitan(table)
    assert "pp_schedule" not in training and "virtual_stages" not in training
    assert note in notes


@pytest.mark.parametrize(
    ("table", "where", "message"),
    [
        (
            {"pipeline_parallel_schedule": "OneFOneB"},
            "[parallelism].pipeline_parallel_schedule",
            "expected one of torch's pipeline schedules (1F1B, Interleaved1F1B, GPipe, LoopedBFS, "
            "InterleavedZeroBubble, PipelineScheduleSingle, PipelineScheduleMulti, ZBVZeroBubble, "
            "DualPipeV), got the string 'OneFOneB'",
        ),
        (
            {"pipeline_parallel_first_stage_less_layers": -1},
            "[parallelism].pipeline_parallel_first_stage_less_layers",
            "expected an integer >= 0, got -1",
        ),
        (
            {"pipeline_parallel_layers_per_stage": 0},
            "[parallelism].pipeline_parallel_layers_per_stage",
            "expected an integer >= 1, got 0",
        ),
        (
            {"pipeline_parallel_last_stage_less_layers": "1"},
            "[parallelism].pipeline_parallel_last_stage_less_layers",
            "expected an integer >= 0, got the string '1' (a quoted number is a string; write "
            "the integer you mean, unquoted)",
        ),
    ],
)
def test_bad_torchtitan_pipeline_settings_are_refused_at_their_key(
    table: dict[str, object], where: str, message: str
) -> None:
    with pytest.raises(ConversionError) as raised:
        _torchtitan(table)
    (problem,) = raised.value.problems
    assert (problem.where, problem.message) == (where, message)


ARGS = "--pipeline-model-parallel-size 4 --use-distributed-optimizer "


@pytest.mark.parametrize(
    ("arguments", "expected"),
    [
        ("--account-for-embedding-in-pipeline-split", {"embedding_as_layers": 1}),
        ("--account-for-loss-in-pipeline-split", {"output_as_layers": 1}),
        (
            "--account-for-embedding-in-pipeline-split --account-for-loss-in-pipeline-split",
            {"embedding_as_layers": 1, "output_as_layers": 1},
        ),
        ("", {}),
    ],
)
def test_megatron_s_split_switches_are_converted(arguments: str, expected: dict[str, int]) -> None:
    conversion = BY_NAME[MEGATRON].convert(read_command_line(ARGS + arguments), world_size=8)
    assert conversion.data["training"] == {"zero_stage": 1} | expected


def test_megatron_s_switches_beside_the_end_chunks_are_refused_at_the_switch() -> None:
    line = ARGS + "--decoder-first-pipeline-num-layers 3 --account-for-loss-in-pipeline-split"
    with pytest.raises(ConversionError) as raised:
        BY_NAME[MEGATRON].convert(read_command_line(line), world_size=8)
    (problem,) = raised.value.problems
    assert problem.render("--args") == (
        "--args:1:100: --account-for-loss-in-pipeline-split: output_as_layers and "
        "first_stage_layers or last_stage_layers exclude each other: both set the layers of the "
        "first and last pipeline chunks"
    )


@pytest.mark.parametrize(
    ("value", "expected", "problem"),
    [
        ("true", {"embedding_as_layers": 1}, None),
        ("false", {}, None),
        ("1", None, "model.account_for_embedding_in_pipeline_split: expected true or false, got "
         "the integer 1"),
    ],
)  # fmt: skip
def test_nemo_s_split_switch_is_read_by_its_value(
    run_cli, tmp_path: Path, value: str, expected: dict[str, int] | None, problem: str | None
) -> None:  # type: ignore[no-untyped-def]
    nemo = tmp_path / "nemo.yaml"
    nemo.write_text(
        "trainer: {devices: 8, num_nodes: 1}\n"
        f"model:\n  pipeline_model_parallel_size: 4\n"
        f"  account_for_embedding_in_pipeline_split: {value}\n"
    )
    out = tmp_path / "converted.yaml"
    result = run_cli("convert", "--from", "megatron", str(nemo), "--out", str(out))
    if problem is not None:
        assert (result.returncode, result.stderr) == (1, f"{nemo}:4:3: {problem}\n")
        return
    assert result.returncode == 0, result.stderr
    training = meshconf.load_config(out).training
    assert training is not None
    assert training.model_dump(exclude_none=True) == {"zero_stage": 0} | (expected or {})


#: Any value a TOML document holds, and the words the pipeline keys use.
TOML_VALUES = toml_values("1F1B", "interleaved1f1b", "DualPipeV", "GPipe", "0", "1")
#: The schedules among those words, and what the estimate calls them.
SCHEDULE_WORDS = {
    "1f1b": "1f1b",
    "interleaved1f1b": "interleaved",
    "dualpipev": "dualpipev",
    "gpipe": "gpipe",
}
PIPELINE_KEYS = (
    "pipeline_parallel_schedule",
    "pipeline_parallel_first_stage_less_layers",
    "pipeline_parallel_last_stage_less_layers",
    "pipeline_parallel_layers_per_stage",
)


@given(table=st.dictionaries(st.sampled_from(PIPELINE_KEYS), TOML_VALUES, max_size=4))
@settings(max_examples=300, deadline=None)
def test_any_torchtitan_pipeline_settings_convert_or_are_refused_at_their_key(
    table: dict[str, object],
) -> None:
    try:
        training, _ = _torchtitan(table)
    except ConversionError as error:
        assert {problem.key for problem in error.problems} <= set(PIPELINE_KEYS)
        return
    schedule = table.get("pipeline_parallel_schedule", "1F1B")
    # torchtitan reads the name in any case
    assert isinstance(schedule, str)
    assert training["pp_schedule"] == SCHEDULE_WORDS[schedule.casefold()]
    for key in ("embedding_as_layers", "output_as_layers"):
        assert type(training[key]) is int and 0 <= training[key] <= 100_000


# --- Megatron-LM's model chunks per rank ------------------------------------------------------

VIRTUAL = "--pipeline-model-parallel-size 4 "


@pytest.mark.parametrize(
    ("arguments", "chunks"),
    [
        ("--num-virtual-stages-per-pipeline-rank 3", 3),
        # 32 layers over 4 stages: 8 a stage, in chunks of 2
        ("--num-layers 32 --num-layers-per-virtual-pipeline-stage 2", 4),
        ("--num-layers=32 --num-layers-per-virtual-pipeline-stage=4", 2),
        # the embedding and the loss counted as layers: 32 again
        ("--num-layers 30 --num-layers-per-virtual-pipeline-stage 2 "
         "--account-for-embedding-in-pipeline-split --account-for-loss-in-pipeline-split", 4),
        # both, agreeing
        ("--num-layers 32 --num-layers-per-virtual-pipeline-stage 2 "
         "--num-virtual-stages-per-pipeline-rank 4", 4),
    ],
)  # fmt: skip
def test_megatron_s_model_chunks_per_rank_set_the_interleaved_schedule(
    arguments: str, chunks: int
) -> None:
    conversion = BY_NAME[MEGATRON].convert(read_command_line(VIRTUAL + arguments), world_size=8)
    training = conversion.data["training"]
    assert (training["pp_schedule"], training["virtual_stages"]) == ("interleaved", chunks)


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ("--num-layers-per-virtual-pipeline-stage 2",
         "--args:1:74: --num-layers-per-virtual-pipeline-stage: needs the model's number of "
         "layers (--num-layers): Megatron-LM derives the model chunks per pipeline rank from it"),
        ("--num-layers 30 --num-layers-per-virtual-pipeline-stage 2",
         "--args:1:90: --num-layers-per-virtual-pipeline-stage: 30 layers do not split evenly "
         "over 4 pipeline stages"),
        ("--num-layers 32 --num-layers-per-virtual-pipeline-stage 3",
         "--args:1:90: --num-layers-per-virtual-pipeline-stage: a pipeline stage's 8 layers are "
         "not a multiple of the 3 layers of a model chunk"),
        ("--num-layers 32 --num-layers-per-virtual-pipeline-stage 2 "
         "--num-virtual-stages-per-pipeline-rank 2",
         "--args:1:90: --num-layers-per-virtual-pipeline-stage: gives 4 model chunks per "
         "pipeline rank, but --num-virtual-stages-per-pipeline-rank gives 2: which one is meant?"),
        ("--num-layers 32 --decoder-first-pipeline-num-layers 6 "
         "--num-layers-per-virtual-pipeline-stage 2",
         "--args:1:128: --num-layers-per-virtual-pipeline-stage: beside "
         "--decoder-first-pipeline-num-layers, Megatron-LM takes the model chunks per pipeline "
         "rank from --num-virtual-stages-per-pipeline-rank, not from the layers of a chunk"),
        ("--num-layers x --num-layers-per-virtual-pipeline-stage 2",
         "--args:1:47: --num-layers: expected an integer >= 1, got the string 'x'"),
        ("--num-virtual-stages-per-pipeline-rank 0",
         "--args:1:73: --num-virtual-stages-per-pipeline-rank: expected an integer >= 1, got 0"),
    ],
)  # fmt: skip
def test_megatron_s_model_chunks_that_do_not_add_up_are_refused_at_their_argument(
    arguments: str, message: str
) -> None:
    with pytest.raises(ConversionError) as raised:
        BY_NAME[MEGATRON].convert(read_command_line(VIRTUAL + arguments), world_size=8)
    assert [problem.render("--args") for problem in raised.value.problems] == [message]


def test_nemo_s_layers_per_virtual_stage_give_the_model_chunks(run_cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    nemo = tmp_path / "nemo.yaml"
    nemo.write_text(
        "trainer: {devices: 8, num_nodes: 1}\n"
        "model:\n  pipeline_model_parallel_size: 4\n  num_layers: 32\n"
        "  num_layers_per_virtual_pipeline_stage: 4\n"
        "  virtual_pipeline_model_parallel_size: null\n"
    )
    out = tmp_path / "converted.yaml"
    result = run_cli("convert", "--from", "megatron", str(nemo), "--out", str(out))
    assert result.returncode == 0, result.stderr
    training = meshconf.load_config(out).training
    assert training is not None
    assert (training.pp_schedule, training.virtual_stages) == ("interleaved", 2)


def test_megatron_s_micro_batch_groups_go_with_the_model_chunks() -> None:
    group = "--microbatch-group-size-per-virtual-pipeline-stage 8"
    line = f"{VIRTUAL}--num-virtual-stages-per-pipeline-rank 2 {group}"
    conversion = BY_NAME[MEGATRON].convert(read_command_line(line), world_size=8)
    assert conversion.data["training"]["microbatch_group"] == 8
    # without interleaving Megatron-LM runs no groups: the setting has no effect
    conversion = BY_NAME[MEGATRON].convert(read_command_line(VIRTUAL + group), world_size=8)
    assert "microbatch_group" not in conversion.data["training"]
    assert (
        "--microbatch-group-size-per-virtual-pipeline-stage is left out: only the interleaved "
        "schedule groups micro-batches, and the arguments give no model chunks per pipeline "
        "rank."
    ) in conversion.notes
    nemo = (
        "model:\n  pipeline_model_parallel_size: 4\n  virtual_pipeline_model_parallel_size: 2\n"
        "  microbatch_group_size_per_vp_stage: 8\n"
        "  microbatch_group_size_per_virtual_pipeline_stage: 4\n"
    )
    with pytest.raises(ConversionError) as raised:
        BY_NAME[MEGATRON].convert(read_nemo_yaml(nemo), world_size=8)
    assert [problem.render("nemo.yaml") for problem in raised.value.problems] == [
        "nemo.yaml:4:3: model.microbatch_group_size_per_vp_stage: gives 8 micro-batches per "
        "model chunk, but model.microbatch_group_size_per_virtual_pipeline_stage gives 4: "
        "which one is meant?"
    ]
