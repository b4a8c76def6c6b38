"""DistributedContext on 8 real processes (gloo, CPU, forked): groups equal the layout math,
collectives sum what they should, groups are deduplicated and lazy."""

from __future__ import annotations

import torch
import torch.distributed as dist
from distributed import run_ranks

from meshconf import DistributedContext, load_config
from meshconf.layout import process_group_count
from meshconf.runtime import all_reduce

CONFIG = {"world_size": 8, "degrees": {"dp_replicate": 2, "dp_shard": 2, "tp": 2, "ep": 2}}


def _groups_match_layout(rank: int, environ: dict[str, str]) -> None:
    with DistributedContext(load_config(CONFIG), environ=environ) as ctx:
        assert (ctx.rank, ctx.world_size, ctx.backend) == (rank, 8, "gloo")
        meshes = ctx.build_all()
        for domain, mesh in meshes.items():
            layout = ctx.config.layout(domain)
            assert mesh.mesh_dim_names == layout.dim_names
            assert mesh.mesh.tolist() == torch.arange(8).reshape(layout.shape).tolist()
            for dim in layout.dims:
                expected = layout.group(rank, dim.name).ranks()
                assert dist.get_process_group_ranks(mesh.get_group(dim.name)) == expected
                assert mesh.get_local_rank(dim.name) == layout.coordinate(rank)[dim.name]
                if dim.size > 1:
                    total = all_reduce(torch.tensor([float(rank)]), "sum", ctx.get_mesh(dim.name))
                    assert total.item() == sum(expected), (domain, dim.name)
        hsdp = ctx.get_mesh(["dp_replicate", "fsdp"])
        assert hsdp.shape == (2, 2)
        expected = ctx.config.layout("dense").group(rank, ["dp_replicate", "fsdp"]).ranks()
        assert all_reduce(torch.tensor([float(rank)]), "sum", hsdp).item() == sum(expected)
        assert all_reduce(torch.tensor([float(rank)]), "avg", hsdp).item() == sum(expected) / 4
        assert all_reduce(torch.tensor([3.0]), "max", None).item() == 3.0
        # One communicator per distinct multi-rank group: exactly the layout math's count.
        distinct = process_group_count(list(ctx.config.layouts.values()), rank)
        assert ctx.counters.real_groups == distinct, (ctx.counters, distinct)
        assert ctx.counters.default_group_reuses == 0
        assert ctx.counters.new_group_calls == ctx.counters.real_groups + ctx.counters.fake_groups
        assert ctx.coordinate("dense") == ctx.config.layout("dense").coordinate(rank)


def test_every_group_equals_the_layout_math_on_8_processes() -> None:
    run_ranks(_groups_match_layout, 8)


def _lazy(rank: int, environ: dict[str, str]) -> None:
    config = load_config({**CONFIG, "degrees": {**CONFIG["degrees"], "ep": 4}})
    with DistributedContext(config, environ=environ) as ctx:
        assert ctx.counters.new_group_calls == 0
        ctx.mesh_for("dense")
        dense_only = ctx.counters.real_groups
        # dense: dp_replicate, fsdp, tp (pp is a size-1 fake group)
        assert dense_only == 3 and ctx.counters.fake_groups == 1
        ctx.mesh_for("dense")
        assert ctx.counters.real_groups == dense_only
        ctx.mesh_for("sparse")
        # sparse adds ep (4 ranks) and efsdp, size 1 but kept real for FSDP since ep > 1;
        # pp, etp (size-1 fakes) and dp_replicate are shared with dense.
        assert ctx.counters.real_groups == dense_only + 2
        assert ctx.counters.fake_groups == 1
        ep_group = ctx.config.layout("sparse").group(rank, "ep").ranks()
        assert dist.get_process_group_ranks(ctx.get_mesh("ep").get_group()) == ep_group
        assert ctx.get_mesh("efsdp").size() == 1


def test_domains_build_lazily_and_share_groups() -> None:
    run_ranks(_lazy, 8)


def _world_spanning(rank: int, environ: dict[str, str]) -> None:
    config = load_config({"world_size": 8, "degrees": {"dp_shard": 8}})
    with DistributedContext(config, environ=environ) as ctx:
        fsdp = ctx.get_mesh("fsdp")
        assert fsdp.get_group() is dist.group.WORLD
        assert ctx.counters.default_group_reuses == 1 and ctx.counters.real_groups == 0
        assert all_reduce(torch.tensor([1.0]), "sum", fsdp).item() == 8


def test_a_dim_spanning_the_world_reuses_the_default_group() -> None:
    run_ranks(_world_spanning, 8)
