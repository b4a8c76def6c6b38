"""meshconf.compat.torchtitan.ParallelDims against torchtitan 0.3's documented behaviour:
validation and its exception types, from_config, the one-dim meshes each spmd_backend keeps,
and the groups on 8 gloo processes, written out by hand from torchtitan's row-major meshes
(world order pp, dp_replicate, dp_shard, cp, tp)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import torch.distributed as dist
from distributed import run_ranks

from meshconf import ConfigError
from meshconf.compat.torchtitan import ParallelDims, ParallelDimsError
from meshconf.core.errors import InvalidArgumentError


def dims(**degrees: Any) -> ParallelDims:
    fields: dict[str, Any] = {"dp_replicate": 1, "dp_shard": -1, "cp": 1, "tp": 1, "pp": 1}
    fields.update({"ep": 1, **degrees})
    return ParallelDims(**fields)


def refused(**degrees: Any) -> str:
    with pytest.raises(AssertionError) as raised:
        dims(**degrees)
    assert isinstance(raised.value, ConfigError) and type(raised.value) is ParallelDimsError
    return str(raised.value)


# Validation (no process group needed) ---------------------------------------------------


def test_the_constructor_has_no_etp_and_defaults_to_spmd_types() -> None:
    parallel_dims = ParallelDims(2, -1, 1, 2, 1, 1, 8)
    assert (parallel_dims.dp_shard, parallel_dims.spmd_backend) == (2, "spmd_types")
    with pytest.raises(TypeError):
        ParallelDims(dp_replicate=1, dp_shard=1, cp=1, tp=1, pp=1, ep=1, etp=1, world_size=1)  # type: ignore[call-arg]


def test_from_config_reads_the_parallelism_table() -> None:
    table = SimpleNamespace(
        data_parallel_replicate_degree=2,
        data_parallel_shard_degree=-1,
        context_parallel_degree=1,
        tensor_parallel_degree=2,
        pipeline_parallel_degree=1,
        expert_parallel_degree=1,
        spmd_backend="full_dtensor",
    )
    parallel_dims = ParallelDims.from_config(table, world_size=8)
    assert (parallel_dims.dp_replicate, parallel_dims.dp_shard, parallel_dims.tp) == (2, 2, 2)
    assert parallel_dims.spmd_backend == "full_dtensor"


def test_errors_are_assertion_errors_with_meshconf_s_message() -> None:
    assert refused(dp_shard=2, tp=2, world_size=10) == (
        "degrees.tp: pp(1) * dp_replicate(1) * dp_shard(2) * cp(1) * tp(2) = 4 != world_size 10"
    )
    assert refused(dp_replicate=0, dp_shard=1, world_size=1) == (
        "degrees.dp_replicate: expected an integer >= 1, got 0; only dp_shard may be -1"
    )
    assert refused(dp_shard=0, world_size=1) == (
        "degrees.dp_shard: expected an integer >= 1 or -1 (fill the remaining ranks), got 0"
    )
    assert refused(spmd_backend="dtensor", world_size=1) == (
        "spmd_backend: expected one of partial_dtensor, full_dtensor, spmd_types, got 'dtensor'"
    )


@pytest.mark.parametrize("name", ["dp_replicate", "cp", "tp", "pp", "ep"])
def test_only_dp_shard_may_be_minus_one(name: str) -> None:
    assert refused(dp_shard=2, **{name: -1}, world_size=8) == (
        f"degrees.{name}: expected an integer >= 1, got -1; only dp_shard may be -1"
    )


def test_experts_that_do_not_fit_are_refused_at_construction() -> None:
    """torchtitan 0.3 accepts this; its efsdp comes out as 2 // 3 = 0 and build_mesh fails."""
    assert refused(dp_replicate=2, dp_shard=2, ep=3, world_size=4).splitlines()[0] == (
        "degrees.ep: ep(3) * etp(1) = 3 must divide dp_shard(2) * cp(1) * tp(1) = 2: experts "
        "borrow their ranks from those dims"
    )


def test_degrees_and_properties() -> None:
    parallel_dims = dims(dp_replicate=2, dp_shard=2, cp=2, tp=3, pp=2, world_size=48)
    assert parallel_dims.non_data_parallel_size == 12
    assert dims(dp_replicate=2, dp_shard=1, cp=2, tp=4, world_size=16).seq_len_divisor == 16
    cp_only = dims(dp_shard=1, cp=2, world_size=2)
    assert (cp_only.dp_enabled, cp_only.cp_enabled, cp_only.dp_cp_enabled) == (False, True, True)
    assert cp_only.fsdp_enabled and not cp_only.tp_enabled
    assert dims(dp_shard=2, ep=2, world_size=2).ep_enabled


def test_unknown_dims_are_refused_before_any_process_group() -> None:
    parallel_dims = dims(world_size=1)
    with pytest.raises(ValueError) as raised:
        parallel_dims.get_optional_mesh("fsdp")  # spmd_types keeps dp and dp_shard instead
    assert type(raised.value) is InvalidArgumentError
    assert str(raised.value) == (
        "Invalid mesh dim 'fsdp': the one-dim meshes are pp, batch, loss, dp_replicate, cp, "
        "tp, ep, efsdp, dp, dp_shard"
    )
    assert parallel_dims._single_axis_meshes == {} and not dist.is_initialized()


# One rank ------------------------------------------------------------------------------


STORAGE_AXES = {
    "partial_dtensor": ["fsdp"],
    "full_dtensor": ["dp_shard"],
    "spmd_types": ["dp", "dp_shard"],
}


def _single_rank(rank: int, environ: dict[str, str], backend: str) -> None:
    # No launcher variables: a plain `python train.py` on one GPU or CPU.
    storage = STORAGE_AXES[backend]
    parallel_dims = dims(world_size=1, spmd_backend=backend)
    try:
        assert parallel_dims.get_optional_mesh("tp") is None  # builds lazily
        common = ["pp", "batch", "loss", "dp_replicate", "cp", "tp", "ep", "efsdp"]
        assert list(parallel_dims._single_axis_meshes) == common + storage
        assert parallel_dims.world_mesh.size() == 1
        assert parallel_dims.get_all_one_dimensional_meshes() == {}
        # The storage dim stays at size 1 for fully_shard's mixed precision; the
        # spmd_types dense mesh is [dp, cp, tp], none of which exists here.
        kept = parallel_dims.get_optional_mesh(storage[-1])
        assert kept is not None and kept.mesh_dim_names == (storage[-1],)
        assert len(parallel_dims.spmd_meshes()) == (0 if backend == "spmd_types" else 1)
        with_ones = parallel_dims.get_optional_mesh(["pp", "tp"], include_singleton_axes=True)
        assert with_ones is not None and with_ones.shape == (1, 1)
        with pytest.raises(InvalidArgumentError) as raised:
            parallel_dims.get_mesh("tp")
        assert str(raised.value) == (
            "mesh ['tp'] is not available: tp=1; use get_optional_mesh to get None instead"
        )
    finally:
        parallel_dims.context.close()
    assert not dist.is_initialized()


@pytest.mark.parametrize("backend", list(STORAGE_AXES))
def test_a_single_rank_keeps_each_backend_s_one_dim_meshes(backend: str) -> None:
    run_ranks(_single_rank, 1, backend)


# Eight ranks ---------------------------------------------------------------------------


def _ranks(mesh: Any) -> list[int]:
    return sorted(dist.get_process_group_ranks(mesh.get_group()))


def _hsdp_tp(rank: int, environ: dict[str, str], backend: str) -> None:
    import os

    os.environ.update(environ)
    parallel_dims = dims(dp_replicate=2, dp_shard=2, tp=2, world_size=8, spmd_backend=backend)
    try:
        parallel_dims.build_mesh()
        data = [rank % 2 + offset for offset in (0, 2, 4, 6)]
        expected = {
            "batch": data,
            "loss": data,
            "dp": data,
            "dp_replicate": [rank % 4, rank % 4 + 4],
            "dp_shard": [rank - rank % 4 + rank % 2, rank - rank % 4 + rank % 2 + 2],
            "fsdp": [rank - rank % 4 + rank % 2, rank - rank % 4 + rank % 2 + 2],
            "tp": [rank - rank % 2, rank - rank % 2 + 1],
        }
        one_dim = parallel_dims.get_all_one_dimensional_meshes()
        # efsdp has 4 ranks, but with ep 1 it does not exist in 0.3 and is not listed.
        assert "efsdp" not in one_dim and parallel_dims.get_optional_mesh("efsdp") is None
        for name, mesh in one_dim.items():
            assert _ranks(mesh) == expected[name], name
            assert dist.get_backend(mesh.get_group()) != "fake", name
        dense_dims = {
            "partial_dtensor": ("dp_replicate", "fsdp", "tp"),
            "full_dtensor": ("dp_replicate", "dp_shard", "tp"),
            "spmd_types": ("dp", "tp"),
        }[backend]
        # The sparse mesh keeps what exists of [dp_replicate, efsdp, ep]: dp_replicate alone.
        dense, sparse = parallel_dims.spmd_meshes()
        assert dense.mesh_dim_names == dense_dims
        assert sparse is parallel_dims.get_mesh("dp_replicate")
        assert dense is parallel_dims.get_optional_mesh(list(dense_dims))
        assert parallel_dims.get_dense_tp_mesh().mesh_dim_names == ("tp",)
        assert _ranks(parallel_dims.get_dense_tp_mesh()) == expected["tp"]
        if backend == "spmd_types":
            assert parallel_dims.spmd_dense_mesh().mesh_dim_names == ("dp", "cp", "tp")
            assert parallel_dims.spmd_sparse_mesh() is None
            assert parallel_dims.resolve_mesh(["dp", "cp", "tp", "pp"]) is dense
        if backend == "full_dtensor":
            assert parallel_dims.resolve_mesh(["dp", "cp", "tp"]) is dense
            with pytest.raises(InvalidArgumentError):
                parallel_dims.resolve_mesh(["dp_replicate", "tp"])
        if backend == "partial_dtensor":
            assert parallel_dims.resolve_mesh(["dp_replicate", "fsdp"]) is None
            assert parallel_dims.resolve_mesh(["tp", "ep"]) is parallel_dims.get_mesh("tp")
        # No rank may exit while another still connects a group to it: gloo then reports
        # "Connection closed by peer" on the slower one.
        parallel_dims.context.wait_world()
    finally:
        parallel_dims.context.close()


@pytest.mark.parametrize("backend", ["partial_dtensor", "full_dtensor", "spmd_types"])
def test_hsdp_with_tensor_parallel_on_8_processes(backend: str) -> None:
    run_ranks(_hsdp_tp, 8, backend)


def _experts(rank: int, environ: dict[str, str]) -> None:
    import os

    os.environ.update(environ)
    parallel_dims = dims(dp_shard=4, tp=2, ep=2, world_size=8)
    try:
        parallel_dims.build_mesh()
        # 0.3's sparse mesh is [pp, dp_replicate, efsdp, ep]: efsdp = 4 * 2 / 2 = 4.
        assert _ranks(parallel_dims.get_mesh("ep")) == [rank - rank % 2, rank - rank % 2 + 1]
        assert _ranks(parallel_dims.get_mesh("efsdp")) == [rank % 2 + o for o in (0, 2, 4, 6)]
        assert set(parallel_dims.get_all_one_dimensional_meshes()) == {
            "batch",
            "loss",
            "tp",
            "ep",
            "efsdp",
            "dp",
            "dp_shard",
        }
        sparse = parallel_dims.spmd_sparse_mesh()
        assert sparse is not None and sparse.mesh_dim_names == ("dp_replicate", "efsdp", "ep")
        dense, experts = parallel_dims.spmd_meshes()
        assert (dense.mesh_dim_names, experts.mesh_dim_names) == (("dp", "tp"), ("efsdp", "ep"))
        parallel_dims.context.wait_world()  # as above: no rank leaves while others connect
    finally:
        parallel_dims.context.close()


def test_experts_on_8_processes() -> None:
    run_ranks(_experts, 8)
