"""The estimate's precisions and recomputation groups against torch's ``MemTracker`` on CPU,
under ``FakeTensorMode``, with blocks of tests/llama_like.py's model in bf16:

- eager norms (``--norm-kernel eager``), written as Hugging Face's ``LlamaRMSNorm`` is: what
  a block stores equals the estimate exactly;
- fp8 activations (``--activation-dtype fp8``): linear layers that keep their input in fp8,
  one copy for the products that share it, with an fp32 scale per token and 128 channels
  (the DeepSeek-V3 report, sections 3.3.2 and 3.3.3): what a block stores equals the
  estimate exactly;
- bf16 moments (``--optimizer-dtype bf16``): torch's AdamW state on bf16 parameters;
- Megatron-LM's uniform recomputation (``--checkpoint-group N``): groups of N blocks, each
  a reentrant checkpoint recomputed whole from its input: a group stores its input, and the
  last group's backward peak grows over recomputing block by block as the estimate says,
  exactly.
"""

from __future__ import annotations

import itertools
import weakref
from dataclasses import replace
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from llama_like import LlamaLike
from measure_builds import tracked_step
from torch import nn

from meshconf.features.plan.estimate import activations
from meshconf.features.plan.estimate.architecture import Architecture, GroupedQueryAttention
from meshconf.features.plan.estimate.memory import ADAM_MOMENTS, MASTER_BYTES, rank_memory
from meshconf.features.plan.estimate.pipeline import rank_stage
from meshconf.features.plan.estimate.step_inputs import Parallelism, Training

#: widths that are multiples of 128, the channels one fp8 scale covers
ARCH = Architecture("precision", 4, 256, 768, 512, GroupedQueryAttention(4, 2, 64))
SEQ, BATCH = 64, 2
TOKENS = SEQ * BATCH
TILE = activations.FP8_TILE


class EagerRMSNorm(nn.Module):
    """RMSNorm as Hugging Face's LlamaRMSNorm writes it: on an fp32 copy of the input."""

    def __init__(self, hidden: int, dtype: torch.dtype) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden, dtype=dtype))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        upcast = x.to(torch.float32)
        variance = upcast.pow(2).mean(-1, keepdim=True)
        upcast = upcast * torch.rsqrt(variance + 1e-6)
        return self.weight * upcast.to(x.dtype)


class _Fp8Input(torch.autograd.Function):
    """A linear layer that keeps its input for the backward pass in fp8 (e4m3), scaled per
    token and 128 channels in fp32, quantized once for every product that reads it."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor, cache: _Quantized) -> torch.Tensor:
        ctx.quantized = cache.of(x)
        ctx.save_for_backward(*ctx.quantized, weight)
        ctx.shape = x.shape
        return F.linear(x, weight)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, None]:
        values, scales, weight = ctx.saved_tensors
        tiles = values.to(torch.float32).unflatten(-1, (-1, TILE)) * scales.unsqueeze(-1)
        x = tiles.flatten(-2).to(grad.dtype).reshape(ctx.shape)
        grad_weight = grad.flatten(0, -2).T @ x.flatten(0, -2)
        return grad @ weight, grad_weight, None


class _Quantized:
    """The fp8 copy of each input, made once while the input lives."""

    def __init__(self) -> None:
        self._copies: dict[int, tuple[weakref.ref[torch.Tensor], tuple[torch.Tensor, ...]]] = {}

    def of(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        found = self._copies.get(id(x))
        if found is not None and found[0]() is x:
            return found[1]
        tiles = x.detach().to(torch.float32).unflatten(-1, (-1, TILE))
        scales = tiles.abs().amax(-1).clamp(min=1e-12) / 448.0
        values = (tiles / scales.unsqueeze(-1)).flatten(-2).to(torch.float8_e4m3fn)
        copy = (values, scales)
        self._copies[id(x)] = (weakref.ref(x), copy)
        return copy


class Fp8InputLinear(nn.Module):
    def __init__(self, linear: nn.Linear, cache: _Quantized) -> None:
        super().__init__()
        self.weight = linear.weight
        self.cache = cache

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = _Fp8Input.apply(x, self.weight, self.cache)
        return out


def _bf16_model() -> LlamaLike:
    """The model made in bf16 (converting it under fake tensors is refused)."""
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        return LlamaLike(ARCH)
    finally:
        torch.set_default_dtype(default)


def _model(eager: bool, fp8: bool) -> LlamaLike:
    model = _bf16_model()
    cache = _Quantized()
    for block in model.layers:
        if eager:
            block.attention_norm = EagerRMSNorm(ARCH.hidden, torch.bfloat16)
            block.ffn_norm = EagerRMSNorm(ARCH.hidden, torch.bfloat16)
        if fp8:
            # the attention's output, wo's input, stays in bf16: the attention's backward
            # pass reads it too
            for name in ("wq", "wk", "wv", "w1", "w3", "w2"):
                setattr(block, name, Fp8InputLinear(getattr(block, name), cache))
    return model


def _stores(model: nn.Module) -> tuple[list[int], int]:
    tokens = torch.randint(0, ARCH.vocab, (BATCH, SEQ))
    return tracked_step(model, tokens, "LlamaLike.layers")


def _tracked(eager: bool, fp8: bool) -> list[int]:
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        torch.manual_seed(0)
        ends, _ = _stores(_model(eager, fp8))
    return [later - earlier for earlier, later in itertools.pairwise(ends)]


def test_eager_norms_store_what_the_estimate_says_exactly() -> None:
    expected = activations.block(ARCH, "dense", "none", norm_kernel="eager")
    assert _tracked(eager=True, fp8=False) == [expected.bytes(TOKENS, 1, 2)] * (ARCH.layers - 1)
    # 4 bytes an element of each of the two norms more than fused ones
    fused = activations.block(ARCH, "dense", "none").bytes(TOKENS, 1, 2)
    assert expected.bytes(TOKENS, 1, 2) - fused == 2 * 4 * ARCH.hidden * TOKENS


def test_fp8_activations_store_what_the_estimate_says_exactly() -> None:
    expected = activations.block(ARCH, "dense", "none", norm_kernel="eager")
    stored = expected.bytes(TOKENS, 1, 2, linear_bytes=1)
    assert _tracked(eager=True, fp8=True) == [stored] * (ARCH.layers - 1)
    # the norms' outputs and the SwiGLU product in 1 byte and a 4-byte scale per 128
    linear = 2 * ARCH.hidden + ARCH.ffn
    assert expected.bytes(TOKENS, 1, 2) - stored == linear * TOKENS * (2 - 1 - 4 / TILE)


def test_bf16_moments_are_what_adamw_keeps_for_bf16_parameters() -> None:
    """torch's AdamW keeps its moments in the parameters' dtype: on bf16 parameters, the two
    bf16 moments of ``--optimizer-dtype bf16``, without the fp32 master copy that the
    estimate adds beside bf16 parameters (DeepSeek-V3 keeps it)."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed._tools.mem_tracker import MemTracker

    with FakeTensorMode():
        model = _bf16_model()
        optimizer = torch.optim.AdamW(model.parameters())
        tracker = MemTracker()
        tracker.track_external(model, optimizer)
        with tracker:
            model(torch.randint(0, ARCH.vocab, (BATCH, SEQ))).float().sum().backward()
            optimizer.step()
            # the state after the step, without the step's temporaries
            current = tracker.get_tracker_snapshot()
        measured = sum(
            size
            for sizes in current.values()
            for kind, size in sizes.items()
            if getattr(kind, "name", "") == "OPT"
        )
    parameters = sum(p.numel() for p in model.parameters())
    tensors = len(list(model.parameters()))
    training = Training(optimizer_dtype="bf16", zero_stage=0)
    stage = rank_stage(ARCH, 1, 1, 0)
    estimated = rank_memory(ARCH, Parallelism(), training, stage).optimizer
    steps = 4 * tensors  # torch keeps each tensor's step as an fp32 scalar
    assert measured == parameters * ADAM_MOMENTS * 2 + steps
    assert estimated == measured + parameters * MASTER_BYTES


#: blocks large beside the output, so that the step's peak falls in a group's backward pass
GROUP_ARCH = Architecture("grouped", 8, 512, 1536, 256, GroupedQueryAttention(8, 2, 64))
GROUP_SEQ = 256


def _grouped_peak(group: int) -> int:
    """The activations at the peak of the last group's backward pass (torch's
    ``MemTracker``) with the blocks recomputed in groups of ``group``, each a reentrant
    checkpoint as Megatron-LM's ``CheckpointFunction`` is, which runs the group's forward
    pass again and then its backward pass."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
        CheckpointImpl,
        checkpoint_wrapper,
    )

    with FakeTensorMode():
        model = LlamaLike(GROUP_ARCH)
        layers = list(model.layers)
        model.layers = nn.ModuleList(
            checkpoint_wrapper(
                nn.Sequential(*layers[start : start + group]),
                checkpoint_impl=CheckpointImpl.REENTRANT,
                preserve_rng_state=False,
            )
            for start in range(0, len(layers), group)
        )
        tokens = torch.randint(0, GROUP_ARCH.vocab, (BATCH, GROUP_SEQ))
        ends, last_backward = tracked_step(model, tokens, "LlamaLike.layers")
    tokens_bytes = BATCH * GROUP_SEQ * GROUP_ARCH.hidden * 4
    # each group keeps its input, one hidden width a token
    assert [later - earlier for earlier, later in itertools.pairwise(ends)] == [tokens_bytes] * (
        len(ends) - 1
    )
    return last_backward


@pytest.fixture(scope="module")
def grouped_peaks() -> dict[int, int]:
    return {group: _grouped_peak(group) for group in (1, 2, 4, 8)}


@pytest.mark.parametrize("group", [2, 4, 8])
def test_a_uniform_group_is_recomputed_at_once_as_the_estimate_says(
    grouped_peaks: dict[int, int], group: int
) -> None:
    """Against recomputing each block alone (``full``), a group of N keeps N - 1 fewer
    inputs in N blocks, and its backward pass holds N - 1 more blocks recomputed, as
    ``none`` keeps them (on CPU with their norms' normalized input): the growth of the last
    group's backward peak is the estimate's exactly."""
    tokens = BATCH * GROUP_SEQ
    full = activations.block(GROUP_ARCH, "dense", "full").bytes(tokens, 1, 4)
    none = activations.block(GROUP_ARCH, "dense", "none").bytes(tokens, 1, 4)
    norms = 2 * GROUP_ARCH.hidden * tokens * 4
    layers = GROUP_ARCH.layers
    grown = (group - 1) * (none + norms) - (layers - layers // group) * full
    measured = grouped_peaks[group] - grouped_peaks[1]
    assert grown == measured


@pytest.mark.parametrize(("group", "blocks"), [(2, 3), (4, 3), (3, 9)])
def test_a_rank_s_uniform_groups_are_its_inputs_and_one_group_recomputed(
    group: int, blocks: int
) -> None:
    """The estimate of a pipeline rank of ``blocks`` blocks (neither end), one
    micro-batch in flight: each group's input, and its largest group recomputed."""
    tokens = BATCH * GROUP_SEQ
    pp = 3
    arch = replace(GROUP_ARCH, layers=pp * blocks)
    training = Training(
        seq_len=GROUP_SEQ,
        micro_batch=BATCH,
        global_batch_tokens=tokens,
        param_dtype="fp32",
        checkpoint_group=group,
    )
    stage = rank_stage(arch, pp, 1, 1)
    assert (stage.first, stage.last, sum(stage.chunk_sizes[0])) == (False, False, blocks)
    held = rank_memory(arch, Parallelism(pp=pp), training, stage)
    full = activations.block(arch, "dense", "full").bytes(tokens, 1, 4)
    none = activations.block(arch, "dense", "none").bytes(tokens, 1, 4)
    working = activations.backward_working_set(arch, "dense", "full").bytes(tokens, 1, 4)
    groups = -(-blocks // group)
    assert held.in_flight == 1
    assert held.activations == groups * full + (min(group, blocks) - 1) * none + working
