"""What a pipeline schedule costs a rank: the chunk-micro-batches whose activations it holds
at its peak, the time it waits in a step, and the micro-batch counts a schedule cannot run.
Each order of ``meshconf.core.schedules`` has its formulas here (:data:`ORDERS`); a schedule's
row says which order it runs, where it places its chunks and how it groups micro-batches.

Pure Python. Formulas and sources in docs/plan.md ("Micro-batches in flight", "Step time").
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from meshconf.core.schedules import Order, PipelineSchedule
from meshconf.features.plan.estimate.step_inputs import Training


@dataclass(frozen=True)
class PassFlops:
    """FLOPs per token of one rank's passes over a micro-batch, as the schedule runs them:
    the forward pass, the backward pass for the inputs (what is recomputed included) and the
    backward pass for the weights, which zero-bubble schedules run apart."""

    forward: float
    backward_input: float
    backward_weight: float
    #: What the backward pass for the inputs runs again, which model FLOPs do not count.
    recomputed: float

    @property
    def total(self) -> float:
        return self.forward + self.backward_input + self.backward_weight


def round_size(pp: int, microbatches: int) -> int:
    """The micro-batches the interleaved schedule runs through every chunk before the next
    ones, as torch's ``ScheduleInterleaved1F1B`` groups them: ``m`` cut into ``m // pp``
    rounds (one when ``m < pp``); :func:`schedule_problem` says when they are not equal."""
    return microbatches // _rounds(pp, microbatches)


def _rounds(pp: int, microbatches: int) -> int:
    return max(1, microbatches // pp)


def _depth_first_in_flight(pp: int, rank: int, v: int, m: int, group: int | None) -> int:
    """1F1B starts ``pp - rank`` before its first backward (Narayanan et al. 2021, section
    2.2); over ``v`` looped chunks it warms up ``2 (pp - rank - 1) + (v - 1) g``
    chunk-micro-batches, then holds one more, where ``g`` is the micro-batches each chunk runs
    before the next chunk's: ``microbatch_group`` where given (Megatron-LM's
    ``--microbatch-group-size-per-virtual-pipeline-stage``), else torch's round
    (:func:`round_size`: ``pp`` when ``m`` is a multiple of ``pp``, Megatron-LM's default);
    Llama 3's schedule (The Llama 3 Herd of Models, section 3.3.2) runs the same order with
    ``g`` its ``N``, which may be below ``pp``: its warm-up is the same count."""
    if v == 1:
        return min(m, pp - rank)
    return min(m * v, 2 * (pp - rank - 1) + (v - 1) * (group or round_size(pp, m)) + 1)


def _breadth_first_in_flight(pp: int, rank: int, v: int, m: int, group: int | None) -> int:
    """GPipe runs every forward pass before the first backward (Huang et al. 2019), and
    LoopedBFS every forward pass of every chunk (Lamy-Poirier, "Breadth-First Pipeline
    Parallelism", arXiv:2211.05953; torch's ``ScheduleLoopedBFS``)."""
    return m * v


def _zero_bubble_v_in_flight(pp: int, rank: int, v: int, m: int, group: int | None) -> int:
    """ZBV runs ``2 (pp - rank) - 1`` forward passes of its first chunk and ``rank`` of each
    chunk before the first backward of its second chunk's first forward pass (torch's
    ``ScheduleZBVZeroBubble``; Qi et al. 2024, section 6: 1F1B's peak)."""
    return min(m, 2 * pp - rank - 1) + min(m, rank + 1)


def _overlapped_in_flight(pp: int, rank: int, v: int, m: int, group: int | None) -> int:
    """DualPipe holds ``S + 1`` of its ``S`` stages (the DeepSeek-V3 report, table 2: ``PP +
    1``), on every rank, of its chunks together: ``pp + 1`` mirrored (the order of DeepSeek's
    ``DualPipe.step``), ``2 pp + 1`` in a V (DualPipeV, ``2 pp`` stages)."""
    return min(v * m, v * pp + 1)


def _flush_bubble(pp: int, m: int, v: int, flops: PassFlops) -> float:
    """1F1B and GPipe: ``(pp - 1) / m``; over ``v`` looped chunks: ``(pp - 1) / (v m)``
    (Narayanan et al. 2021, section 2.2), as Llama 3's schedule states for any ``N`` (The
    Llama 3 Herd of Models, section 3.3.2), and with fewer micro-batches than ``pp``, which
    come back to the first rank before a round ends, ``(v (pp - m) + m - 1) / (v m)``: a
    micro-batch's ``v pp`` chunks one after the other, and one chunk for each other;
    LoopedBFS's is the same, for every count (the makespan of torch's
    ``ScheduleLoopedBFS``)."""
    if v > 1 and m < pp:
        return (v * (pp - m) + m - 1) / (v * m)
    return (pp - 1) / (v * m)


def _zero_bubble_v_bubble(pp: int, m: int, v: int, flops: PassFlops) -> float:
    """ZBV, with ``f``, ``b`` and ``w`` a chunk's forward pass and backward passes for the
    inputs and the weights (``w <= f <= b``: the backward pass for the inputs takes the
    attention's twice and what is recomputed): the makespan of torch's
    ``ScheduleZBVZeroBubble``, :func:`_zbv_wait` over ``2 m (f + b + w)``; from ``2 pp - 1``
    micro-batches on, ``(pp - 1) max(b, 2 (b - w))``."""
    f, b, w = flops.forward, flops.backward_input, flops.backward_weight
    return _zbv_wait(pp, m, f, b, w) / (2 * m * flops.total)


def _zbv_wait(pp: int, m: int, f: float, b: float, w: float) -> float:
    """How long a rank of torch's ``ScheduleZBVZeroBubble`` waits in a step: the longer of
    two chains its order makes. One is the backward passes for the inputs, ``pp - 1`` of them
    down the V, and between ``pp`` and ``2 pp - 1`` micro-batches one forward pass late on
    them; the other the passes for the weights that fill the bubble, ``2 (b - w)`` a rank,
    which leave ``2 w`` more for each micro-batch short of ``2 pp - 1`` (down to ``pp``) and
    ``2 f`` for each short of ``pp``. The makespan of torch's action lists is this exactly
    where ``b >= 2 w`` (most full recomputation, long sequences) and within 1% of the step
    otherwise (tests/test_plan_schedule.py)."""
    late = 2 * (b - f) if pp < m < 2 * pp - 1 else 0
    filled = 2 * w * max(0, 2 * pp - 1 - max(m, pp)) + 2 * f * max(0, pp - m)
    return max((pp - 1) * b + late, (pp - 1) * 2 * (b - w) + filled)


def _overlapped_bubble(pp: int, m: int, v: int, flops: PassFlops) -> float:
    """DualPipe over ``S`` stages: ``(S / 2 - 1) (F&B + B - 3 W)`` (the DeepSeek-V3 report,
    table 2), with ``F&B``, a forward and a backward pass overlapped, as long as both:
    ``f + 2 b - w``, over the ``v m (f + b + w)`` a rank computes: mirrored, ``S`` is ``pp``
    and each micro-batch passes one of the rank's two chunks (``v`` 1); in a V (DualPipeV),
    ``S`` is ``2 pp`` and each passes both."""
    f, b, w = flops.forward, flops.backward_input, flops.backward_weight
    return (pp * v / 2 - 1) * (f + 2 * b - w) / (v * m * flops.total)


def _overlapped_problem(pp: int, m: int, schedule: PipelineSchedule) -> str | None:
    """DualPipe sends half the micro-batches from each end, an even count of at least
    ``2 pp``; torch's ``ScheduleDualPipeV`` refuses fewer than ``2 pp``."""
    name = schedule.name
    if schedule.chunks == "mirror" and (m < 2 * pp or m % 2):
        return (
            f"{m} micro-batches a step for {name} over pp {pp}: it sends half of them "
            f"from each end, and needs an even count of at least {2 * pp}"
        )
    if schedule.chunks != "mirror" and m < 2 * pp:
        return (
            f"{m} micro-batches a step for {name} over pp {pp}: it needs at least {2 * pp}; "
            f"torch's {schedule.torch} runs no fewer"
        )
    return None


@dataclass(frozen=True)
class OrderCosts:
    """The formulas of one order, over ``pp`` ranks, ``m`` micro-batches a step and ``v``
    model chunks a rank (:meth:`~meshconf.core.schedules.PipelineSchedule.chunks_per_rank`)."""

    #: Chunk-micro-batches a rank holds at its peak: ``(pp, rank, v, m, microbatch_group)``.
    in_flight: Callable[[int, int, int, int, int | None], int]
    #: The time a rank waits in a step over the time it computes: ``(pp, m, v, flops)``.
    bubble: Callable[[int, int, int, PassFlops], float]
    #: Why the order cannot run ``m`` micro-batches over ``pp`` ranks, or None; None where
    #: it runs any count.
    problem: Callable[[int, int, PipelineSchedule], str | None] | None = None


ORDERS: Mapping[Order, OrderCosts] = {
    "depth_first": OrderCosts(_depth_first_in_flight, _flush_bubble),
    "breadth_first": OrderCosts(_breadth_first_in_flight, _flush_bubble),
    "zero_bubble_v": OrderCosts(_zero_bubble_v_in_flight, _zero_bubble_v_bubble),
    "overlapped": OrderCosts(_overlapped_in_flight, _overlapped_bubble, _overlapped_problem),
}


def in_flight_chunks(pp: int, rank: int, training: Training, microbatches: int) -> int:
    """Chunk-micro-batches whose activations a pipeline rank holds at its peak, from their
    forward pass until their backward pass for the weights ends (:data:`ORDERS`); without a
    pipeline the micro-batches accumulate one after the other."""
    v = training.chunks_per_stage
    if pp == 1:
        return v
    costs = ORDERS[training.pipeline_schedule.order]
    return costs.in_flight(pp, rank, v, microbatches, training.microbatch_group)


def bubble_fraction(pp: int, microbatches: int, training: Training, flops: PassFlops) -> float:
    """The time a rank waits in a step over the time it computes (:data:`ORDERS`); 0
    without a pipeline."""
    if pp == 1:
        return 0.0
    costs = ORDERS[training.pipeline_schedule.order]
    return costs.bubble(pp, microbatches, training.chunks_per_stage, flops)


def pipeline_ranks_problem(pp: int, training: Training) -> str | None:
    """Why the schedule cannot run over ``pp`` pipeline ranks, whatever the micro-batches, or
    None: mirrored, DeepSeek's ``DualPipe`` asserts an even number of ranks (``num_ranks % 2
    == 0`` in ``DualPipe.step``)."""
    schedule = training.pipeline_schedule
    if schedule.chunks == "mirror" and pp % 2 and pp > 1:
        return (
            f"{schedule.name} over pp {pp}: its two halves of the pipeline mirror each other, "
            "so pp must be even"
        )
    return None


def schedule_problem(pp: int, microbatches: int, training: Training) -> str | None:
    """Why the schedule cannot run (or the estimate cannot tell its step) over ``pp`` ranks
    with this many micro-batches a step, or None: its ranks (:func:`pipeline_ranks_problem`),
    its micro-batch groups, torch's rounds of unequal size (:func:`round_size`) and the
    counts its order refuses (:data:`ORDERS`)."""
    if pp == 1:
        return None
    schedule = training.pipeline_schedule
    m, group = microbatches, training.microbatch_group
    ranks = pipeline_ranks_problem(pp, training)
    if ranks is not None:
        return ranks
    if schedule.grouping == "pp_to_m" and group is not None:
        return _group_problem(pp, m, group)
    if schedule.grouping == "up_to_m" and group is not None:
        if group > m:
            return (
                f"microbatch_group {group} with {m} micro-batches a step: Llama 3's schedule "
                f"runs each model chunk on at most the step's {m} before the next"
            )
        return None
    rounds = _rounds(pp, m)
    if schedule.grouping is not None and m % rounds:
        return (
            f"{m} micro-batches a step for {schedule.name} over pp {pp}: torch's "
            f"Interleaved1F1B runs them in {rounds} rounds of equal size, which {m} is not a "
            "multiple of"
        )
    problem = ORDERS[schedule.order].problem
    return None if problem is None else problem(pp, m, schedule)


def _group_problem(pp: int, microbatches: int, group: int) -> str | None:
    """Megatron-LM's checks of its interleaved schedule's micro-batch groups: ``pp`` to
    ``m``, and a last group of at least ``pp``, so that no rank waits on its own chunk."""
    m = microbatches
    if not pp <= group <= m:
        return (
            f"microbatch_group {group} with {m} micro-batches a step over pp {pp}: Megatron-LM "
            f"runs each model chunk on {pp} to {m} micro-batches before the next"
        )
    if 0 < m % group < pp:
        return (
            f"microbatch_group {group} leaves a last group of {m % group} of the {m} "
            f"micro-batches a step, fewer than pp {pp}: Megatron-LM refuses it, as its ranks "
            "would wait on their own chunks"
        )
    return None
