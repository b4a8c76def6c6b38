"""Hugging Face accelerate's ``ParallelismConfig`` from a meshconf context, and a meshconf
config from one.

accelerate's dims, the dims it flattens and what it refuses are in
:mod:`meshconf.trainers.accelerate_mesh`. accelerate uses a ``ParallelismConfig``'s
``device_mesh`` as it is, so the ranks are numbered as the config numbers them (its ``order``,
``levels`` and ``inside`` kept). :func:`parallelism_config` needs the ``accelerate`` extra.
"""

from __future__ import annotations

import os
import warnings
from typing import TYPE_CHECKING, Any

from meshconf.compat.checks import mesh_config, open_context, refused, switch, world_ranks
from meshconf.core.errors import ConfigError, Diagnostic, describe_value
from meshconf.model.config import MeshConfig
from meshconf.sources.loading import load_config
from meshconf.trainers.accelerate_mesh import (
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
    "check_config",
    "from_parallelism_config",
    "parallelism_config",
]

#: What a run on CPUs is told before accelerate refuses it.
CPU_ONLY = (
    "this context runs on the CPU over {world} ranks, and accelerate's Accelerator will refuse "
    "the ParallelismConfig: without a GPU it runs as DistributedType.MULTI_CPU, and accelerate "
    "takes a ParallelismConfig of more than one rank only under FSDP2, a multi-GPU run or "
    "DeepSpeed (ParallelismConfig._validate_accelerator); launch on GPUs "
    "(accelerate launch without --cpu, on a machine with CUDA devices)"
)


def check_config(config: MeshConfig, *, fsdp2: bool | None = None) -> None:
    """Refuse what accelerate cannot express or would refuse at run time
    (:data:`meshconf.trainers.accelerate_mesh.REFUSALS`), at the meshconf key, without torch.

    ``fsdp2``: whether accelerate runs FSDP2; ``None`` reads it from the environment
    ``accelerate launch`` sets (``ACCELERATE_USE_FSDP`` and ``FSDP_VERSION``).

    Raises:
        ConfigError: a layout one of the refusals applies to; ``config`` not a MeshConfig,
            or ``fsdp2`` not True, False or None.
        WorldSizeUnknownError: a degree is -1 and the config has no world size.
    """
    config = mesh_config(config)
    fsdp2 = switch(fsdp2, "fsdp2")
    if fsdp2 is None:
        launcher = {
            option: os.environ.get(variable) for variable, option in LAUNCH_ENVIRONMENT.items()
        }
        fsdp2 = uses_fsdp2(launcher)
    launch = Launch(config.resolved_degrees, config.resolved_world_size or 1, fsdp2)
    problems = [
        Diagnostic(("degrees", degree), message)
        for degree, message in refusals(launch, "degrees.{}".format)
    ]
    if problems:
        raise ConfigError(problems)


def parallelism_config(
    context: DistributedContext, *, fsdp2: bool | None = None
) -> ParallelismConfig:
    """accelerate's ``ParallelismConfig`` for ``context``: its sizes, and its ``device_mesh``
    set to a mesh meshconf built, with accelerate's dim names and its flattened dims, so
    that ``Accelerator(parallelism_config=...)`` (or ``TrainingArguments``) keeps it and
    creates no group. ``fsdp2`` as :func:`check_config`. Without a GPU, over more than one
    rank, it warns first (:data:`CPU_ONLY`), and builds the mesh all the same.

    Raises:
        ConfigError: as :func:`check_config`, before any mesh is built; ``context`` not an
            open DistributedContext (a MeshConfig, or a closed context).
        ImportError: accelerate is not installed (the ``accelerate`` extra).
    """
    context = open_context(context)
    config = context.config
    check_config(config, fsdp2=fsdp2)
    if context.device.type == "cpu" and context.world_size > 1:
        warnings.warn(CPU_ONLY.format(world=context.world_size), UserWarning, stacklevel=2)
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
    """The meshconf config of an accelerate ``ParallelismConfig`` (or any object with its
    four sizes, and optionally ``sp_size``; not a mapping, a string or None, which would read
    as all ones) for ``world_size`` ranks, whose groups are accelerate's. As accelerate does,
    sizes that are all 1 replicate the model over every rank.

    Raises:
        ConfigError: ``parallelism`` without those sizes, sp_size above 1
            (:func:`~meshconf.trainers.accelerate_mesh.sp_size_problem`), a size or
            ``world_size`` that is not a positive integer, sizes that do not multiply to
            ``world_size``, or a ``gpus_per_node`` that is not a positive integer.
    """
    if isinstance(parallelism, str | bytes) or not all(
        hasattr(parallelism, name) for name in SIZE_DEGREES
    ):
        hint = ""
        if isinstance(parallelism, dict):
            hint = "; for a mapping of sizes, pass ParallelismConfig(**sizes)"
        raise refused(
            "parallelism",
            "expected accelerate's ParallelismConfig (or an object with its "
            f"{', '.join(SIZE_DEGREES)}), got {describe_value(parallelism)}{hint}",
        )
    world_size = world_ranks(
        world_size,
        "pass world_size=, the number of processes accelerate runs (accelerate launch's "
        "--num_processes, or Accelerator().num_processes)",
    )
    sizes = {name: getattr(parallelism, name, 1) for name in (*SIZE_DEGREES, SP_SIZE)}
    problems = [
        Diagnostic((name,), f"expected an integer >= 1, got {value!r}")
        for name, value in sizes.items()
        if isinstance(value, bool) or not isinstance(value, int) or value < 1
    ]
    if not problems and (problem := sp_size_problem(sizes[SP_SIZE])) is not None:
        problems.append(Diagnostic((SP_SIZE,), problem))
    if problems:
        raise ConfigError(problems)
    degrees = {dim: sizes[name] for name, dim in SIZE_DEGREES.items()}
    if all(size == 1 for size in degrees.values()):
        degrees["dp_replicate"] = world_size
    data: dict[str, Any] = {"world_size": world_size, "degrees": degrees}
    if gpus_per_node is not None:
        data["gpus_per_node"] = gpus_per_node
    return load_config(data)
