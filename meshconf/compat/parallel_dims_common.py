"""What every torchtitan ``ParallelDims`` release shares, backed by meshconf: the degrees
checked into a :class:`MeshConfig`, the ``*_enabled`` properties, and one-dim and multi-dim
meshes taken from meshconf's domains and kept, so that a second request returns the same
object (torchtitan compares meshes by identity).

Validation needs no torch; building the meshes imports the runtime.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from meshconf.core.errors import ConfigError, Diagnostic, InvalidArgumentError
from meshconf.model.config import MeshConfig
from meshconf.sources.loading import load_config

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh

    from meshconf.runtime import DistributedContext


class ParallelDimsError(ConfigError, AssertionError):
    """The degrees do not make a valid layout.

    torchtitan checks its degrees with ``assert``, so code written for it catches
    ``AssertionError``; code written for meshconf catches ``ConfigError``. Both work.
    """


def checked_config(
    degrees: Mapping[str, Any],
    world_size: Any,
    *,
    derived: Mapping[str, str] | None = None,
    domains: Mapping[str, Sequence[str]] | None = None,
) -> MeshConfig:
    """The meshconf config of torchtitan's degrees.

    Only ``dp_shard`` may be -1 (fill the ranks the others leave), as in torchtitan; meshconf's
    own configs also allow one other degree to be -1, which torchtitan's callers never expect.

    Raises:
        ParallelDimsError: a degree is not an integer, is below 1 (or is 0 or below -1 for
            ``dp_shard``), or the degrees do not fit the world size; every problem at once.
    """
    problems = [
        Diagnostic(("degrees", name), message)
        for name, value in degrees.items()
        if (message := _degree_problem(name, value)) is not None
    ]
    if problems:
        raise ParallelDimsError(problems)
    data: dict[str, Any] = {"world_size": world_size, "degrees": dict(degrees)}
    if derived is not None:
        data["derived"] = dict(derived)
    if domains is not None:
        data["domains"] = {name: list(dims) for name, dims in domains.items()}
    try:
        return load_config(data)
    except ConfigError as error:
        raise ParallelDimsError(error.diagnostics) from None


def _degree_problem(name: str, value: Any) -> str | None:
    if isinstance(value, bool) or not isinstance(value, int):
        return f"expected an integer, got {value!r}"
    if name == "dp_shard":
        if value == -1 or value >= 1:
            return None
        return f"expected an integer >= 1 or -1 (fill the remaining ranks), got {value}"
    if value >= 1:
        return None
    return f"expected an integer >= 1, got {value}; only dp_shard may be -1"


class ParallelDimsMeshes:
    """The release-independent half of ``ParallelDims``.

    A release subclass declares the dataclass fields, hands :meth:`_start` its global meshes
    (searched in order for multi-dim requests), its one-dim meshes and the dict it keeps them
    in, and says which of them exist (:meth:`_mesh_exist`).
    """

    dp_replicate: int
    dp_shard: int
    cp: int
    tp: int
    pp: int
    ep: int
    world_size: int

    _config: MeshConfig
    _domains: dict[str, tuple[str, ...]]
    _axes: tuple[str, ...]
    _one_dim: dict[str, DeviceMesh]
    _context: DistributedContext | None
    _world_mesh: DeviceMesh | None
    _multi_dim_cache: dict[tuple[str, ...], DeviceMesh]

    def _start(
        self,
        config: MeshConfig,
        domains: dict[str, tuple[str, ...]],
        axes: tuple[str, ...],
        one_dim: dict[str, DeviceMesh],
    ) -> None:
        self._config = config
        self._domains, self._axes, self._one_dim = domains, axes, one_dim
        # As torchtitan does, dp_shard holds the filled-in value from here on.
        self.dp_shard = config.resolved_degrees["dp_shard"]
        self._context = None
        self._world_mesh = None
        self._multi_dim_cache = {}

    def _mesh_exist(self, name: str, size: int) -> bool:
        raise NotImplementedError

    @property
    def config(self) -> MeshConfig:
        """The validated meshconf config these degrees describe."""
        return self._config

    def build_mesh(self) -> DeviceMesh:
        """Build every mesh and return the 1-D world mesh.

        Collective, as in torchtitan: every rank calls it (or a mesh getter, which calls
        it), after ``torch.distributed.init_process_group``, or with a launcher's
        environment for meshconf to initialize the default group from. One process group
        is created per distinct group of ranks, shared by every mesh that has it.

        Raises:
            MeshconfError: the process group disagrees with ``world_size``.
        """
        if self._world_mesh is not None:
            return self._world_mesh
        from meshconf.runtime import DistributedContext

        context = DistributedContext(self._config)
        context.build_all()
        for name in self._axes:
            self._one_dim[name] = context.mesh_for(self._domain_holding([name]))[name]
        self._context = context
        self._world_mesh = context.world_mesh
        return self._world_mesh

    @property
    def world_mesh(self) -> DeviceMesh:
        """The world as a 1-D mesh named ``world``, over the default group."""
        return self.build_mesh()

    @property
    def context(self) -> DistributedContext:
        """The meshconf context behind the meshes (built on first use), for the rest of
        meshconf's runtime: coordinates, seeds, ``close()``."""
        self.build_mesh()
        assert self._context is not None
        return self._context

    def _domain_holding(self, names: list[str]) -> str:
        for domain, dims in self._domains.items():
            if set(names) <= set(dims):
                return domain
        meshes = "; ".join(f"{domain} {list(dims)}" for domain, dims in self._domains.items())
        raise InvalidArgumentError(f"no mesh holds all of {names}; the meshes are {meshes}")

    def _names(self, dims: str | Sequence[str]) -> list[str]:
        names = [dims] if isinstance(dims, str) else [str(name) for name in dims]
        for name in names:
            if name not in self._axes:
                raise InvalidArgumentError(
                    f"Invalid mesh dim {name!r}: the one-dim meshes are {', '.join(self._axes)}"
                )
        return names

    def _exists(self, name: str) -> bool:
        return self._mesh_exist(name, self._config.dim_sizes[name])

    def _mesh_of(self, names: list[str]) -> DeviceMesh:
        """The mesh over ``names`` whatever their sizes, built first if need be."""
        self.build_mesh()
        if len(names) == 1:
            return self._one_dim[names[0]]
        key = tuple(names)
        mesh = self._multi_dim_cache.get(key)
        if mesh is None:
            domain = self._domain_holding(names)
            in_order = [dim for dim in self._domains[domain] if dim in names]
            if in_order != names:
                raise InvalidArgumentError(
                    f"mesh dims {names} are all in mesh {domain!r} but in another order; ask "
                    f"for {in_order}"
                )
            mesh = self.context.mesh_for(domain)[key]
            self._multi_dim_cache[key] = mesh
        return mesh

    def _optional_mesh(
        self, dims: str | Sequence[str], include_singleton_axes: bool
    ) -> DeviceMesh | None:
        names = self._names(dims)
        self.build_mesh()
        if not include_singleton_axes and not all(self._exists(name) for name in names):
            return None
        return self._mesh_of(names)

    def get_mesh(self, dims: str | list[str]) -> DeviceMesh:
        """Like ``get_optional_mesh``, but a dim that does not exist is an error.

        Raises:
            InvalidArgumentError: (a ValueError) an unknown dim, dims that no mesh holds together
                or in that order, or a dim that does not exist in this layout.
        """
        mesh = self._optional_mesh(dims, False)
        if mesh is None:
            names = self._names(dims)
            off = [
                f"{name}={self._config.dim_sizes[name]}" for name in names if not self._exists(name)
            ]
            hint = " (efsdp exists only when ep > 1)" if "efsdp" in names else ""
            raise InvalidArgumentError(
                f"mesh {names} is not available: {', '.join(off)}{hint}; use "
                "get_optional_mesh to get None instead"
            )
        return mesh

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
    def non_data_parallel_size(self) -> int:
        return self.cp * self.tp * self.pp

    @property
    def seq_len_divisor(self) -> int:
        """What a sequence length must be a multiple of: tp for sequence parallelism, and
        2 * cp for context parallelism's load balancing."""
        return self.tp * (self.cp * 2)
