"""The sections of a mesh config, each its own frozen model: the degrees, the part of each
world factor inside a node, the topology levels and the runtime options."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PrivateAttr,
    create_model,
    model_validator,
)

from meshconf.core.degrees import (
    AUTO,
    DEGREE_NAMES,
    DEGREES,
    EXPERT_DEGREES,
    WORLD_FACTORS,
    auto_factor,
    default_dp_shard,
)
from meshconf.model.field_errors import FieldError, validation_error
from meshconf.model.fields import (
    BandwidthGBs,
    ExpertDegree,
    GpusPerNode,
    Name,
    Positive,
    TimeoutSeconds,
    WorldFactor,
    device_value,
)


class FrozenModel(BaseModel):
    """The base of every config model: unknown keys refused, frozen once validated."""

    # strict=False: the field types check and convert values themselves, with meshconf's
    # messages; unknown keys are refused and a validated model cannot change.
    model_config = ConfigDict(frozen=True, extra="forbid", strict=False)


class _DegreeValues(FrozenModel):
    """Parallel degrees. World factors may be -1 (at most one): fill the remaining ranks."""

    _dp_shard_defaulted: bool = PrivateAttr(default=False)

    if TYPE_CHECKING:
        # Each field is a degree of core.degrees.DEGREES, an int; Degrees below adds them.
        def __getattr__(self, name: str) -> int: ...

    @model_validator(mode="wrap")
    @classmethod
    def _default_dp_shard(cls, data: Any, handler: Any) -> _DegreeValues:
        defaulted = isinstance(data, dict) and "dp_shard" not in data
        if defaulted:
            data = {**data, "dp_shard": default_dp_shard(data)}
        degrees: _DegreeValues = handler(data)
        degrees._dp_shard_defaulted = defaulted or degrees._dp_shard_defaulted
        return degrees

    @property
    def explicit(self) -> frozenset[str]:
        """The degrees the user wrote (dp_shard's computed default excluded)."""
        written = set(self.model_fields_set)
        if self._dp_shard_defaulted:
            written.discard("dp_shard")
        return frozenset(written)

    @property
    def pinned(self) -> dict[str, int]:
        """The degrees the user wrote with a value (not ``-1``), in the registry's order."""
        explicit = self.explicit
        return {
            name: getattr(self, name)
            for name in DEGREE_NAMES
            if name in explicit and getattr(self, name) != AUTO
        }

    @property
    def auto(self) -> str | None:
        return auto_factor(self.model_dump())


class _InsideNodeParts(FrozenModel):
    """The part of each world factor placed inside a node; the rest of it goes across nodes.
    Parts left out are 1; together the parts multiply to gpus_per_node."""

    if TYPE_CHECKING:
        # Each field is a world factor of core.degrees.DEGREES; InsideNode below adds them.
        def __getattr__(self, name: str) -> int: ...

    @model_validator(mode="before")
    @classmethod
    def _no_expert_degrees(cls, data: Any) -> Any:
        # ep and etp are not world factors, so the generic "unknown key 'ep' (did you mean
        # 'pp'?)" would mislead; say where their ranks come from instead.
        if isinstance(data, dict):
            expert = [key for key in EXPERT_DEGREES if key in data]
            if expert:
                raise validation_error(
                    "InsideNode",
                    [
                        FieldError(
                            (key,),
                            "inside_node_expert",
                            "{key} is not a world factor: experts borrow their ranks from "
                            "dp_shard * cp * tp, so place those; inside_node takes {factors}",
                            {"key": key, "factors": ", ".join(WORLD_FACTORS)},
                            data[key],
                        )
                        for key in expert
                    ],
                )
        return data

    @property
    def explicit(self) -> frozenset[str]:
        """The world factors the user placed."""
        return frozenset(self.model_fields_set)


def _with_fields(name: str, base: type[FrozenModel], fields: dict[str, Any]) -> Any:
    return create_model(name, __base__=base, __module__=__name__, __doc__=base.__doc__, **fields)


# The fields come from the degree table, so that a degree is declared once; the classes above
# hold what the fields do not.
if TYPE_CHECKING:
    Degrees = _DegreeValues
    InsideNode = _InsideNodeParts
else:
    Degrees = _with_fields(
        "Degrees",
        _DegreeValues,
        {
            degree.name: (
                WorldFactor if degree.world_factor else ExpertDegree,
                Field(degree.default, description=degree.meaning, examples=list(degree.examples)),
            )
            for degree in DEGREES
        },
    )
    InsideNode = _with_fields(
        "InsideNode",
        _InsideNodeParts,
        {
            degree.name: (
                GpusPerNode,
                Field(1, description=degree.inside_node, examples=[degree.inside_node_example]),
            )
            for degree in DEGREES
            if degree.world_factor
        },
    )


class TopologyLevel(FrozenModel):
    """A unit of GPUs that hold consecutive ranks: a node, an NVLink domain, a pod."""

    name: Name = Field(
        description="The level's name, used by inside; node is the node, nvlink the NVLink "
        "domain (both checked on the machine at start-up).",
        examples=["nvlink"],
    )
    size: Positive = Field(
        description="GPUs (ranks of this job) in one unit, a multiple of the level below.",
        examples=[72],
    )
    bandwidth_gb_s: BandwidthGBs | None = Field(
        None,
        description="Bandwidth between two GPUs of one unit, in GB/s per GPU, for plan's "
        "estimate; by default the hardware's.",
        examples=[900],
    )


class RuntimeOptions(FrozenModel):
    """How DistributedContext picks device, backend and timeouts."""

    device: Annotated[Literal["auto", "cuda", "cpu"], BeforeValidator(device_value)] = Field(
        "auto", description="auto: cuda when GPUs exist, else cpu.", examples=["cuda"]
    )
    backend: Literal["auto", "nccl", "gloo"] = Field(
        "auto", description="auto: nccl on cuda, gloo on cpu.", examples=["nccl"]
    )
    timeout_s: TimeoutSeconds = Field(
        1800, description="Timeout of every process group, in seconds.", examples=[600]
    )
    setup_timeout_s: TimeoutSeconds = Field(
        180,
        description="Bound on set-up, in seconds: joining the world, the config check across "
        "ranks and group creation. A rank that fails or never arrives is named within it.",
        examples=[60],
    )
    build: Literal["eager", "lazy"] = Field(
        "eager",
        description="eager: every domain's groups are created when the context is, in one "
        "order on every rank. lazy: on first use; every rank must then ask for meshes in the "
        "same order (a different order fails within setup_timeout_s, naming the meshes).",
        examples=["lazy"],
    )

    @model_validator(mode="after")
    def _backend_fits_device(self) -> RuntimeOptions:
        if self.backend == "nccl" and self.device == "cpu":
            raise validation_error(
                "RuntimeOptions",
                FieldError(
                    ("backend",),
                    "backend_device",
                    "nccl needs device cuda (or auto), not cpu",
                    input=self.backend,
                ),
            )
        return self
