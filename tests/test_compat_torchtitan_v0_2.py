"""meshconf.compat.torchtitan_v0_2.ParallelDims against torchtitan 0.2's documented behaviour,
case by case: validation, a single rank, 8 gloo processes with dp_replicate=2, dp_shard=2,
tp=2, and mixture-of-experts layouts. The expected groups are written out by hand from
torchtitan's row-major meshes."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.distributed as dist
from distributed import run_ranks

from meshconf import ConfigError
from meshconf.compat.torchtitan_v0_2 import (
    MESH_DIMS,
    ParallelDims,
    ParallelDimsError,
)
from meshconf.core.errors import InvalidArgumentError
from meshconf.core.layout import process_group_count
from meshconf.runtime import all_reduce


def dims(**degrees: int) -> ParallelDims:
    fields = {"dp_replicate": 1, "dp_shard": -1, "cp": 1, "tp": 1, "pp": 1, "ep": 1, "etp": 1}
    fields.update(degrees)
    return ParallelDims(**fields)  # type: ignore[arg-type]


def refused(**degrees: int) -> str:
    """The message of the error, which is both torchtitan's AssertionError and meshconf's
    ConfigError."""
    with pytest.raises(AssertionError) as raised:
        dims(**degrees)
    assert isinstance(raised.value, ConfigError) and type(raised.value) is ParallelDimsError
    return str(raised.value)


# Validation (no process group needed) ---------------------------------------------------


def test_dp_shard_minus_one_is_filled_in_place() -> None:
    parallel_dims = dims(dp_replicate=2, tp=2, pp=2, world_size=64)
    assert parallel_dims.dp_shard == 8
    assert parallel_dims.config.resolved_degrees["dp_shard"] == 8


def test_the_world_product_must_match() -> None:
    assert refused(dp_shard=2, tp=2, world_size=8) == (
        "degrees.tp: pp(1) * dp_replicate(1) * dp_shard(2) * cp(1) * tp(2) = 4 != world_size 8"
    )


def test_an_auto_dp_shard_of_zero_names_the_numbers() -> None:
    """torchtitan computes 4 // 8 = 0 and fails `assert dp_shard >= 1` with no message."""
    assert refused(tp=8, world_size=4) == (
        "degrees.dp_shard: -1 cannot fill the remaining ranks: world_size 4 is not divisible "
        "by pp(1) * dp_replicate(1) * cp(1) * tp(8) = 8"
    )


def test_degrees_must_be_positive_and_dp_shard_may_be_minus_one_only() -> None:
    assert refused(tp=0, world_size=8) == (
        "degrees.tp: expected an integer >= 1, got 0; only dp_shard may be -1"
    )
    assert refused(dp_shard=-2, world_size=8) == (
        "degrees.dp_shard: expected an integer >= 1 or -1 (fill the remaining ranks), got -2"
    )
    assert refused(ep=-1, world_size=8) == (
        "degrees.ep: expected an integer >= 1, got -1; only dp_shard may be -1"
    )
    # dp_replicate=0 gets no hint to write -1, which torchtitan does not allow there.
    assert refused(dp_replicate=0, dp_shard=1, world_size=1) == (
        "degrees.dp_replicate: expected an integer >= 1, got 0; only dp_shard may be -1"
    )


@pytest.mark.parametrize("name", ["dp_replicate", "cp", "tp", "pp"])
def test_only_dp_shard_may_be_minus_one(name: str) -> None:
    """A -1 elsewhere used to be filled inside meshconf while the attribute stayed -1, so
    that tp_enabled was False with tp groups of 2 and seq_len_divisor came out as -2."""
    degrees = {"dp_replicate": 2, "dp_shard": 2, "cp": 1, "tp": 1, "pp": 1, name: -1}
    assert refused(**degrees, world_size=8) == (
        f"degrees.{name}: expected an integer >= 1, got -1; only dp_shard may be -1"
    )


def test_every_bad_degree_is_reported_at_once() -> None:
    assert refused(tp=0, cp=-1, dp_shard=-3, world_size=8).splitlines() == [
        "degrees.dp_shard: expected an integer >= 1 or -1 (fill the remaining ranks), got -3",
        "degrees.cp: expected an integer >= 1, got -1; only dp_shard may be -1",
        "degrees.tp: expected an integer >= 1, got 0; only dp_shard may be -1",
    ]


def test_etp_is_1_or_tp() -> None:
    assert (
        refused(tp=2, ep=2, etp=4, world_size=8)
        == "degrees.etp: etp(4) must be 1 or equal to tp(2)"
    )
    # torchtitan only checks etp when ep > 1; meshconf always does (docs/migration.md).
    assert refused(tp=2, ep=1, etp=4, world_size=8) == (
        "degrees.etp: etp(4) must be 1 or equal to tp(2)"
    )


def test_experts_must_fit_in_dp_shard_cp_tp() -> None:
    """torchtitan 0.2 accepts this and fails inside torch when it unflattens the mesh."""
    assert refused(dp_shard=2, tp=2, ep=8, world_size=4) == (
        "degrees.ep: ep(8) * etp(1) = 8 must divide dp_shard(2) * cp(1) * tp(2) = 4: experts "
        "borrow their ranks from those dims"
    )


def test_enabled_flags_and_sizes() -> None:
    parallel_dims = dims(dp_replicate=2, cp=2, tp=4, pp=2, ep=4, world_size=128)
    enabled = {
        name: getattr(parallel_dims, f"{name}_enabled")
        for name in (
            "dp",
            "dp_replicate",
            "dp_shard",
            "cp",
            "dp_cp",
            "fsdp",
            "tp",
            "pp",
            "ep",
            "etp",
        )
    }
    assert enabled == {
        "dp": True,
        "dp_replicate": True,
        "dp_shard": True,
        "cp": True,
        "dp_cp": True,
        "fsdp": True,
        "tp": True,
        "pp": True,
        "ep": True,
        "etp": False,
    }
    assert parallel_dims.dp_shard == 4
    assert parallel_dims.non_data_parallel_size == 2 * 4 * 2
    assert parallel_dims.seq_len_divisor == 4 * 2 * 2
    assert parallel_dims.fsdp_gradient_divide_factor == 2 * 4 * 2
    only_tp = dims(dp_shard=1, tp=8, world_size=8)
    assert (only_tp.dp_enabled, only_tp.fsdp_enabled, only_tp.dp_cp_enabled) == (False,) * 3
    cp_only = dims(dp_shard=1, cp=2, world_size=2)
    assert (cp_only.dp_enabled, cp_only.fsdp_enabled, cp_only.dp_cp_enabled) == (
        False,
        True,
        True,
    )


def test_equal_degrees_are_equal() -> None:
    assert dims(tp=2, world_size=8) == dims(dp_shard=4, tp=2, world_size=8)
    assert dims(tp=2, world_size=8) != dims(tp=4, world_size=8)


# One rank ------------------------------------------------------------------------------


def _single_rank(rank: int, environ: dict[str, str]) -> None:
    # No launcher variables: a plain `python train.py` on one GPU or CPU.
    parallel_dims = dims(world_size=1)
    try:
        assert parallel_dims.get_optional_mesh("tp") is None  # builds lazily
        world = parallel_dims.world_mesh
        assert (world.mesh_dim_names, world.size()) == (("world",), 1)
        assert parallel_dims.build_mesh() is world
        assert parallel_dims.get_all_one_dimensional_meshes() == {}
        # fsdp is off at size 1 here, as in torchtitan (DistributedContext keeps it on).
        assert parallel_dims.get_optional_mesh("fsdp") is None
        assert parallel_dims.get_optional_mesh("efsdp") is None
        with pytest.raises(InvalidArgumentError) as raised:
            parallel_dims.get_mesh("tp")
        assert str(raised.value) == (
            "mesh ['tp'] is not available: tp=1; use get_optional_mesh to get None instead"
        )
        with pytest.raises(ValueError) as raised:
            parallel_dims.get_mesh("efsdp")
        assert str(raised.value) == (
            "mesh ['efsdp'] is not available: efsdp=1 (efsdp exists only when ep > 1); use "
            "get_optional_mesh to get None instead"
        )
        with pytest.raises(ValueError) as raised:
            parallel_dims.get_optional_mesh("dp")
        assert str(raised.value) == (
            "Invalid mesh dim 'dp': the one-dim meshes are pp, batch, loss, dp_replicate, "
            "fsdp, cp, tp, ep, efsdp, etp"
        )
        # The state torchtitan 0.2's tests read: every one-dim mesh by name, size 1 too.
        assert list(parallel_dims._meshes) == list(MESH_DIMS)
        assert {mesh.size() for mesh in parallel_dims._meshes.values()} == {1}
    finally:
        parallel_dims.context.close()
    assert not dist.is_initialized()


def test_a_single_rank_has_a_world_mesh_and_no_enabled_dims() -> None:
    # In a child process: a process that has run torch's collectives and then forks the
    # 8-rank tests' workers can leave them waiting on locks copied mid-use.
    run_ranks(_single_rank, 1)


# Eight ranks ---------------------------------------------------------------------------


def _ranks(mesh: Any) -> list[int]:
    return sorted(dist.get_process_group_ranks(mesh.get_group()))


def _hsdp_tp(rank: int, environ: dict[str, str]) -> None:
    import os

    os.environ.update(environ)
    parallel_dims = dims(dp_replicate=2, dp_shard=2, tp=2, world_size=8)
    world = parallel_dims.build_mesh()
    context = parallel_dims.context
    try:
        assert world.get_group() is dist.group.WORLD and world.size() == 8
        tp = [rank - rank % 2, rank - rank % 2 + 1]
        batch = [rank % 2 + offset for offset in (0, 2, 4, 6)]
        expected = {
            "batch": batch,
            "loss": batch,
            "dp_replicate": [rank % 4, rank % 4 + 4],
            "fsdp": [rank - rank % 4 + rank % 2, rank - rank % 4 + rank % 2 + 2],
            "tp": tp,
            "efsdp": [rank - rank % 4 + offset for offset in range(4)],
        }
        one_dimensional = parallel_dims.get_all_one_dimensional_meshes()
        assert list(one_dimensional) == ["batch", "loss", "dp_replicate", "fsdp", "tp", "efsdp"]
        for name, mesh in one_dimensional.items():
            assert mesh.mesh_dim_names == (name,)
            assert _ranks(mesh) == expected[name], name
            if name != "efsdp":
                assert parallel_dims.get_mesh(name) is mesh
            total = all_reduce(torch.tensor([float(rank)]), "sum", mesh).item()
            assert total == sum(expected[name]), name
        # efsdp has 4 ranks here but is off, as in torchtitan: it exists only when ep > 1.
        for name in ("pp", "cp", "ep", "etp", "efsdp"):
            assert parallel_dims.get_optional_mesh(name) is None, name
        hsdp = parallel_dims.get_mesh(["dp_replicate", "fsdp"])
        assert hsdp.mesh_dim_names == ("dp_replicate", "fsdp") and tuple(hsdp.shape) == (2, 2)
        assert parallel_dims.get_optional_mesh(["dp_replicate", "ep"]) is None
        assert parallel_dims.get_mesh(["batch", "tp"]).shape == (4, 2)
        with pytest.raises(ValueError) as raised:
            parallel_dims.get_mesh(["fsdp", "dp_replicate"])
        assert str(raised.value) == (
            "mesh dims ['fsdp', 'dp_replicate'] are all in mesh 'dense' but in another "
            "order; ask for ['dp_replicate', 'fsdp']"
        )
        with pytest.raises(ValueError) as raised:
            parallel_dims.get_mesh(["dp_replicate", "batch"])
        assert str(raised.value) == (
            "no mesh holds all of ['dp_replicate', 'batch']; the meshes are dataloading "
            "['pp', 'batch', 'cp', 'tp']; loss ['pp', 'loss', 'tp']; dense ['pp', "
            "'dp_replicate', 'fsdp', 'tp']; sparse ['pp', 'dp_replicate', 'efsdp', 'ep', 'etp']"
        )
        # The same object on every request, as torchtitan's cache gives.
        assert parallel_dims.get_mesh(["dp_replicate", "fsdp"]) is hsdp
        assert parallel_dims._meshes["tp"] is parallel_dims.get_mesh("tp")
        # One communicator per distinct group: batch and loss are one group, and efsdp is
        # the 4 ranks of a node-sized block that no other dim holds.
        layouts = list(parallel_dims.config.layouts.values())
        assert context.counters.real_groups == process_group_count(layouts, rank) == 5
    finally:
        context.close()


def test_hsdp_with_tensor_parallel_on_8_processes() -> None:
    run_ranks(_hsdp_tp, 8)


def _moe(
    rank: int, environ: dict[str, str], degrees: dict[str, int], groups: dict[str, Any]
) -> None:
    import os

    os.environ.update(environ)
    parallel_dims = dims(world_size=8, **degrees)
    try:
        for name, expected in groups.items():
            mesh = parallel_dims.get_optional_mesh(name)
            if expected is None:
                assert mesh is None, name
            else:
                assert _ranks(mesh) == expected(rank), name
        efsdp = parallel_dims.get_mesh("efsdp")  # kept for FSDP's mixed precision while ep > 1
        assert efsdp.size() == parallel_dims.config.dim_sizes["efsdp"]
        sparse = parallel_dims.get_mesh(
            ["dp_replicate", "efsdp"] if degrees.get("dp_replicate") else ["efsdp", "ep"]
        )
        assert sparse.ndim == 2
    finally:
        parallel_dims.context.close()


@pytest.mark.parametrize(
    ("degrees", "groups"),
    [
        pytest.param(
            {"dp_shard": 4, "tp": 2, "ep": 2},
            {
                "ep": lambda r: [r - r % 2, r - r % 2 + 1],
                "efsdp": lambda r: [r % 2 + o for o in (0, 2, 4, 6)],
                "etp": None,
            },
            id="ep2-etp1: ep borrows the tp ranks",
        ),
        pytest.param(
            {"dp_shard": 4, "tp": 2, "ep": 2, "etp": 2},
            {
                "ep": lambda r: [r - r % 4 + r % 2, r - r % 4 + r % 2 + 2],
                "etp": lambda r: [r - r % 2, r - r % 2 + 1],
                "efsdp": lambda r: [r % 4, r % 4 + 4],
            },
            id="ep2-etp=tp2: etp is the tp group",
        ),
        pytest.param(
            {"dp_shard": 4, "tp": 2, "ep": 4, "etp": 2},
            {
                "ep": lambda r: [r % 2 + o for o in (0, 2, 4, 6)],
                "etp": lambda r: [r - r % 2, r - r % 2 + 1],
                "efsdp": lambda r: [r],
            },
            id="ep4-etp2: efsdp of size 1 still exists",
        ),
        pytest.param(
            {"dp_replicate": 2, "dp_shard": 4, "ep": 4},
            {
                "ep": lambda r: [r - r % 4 + o for o in range(4)],
                "dp_replicate": lambda r: [r % 4, r % 4 + 4],
                "tp": None,
            },
            id="hsdp-ep4: ep inside each replica",
        ),
    ],
)
def test_mixture_of_experts_layouts_on_8_processes(
    degrees: dict[str, int], groups: dict[str, Any]
) -> None:
    run_ranks(_moe, 8, degrees, groups)
