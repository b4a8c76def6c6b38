"""Every valid assignment of the world factors for a plan request: nested loops over
divisors, the expert degrees a model with experts can take (unless pinned), meshconf's expert
rules and the model's own (``meshconf.features.plan.runnable``) asked once per distinct
input, and under an order other than the default, the even split of the expert dims."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, replace
from functools import cache
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
from meshconf.core.messages import either
from meshconf.features.plan.request import (
    MAX_ESTIMATED_ASSIGNMENTS,
    PlanError,
    Request,
    assignment_count,
    check_request,
    pins_text,
    rule_inputs,
)
from meshconf.features.plan.runnable import RULED_DEGREES, Unrunnable, ep_choices, unrunnable
from meshconf.model.analysis import Analysis
from meshconf.model.rules import check_etp, check_expert_borrow

#: An assignment of the world factors, in WORLD_FACTORS order (pp outermost).
Factors = tuple[int, ...]
#: The expert degrees of an assignment: ep and etp.
Experts = tuple[int, int]
#: Where the world factors that experts borrow sit in an assignment.
_LENT = tuple(index for index, name in enumerate(WORLD_FACTORS) if name in LENT_TO_EXPERTS)
#: The degrees a plan's pins may set.
_PINNABLE = WORLD_FACTORS + EXPERT_DEGREES
#: What the expert rules say of an assignment: valid, refused by the degree rules, or left
#: out because the order would split an expert dim unevenly.
_Verdict = Literal["valid", "refused", "uneven"]


def _assignments(request: Request) -> Iterator[Factors]:
    """Every tuple of world factors (in WORLD_FACTORS order) with product world_size that
    keeps the pins: nested loops over divisors, innermost factor (tp) outermost in the loops,
    and the outermost factor (pp) taking the ranks left."""
    world = divisors(request.world_size)
    pins = request.pins
    *outer, last = reversed(WORLD_FACTORS)

    @cache
    def divisors_of(number: int) -> list[int]:
        """The divisors of a divisor of the world, from the world's own."""
        return [d for d in world if d <= number and number % d == 0]

    def options(name: str, remaining: int) -> list[int]:
        pinned = pins.get(name)
        if pinned is None:
            return [1] if BY_NAME[name].planned_when_pinned else divisors_of(remaining)
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
    """The assignments of a request that pass meshconf's expert rules and, with a model, the
    model's own (:func:`~meshconf.features.plan.runnable.unrunnable`), as every degree; a
    model with experts is planned at every ep that divides its routed experts and etp 1 or
    tp, where not pinned.

    Each iteration counts afresh the assignments yielded (:attr:`seen`) and the ep and etp
    values they take (:attr:`tried`), those the order alone leaves out (:attr:`left_out`),
    and those the model cannot run, by reason (:attr:`unrunnable`, keeping for the message
    the example of the smallest degree at fault: pp 1 rather than pp 4096). The expert
    rules read only the factors experts borrow (dp_shard, cp and tp), and the even split
    under an order whether each other factor is 1 (a factor of one rank between two others
    lets their digits run on); so each distinct (dp_shard, cp, tp, pp > 1, dp_replicate > 1,
    ep, etp) is checked once, and the model's rules once per distinct (pp, cp, tp, ep, etp).
    """

    def __init__(self, request: Request) -> None:
        self._request = request
        model = request.model
        self._explored = model is not None and model.experts is not None
        self._experts = self._explored or any(name in request.pins for name in EXPERT_DEGREES)
        self._ep = (
            (request.pins["ep"],)
            if "ep" in request.pins
            else ep_choices(model)
            if model is not None and self._explored
            else (BY_NAME["ep"].default,)
        )
        self._answers: dict[tuple[int, ...], _Verdict] = {}
        self._problems: dict[tuple[int, ...], Unrunnable | None] = {}
        # set as its verdict is found; verdicts are cached, so a later iteration cannot find
        # it again and no iteration resets it
        self.uneven: UnevenSplit | None = None
        self._reset()

    def _reset(self) -> None:
        self.seen = 0
        self.left_out = 0
        self.unrunnable: Counter[str] = Counter()
        #: For each reason, the example and the value of its degree at fault.
        self._examples: dict[str, tuple[int, Unrunnable]] = {}
        self.tried: dict[str, set[int]] = {name: set() for name in EXPERT_DEGREES}

    def __iter__(self) -> Iterator[dict[str, int]]:
        self._reset()
        request = self._request
        for factors in _assignments(request):
            for experts in self._expert_options(factors):
                if self._experts and not self._allow(factors, experts):
                    continue
                degrees = _degrees(factors, experts)
                if request.model is not None:
                    problem = self._problem(degrees)
                    if problem is not None:
                        self.unrunnable[problem.reason] += 1
                        self._keep_example(problem, degrees[problem.degree])
                        continue
                self.seen += 1
                self.tried["ep"].add(experts[0])
                self.tried["etp"].add(experts[1])
                yield degrees

    def _keep_example(self, problem: Unrunnable, value: int) -> None:
        kept = self._examples.get(problem.reason)
        if kept is None or value < kept[0]:
            self._examples[problem.reason] = (value, problem)

    def count(self) -> int:
        """How many assignments iterating yields; the answers found are kept for the next."""
        return sum(1 for _ in self)

    @property
    def explored(self) -> tuple[str, ...]:
        """The expert degrees of a model with experts that are not pinned."""
        if not self._explored:
            return ()
        return tuple(name for name in EXPERT_DEGREES if name not in self._request.pins)

    def _expert_options(self, factors: Factors) -> list[Experts]:
        """The (ep, etp) pairs to try: as pinned, or the model's ep choices and etp 1 or tp."""
        pinned = self._request.pins.get("etp")
        if pinned is not None or not self._explored:
            etps: tuple[int, ...] = (BY_NAME["etp"].default if pinned is None else pinned,)
        else:
            tp = factors[WORLD_FACTORS.index("tp")]
            etps = (1,) if tp == 1 else (1, tp)
        return [(ep, etp) for ep in self._ep for etp in etps]

    def _allow(self, factors: Factors, experts: Experts) -> bool:
        key = (
            *(value if index in _LENT else value > 1 for index, value in enumerate(factors)),
            *experts,
        )
        verdict = self._answers.get(key)
        if verdict is None:
            verdict = self._answers[key] = self._verdict(factors, experts)
        if verdict == "uneven":
            self.left_out += 1
        return verdict == "valid"

    def _problem(self, degrees: dict[str, int]) -> Unrunnable | None:
        """The first reason the model cannot run the assignment, once per distinct input."""
        key = tuple(degrees[name] for name in RULED_DEGREES)
        if key not in self._problems:
            model = self._request.model
            assert model is not None
            found = unrunnable(model, degrees, self._request.training, self._request.world_size)
            self._problems[key] = found[0] if found else None
        return self._problems[key]

    def _verdict(self, factors: Factors, experts: Experts) -> _Verdict:
        if _expert_problems(_degrees(factors, experts)):
            return "refused"
        return "valid" if self._splits_evenly(factors, experts) else "uneven"

    def _splits_evenly(self, factors: Factors, experts: Experts) -> bool:
        """The default order numbers ranks by the logical index itself, one mode that any
        sizes split evenly; another order may keep apart world factors a dim must share."""
        order = self._request.rank_order
        if order == WORLD_FACTORS:
            return True
        degrees = _degrees(factors, experts)
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
        """Why none is left once the world-factor pins fit, by the expert rules, the order or
        the model's rules; with the values of each pin that would give rows."""
        request = self._request
        pins = pins_text(request, _PINNABLE)
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
        others = _alternatives(request)
        if self.unrunnable:
            assert request.model is not None
            example = (
                _pinned_problem(request) or self._examples[self.unrunnable.most_common(1)[0][0]][1]
            )
            why = f"{example.degree} {example.message}"
            offered = example.message.rpartition("; use ")[2]
            if others == f"; {example.degree} may be {offered}":
                others = ""  # the message offers the same values
            several = sum(1 for name in request.pins if name in _PINNABLE) > 1
            subject = f"{pins} leave{'' if several else 's'}" if pins else "the world leaves"
            return (
                f"{subject} no layout {request.model.name} can run at --world-size "
                f"{request.world_size}: {why}{others}"
            )
        ep, etp = request.pins.get("ep", 1), request.pins.get("etp", 1)
        tp_note = "" if "tp" in request.pins or etp == 1 else f" (and tp = etp({etp}))"
        return (
            f"{pins} conflict at --world-size {request.world_size}: no assignment has "
            f"ep({ep}) * etp({etp}) = {ep * etp} dividing dp_shard * cp * tp{tp_note}{others}"
        )


def _pinned_problem(request: Request) -> Unrunnable | None:
    """The first pin the model cannot run whatever the other degrees are: each rule reads its
    own degree, but etp's reads tp too, so etp counts only beside a pinned tp."""
    assert request.model is not None
    pins = dict(request.pins)
    found = unrunnable(request.model, pins, request.training, request.world_size)
    return next(
        (
            problem
            for problem in found
            if problem.degree in pins and (problem.degree != "etp" or "tp" in pins)
        ),
        None,
    )


def has_rows(request: Request) -> bool:
    """Whether the request passes its checks and some assignment passes every rule."""
    try:
        check_request(request)
    except PlanError:
        return False
    return next(iter(ValidAssignments(request)), None) is not None


def _alternatives(request: Request) -> str:
    """Each pin's values that would give rows with the other pins kept (``; with pp 16, ep
    may be 1, 2, 4 or 8``); none when trying each would list too many assignments."""
    pinned = [name for name in _PINNABLE if name in request.pins]
    if assignment_count(request) > MAX_ESTIMATED_ASSIGNMENTS:
        return ""
    found = []
    for name in pinned:
        if name == "ep" and request.model is not None and request.model.experts is not None:
            candidates = ep_choices(request.model)
        else:
            candidates = tuple(divisors(request.world_size))
        values = [
            value
            for value in candidates
            if value != request.pins[name]
            and has_rows(replace(request, pins={**request.pins, name: value}))
        ]
        kept = ", ".join(f"{other} {request.pins[other]}" for other in pinned if other != name)
        if values:
            found.append(f"{f'with {kept}, ' if kept else ''}{name} may be {either(values)}")
    return "".join(f"; {text}" for text in found)


def _expert_problems(degrees: dict[str, int]) -> list[Problem]:
    result = Analysis(degrees=dict(degrees))
    spec = rule_inputs(degrees)
    check_etp(spec, result)
    check_expert_borrow(spec, result)
    return result.problems


def _degrees(factors: Factors, experts: Experts) -> dict[str, int]:
    """Every degree of an assignment: its world factors, and ep and etp."""
    degrees = dict(zip(WORLD_FACTORS, factors, strict=True))
    degrees["ep"], degrees["etp"] = experts
    return degrees


def _degrees_text(degrees: Mapping[str, int]) -> str:
    return " ".join(f"{name}={degrees[name]}" for name in WORLD_FACTORS)
