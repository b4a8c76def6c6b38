"""What the launcher says about this process: rank, world size, local rank, node size.

torchrun sets ``RANK WORLD_SIZE LOCAL_RANK LOCAL_WORLD_SIZE``; SLURM's ``srun`` sets
``SLURM_PROCID SLURM_NTASKS SLURM_LOCALID SLURM_NTASKS_PER_NODE``. With neither, the process
is a world of one. Every value is checked before anything connects: ASCII digits, at most
as large as torch numbers ranks, consistent with the others; a message names the rank when
the launcher gave a usable one.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from meshconf.core.degrees import MAX_WORLD_SIZE
from meshconf.core.errors import MeshconfError


@dataclass(frozen=True)
class Launch:
    rank: int
    world_size: int
    local_rank: int
    local_world_size: int | None  # None when the launcher does not say
    source: str  # "torchrun", "slurm", "none" or "simulated"


_TORCHRUN = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")
_SLURM = ("SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NTASKS_PER_NODE")
# SLURM_NTASKS_PER_NODE may read "8(x4)" on uniform allocations.
_COUNT = re.compile(r"\s*([0-9]+)(\(x[0-9]+\))?\s*")


def _shown(text: str) -> str:
    return text if len(text) <= 20 else f"{text[:17]}... ({len(text):,} characters)"


def _integer(environ: Mapping[str, str], name: str, who: str) -> int:
    """The value of ``name``: ASCII digits, at most ``MAX_WORLD_SIZE``."""
    text = environ[name]
    match = _COUNT.fullmatch(text)
    if match is None or len(match[1]) > len(str(MAX_WORLD_SIZE)):
        raise MeshconfError(
            f"{who} has {name}={_shown(text)}, which is not an integer from 0 to {MAX_WORLD_SIZE}"
        )
    value = int(match[1])
    if value > MAX_WORLD_SIZE:
        raise MeshconfError(f"{who} has {name}={value}, more than torch numbers ({MAX_WORLD_SIZE})")
    return value


def stated_rank(environ: Mapping[str, str]) -> int | None:
    """The rank the launcher's variables give (torchrun's, else SLURM's), when it reads as a
    rank even though another variable is wrong; None otherwise. Names a rank in a message."""
    for rank_name in (_TORCHRUN[0], _SLURM[0]):
        if rank_name in environ:
            try:
                return _integer(environ, rank_name, "a rank")
            except MeshconfError:
                return None
    return None


def read_launch(environ: Mapping[str, str]) -> Launch:
    """Rank and sizes from torchrun's variables, else SLURM's, else a world of one.

    Raises:
        MeshconfError: a variable is missing, is not a number, or disagrees with another.
    """
    for names, source in ((_TORCHRUN, "torchrun"), (_SLURM, "slurm")):
        rank_name, world_name, local_name, local_size_name = names
        present = [name for name in (rank_name, world_name) if name in environ]
        if not present:
            continue
        missing = [name for name in (rank_name, world_name) if name not in environ]
        if missing:
            raise MeshconfError(
                f"{source} environment incomplete: {present[0]} is set but {missing[0]} is not"
            )
        rank = _integer(environ, rank_name, "a rank")
        world_size = _integer(environ, world_name, f"rank {rank}")
        if world_size < 1 or rank >= world_size:
            raise MeshconfError(
                f"a rank has {rank_name}={rank}, outside {world_name}={world_size} ({source})"
            )
        who = f"rank {rank}"
        local_world_size = None
        if local_size_name in environ:
            local_world_size = _integer(environ, local_size_name, who)
            if local_world_size == 0:
                raise MeshconfError(
                    f"{who} has {local_size_name}=0 ({source}): a node runs at least one process"
                )
        if local_name not in environ:
            local_rank = rank if local_world_size is None else rank % local_world_size
        else:
            local_rank = _integer(environ, local_name, who)
            if local_world_size is not None and local_rank >= local_world_size:
                raise MeshconfError(
                    f"{who} has {local_name}={local_rank}, outside "
                    f"{local_size_name}={local_world_size} ({source})"
                )
        return Launch(rank, world_size, local_rank, local_world_size, source)
    return Launch(0, 1, 0, 1, "none")
