"""Build functions for ``meshconf measure`` (tests/test_measure.py): a small Llama-shaped
model (tests/llama_like.py) parallelized over the context's meshes as torchtitan does, with
torchtitan's activation checkpointing, and build functions that fail in each way a user's
may. Also what the activation measurements share: reading torch's ``MemTracker`` block by
block, and what the CPU's norms keep beyond CUDA's."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any, TypeVar

import torch
import torch.nn.functional as F
from llama_like import LlamaLike, tensor_parallel_plan
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor.parallel import parallelize_module
from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

from meshconf.features.plan.estimate import activations
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

#: The same blocks under a vocabulary large beside them, and its model file.
LARGE_VOCABULARY = replace(ARCH, name="small-large-vocabulary", vocab=16384)
LARGE_VOCABULARY_FILE = MODEL_FILE.replace("name: small", f"name: {LARGE_VOCABULARY.name}").replace(
    "vocab: 512", "vocab: 16384"
)

ModelT = TypeVar("ModelT", bound=torch.nn.Module)

_MATMULS = {torch.ops.aten.mm.default, torch.ops.aten.linear.default}
# the attention kernels: CUDA's flash kernel, and the CPU's, which stands for it here
_KEPT = _MATMULS | {
    torch.ops.aten._scaled_dot_product_flash_attention.default,
    torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default,
    torch.ops._c10d_functional.reduce_scatter_tensor.default,
    torch.ops.aten.topk.default,
}


def per_op_policy(
    recomputed: frozenset[tuple[int, ...]] = frozenset(),
) -> Callable[..., CheckpointPolicy]:
    """torchtitan's per-op selective checkpointing (``SelectiveAC``), for one block's call:
    keep the outputs of the attention kernel, reduce-scatter and top-k, and those of every
    other matrix product, counted separately in the forward pass and in the recomputation.
    A product with a weight of a shape in ``recomputed`` (``(in, out)``, torchtitan's
    router gate) is recomputed and not counted."""
    counts = {False: 0, True: 0}

    def policy(context: Any, function: Any, *args: Any, **kwargs: Any) -> CheckpointPolicy:
        if function in _MATMULS:
            shape = tuple(args[1].shape)
            if (shape[::-1] if function == torch.ops.aten.linear.default else shape) in recomputed:
                return CheckpointPolicy.PREFER_RECOMPUTE
            counts[context.is_recompute] += 1
            if counts[context.is_recompute] % 2 == 0:
                return CheckpointPolicy.PREFER_RECOMPUTE
        return (
            CheckpointPolicy.MUST_SAVE if function in _KEPT else CheckpointPolicy.PREFER_RECOMPUTE
        )

    return policy


def checkpointed(
    model: ModelT,
    mode: str,
    recomputed: frozenset[tuple[int, ...]] = frozenset(),
    wrapped: list[bool] | None = None,
) -> ModelT:
    """Each block wrapped as torchtitan wraps it for ``mode`` (none, selective or full):
    without early stop, so that the recomputation runs the whole block; ``recomputed`` as
    for :func:`per_op_policy`. With ``full`` and ``wrapped``, only the blocks it marks, as
    torchtitan's layer-wise selective checkpointing and Megatron-LM's ``--recompute-method
    block`` wrap some."""
    layers: Any = model.layers
    for index, layer in enumerate(layers):
        if mode == "full" and wrapped is not None and not wrapped[index]:
            continue
        if mode == "selective":
            layers[index] = checkpoint_wrapper(
                layer,
                context_fn=lambda: create_selective_checkpoint_contexts(per_op_policy(recomputed)),
                preserve_rng_state=False,
                early_stop=False,
            )
        elif mode == "full":
            layers[index] = checkpoint_wrapper(layer, preserve_rng_state=False, early_stop=False)
    return model


def cpu_norm_extra(arch: Architecture) -> activations.PerToken:
    """torch's RMSNorm on CPU is composite: besides its input and one fp32 reciprocal RMS
    per token, which CUDA's fused kernel keeps and the estimate counts, it keeps the
    normalized input. What a block's norms (two, and Qwen3's per query and key head) that
    run without recomputation add on CPU."""
    attention = arch.attention
    assert isinstance(attention, GroupedQueryAttention)
    heads = (attention.heads + attention.kv_heads) * attention.head_dim
    return activations.PerToken(outside=2 * arch.hidden, split=heads if attention.qk_norm else 0)


def block_activations(tracker: Any, blocks: str) -> tuple[list[int], int]:
    """The activations (and temporaries) a ``MemTracker`` tracked at the end of forward of
    each block ``{blocks}.N``, and at the peak of the last block's backward pass, in bytes."""
    from torch.distributed._tools.mem_tracker import _ModState

    def activation_bytes(snapshot: dict[torch.device, dict[Any, int]]) -> int:
        return sum(
            size
            for sizes in snapshot.values()
            for kind, size in sizes.items()
            if getattr(kind, "name", "") in ("ACT", "TEMP")
        )

    ends, last_backward = [], 0
    for stats in tracker.memory_tracking.values():
        if (
            stats.mod_fqn.startswith(f"{blocks}.")
            and stats.mod_fqn.count(".") == blocks.count(".") + 1
        ):
            ends.append(activation_bytes(stats.snapshots[_ModState.POST_FW][-1]))
            last_backward = activation_bytes(stats.snapshots[_ModState.PEAK_BW][-1])
    return ends, last_backward


def tracked_step(
    model: torch.nn.Module, tokens: torch.Tensor, blocks: str
) -> tuple[list[int], int]:
    """:func:`block_activations` of a ``MemTracker`` over one forward and backward pass of
    ``model`` on ``tokens``, the cross-entropy of its logits in fp32 as the loss."""
    from torch.distributed._tools.mem_tracker import MemTracker

    tracker = MemTracker()
    tracker.track_external(model)
    with tracker:
        logits = model(tokens).float()
        F.cross_entropy(logits.flatten(0, 1), tokens.flatten()).backward()
    return block_activations(tracker, blocks)


def _step(model: torch.nn.Module, arch: Architecture = ARCH, batch: int = BATCH) -> TrainingStep:
    optimizer = torch.optim.AdamW(model.parameters())
    tokens = torch.randint(0, arch.vocab, (batch, SEQ))

    def forward_backward() -> None:
        # no name holds the logits through the backward pass, as torchtitan's train step
        # deletes them
        loss = F.cross_entropy(model(tokens).float().flatten(0, 1), tokens.flatten())
        loss.backward()

    return TrainingStep(model, optimizer, forward_backward)


def _fsdp(context: DistributedContext, mode: str, fp8: bool = False) -> TrainingStep:
    mesh = context.mesh_for("dense")["fsdp"]
    model = LlamaLike(ARCH)
    if fp8:
        from torchao.float8 import Float8LinearConfig, convert_to_float8_training

        # torchtitan's float8 linear training with FSDP's fp8 all-gather; the output
        # projection left out, as --fp8-param-gather leaves it
        config = Float8LinearConfig(enable_fsdp_float8_all_gather=True)
        convert_to_float8_training(
            model, config=config, module_filter_fn=lambda module, fqn: fqn != "output"
        )
    return _step(_sharded_as_torchtitan(checkpointed(model, mode), mesh))


def _sharded_as_torchtitan(model: ModelT, mesh: Any, **policy: Any) -> ModelT:
    """FSDP2 in torchtitan's groups (``apply_fsdp``): the embedding, each block, the final
    norm with the output (kept gathered from its forward to its backward pass), then the
    root; ``policy``, fully_shard's other settings (``mp_policy``)."""
    fully_shard(model.embedding, mesh=mesh, **policy)
    layers: Any = model.layers
    for layer in layers:
        fully_shard(layer, mesh=mesh, **policy)
    fully_shard([model.norm, model.output], mesh=mesh, reshard_after_forward=False, **policy)
    fully_shard(model, mesh=mesh, **policy)
    return model


def fsdp(context: DistributedContext) -> TrainingStep:
    """FSDP2 over the dense domain's fsdp dim, one block at a time, then the root."""
    return _fsdp(context, "none")


def fsdp_selective(context: DistributedContext) -> TrainingStep:
    """As :func:`fsdp`, each block under torchtitan's per-op selective checkpointing."""
    return _fsdp(context, "selective")


def fsdp_full(context: DistributedContext) -> TrainingStep:
    """As :func:`fsdp`, each block recomputed whole in the backward pass."""
    return _fsdp(context, "full")


def fsdp_large_vocabulary(context: DistributedContext) -> TrainingStep:
    """:data:`LARGE_VOCABULARY` under torchtitan's FSDP groups and mixed precision (fp32
    shards gathered in bf16, gradients reduced in fp32), one sequence a micro-batch."""
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    mesh = context.mesh_for("dense")["fsdp"]
    model = _sharded_as_torchtitan(LlamaLike(LARGE_VOCABULARY), mesh, mp_policy=policy)
    return _step(model, LARGE_VOCABULARY, batch=1)


def fsdp_fp8(context: DistributedContext) -> TrainingStep:
    """As :func:`fsdp`, the blocks' linear layers trained in fp8 by torchao, which FSDP
    gathers in fp8."""
    return _fsdp(context, "none", fp8=True)


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


def exits(context: DistributedContext) -> TrainingStep:
    raise SystemExit(3)


def step_exits(context: DistributedContext) -> TrainingStep:
    model = LlamaLike(ARCH)

    def forward_backward() -> None:
        raise SystemExit(0)

    return TrainingStep(model, torch.optim.AdamW(model.parameters()), forward_backward)


class _Unprintable(Exception):
    def __str__(self) -> str:
        raise RuntimeError("no message either")


def step_raises_unprintable(context: DistributedContext) -> TrainingStep:
    model = LlamaLike(ARCH)

    def forward_backward() -> None:
        raise _Unprintable

    return TrainingStep(model, torch.optim.AdamW(model.parameters()), forward_backward)


def returns_wrong_fields(context: DistributedContext) -> TrainingStep:
    return TrainingStep("model", None, 1)  # type: ignore[arg-type]
