"""Hugging Face accelerate's ``ParallelismConfig`` from a meshconf context, and a meshconf
config from one.

accelerate's dims, the dims it flattens and what it refuses are in
:mod:`meshconf.trainers.accelerate`. A ``ParallelismConfig`` whose ``device_mesh`` is set is
used as it is, so :func:`parallelism_config` hands accelerate a mesh meshconf built:
accelerate creates no process group, and the ranks are numbered as the config numbers them,
its ``order``, ``levels`` and ``inside`` kept. What accelerate cannot express or refuses is
refused here first, at the meshconf key responsible (:func:`check_config`), without torch.
Needs ``pip install "meshconf[accelerate]"`` for :func:`parallelism_config`.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from meshconf.core.errors import ConfigError, Diagnostic
from meshconf.model.config import MeshConfig
from meshconf.sources.loading import load_config
from meshconf.trainers.accelerate import (
    ACCELERATE_DIMS,
    FLATTENED_DIMS,
    LAUNCH_ENVIRONMENT,
    SIZE_DEGREES,
    SP_SIZE,
    Launch,
    refusals,
    sp_size_problem,
    uses_fsdp2,
)

if TYPE_CHECKING:
    from accelerate import ParallelismConfig

    from meshconf.runtime import DistributedContext

__all__ = [
    "ACCELERATE_DIMS",
    "FLATTENED_DIMS",
    "AccelerateError",
    "check_config",
    "from_parallelism_config",
    "parallelism_config",
]


class AccelerateError(ConfigError):
    """A layout that accelerate cannot express, or would refuse when it starts."""


def _config_key(degree: str) -> str:
    return f"degrees.{degree}"


def check_config(config: MeshConfig, *, fsdp2: bool | None = None) -> None:
    """Refuse what accelerate cannot express or would refuse at run time
    (:data:`meshconf.trainers.accelerate.REFUSALS`), naming the meshconf key and what to
    change. Needs no torch and no process group.

    ``fsdp2``: whether accelerate runs FSDP2; ``None`` reads it from the environment
    ``accelerate launch`` sets (``ACCELERATE_USE_FSDP`` and ``FSDP_VERSION``).

    Raises:
        AccelerateError: (a ConfigError) a layout one of the refusals applies to.
        WorldSizeUnknownError: a degree is -1 and the config has no world size.
    """
    if fsdp2 is None:
        launcher = {
            option: os.environ.get(variable) for variable, option in LAUNCH_ENVIRONMENT.items()
        }
        fsdp2 = uses_fsdp2(launcher)
    launch = Launch(config.resolved_degrees, config.resolved_world_size or 1, fsdp2)
    problems = [
        Diagnostic(("degrees", degree), message)
        for degree, message in refusals(launch, _config_key)
    ]
    if problems:
        raise AccelerateError(problems)


def parallelism_config(
    context: DistributedContext, *, fsdp2: bool | None = None
) -> ParallelismConfig:
    """accelerate's ``ParallelismConfig`` for ``context``: its sizes, and its ``device_mesh``
    set to a mesh meshconf built, with accelerate's dim names and its flattened dims, so
    that ``Accelerator(parallelism_config=...)`` (or ``TrainingArguments``) keeps it and
    creates no group. ``fsdp2`` as :func:`check_config`.

    Raises:
        AccelerateError: as :func:`check_config`, before any mesh is built.
        ImportError: accelerate is not installed (``pip install "meshconf[accelerate]"``).
    """
    config = context.config
    check_config(config, fsdp2=fsdp2)
    from accelerate import ParallelismConfig

    degrees = config.resolved_degrees
    result = ParallelismConfig(**{name: degrees[dim] for name, dim in SIZE_DEGREES.items()})
    enabled = [dim for dim in ACCELERATE_DIMS if degrees[dim] > 1]
    if enabled:
        flattened = {
            name: [dim for dim in dims if dim in enabled]
            for name, (dims, _) in FLATTENED_DIMS.items()
        }
        result.device_mesh = context.named_mesh(
            {dim: dim for dim in enabled},
            {name: dims for name, dims in flattened.items() if dims},
        )
    return result


def from_parallelism_config(
    parallelism: Any, *, world_size: int, gpus_per_node: int | None = None
) -> MeshConfig:
    """The meshconf config of an accelerate ``ParallelismConfig`` for ``world_size`` ranks,
    whose groups are accelerate's. As accelerate does, sizes that are all 1 replicate the
    model over every rank.

    Raises:
        AccelerateError: sp_size above 1
            (:func:`~meshconf.trainers.accelerate.sp_size_problem`), or a size that is not a
            positive integer.
        ConfigError: the sizes do not multiply to ``world_size``.
    """
    sizes = {name: getattr(parallelism, name, 1) for name in (*SIZE_DEGREES, SP_SIZE)}
    problems = [
        Diagnostic((name,), f"expected an integer >= 1, got {value!r}")
        for name, value in sizes.items()
        if isinstance(value, bool) or not isinstance(value, int) or value < 1
    ]
    if not problems and (problem := sp_size_problem(sizes[SP_SIZE])) is not None:
        problems.append(Diagnostic((SP_SIZE,), problem))
    if problems:
        raise AccelerateError(problems)
    degrees = {dim: sizes[name] for name, dim in SIZE_DEGREES.items()}
    if all(size == 1 for size in degrees.values()):
        degrees["dp_replicate"] = world_size
    data: dict[str, Any] = {"world_size": world_size, "degrees": degrees}
    if gpus_per_node is not None:
        data["gpus_per_node"] = gpus_per_node
    return load_config(data)
