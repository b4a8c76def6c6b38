"""What the launcher says about this process: rank, world size, local rank, node size.

torchrun sets ``RANK WORLD_SIZE LOCAL_RANK LOCAL_WORLD_SIZE``; SLURM's ``srun`` sets
``SLURM_PROCID SLURM_NTASKS SLURM_LOCALID SLURM_NTASKS_PER_NODE``. With neither, the process
is a world of one.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from meshconf.core.errors import MeshconfError


class LaunchError(MeshconfError):
    """The launcher's environment is inconsistent or incomplete."""


@dataclass(frozen=True)
class Launch:
    rank: int
    world_size: int
    local_rank: int
    local_world_size: int | None  # None when the launcher does not say
    source: str  # "torchrun", "slurm", "none" or "simulated"


_TORCHRUN = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")
_SLURM = ("SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NTASKS_PER_NODE")


def _integer(environ: Mapping[str, str], name: str) -> int:
    text = environ[name]
    # SLURM_NTASKS_PER_NODE may read "8(x4)" on uniform allocations.
    match = re.fullmatch(r"\s*([0-9]+)(\(x[0-9]+\))?\s*", text)
    if match is None:
        raise LaunchError(f"environment variable {name}={text!r} is not a non-negative integer")
    return int(match.group(1))


def read_launch(environ: Mapping[str, str]) -> Launch:
    """Rank and sizes from torchrun's variables, else SLURM's, else a world of one."""
    for names, source in ((_TORCHRUN, "torchrun"), (_SLURM, "slurm")):
        present = [name for name in names[:2] if name in environ]
        if not present:
            continue
        missing = [name for name in names[:2] if name not in environ]
        if missing:
            raise LaunchError(
                f"{source} environment incomplete: {present[0]} is set but {missing[0]} is not"
            )
        rank, world_size = (_integer(environ, name) for name in names[:2])
        if world_size < 1 or not 0 <= rank < world_size:
            raise LaunchError(f"{source} says rank {rank} of world size {world_size}")
        local_world_size = _integer(environ, names[3]) if names[3] in environ else None
        if local_world_size == 0:
            raise LaunchError(f"{source} says {names[3]}=0: a node runs at least one process")
        local_rank = _integer(environ, names[2]) if names[2] in environ else None
        if local_rank is None:
            local_rank = rank if local_world_size is None else rank % local_world_size
        elif local_world_size is not None and local_rank >= local_world_size:
            raise LaunchError(
                f"{source} says local rank {local_rank} of {local_world_size} processes per "
                f"node ({names[2]}, {names[3]})"
            )
        return Launch(rank, world_size, local_rank, local_world_size, source)
    return Launch(0, 1, 0, 1, "none")
