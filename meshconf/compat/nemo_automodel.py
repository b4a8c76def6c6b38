"""NeMo AutoModel's meshes, built by meshconf and named with its axis names.

NeMo AutoModel (0.7) takes meshes built elsewhere (``MeshContext.from_meshes``,
``from_pretrained(device_mesh=...)``), reading them by its ``MeshAxisName``s: a device mesh
``(pp, dp_replicate, dp_shard, cp, tp)`` with the flattened ``dp``, ``dp_shard_cp`` and
``dp_cp``, and, with experts, a MoE mesh ``(ep_shard, ep)`` over one pipeline stage's ranks.
:func:`meshes` builds both from a context's groups, with the config's rank order.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from meshconf.compat.checks import mesh_config, open_context
from meshconf.core.errors import ConfigError, Diagnostic
from meshconf.model.config import MeshConfig
from meshconf.trainers.accelerate_mesh import FLATTENED_DIMS

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh

    from meshconf.runtime import DistributedContext

__all__ = ["DEVICE_MESH_DIMS", "check_config", "meshes"]

#: The device mesh's axes, outer to inner, each the meshconf degree of the same name.
DEVICE_MESH_DIMS = ("pp", "dp_replicate", "dp_shard", "cp", "tp")
#: The axes NeMo AutoModel flattens, with the axes each joins: accelerate's.
FLATTENED = {name: dims for name, (dims, _) in FLATTENED_DIMS.items()}
#: The MoE mesh's axes, over one pipeline stage: ep_shard holds the ranks that keep the same
#: experts, meshconf's dp_replicate and efsdp together.
MOE_MESH_DIMS = {"ep_shard": ("dp_replicate", "efsdp"), "ep": ("ep",)}


def check_config(config: MeshConfig) -> None:
    """Refuse what NeMo AutoModel cannot run, at the meshconf key, with what to change.

    Raises:
        ConfigError: etp above 1 with experts, or dp_replicate above 1 without dp_shard;
            ``config`` not a MeshConfig.
        WorldSizeUnknownError: a degree is -1 and the config has no world size.
    """
    config = mesh_config(config)
    degrees = config.resolved_degrees
    problems = []
    if degrees["ep"] > 1 and degrees["etp"] > 1:
        whole = "NeMo AutoModel keeps each expert whole on its rank; set degrees.etp to 1"
        problems.append(Diagnostic(("degrees", "etp"), whole))
    if degrees["dp_replicate"] > 1 and degrees["dp_shard"] == 1:
        replicated = (
            "NeMo AutoModel's FSDP2 strategy refuses plain replication (dp_shard 1): set "
            f"degrees.dp_shard to {degrees['dp_replicate']} and degrees.dp_replicate to 1, "
            "or degrees.dp_shard above 1 as well (HSDP)"
        )
        problems.append(Diagnostic(("degrees", "dp_replicate"), replicated))
    if problems:
        raise ConfigError(problems)


def meshes(context: DistributedContext) -> tuple[DeviceMesh, DeviceMesh | None]:
    """NeMo AutoModel's device mesh and MoE mesh (None without experts) for ``context``,
    for ``MeshContext.from_meshes(device_mesh, moe_mesh, strategy_config=...)``.

    Raises:
        ConfigError: as :func:`check_config`, before any mesh is built; ``context``
            not an open DistributedContext (a MeshConfig, or a closed context).
    """
    context = open_context(context)
    check_config(context.config)
    device_mesh = context.named_mesh({dim: dim for dim in DEVICE_MESH_DIMS}, FLATTENED)
    if context.config.resolved_degrees["ep"] == 1:
        return device_mesh, None
    return device_mesh, context.named_mesh(MOE_MESH_DIMS, outside=["pp"])
