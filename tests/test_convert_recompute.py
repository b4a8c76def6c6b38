"""The config's ``training.activation_checkpointing``, and Megatron-LM's recomputation
arguments read into it by ``meshconf convert``: where the estimate's modes say the same, the
key is written; where they cannot (layers recomputed in groups, or only some of them), a note
says so and the key is left to the estimate's default."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import meshconf

ARGS = "--tensor-model-parallel-size 2 --use-distributed-optimizer "


def _converted(run_cli, tmp_path: Path, arguments: str):  # type: ignore[no-untyped-def]
    out = tmp_path / "converted.yaml"
    result = run_cli(
        "convert", "--from", "megatron", "--args", ARGS + arguments, "--world-size", "16",
        "--out", str(out),
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    return meshconf.load_config(out), out.read_text()


@pytest.mark.parametrize(
    ("arguments", "mode"),
    [
        (
            "--recompute-granularity full --recompute-method uniform --recompute-num-layers 1",
            "full",
        ),
        ("--recompute-granularity selective", "none"),
    ],
)
def test_recomputation_the_estimate_can_say_is_converted(
    run_cli, tmp_path: Path, arguments: str, mode: str
) -> None:  # type: ignore[no-untyped-def]
    config, _ = _converted(run_cli, tmp_path, arguments)
    assert config.training is not None
    assert config.training.activation_checkpointing == mode


@pytest.mark.parametrize(
    "arguments",
    [
        "--recompute-granularity full --recompute-method block --recompute-num-layers 4",
        "--recompute-granularity full --recompute-method uniform --recompute-num-layers 2",
    ],
)
def test_recomputation_it_cannot_say_is_left_with_a_note(
    run_cli, tmp_path: Path, arguments: str
) -> None:  # type: ignore[no-untyped-def]
    config, text = _converted(run_cli, tmp_path, arguments)
    assert config.training is not None
    assert config.training.activation_checkpointing is None
    note = " ".join(line.lstrip("# ") for line in text.splitlines() if line.startswith("#"))
    assert f"{arguments} is not converted: the estimate recomputes each block whole" in note


def test_an_unknown_granularity_is_refused_at_its_argument(run_cli) -> None:  # type: ignore[no-untyped-def]
    result = run_cli(
        "convert", "--from", "megatron", "--args", "--recompute-granularity partial",
        "--world-size", "16",
    )  # fmt: skip
    assert (result.returncode, result.stdout) == (
        1,
        "--args:1:25: --recompute-granularity: expected full or selective, got the string "
        "'partial'\n",
    )


def test_the_block_and_the_option_give_the_same_estimate(run_cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    block = tmp_path / "block.yaml"
    block.write_text(
        "world_size: 8\ndegrees: {dp_shard: 8}\ntraining:\n  activation_checkpointing: selective\n"
    )
    plain = tmp_path / "plain.yaml"
    plain.write_text("world_size: 8\ndegrees: {dp_shard: 8}\n")
    from_block = run_cli("show", str(block), "--model", "llama3-8b", "--format", "json")
    from_option = run_cli(
        "show", str(plain), "--model", "llama3-8b", "--format", "json",
        "--activation-checkpointing", "selective",
    )  # fmt: skip
    assert from_block.returncode == 0, from_block.stderr
    assert json.loads(from_block.stdout)["estimate"] == json.loads(from_option.stdout)["estimate"]
    # the option overrides the block
    overridden = run_cli(
        "show", str(block), "--model", "llama3-8b", "--activation-checkpointing", "full"
    )
    assert "; full checkpointing," in overridden.stdout
