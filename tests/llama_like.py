"""A small Llama-shaped model in torch whose weights are exactly those of
``meshconf.features.estimate.architecture`` (the same names, shapes and count), and its
tensor-parallel plan (torchtitan's: column-wise q, k, v, w1, w3 and output, row-wise wo and
w2 and a vocabulary-split embedding; norms replicated)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from meshconf.features.estimate.architecture import Architecture, GroupedQueryAttention

TINY = Architecture("tiny", 2, 64, 128, 256, GroupedQueryAttention(4, 2, 16))


class Block(nn.Module):
    def __init__(self, arch: Architecture) -> None:
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
        self.ffn_norm = nn.RMSNorm(hidden)
        self.w1 = nn.Linear(hidden, arch.ffn, bias=False)
        self.w3 = nn.Linear(hidden, arch.ffn, bias=False)
        self.w2 = nn.Linear(arch.ffn, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, _ = x.shape
        h = self.attention_norm(x)
        # -1: the local number of heads under tensor parallelism
        q = self.wq(h).view(batch, seq, -1, self.head_dim).transpose(1, 2)
        k = self.wk(h).view(batch, seq, -1, self.head_dim).transpose(1, 2)
        v = self.wv(h).view(batch, seq, -1, self.head_dim).transpose(1, 2)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        x = x + self.wo(out.transpose(1, 2).reshape(batch, seq, -1))
        h = self.ffn_norm(x)
        return x + self.w2(F.silu(self.w1(h)) * self.w3(h))


class LlamaLike(nn.Module):
    def __init__(self, arch: Architecture) -> None:
        super().__init__()
        self.embedding = nn.Embedding(arch.vocab, arch.hidden)
        self.layers = nn.ModuleList(Block(arch) for _ in range(arch.layers))
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
