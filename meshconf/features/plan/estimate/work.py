"""What a pipeline rank runs per micro-batch, and the FLOPs it does: per token of each pass,
and per step.

Pure Python. Formulas and sources in docs/plan.md ("Step time").
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from functools import lru_cache

from meshconf.core.schedules import Placement
from meshconf.core.setting_values import Checkpointing, Ends
from meshconf.features.plan.estimate import activations
from meshconf.features.plan.estimate.architecture import (
    Architecture,
    GroupedQueryAttention,
    LayerKind,
)
from meshconf.features.plan.estimate.pipeline import KINDS, RankStage, rank_stage, rank_stages
from meshconf.features.plan.estimate.schedule import PassFlops
from meshconf.features.plan.estimate.sizing import block_split, end_weights, linear_split, unsharded
from meshconf.features.plan.estimate.step_inputs import (
    Parallelism,
    Training,
    microbatches,
    recomputed_blocks,
)


@dataclass(frozen=True)
class StageWork:
    """What a pipeline rank runs: its layers (mixture-of-experts ones counted apart), those
    recomputed, whether it runs the output, and its weights after tp/ep/etp, dense (the
    embedding and the output included) and expert, as its collectives move them."""

    layers: int
    moe_layers: int
    dense_elements: int
    expert_elements: int
    #: Of ``dense_elements``: the blocks' dense linear weights (gathered in fp8 with
    #: ``fp8_param_gather``).
    linear_elements: int
    #: Of ``layers``: those the backward pass recomputes whole.
    recomputed_layers: int
    #: Of ``recomputed_layers``: those with experts.
    recomputed_moe_layers: int
    #: Whether the rank runs the final norm and the output.
    last: bool


def busiest_stage(arch: Architecture, par: Parallelism, training: Training) -> StageWork:
    """The pipeline rank with the most FLOPs a micro-batch (:func:`pass_flops`; the first
    such rank), whose pace the pipeline runs at: the most layers, or the output's product
    with fewer; ``training`` resolved for the model (:meth:`Training.for_model`)."""
    # only tp, ep and etp split the weights before FSDP: rows share the stages
    split = Parallelism(pp=par.pp, tp=par.tp, ep=par.ep, etp=par.etp)
    v, ends, placement = training.chunks_per_stage, training.stage_ends, training.placement
    works = _stage_works(arch, split, v, ends, _recomputation(training), placement)
    return max(works, key=lambda work: group_passes(arch, training, work).total)


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


def _recomputation(training: Training) -> tuple[Checkpointing, int | None, int | None]:
    return (training.checkpointing, training.checkpoint_every, training.checkpoint_first)


def stage_work(
    arch: Architecture,
    par: Parallelism,
    stage: RankStage,
    recomputation: tuple[Checkpointing, int | None, int | None],
) -> StageWork:
    """What pipeline rank ``stage`` runs, its blocks recomputed as ``recomputation`` says."""
    layers = stage.layers
    dense = expert = linear = 0
    for kind, count in layers.items():
        if count:
            block_dense, block_experts = block_split(arch, kind, par)
            dense += count * block_dense
            expert += count * block_experts
            linear += count * linear_split(arch, kind, par)[0]
    dense += unsharded(end_weights(arch, stage.first, stage.last), par)
    chunks = recomputed_blocks(stage.chunk_sizes, *recomputation)
    recomputed = {kind: sum(chunk[index] for chunk in chunks) for index, kind in enumerate(KINDS)}
    return StageWork(
        layers=sum(layers.values()),
        moe_layers=layers["moe"],
        dense_elements=dense,
        expert_elements=expert,
        linear_elements=linear,
        recomputed_layers=sum(recomputed.values()),
        recomputed_moe_layers=recomputed["moe"],
        last=stage.last,
    )


@dataclass(frozen=True)
class GroupPasses:
    """FLOPs per token of the passes a pipeline rank's tp group runs over a micro-batch, all
    its ranks together: integers, the same for every layout of the stage."""

    forward: int
    backward_input: int
    backward_weight: int
    #: What the backward pass for the inputs runs again, which model FLOPs do not count.
    recomputed: int

    @property
    def total(self) -> int:
        return self.forward + self.backward_input + self.backward_weight

    def counted(self, training: Training) -> int:
        """What ``--mfu-counts`` counts: the model's FLOPs, which a published MFU counts, or
        with ``hardware`` what is recomputed too (8 N with full recomputation), as hardware
        FLOPs utilization is (PaLM, appendix B)."""
        return self.total - (self.recomputed if training.mfu_counts == "model" else 0)


def pass_flops(
    arch: Architecture, par: Parallelism, training: Training, work: StageWork
) -> PassFlops:
    """FLOPs per token of one rank's passes (per token of its tp group's micro-batch): its
    share, ``1 / tp``, of its group's (:func:`group_passes`). Mirrored (DualPipe), half of
    the rank's chunks' work: each micro-batch passes through one of them."""
    group = group_passes(arch, training, work)
    share = training.chunk_share(par.pp) / par.tp
    counts = (group.forward, group.backward_input, group.backward_weight, group.recomputed)
    return PassFlops(*(share * count for count in counts))


def step_flops(
    arch: Architecture, par: Parallelism, training: Training, work: StageWork, microbatches: int
) -> Fraction:
    """FLOPs of one rank of pipeline rank ``work`` per step, exact, as ``--mfu-counts``
    counts them: its share of its group's passes (:func:`pass_flops`) over the tokens of the
    ``microbatches`` micro-batches its tp group runs, ``1 / cp`` of each sequence;
    ``training`` resolved for the model (:meth:`Training.for_model`). Raises nothing."""
    group = group_passes(arch, training, work).counted(training)
    tokens = microbatches * training.micro_batch * training.seq_len
    share = Fraction(training.chunk_share(par.pp))
    return share * Fraction(group * tokens, par.tp * par.cp)


def pipeline_flops(
    arch: Architecture, par: Parallelism, training: Training
) -> tuple[Fraction, ...]:
    """FLOPs per step of one rank of each pipeline rank, in rank order (each stands for the
    ``world / pp`` ranks of its stage, which do the same), as :func:`step_flops`: summed over
    the world, the model's FLOPs per token times the step's tokens. Raises nothing."""
    resolved, _ = training.for_model(arch.layers, par.pp)
    m = microbatches(par, resolved)
    recomputation = _recomputation(resolved)
    v, ends, placement = resolved.chunks_per_stage, resolved.stage_ends, resolved.placement
    stages = (rank_stage(arch, par.pp, v, rank, ends, placement) for rank in range(par.pp))
    return tuple(
        step_flops(arch, par, resolved, stage_work(arch, par, stage, recomputation), m)
        for stage in stages
    )


def group_passes(arch: Architecture, training: Training, work: StageWork) -> GroupPasses:
    """FLOPs per token of the passes a pipeline rank's tp group runs: ``2 N`` a pass for the
    weights a token passes through (Kaplan et al. 2020: ``6 N`` in all; ``top_k`` of the
    routed experts; the output projection, which a tied model runs with the embedding's
    weights; not the embedding, a look-up) and ``2 s`` per attention dim for the scores and
    their use, twice that backward (PaLM, Chowdhery et al. 2022, appendix B). The backward
    pass for the inputs also runs what is recomputed: full recomputation's forward pass of
    its blocks, and the products ``selective`` or ``norms-latent-swiglu`` runs again
    (:func:`activations.recomputed_weights`; the norms and the SwiGLU that
    ``norms-latent-swiglu`` recomputes besides are element-wise, no products).

    The group's ranks share every term evenly (docs/plan.md, "Step time"): weights tp splits
    over all the group's tokens, the ones it does not (norms, the router, latent attention's
    down-projections) over the ``1 / tp`` of the tokens sequence parallelism leaves each
    rank (Megatron-LM), the scores by head, the routed experts as ep and etp place them:
    tokens spread evenly over the ep group, each expert's weights over etp, and the group's
    tokens split over its ranks where etp is 1."""
    return _group_passes(arch, training.seq_len, training.checkpointing, work)


@lru_cache(maxsize=4096)
def _group_passes(
    arch: Architecture, seq_len: int, checkpointing: Checkpointing, work: StageWork
) -> GroupPasses:
    """:func:`group_passes`, once per stage (asked for each candidate rank, twice)."""
    scores = _scores(arch, seq_len)
    layers: dict[LayerKind, int] = {"dense": work.layers - work.moe_layers, "moe": work.moe_layers}
    recomputed_layers: dict[LayerKind, int] = {
        "dense": work.recomputed_layers - work.recomputed_moe_layers,
        "moe": work.recomputed_moe_layers,
    }
    weights = 2 * _output_elements(arch) if work.last else 0
    recomputed = 0
    for kind in KINDS:
        if not layers[kind]:
            continue
        block = 2 * arch.active_elements(kind)
        weights += layers[kind] * block
        # the blocks' forward pass, which the final norm and the output are not part of
        recomputed += recomputed_layers[kind] * (block + scores)
        recomputed += 2 * layers[kind] * activations.recomputed_weights(arch, kind, checkpointing)
    attention = work.layers * scores
    return GroupPasses(
        weights + attention, weights + 2 * attention + recomputed, weights, recomputed
    )


def _output_elements(arch: Architecture) -> int:
    """Weight elements a token passes through after the blocks: the final norm and the
    output projection, the embedding's with tied embeddings."""
    tied = (
        sum(weight.elements for weight in arch.embedding_weights()) if arch.tied_embeddings else 0
    )
    return sum(weight.elements for weight in arch.output_weights()) + tied


def _scores(arch: Architecture, seq_len: int) -> int:
    """FLOPs per token of one block's attention scores and their use, forward: ``2 s`` per
    attention dim, ``W = 2 a d`` (latent: ``a (nope + rope + v)``)."""
    attention = arch.attention
    if isinstance(attention, GroupedQueryAttention):
        width = 2 * attention.heads * attention.head_dim
    else:
        qk = attention.qk_nope_head_dim + attention.qk_rope_head_dim
        width = attention.heads * (qk + attention.v_head_dim)
    return 2 * seq_len * width
