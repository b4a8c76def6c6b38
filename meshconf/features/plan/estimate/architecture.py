"""A decoder-only transformer as the estimators see it: its weight tensors, how tensor
parallelism splits each one, and which layers hold experts.

Pure Python. The weights are those of the usual implementation (torchtitan's Llama 3,
DeepSeek-V3 and Qwen3 models, Hugging Face's Mixtral): bias-free linear layers stored
``[out, in]``, RMSNorm weights, a SwiGLU feed-forward of three matrices, and experts stacked
``[experts, out, in]``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

#: How tensor parallelism splits a weight: ``rows`` (dim 0: column-wise parallel and
#: embeddings), ``cols`` (dim 1: row-wise parallel) or ``none`` (replicated: norms, routers,
#: the low-rank projections of latent attention).
Split = Literal["rows", "cols", "none"]
LayerKind = Literal["dense", "moe"]


@dataclass(frozen=True)
class Weight:
    """One weight tensor: ``rows x cols`` elements (a norm's vector is ``rows x 1``: FSDP
    splits its only dim), ``experts`` of them stacked (0 when not an expert weight);
    ``split`` says how tp (etp for experts) splits it."""

    name: str
    rows: int
    cols: int
    split: Split
    experts: int = 0

    @property
    def elements(self) -> int:
        return self.rows * self.cols * max(1, self.experts)

    @property
    def dense_linear(self) -> bool:
        """A matrix of a block's dense linear layers (attention projections, the dense and
        shared SwiGLU), which fp8 training casts: not a norm, the router, or routed
        experts."""
        return self.cols > 1 and not self.experts and self.name != "router"


@dataclass(frozen=True)
class GroupedQueryAttention:
    """Multi-head attention with ``kv_heads`` key/value heads (Llama, Mixtral, Qwen3)."""

    heads: int
    kv_heads: int
    head_dim: int
    qk_norm: bool = False


@dataclass(frozen=True)
class LatentAttention:
    """Multi-head latent attention (DeepSeek-V2/V3): low-rank query and key/value
    projections; ``q_lora_rank`` 0 projects queries directly."""

    heads: int
    q_lora_rank: int
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int


@dataclass(frozen=True)
class Experts:
    """The mixture of experts of every layer from ``dense_layers`` on."""

    routed: int
    top_k: int
    ffn: int
    shared: int = 0
    dense_layers: int = 0


@dataclass(frozen=True)
class Architecture:
    """A decoder-only transformer: ``layers`` blocks of attention and feed-forward (dense of
    width ``ffn``, or experts), an embedding and an output projection of ``vocab`` rows."""

    name: str
    layers: int
    hidden: int
    ffn: int
    vocab: int
    attention: GroupedQueryAttention | LatentAttention
    experts: Experts | None = None
    tied_embeddings: bool = False

    def kind(self, layer: int) -> LayerKind:
        experts = self.experts
        return "moe" if experts is not None and layer >= experts.dense_layers else "dense"

    def layer_weights(self, kind: LayerKind) -> tuple[Weight, ...]:
        return (
            Weight("attention_norm", self.hidden, 1, "none"),
            *self._attention_weights(),
            Weight("ffn_norm", self.hidden, 1, "none"),
            *(self._expert_weights() if kind == "moe" else _swiglu("ffn", self.hidden, self.ffn)),
        )

    def embedding_weights(self) -> tuple[Weight, ...]:
        """The weights of the first pipeline stage that are not in a block."""
        return (Weight("embedding", self.vocab, self.hidden, "rows"),)

    def output_weights(self) -> tuple[Weight, ...]:
        """The weights of the last pipeline stage that are not in a block; a tied output
        reuses the embedding, so only the final norm is left."""
        norm = Weight("norm", self.hidden, 1, "none")
        if self.tied_embeddings:
            return (norm,)
        return norm, Weight("output", self.vocab, self.hidden, "rows")

    def parameter_count(self) -> int:
        blocks = sum(_elements(self.layer_weights(self.kind(i))) for i in range(self.layers))
        return blocks + _elements(self.embedding_weights()) + _elements(self.output_weights())

    def active_parameter_count(self) -> int:
        """The parameters one token passes through, without the embedding, which is a
        look-up: the ``N`` of ``6 N`` FLOPs per token."""
        blocks = sum(self.active_elements(self.kind(layer)) for layer in range(self.layers))
        return blocks + _elements(self.output_weights())

    def active_elements(self, kind: LayerKind) -> int:
        """Weight elements a token passes through in one block: ``top_k`` of the routed
        experts."""
        top_k = 0 if self.experts is None else self.experts.top_k
        return sum(
            weight.rows * weight.cols * top_k if weight.experts else weight.elements
            for weight in self.layer_weights(kind)
        )

    def _attention_weights(self) -> tuple[Weight, ...]:
        hidden = self.hidden
        attention = self.attention
        if isinstance(attention, GroupedQueryAttention):
            heads = attention.heads * attention.head_dim
            kv = attention.kv_heads * attention.head_dim
            norms = ("q_norm", "k_norm") if attention.qk_norm else ()
            return (
                Weight("wq", heads, hidden, "rows"),
                Weight("wk", kv, hidden, "rows"),
                Weight("wv", kv, hidden, "rows"),
                *(Weight(name, attention.head_dim, 1, "none") for name in norms),
                Weight("wo", hidden, heads, "cols"),
            )
        qk_head = attention.qk_nope_head_dim + attention.qk_rope_head_dim
        heads = attention.heads
        if attention.q_lora_rank:
            query: tuple[Weight, ...] = (
                Weight("wq_a", attention.q_lora_rank, hidden, "none"),
                Weight("q_norm", attention.q_lora_rank, 1, "none"),
                Weight("wq_b", heads * qk_head, attention.q_lora_rank, "rows"),
            )
        else:
            query = (Weight("wq", heads * qk_head, hidden, "rows"),)
        kv_b_rows = heads * (attention.qk_nope_head_dim + attention.v_head_dim)
        return (
            *query,
            Weight("wkv_a", attention.kv_lora_rank + attention.qk_rope_head_dim, hidden, "none"),
            Weight("kv_norm", attention.kv_lora_rank, 1, "none"),
            Weight("wkv_b", kv_b_rows, attention.kv_lora_rank, "rows"),
            Weight("wo", hidden, heads * attention.v_head_dim, "cols"),
        )

    def _expert_weights(self) -> tuple[Weight, ...]:
        experts = self.experts
        assert experts is not None
        hidden, ffn, routed = self.hidden, experts.ffn, experts.routed
        shared = _swiglu("shared", hidden, experts.ffn * experts.shared) if experts.shared else ()
        return (
            Weight("router", routed, hidden, "none"),
            Weight("experts.w1", ffn, hidden, "rows", routed),
            Weight("experts.w3", ffn, hidden, "rows", routed),
            Weight("experts.w2", hidden, ffn, "cols", routed),
            *shared,
        )


def _swiglu(prefix: str, hidden: int, ffn: int) -> tuple[Weight, ...]:
    return (
        Weight(f"{prefix}.w1", ffn, hidden, "rows"),
        Weight(f"{prefix}.w3", ffn, hidden, "rows"),
        Weight(f"{prefix}.w2", hidden, ffn, "cols"),
    )


def _elements(weights: tuple[Weight, ...]) -> int:
    return sum(weight.elements for weight in weights)
