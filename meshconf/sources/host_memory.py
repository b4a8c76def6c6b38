"""The memory this process may still take, read from the host: what the machine has available
(``MemAvailable`` in ``/proc/meminfo``), what the process's cgroup still allows, and what its
address-space limit (``ulimit -v``) leaves."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

try:
    # Loaded with this module: a process at its memory limit may not load it later.
    import resource
except ImportError:  # pragma: no cover - Windows has no resource module
    resource = None  # type: ignore[assignment]


@dataclass(frozen=True)
class Headroom:
    """The memory this process may still take, and the bound that sets it."""

    size: int
    bound: str


def _kib_field(path: Path, name: str) -> int | None:
    """The bytes of a ``/proc`` file's ``<name>: <n> kB`` line."""
    match = re.search(rf"^{name}:\s+(\d+) kB$", _read(path) or "", re.MULTILINE)
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
    limit, size = address_space_limit(), _kib_field(status, "VmSize")
    return None if limit is None or size is None else max(0, limit - size)


def _read(path: Path) -> str | None:
    try:
        return path.read_text(encoding="ascii", errors="replace")
    except OSError:
        return None


def headroom() -> Headroom | None:
    """The least of the three, None where none of them can be read (a system without
    ``/proc``)."""
    proc = Path("/proc")
    found = [
        (_kib_field(proc / "meminfo", "MemAvailable"), "this machine has available"),
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
