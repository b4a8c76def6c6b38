"""Megatron-Core's ``parallel_state`` started from a meshconf config.

:func:`initialize_model_parallel` calls ``parallel_state.initialize_model_parallel`` with the
config's degrees, model chunks per pipeline rank and rank order in Megatron's spelling, after
checking, by converting those arguments back, that Megatron's groups are the config's
(:func:`meshconf.features.convert.megatron_export.megatron_arguments`). Megatron-Core is
imported only there.
"""

from __future__ import annotations

from typing import Any

from meshconf.compat.checks import mesh_config
from meshconf.core.errors import ConfigError, Diagnostic
from meshconf.features.convert.megatron_export import megatron_arguments
from meshconf.model.config import MeshConfig
from meshconf.sources.loading import at_world_size

__all__ = ["initialize_model_parallel", "parallel_state_arguments"]


def parallel_state_arguments(config: MeshConfig) -> dict[str, Any]:
    """The keyword arguments of ``parallel_state.initialize_model_parallel`` for ``config``.

    Raises:
        ConfigError: a layout whose groups Megatron cannot reproduce, at the key
            responsible; ``config`` not a MeshConfig.
        WorldSizeUnknownError: a degree is -1 and the config has no world size.
    """
    config = mesh_config(config)
    return megatron_arguments(config, command_line=False).parallel_state


def initialize_model_parallel(config: MeshConfig, **options: Any) -> None:
    """``parallel_state.initialize_model_parallel`` for ``config``, after the default process
    group exists; ``options`` go to it as they are (``distributed_timeout_minutes``,
    ``create_gloo_process_groups``, ...). A config without a world size takes the default
    group's.

    Raises:
        ConfigError: as :func:`parallel_state_arguments`, before any group exists; or the
            config does not fit the default group's world size (:func:`_world_mismatch`).
        RuntimeSetupError: no default process group exists.
        ImportError: megatron-core is not installed.
    """
    config = mesh_config(config)
    import torch.distributed as dist

    if not dist.is_initialized():
        from meshconf.runtime import RuntimeSetupError

        raise RuntimeSetupError(
            "initialize_model_parallel needs the default process group: call "
            "torch.distributed.init_process_group first (or build a DistributedContext, and "
            "pass its config)"
        )
    group = dist.get_world_size()
    wanted = config.resolved_world_size
    if wanted is not None and wanted != group:
        raise ConfigError([Diagnostic(("world_size",), _world_mismatch(config, wanted, group))])
    config = at_world_size(config, group)
    arguments = parallel_state_arguments(config)
    from megatron.core import parallel_state

    parallel_state.initialize_model_parallel(**arguments, **options)


def _world_mismatch(config: MeshConfig, wanted: int, group: int) -> str:
    """Why a config of another world size than the default group's is refused: Megatron-Core
    takes the data-parallel size as what the group leaves."""
    degrees = config.resolved_degrees
    model = degrees["tp"] * degrees["cp"] * degrees["pp"]
    data = degrees["dp_replicate"] * degrees["dp_shard"]
    theirs = f"{group // model}" if group % model == 0 else f"{group}/{model}"
    return (
        f"the config {'says' if config.world_size else 'has degrees for'} {wanted} ranks, but "
        f"the default process group has {group}: Megatron-Core takes its data-parallel size "
        f"from the group ({group} / (tp * cp * pp = {model}) = {theirs}), where the config's "
        f"dp_replicate * dp_shard is {data}; launch {wanted} ranks, or give the config "
        f"degrees for {group}"
    )
