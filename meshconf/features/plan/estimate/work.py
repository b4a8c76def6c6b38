"""What a pipeline rank runs per micro-batch, and the FLOPs of its passes: the rank the
pipeline's pace is set by (the most FLOPs), its layers and weights, and the FLOPs per token of
its forward pass and its backward passes for the inputs and for the weights.

Pure Python. Formulas and sources in docs/plan.md ("Step time").
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from meshconf.core.training import Checkpointing, Ends
from meshconf.features.plan.estimate import activations
from meshconf.features.plan.estimate.architecture import (
    Architecture,
    GroupedQueryAttention,
    LayerKind,
)
from meshconf.features.plan.estimate.pipeline import Placement, RankStage, rank_stages
from meshconf.features.plan.estimate.schedule import PassFlops
from meshconf.features.plan.estimate.sizing import block_split, linear_split, unsharded
from meshconf.features.plan.estimate.training import Parallelism, Training, recomputed_blocks


@dataclass(frozen=True)
class StageWork:
    """What a pipeline rank runs: its layers (mixture-of-experts ones counted apart) and its
    weights after tp/ep/etp, dense and expert."""

    layers: int
    moe_layers: int
    dense_elements: int
    expert_elements: int
    lookup_elements: int
    #: Of ``dense_elements``: the blocks' dense linear weights (gathered in fp8 with
    #: ``fp8_param_gather``).
    linear_elements: int
    #: Of ``layers``: those the backward pass recomputes whole.
    recomputed_layers: int
    #: Of ``dense_elements``: the final norm's and the output's, which no recomputation runs
    #: again.
    output_elements: int


def busiest_stage(arch: Architecture, par: Parallelism, training: Training) -> StageWork:
    """The pipeline rank with the most FLOPs a micro-batch (:func:`pass_flops`; the first
    such rank), whose pace the pipeline runs at: the most layers, or the output's product
    with fewer; ``training`` resolved for the model (:meth:`Training.for_model`)."""
    # only tp, ep and etp split the weights before FSDP: rows share the stages
    split = Parallelism(pp=par.pp, tp=par.tp, ep=par.ep, etp=par.etp)
    works = _stage_works(
        arch,
        split,
        training.chunks_per_stage,
        training.stage_ends,
        (training.checkpointing, training.checkpoint_every, training.checkpoint_first),
        training.placement,
    )
    return max(works, key=lambda work: pass_flops(arch, par, training, work).total)


@lru_cache(maxsize=4096)
def _stage_works(
    arch: Architecture,
    par: Parallelism,
    chunks_per_stage: int,
    ends: Ends,
    recomputation: tuple[Checkpointing, int | None, int | None],
    placement: Placement,
) -> tuple[StageWork, ...]:
    """What each candidate rank (:func:`rank_stages`) runs, in rank order."""
    return tuple(
        stage_work(arch, par, stage, recomputation)
        for stage in rank_stages(arch, par.pp, chunks_per_stage, ends, placement)
    )


def stage_work(
    arch: Architecture,
    par: Parallelism,
    stage: RankStage,
    recomputation: tuple[Checkpointing, int | None, int | None],
) -> StageWork:
    """What pipeline rank ``stage`` runs, its blocks recomputed as ``recomputation`` (the
    checkpointing mode, every N-th block, the first N) says."""
    layers = stage.layers
    dense = expert = linear = 0
    for kind, count in layers.items():
        if count:
            block_dense, block_experts = block_split(arch, kind, par)
            dense += count * block_dense
            expert += count * block_experts
            linear += count * linear_split(arch, kind, par)[0]
    lookup = unsharded(arch.embedding_weights(), par) if stage.first else 0
    output = unsharded(arch.output_weights(), par) if stage.last else 0
    dense += lookup + output
    recomputed = sum(map(sum, recomputed_blocks(stage.chunk_sizes, *recomputation)))
    return StageWork(
        sum(layers.values()), layers["moe"], dense, expert, lookup, linear, recomputed, output
    )


def pass_flops(
    arch: Architecture, par: Parallelism, training: Training, work: StageWork
) -> PassFlops:
    """FLOPs per token of one rank's passes: ``2 N`` a pass for the weights it applies
    (Kaplan et al. 2020: ``6 N`` in all) and ``2 s`` per attention dim for the scores and
    their use, twice that backward (PaLM, Chowdhery et al. 2022, appendix B), split by tp.
    The backward pass for the inputs also runs what is recomputed: full recomputation's
    forward pass of its blocks, and the products ``selective`` runs again
    (:func:`activations.recomputed_weights`). Mirrored (DualPipe), half of the rank's
    chunks' work: each micro-batch passes through one of them."""
    # the embedding is a look-up, not a matrix product
    active = work.dense_elements - work.lookup_elements + _active_experts(arch, work, par)
    attention = arch.attention
    if isinstance(attention, GroupedQueryAttention):
        width = 2 * attention.heads * attention.head_dim
    else:
        qk = attention.qk_nope_head_dim + attention.qk_rope_head_dim
        width = attention.heads * (qk + attention.v_head_dim)
    weights = 2 * active
    scores = 2 * training.seq_len * width * work.layers / par.tp
    # the blocks' forward pass, which the final norm and the output are not part of
    blocks = weights - 2 * work.output_elements + scores
    recomputed = (work.recomputed_layers / work.layers if work.layers else 0) * blocks
    if training.checkpointing == "selective":
        layers: dict[LayerKind, int] = {
            "dense": work.layers - work.moe_layers,
            "moe": work.moe_layers,
        }
        for kind, count in layers.items():
            if count:
                recomputed += (
                    2 * count * activations.recomputed_weights(arch, kind, par.tp, par.etp)
                )
    # mirrored, a micro-batch passes through one of the rank's two chunks
    share = training.chunk_share(par.pp)
    return PassFlops(
        share * (weights + scores),
        share * (weights + 2 * scores + recomputed),
        share * weights,
        share * recomputed,
    )


def _active_experts(arch: Architecture, work: StageWork, par: Parallelism) -> float:
    """The expert weights one token passes through, per rank: ``top_k`` of the routed ones,
    whose work ep spreads evenly over its ranks."""
    experts = arch.experts
    if experts is None or not work.moe_layers:
        return 0.0
    return work.expert_elements * par.ep * experts.top_k / experts.routed
