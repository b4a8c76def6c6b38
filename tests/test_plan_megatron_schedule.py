"""The micro-batches in flight under 1F1B and the interleaved schedule against Megatron-Core's
own count of each rank's warm-up forward passes (``get_pp_rank_microbatches``, read from
the installed megatron-core by tests/megatron_code.py): a rank holds its warm-up passes and
the one forward pass of its first 1F1B step, or every pass when all of them are warm-up.
Megatron-Core runs the interleaved schedule over groups of ``pp`` micro-batches by default,
and refuses counts that are not a multiple of the group; torch's schedules, measured in
tests/test_plan_pipeline_gloo.py, run the same counts the same way."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from megatron_code import get_pp_rank_microbatches

from meshconf.features.plan.estimate.schedule import in_flight_chunks
from meshconf.features.plan.estimate.training import Training


def _megatron_in_flight(pp: int, rank: int, chunks: int, microbatches: int) -> int:
    communicator = SimpleNamespace(
        pp_group=SimpleNamespace(size=lambda: pp, rank=lambda: rank),
        virtual_pipeline_model_parallel_size=chunks if chunks > 1 else None,
    )
    total, all_warm_up, warm_up, _ = get_pp_rank_microbatches(
        microbatches, chunks, pp, p2p_communicator=communicator
    )
    return total if all_warm_up else warm_up + 1


@pytest.mark.parametrize("pp", range(2, 9))
def test_1f1b_holds_what_megatron_core_warms_up_and_one_more(pp: int) -> None:
    training = Training(schedule="1f1b")
    for microbatches in range(1, 4 * pp + 2):
        for rank in range(pp):
            assert in_flight_chunks(pp, rank, training, microbatches) == _megatron_in_flight(
                pp, rank, 1, microbatches
            ), (rank, microbatches)


@pytest.mark.parametrize("pp", range(2, 9))
@pytest.mark.parametrize("chunks", [2, 3, 4, 8])
def test_interleaved_holds_what_megatron_core_warms_up_and_one_more(pp: int, chunks: int) -> None:
    training = Training(schedule="interleaved", virtual_stages=chunks)
    for microbatches in range(pp, 5 * pp, pp):
        for rank in range(pp):
            assert in_flight_chunks(pp, rank, training, microbatches) == _megatron_in_flight(
                pp, rank, chunks, microbatches
            ), (rank, microbatches)
