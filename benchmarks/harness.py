"""What every benchmark shares: its heading, Markdown tables, time formatting, repeated timing,
peak memory.

The benchmarks print Markdown so that their output can be pasted into docs/performance.md.
"""

from __future__ import annotations

import os
import platform
import resource
import shlex
import statistics
import sys
import timeit
from collections.abc import Callable, Sequence
from importlib import metadata
from typing import Any


def table(headers: Sequence[str], rows: Sequence[Sequence[str]], right: Sequence[int] = ()) -> str:
    """A Markdown table; the columns whose index is in ``right`` are right-aligned."""
    align = ["---:" if index in right else "---" for index in range(len(headers))]
    lines = ["| " + " | ".join(headers) + " |", "| " + " | ".join(align) + " |"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def fmt_time(seconds: float) -> str:
    """Seconds with a unit that keeps three significant figures readable (s, ms or µs)."""
    if seconds >= 1:
        return f"{seconds:.2f} s"
    if seconds >= 0.01:
        return f"{seconds * 1e3:.1f} ms"
    if seconds >= 1e-4:
        return f"{seconds * 1e3:.2f} ms"
    return f"{seconds * 1e6:.1f} µs"


def per_call(
    fn: Callable[[], Any], repeat: int = 5, min_seconds: float = 0.05
) -> tuple[float, float]:
    """(median, best) seconds per call of ``fn``: each of ``repeat`` samples runs ``fn`` enough
    times to last at least ``min_seconds``, so that short calls are not lost in timer noise."""
    timer = timeit.Timer(fn)
    number = 1
    while True:
        elapsed = timer.timeit(number)
        if elapsed >= min_seconds:
            break
        number *= 2 if elapsed > min_seconds / 4 else 10
    samples = [elapsed / number]
    samples += [total / number for total in timer.repeat(repeat=repeat - 1, number=number)]
    return statistics.median(samples), min(samples)


def maxrss_mib(usage: resource.struct_rusage | None = None) -> float:
    """The peak resident memory in ``usage`` (a finished child's, from ``os.wait4``), or of
    this process so far, in MiB."""
    usage = usage or resource.getrusage(resource.RUSAGE_SELF)
    # ru_maxrss is in KiB on Linux and in bytes on macOS.
    scale = 1 if sys.platform == "darwin" else 1024
    return usage.ru_maxrss * scale / 2**20


def version(package: str) -> str:
    """The installed version of ``package``, or "not installed"."""
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "not installed"


def preamble(title: str, quick: bool, packages: Sequence[str], mode_detail: str = "") -> str:
    """A benchmark's heading: the command that ran it, the machine, the Python and package
    versions, the load when it started, and whether it is a quick run."""
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else "?"
    versions = "".join(f"; {name} {version(name)}" for name in packages)
    mode = "quick (smoke run, few repetitions: numbers are rough)" if quick else "full"
    lines = [
        f"## {title}",
        "",
        f"Command: `{shlex.join(['python', *sys.argv])}`",
        "",
        f"- Machine: {platform.platform()}, {platform.machine()}, "
        f"{os.cpu_count()} CPUs ({usable} usable)",
        f"- Python {platform.python_version()} ({platform.python_implementation()}){versions}",
    ]
    if hasattr(os, "getloadavg"):
        lines.append(f"- Load average (1 min) at start: {os.getloadavg()[0]:.2f}")
    lines += [f"- Mode: {mode}{mode_detail}", ""]
    return "\n".join(lines)
