"""meshconf.compat.nemo_automodel against NeMo AutoModel's own code (0.7.0, installed by the
peers stage without its requirements, which pin another transformers: only its mesh modules
are imported, and they need torch alone): the meshes NeMo AutoModel builds for the same sizes
with its FSDP2 strategy, axis by axis, flattened axes included, and its MeshContext reading
meshconf's meshes.

On torch's fake process group, which simulates each world in one forked child process.
"""

from __future__ import annotations

import itertools
from typing import Any

import pytest
import torch.distributed as dist
from distributed import in_child
from nemo_automodel.components.distributed.config import FSDP2Config
from nemo_automodel.components.distributed.mesh import MeshContext, ParallelismSizes

from meshconf import ConfigError, load_config
from meshconf.compat.nemo_automodel import (
    DEVICE_MESH_DIMS,
    FLATTENED,
    check_config,
    meshes,
)
from meshconf.runtime import DistributedContext


def _layouts() -> list[dict[str, int]]:
    """pp, dp_replicate, dp_shard, cp, tp of 1 or 2 and ep dividing dp_shard * cp * tp, on 2
    to 8 ranks, that NeMo AutoModel's FSDP2 strategy accepts."""
    layouts = []
    for pp, replicate, shard, cp, tp in itertools.product((1, 2), repeat=5):
        world = pp * replicate * shard * cp * tp
        if not 1 < world <= 8 or (replicate > 1 and shard == 1):
            continue
        for ep in (1, 2, 4):
            if (shard * cp * tp) % ep == 0:
                degrees = {"pp": pp, "dp_replicate": replicate, "dp_shard": shard}
                layouts.append({**degrees, "cp": cp, "tp": tp, "ep": ep})
    return layouts


def _ranks(mesh: Any) -> list[int]:
    return dist.get_process_group_ranks(mesh.get_group())


def _same_as_nemo(degrees: dict[str, int]) -> None:
    world = 1
    for name in DEVICE_MESH_DIMS:
        world *= degrees[name]
    config = load_config({"world_size": world, "degrees": degrees})
    sizes = ParallelismSizes(
        dp_size=degrees["dp_replicate"] * degrees["dp_shard"],
        dp_replicate_size=degrees["dp_replicate"],
        tp_size=degrees["tp"],
        pp_size=degrees["pp"],
        cp_size=degrees["cp"],
        ep_size=degrees["ep"],
    )
    for rank in range(world):
        context = DistributedContext.simulate(config, rank=rank, world_size=world)
        try:
            device_mesh, moe_mesh = meshes(context)
            theirs = MeshContext.build(FSDP2Config(), sizes, world_size=world)
            assert device_mesh.mesh_dim_names == theirs.device_mesh.mesh_dim_names
            for name in (*DEVICE_MESH_DIMS, *FLATTENED):
                mine, nemo = device_mesh[name], theirs.device_mesh[name]
                assert _ranks(mine) == _ranks(nemo), (degrees, rank, name)
                assert mine.get_local_rank() == nemo.get_local_rank()
            assert (moe_mesh is None) == (theirs.moe_mesh is None)
            if moe_mesh is not None:
                assert moe_mesh.mesh_dim_names == theirs.moe_mesh.mesh_dim_names
                for name in ("ep_shard", "ep"):
                    assert _ranks(moe_mesh[name]) == _ranks(theirs.moe_mesh[name]), (rank, name)
            # NeMo AutoModel's own context reads the sizes off meshconf's meshes.
            read = MeshContext.from_meshes(device_mesh, moe_mesh, strategy_config=FSDP2Config())
            assert (read.tp_size, read.cp_size, read.ep_size, read.dp_shard_size) == (
                degrees["tp"],
                degrees["cp"],
                degrees["ep"],
                degrees["dp_shard"],
            )
        finally:
            context.close()


@pytest.mark.timeout(300)
def test_nemo_automodel_s_own_meshes_equal_meshconf_s_on_every_rank() -> None:
    """Fake process group: every rank of each generated layout."""
    layouts = _layouts()
    assert len(layouts) == 44
    for degrees in layouts:
        in_child(_same_as_nemo, degrees)


def test_what_nemo_automodel_refuses_is_refused_at_its_key() -> None:
    degrees = {"dp_replicate": 2, "dp_shard": 1, "cp": 2, "tp": 2, "ep": 2, "etp": 2}
    config = load_config({"degrees": degrees})
    with pytest.raises(ConfigError) as raised:
        check_config(config)
    assert type(raised.value) is ConfigError
    assert str(raised.value) == (
        "degrees.etp: NeMo AutoModel keeps each expert whole on its rank; set degrees.etp to 1\n"
        "degrees.dp_replicate: NeMo AutoModel's FSDP2 strategy refuses plain replication "
        "(dp_shard 1): set degrees.dp_shard to 2 and degrees.dp_replicate to 1, or "
        "degrees.dp_shard above 1 as well (HSDP)"
    )
