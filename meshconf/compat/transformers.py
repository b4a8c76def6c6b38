"""transformers' ``DistributedConfig`` (transformers 5.24 and later) from a meshconf config.

transformers builds its meshes itself from a ``DistributedConfig``: a dense mesh
``(pp, dp_replicate, fsdp, tp)`` and an expert mesh ``(pp, dp_replicate, efsdp, ep)``, both
row-major over the ranks. Those hold the groups of meshconf's ``dense`` and ``sparse``
domains when the config numbers its ranks in the default order, so :func:`distributed_config`
gives the sizes, after :func:`check_config` refuses what transformers cannot build. Needs no
torch; ``DistributedConfig`` needs the ``transformers`` extra.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from meshconf.compat.checks import mesh_config
from meshconf.core.degrees import WORLD_FACTORS
from meshconf.core.errors import ConfigError, Diagnostic
from meshconf.model.config import MeshConfig

if TYPE_CHECKING:
    from transformers import DistributedConfig

__all__ = ["check_config", "distributed_config"]

#: transformers' size arguments, and the meshconf degree each one is.
SIZE_DEGREES = {
    "pp_size": "pp",
    "dp_replicate_size": "dp_replicate",
    "fsdp_size": "dp_shard",
    "tp_size": "tp",
    "ep_size": "ep",
}


def check_config(config: MeshConfig) -> None:
    """Refuse what transformers' meshes cannot hold, naming the meshconf key and what to
    change.

    Raises:
        ConfigError: cp or etp above 1; ranks numbered other than in the default order; ep
            that is not a multiple of tp or does not divide dp_shard * tp; data parallelism
            beside pipeline parallelism; ``config`` not a MeshConfig.
        WorldSizeUnknownError: a degree is -1 and the config has no world size.
    """
    config = mesh_config(config)
    degrees = config.resolved_degrees
    ep, tp, shard = degrees["ep"], degrees["tp"], degrees["dp_shard"]
    order = "order" if config.order is not None else "inside" if config.inside else "levels"
    refused = [
        (
            ("degrees", "cp"),
            degrees["cp"] > 1,
            "transformers' DistributedConfig has no context parallelism; set degrees.cp to 1, "
            "or train with accelerate's ParallelismConfig (cp_size) or torchtitan",
        ),
        (
            ("degrees", "etp"),
            degrees["etp"] > 1,
            "transformers keeps each expert whole on its rank; set degrees.etp to 1",
        ),
        (
            (order,),
            not config.layout_over("transformers", WORLD_FACTORS).is_row_major,
            "transformers numbers the ranks pp, dp_replicate, fsdp, tp outer to inner and "
            f"builds its meshes itself; leave {order} out (or give {order} that keeps that "
            "order), or hand meshconf's meshes to a trainer that takes them (accelerate, "
            "torchtitan)",
        ),
        (
            ("degrees", "ep"),
            ep > 1 and bool(ep % tp or (shard * tp) % ep),
            f"transformers needs ep to be a multiple of tp ({tp}) that divides dp_shard * tp "
            f"({shard * tp}); set degrees.ep to one of "
            + ", ".join(str(n) for n in range(tp, shard * tp + 1, tp) if (shard * tp) % n == 0),
        ),
        (
            ("degrees", "pp"),
            degrees["pp"] > 1 and degrees["dp_replicate"] * shard > 1,
            "transformers does not combine FSDP with pipeline parallelism; set degrees.pp to 1, "
            "or dp_replicate and dp_shard to 1 (tp and pp only)",
        ),
    ]
    problems = [Diagnostic(key, message) for key, applies, message in refused if applies]
    if problems:
        raise ConfigError(problems)


def distributed_config(config: MeshConfig) -> DistributedConfig:
    """transformers' ``DistributedConfig`` with ``config``'s sizes; other arguments
    (``tp_plan``, ``fsdp_plan``, ...) can be set on the result.

    Raises:
        ConfigError: as :func:`check_config`.
        ImportError: transformers is not installed (the ``transformers`` extra).
    """
    check_config(config)
    from transformers import DistributedConfig

    degrees = config.resolved_degrees
    return DistributedConfig(**{name: degrees[dim] for name, dim in SIZE_DEGREES.items()})
