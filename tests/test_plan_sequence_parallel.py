"""Tensor with sequence parallelism as torchtitan applies it, measured against the
estimate: tests/sequence_parallel_probe.py runs the blocks of a small Llama-shaped model at
tp 2 on torch's fake process group, under ``FakeTensorMode``, for each checkpointing mode.

- What a block stores on one rank (torch's ``MemTracker``, the growth between two blocks'
  ends of forward) equals the estimate exactly: the norms' outputs are kept whole, as the
  gathered inputs of the products after them, and under ``selective`` a kept row-wise
  product is every token's partial sum, beside the reduce-scatter's share.
- The collectives of one forward and backward pass (torch's ``CommDebugMode``) are those
  the estimate's tp traffic counts: four all-gathers and four reduce-scatters a block, two
  more all-gathers when ``selective`` recomputes, two more of each with ``full``.
"""

from __future__ import annotations

import itertools
import json
import os
from pathlib import Path
from typing import Any

import forkserver
import pytest
from measure_builds import ARCH, BATCH, SEQ, cpu_norm_extra
from sequence_parallel_probe import TP

from meshconf.features.plan.estimate import activations
from meshconf.features.plan.estimate.communication import traffic
from meshconf.features.plan.estimate.step_inputs import Parallelism, Training

HERE = Path(__file__).parent
MODES = ["none", "selective", "full"]
TOKENS = SEQ * BATCH


def _probe(server: Path, mode: str, sequence_parallel: str = "dtensor") -> dict[str, Any]:
    """The probe's report for ``mode``, run as ``python sequence_parallel_probe.py MODE SP``
    in a child of the fork server (tests/forkserver.py), which imported torch once."""
    script = str(HERE / "sequence_parallel_probe.py")
    words = [script, mode, sequence_parallel]
    done = forkserver.run(server, words, cwd=HERE, env=dict(os.environ), script=script)
    assert done.returncode == 0, done.stderr
    probed: dict[str, Any] = json.loads(done.stdout)
    return probed


@pytest.fixture(scope="module")
def probed(torch_server: Path) -> dict[str, dict[str, Any]]:
    return {mode: _probe(torch_server, mode) for mode in MODES}


@pytest.mark.parametrize("mode", MODES)
def test_what_a_block_stores_under_sequence_parallelism_is_the_estimate_exactly(
    probed: dict[str, dict[str, Any]], mode: str
) -> None:
    expected = activations.block(ARCH, "dense", mode, tensor_parallel=True)  # type: ignore[arg-type]
    if mode == "none":
        # on CPU each norm also keeps its normalized input: this rank's share of the sequence
        expected += cpu_norm_extra(ARCH)
    ends = probed[mode]["ends"]
    assert len(ends) == ARCH.layers
    assert [later - earlier for earlier, later in itertools.pairwise(ends)] == [
        expected.bytes(TOKENS, TP, 4)
    ] * (ARCH.layers - 1)


@pytest.mark.parametrize("mode", MODES)
def test_without_sequence_parallelism_a_block_stores_the_estimate_exactly(
    torch_server: Path, mode: str
) -> None:
    """Tensor parallelism alone (``--sequence-parallel none``): the norms' inputs and
    outputs and the block's input are kept for every token on each rank, and ``selective``
    keeps no all-reduce."""
    expected = activations.block(
        ARCH,
        "dense",
        mode,  # type: ignore[arg-type]
        tensor_parallel=True,
        sequence_parallel="none",
    )
    if mode == "none":
        expected += cpu_norm_extra(ARCH)
    ends = _probe(torch_server, mode, "none")["ends"]
    assert [later - earlier for earlier, later in itertools.pairwise(ends)] == [
        expected.bytes(TOKENS, TP, 4, sequence_parallel="none")
    ] * (ARCH.layers - 1)
    # and more than with it, by what sequence parallelism splits
    assert expected.bytes(TOKENS, TP, 4, sequence_parallel="none") > expected.bytes(TOKENS, TP, 4)


@pytest.mark.parametrize(
    ("mode", "gathers", "scatters"), [("none", 4, 4), ("selective", 6, 4), ("full", 6, 6)]
)
def test_the_collectives_are_those_the_tp_traffic_counts(
    probed: dict[str, dict[str, Any]], mode: str, gathers: int, scatters: int
) -> None:
    assert probed[mode]["collectives"] == {
        "all_gather_into_tensor": gathers * ARCH.layers,
        "reduce_scatter_tensor": scatters * ARCH.layers,
    }
    training = Training(
        seq_len=SEQ,
        micro_batch=BATCH,
        global_batch_tokens=TOKENS,
        param_dtype="fp32",
        checkpointing=mode,  # type: ignore[arg-type]
    )
    # the estimate's tp traffic is its blocks', and the probe runs blocks alone
    sent = traffic(ARCH, Parallelism(tp=TP), training, {})["tp"].bytes
    each = TOKENS * ARCH.hidden * 4 * (TP - 1) / TP
    assert sent == int((gathers + scatters) * ARCH.layers * each)
