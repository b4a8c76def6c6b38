"""A drop-in for torchtitan 0.3's ``ParallelDims``, backed by meshconf.

Change ``from torchtitan.distributed.parallel_dims import ParallelDims`` to
``from meshconf.compat.torchtitan import ParallelDims``; torchtitan's other names in that
module (``MeshAxisName``, ``SpmdLayout``, ...) keep coming from torchtitan. For torchtitan 0.2
(which has ``etp`` and no ``spmd_backend``) use :mod:`meshconf.compat.torchtitan_v0_2`. The
differences on purpose are listed in ``docs/migration.md``.

Validation needs no torch; :meth:`ParallelDims.build_mesh` imports the runtime.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from meshconf.compat.checks import refused
from meshconf.compat.parallel_dims_common import (
    ParallelDimsError,
    ParallelDimsMeshes,
    checked_config,
)
from meshconf.core.degrees import WORLD_FACTORS
from meshconf.core.domains import DEFAULT_DOMAINS
from meshconf.core.errors import Diagnostic, InvalidArgumentError, describe_value
from meshconf.trainers.torchtitan_fields import TORCHTITAN_DEGREES

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh

__all__ = ["SPMD_BACKENDS", "ParallelDims", "ParallelDimsError"]

SpmdBackend = Literal["partial_dtensor", "full_dtensor", "spmd_types"]
SPMD_BACKENDS: tuple[SpmdBackend, ...] = ("partial_dtensor", "full_dtensor", "spmd_types")

#: The one-dim meshes every backend has, in torchtitan 0.3's order; each backend adds its
#: data-parallel storage dims after them.
_COMMON_AXES = ("pp", "batch", "loss", "dp_replicate", "cp", "tp", "ep", "efsdp")
_BACKEND_AXES = {
    "partial_dtensor": ("fsdp",),
    "full_dtensor": ("dp_shard",),
    "spmd_types": ("dp", "dp_shard"),
}
#: The dense mesh FSDP shards over: ``fsdp`` folds dp_shard and cp into one dim under
#: partial_dtensor; the other backends keep them apart.
_SPLIT_DENSE = ("pp", "dp_replicate", "dp_shard", "cp", "tp")
#: The meshes the SPMD helpers assemble, from the dims that exist, per backend.
_SPMD_DENSE_AXES = {
    "partial_dtensor": ["dp_replicate", "fsdp", "tp"],
    "full_dtensor": ["dp_replicate", "dp_shard", "cp", "tp"],
    "spmd_types": ["dp", "cp", "tp"],
}
_SPMD_SPARSE_AXES = ["dp_replicate", "efsdp", "ep"]
#: Under these backends only these dims carry a DTensor placement; the rest stay outside.
_IN_BAND = {"partial_dtensor": ("tp", "ep"), "spmd_types": ("dp", "cp", "tp", "ep")}
#: Under full_dtensor, the logical dp is the two dims that store it.
_STORED_AS = {"dp": ("dp_replicate", "dp_shard")}


def _global_meshes(backend: str) -> dict[str, tuple[str, ...]]:
    """torchtitan 0.3's global meshes, as meshconf domains, in the order a multi-dim
    request searches them. Experts have no ``etp`` in 0.3."""
    meshes = {
        "dataloading": DEFAULT_DOMAINS["dataloading"],
        "loss": DEFAULT_DOMAINS["loss"],
        "dense": DEFAULT_DOMAINS["dense"] if backend == "partial_dtensor" else _SPLIT_DENSE,
        "sparse": ("pp", "dp_replicate", "efsdp", "ep"),
    }
    if backend == "spmd_types":
        meshes["spmd_dense"] = ("pp", "dp", "cp", "tp")
    return meshes


def _axis_names(axes: Iterable[Any]) -> list[str]:
    """Axis names (strings or ``MeshAxisName`` members) as strings."""
    return [str(getattr(axis, "value", axis)) for axis in axes]


@dataclass
class ParallelDims(ParallelDimsMeshes):
    """torchtitan 0.3's parallel degrees; ``dp_shard=-1`` fills the ranks the others leave.

    >>> dims = ParallelDims(dp_replicate=2, dp_shard=-1, cp=1, tp=2, pp=1, ep=1, world_size=8)
    >>> dims.dp_shard, dims.fsdp_enabled, dims.spmd_backend
    (2, True, 'spmd_types')

    Raises:
        ParallelDimsError: (an AssertionError and a ConfigError) the degrees do not make a
            valid layout, or ``spmd_backend`` is not one of :data:`SPMD_BACKENDS`.
    """

    dp_replicate: int
    dp_shard: int
    cp: int
    tp: int
    pp: int
    ep: int
    world_size: int
    spmd_backend: SpmdBackend = "spmd_types"

    _single_axis_meshes: dict[str, DeviceMesh] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )
    _spmd_meshes: list[DeviceMesh] = field(
        default_factory=list, init=False, repr=False, compare=False
    )

    @classmethod
    def from_config(cls, parallelism_config: Any, world_size: int) -> ParallelDims:
        """From torchtitan's ``ParallelismConfig`` (the job's ``[parallelism]`` table).

        Raises:
            ParallelDimsError: as the constructor, or ``parallelism_config`` without
                torchtitan's degree fields.
        """
        fields = {name: degree for name, degree in TORCHTITAN_DEGREES.items() if degree != "etp"}
        missing = [name for name in fields if not hasattr(parallelism_config, name)]
        if missing or isinstance(parallelism_config, str | bytes):
            raise refused(
                "parallelism_config",
                "expected torchtitan's ParallelismConfig (job_config.parallelism), got "
                f"{describe_value(parallelism_config)}, which has no "
                f"{', '.join(missing or fields)}",
                ParallelDimsError,
            )
        degrees = {degree: getattr(parallelism_config, name) for name, degree in fields.items()}
        return cls(
            **degrees,
            world_size=world_size,
            spmd_backend=getattr(parallelism_config, "spmd_backend", "spmd_types"),
        )

    def __post_init__(self) -> None:
        if self.spmd_backend not in SPMD_BACKENDS:
            raise refused(
                "spmd_backend",
                f"expected one of {', '.join(SPMD_BACKENDS)}, got {self.spmd_backend!r}",
                ParallelDimsError,
            )
        degrees = {name: getattr(self, name) for name in (*WORLD_FACTORS, "ep")}
        derived = {"dp": "dp_replicate * dp_shard"}
        meshes = _global_meshes(self.spmd_backend)
        config = checked_config(degrees, self.world_size, derived=derived, domains=meshes)
        axes = _COMMON_AXES + _BACKEND_AXES[self.spmd_backend]
        self._start(config, meshes, axes, self._single_axis_meshes)

    def _mesh_exist(self, name: str, size: int) -> bool:
        # fsdp, and dp_shard where it is the storage dim, stay at size 1 so that fully_shard
        # can apply a mixed-precision policy; efsdp likewise whenever there are experts.
        if name == "fsdp":
            return True
        if name == "dp_shard" and self.spmd_backend != "partial_dtensor":
            return True
        if name == "efsdp":
            return self.ep > 1
        return size > 1

    def build_mesh(self) -> DeviceMesh:
        """:meth:`ParallelDimsMeshes.build_mesh`, and then the SPMD meshes."""
        if self._world_mesh is not None:
            return self._world_mesh
        world = super().build_mesh()
        dense = self.get_activated_mesh(_SPMD_DENSE_AXES[self.spmd_backend])
        sparse = self.get_activated_mesh(_SPMD_SPARSE_AXES)
        self._spmd_meshes = [mesh for mesh in (dense, sparse) if mesh is not None]
        return world

    def get_optional_mesh(
        self, dims: str | list[str], *, include_singleton_axes: bool = False
    ) -> DeviceMesh | None:
        """The mesh over one dim or several, or None when one of them does not exist
        (unless ``include_singleton_axes``).

        Raises:
            InvalidArgumentError: (a ValueError) an unknown dim, or dims that no mesh holds
                together or in that order.
        """
        return self._optional_mesh(dims, include_singleton_axes)

    def get_all_one_dimensional_meshes(self) -> dict[str, DeviceMesh]:
        """Every existing one-dim mesh of more than one rank, by name (not ``efsdp`` when
        ep is 1: torchtitan 0.3 puts it on the fake backend)."""
        self.build_mesh()
        return {
            name: mesh
            for name, mesh in self._single_axis_meshes.items()
            if mesh.size() > 1 and self._mesh_exist(name, mesh.size())
        }

    def get_activated_mesh(self, axes: list[str]) -> DeviceMesh | None:
        """The mesh over those of ``axes`` that exist, or None when none does."""
        self.build_mesh()
        names = [name for name in _axis_names(axes) if name in self._axes]
        present = [name for name in names if self._exists(name)]
        return self.get_optional_mesh(present) if present else None

    def spmd_meshes(self) -> list[DeviceMesh]:
        """The dense and the sparse mesh over their dims that exist (the sparse one only
        when an expert dim exists)."""
        self.build_mesh()
        return self._spmd_meshes

    def spmd_dense_mesh(self) -> DeviceMesh:
        """The dense ``[dp, cp, tp]`` mesh the ``spmd_types`` backend checks types on.

        Raises:
            InvalidArgumentError: the backend is not ``spmd_types``.
        """
        if self.spmd_backend != "spmd_types":
            raise InvalidArgumentError(
                f"spmd_dense_mesh exists only with spmd_backend 'spmd_types', not "
                f"{self.spmd_backend!r}"
            )
        return self._mesh_of(["dp", "cp", "tp"])

    def spmd_sparse_mesh(self) -> DeviceMesh | None:
        """The ``[dp_replicate, efsdp, ep]`` mesh of expert dispatch under ``spmd_types``
        with experts; None otherwise."""
        if self.spmd_backend != "spmd_types" or self.ep == 1:
            return None
        return self._mesh_of(_SPMD_SPARSE_AXES)

    def get_dense_tp_mesh(self) -> DeviceMesh:
        """The ``tp`` mesh the dense layers compute on under this backend.

        Raises:
            InvalidArgumentError: tp does not exist (partial_dtensor) or no dense mesh does.
        """
        if self.spmd_backend == "spmd_types":
            return self.spmd_dense_mesh()["tp"]
        if self.spmd_backend == "full_dtensor":
            meshes = self.spmd_meshes()
            if not meshes:
                raise InvalidArgumentError("no dense SPMD mesh: every dense dim has size 1")
            return meshes[0]["tp"]
        return self.get_mesh("tp")

    def resolve_mesh(self, axes: Iterable[Any]) -> DeviceMesh | None:
        """The SPMD mesh for a layout's axes (names or ``MeshAxisName`` members): only the
        in-band dims of this backend, those that exist; None when none does.

        Raises:
            InvalidArgumentError: under full_dtensor, the axes give a mesh that is not one of
                :meth:`spmd_meshes`.
        """
        names = _axis_names(axes)
        if self.spmd_backend == "full_dtensor":
            names = [part for name in names for part in _STORED_AS.get(name, (name,))]
        else:
            names = [name for name in names if name in _IN_BAND[self.spmd_backend]]
        mesh = self.get_activated_mesh(names)
        if mesh is None:
            return None
        if self.spmd_backend == "full_dtensor" and all(mesh is not m for m in self.spmd_meshes()):
            valid = [list(m.mesh_dim_names or ()) for m in self.spmd_meshes()]
            raise InvalidArgumentError(
                f"axes {names} give the mesh {list(mesh.mesh_dim_names or ())}, which is not "
                f"an SPMD mesh; the SPMD meshes are {valid}"
            )
        return mesh

    def resolve_shared_mesh(self, placements: Iterable[Any]) -> DeviceMesh | None:
        """The mesh of layouts that name the same axes (``None`` entries skipped).

        Raises:
            ParallelDimsError: two layouts name different axes.
        """
        layouts = [layout for layout in placements if layout is not None]
        if not layouts:
            return None
        axes = tuple(layouts[0].axes())
        for layout in layouts[1:]:
            if tuple(layout.axes()) != axes:
                first = sorted(_axis_names(axes))
                other = sorted(_axis_names(layout.axes()))
                raise ParallelDimsError(
                    [Diagnostic((), f"layouts of one boundary name other axes: {first} vs {other}")]
                )
        return self.resolve_mesh(axes)
