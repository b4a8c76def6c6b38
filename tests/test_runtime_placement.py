"""The placement check on the machine (``inside``): each rank publishes where it is
(``MESHCONF_LEVEL_<NAME>`` here, as a launcher would set it) and a kept group that the
launcher spread over two units stops every rank with one message, before any process group
exists. Real processes (gloo, forked); the units come from the environment, since one CPU
machine has one host name and no NVLink fabric."""

from __future__ import annotations

import time
import warnings
from typing import Any

import pytest
import torch
import torch.distributed as dist
from distributed import run_ranks

from meshconf import DistributedContext, load_config
from meshconf.runtime import RankFailedError, RuntimeSetupError, TopologyWarning, all_reduce
from meshconf.runtime.placement import MAX_UNIT_NAME, locate, misplaced_group

BOUND_S = 10
CONFIG: dict[str, Any] = {
    "world_size": 8,
    "levels": [{"name": "node", "size": 2}, {"name": "nvlink", "size": 4}],
    "inside": {"nvlink": ["tp"]},
    "degrees": {"dp_shard": 2, "tp": 4},
    "runtime": {"setup_timeout_s": BOUND_S},
}


def _placed(rank: int, environ: dict[str, str], racks: list[str]) -> dict[str, str]:
    return {
        **environ,
        "MESHCONF_LEVEL_NODE": f"host{rank // 2}",
        "MESHCONF_LEVEL_NVLINK": racks[rank],
    }


def _well_placed(rank: int, environ: dict[str, str]) -> None:
    racks = ["rackA"] * 4 + ["rackB"] * 4
    with DistributedContext(load_config(CONFIG), environ=_placed(rank, environ, racks)) as ctx:
        total = all_reduce(torch.tensor([float(rank)]), "sum", ctx.mesh_for("dense")["tp"])
        assert total.item() == sum(range(rank // 4 * 4, rank // 4 * 4 + 4))


def test_groups_the_launcher_placed_inside_their_domain_build() -> None:
    run_ranks(_well_placed, 8, local_world_size=2)


MESSAGE = (
    "inside.nvlink: the config keeps tp (domain 'dataloading') inside one nvlink domain, but "
    "the launcher placed tp's group of ranks 0, 1, 2, 3 in 2 of them: 'rackA' holds ranks 0, "
    "1, 2; 'rackB' holds rank 3; start the ranks so that each nvlink unit holds 4 consecutive "
    "ranks (a hostfile ordered by nvlink), or set MESHCONF_LEVEL_NVLINK to where each rank "
    "really is"
)


def _badly_placed(rank: int, environ: dict[str, str]) -> None:
    # A scheduler that filled a gap: rank 3 runs in the other rack.
    racks = ["rackA", "rackA", "rackA", "rackB", "rackB", "rackB", "rackB", "rackB"]
    config = load_config(CONFIG)
    start = time.monotonic()
    with pytest.raises(RuntimeSetupError) as caught:
        DistributedContext(config, environ=_placed(rank, environ, racks))
    prefix, _, rest = str(caught.value).partition(": ")
    assert rest == MESSAGE
    # The ranks of the misplaced group each find it; the others raise the first one's.
    assert prefix in [f"rank {member}" for member in range(4)]
    if rank >= 4:
        assert isinstance(caught.value, RankFailedError)
    assert time.monotonic() - start < BOUND_S
    assert not dist.is_initialized()


def test_a_group_spread_over_two_domains_stops_every_rank_with_one_message() -> None:
    run_ranks(_badly_placed, 8, local_world_size=2)


def _unknown_domain(rank: int, environ: dict[str, str]) -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        config = load_config({**CONFIG, "world_size": 4, "degrees": {"tp": 4}})
        with DistributedContext(config, environ=environ):
            pass
    emitted = [
        str(w.message)
        for w in caught
        if issubclass(w.category, TopologyWarning) and str(w.message).startswith("inside.")
    ]
    expected = (
        "inside.nvlink: where this rank is in its nvlink level is unknown (set "
        "MESHCONF_LEVEL_NVLINK), so the placement was not checked on the machine"
    )
    assert emitted == ([expected] if rank == 0 else [])


def test_a_domain_nothing_tells_is_warned_and_not_checked() -> None:
    """No variable, and no NVLink fabric on a CPU: the meshes are built, rank 0 warns."""
    run_ranks(_unknown_domain, 4, local_world_size=2)


def test_units_come_from_the_environment_then_the_host() -> None:
    device = torch.device("cpu")
    found = locate(["node", "nvlink", "pod"], {"MESHCONF_LEVEL_POD": "p1"}, device)
    assert found["node"] and found["nvlink"] is None and found["pod"] == "p1"
    with pytest.raises(RuntimeSetupError, match=f"more than the {MAX_UNIT_NAME} a unit"):
        locate(["pod"], {"MESHCONF_LEVEL_POD": "x" * (MAX_UNIT_NAME + 1)}, device)


def test_a_rank_reads_only_its_kept_groups_at_a_million_ranks() -> None:
    """At 2**20 ranks a rank asks for the units of its own kept groups only: 64 ranks."""
    config = load_config(
        {
            "world_size": 2**20,
            "levels": [{"name": "node", "size": 4}, {"name": "nvlink", "size": 64}],
            "inside": {"nvlink": ["tp", "ep"]},
            "degrees": {"dp_shard": -1, "tp": 4, "ep": 16},
        }
    )
    asked: list[int] = []

    def units_of(ranks: list[int]) -> list[dict[str, str | None]]:
        asked.extend(ranks)
        return [{"node": f"h{r // 4}", "nvlink": f"r{r // 64}"} for r in ranks]

    assert misplaced_group(config, 123_457, units_of) is None
    assert asked == list(range(123_456 // 16 * 16, 123_456 // 16 * 16 + 16))


def test_simulated_meshes_of_three_levels_are_the_oracle_s(run_cli) -> None:  # type: ignore[no-untyped-def]
    """The process groups torch builds for the banded numbering equal the rank arithmetic of
    the bands (``meshconf.runtime.oracle``), computed apart from the layouts. pp kept in the
    rack numbers it inside the tp band's neighbour, not outermost as row-major would."""
    path = "examples/gb200_nvl72_moe.yaml"
    args = ("-o", "inside.nvlink=[pp, tp, ep]", "--rank", "0,517,1023")
    result = run_cli("simulate", path, *args)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[-1] == (
        "every group and local rank equals the rank arithmetic of the degrees, computed apart "
        "from the layouts"
    )
    assert "  sparse [pp=4, dp_replicate=1, efsdp=16, ep=16, etp=1]: groups ok" in result.stdout
    shown = run_cli("show", path, "-o", "inside.nvlink=[pp, tp, ep]", "--domain", "dense")
    assert "  pp          4       16      256  node         0, 16, 32, 48" in shown.stdout
