"""Every public function of ``meshconf.compat`` (read from each module's ``__all__``) given an
argument of the wrong type or value: each raises its trainer's documented error, a
``ConfigError``, naming the argument, and never an ``AttributeError``, a bare ``TypeError`` or
pydantic's ``ValidationError`` from deep inside. No torch is imported except by the tests
marked slow, which fork a child for torch's process groups.
"""

from __future__ import annotations

import contextlib
import importlib
import inspect
import warnings
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import given, settings, strategies as st
from pydantic import ValidationError

from meshconf import ConfigError, MeshconfError, load_config

MODULES = (
    "meshconf.compat.accelerate",
    "meshconf.compat.megatron",
    "meshconf.compat.nemo_automodel",
    "meshconf.compat.transformers",
    "meshconf.compat.torchtitan",
    "meshconf.compat.torchtitan_v0_2",
)
CONFIG = load_config({"world_size": 8, "degrees": {"dp_shard": 4, "tp": 2}})
ACCELERATE_SIZES = {"dp_replicate_size": 1, "dp_shard_size": 4, "cp_size": 1, "tp_size": 2}


def _public_functions() -> list[tuple[str, Callable[..., Any]]]:
    found: list[tuple[str, Callable[..., Any]]] = []
    for name in MODULES:
        module = importlib.import_module(name)
        for attribute in module.__all__:
            value = getattr(module, attribute)
            if inspect.isfunction(value):
                found.append((f"{name}.{attribute}", value))
    return found


#: Values that are no MeshConfig, no context, no ParallelismConfig: what a caller passes by
#: mistake (a path, the mapping it was loaded from, nothing, a number, a list).
WRONG = st.one_of(
    st.none(),
    st.text(max_size=12),
    st.binary(max_size=4),
    st.integers(),
    st.floats(allow_nan=False),
    st.booleans(),
    st.lists(st.integers(), max_size=3),
    st.dictionaries(
        st.sampled_from([*ACCELERATE_SIZES, "tp", "world_size"]), st.integers(1, 8), max_size=4
    ),
    st.builds(object),
)
#: Every public function's arguments and a valid value of each, for the argument not under test.
VALID: dict[str, dict[str, Any]] = {
    "meshconf.compat.accelerate.check_config": {"config": CONFIG, "fsdp2": False},
    "meshconf.compat.accelerate.parallelism_config": {"context": None, "fsdp2": False},
    "meshconf.compat.accelerate.from_parallelism_config": {
        "parallelism": SimpleNamespace(**ACCELERATE_SIZES),
        "world_size": 8,
    },
    "meshconf.compat.megatron.initialize_model_parallel": {"config": CONFIG},
    "meshconf.compat.megatron.parallel_state_arguments": {"config": CONFIG},
    "meshconf.compat.nemo_automodel.check_config": {"config": CONFIG},
    "meshconf.compat.nemo_automodel.meshes": {"context": None},
    "meshconf.compat.transformers.check_config": {"config": CONFIG},
    "meshconf.compat.transformers.distributed_config": {"config": CONFIG},
}


def test_every_public_function_is_covered() -> None:
    assert sorted(name for name, _ in _public_functions()) == sorted(VALID)
    for name, function in _public_functions():
        parameters = [
            parameter.name
            for parameter in inspect.signature(function).parameters.values()
            if parameter.kind is not inspect.Parameter.VAR_KEYWORD
        ]
        assert parameters[: len(VALID[name])] == list(VALID[name]), name


def _refused_naming(function: Callable[..., Any], arguments: dict[str, Any], name: str) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            function(**arguments)
        except ConfigError as error:
            assert f"{name}:" in str(error), (arguments, str(error))
            return
        except (AttributeError, TypeError, ValidationError) as error:  # pragma: no cover
            raise AssertionError(f"{arguments}: {type(error).__name__}: {error}") from error
    raise AssertionError(f"{arguments} was accepted")  # pragma: no cover


@pytest.mark.parametrize(
    ("name", "function"),
    [pytest.param(name, function, id=name) for name, function in _public_functions()],
)
@settings(max_examples=40, deadline=None)
@given(value=WRONG)
def test_a_first_argument_of_another_type_is_refused_by_name(
    name: str, function: Callable[..., Any], value: Any
) -> None:
    first = next(iter(VALID[name]))
    _refused_naming(function, {**VALID[name], first: value}, first)


@pytest.mark.parametrize(
    "name",
    [name for name in VALID if "context" in VALID[name]],
)
def test_a_config_where_a_context_is_taken_is_refused_by_name(name: str) -> None:
    module, _, attribute = name.rpartition(".")
    function = getattr(importlib.import_module(module), attribute)
    with pytest.raises(ConfigError) as raised:
        function(**{**VALID[name], "context": CONFIG})
    assert str(raised.value) == (
        "context: expected a DistributedContext, got a MeshConfig; build one from it: "
        "meshconf.DistributedContext(config) on every rank"
    )


@settings(max_examples=60, deadline=None)
@given(value=st.one_of(st.text(max_size=8), st.integers(), st.floats(allow_nan=False), WRONG))
def test_fsdp2_takes_only_true_false_or_none(value: Any) -> None:
    from meshconf.compat.accelerate import check_config

    if value is None or isinstance(value, bool):
        return
    _refused_naming(check_config, {"config": CONFIG, "fsdp2": value}, "fsdp2")


def test_fsdp2_given_as_the_string_false_is_refused_not_read_as_on() -> None:
    from meshconf.compat.accelerate import check_config

    single = load_config({"world_size": 8, "degrees": {"tp": 8}})
    with pytest.raises(ConfigError) as raised:
        check_config(single, fsdp2="false")  # type: ignore[arg-type]
    assert str(raised.value) == "fsdp2: expected True, False or None, got the string 'false'"
    check_config(single, fsdp2=False)


@settings(max_examples=60, deadline=None)
@given(
    value=st.one_of(
        st.none(), st.integers(max_value=0), st.text(max_size=4), st.floats(), st.booleans()
    )
)
def test_from_parallelism_config_needs_a_world_size_of_ranks(value: Any) -> None:
    from meshconf.compat.accelerate import from_parallelism_config

    arguments = {**VALID["meshconf.compat.accelerate.from_parallelism_config"], "world_size": value}
    _refused_naming(from_parallelism_config, arguments, "world_size")


@settings(max_examples=60, deadline=None)
@given(
    sizes=st.dictionaries(st.sampled_from(list(ACCELERATE_SIZES)), st.integers(1, 4), max_size=4)
)
def test_a_mapping_of_accelerate_s_sizes_is_refused_not_read_as_all_ones(
    sizes: dict[str, int],
) -> None:
    from meshconf.compat.accelerate import from_parallelism_config

    with pytest.raises(ConfigError) as raised:
        from_parallelism_config(sizes, world_size=8)
    assert str(raised.value).startswith(
        "parallelism: expected accelerate's ParallelismConfig (or an object with its "
        "dp_replicate_size, dp_shard_size, cp_size, tp_size), got a mapping"
    )
    every = {**dict.fromkeys(ACCELERATE_SIZES, 1), **sizes}
    world = (
        every["dp_replicate_size"] * every["dp_shard_size"] * every["cp_size"] * every["tp_size"]
    )
    config = from_parallelism_config(SimpleNamespace(**every), world_size=world)
    assert config.resolved_degrees["dp_shard"] == every["dp_shard_size"]
    assert config.resolved_degrees["tp"] == every["tp_size"]


def test_torchtitan_s_from_config_names_what_it_was_given() -> None:
    from meshconf.compat.parallel_dims_common import ParallelDimsError
    from meshconf.compat.torchtitan import ParallelDims

    for value in (None, {"tensor_parallel_degree": 2}, "job.toml"):
        with pytest.raises(ParallelDimsError, match=r"^parallelism_config: expected torchtitan's"):
            ParallelDims.from_config(value, 8)


# Torch's side: a closed context, and a process group of another size ---------------------


def _closed_context_is_named() -> None:
    from meshconf.compat.accelerate import parallelism_config
    from meshconf.compat.nemo_automodel import meshes
    from meshconf.runtime import DistributedContext, RuntimeSetupError

    context = DistributedContext.simulate(CONFIG, rank=0, world_size=8)
    # On the CPU, accelerate's Accelerator runs as MULTI_CPU and refuses a ParallelismConfig:
    # said first, whether accelerate is installed here or not.
    with pytest.warns(UserWarning) as warned, contextlib.suppress(ModuleNotFoundError):
        parallelism_config(context, fsdp2=False)
    assert str(warned[0].message).startswith(
        "this context runs on the CPU over 8 ranks, and accelerate's Accelerator will refuse "
        "the ParallelismConfig: without a GPU it runs as DistributedType.MULTI_CPU"
    )
    context.close()
    assert context.closed
    closed = (
        "context: the DistributedContext is closed: close() (or the end of its with block) "
        "destroyed its process groups; build a new one with meshconf.DistributedContext(config) "
        "on every rank"
    )
    for function in (parallelism_config, meshes):
        with pytest.raises(ConfigError) as raised:
            function(context)
        assert type(raised.value) is ConfigError and str(raised.value) == closed
    for request in (
        lambda: context.mesh_for("dense"),
        lambda: context.get_mesh("tp"),
        lambda: context.world_mesh,
        context.build_all,
        lambda: context.named_mesh({"tp": "tp"}),
    ):
        with pytest.raises(RuntimeSetupError, match=r"^rank 0's DistributedContext is closed"):
            request()


@pytest.mark.slow
def test_a_closed_context_says_it_is_closed() -> None:
    from distributed import in_child

    in_child(_closed_context_is_named)


def _megatron_refuses_another_world() -> None:
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    from meshconf.compat.megatron import initialize_model_parallel
    from meshconf.runtime import RuntimeSetupError

    with pytest.raises(RuntimeSetupError, match="needs the default process group"):
        initialize_model_parallel(CONFIG)
    dist.init_process_group("fake", rank=0, world_size=32, store=FakeStore())
    try:
        for data, says in (
            ({"world_size": 64, "degrees": {"dp_shard": 8, "tp": 8}}, "says"),
            ({"degrees": {"dp_shard": 8, "tp": 8}}, "has degrees for"),
        ):
            with pytest.raises(ConfigError) as raised:
                initialize_model_parallel(load_config(data))
            assert str(raised.value) == (
                f"world_size: the config {says} 64 ranks, but the default process group has 32: "
                "Megatron-Core takes its data-parallel size from the group (32 / (tp * cp * pp "
                "= 8) = 4), where the config's dp_replicate * dp_shard is 8; launch 64 ranks, or "
                "give the config degrees for 32"
            )
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_megatron_refuses_a_config_for_another_process_group() -> None:
    from distributed import in_child

    in_child(_megatron_refuses_another_world)


@pytest.mark.slow
@settings(max_examples=30, deadline=None)
@given(wanted=st.integers(2, 4096))
def test_a_process_started_alone_is_told_how_many_to_start(wanted: int) -> None:
    from meshconf.runtime.inputs import check_launched_world
    from meshconf.runtime.launch import Launch

    config = load_config({"world_size": wanted, "degrees": {"dp_shard": wanted}})
    with pytest.raises(MeshconfError) as raised:
        check_launched_world(config, Launch(0, 1, 0, 1, "none"))
    assert str(raised.value) == (
        f"world_size: the config says {wanted} ranks, but this process was started alone, "
        "without a launcher's RANK and WORLD_SIZE, so the world is 1 rank; start "
        f"{wanted} processes: `torchrun --nproc_per_node {wanted} train.py`, or `accelerate "
        f"launch --num_processes {wanted} train.py` (`accelerate launch --cpu` starts one "
        "process unless given --num_processes)"
    )
