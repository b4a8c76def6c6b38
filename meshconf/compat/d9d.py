"""d9d's mesh parameters and domain names, backed by meshconf.

``DeviceMeshParameters`` takes d9d's field names (``pipeline_parallel``,
``data_parallel_replicate``, ...) and turns them into a :class:`MeshConfig` whose domains are
d9d's, with d9d's dim names, so that code written against d9d's ``DistributedContext``
(``ctx.mesh_for(DENSE_DOMAIN)["dp_replicate", "dp_cp_shard"]``) runs on meshconf's. Validation
needs no torch; :meth:`DeviceMeshParameters.build` imports the runtime.

d9d 0.24.0's fields, ``has_*`` flags, ``is_distributed`` and its check on
``expert_parallel`` are kept; the differences on purpose (degrees below 1, the expert domain
when ``tensor_parallel > 1``) are listed in ``docs/migration.md``.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from meshconf.model.config import MeshConfig
from meshconf.model.field_errors import FieldError, validation_error
from meshconf.model.fields import Positive
from meshconf.sources.loading import load_config

if TYPE_CHECKING:
    from meshconf.compat.d9d_context import DistributedContext

#: d9d's domain names.
DENSE_DOMAIN = "dense"
EXPERT_DOMAIN = "expert"
BATCH_DOMAIN = "batch"
REGULAR_DOMAIN = "regular"
FLAT_DOMAIN = "flat"
#: d9d's domains, outer dim first, with d9d's dim names.
_DOMAINS = {
    DENSE_DOMAIN: ("pp", "dp_replicate", "dp_cp_shard", "cp_replicate", "tp"),
    EXPERT_DOMAIN: ("pp", "ep_replicate", "ep_shard"),
    BATCH_DOMAIN: ("pp", "dp", "cp", "tp"),
    REGULAR_DOMAIN: ("pp", "dp_replicate", "dp_shard", "cp_shard", "cp_replicate", "tp"),
    FLAT_DOMAIN: ("world",),
}


class DeviceMeshParameters(BaseModel):
    """d9d's parallel degrees; each defaults to 1, and the world is their product.

    Raises:
        pydantic.ValidationError: (a ValueError) a degree below 1 or not an integer, an unknown
            field, or ``expert_parallel`` not dividing the data, context and tensor ranks.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    pipeline_parallel: Positive = Field(1, description="Pipeline stages.")
    data_parallel_replicate: Positive = Field(1, description="Data-parallel replicas.")
    data_parallel_shard: Positive = Field(1, description="Data-parallel shards (FSDP).")
    context_parallel_replicate: Positive = Field(1, description="Context ranks kept replicated.")
    context_parallel_shard: Positive = Field(1, description="Context ranks FSDP shards over.")
    tensor_parallel: Positive = Field(1, description="Tensor-parallel ranks.")
    expert_parallel: Positive = Field(1, description="Expert shards (ep_shard).")

    @model_validator(mode="after")
    def _experts_split_the_ranks_of_a_stage(self) -> DeviceMeshParameters:
        if self.ranks_per_stage % self.expert_parallel:
            raise validation_error(
                "DeviceMeshParameters",
                [
                    FieldError(
                        ("expert_parallel",),
                        "expert_parallel",
                        "expert_parallel({ep}) must divide data_parallel_replicate * "
                        "data_parallel_shard * context_parallel_shard * "
                        "context_parallel_replicate * tensor_parallel = {ranks}: the expert "
                        "domain splits the ranks of a pipeline stage into ep_replicate x "
                        "ep_shard",
                        {"ep": self.expert_parallel, "ranks": self.ranks_per_stage},
                        self.expert_parallel,
                    )
                ],
            )
        return self

    @property
    def has_pipeline_parallel(self) -> bool:
        return self.pipeline_parallel > 1

    @property
    def has_data_parallel_replicate(self) -> bool:
        return self.data_parallel_replicate > 1

    @property
    def has_data_parallel_shard(self) -> bool:
        return self.data_parallel_shard > 1

    @property
    def has_context_parallel_replicate(self) -> bool:
        return self.context_parallel_replicate > 1

    @property
    def has_context_parallel_shard(self) -> bool:
        return self.context_parallel_shard > 1

    @property
    def has_tensor_parallel(self) -> bool:
        return self.tensor_parallel > 1

    @property
    def has_expert_parallel(self) -> bool:
        return self.expert_parallel > 1

    @property
    def is_distributed(self) -> bool:
        """Whether any degree is above 1."""
        return any(value > 1 for value in self.model_dump().values())

    @property
    def ranks_per_stage(self) -> int:
        """The data, context and tensor ranks of one pipeline stage."""
        return (
            self.data_parallel_replicate
            * self.data_parallel_shard
            * self.context_parallel_shard
            * self.context_parallel_replicate
            * self.tensor_parallel
        )

    @property
    def world_size(self) -> int:
        return self.pipeline_parallel * self.ranks_per_stage

    def mesh_config_data(self) -> dict[str, Any]:
        """The meshconf config, as the mapping ``load_config`` takes (and YAML would hold)."""
        cp_replicate, ep = self.context_parallel_replicate, self.expert_parallel
        return {
            "world_size": self.world_size,
            "degrees": {
                "pp": self.pipeline_parallel,
                "dp_replicate": self.data_parallel_replicate,
                "dp_shard": self.data_parallel_shard,
                "cp": self.context_parallel_shard * cp_replicate,
                "tp": self.tensor_parallel,
            },
            # ep stays out of degrees: d9d's experts also borrow dp_replicate's ranks, which
            # meshconf's ep may not; these dims state d9d's split directly. d9d's expert mesh
            # leaves tp out, so that it covers only part of the world when tp > 1; here
            # ep_replicate counts the tp ranks too, and the expert domain covers the world.
            "derived": {
                "cp_replicate": str(cp_replicate),
                "cp_shard": f"cp / {cp_replicate}",
                "dp_cp_shard": "dp_shard * cp_shard",
                "dp": "dp_replicate * dp_shard",
                "ep_shard": str(ep),
                "ep_replicate": f"dp_replicate * dp_shard * cp * tp / {ep}",
                "world": "pp * dp_replicate * dp_shard * cp * tp",
            },
            "domains": {name: list(dims) for name, dims in _DOMAINS.items()},
        }

    def to_mesh_config(self) -> MeshConfig:
        return load_config(self.mesh_config_data())

    def build(self, log_level: int = logging.INFO) -> DistributedContext:
        """A DistributedContext over these parameters, as d9d's ``build()`` gives.

        Raises:
            MeshconfError: the launcher started another number of ranks.
        """
        from meshconf.compat.d9d_context import DistributedContext

        return DistributedContext(self, log_level)
