"""The pipeline split that counts the embedding and the output as layers
(``--embedding-as-layers``, ``--output-as-layers`` and the training block's keys): the layers
of every chunk as torchtitan's ``generate_llm_fqn_per_model_part`` and Megatron-Core's
``get_num_layers_to_build`` give them, the splits both refuse, and the settings it excludes;
and the chunks per rank that layers per chunk make (``--layers-per-stage``), as torchtitan's
``pipeline_parallel_layers_per_stage`` makes them."""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from types import SimpleNamespace

import pytest
from megatron_code import get_num_layers_to_build

from meshconf.features.plan.estimate.pipeline import (
    chunks_from_layers,
    split_problem,
    stage_layers,
    weights_problem,
)
from meshconf.features.plan.estimate.step_inputs import Training


def _chunk_sizes(layers: int, pp: int, virtual: int, training: Training) -> list[int]:
    """The layers of every chunk, in model order (chunk ``c`` on rank ``c % pp``), of a
    split the estimate accepts."""
    resolved, problem = training.for_model(layers, pp)
    assert problem is None
    assert split_problem(layers, pp * virtual, resolved.stage_ends) is None
    ranks = stage_layers(layers, pp, virtual, resolved.stage_ends)
    return [len(ranks[chunk % pp][chunk // pp]) for chunk in range(pp * virtual)]


def _training(virtual: int, embedding: int | None, output: int | None) -> Training:
    return Training(
        schedule="interleaved" if virtual > 1 else "1f1b",
        virtual_stages=virtual,
        embedding_as_layers=embedding,
        output_as_layers=output,
    )


@pytest.mark.parametrize(
    ("layers", "pp", "virtual", "weights", "sizes"),
    [
        # generate_llm_fqn_per_model_part(2, 3, input_weight=2, output_weight=2), torchtitan's
        # own example: 7 weighted layers, 4 and 3 a chunk, less the ends' weights
        (3, 2, 1, (2, 2), [2, 1]),
        # Llama 3 70B under torchtitan's defaults: Interleaved1F1B, 2 chunks a rank, each end
        # one layer; 82 weighted layers, the first two chunks taking one more
        (80, 2, 2, (1, 1), [20, 21, 20, 19]),
        # Llama 3 405B on 16 stages with one layer fewer on the first and the last
        (126, 16, 1, (1, 1), [7, *[8] * 14, 7]),
        # ... and interleaved 8 chunks a rank: the embedding and the output alone
        (126, 16, 8, (1, 1), [0, *[1] * 126, 0]),
        # zero weights are still torchtitan's split: the earlier chunks take the extra layers
        (30, 4, 1, (0, 0), [8, 8, 7, 7]),
        # one weight given, the other end counting as none
        (30, 4, 1, (1, None), [7, 8, 8, 7]),
        (30, 4, 1, (None, 2), [8, 8, 8, 6]),
    ],
)
def test_the_chunks_hold_what_torchtitan_builds(
    layers: int, pp: int, virtual: int, weights: tuple[int | None, int | None], sizes: list[int]
) -> None:
    assert _chunk_sizes(layers, pp, virtual, _training(virtual, *weights)) == sizes


def test_without_weights_the_split_is_meshconf_s_even_one() -> None:
    """The extra layers go to the middle chunks, not the first ones."""
    assert _chunk_sizes(30, 4, 1, Training()) == [7, 8, 8, 7]


def _megatron(layers: int, pp: int, virtual: int, embedding: bool, loss: bool) -> list[int] | None:
    """The layers of every chunk as Megatron-Core builds them, in model order; None where it
    refuses the split."""
    config = SimpleNamespace(
        num_layers=layers,
        pipeline_model_parallel_layout=None,
        num_layers_in_first_pipeline_stage=None,
        num_layers_in_last_pipeline_stage=None,
        account_for_embedding_in_pipeline_split=embedding,
        account_for_loss_in_pipeline_split=loss,
        pipeline_model_parallel_size=pp,
        virtual_pipeline_model_parallel_size=virtual if virtual > 1 else None,
    )
    try:
        return [
            get_num_layers_to_build(config, vp_stage=chunk // pp, pp_rank=chunk % pp)
            for chunk in range(pp * virtual)
        ]
    except AssertionError:
        return None


def test_megatron_s_switches_split_as_megatron_core_builds() -> None:
    """Every split Megatron-Core builds with ``--account-for-embedding-in-pipeline-split``
    and ``--account-for-loss-in-pipeline-split`` (weights of 1), for 1 to 40 layers on 2 to 6
    ranks with 1 to 3 chunks each: meshconf accepts it and holds the same layers in every
    chunk."""
    compared = 0
    for layers, pp, virtual in itertools.product(range(1, 41), range(2, 7), range(1, 4)):
        for embedding, loss in ((True, False), (False, True), (True, True)):
            built = _megatron(layers, pp, virtual, embedding, loss)
            if built is None:
                continue
            training = _training(virtual, int(embedding), int(loss))
            assert _chunk_sizes(layers, pp, virtual, training) == built, (layers, pp, virtual)
            compared += 1
    assert compared == 310


@pytest.mark.parametrize(
    ("layers", "chunks", "weights", "problem"),
    [
        # torchtitan: "Number of stages (8) cannot be greater than effective layers (7)"
        (5, 8, (1, 1), "8 pipeline chunks for 7 layers (the embedding and output counted as 1 "
         "and 1 layers): some chunk holds none"),
        (3, 4, (0, 0), "4 pipeline chunks for 3 layers (the embedding and output counted as 0 "
         "and 0 layers): some chunk holds none"),
        # torchtitan: "input_weight (9) exceeds minimum layers per stage (8)"
        (32, 5, (9, 0), "the embedding and output counted as 9 and 0 layers make 41 layers for 5 "
         "pipeline chunks, 8 a chunk: fewer than the 9 layers one end counts as"),
    ],
)  # fmt: skip
def test_splits_torchtitan_refuses_are_refused(
    layers: int, chunks: int, weights: tuple[int, int], problem: str
) -> None:
    assert weights_problem(layers, chunks, *weights) == problem


def test_the_largest_weights_torchtitan_accepts_are_accepted() -> None:
    # 32 + 8 = 40 layers for 5 chunks: the first chunk holds the embedding alone
    assert weights_problem(32, 5, 8, 0) is None
    assert _chunk_sizes(32, 5, 1, _training(1, 8, 0)) == [0, 8, 8, 8, 8]


def test_a_split_that_cannot_be_made_is_no_row_of_plan(run_cli) -> None:  # type: ignore[no-untyped-def]
    result = run_cli(
        "plan", "--world-size", "64", "--gpus-per-node", "8", "--model", "llama3-8b",
        "--pp", "4", "--tp", "8", "--dp-replicate", "2", "--embedding-as-layers", "20",
        "--explain", "1",
    )  # fmt: skip
    assert (result.returncode, result.stdout) == (2, "")
    assert result.stderr == (
        "meshconf: error: --pp 4 --dp-replicate 2 --tp 8 leave no layout llama3-8b can run at "
        "--world-size 64: pp 4 cannot split llama3-8b's 32 layers: the embedding and output "
        "counted as 20 and 0 layers make 52 layers for 4 pipeline chunks, 13 a chunk: fewer "
        "than the 20 layers one end counts as; use 1 or 2; with dp_replicate 2, tp 8, pp may "
        "be 1 or 2\n"
    )


def test_the_weights_and_the_end_chunks_exclude_each_other_on_the_command_line(
    run_cli,  # type: ignore[no-untyped-def]
) -> None:
    result = run_cli(
        "plan", "--world-size", "64", "--model", "llama3-8b", "--pp", "4",
        "--output-as-layers", "1", "--last-stage-layers", "7",
    )  # fmt: skip
    assert (result.returncode, result.stdout) == (2, "")
    assert result.stderr.endswith(
        "meshconf: error: --output-as-layers and --first-stage-layers or --last-stage-layers "
        "exclude each other: both set the layers of the first and last pipeline chunks\n"
    )


def test_the_weights_and_the_end_chunks_exclude_each_other_in_a_config(
    run_cli, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "mesh.yaml"
    path.write_text(
        "world_size: 64\ndegrees: {pp: 4, dp_shard: -1}\n"
        "training:\n  first_stage_layers: 7\n  embedding_as_layers: 1\n"
    )
    result = run_cli("validate", str(path))
    assert result.returncode == 1
    assert (
        f"{path}:5:3: training.embedding_as_layers: embedding_as_layers and first_stage_layers "
        "or last_stage_layers exclude each other: both set the layers of the first and last "
        "pipeline chunks"
    ) in result.stdout + result.stderr


def test_the_block_gives_what_the_options_give(run_cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    block = tmp_path / "block.yaml"
    block.write_text(
        "world_size: 64\ndegrees: {pp: 4, tp: 8, dp_shard: 2}\n"
        "training:\n  embedding_as_layers: 1\n  output_as_layers: 1\n"
    )
    plain = tmp_path / "plain.yaml"
    plain.write_text("world_size: 64\ndegrees: {pp: 4, tp: 8, dp_shard: 2}\n")
    options = ("--embedding-as-layers", "1", "--output-as-layers", "1")
    from_block = run_cli("show", str(block), "--model", "llama3-8b")
    from_options = run_cli("show", str(plain), "--model", "llama3-8b", *options)
    assert from_block.returncode == 0, from_block.stderr
    estimate = from_block.stdout[from_block.stdout.index("model llama3-8b") :]
    assert estimate == from_options.stdout[from_options.stdout.index("model llama3-8b") :]
    assert "1f1b (the embedding and output as 1 and 1 layers);" in estimate
    # 34 weighted layers over 4 stages: 8, 9, 8 and 7 layers; the last stage, with the
    # output, peaks
    assert "pipeline rank 3" in estimate


@pytest.mark.parametrize(
    ("layers", "pp", "per_stage", "weights", "schedule", "per_rank", "problem"),
    [
        # torchtitan: num_virtual_stages = ceil((layers + weights) / layers_per_stage)
        (30, 4, 4, (1, 1), "interleaved", 2, None),
        (32, 4, 8, (0, 0), "1f1b", 1, None),
        (32, 4, 3, (1, 1), "interleaved", 3, None),
        # "Number of virtual stages (9) must be divisible by pipeline parallel size (4)"
        (32, 4, 4, (1, 1), "interleaved", 2, "4 layers a chunk make 9 chunks of 34 layers: not a multiple "
         "of pp 4"),
        # "Single stage schedule requires exactly 1 stage per rank, but got 2"
        (32, 2, 8, (0, 0), "1f1b", 2, "8 layers a chunk make 4 chunks of 32 layers, 2 a pipeline "
         "rank: 1f1b runs one"),
        # "Multi-stage schedule requires at least 2 stages per rank, but got 1"
        (32, 4, 8, (0, 0), "interleaved", 1, "8 layers a chunk make 4 chunks of 32 layers, 1 a pipeline "
         "rank: interleaved needs at least 2"),
        # ZBVZeroBubble and DualPipeV: "ZBV requires exactly 2 stages per rank"
        (30, 4, 4, (1, 1), "zbv", 2, None),
        (32, 4, 2, (0, 0), "dualpipev", 4, "2 layers a chunk make 16 chunks of 32 layers, 4 a "
         "pipeline rank: dualpipev runs two"),
        (32, 4, 8, (0, 0), "gpipe", 1, None),
        # DualPipe: one chunk a rank, and a copy of its mirror rank's
        (32, 4, 8, (0, 0), "dualpipe", 1, None),
        (32, 4, 4, (0, 0), "dualpipe", 2, "4 layers a chunk make 8 chunks of 32 layers, 2 a "
         "pipeline rank: dualpipe runs one"),
    ],
)  # fmt: skip
def test_layers_per_stage_set_the_chunks_as_torchtitan_does(
    layers: int,
    pp: int,
    per_stage: int,
    weights: tuple[int, int],
    schedule: str,
    per_rank: int,
    problem: str | None,
) -> None:
    assert chunks_from_layers(layers, pp, per_stage, weights, schedule) == (per_rank, problem)


def test_layers_per_stage_split_the_chunks_as_torchtitan_does() -> None:
    # 30 layers and the two ends make 32, 4 a chunk: 8 chunks, 2 a rank
    training = Training(
        schedule="interleaved", layers_per_stage=4, embedding_as_layers=1, output_as_layers=1
    )
    resolved, problem = training.for_model(30, 4)
    assert (problem, resolved.virtual_stages, resolved.layers_per_stage) == (None, 2, None)
    assert resolved.stage_ends == (3, 3)
    assert _chunk_sizes(30, 4, 2, resolved) == [3, 4, 4, 4, 4, 4, 4, 3]


def test_layers_per_stage_estimate_what_the_chunks_they_make_estimate(
    run_cli, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    """Llama 3 8B: 32 layers and the two ends, 3 a chunk, make 12 chunks, 3 a rank at pp 4;
    at pp 2, 6 a rank."""
    split = "embedding_as_layers: 1, output_as_layers: 1, pp_schedule: interleaved"
    for pp, virtual in ((4, 3), (2, 6)):
        by_layers = tmp_path / "layers.yaml"
        by_layers.write_text(
            f"world_size: 64\ndegrees: {{pp: {pp}, tp: 8, dp_shard: -1}}\n"
            f"training: {{{split}, layers_per_stage: 3}}\n"
        )
        by_count = tmp_path / "count.yaml"
        by_count.write_text(
            f"world_size: 64\ndegrees: {{pp: {pp}, tp: 8, dp_shard: -1}}\n"
            f"training: {{{split}, virtual_stages: {virtual}}}\n"
        )
        found = [
            run_cli("show", str(path), "--model", "llama3-8b", "--format", "json")
            for path in (by_layers, by_count)
        ]
        assert found[0].returncode == 0, found[0].stderr
        assert json.loads(found[0].stdout)["estimate"] == json.loads(found[1].stdout)["estimate"]


def test_layers_per_stage_and_virtual_stages_exclude_each_other(run_cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    result = run_cli(
        "plan", "--world-size", "64", "--model", "llama3-8b", "--pp", "4", "--pp-schedule",
        "interleaved", "--virtual-stages", "2", "--layers-per-stage", "4",
    )  # fmt: skip
    assert (result.returncode, result.stdout) == (2, "")
    assert result.stderr.endswith(
        "meshconf: error: --virtual-stages and --layers-per-stage exclude each other: both set "
        "the model chunks per pipeline rank\n"
    )
    path = tmp_path / "mesh.yaml"
    path.write_text(
        "world_size: 64\ndegrees: {pp: 4, dp_shard: -1}\ntraining:\n  pp_schedule: interleaved\n"
        "  virtual_stages: 2\n  layers_per_stage: 4\n"
    )
    result = run_cli("validate", str(path))
    assert result.returncode == 1
    assert (
        f"{path}:5:3: training.virtual_stages: virtual_stages and layers_per_stage exclude each "
        "other: both set the model chunks per pipeline rank"
    ) in result.stdout + result.stderr
