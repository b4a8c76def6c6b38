"""Uneven pipeline splits (``--first-stage-layers``, ``--last-stage-layers``), as Megatron-LM's
``--decoder-first-pipeline-num-layers`` and ``--decoder-last-pipeline-num-layers`` give them,
and the layout Llama 3.1 405B trained with: 126 layers over 16 stages of 8 interleaved chunks,
the first chunk the embedding alone and the last the output alone (Dubey et al. 2024,
section 3.3.2)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import meshconf
from meshconf.features.plan.estimate.pipeline import EndSplit, rank_chunks, split_problem
from meshconf.features.plan.estimate.presets import PRESETS
from meshconf.features.plan.estimate.step import estimate
from meshconf.features.plan.estimate.step_inputs import Parallelism, Training

LLAMA_405B = PRESETS["llama3-405b"]


def test_the_405b_split_leaves_the_first_and_last_chunk_to_embedding_and_output() -> None:
    split = EndSplit.of(126, 128, (0, 0))
    sizes = [split.size(chunk) for chunk in range(128)]
    assert sizes == [0] + [1] * 126 + [0]
    assert rank_chunks(126, 16, 8, 0, (0, 0))[:2] == [range(0, 0), range(15, 16)]
    assert rank_chunks(126, 16, 8, 15, (0, 0))[-1] == range(126, 126)
    layers = [layer for rank in range(16) for chunk in rank_chunks(126, 16, 8, rank, (0, 0))
              for layer in chunk]  # fmt: skip
    assert sorted(layers) == list(range(126))


def test_meta_s_interleaved_405b_layout_fits_with_its_split() -> None:
    par = Parallelism(pp=16, dp_shard=128, tp=8)
    base = {"global_batch_tokens": 16_777_216, "schedule": "interleaved", "virtual_stages": 8}
    even = estimate(LLAMA_405B, par, Training(**base), {})  # type: ignore[arg-type]
    assert even.problem == "128 pipeline chunks for 126 layers: some chunk holds none"
    split = Training(**base, first_stage_layers=0, last_stage_layers=0)  # type: ignore[arg-type]
    found = estimate(LLAMA_405B, par, split, {})
    assert found.problem is None and found.fits


@pytest.mark.parametrize(
    ("layers", "count", "ends", "problem"),
    [
        (126, 128, (0, 0), None),
        (126, 128, (None, None), "128 pipeline chunks for 126 layers: some chunk holds none"),
        (
            126,
            128,
            (0, 5),
            "first and last chunks of 0 and 5 layers leave 121 of 126 layers for the other 126 "
            "pipeline chunks: each needs at least one",
        ),
        (
            10,
            2,
            (3, None),
            None,
        ),
        (
            10,
            2,
            (3, 3),
            "first and last chunks of 3 and 3 layers leave 4 of 10 layers for the other 0 "
            "pipeline chunks: each needs at least one",
        ),
        (
            10,
            1,
            (3, None),
            "--first-stage-layers and --last-stage-layers need at least 2 pipeline chunks",
        ),
    ],
)
def test_split_problems_say_what_is_left(
    layers: int, count: int, ends: tuple[int | None, int | None], problem: str | None
) -> None:
    assert split_problem(layers, count, ends) == problem


def test_the_options_are_checked_like_the_others(run_cli) -> None:  # type: ignore[no-untyped-def]
    args = ["plan", "--world-size", "64", "--model", "llama3-8b", "--first-stage-layers", "-1"]
    result = run_cli(*args)
    assert result.returncode == 2
    assert result.stderr.startswith("meshconf: error: --first-stage-layers: ")


def test_megatron_s_training_settings_become_the_config_s_training_block(
    run_cli, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    args = "--pipeline-model-parallel-size 16 --tensor-model-parallel-size 8 "
    split = "--decoder-first-pipeline-num-layers 7 --decoder-last-pipeline-num-layers 7"
    more = " --use-distributed-optimizer --virtual-pipeline-model-parallel-size 4"
    out = tmp_path / "converted.yaml"
    result = run_cli(
        "convert", "--from", "megatron", "--args", args + split + more, "--world-size", "16384",
        "--out", str(out),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    config = meshconf.load_config(out)
    assert config.training is not None
    assert config.training.estimate_settings() == {
        "zero_stage": 1, "schedule": "interleaved", "virtual_stages": 4,
        "first_stage_layers": 7, "last_stage_layers": 7, "sequence_parallel": "none",
    }  # fmt: skip
    # show --model reads the block: the same estimate as the options give
    from_block = run_cli("show", str(out), "--model", "llama3-405b", "--format", "json")
    from_options = run_cli(
        "show", str(out), "--model", "llama3-405b", "--format", "json", "--zero-stage", "1",
        "--pp-schedule", "interleaved", "--virtual-stages", "4", "--first-stage-layers", "7",
        "--last-stage-layers", "7", "--sequence-parallel", "none",
    )  # fmt: skip
    assert json.loads(from_block.stdout)["estimate"] == json.loads(from_options.stdout)["estimate"]
    overridden = run_cli("show", str(out), "--model", "llama3-405b", "--zero-stage", "3")
    assert "ZeRO stage" not in overridden.stdout
    bad = run_cli(
        "convert", "--from", "megatron", "--args", args + "--decoder-first-pipeline-num-layers x"
    )
    assert (bad.returncode, bad.stdout) == (1, "")
    assert bad.stderr.splitlines() == [
        "--args:1:102: --decoder-first-pipeline-num-layers: expected an integer >= 1, got the "
        "string 'x'"
    ]
    one_chunk = run_cli(
        "convert", "--from", "megatron", "--args", args + "--virtual-pipeline-model-parallel-size 1"
    )
    assert (one_chunk.returncode, one_chunk.stdout, one_chunk.stderr) == (
        1,
        "",
        "--args:1:105: --virtual-pipeline-model-parallel-size: pp_schedule interleaved needs "
        "virtual_stages >= 2\n",
    )
