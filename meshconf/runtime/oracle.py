"""Expected groups by plain arithmetic on the degrees, apart from the layout code.

meshconf's layouts describe each dim as modes (sizes and strides) and are what the runtime
builds from; this module never uses them. It numbers ranks as the documentation says they
are numbered: the logical world is the row-major number of the world factors' indices (pp
outermost, tp innermost), and ranks number those indices in ``order`` (outer to inner; by
default the same). A domain's coordinates are the digits of the logical index in the radix of
the domain's dim sizes. With ``inside_node`` or ``inside``, each factor's index is the
number of its parts in the bands of the placement (outer band first: ``across * inside +
inside_index`` for a node), and the rank the number of the bands, each the number of its
parts in ``order``. Along one dim, a mesh lists a group's ranks in
increasing order (the order of a torch process group), so this rank's coordinate along a dim
is its place in the sorted group. ``meshconf simulate`` and the tests check the built process
groups against this.

The arithmetic is written once for a number and runs on a tensor of them too (``//``, ``%``,
``*`` and ``+`` only), so that a group of half a million ranks is one pass of tensor
operations rather than half a million Python calls.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import TypeVar

import torch

from meshconf.core.degrees import WORLD_FACTORS
from meshconf.model.config import MeshConfig

# A rank number, or a tensor of them.
Numbers = TypeVar("Numbers", int, torch.Tensor)


def _digits(number: Numbers, radix: Sequence[int]) -> list[Numbers]:
    digits = []
    for size in reversed(radix):
        digits.append(number % size)
        number = number // size
    return digits[::-1]


def _number(digits: Sequence[Numbers], radix: Sequence[int]) -> Numbers:
    number = digits[0] * 0
    for digit, size in zip(digits, radix, strict=True):
        number = number * size + digit
    return number


def _numbering(
    config: MeshConfig,
) -> tuple[Callable[[torch.Tensor], torch.Tensor], Callable[[int], int]]:
    """(logical indices -> their ranks, rank -> logical index)."""
    degrees = [config.resolved_degrees[name] for name in WORLD_FACTORS]
    # ``order`` lists the world factors outer to inner as ranks number them.
    ranked = [WORLD_FACTORS.index(name) for name in (config.order or WORLD_FACTORS)]
    # The bands, outer first: each factor's part in each; without placement, one band.
    bands = [degrees]
    if config.placement_bands is not None:
        bands = [[parts[name] for name in WORLD_FACTORS] for _, parts in config.placement_bands]
        bands.reverse()
    # Per factor, the radix of its index: its part in each band, outer band first.
    factor_radix = [[band[factor] for band in bands] for factor in range(len(WORLD_FACTORS))]
    band_sizes = [math.prod(band) for band in bands]

    def in_order(values: Sequence[Numbers]) -> list[Numbers]:
        return [values[factor] for factor in ranked]

    def from_order(values: Sequence[int]) -> list[int]:
        factors = [0] * len(WORLD_FACTORS)
        for value, factor in zip(values, ranked, strict=True):
            factors[factor] = value
        return factors

    def to_rank(index: torch.Tensor) -> torch.Tensor:
        factors = _digits(index, degrees)
        parts = [_digits(f, radix) for f, radix in zip(factors, factor_radix, strict=True)]
        numbers = [
            _number(in_order([part[b] for part in parts]), in_order(band))
            for b, band in enumerate(bands)
        ]
        return _number(numbers, band_sizes)

    def to_index(rank: int) -> int:
        numbers = _digits(rank, band_sizes)
        parts = [
            from_order(_digits(number, in_order(band)))
            for number, band in zip(numbers, bands, strict=True)
        ]
        factors = [
            _number([part[factor] for part in parts], factor_radix[factor])
            for factor in range(len(WORLD_FACTORS))
        ]
        return _number(factors, degrees)

    return to_rank, to_index


def expected_groups(config: MeshConfig, rank: int) -> dict[tuple[str, str], torch.Tensor]:
    """For every (domain, dim): the ranks of ``rank``'s group along that dim, sorted (a 1-D
    int64 tensor). Dims whose groups have the same members share one tensor.

    ``config`` must have a resolved world size (``at_world_size`` gives one).
    """
    to_rank, to_index = _numbering(config)
    index = to_index(rank)
    groups = {}
    # Different dims often have the same members (batch, fsdp and loss over one replica).
    by_members: dict[tuple[int, int, int], torch.Tensor] = {}
    for domain, dims in config.effective_domains.items():
        sizes = [config.dim_sizes[dim] for dim in dims]
        coordinate = _digits(index, sizes)
        for axis, dim in enumerate(dims):
            stride = math.prod(sizes[axis + 1 :])
            start = index - coordinate[axis] * stride
            key = (start, stride, sizes[axis])
            if key not in by_members:
                by_members[key] = _ranks_of(to_rank, start, stride, sizes[axis])
            groups[domain, dim] = by_members[key]
    return groups


#: Members numbered per pass: each pass holds a few dozen tensors of this length, so a group of
#: millions costs megabytes at a time rather than hundreds.
_CHUNK = 1 << 16


def _ranks_of(
    to_rank: Callable[[torch.Tensor], torch.Tensor], start: int, stride: int, size: int
) -> torch.Tensor:
    """The sorted ranks of logical indices ``start + i * stride`` for ``i`` below ``size``."""
    ranks = torch.empty(size, dtype=torch.int64)
    for first in range(0, size, _CHUNK):
        steps = torch.arange(first, min(size, first + _CHUNK), dtype=torch.int64)
        ranks[first : first + len(steps)] = to_rank(start + steps * stride)
    return ranks.sort().values
