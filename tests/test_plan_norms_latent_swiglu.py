"""``--activation-checkpointing norms-latent-swiglu`` against torch's ``MemTracker`` on CPU:
a small DeepSeek-V3-shaped model in bf16 (latent attention, a dense block then blocks of
routed and shared experts) whose blocks keep for the backward pass exactly what the DeepSeek-V3
report says its training keeps, with fp8 activations:

- every RMSNorm and latent attention's up-projections recomputed from their inputs, their
  outputs not stored (section 3.2.3);
- the linear layers' inputs cached in fp8 with an fp32 scale per token and 128 channels, the
  input of the linear after attention, which the attention's backward pass reads too, in
  E5M6 (12 bits) with the same scales; the experts' SwiGLU inputs cached in fp8 and its
  output recomputed (section 3.3.3); the tokens dispatched to the experts are their
  up-projections' input, kept in fp8;
- each expert's gate applied where Megatron-Core applies it, which the report does not say:
  to the SwiGLU's output, before the down-projection (``TEGroupedMLP.forward``'s
  ``weighted_bias_swiglu_impl``, megatron/core/transformer/moe/experts.py), so the combine
  adds the experts' outputs back keeping only indices.

Each kept tensor is the input of a segment that runs again in the backward pass from it
(:class:`_Segment`: the SwiGLU's with its gate, as Megatron-Core's ``moe_act`` checkpoint
keeps them), or a tensor ordinary autograd keeps (the router's scores, top-k); the
attention's backward pass runs on its kept output and log-sum-exp, with q, k and v made
again. What a block stores equals the estimate
exactly; the last block's backward peak is within 5% of it. The rotary embedding is left out:
it runs on tensors made again here, and keeps nothing.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from llama_like import LlamaLike
from measure_builds import tracked_step
from torch import nn

from meshconf.features.plan.estimate import activations
from meshconf.features.plan.estimate.architecture import (
    Architecture,
    Experts,
    LatentAttention,
    LayerKind,
)
from meshconf.features.plan.estimate.presets import PRESETS

#: widths that are multiples of the 128 channels one scale covers; q and k as wide as v, as
#: the CPU's attention kernel needs; a dense block, then three of experts
ARCH = Architecture(
    "small-latent",
    4,
    256,
    512,
    512,
    LatentAttention(2, 128, 128, 32, 32, 64),
    Experts(routed=4, top_k=2, ffn=128, shared=1, dense_layers=1),
)
SEQ, BATCH = 64, 2
TOKENS = SEQ * BATCH
TILE = activations.FP8_TILE
MODE = activations.REPORTED


def _tiles(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    tiles = x.detach().to(torch.float32).unflatten(-1, (-1, TILE))
    scales = tiles.abs().amax(-1).clamp(min=1e-12)
    return tiles, scales


def _fp8(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """e4m3 values and an fp32 scale per 128 channels."""
    tiles, scales = _tiles(x)
    scales = scales / 448.0
    return (tiles / scales.unsqueeze(-1)).flatten(-2).to(torch.float8_e4m3fn), scales


def _e5m6(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """E5M6 values, two in three bytes (fp16's bits without their 4 lowest), and a power of 2
    scale per 128 channels, in fp32."""
    tiles, scales = _tiles(x)
    scales = torch.exp2(torch.ceil(torch.log2(scales / 65504.0)))
    half = (tiles / scales.unsqueeze(-1)).flatten(-2).to(torch.float16)
    bits = (half.view(torch.int16).to(torch.int32) & 0xFFFF) >> 4
    low, high = bits[..., 0::2], bits[..., 1::2]
    packed = torch.stack((low & 0xFF, (low >> 8) | ((high & 0xF) << 4), high >> 4), -1)
    return packed.flatten(-2).to(torch.uint8), scales


def _from_fp8(values: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    tiles = values.to(torch.float32).unflatten(-1, (-1, TILE)) * scales.unsqueeze(-1)
    return tiles.flatten(-2).to(torch.bfloat16)


def _from_e5m6(packed: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    triples = packed.to(torch.int32).unflatten(-1, (-1, 3))
    low = triples[..., 0] | ((triples[..., 1] & 0xF) << 8)
    high = (triples[..., 1] >> 4) | (triples[..., 2] << 4)
    bits = torch.stack((low, high), -1).flatten(-2) << 4
    half = torch.where(bits >= 0x8000, bits - 0x10000, bits).to(torch.int16).view(torch.float16)
    tiles = half.to(torch.float32).unflatten(-1, (-1, TILE)) * scales.unsqueeze(-1)
    return tiles.flatten(-2).to(torch.bfloat16)


PACK = {"bf16": lambda x: (x,), "fp8": _fp8, "e5m6": _e5m6}
UNPACK = {"bf16": lambda x: x, "fp8": _from_fp8, "e5m6": _from_e5m6}


class _Segment(torch.autograd.Function):
    """Runs ``function`` without keeping its intermediates; keeps its tensor inputs, each in
    its format (``bf16`` as it is, ``fp8``, ``e5m6``; integers as they are), and in the
    backward pass runs it again on them and passes the gradients through, as a reentrant
    checkpoint does (the parameters' gradients accumulate into them)."""

    @staticmethod
    def forward(
        ctx: Any, function: Callable[..., Any], formats: Sequence[str], *inputs: torch.Tensor
    ) -> Any:
        ctx.function, ctx.formats = function, formats
        packed = [
            PACK[f](x) if x.is_floating_point() else (x,)
            for f, x in zip(formats, inputs, strict=True)
        ]
        ctx.sizes = [len(p) for p in packed]
        ctx.save_for_backward(*itertools.chain.from_iterable(packed))
        with torch.no_grad():
            return function(*(x.detach() for x in inputs))

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor) -> Any:
        saved = iter(ctx.saved_tensors)
        inputs = []
        for fmt, size in zip(ctx.formats, ctx.sizes, strict=True):
            parts = [next(saved) for _ in range(size)]
            if parts[0].is_floating_point() or fmt != "bf16":
                inputs.append(UNPACK[fmt](*parts).detach().requires_grad_())
            else:
                inputs.append(parts[0])
        with torch.enable_grad():
            outputs = ctx.function(*inputs)
        outputs = outputs if isinstance(outputs, tuple) else (outputs,)
        pairs = [
            (o, g) for o, g in zip(outputs, grads, strict=True) if o.requires_grad and g is not None
        ]
        torch.autograd.backward([o for o, _ in pairs], [g for _, g in pairs])
        return (None, None, *(x.grad if x.requires_grad else None for x in inputs))


def segment(function: Callable[..., Any], formats: Sequence[str], *inputs: torch.Tensor) -> Any:
    return _Segment.apply(function, formats, *inputs)


class _Attention(torch.autograd.Function):
    """Latent attention from its down-projections' outputs to the linear after it: keeps
    them, the kernel's output in E5M6 and its log-sum-exp; the backward pass makes q, k and
    v again (the norms and up-projections), runs the kernel's backward on the kept output,
    then the up-projections' backward."""

    @staticmethod
    def forward(ctx: Any, block: LatentBlock, q_low: torch.Tensor, kv_low: torch.Tensor) -> Any:
        with torch.no_grad():
            q, k, v = block.qkv(q_low.detach(), kv_low.detach())
            out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
                q, k, v, 0.0, True
            )
            merged = out.transpose(1, 2).flatten(2)
            ctx.block = block
            ctx.save_for_backward(q_low, kv_low, *_e5m6(merged), lse)
            return block.wo(merged)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> Any:
        q_low, kv_low, packed, scales, lse = ctx.saved_tensors
        block = ctx.block
        merged = _from_e5m6(packed, scales)
        weight = block.wo.weight
        weight.grad = (weight.grad if weight.grad is not None else 0) + grad.flatten(
            0, 1
        ).T @ merged.flatten(0, 1)
        grad_out = (grad @ weight).unflatten(-1, (block.heads, -1)).transpose(1, 2)
        out = merged.unflatten(-1, (block.heads, -1)).transpose(1, 2)
        q_low, kv_low = q_low.detach().requires_grad_(), kv_low.detach().requires_grad_()
        with torch.enable_grad():
            q, k, v = block.qkv(q_low, kv_low)
        grads = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(
            grad_out, q, k, v, out, lse, 0.0, True
        )
        torch.autograd.backward([q, k, v], list(grads))
        return None, q_low.grad, kv_low.grad


class LatentBlock(nn.Module):
    def __init__(self, arch: Architecture, moe: bool) -> None:
        super().__init__()
        a = arch.attention
        assert isinstance(a, LatentAttention)
        self.heads, self.nope, self.kv_lora = a.heads, a.qk_nope_head_dim, a.kv_lora_rank
        hidden = arch.hidden
        self.attention_norm = nn.RMSNorm(hidden)
        self.wq_a = nn.Linear(hidden, a.q_lora_rank, bias=False)
        self.q_norm = nn.RMSNorm(a.q_lora_rank)
        self.wq_b = nn.Linear(
            a.q_lora_rank, a.heads * (a.qk_nope_head_dim + a.qk_rope_head_dim), bias=False
        )
        self.wkv_a = nn.Linear(hidden, a.kv_lora_rank + a.qk_rope_head_dim, bias=False)
        self.kv_norm = nn.RMSNorm(a.kv_lora_rank)
        self.wkv_b = nn.Linear(
            a.kv_lora_rank, a.heads * (a.qk_nope_head_dim + a.v_head_dim), bias=False
        )
        self.wo = nn.Linear(a.heads * a.v_head_dim, hidden, bias=False)
        self.ffn_norm = nn.RMSNorm(hidden)
        experts = arch.experts
        assert experts is not None
        self.moe = moe
        if moe:
            self.top_k, self.routed, ffn = experts.top_k, experts.routed, experts.ffn
            self.gate = nn.Linear(hidden, experts.routed, bias=False)
            self.w1 = nn.Parameter(torch.randn(experts.routed, ffn, hidden) * 0.02)
            self.w3 = nn.Parameter(torch.randn(experts.routed, ffn, hidden) * 0.02)
            self.w2 = nn.Parameter(torch.randn(experts.routed, hidden, ffn) * 0.02)
            shared = experts.shared * ffn
            self.shared = nn.ModuleList(
                [
                    nn.Linear(hidden, shared, bias=False),
                    nn.Linear(hidden, shared, bias=False),
                    nn.Linear(shared, hidden, bias=False),
                ]
            )
        else:
            self.ffn = nn.ModuleList(
                [
                    nn.Linear(hidden, arch.ffn, bias=False),
                    nn.Linear(hidden, arch.ffn, bias=False),
                    nn.Linear(arch.ffn, hidden, bias=False),
                ]
            )

    def qkv(self, q_low: torch.Tensor, kv_low: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """q, k and v from the down-projections' outputs: their norms and up-projections."""
        q = self.wq_b(self.q_norm(q_low)).unflatten(-1, (self.heads, -1))
        latent, rope = kv_low.split([self.kv_lora, kv_low.shape[-1] - self.kv_lora], -1)
        kv = self.wkv_b(self.kv_norm(latent)).unflatten(-1, (self.heads, -1))
        k_nope, v = kv.split([self.nope, kv.shape[-1] - self.nope], -1)
        k = torch.cat((k_nope, rope.unsqueeze(2).expand(-1, -1, self.heads, -1)), -1)
        return q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)

    def down(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = self.attention_norm(x)
        return self.wq_a(h), self.wkv_a(h)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q_low, kv_low = segment(self.down, ["bf16"], x)
        x = x + _Attention.apply(self, q_low, kv_low)
        return x + (self._experts(x) if self.moe else self._dense(x))

    def _dense(self, x: torch.Tensor) -> torch.Tensor:
        w1, w3, w2 = self.ffn

        def up(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            h = self.ffn_norm(x)
            return w1(h), w3(h)

        a, b = segment(up, ["bf16"], x)
        # the SwiGLU as none keeps it, its product (w2's input) in fp8
        return segment(w2, ["fp8"], F.silu(a) * b)

    def _experts(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        x = x.flatten(0, 1)

        def router(x: torch.Tensor) -> torch.Tensor:
            return self.gate(self.ffn_norm(x))

        scores = torch.softmax(segment(router, ["bf16"], x).float(), dim=-1)
        top_scores, top_ids = scores.topk(self.top_k, dim=-1)
        with torch.no_grad():
            order = top_ids.flatten().argsort(stable=True)
            counts = torch.histc(
                top_ids.flatten().float(), bins=self.routed, min=0, max=self.routed - 1
            )
            offsets = counts.cumsum(0).to(torch.int32)
            source = order // self.top_k
        w1_s, w3_s, w2_s = self.shared

        def dispatch(x: torch.Tensor, source: torch.Tensor) -> tuple[torch.Tensor, ...]:
            h = self.ffn_norm(x)
            return h[source], w1_s(h), w3_s(h)

        routed, a_s, b_s = segment(dispatch, ["bf16", "bf16"], x, source)

        def up(routed: torch.Tensor, offsets: torch.Tensor) -> tuple[torch.Tensor, ...]:
            return (
                torch._grouped_mm(routed, self.w1.transpose(-2, -1), offs=offsets),
                torch._grouped_mm(routed, self.w3.transpose(-2, -1), offs=offsets),
            )

        def down(
            a: torch.Tensor, b: torch.Tensor, gate: torch.Tensor, offsets: torch.Tensor
        ) -> torch.Tensor:
            # the report's equation 12 weights each expert's output by its gate; Megatron-Core
            # weights the SwiGLU's output, which the down-projection's linearity makes the same
            weighted = F.silu(a) * b * gate
            return torch._grouped_mm(weighted, self.w2.transpose(-2, -1), offs=offsets)

        a, b = segment(up, ["fp8", "bf16"], routed, offsets)
        gate = top_scores.flatten()[order].unsqueeze(-1).to(a.dtype)
        out = segment(down, ["fp8", "fp8", "bf16", "bf16"], a, b, gate, offsets)
        combined = torch.zeros_like(x).scatter_add(0, source.unsqueeze(-1).expand_as(out), out)
        shared = segment(lambda a, b: w2_s(F.silu(a) * b), ["fp8", "fp8"], a_s, b_s)
        return (combined + shared).reshape(shape)


class LatentModel(LlamaLike):
    """:class:`LlamaLike` with :class:`LatentBlock` blocks: its forward pass, inherited."""

    def __init__(self, arch: Architecture) -> None:
        nn.Module.__init__(self)
        self.embedding = nn.Embedding(arch.vocab, arch.hidden)
        self.layers = nn.ModuleList(
            LatentBlock(arch, arch.kind(i) == "moe") for i in range(arch.layers)
        )
        self.norm = nn.RMSNorm(arch.hidden)
        self.output = nn.Linear(arch.hidden, arch.vocab, bias=False)


@pytest.fixture(scope="module")
def tracked() -> tuple[list[int], int]:
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        torch.manual_seed(0)
        model = LatentModel(ARCH)
    finally:
        torch.set_default_dtype(default)
    tokens = torch.randint(0, ARCH.vocab, (BATCH, SEQ))
    found = tracked_step(model, tokens, "LatentModel.layers")
    assert all(p.grad is not None for p in model.parameters())
    return found


def _stored(kind: LayerKind) -> int:
    stored = activations.block(ARCH, kind, MODE).bytes(TOKENS, 1, 2, linear_bytes=1)
    # the grouped products also keep the experts' int32 offsets, a few bytes a block
    return stored + (4 * ARCH.experts.routed if kind == "moe" and ARCH.experts else 0)


def test_what_a_block_stores_is_the_estimate_exactly(tracked: tuple[list[int], int]) -> None:
    ends, _ = tracked
    grown = [later - earlier for earlier, later in itertools.pairwise(ends)]
    # block 1 is the first of experts: what it stores over the dense block 0's output
    assert grown == [_stored("moe")] * (ARCH.layers - 1)


def test_the_kept_tensors_of_a_block_of_experts_are_those_of_the_report() -> None:
    """Per token: the two norms' inputs (bf16); the down-projections' outputs (bf16); the
    kernel's output in E5M6 with a scale per 128 and its log-sum-exp; per routed copy the
    dispatched input and the two SwiGLU inputs in fp8 with their scales, and its gate in bf16
    (not the expert's output: the gate weights the SwiGLU's output); the shared experts' SwiGLU inputs in fp8; the router's fp32 scores
    and three int64 indices a copy."""
    a = ARCH.attention
    e = ARCH.experts
    assert isinstance(a, LatentAttention) and e is not None
    fp8 = 1 + 4 / TILE
    expected = (
        2 * 2 * ARCH.hidden
        + 2 * (a.q_lora_rank + a.kv_lora_rank + a.qk_rope_head_dim)
        + a.heads * a.v_head_dim * (1.5 + 4 / TILE)
        + 4 * a.heads
        + e.top_k * ((ARCH.hidden + 2 * e.ffn) * fp8 + 2)
        + 2 * e.shared * e.ffn * fp8
        + 4 * e.routed
        + 8 * 3 * e.top_k
    )
    assert activations.block(ARCH, "moe", MODE).bytes(TOKENS, 1, 2, 1) == expected * TOKENS


def test_the_last_blocks_backward_peak_is_within_5_percent(
    tracked: tuple[list[int], int],
) -> None:
    _, measured = tracked
    working = activations.backward_working_set(ARCH, "moe", MODE)
    dense = activations.block(ARCH, "dense", MODE).bytes(TOKENS, 1, 2, 1)
    estimated = dense + (ARCH.layers - 1) * _stored("moe") + working.bytes(TOKENS, 1, 2, 1)
    print(f"estimated {estimated} measured {measured} ratio {estimated / measured:.3f}")
    assert estimated == pytest.approx(measured, rel=0.05)


@pytest.mark.parametrize("preset", sorted(PRESETS))
@pytest.mark.parametrize(("tp", "ep"), [(1, 1), (2, 1), (8, 8)])
def test_it_stores_less_than_none_and_its_backward_pass_holds_at_least_what_none_does(
    preset: str, tp: int, ep: int
) -> None:
    """Every preset, dense blocks and blocks of experts: the mode keeps less than ``none``
    (in bf16 and with fp8 activations), and in bf16 a block's backward pass, holding what it
    recomputes, at least what ``none`` holds."""
    arch = PRESETS[preset]
    for kind in ("dense", "moe") if arch.experts else ("dense",):
        for linear in (None, 1):
            stored, held = {}, {}
            for mode in ("none", MODE):
                block = activations.block(arch, kind, mode, tp > 1, ep > 1)
                working = activations.backward_working_set(arch, kind, mode, tp > 1, ep > 1)
                stored[mode] = block.bytes(8192, tp, 2, linear)
                held[mode] = stored[mode] + working.bytes(8192, tp, 2, linear)
            assert stored[MODE] < stored["none"]
            assert linear is not None or held[MODE] >= held["none"]
