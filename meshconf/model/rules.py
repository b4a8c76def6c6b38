"""Every formula rule of a mesh configuration, each a function of its own.

The rules work on plain values (:class:`MeshSpec`), know nothing of pydantic or files, and
report :class:`~meshconf.core.errors.Problem` objects placed on the key they concern, with the
arithmetic written out. A rule that needs the world size while none is known is not run;
its description goes to :attr:`Analysis.pending` instead.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from meshconf.core import formulas
from meshconf.core.degrees import (
    AUTO,
    DEGREE_NAMES,
    MAX_WORLD_SIZE,
    WORLD_FACTORS,
    auto_factor,
    divisors,
    product_text,
    world_product,
)
from meshconf.core.errors import KeyPath
from meshconf.core.layout import DomainLayout, Mode, UnevenSplitError, canonical_modes
from meshconf.core.messages import did_you_mean, name_list, shorten
from meshconf.model.analysis import Analysis, MeshSpec
from meshconf.model.level_rules import check_inside, check_levels
from meshconf.model.numbering import (
    check_inside_node,
    check_order,
    describe_split,
    numbering,
    placement_keys,
)


def check_single_auto(spec: MeshSpec, result: Analysis) -> None:
    """At most one world factor may be -1."""
    autos = [name for name in WORLD_FACTORS if spec.degrees[name] == AUTO]
    quantifier = "both" if len(autos) == 2 else "all"
    for name in autos[1:]:
        result.fail(
            ("degrees", name),
            f"only one degree may be -1 (fill the remaining ranks), but {' and '.join(autos)} "
            f"{quantifier} are",
        )


def resolve_world(spec: MeshSpec, result: Analysis) -> None:
    """World factors multiply to world_size; a -1 factor is whatever divides out exactly."""
    degrees = dict(spec.degrees)
    auto = auto_factor(degrees)
    if spec.world_size is None:
        if auto is None:
            implied = world_product(degrees)
            if implied > MAX_WORLD_SIZE:
                result.fail(
                    ("degrees",),
                    f"{product_text(degrees, WORLD_FACTORS)} = {implied} is more ranks than "
                    f"torch can number ({MAX_WORLD_SIZE})",
                )
                return
            result.world_size, result.world_size_from_degrees = implied, True
            result.degrees = degrees
        else:
            result.waiting_for_world = True
            result.wait(f"degrees.{auto}: fill -1 from world_size")
        return
    result.world_size = spec.world_size
    if auto is None:
        product = world_product(degrees)
        if product != spec.world_size:
            explicit = [name for name in WORLD_FACTORS if name in spec.explicit_degrees]
            path: KeyPath = ("degrees", explicit[-1]) if explicit else ("world_size",)
            result.fail(
                path,
                f"{product_text(degrees, WORLD_FACTORS)} = {product} "
                f"!= world_size {spec.world_size}",
            )
            return
    else:
        others = tuple(name for name in WORLD_FACTORS if name != auto)
        divisor = math.prod(degrees[name] for name in others)
        if spec.world_size % divisor:
            arithmetic = (
                f"world_size {spec.world_size} is not divisible by "
                f"{product_text(degrees, others)} = {divisor}"
            )
            if auto in spec.explicit_degrees:
                result.fail(("degrees", auto), f"-1 cannot fill the remaining ranks: {arithmetic}")
            else:
                result.fail(*_misfit(spec.world_size, degrees, others, spec, auto, arithmetic))
            return
        degrees[auto] = spec.world_size // divisor
    result.degrees = degrees


def _misfit(
    world_size: int,
    degrees: Mapping[str, int],
    others: tuple[str, ...],
    spec: MeshSpec,
    auto: str,
    arithmetic: str,
) -> tuple[KeyPath, str]:
    """Where to report a -1 that the user did not write and cannot fill: on the degree they
    wrote that does not fit (the last one whose change alone would), with the values it
    could take instead."""
    written = [name for name in others if name in spec.explicit_degrees and degrees[name] > 1]
    fits = [
        name
        for name in written
        if world_size % math.prod(degrees[other] for other in others if other != name) == 0
    ]
    if not fits:
        path: KeyPath = ("degrees", written[-1]) if written else ("degrees", auto)
        return path, f"-1 cannot fill the remaining ranks ({auto} defaults to -1): {arithmetic}"
    name = fits[-1]
    rest = world_size // math.prod(degrees[other] for other in others if other != name)
    values = [str(value) for value in divisors(rest)]
    return (
        ("degrees", name),
        f"{name}({degrees[name]}) leaves no whole number of ranks for {auto} (-1 by default): "
        f"{arithmetic}; {name} could be one of {name_list(values)} (the divisors of {rest})",
    )


def check_etp(spec: MeshSpec, result: Analysis) -> None:
    """Expert tensor parallelism is either off or the same as tp."""
    etp = spec.degrees["etp"]
    tp = result.degrees["tp"] if result.degrees else spec.degrees["tp"]
    if tp == AUTO:
        if etp != 1:
            result.wait("degrees.etp: etp is 1 or tp")
        return
    if etp not in (1, tp):
        result.fail(("degrees", "etp"), f"etp({etp}) must be 1 or equal to tp({tp})")


def check_expert_borrow(spec: MeshSpec, result: Analysis) -> None:
    """Experts borrow their ranks from dp_shard * cp * tp: ep * etp must divide it."""
    if result.degrees is None:
        if spec.degrees["ep"] * spec.degrees["etp"] > 1:
            result.wait("degrees.ep: ep * etp divides dp_shard * cp * tp")
        return
    degrees = result.degrees
    borrowed = degrees["ep"] * degrees["etp"]
    lender = degrees["dp_shard"] * degrees["cp"] * degrees["tp"]
    if lender % borrowed:
        result.fail(
            ("degrees", "ep"),
            f"ep({degrees['ep']}) * etp({degrees['etp']}) = {borrowed} must divide "
            f"dp_shard({degrees['dp_shard']}) * cp({degrees['cp']}) * tp({degrees['tp']}) "
            f"= {lender}: experts borrow their ranks from those dims",
        )


def check_derived(spec: MeshSpec, result: Analysis) -> None:
    """Derived dims: a name of their own, a formula over degrees and earlier derived dims,
    exact division, and a size >= 1."""
    known: dict[str, int] = (
        dict(result.degrees)
        if result.degrees
        else {name: value for name, value in spec.degrees.items() if value != AUTO}
    )
    defined: set[str] = set(DEGREE_NAMES)
    ordered_names = list(DEGREE_NAMES) + list(spec.derived)
    all_names = set(ordered_names)
    for name, formula_text in spec.derived.items():
        path: KeyPath = ("derived", name)
        text = shorten(formula_text, 60)
        is_user = name in spec.user_derived
        if name in DEGREE_NAMES:
            result.fail(path, f"{name!r} is a degree; a derived dim needs a name of its own")
            continue
        try:
            expr = formulas.parse(formula_text)
        except formulas.FormulaError as error:
            result.fail(path, f"{text!r}: {error}")
            continue
        usable = True
        for used in dict.fromkeys(formulas.names(expr)):
            if used == name:
                result.fail(path, f"{text!r} uses {name!r} itself")
                usable = False
            elif used in all_names and used not in defined:
                result.fail(
                    path,
                    f"{text!r} uses {used!r}, which is defined after {name!r}; a formula may "
                    "use degrees and derived dims defined before it",
                )
                usable = False
            elif used not in all_names:
                detail = ""
                if not result.brief:
                    listed = [n for n in dict.fromkeys(ordered_names) if n in defined]
                    detail = (
                        f"{did_you_mean(used, ordered_names)}; a formula may use the degrees "
                        f"and the derived dims defined before it: {name_list(listed)}"
                    )
                result.fail(path, f"{text!r} uses unknown name {used!r}{detail}")
                usable = False
        defined.add(name)
        if not usable:
            continue
        if any(used not in known for used in formulas.names(expr)):
            if is_user:
                result.wait(f"derived.{name}: {text} needs the -1 degree filled in")
            continue
        try:
            value = formulas.evaluate(expr, known)
        except formulas.FormulaError as error:
            # A default formula can only fail when a degree rule already failed.
            if is_user:
                result.fail(path, f"{formulas.render(expr, known)}: {error}")
            continue
        if not 1 <= value <= MAX_WORLD_SIZE:
            bound = "must be >= 1" if value < 1 else f"must be <= {MAX_WORLD_SIZE}"
            rendered = shorten(formulas.render(expr, known), 200)
            result.fail(path, f"{rendered} = {value}; a dim size {bound}")
            continue
        known[name] = value
    result.sizes = known


def check_domain_dims(spec: MeshSpec, result: Analysis) -> None:
    """Each domain lists known dims, each once."""
    candidates = list(DEGREE_NAMES) + [n for n in spec.derived if n not in DEGREE_NAMES]
    known = set(candidates)
    for domain, dims in spec.domains.items():
        if not dims:
            result.fail(("domains", domain), "a domain needs at least one dim")
        seen: set[str] = set()
        for index, dim in enumerate(dims):
            path: KeyPath = ("domains", domain, index)
            if dim not in known:
                detail = (
                    ""
                    if result.brief
                    else f"{did_you_mean(dim, candidates)}; dims are the degrees and the derived "
                    f"dims: {name_list(candidates)}"
                )
                result.fail(path, f"unknown dim {dim!r}{detail}")
            elif dim in seen:
                result.fail(path, f"{dim!r} appears twice in domain {domain!r}")
            seen.add(dim)


def check_domain_products(spec: MeshSpec, result: Analysis) -> None:
    """The dims of every domain multiply to world_size; then the domain has a layout."""
    for domain, dims in spec.domains.items():
        if not dims or len(set(dims)) != len(dims):
            continue  # already reported by check_domain_dims
        if result.degrees is None or any(dim not in result.sizes for dim in dims):
            result.wait(f"domains.{domain}: product of dims == world_size")
            continue
        assert result.world_size is not None
        product = math.prod(result.sizes[dim] for dim in dims)
        if product != result.world_size:
            written = " * ".join(f"{dim}({result.sizes[dim]})" for dim in dims)
            default = "" if spec.user_domains else " (default domain)"
            result.fail(
                ("domains", domain),
                f"{written} = {product} != world_size {result.world_size}{default}",
            )
            continue
        sizes = [(dim, result.sizes[dim]) for dim in dims]
        ranks = numbering(spec, result)
        if ranks is None:
            continue
        try:
            result.layouts[domain] = DomainLayout.unflatten(domain, sizes, ranks)
        except UnevenSplitError as error:
            result.fail(
                ("domains", domain, dims.index(error.dim))
                if spec.user_domains
                else ("inside_node",)
                if spec.inside_node is not None
                else ("inside",)
                if spec.inside
                else ("order",),
                f"{error.dim}({error.dim_size}) in domain {domain!r} would split "
                f"{describe_split(result, error.mode_indices)} unevenly: it needs "
                f"{error.needed} ranks where {error.mode_size} remain; a dim must take whole "
                f"parts or an even share of one, so change {placement_keys(spec)} or the size "
                f"of {error.dim}",
            )


def _describe(modes: tuple[Mode, ...]) -> str:
    if not modes:
        return "size 1"
    return " and ".join(f"size {mode.size} stride {mode.stride}" for mode in modes)


def check_cross_domain(spec: MeshSpec, result: Analysis) -> None:
    """A dim name used in several domains denotes the same rank groups in each."""
    if result.world_size is None:
        if len(spec.domains) > 1:
            result.wait("domains: shared dims denote the same rank groups")
        return
    first_seen: dict[str, tuple[str, tuple[Mode, ...]]] = {}
    for domain, layout in result.layouts.items():
        for index, dim in enumerate(layout.dims):
            modes = canonical_modes(dim.modes)
            if dim.name not in first_seen:
                first_seen[dim.name] = (domain, modes)
                continue
            other_domain, other_modes = first_seen[dim.name]
            if modes != other_modes:
                result.fail(
                    ("domains", domain, index),
                    f"{dim.name!r} has {_describe(modes)} here but {_describe(other_modes)} in "
                    f"domain {other_domain!r}; a dim must denote the same rank groups in "
                    "every domain",
                )


RULES = (
    check_single_auto,
    resolve_world,
    check_etp,
    check_expert_borrow,
    check_order,
    check_levels,
    check_inside_node,
    check_derived,
    check_domain_dims,
    check_inside,
    check_domain_products,
    check_cross_domain,
)


def analyze(spec: MeshSpec) -> Analysis:
    """Run every rule; stop after the degree rules if those already failed."""
    result = Analysis()
    check_single_auto(spec, result)
    if result.problems:
        return result
    for rule in RULES[1:]:
        rule(spec, result)
    return result
