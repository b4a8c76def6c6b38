"""Whether each dim's groups cross nodes, for many assignments at once, without building a
config per assignment.

In the default domains (``meshconf.core.domains``) every dim is a single row-major block,
whose groups depend only on its size and on the product of the dims inside it in its domain
(its stride). :class:`NodeLocality` asks :meth:`DomainLayout.crosses_nodes` once per
distinct ``(size, stride)`` and remembers the answer. tests/test_plan.py checks every flag
against the layouts of the validated config.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from meshconf.core.domains import DEFAULT_DOMAINS, DEFAULT_FORMULAS
from meshconf.core.formulas import evaluate, names
from meshconf.core.layout import DomainLayout

#: The dims a plan shows and ranks, outer to inner; the expert dims only with experts.
RANKED_DIMS = ("pp", "dp_replicate", "fsdp", "cp", "tp", "efsdp", "ep", "etp")
EXPERT_DIMS = frozenset({"efsdp", "ep", "etp"})
#: Dims whose groups carry the most traffic, most first: their locality is ranked before the
#: number of pipeline stages. ``etp`` and ``ep`` count only for a mixture of experts.
HEAVY_DIMS = ("tp", "cp", "etp", "ep")
#: Dims with less traffic, most first: their locality is ranked after the pipeline stages.
LIGHT_DIMS = ("fsdp", "efsdp", "dp_replicate")

_FORMULA_NAMES = {
    name: tuple(sorted(set(names(formula)))) for name, formula in DEFAULT_FORMULAS.items()
}


def home_domain(name: str) -> str:
    """The first default domain that holds a dim: where a plan reads it from."""
    return next(domain for domain, dims in DEFAULT_DOMAINS.items() if name in dims)


def dim_sizes(degrees: Mapping[str, int]) -> dict[str, int]:
    """Every degree and every default derived dim."""
    sizes = dict(degrees)
    for name, formula in DEFAULT_FORMULAS.items():
        sizes[name] = evaluate(formula, degrees)
    return sizes


def blocks(degrees: Mapping[str, int]) -> dict[str, tuple[int, int]]:
    """``(size, stride)`` of each ranked dim in its home domain, which lays its dims out
    row-major: the stride is the product of the dims inside it."""
    sizes = dim_sizes(degrees)
    return {name: _block(name, sizes) for name in RANKED_DIMS}


def _block(name: str, sizes: Mapping[str, int]) -> tuple[int, int]:
    dims = DEFAULT_DOMAINS[home_domain(name)]
    inner = dims[dims.index(name) + 1 :]
    return sizes[name], math.prod(sizes[dim] for dim in inner)


def _inner_dims(name: str) -> tuple[str, ...]:
    dims = DEFAULT_DOMAINS[home_domain(name)]
    return dims[dims.index(name) + 1 :]


class NodeLocality:
    """The node locality of assignments of one world; answers remembered across them."""

    def __init__(self, world_size: int, gpus_per_node: int | None, experts: bool) -> None:
        self._world = world_size
        self._gpus = gpus_per_node
        self.dims = tuple(name for name in RANKED_DIMS if experts or name not in EXPERT_DIMS)
        self._inner = {name: _inner_dims(name) for name in self.dims}
        self._crossings: dict[tuple[int, int], bool] = {}
        self._derived: dict[tuple[str, tuple[int, ...]], int] = {}

    def crosses(self, degrees: Mapping[str, int]) -> dict[str, bool]:
        """Per ranked dim, whether its groups cross nodes (never, without nodes)."""
        if self._gpus is None:
            return dict.fromkeys(self.dims, False)
        sizes = dict(degrees)
        for name, inputs in _FORMULA_NAMES.items():
            key = (name, tuple(degrees[degree] for degree in inputs))
            size = self._derived.get(key)
            if size is None:
                size = self._derived[key] = evaluate(DEFAULT_FORMULAS[name], degrees)
            sizes[name] = size
        return {
            name: self._crosses(sizes[name], math.prod(sizes[dim] for dim in self._inner[name]))
            for name in self.dims
        }

    def key(
        self, degrees: Mapping[str, int], flags: Mapping[str, bool] | None = None
    ) -> tuple[int, ...]:
        """Smaller is better: heavy dims inside a node (tp, cp, etp, ep in turn), then fewer
        pipeline stages, then light dims inside a node (fsdp, efsdp, dp_replicate), then
        fewer replicas, then fewer context-parallel ranks, then fewer FSDP shards: what is
        left goes to tp, the innermost dim. Each flag is 1 when the dim's groups cross;
        ``flags`` are :meth:`crosses` of ``degrees`` when already known."""
        flags = self.crosses(degrees) if flags is None else flags
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

    def _crosses(self, size: int, stride: int) -> bool:
        gpus = self._gpus
        if gpus is None or size == 1:
            return False
        answer = self._crossings.get((size, stride))
        if answer is None:
            outer = self._world // (size * stride)
            block = DomainLayout.row_major(
                "block", [("outer", outer), ("dim", size), ("inner", stride)], self._world
            )
            answer = block.crosses_nodes("dim", gpus)
            self._crossings[size, stride] = answer
        return answer
