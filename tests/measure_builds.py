"""Build functions for ``meshconf measure`` (tests/test_measure.py): a small Llama-shaped
model (tests/llama_like.py) parallelized over the context's meshes as torchtitan does, and
build functions that fail in each way a user's may."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from llama_like import LlamaLike, tensor_parallel_plan
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor.parallel import parallelize_module

from meshconf.features.plan.estimate.architecture import Architecture, GroupedQueryAttention
from meshconf.runtime import DistributedContext, TrainingStep

ARCH = Architecture("small", 4, 256, 704, 512, GroupedQueryAttention(4, 2, 64))
SEQ, BATCH = 64, 2
#: The same model as a model file, for the estimate beside the measurement.
MODEL_FILE = """\
name: small
layers: 4
hidden: 256
ffn: 704
vocab: 512
attention: {heads: 4, kv_heads: 2, head_dim: 64}
"""


def _step(model: torch.nn.Module) -> TrainingStep:
    optimizer = torch.optim.AdamW(model.parameters())
    tokens = torch.randint(0, ARCH.vocab, (BATCH, SEQ))

    def forward_backward() -> None:
        logits = model(tokens).float()
        F.cross_entropy(logits.flatten(0, 1), tokens.flatten()).backward()

    return TrainingStep(model, optimizer, forward_backward)


def fsdp(context: DistributedContext) -> TrainingStep:
    """FSDP2 over the dense domain's fsdp dim, one block at a time, then the root."""
    mesh = context.mesh_for("dense")["fsdp"]
    model = LlamaLike(ARCH)
    for layer in model.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return _step(model)


def tensor_parallel(context: DistributedContext) -> TrainingStep:
    """torchtitan's tensor-parallel plan over the dense domain's tp dim, no FSDP."""
    mesh = context.mesh_for("dense")["tp"]
    model = LlamaLike(ARCH)
    top, block = tensor_parallel_plan()
    for layer in model.layers:
        parallelize_module(layer, mesh, block)
    parallelize_module(model, mesh, top)
    return _step(model)


def raises(context: DistributedContext) -> TrainingStep:
    raise ValueError("no checkpoint at /data/ckpt")


def returns_a_model(context: DistributedContext) -> torch.nn.Module:
    return LlamaLike(ARCH)


def step_raises(context: DistributedContext) -> TrainingStep:
    model = LlamaLike(ARCH)

    def forward_backward() -> None:
        model(torch.zeros(BATCH, SEQ + 1)).sum().backward()

    return TrainingStep(model, torch.optim.AdamW(model.parameters()), forward_backward)
