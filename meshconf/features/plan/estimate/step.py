"""One layout's estimate: memory per rank, whether it fits, communication per dim, and the
time of a training step. Formulas and sources in docs/plan.md ("Step time")."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from meshconf.core.training import GIB
from meshconf.features.plan.estimate import activations
from meshconf.features.plan.estimate.architecture import (
    Architecture,
    GroupedQueryAttention,
    LayerKind,
)
from meshconf.features.plan.estimate.communication import (
    DimTraffic,
    StageWork,
    busiest_stage,
    overlapped_dims,
    traffic,
)
from meshconf.features.plan.estimate.memory import Memory, estimate_memory
from meshconf.features.plan.estimate.pipeline import split_problem
from meshconf.features.plan.estimate.schedule import (
    PassFlops,
    bubble_fraction,
    schedule_problem,
)
from meshconf.features.plan.estimate.training import Parallelism, Training, microbatches


@dataclass(frozen=True)
class Estimate:
    """Everything estimated for one layout. ``fits`` is false also when some pipeline
    chunk would hold no layer (``problem`` says so)."""

    memory: Memory
    fits: bool
    microbatches: int
    compute_seconds: float
    bubble_fraction: float
    traffic: Mapping[str, DimTraffic]
    step_seconds: float
    batch_tokens: int
    problem: str | None = None
    #: Communication not hidden behind compute: the dims that wait for it (tp, cp, ep, etp,
    #: pp), and what FSDP and replica traffic take beyond the compute they overlap.
    exposed_seconds: float = 0.0
    #: The fraction of peak the compute reaches: ``--mfu`` measured over the compute; over
    #: the step, what the compute must reach for the step to take ``F / (peak mfu)``, None
    #: when the bubble and the communication not hidden leave it no time (the step is then
    #: that at the peak).
    compute_mfu: float | None = None


def estimate(
    arch: Architecture,
    par: Parallelism,
    training: Training,
    crosses: Mapping[str, int],
    bandwidths: Sequence[float] = (),
) -> Estimate:
    """Memory, fit, communication and step time of ``par``; ``crosses`` says, per dim, how
    many levels its groups cross, and ``bandwidths`` the bandwidth at each count
    (:func:`~meshconf.features.plan.estimate.communication.traffic`)."""
    # the chunks per rank and the end chunks' layers, as this model gives them
    training, chunking = training.for_model(arch.layers, par.pp)
    memory = estimate_memory(arch, par, training)
    work = busiest_stage(arch, par, training)
    m = microbatches(par, training)
    flows = traffic(arch, par, training, crosses, work, bandwidths)
    passes = pass_flops(arch, par, training, work)
    at_peak = _flops(par, training, passes, m) / (training.peak_tflops * 1e12)
    bubble = bubble_fraction(par.pp, m, training, passes)
    hidden = overlapped_dims(training)
    exposed = sum(flow.seconds for flow in flows.values() if flow.name not in hidden)
    overlapped = sum(flow.seconds for flow in flows.values() if flow.name in hidden)
    compute = at_peak / training.mfu
    compute_mfu: float | None = training.mfu
    if training.mfu_over == "step":
        within = _compute_within(compute, exposed, overlapped, bubble)
        if within is not None and within >= at_peak:
            compute, compute_mfu = within, at_peak / within
        else:
            compute, compute_mfu = at_peak, None
    step = (compute + exposed) * (1 + bubble) + max(0.0, overlapped - compute)
    chunks = par.pp * training.chunks_per_stage
    problem = (
        chunking
        or split_problem(arch.layers, chunks, training.stage_ends)
        or schedule_problem(par.pp, m, training)
    )
    return Estimate(
        memory=memory,
        fits=problem is None and memory.total <= training.gpu_memory_gib * GIB,
        problem=problem,
        microbatches=m,
        compute_seconds=compute,
        bubble_fraction=bubble,
        traffic=flows,
        step_seconds=step,
        batch_tokens=m * par.batch * training.seq_len * training.micro_batch,
        exposed_seconds=exposed + max(0.0, overlapped - compute),
        compute_mfu=compute_mfu,
    )


def _compute_within(step: float, exposed: float, overlapped: float, bubble: float) -> float | None:
    """The longest compute time whose step (compute and exposed communication stretched by the
    bubble, plus the overlapped communication the compute does not cover) is at most
    ``step``; None if even no compute would take longer. The step grows with the compute, at
    ``1 + bubble`` per second where the compute covers the overlapped communication and at
    ``bubble`` where it does not."""
    covering = step / (1 + bubble) - exposed
    if covering >= overlapped:
        return covering
    if bubble == 0:
        return None
    short = (step - exposed * (1 + bubble) - overlapped) / bubble
    return short if short > 0 else None


def _flops(par: Parallelism, training: Training, passes: PassFlops, m: int) -> float:
    """FLOPs of one rank per step. These are the model's FLOPs, which published MFU counts;
    with ``mfu_counts`` "hardware", what is recomputed is counted too (8 N with full
    recomputation), as hardware FLOPs utilization is (PaLM, appendix B)."""
    tokens = m * training.micro_batch * training.seq_len // par.cp
    per_token = passes.total
    if training.mfu_counts == "model":
        per_token -= passes.recomputed
    return per_token * tokens


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
