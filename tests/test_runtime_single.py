"""DistributedContext in one process: no launcher (world of one), guard rails, and
simulated worlds. The simulation tests use torch's fake process group (one process standing
in for a large world), as their names say. Every test that creates a process group does so in
a forked child (``in_child``), so the test process never holds one when it forks again."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from conftest import REPO
from distributed import environ, in_child, run_ranks
from torch import nn
from torch.distributed.fsdp import fully_shard

from meshconf import ConfigError, DistributedContext, MeshconfError, load_config
from meshconf.core.layout import process_group_count
from meshconf.runtime import (
    RuntimeSetupError,
    TopologyWarning,
    all_reduce,
    read_launch,
)


def test_a_single_process_needs_no_environment_and_builds_real_meshes() -> None:
    in_child(_a_single_process_needs_no_environment_and_builds_real_meshes)


def _a_single_process_needs_no_environment_and_builds_real_meshes() -> None:
    with DistributedContext.from_yaml(REPO / "examples" / "single_gpu.yaml", environ={}) as ctx:
        assert (ctx.rank, ctx.world_size, ctx.local_rank, ctx.is_main_process) == (0, 1, 0, True)
        assert ctx.device == torch.device("cpu") and ctx.backend == "gloo"
        dense = ctx.mesh_for("dense")
        assert dense.mesh_dim_names == ("pp", "dp_replicate", "fsdp", "tp")
        assert dense.shape == (1, 1, 1, 1)
        assert ctx.get_optional_mesh("tp") is None
        assert ctx.get_optional_mesh(["dp_replicate", "fsdp"]) is None
        with pytest.raises(
            ValueError, match=r"mesh \['tp'\] is not enabled: tp=1; use get_optional_mesh"
        ):
            ctx.get_mesh("tp")
        assert all_reduce(torch.tensor([2.0]), "sum", ctx.get_optional_mesh("tp")).item() == 2.0
        # The same FSDP call as on a cluster works on the size-1 fsdp dim (a real group).
        fsdp = ctx.get_mesh("fsdp")
        assert fsdp.size() == 1 and fsdp.get_group() is dist.group.WORLD
        model = nn.Linear(4, 4)
        fully_shard(model, mesh=fsdp)
        model(torch.ones(2, 4)).sum().backward()
        assert ctx.log_prefix == "[rank0]"
        assert ctx.seed(7, vary_along=["pp", "fsdp"]) == 7
    assert not dist.is_initialized()


def test_mesh_lookup_errors_name_the_valid_choices() -> None:
    in_child(_mesh_lookup_errors_name_the_valid_choices)


def _mesh_lookup_errors_name_the_valid_choices() -> None:
    with DistributedContext(load_config({"world_size": 1}), environ={}) as ctx:
        with pytest.raises(
            ValueError,
            match=r"unknown mesh dim 'tpp'; valid dims are pp, batch, cp, tp, dp_replicate, fsdp, efsdp, ep, etp, loss",
        ):
            ctx.get_mesh("tpp")
        with pytest.raises(
            ValueError,
            match=r"unknown domain 'densee'; domains are dataloading, dense, sparse, loss",
        ):
            ctx.mesh_for("densee")
        with pytest.raises(
            ValueError,
            match=r"are all in domain 'dense' but in another order; ask for \['dp_replicate', 'fsdp'\]",
        ):
            ctx.get_optional_mesh(["fsdp", "dp_replicate"])
        with pytest.raises(ValueError, match=r"no domain has all of \['tp', 'ep'\]"):
            ctx.get_optional_mesh(["tp", "ep"])


def test_cuda_asked_for_but_absent() -> None:
    in_child(_cuda_asked_for_but_absent)


def _cuda_asked_for_but_absent() -> None:
    config = load_config({"world_size": 1, "runtime": {"device": "cuda"}})
    with pytest.raises(
        RuntimeSetupError, match=r"runtime\.device is cuda, but torch sees no CUDA device"
    ):
        DistributedContext(config, environ={})
    assert not dist.is_initialized()


def test_launcher_environment_is_read_and_checked() -> None:
    assert read_launch(
        {
            "SLURM_PROCID": "5",
            "SLURM_NTASKS": "16",
            "SLURM_LOCALID": "1",
            "SLURM_NTASKS_PER_NODE": "4(x4)",
        }
    ) == (
        read_launch(
            {"RANK": "5", "WORLD_SIZE": "16", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "4"}
        ).__class__(5, 16, 1, 4, "slurm")
    )
    with pytest.raises(
        MeshconfError, match="torchrun environment incomplete: RANK is set but WORLD_SIZE is not"
    ):
        read_launch({"RANK": "0"})
    with pytest.raises(MeshconfError, match="a rank has RANK=4, outside WORLD_SIZE=4"):
        read_launch({"RANK": "4", "WORLD_SIZE": "4"})
    with pytest.raises(
        MeshconfError, match="rank 0 has WORLD_SIZE=eight, which is not an integer from 0"
    ):
        read_launch({"RANK": "0", "WORLD_SIZE": "eight"})
    with pytest.raises(MeshconfError, match="has no MASTER_ADDR and MASTER_PORT"):
        DistributedContext(load_config({"world_size": 2}), environ={"RANK": "0", "WORLD_SIZE": "2"})


def test_a_world_size_left_open_is_taken_from_the_launcher() -> None:
    run_ranks(_open_world_size, 2)


def _open_world_size(rank: int, env: dict[str, str]) -> None:
    with DistributedContext(load_config({"degrees": {"tp": 2}}), environ=env) as ctx:
        assert ctx.config.resolved_world_size == 2 and ctx.get_mesh("tp").size() == 2
        assert ctx.config.gpus_per_node == 2  # LOCAL_WORLD_SIZE


def test_torch_missing_names_the_extra() -> None:
    code = "import sys; sys.modules['torch'] = None\ntry:\n import meshconf.runtime\nexcept Exception as e: print(type(e).__name__, e)"
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    # The command installs the extra from where meshconf came from: this clone (README).
    assert result.stdout == (
        f"MeshconfError meshconf's runtime needs torch, which is not installed: pip install '{REPO}[torch]'\n"
    )


@pytest.mark.parametrize("world_size", [4096, 65536])
def test_simulated_world_with_the_fake_process_group(world_size: int) -> None:
    """Fake process group: one process builds one rank's meshes of a large world."""
    in_child(_simulated_world, world_size)


def _simulated_world(world_size: int) -> None:
    config = load_config({"degrees": {"pp": 4, "tp": 8, "ep": 8}})
    rank = world_size // 2 + 3
    context = DistributedContext.simulate(config, rank=rank, world_size=world_size)
    try:
        assert context.mismatched_groups() == []
        distinct = process_group_count(list(context.config.layouts.values()), rank)
        counters = context.counters
        assert counters.real_groups == distinct
        assert counters.new_group_calls == distinct + counters.fake_groups
        assert counters.new_group_calls <= 10
        assert context.coordinate("dense")["tp"] == rank % 8
    finally:
        context.close()
    assert not dist.is_initialized()


def test_simulate_rejects_a_bad_world_size_with_config_errors() -> None:
    with pytest.raises(
        ConfigError, match=r"degrees\.tp: tp\(8\) leaves no whole number of ranks for dp_shard"
    ):
        DistributedContext.simulate(load_config({"degrees": {"tp": 8}}), rank=0, world_size=12)
    assert not dist.is_initialized()


def test_simulate_refuses_a_world_larger_than_it_can_hold() -> None:
    in_child(_simulate_too_large)


def _simulate_too_large() -> None:
    config = load_config({"degrees": {"tp": 8}})
    with pytest.raises(RuntimeSetupError) as caught:
        DistributedContext.simulate(config, rank=0, world_size=2**31 - 1)
    assert str(caught.value) == (
        "simulate builds worlds of up to 4194304 ranks, and this one has 2147483647: torch's "
        "meshes and groups hold every rank, about 384 bytes each; the config's layouts "
        "(MeshConfig.layout) answer for any world size"
    )
    assert not dist.is_initialized()


def test_simulate_cli(run_cli) -> None:  # type: ignore[no-untyped-def]
    result = run_cli("simulate", "examples/llama3_70b_512gpu.yaml", "--rank", "77")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].startswith(
        "simulated rank 77 of 512 against torch's fake process group: 4 domains built in"
    )
    assert "  dense [pp=4, dp_replicate=2, fsdp=8, tp=8]: groups ok" in lines
    assert lines[-2] == (
        "process groups of rank 77: 7 new_group calls, 6 real groups, 1 fake (size-1) groups, "
        "0 reuses of the default group, 9 dims served by an existing group"
    )
    assert (
        lines[-1]
        == "every group and local rank equals the rank arithmetic of the degrees, computed apart from the layouts"
    )
    result = run_cli("simulate", "examples/world_size_from_launcher.yaml")
    assert result.returncode == 2 and "the world size is unknown" in result.stderr


def test_an_existing_default_group_is_used_and_left_alone() -> None:
    in_child(_an_existing_default_group_is_used_and_left_alone)


def _an_existing_default_group_is_used_and_left_alone() -> None:
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)  # type: ignore[attr-defined]
    try:
        ctx = DistributedContext(load_config({"world_size": 1}), environ={})
        ctx.build_all()
        ctx.close()
        ctx.close()
        assert dist.is_initialized()
    finally:
        dist.destroy_process_group()


def test_hierarchical_placement_simulated_on_4096_nodes_of_8() -> None:
    in_child(_hierarchical_placement_simulated_on_4096_nodes_of_8)


def _hierarchical_placement_simulated_on_4096_nodes_of_8() -> None:
    """Fake process group: rank 20,013 of 32,768 (4,096 nodes of 8), with tp and 2 FSDP
    shards inside each node and cp across nodes; every group and local rank equals the rank arithmetic of the degrees, computed apart from the layouts."""
    config = load_config(
        {
            "gpus_per_node": 8,
            "degrees": {"pp": 4, "dp_shard": -1, "cp": 4, "tp": 4, "ep": 8},
            "inside_node": {"dp_shard": 2, "cp": 1, "tp": 4},
        }
    )
    rank = 20_013
    context = DistributedContext.simulate(config, rank=rank, world_size=4096 * 8)
    try:
        assert context.mismatched_groups() == []
        assert context.topology_warnings == []
        layouts = context.config.layouts
        assert not layouts["dataloading"].is_row_major
        node = rank // 8
        assert context.get_mesh("tp").mesh.tolist() == [node * 8 + i for i in range(4, 8)]
        cp = layouts["dataloading"].group(rank, "cp").ranks()
        assert len({member // 8 for member in cp}) == 4
        distinct = process_group_count(list(layouts.values()), rank)
        assert context.counters.real_groups == distinct
    finally:
        context.close()
    assert not dist.is_initialized()


def test_rank_0_warns_when_the_launcher_runs_another_node_size() -> None:
    in_child(_rank_0_warns_when_the_launcher_runs_another_node_size)


def _rank_0_warns_when_the_launcher_runs_another_node_size() -> None:
    config = load_config({"world_size": 1, "gpus_per_node": 8})
    with pytest.warns(TopologyWarning) as caught:
        context = DistributedContext(config, environ=environ(0, 1, 0))
    context.close()
    assert [str(w.message) for w in caught if issubclass(w.category, TopologyWarning)] == [
        "gpus_per_node: the config places groups on nodes of 8 ranks, but torchrun runs 1 on "
        "this node, so the groups do not sit where the config says (they still work); set "
        "gpus_per_node to 1 or start 8 ranks per node",
        "world_size: world_size 1 is not a multiple of gpus_per_node 8: the last node would run "
        "1 ranks, but launchers start the same number on every node; use a multiple of 8, or "
        "set gpus_per_node to the ranks each node runs",
    ]


def test_a_topology_warning_points_at_the_users_line(tmp_path: Path) -> None:
    """from_yaml calls the constructor, which warns: the warning names the caller's line."""
    path = tmp_path / "nodes.yaml"
    path.write_text("world_size: 1\ngpus_per_node: 8\n")
    in_child(_warning_names_the_callers_line, str(path))


def _warning_names_the_callers_line(path: str) -> None:
    with pytest.warns(TopologyWarning) as caught:
        line = sys._getframe().f_lineno + 1
        context = DistributedContext.from_yaml(path, environ={})
    context.close()
    assert {(warning.filename, warning.lineno) for warning in caught} == {(__file__, line)}


def test_every_mesh_asked_for_is_built_once() -> None:
    """Fake process group, 65,536 simulated ranks: a repeated request is the same object."""
    in_child(_meshes_are_cached)


def _meshes_are_cached() -> None:
    config = load_config({"degrees": {"dp_replicate": 2, "pp": 4, "tp": 8, "ep": 8}})
    context = DistributedContext.simulate(config, rank=40_000, world_size=65_536)
    try:
        for request in ("loss", ["dp_replicate", "fsdp"], ["pp", "tp"], "ep", "cp"):
            first = context.get_optional_mesh(request)
            assert context.get_optional_mesh(request) is first
            if isinstance(request, list):
                assert context.get_optional_mesh(tuple(request)) is first
        assert context.get_optional_mesh("cp") is None
        assert context.get_mesh(["dp_replicate", "fsdp"]).shape == (2, 1024)
        assert context.mesh_for("dense") is context.mesh_for("dense")
    finally:
        context.close()


def test_a_missing_private_torch_name_is_one_line_naming_torch_and_the_name(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from torch.distributed import distributed_c10d
    from torch.distributed.device_mesh import DeviceMesh

    from meshconf.runtime.torch_support import PROBES, check_torch

    check_torch()
    assert all(probe() for probe in PROBES.values())
    monkeypatch.delattr(distributed_c10d, "_get_default_store")
    with pytest.raises(MeshconfError) as caught:
        check_torch()
    assert str(caught.value) == (
        "meshconf's runtime needs torch.distributed.distributed_c10d._get_default_store, which "
        f"torch {torch.__version__} does not have; meshconf is tested with torch 2.13.0 and 2.14.1"
    )
    monkeypatch.undo()

    def older_init(self: DeviceMesh, device_type: str, mesh: object = None) -> None:
        raise NotImplementedError

    monkeypatch.setattr(DeviceMesh, "__init__", older_init)
    with pytest.raises(MeshconfError, match=r"needs DeviceMesh\(_layout=\.\.\., _rank_map"):
        check_torch()


def test_importing_the_runtime_probes_torch() -> None:
    code = (
        "import torch.distributed.device_mesh as m\n"
        "m.DeviceMesh.__annotations__.pop('_pg_registry')\n"
        "try:\n import meshconf.runtime\nexcept Exception as e: print(type(e).__name__, e)"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO
    )
    assert result.stdout == (
        "MeshconfError meshconf's runtime needs DeviceMesh._pg_registry, which torch "
        f"{torch.__version__} does not have; meshconf is tested with torch 2.13.0 and 2.14.1\n"
    )


def test_a_failed_start_is_a_short_traceback_under_the_documented_name(tmp_path: Path) -> None:
    """The traceback of a set-up failure is the user's line, the call and meshconf's message,
    under the name the docs give the exception (meshconf.runtime.RuntimeSetupError), whichever
    module defines it."""
    script = tmp_path / "train.py"
    script.write_text(
        "from meshconf import DistributedContext, load_config\n"
        "config = load_config({'world_size': 1, 'runtime': {'device': 'cuda'}})\n"
        "DistributedContext(config, environ={})\n"
    )
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=120
    )
    lines = done.stderr.splitlines()
    assert done.returncode == 1
    assert lines[0] == "Traceback (most recent call last):"
    assert lines[-1].startswith("meshconf.runtime.RuntimeSetupError: runtime.device is cuda")
    assert len(lines) <= 8, done.stderr
    assert "During handling" not in done.stderr and "direct cause" not in done.stderr
