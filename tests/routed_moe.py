"""A mixture of experts routed as torchtitan's MoE routes it without expert parallelism, for
measuring its activations (tests/test_plan_activations.py): router scores in fp32, top-k,
every routed copy of a token gathered in expert order, the experts' grouped products, each
copy's output weighted by its score and added back to its token, shared experts beside."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from meshconf.features.plan.estimate.architecture import Architecture


class RoutedMoE(nn.Module):
    def __init__(self, arch: Architecture) -> None:
        super().__init__()
        experts = arch.experts
        assert experts is not None
        self.top_k, self.routed = experts.top_k, experts.routed
        hidden, ffn = arch.hidden, experts.ffn
        self.gate = nn.Linear(hidden, experts.routed, bias=False)
        self.w1 = nn.Parameter(torch.randn(experts.routed, ffn, hidden) * 0.02)
        self.w3 = nn.Parameter(torch.randn(experts.routed, ffn, hidden) * 0.02)
        self.w2 = nn.Parameter(torch.randn(experts.routed, hidden, ffn) * 0.02)
        shared = experts.shared * ffn
        self.shared = (
            nn.ModuleDict(
                {
                    "w1": nn.Linear(hidden, shared, bias=False),
                    "w3": nn.Linear(hidden, shared, bias=False),
                    "w2": nn.Linear(shared, hidden, bias=False),
                }
            )
            if shared
            else None
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        tokens = x.reshape(-1, x.shape[-1])
        scores = torch.softmax(self.gate(tokens).float(), dim=-1)
        top_scores, top_ids = scores.topk(self.top_k, dim=-1)
        order = top_ids.flatten().argsort(stable=True)
        # a fixed number of bins: the counts' shape does not depend on the routing
        counts = torch.histc(
            top_ids.flatten().float(), bins=self.routed, min=0, max=self.routed - 1
        )
        offsets = counts.cumsum(0).to(torch.int32)
        source = order // self.top_k
        routed = tokens[source]
        up = torch._grouped_mm(routed, self.w1.transpose(-2, -1), offs=offsets)
        gate = torch._grouped_mm(routed, self.w3.transpose(-2, -1), offs=offsets)
        out = torch._grouped_mm(F.silu(up) * gate, self.w2.transpose(-2, -1), offs=offsets)
        out = out * top_scores.flatten()[order].unsqueeze(-1).to(out.dtype)
        combined = torch.zeros_like(tokens).scatter_add(0, source.unsqueeze(-1).expand_as(out), out)
        if self.shared is not None:
            shared = self.shared
            combined = combined + shared["w2"](F.silu(shared["w1"](tokens)) * shared["w3"](tokens))
        return combined.reshape(x.shape)
