"""What simulating a world costs, known before torch is loaded: the largest world, the work one
command may ask for, the memory a world's meshes take, and the memory this process has left.

A simulated rank builds torch's DeviceMeshes and process groups, and each of them holds every
rank of the world: the default group maps every rank to its group rank, and each mesh holds
the world's rank map. Time and memory therefore grow with the world, and time also with the
number of ranks simulated one after the other (each rank's meshes are freed before the next).
``benchmarks/simulate_scale.py`` measures both; docs/performance.md has its table.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from meshconf.core.errors import MeshconfError

try:
    # Loaded with this module: a process at its memory limit may not load it later.
    import resource
except ImportError:  # pragma: no cover - Windows has no resource module
    resource = None  # type: ignore[assignment]

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


class SimulationTooLarge(MeshconfError):
    """A simulation that would take more time or memory than meshconf lets one command take."""


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
        SimulationTooLarge: the message names the limit and the world.
    """
    if world_size > MAX_SIMULATED_WORLD:
        raise SimulationTooLarge(
            f"simulate builds worlds of up to {MAX_SIMULATED_WORLD} ranks, and this one has "
            f"{world_size}: torch's meshes and groups hold every rank, about "
            f"{BYTES_PER_SIMULATED_RANK} bytes each; {instead}"
        )


def check_simulation_size(world_size: int, rank_count: int) -> None:
    """Refuses a world larger than :data:`MAX_SIMULATED_WORLD`, or more ranks of it than
    :data:`MAX_SIMULATED_WORK` allows.

    Raises:
        SimulationTooLarge: the message names the limit and the figures of this request.
    """
    check_world_size(world_size)
    cost_per_rank = max(world_size, RANK_SET_UP_COST)
    if rank_count * cost_per_rank > MAX_SIMULATED_WORK:
        most = max(1, MAX_SIMULATED_WORK // cost_per_rank)
        raise SimulationTooLarge(
            f"{rank_count} ranks of a world of {world_size} are more than one simulate builds: "
            f"each rank builds meshes over the whole world, and one command builds at most "
            f"{most} rank{'s' if most > 1 else ''} of this world; simulate fewer ranks at once"
        )


@dataclass(frozen=True)
class Headroom:
    """The memory this process may still take, and the bound that sets it."""

    size: int
    bound: str


def _meminfo_available(meminfo: Path) -> int | None:
    match = re.search(r"^MemAvailable:\s+(\d+) kB$", _read(meminfo) or "", re.MULTILINE)
    return int(match.group(1)) * 1024 if match else None


def _cgroup_headroom(cgroups: Path, proc_cgroup: Path) -> int | None:
    # cgroup v2: the process's group is the line "0::/path"; "max" means no limit.
    match = re.search(r"^0::(/.*)$", _read(proc_cgroup) or "", re.MULTILINE)
    if match is None:
        return None
    folder = cgroups / match.group(1).lstrip("/")
    limit, current = _read(folder / "memory.max"), _read(folder / "memory.current")
    if limit is None or current is None or not limit.strip().isdigit():
        return None
    return max(0, int(limit) - int(current))


def address_space_limit() -> int | None:
    """The bytes of address space this process may map (``ulimit -v``), None if unlimited."""
    if resource is None:
        return None
    limit, _ = resource.getrlimit(resource.RLIMIT_AS)
    return None if limit == resource.RLIM_INFINITY else limit


def _address_space_headroom(status: Path) -> int | None:
    limit = address_space_limit()
    match = re.search(r"^VmSize:\s+(\d+) kB$", _read(status) or "", re.MULTILINE)
    if limit is None or match is None:
        return None
    return max(0, limit - int(match.group(1)) * 1024)


def _read(path: Path) -> str | None:
    try:
        return path.read_text(encoding="ascii", errors="replace")
    except OSError:
        return None


def headroom() -> Headroom | None:
    """The least of the memory this machine has available (``MemAvailable``), what the
    process's cgroup still allows, and what its address-space limit (``ulimit -v``) leaves;
    None where none of them can be read (a system without ``/proc``)."""
    proc = Path("/proc")
    found = [
        (_meminfo_available(proc / "meminfo"), "this machine has available"),
        (
            _cgroup_headroom(Path("/sys/fs/cgroup"), proc / "self" / "cgroup"),
            "this process's cgroup allows",
        ),
        (
            _address_space_headroom(proc / "self" / "status"),
            "this process's address-space limit (ulimit -v) leaves",
        ),
    ]
    known = [Headroom(size, bound) for size, bound in found if size is not None]
    return min(known, key=lambda room: room.size) if known else None


def check_simulation_memory(world_size: int) -> int:
    """The memory a simulated rank of ``world_size`` needs beyond what this process holds now
    (torch loaded), after checking that it is there.

    Raises:
        SimulationTooLarge: the need, and the bound it exceeds, in MiB.
    """
    need = mesh_bytes(world_size)
    room = headroom()
    if room is not None and need > room.size:
        raise SimulationTooLarge(
            f"a simulated rank of a world of {world_size} needs about {mebibytes(need)} for "
            f"its meshes and groups, and {room.bound} {mebibytes(room.size)}; {_INSTEAD}"
        )
    return need
