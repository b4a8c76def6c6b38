"""``read_launch``: what the launcher's environment says about this process (no processes)."""

from __future__ import annotations

import pytest

from meshconf.core.errors import MeshconfError
from meshconf.runtime.launch import Launch, read_launch


def test_torchrun_variables_are_read_as_given() -> None:
    environ = {"RANK": "13", "WORLD_SIZE": "16", "LOCAL_RANK": "3", "LOCAL_WORLD_SIZE": "8"}
    assert read_launch(environ) == Launch(13, 16, 3, 8, "torchrun")


@pytest.mark.parametrize(
    ("rank", "local_world_size", "local_rank"),
    [(0, 4, 0), (3, 4, 3), (4, 4, 0), (13, 4, 1), (13, 8, 5), (15, 16, 15)],
)
def test_without_local_rank_it_is_the_rank_modulo_the_node_size(
    rank: int, local_world_size: int, local_rank: int
) -> None:
    torchrun = {"RANK": str(rank), "WORLD_SIZE": "16", "LOCAL_WORLD_SIZE": str(local_world_size)}
    assert read_launch(torchrun) == Launch(rank, 16, local_rank, local_world_size, "torchrun")
    slurm = {
        "SLURM_PROCID": str(rank),
        "SLURM_NTASKS": "16",
        "SLURM_NTASKS_PER_NODE": f"{local_world_size}(x{16 // local_world_size})",
    }
    assert read_launch(slurm) == Launch(rank, 16, local_rank, local_world_size, "slurm")


def test_without_local_rank_or_node_size_the_local_rank_is_the_rank() -> None:
    assert read_launch({"RANK": "13", "WORLD_SIZE": "16"}) == Launch(13, 16, 13, None, "torchrun")
    assert read_launch({"SLURM_PROCID": "5", "SLURM_NTASKS": "8"}) == Launch(5, 8, 5, None, "slurm")


def test_torchrun_wins_over_slurm_and_nothing_is_a_world_of_one() -> None:
    both = {"RANK": "1", "WORLD_SIZE": "2", "SLURM_PROCID": "7", "SLURM_NTASKS": "8"}
    assert read_launch(both) == Launch(1, 2, 1, None, "torchrun")
    assert read_launch({}) == Launch(0, 1, 0, 1, "none")


def test_a_node_size_of_zero_or_a_local_rank_outside_the_node_is_an_error() -> None:
    with pytest.raises(MeshconfError) as caught:
        read_launch({"RANK": "3", "WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "0"})
    assert str(caught.value) == (
        "rank 3 has LOCAL_WORLD_SIZE=0 (torchrun): a node runs at least one process"
    )
    with pytest.raises(MeshconfError) as caught:
        read_launch({"SLURM_PROCID": "3", "SLURM_NTASKS": "4", "SLURM_NTASKS_PER_NODE": "0"})
    assert str(caught.value) == (
        "rank 3 has SLURM_NTASKS_PER_NODE=0 (slurm): a node runs at least one process"
    )
    with pytest.raises(MeshconfError) as caught:
        read_launch({"RANK": "3", "WORLD_SIZE": "16", "LOCAL_RANK": "8", "LOCAL_WORLD_SIZE": "8"})
    assert str(caught.value) == ("rank 3 has LOCAL_RANK=8, outside LOCAL_WORLD_SIZE=8 (torchrun)")


def test_inconsistent_environments_are_errors() -> None:
    with pytest.raises(MeshconfError) as caught:
        read_launch({"SLURM_NTASKS": "8"})
    assert str(caught.value) == (
        "slurm environment incomplete: SLURM_NTASKS is set but SLURM_PROCID is not"
    )
    with pytest.raises(MeshconfError) as caught:
        read_launch({"RANK": "0", "WORLD_SIZE": "0"})
    assert str(caught.value) == "a rank has RANK=0, outside WORLD_SIZE=0 (torchrun)"
    with pytest.raises(MeshconfError) as caught:
        read_launch({"RANK": "0", "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "8(x)"})
    assert str(caught.value) == (
        "rank 0 has LOCAL_WORLD_SIZE=8(x), which is not an integer from 0 to 2147483647"
    )
