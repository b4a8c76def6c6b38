"""The parallel degrees, and how the one left at ``-1`` is filled in.

:data:`DEGREES` is the one table of the degrees: every layer reads it (the models' fields
and their descriptions, the Hydra schema node, the JSON Schema, the rules, plan's
enumeration and its flags, the estimators), so that a degree is named, described and
classified here alone.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

#: The value of a world factor that takes whatever ranks the others leave.
AUTO = -1


@dataclass(frozen=True)
class Degree:
    """One parallel degree."""

    name: str
    #: What it is, as the config's reference and the JSON Schema describe it.
    meaning: str
    #: A world factor: the degrees' product is the world size. Otherwise it borrows its ranks
    #: from the world factors (the expert degrees borrow ``dp_shard * cp * tp``).
    world_factor: bool
    #: Its label in a rank's log prefix (``[dpr0 dps1 tp3]``).
    short: str
    #: Values the JSON Schema and the reference show.
    examples: tuple[int, ...]
    #: Its value when the config leaves it out (``dp_shard``'s is -1, see default_dp_shard).
    default: int = 1
    #: A world factor's part inside a node, as ``inside_node`` describes it, with an example.
    inside_node: str = ""
    inside_node_example: int = 1
    #: ``meshconf plan`` varies it only when pinned (it keeps the default otherwise).
    planned_when_pinned: bool = False

    @property
    def expert(self) -> bool:
        """Only the expert layers (the ``sparse`` domain) use it."""
        return not self.world_factor


DEGREES: tuple[Degree, ...] = (
    Degree(
        "pp",
        "Pipeline-parallel stages.",
        world_factor=True,
        short="pp",
        examples=(4,),
        inside_node="Pipeline stages inside a node.",
    ),
    Degree(
        "dp_replicate",
        "Data-parallel replicas (DDP, or HSDP's outer dim).",
        world_factor=True,
        short="dpr",
        examples=(2,),
        inside_node="Replicas inside a node.",
    ),
    Degree(
        "dp_shard",
        "Data-parallel shards (FSDP). Defaults to -1 unless another degree is -1.",
        world_factor=True,
        default=AUTO,
        short="dps",
        examples=(AUTO, 8),
        inside_node="FSDP shards inside a node.",
        inside_node_example=2,
    ),
    # A sequence split is for long contexts: a plan adds it only when asked for.
    Degree(
        "cp",
        "Context-parallel ranks (sequence split).",
        world_factor=True,
        short="cp",
        examples=(2,),
        inside_node="Context-parallel ranks inside a node.",
        inside_node_example=2,
        planned_when_pinned=True,
    ),
    Degree(
        "tp",
        "Tensor-parallel ranks.",
        world_factor=True,
        short="tp",
        examples=(8,),
        inside_node="Tensor-parallel ranks inside a node.",
        inside_node_example=8,
    ),
    Degree(
        "ep",
        "Expert-parallel ranks, borrowed from dp_shard * cp * tp.",
        world_factor=False,
        short="ep",
        examples=(8,),
    ),
    Degree(
        "etp",
        "Expert tensor-parallel ranks: 1 or tp.",
        world_factor=False,
        short="etp",
        examples=(1,),
    ),
)
BY_NAME: Mapping[str, Degree] = {degree.name: degree for degree in DEGREES}

#: The degrees whose product is the world size, outer to inner in the default layouts.
WORLD_FACTORS = tuple(degree.name for degree in DEGREES if degree.world_factor)
#: The degrees that borrow their ranks from the world factors; none is a world factor.
EXPERT_DEGREES = tuple(degree.name for degree in DEGREES if not degree.world_factor)
DEGREE_NAMES = tuple(degree.name for degree in DEGREES)
#: The world factors whose ranks the expert degrees borrow: ``ep * etp`` divides their product.
LENT_TO_EXPERTS = ("dp_shard", "cp", "tp")
#: torch numbers ranks with 32-bit signed integers.
MAX_WORLD_SIZE = 2**31 - 1


def default_dp_shard(declared: Mapping[str, int]) -> int:
    """``dp_shard`` fills the world unless another world factor already does."""
    others_auto = any(declared.get(name) == AUTO for name in WORLD_FACTORS if name != "dp_shard")
    return 1 if others_auto else AUTO


def auto_factor(degrees: Mapping[str, int]) -> str | None:
    """The world factor set to ``-1``, if any."""
    return next((name for name in WORLD_FACTORS if degrees[name] == AUTO), None)


def prime_factors(number: int) -> dict[int, int]:
    """Each prime dividing ``number``, with its exponent (``{2: 3, 3: 1}`` for 24)."""
    factors: dict[int, int] = {}
    remaining, prime = number, 2
    while prime * prime <= remaining:
        while remaining % prime == 0:
            remaining //= prime
            factors[prime] = factors.get(prime, 0) + 1
        prime += 1 if prime == 2 else 2
    if remaining > 1:
        factors[remaining] = factors.get(remaining, 0) + 1
    return factors


def divisors(number: int) -> list[int]:
    """Divisors of ``number`` in increasing order, from its prime factorisation: every size
    a degree of a world of ``number`` ranks can take."""
    found = [1]
    for prime, exponent in prime_factors(number).items():
        found = [d * prime**power for d in found for power in range(exponent + 1)]
    return sorted(found)


def product_text(degrees: Mapping[str, int], names: tuple[str, ...]) -> str:
    """``pp(4) * tp(8)``: a product written out with its values."""
    return " * ".join(f"{name}({degrees[name]})" for name in names)


def world_product(degrees: Mapping[str, int]) -> int:
    return math.prod(degrees[name] for name in WORLD_FACTORS)
