"""The pipeline schedules' terms against torch's own schedules: where each chunk runs
(torch's stage-to-rank mappings), and the bubble of a step, against the makespan of the
action lists torch's ``ScheduleInterleaved1F1B``, ``ScheduleZBVZeroBubble`` and
``ScheduleDualPipeV`` build (tests/pipeline_orders.py), with each pass taking the time the
estimate gives it for real models' shapes. The micro-batches in flight are measured on gloo
processes in tests/test_plan_pipeline_gloo.py."""

from __future__ import annotations

from dataclasses import replace
from fractions import Fraction
from pathlib import Path

import pytest
from pipeline_orders import action_lists, step_time
from test_plan_model import SMALL_MOE, SPLITS
from torch.distributed.pipelining.schedules import generate_rank_to_stage_mapping

from meshconf.features.plan.estimate.architecture import Architecture
from meshconf.features.plan.estimate.memory import estimate_memory, rank_memory
from meshconf.features.plan.estimate.pipeline import (
    chunk_ids,
    rank_of_chunk,
    rank_stage,
    stage_layers,
)
from meshconf.features.plan.estimate.presets import PRESETS
from meshconf.features.plan.estimate.schedule import (
    PassFlops,
    bubble_fraction,
    schedule_problem,
)
from meshconf.features.plan.estimate.step import estimate
from meshconf.features.plan.estimate.step_inputs import Parallelism, Training
from meshconf.features.plan.estimate.work import busiest_stage, pass_flops


@pytest.mark.parametrize("pp", range(1, 9))
@pytest.mark.parametrize(("style", "chunks"), [("loop", 1), ("loop", 2), ("loop", 3), ("v", 2)])
def test_each_chunk_runs_where_torch_places_it(pp: int, style: str, chunks: int) -> None:
    torch_s = generate_rank_to_stage_mapping(pp, pp * chunks, style=style)
    placement = "v" if style == "v" else "rounds"
    for rank in range(pp):
        ours = list(chunk_ids(pp, chunks, rank, placement))
        assert ours == sorted(torch_s[rank])
        assert [rank_of_chunk(pp, chunk, placement) for chunk in ours] == [rank] * chunks


def test_in_a_v_the_first_rank_holds_both_ends() -> None:
    # 10 layers in 6 chunks, the middle ones larger: rank 0 runs the first and the last
    assert stage_layers(10, 3, 2, placement="v") == [
        [[0], [9]],
        [[1, 2], [7, 8]],
        [[3, 4], [5, 6]],
    ]
    first = estimate(PRESETS["llama3-8b"], Parallelism(pp=4), Training(schedule="zbv"), {})
    assert first.memory.pp_rank == 0


#: Real shapes and settings whose passes take the times the estimate gives them.
SETTINGS = [
    (model, checkpointing, seq_len, tp)
    for model in ("llama3-8b", "deepseek-v3")
    for checkpointing in ("none", "selective", "full")
    for seq_len in (2048, 131072)
    for tp in (1, 8)
]


def _passes(
    model: str, checkpointing: str, seq_len: int, tp: int, pp: int, schedule: str, virtual: int = 1
) -> tuple[Training, PassFlops]:
    arch, par = PRESETS[model], Parallelism(pp=pp, tp=tp)
    training, _ = Training(
        schedule=schedule,  # type: ignore[arg-type]
        virtual_stages=virtual,
        checkpointing=checkpointing,  # type: ignore[arg-type]
        seq_len=seq_len,
    ).for_model(arch.layers, pp)
    return training, pass_flops(arch, par, training, busiest_stage(arch, par, training))


def _simulated(
    schedule: str, pp: int, m: int, passes: PassFlops, chunks: int = 2
) -> tuple[Fraction, Fraction]:
    """The bubble of torch's schedule as a fraction of the compute, and the step over the
    compute."""
    times = [
        Fraction(passes.forward),
        Fraction(passes.backward_input),
        Fraction(passes.backward_weight),
    ]
    step = step_time(action_lists(schedule, pp, chunks, m), chunks * pp, *times)
    compute = chunks * m * sum(times)
    return (step - compute) / compute, step / compute


@pytest.mark.parametrize(("model", "checkpointing", "seq_len", "tp"), SETTINGS)
def test_the_zbv_bubble_is_torch_s_schedule_s(
    model: str, checkpointing: str, seq_len: int, tp: int
) -> None:
    """From 2 pp - 1 micro-batches on, ``(pp - 1) max(b, 2 (b - w)) / (2 m (f + b + w))``,
    exactly; with fewer, exactly where ``b >= 2 w`` and within 1% of the step otherwise."""
    for pp in (2, 3, 4, 8):
        training, passes = _passes(model, checkpointing, seq_len, tp, pp, "zbv")
        f, b, w = passes.forward, passes.backward_input, passes.backward_weight
        assert w <= f <= b
        for m in (*range(1, 2 * pp), 3 * pp, 4 * pp + 1, 16 * pp):
            simulated, step = _simulated("zbv", pp, m, passes)
            estimated = bubble_fraction(pp, m, training, passes)
            if m >= 2 * pp - 1 or b >= 2 * w:
                assert estimated == pytest.approx(float(simulated), rel=1e-9), m
            else:
                assert abs(estimated - float(simulated)) <= 0.01 * float(step), m


@pytest.mark.parametrize(("model", "checkpointing", "seq_len", "tp"), SETTINGS)
def test_the_dualpipev_bubble_is_never_below_torch_s_and_within_4_percent_of_the_step(
    model: str, checkpointing: str, seq_len: int, tp: int
) -> None:
    """The DeepSeek-V3 report's ``(PP/2 - 1) (F&B + B - 3W)`` over ``PP = 2 pp`` stages:
    never less than torch's DualPipeV waits, and more by at most 4% of its step (most at
    pp 2 and 2 pp micro-batches)."""
    for pp in (2, 3, 4, 8):
        training, passes = _passes(model, checkpointing, seq_len, tp, pp, "dualpipev")
        for m in (2 * pp, 3 * pp, 4 * pp + 1, 16 * pp):
            simulated, step = _simulated("dualpipev", pp, m, passes)
            estimated = bubble_fraction(pp, m, training, passes)
            assert estimated >= float(simulated) - 1e-12
            assert estimated - float(simulated) <= 0.04 * float(step)


@pytest.mark.parametrize(("model", "checkpointing", "seq_len", "tp"), SETTINGS[:6])
def test_the_interleaved_bubble_is_torch_s_schedule_s(
    model: str, checkpointing: str, seq_len: int, tp: int
) -> None:
    """``(pp - 1) / (v m)`` (Narayanan et al. 2021), whatever the passes take, and with fewer
    micro-batches than pp, ``(v (pp - m) + m - 1) / (v m)``; for every count torch runs."""
    for pp, virtual in ((2, 2), (3, 2), (4, 2), (3, 3)):
        training, passes = _passes(model, checkpointing, seq_len, tp, pp, "interleaved", virtual)
        for m in range(1, 4 * pp + 2):
            if schedule_problem(pp, m, training) is not None:
                continue
            simulated, _ = _simulated("interleaved", pp, m, passes, virtual)
            assert bubble_fraction(pp, m, training, passes) == pytest.approx(
                float(simulated), rel=1e-9
            )


def test_the_loopedbfs_bubble_is_the_interleaved_one_and_torch_s() -> None:
    """Every forward pass of every chunk, then every backward pass: torch's
    ``ScheduleLoopedBFS`` waits as long as the interleaved schedule, for every count and
    whatever the passes take."""
    for pp, virtual in ((2, 2), (3, 2), (4, 3), (8, 2)):
        looped = Training(schedule="loopedbfs", virtual_stages=virtual)
        interleaved = replace(looped, schedule="interleaved")
        for m in range(1, 4 * pp + 2):
            for forward, backward in ((1, 1), (1, 2), (2, 3)):
                passes = PassFlops(forward, backward, 0, 0)
                simulated, _ = _simulated("loopedbfs", pp, m, passes, virtual)
                estimated = bubble_fraction(pp, m, looped, passes)
                assert estimated == pytest.approx(float(simulated), rel=1e-12), (pp, m)
                if schedule_problem(pp, m, interleaved) is None:
                    assert estimated == bubble_fraction(pp, m, interleaved, passes)


@pytest.mark.parametrize(
    ("schedule", "pp", "m", "problem"),
    [
        ("dualpipev", 4, 7, "7 micro-batches a step for dualpipev over pp 4: it needs at least 8; "
         "torch's DualPipeV runs no fewer"),
        ("dualpipev", 4, 8, None),
        ("zbv", 4, 1, None),
        ("dualpipev", 1, 1, None),
        ("interleaved", 4, 1, None),
        ("interleaved", 4, 10, None),
        ("interleaved", 4, 9, "9 micro-batches a step for interleaved over pp 4: torch's "
         "Interleaved1F1B runs them in 2 rounds of equal size, which 9 is not a multiple of"),
    ],
)  # fmt: skip
def test_micro_batch_counts_a_schedule_cannot_run_are_said(
    schedule: str, pp: int, m: int, problem: str | None
) -> None:
    virtual = 2 if schedule == "interleaved" else 1
    training = Training(schedule=schedule, virtual_stages=virtual)  # type: ignore[arg-type]
    assert schedule_problem(pp, m, training) == problem


def test_a_row_with_too_few_micro_batches_does_not_fit_and_says_why() -> None:
    # 16 sequences of 8192 tokens over 2 replicas: 8 micro-batches each, where pp 8 needs 16
    arch = PRESETS["llama3-8b"]
    training = Training(schedule="dualpipev", global_batch_tokens=16 * 8192)
    found = estimate(arch, Parallelism(pp=8, dp_replicate=2), training, {})
    assert (found.fits, found.problem) == (
        False,
        "8 micro-batches a step for dualpipev over pp 8: it needs at least 16; torch's DualPipeV "
        "runs no fewer",
    )


def test_a_config_s_v_schedule_is_estimated_on_the_rank_with_both_ends(
    run_cli, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    config = tmp_path / "v.yaml"
    config.write_text(
        "world_size: 64\ndegrees: {pp: 4, tp: 8, dp_replicate: 2}\n"
        "training: {pp_schedule: dualpipev}\n"
    )
    shown = run_cli("show", str(config), "--model", "llama3-8b", "--explain")
    assert shown.returncode == 0, shown.stderr
    assert "memory per GPU (GiB, pipeline rank 0)" in shown.stdout
    # 2 pp + 1 chunk-micro-batches, and the loss on the same rank as the embedding
    assert "stored by the blocks of 9 chunk-micro-batches in flight" in shown.stdout
    assert "the loss's fp32 copies of the logits" in shown.stdout
    assert "dualpipev: the DeepSeek-V3 report, table 2" in shown.stdout


@pytest.mark.parametrize("arch", [PRESETS["deepseek-v3"], PRESETS["llama3-405b"], SMALL_MOE])
@pytest.mark.parametrize("pp", [1, 2, 3, 5, 8, 16])
@pytest.mark.parametrize("schedule", ["zbv", "dualpipev", "dualpipe"])
@pytest.mark.parametrize("split", SPLITS)
def test_in_a_v_or_mirrored_the_candidate_ranks_find_the_rank_every_rank_would(
    arch: Architecture, pp: int, schedule: str, split: dict[str, int]
) -> None:
    """estimate_memory looks at a few pipeline ranks only; the largest of all is among them,
    whatever the micro-batches."""
    for m in (1, 3, 2 * pp - 1, 64):
        training, _ = Training(
            schedule=schedule,  # type: ignore[arg-type]
            global_batch_tokens=m * 8192,
            **split,  # type: ignore[arg-type]
        ).for_model(arch.layers, pp)
        par = Parallelism(pp=pp)
        ends = training.stage_ends
        every = max(
            (
                rank_memory(
                    arch,
                    par,
                    training,
                    rank_stage(arch, pp, training.chunks_per_stage, rank, ends, training.placement),
                )
                for rank in range(pp)
            ),
            key=lambda memory: memory.total,
        )
        assert estimate_memory(arch, par, training).total == every.total
