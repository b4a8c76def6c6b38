"""Activation memory of one transformer block for one micro-batch, per tensor-parallel rank.

The method is Korthikanti et al., "Reducing Activation Recomputation in Large Transformer
Models" (MLSys 2023, arXiv:2205.05198), section 4: count, op by op, the tensors the backward
pass needs, for the ops of the model at hand (RMSNorm, SwiGLU, grouped-query or latent
attention, experts) instead of the paper's GPT block. Attention is a fused kernel
(FlashAttention or PyTorch's scaled_dot_product_attention), which keeps its output and one
fp32 log-sum-exp per head and token, never the ``s x s`` scores. Sequence parallelism splits
every tensor outside the attention and feed-forward cores by tp, as in the paper's section
4.2.2, but for a norm's output, which DTensor's sequence parallelism gathers whole for the
products that follow and keeps so (the paper's implementation gathers it again in the
backward pass instead); the low-rank projections of latent attention, which tp does not
split, are not split either.
``selective`` is torchtitan's per-op policy (``SelectiveAC`` in
torchtitan/distributed/activation_checkpoint.py): a block keeps the outputs of the attention
kernel, of top-k, of the collectives that carry tokens (reduce-scatter, all-to-all) and of
every other matrix product, counted in the order the forward pass runs them, and recomputes
the rest in the backward pass. Every formula is written out in docs/plan.md.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from meshconf.core.training import Checkpointing
from meshconf.features.plan.estimate.architecture import (
    Architecture,
    GroupedQueryAttention,
    LayerKind,
    Weight,
)

FP32 = 4


@dataclass(frozen=True)
class PerToken:
    """Stored elements per token: ``split`` divided by tp, ``whole`` not, and ``fp32``
    elements (divided by tp) kept in fp32 whatever the compute dtype."""

    split: int = 0
    whole: int = 0
    fp32: int = 0

    def __add__(self, other: PerToken) -> PerToken:
        return PerToken(self.split + other.split, self.whole + other.whole, self.fp32 + other.fp32)

    def bytes(self, tokens: int, tp: int, dtype_bytes: int) -> int:
        """Bytes for ``tokens`` tokens on one tensor-parallel rank."""
        split = -(-(self.split * dtype_bytes + self.fp32 * FP32) * tokens // tp)
        return split + self.whole * dtype_bytes * tokens


@lru_cache(maxsize=1024)
def block(
    arch: Architecture,
    kind: LayerKind,
    mode: Checkpointing,
    tensor_parallel: bool = False,
    expert_parallel: bool = False,
) -> PerToken:
    """What one block stores per token under ``mode`` until its backward pass; ``full``
    stores only its input. ``tensor_parallel`` and ``expert_parallel`` say whether tp and ep
    are above 1, which adds the collectives that ``selective`` keeps."""
    if mode == "full":
        return PerToken(split=arch.hidden)
    if mode == "selective":
        return _kept_by_policy(arch, kind, tensor_parallel, expert_parallel)
    return _attention(arch) + _feed_forward(arch, kind)


def backward_working_set(
    arch: Architecture,
    kind: LayerKind,
    mode: Checkpointing,
    tensor_parallel: bool = False,
    expert_parallel: bool = False,
) -> PerToken:
    """What one block's backward pass holds on top of what the block stored: the tensors
    it recomputes (everything ``none`` keeps that ``mode`` did not) and the gradients alive
    at once in the feed-forward's backward: the one entering the block and its copy on the
    residual path (two hidden widths), those of the SwiGLU product, of the SiLU output and
    of the gate (three feed-forward widths), and with experts, every routed copy's gradient
    as the combine's backward gathers it and as the weighting by its score passes it on
    (two hidden widths a copy)."""
    stored = block(arch, kind, mode, tensor_parallel, expert_parallel)
    kept = block(arch, kind, "none")
    recomputed = PerToken(
        max(0, kept.split - stored.split),
        max(0, kept.whole - stored.whole),
        max(0, kept.fp32 - stored.fp32),
    )
    experts = arch.experts
    copies = experts.top_k if kind == "moe" and experts is not None else 0
    in_flight = 2 * arch.hidden * (1 + copies) + 3 * _feed_forward_width(arch, kind)
    return recomputed + PerToken(split=in_flight)


def matmuls(arch: Architecture, kind: LayerKind) -> tuple[Weight, ...]:
    """The matrix products that ``selective`` counts, in the order the forward pass runs
    them: every linear layer of the block but the router, which torchtitan always
    recomputes, and the routed experts, whose grouped products are not on its list."""
    return tuple(weight for weight in arch.layer_weights(kind) if weight.dense_linear)


#: fp32 copies of the logits alive at the peak of the loss's backward pass, per logit:
#: log-softmax's saved output, the gradient the negative log-likelihood hands it, and the
#: gradient it returns, before that is cast back to the compute dtype. The loss is torchtitan's
#: (``cross_entropy`` on the logits cast to fp32, the logits deleted before ``backward``);
#: tests/test_plan_loss_memory.py measures 12 bytes per logit with torch's MemTracker under
#: fake tensors, in bf16 and fp32.
LOSS_FP32_COPIES = 3


def output_head(arch: Architecture) -> PerToken:
    """The last stage's final norm (input and output) and the loss's fp32 copies of the
    logits at the peak of its backward pass (:data:`LOSS_FP32_COPIES`); loss parallelism
    splits the vocabulary by tp."""
    return PerToken(split=2 * arch.hidden, fp32=LOSS_FP32_COPIES * arch.vocab)


def recomputed_weights(arch: Architecture, kind: LayerKind, tp: int, etp: int) -> float:
    """Weight elements per token on one rank whose matrix products ``selective`` runs
    again in the backward pass (twice this in FLOPs): every other counted product, the
    router, and the routed experts a token goes to. Weights tp does not split count whole,
    as the rest of the step's FLOPs count them."""
    total = 0.0
    for index, weight in enumerate(matmuls(arch, kind), start=1):
        if index % 2 == 0:
            total += weight.elements / (1 if weight.split == "none" else tp)
    experts = arch.experts
    if kind == "moe" and experts is not None:
        total += experts.routed * arch.hidden
        total += experts.top_k * 3 * arch.hidden * experts.ffn / etp
    return total


def _kept_by_policy(
    arch: Architecture, kind: LayerKind, tensor_parallel: bool, expert_parallel: bool
) -> PerToken:
    attention = arch.attention
    if isinstance(attention, GroupedQueryAttention):
        kernel = PerToken(split=attention.heads * attention.head_dim, fp32=attention.heads)
    else:
        kernel = PerToken(split=attention.heads * attention.v_head_dim, fp32=attention.heads)
    kept = PerToken(split=arch.hidden) + kernel
    for index, weight in enumerate(matmuls(arch, kind), start=1):
        # under tp a row-wise product gives every token's partial sum, which the kept
        # reduce-scatter then splits over the sequence
        row_wise = tensor_parallel and weight.split == "cols"
        if row_wise:
            kept += PerToken(split=weight.rows)
        if index % 2 == 1:
            whole = row_wise or weight.split == "none"
            kept += PerToken(whole=weight.rows) if whole else PerToken(split=weight.rows)
    experts = arch.experts
    if kind == "moe" and experts is not None:
        # top-k's fp32 scores and int64 expert ids
        kept += PerToken(fp32=3 * experts.top_k)
        if expert_parallel:
            # the all-to-all outputs: every routed copy, dispatched and combined
            kept += PerToken(split=2 * experts.top_k * arch.hidden)
    return kept


def _feed_forward_width(arch: Architecture, kind: LayerKind) -> int:
    experts = arch.experts
    if kind == "dense" or experts is None:
        return arch.ffn
    return (experts.top_k + experts.shared) * experts.ffn


def _attention(arch: Architecture) -> PerToken:
    hidden = arch.hidden
    attention = arch.attention
    if isinstance(attention, GroupedQueryAttention):
        query = attention.heads * attention.head_dim
        kv = 2 * attention.kv_heads * attention.head_dim
        # norm input, output and fp32 reciprocal RMS; q k v after rotary embedding; the
        # kernel's output and log-sum-exp
        kept = PerToken(split=hidden + query + kv + query, whole=hidden, fp32=1 + attention.heads)
        if attention.qk_norm:
            # the query and key heads' norms: their inputs and a reciprocal RMS per head
            heads = attention.heads + attention.kv_heads
            kept += PerToken(split=query + kv // 2, fp32=heads)
        return kept
    heads = attention.heads
    qk = heads * (attention.qk_nope_head_dim + attention.qk_rope_head_dim)
    value = heads * attention.v_head_dim
    latent = attention.kv_lora_rank + attention.qk_rope_head_dim
    # norm in/out and its reciprocal RMS; low-rank projections and their norms (not split
    # by tp); q, k, v; the kernel's output and log-sum-exp
    low_rank = 2 * attention.q_lora_rank + latent + attention.kv_lora_rank
    return PerToken(split=hidden + 2 * qk + 2 * value, whole=hidden + low_rank, fp32=1 + heads)


def _feed_forward(arch: Architecture, kind: LayerKind) -> PerToken:
    hidden = arch.hidden
    experts = arch.experts
    if kind == "dense" or experts is None:
        # norm in/out and its reciprocal RMS, w1 and w3 outputs, silu output, their product
        return PerToken(split=hidden + 4 * arch.ffn, whole=hidden, fp32=1)
    # norm in/out and its reciprocal RMS; per routed copy of a token: its permuted input,
    # four ffn tensors, the expert's output and the score that weights it, and three int64
    # indices (its expert, its place in expert order, its token); the shared experts' four
    # tensors; the router's fp32 scores
    per_copy = 2 * hidden + 4 * experts.ffn + 1
    shared = 4 * experts.shared * experts.ffn
    fp32 = 1 + experts.routed + 6 * experts.top_k
    return PerToken(split=hidden + experts.top_k * per_copy + shared, whole=hidden, fp32=fp32)
