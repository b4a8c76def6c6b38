"""``order:`` at runtime, on 8 gloo processes: every domain's mesh holds the groups its layout
gives, and FSDP2 + TP over a non-default order takes the step a single process takes."""

from __future__ import annotations

from typing import Any

from distributed import assert_domains_hold_their_groups, run_ranks
from test_runtime_training import _train_one_step

from meshconf import DistributedContext, load_config

#: tp outermost, data parallelism inside it: the reverse of the default order.
REVERSED = {
    "world_size": 8,
    "order": ["tp", "cp", "dp_shard", "dp_replicate", "pp"],
    "degrees": {"dp_replicate": 2, "dp_shard": 2, "tp": 2},
}


def _every_domain(rank: int, environ: dict[str, str], layout: dict[str, Any]) -> None:
    with DistributedContext(load_config(layout), environ=environ) as ctx:
        # Stated without meshconf: ranks number tp, dp_shard, dp_replicate outer to inner.
        tp, dp_shard, dp_replicate = rank // 4, rank // 2 % 2, rank % 2
        expected = {
            "tp": [dp_shard * 2 + dp_replicate, dp_shard * 2 + dp_replicate + 4],
            "dp_replicate": [tp * 4 + dp_shard * 2, tp * 4 + dp_shard * 2 + 1],
            "fsdp": [tp * 4 + dp_replicate, tp * 4 + dp_replicate + 2],
            "batch": [tp * 4, tp * 4 + 1, tp * 4 + 2, tp * 4 + 3],
        }
        assert_domains_hold_their_groups(ctx, rank, expected)


def test_every_domain_of_a_reversed_order_holds_its_groups() -> None:
    run_ranks(_every_domain, 8, REVERSED)


def test_hsdp_with_tensor_parallel_in_a_reversed_order_matches_a_single_process_step() -> None:
    """tp's two ranks are 4 apart, and HSDP's [dp_replicate, fsdp] mesh is ranks 0-3."""
    layout = {key: value for key, value in REVERSED.items() if key != "world_size"}
    run_ranks(_train_one_step, 8, layout, True)


def test_fsdp_over_a_multi_mode_dim_with_tensor_parallel_matches_a_single_process_step() -> None:
    """dp_shard outermost, then tp, then cp: fsdp = dp_shard * cp is ranks {0, 1, 4, 5}, two
    modes (stride 4 and 1), and tp's pairs are 2 apart. The cp ranks read the same rows here
    (the model has no sequence to split), so FSDP's average over them is the reference's."""
    layout = {
        "order": ["dp_shard", "tp", "cp", "dp_replicate", "pp"],
        "degrees": {"dp_shard": 2, "cp": 2, "tp": 2},
    }
    config = load_config({"world_size": 8, **layout})
    assert config.layout("dense").group(0, "fsdp").ranks() == [0, 1, 4, 5]
    assert config.layout("dense").group(0, "tp").ranks() == [0, 2]
    run_ranks(_train_one_step, 8, layout, True)
