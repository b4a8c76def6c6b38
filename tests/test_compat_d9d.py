"""meshconf.compat.d9d and the d9d-style members of DistributedContext: d9d's field names in,
d9d's domains and dim names out, and the process helpers on 8 gloo processes as 2 nodes of 4."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch.distributed as dist
from distributed import run_ranks
from pydantic import ValidationError

from meshconf.compat import d9d
from meshconf.compat.d9d import DeviceMeshParameters

MIGRATION_EXAMPLE = DeviceMeshParameters(
    pipeline_parallel=2, data_parallel_replicate=2, data_parallel_shard=16, expert_parallel=8
)


def test_the_domain_constants_name_the_config_s_domains() -> None:
    # The names themselves are d9d's: test_domains_have_d9d_s_dims_and_groups spells them out.
    constants = [d9d.DENSE_DOMAIN, d9d.EXPERT_DOMAIN, d9d.BATCH_DOMAIN, d9d.REGULAR_DOMAIN]
    assert list(MIGRATION_EXAMPLE.to_mesh_config().layouts) == [*constants, d9d.FLAT_DOMAIN]


def test_every_degree_defaults_to_1_and_the_world_is_their_product() -> None:
    assert DeviceMeshParameters().world_size == 1
    assert MIGRATION_EXAMPLE.world_size == 64


def test_domains_have_d9d_s_dims_and_groups() -> None:
    config = MIGRATION_EXAMPLE.to_mesh_config()
    shapes = {name: (layout.dim_names, layout.shape) for name, layout in config.layouts.items()}
    assert shapes == {
        "dense": (("pp", "dp_replicate", "dp_cp_shard", "cp_replicate", "tp"), (2, 2, 16, 1, 1)),
        "expert": (("pp", "ep_replicate", "ep_shard"), (2, 4, 8)),
        "batch": (("pp", "dp", "cp", "tp"), (2, 32, 1, 1)),
        "regular": (
            ("pp", "dp_replicate", "dp_shard", "cp_shard", "cp_replicate", "tp"),
            (2, 2, 16, 1, 1, 1),
        ),
        "flat": (("world",), (64,)),
    }
    expert = config.layout("expert")
    assert expert.group(9, "ep_shard").ranks() == list(range(8, 16))
    # ep_replicate takes dp_replicate's ranks too, as in d9d.
    assert expert.group(9, "ep_replicate").ranks() == [1, 9, 17, 25]
    assert config.layout("dense").group(9, "dp_cp_shard").ranks() == list(range(16))


def test_context_parallel_splits_into_shard_and_replicate() -> None:
    parameters = DeviceMeshParameters(
        data_parallel_shard=2,
        context_parallel_shard=2,
        context_parallel_replicate=2,
        tensor_parallel=2,
    )
    config = parameters.to_mesh_config()
    regular = config.layout("regular")
    assert regular.dim_names == ("pp", "dp_replicate", "dp_shard", "cp_shard", "cp_replicate", "tp")
    assert [
        regular.group(0, dim).ranks() for dim in ("dp_shard", "cp_shard", "cp_replicate", "tp")
    ] == [
        [0, 8],
        [0, 4],
        [0, 2],
        [0, 1],
    ]
    dense = config.layout("dense")
    assert dense.group(0, "dp_cp_shard").ranks() == [0, 4, 8, 12]
    # tp > 1: the expert domain keeps tp last, so that it covers the world.
    assert config.layout("expert").dim_names == ("pp", "ep_replicate", "ep_shard", "tp")


def test_expert_parallel_must_split_the_data_and_context_ranks() -> None:
    with pytest.raises(ValidationError) as raised:
        DeviceMeshParameters(data_parallel_shard=2, tensor_parallel=4, expert_parallel=4)
    (error,) = raised.value.errors()
    assert error["loc"] == ("expert_parallel",)
    assert error["msg"] == (
        "expert_parallel(4) must divide data_parallel_replicate * data_parallel_shard * "
        "context_parallel_shard * context_parallel_replicate = 2: the expert domain splits "
        "those ranks into ep_replicate x ep_shard"
    )


def test_fields_are_strict_and_known() -> None:
    with pytest.raises(ValidationError) as raised:
        DeviceMeshParameters(pipeline_paralel=2)  # type: ignore[call-arg]
    assert raised.value.errors()[0]["type"] == "extra_forbidden"
    with pytest.raises(ValidationError) as raised:
        DeviceMeshParameters(tensor_parallel="8")  # type: ignore[arg-type]
    assert raised.value.errors()[0]["msg"] == (
        "expected an integer >= 1, got the string '8' (a quoted number is a string; write the "
        "integer you mean, unquoted)"
    )


def _process_helpers(rank: int, environ: dict[str, str], scratch: Path) -> None:
    os.environ.update(environ)
    parameters = DeviceMeshParameters(
        data_parallel_replicate=2, data_parallel_shard=2, tensor_parallel=2
    )
    with parameters.build() as ctx:
        assert (ctx.node_rank, ctx.num_nodes) == (rank // 4, 2)
        assert ctx.is_main_process == (rank == 0)
        assert ctx.is_local_main_process == (rank % 4 == 0)
        assert ctx.current_device == ctx.device
        dense = ctx.mesh_for(d9d.DENSE_DOMAIN)
        assert dense["dp_replicate", "dp_cp_shard"].shape == (2, 2)
        assert ctx.mesh_for(d9d.FLAT_DOMAIN).get_group() is dist.group.WORLD

        shared = scratch / "main.txt"
        with ctx.main_process_first():
            if ctx.is_main_process:
                shared.write_text("written by rank 0")
            else:
                assert shared.read_text() == "written by rank 0"
        per_node = scratch / f"node{ctx.node_rank}.txt"
        with ctx.local_main_process_first():
            if ctx.is_local_main_process:
                per_node.write_text(f"rank {rank}")
            else:
                assert per_node.read_text() == f"rank {rank - rank % 4}"
        ctx.wait_world()

        ctx.set_timeout(42)
        tp_group = ctx.get_mesh("tp").get_group()
        for group in (dist.group.WORLD, tp_group):
            assert group._get_backend(ctx.device).options._timeout.total_seconds() == 42
        later = ctx.get_mesh("dp_replicate").get_group()  # created after set_timeout
        assert later._get_backend(ctx.device).options._timeout.total_seconds() == 42
        with pytest.raises(ValueError, match="a timeout must be a positive number of seconds"):
            ctx.set_timeout(0)


def test_process_helpers_on_2_nodes_of_4(tmp_path: Path) -> None:
    run_ranks(_process_helpers, 8, tmp_path, local_world_size=4)
