"""``meshconf simulate`` at 2**20 and 2**22 ranks, and at 2**20 a two-level (``inside_node``)
config and one of three levels (GPU, node, NVLink domain, with ``inside``): time and peak
memory, from the command line and from Python's ``DistributedContext.simulate``, each in a
fresh process, against meshconf's own estimate of the memory
(``meshconf.features.simulation``).

Run from the repository root with the interpreter meshconf and torch are installed in::

    python benchmarks/simulate_scale.py            # each cell 3 times, median shown
    python benchmarks/simulate_scale.py --quick    # each cell once, 2**20 only

"build" is the time ``simulate`` reports for building and checking every mesh (the Python
column times ``simulate`` + ``build_all`` + ``mismatched_groups`` + ``close`` the same way);
"wall" is the whole process, torch's import included. "peak" is the process's peak resident
memory (``wait4``); "over a world of 16" subtracts that of the same command at 16 ranks, which
is torch and meshconf themselves, and divides by the world: the figure that
``BYTES_PER_SIMULATED_RANK`` must stay above. Nothing here is asserted;
tests/test_simulation_bounds.py checks the bounds' messages.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from harness import maxrss_mib, preamble, table

from meshconf.features.simulation import BYTES_PER_SIMULATED_RANK, mesh_bytes

REPO = Path(__file__).resolve().parent.parent
LAUNCHER = "examples/world_size_from_launcher.yaml"
TWO_LEVEL = "examples/hierarchical_fsdp_16gpu_nodes.yaml"
LEVELS = "examples/gb200_nvl72_moe.yaml"

PYTHON_SIMULATE = """
import sys, time
from meshconf import load_config
from meshconf.runtime import DistributedContext
config = load_config(sys.argv[1], list(sys.argv[3:]), world_size=int(sys.argv[2]))
start = time.perf_counter()
context = DistributedContext.simulate(config, rank=0, world_size=int(sys.argv[2]))
context.build_all()
assert not context.mismatched_groups()
context.close()
print(f"built in {time.perf_counter() - start:.3f} s")
"""


@dataclass(frozen=True)
class Cell:
    label: str
    path: str
    world_size: int
    overrides: tuple[str, ...] = ()

    def command(self, via: str, world_size: int) -> list[str]:
        overrides = [f"world_size={world_size}", *self.overrides] if self.path != LAUNCHER else []
        if via == "python":
            return [sys.executable, "-c", PYTHON_SIMULATE, self.path, str(world_size), *overrides]
        options = [part for override in overrides for part in ("-o", override)]
        return [
            sys.executable, "-m", "meshconf", "simulate", self.path,
            "--world-size", str(world_size), *options,
        ]  # fmt: skip


def run(command: list[str]) -> tuple[float, float, float]:
    """(build seconds, wall seconds, peak MiB) of one fresh process."""
    start = time.perf_counter()
    process = subprocess.Popen(
        command,
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert process.stdout is not None
    output = process.stdout.read().decode()
    _, status, usage = os.wait4(process.pid, 0)
    wall = time.perf_counter() - start
    if status != 0:
        raise SystemExit(f"{' '.join(command)} failed:\n{output}")
    built = re.search(r"built in (\d+\.\d+) s", output)
    assert built is not None, output
    return float(built.group(1)), wall, maxrss_mib(usage)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="each cell once, 2**20 only")
    args = parser.parse_args()
    repeat = 1 if args.quick else 3
    cells = [
        Cell("default domains", LAUNCHER, 2**20),
        Cell("two levels: 16-GPU nodes, inside_node", TWO_LEVEL, 2**20, ("degrees.dp_shard=-1",)),
        # ep 4, so that the same config is valid at 16 ranks too
        Cell("levels: nodes of 4, NVLink domains of 64, inside", LEVELS, 2**20, ("degrees.ep=4",)),
    ]
    if not args.quick:
        cells.append(Cell("default domains", LAUNCHER, 2**22))
    print(preamble("meshconf simulate at scale", args.quick, ["torch", "meshconf"]))
    rows = []
    for cell in cells:
        for via in ("meshconf simulate", "python"):
            baseline = statistics.median(run(cell.command(via, 16))[2] for _ in range(repeat))
            samples = [run(cell.command(via, cell.world_size)) for _ in range(repeat)]
            built, wall, peak = (statistics.median(column) for column in zip(*samples, strict=True))
            over = peak - baseline
            rows.append(
                [
                    cell.label,
                    f"2**{cell.world_size.bit_length() - 1}",
                    via if via != "python" else "DistributedContext.simulate",
                    f"{built:.2f} s",
                    f"{wall:.2f} s",
                    f"{peak:.0f} MiB",
                    f"{over:.0f} MiB ({over * 2**20 / cell.world_size:.0f} B per rank)",
                    f"{mesh_bytes(cell.world_size) / 2**20:.0f} MiB",
                ]
            )
            print(f"  done: {cell.label}, {via}", file=sys.stderr)
    headers = ["config", "world", "via", "build", "wall", "peak", "over a world of 16"]
    headers.append(f"estimate ({BYTES_PER_SIMULATED_RANK} B per rank)")
    print(table(headers, rows, right=(3, 4, 5, 6, 7)))


if __name__ == "__main__":
    main()
