"""A drop-in for torchtitan 0.2's ``ParallelDims`` (0.2.1 and 0.2.2), backed by meshconf.

Change ``from torchtitan.distributed.parallel_dims import ParallelDims`` to
``from meshconf.compat.torchtitan_v0_2 import ParallelDims``. For torchtitan 0.3 use
:mod:`meshconf.compat.torchtitan`. The differences on purpose are listed in
``docs/migration.md``.

Validation needs no torch; :meth:`ParallelDims.build_mesh` imports the runtime.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from meshconf.compat.parallel_dims_common import (
    ParallelDimsError,
    ParallelDimsMeshes,
    checked_config,
)
from meshconf.core.degrees import EXPERT_DEGREES, WORLD_FACTORS
from meshconf.core.domains import DEFAULT_DOMAINS

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh

__all__ = ["MESH_DIMS", "ParallelDims", "ParallelDimsError"]

#: The one-dim meshes torchtitan 0.2 keeps in ``_meshes``, in its order.
MESH_DIMS = ("pp", "batch", "loss", "dp_replicate", "fsdp", "cp", "tp", "ep", "efsdp", "etp")

#: torchtitan 0.2's global meshes, in the order a multi-dim request searches them: meshconf's
#: default domains, which have the same names and dims.
_GLOBAL_MESHES = {
    name: DEFAULT_DOMAINS[name] for name in ("dataloading", "loss", "dense", "sparse")
}


@dataclass
class ParallelDims(ParallelDimsMeshes):
    """torchtitan 0.2's parallel degrees; ``dp_shard=-1`` fills the ranks the others leave.

    >>> dims = ParallelDims(dp_replicate=2, dp_shard=-1, cp=1, tp=2, pp=1, ep=1, etp=1,
    ...                     world_size=8)
    >>> dims.dp_shard, dims.fsdp_enabled, dims.non_data_parallel_size
    (2, True, 2)

    Raises:
        ParallelDimsError: (an AssertionError and a ConfigError) the degrees do not make a
            valid layout, with every problem and its arithmetic.
    """

    dp_replicate: int
    dp_shard: int
    cp: int
    tp: int
    pp: int
    ep: int
    etp: int
    world_size: int

    _meshes: dict[str, DeviceMesh] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )

    def __post_init__(self) -> None:
        degrees = {name: getattr(self, name) for name in WORLD_FACTORS + EXPERT_DEGREES}
        config = checked_config(degrees, self.world_size)
        self._start(config, _GLOBAL_MESHES, MESH_DIMS, self._meshes)

    def _mesh_exist(self, name: str, size: int) -> bool:
        # efsdp stays whenever ep > 1, even at size 1: the experts need an FSDP wrapper for
        # mixed precision. Every other dim exists when it has more than one rank.
        if name == "efsdp":
            return self.ep > 1
        return size > 1

    def get_optional_mesh(self, dims: str | list[str]) -> DeviceMesh | None:
        """The mesh over one dim or several, or None when one of them does not exist.

        Raises:
            InvalidArgumentError: (a ValueError) an unknown dim, or dims that no mesh holds
                together or in that order.
        """
        return self._optional_mesh(dims, False)

    def get_all_one_dimensional_meshes(self) -> dict[str, DeviceMesh]:
        """Every one-dim mesh of more than one rank, by name (``efsdp`` too when ep is 1,
        as in torchtitan 0.2)."""
        self.build_mesh()
        return {name: mesh for name, mesh in self._meshes.items() if mesh.size() > 1}

    @property
    def etp_enabled(self) -> bool:
        return self.etp > 1

    @property
    def fsdp_gradient_divide_factor(self) -> int:
        """The data-parallel ranks, which FSDP-sharded experts divide gradients by too."""
        return self.dp_replicate * self.dp_shard * self.cp
