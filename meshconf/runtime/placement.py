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

from meshconf.core.levels import NODE, NVLINK, environment_name, unit_article
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
    unit: each kept dim in the first domain that has it, and the dims kept inside a level
    below too, since units nest."""
    groups = []
    kept: list[str] = []
    layouts, sizes = config.layouts, config.dim_sizes
    for level in config.topology:
        kept += (config.inside or {}).get(level.name, ())
        for dim in dict.fromkeys(kept):
            domain = next((d for d, layout in layouts.items() if dim in layout.dim_names), None)
            if domain is not None and sizes[dim] > 1:
                ranks = layouts[domain].group(rank, dim).ranks()
                groups.append((level.name, dim, domain, ranks))
    return groups


def misplaced_group(
    config: MeshConfig,
    rank: int,
    units_of: Callable[[list[int]], list[dict[str, str | None]]],
) -> str | None:
    """The message for the first group of ``rank`` that spans two units of a level the config
    keeps it inside, or None; ``units_of`` gives the published units of some ranks."""
    groups = kept_groups(config, rank)
    members = sorted({member for *_, ranks in groups for member in ranks})
    units = dict(zip(members, units_of(members), strict=True))
    for level, dim, domain, ranks in groups:
        where = [units[member].get(level) for member in ranks]
        if None in where or len(set(where)) == 1:
            continue
        by_unit: dict[str, list[int]] = {}
        for member, unit in zip(ranks, where, strict=True):
            assert unit is not None
            by_unit.setdefault(unit, []).append(member)
        held = "; ".join(
            f"{unit!r} holds {ranks_named(held_ranks)}"
            for unit, held_ranks in list(by_unit.items())[:_SHOWN_UNITS]
        )
        size = next(item.size for item in config.topology if item.name == level)
        return (
            f"inside.{level}: the config keeps {dim} (domain {domain!r}) inside "
            f"{unit_article(level)}, but the launcher placed {dim}'s group of "
            f"{ranks_named(ranks)} in {len(by_unit)} of them: {held}; start the ranks so that "
            f"each {level} unit holds {size} consecutive ranks (a hostfile ordered by {level}), "
            f"or set {environment_name(level)} to where each rank really is"
        )
    return None


def publish_units(
    config: MeshConfig, rendezvous: Rendezvous, environ: Mapping[str, str], device: torch.device
) -> list[str]:
    """Publish this rank's units before it joins; the warnings for the kept levels whose
    unit it cannot tell.

    Raises:
        RankReasonError: as :func:`locate`.
    """
    units = locate([level.name for level in config.topology], environ, device)
    rendezvous.store.set(f"where/{rendezvous.launch.rank}", json.dumps(units))
    return [
        f"inside.{level}: where this rank is in its {level} level is unknown (set "
        f"{environment_name(level)}), so the placement was not checked on the machine"
        for level, unit in units.items()
        if unit is None and level in (config.inside or {})
    ]


def check_placement(config: MeshConfig, rendezvous: Rendezvous) -> None:
    """Once every rank has joined (and so published), check this rank's kept groups.

    Raises:
        RankReasonError: a kept group spans two units of its level; the message names it.
    """
    rank = rendezvous.launch.rank
    problem = misplaced_group(config, rank, lambda ranks: _published_units(rendezvous, ranks))
    if problem is not None:
        raise RankReasonError(f"rank {rank}: {problem}")


def _published_units(rendezvous: Rendezvous, ranks: list[int]) -> list[dict[str, str | None]]:
    """The units ``ranks`` published, in two requests; a rank that published none (it loaded
    another config, which the fingerprints report) is where nothing is known."""
    keys = [f"where/{rank}" for rank in ranks]
    store = rendezvous.store
    if store.check(keys):
        return [json.loads(value) for value in store.multi_get(keys)]
    return [json.loads(store.get(key)) if store.check([key]) else {} for key in keys]
