"""Per-rank memory of a training step: model state (parameters, gradients, AdamW state),
the transient FSDP gathers, and activations, on the pipeline rank that needs the most.

Pure Python. Formulas and sources in docs/plan.md ("Memory per rank").
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

from meshconf.features.estimate import activations
from meshconf.features.estimate.architecture import Architecture, LayerKind, Weight
from meshconf.features.estimate.training import Checkpointing, Parallelism, Training, microbatches

#: AdamW keeps two fp32 moments per parameter and one fp32 step count per tensor.
ADAM_MOMENT_BYTES = 8
ADAM_STEP_BYTES = 4
MASTER_BYTES = 4


@dataclass(frozen=True)
class Memory:
    """Bytes on one rank. ``gathers`` is the transient FSDP working set: one block's
    parameters gathered, the next one prefetched, and one block's unsharded gradient."""

    params: int
    grads: int
    optimizer: int
    gathers: int
    activations: int
    pp_rank: int

    @property
    def total(self) -> int:
        return self.params + self.grads + self.optimizer + self.gathers + self.activations


@dataclass(frozen=True)
class Shard:
    """Elements and tensors of some weights on one rank."""

    elements: int
    tensors: int


def stage_layers(layers: int, pp: int, chunks_per_stage: int) -> list[list[list[int]]]:
    """The layers of each pipeline rank, chunk by chunk. The model is cut into
    ``pp * chunks_per_stage`` chunks of consecutive layers; chunk ``c`` runs on rank
    ``c % pp``. Sizes differ by at most one, and the larger ones go to the middle chunks
    first, so the first chunk (with the embedding) and the last (with the output) are the
    smaller ones when the layers do not divide evenly."""
    count = pp * chunks_per_stage
    base, extra = divmod(layers, count)
    order = [*range(1, count - 1), 0, count - 1][: max(0, extra)]
    sizes = [base + (chunk in order) for chunk in range(count)]
    ranks: list[list[list[int]]] = [[] for _ in range(pp)]
    start = 0
    for chunk, size in enumerate(sizes):
        ranks[chunk % pp].append(list(range(start, start + size)))
        start += size
    return ranks


def local_shard(weights: Sequence[Weight], par: Parallelism) -> Shard:
    """The weights' local shard after tp (etp and ep for experts), then FSDP over ``fsdp``
    (``efsdp`` for experts), which splits dim 0 into equal parts, padding the last: each
    rank allocates ``ceil(rows / n)`` rows."""
    elements = 0
    for weight in weights:
        elements += _sharded(weight, par)
    return Shard(elements, len(weights))


def unsharded(weights: Sequence[Weight], par: Parallelism) -> int:
    """Elements of the weights after tp/ep/etp only: what an FSDP all-gather rebuilds."""
    return sum(_tp_local(weight, par)[0] * _tp_local(weight, par)[1] for weight in weights)


def estimate_memory(arch: Architecture, par: Parallelism, training: Training) -> Memory:
    """The memory of the pipeline rank with the largest total."""
    return max(
        (_rank_memory(arch, par, training, rank) for rank in range(par.pp)),
        key=lambda memory: memory.total,
    )


def _rank_memory(arch: Architecture, par: Parallelism, training: Training, rank: int) -> Memory:
    chunks = stage_layers(arch.layers, par.pp, training.chunks_per_stage)[rank]
    layers = [layer for chunk in chunks for layer in chunk]
    last = rank == (par.pp * training.chunks_per_stage - 1) % par.pp
    shard = _rank_shard(arch, par, layers, rank == 0, last)
    optimizer = shard.elements * ADAM_MOMENT_BYTES + shard.tensors * ADAM_STEP_BYTES
    if training.param_dtype != "fp32":
        optimizer += shard.elements * MASTER_BYTES
    return Memory(
        params=shard.elements * training.param_bytes,
        grads=shard.elements * training.grad_bytes,
        optimizer=optimizer,
        gathers=_gathers(arch, par, training, layers),
        activations=_activations(arch, par, training, rank, chunks, last),
        pp_rank=rank,
    )


def _rank_shard(
    arch: Architecture, par: Parallelism, layers: list[int], first: bool, last: bool
) -> Shard:
    """The rank's shard, from one shard per kind of block (many rows share them)."""
    elements = tensors = 0
    for layer in layers:
        shard = _block_shard(arch, arch.kind(layer), par)
        elements += shard.elements
        tensors += shard.tensors
    ends = (arch.embedding_weights() if first else ()) + (arch.output_weights() if last else ())
    shard = local_shard(ends, par)
    return Shard(elements + shard.elements, tensors + shard.tensors)


@lru_cache(maxsize=4096)
def _block_shard(arch: Architecture, kind: LayerKind, par: Parallelism) -> Shard:
    return local_shard(arch.layer_weights(kind), par)


def _gathers(arch: Architecture, par: Parallelism, training: Training, layers: list[int]) -> int:
    if par.fsdp == 1 and (arch.experts is None or par.efsdp == 1):
        return 0
    kinds = {arch.kind(layer) for layer in layers}
    largest = max((block_elements(arch, kind, par) for kind in kinds), default=0)
    return largest * (2 * training.param_bytes + training.grad_bytes)


def block_elements(arch: Architecture, kind: LayerKind, par: Parallelism) -> int:
    """Elements of one block after tp/ep/etp, as an FSDP all-gather rebuilds it."""
    dense, experts = block_split(arch, kind, par)
    return dense + experts


@lru_cache(maxsize=4096)
def block_split(arch: Architecture, kind: LayerKind, par: Parallelism) -> tuple[int, int]:
    """Elements of one block after tp/ep/etp: the non-expert weights, and the experts."""
    weights = arch.layer_weights(kind)
    experts = unsharded([weight for weight in weights if weight.experts], par)
    return unsharded([weight for weight in weights if not weight.experts], par), experts


def _activations(
    arch: Architecture,
    par: Parallelism,
    training: Training,
    rank: int,
    chunks: list[list[int]],
    last: bool,
) -> int:
    tokens = training.seq_len * training.micro_batch // par.cp
    dtype = training.param_bytes
    mode = training.checkpointing

    sizes: dict[tuple[str, str], int] = {}

    def layer_bytes(layer: int, layer_mode: Checkpointing) -> int:
        kind = arch.kind(layer)
        found = sizes.get((kind, layer_mode))
        if found is None:
            per_token = activations.block(arch, kind, layer_mode)
            found = sizes[kind, layer_mode] = per_token.bytes(tokens, par.tp, dtype)
        return found

    chunk_bytes = [sum(layer_bytes(layer, mode) for layer in chunk) for chunk in chunks]
    in_flight = _in_flight_chunks(par.pp, rank, training, microbatches(par, training))
    if training.chunks_per_stage == 1:
        stored = in_flight * chunk_bytes[0]
    else:
        stored = in_flight * max(chunk_bytes)
    head = activations.output_head(arch).bytes(tokens, par.tp, dtype) if last else 0
    layers = [layer for chunk in chunks for layer in chunk]
    if mode == "full" and layers:
        # the backward pass recomputes one block at a time, keeping what it stores, after
        # the output head's backward has freed the head's tensors
        return stored + max(head, max(layer_bytes(layer, "none") for layer in layers))
    return stored + head


def _in_flight_chunks(pp: int, rank: int, training: Training, microbatches: int) -> int:
    """Micro-batches whose activations a pipeline rank holds at its peak (per model chunk
    for the interleaved schedule): 1F1B starts ``pp - rank`` before its first backward
    (Narayanan et al. 2021, section 2.2); the interleaved schedule of Megatron-LM warms up
    ``2 (pp - rank - 1) + (v - 1) pp`` chunk-micro-batches, then holds one more."""
    v = training.chunks_per_stage
    if v == 1:
        return min(microbatches, pp - rank)
    return min(microbatches * v, 2 * (pp - rank - 1) + (v - 1) * pp + 1)


def _tp_local(weight: Weight, par: Parallelism) -> tuple[int, int]:
    """Rows and columns of one rank's part after tensor parallelism (etp and ep for
    experts, whose ``rows`` count every local expert)."""
    ways = par.etp if weight.experts else par.tp
    rows = -(-weight.rows // ways) if weight.split == "rows" else weight.rows
    cols = -(-weight.cols // ways) if weight.split == "cols" else weight.cols
    if weight.experts:
        rows *= -(-weight.experts // par.ep)
    return rows, cols


def _sharded(weight: Weight, par: Parallelism) -> int:
    rows, cols = _tp_local(weight, par)
    ways = par.efsdp if weight.experts else par.fsdp
    return -(-rows // ways) * cols
