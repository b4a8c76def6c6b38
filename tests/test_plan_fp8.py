"""``--fp8-param-gather`` (the config's ``training.fp8_param_gather``): data parallelism
gathers the blocks' dense linear weights in fp8, and under ZeRO 1 and 2 keeps them in fp8.
tests/test_measure.py measures the gathers under torchao's float8 training; here, what each
term and the traffic owe to it, in bytes worked out from the model's shapes, and where the
option is refused (tests/test_convert_recompute.py has its conversions)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

import meshconf
from meshconf.features.plan.estimate.communication import traffic
from meshconf.features.plan.estimate.memory import estimate_memory
from meshconf.features.plan.estimate.presets import PRESETS
from meshconf.features.plan.estimate.step_inputs import Parallelism, Training

LLAMA = PRESETS["llama3-8b"]
# Llama 3 8B's linear weights a block: wq and wo (4096 x 4096), wk and wv (1024 x 4096),
# w1, w3 and w2 (14336 x 4096)
LINEAR = 32 * (2 * 4096 * 4096 + 2 * 1024 * 4096 + 3 * 14336 * 4096)


@pytest.mark.parametrize("zero_stage", [1, 2])
def test_zero_1_and_2_keep_the_linear_weights_in_one_byte(zero_stage: int) -> None:
    par = Parallelism(dp_shard=8)
    bf16 = estimate_memory(LLAMA, par, Training(zero_stage=zero_stage))
    fp8 = estimate_memory(LLAMA, par, Training(zero_stage=zero_stage, fp8_param_gather=True))
    assert bf16.params - fp8.params == LINEAR * (2 - 1)
    assert (fp8.grads, fp8.optimizer, fp8.gathers) == (bf16.grads, bf16.optimizer, bf16.gathers)


def test_zero_3_gathers_two_blocks_linear_weights_in_one_byte() -> None:
    # a small vocabulary, so that the peak falls in a block's backward pass
    llama = replace(LLAMA, vocab=256)
    par = Parallelism(dp_shard=8)
    bf16 = estimate_memory(llama, par, Training())
    fp8 = estimate_memory(llama, par, Training(fp8_param_gather=True))
    assert bf16.phase == fp8.phase == "block"
    # the block run and the one prefetched; the sharded parameters stay in bf16
    assert bf16.gathers - fp8.gathers == 2 * (LINEAR // 32) * (2 - 1)
    assert (fp8.params, fp8.grads, fp8.optimizer) == (bf16.params, bf16.grads, bf16.optimizer)


@pytest.mark.parametrize(("zero_stage", "gathers"), [(3, 2), (1, 1)])
def test_fsdp_traffic_gathers_the_linear_weights_in_one_byte(zero_stage: int, gathers: int) -> None:
    par = Parallelism(dp_shard=8)
    sent = {
        fp8: traffic(LLAMA, par, Training(zero_stage=zero_stage, fp8_param_gather=fp8), {})[
            "fsdp"
        ].bytes
        for fp8 in (False, True)
    }
    # ZeRO 3 gathers in the forward and the backward pass of the one micro-batch, ZeRO 1
    # once after the optimizer; a ring all-gather sends 7/8 of it
    assert sent[False] - sent[True] == pytest.approx(gathers * LINEAR * (2 - 1) * 7 / 8, abs=1)


def test_the_option_needs_a_zero_stage_that_gathers(run_cli) -> None:  # type: ignore[no-untyped-def]
    result = run_cli(
        "plan", "--world-size", "8", "--model", "llama3-8b", "--fp8-param-gather",
        "--zero-stage", "0",
    )  # fmt: skip
    assert result.returncode == 2
    assert result.stderr == (
        "meshconf: error: --fp8-param-gather needs --zero-stage 1, 2 or 3: ZeRO 0 keeps "
        "the parameters whole on every rank and gathers none\n"
    )


def test_the_training_block_refuses_it_at_its_key(tmp_path: Path) -> None:
    path = tmp_path / "mesh.yaml"
    path.write_text(
        "world_size: 8\ndegrees: {dp_shard: 8}\n"
        "training:\n  zero_stage: 0\n  fp8_param_gather: true\n"
    )
    with pytest.raises(meshconf.ConfigError) as raised:
        meshconf.load_config(path)
    (diagnostic,) = raised.value.diagnostics
    assert diagnostic.render() == (
        f"{path}:5:3: training.fp8_param_gather: fp8_param_gather needs zero_stage 1, 2 or 3: "
        "ZeRO 0 keeps the parameters whole on every rank and gathers none"
    )


def test_one_rule_names_the_option_and_the_key_where_the_file_gives_it(  # type: ignore[no-untyped-def]
    run_cli, tmp_path: Path
) -> None:
    path = tmp_path / "mesh.yaml"
    path.write_text(
        "world_size: 8\ndegrees: {dp_shard: 8}\ntraining:\n  model: llama3-8b\n  zero_stage: 0\n"
    )
    result = run_cli("show", str(path), "--fp8-param-gather")
    assert (result.returncode, result.stdout) == (2, "")
    assert result.stderr == (
        f"meshconf: error: --fp8-param-gather needs training.zero_stage at {path}:5:3 1, 2 or 3: "
        "ZeRO 0 keeps the parameters whole on every rank and gathers none\n"
    )
