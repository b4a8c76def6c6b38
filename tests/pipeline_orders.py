"""How long a step of torch's own pipeline schedules takes when each pass takes a given time.

``torch.distributed.pipelining``'s multi-chunk schedules build, on every rank, the list of
actions that rank runs in order (forward passes, backward passes for the inputs, for the
weights, or both, and DualPipeV's forward and backward passes overlapped). Here the lists
are torch's own, built by each schedule class's private ``_calculate_single_rank_operations``
on a stand-in holding only the counts it reads; no process group or stage is made. Each
action then starts once its rank is free and what it needs is done (a forward pass needs the
previous chunk's, a backward pass the next chunk's and its own forward pass, a backward pass
for the weights the one for the inputs), with no time to send anything, and the step ends
with the last action. Two actions overlapped take the time of both.
"""

from __future__ import annotations

from fractions import Fraction
from types import SimpleNamespace
from typing import Any

from torch.distributed.pipelining.schedules import (
    ScheduleDualPipeV,
    ScheduleInterleaved1F1B,
    ScheduleZBVZeroBubble,
    _ComputationType,
)

SCHEDULES: dict[str, Any] = {
    "interleaved": ScheduleInterleaved1F1B,
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
