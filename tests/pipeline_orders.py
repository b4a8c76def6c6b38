"""How long a step of torch's own pipeline schedules, and of DeepSeek's DualPipe, takes when
each pass takes a given time.

``torch.distributed.pipelining``'s multi-chunk schedules build, on every rank, the list of
actions that rank runs in order (forward passes, backward passes for the inputs, for the
weights, or both, and DualPipeV's forward and backward passes overlapped). Here the lists
are torch's own, built by each schedule class's private ``_calculate_single_rank_operations``
on a stand-in holding only the counts it reads; no process group or stage is made. Each
action then starts once its rank is free and what it needs is done (a forward pass needs the
previous chunk's, a backward pass the next chunk's and its own forward pass, a backward pass
for the weights the one for the inputs), with no time to send anything, and the step ends
with the last action. Two actions overlapped take the time of both.

DualPipe's actions are recorded as its ``step`` runs them (:func:`dualpipe_step`), from the
``dualpipe`` package: on gloo processes, or each rank in this one process, what it would
receive made where it is received.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import ExitStack
from fractions import Fraction
from types import SimpleNamespace
from typing import Any
from unittest import mock

import torch
from torch.distributed.pipelining.schedules import (
    ScheduleDualPipeV,
    ScheduleInterleaved1F1B,
    ScheduleLoopedBFS,
    ScheduleZBVZeroBubble,
    _ComputationType,
)

SCHEDULES: dict[str, Any] = {
    "interleaved": ScheduleInterleaved1F1B,
    "loopedbfs": ScheduleLoopedBFS,
    "zbv": ScheduleZBVZeroBubble,
    "dualpipev": ScheduleDualPipeV,
}
FORWARD = _ComputationType.FORWARD
INPUT = _ComputationType.BACKWARD_INPUT
WEIGHT = _ComputationType.BACKWARD_WEIGHT
FULL = _ComputationType.FULL_BACKWARD
OVERLAP = _ComputationType.OVERLAP_F_B


def action_lists(
    schedule: str, pp: int, chunks_per_rank: int, microbatches: int
) -> list[list[Any]]:
    """Each rank's actions, as torch's schedule class builds them."""
    stages = pp * chunks_per_rank
    rounds = max(1, microbatches // pp)
    counts = SimpleNamespace(
        pp_group_size=pp,
        _n_microbatches=microbatches,
        n_local_stages=chunks_per_rank,
        _stages=[None] * chunks_per_rank,
        num_stages=stages,
        _num_stages=stages,
        number_of_rounds=rounds,
        microbatches_per_round=microbatches // rounds,
    )
    build = SCHEDULES[schedule]._calculate_single_rank_operations
    return [[action for action in build(counts, rank) if action is not None] for rank in range(pp)]


def step_time(
    lists: list[list[Any]],
    stages: int,
    forward: Fraction,
    backward_input: Fraction,
    weight: Fraction,
) -> Fraction:
    """When the last action of any rank ends."""
    durations = {FORWARD: forward, INPUT: backward_input, WEIGHT: weight}
    durations[FULL] = backward_input + weight
    done: dict[tuple[str, int, int], Fraction] = {}
    free = [Fraction(0)] * len(lists)
    position = [0] * len(lists)

    def needs(action: Any) -> list[tuple[str, int, int]]:
        stage, microbatch = action.stage_index, action.microbatch_index
        if action.computation_type == FORWARD:
            return [("F", stage - 1, microbatch)] if stage > 0 else []
        if action.computation_type == WEIGHT:
            return [("I", stage, microbatch)]
        later = [("I", stage + 1, microbatch)] if stage < stages - 1 else []
        return [("F", stage, microbatch), *later]

    def finish(action: Any, end: Fraction) -> None:
        kind = action.computation_type
        stage, microbatch = action.stage_index, action.microbatch_index
        if kind == FORWARD:
            done["F", stage, microbatch] = end
        if kind in (INPUT, FULL):
            done["I", stage, microbatch] = end
        if kind in (WEIGHT, FULL):
            done["W", stage, microbatch] = end

    moved = True
    while moved:
        moved = False
        for rank, actions in enumerate(lists):
            while position[rank] < len(actions):
                action = actions[position[rank]]
                parts = action.sub_actions if action.computation_type == OVERLAP else (action,)
                waits = [need for part in parts for need in needs(part)]
                if any(need not in done for need in waits):
                    break
                start = max([free[rank], *(done[need] for need in waits)])
                end = start + sum(durations[part.computation_type] for part in parts)
                for part in parts:
                    finish(part, end)
                free[rank], position[rank] = end, position[rank] + 1
                moved = True
    assert position == [len(actions) for actions in lists], "the schedule does not finish"
    return max(free)


#: The width of the one-layer stages the pipeline tests run, and of what they send.
STAGE_WIDTH = 4


def dualpipe_step(
    pp: int, rank: int, microbatches: int, group: Any = None, sent: list[int] | None = None
) -> list[Any]:
    """Run rank ``rank``'s ``DualPipe.step`` over ``microbatches`` micro-batches, and return
    its actions in the order it ran them. The rank holds one-layer stages on the CPU: stage
    ``rank`` for the micro-batches that enter at the first rank, and a copy of stage
    ``pp - 1 - rank`` for those that enter at the last. The package asks CUDA for its device
    and makes what it receives there: both are pointed at the CPU. Over ``group`` it sends
    and receives, adding the bytes it sends to ``sent[0]``; without one, what the rank would
    receive is made where it is received and nothing is sent."""
    import dualpipe.comm as comm
    from dualpipe import DualPipe

    def made() -> list[torch.Tensor]:
        shapes = comm.TENSOR_SHAPES
        return [torch.zeros(shape, dtype=comm.TENSOR_DTYPE, requires_grad=True) for shape in shapes]

    def received(ops: list[Any], peer: int, over: Any) -> list[torch.Tensor]:
        return made()

    sending, standing_in = comm.append_isend, group is None

    def send(ops: list[Any], tensors: list[torch.Tensor], peer: int, over: Any) -> None:
        if sent is not None:
            sent[0] += sum(tensor.numel() * tensor.element_size() for tensor in tensors)
        if not standing_in:
            sending(ops, tensors, peer, over)

    with ExitStack() as patches:
        patches.enter_context(mock.patch("torch.cuda.current_device", return_value="cpu"))
        patches.enter_context(mock.patch.object(comm, "build_from_tensor_shapes", made))
        patches.enter_context(mock.patch.object(comm, "append_isend", send))
        if standing_in:
            patches.enter_context(mock.patch.object(comm, "append_irecv", received))
            group = SimpleNamespace(size=lambda: pp, rank=lambda: rank)
        comm.set_p2p_tensor_shapes([(1, STAGE_WIDTH)])
        comm.set_p2p_tensor_dtype(torch.float32)
        torch.manual_seed(rank)
        stages = tuple(torch.nn.Linear(STAGE_WIDTH, STAGE_WIDTH) for _ in range(2))
        pipe = DualPipe(stages, process_group=group)
        actions = _recorded(pipe, pp, rank, microbatches)
        ends = rank in (0, pp - 1)
        half = [torch.randn(microbatches // 2, STAGE_WIDTH)] if ends else []
        loss: Callable[..., torch.Tensor] | None = torch.nn.functional.mse_loss if ends else None
        pipe.step(*half, num_chunks=microbatches, criterion=loss, labels=list(half))
    return actions


def _recorded(pipe: Any, pp: int, rank: int, microbatches: int) -> list[Any]:
    """The list ``pipe``'s passes are recorded in as they run: a forward pass, a backward
    pass (for the inputs alone when its weights' pass comes later, in the order DualPipe
    queues them), and a forward and a backward pass that DualPipe runs together."""
    actions: list[Any] = []
    later: list[Any] = []
    together: list[Any] | None = None
    forward, backward = pipe._forward_compute_chunk, pipe._backward_compute_chunk
    both, weight = pipe._forward_backward_compute_chunk, pipe._weight_chunk

    def action(kind: Any, phase: int, counts: list[int]) -> Any:
        # phase 0 runs the stage of the micro-batches that enter at the first rank on the
        # first half of the ranks, the copy on the second half
        direction = phase ^ pipe.is_in_second_half
        return SimpleNamespace(
            computation_type=kind,
            stage_index=rank if direction == 0 else pp - 1 - rank,
            microbatch_index=counts[direction] + direction * (microbatches // 2),
            sub_actions=(),
        )

    def record(found: Any) -> None:
        (actions if together is None else together).append(found)

    def recorded_forward(phase: int) -> None:
        record(action(FORWARD, phase, pipe.current_f_chunk_id))
        forward(phase)

    def recorded_backward(phase: int, enable_zb: bool = False) -> None:
        found = action(INPUT if enable_zb else FULL, phase, pipe.current_b_chunk_id)
        if enable_zb:
            later.append(found)
        record(found)
        backward(phase, enable_zb)

    def recorded_both(phase0: int, phase1: int) -> None:
        nonlocal together
        together = []
        both(phase0, phase1)
        actions.append(SimpleNamespace(computation_type=OVERLAP, sub_actions=tuple(together)))
        together = None

    def recorded_weight() -> None:
        done = later.pop(0)
        actions.append(SimpleNamespace(**{**vars(done), "computation_type": WEIGHT}))
        weight()

    pipe._forward_compute_chunk, pipe._backward_compute_chunk = recorded_forward, recorded_backward
    pipe._forward_backward_compute_chunk, pipe._weight_chunk = recorded_both, recorded_weight
    return actions


def held_at_peak(actions: list[Any]) -> int:
    """The most chunk-micro-batches a rank holds activations for: from a forward pass until
    the backward pass ends (for the weights, where it runs apart)."""
    held = most = 0
    for action in actions:
        for part in action.sub_actions or (action,):
            if part.computation_type == FORWARD:
                held += 1
                most = max(most, held)
            elif part.computation_type in (FULL, WEIGHT):
                held -= 1
    assert held == 0, "a forward pass with no backward pass"
    return most
