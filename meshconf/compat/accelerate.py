"""Hugging Face accelerate's ``ParallelismConfig`` from a meshconf context, and a meshconf
config from one.

accelerate (1.10 and later) describes dp_replicate, dp_shard, cp and tp, lays them out in
that order (outer to inner), and reads its mesh only by dim name: the enabled dims (those
above 1) and three dims it flattens, ``dp`` (the batch), ``dp_shard_cp`` (what FSDP shards
over) and ``dp_cp`` (what the loss is averaged over). A ``ParallelismConfig`` whose
``device_mesh`` is set is used as it is, so :func:`parallelism_config` hands accelerate a
mesh meshconf built: accelerate creates no process group, and the ranks are numbered as the
config numbers them, its ``order``, ``levels`` and ``inside`` kept.

What accelerate cannot express (pipeline and expert parallelism) and what it refuses at run
time is refused here first, at the meshconf key responsible (:func:`check_config`), without
torch. Needs ``pip install "meshconf[accelerate]"`` for :func:`parallelism_config`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from meshconf.core.errors import ConfigError, Diagnostic
from meshconf.features.convert.accelerate import (
    ACCELERATE_ISSUES,
    nothing_to_shard,
    replicated_model_parallel,
)
from meshconf.model.config import MeshConfig
from meshconf.sources.loading import load_config

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

#: accelerate's mesh dims, outer to inner, each the meshconf degree of the same name.
ACCELERATE_DIMS = ("dp_replicate", "dp_shard", "cp", "tp")
#: The dims accelerate flattens, with the dims each joins (those enabled), and the meshconf
#: dim that holds the same groups: the batch, FSDP's shards, the loss.
FLATTENED_DIMS: Mapping[str, tuple[tuple[str, ...], str]] = {
    "dp": (("dp_replicate", "dp_shard"), "batch"),
    "dp_shard_cp": (("dp_shard", "cp"), "fsdp"),
    "dp_cp": (("dp_replicate", "dp_shard", "cp"), "loss"),
}


class AccelerateError(ConfigError):
    """A layout that accelerate cannot express, or would refuse when it starts."""


def _fsdp2_from_launch(environ: Mapping[str, str]) -> bool:
    """Whether ``accelerate launch`` (or the Trainer) asked for FSDP2, as accelerate reads it."""
    return (
        environ.get("ACCELERATE_USE_FSDP", "false").lower() == "true"
        and environ.get("FSDP_VERSION", "1") == "2"
    )


def check_config(config: MeshConfig, *, fsdp2: bool | None = None) -> None:
    """Refuse what accelerate cannot express or would refuse at run time, naming the
    meshconf key and what to change. Needs no torch and no process group.

    ``fsdp2``: whether accelerate runs FSDP2; ``None`` reads it from the environment
    ``accelerate launch`` sets (``ACCELERATE_USE_FSDP`` and ``FSDP_VERSION``).

    Raises:
        AccelerateError: (a ConfigError) pp or ep above 1; tp or cp beside replication without
            sharding (accelerate's issue #3876); FSDP2 with nothing to shard over (#3798).
        WorldSizeUnknownError: a degree is -1 and the config has no world size.
    """
    degrees = config.resolved_degrees
    if fsdp2 is None:
        fsdp2 = _fsdp2_from_launch(os.environ)
    problems: list[Diagnostic] = []
    if degrees["pp"] > 1:
        problems.append(
            Diagnostic(
                ("degrees", "pp"),
                f"accelerate has no pipeline parallelism; set degrees.pp to 1 (giving its "
                f"{degrees['pp']} ranks to dp_shard), or train with torchtitan or Megatron-Core",
            )
        )
    if degrees["ep"] > 1:
        problems.append(
            Diagnostic(
                ("degrees", "ep"),
                f"accelerate has no expert parallelism ({ACCELERATE_ISSUES}/4200); set "
                "degrees.ep to 1, or train with torchtitan, Megatron-Core or transformers' "
                "DistributedConfig",
            )
        )
    model_parallel = replicated_model_parallel(degrees)
    if model_parallel:
        problems.append(
            Diagnostic(
                ("degrees", "dp_replicate"),
                f"accelerate refuses {' and '.join(model_parallel)} beside replication that "
                f"does not shard ({ACCELERATE_ISSUES}/3876): with dp_shard 1, set "
                f"degrees.dp_shard to {degrees['dp_replicate']} and dp_replicate to 1 (FSDP), "
                "or keep dp_replicate and set dp_shard above 1 (HSDP)",
            )
        )
    if fsdp2 and nothing_to_shard(degrees, config.resolved_world_size or 1):
        problems.append(
            Diagnostic(
                ("degrees", "dp_shard"),
                "accelerate's FSDP2 shards over dp_shard * cp, which is 1 here, and fails with "
                f"KeyError 'dp_shard_cp' ({ACCELERATE_ISSUES}/3798): set degrees.dp_shard above "
                "1 (lowering tp to leave it ranks), or launch without FSDP",
            )
        )
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
    result = ParallelismConfig(**{f"{dim}_size": degrees[dim] for dim in ACCELERATE_DIMS})
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
        AccelerateError: sp_size above 1 (DeepSpeed's Ulysses sequence parallelism, which
            meshconf has no degree for), or a size that is not a positive integer.
        ConfigError: the sizes do not multiply to ``world_size``.
    """
    sizes = {dim: getattr(parallelism, f"{dim}_size", 1) for dim in (*ACCELERATE_DIMS, "sp")}
    problems = [
        Diagnostic((f"{dim}_size",), f"expected an integer >= 1, got {value!r}")
        for dim, value in sizes.items()
        if isinstance(value, bool) or not isinstance(value, int) or value < 1
    ]
    if not problems and sizes["sp"] > 1:
        problems.append(
            Diagnostic(
                ("sp_size",),
                f"is {sizes['sp']}: DeepSpeed's Ulysses sequence parallelism, which meshconf "
                "has no degree for; set sp_size to 1, or cp_size for context parallelism",
            )
        )
    if problems:
        raise AccelerateError(problems)
    degrees = {dim: sizes[dim] for dim in ACCELERATE_DIMS}
    if all(size == 1 for size in degrees.values()):
        degrees["dp_replicate"] = world_size
    data: dict[str, Any] = {"world_size": world_size, "degrees": degrees}
    if gpus_per_node is not None:
        data["gpus_per_node"] = gpus_per_node
    return load_config(data)
