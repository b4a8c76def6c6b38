"""The estimate's runtime term: what a GPU holds beside the step's tensors, from published
measurements (docs/estimate.md), counted per communicator the rank sends over, each figure
replaceable, and the totals given with and without it."""

from __future__ import annotations

import json

import pytest

from meshconf.core.training import GIB
from meshconf.features.plan.estimate.presets import PRESETS
from meshconf.features.plan.estimate.runtime import (
    CUDA_CONTEXT_BYTES,
    NCCL_GROUP_BYTES,
    NCCL_PAIR_BYTES,
    runtime_memory,
)
from meshconf.features.plan.estimate.step import estimate
from meshconf.features.plan.estimate.training import Parallelism, Training

#: Llama 3 70B over tp 8, pp 2 and fsdp 4 on 64 GPUs.
LAYOUT = ("--world-size", "64", "--gpus-per-node", "8", "--model", "llama3-70b", "--tp", "8",
          "--pp", "2", "--dp-replicate", "1", "--cp", "1")  # fmt: skip


def test_each_communicator_has_the_published_buffers_of_its_size() -> None:
    runtime = runtime_memory(Training(), {"tp": 8, "pp": 2, "fsdp": 4, "cp": 1})
    # NCCL issue #964: 544 MB for a communicator of 2 GPUs, 688 MB for a larger one; a dim
    # of one rank sends nothing
    assert (runtime.nccl, runtime.communicators) == (
        2 * NCCL_GROUP_BYTES + NCCL_PAIR_BYTES,
        {"tp": 8, "pp": 2, "fsdp": 4},
    )
    assert (NCCL_PAIR_BYTES, NCCL_GROUP_BYTES) == (544 * 10**6, 688 * 10**6)
    assert runtime.cuda_context == CUDA_CONTEXT_BYTES == 300 * 10**6
    assert runtime.allocator == 0
    assert runtime.total == runtime.cuda_context + runtime.nccl


def test_each_figure_can_be_replaced_and_runtime_gib_replaces_them_all() -> None:
    groups = {"tp": 8, "fsdp": 2}
    given = Training(cuda_context_gib=0.5, nccl_communicator_gib=1.0, allocator_gib=2.0)
    runtime = runtime_memory(given, groups)
    assert (runtime.cuda_context, runtime.nccl, runtime.allocator) == (GIB // 2, 2 * GIB, 2 * GIB)
    whole = runtime_memory(Training(runtime_gib=3.0, nccl_communicator_gib=1.0), groups)
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
    assert memory.runtime == found.runtime.total
    assert memory.total == memory.training_state + memory.runtime
    assert found.headroom == Training().gpu_memory_gib * GIB - memory.total


def _row(run_cli, *extra: str) -> dict[str, object]:  # type: ignore[no-untyped-def]
    result = run_cli("plan", *LAYOUT, *extra, "--format", "json")
    assert result.returncode == 0, result.stderr
    (row,) = json.loads(result.stdout)["assignments"]
    return row  # type: ignore[no-any-return]


def test_plan_gives_the_totals_with_and_without_the_runtime_term(run_cli) -> None:  # type: ignore[no-untyped-def]
    row, without = _row(run_cli), _row(run_cli, "--runtime-gib", "0")
    memory, bare = row["memory_bytes"], without["memory_bytes"]
    assert memory["runtime"] == CUDA_CONTEXT_BYTES + 2 * NCCL_GROUP_BYTES + NCCL_PAIR_BYTES
    assert memory["total"] - memory["runtime"] == memory["total_without_runtime"]
    assert bare["runtime"] == 0 and bare["total"] == bare["total_without_runtime"]
    assert bare["total"] == memory["total_without_runtime"]
    assert without["runtime_gib"] == {"given": 0.0}


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
