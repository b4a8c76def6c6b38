"""The estimate's runtime term: what a GPU holds beside the step's tensors, from published
measurements (docs/estimate.md), counted per communicator the rank sends over, each figure
replaceable, and the totals given with and without it."""

from __future__ import annotations

import json
import statistics
from fractions import Fraction
from typing import Any

import pytest
from hypothesis import given, strategies as st

from meshconf.core.setting_values import GIB
from meshconf.features.plan.estimate.gpu_overheads import (
    CUDA_CONTEXT_BYTES,
    NCCL_GROUP_BYTES,
    NCCL_PAIR_BYTES,
    RESERVED_PEAKS,
    RESERVED_RATIO,
    allocator_reserve,
    runtime_memory,
)
from meshconf.features.plan.estimate.presets import PRESETS
from meshconf.features.plan.estimate.step import estimate
from meshconf.features.plan.estimate.step_inputs import Parallelism, Training

#: Llama 3 70B over tp 8, pp 2 and fsdp 4 on 64 GPUs.
LAYOUT = ("--world-size", "64", "--gpus-per-node", "8", "--model", "llama3-70b", "--tp", "8",
          "--pp", "2", "--dp-replicate", "1", "--cp", "1")  # fmt: skip


def test_each_communicator_has_the_published_buffers_of_its_size() -> None:
    runtime = runtime_memory(Training(), {"tp": 8, "pp": 2, "fsdp": 4, "cp": 1}, 0)
    # NCCL issue #964: 544 MB for a communicator of 2 GPUs, 688 MB for a larger one; a dim
    # of one rank sends nothing
    assert (runtime.nccl, runtime.communicators) == (
        2 * NCCL_GROUP_BYTES + NCCL_PAIR_BYTES,
        {"tp": 8, "pp": 2, "fsdp": 4},
    )
    assert (NCCL_PAIR_BYTES, NCCL_GROUP_BYTES) == (544 * 10**6, 688 * 10**6)
    assert runtime.cuda_context == CUDA_CONTEXT_BYTES == 300 * 10**6
    assert runtime.allocator == 0  # no tensors, no reserve
    assert runtime.total == runtime.cuda_context + runtime.nccl


def test_the_reserve_ratio_is_the_median_of_the_published_pairs() -> None:
    """Each pair is one run's peak reserved and peak allocated (active) memory, as its source
    prints them; no pair is measured here (torch's memory tracker on CPU has no caching
    allocator)."""
    ratios = sorted(peak.reserved / peak.allocated for peak in RESERVED_PEAKS)
    assert len(ratios) == 3
    assert RESERVED_RATIO == statistics.median(ratios) == Fraction("40.78") / Fraction("36.17")
    assert [round(float(ratio), 4) for ratio in ratios] == [1.0546, 1.1275, 1.3074]
    assert all(peak.source for peak in RESERVED_PEAKS)


def test_the_reserve_is_the_tensors_at_the_published_ratio() -> None:
    # 72.6 GiB of tensors at the peak
    tensors = 77_953_482_752
    reserve = runtime_memory(Training(), {"fsdp": 8}, tensors).allocator
    assert reserve == allocator_reserve(tensors) == 9_935_459_096
    assert reserve == round(tensors * Fraction(461, 3617))


@given(st.integers(min_value=0, max_value=2**50))
def test_the_reserve_grows_with_the_tensors_at_the_ratio(tensors: int) -> None:
    reserve = allocator_reserve(tensors)
    assert abs(reserve - tensors * (RESERVED_RATIO - 1)) <= Fraction(1, 2)
    assert reserve <= allocator_reserve(tensors + 1)


def test_each_figure_can_be_replaced_and_runtime_gib_replaces_them_all() -> None:
    groups = {"tp": 8, "fsdp": 2}
    given = Training(cuda_context_gib=0.5, nccl_communicator_gib=1.0, allocator_gib=2.0)
    runtime = runtime_memory(given, groups, 40 * GIB)
    assert (runtime.cuda_context, runtime.nccl, runtime.allocator) == (GIB // 2, 2 * GIB, 2 * GIB)
    none = runtime_memory(Training(allocator_gib=0.0), groups, 40 * GIB)
    assert none.allocator == 0
    whole = runtime_memory(Training(runtime_gib=3.0, nccl_communicator_gib=1.0), groups, GIB)
    assert (whole.total, whole.given) == (3 * GIB, 3 * GIB)


@pytest.mark.parametrize(("tp", "pp", "fsdp"), [(1, 1, 8), (8, 1, 1), (2, 2, 2), (1, 1, 1)])
def test_the_estimate_counts_the_communicators_its_traffic_uses(
    tp: int, pp: int, fsdp: int
) -> None:
    par = Parallelism(tp=tp, pp=pp, dp_shard=fsdp)
    found = estimate(PRESETS["llama3-8b"], par, Training(), {})
    assert found.runtime.communicators == {
        name: size for name, size in (("tp", tp), ("pp", pp), ("fsdp", fsdp)) if size > 1
    }
    assert set(found.runtime.communicators) == set(found.traffic)
    memory = found.memory
    assert found.runtime.allocator == allocator_reserve(memory.training_state)
    assert memory.runtime == found.runtime.total
    assert memory.total == memory.training_state + memory.runtime
    assert found.headroom == Training().gpu_memory_gib * GIB - memory.total


def _row(run_cli, *extra: str) -> dict[str, Any]:  # type: ignore[no-untyped-def]
    result = run_cli("plan", *LAYOUT, *extra, "--format", "json")
    assert result.returncode == 0, result.stderr
    (row,) = json.loads(result.stdout)["assignments"]
    return row  # type: ignore[no-any-return]


def test_plan_gives_the_totals_with_and_without_the_runtime_term(run_cli) -> None:  # type: ignore[no-untyped-def]
    row, without = _row(run_cli), _row(run_cli, "--runtime-gib", "0")
    memory, bare = row["memory_bytes"], without["memory_bytes"]
    reserve = allocator_reserve(memory["total_without_runtime"])
    assert (
        memory["runtime"] == CUDA_CONTEXT_BYTES + 2 * NCCL_GROUP_BYTES + NCCL_PAIR_BYTES + reserve
    )
    assert row["runtime_gib"]["allocator"] == round(reserve / GIB, 2)
    assert memory["total"] - memory["runtime"] == memory["total_without_runtime"]
    assert bare["runtime"] == 0 and bare["total"] == bare["total_without_runtime"]
    assert bare["total"] == memory["total_without_runtime"]
    assert without["runtime_gib"] == {"given": 0.0}


def test_allocator_gib_replaces_the_published_reserve(run_cli) -> None:  # type: ignore[no-untyped-def]
    row = _row(run_cli, "--allocator-gib", "1.5")
    memory = row["memory_bytes"]
    assert memory["runtime"] == CUDA_CONTEXT_BYTES + 2 * NCCL_GROUP_BYTES + NCCL_PAIR_BYTES + (
        3 * GIB // 2
    )
    assert row["runtime_gib"]["allocator"] == 1.5


def test_explain_names_the_reserve_its_ratio_and_its_sources(run_cli) -> None:  # type: ignore[no-untyped-def]
    result = run_cli("plan", *LAYOUT, "--explain", "1")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    (at,) = [index for index, line in enumerate(lines) if line.startswith("  runtime ")]
    holds, source = lines[at], lines[at + 1]
    assert "the allocator's reserve " in holds
    assert "(0.1275 of the tensors' " in holds
    assert holds.endswith(", reserved over allocated as published)")
    assert "published: the median peak reserved / peak allocated of 3 runs under FSDP2" in source
    for peak in RESERVED_PEAKS:
        assert peak.source in source
    given = run_cli("plan", *LAYOUT, "--explain", "1", "--allocator-gib", "2")
    assert "the allocator's reserve 2.00 (as --allocator-gib gives it)" in given.stdout


def test_a_layout_that_fits_only_without_the_runtime_term_does_not_fit(run_cli) -> None:  # type: ignore[no-untyped-def]
    row = _row(run_cli)
    state = row["memory_bytes"]["total_without_runtime"]
    # a GPU that holds the step's tensors with 1 GiB to spare, but not NCCL's buffers
    room = f"{(state + GIB) / GIB:.6f}"
    tight = _row(run_cli, "--gpu-memory-gib", room)
    assert tight["fits"] is False and tight["headroom_gib"] < 0
    assert _row(run_cli, "--gpu-memory-gib", room, "--runtime-gib", "0")["fits"] is True


@pytest.mark.parametrize(
    ("option", "value", "message"),
    [
        ("--runtime-gib", "-1", "--runtime-gib: expected a number from 0 to 16384, got '-1'"),
        (
            "--nccl-communicator-gib",
            "nan",
            "--nccl-communicator-gib: expected a number from 0 to 16384, got 'nan'",
        ),
        (
            "--cuda-context-gib",
            "1e9",
            "--cuda-context-gib: 1e9 is more than 16384: more memory than any GPU has",
        ),
    ],
)
def test_a_runtime_figure_out_of_bounds_is_refused_at_its_option(  # type: ignore[no-untyped-def]
    run_cli, option: str, value: str, message: str
) -> None:
    result = run_cli("plan", *LAYOUT, option, value)
    assert (result.returncode, result.stdout) == (2, "")
    assert result.stderr == f"meshconf: error: {message}\n"
