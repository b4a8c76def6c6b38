"""A drop-in for torchtitan's ``ParallelDims`` (torchtitan 0.2.x), backed by meshconf.

Change ``from torchtitan.distributed.parallel_dims import ParallelDims`` to
``from meshconf.compat.torchtitan import ParallelDims``. The constructor, the mesh getters and
the ``*_enabled`` properties behave as torchtitan's, with three differences on purpose (see
``docs/migration.md``): an invalid combination raises meshconf's :class:`ConfigError` with the
arithmetic written out instead of a bare ``AssertionError``; ``etp`` must be 1 or ``tp`` even
when ``ep`` is 1; and the meshes share one process group per distinct group of ranks instead of
one per dim of every mesh.

Validation needs no torch; :meth:`ParallelDims.build_mesh` imports the runtime.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from meshconf.model.config import MeshConfig
from meshconf.sources.loading import load_config

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh

    from meshconf.runtime import DistributedContext

#: The dims torchtitan hands out, in the order of its ``get_all_one_dimensional_meshes``.
MESH_DIMS = ("pp", "batch", "loss", "dp_replicate", "fsdp", "cp", "tp", "ep", "efsdp", "etp")


@dataclass
class ParallelDims:
    """torchtitan's parallel degrees; ``dp_shard=-1`` fills the ranks the others leave.

    >>> dims = ParallelDims(dp_replicate=2, dp_shard=-1, cp=1, tp=2, pp=1, ep=1, etp=1,
    ...                     world_size=8)
    >>> dims.dp_shard, dims.fsdp_enabled, dims.non_data_parallel_size
    (2, True, 2)
    """

    dp_replicate: int
    dp_shard: int
    cp: int
    tp: int
    pp: int
    ep: int
    etp: int
    world_size: int

    _config: MeshConfig = field(init=False, repr=False, compare=False)
    _context: DistributedContext | None = field(default=None, init=False, repr=False, compare=False)
    _world_mesh: DeviceMesh | None = field(default=None, init=False, repr=False, compare=False)
    _meshes: dict[tuple[str, ...], DeviceMesh] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )

    def __post_init__(self) -> None:
        degrees = {
            "pp": self.pp,
            "dp_replicate": self.dp_replicate,
            "dp_shard": self.dp_shard,
            "cp": self.cp,
            "tp": self.tp,
            "ep": self.ep,
            "etp": self.etp,
        }
        self._config = load_config({"world_size": self.world_size, "degrees": degrees})
        # As torchtitan does, dp_shard holds the filled-in value from here on.
        self.dp_shard = self._config.resolved_degrees["dp_shard"]

    @property
    def config(self) -> MeshConfig:
        """The validated meshconf config these degrees describe."""
        return self._config

    # Meshes ----------------------------------------------------------------------------

    def build_mesh(self) -> DeviceMesh:
        """Build every mesh and return the 1-D world mesh.

        Like torchtitan, this is collective: every rank calls it, after
        ``torch.distributed.init_process_group`` (meshconf initializes the default group
        itself from the launcher's environment if no one has). Unlike torchtitan, it creates
        one process group per distinct group of ranks, shared by every mesh that has it.
        """
        if self._world_mesh is not None:
            return self._world_mesh
        from meshconf.runtime import DistributedContext

        context = DistributedContext(self._config)
        # Every rank builds every domain in the same order, as torchtitan builds every mesh.
        context.build_all()
        self._context = context
        self._world_mesh = context.world_mesh
        return self._world_mesh

    @property
    def world_mesh(self) -> DeviceMesh:
        return self.build_mesh()

    @property
    def context(self) -> DistributedContext:
        """The meshconf context behind the meshes (built on first use), for the rest of
        meshconf's runtime: coordinates, seeds, ``close()``."""
        self.build_mesh()
        assert self._context is not None
        return self._context

    def _exists(self, dim: str) -> bool:
        # torchtitan keeps efsdp whenever ep > 1, even at size 1: the experts need an FSDP
        # wrapper for mixed precision. Every other dim exists when it has more than one rank.
        if dim == "efsdp":
            return self.ep > 1
        return self._config.dim_sizes[dim] > 1

    def get_optional_mesh(self, dims: str | list[str]) -> DeviceMesh | None:
        """The mesh over one dim or several, or None when one of them is not enabled.

        Raises ValueError, naming the valid choices, for an unknown dim or for dims that no
        global mesh holds together in that order.
        """
        names = [dims] if isinstance(dims, str) else list(dims)
        unknown = [name for name in names if name not in MESH_DIMS]
        if unknown:
            raise ValueError(
                f"Invalid mesh dim: {unknown[0]!r}. Valid dimensions are: {list(MESH_DIMS)}"
            )
        self.build_mesh()
        if not all(self._exists(name) for name in names):
            return None
        return self._mesh_over(names)

    def _mesh_over(self, names: list[str]) -> DeviceMesh:
        # Slicing makes a new DeviceMesh each time; torchtitan hands out the same one.
        key = tuple(names)
        if key not in self._meshes:
            context = self.context
            self._meshes[key] = context._mesh_over(names)
        return self._meshes[key]

    def get_mesh(self, dims: str | list[str]) -> DeviceMesh:
        """Like get_optional_mesh, but a dim that is not enabled is a ValueError."""
        mesh = self.get_optional_mesh(dims)
        if mesh is None:
            names = [dims] if isinstance(dims, str) else list(dims)
            off = [
                f"{name}={self._config.dim_sizes[name]}" for name in names if not self._exists(name)
            ]
            hint = " (efsdp exists only when ep > 1)" if "efsdp" in names else ""
            raise ValueError(
                f"mesh {names} is not available: {', '.join(off)}{hint}; use "
                "get_optional_mesh to get None instead"
            )
        return mesh

    def get_all_one_dimensional_meshes(self) -> dict[str, DeviceMesh]:
        """Every enabled dim of more than one rank, by name."""
        self.build_mesh()
        return {
            name: self._mesh_over([name]) for name in MESH_DIMS if self._config.dim_sizes[name] > 1
        }

    # Degrees ---------------------------------------------------------------------------

    @property
    def dp_enabled(self) -> bool:
        return self.dp_replicate > 1 or self.dp_shard > 1

    @property
    def dp_replicate_enabled(self) -> bool:
        return self.dp_replicate > 1

    @property
    def dp_shard_enabled(self) -> bool:
        return self.dp_shard > 1

    @property
    def cp_enabled(self) -> bool:
        return self.cp > 1

    @property
    def dp_cp_enabled(self) -> bool:
        return self.dp_enabled or self.cp_enabled

    @property
    def fsdp_enabled(self) -> bool:
        return self.dp_shard_enabled or self.cp_enabled

    @property
    def tp_enabled(self) -> bool:
        return self.tp > 1

    @property
    def pp_enabled(self) -> bool:
        return self.pp > 1

    @property
    def ep_enabled(self) -> bool:
        return self.ep > 1

    @property
    def etp_enabled(self) -> bool:
        return self.etp > 1

    @property
    def fsdp_gradient_divide_factor(self) -> int:
        """The data-parallel ranks, which FSDP-sharded experts divide gradients by too."""
        return self.dp_replicate * self.dp_shard * self.cp

    @property
    def non_data_parallel_size(self) -> int:
        return self.cp * self.tp * self.pp

    @property
    def seq_len_divisor(self) -> int:
        """What a sequence length must be a multiple of: tp for sequence parallelism, and
        2 * cp for context parallelism's load balancing."""
        return self.tp * (self.cp * 2)
