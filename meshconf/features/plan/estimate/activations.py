"""Activation memory of one transformer block for one micro-batch, per tensor-parallel rank.

The method is Korthikanti et al., "Reducing Activation Recomputation in Large Transformer
Models" (MLSys 2023, arXiv:2205.05198), section 4: count, op by op, the tensors the backward
pass needs, for the ops of the model at hand (RMSNorm, SwiGLU, grouped-query or latent
attention, experts) instead of the paper's GPT block. Attention is a fused kernel
(FlashAttention or PyTorch's scaled_dot_product_attention), which keeps its output and one
fp32 log-sum-exp per head and token, never the ``s x s`` scores. Sequence parallelism splits
every tensor outside the attention and feed-forward cores by tp, as in the paper's section
4.2.2; the low-rank projections of latent attention, which tp does not split, are not split.
Every formula is written out in docs/plan.md.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from meshconf.core.training import Checkpointing
from meshconf.features.plan.estimate.architecture import (
    Architecture,
    GroupedQueryAttention,
    LayerKind,
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


@lru_cache(maxsize=256)
def block(arch: Architecture, kind: LayerKind, mode: Checkpointing) -> PerToken:
    """What one block stores per token under ``mode``; ``full`` stores only its input."""
    if mode == "full":
        return PerToken(split=arch.hidden)
    return _attention(arch, mode) + _feed_forward(arch, kind, mode)


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


def _attention(arch: Architecture, mode: Checkpointing) -> PerToken:
    hidden = arch.hidden
    attention = arch.attention
    if isinstance(attention, GroupedQueryAttention):
        query = attention.heads * attention.head_dim
        kv = 2 * attention.kv_heads * attention.head_dim
        lse = PerToken(fp32=attention.heads)
        if mode == "none":
            # norm input and output, q k v after rotary embedding, the kernel's output
            return PerToken(split=2 * hidden + query + kv + query) + lse
        # block input, q k v projections, kernel output, output projection
        return PerToken(split=hidden + query + kv + query + hidden) + lse
    heads = attention.heads
    qk = heads * (attention.qk_nope_head_dim + attention.qk_rope_head_dim)
    value = heads * attention.v_head_dim
    latent = attention.kv_lora_rank + attention.qk_rope_head_dim
    lse = PerToken(fp32=heads)
    if mode == "none":
        # norm in/out; low-rank projections and their norms (not split by tp); q, k, v; output
        low_rank = 2 * attention.q_lora_rank + latent + attention.kv_lora_rank
        return PerToken(split=2 * hidden + 2 * qk + 2 * value, whole=low_rank) + lse
    low_rank = attention.q_lora_rank + latent
    kv_b = heads * attention.qk_nope_head_dim + value
    return PerToken(split=hidden + qk + kv_b + value + hidden, whole=low_rank) + lse


def _feed_forward(arch: Architecture, kind: LayerKind, mode: Checkpointing) -> PerToken:
    hidden = arch.hidden
    experts = arch.experts
    if kind == "dense" or experts is None:
        # none: norm in/out, w1 and w3 outputs, silu output, their product; selective: w1, w3
        return PerToken(split=2 * hidden + 4 * arch.ffn if mode == "none" else 2 * arch.ffn)
    routed = experts.top_k
    shared_ffn = experts.shared * experts.ffn
    router = PerToken(fp32=experts.routed)
    if mode == "none":
        # norm in/out; per routed copy of a token: its permuted input, four ffn tensors and
        # the expert's output; the shared experts' four tensors
        per_copy = 2 * hidden + 4 * experts.ffn
        return PerToken(split=2 * hidden + routed * per_copy + 4 * shared_ffn) + router
    return PerToken(split=routed * (2 * experts.ffn + hidden) + 2 * shared_ffn) + router
