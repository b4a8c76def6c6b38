"""``--pp-schedule dualpipe`` against DeepSeek's ``DualPipe`` (the ``dualpipe`` package) as it
runs: where each chunk runs, the micro-batches in flight and the activations and gradients
sent, measured on gloo processes; the bubble of a step, against the makespan of the order its
``step`` runs the passes in (tests/pipeline_orders.py), each pass taking the time the
estimate gives it for real models' shapes; and what a rank computes and holds."""

from __future__ import annotations

from dataclasses import replace
from fractions import Fraction
from functools import lru_cache
from pathlib import Path
from typing import Any

import pytest
import torch
from distributed import run_ranks
from pipeline_orders import dualpipe_step, held_at_peak, step_time
from test_plan_pipeline_gloo import one_layer_a_chunk
from test_plan_schedule import SETTINGS, _passes

from meshconf import DistributedContext, load_config
from meshconf.features.plan.estimate.communication import traffic
from meshconf.features.plan.estimate.memory import rank_memory
from meshconf.features.plan.estimate.pipeline import rank_stage, stage_layers
from meshconf.features.plan.estimate.presets import PRESETS
from meshconf.features.plan.estimate.schedule import (
    bubble_fraction,
    in_flight_chunks,
    schedule_problem,
)
from meshconf.features.plan.estimate.step import estimate
from meshconf.features.plan.estimate.step_inputs import Parallelism, Training
from meshconf.features.plan.estimate.work import busiest_stage

DUALPIPE = Training(schedule="dualpipe")


def _order(actions: list[Any]) -> list[tuple[Any, ...]]:
    return [
        (part.computation_type, part.stage_index, part.microbatch_index)
        for action in actions
        for part in action.sub_actions or (action,)
    ]


def test_each_rank_holds_its_chunk_and_a_copy_of_its_mirror_rank_s() -> None:
    # DualPipe's rank r runs stage r for the micro-batches that enter at the first rank, and
    # stage pp - 1 - r for those that enter at the last: both ends on the first and last rank
    assert stage_layers(8, 4, 1, placement="mirror") == [
        [[0, 1], [6, 7]],
        [[2, 3], [4, 5]],
        [[2, 3], [4, 5]],
        [[0, 1], [6, 7]],
    ]
    arch = PRESETS["llama3-8b"]
    ends = [rank_stage(arch, 4, 1, rank, placement="mirror") for rank in range(4)]
    assert [(stage.first, stage.last) for stage in ends] == [
        (True, True),
        (False, False),
        (False, False),
        (True, True),
    ]


def _dualpipe_on_gloo(rank: int, environ: dict[str, str], pp: int, m: int) -> None:
    config = load_config({"world_size": pp, "degrees": {"pp": pp}})
    with DistributedContext(config, environ=environ) as ctx:
        group = ctx.get_mesh("pp").get_group()
        sent = [0]
        actions = dualpipe_step(pp, rank, m, group, sent)
        assert held_at_peak(actions) == in_flight_chunks(pp, rank, DUALPIPE, m)
        # what the rank runs is what it runs standing in for itself, alone
        assert _order(actions) == _order(dualpipe_step(pp, rank, m))
        most = torch.tensor([sent[0]])
        torch.distributed.all_reduce(most, torch.distributed.ReduceOp.MAX, group=group)
        arch, resolved = one_layer_a_chunk(pp, 1, m, DUALPIPE)
        work = busiest_stage(arch, Parallelism(pp=pp), resolved)
        estimated = traffic(arch, Parallelism(pp=pp), resolved, {}, work)["pp"].bytes
        # the estimate's pp traffic also sums the two copies' fp32 gradients, once a step
        assert int(most) + work.dense_elements * 4 == estimated


@pytest.mark.parametrize(("pp", "m"), [(2, 4), (2, 6), (4, 8), (4, 12)])
def test_the_micro_batches_in_flight_and_the_pp_traffic_are_dualpipe_s(pp: int, m: int) -> None:
    """On every rank, ``pp + 1`` chunk-micro-batches at most (the DeepSeek-V3 report, table
    2); the busiest rank sends an activation and a gradient a micro-batch, one with pp 2."""
    run_ranks(_dualpipe_on_gloo, pp, pp, m)


@lru_cache(maxsize=64)
def _orders(pp: int, m: int) -> tuple[tuple[Any, ...], ...]:
    return tuple(tuple(dualpipe_step(pp, rank, m)) for rank in range(pp))


@pytest.mark.parametrize(("model", "checkpointing", "seq_len", "tp"), SETTINGS)
def test_the_dualpipe_bubble_is_never_below_dualpipe_s_and_within_4_percent_of_the_step(
    model: str, checkpointing: str, seq_len: int, tp: int
) -> None:
    """The DeepSeek-V3 report's ``(PP/2 - 1) (F&B + B - 3W)``: never less than DualPipe's
    order waits, and more by at most 4% of its step (3.4% at most, at pp 4 with the fewest
    micro-batches; nothing at pp 2)."""
    for pp in (2, 4, 8):
        training, passes = _passes(model, checkpointing, seq_len, tp, pp, "dualpipe")
        times = [
            Fraction(passes.forward),
            Fraction(passes.backward_input),
            Fraction(passes.backward_weight),
        ]
        for m in (2 * pp, 2 * pp + 2, 4 * pp, 16 * pp):
            lists = [list(actions) for actions in _orders(pp, m)]
            step = step_time(lists, pp, *times)
            compute = m * sum(times)
            simulated = float((step - compute) / compute)
            estimated = bubble_fraction(pp, m, training, passes)
            assert estimated >= simulated - 1e-12, (pp, m)
            assert estimated - simulated <= 0.04 * float(step / compute), (pp, m)


@pytest.mark.parametrize(
    ("pp", "m", "problem"),
    [
        (4, 8, None),
        (4, 10, None),
        (1, 1, None),
        (3, 6, "dualpipe over pp 3: its two halves of the pipeline mirror each other, so pp "
         "must be even"),
        (4, 6, "6 micro-batches a step for dualpipe over pp 4: it sends half of them from each "
         "end, and needs an even count of at least 8"),
        (4, 9, "9 micro-batches a step for dualpipe over pp 4: it sends half of them from each "
         "end, and needs an even count of at least 8"),
    ],
)  # fmt: skip
def test_what_dualpipe_cannot_run_is_said(pp: int, m: int, problem: str | None) -> None:
    assert schedule_problem(pp, m, DUALPIPE) == problem


def test_a_rank_computes_what_1f1b_s_does_and_holds_two_stages() -> None:
    # each micro-batch passes through one of a rank's two chunks: 1F1B's compute, twice its
    # weights (the DeepSeek-V3 report, table 2: 2x parameters). The middle stages are the
    # larger, so that the busiest rank holds neither end under either schedule.
    arch, par = PRESETS["llama3-8b"], Parallelism(pp=4)
    one_f_one_b = Training(global_batch_tokens=32 * 8192, first_stage_layers=6, last_stage_layers=6)
    mirrored = replace(one_f_one_b, schedule="dualpipe")
    found, usual = estimate(arch, par, mirrored, {}), estimate(arch, par, one_f_one_b, {})
    assert found.compute_seconds == pytest.approx(usual.compute_seconds, rel=1e-12)
    assert found.problem is None

    def params(training: Training, rank: int) -> int:
        stage = rank_stage(arch, 4, 1, rank, training.stage_ends, training.placement)
        return rank_memory(arch, par, training, stage).params

    for rank in range(4):
        assert params(mirrored, rank) == params(one_f_one_b, rank) + params(one_f_one_b, 3 - rank)
    # without a pipeline no schedule runs: one copy, every micro-batch through it
    alone, usual = (
        estimate(arch, Parallelism(), mirrored, {}),
        estimate(arch, Parallelism(), one_f_one_b, {}),
    )
    assert (alone.compute_seconds, alone.memory) == (usual.compute_seconds, usual.memory)


def test_show_explains_dualpipe_s_copies_and_its_source(run_cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    config = tmp_path / "dualpipe.yaml"
    config.write_text(
        "world_size: 64\ndegrees: {pp: 4, tp: 8, dp_replicate: 2}\n"
        "training: {pp_schedule: dualpipe}\n"
    )
    shown = run_cli("show", str(config), "--model", "llama3-8b", "--explain")
    assert shown.returncode == 0, shown.stderr
    assert "stored by the blocks of 5 chunk-micro-batches in flight" in shown.stdout
    assert "the rank's weights, its chunk and a copy of its mirror rank's, after tp" in shown.stdout
    assert "dualpipe: the DeepSeek-V3 report, table 2, DeepSeek's DualPipe" in shown.stdout
