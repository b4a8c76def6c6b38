"""Rank layouts of mesh domains: pure integer arithmetic, no torch, no enumeration.

A domain lays the ranks ``0 .. world_size - 1`` out over named dims. Each dim is a list of
*modes* ``(size, stride)``, outer to inner: a rank's coordinate along a mode is
``rank // stride % size``. A plain dim has one mode; a dim placed partly inside and partly
across nodes has several. The modes of all dims together must form a complete mixed-radix
numbering of the world (sorted by stride, each stride is the product of the smaller sizes),
which makes the map from coordinates to ranks a bijection.

Every query below costs O(number of modes), independent of the world size, except listing
the members of a group: O(group size), the size of the answer.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Literal

from meshconf.core.errors import MeshconfError

#: Where the groups of a dim sit: each inside one node, one rank per node, or neither.
Placement = Literal["intra-node", "inter-node", "mixed"]


@dataclass(frozen=True, order=True)
class Mode:
    """One mixed-radix digit of the rank: ``size`` values, ``stride`` ranks apart."""

    size: int
    stride: int


def canonical_modes(modes: Sequence[Mode]) -> tuple[Mode, ...]:
    """Modes that enumerate the same ranks in the same order are equal after this: size-1
    modes dropped, an outer mode fused into the inner one it continues."""
    merged: list[Mode] = []
    for mode in modes:
        if mode.size == 1:
            continue
        if merged and merged[-1].stride == mode.stride * mode.size:
            outer = merged.pop()
            mode = Mode(outer.size * mode.size, mode.stride)
        merged.append(mode)
    return tuple(merged)


def group_identity(modes: Sequence[Mode]) -> tuple[Mode, ...]:
    """Modes that give the same *set* of ranks (any order) are equal after this."""
    return canonical_modes(sorted(modes, key=lambda mode: -mode.stride))


@dataclass(frozen=True)
class DimLayout:
    """A named dim of a domain and its modes, outer to inner."""

    name: str
    modes: tuple[Mode, ...]

    @property
    def size(self) -> int:
        return math.prod(mode.size for mode in self.modes)

    @property
    def stride(self) -> int:
        """The stride of the innermost mode: the distance between neighbours in a group."""
        return self.modes[-1].stride


@dataclass(frozen=True)
class RankGroup:
    """The ranks ``base + sum(c_i * stride_i)`` for every coordinate ``c`` over ``modes``.

    Ranks are listed row-major over the modes (the last mode varies fastest), which is the
    order of local ranks in the corresponding 1-D or N-D mesh.
    """

    base: int
    modes: tuple[Mode, ...]

    @property
    def size(self) -> int:
        return math.prod(mode.size for mode in self.modes)

    def __iter__(self) -> Iterator[int]:
        ranks = [self.base]
        for mode in self.modes:
            ranks = [rank + index * mode.stride for rank in ranks for index in range(mode.size)]
        return iter(ranks)

    def ranks(self) -> list[int]:
        return list(self)

    @property
    def identity(self) -> tuple[int, tuple[Mode, ...]]:
        """Equal for two groups exactly when they hold the same set of ranks."""
        return (self.base, group_identity(self.modes))


class LayoutError(MeshconfError, ValueError):
    """A layout that is not a bijection, or a query outside it."""


class UnevenSplitError(LayoutError):
    """A dim that would take a share of the numbering that is not a sub-lattice: the dim
    still needs ``needed`` ranks, the numbering's modes at ``mode_indices`` (fused) have
    ``mode_size`` left, and neither divides the other."""

    def __init__(
        self,
        domain: str,
        dim: str,
        dim_size: int,
        mode_indices: tuple[int, ...],
        mode_size: int,
        needed: int,
    ) -> None:
        super().__init__(
            f"domain {domain!r}: dim {dim!r} of size {dim_size} needs {needed} more ranks from a "
            f"part of {mode_size}, and neither divides the other"
        )
        self.domain, self.dim, self.dim_size = domain, dim, dim_size
        self.mode_indices, self.mode_size, self.needed = mode_indices, mode_size, needed


@dataclass(frozen=True)
class DomainLayout:
    """The ranks of a world laid out over a domain's named dims."""

    name: str
    world_size: int
    dims: tuple[DimLayout, ...]

    def __post_init__(self) -> None:
        names = [dim.name for dim in self.dims]
        if len(set(names)) != len(names):
            raise LayoutError(f"domain {self.name!r} repeats a dim: {names}")
        expected_stride = 1
        for mode in sorted(
            (m for d in self.dims for m in d.modes if m.size > 1), key=lambda m: m.stride
        ):
            if mode.stride != expected_stride:
                raise LayoutError(
                    f"domain {self.name!r}: the modes do not number the ranks one to one "
                    f"(a mode has stride {mode.stride}, {expected_stride} was expected)"
                )
            expected_stride *= mode.size
        if expected_stride != self.world_size:
            raise LayoutError(
                f"domain {self.name!r}: the dims cover {expected_stride} ranks, "
                f"not world_size {self.world_size}"
            )

    @classmethod
    def row_major(
        cls, name: str, sizes: Sequence[tuple[str, int]], world_size: int | None = None
    ) -> DomainLayout:
        """Unflatten the world into ``sizes`` (outer to inner), the last dim varying fastest."""
        total = math.prod(size for _, size in sizes) if world_size is None else world_size
        return cls.unflatten(name, sizes, (Mode(total, 1),))

    @classmethod
    def unflatten(
        cls, name: str, sizes: Sequence[tuple[str, int]], numbering: Sequence[Mode]
    ) -> DomainLayout:
        """Unflatten a numbering of the world into ``sizes``, row-major.

        ``numbering`` maps a logical index to a rank: its modes, outer to inner, are the
        mixed-radix digits of the index, and each digit moves the rank by the mode's stride.
        ``(Mode(world_size, 1),)`` numbers ranks as themselves, which gives plain row-major
        dims. Each dim takes the next inner digits of the index; a dim that ends inside a mode
        splits it, which needs one size to divide the other (:class:`UnevenSplitError`).

        A dim's modes are kept in decreasing stride (contiguous ones fused), so its groups list
        their ranks in increasing order: the order torch gives the ranks of a process group,
        which a DeviceMesh needs its coordinates to follow.
        """
        world_size = math.prod(mode.size for mode in numbering)
        # Fused contiguous modes split more ways than their pieces: (3, 2) then (2, 6) is
        # (6, 2), which a dim of 4 can share evenly with the dims after it.
        pending: list[tuple[tuple[int, ...], Mode]] = []
        for index, mode in enumerate(numbering):
            if mode.size == 1:
                continue
            if pending and pending[-1][1].stride == mode.stride * mode.size:
                indices, outer = pending.pop()
                pending.append(((*indices, index), Mode(outer.size * mode.size, mode.stride)))
            else:
                pending.append(((index,), mode))
        dims: list[DimLayout] = []
        for dim_name, size in reversed(sizes):
            taken: list[Mode] = []
            remaining = size
            while remaining > 1:
                if not pending:
                    raise LayoutError(
                        f"domain {name!r}: the dims cover more than {world_size} ranks"
                    )
                indices, mode = pending.pop()
                if remaining % mode.size == 0:
                    taken.append(mode)
                    remaining //= mode.size
                elif mode.size % remaining == 0:
                    taken.append(Mode(remaining, mode.stride))
                    pending.append((indices, Mode(mode.size // remaining, mode.stride * remaining)))
                    remaining = 1
                else:
                    raise UnevenSplitError(name, dim_name, size, indices, mode.size, remaining)
            modes = group_identity(taken) or (
                Mode(1, pending[-1][1].stride if pending else world_size),
            )
            dims.append(DimLayout(dim_name, modes))
        return cls(name, world_size, tuple(reversed(dims)))

    @cached_property
    def is_row_major(self) -> bool:
        """Whether the domain is the world reshaped: one mode per dim, strides row-major."""
        expected = DomainLayout.row_major(
            self.name, [(dim.name, dim.size) for dim in self.dims], self.world_size
        )
        return all(
            canonical_modes(dim.modes) == canonical_modes(plain.modes)
            for dim, plain in zip(self.dims, expected.dims, strict=True)
        )

    @cached_property
    def _by_name(self) -> dict[str, DimLayout]:
        return {dim.name: dim for dim in self.dims}

    @property
    def dim_names(self) -> tuple[str, ...]:
        return tuple(dim.name for dim in self.dims)

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(dim.size for dim in self.dims)

    def dim(self, name: str) -> DimLayout:
        try:
            return self._by_name[name]
        except KeyError:
            raise LayoutError(
                f"domain {self.name!r} has no dim {name!r}; its dims are {list(self.dim_names)}"
            ) from None

    def _check_rank(self, rank: int) -> None:
        if not 0 <= rank < self.world_size:
            raise LayoutError(f"rank {rank} is outside the world [0, {self.world_size})")

    def coordinate(self, rank: int) -> dict[str, int]:
        """The rank's index along every dim of the domain."""
        self._check_rank(rank)
        coordinate: dict[str, int] = {}
        for dim in self.dims:
            index = 0
            for mode in dim.modes:
                index = index * mode.size + rank // mode.stride % mode.size
            coordinate[dim.name] = index
        return coordinate

    def rank_at(self, coordinate: Mapping[str, int]) -> int:
        """The rank at a coordinate that gives an index for every dim."""
        missing = [name for name in self.dim_names if name not in coordinate]
        unknown = [name for name in coordinate if name not in self._by_name]
        if missing or unknown:
            raise LayoutError(
                f"a coordinate of domain {self.name!r} needs exactly the dims "
                f"{list(self.dim_names)}; missing {missing}, unknown {unknown}"
            )
        rank = 0
        for dim in self.dims:
            index = coordinate[dim.name]
            if not 0 <= index < dim.size:
                raise LayoutError(f"index {index} of dim {dim.name!r} is outside [0, {dim.size})")
            for mode in reversed(dim.modes):
                rank += index % mode.size * mode.stride
                index //= mode.size
        return rank

    def _modes_of(self, dims: str | Sequence[str]) -> tuple[Mode, ...]:
        names = [dims] if isinstance(dims, str) else list(dims)
        if len(set(names)) != len(names):
            raise LayoutError(f"dims {names} repeat a name")
        return tuple(mode for name in names for mode in self.dim(name).modes)

    def group(self, rank: int, dims: str | Sequence[str]) -> RankGroup:
        """The ranks that share every coordinate with ``rank`` except along ``dims``.

        With several dims, the ranks are ordered as a mesh over ``dims`` in the given order.
        """
        self._check_rank(rank)
        modes = self._modes_of(dims)
        base = rank - sum(rank // mode.stride % mode.size * mode.stride for mode in modes)
        return RankGroup(base, modes)

    def num_groups(self, dims: str | Sequence[str]) -> int:
        """How many disjoint groups ``dims`` split the world into."""
        return self.world_size // math.prod(mode.size for mode in self._modes_of(dims))

    def crosses_nodes(self, dims: str | Sequence[str], gpus_per_node: int) -> bool:
        """Whether some group along ``dims`` holds ranks of more than one node.

        Nodes hold consecutive ranks, ``gpus_per_node`` each: :func:`groups_cross_nodes`
        of the block of the outermost mode along ``dims``.
        """
        if gpus_per_node < 1:
            raise LayoutError(f"gpus_per_node must be >= 1, got {gpus_per_node}")
        block = max(
            (mode.size * mode.stride for mode in self._modes_of(dims) if mode.size > 1), default=1
        )
        return groups_cross_nodes(block, self.world_size, gpus_per_node)

    def placement(self, dims: str | Sequence[str], gpus_per_node: int) -> Placement:
        """``intra-node`` when every group along ``dims`` stays inside one node,
        ``inter-node`` when no node holds two ranks of one group, ``mixed`` otherwise.

        The modes number the world in mixed radix, so two ranks of a group are at least the
        smallest stride of its modes apart, and rank 0's group holds both 0 and that stride:
        no node holds two ranks of a group exactly when that stride is ``gpus_per_node`` or
        more.
        """
        if not self.crosses_nodes(dims, gpus_per_node):
            return "intra-node"
        smallest = min(mode.stride for mode in self._modes_of(dims) if mode.size > 1)
        return "inter-node" if smallest >= gpus_per_node else "mixed"


def groups_cross_nodes(block: int, world_size: int, gpus_per_node: int) -> bool:
    """Whether the groups of a dim hold ranks of more than one node, in a world numbered in
    mixed radix (as every layout is), nodes holding ``gpus_per_node`` consecutive ranks.

    ``block`` is the size times the stride of the dim's outermost mode (1 for a dim of one
    rank). A group's ranks differ only in the digits up to that mode, so each group lies in
    one aligned run of ``block`` ranks. When ``block`` divides ``gpus_per_node``, every run is
    inside one node. Otherwise, in a world larger than a node, some node boundary falls inside
    a run; of that run's two groups whose other inner digits are all zero or all at their
    largest, one straddles it, because those digits span less than half the run.
    """
    return world_size > gpus_per_node and gpus_per_node % block != 0


def process_group_count(layouts: Sequence[DomainLayout], rank: int) -> int:
    """Distinct groups of more than one rank that ``rank`` joins over every dim of ``layouts``.

    Two dims that hold the same set of ranks around ``rank`` (in any domain, in any order)
    count once, so a dim spanning the whole world counts once however often it appears.
    """
    identities = {
        layout.group(rank, dim.name).identity
        for layout in layouts
        for dim in layout.dims
        if dim.size > 1
    }
    return len(identities)
