"""Where each rank really is, level by level, and the check that the groups a config keeps
inside a level (``inside``) sit inside one of its units on the machine the job got.

A rank finds its unit of each level from ``MESHCONF_LEVEL_<NAME>`` (``MESHCONF_LEVEL_NVLINK
=rack07``, set by the launcher), else, for ``node``, from the host name and, for ``nvlink``
on an NVIDIA GPU, from NVML's fabric information (the cluster UUID and clique id that
``nvidia-smi -q`` shows; read through ``pynvml`` when it is installed). Every rank publishes
its units through the rendezvous store; each then reads those of the members of its own kept
groups, so a rank reads as many keys as its kept groups hold ranks, whatever the world size.
"""

from __future__ import annotations

import importlib
import json
import socket
from collections.abc import Callable, Mapping, Sequence

import torch

from meshconf.core.levels import (
    NODE,
    NVLINK,
    environment_name,
    plural_units,
    unit_article,
    unit_name,
)
from meshconf.model.config import MeshConfig
from meshconf.runtime.rendezvous import RankReasonError, Rendezvous, ranks_named

#: Longest unit name a rank publishes; a longer variable is refused.
MAX_UNIT_NAME = 256
_SHOWN_UNITS = 4


def nvlink_domain(device: torch.device) -> str | None:
    """The NVLink domain of ``device`` from NVML's fabric information (cluster UUID and
    clique id), or None: not a CUDA device, no ``pynvml``, no fabric (an NVLink domain of one
    node), or fabric registration not complete."""
    if device.type != "cuda":
        return None
    try:
        pynvml = importlib.import_module("pynvml")
        pynvml.nvmlInit()
    except Exception:
        return None
    try:
        index = device.index if device.index is not None else torch.cuda.current_device()
        handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        info = pynvml.nvmlDeviceGetGpuFabricInfo(handle)
        completed = info.state == pynvml.NVML_GPU_FABRIC_STATE_COMPLETED
        cluster = bytes(info.clusterUuid).hex()
        if not completed or not cluster.strip("0"):
            return None
        return f"{cluster}/{info.cliqueId}"
    except Exception:
        return None
    finally:
        pynvml.nvmlShutdown()


def locate(
    levels: Sequence[str], environ: Mapping[str, str], device: torch.device
) -> dict[str, str | None]:
    """This rank's unit of each level, None where nothing says.

    Raises:
        RankReasonError: a ``MESHCONF_LEVEL_*`` value longer than :data:`MAX_UNIT_NAME`.
    """
    found: dict[str, str | None] = {}
    for level in levels:
        name = environment_name(level)
        value = environ.get(name, "")
        if len(value) > MAX_UNIT_NAME:
            raise RankReasonError(
                f"{name} is {len(value):,} characters, more than the {MAX_UNIT_NAME} a unit's "
                "name may have"
            )
        if not value and level == NODE:
            value = socket.gethostname()
        elif not value and level == NVLINK:
            value = nvlink_domain(device) or ""
        found[level] = value or None
    return found


def kept_groups(config: MeshConfig, rank: int) -> list[tuple[str, str, str, list[int]]]:
    """(level, dim, domain, ranks) of every group of ``rank`` that ``inside`` keeps in a
    unit: each dim under the level ``inside`` names it at, in the first domain that has it."""
    groups = []
    layouts, sizes = config.layouts, config.dim_sizes
    for level in config.topology:
        for dim in dict.fromkeys((config.inside or {}).get(level.name, ())):
            domain = next((d for d, layout in layouts.items() if dim in layout.dim_names), None)
            if domain is not None and sizes[dim] > 1:
                ranks = layouts[domain].group(rank, dim).ranks()
                groups.append((level.name, dim, domain, ranks))
    return groups


def misplaced_group(
    config: MeshConfig,
    rank: int,
    units_of: Callable[[list[int]], list[dict[str, str | None]]],
) -> tuple[str | None, list[str]]:
    """The message for the first group of ``rank`` that spans two units of the level the
    config keeps it inside, or of a level above it (units nest, so a group inside a node is
    inside that node's NVLink domain too), or None; and a note for each group left unchecked
    at a level because some of its members know their unit there and others do not (said by
    the lowest member that knows; where no rank knows, rank 0 says it for itself).
    ``units_of`` gives the published units of some ranks. The message names the ``inside``
    key as written and the tightest level the group breaks."""
    groups = kept_groups(config, rank)
    members = sorted({member for *_, ranks in groups for member in ranks})
    units = dict(zip(members, units_of(members), strict=True))
    names = [level.name for level in config.topology]
    notes: list[str] = []
    for written, dim, domain, ranks in groups:
        for level in names[names.index(written) :]:
            where = [units[member].get(level) for member in ranks]
            unknown = [member for member, unit in zip(ranks, where, strict=True) if unit is None]
            known = [member for member in ranks if member not in unknown]
            if unknown and known and rank == known[0]:
                notes.append(
                    f"inside.{written}: {dim}'s group of {ranks_named(ranks)} was not checked "
                    f"at the {level} level on the machine: {ranks_named(unknown)} do not know "
                    f"their {unit_name(level)} (set {environment_name(level)} there)"
                )
            placed = {unit for unit in where if unit is not None}
            if len(placed) > 1:
                text = _misplaced_text(config, written, level, dim, domain, ranks, where)
                return text, notes
    return None, notes


def _misplaced_text(
    config: MeshConfig,
    written: str,
    level: str,
    dim: str,
    domain: str,
    ranks: list[int],
    where: list[str | None],
) -> str:
    by_unit: dict[str, list[int]] = {}
    for member, unit in zip(ranks, where, strict=True):
        if unit is not None:
            by_unit.setdefault(unit, []).append(member)
    held = "; ".join(
        f"{_shown(unit)} holds {ranks_named(held_ranks)}"
        for unit, held_ranks in list(by_unit.items())[:_SHOWN_UNITS]
    )
    size = next(item.size for item in config.topology if item.name == level)
    spread = f"{len(by_unit)} {plural_units(level)}"
    if level != written:
        spread += f", though {unit_article(written)} lies inside {unit_article(level)}"
    return (
        f"inside.{written}: the config keeps {dim} (domain {domain!r}) inside "
        f"{unit_article(written)}, but the launcher placed {dim}'s group of "
        f"{ranks_named(ranks)} in {spread}: {held}; start the ranks so that each "
        f"{unit_name(level)} holds {size} consecutive ranks (a hostfile ordered by {level}), or "
        f"set {environment_name(level)} to where each rank really is"
    )


def _shown(unit: str) -> str:
    """A unit's name as the launcher gave it, quoted; escaped where it is not printable
    ASCII, so that two names that print alike read apart."""
    return repr(unit) if unit.isascii() and unit.isprintable() else ascii(unit)


def publish_units(
    config: MeshConfig, rendezvous: Rendezvous, environ: Mapping[str, str], device: torch.device
) -> list[str]:
    """Publish this rank's units before it joins; the warnings for the kept levels whose
    unit it cannot tell.

    Raises:
        RankReasonError: as :func:`locate`.
    """
    try:
        units = locate([level.name for level in config.topology], environ, device)
    except RankReasonError as error:
        raise RankReasonError(f"rank {rendezvous.launch.rank}: {error}") from None
    rendezvous.store.set(f"where/{rendezvous.launch.rank}", json.dumps(units))
    return [
        f"inside.{level}: where this rank is in its {level} level is unknown (set "
        f"{environment_name(level)}), so the placement was not checked on the machine"
        for level, unit in units.items()
        if unit is None and level in (config.inside or {})
    ]


def check_placement(config: MeshConfig, rendezvous: Rendezvous) -> list[str]:
    """Once every rank has joined (and so published), check this rank's kept groups; the
    notes on groups left unchecked (:func:`misplaced_group`).

    Raises:
        RankReasonError: a kept group spans two units of its level; the message names it.
    """
    rank = rendezvous.launch.rank
    problem, notes = misplaced_group(
        config, rank, lambda ranks: _published_units(rendezvous, ranks)
    )
    if problem is not None:
        raise RankReasonError(f"rank {rank}: {problem}")
    return notes


def _published_units(rendezvous: Rendezvous, ranks: list[int]) -> list[dict[str, str | None]]:
    """The units ``ranks`` published, in two requests; a rank that published none (it loaded
    another config, which the fingerprints report) is where nothing is known."""
    keys = [f"where/{rank}" for rank in ranks]
    store = rendezvous.store
    if store.check(keys):
        return [json.loads(value) for value in store.multi_get(keys)]
    return [json.loads(store.get(key)) if store.check([key]) else {} for key in keys]
