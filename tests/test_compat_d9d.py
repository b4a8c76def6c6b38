"""meshconf.compat.d9d and the d9d-style members of DistributedContext: d9d's field names in,
d9d's domains and dim names out, and the process helpers on 8 gloo processes as 2 nodes of 4."""

from __future__ import annotations

import logging
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
    expert = config.layout("expert")
    assert (expert.dim_names, expert.shape) == (("pp", "ep_replicate", "ep_shard"), (1, 16, 1))


@pytest.mark.parametrize(
    "degrees",
    [
        {"pipeline_parallel": 2, "data_parallel_replicate": 2, "expert_parallel": 2},
        {"data_parallel_shard": 4, "expert_parallel": 4},
        {"data_parallel_replicate": 4, "expert_parallel": 4},
        {"context_parallel_shard": 2, "context_parallel_replicate": 2, "expert_parallel": 2},
        {"data_parallel_replicate": 8, "data_parallel_shard": 2, "expert_parallel": 4},
    ],
)
def test_expert_groups_are_d9d_s_when_tp_is_1(degrees: dict[str, int]) -> None:
    """d9d's expert mesh is the world reshaped to (pp, ranks per stage / ep, ep)."""
    parameters = DeviceMeshParameters(**degrees)
    expert = parameters.to_mesh_config().layout("expert")
    pp, ep = parameters.pipeline_parallel, parameters.expert_parallel
    replicas = parameters.world_size // (pp * ep)
    assert expert.shape == (pp, replicas, ep)
    for rank in range(parameters.world_size):
        stage, rest = divmod(rank, replicas * ep)
        replica, shard = divmod(rest, ep)
        first = stage * replicas * ep
        assert expert.group(rank, "ep_shard").ranks() == [
            first + replica * ep + s for s in range(ep)
        ]
        assert expert.group(rank, "ep_replicate").ranks() == [
            first + r * ep + shard for r in range(replicas)
        ]


def test_with_tp_the_expert_shards_take_tp_ranks_and_cover_the_world() -> None:
    """d9d accepts these, and its expert mesh then leaves tp out: (1, 1 // 4 = 0, 4) and
    (1, 2 // 4 = 0, 4), no ranks at all. Here ep_replicate counts the tp ranks too."""
    for degrees in ({"tensor_parallel": 4}, {"data_parallel_shard": 2, "tensor_parallel": 2}):
        parameters = DeviceMeshParameters(**degrees, expert_parallel=4)
        expert = parameters.to_mesh_config().layout("expert")
        assert (expert.dim_names, expert.shape) == (("pp", "ep_replicate", "ep_shard"), (1, 1, 4))
        assert expert.group(3, "ep_shard").ranks() == [0, 1, 2, 3]
    parameters = DeviceMeshParameters(
        data_parallel_replicate=2, data_parallel_shard=2, tensor_parallel=2, expert_parallel=2
    )
    expert = parameters.to_mesh_config().layout("expert")
    assert expert.shape == (1, 4, 2)
    assert expert.group(5, "ep_shard").ranks() == [4, 5]
    assert expert.group(5, "ep_replicate").ranks() == [1, 3, 5, 7]


def test_expert_parallel_must_divide_the_ranks_of_a_stage() -> None:
    with pytest.raises(ValidationError) as raised:
        DeviceMeshParameters(data_parallel_shard=4, tensor_parallel=2, expert_parallel=3)
    assert isinstance(raised.value, ValueError)
    (error,) = raised.value.errors()
    assert error["loc"] == ("expert_parallel",)
    assert error["msg"] == (
        "expert_parallel(3) must divide data_parallel_replicate * data_parallel_shard * "
        "context_parallel_shard * context_parallel_replicate * tensor_parallel = 8: the expert "
        "domain splits the ranks of a pipeline stage into ep_replicate x ep_shard"
    )


FLAGS = {
    "pipeline_parallel": "has_pipeline_parallel",
    "data_parallel_replicate": "has_data_parallel_replicate",
    "data_parallel_shard": "has_data_parallel_shard",
    "context_parallel_replicate": "has_context_parallel_replicate",
    "context_parallel_shard": "has_context_parallel_shard",
    "tensor_parallel": "has_tensor_parallel",
    "expert_parallel": "has_expert_parallel",
}


@pytest.mark.parametrize("field", list(FLAGS))
def test_each_has_flag_follows_its_degree(field: str) -> None:
    degrees = {field: 4} if field != "expert_parallel" else {"tensor_parallel": 4, field: 4}
    parameters = DeviceMeshParameters(**degrees)
    assert {flag: getattr(parameters, flag) for flag in FLAGS.values()} == {
        flag: name in degrees for name, flag in FLAGS.items()
    }
    assert parameters.is_distributed
    assert not DeviceMeshParameters().is_distributed


def test_a_degree_below_1_is_refused() -> None:
    """d9d takes any integer here; 0 makes a world of no ranks."""
    with pytest.raises(ValidationError) as raised:
        DeviceMeshParameters(tensor_parallel=0)
    assert raised.value.errors()[0]["msg"] == "expected an integer >= 1, got 0"


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
        data_parallel_replicate=2, data_parallel_shard=2, tensor_parallel=2, expert_parallel=2
    )
    with parameters.build() as ctx:
        assert (ctx.node_rank, ctx.num_nodes) == (rank // 4, 2)
        assert ctx.master_addr == "127.0.0.1" and ctx.mesh_params is parameters
        expert = ctx.mesh_for(d9d.EXPERT_DOMAIN)
        assert (expert.mesh_dim_names, tuple(expert.shape)) == (
            ("pp", "ep_replicate", "ep_shard"),
            (1, 4, 2),
        )
        ep_shard = sorted(dist.get_process_group_ranks(expert.get_group("ep_shard")))
        assert ep_shard == [rank - rank % 2, rank - rank % 2 + 1]
        ep_replicate = sorted(dist.get_process_group_ranks(expert.get_group("ep_replicate")))
        assert ep_replicate == [rank % 2 + offset for offset in (0, 2, 4, 6)]
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


def _without_launcher(rank: int, environ: dict[str, str]) -> None:
    with DeviceMeshParameters().build(log_level=logging.WARNING) as ctx:
        assert (ctx.num_nodes, ctx.node_rank, ctx.local_rank) == (1, 0, 0)
        assert ctx.master_addr == "127.0.0.1"
        assert ctx.is_main_process and ctx.is_local_main_process
        assert ctx.logger.level == logging.WARNING
        # d9d has no meshes in a world of one and raises here; meshconf gives 1-rank meshes.
        assert ctx.mesh_for(d9d.REGULAR_DOMAIN).size() == 1
        with pytest.raises(ValueError, match="unknown domain 'sparse'"):
            ctx.mesh_for("sparse")
        ctx.wait_world()
        ctx.set_timeout(10.0)


def test_a_process_without_a_launcher_is_one_node() -> None:
    run_ranks(_without_launcher, 1)
