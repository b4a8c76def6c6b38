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
split, are not split either. Every formula is written out in docs/plan.md.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from functools import lru_cache

from meshconf.core.setting_values import FP8_BYTES, Checkpointing, NormKernel, SequenceParallel
from meshconf.features.plan.estimate.architecture import (
    Architecture,
    GroupedQueryAttention,
    LayerKind,
    Weight,
)

#: The recomputation of DeepSeek-V3's report (sections 3.2.3 and 3.3.3).
REPORTED: Checkpointing = "norms-latent-swiglu"

FP32 = 4
#: Elements of an activation that share one fp32 scale when kept in fp8: DeepSeek-V3 scales
#: activations per token and 128 channels (its report, section 3.3.2, "fine-grained
#: quantization").
FP8_TILE = 128
#: Bits of the format fp8 activations keep the input of the linear after attention in:
#: DeepSeek-V3's E5M6 (a sign, 5 exponent and 6 mantissa bits; its report, section 3.3.3),
#: scaled per 1 x 128 tile as fp8 is.
E5M6_BITS = 12


@dataclass(frozen=True)
class PerToken:
    """Stored elements per token, by how tensor parallelism splits them: ``split`` by tp (the
    attention and feed-forward cores), ``whole`` not at all, ``outside`` over the sequence
    under sequence parallelism and not without it (the norms' inputs, the residual stream),
    ``gathered`` (the norms' outputs, inputs of the products that follow) whole under
    torchtitan's sequence parallelism and without any, split under Megatron-LM's. ``fp32``,
    ``outside_fp32`` and ``whole_fp32`` are kept in fp32 whatever the compute dtype, split as
    ``split``, ``outside`` and ``whole`` are. ``split_linear`` and ``whole_linear``, parts of
    ``split`` and ``whole``, are what ``fp8`` activations keep in fp8, as they do
    ``gathered``: the inputs of linear layers (and the SwiGLU's inputs in a mixture of experts
    under ``norms-latent-swiglu``); ``split_wide_linear``, split and not part of ``split``, is
    the input of the linear after attention, which ``norms-latent-swiglu`` keeps in E5M6 under
    ``fp8`` activations (:data:`E5M6_BITS`)."""

    split: int = 0
    whole: int = 0
    fp32: int = 0
    outside: int = 0
    gathered: int = 0
    outside_fp32: int = 0
    split_linear: int = 0
    whole_linear: int = 0
    whole_fp32: int = 0
    split_wide_linear: int = 0

    def __add__(self, other: PerToken) -> PerToken:
        return PerToken(*(a + b for a, b in zip(self._counts(), other._counts(), strict=True)))

    def beyond(self, other: PerToken) -> PerToken:
        """What this holds that ``other`` does not, field by field."""
        pairs = zip(self._counts(), other._counts(), strict=True)
        return PerToken(*(max(0, a - b) for a, b in pairs))

    def _counts(self) -> tuple[int, ...]:
        # dataclasses.astuple, without its deep copies
        return tuple(getattr(self, name) for name in _FIELDS)

    def bytes(
        self,
        tokens: int,
        tp: int,
        dtype_bytes: int,
        linear_bytes: int | None = None,
        sequence_parallel: SequenceParallel = "dtensor",
    ) -> int:
        """Bytes for ``tokens`` tokens on one tensor-parallel rank, with the linear layers'
        inputs in ``linear_bytes`` (``dtype_bytes`` when None); in fp8, each tile of
        :data:`FP8_TILE` elements adds its fp32 scale, as it does in E5M6."""
        # in 1/FP8_TILE bytes, so that a tile's scale is whole
        tile = FP8_TILE
        d = dtype_bytes * tile
        linear = d if linear_bytes is None else linear_bytes * tile
        wide = linear
        if linear_bytes == FP8_BYTES:
            linear += FP32
            wide = E5M6_BITS * tile // 8 + FP32
        outside = self.outside * d + self.outside_fp32 * FP32 * tile
        gathered = self.gathered * linear
        split = (self.split - self.split_linear) * d + self.split_linear * linear
        split += self.fp32 * FP32 * tile + self.split_wide_linear * wide
        whole = (self.whole - self.whole_linear) * d + self.whole_linear * linear
        whole += self.whole_fp32 * FP32 * tile
        if sequence_parallel != "none":
            split += outside
        else:
            whole += outside
        if sequence_parallel == "megatron":
            split += gathered
        else:
            whole += gathered
        return -(-split * tokens // (tp * tile)) + -(-whole * tokens // tile)


_FIELDS = tuple(field.name for field in fields(PerToken))


@lru_cache(maxsize=1024)
def block(
    arch: Architecture,
    kind: LayerKind,
    mode: Checkpointing,
    tensor_parallel: bool = False,
    expert_parallel: bool = False,
    norm_kernel: NormKernel = "fused",
    sequence_parallel: SequenceParallel = "dtensor",
) -> PerToken:
    """What one block stores per token under ``mode`` until its backward pass; ``full``
    stores only its input. ``tensor_parallel`` and ``expert_parallel`` (tp and ep above 1)
    add the collectives that ``selective`` keeps. An ``eager`` norm keeps an fp32 copy of its
    input where a fused one keeps the input, and its normalized input besides: 4 bytes more
    per element whatever the compute dtype (tests/test_plan_precision.py)."""
    if mode == "full":
        return PerToken(outside=arch.hidden)
    if mode == "selective":
        scattered = tensor_parallel and sequence_parallel != "none"
        return _kept_by_policy(arch, kind, tensor_parallel, expert_parallel, scattered)
    if mode == REPORTED:
        return _kept_by_report(arch, kind)
    stored = _attention(arch) + _feed_forward(arch, kind)
    if norm_kernel == "eager":
        stored += _eager_norms(arch)
    return stored


def _eager_norms(arch: Architecture) -> PerToken:
    """What a block's eager norms keep beyond fused ones, 4 bytes per element normed: the
    hidden width twice, Qwen3's query and key heads, latent attention's low-rank projections."""
    attention = arch.attention
    if isinstance(attention, GroupedQueryAttention):
        heads = attention.heads + attention.kv_heads
        per_head = heads * attention.head_dim if attention.qk_norm else 0
        return PerToken(outside_fp32=2 * arch.hidden, fp32=per_head)
    low_rank = attention.q_lora_rank + attention.kv_lora_rank
    return PerToken(outside_fp32=2 * arch.hidden, whole_fp32=low_rank)


@lru_cache(maxsize=1024)
def backward_working_set(
    arch: Architecture,
    kind: LayerKind,
    mode: Checkpointing,
    tensor_parallel: bool = False,
    expert_parallel: bool = False,
    norm_kernel: NormKernel = "fused",
    sequence_parallel: SequenceParallel = "dtensor",
) -> PerToken:
    """What one block's backward pass holds on top of what the block stored: the tensors
    it recomputes (everything ``none`` keeps that ``mode`` did not) and the gradients alive
    at once in the feed-forward's backward: the one entering the block and its copy on the
    residual path (two hidden widths), those of the SwiGLU product, of the SiLU output and
    of the gate (three feed-forward widths), and with experts, every routed copy's gradient
    as the combine's backward gathers it and as the weighting by its score passes it on
    (two hidden widths a copy). Megatron-LM's sequence parallelism gathers a norm's output
    again for the products' backward pass: one hidden width, whole."""
    stored = block(
        arch, kind, mode, tensor_parallel, expert_parallel, norm_kernel, sequence_parallel
    )
    kept = block(arch, kind, "none", norm_kernel=norm_kernel)
    experts = arch.experts
    copies, width = 0, arch.ffn
    if kind == "moe" and experts is not None:
        copies, width = experts.top_k, (experts.top_k + experts.shared) * experts.ffn
    in_flight = PerToken(outside=2 * arch.hidden * (1 + copies), split=3 * width)
    if sequence_parallel == "megatron" and tensor_parallel:
        in_flight += PerToken(whole=arch.hidden)
    return kept.beyond(stored) + in_flight


def matmuls(arch: Architecture, kind: LayerKind) -> tuple[Weight, ...]:
    """The matrix products that ``selective`` counts, in the order the forward pass runs
    them: not the router, which torchtitan always recomputes, nor the routed experts'."""
    return tuple(weight for weight in arch.layer_weights(kind) if weight.dense_linear)


#: fp32 copies of the logits alive at the peak of torchtitan's loss's backward pass (its
#: ``cross_entropy`` on the logits cast to fp32): log-softmax's saved output, the gradient
#: it is handed and the one it returns (tests/test_plan_loss_memory.py measures 12 bytes).
LOSS_FP32_COPIES = 3


def output_head(arch: Architecture) -> PerToken:
    """The last stage's final norm (input and output) and the loss's fp32 copies of the
    logits at the peak of its backward pass; loss parallelism splits the vocabulary by tp."""
    return PerToken(split=2 * arch.hidden, fp32=LOSS_FP32_COPIES * arch.vocab)


def recomputed_weights(
    arch: Architecture, kind: LayerKind, mode: Checkpointing = "selective"
) -> int:
    """Weight elements per token of one block whose matrix products ``mode`` runs again in
    the backward pass (twice this in FLOPs): under ``selective`` every other counted
    product, the router, and the routed experts a token goes to; under
    ``norms-latent-swiglu`` latent attention's up-projections; none under the other modes,
    whose recomputation is whole blocks or nothing. The model's, which a pipeline rank's tp
    group shares as it shares the forward pass (:func:`~.work.group_passes`)."""
    if mode == REPORTED:
        return sum(
            weight.elements for weight in arch.layer_weights(kind) if weight.name in _UP_PROJECTIONS
        )
    if mode != "selective":
        return 0
    total = sum(weight.elements for weight in matmuls(arch, kind)[1::2])
    experts = arch.experts
    if kind == "moe" and experts is not None:
        total += experts.routed * arch.hidden
        total += experts.top_k * 3 * arch.hidden * experts.ffn
    return total


#: Latent attention's up-projections, from its normalized low-rank projections.
_UP_PROJECTIONS = frozenset({"wq_b", "wkv_b"})


def _kept_by_report(arch: Architecture, kind: LayerKind) -> PerToken:
    """What ``norms-latent-swiglu`` keeps, as the DeepSeek-V3 report (arXiv:2412.19437)
    states: every RMSNorm and latent attention's up-projections recomputed (section 3.2.3),
    so the norms keep their inputs and latent attention its down-projections' outputs, not
    the q, k and v made from them (grouped-query attention, without up-projections, keeps
    them as ``none`` does); the kernel's output, kept in E5M6 under fp8 (section 3.3.3), and
    its log-sum-exp. A dense feed-forward keeps what ``none`` keeps but its norm's output; a
    mixture of experts its SwiGLU's inputs, not its output nor the expert's: the report's
    equation 12 weights that by the gate without saying where, and Megatron-Core, whose
    ``--recompute-modules layernorm mla_up_proj moe_act`` are these recomputations, applies
    the gate to the SwiGLU's output inside the expert (``weighted_bias_swiglu_impl`` in
    megatron/core/transformer/moe/experts.py), so the combine (``unpermute`` without
    probabilities, moe_utils.py) keeps only indices."""
    attention = arch.attention
    kernel = _kernel(arch)
    kept = PerToken(outside=2 * arch.hidden, split_wide_linear=kernel.split, fp32=kernel.fp32)
    if isinstance(attention, GroupedQueryAttention):
        kept += _qkv(attention, norm_fp32=False)
    else:
        low_rank = attention.q_lora_rank + attention.kv_lora_rank + attention.qk_rope_head_dim
        # without a low-rank query, q is projected from the hidden state: no up-projection
        qk = attention.heads * (attention.qk_nope_head_dim + attention.qk_rope_head_dim)
        kept += PerToken(whole=low_rank, split=0 if attention.q_lora_rank else qk)
    experts = arch.experts
    if kind == "dense" or experts is None:
        return kept + _swiglu(arch.ffn)
    swiglu = 2 * experts.ffn
    return kept + PerToken(
        split=experts.top_k * (arch.hidden + swiglu + 1) + experts.shared * swiglu,
        split_linear=experts.top_k * (arch.hidden + swiglu) + experts.shared * swiglu,
        fp32=experts.routed + 6 * experts.top_k,
    )


def _kept_by_policy(
    arch: Architecture,
    kind: LayerKind,
    tensor_parallel: bool,
    expert_parallel: bool,
    scattered: bool,
) -> PerToken:
    """What torchtitan's ``selective`` per-op policy (``SelectiveAC`` in
    torchtitan/distributed/activation_checkpoint.py) keeps: the outputs of the attention
    kernel, of top-k, of the collectives that carry tokens (reduce-scatter, all-to-all) and
    of every other matrix product (:func:`matmuls`); the rest is recomputed."""
    kept = PerToken(outside=arch.hidden) + _kernel(arch)
    for index, weight in enumerate(matmuls(arch, kind)):
        # under tp a row-wise product gives every token's partial sum, which the kept
        # reduce-scatter then splits over the sequence (an all-reduce, not kept, without
        # sequence parallelism)
        row_wise = tensor_parallel and weight.split == "cols"
        if row_wise and scattered:
            kept += PerToken(outside=weight.rows)
        if index % 2 == 0:
            whole = row_wise or weight.split == "none"
            kept += PerToken(whole=weight.rows) if whole else PerToken(split=weight.rows)
    experts = arch.experts
    if kind == "moe" and experts is not None:
        # top-k's fp32 scores and int64 expert ids
        kept += PerToken(fp32=3 * experts.top_k)
        if expert_parallel:
            # the all-to-all outputs: every routed copy, dispatched (the experts' input) and
            # combined
            copies = experts.top_k * arch.hidden
            kept += PerToken(split=2 * copies, split_linear=copies)
    return kept


def _norm(arch: Architecture) -> PerToken:
    """A norm's input, its output and its fp32 reciprocal RMS."""
    return PerToken(outside=arch.hidden, gathered=arch.hidden, outside_fp32=1)


def _kernel(arch: Architecture) -> PerToken:
    """The attention kernel's output (the input of the linear after it, in the compute dtype:
    the kernel's backward pass reads it) and its fp32 log-sum-exp."""
    attention = arch.attention
    if isinstance(attention, GroupedQueryAttention):
        return PerToken(split=attention.heads * attention.head_dim, fp32=attention.heads)
    return PerToken(split=attention.heads * attention.v_head_dim, fp32=attention.heads)


def _qkv(attention: GroupedQueryAttention, norm_fp32: bool) -> PerToken:
    """q, k and v after rotary embedding; with Qwen3's head norms, their inputs, and a
    reciprocal RMS per head where the norms are not recomputed (``norm_fp32``)."""
    query = attention.heads * attention.head_dim
    kv = 2 * attention.kv_heads * attention.head_dim
    kept = PerToken(split=query + kv)
    if attention.qk_norm:
        rms = attention.heads + attention.kv_heads if norm_fp32 else 0
        kept += PerToken(split=query + kv // 2, fp32=rms)
    return kept


def _swiglu(ffn: int) -> PerToken:
    """A dense SwiGLU's w1 and w3 outputs, the SiLU output and their product (w2's input)."""
    return PerToken(split=4 * ffn, split_linear=ffn)


def _attention(arch: Architecture) -> PerToken:
    attention = arch.attention
    if isinstance(attention, GroupedQueryAttention):
        return _norm(arch) + _qkv(attention, norm_fp32=True) + _kernel(arch)
    qk = attention.heads * (attention.qk_nope_head_dim + attention.qk_rope_head_dim)
    latent = attention.kv_lora_rank + attention.qk_rope_head_dim
    # the low-rank projections and their norms (not split by tp; the norms' outputs are the
    # up-projections' inputs); q, k and v
    return (
        _norm(arch)
        + _kernel(arch)
        + PerToken(
            split=2 * qk + attention.heads * attention.v_head_dim,
            whole=2 * attention.q_lora_rank + latent + attention.kv_lora_rank,
            whole_linear=attention.q_lora_rank + attention.kv_lora_rank,
        )
    )


def _feed_forward(arch: Architecture, kind: LayerKind) -> PerToken:
    experts = arch.experts
    if kind == "dense" or experts is None:
        return _norm(arch) + _swiglu(arch.ffn)
    # per routed copy of a token: its permuted input, four ffn tensors, the expert's output
    # and the score that weights it, and three int64 indices (its expert, its place in expert
    # order, its token); the shared experts' four tensors; the router's fp32 scores. The
    # linear layers' inputs: each copy's permuted input and product, the shared experts'
    # product (the norm's output is the router's and the shared experts').
    return _norm(arch) + PerToken(
        split=experts.top_k * (2 * arch.hidden + 4 * experts.ffn + 1)
        + 4 * experts.shared * experts.ffn,
        split_linear=experts.top_k * (arch.hidden + experts.ffn) + experts.shared * experts.ffn,
        fp32=experts.routed + 6 * experts.top_k,
    )
