"""One rank's DeviceMeshes: a mesh per domain over the registry's groups, and every mesh a
rank asks for, built once and kept.

torch's DeviceMesh holds the rank of every process in the world, so building one costs
O(world) time and memory; slicing one builds another. Each (domain, dims) request is
therefore built once, straight from the layout, and answered from a cache after that; all
meshes share one rank map (the ranks in order).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence

import torch
import torch.distributed as dist
from torch.distributed._mesh_layout import _FlatLayout, _MeshLayout
from torch.distributed.device_mesh import DeviceMesh

from meshconf.core.layout import DimLayout, group_identity
from meshconf.model.config import MeshConfig
from meshconf.runtime.groups import GroupRegistry


def layout_mesh(
    dims: Sequence[DimLayout],
    rank_map: torch.Tensor,
    groups: list[dist.ProcessGroup],
    device_type: str,
) -> DeviceMesh:
    """A mesh over ``dims`` as torch's own ``_unflatten`` and ``_flatten`` describe one: a
    layout over the ranks in order (``rank_map``, shared by every mesh of the context), a
    dim's modes nested.

    A mesh tensor would do for the mesh alone, but its flattening would become the mesh's
    rank map, and torch only concatenates meshes (FSDP over ``fsdp`` with TP over ``tp``) or
    lets their DTensors meet when the rank maps agree; those of every other mesh are the
    ranks in order. torch has no public constructor for this, so this is the private one
    that ``DeviceMesh.from_group`` uses (torch_support checks it exists).
    """
    axes = [
        _FlatLayout(
            tuple(mode.size for mode in dim.modes), tuple(mode.stride for mode in dim.modes)
        )
        for dim in dims
    ]
    mesh = DeviceMesh(
        device_type,
        _layout=_MeshLayout(axes),
        _rank_map=rank_map,
        mesh_dim_names=tuple(dim.name for dim in dims),
        _init_backend=False,
    )
    mesh._dim_group_names = [group.group_name for group in groups]
    for group in groups:
        mesh._pg_registry[group.group_name] = group
    return mesh


class MeshCache:
    """The meshes of one context: every domain's, the world's, and every slice asked for."""

    def __init__(
        self, config: MeshConfig, rank: int, device_type: str, registry: GroupRegistry
    ) -> None:
        self.config = config
        self.rank = rank
        self.device_type = device_type
        self.registry = registry
        self.build_seconds = 0.0
        self.domains: dict[str, DeviceMesh] = {}
        self.slices: dict[tuple[str, ...], DeviceMesh] = {}
        self._groups: dict[str, list[dist.ProcessGroup]] = {}
        self._world: DeviceMesh | None = None
        self._rank_map: torch.Tensor | None = None

    def must_stay_real(self, dim: str) -> bool:
        # FSDP's mixed precision needs a real group even over one rank.
        return dim == "fsdp" or (dim == "efsdp" and self.config.resolved_degrees["ep"] > 1)

    def groups(self, domain: str) -> list[dist.ProcessGroup]:
        """The process groups of ``domain``'s dims around this rank, created on first use
        (an eager build asks for every domain's at construction)."""
        groups = self._groups.get(domain)
        if groups is None:
            start = time.perf_counter()
            layout = self.config.layouts[domain]
            groups = [
                self.registry.get(
                    layout.group(self.rank, dim.name),
                    real=self.must_stay_real(dim.name),
                    description=f"{domain}/{dim.name}",
                )
                for dim in layout.dims
            ]
            self.build_seconds += time.perf_counter() - start
            self._groups[domain] = groups
        return groups

    def domain(self, domain: str) -> DeviceMesh:
        """The mesh of ``domain`` (a name the config has), built on first use."""
        mesh = self.domains.get(domain)
        if mesh is None:
            groups = self.groups(domain)
            start = time.perf_counter()
            dims = self.config.layouts[domain].dims
            mesh = layout_mesh(dims, self.rank_map(), groups, self.device_type)
            self.build_seconds += time.perf_counter() - start
            self.domains[domain] = mesh
        return mesh

    def rank_map(self) -> torch.Tensor:
        if self._rank_map is None:
            self._rank_map = torch.arange(self.config.resolved_world_size or 1, dtype=torch.int)
        return self._rank_map

    def world(self) -> DeviceMesh:
        """The whole world as a 1-D mesh named ``world``, over the default group."""
        if self._world is None:
            world = dist.group.WORLD
            assert world is not None
            self._world = DeviceMesh.from_group(world, self.device_type, mesh_dim_names=("world",))
        return self._world

    def dims(self, domain: str, names: tuple[str, ...]) -> DeviceMesh:
        """The mesh over ``names``, dims of ``domain`` in its order, built once."""
        key = (domain, *names)
        mesh = self.slices.get(key)
        if mesh is None:
            mesh = self._slice(domain, list(names))
            self.slices[key] = mesh
        return mesh

    def _slice(self, domain: str, names: list[str]) -> DeviceMesh:
        layout = self.config.layouts[domain]
        if tuple(names) == layout.dim_names:
            return self.domain(domain)
        # Not sliced from the domain's mesh, which torch would build first at O(world); the
        # shared rank map lets the meshes compose (FSDP with TP) as slices of one would.
        groups = dict(zip(layout.dim_names, self.groups(domain), strict=True))
        return layout_mesh(
            [layout.dim(name) for name in names],
            self.rank_map(),
            [groups[name] for name in names],
            self.device_type,
        )

    def named(
        self,
        dims: Mapping[str, tuple[str, ...]],
        flattened: Mapping[str, Sequence[str]],
        outside: tuple[str, ...],
    ) -> DeviceMesh:
        """The mesh :meth:`~meshconf.runtime.requests.MeshRequests.named_mesh` describes, each
        name in ``dims`` mapped to the meshconf dims it joins. Built once."""
        key = ("named", *(f"{k}={'*'.join(v)}" for k, v in dims.items()), *outside)
        key += tuple(f"{k}={'*'.join(v)}" for k, v in flattened.items())
        mesh = self.slices.get(key)
        if mesh is not None:
            return mesh
        start = time.perf_counter()
        parts = [*outside, *(dim for joined in dims.values() for dim in joined)]
        layout = self.config.layout_over("+".join(parts), parts)
        groups = [
            self.registry.get(
                layout.group(self.rank, joined),
                real=any(self.must_stay_real(dim) for dim in joined),
                description=f"{name}={'*'.join(joined)}",
            )
            for name, joined in dims.items()
        ]
        renamed = [
            DimLayout(name, group_identity([m for dim in joined for m in layout.dim(dim).modes]))
            for name, joined in dims.items()
        ]
        mesh = layout_mesh(renamed, self.rank_map(), groups, self.device_type)
        names = list(dims)
        for name, joined_names in flattened.items():
            joined = [dim for part in joined_names for dim in dims[part]]
            # FSDP shards over flattened dims, and needs a real group even over one rank.
            group = self.registry.get(
                layout.group(self.rank, joined), real=True, description=f"{name}={'*'.join(joined)}"
            )
            indices = [names.index(part) for part in joined_names]
            flat_layout = _MeshLayout([mesh._layout[i] for i in indices]).collapse()
            flat = DeviceMesh(
                self.device_type,
                _layout=_MeshLayout([flat_layout]),
                _rank_map=mesh._rank_map,
                mesh_dim_names=(name,),
                _root_mesh=mesh,
                _init_backend=False,
            )
            flat._dim_group_names = [group.group_name]
            mesh._pg_registry[group.group_name] = group
            mesh._flatten_mapping[name] = flat
        self.build_seconds += time.perf_counter() - start
        self.slices[key] = mesh
        return mesh

    def clear(self) -> None:
        self._groups.clear()
        self.domains.clear()
        self.slices.clear()
        self._world = None
