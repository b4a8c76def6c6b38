"""One layout's estimate: memory per rank, whether it fits, communication per dim, and the
time of a training step. Formulas and sources in docs/plan.md ("Step time")."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from meshconf.core.setting_values import GIB
from meshconf.features.plan.estimate.architecture import Architecture
from meshconf.features.plan.estimate.communication import DimTraffic, overlapped_dims, traffic
from meshconf.features.plan.estimate.gpu_overheads import Runtime, runtime_memory
from meshconf.features.plan.estimate.memory import Memory, estimate_memory
from meshconf.features.plan.estimate.pipeline import split_problem
from meshconf.features.plan.estimate.schedule import bubble_fraction, schedule_problem
from meshconf.features.plan.estimate.step_inputs import Parallelism, Training, microbatches
from meshconf.features.plan.estimate.work import busiest_stage, pass_flops, step_flops


@dataclass(frozen=True)
class Estimate:
    """Everything estimated for one layout. ``fits`` is false also when some pipeline
    chunk would hold no layer (``problem`` says so)."""

    memory: Memory
    fits: bool
    #: Bytes the GPU has left beside ``memory``; negative when it does not hold it.
    headroom: float
    microbatches: int
    compute_seconds: float
    bubble_fraction: float
    traffic: Mapping[str, DimTraffic]
    step_seconds: float
    batch_tokens: int
    #: The runtime terms in ``memory.runtime``, by term.
    runtime: Runtime
    problem: str | None = None
    #: Communication not hidden behind compute: the dims that wait for it (tp, cp, ep, etp,
    #: pp), and what FSDP and replica traffic take beyond the compute they overlap.
    exposed_seconds: float = 0.0
    #: The fraction of peak the compute reaches: ``--mfu`` measured over the compute; over
    #: the step, what the compute must reach for the step to take ``F / (peak mfu)``, None
    #: when the bubble and the communication not hidden leave it no time (the step is then
    #: that at the peak).
    compute_mfu: float | None = None

    def tokens_per_second_per_gpu(self, world: int) -> float:
        """What the layout delivers: the step's tokens (``batch_tokens``, as the layout runs
        them, whether or not they are the batch asked for) over the step time and the
        ``world`` GPUs that run it."""
        return self.batch_tokens / self.step_seconds / world


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
    work = busiest_stage(arch, par, training)
    m = microbatches(par, training)
    flows = traffic(arch, par, training, crosses, work, bandwidths)
    tensors = estimate_memory(arch, par, training)
    groups = {name: flow.size for name, flow in flows.items()}
    runtime = runtime_memory(training, groups, tensors.training_state)
    memory = replace(tensors, runtime=runtime.total)
    passes = pass_flops(arch, par, training, work)
    at_peak = float(step_flops(arch, par, training, work, m)) / (training.peak_tflops * 1e12)
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
    headroom = training.gpu_memory_gib * GIB - memory.total
    return Estimate(
        memory=memory,
        fits=problem is None and headroom >= 0,
        headroom=headroom,
        problem=problem,
        microbatches=m,
        compute_seconds=compute,
        bubble_fraction=bubble,
        traffic=flows,
        step_seconds=step,
        batch_tokens=m * par.batch * training.seq_len * training.micro_batch,
        exposed_seconds=exposed + max(0.0, overlapped - compute),
        compute_mfu=compute_mfu,
        runtime=runtime,
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
