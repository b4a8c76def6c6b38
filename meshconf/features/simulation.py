"""What simulating a world costs, known before torch is loaded: the largest world, the work one
command may ask for, and the memory a world's meshes take beside what this process has left.

A simulated rank builds torch's DeviceMeshes and process groups, and each of them holds every
rank of the world: the default group maps every rank to its group rank, and each mesh holds
the world's rank map. Time and memory therefore grow with the world, and time also with the
number of ranks simulated one after the other (each rank's meshes are freed before the next).
``benchmarks/simulate_scale.py`` measures both; docs/performance.md has its table.
"""

from __future__ import annotations

from meshconf.core.errors import MeshconfError
from meshconf.sources.host_memory import headroom

#: The largest world a simulation builds: about 1.5 GiB at its peak.
MAX_SIMULATED_WORLD = 1 << 22

#: Memory one rank of the world costs while a rank's meshes are built and checked, measured as
#: peak resident memory over that of a world of 16 by ``benchmarks/simulate_scale.py``: 308 to
#: 329 bytes for the examples at 2**20 and 2**22 on torch 2.13.0 (docs/performance.md). The
#: figure is the top of that range with some 15% to spare, so that a refusal errs on the side
#: of the machine.
BYTES_PER_SIMULATED_RANK = 384

#: A simulated rank's set-up (its default group, its groups and meshes, the check) costs at
#: least as much time as a world of this many ranks, whatever the world: about 20 ms.
RANK_SET_UP_COST = 1 << 14

#: The work one ``meshconf simulate`` builds, in ranks of the world times ranks simulated:
#: about a second of CPU for each million, so 16 ranks of 2**20 or 4 of 2**22.
MAX_SIMULATED_WORK = 1 << 24


def mesh_bytes(world_size: int) -> int:
    """The memory the meshes and groups of one simulated rank of ``world_size`` take, beyond
    torch itself."""
    return world_size * BYTES_PER_SIMULATED_RANK


def mebibytes(size: int) -> str:
    """``size`` bytes in MiB, rounded up: ``385 MiB``."""
    return f"{-(-size // (1 << 20))} MiB"


#: Where a world too large to simulate is still checked, as the command line says it.
_INSTEAD = "`meshconf show` checks the layout of any world size"


def check_world_size(world_size: int, *, instead: str = _INSTEAD) -> None:
    """Refuses a world larger than :data:`MAX_SIMULATED_WORLD`; ``instead`` ends the message
    with what checks such a world.

    Raises:
        MeshconfError: the message names the limit and the world.
    """
    if world_size > MAX_SIMULATED_WORLD:
        raise MeshconfError(
            f"simulate builds worlds of up to {MAX_SIMULATED_WORLD} ranks, and this one has "
            f"{world_size}: torch's meshes and groups hold every rank, about "
            f"{BYTES_PER_SIMULATED_RANK} bytes each; {instead}"
        )


def check_simulation_size(world_size: int, rank_count: int) -> None:
    """Refuses a world larger than :data:`MAX_SIMULATED_WORLD`, or more ranks of it than
    :data:`MAX_SIMULATED_WORK` allows.

    Raises:
        MeshconfError: the message names the limit and the figures of this request.
    """
    check_world_size(world_size)
    cost_per_rank = max(world_size, RANK_SET_UP_COST)
    if rank_count * cost_per_rank > MAX_SIMULATED_WORK:
        most = max(1, MAX_SIMULATED_WORK // cost_per_rank)
        raise MeshconfError(
            f"{rank_count} ranks of a world of {world_size} are more than one simulate builds: "
            f"each rank builds meshes over the whole world, and one command builds at most "
            f"{most} rank{'s' if most > 1 else ''} of this world; simulate fewer ranks at once"
        )


def check_simulation_memory(world_size: int) -> int:
    """The memory a simulated rank of ``world_size`` needs beyond what this process holds now
    (torch loaded), after checking that it is there.

    Raises:
        MeshconfError: the need, and the bound it exceeds, in MiB.
    """
    need = mesh_bytes(world_size)
    room = headroom()
    if room is not None and need > room.size:
        raise MeshconfError(
            f"a simulated rank of a world of {world_size} needs about {mebibytes(need)} for "
            f"its meshes and groups, and {room.bound} {mebibytes(room.size)}; {_INSTEAD}"
        )
    return need
