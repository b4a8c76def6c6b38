"""1F1B, the interleaved schedule and Llama 3's against Megatron-Core's own code, read from the
installed megatron-core by tests/megatron_code.py:

- the micro-batches in flight against its count of each rank's warm-up forward passes
  (``get_pp_rank_microbatches``): a rank holds its warm-up passes and the one forward pass of
  its first 1F1B step, or every pass when all of them are warm-up; with the experts'
  all-to-all overlapped, one more warm-up pass and none beside;
- the interleaved schedule's bubble against the makespan of the order its ranks run their
  passes in: the warm-up forward passes, then one forward and one backward pass at a time,
  then the remaining backward passes, each in the order of its schedule table
  (``get_schedule_table``), with each pass starting once its rank is free and the pass it
  needs is done (tests/pipeline_orders.py's ``step_time``).

Megatron-Core runs each model chunk on a group of micro-batches before the next chunk
(``--microbatch-group-size-per-virtual-pipeline-stage``, ``pp`` by default): every group it
accepts is checked, and the ones it refuses are refused by the estimate too. Its checks are
inline in ``forward_backward_pipelining_with_interleaving``, which needs a process group and
CUDA to run: ``_accepted`` writes them out, and a test finds them, as written there, in the
installed source."""

from __future__ import annotations

import itertools
import json
from fractions import Fraction
from pathlib import Path
from types import SimpleNamespace

import pytest
from megatron_code import get_pp_rank_microbatches, get_schedule_table, source
from pipeline_orders import FORWARD, FULL, held_at_peak, step_time

from meshconf.features.plan.estimate.schedule import (
    PassFlops,
    bubble_fraction,
    in_flight_chunks,
    schedule_problem,
)
from meshconf.features.plan.estimate.step_inputs import Training


def _warm_up(
    pp: int, rank: int, chunks: int, microbatches: int, group: int, overlap: bool = False
) -> tuple[int, ...]:
    """Megatron-Core's (total passes, all of them warm-up, warm-up passes, the rest), with
    or without the experts' all-to-all overlapped."""
    communicator = SimpleNamespace(
        pp_group=SimpleNamespace(size=lambda: pp, rank=lambda: rank),
        virtual_pipeline_model_parallel_size=chunks if chunks > 1 else None,
    )
    return tuple(
        get_pp_rank_microbatches(
            microbatches,
            chunks,
            group,
            overlap_moe_expert_parallel_comm=overlap,
            p2p_communicator=communicator,
        )
    )


def _megatron_in_flight(pp: int, rank: int, chunks: int, microbatches: int, group: int) -> int:
    total, all_warm_up, warm_up, _ = _warm_up(pp, rank, chunks, microbatches, group)
    return total if all_warm_up else warm_up + 1


def _megatron_orders(pp: int, chunks: int, microbatches: int, group: int) -> list[list[object]]:
    """Each rank's passes in the order Megatron-Core's interleaved schedule runs them; chunk
    ``c`` of rank ``r`` is stage ``c pp + r``, and the backward passes take the chunks in
    reverse."""
    table = get_schedule_table(microbatches, chunks, group)
    orders = []
    for rank in range(pp):
        total, _, warm_up, steady = _warm_up(pp, rank, chunks, microbatches, group)

        def forward(index: int, rank: int = rank) -> object:
            microbatch, chunk = table[index]
            return SimpleNamespace(
                computation_type=FORWARD,
                stage_index=chunk * pp + rank,
                microbatch_index=microbatch,
                sub_actions=None,
            )

        def backward(index: int, rank: int = rank) -> object:
            microbatch, chunk = table[index]
            return SimpleNamespace(
                computation_type=FULL,
                stage_index=(chunks - 1 - chunk) * pp + rank,
                microbatch_index=microbatch,
                sub_actions=None,
            )

        passes = [forward(index) for index in range(warm_up)]
        for index in range(steady):
            passes += [forward(warm_up + index), backward(index)]
        passes += [backward(index) for index in range(steady, total)]
        orders.append(passes)
    return orders


def _accepted(pp: int, microbatches: int, group: int) -> bool:
    """Whether Megatron-Core's interleaved schedule runs these counts."""
    last = microbatches % group
    return pp <= group <= microbatches and not 0 < last < pp


def test_the_groups_accepted_are_the_ones_megatron_core_checks_for() -> None:
    checks = " ".join(source("megatron/core/pipeline_parallel/schedules.py").split())
    assert (
        "config.microbatch_group_size_per_vp_stage > num_microbatches or "
        "config.microbatch_group_size_per_vp_stage < pipeline_parallel_size ): "
    ) in checks
    assert (
        "final_microbatch_group_size = num_microbatches % "
        "config.microbatch_group_size_per_vp_stage if 0 < final_microbatch_group_size < "
        "pipeline_parallel_size:"
    ) in checks


@pytest.mark.parametrize("pp", range(2, 9))
def test_1f1b_holds_what_megatron_core_warms_up_and_one_more(pp: int) -> None:
    training = Training(schedule="1f1b")
    for microbatches, rank in itertools.product(range(1, 4 * pp + 2), range(pp)):
        assert in_flight_chunks(pp, rank, training, microbatches) == _megatron_in_flight(
            pp, rank, 1, microbatches, pp
        ), (rank, microbatches)


@pytest.mark.parametrize("pp", range(2, 9))
@pytest.mark.parametrize("chunks", [2, 3, 4, 8])
def test_interleaved_holds_what_megatron_core_warms_up_and_one_more(pp: int, chunks: int) -> None:
    default = Training(schedule="interleaved", virtual_stages=chunks)
    for microbatches in range(pp, 4 * pp + 1):
        for group in range(1, microbatches + 2):
            grouped = Training(
                schedule="interleaved", virtual_stages=chunks, microbatch_group=group
            )
            accepted = _accepted(pp, microbatches, group)
            assert (schedule_problem(pp, microbatches, grouped) is None) == accepted
            if not accepted:
                continue
            for rank in range(pp):
                expected = _megatron_in_flight(pp, rank, chunks, microbatches, group)
                assert in_flight_chunks(pp, rank, grouped, microbatches) == expected
                if microbatches % pp == 0 and group == pp:  # Megatron-Core's default
                    assert in_flight_chunks(pp, rank, default, microbatches) == expected


@pytest.mark.parametrize("pp", range(2, 9))
def test_with_the_experts_overlapped_megatron_core_holds_as_many(pp: int) -> None:
    """``--overlap-moe-expert-parallel-comm`` warms up one more forward pass, then runs each
    forward pass together with a backward pass, layer by layer: the one frees what the other
    takes, so a rank holds its warm-up passes at the peak, as many as without the overlap."""
    for chunks, microbatches in itertools.product([2, 3, 4], range(pp, 4 * pp + 1, pp)):
        training = Training(schedule="interleaved", virtual_stages=chunks, ep_overlap=True)
        for rank in range(pp):
            total, all_warm_up, warm_up, _ = _warm_up(
                pp, rank, chunks, microbatches, pp, overlap=True
            )
            held = total if all_warm_up else warm_up
            assert in_flight_chunks(pp, rank, training, microbatches) == held


@pytest.mark.parametrize("pp", [2, 3, 4, 5])
@pytest.mark.parametrize("chunks", [2, 3, 4])
def test_the_interleaved_bubble_is_the_makespan_of_megatron_core_s_order(
    pp: int, chunks: int
) -> None:
    """Forward and backward passes in the ratios of full checkpointing, none, and two
    others; the order's held chunk-micro-batches are the in-flight count again."""
    for forward, backward in [(1, 3), (1, 2), (1, 1), (3, 1)]:
        flops = PassFlops(float(forward), float(backward), 0.0, 0.0)
        for microbatches in range(pp, 3 * pp + 1):
            for group in range(pp, microbatches + 1):
                if not _accepted(pp, microbatches, group):
                    continue
                training = Training(
                    schedule="interleaved", virtual_stages=chunks, microbatch_group=group
                )
                orders = _megatron_orders(pp, chunks, microbatches, group)
                makespan = step_time(
                    orders, pp * chunks, Fraction(forward), Fraction(backward), Fraction(0)
                )
                compute = microbatches * chunks * (forward + backward)
                bubble = bubble_fraction(pp, microbatches, training, flops)
                assert makespan / compute - 1 == pytest.approx(bubble, abs=1e-12)
                held = [held_at_peak(order) for order in orders]
                assert held == [
                    in_flight_chunks(pp, rank, training, microbatches) for rank in range(pp)
                ]


# --- the option, as users give it -----------------------------------------------------------

#: Llama 3 8B over pp 4, 2 chunks a rank, 16 micro-batches a step.
LAYOUT = (
    "--world-size", "64", "--gpus-per-node", "8", "--model", "llama3-8b", "--pp", "4", "--tp",
    "8", "--dp-replicate", "2", "--pp-schedule", "interleaved", "--virtual-stages", "2",
    "--global-batch-tokens", "262144",
)  # fmt: skip


def _row(run_cli, *extra: str) -> dict[str, object]:  # type: ignore[no-untyped-def]
    result = run_cli("plan", *LAYOUT, *extra, "--format", "json")
    assert result.returncode == 0, result.stderr
    (row,) = json.loads(result.stdout)["assignments"]
    return row  # type: ignore[no-any-return]


def test_a_larger_group_holds_more_in_flight_and_waits_as_long(run_cli) -> None:  # type: ignore[no-untyped-def]
    default, grouped = _row(run_cli), _row(run_cli, "--microbatch-group", "8")
    assert grouped["memory_pp_rank"] == default["memory_pp_rank"] == 3
    assert grouped["memory_gib"]["activations"] > default["memory_gib"]["activations"]
    assert grouped["bubble_fraction"] == default["bubble_fraction"] == 0.0938  # 3 / 32
    # Megatron-LM's default group is pp, as torch's rounds are when pp divides m
    assert _row(run_cli, "--microbatch-group", "4") == default
    explained = run_cli("plan", *LAYOUT, "--microbatch-group", "8", "--explain", "1").stdout
    # the last rank holds 2 (4 - 3 - 1) + (2 - 1) g + 1 chunk-micro-batches: 9 with g = 8
    assert "interleaved x2 in groups of 8 micro-batches;" in explained
    assert "stored by the blocks of 9 chunk-micro-batches in flight" in explained
    assert "micro-batch groups: Megatron-Core's get_pp_rank_microbatches" in explained


def test_a_group_needs_the_interleaved_schedule(run_cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    result = run_cli("plan", "--world-size", "8", "--model", "llama3-8b", "--microbatch-group", "8")
    assert (result.returncode, result.stdout) == (2, "")
    assert result.stderr == (
        "meshconf: error: --microbatch-group needs --pp-schedule interleaved or llama3: no "
        "other schedule groups the micro-batches of a model chunk\n"
    )
    path = tmp_path / "mesh.yaml"
    path.write_text(
        "world_size: 64\ndegrees: {pp: 4, dp_shard: -1}\ntraining:\n  pp_schedule: loopedbfs\n"
        "  virtual_stages: 2\n  microbatch_group: 8\n"
    )
    result = run_cli("validate", str(path))
    assert result.returncode == 1
    assert result.stdout == (
        f"{path}:6:3: training.microbatch_group: microbatch_group needs pp_schedule "
        "interleaved or llama3: no other schedule groups the micro-batches of a model chunk\n"
    )


@pytest.mark.parametrize(
    ("group", "problem"),
    [
        ("3", "microbatch_group 3 with 16 micro-batches a step over pp 4: Megatron-LM runs each "
         "model chunk on 4 to 16 micro-batches before the next"),
        ("17", "microbatch_group 17 with 16 micro-batches a step over pp 4: Megatron-LM runs "
         "each model chunk on 4 to 16 micro-batches before the next"),
        ("7", "microbatch_group 7 leaves a last group of 2 of the 16 micro-batches a step, "
         "fewer than pp 4: Megatron-LM refuses it, as its ranks would wait on their own "
         "chunks"),
    ],
)  # fmt: skip
def test_a_group_megatron_refuses_does_not_fit_and_says_why(  # type: ignore[no-untyped-def]
    run_cli, group: str, problem: str
) -> None:
    row = _row(run_cli, "--microbatch-group", group)
    assert (row["fits"], row["problem"]) == (False, problem)


# --- Llama 3's schedule -----------------------------------------------------------------------


@pytest.mark.parametrize("pp", [2, 3, 4, 5])
@pytest.mark.parametrize("chunks", [2, 3, 4])
def test_llama3_with_groups_of_pp_or_more_is_megatron_core_s_order(pp: int, chunks: int) -> None:
    """Where Megatron-Core takes the group, Llama 3's schedule is its order: the same
    chunk-micro-batches in flight on every rank and the makespan of that order."""
    flops = PassFlops(1.0, 2.0, 0.0, 0.0)
    for microbatches in range(pp, 3 * pp + 1):
        for group in range(pp, microbatches + 1):
            if not _accepted(pp, microbatches, group):
                continue
            training = Training(schedule="llama3", virtual_stages=chunks, microbatch_group=group)
            assert schedule_problem(pp, microbatches, training) is None
            orders = _megatron_orders(pp, chunks, microbatches, group)
            makespan = step_time(orders, pp * chunks, Fraction(1), Fraction(2), Fraction(0))
            bubble = bubble_fraction(pp, microbatches, training, flops)
            assert makespan / (microbatches * chunks * 3) - 1 == pytest.approx(bubble, abs=1e-12)
            assert [held_at_peak(order) for order in orders] == [
                in_flight_chunks(pp, rank, training, microbatches) for rank in range(pp)
            ]


@pytest.mark.parametrize("pp", [4, 8, 16])
def test_llama3_below_pp_holds_its_warm_up_and_waits_what_the_paper_states(pp: int) -> None:
    """Groups of fewer than pp micro-batches, which Megatron-Core refuses: each rank holds
    the warm-up forward passes Megatron-Core counts for such a group (2 (pp - rank - 1) +
    (v - 1) N) and the one its first 1F1B step runs; the bubble is the paper's (pp - 1) /
    (v m) (The Llama 3 Herd of Models, section 3.3.2)."""
    chunks = 4
    for microbatches in range(pp, 4 * pp + 1, 3):
        for group in range(1, pp):
            training = Training(schedule="llama3", virtual_stages=chunks, microbatch_group=group)
            assert schedule_problem(pp, microbatches, training) is None
            for rank in range(pp):
                assert in_flight_chunks(pp, rank, training, microbatches) == _megatron_in_flight(
                    pp, rank, chunks, microbatches, group
                )
            flops = PassFlops(1.0, 2.0, 0.0, 0.0)
            expected = (pp - 1) / (chunks * microbatches)
            assert bubble_fraction(pp, microbatches, training, flops) == pytest.approx(expected)


def test_llama3_s_own_layout_holds_66_chunk_micro_batches_where_megatron_s_holds_143() -> None:
    """Llama 3 405B on 8,192 GPUs: pp 16, 8 chunks a rank, 32 micro-batches a step; rank 0
    warms up 2 x 15 + 7 N forward passes and runs one more."""
    for group, held in [(5, 66), (16, 143)]:
        training = Training(schedule="llama3", virtual_stages=8, microbatch_group=group)
        assert in_flight_chunks(16, 0, training, 32) == held


def test_a_llama3_group_above_the_step_s_micro_batches_does_not_fit_and_says_why(  # type: ignore[no-untyped-def]
    run_cli,
) -> None:
    llama3 = ["--pp-schedule", "llama3"]
    row = _row(run_cli, *llama3, "--microbatch-group", "17")
    assert (row["fits"], row["problem"]) == (
        False,
        "microbatch_group 17 with 16 micro-batches a step: Llama 3's schedule runs each model "
        "chunk on at most the step's 16 before the next",
    )
    # 3 is below pp 4: refused by Megatron-LM's schedule, run by Llama 3's
    row = _row(run_cli, *llama3, "--microbatch-group", "3")
    assert (row["fits"], row["problem"]) == (True, None)
    assert row["bubble_fraction"] == 0.0938  # 3 / 32, as the paper states
