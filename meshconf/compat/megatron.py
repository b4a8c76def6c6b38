"""Megatron-Core's ``parallel_state`` started from a meshconf config.

:func:`initialize_model_parallel` calls ``parallel_state.initialize_model_parallel`` with the
config's degrees, model chunks per pipeline rank and rank order in Megatron's spelling, after
checking, by converting those arguments back, that Megatron's groups are the config's
(:func:`meshconf.features.convert.megatron_export.megatron_arguments`). Megatron-Core is
imported only there.
"""

from __future__ import annotations

from typing import Any

from meshconf.features.convert.megatron_export import MegatronExportError, megatron_arguments
from meshconf.model.config import MeshConfig

__all__ = ["MegatronExportError", "initialize_model_parallel", "parallel_state_arguments"]


def parallel_state_arguments(config: MeshConfig) -> dict[str, Any]:
    """The keyword arguments of ``parallel_state.initialize_model_parallel`` for ``config``.

    Raises:
        MegatronExportError: (a ConfigError) a layout whose groups Megatron cannot reproduce,
            at the key responsible.
        WorldSizeUnknownError: a degree is -1 and the config has no world size.
    """
    return megatron_arguments(config, command_line=False).parallel_state


def initialize_model_parallel(config: MeshConfig, **options: Any) -> None:
    """``parallel_state.initialize_model_parallel`` for ``config``, after the default process
    group exists; ``options`` go to it as they are (``distributed_timeout_minutes``,
    ``create_gloo_process_groups``, ...). A config without a world size takes the default
    group's.

    Raises:
        MegatronExportError: as :func:`parallel_state_arguments`, before any group exists.
        ConfigError: the config does not fit the default group's world size.
        ImportError: megatron-core is not installed.
    """
    import torch.distributed as dist

    if config.resolved_world_size is None:
        config = config.with_world_size(dist.get_world_size())
    arguments = parallel_state_arguments(config)
    from megatron.core import parallel_state

    parallel_state.initialize_model_parallel(**arguments, **options)
