"""d9d's mesh parameters and domain names, backed by meshconf.

``DeviceMeshParameters`` takes d9d's field names (``pipeline_parallel``,
``data_parallel_replicate``, ...) and turns them into a :class:`MeshConfig` whose domains are
d9d's, with d9d's dim names, so that code written against d9d's ``DistributedContext``
(``ctx.mesh_for(DENSE_DOMAIN)["dp_replicate", "dp_cp_shard"]``) runs on meshconf's. Validation
needs no torch; :meth:`DeviceMeshParameters.build` imports the runtime.

One difference on purpose (see ``docs/migration.md``): ``expert_parallel`` must divide the data
and context ranks, ``data_parallel_replicate * data_parallel_shard * context_parallel_shard *
context_parallel_replicate``, which d9d's expert domain splits into ``ep_replicate x
ep_shard``; d9d checks it against that product times ``tensor_parallel``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator
from pydantic_core import InitErrorDetails, PydanticCustomError

from meshconf.model.config import MeshConfig
from meshconf.model.fields import Positive
from meshconf.sources.loading import load_config

if TYPE_CHECKING:
    from meshconf.runtime import DistributedContext

#: d9d's domain names.
DENSE_DOMAIN = "dense"
EXPERT_DOMAIN = "expert"
BATCH_DOMAIN = "batch"
REGULAR_DOMAIN = "regular"
FLAT_DOMAIN = "flat"


class DeviceMeshParameters(BaseModel):
    """d9d's parallel degrees; each defaults to 1, and the world is their product."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    pipeline_parallel: Positive = Field(1, description="Pipeline stages.")
    data_parallel_replicate: Positive = Field(1, description="Data-parallel replicas.")
    data_parallel_shard: Positive = Field(1, description="Data-parallel shards (FSDP).")
    context_parallel_shard: Positive = Field(1, description="Context ranks FSDP shards over.")
    context_parallel_replicate: Positive = Field(1, description="Context ranks kept replicated.")
    tensor_parallel: Positive = Field(1, description="Tensor-parallel ranks.")
    expert_parallel: Positive = Field(1, description="Expert shards (ep_shard).")

    @model_validator(mode="after")
    def _experts_split_the_data_ranks(self) -> DeviceMeshParameters:
        if self.data_and_context % self.expert_parallel:
            error = PydanticCustomError(
                "expert_parallel",
                "expert_parallel({ep}) must divide data_parallel_replicate * "
                "data_parallel_shard * context_parallel_shard * context_parallel_replicate "
                "= {ranks}: the expert domain splits those ranks into ep_replicate x ep_shard",
                {"ep": self.expert_parallel, "ranks": self.data_and_context},
            )
            raise ValidationError.from_exception_data(
                "DeviceMeshParameters",
                [
                    InitErrorDetails(
                        type=error, loc=("expert_parallel",), input=self.expert_parallel
                    )
                ],
            )
        return self

    @property
    def data_and_context(self) -> int:
        return (
            self.data_parallel_replicate
            * self.data_parallel_shard
            * self.context_parallel_shard
            * self.context_parallel_replicate
        )

    @property
    def world_size(self) -> int:
        return self.pipeline_parallel * self.data_and_context * self.tensor_parallel

    def mesh_config_data(self) -> dict[str, Any]:
        """The meshconf config, as the mapping ``load_config`` takes (and YAML would hold)."""
        cp_replicate, ep = self.context_parallel_replicate, self.expert_parallel
        expert = ["pp", "ep_replicate", "ep_shard"]
        if self.tensor_parallel > 1:
            # d9d's expert domain leaves tp out, so it covers the world only when tp is 1;
            # meshconf's domains cover the world, so tp stays last, where the dense one has it.
            expert.append("tp")
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
            # meshconf's ep may not; these dims state d9d's split directly.
            "derived": {
                "cp_replicate": str(cp_replicate),
                "cp_shard": f"cp / {cp_replicate}",
                "dp_cp_shard": "dp_shard * cp_shard",
                "dp": "dp_replicate * dp_shard",
                "ep_shard": str(ep),
                "ep_replicate": f"dp_replicate * dp_shard * cp / {ep}",
                "world": "pp * dp_replicate * dp_shard * cp * tp",
            },
            "domains": {
                DENSE_DOMAIN: ["pp", "dp_replicate", "dp_cp_shard", "cp_replicate", "tp"],
                EXPERT_DOMAIN: expert,
                BATCH_DOMAIN: ["pp", "dp", "cp", "tp"],
                REGULAR_DOMAIN: [
                    "pp",
                    "dp_replicate",
                    "dp_shard",
                    "cp_shard",
                    "cp_replicate",
                    "tp",
                ],
                FLAT_DOMAIN: ["world"],
            },
        }

    def to_mesh_config(self) -> MeshConfig:
        return load_config(self.mesh_config_data())

    def build(self) -> DistributedContext:
        """A DistributedContext over these parameters, as d9d's ``build()`` gives."""
        from meshconf.runtime import DistributedContext

        return DistributedContext(self.to_mesh_config())
