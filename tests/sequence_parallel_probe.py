"""Run by tests/test_plan_sequence_parallel.py in a process of its own, since it starts
torch's fake process group: the blocks of tests/measure_builds.py's model under tensor and
sequence parallelism as torchtitan applies them (each norm's output gathered once for the
products after it, row-wise products reduce-scattered back over the sequence), at tp 2, on
the fake process group and under ``FakeTensorMode``, wrapped for one checkpointing mode.
Prints, as JSON, the activations tracked at each block's end of forward, and the
collectives of one forward and backward pass counted by torch's ``CommDebugMode``. With
``none`` after the mode, tensor parallelism without sequence parallelism: the norms run on
every token of each rank, and the row-wise products' outputs are all-reduced.

    python sequence_parallel_probe.py none|selective|full [dtensor|none]
"""

from __future__ import annotations

import json
import sys

import torch
import torch.nn.functional as F
from measure_builds import ARCH, BATCH, SEQ, block_activations, checkpointed
from torch import nn

from meshconf import load_config
from meshconf.features.plan.estimate.architecture import GroupedQueryAttention
from meshconf.runtime import DistributedContext

TP = 2
ATTENTION = ARCH.attention
assert isinstance(ATTENTION, GroupedQueryAttention)


class Attention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        hidden, head_dim = ARCH.hidden, ATTENTION.head_dim
        self.wq = nn.Linear(hidden, ATTENTION.heads * head_dim, bias=False)
        self.wk = nn.Linear(hidden, ATTENTION.kv_heads * head_dim, bias=False)
        self.wv = nn.Linear(hidden, ATTENTION.kv_heads * head_dim, bias=False)
        self.wo = nn.Linear(ATTENTION.heads * head_dim, hidden, bias=False)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        batch, seq, _ = h.shape
        q, k, v = (
            projection(h).view(batch, seq, -1, ATTENTION.head_dim).transpose(1, 2)
            for projection in (self.wq, self.wk, self.wv)
        )
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        return self.wo(out.transpose(1, 2).reshape(batch, seq, -1))


class FeedForward(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w1 = nn.Linear(ARCH.hidden, ARCH.ffn, bias=False)
        self.w3 = nn.Linear(ARCH.hidden, ARCH.ffn, bias=False)
        self.w2 = nn.Linear(ARCH.ffn, ARCH.hidden, bias=False)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(h)) * self.w3(h))


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.attention_norm = nn.RMSNorm(ARCH.hidden)
        self.attention = Attention()
        self.ffn_norm = nn.RMSNorm(ARCH.hidden)
        self.feed_forward = FeedForward()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.attention_norm(x))
        return x + self.feed_forward(self.ffn_norm(x))


class Blocks(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList(Block() for _ in range(ARCH.layers))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return x


def _plan(sequence_parallel: str) -> dict[str, object]:
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        RowwiseParallel,
        SequenceParallel,
    )

    if sequence_parallel == "none":
        return {
            "attention.wq": ColwiseParallel(),
            "attention.wk": ColwiseParallel(),
            "attention.wv": ColwiseParallel(),
            "attention.wo": RowwiseParallel(),
            "feed_forward.w1": ColwiseParallel(),
            "feed_forward.w3": ColwiseParallel(),
            "feed_forward.w2": RowwiseParallel(),
        }

    gathered = PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),))
    return {
        "attention_norm": SequenceParallel(),
        "attention": gathered,
        "attention.wq": ColwiseParallel(),
        "attention.wk": ColwiseParallel(),
        "attention.wv": ColwiseParallel(),
        "attention.wo": RowwiseParallel(output_layouts=Shard(1)),
        "ffn_norm": SequenceParallel(),
        "feed_forward": gathered,
        "feed_forward.w1": ColwiseParallel(),
        "feed_forward.w3": ColwiseParallel(),
        "feed_forward.w2": RowwiseParallel(output_layouts=Shard(1)),
    }


def main(mode: str, sequence_parallel: str) -> None:
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed._tools.mem_tracker import MemTracker
    from torch.distributed.tensor.debug import CommDebugMode
    from torch.distributed.tensor.parallel import parallelize_module

    config = load_config({"world_size": TP, "degrees": {"tp": TP}})
    context = DistributedContext.simulate(config, rank=0, world_size=TP)
    try:
        mesh = context.mesh_for("dense")["tp"]
        with FakeTensorMode():
            model = Blocks()
            for layer in model.layers:
                parallelize_module(layer, mesh, _plan(sequence_parallel))
            model = checkpointed(model, mode)
            # this rank's share of the sequence, or every token without sequence parallelism
            share = SEQ if sequence_parallel == "none" else SEQ // TP
            x = torch.randn(BATCH, share, ARCH.hidden, requires_grad=True)
            tracker = MemTracker()
            tracker.track_external(model)
            collectives = CommDebugMode()
            with tracker, collectives:
                model(x).sum().backward()
        ends, _ = block_activations(tracker, "Blocks.layers")
        counts = {
            str(op).rsplit(".", 1)[-1]: count for op, count in collectives.get_comm_counts().items()
        }
        print(json.dumps({"ends": ends, "collectives": counts}))
    finally:
        context.close()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else "dtensor")
