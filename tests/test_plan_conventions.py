"""Conventions of the estimate against their sources: ZeRO stages against the ZeRO paper's
model-state memory, and what --mfu counts against PaLM's definitions.

Rajbhandari et al., "ZeRO: Memory Optimizations Toward Training Trillion Parameter Models"
(SC 2020), figure 1: with ``Psi`` parameters, fp16 parameters and gradients and ``K = 12``
bytes of optimizer state per parameter (fp32 master copy and two Adam moments) over ``Nd``
data-parallel ranks, a rank holds ``(2 + 2 + K) Psi / Nd`` under stage 3,
``2 Psi + (2 + K) Psi / Nd`` under stage 2 and ``2 Psi + 2 Psi + K Psi / Nd`` under stage 1.
meshconf counts torch's 4-byte Adam step per tensor on top, which the paper leaves out.

Megatron-LM's ``theoretical_memory_usage.compute_weight_and_optimizer_memory`` counts 18
bytes per parameter of the most loaded shard (bf16 weight, fp32 main gradient, fp32 master
weight and two Adam moments), or ``6 + 12 / dp`` with its distributed optimizer; these are
meshconf's ZeRO stage 1 with fp32 gradients, without and with the data-parallel ranks
sharding the optimizer.
"""

from __future__ import annotations

import pytest

from meshconf.features.plan.estimate.architecture import Architecture, GroupedQueryAttention
from meshconf.features.plan.estimate.communication import traffic
from meshconf.features.plan.estimate.memory import ADAM_STEP_BYTES, estimate_memory
from meshconf.features.plan.estimate.step import estimate
from meshconf.features.plan.estimate.training import Parallelism, Training, ZeroStage

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
    ("degrees", "megatron_bytes_per_parameter"),
    [({"dp_replicate": RANKS}, 18), ({"dp_shard": RANKS}, 6 + 12 / RANKS)],
)
def test_weights_and_optimizer_are_megatron_s_theoretical_memory(
    degrees: dict[str, int], megatron_bytes_per_parameter: float
) -> None:
    training = Training(param_dtype="bf16", grad_dtype="fp32", zero_stage=1)
    memory = estimate_memory(ARCH, Parallelism(**degrees), training)
    sharded_steps = TENSORS * ADAM_STEP_BYTES
    state = memory.params + memory.grads + memory.optimizer - sharded_steps
    assert state == megatron_bytes_per_parameter * PSI


def test_stages_1_and_2_gather_parameters_once_a_step() -> None:
    """ZeRO 3 gathers the weights for every forward and backward pass of every micro-batch;
    1 and 2 once a step, after the optimizer. Both reduce-scatter the gradients once."""
    par = Parallelism(dp_shard=RANKS)
    sent = {
        stage: traffic(ARCH, par, Training(zero_stage=stage, global_batch_tokens=8 * 8192 * 4), {})
        for stage in (1, 3)
    }
    micro_batches = 8
    ring = (RANKS - 1) / RANKS
    weights = PSI
    assert sent[1]["fsdp"].bytes == int((weights * 2 + weights * 4) * ring)
    assert sent[3]["fsdp"].bytes == int((2 * micro_batches * weights * 2 + weights * 4) * ring)


@pytest.mark.parametrize(("checkpointing", "ratio"), [("full", 4 / 3), ("none", 1.0)])
def test_hardware_flops_count_the_recomputed_forward_pass(checkpointing: str, ratio: float) -> None:
    """A published MFU counts the model's FLOPs (three passes a step); hardware FLOPs count
    full recomputation's fourth pass too (PaLM, appendix B)."""
    settings = {"checkpointing": checkpointing}
    model = estimate(ARCH, Parallelism(), Training(**settings, mfu_counts="model"), {})  # type: ignore[arg-type]
    hardware = estimate(ARCH, Parallelism(), Training(**settings, mfu_counts="hardware"), {})  # type: ignore[arg-type]
    assert hardware.compute_seconds == pytest.approx(model.compute_seconds * ratio)
