"""Conventions of the estimate against their sources: ZeRO stages against the ZeRO paper's
model-state memory, what --mfu counts against PaLM's definitions, and the estimate's
settings against the settings table.

Rajbhandari et al., "ZeRO: Memory Optimizations Toward Training Trillion Parameter Models"
(SC 2020), figure 1: with ``Psi`` parameters, fp16 parameters and gradients and ``K = 12``
bytes of optimizer state per parameter (fp32 master copy and two Adam moments) over ``Nd``
data-parallel ranks, a rank holds ``(2 + 2 + K) Psi / Nd`` under stage 3,
``2 Psi + (2 + K) Psi / Nd`` under stage 2 and ``2 Psi + 2 Psi + K Psi / Nd`` under stage 1.
meshconf counts torch's 4-byte Adam step per tensor on top, which the paper leaves out.

Megatron-LM's ``theoretical_memory_usage.compute_weight_and_optimizer_memory`` counts 18
bytes per parameter of the most loaded shard (bf16 weight, fp32 main gradient, fp32 master
weight and two Adam moments), or ``6 + 12 / dp`` with its distributed optimizer: meshconf's
ZeRO stages 0 and 1 with fp32 gradients.
"""

from __future__ import annotations

from dataclasses import fields

import pytest

from meshconf.core.setting_values import ZeroStage
from meshconf.core.settings import MODEL_SETTINGS, SETTINGS, TRAINING_SETTINGS
from meshconf.features.plan.estimate.architecture import Architecture, GroupedQueryAttention
from meshconf.features.plan.estimate.communication import traffic
from meshconf.features.plan.estimate.gpus import GPUS
from meshconf.features.plan.estimate.memory import ADAM_STEP_BYTES, estimate_memory
from meshconf.features.plan.estimate.step import estimate
from meshconf.features.plan.estimate.step_inputs import Parallelism, Training

# Every dim divides by 4, so FSDP's shards need no padding.
ARCH = Architecture("small", 4, 256, 704, 512, GroupedQueryAttention(4, 2, 64))
RANKS = 4
PSI = ARCH.parameter_count()
TENSORS = sum(len(ARCH.layer_weights("dense")) for _ in range(ARCH.layers)) + len(
    ARCH.embedding_weights() + ARCH.output_weights()
)


@pytest.mark.parametrize(
    ("stage", "paper"),
    [
        (3, (2 + 2 + 12) * PSI // RANKS),
        (0, (2 + 2 + 12) * PSI),
        (2, 2 * PSI + (2 + 12) * PSI // RANKS),
        (1, 2 * PSI + 2 * PSI + 12 * PSI // RANKS),
    ],
)
def test_model_state_is_the_paper_s(stage: ZeroStage, paper: int) -> None:
    training = Training(param_dtype="bf16", grad_dtype="bf16", zero_stage=stage)
    memory = estimate_memory(ARCH, Parallelism(dp_shard=RANKS), training)
    steps = TENSORS * ADAM_STEP_BYTES
    assert memory.params + memory.grads + memory.optimizer - steps == paper


@pytest.mark.parametrize(
    ("stage", "megatron_bytes_per_parameter"),
    [(0, 18), (1, 6 + 12 / RANKS)],
)
def test_weights_and_optimizer_are_megatron_s_theoretical_memory(
    stage: ZeroStage, megatron_bytes_per_parameter: float
) -> None:
    training = Training(param_dtype="bf16", grad_dtype="fp32", zero_stage=stage)
    memory = estimate_memory(ARCH, Parallelism(dp_shard=RANKS), training)
    sharded_steps = TENSORS * ADAM_STEP_BYTES
    state = memory.params + memory.grads + memory.optimizer - sharded_steps
    assert state == megatron_bytes_per_parameter * PSI


def test_stages_1_and_2_gather_parameters_once_a_step() -> None:
    """ZeRO 3 gathers the weights for every forward and backward pass of every micro-batch;
    1 and 2 once a step, after the optimizer. Both reduce-scatter the gradients once; ZeRO 0
    all-reduces them and gathers nothing."""
    par = Parallelism(dp_shard=RANKS)
    sent = {
        stage: traffic(ARCH, par, Training(zero_stage=stage, global_batch_tokens=8 * 8192 * 4), {})
        for stage in (0, 1, 3)
    }
    micro_batches = 8
    ring = (RANKS - 1) / RANKS
    weights = PSI
    assert sent[1]["fsdp"].bytes == int((weights * 2 + weights * 4) * ring)
    assert sent[3]["fsdp"].bytes == int((2 * micro_batches * weights * 2 + weights * 4) * ring)
    # ZeRO 0: an all-reduce of the gradients, a reduce-scatter and an all-gather of them
    assert sent[0]["fsdp"].bytes == int(2 * weights * 4 * ring)


@pytest.mark.parametrize("checkpointing", ["full", "none"])
def test_hardware_flops_count_the_blocks_recomputed_forward_pass(checkpointing: str) -> None:
    """A published MFU counts the model's FLOPs (three passes a step); hardware FLOPs count
    full recomputation's fourth pass of the blocks too (PaLM, appendix B), not of the final
    norm and the output, which no recomputation runs (tests/test_plan_flops.py counts both
    with torch's FLOP counter)."""
    settings = {"checkpointing": checkpointing}
    model = estimate(ARCH, Parallelism(), Training(**settings, mfu_counts="model"), {})  # type: ignore[arg-type]
    hardware = estimate(ARCH, Parallelism(), Training(**settings, mfu_counts="hardware"), {})  # type: ignore[arg-type]
    width = 2 * 4 * 64
    forward = 2 * ARCH.active_parameter_count() + 2 * Training().seq_len * width * ARCH.layers
    blocks = forward - 2 * (ARCH.hidden * ARCH.vocab + ARCH.hidden)
    ratio = 1 + blocks / (3 * forward) if checkpointing == "full" else 1.0
    assert hardware.compute_seconds == pytest.approx(model.compute_seconds * ratio)


def test_hardware_flops_count_the_products_selective_runs_again() -> None:
    """torchtitan's per-op policy keeps every other matrix product of a block and runs the
    others again in the backward pass: in a Llama block wk, wo and w3 (wq, wv, w1 and w2
    are kept). Hardware FLOPs count those; the attention kernel is kept, not recomputed."""
    seq_len, hidden, width = 8192, 256, 2 * 4 * 64
    settings = {"checkpointing": "selective", "seq_len": seq_len}
    model = estimate(ARCH, Parallelism(), Training(**settings, mfu_counts="model"), {})  # type: ignore[arg-type]
    hardware = estimate(ARCH, Parallelism(), Training(**settings, mfu_counts="hardware"), {})  # type: ignore[arg-type]
    per_token = 6 * ARCH.active_parameter_count() + 6 * seq_len * width * ARCH.layers
    recomputed = ARCH.layers * (2 * 64 * hidden + hidden * hidden + 704 * hidden)
    ratio = 1 + 2 * recomputed / per_token
    assert hardware.compute_seconds == pytest.approx(model.compute_seconds * ratio)


def test_an_mfu_over_the_step_is_the_step_s_and_says_what_the_compute_needs() -> None:
    """A published MFU is model FLOPs over the whole step: at that MFU the step is
    ``F / (peak mfu)`` whatever the bubble and the communication not hidden, and the
    compute must then reach a larger share of the peak, which the estimate gives."""
    par = Parallelism(pp=4, dp_shard=RANKS)
    over_compute = Training(global_batch_tokens=8 * 8192 * RANKS, mfu=0.4)
    over_step = Training(global_batch_tokens=8 * 8192 * RANKS, mfu=0.4, mfu_over="step")
    plain = estimate(ARCH, par, over_compute, {})
    found = estimate(ARCH, par, over_step, {})
    assert plain.compute_mfu == 0.4
    assert found.step_seconds == pytest.approx(plain.compute_seconds, rel=1e-12)
    assert found.compute_mfu is not None and found.compute_mfu > 0.4
    # the compute the step leaves, stretched by the bubble, with the exposed traffic
    stretched = (found.compute_seconds + found.exposed_seconds) * (1 + found.bubble_fraction)
    assert stretched == pytest.approx(found.step_seconds, rel=1e-12)
    assert found.compute_mfu == pytest.approx(0.4 * plain.compute_seconds / found.compute_seconds)


def test_an_mfu_the_layout_cannot_reach_over_the_step_is_said() -> None:
    """With a bubble of 3 (4 stages, one micro-batch), no compute reaches 0.9 over the step:
    the estimate runs the compute at the peak and says it cannot reach the MFU."""
    par = Parallelism(pp=4, dp_shard=RANKS)
    training = Training(global_batch_tokens=8192 * RANKS, mfu=0.9, mfu_over="step")
    found = estimate(ARCH, par, training, {})
    at_peak = estimate(ARCH, par, Training(global_batch_tokens=8192 * RANKS, mfu=1.0), {})
    assert found.compute_mfu is None
    assert found.step_seconds == pytest.approx(at_peak.step_seconds, rel=1e-12)


def test_every_setting_s_default_is_its_row_s() -> None:
    training = Training()
    gpu = GPUS[SETTINGS["gpu"].default]
    rows = [row for row in TRAINING_SETTINGS if row.key not in MODEL_SETTINGS]
    assert {field.name for field in fields(Training)} == {row.attribute for row in rows}
    for row in rows:
        figure = row.gpu_figure not in ("", "name")
        expected = getattr(gpu, row.gpu_figure) if figure else row.default
        assert getattr(training, row.attribute) == expected, row.key
