"""The FLOPs of a step against torch's FLOP counter: a small Llama-shaped model
(tests/llama_like.py) runs its forward and backward passes on CPU under
``torch.utils.flop_counter.FlopCounterMode``, with each block wrapped as torchtitan wraps it
for each checkpointing mode, and the counts equal the estimate's passes
(``work.pass_flops``) times the tokens; and the pipeline runs at the pace of its rank with
the most FLOPs.

Two conventions differ from the counter's, and the tests say each one: the estimate's
``2 N`` a pass counts every weight outside the embedding, the norms' too, where the counter
counts matrix products only; and a flash attention kernel's backward pass computes the
scores again (one product), which the counter counts and model FLOPs do not. The attention
runs as its products (torch's math kernel) where checkpointing keeps no attention output;
with ``selective``, torchtitan's policy keeps the kernel's output, so it runs as CPU's flash
kernel, counted with torch's own formulas for the CUDA kernels.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from llama_like import LlamaLike
from measure_builds import checkpointed
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import (
    FlopCounterMode,
    bmm_flop,
    sdpa_backward_flop_count,
    sdpa_flop_count,
)

from meshconf.features.plan.estimate.architecture import Architecture, GroupedQueryAttention
from meshconf.features.plan.estimate.pipeline import rank_stage
from meshconf.features.plan.estimate.presets import PRESETS
from meshconf.features.plan.estimate.schedule import PassFlops
from meshconf.features.plan.estimate.step_inputs import Parallelism, Training
from meshconf.features.plan.estimate.work import busiest_stage, pass_flops, stage_work

ARCH = Architecture("small", 4, 128, 352, 512, GroupedQueryAttention(4, 2, 32))
BATCH, SEQ = 2, 128
TOKENS = BATCH * SEQ

_CPU_FLASH = {
    torch.ops.aten._scaled_dot_product_flash_attention_for_cpu: (
        lambda query, key, value, *args, out_shape=None, **kwargs: sdpa_flop_count(
            query, key, value
        )
    ),
    torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward: (
        lambda grad, query, key, value, *args, out_shape=None, **kwargs: sdpa_backward_flop_count(
            grad, query, key, value
        )
    ),
}


def _counted(mode: str, kernel: SDPBackend) -> tuple[int, int, torch.nn.Module]:
    """FLOPs of the forward and of the backward pass of one micro-batch."""
    torch.manual_seed(0)
    model = checkpointed(LlamaLike(ARCH), mode)
    tokens = torch.randint(0, ARCH.vocab, (BATCH, SEQ))
    with sdpa_kernel(kernel):
        with FlopCounterMode(display=False, custom_mapping=_CPU_FLASH) as forward:
            loss = model(tokens).float().sum()
        with FlopCounterMode(display=False, custom_mapping=_CPU_FLASH) as backward:
            loss.backward()
    return forward.get_total_flops(), backward.get_total_flops(), model


def _estimated(mode: str) -> PassFlops:
    training, _ = Training(seq_len=SEQ, micro_batch=BATCH, checkpointing=mode).for_model(  # type: ignore[arg-type]
        ARCH.layers, 1
    )
    return pass_flops(ARCH, Parallelism(), training, busiest_stage(ARCH, Parallelism(), training))


def _norm_flops(model: torch.nn.Module) -> int:
    """What ``2 N`` a pass gives the norms' weights, which multiply elementwise."""
    norms = [module for module in model.modules() if isinstance(module, torch.nn.RMSNorm)]
    elements = sum(param.numel() for norm in norms for param in norm.parameters())
    return 2 * elements * TOKENS


@pytest.mark.parametrize("mode", ["none", "full"])
def test_the_passes_are_torch_s_flop_count(mode: str) -> None:
    """Forward: ``2 N`` and the attention's scores and their use; backward: twice that, and
    with ``full`` the blocks' forward pass again (not the final norm's and output's)."""
    forward, backward, model = _counted(mode, SDPBackend.MATH)
    passes = _estimated(mode)
    norms = _norm_flops(model)
    assert forward == passes.forward * TOKENS - norms
    # the norms, in each of the backward pass's two products a weight and, recomputed, in
    # the blocks' forward pass (the final norm's weight is the last hidden of them)
    recomputed_norms = norms - 2 * ARCH.hidden * TOKENS if mode == "full" else 0
    estimated = (passes.backward_input + passes.backward_weight) * TOKENS
    assert backward == estimated - 2 * norms - recomputed_norms


def test_selective_recomputes_the_products_torchtitan_s_policy_leaves() -> None:
    """torchtitan's per-op policy keeps the attention kernel's output and every other matrix
    product: the backward pass runs ``wk``, ``wo`` and ``w3`` again (``recomputed``), and the
    flash kernel computes the scores again, which model FLOPs leave out."""
    forward, backward, model = _counted("selective", SDPBackend.FLASH_ATTENTION)
    passes = _estimated("selective")
    norms = _norm_flops(model)
    assert forward == passes.forward * TOKENS - norms
    attention: Any = ARCH.attention
    scores = bmm_flop(
        (BATCH * attention.heads, SEQ, attention.head_dim),
        (BATCH * attention.heads, attention.head_dim, SEQ),
    )
    flash_scores = ARCH.layers * scores
    expected = (passes.backward_input + passes.backward_weight) * TOKENS - 2 * norms
    assert backward == expected + flash_scores
    wk = ARCH.hidden * attention.kv_heads * attention.head_dim
    wo = attention.heads * attention.head_dim * ARCH.hidden
    w3 = ARCH.hidden * ARCH.ffn
    assert passes.recomputed * TOKENS == 2 * ARCH.layers * TOKENS * (wk + wo + w3)


@pytest.mark.parametrize(
    ("ends", "layers", "last"),
    [
        # Llama 3 8B over pp 4, 8 blocks a rank: the last also runs the final norm and the
        # output (2.4 blocks' weights, 1.8 blocks' FLOPs at 8K tokens), and sets the pace
        ((None, None), 8, True),
        # 7, 9, 8 and 8 blocks: the last rank's 8 and the output outweigh 9
        ((7, 8), 8, True),
        # 2 on each end, 14 on the others: the first of those
        ((2, 2), 14, False),
    ],
)
def test_the_pipeline_runs_at_the_pace_of_its_rank_with_the_most_flops(
    ends: tuple[int, int], layers: int, last: bool
) -> None:
    arch, par = PRESETS["llama3-8b"], Parallelism(pp=4)
    training = Training(first_stage_layers=ends[0], last_stage_layers=ends[1])
    work = busiest_stage(arch, par, training)
    assert (work.layers, work.last) == (layers, last)
    # the pace is the most FLOPs of any rank, whichever ranks the estimate looks at
    recomputation = (training.checkpointing, None, None)
    every = [
        pass_flops(
            arch,
            par,
            training,
            stage_work(arch, par, rank_stage(arch, 4, 1, rank, ends), recomputation),
        ).total
        for rank in range(4)
    ]
    assert pass_flops(arch, par, training, work).total == max(every)
