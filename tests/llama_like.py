"""A small Llama-shaped model in torch whose weights are exactly those of
``meshconf.features.plan.estimate.architecture`` (the same names, shapes and count), and its
tensor-parallel plan (torchtitan's: column-wise q, k, v, w1, w3 and output, row-wise wo and
w2 and a vocabulary-split embedding; norms replicated)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from meshconf.features.plan.estimate.architecture import (
    Architecture,
    Experts,
    GroupedQueryAttention,
)

TINY = Architecture("tiny", 2, 64, 128, 256, GroupedQueryAttention(4, 2, 16))
TINY_MOE = Architecture(
    "tiny-moe", 2, 64, 128, 256, GroupedQueryAttention(4, 2, 16), Experts(8, 2, 32, 0, 1)
)


class LocalExperts(nn.Module):
    """The experts one expert-parallel rank holds, stacked ``[experts, out, in]``."""

    def __init__(self, count: int, hidden: int, ffn: int) -> None:
        super().__init__()
        self.w1 = nn.Parameter(torch.randn(count, ffn, hidden) * 0.02)
        self.w3 = nn.Parameter(torch.randn(count, ffn, hidden) * 0.02)
        self.w2 = nn.Parameter(torch.randn(count, hidden, ffn) * 0.02)

    def forward(self, x: torch.Tensor, gates: torch.Tensor) -> torch.Tensor:
        # every local token through every local expert, weighted by its gate: the
        # parameters and their gradients are those of routed experts
        up = torch.einsum("th,efh->tef", x, self.w1)
        gate = torch.einsum("th,efh->tef", x, self.w3)
        out = torch.einsum("tef,ehf->teh", F.silu(up) * gate, self.w2)
        return torch.einsum("teh,te->th", out, gates)


class MoEFeedForward(nn.Module):
    def __init__(self, arch: Architecture, first_expert: int, count: int) -> None:
        super().__init__()
        assert arch.experts is not None
        self.router = nn.Linear(arch.hidden, arch.experts.routed, bias=False)
        self.experts = LocalExperts(count, arch.hidden, arch.experts.ffn)
        self.local = slice(first_expert, first_expert + count)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        tokens = x.reshape(-1, shape[-1])
        gates = torch.softmax(self.router(tokens), dim=-1)[:, self.local]
        return self.experts(tokens, gates).reshape(shape)


class Block(nn.Module):
    def __init__(self, arch: Architecture, moe: MoEFeedForward | None = None) -> None:
        super().__init__()
        attention = arch.attention
        assert isinstance(attention, GroupedQueryAttention)
        self.heads, self.kv_heads, self.head_dim = (
            attention.heads,
            attention.kv_heads,
            attention.head_dim,
        )
        hidden = arch.hidden
        self.attention_norm = nn.RMSNorm(hidden)
        self.wq = nn.Linear(hidden, self.heads * self.head_dim, bias=False)
        self.wk = nn.Linear(hidden, self.kv_heads * self.head_dim, bias=False)
        self.wv = nn.Linear(hidden, self.kv_heads * self.head_dim, bias=False)
        self.wo = nn.Linear(self.heads * self.head_dim, hidden, bias=False)
        # Qwen3's norms of each query and key head, before the rotary embedding
        self.q_norm = nn.RMSNorm(self.head_dim) if attention.qk_norm else None
        self.k_norm = nn.RMSNorm(self.head_dim) if attention.qk_norm else None
        self.ffn_norm = nn.RMSNorm(hidden)
        self.moe = moe
        if moe is None:
            self.w1 = nn.Linear(hidden, arch.ffn, bias=False)
            self.w3 = nn.Linear(hidden, arch.ffn, bias=False)
            self.w2 = nn.Linear(arch.ffn, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, _ = x.shape
        h = self.attention_norm(x)
        # -1: the local number of heads under tensor parallelism
        q = self.wq(h).view(batch, seq, -1, self.head_dim)
        k = self.wk(h).view(batch, seq, -1, self.head_dim)
        if self.q_norm is not None and self.k_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = q.transpose(1, 2), k.transpose(1, 2)
        v = self.wv(h).view(batch, seq, -1, self.head_dim).transpose(1, 2)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        x = x + self.wo(out.transpose(1, 2).reshape(batch, seq, -1))
        h = self.ffn_norm(x)
        if self.moe is not None:
            return x + self.moe(h)
        return x + self.w2(F.silu(self.w1(h)) * self.w3(h))


class LlamaLike(nn.Module):
    """With experts, this rank holds experts ``[first_expert, first_expert + count)``."""

    def __init__(self, arch: Architecture, first_expert: int = 0, count: int = 0) -> None:
        super().__init__()
        self.embedding = nn.Embedding(arch.vocab, arch.hidden)
        self.layers = nn.ModuleList(
            Block(
                arch,
                MoEFeedForward(arch, first_expert, count) if arch.kind(i) == "moe" else None,
            )
            for i in range(arch.layers)
        )
        self.norm = nn.RMSNorm(arch.hidden)
        self.output = nn.Linear(arch.hidden, arch.vocab, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embedding(tokens)
        for layer in self.layers:
            x = layer(x)
        return self.output(self.norm(x))


def tensor_parallel_plan() -> tuple[dict[str, object], dict[str, object]]:
    """The plans of the model's top level and of each block."""
    from torch.distributed.tensor import Replicate
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    top = {
        "embedding": RowwiseParallel(input_layouts=Replicate()),
        "output": ColwiseParallel(output_layouts=Replicate()),
    }
    block = {
        "wq": ColwiseParallel(),
        "wk": ColwiseParallel(),
        "wv": ColwiseParallel(),
        "wo": RowwiseParallel(),
        "w1": ColwiseParallel(),
        "w3": ColwiseParallel(),
        "w2": RowwiseParallel(),
    }
    return top, block
