"""What the brute-force tests share: mixed-radix digits written out by hand (no meshconf code),
the groups that a rank order and a hierarchical placement mean, stated directly, and the
messages a config is refused with."""

from __future__ import annotations

import functools
import math
from typing import Any

import pytest

from meshconf import ConfigError, load_config
from meshconf.core.degrees import WORLD_FACTORS


def errors(data: dict[str, Any]) -> list[str]:
    """The rendered diagnostics ``load_config(data)`` raises (it must raise)."""
    with pytest.raises(ConfigError) as raised:
        load_config(data)
    return [diagnostic.render() for diagnostic in raised.value.diagnostics]


def unravel(index: int, sizes: list[int]) -> list[int]:
    """The digits of ``index`` in the mixed radix ``sizes``, most significant first."""
    digits = []
    for size in reversed(sizes):
        index, digit = divmod(index, size)
        digits.append(digit)
    return digits[::-1]


def ravel(digits: list[int], sizes: list[int]) -> int:
    """The number whose digits in the mixed radix ``sizes`` are ``digits``."""
    index = 0
    for digit, size in zip(digits, sizes, strict=True):
        index = index * size + digit
    return index


def factor_indices(
    rank: int, degrees: dict[str, int], order: list[str], inside: dict[str, int], gpus: int
) -> dict[str, int]:
    """What order means, stated directly: the rank numbers the world factors row-major in
    ``order``; with inside_node, the local rank numbers the inside parts and the node the
    across parts, both row-major in ``order``, and a factor's index is across * inside + in."""
    inner = {name: inside.get(name, 1) for name in WORLD_FACTORS}
    outer = {name: degrees[name] // inner[name] for name in WORLD_FACTORS}
    node, local = divmod(rank, gpus)
    across = dict(zip(order, unravel(node, [outer[name] for name in order]), strict=True))
    within = dict(zip(order, unravel(local, [inner[name] for name in order]), strict=True))
    return {name: across[name] * inner[name] + within[name] for name in WORLD_FACTORS}


def brute_force_groups(
    degrees: dict[str, int],
    order: list[str],
    inside: dict[str, int],
    gpus: int,
    sizes: list[int],
    axis: int,
) -> dict[int, list[int]]:
    """The group of every rank along dim ``axis`` of a domain of ``sizes``: the domains
    unflatten the factors' indices numbered row-major in the default order."""
    placed = tuple(inside.get(name, 1) for name in WORLD_FACTORS)
    logical = _logical_indices(tuple(degrees[n] for n in WORLD_FACTORS), tuple(order), placed, gpus)
    groups: dict[tuple[int, ...], list[int]] = {}
    for rank, index in enumerate(logical):
        coordinate = unravel(index, sizes)
        del coordinate[axis]
        groups.setdefault(tuple(coordinate), []).append(rank)
    return {rank: sorted(group) for group in groups.values() for rank in group}


@functools.lru_cache(maxsize=4)  # every dim of every domain of one world reads the same
def _logical_indices(
    factors: tuple[int, ...], order: tuple[str, ...], placed: tuple[int, ...], gpus: int
) -> tuple[int, ...]:
    """Each rank's index in the default numbering of the world factors."""
    degrees = dict(zip(WORLD_FACTORS, factors, strict=True))
    inside = dict(zip(WORLD_FACTORS, placed, strict=True))
    return tuple(
        ravel([indices[name] for name in WORLD_FACTORS], list(factors))
        for indices in (
            factor_indices(rank, degrees, list(order), inside, gpus)
            for rank in range(math.prod(factors))
        )
    )


SPARSE_DIMS = ["pp", "dp_replicate", "efsdp", "ep", "etp"]


def sparse_sizes(degrees: dict[str, int]) -> list[int]:
    """The sizes of the default sparse domain's dims: experts borrow dp_shard * cp * tp."""
    lender = degrees["dp_shard"] * degrees["cp"] * degrees["tp"]
    sizes = {**degrees, "efsdp": lender // (degrees["ep"] * degrees["etp"])}
    return [sizes[name] for name in SPARSE_DIMS]


def assert_refused_only_for_uneven_groups(
    error: ConfigError,
    degrees: dict[str, int],
    order: list[str],
    inside: dict[str, int],
    gpus: int,
) -> None:
    """A config may be refused only for an expert dim that would split ranks unevenly, and
    then that dim's brute-force groups really differ in shape from rank to rank, which no
    layout describes."""
    (diagnostic,) = error.diagnostics
    assert "unevenly" in diagnostic.message, diagnostic.render()
    domain = diagnostic.message.split("domain '")[1].split("'")[0]
    dim = diagnostic.message.split("(")[0]
    assert domain == "sparse" and dim in ("ep", "efsdp"), diagnostic.render()
    axis = SPARSE_DIMS.index(dim)
    groups = brute_force_groups(degrees, order, inside, gpus, sparse_sizes(degrees), axis)
    assert len({tuple(rank - group[0] for rank in group) for group in groups.values()}) > 1
