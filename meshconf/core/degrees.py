"""The parallel degrees, and how the one left at ``-1`` is filled in."""

from __future__ import annotations

import math
from collections.abc import Mapping

#: The degrees whose product is the world size, outer to inner in the default layouts.
WORLD_FACTORS = ("pp", "dp_replicate", "dp_shard", "cp", "tp")
#: Expert parallelism borrows ranks from ``dp_shard * cp * tp``; it is not a world factor.
EXPERT_DEGREES = ("ep", "etp")
DEGREE_NAMES = WORLD_FACTORS + EXPERT_DEGREES

#: The value of a world factor that takes whatever ranks the others leave.
AUTO = -1
#: torch numbers ranks with 32-bit signed integers.
MAX_WORLD_SIZE = 2**31 - 1


def default_dp_shard(declared: Mapping[str, int]) -> int:
    """``dp_shard`` fills the world unless another world factor already does."""
    others_auto = any(declared.get(name) == AUTO for name in WORLD_FACTORS if name != "dp_shard")
    return 1 if others_auto else AUTO


def auto_factor(degrees: Mapping[str, int]) -> str | None:
    """The world factor set to ``-1``, if any."""
    return next((name for name in WORLD_FACTORS if degrees[name] == AUTO), None)


def divisors(number: int) -> list[int]:
    """Divisors of ``number`` in increasing order, from its prime factorisation: every size
    a degree of a world of ``number`` ranks can take."""
    found = [1]
    remaining = number
    prime = 2
    while prime * prime <= remaining:
        exponent = 0
        while remaining % prime == 0:
            remaining //= prime
            exponent += 1
        if exponent:
            found = [d * prime**power for d in found for power in range(exponent + 1)]
        prime += 1 if prime == 2 else 2
    if remaining > 1:
        found += [d * remaining for d in found]
    return sorted(found)


def product_text(degrees: Mapping[str, int], names: tuple[str, ...]) -> str:
    """``pp(4) * tp(8)``: a product written out with its values."""
    return " * ".join(f"{name}({degrees[name]})" for name in names)


def world_product(degrees: Mapping[str, int]) -> int:
    return math.prod(degrees[name] for name in WORLD_FACTORS)
