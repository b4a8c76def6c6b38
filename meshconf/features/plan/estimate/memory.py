"""Per-rank memory of a training step: model state (parameters, gradients, AdamW state),
the transient FSDP gathers, and activations, on the pipeline rank that needs the most.

Pure Python. Formulas and sources in docs/plan.md ("Weights and model state per rank",
"Activations").
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import lru_cache
from typing import Literal

from meshconf.core.setting_values import Checkpointing
from meshconf.features.plan.estimate import activations
from meshconf.features.plan.estimate.architecture import Architecture, LayerKind
from meshconf.features.plan.estimate.pipeline import KINDS, RankStage, rank_stages
from meshconf.features.plan.estimate.schedule import in_flight_chunks
from meshconf.features.plan.estimate.sizing import (
    Shard,
    Sizing,
    end_weights,
    gathered,
    linear_split,
    local_shard,
    unsharded,
)
from meshconf.features.plan.estimate.step_inputs import (
    ChunkSizes,
    Parallelism,
    Training,
    microbatches,
    recomputed_blocks,
)

#: AdamW keeps two moments per parameter (fp32 unless ``optimizer_dtype`` says bf16) and one
#: fp32 step count per tensor.
ADAM_MOMENTS = 2
ADAM_STEP_BYTES = 4
MASTER_BYTES = 4

#: When a pipeline rank's memory peaks: in a block's backward pass, at the peak of the
#: loss's backward pass, when FSDP gathers the final norm and the output again for the norm's
#: backward pass, or in the embedding's backward pass (docs/plan.md, "Gathers").
Phase = Literal["block", "loss", "output", "embedding"]
#: What FSDP holds gathered at the peak, as ``meshconf.features.plan.estimate.terms.GATHERED``
#: words each.
Gathered = Literal[
    "whole",
    "unsharded",
    "gradient",
    "resharded",
    "kept",
    "accumulated",
    "loss",
    "output",
    "embedding",
]


@dataclass(frozen=True)
class Memory:
    """Bytes on one rank, at the ``phase`` of the step where its total peaks; ``gathers`` is
    FSDP's unsharded working set then, which holds ``gathered`` (docs/plan.md, "Gathers")."""

    params: int
    grads: int
    optimizer: int
    gathers: int
    activations: int
    pp_rank: int
    #: Of ``activations``: the last stage's final norm and loss at the peak of the loss's
    #: backward pass (0 in other phases).
    output_head: int = 0
    #: Of ``activations``: one block's backward pass, what it recomputes and the gradients
    #: in flight (0 in other phases).
    block_backward: int = 0
    #: Chunk-micro-batches whose activations the rank holds at its peak.
    in_flight: int = 0
    phase: Phase = "block"
    #: The CUDA context, NCCL's buffers and the allocator's reserve (:mod:`~.gpu_overheads`).
    runtime: int = 0
    gathered: Gathered = "whole"

    @property
    def training_state(self) -> int:
        """What the step's tensors hold: every term but ``runtime``."""
        return self.params + self.grads + self.optimizer + self.gathers + self.activations

    @property
    def total(self) -> int:
        return self.training_state + self.runtime


def estimate_memory(arch: Architecture, par: Parallelism, training: Training) -> Memory:
    """The memory of the pipeline rank with the largest total; ``training`` resolved for the
    model (:meth:`Training.for_model`)."""
    stages = rank_stages(
        arch, par.pp, training.chunks_per_stage, training.stage_ends, training.placement
    )
    return max(
        (rank_memory(arch, par, training, stage) for stage in stages),
        key=lambda memory: memory.total,
    )


def rank_memory(
    arch: Architecture, par: Parallelism, training: Training, stage: RankStage
) -> Memory:
    shard = _rank_shard(arch, par, stage)
    # ZeRO 3 (FSDP) keeps a shard of everything; 2 the parameters whole (after tp/ep/etp),
    # 1 the gradients too, and 0 the optimizer state as well.
    whole = shard.elements if training.zero_stage == 3 else sum(_stage(arch, par, stage, unsharded))
    kept = whole if training.zero_stage == 0 else shard.elements
    optimizer = kept * ADAM_MOMENTS * training.moment_bytes + shard.tensors * ADAM_STEP_BYTES
    if training.param_dtype != "fp32":
        optimizer += kept * MASTER_BYTES
    if training.zero_stage == 3:
        params = shard.elements * training.param_bytes
    else:
        params = _parameter_bytes(_stage(arch, par, stage, unsharded), training)
    grads = whole if training.zero_stage <= 1 else shard.elements
    held = _activations(arch, par, training, stage)
    gathers, gathered_kind = _gathers(arch, par, training, stage)
    block = Memory(
        params=params,
        grads=grads * training.grad_bytes,
        optimizer=optimizer,
        gathers=gathers,
        activations=held.stored + held.block_backward,
        pp_rank=stage.rank,
        block_backward=held.block_backward,
        in_flight=held.in_flight,
        gathered=gathered_kind,
    )
    return max(_phases(arch, par, training, stage, held, block), key=lambda phase: phase.total)


def _phases(
    arch: Architecture,
    par: Parallelism,
    training: Training,
    stage: RankStage,
    held: _Held,
    block: Memory,
) -> list[Memory]:
    """The rank's memory at each phase of the step that may be its peak, from ``block``'s."""
    phases = [block]
    # FSDP groups the final norm with the output and keeps them gathered from their forward
    # pass through the loss's backward pass (torchtitan's apply_fsdp); FSDP2 gathers the
    # group again for the norm's backward pass, while the output's gradient waits in its
    # reduce-scatter buffer. The embedding's backward pass comes last, every activation freed.
    grouped = training.zero_stage == 3 and training.reshards(par.pp) and block.gathers > 0
    p, g = training.param_bytes, training.grad_bytes

    def at(name: Literal["loss", "output", "embedding"], gathers: int, activations: int) -> Memory:
        return replace(
            block,
            gathers=gathers,
            activations=activations,
            block_backward=0,
            phase=name,
            gathered=name if grouped else block.gathered,
        )

    if stage.last:
        output = gathered(arch.output_weights(), par)
        loss = at("loss", output * p if grouped else block.gathers, held.stored + held.output_head)
        phases.append(replace(loss, output_head=held.output_head))
        if grouped:
            phases.append(at("output", output * (2 * p + g), held.stored))
    if grouped and stage.first:
        embedding = gathered(arch.embedding_weights(), par) * (2 * p + g)
        phases.append(replace(at("embedding", embedding, 0), in_flight=0))
    return phases


def _rank_shard(arch: Architecture, par: Parallelism, stage: RankStage) -> Shard:
    ends = local_shard(end_weights(arch, stage.first, stage.last), par)
    counted = [(1, ends)]
    counted += [(n, _block_shard(arch, kind, par)) for kind, n in stage.layers.items() if n]
    elements = sum(count * shard.elements for count, shard in counted)
    return Shard(elements, sum(count * shard.tensors for count, shard in counted))


@lru_cache(maxsize=4096)
def _block_shard(arch: Architecture, kind: LayerKind, par: Parallelism) -> Shard:
    return local_shard(arch.layer_weights(kind), par)


def _gathers(
    arch: Architecture, par: Parallelism, training: Training, stage: RankStage
) -> tuple[int, Gathered]:
    """FSDP's working set in a block's backward pass, and what it holds."""
    if training.zero_stage <= 1:
        return 0, "whole"
    if par.fsdp == 1 and (arch.experts is None or par.efsdp == 1):
        return 0, "unsharded"
    splits = [
        linear_split(arch, kind, par, gathered) for kind, count in stage.layers.items() if count
    ]
    largest = max((sum(split) for split in splits), default=0)
    if training.zero_stage == 2:
        # whole parameters; one block's gradient before its reduce-scatter
        return largest * training.grad_bytes, "gradient"
    if training.reshards(par.pp):
        block = max((_parameter_bytes(split, training) for split in splits), default=0)
        return 2 * block + largest * training.grad_bytes, "resharded"
    # Parameters stay gathered from a block's forward pass to its backward pass. Under a
    # pipeline schedule, torch.distributed.pipelining also turns off gradient sync and
    # resharding until the last micro-batch (stage.backward_maybe_with_nosync), so the
    # rank's gradients accumulate unsharded, in the reduction dtype.
    held = _stage(arch, par, stage, gathered)
    if par.pp > 1 and microbatches(par, training) > 1:
        return _parameter_bytes(held, training) + sum(held) * training.grad_bytes, "accumulated"
    return _parameter_bytes(held, training) + largest * training.grad_bytes, "kept"


def _stage(arch: Architecture, par: Parallelism, stage: RankStage, size: Sizing) -> tuple[int, int]:
    """Elements of the rank's weights, sized by ``size`` (as tp/ep/etp leave them, or as
    FSDP gathers them): its blocks' dense linear weights, and the rest."""
    linear = rest = 0
    for kind, count in stage.layers.items():
        if count:
            block_linear, block_rest = linear_split(arch, kind, par, size)
            linear += count * block_linear
            rest += count * block_rest
    return linear, rest + size(end_weights(arch, stage.first, stage.last), par)


def _parameter_bytes(split: tuple[int, int], training: Training) -> int:
    """Bytes of weights split as :func:`linear_split` splits them, in ``training``'s dtypes."""
    linear, rest = split
    return linear * training.linear_bytes + rest * training.param_bytes


@dataclass(frozen=True)
class _Held:
    """Activations of a rank: what its blocks store for the micro-batches in flight, the
    loss's (the last stage), and one block's backward pass."""

    stored: int
    output_head: int
    block_backward: int
    in_flight: int


def _activations(
    arch: Architecture, par: Parallelism, training: Training, stage: RankStage
) -> _Held:
    tokens = training.seq_len * training.micro_batch // par.cp
    dtype = training.stored_bytes
    parallel = (par.tp > 1, par.ep > 1)
    norm, sp = training.norm_kernel, training.sequence_parallel

    def layer_bytes(per_token: activations.PerToken) -> int:
        return per_token.bytes(tokens, par.tp, dtype, training.activation_bytes, sp)

    chunks = _chunk_blocks(
        stage.chunk_sizes,
        training.checkpointing,
        training.checkpoint_every,
        training.checkpoint_first,
    )
    present = {(kind, mode) for chunk in chunks for kind, mode, count in chunk if count}
    per_layer = {
        (kind, mode): layer_bytes(activations.block(arch, kind, mode, *parallel, norm, sp))
        for kind, mode in present
    }
    group = training.checkpoint_group if training.checkpointing == "full" else None
    if group is None:
        largest = max(
            sum(per_layer[kind, mode] * count for kind, mode, count in chunk if count)
            for chunk in chunks
        )
    else:
        # Megatron-LM's uniform method keeps one input a group of blocks (an input is the
        # same for every kind of block); a chunk's last group may hold fewer
        blocks = max(sum(count for _, _, count in chunk) for chunk in chunks)
        largest = -(-blocks // group) * layer_bytes(activations.block(arch, "dense", "full"))
        group = min(group, blocks)
    in_flight = in_flight_chunks(par.pp, stage.rank, training, microbatches(par, training))
    head = activations.output_head(arch).bytes(tokens, par.tp, dtype) if stage.last else 0
    # the output head's backward pass frees its tensors before the last block's begins,
    # and each block's backward pass runs alone; a group of the uniform method is
    # recomputed whole before its backward pass, which then frees one block at a time
    working = max(
        (
            layer_bytes(activations.backward_working_set(arch, kind, mode, *parallel, norm, sp))
            + (group - 1 if group else 0)
            * layer_bytes(activations.block(arch, kind, "none", *parallel, norm, sp))
            for kind, mode in present
        ),
        default=0,
    )
    return _Held(in_flight * largest, head, working, in_flight)


@lru_cache(maxsize=4096)
def _chunk_blocks(
    sizes: ChunkSizes, checkpointing: Checkpointing, every: int | None, first: int | None
) -> frozenset[tuple[tuple[LayerKind, Checkpointing, int], ...]]:
    """The distinct chunks of a rank (``sizes``: each chunk's blocks of each kind), as how
    many of their blocks of each kind run under each checkpointing mode: those recomputed
    whole (:func:`recomputed_blocks`) under ``full``, the others under the mode that keeps
    what they store (``none`` beside recomputed blocks, else the training's own)."""
    kept: Checkpointing = "none" if checkpointing == "full" else checkpointing
    recomputed = recomputed_blocks(sizes, checkpointing, every, first)
    return frozenset(
        tuple(
            block
            for kind, count, whole in zip(KINDS, chunk, wholes, strict=True)
            for block in ((kind, "full", whole), (kind, kept, count - whole))
        )
        for chunk, wholes in zip(sizes, recomputed, strict=True)
    )
