"""``meshconf plan`` with a model ranks its rows by what they deliver: among the rows that
fit, the most tokens per second per GPU first (the tokens a step runs, the batch asked for
or not, over the step time and the world); the rows that do not fit after them, closest to
fitting first. The table and the JSON say how far each row's batch is from
``--global-batch-tokens``, and a row that cannot run for a reason other than memory says
that reason, in the table and in ``--explain``."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given, settings, strategies as st

from meshconf.features.plan.estimate.presets import PRESETS
from meshconf.features.plan.estimate.step import Estimate
from meshconf.features.plan.estimate.step_inputs import Training
from meshconf.features.plan.ranking import make_plan
from meshconf.features.plan.request import Request

#: More rows than any generated plan has: the whole plan.
EVERY_ROW = 10**6


def _delivered(found: Estimate | None, world: int) -> float:
    assert found is not None
    return found.tokens_per_second_per_gpu(world)


@st.composite
def _requests(draw: st.DrawFn) -> Request:
    """A plan of a preset over a small world: every world factor free, on nodes or not,
    with or without a global batch, on a GPU small enough that some rows do not fit, under a
    schedule that refuses some micro-batch counts (dualpipe) or none."""
    world = draw(st.sampled_from([4, 6, 8, 12, 16, 24, 32, 48, 64]))
    seq_len = draw(st.sampled_from([1024, 2048, 4096, 8192]))
    training = Training(
        seq_len=seq_len,
        global_batch_tokens=draw(st.none() | st.integers(1, 64 * world * seq_len)),
        schedule=draw(st.sampled_from(["1f1b", "gpipe", "dualpipe"])),
        gpu_memory_gib=draw(st.sampled_from([16.0, 40.0, 80.0, 186.0])),
        mfu_over=draw(st.sampled_from(["compute", "step"])),
    )
    model = PRESETS[draw(st.sampled_from(sorted(PRESETS)))]
    gpus_per_node = draw(st.sampled_from([None, 2, 4, 8]))
    return Request(world, gpus_per_node, {"cp": 1}, model, training)


@settings(max_examples=40, deadline=None)
@given(_requests())
def test_the_rows_that_fit_lead_by_tokens_per_second_per_gpu(request: Request) -> None:
    world = request.world_size
    plan = make_plan(request, EVERY_ROW)
    rows = plan.best
    assert len(rows) == plan.total
    for row in rows:
        assert row.estimate is not None
        # no schedule makes a step shorter than its compute (no negative bubble)
        assert row.estimate.bubble_fraction >= 0
    fits = [row.estimate is not None and row.estimate.fits for row in rows]
    assert fits == sorted(fits, reverse=True)  # the rows that fit come first
    fitting = [_delivered(row.estimate, world) for row in rows[: fits.count(True)]]
    assert fitting == sorted(fitting, reverse=True)
    # the best row of a plan that shows one row is the best of the whole plan
    (first,) = make_plan(request, 1).best
    if fitting:
        assert first.estimate is not None and first.estimate.fits
        assert _delivered(first.estimate, world) == max(fitting)
    # the rows that do not fit: memory alone first, the fewest bytes over first; then those
    # that cannot run for another reason
    rest = [row.estimate for row in rows[len(fitting) :]]
    problems = [found is not None and found.problem is not None for found in rest]
    assert problems == sorted(problems)
    over = [-found.headroom for found in rest[: problems.count(False)] if found is not None]
    assert over == sorted(over)


def _plan(run_cli: Any, *args: str) -> tuple[list[str], dict[str, Any]]:
    """The text table's lines and the JSON report of one plan."""
    text = run_cli("plan", *args)
    assert text.returncode == 0, text.stderr
    data = run_cli("plan", *args, "--format", "json")
    assert data.returncode == 0, data.stderr
    return text.stdout.splitlines(), json.loads(data.stdout)


def _heading(lines: list[str]) -> int:
    """The index of the table's heading."""
    return next(index for index, line in enumerate(lines) if line.split()[:2] == ["#", "pp"])


def _table(lines: list[str]) -> list[list[str]]:
    """The table's rows after its heading, split into cells (the locality columns last)."""
    return [line.split() for line in lines[_heading(lines) + 1 :] if not line.startswith("[")]


#: Llama 3 8B on 8 GPUs, seq 4096: 257 sequences a step, which only a layout without data
#: parallelism runs exactly; fsdp 8 runs 33 micro-batches of 8 sequences, 264 (+2.7%).
OVERSHOOT = (
    "--world-size", "8", "--gpus-per-node", "8", "--cp", "1", "--model", "llama3-8b",
    "--seq-len", "4096", "--global-batch-tokens", str(257 * 4096),
)  # fmt: skip


def test_a_row_that_overshoots_the_batch_and_delivers_more_ranks_first(run_cli: Any) -> None:
    lines, report = _plan(run_cli, *OVERSHOOT, "--limit", "100")
    rows = report["assignments"]
    assert rows[0]["degrees"] == {
        "pp": 1, "dp_replicate": 1, "dp_shard": 8, "cp": 1, "tp": 1, "ep": 1, "etp": 1
    }  # fmt: skip
    assert (rows[0]["batch_tokens"], rows[0]["batch_difference_tokens"]) == (264 * 4096, 7 * 4096)
    exact = [row for row in rows if row["fits"] and row["batch_difference_tokens"] == 0]
    assert exact and all(row["index"] > 1 for row in exact)
    best = rows[0]["tokens_per_second_per_gpu"]
    assert all(best > row["tokens_per_second_per_gpu"] for row in exact)
    assert lines[_heading(lines)].split()[:10] == [
        "#", "pp", "dp_replicate", "dp_shard", "cp", "tp", "GiB", "headroom", "tokens/s/GPU",
        "batch",
    ]  # fmt: skip
    cells = _table(lines)
    assert cells[0][9] == "+2.7%"
    assert cells[0][8] == f"{best:.0f}"
    assert [cell[9] for cell, row in zip(cells, rows, strict=True) if row in exact] == ["="] * len(
        exact
    )


def test_tokens_per_second_per_gpu_is_the_step_s_tokens_over_its_time_and_the_world(
    run_cli: Any,
) -> None:
    _, report = _plan(run_cli, *OVERSHOOT, "--limit", "100")
    for row in report["assignments"]:
        # the JSON's step is rounded to 1e-4 s
        delivered = row["batch_tokens"] / row["step_seconds"] / 8
        assert abs(row["tokens_per_second_per_gpu"] - delivered) <= delivered * 1e-3


#: One layout, fsdp 8 on 8 GPUs, seq 4096: a step runs whole micro-batches of 8 sequences,
#: 32,768 tokens each.
ONE_ROW = (
    "--world-size", "8", "--gpus-per-node", "8", "--pp", "1", "--dp-replicate", "1",
    "--dp-shard", "8", "--cp", "1", "--tp", "1", "--model", "llama3-8b", "--seq-len", "4096",
)  # fmt: skip


def test_the_batch_column_says_how_far_each_row_is_from_the_batch_asked_for(
    run_cli: Any,
) -> None:
    cases = [
        # (--global-batch-tokens, the batch cell, the batch's difference in tokens)
        (327680, "=", 0),  # 10 micro-batches exactly
        (326700, "+0.3%", 980),  # 0.29997%: two significant digits
        (3276792, "+0.00024%", 8),  # 100 micro-batches, 8 tokens over: never "0%"
        (29000, "+13%", 3768),  # one micro-batch, 12.99% over: whole percents
        (1000, "+3177%", 31768),
    ]
    for wanted, cell, difference in cases:
        lines, report = _plan(run_cli, *ONE_ROW, "--global-batch-tokens", str(wanted))
        assert _table(lines)[0][9] == cell
        (row,) = report["assignments"]
        assert row["batch_difference_tokens"] == difference
        assert row["batch_tokens"] == wanted + difference


def test_without_a_global_batch_there_is_no_batch_column(run_cli: Any) -> None:
    lines, report = _plan(run_cli, *ONE_ROW)
    assert lines[_heading(lines)].split()[6:12] == [
        "GiB", "headroom", "tokens/s/GPU", "step", "s", "compute"
    ]  # fmt: skip
    (row,) = report["assignments"]
    assert row["batch_difference_tokens"] is None
    assert _table(lines)[0][8] == f"{row['tokens_per_second_per_gpu']:.0f}"


#: Llama 3 8B over pp 2 under DualPipe on GB200s: 81,920 tokens a step are 5 micro-batches
#: of fsdp 4, which DualPipe cannot run (an even count of at least 4), and 10 and 20 of
#: fsdp 2 and 1. Every row's memory fits in 186 GiB.
DUALPIPE = (
    "--world-size", "8", "--gpus-per-node", "8", "--pp", "2", "--dp-replicate", "1",
    "--cp", "1", "--model", "llama3-8b", "--seq-len", "4096", "--global-batch-tokens",
    "81920", "--pp-schedule", "dualpipe", "--gpu", "gb200",
)  # fmt: skip
DUALPIPE_REASON = (
    "5 micro-batches a step for dualpipe over pp 2: it sends half of them from each end, and "
    "needs an even count of at least 4"
)


def test_a_row_that_cannot_run_says_why_below_the_table(run_cli: Any) -> None:
    lines, report = _plan(run_cli, *DUALPIPE)
    assert report["fitting"] == 2
    rows = report["assignments"]
    assert [row["problem"] for row in rows] == [None, None, DUALPIPE_REASON]
    assert (rows[2]["degrees"]["dp_shard"], rows[2]["microbatches"]) == (4, 5)
    assert rows[2]["headroom_gib"] > 0  # not memory
    cells = _table(lines)
    headroom = [f"{row['headroom_gib']:.1f}" for row in rows[:2]]
    assert [cell[7] for cell in cells] == [*headroom, "[1]"]
    assert lines[-1] == f"[1] cannot run: {DUALPIPE_REASON}"
    assert "does NOT fit" not in "\n".join(lines)


def test_rows_that_cannot_run_for_different_reasons_have_a_mark_each(run_cli: Any) -> None:
    """12,288 tokens a step are 1, 2 and 3 micro-batches over pp 2, 4 and 8 (fsdp 4, 2 and
    1): three counts DualPipe refuses, three reasons; pp 1 has no pipeline to schedule."""
    args = [*DUALPIPE]
    args[args.index("--pp") : args.index("--pp") + 2] = ["--tp", "1"]
    args[args.index("81920")] = "12288"
    lines, report = _plan(run_cli, *args)
    rows = report["assignments"]
    assert [row["degrees"]["pp"] for row in rows] == [1, 2, 4, 8]
    reasons = [
        f"{m} micro-batches a step for dualpipe over pp {pp}: it sends half of them from each "
        f"end, and needs an even count of at least {2 * pp}"
        for m, pp in [(1, 2), (2, 4), (3, 8)]
    ]
    assert [row["problem"] for row in rows] == [None, *reasons]
    assert [cell[7] for cell in _table(lines)[1:]] == ["[1]", "[2]", "[3]"]
    assert lines[-3:] == [
        f"[{mark}] cannot run: {reason}" for mark, reason in enumerate(reasons, 1)
    ]


def test_explain_says_why_a_row_cannot_run_and_what_it_delivers(run_cli: Any) -> None:
    result = run_cli("plan", *DUALPIPE, "--explain", "3")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == "assignment 3 of 3: pp=2 dp_replicate=1 dp_shard=4 cp=1 tp=1"
    assert lines[2] == f"cannot run: {DUALPIPE_REASON}"
    assert lines[3].startswith("memory per GPU") and ": fits in 186 GiB, " in lines[3]
    assert "does NOT fit" not in result.stdout
    (row,) = [row for row in _plan(run_cli, *DUALPIPE)[1]["assignments"] if row["index"] == 3]
    throughput = [line for line in lines if line.startswith("throughput: ")]
    assert throughput == [
        f"throughput: {row['tokens_per_second_per_gpu']:.0f} tokens/s per GPU, the step's 81920 "
        f"tokens (the batch asked for) in {row['step_seconds']:.3g} s over 8 GPUs"
    ]


def test_explain_says_how_far_the_batch_is_from_the_one_asked_for(run_cli: Any) -> None:
    result = run_cli("plan", *ONE_ROW, "--global-batch-tokens", "326700", "--explain", "1")
    assert result.returncode == 0, result.stderr
    (line,) = [line for line in result.stdout.splitlines() if line.startswith("throughput: ")]
    assert line.startswith("throughput: ")
    assert ", the step's 327680 tokens (+0.3% against 326700) in " in line
    assert line.endswith(" s over 8 GPUs")


def test_show_says_why_a_config_s_layout_cannot_run(run_cli: Any) -> None:
    """81,920 tokens over the 16 data-parallel ranks of pp 4 are 2 micro-batches of 4,096."""
    args = ["examples/llama3_70b_512gpu.yaml", "--model", "llama3-70b", "--seq-len", "4096"]
    args += ["--global-batch-tokens", "81920", "--pp-schedule", "dualpipe"]
    result = run_cli("show", *args)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    memory = next(index for index, line in enumerate(lines) if line.startswith("memory per GPU"))
    assert lines[memory - 1] == (
        "cannot run: 2 micro-batches a step for dualpipe over pp 4: it sends half of them from "
        "each end, and needs an even count of at least 8"
    )
    assert "does NOT fit" not in result.stdout
