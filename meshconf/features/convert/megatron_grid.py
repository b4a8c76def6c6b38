"""Megatron-LM's rank grids as modes, the checks Megatron makes on them at start-up, and its
groups set beside the meshconf dims that hold the same ranks.

Megatron numbers ranks row-major over its sizes in an order string read inner to outer
(``tp-cp-ep-dp-pp``: tp varies fastest); a name missing from the string sits outside the
others. Dense layers use the sizes tp, cp, dp, pp (ep 1); expert layers a second grid in the
same order with expert tp, ep, expert dp and pp (cp 1). A group over some names holds the
ranks that differ only in those digits, so it is a tuple of modes, and two groups hold the
same ranks for every rank exactly when their modes are equal after
:func:`~meshconf.core.layout.group_identity`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from meshconf.core.hierarchy import order_strides
from meshconf.core.layout import DomainLayout, Mode, group_identity
from meshconf.features.convert.draft import Draft

#: Every name Megatron's order strings use.
TOKENS = ("tp", "cp", "ep", "dp", "pp")
DEFAULT_ORDER = "tp-cp-ep-dp-pp"
#: ``--use-tp-pp-dp-mapping``: pipeline stages inside data parallelism.
TP_PP_DP_ORDER = "tp-cp-ep-pp-dp"


def full_order(order: str) -> tuple[str, ...]:
    """The order's names inner to outer, the missing ones appended outside, as Megatron
    does (it refuses a missing name of size above 1 instead; the caller checks that)."""
    written = tuple(order.lower().split("-"))
    return written + tuple(name for name in TOKENS if name not in written)


@dataclass(frozen=True)
class Grid:
    """One of Megatron's rank grids: a size per name, and the order inner to outer."""

    sizes: Mapping[str, int]
    order: tuple[str, ...]

    def modes(self, names: Sequence[str]) -> tuple[Mode, ...]:
        """The modes of the group over ``names``, listed as Megatron lists its ranks: the
        name that comes first in the order varies fastest, so it is the last mode. Names of
        size 1 have no mode."""
        strides = order_strides(self.sizes, tuple(reversed(self.order)))
        inner_first = [name for name in self.order if name in names and self.sizes[name] > 1]
        return tuple(Mode(self.sizes[name], strides[name]) for name in reversed(inner_first))


def inner_part(modes: Sequence[Mode], size: int) -> tuple[Mode, ...] | None:
    """The modes of the first ``size`` ranks of each group as Megatron lists them (its
    distributed-optimizer instances cut the data-parallel list into consecutive parts), or
    None when those ranks are not a sub-grid."""
    taken: list[Mode] = []
    remaining = size
    for mode in reversed(modes):
        if remaining == 1:
            break
        if remaining % mode.size == 0:
            taken.append(mode)
            remaining //= mode.size
        elif mode.size % remaining == 0:
            taken.append(Mode(remaining, mode.stride))
            remaining = 1
        else:
            return None
    return tuple(reversed(taken)) if remaining == 1 else None


def outer_part(modes: Sequence[Mode], inner: Sequence[Mode]) -> tuple[Mode, ...]:
    """The modes left of a group once its inner part is taken out."""
    remaining = {mode.stride: mode.size for mode in modes}
    left = dict(remaining)
    for mode in inner:
        whole = remaining[mode.stride]
        del left[mode.stride]
        if mode.size < whole:
            left[mode.stride * mode.size] = whole // mode.size
    return tuple(Mode(size, stride) for stride, size in sorted(left.items(), reverse=True))


@dataclass(frozen=True)
class Pairing:
    """A Megatron group and the meshconf dims that must hold the same ranks."""

    megatron: str
    modes: tuple[Mode, ...]
    domain: str
    dims: tuple[str, ...]

    def meshconf_modes(self, layouts: Mapping[str, DomainLayout]) -> tuple[Mode, ...]:
        layout = layouts[self.domain]
        return tuple(mode for dim in self.dims for mode in layout.dim(dim).modes)

    def holds(self, layouts: Mapping[str, DomainLayout]) -> bool:
        return group_identity(self.meshconf_modes(layouts)) == group_identity(self.modes)


def pairings(dense: Grid, expert: Grid, instances: int) -> list[Pairing] | str:
    """Every Megatron group beside its meshconf dims, or why an optimizer instance of
    Megatron's is not a sub-grid."""
    found = [
        Pairing("tp", dense.modes(["tp"]), "dense", ("tp",)),
        Pairing("cp", dense.modes(["cp"]), "dataloading", ("cp",)),
        Pairing("pp", dense.modes(["pp"]), "dense", ("pp",)),
        Pairing("dp", dense.modes(["dp"]), "dataloading", ("batch",)),
        Pairing("dp-cp", dense.modes(["dp", "cp"]), "loss", ("loss",)),
        Pairing("ep", expert.modes(["ep"]), "sparse", ("ep",)),
        Pairing("expert-tp", expert.modes(["tp"]), "sparse", ("etp",)),
        Pairing("expert-dp", expert.modes(["dp"]), "sparse", ("dp_replicate", "efsdp")),
    ]
    if instances == 1:
        return found
    for grid, names, pair, label in (
        (dense, ["dp", "cp"], ("dense", "fsdp"), "dp-cp"),
        (expert, ["dp"], ("sparse", "efsdp"), "expert-dp"),
    ):
        modes = grid.modes(names)
        size = grid.sizes["dp"] * grid.sizes["cp"] // instances
        inner = inner_part(modes, size)
        if inner is None:
            return (
                f"each of the {instances} optimizer instances takes {size} consecutive ranks "
                f"of Megatron's {label} group, which are not a grid"
            )
        found.append(Pairing(f"intra-instance {label}", inner, pair[0], (pair[1],)))
        found.append(
            Pairing(f"inter-instance {label}", outer_part(modes, inner), pair[0], ("dp_replicate",))
        )
    return found


def checked_grids(
    draft: Draft, keys: Mapping[str, str], sizes: Mapping[str, int], world: int, order: str
) -> tuple[Grid, Grid] | None:
    """Megatron's own checks at start-up; its two grids when they pass."""
    tp, pp = sizes["tensor_model_parallel_size"], sizes["pipeline_model_parallel_size"]
    cp = sizes["context_parallel_size"]
    ep, etp = sizes["expert_model_parallel_size"], sizes["expert_tensor_parallel_size"]
    instances = sizes["num_distributed_optimizer_instances"]
    model = tp * pp * cp
    if world % model:
        draft.fail(
            keys.get("tensor_model_parallel_size"),
            f"world size {world} is not divisible by tp({tp}) * pp({pp}) * cp({cp}) = {model}",
        )
        return None
    dp = world // model
    if dp % instances:
        draft.fail(
            keys.get("num_distributed_optimizer_instances"),
            f"{instances} instances must "
            f"divide the data-parallel size {dp} = world size {world} / {model}",
        )
    if world % (etp * ep * pp):
        draft.fail(
            keys.get("expert_model_parallel_size"),
            f"world size {world} is not divisible "
            f"by expert tp({etp}) * ep({ep}) * pp({pp}) = {etp * ep * pp}",
        )
    if draft.problems:
        return None
    names = full_order(order)
    dense = Grid({"tp": tp, "cp": cp, "ep": 1, "dp": dp, "pp": pp}, names)
    expert_dp = world // (etp * ep * pp)
    expert = Grid({"tp": etp, "cp": 1, "ep": ep, "dp": expert_dp, "pp": pp}, names)
    # Megatron's two assertions, in its order and with its reasons.
    if not order.endswith("pp") and pp > 1 and expert_dp != dp:
        draft.fail(
            keys.get("order"),
            f"Megatron refuses this: with order {order}, which does not end with pp, the expert "
            f"data-parallel size (world {world} / (expert tp({etp}) * ep({ep}) * pp({pp})) = "
            f"{expert_dp}) must equal the data-parallel size ({dp})",
        )
        return None
    if group_identity(dense.modes(["pp"])) != group_identity(expert.modes(["pp"])):
        draft.fail(
            keys.get("order"),
            f"Megatron refuses this: with order {order}, the expert layers' pipeline groups "
            "differ from the dense layers'",
        )
        return None
    if expert_dp % instances:
        draft.fail(
            keys.get("num_distributed_optimizer_instances"),
            f"{instances} instances must divide the expert data-parallel size {expert_dp}",
        )
        return None
    return dense, expert
