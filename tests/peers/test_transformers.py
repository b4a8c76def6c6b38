"""meshconf.compat.transformers against transformers' own code (the release .ci/run's peers
stage installs): the meshes transformers builds from the DistributedConfig meshconf gives
hold the groups of meshconf's dense and sparse domains, and transformers' own checks refuse
what meshconf refuses.

On torch's fake process group, which simulates each world in one forked child process.
"""

from __future__ import annotations

import itertools
from typing import Any

import pytest
import torch.distributed as dist
from distributed import in_child
from transformers import DistributedConfig
from transformers.distributed.utils import initialize_distributed_mesh

from meshconf import ConfigError, load_config
from meshconf.compat.transformers import check_config, distributed_config
from meshconf.runtime import DistributedContext

DENSE_DIMS = ("pp", "dp_replicate", "fsdp", "tp")
EXPERT_DIMS = ("efsdp", "ep")


def _layouts() -> list[dict[str, int]]:
    """Every layout of pp, dp_replicate, dp_shard, tp in 1, 2 and 4 and ep of 1, 2 or 4 dividing
    dp_shard * tp, on 2 to 8 ranks, that transformers accepts."""
    layouts = []
    for pp, replicate, shard, tp in itertools.product((1, 2, 4), repeat=4):
        world = pp * replicate * shard * tp
        if not 1 < world <= 8 or (pp > 1 and replicate * shard > 1):
            continue
        for ep in (1, 2, 4):
            if ep == 1 or (ep % tp == 0 and (shard * tp) % ep == 0):
                layouts.append(
                    {"pp": pp, "dp_replicate": replicate, "dp_shard": shard, "tp": tp, "ep": ep}
                )
    return layouts


def _groups(mesh: Any, dim: str) -> list[int]:
    return dist.get_process_group_ranks(mesh.get_group(dim))


def _ranks(mesh: Any) -> list[int]:
    return dist.get_process_group_ranks(mesh.get_group())


def _meshes_hold_meshconf_s_groups(degrees: dict[str, int]) -> None:
    world = degrees["pp"] * degrees["dp_replicate"] * degrees["dp_shard"] * degrees["tp"]
    config = load_config({"world_size": world, "degrees": degrees})
    for rank in range(world):
        context = DistributedContext.simulate(config, rank=rank, world_size=world)
        try:
            _, meshes = initialize_distributed_mesh(distributed_config(config))
            assert meshes is not None
            dense, expert = context.mesh_for("dense"), context.mesh_for("sparse")
            # transformers' own accessor: ep and efsdp from the expert mesh, the rest dense.
            for mine, dims in ((dense, DENSE_DIMS), (expert, EXPERT_DIMS)):
                for dim in dims:
                    theirs = meshes.get_mesh(dim)
                    assert _ranks(theirs) == _groups(mine, dim), (degrees, rank, dim)
                    assert theirs.get_local_rank() == mine.get_local_rank(dim)
        finally:
            context.close()


@pytest.mark.timeout(300)
def test_transformers_meshes_hold_the_dense_and_sparse_groups_on_every_rank() -> None:
    """Fake process group: every rank of each generated layout."""
    layouts = _layouts()
    assert len(layouts) == 43
    for degrees in layouts:
        in_child(_meshes_hold_meshconf_s_groups, degrees)


def _refusal(data: dict[str, object]) -> str:
    with pytest.raises(ConfigError) as raised:
        check_config(load_config(data))
    assert type(raised.value) is ConfigError
    return str(raised.value)


def test_context_parallelism_and_expert_tp_are_refused_at_their_keys() -> None:
    assert _refusal({"degrees": {"dp_shard": 2, "cp": 2, "tp": 2, "ep": 2, "etp": 2}}) == (
        "degrees.cp: transformers' DistributedConfig has no context parallelism; set degrees.cp "
        "to 1, or train with accelerate's ParallelismConfig (cp_size) or torchtitan\n"
        "degrees.etp: transformers keeps each expert whole on its rank; set degrees.etp to 1"
    )


def test_a_rank_order_of_the_config_s_own_is_refused() -> None:
    data = {
        "degrees": {"dp_shard": 2, "tp": 2},
        "order": ["tp", "pp", "dp_replicate", "dp_shard", "cp"],
    }
    assert _refusal(data) == (
        "order: transformers numbers the ranks pp, dp_replicate, fsdp, tp outer to inner and "
        "builds its meshes itself; leave order out (or give order that keeps that order), or "
        "hand meshconf's meshes to a trainer that takes them (accelerate, torchtitan)"
    )


@pytest.mark.parametrize(
    ("degrees", "expected", "theirs"),
    [
        (
            {"dp_shard": 2, "tp": 4, "ep": 2},
            "degrees.ep: transformers needs ep to be a multiple of tp (4) that divides dp_shard "
            "* tp (8); set degrees.ep to one of 4, 8",
            "`ep_size` must be a multiple of `tp_size`",
        ),
        (
            {"dp_shard": 4, "tp": 2, "ep": 1, "pp": 2},
            "degrees.pp: transformers does not combine FSDP with pipeline parallelism; set "
            "degrees.pp to 1, or dp_replicate and dp_shard to 1 (tp and pp only)",
            "Combining FSDP with pipeline parallelism is not supported",
        ),
    ],
)
def test_what_transformers_refuses_is_refused_first(
    degrees: dict[str, int], expected: str, theirs: str
) -> None:
    assert _refusal({"degrees": degrees}) == expected
    sizes = {"pp_size": 1, "ep_size": 1} | {
        {"dp_shard": "fsdp_size", "tp": "tp_size", "ep": "ep_size", "pp": "pp_size"}[k]: v
        for k, v in degrees.items()
    }
    with pytest.raises(ValueError, match=theirs):
        DistributedConfig(**sizes)


def test_the_sizes_are_the_config_s() -> None:
    config = load_config({"degrees": {"dp_replicate": 2, "dp_shard": 4, "tp": 2, "ep": 4}})
    result = distributed_config(config)
    sizes = (result.pp_size, result.dp_replicate_size, result.fsdp_size, result.tp_size)
    assert (*sizes, result.ep_size, result.efsdp_size) == (1, 2, 4, 2, 4, 2)
