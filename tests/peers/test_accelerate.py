"""meshconf.compat.accelerate against accelerate's own code (the release installed: .ci/run's
peers stage runs this module under 1.15 and 1.10): the mesh accelerate builds from its own
ParallelismConfig, its own checks, and its getter keeping a preset mesh.

The layouts are checked on torch's fake process group, which simulates a world in one
process (each world in a forked child, so that the test process holds no default group);
one layout also runs on 8 real gloo processes.
"""

from __future__ import annotations

import itertools
from types import SimpleNamespace
from typing import Any

import pytest
import torch
import torch.distributed as dist
from accelerate import ParallelismConfig
from accelerate.utils import DistributedType
from conftest import REPO
from distributed import in_child, run_ranks

from meshconf import ConfigError, load_config
from meshconf.compat.accelerate import (
    ACCELERATE_DIMS,
    FLATTENED_DIMS,
    check_config,
    from_parallelism_config,
    parallelism_config,
)
from meshconf.features.convert import BY_NAME
from meshconf.runtime import DistributedContext, all_reduce

SIZES = (1, 2, 3)


def _accelerate_sizes(degrees: dict[str, int]) -> dict[str, int]:
    return {f"{dim}_size": degrees[dim] for dim in ACCELERATE_DIMS}


def _layouts() -> list[dict[str, int]]:
    """Every accelerate layout of sizes 1 to 3 on at most 8 ranks that accelerate accepts
    and that has a mesh (some size above 1)."""
    layouts = []
    for sizes in itertools.product(SIZES, repeat=len(ACCELERATE_DIMS)):
        degrees = dict(zip(ACCELERATE_DIMS, sizes, strict=True))
        pure_replication = degrees["dp_replicate"] > 1 and degrees["dp_shard"] == 1
        if (degrees["tp"] > 1 or degrees["cp"] > 1) and pure_replication:
            continue
        world = 1
        for size in sizes:
            world *= size
        if 1 < world <= 8:
            layouts.append(degrees)
    return layouts


def _ranks(mesh: Any) -> list[int]:
    return dist.get_process_group_ranks(mesh.get_group())


def _every_rank_equals_accelerate(degrees: dict[str, int]) -> None:
    world = 1
    for size in degrees.values():
        world *= size
    config = load_config({"world_size": world, "degrees": degrees})
    for rank in range(world):
        context = DistributedContext.simulate(config, rank=rank, world_size=world)
        try:
            preset = parallelism_config(context, fsdp2=False)
            theirs = ParallelismConfig(**_accelerate_sizes(degrees)).build_device_mesh("cpu")
            mine = preset.device_mesh
            assert mine is not None and theirs is not None
            assert mine.mesh_dim_names == theirs.mesh_dim_names
            flattened = set(theirs._flatten_mapping)
            assert flattened == set(mine._flatten_mapping)
            for name in (*theirs.mesh_dim_names, *sorted(flattened)):
                assert _ranks(mine[name]) == _ranks(theirs[name]), (degrees, rank, name)
                assert mine[name].get_local_rank() == theirs[name].get_local_rank()
            for name, (_, dim) in FLATTENED_DIMS.items():
                if name in flattened:
                    ours = context.get_optional_mesh(dim)
                    assert ours is not None and _ranks(ours) == _ranks(mine[name])
            # accelerate's getter keeps the preset mesh, and accelerate's own check of the
            # config against the launch passes.
            assert preset.get_device_mesh("cpu") is mine
            fsdp2 = degrees["dp_shard"] > 1 or degrees["cp"] > 1
            preset._validate_accelerator(_launched(world, fsdp2=fsdp2))
        finally:
            context.close()


def _launched(world: int, *, fsdp2: bool) -> SimpleNamespace:
    """What ParallelismConfig._validate_accelerator reads of an Accelerator on ``world``
    GPUs: accelerate 1.15 refuses a CPU-only Accelerator with a ParallelismConfig, so the
    Accelerator itself needs a GPU (tests/gpu)."""
    return SimpleNamespace(
        multi_device=True,
        num_processes=world,
        is_fsdp2=fsdp2,
        distributed_type=DistributedType.FSDP if fsdp2 else DistributedType.MULTI_GPU,
        is_main_process=False,
    )


@pytest.mark.timeout(300)
def test_every_dim_of_accelerate_s_own_mesh_is_meshconf_s_on_every_rank() -> None:
    """Fake process group: every rank of each layout of sizes 1 to 3, up to 8 ranks."""
    layouts = _layouts()
    assert len(layouts) == 23
    for degrees in layouts:
        in_child(_every_rank_equals_accelerate, degrees)


def _order_kept(_: None) -> None:
    # Ranks numbered tp outermost: accelerate cannot express this order, its preset mesh can.
    config = load_config(
        {
            "world_size": 16,
            "degrees": {"dp_replicate": 2, "dp_shard": 2, "cp": 2, "tp": 2},
            "order": ["tp", "pp", "dp_replicate", "dp_shard", "cp"],
        }
    )
    for rank in range(16):
        context = DistributedContext.simulate(config, rank=rank, world_size=16)
        try:
            mesh = parallelism_config(context, fsdp2=True).device_mesh
            assert mesh is not None
            pairs = [
                ("tp", "tp"),
                ("dp_replicate", "dp_replicate"),
                ("dp_shard_cp", "fsdp"),
                ("dp", "batch"),
                ("dp_cp", "loss"),
            ]
            for name, dim in pairs:
                assert _ranks(mesh[name]) == _ranks(context.get_mesh(dim)), (rank, name)
            assert _ranks(mesh["tp"]) == [rank % 8, rank % 8 + 8]
        finally:
            context.close()


def test_a_custom_order_is_kept_in_the_mesh_accelerate_reads() -> None:
    """Fake process group: every rank of 16."""
    in_child(_order_kept, None)


def _on_gloo(rank: int, environ: dict[str, str]) -> None:
    degrees = {"dp_replicate": 2, "dp_shard": 2, "tp": 2}
    config = load_config({"world_size": 8, "degrees": degrees})
    with DistributedContext(config, environ=environ) as context:
        before = context.counters.new_group_calls
        mesh = parallelism_config(context, fsdp2=True).get_device_mesh("cpu")
        # Every group is one the context made for its domains (with cp 1, dp_shard is fsdp).
        assert context.counters.new_group_calls == before
        theirs = init_theirs(degrees)
        for name in ("dp_replicate", "dp_shard", "tp", "dp", "dp_shard_cp", "dp_cp"):
            assert _ranks(mesh[name]) == _ranks(theirs[name]), name
            total = all_reduce(torch.tensor([float(rank)]), "sum", mesh[name])
            assert total.item() == sum(_ranks(mesh[name])), name


def init_theirs(degrees: dict[str, int]) -> Any:
    return ParallelismConfig(**_accelerate_sizes({"cp": 1, **degrees})).build_device_mesh("cpu")


def test_accelerate_s_groups_reduce_on_8_gloo_processes() -> None:
    run_ranks(_on_gloo, 8)


# What accelerate refuses, refused first -------------------------------------------------


def _refusal(degrees: dict[str, int], *, fsdp2: bool = False) -> str:
    config = load_config({"degrees": {"dp_shard": 1, **degrees}})
    with pytest.raises(ConfigError) as raised:
        check_config(config, fsdp2=fsdp2)
    assert type(raised.value) is ConfigError
    return str(raised.value)


def test_pipeline_and_expert_parallelism_are_refused_at_their_keys() -> None:
    assert _refusal({"pp": 2, "dp_shard": 2, "ep": 2}) == (
        "degrees.pp: accelerate has no pipeline parallelism; set degrees.pp to 1 (giving its "
        "2 ranks to dp_shard), or train with torchtitan or Megatron-Core\n"
        "degrees.ep: accelerate has no expert parallelism "
        "(https://github.com/huggingface/accelerate/issues/4200); set degrees.ep to 1, or train "
        "with torchtitan, Megatron-Core or transformers' DistributedConfig"
    )


def test_tp_beside_pure_replication_is_refused_as_accelerate_refuses_it() -> None:
    assert _refusal({"dp_replicate": 2, "tp": 2}) == (
        "degrees.dp_replicate: accelerate refuses tp beside replication that does not shard "
        "(https://github.com/huggingface/accelerate/issues/3876): set degrees.dp_shard to 2 "
        "and degrees.dp_replicate to 1 (FSDP), or degrees.dp_shard above 1 as well (HSDP)"
    )
    with pytest.raises(ValueError, match="cannot be used with pure data parallelism"):
        ParallelismConfig(dp_replicate_size=2, tp_size=2)


def _fsdp2_key_error(_: None) -> None:
    # What accelerate's FSDP2 preparation slices (fsdp_utils: mesh[fsdp_dim_names]).
    config = ParallelismConfig(tp_size=4)
    mesh = config.build_device_mesh("cpu")
    with pytest.raises(KeyError, match="dp_shard_cp"):
        mesh[tuple(config.fsdp_dim_names)]


def test_fsdp2_with_nothing_to_shard_is_refused_as_accelerate_fails() -> None:
    """Fake process group, 4 simulated ranks, for accelerate's own mesh."""
    assert _refusal({"tp": 4}, fsdp2=True) == (
        "degrees.dp_shard: FSDP2 shards over dp_shard * cp, which is 1 here, and accelerate "
        "fails with KeyError 'dp_shard_cp' "
        "(https://github.com/huggingface/accelerate/issues/3798): set degrees.dp_shard above 1 "
        "(lowering degrees.tp to leave it processes), or turn FSDP off"
    )
    check_config(load_config({"degrees": {"dp_shard": 1, "tp": 4}}), fsdp2=False)
    in_child(_fake_world, 4, _fsdp2_key_error)


def _fake_world(world: int, function: Any) -> None:
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group("fake", rank=0, world_size=world, store=FakeStore())
    function(None)


def _accelerate_refuses(sizes: dict[str, int], fsdp2: bool) -> bool:
    """Whether accelerate refuses the layout: its ParallelismConfig, its check of the launch
    (1.15 refuses FSDP2 with nothing to shard there), or its FSDP2 preparation, which slices
    the mesh by fsdp_dim_names and meets no dp_shard_cp dim (1.10, #3798)."""
    world = 1
    for size in sizes.values():
        world *= size
    try:
        config = ParallelismConfig(**_accelerate_sizes(sizes))
        config._validate_accelerator(_launched(world, fsdp2=fsdp2))
    except ValueError:
        return world > 1
    return (
        fsdp2
        and world > 1
        and "dp_shard_cp" in config.fsdp_dim_names
        and (not config.dp_shard_cp_dim_names)
    )


def test_fsdp2_is_read_from_the_environment_accelerate_launch_sets(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    config = load_config({"degrees": {"dp_shard": 1, "tp": 4}})
    monkeypatch.setenv("ACCELERATE_USE_FSDP", "true")
    monkeypatch.setenv("FSDP_VERSION", "2")
    with pytest.raises(ConfigError, match=r"^degrees\.dp_shard: FSDP2 shards over dp_shard \* cp"):
        check_config(config)
    monkeypatch.setenv("FSDP_VERSION", "1")
    check_config(config)


@pytest.mark.parametrize("degrees", _layouts()[::5])
def test_what_meshconf_refuses_is_what_accelerate_refuses(degrees: dict[str, int]) -> None:
    """Over both settings that matter (pure replication, FSDP2 without a shard dim),
    meshconf refuses exactly what accelerate refuses or fails on."""
    for replicate, shard, fsdp2 in itertools.product((1, 2), (1, 2), (False, True)):
        sizes = {**degrees, "dp_replicate": replicate, "dp_shard": shard}
        try:
            check_config(load_config({"degrees": sizes}), fsdp2=fsdp2)
            meshconf_refuses = False
        except ConfigError:
            meshconf_refuses = True
        assert meshconf_refuses == _accelerate_refuses(sizes, fsdp2), (sizes, fsdp2)


# From accelerate to meshconf ------------------------------------------------------------


@pytest.mark.parametrize("degrees", _layouts())
def test_from_parallelism_config_gives_accelerate_s_sizes_back(degrees: dict[str, int]) -> None:
    world = 1
    for size in degrees.values():
        world *= size
    config = from_parallelism_config(
        ParallelismConfig(**_accelerate_sizes(degrees)), world_size=world
    )
    assert {dim: config.resolved_degrees[dim] for dim in ACCELERATE_DIMS} == degrees
    assert config.resolved_degrees["pp"] == config.resolved_degrees["ep"] == 1


def test_a_config_of_ones_replicates_over_the_world_as_accelerate_does() -> None:
    config = from_parallelism_config(ParallelismConfig(), world_size=8, gpus_per_node=8)
    assert config.resolved_degrees["dp_replicate"] == 8
    assert config.gpus_per_node == 8


def test_sequence_parallelism_is_refused_with_a_note() -> None:
    # accelerate 1.10 has no sp_size; what 1.15 gives, with it, is read alike.
    sizes = {"dp_replicate_size": 1, "dp_shard_size": 2, "tp_size": 1, "cp_size": 1}
    with pytest.raises(ConfigError) as raised:
        from_parallelism_config(SimpleNamespace(**sizes, sp_size=2), world_size=4)
    assert str(raised.value) == (
        "sp_size: is 2: DeepSpeed's Ulysses sequence parallelism, which meshconf has no degree "
        "for; set it to 1, or use cp_size for context parallelism"
    )


def test_sizes_that_do_not_make_the_world_are_refused() -> None:
    with pytest.raises(ConfigError, match="world_size"):
        from_parallelism_config(ParallelismConfig(dp_shard_size=2, tp_size=2), world_size=8)


# accelerate's own readers of what convert --from accelerate reads ---------------------------

CONFIG_FILE = REPO / "examples/migration/accelerate/fsdp2_hsdp_tp_cp_16gpu.yaml"


def _converted(text: str, suffix: str) -> dict[str, Any]:
    source = BY_NAME["accelerate"]
    assert source.read is not None
    return source.convert(source.read(text, suffix)).data


def test_accelerate_s_config_reader_reads_the_sizes_meshconf_converts() -> None:
    from accelerate.commands.config.config_args import load_config_from_file

    cluster = load_config_from_file(str(CONFIG_FILE))
    block = {
        k.removeprefix("parallelism_config_"): v for k, v in cluster.parallelism_config.items()
    }
    sizes = {name: block[f"{name}_size"] for name in ACCELERATE_DIMS}
    data = _converted(CONFIG_FILE.read_text(encoding="utf-8"), ".yaml")
    assert {name: data["degrees"][name] for name in ACCELERATE_DIMS} == sizes
    assert data["world_size"] == cluster.num_processes
    assert data["gpus_per_node"] == cluster.num_processes // cluster.num_machines


@pytest.mark.parametrize("values", list(itertools.product((1, 2), (2, 3), (1, 2), (1, 2)))[::3])
def test_accelerate_s_launch_parser_and_environment_read_what_meshconf_reads(
    values: tuple[int, ...], monkeypatch: pytest.MonkeyPatch
) -> None:
    from accelerate.commands.launch import launch_command_parser

    sizes = dict(zip(ACCELERATE_DIMS, values, strict=True))
    world = values[0] * values[1] * values[2] * values[3]
    options = [f"--parallelism_config_{name}_size={size}" for name, size in sizes.items()]
    # without --use_parallelism_config the launcher hands the script none of these sizes
    fsdp2 = ["--use_fsdp", "--fsdp_version", "2", "--use_parallelism_config"]
    argv = [*fsdp2, "--num_processes", str(world), *options, "train.py"]
    parsed = launch_command_parser().parse_args(argv)
    theirs = {name: getattr(parsed, f"parallelism_config_{name}_size") for name in sizes}
    line = _converted("accelerate launch " + " ".join(argv), "")
    assert {name: line["degrees"][name] for name in sizes} == theirs == sizes
    assert line["world_size"] == parsed.num_processes
    # The variables accelerate launch sets, read by accelerate's ParallelismConfig.
    exports = "".join(f"export PARALLELISM_CONFIG_{n.upper()}_SIZE={v}\n" for n, v in sizes.items())
    for name, size in sizes.items():
        monkeypatch.setenv(f"PARALLELISM_CONFIG_{name.upper()}_SIZE", str(size))
    from_environment = ParallelismConfig()
    variables = _converted(exports + f"accelerate launch --num_processes {world} train.py", "")
    assert {name: variables["degrees"][name] for name in sizes} == {
        name: getattr(from_environment, f"{name}_size") for name in sizes
    }
