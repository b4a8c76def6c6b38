"""What every benchmark shares: Markdown tables, time formatting, repeated timing, peak memory.

The benchmarks print Markdown so that their output can be pasted into docs/performance.md.
"""

from __future__ import annotations

import resource
import statistics
import sys
import timeit
from collections.abc import Callable, Sequence
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


def maxrss_mib() -> float:
    """The peak resident memory of this process so far, in MiB."""
    # ru_maxrss is in KiB on Linux and in bytes on macOS.
    scale = 1 if sys.platform == "darwin" else 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale / 2**20
