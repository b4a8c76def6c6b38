"""What a rank knows without its meshes: launcher facts, synchronisation on the default
group, its coordinates, a log prefix and seeds; and which domain a request of dims is in."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import torch
import torch.distributed as dist

from meshconf.core.degrees import BY_NAME
from meshconf.core.errors import InvalidArgumentError
from meshconf.model.config import MeshConfig
from meshconf.runtime.launch import Launch


def domain_of(config: MeshConfig, names: list[str]) -> str:
    """The domain whose dims include ``names`` in that order.

    Raises:
        InvalidArgumentError: (a ValueError) an unknown dim, a repeated one, or dims no
            domain has in that order.
    """
    layouts = config.layouts
    known = list(dict.fromkeys(dim for layout in layouts.values() for dim in layout.dim_names))
    unknown = [name for name in names if name not in known]
    if unknown:
        raise InvalidArgumentError(
            f"unknown mesh dim {unknown[0]!r}; valid dims are {', '.join(known)}"
        )
    if len(set(names)) != len(names):
        raise InvalidArgumentError(f"mesh dims {names} repeat a name")
    unordered = None
    for domain, layout in layouts.items():
        if not set(names) <= set(layout.dim_names):
            continue
        in_order = [dim for dim in layout.dim_names if dim in names]
        if in_order == names:
            return domain
        unordered = unordered or (domain, in_order)
    if unordered is not None:
        raise InvalidArgumentError(
            f"mesh dims {names} are all in domain {unordered[0]!r} but in another order; "
            f"ask for {unordered[1]}"
        )
    summary = "; ".join(f"{d} {list(layout.dim_names)}" for d, layout in layouts.items())
    raise InvalidArgumentError(f"no domain has all of {names}; the domains are {summary}")


class RankFacts:
    """The part of DistributedContext that needs only the config, the launch and the device."""

    config: MeshConfig
    launch: Launch
    device: torch.device
    backend: str

    @property
    def rank(self) -> int:
        return self.launch.rank

    @property
    def world_size(self) -> int:
        return self.launch.world_size

    @property
    def local_rank(self) -> int:
        return self.launch.local_rank

    @property
    def local_world_size(self) -> int | None:
        """Ranks on this node, when the launcher says (torchrun always does)."""
        return self.launch.local_world_size

    @property
    def is_main_process(self) -> bool:
        return self.rank == 0

    @property
    def is_local_main_process(self) -> bool:
        """Local rank 0: the first process on this node."""
        return self.local_rank == 0

    @property
    def current_device(self) -> torch.device:
        """The device this rank computes on (d9d's name for ``device``)."""
        return self.device

    @property
    def node_rank(self) -> int | None:
        """This rank's node, when the launcher says how many ranks a node runs."""
        local = self.local_world_size
        return None if local is None else self.rank // local

    @property
    def num_nodes(self) -> int | None:
        """How many nodes the world spans, when the launcher says how many ranks a node runs."""
        local = self.local_world_size
        return None if local is None else -(-self.world_size // local)

    def wait_world(self) -> None:
        """Block until every rank of the world gets here (a barrier on the default group)."""
        self._barrier().wait()

    def _barrier(self) -> dist.Work:
        work: dist.Work | None
        if self.device.type == "cuda" and self.backend == "nccl":
            work = dist.barrier(device_ids=[self.device.index or 0], async_op=True)
        else:
            work = dist.barrier(async_op=True)
        assert work is not None  # async_op=True always returns the work
        return work

    @contextmanager
    def main_process_first(self) -> Iterator[None]:
        """Run the block on rank 0 first and on the other ranks after it (say, to download
        or preprocess once and read the result everywhere)."""
        with self._first(self.is_main_process):
            yield

    @contextmanager
    def local_main_process_first(self) -> Iterator[None]:
        """Run the block on each node's local rank 0 first and on the other ranks after."""
        with self._first(self.is_local_main_process):
            yield

    @contextmanager
    def _first(self, goes_first: bool) -> Iterator[None]:
        if not goes_first:
            self.wait_world()
        try:
            yield
        finally:
            if goes_first:
                self.wait_world()

    def coordinate(self, domain: str) -> dict[str, int]:
        """This rank's index along every dim of a domain (from the layout; no torch call)."""
        return self.config.layout(domain).coordinate(self.rank)

    @property
    def log_prefix(self) -> str:
        """``[pp0 dpr1 fsdp0 tp3]``: this rank's coordinate along the dense dims of size > 1."""
        layouts = self.config.layouts
        layout = layouts.get("dense") or next(iter(layouts.values()))
        coordinate = layout.coordinate(self.rank)
        parts = [
            f"{BY_NAME[dim.name].short if dim.name in BY_NAME else dim.name}{coordinate[dim.name]}"
            for dim in layout.dims
            if dim.size > 1
        ]
        return "[" + (" ".join(parts) or f"rank{self.rank}") + "]"

    def seed(self, base_seed: int, vary_along: Sequence[str] = ()) -> int:
        """A seed equal on ranks that share coordinates along ``vary_along`` and different
        otherwise: ``torch.manual_seed(ctx.seed(42, vary_along=["pp"]))``."""
        offset, scale = 0, 1
        for name in vary_along:
            layout = self.config.layout(domain_of(self.config, [name]))
            offset += layout.coordinate(self.rank)[name] * scale
            scale *= layout.dim(name).size
        return base_seed + offset
