"""DistributedContext on 8 real processes (gloo, CPU, forked): groups equal hand-written rank
arithmetic and the layout math, collectives sum what they should, groups are deduplicated,
created up front by default and on first use with ``runtime.build: lazy``."""

from __future__ import annotations

import torch
import torch.distributed as dist
from distributed import assert_domains_hold_their_groups, run_ranks

from meshconf import DistributedContext, load_config
from meshconf.core.layout import process_group_count
from meshconf.runtime import RuntimeSetupError, TopologyWarning, all_reduce

CONFIG = {"world_size": 8, "degrees": {"dp_replicate": 2, "dp_shard": 2, "tp": 2, "ep": 2}}


def _groups_match_layout(rank: int, environ: dict[str, str]) -> None:
    with DistributedContext(load_config(CONFIG), environ=environ) as ctx:
        assert (ctx.rank, ctx.world_size, ctx.backend) == (rank, 8, "gloo")
        # Eager by default: every group exists once the context does.
        created = ctx.counters.new_group_calls
        meshes = ctx.build_all()
        assert ctx.counters.new_group_calls == created
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
    config = load_config(
        {**CONFIG, "degrees": {**CONFIG["degrees"], "ep": 4}, "runtime": {"build": "lazy"}}
    )
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


def _closing_barrier_outlives_the_context(rank: int, environ: dict[str, str]) -> None:
    from meshconf.runtime import context

    config = load_config({"world_size": 2, "degrees": {"dp_shard": 2}})
    with DistributedContext(config, environ=environ) as ctx:
        all_reduce(torch.tensor([1.0]), "sum", ctx.get_mesh("fsdp"))
    kept = context._LAST_BARRIERS[-1]
    assert kept.is_completed() and not dist.is_initialized()


def test_the_closing_barrier_is_freed_at_exit_on_the_main_thread() -> None:
    """The abort this guards against is a race at interpreter exit, which forked test ranks
    never reach: a script that closed its context and exited at once aborted in 1 of 15
    torchrun runs (docs/tutorial.md), and in 0 of 40 with the barrier kept. So this checks
    the mechanism: close() keeps its last barrier, finished, after the groups are gone."""
    run_ranks(_closing_barrier_outlives_the_context, 2)


# Two "nodes" of 4 ranks: dp_shard and tp inside each node, cp across the two. Row-major
# would put cp inside a node (ranks 0 and 2) and dp_shard across (0 and 4).
TWO_NODES = {
    "world_size": 8,
    "gpus_per_node": 4,
    "degrees": {"dp_shard": 2, "cp": 2, "tp": 2, "ep": 2},
    "inside_node": {"dp_shard": 2, "cp": 1, "tp": 2},
}


def _hierarchical_groups(rank: int, environ: dict[str, str]) -> None:
    with DistributedContext(load_config(TWO_NODES), environ=environ) as ctx:
        assert (ctx.local_rank, ctx.local_world_size) == (rank % 4, 4)
        assert ctx.topology_warnings == []
        node, local = divmod(rank, 4)
        expected = {
            "tp": [rank - rank % 2, rank - rank % 2 + 1],
            "cp": [local, local + 4],
            "fsdp": [rank % 2, rank % 2 + 2, rank % 2 + 4, rank % 2 + 6],
            "batch": [node * 4 + local % 2, node * 4 + local % 2 + 2],
            "ep": [rank - rank % 2, rank - rank % 2 + 1],
        }
        assert_domains_hold_their_groups(ctx, rank, expected)
        # Every domain's mesh numbers the ranks the same way, so meshes of one dim taken from
        # two domains are equal, and DTensors built on either can meet.
        assert not ctx.config.layout("dataloading").is_row_major
        assert ctx.mesh_for("dataloading")["tp"] == ctx.mesh_for("dense")["tp"]
        # batch (inside a node, stride 2) before cp (across, stride 4): torch will not slice
        # that pair out of the domain's mesh, so get_mesh builds it over the same groups.
        pair = ctx.get_mesh(["batch", "cp"])
        group = ctx.config.layout("dataloading").group(rank, ["batch", "cp"]).ranks()
        assert pair.mesh.flatten().tolist() == group
        assert list(pair.get_coordinate() or ()) == [group.index(rank) // 2, group.index(rank) % 2]
        assert all_reduce(torch.tensor([float(rank)]), "sum", pair).item() == sum(group)
        assert ctx.get_mesh(["batch", "cp"]) is pair


def test_hierarchical_placement_on_2_nodes_of_4_processes() -> None:
    run_ranks(_hierarchical_groups, 8, local_world_size=4)


def _node_size_from_the_launcher(rank: int, environ: dict[str, str]) -> None:
    import warnings

    config = load_config({"world_size": 8, "degrees": {"dp_shard": 1, "tp": 8}})
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ctx = DistributedContext(config, environ=environ)
    with ctx:
        assert ctx.config.gpus_per_node == 4
        assert ctx.topology_warnings == [
            "degrees.tp: tp groups of 8 ranks are mixed in domain 'dataloading' with 4 GPUs per "
            "node; tensor parallelism exchanges activations in every layer, so they belong on "
            "one node's fast links: use a tp that divides 4"
        ]
        emitted = [str(w.message) for w in caught if issubclass(w.category, TopologyWarning)]
        assert emitted == (ctx.topology_warnings if rank == 0 else [])


def test_the_launcher_s_node_size_drives_the_warnings_on_rank_0() -> None:
    run_ranks(_node_size_from_the_launcher, 8, local_world_size=4)


def _own_default_group(rank: int, environ: dict[str, str]) -> None:
    store = dist.TCPStore(  # type: ignore[attr-defined]
        "127.0.0.1", int(environ["MASTER_PORT"]), 8, is_master=False
    )
    dist.init_process_group("gloo", store=store, rank=rank, world_size=8)
    try:
        # No launcher variables: the script's default group says who this rank is, and its
        # store carries the config check.
        degrees = {"tp": 4 if rank == 2 else 2}
        config = load_config(
            {"world_size": 8, "degrees": degrees, "runtime": {"setup_timeout_s": 20}}
        )
        try:
            DistributedContext(config, environ={})
        except RuntimeSetupError as error:
            assert str(error).startswith("rank 2 loaded another config than rank 0"), error
        else:
            raise AssertionError("the ranks loaded different configs")
        assert dist.is_initialized()
    finally:
        dist.destroy_process_group()


def test_a_default_group_of_the_script_s_own_checks_the_configs_through_its_store() -> None:
    run_ranks(_own_default_group, 8)
