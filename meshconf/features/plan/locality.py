"""Whether each dim's groups cross nodes, for many assignments at once, without building a
config per assignment.

The default domains (``meshconf.core.domains``) unflatten the *logical* index of the world
factors, row-major in their default order, so each ranked dim is a run of that index: the
digits from the product of the dims inside it in its home domain (``low``) up to ``low``
times its size. ``order`` moves each world factor's digits to its own stride among the
ranks. Whether a dim's groups cross nodes needs only its outermost digit among the ranks
(:func:`meshconf.core.layout.groups_cross_nodes`), which the run gives in a few
multiplications: :class:`NodeLocality` builds no layout. tests/test_plan.py checks every flag
against the layouts of the validated config, over every order.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from meshconf.core.degrees import WORLD_FACTORS
from meshconf.core.domains import DEFAULT_DOMAINS, default_sizes
from meshconf.core.hierarchy import order_strides
from meshconf.core.layout import groups_cross_nodes

#: The dims a plan shows and ranks, outer to inner; the expert dims only with experts.
RANKED_DIMS = ("pp", "dp_replicate", "fsdp", "cp", "tp", "efsdp", "ep", "etp")
EXPERT_DIMS = frozenset({"efsdp", "ep", "etp"})
#: Dims whose groups carry the most traffic, most first: their locality is ranked before the
#: number of pipeline stages. ``etp`` and ``ep`` count only for a mixture of experts.
HEAVY_DIMS = ("tp", "cp", "etp", "ep")
#: Dims with less traffic, most first: their locality is ranked after the pipeline stages.
LIGHT_DIMS = ("fsdp", "efsdp", "dp_replicate")

_INNER_FIRST = tuple(reversed(WORLD_FACTORS))


def home_domain(name: str) -> str:
    """The first default domain that holds a dim: where a plan reads it from."""
    return next(domain for domain, dims in DEFAULT_DOMAINS.items() if name in dims)


class NodeLocality:
    """The locality of assignments of one world and one rank order: which nodes, and which
    units of the levels above them (``level_sizes``, inner to outer), their groups cross."""

    def __init__(
        self,
        world_size: int,
        gpus_per_node: int | None,
        experts: bool,
        order: Sequence[str] = WORLD_FACTORS,
        level_sizes: Sequence[int] = (),
    ) -> None:
        self._world = world_size
        self._gpus = gpus_per_node
        self._sizes = () if gpus_per_node is None else (gpus_per_node, *level_sizes)
        self._order = tuple(order)
        self.dims = tuple(name for name in RANKED_DIMS if experts or name not in EXPERT_DIMS)
        homes = {name: DEFAULT_DOMAINS[home_domain(name)] for name in self.dims}
        self._inner = {name: dims[dims.index(name) + 1 :] for name, dims in homes.items()}

    def blocks(self, degrees: Mapping[str, int]) -> dict[str, int]:
        """Per ranked dim, the size times the stride of its outermost mode among the ranks:
        each of its groups lies in one aligned run of that many ranks."""
        sizes = default_sizes(degrees)
        rank_strides = order_strides(degrees, self._order)
        logical_strides = order_strides(degrees, WORLD_FACTORS)
        found: dict[str, int] = {}
        for name in self.dims:
            low = math.prod([sizes[dim] for dim in self._inner[name]])
            high = low * sizes[name]
            block = 1
            # Inner factors first: past the run's top, no factor has digits in it.
            for factor in _INNER_FIRST:
                start = logical_strides[factor]
                if start >= high:
                    break
                end = start * degrees[factor]
                if end > low and end > start:
                    # This factor's digits in the run span rank_stride * top / start ranks;
                    # under an order any factor's may be the outermost among the ranks.
                    top = high if high < end else end
                    block = max(block, rank_strides[factor] * top // start)
            found[name] = block
        return found

    def crossings(self, degrees: Mapping[str, int]) -> dict[str, int]:
        """Per ranked dim, how many levels its groups cross, the node first: 0 inside a
        node, 1 across nodes (but inside one unit of the next level), and so on. Levels
        nest, so a group that crosses one crosses every level inside it."""
        if not self._sizes:
            return dict.fromkeys(self.dims, 0)
        return {
            name: sum(groups_cross_nodes(block, self._world, size) for size in self._sizes)
            for name, block in self.blocks(degrees).items()
        }

    def key(
        self, degrees: Mapping[str, int], flags: Mapping[str, int] | None = None
    ) -> tuple[int, ...]:
        """Smaller is better: the heavy dims' crossings, fewer pipeline stages, the light
        dims' crossings, then fewer replicas, context-parallel ranks and FSDP shards: what is
        left goes to tp, the innermost dim. ``flags`` are :meth:`crossings` of ``degrees``
        when already known."""
        flags = self.crossings(degrees) if flags is None else flags
        heavy = tuple(int(flags[name]) for name in HEAVY_DIMS if name in flags)
        light = tuple(int(flags[name]) for name in LIGHT_DIMS if name in flags)
        # cp before dp_shard: a sequence split is for long contexts, so one not asked for
        # is the last thing to add.
        return (
            *heavy,
            degrees["pp"],
            *light,
            degrees["dp_replicate"],
            degrees["cp"],
            degrees["dp_shard"],
            degrees["tp"],
        )
