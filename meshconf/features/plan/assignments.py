"""Every valid assignment of the world factors for a plan request: nested loops over
divisors, meshconf's expert rules asked once per distinct input, and under an order other
than the default, the even split of the expert dims."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Literal

from meshconf.core.degrees import (
    BY_NAME,
    EXPERT_DEGREES,
    LENT_TO_EXPERTS,
    WORLD_FACTORS,
    divisors,
)
from meshconf.core.domains import DEFAULT_DOMAINS, SPARSE, default_sizes
from meshconf.core.errors import Problem
from meshconf.core.hierarchy import rank_numbering
from meshconf.core.layout import DomainLayout, UnevenSplitError
from meshconf.features.plan.request import Request, pins_text, rule_inputs
from meshconf.model.analysis import Analysis
from meshconf.model.rules import check_etp, check_expert_borrow

#: An assignment of the world factors, in WORLD_FACTORS order (pp outermost).
Factors = tuple[int, ...]
#: Where the world factors that experts borrow sit in an assignment.
_LENT = tuple(index for index, name in enumerate(WORLD_FACTORS) if name in LENT_TO_EXPERTS)
#: What the expert rules say of an assignment: valid, refused by the degree rules, or left
#: out because the order would split an expert dim unevenly.
_Verdict = Literal["valid", "refused", "uneven"]


class _Divisors:
    """Divisors of the divisors of one world, computed from the world's own once."""

    def __init__(self, world_size: int) -> None:
        self._world = divisors(world_size)
        self._cache: dict[int, list[int]] = {}

    def of(self, number: int) -> list[int]:
        found = self._cache.get(number)
        if found is None:
            found = [d for d in self._world if d <= number and number % d == 0]
            self._cache[number] = found
        return found


def _assignments(request: Request) -> Iterator[Factors]:
    """Every tuple of world factors (in WORLD_FACTORS order) with product world_size that
    keeps the pins: nested loops over divisors, innermost factor (tp) outermost in the loops,
    and the outermost factor (pp) taking the ranks left."""
    divisors = _Divisors(request.world_size)
    pins = request.pins
    *outer, last = reversed(WORLD_FACTORS)

    def options(name: str, remaining: int) -> list[int]:
        pinned = pins.get(name)
        if pinned is None:
            return [1] if BY_NAME[name].planned_when_pinned else divisors.of(remaining)
        return [pinned] if remaining % pinned == 0 else []

    def extend(chosen: tuple[int, ...], remaining: int) -> Iterator[Factors]:
        if len(chosen) == len(outer):
            # the last factor takes what is left; a pin must equal it.
            if pins.get(last, remaining) == remaining:
                yield (remaining, *reversed(chosen))
            return
        for value in options(outer[len(chosen)], remaining):
            yield from extend((*chosen, value), remaining // value)

    return extend((), request.world_size)


@dataclass(frozen=True)
class UnevenSplit:
    """An assignment whose expert dims the order would split unevenly, and how."""

    degrees: dict[str, int]
    error: UnevenSplitError


class ValidAssignments:
    """The assignments of a request that also pass meshconf's expert rules, as every degree.

    Iterating counts them (:attr:`seen`), and the assignments that the order alone leaves
    out (:attr:`left_out`), the first of which is kept in :attr:`uneven` for the message.
    The rules on ep and etp (``check_etp``, ``check_expert_borrow``) read only the factors
    experts borrow (dp_shard, cp and tp); the even split under an order also reads whether
    each other factor is 1 (a factor of one rank between two others lets their digits run
    on). So each distinct (dp_shard, cp, tp, pp > 1, dp_replicate > 1) is checked once.
    """

    def __init__(self, request: Request) -> None:
        self._request = request
        self._experts = any(name in request.pins for name in EXPERT_DEGREES)
        self._answers: dict[tuple[int, ...], _Verdict] = {}
        self.seen = 0
        self.left_out = 0
        self.uneven: UnevenSplit | None = None

    def __iter__(self) -> Iterator[dict[str, int]]:
        for factors in _assignments(self._request):
            if self._experts and not self._allow(factors):
                continue
            self.seen += 1
            yield _degrees(self._request, factors)

    def _allow(self, factors: Factors) -> bool:
        key = tuple(value if index in _LENT else value > 1 for index, value in enumerate(factors))
        verdict = self._answers.get(key)
        if verdict is None:
            verdict = self._answers[key] = self._verdict(factors)
        if verdict == "uneven":
            self.left_out += 1
        return verdict == "valid"

    def _verdict(self, factors: Factors) -> _Verdict:
        if _expert_problems(_degrees(self._request, factors)):
            return "refused"
        return "valid" if self._splits_evenly(factors) else "uneven"

    def _splits_evenly(self, factors: Factors) -> bool:
        """The default order numbers ranks by the logical index itself, one mode that any
        sizes split evenly; another order may keep apart world factors a dim must share."""
        order = self._request.rank_order
        if order == WORLD_FACTORS:
            return True
        degrees = _degrees(self._request, factors)
        sizes = default_sizes(degrees)
        dims = [(name, sizes[name]) for name in DEFAULT_DOMAINS[SPARSE]]
        try:
            DomainLayout.unflatten(SPARSE, dims, rank_numbering(degrees, order))
        except UnevenSplitError as error:
            if self.uneven is None:
                self.uneven = UnevenSplit(degrees, error)
            return False
        return True

    def no_assignment_message(self) -> str:
        """Why none is valid, once the world-factor pins fit: only the expert rules can leave
        nothing. ep * etp must divide dp_shard * cp * tp, and an order must let the expert
        dims split evenly."""
        request = self._request
        pins = pins_text(request, WORLD_FACTORS + EXPERT_DEGREES)
        uneven = self.uneven
        if uneven is not None:
            factors = " and ".join(WORLD_FACTORS[index] for index in uneven.error.mode_indices)
            return (
                f"{pins} --order {','.join(request.rank_order)} conflict at --world-size "
                f"{request.world_size}: in every assignment that ep and etp divide, an expert "
                f"dim would split world factors that this order numbers apart unevenly; with "
                f"{_degrees_text(uneven.degrees)}, {uneven.error.dim}({uneven.error.dim_size}) "
                f"needs {uneven.error.needed} ranks where the {uneven.error.mode_size} ranks of "
                f"{factors} remain"
            )
        etp = request.etp
        tp_note = "" if "tp" in request.pins or etp == 1 else f" (and tp = etp({etp}))"
        return (
            f"{pins} conflict at --world-size {request.world_size}: no assignment has "
            f"ep({request.ep}) * etp({etp}) = {request.ep * etp} dividing dp_shard * cp * "
            f"tp{tp_note}"
        )


def _expert_problems(degrees: dict[str, int]) -> list[Problem]:
    result = Analysis(degrees=dict(degrees))
    spec = rule_inputs(degrees)
    check_etp(spec, result)
    check_expert_borrow(spec, result)
    return result.problems


def _degrees(request: Request, factors: Factors) -> dict[str, int]:
    """Every degree of an assignment: its world factors, and ep and etp as requested."""
    return dict(zip(WORLD_FACTORS, factors, strict=True)) | request.expert_degrees


def _degrees_text(degrees: Mapping[str, int]) -> str:
    return " ".join(f"{name}={degrees[name]}" for name in WORLD_FACTORS)
