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
    "the launcher placed tp's group of ranks 0, 1, 2, 3 in 2 nvlink domains: 'rackA' holds "
    "ranks 0, 1, 2; 'rackB' holds rank 3; start the ranks so that each nvlink domain holds 4 "
    "consecutive ranks (a hostfile ordered by nvlink), or set MESHCONF_LEVEL_NVLINK to where "
    "each rank really is"
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

    assert misplaced_group(config, 123_457, units_of) == (None, [])
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


#: tp kept in a node and ep in a rack of 8; rank 3's rack is another, though its host is not
TWO_LEVELS = load_config(
    {
        "world_size": 8,
        "levels": [{"name": "node", "size": 4}, {"name": "nvlink", "size": 8}],
        "inside": {"node": ["tp"], "nvlink": ["ep"]},
        "degrees": {"dp_shard": 2, "tp": 4, "ep": 2},
    }
)


def _units(nvlink: dict[int, str | None]) -> Any:
    def units_of(ranks: list[int]) -> list[dict[str, str | None]]:
        return [{"node": f"host{r // 4}", "nvlink": nvlink.get(r, "rackA")} for r in ranks]

    return units_of


def test_a_failure_names_the_inside_key_written_and_the_tightest_level_broken() -> None:
    problem, notes = misplaced_group(TWO_LEVELS, 0, _units({3: "rackB"}))
    assert notes == []
    assert problem == (
        "inside.node: the config keeps tp (domain 'dataloading') inside a node, but the "
        "launcher placed tp's group of ranks 0, 1, 2, 3 in 2 nvlink domains, though a node lies "
        "inside one nvlink domain: 'rackA' holds ranks 0, 1, 2; 'rackB' holds rank 3; start the "
        "ranks so that each nvlink domain holds 8 consecutive ranks (a hostfile ordered by "
        "nvlink), or set MESHCONF_LEVEL_NVLINK to where each rank really is"
    )


def test_a_group_some_of_whose_ranks_know_no_unit_is_said_to_be_unchecked() -> None:
    unknown = _units({2: None, 3: None})
    problem, notes = misplaced_group(TWO_LEVELS, 0, unknown)
    assert problem is None
    assert notes == [
        "inside.node: tp's group of ranks 0, 1, 2, 3 was not checked at the nvlink level on the "
        "machine: ranks 2, 3 do not know their nvlink domain (set MESHCONF_LEVEL_NVLINK there)"
    ]
    # only the lowest rank that knows says it
    assert misplaced_group(TWO_LEVELS, 1, unknown) == (None, [])


def test_unit_names_that_print_alike_are_written_apart() -> None:
    problem, _ = misplaced_group(TWO_LEVELS, 0, _units({3: "rack\uff21"}))
    assert problem is not None
    assert "'rackA' holds ranks 0, 1, 2; 'rack\\uff21' holds rank 3;" in problem


def _bad_variable(rank: int, environ: dict[str, str]) -> None:
    value = "x" * (MAX_UNIT_NAME + 1) if rank == 1 else f"rack{rank // 4}"
    with pytest.raises(RuntimeSetupError) as caught:
        DistributedContext(load_config(CONFIG), environ={**environ, "MESHCONF_LEVEL_NVLINK": value})
    assert str(caught.value) == (
        f"rank 1: MESHCONF_LEVEL_NVLINK is {MAX_UNIT_NAME + 1} characters, more than the "
        f"{MAX_UNIT_NAME} a unit's name may have"
    )


def test_a_bad_variable_is_named_with_the_rank_it_came_from() -> None:
    run_ranks(_bad_variable, 8, local_world_size=2)


def _node_warnings(rank: int, environ: dict[str, str], named: bool) -> None:
    # torchrun's 4 ranks on one host and the config's nodes of 2: named by the environment,
    # the placement is checked on the names and no warning speaks of the launcher's 4 a
    # node; unnamed, the warning names the node level's key, which the config has
    config = load_config({**CONFIG, "world_size": 4, "degrees": {"tp": 2}})
    placed = {**environ, "MESHCONF_LEVEL_NVLINK": "r"}
    if named:
        placed["MESHCONF_LEVEL_NODE"] = f"h{rank // 2}"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with DistributedContext(config, environ=placed):
            pass
    warned = [str(w.message) for w in caught if issubclass(w.category, TopologyWarning)]
    expected = (
        "levels[0].size: the config places groups on nodes of 2 ranks, but torchrun runs 4 on "
        "this node, so the groups do not sit where the config says (they still work); set "
        "levels[0].size to 4 or start 2 ranks per node"
    )
    assert warned == ([] if named or rank else [expected])


@pytest.mark.parametrize("named", [True, False])
def test_a_warning_names_the_key_the_config_has(named: bool) -> None:
    run_ranks(_node_warnings, 4, named, local_world_size=4)
