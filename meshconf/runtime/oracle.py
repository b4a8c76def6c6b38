"""Expected groups by plain arithmetic on the degrees, apart from the layout code.

meshconf's layouts describe each dim as modes (sizes and strides) and are what the runtime
builds from; this module never uses them. It numbers ranks as the documentation says they
are numbered: the logical world is the row-major number of the world factors' indices (pp
outermost, tp innermost), and ranks number those indices in ``order`` (outer to inner; by
default the same). A domain's coordinates are the digits of the logical index in the radix of
the domain's dim sizes. With ``inside_node``, each factor's index is ``across * inside +
inside_index``; the node is the number of the across parts and the local rank the number of
the inside parts, both in ``order``. Along one dim, a mesh lists a group's ranks in
increasing order (the order of a torch process group), so this rank's coordinate along a dim
is its place in the sorted group. ``meshconf simulate`` and the tests check the built process
groups against this.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from meshconf.core.degrees import WORLD_FACTORS
from meshconf.model.config import MeshConfig


def _digits(number: int, radix: Sequence[int]) -> list[int]:
    digits = []
    for size in reversed(radix):
        number, digit = divmod(number, size)
        digits.append(digit)
    return digits[::-1]


def _number(digits: Sequence[int], radix: Sequence[int]) -> int:
    number = 0
    for digit, size in zip(digits, radix, strict=True):
        number = number * size + digit
    return number


def _numbering(config: MeshConfig) -> tuple[Callable[[int], int], Callable[[int], int]]:
    """(logical index -> rank, rank -> logical index)."""
    degrees = [config.resolved_degrees[name] for name in WORLD_FACTORS]
    # ``order`` lists the world factors outer to inner as ranks number them.
    ranked = [WORLD_FACTORS.index(name) for name in (config.order or WORLD_FACTORS)]
    inside = [1] * len(WORLD_FACTORS)
    if config.inside_node is not None:
        inside = [getattr(config.inside_node, name) for name in WORLD_FACTORS]
    across = [degree // part for degree, part in zip(degrees, inside, strict=True)]
    per_node = math.prod(inside)

    def in_order(values: Sequence[int]) -> list[int]:
        return [values[factor] for factor in ranked]

    def from_order(values: Sequence[int]) -> list[int]:
        factors = [0] * len(WORLD_FACTORS)
        for value, factor in zip(values, ranked, strict=True):
            factors[factor] = value
        return factors

    def to_rank(index: int) -> int:
        factors = _digits(index, degrees)
        outer = [f // part for f, part in zip(factors, inside, strict=True)]
        inner = [f % part for f, part in zip(factors, inside, strict=True)]
        node = _number(in_order(outer), in_order(across))
        return node * per_node + _number(in_order(inner), in_order(inside))

    def to_index(rank: int) -> int:
        node, local = divmod(rank, per_node)
        outer = from_order(_digits(node, in_order(across)))
        inner = from_order(_digits(local, in_order(inside)))
        factors = [o * part + i for o, i, part in zip(outer, inner, inside, strict=True)]
        return _number(factors, degrees)

    return to_rank, to_index


def expected_groups(config: MeshConfig, rank: int) -> dict[tuple[str, str], list[int]]:
    """For every (domain, dim): the ranks of ``rank``'s group along that dim, sorted.

    ``config`` must have a resolved world size (``at_world_size`` gives one).
    """
    to_rank, to_index = _numbering(config)
    index = to_index(rank)
    groups = {}
    for domain, dims in config.effective_domains.items():
        sizes = [config.dim_sizes[dim] for dim in dims]
        coordinate = _digits(index, sizes)
        for axis, dim in enumerate(dims):
            stride = math.prod(sizes[axis + 1 :])
            start = index - coordinate[axis] * stride
            groups[domain, dim] = sorted(to_rank(start + i * stride) for i in range(sizes[axis]))
    return groups
