"""Groups checked against expectations from outside meshconf's layout code.

- torch itself: ``init_device_mesh`` over the world factors, then ``_flatten`` and
  ``_unflatten`` into each domain's dims, the way torchtitan 0.3 builds its meshes, on
  torch's fake process group (one process standing in for 4,096 ranks, several ranks each);
- hand-written row-major groups in torchtitan's order (pp, dp_replicate, dp_shard, cp, tp)
  and torch's ``init_device_mesh`` on 8 real gloo processes;
- meshconf's own rank arithmetic (``meshconf.runtime.oracle``, which ``simulate`` reports
  on) against hand-written groups, hierarchical placement included.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from distributed import in_child, run_ranks
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from meshconf import DistributedContext, load_config
from meshconf.runtime import all_reduce
from meshconf.runtime.oracle import expected_groups
from meshconf.sources.loading import at_world_size

FACTORS = ("pp", "dp_replicate", "dp_shard", "cp", "tp")


def _torch_meshes(resolved: dict[str, int]) -> dict[tuple[str, str], DeviceMesh]:
    """Every (domain, dim) of the default domains as torch builds it, from the world mesh."""
    world = init_device_mesh(
        "cpu", tuple(resolved[name] for name in FACTORS), mesh_dim_names=FACTORS
    )
    fsdp = world["dp_shard", "cp"]._flatten("fsdp")
    batch = world["dp_replicate", "dp_shard"]._flatten("batch")
    loss = world["dp_replicate", "dp_shard", "cp"]._flatten("loss")
    ep, etp = resolved["ep"], resolved["etp"]
    efsdp = resolved["dp_shard"] * resolved["cp"] * resolved["tp"] // (ep * etp)
    experts = (
        world["dp_shard", "cp", "tp"]
        ._flatten("experts")
        ._unflatten(0, (efsdp, ep, etp), ("efsdp", "ep", "etp"))
    )
    one = {name: world[name] for name in FACTORS}
    return {
        ("dataloading", "pp"): one["pp"],
        ("dataloading", "batch"): batch,
        ("dataloading", "cp"): one["cp"],
        ("dataloading", "tp"): one["tp"],
        ("dense", "pp"): one["pp"],
        ("dense", "dp_replicate"): one["dp_replicate"],
        ("dense", "fsdp"): fsdp,
        ("dense", "tp"): one["tp"],
        ("sparse", "pp"): one["pp"],
        ("sparse", "dp_replicate"): one["dp_replicate"],
        ("sparse", "efsdp"): experts["efsdp"],
        ("sparse", "ep"): experts["ep"],
        ("sparse", "etp"): experts["etp"],
        ("loss", "pp"): one["pp"],
        ("loss", "loss"): loss,
        ("loss", "tp"): one["tp"],
    }


def _against_torch(degrees: dict[str, int], world_size: int, rank: int) -> None:
    context = DistributedContext.simulate(
        load_config({"degrees": degrees}), rank=rank, world_size=world_size
    )
    try:
        expected = _torch_meshes(context.config.resolved_degrees)
        assert len(expected) == sum(
            len(m.mesh_dim_names or ()) for m in context.build_all().values()
        )
        for (domain, dim), theirs in expected.items():
            mine = context.mesh_for(domain)
            assert mine[dim].mesh.tolist() == theirs.mesh.tolist(), (domain, dim)
            assert mine.get_local_rank(dim) == theirs.get_local_rank(), (domain, dim)
            assert dist.get_process_group_ranks(mine.get_group(dim)) == sorted(
                theirs.mesh.tolist()
            ), (domain, dim)
    finally:
        context.close()


@pytest.mark.parametrize("rank", [0, 1234, 2051, 4095])
@pytest.mark.parametrize(
    "degrees",
    [
        {"pp": 4, "dp_replicate": 2, "cp": 2, "tp": 8, "ep": 8},
        {"pp": 2, "dp_replicate": 4, "cp": 1, "tp": 4, "ep": 16, "etp": 4},
    ],
    ids=["llama-like", "experts-across-tp"],
)
def test_groups_equal_torch_s_own_flatten_and_unflatten(degrees: dict[str, int], rank: int) -> None:
    """Fake process group: rank ``rank`` of 4,096 simulated ranks."""
    in_child(_against_torch, degrees, 4096, rank)


def _hand_written(rank: int, environ: dict[str, str]) -> None:
    degrees = {"pp": 1, "dp_replicate": 2, "dp_shard": 2, "cp": 1, "tp": 2}
    with DistributedContext(
        load_config({"world_size": 8, "degrees": degrees}), environ=environ
    ) as ctx:
        # Row-major over (dp_replicate, dp_shard, tp), tp fastest.
        tp = [rank - rank % 2, rank - rank % 2 + 1]
        fsdp = [rank % 2 + 4 * (rank // 4), rank % 2 + 4 * (rank // 4) + 2]
        replicate = [rank % 4, rank % 4 + 4]
        batch = [rank % 2 + 2 * i for i in range(4)]
        for domain, dim, group in [
            ("dense", "tp", tp),
            ("dense", "fsdp", fsdp),
            ("dense", "dp_replicate", replicate),
            ("dataloading", "batch", batch),
            ("loss", "loss", batch),
        ]:
            mesh = ctx.mesh_for(domain)
            assert dist.get_process_group_ranks(mesh.get_group(dim)) == group, (domain, dim)
            assert mesh.get_local_rank(dim) == group.index(rank)
            total = all_reduce(torch.tensor([float(rank)]), "sum", mesh[dim])
            assert total.item() == sum(group)
        # torch's own mesh over the same real world gives the same groups.
        theirs = init_device_mesh("cpu", (2, 2, 2), mesh_dim_names=("dp_replicate", "fsdp", "tp"))
        for dim in ("dp_replicate", "fsdp", "tp"):
            assert dist.get_process_group_ranks(theirs.get_group(dim)) == (
                dist.get_process_group_ranks(ctx.mesh_for("dense").get_group(dim))
            )


def test_groups_equal_hand_written_row_major_groups_on_8_processes() -> None:
    run_ranks(_hand_written, 8)


def test_the_rank_arithmetic_equals_hand_written_groups() -> None:
    # Two nodes of 4: dp_shard and tp inside each node, cp across them.
    config = at_world_size(
        load_config(
            {
                "gpus_per_node": 4,
                "degrees": {"dp_shard": 2, "cp": 2, "tp": 2, "ep": 2},
                "inside_node": {"dp_shard": 2, "cp": 1, "tp": 2},
            }
        ),
        8,
    )
    for rank in range(8):
        node, local = divmod(rank, 4)
        groups = expected_groups(config, rank)
        assert groups["dense", "tp"].tolist() == [rank - rank % 2, rank - rank % 2 + 1]
        assert groups["dense", "fsdp"].tolist() == [
            rank % 2,
            rank % 2 + 2,
            rank % 2 + 4,
            rank % 2 + 6,
        ]
        assert groups["dataloading", "cp"].tolist() == [local, local + 4]
        assert groups["dataloading", "batch"].tolist() == [
            node * 4 + local % 2,
            node * 4 + local % 2 + 2,
        ]
        assert groups["sparse", "ep"].tolist() == [rank - rank % 2, rank - rank % 2 + 1]
    plain = at_world_size(load_config({"degrees": {"pp": 2, "tp": 4}}), 16)
    assert expected_groups(plain, 13)["dense", "fsdp"].tolist() == [9, 13]
    assert expected_groups(plain, 13)["dense", "pp"].tolist() == [5, 13]
    assert expected_groups(plain, 13)["loss", "tp"].tolist() == [12, 13, 14, 15]


@pytest.mark.parametrize(
    "placement",
    [{}, {"gpus_per_node": 4, "inside_node": {"dp_shard": 2, "tp": 2}}],
    ids=["plain", "inside_node"],
)
def test_the_rank_arithmetic_follows_every_order(placement: dict[str, object]) -> None:
    """All 120 orders of a 16-rank world: the arithmetic's groups are the brute-force groups
    of ranks numbered in that order (factor indices as mixed-radix digits, outer to inner)."""
    import itertools
    import math

    from meshconf.core.degrees import WORLD_FACTORS

    degrees = {"pp": 2, "dp_replicate": 1, "dp_shard": 2, "cp": 1, "tp": 4}
    inside = dict.fromkeys(WORLD_FACTORS, 1) | dict(placement.get("inside_node", {}))  # type: ignore[call-overload]
    across = {name: degrees[name] // inside[name] for name in WORLD_FACTORS}
    every_index = [
        dict(zip(WORLD_FACTORS, values, strict=True))
        for values in itertools.product(*(range(degrees[name]) for name in WORLD_FACTORS))
    ]

    def rank_of(index: dict[str, int], order: tuple[str, ...]) -> int:
        node = local = 0
        for name in order:
            node = node * across[name] + index[name] // inside[name]
            local = local * inside[name] + index[name] % inside[name]
        return node * math.prod(inside.values()) + local

    for order in itertools.permutations(WORLD_FACTORS):
        config = load_config(
            {"world_size": 16, "order": list(order), "degrees": degrees, **placement}
        )
        for index in every_index:
            rank = rank_of(index, order)
            groups = expected_groups(config, rank)
            for factor, dim in (("pp", "pp"), ("dp_shard", "fsdp"), ("tp", "tp")):
                along = sorted(rank_of(index | {factor: i}, order) for i in range(degrees[factor]))
                assert groups["dense", dim].tolist() == along, (order, rank, factor)
