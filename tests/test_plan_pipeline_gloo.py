"""The micro-batches in flight that the estimate holds activations for, against torch's own
pipeline schedules run for real: on ``pp`` gloo processes, over meshconf's ``pp`` mesh,
``torch.distributed.pipelining``'s ``Schedule1F1B``, ``ScheduleInterleaved1F1B``,
``ScheduleLoopedBFS``, ``ScheduleGPipe``, ``ScheduleZBVZeroBubble`` and
``ScheduleDualPipeV`` run a step of small stages, each rank's chunks where meshconf places
them. Each rank counts, over its model chunks, the chunk-micro-batches whose forward pass
the schedule has run and whose backward pass (for the weights, where the schedule runs it
apart) has not ended; the most at any time, on every rank, equals the estimate's in-flight
count: ``pp - rank`` for 1F1B, ``2 (pp - rank - 1) + (v - 1) g + 1`` interleaved with
rounds of ``g`` micro-batches (``pp`` when ``m`` is a multiple of it), never more than the
step runs; every micro-batch for GPipe, and of every chunk for LoopedBFS; ``min(m, 2 pp -
rank - 1) + min(m, rank + 1)`` for ZBV; ``2 pp + 1`` for DualPipeV. Each rank also adds up
the bytes its chunks send to other ranks (activations forward, gradients backward); the most
any rank sends is the estimate's ``pp`` traffic for a model of the test's width: two a chunk
and micro-batch on a rank that holds neither end, fewer with pp 2 and in a V."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

import pytest
import torch
from distributed import run_ranks
from pipeline_orders import STAGE_WIDTH as WIDTH

from meshconf import DistributedContext, load_config
from meshconf.core.schedules import SCHEDULE_BY_NAME
from meshconf.features.plan.estimate.architecture import Architecture, GroupedQueryAttention
from meshconf.features.plan.estimate.communication import traffic
from meshconf.features.plan.estimate.pipeline import chunk_ids, rank_of_chunk
from meshconf.features.plan.estimate.schedule import in_flight_chunks
from meshconf.features.plan.estimate.step_inputs import Parallelism, Training
from meshconf.features.plan.estimate.work import busiest_stage


class _Counter:
    """Chunk-micro-batches whose forward pass ran and whose backward pass has not ended,
    and the most there were at once."""

    def __init__(self) -> None:
        self.now = 0
        self.most = 0
        self.sent = 0


def _counted(stage: Any, counter: _Counter) -> Any:
    """The stage, its schedule's forward and backward passes of one chunk-micro-batch
    counted (not the stage's own forward pass that infers the shapes it sends). A backward
    pass for the inputs alone keeps the graph, and what it saved, for the one for the
    weights."""
    forward, backward = stage.forward_one_chunk, stage.backward_one_chunk
    weight = stage.backward_weight_one_chunk

    def counted_forward(*args: Any, **kwargs: Any) -> Any:
        counter.now += 1
        counter.most = max(counter.most, counter.now)
        return forward(*args, **kwargs)

    def counted_backward(*args: Any, **kwargs: Any) -> Any:
        if kwargs.get("full_backward", True):
            counter.now -= 1
        return backward(*args, **kwargs)

    def counted_weight(*args: Any, **kwargs: Any) -> Any:
        counter.now -= 1
        return weight(*args, **kwargs)

    def counted_sends(ops: Callable[[int], list[Any]]) -> Callable[[int], list[Any]]:
        def sends(chunk: int) -> list[Any]:
            found = ops(chunk)
            counter.sent += sum(op.tensor.numel() * op.tensor.element_size() for op in found)
            return found

        return sends

    stage.forward_one_chunk, stage.backward_one_chunk = counted_forward, counted_backward
    stage.backward_weight_one_chunk = counted_weight
    stage.get_fwd_send_ops = counted_sends(stage.get_fwd_send_ops)
    stage.get_bwd_send_ops = counted_sends(stage.get_bwd_send_ops)
    return stage


def _most_in_flight(
    rank: int, environ: dict[str, str], schedule_name: str, pp: int, virtual: int, m: int
) -> None:
    from torch.distributed.pipelining import (
        PipelineStage,
        Schedule1F1B,
        ScheduleDualPipeV,
        ScheduleGPipe,
        ScheduleInterleaved1F1B,
        ScheduleLoopedBFS,
        ScheduleZBVZeroBubble,
    )

    placement = SCHEDULE_BY_NAME[schedule_name].placement

    config = load_config({"world_size": pp, "degrees": {"pp": pp}})
    with DistributedContext(config, environ=environ) as ctx:
        group = ctx.get_mesh("pp").get_group()
        counter = _Counter()
        stages = [
            _counted(
                PipelineStage(
                    torch.nn.Linear(WIDTH, WIDTH), chunk, pp * virtual, "cpu", group=group
                ),
                counter,
            )
            for chunk in chunk_ids(pp, virtual, rank, placement)
        ]

        def loss(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
            return torch.nn.functional.mse_loss(output, target)

        schedule: Any
        multi = {
            "interleaved": ScheduleInterleaved1F1B,
            "loopedbfs": ScheduleLoopedBFS,
            "zbv": ScheduleZBVZeroBubble,
            "dualpipev": ScheduleDualPipeV,
        }
        if schedule_name in multi:
            schedule = multi[schedule_name](stages, m, loss_fn=loss)
        else:
            single = {"1f1b": Schedule1F1B, "gpipe": ScheduleGPipe}[schedule_name]
            schedule = single(stages[0], m, loss_fn=loss)
        torch.manual_seed(0)
        inputs, target = torch.randn(m, WIDTH), torch.randn(m, WIDTH)
        last = rank_of_chunk(pp, pp * virtual - 1, placement)
        kwargs: dict[str, Any] = {"target": target, "losses": []} if rank == last else {}
        schedule.step(*([inputs] if rank == 0 else []), **kwargs)
        assert counter.now == 0  # every backward pass ran
        training = Training(schedule=schedule_name, virtual_stages=virtual)  # type: ignore[arg-type]
        assert counter.most == in_flight_chunks(pp, rank, training, m), (rank, counter.most)
        sent = torch.tensor([counter.sent])
        torch.distributed.all_reduce(sent, torch.distributed.ReduceOp.MAX, group=group)
        assert int(sent) == _pp_traffic(pp, virtual, m, training), int(sent)


def one_layer_a_chunk(
    pp: int, virtual: int, m: int, training: Training
) -> tuple[Architecture, Training]:
    """The test's model as the estimate sees it: a layer a chunk of the stages' width, one
    fp32 row a micro-batch; and ``training`` resolved for it."""
    arch = Architecture(
        "linear", pp * virtual, WIDTH, WIDTH, WIDTH, GroupedQueryAttention(1, 1, WIDTH)
    )
    one_row = replace(training, seq_len=1, param_dtype="fp32", global_batch_tokens=m)
    return arch, one_row.for_model(arch.layers, pp)[0]


def _pp_traffic(pp: int, virtual: int, m: int, training: Training) -> int:
    """The estimate's ``pp`` bytes for the test's model (:func:`one_layer_a_chunk`)."""
    arch, resolved = one_layer_a_chunk(pp, virtual, m, training)
    par = Parallelism(pp=pp)
    return traffic(arch, par, resolved, {}, busiest_stage(arch, par, resolved))["pp"].bytes


@pytest.mark.parametrize(
    ("schedule", "pp", "virtual", "m"),
    [
        ("1f1b", 2, 1, 4),
        ("1f1b", 4, 1, 8),
        ("1f1b", 3, 1, 5),
        ("interleaved", 2, 2, 4),
        ("interleaved", 4, 2, 8),
        ("interleaved", 4, 2, 4),
        ("interleaved", 2, 3, 6),
        # rounds of m // (m // pp) micro-batches when m is not a multiple of pp, or below it
        ("interleaved", 4, 2, 7),
        ("interleaved", 4, 2, 10),
        ("interleaved", 4, 2, 3),
        ("interleaved", 3, 3, 4),
        ("loopedbfs", 2, 2, 4),
        ("loopedbfs", 3, 2, 2),
        ("gpipe", 2, 1, 4),
        ("gpipe", 3, 1, 5),
        ("zbv", 2, 2, 2),
        ("zbv", 3, 2, 3),
        ("zbv", 4, 2, 4),
        ("zbv", 3, 2, 9),
        ("dualpipev", 2, 2, 4),
        ("dualpipev", 3, 2, 7),
        ("dualpipev", 4, 2, 8),
    ],
)
def test_the_micro_batches_in_flight_are_torch_s_schedules(
    schedule: str, pp: int, virtual: int, m: int
) -> None:
    run_ranks(_most_in_flight, pp, schedule, pp, virtual, m)
