"""The mesh config: a strict, frozen pydantic v2 model over the sections of
:mod:`meshconf.model.sections`. Field types (:mod:`meshconf.model.fields`) check types and
ranges; one model validator then runs the formula rules of :mod:`meshconf.model.rules` and
places each problem on the field it concerns."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from typing import Annotated, Any

from pydantic import BeforeValidator, Field, PrivateAttr, model_validator

from meshconf.core import formulas
from meshconf.core.degrees import WORLD_FACTORS
from meshconf.core.domains import DEFAULT_DERIVED, DEFAULT_DOMAINS
from meshconf.core.errors import UnknownDomainError, WorldSizeUnknownError
from meshconf.core.layout import DomainLayout, LayoutError
from meshconf.core.levels import Level, all_levels, node_size
from meshconf.model.analysis import Analysis, MeshSpec
from meshconf.model.field_errors import FieldError, validation_error
from meshconf.model.fields import (
    DimList,
    FormulaText,
    GpusPerNode,
    Name,
    Positive,
    WorldOrder,
    level_list,
)
from meshconf.model.numbering import numbering
from meshconf.model.rules import analyze
from meshconf.model.sections import Degrees, FrozenModel, InsideNode, RuntimeOptions, TopologyLevel
from meshconf.model.training import TrainingOptions


class MeshConfig(FrozenModel):
    """A validated N-D parallel mesh: world size, degrees, derived dims and domains."""

    world_size: Positive | None = Field(
        None,
        description="Total ranks. May be omitted: then WORLD_SIZE at runtime or --world-size.",
        examples=[512],
    )
    gpus_per_node: GpusPerNode | None = Field(
        None,
        description="Ranks per node; enables the node placement report and its warnings.",
        examples=[8],
    )
    degrees: Degrees = Field(
        default_factory=lambda: Degrees(),
        description="Parallel degrees; their product (with -1 filled in) is the world size.",
        examples=[{"pp": 4, "dp_shard": -1, "tp": 8}],
    )
    order: WorldOrder | None = Field(
        None,
        description="The world factors outer to inner as the ranks number them; by default "
        "pp, dp_replicate, dp_shard, cp, tp. It changes only which ranks a group holds: dims "
        "and domains keep their meaning.",
        examples=[["dp_replicate", "dp_shard", "pp", "cp", "tp"]],
    )
    inside_node: InsideNode | None = Field(
        None,
        description="Hierarchical placement: the part of each degree inside a node, the rest "
        "across nodes. Needs gpus_per_node; the parts multiply to it.",
        examples=[{"dp_shard": 2, "tp": 8}],
    )
    levels: Annotated[tuple[TopologyLevel, ...], BeforeValidator(level_list)] | None = Field(
        None,
        description="Levels above the GPU, inner to outer, each holding whole units of the one "
        "below; gpus_per_node is the node level written short.",
        examples=[[{"name": "node", "size": 4}, {"name": "nvlink", "size": 72}]],
    )
    inside: dict[Name, DimList] | None = Field(
        None,
        description="Dims whose every group stays inside one unit of a level, by level name; "
        "the ranks are numbered so that they do.",
        examples=[{"nvlink": ["tp", "ep"]}],
    )
    derived: dict[Name, FormulaText] = Field(
        default_factory=dict,
        description="Extra or redefined derived dims: formulas over degrees and earlier ones.",
        examples=[{"fsdp_tp": "dp_shard * cp * tp"}],
    )
    domains: dict[Name, DimList] | None = Field(
        None,
        description="Named global meshes, dims outer to inner. Replaces the default set.",
        examples=[{"dense": ["pp", "dp_replicate", "fsdp", "tp"]}],
    )
    runtime: RuntimeOptions = Field(
        default_factory=lambda: RuntimeOptions(),
        description="How DistributedContext picks device, backend and timeouts.",
        examples=[{"device": "cuda", "timeout_s": 600}],
    )
    training: TrainingOptions | None = Field(
        None,
        description="What the estimate of the layout reads: the model, the GPU, the batch and "
        "how training uses the dims (ZeRO stage, pipeline split, expert routing), for show, "
        "measure and plan (an option of the same name replaces a key) and as plan --emit "
        "writes it; the meshes are the same whatever it says.",
        examples=[{"model": "deepseek-v3", "gpu": "gb200", "seq_len": 4096, "zero_stage": 1}],
    )

    _analysis: Analysis = PrivateAttr(default_factory=Analysis)

    @model_validator(mode="after")
    def _check_formulas(self) -> MeshConfig:
        if self.domains is not None and not self.domains:
            raise validation_error(
                "MeshConfig",
                FieldError(
                    ("domains",),
                    "domains_empty",
                    "needs at least one domain (or leave it out for the defaults)",
                    input={},
                ),
            )
        analysis = analyze(self.spec())
        if analysis.problems:
            raise validation_error(
                "MeshConfig",
                [
                    FieldError(problem.path, "mesh_rule", "{message}", {"message": problem.message})
                    for problem in analysis.problems
                ],
            )
        self._analysis = analysis
        return self

    def spec(self) -> MeshSpec:
        """The plain values the rules check."""
        return MeshSpec(
            world_size=self.world_size,
            gpus_per_node=self.gpus_per_node,
            inside_node=None if self.inside_node is None else self.inside_node.model_dump(),
            order=self.order,
            levels=self._own_levels(),
            inside=self.inside,
            degrees=self.degrees.model_dump(),
            explicit_degrees=self.degrees.explicit,
            derived=self.effective_derived,
            user_derived=frozenset(self.derived),
            domains=self.effective_domains,
            user_domains=self.domains is not None,
        )

    @property
    def node_size(self) -> int | None:
        """GPUs per node: gpus_per_node, or the size of the level named node."""
        return node_size(self.topology)

    @property
    def placement_bands(self) -> tuple[tuple[str, dict[str, int]], ...] | None:
        """How inside_node or inside split the world factors: the bands of the rank
        numbering, inner to outer, each with where it is (``inside a node``) and each
        factor's part in it; None when neither is given. A factor's index numbers its parts
        outer band first, and so does the rank (``order`` within a band)."""
        self._require_world()
        bands = self._analysis.bands
        return None if bands is None else tuple((place, dict(parts)) for place, parts in bands)

    @property
    def topology(self) -> tuple[Level, ...]:
        """Every level inner to outer, the node of gpus_per_node first when it is given."""
        return all_levels(self.gpus_per_node, self._own_levels())

    def _own_levels(self) -> tuple[Level, ...]:
        return tuple(
            Level(level.name, level.size, level.bandwidth_gb_s) for level in self.levels or ()
        )

    @property
    def effective_derived(self) -> dict[str, str]:
        """Derived formulas in evaluation order: the defaults the config keeps, then its own
        (a redefined default moves to the config's place, so it may use other defaults)."""
        kept = {name: text for name, text in DEFAULT_DERIVED.items() if name not in self.derived}
        return {**kept, **self.derived}

    @property
    def effective_domains(self) -> dict[str, tuple[str, ...]]:
        return dict(DEFAULT_DOMAINS if self.domains is None else self.domains)

    @property
    def resolved_world_size(self) -> int | None:
        """world_size as given, or implied by degrees with no -1; None if still unknown."""
        return self._analysis.world_size

    @property
    def pending_checks(self) -> tuple[str, ...]:
        """Checks that could not run because the world size is unknown."""
        return tuple(self._analysis.pending)

    def _require_world(self) -> Analysis:
        if self._analysis.world_size is None:
            raise WorldSizeUnknownError(
                f"world_size is unknown: degrees.{self.degrees.auto} is -1; set world_size or "
                "call with_world_size(n)"
            )
        return self._analysis

    @property
    def resolved_degrees(self) -> dict[str, int]:
        """Every degree with -1 filled in."""
        degrees = self._require_world().degrees
        assert degrees is not None
        return dict(degrees)

    @property
    def dim_sizes(self) -> dict[str, int]:
        """Size of every degree and derived dim."""
        return dict(self._require_world().sizes)

    @property
    def layouts(self) -> dict[str, DomainLayout]:
        """The rank layout of every domain, by name."""
        return dict(self._require_world().layouts)

    def layout(self, domain: str) -> DomainLayout:
        layouts = self._require_world().layouts
        if domain not in layouts:
            raise UnknownDomainError(f"unknown domain {domain!r}; domains are {', '.join(layouts)}")
        return layouts[domain]

    def layout_over(self, name: str, dims: Sequence[str]) -> DomainLayout:
        """The ranks laid out over ``dims`` (degrees or derived dims, outer to inner) in this
        config's rank numbering: the layout a domain ``name`` of those dims would have.

        Raises:
            WorldSizeUnknownError: a degree is -1 and the world size is unknown.
            LayoutError: a dim the config does not have, dims that do not multiply to the
                world size, or a dim that would split a part of the numbering unevenly.
        """
        analysis = self._require_world()
        unknown = [dim for dim in dims if dim not in analysis.sizes]
        if unknown:
            raise LayoutError(
                f"{name}: unknown dim {unknown[0]!r}; dims are {', '.join(analysis.sizes)}"
            )
        ranks = numbering(self.spec(), analysis)
        assert ranks is not None, "a validated config numbers its ranks"
        return DomainLayout.unflatten(name, [(dim, analysis.sizes[dim]) for dim in dims], ranks)

    def with_world_size(self, world_size: int) -> MeshConfig:
        """This config at a given world size (validated again); an error if it sets another."""
        if self.world_size is not None and self.world_size != world_size:
            raise validation_error(
                "MeshConfig",
                FieldError(
                    ("world_size",),
                    "world_size_conflict",
                    "the config says {mine}, but the world size is {given}",
                    {"mine": self.world_size, "given": world_size},
                    world_size,
                ),
            )
        data = self.model_dump(exclude_unset=True)
        if self.degrees._dp_shard_defaulted:
            data.get("degrees", {}).pop("dp_shard", None)
        data["world_size"] = world_size
        return MeshConfig.model_validate(data)

    @property
    def fingerprint(self) -> str:
        """SHA-256 of the resolved config: two configs that describe the same meshes (say
        ``dp_shard: -1`` and ``dp_shard: 2`` at world size 8) have the same fingerprint."""
        analysis = self._analysis
        resolved: dict[str, Any] = {
            "world_size": analysis.world_size,
            "gpus_per_node": self.gpus_per_node,
            "degrees": analysis.degrees or self.degrees.model_dump(),
            "derived": {
                name: formulas.render(formulas.parse(text))
                for name, text in self.effective_derived.items()
            },
            "domains": [[name, list(dims)] for name, dims in self.effective_domains.items()],
            "runtime": self.runtime.model_dump(),
        }
        if self.inside_node is not None:
            # Only when set, so that configs without it keep the fingerprints they had.
            resolved["inside_node"] = self.inside_node.model_dump()
        for key in ("levels", "inside", "training"):
            if getattr(self, key) is not None:
                resolved[key] = self.model_dump(mode="json")[key]
        if self.order is not None and self.order != WORLD_FACTORS:
            # The default order written out describes the same meshes as none.
            resolved["order"] = list(self.order)
        canonical = json.dumps(resolved, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()

    def __eq__(self, other: object) -> bool:
        return isinstance(other, MeshConfig) and self.fingerprint == other.fingerprint

    def __hash__(self) -> int:
        return hash(self.fingerprint)
