"""Speed of meshconf's core: validating config files and querying rank layouts.

Run from the repository root with the interpreter meshconf is installed in::

    python benchmarks/core_speed.py           # full run (well under 2 minutes)
    python benchmarks/core_speed.py --quick   # smoke run: fewer repetitions

Prints Markdown tables. Part A times ``meshconf validate`` on 100 generated, valid configs
in one process (as a subprocess, interpreter start included), the in-process cost of
``load_config`` per file and the import time of ``meshconf``. Part B times layout queries
at ``world_size = 2**20`` and shows that their cost does not grow with the world size.

Only the standard library, meshconf and the modules beside this one are used. Nothing here
asserts a timing.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from configs import generate_configs  # benchmarks/ is on sys.path[0]
from harness import fmt_time, per_call, preamble, table

from meshconf import MeshConfig, load_config
from meshconf.core.layout import process_group_count
from meshconf.sources.yaml_reader import decode, read_yaml

NUM_FILES = 100
BIG_WORLD = 2**20
SCALING_WORLDS = (2**10, 2**15, 2**20, 2**25)


# --------------------------------------------------------------------------- settings


class Settings:
    """Repetition counts: the default run, or a quick smoke run."""

    def __init__(self, quick: bool) -> None:
        self.quick = quick
        self.subprocess_runs = 1 if quick else 5  # validate / show / import subprocesses
        self.load_rounds = 1 if quick else 7  # rounds of load_config over all files
        self.timeit_repeat = 2 if quick else 5
        self.timeit_min_s = 0.002 if quick else 0.1  # autorange target per repeat

    def per_call(self, fn: Callable[[], Any]) -> tuple[float, float]:
        """(median, best) seconds per call of ``fn`` at these repetitions."""
        return per_call(fn, self.timeit_repeat, self.timeit_min_s)


# --------------------------------------------------------------------------- helpers


def wall(cmd: Sequence[str], runs: int, expect_rc: int = 0) -> tuple[list[float], str]:
    """Wall times of ``runs`` runs of ``cmd`` (after one warm-up run), and the last stdout."""
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    stdout = ""
    times: list[float] = []
    for index in range(runs + 1):
        start = time.perf_counter()
        done = subprocess.run(cmd, capture_output=True, text=True, env=env)
        elapsed = time.perf_counter() - start
        if done.returncode != expect_rc:
            sys.exit(
                f"{shlex.join(cmd[:6])} ... exited {done.returncode}:\n"
                f"{done.stdout[-2000:]}{done.stderr[-2000:]}"
            )
        stdout = done.stdout
        if index:  # the first run warms the page cache and writes .pyc files
            times.append(elapsed)
    return times, stdout


# --------------------------------------------------------------------------- part A


def part_a(settings: Settings, tmp: Path) -> None:
    configs = generate_configs(NUM_FILES, tmp, broken_every=None)
    paths = [str(config.path) for config in configs]
    worlds = sorted(config.world_size for config in configs)
    python = sys.executable
    n = settings.subprocess_runs

    validate_cmd = [python, "-m", "meshconf", "validate", *paths]
    validate_times, out = wall(validate_cmd, n)
    ok_lines = sum(1 for line in out.splitlines() if ": ok (" in line)
    if ok_lines != NUM_FILES:
        sys.exit(f"expected {NUM_FILES} 'ok' lines from validate, got {ok_lines}:\n{out}")

    bare_times, _ = wall([python, "-c", "pass"], n)
    cli_times, _ = wall([python, "-c", "import meshconf.cli"], n)
    import_code = (
        "import time; t = time.perf_counter(); import meshconf; print(time.perf_counter() - t)"
    )
    import_times: list[float] = []
    for _ in range(n + 1):
        _, out = wall([python, "-c", import_code], 1)
        import_times.append(float(out))
    import_times = import_times[1:]

    # In process: load_config per file, and its two halves (YAML read, model validation).
    texts = [decode(Path(p).read_bytes()) for p in paths]
    datas = [read_yaml(t).data for t in texts]

    def rounds(fn: Callable[[], Any]) -> float:
        fn()  # warm-up
        per_file = []
        for _ in range(settings.load_rounds):
            start = time.perf_counter()
            fn()
            per_file.append((time.perf_counter() - start) / NUM_FILES)
        return statistics.median(per_file)

    load_each = rounds(lambda: [load_config(p) for p in paths])
    yaml_each = rounds(lambda: [read_yaml(t) for t in texts])
    model_each = rounds(lambda: [MeshConfig.model_validate(d) for d in datas])

    n_derived = sum("derived:" in t for t in texts)
    n_domains = sum("domains:" in t for t in texts)
    n_auto = sum(": -1" in t or "dp_shard" not in t for t in texts)
    print("### A. `meshconf validate` on 100 config files\n")
    print(
        f"{NUM_FILES} distinct valid configs, world_size {worlds[0]} .. {worlds[-1]} "
        f"(median {worlds[len(worlds) // 2]}); {n_derived} with `derived:`, {n_domains} with "
        f"custom `domains:`, {n_auto} with a -1 (written or dp_shard's default). "
        f"Subprocess rows: {n} run(s) after one warm-up run.\n"
    )
    median_validate = statistics.median(validate_times)
    processes = [
        ("`python -m meshconf validate <100 files>` (wall, whole process)", validate_times),
        ("`python -c pass` (bare interpreter start, for reference)", bare_times),
        (
            "`python -c 'import meshconf.cli'` (wall: start + every import validate needs)",
            cli_times,
        ),
        ("`import meshconf` alone, timed inside a fresh interpreter", import_times),
    ]
    rows = [
        [label, fmt_time(min(times)), fmt_time(statistics.median(times))]
        for label, times in processes
    ]
    print(table(["what", "best", "median"], rows, right=(1, 2)))
    print()
    in_process = [
        ("`meshconf.load_config(path)`", load_each),
        ("  of which: read YAML with key positions (`read_yaml`)", yaml_each),
        ("  of which: `MeshConfig.model_validate(data)` (all rules)", model_each),
    ]
    rows = [[label, fmt_time(each), fmt_time(each * NUM_FILES)] for label, each in in_process]
    print(
        f"In process, median of {settings.load_rounds} round(s) over the 100 files after a "
        "warm-up round:\n"
    )
    print(table(["what", "per file", "x 100 files"], rows, right=(1, 2)))
    print()
    median_cli = statistics.median(cli_times)
    print(
        f"Split of the median 100-file validate ({fmt_time(median_validate)}): interpreter start "
        f"and imports {fmt_time(median_cli)} ({100 * median_cli / median_validate:.0f}%), "
        f"checking the 100 files and printing {fmt_time(max(median_validate - median_cli, 0.0))} "
        f"(in process, 100 x load_config takes {fmt_time(load_each * NUM_FILES)}).\n"
    )


# --------------------------------------------------------------------------- part B


def big_config(world_size: int) -> dict[str, Any]:
    return {
        "world_size": world_size,
        "gpus_per_node": 8,
        "degrees": {"pp": 8, "dp_replicate": 4, "tp": 8, "cp": 2, "ep": 8, "dp_shard": -1},
    }


def _scaling_row(world: int, settings: Settings) -> list[str]:
    data = big_config(world)
    config = MeshConfig.model_validate(data)
    layout = config.layout("dense")
    rank = world * 3 // 4
    timings = [
        settings.per_call(lambda: MeshConfig.model_validate(data))[1],
        settings.per_call(lambda: layout.coordinate(rank))[1],
        settings.per_call(lambda: layout.group(rank, ["dp_replicate", "fsdp"]))[1],
        settings.per_call(lambda: layout.crosses_nodes("tp", 8))[1],
        settings.per_call(lambda: layout.crosses_nodes("fsdp", 8))[1],
    ]
    exponent = world.bit_length() - 1
    return [f"2**{exponent} = {world:,}", f"{config.resolved_degrees['dp_shard']:,}"] + [
        fmt_time(t) for t in timings
    ]


def part_b(settings: Settings, tmp: Path) -> None:
    data = big_config(BIG_WORLD)
    config = MeshConfig.model_validate(data)
    dense = config.layout("dense")
    layouts = list(config.layouts.values())
    rank = 777_777
    coord = dense.coordinate(rank)

    largest = max(
        ((layout, dim) for layout in layouts for dim in layout.dims), key=lambda ld: ld[1].size
    )
    big_layout, big_dim = largest

    degrees = config.resolved_degrees
    shape = " ".join(f"{k}={v}" for k, v in degrees.items())
    print(f"### B. Layout queries at world_size 2**20 = {BIG_WORLD:,}\n")
    dense_shape = dict(zip(dense.dim_names, dense.shape, strict=True))
    print(
        f"Config: `{json.dumps(data)}` (resolved: {shape}; dense domain {dense_shape}); "
        f"queries on domain `dense`, rank {rank}. "
        f"Per call, median and best of {settings.timeit_repeat} timeit repeats.\n"
    )

    queries: list[tuple[str, Callable[[], Any]]] = [
        (
            "`MeshConfig.model_validate(dict)` (every rule, all 4 layouts)",
            lambda: MeshConfig.model_validate(data),
        ),
        ("`layout.coordinate(rank)`", lambda: dense.coordinate(rank)),
        ("`layout.rank_at(coord)`", lambda: dense.rank_at(coord)),
        ('`layout.group(rank, "tp")` (descriptor)', lambda: dense.group(rank, "tp")),
        (
            '`layout.group(rank, ["dp_replicate", "fsdp"])` (descriptor)',
            lambda: dense.group(rank, ["dp_replicate", "fsdp"]),
        ),
        ('`layout.num_groups("fsdp")`', lambda: dense.num_groups("fsdp")),
        ('`layout.crosses_nodes("fsdp", 8)`', lambda: dense.crosses_nodes("fsdp", 8)),
        ('`layout.crosses_nodes("tp", 8)` (residue scan)', lambda: dense.crosses_nodes("tp", 8)),
        (
            '`layout.crosses_nodes("tp", 4096)` (residue scan, largest allowed node)',
            lambda: dense.crosses_nodes("tp", 4096),
        ),
        (
            "`process_group_count(layouts, rank)` (4 domains)",
            lambda: process_group_count(layouts, rank),
        ),
    ]
    rows = []
    for label, fn in queries:
        median, best = settings.per_call(fn)
        rows.append([label, fmt_time(median), fmt_time(best)])
    print(table(["query", "per call (median)", "per call (best)"], rows, right=(1, 2)))
    print()

    # O(group size): listing ranks, and `meshconf show --format json`.
    group = big_layout.group(rank, big_dim.name)
    median, best = settings.per_call(group.ranks)
    path = tmp / "world_2p20.json"  # JSON is valid YAML 1.2
    path.write_text(json.dumps(data))
    show_cmd = [
        sys.executable,
        "-m",
        "meshconf",
        "show",
        str(path),
        "--rank",
        str(rank),
        "--format",
        "json",
    ]
    show_times, out = wall(show_cmd, settings.subprocess_runs)
    report = json.loads(out)
    listed = sum(len(d["group"]) for dom in report["domains"].values() for d in dom["dims"])
    print("O(group size): these list ranks, so they grow with the groups.\n")
    rows = [
        [
            f'`layout.group(rank, "{big_dim.name}").ranks()` (domain `{big_layout.name}`, '
            f"the largest group: {group.size:,} ranks)",
            fmt_time(median),
            fmt_time(best),
        ],
        [
            f"`python -m meshconf show --format json` (subprocess, wall; lists {listed:,} ranks "
            f"in {len(report['domains'])} domains, {len(out):,} bytes)",
            fmt_time(statistics.median(show_times)),
            fmt_time(min(show_times)),
        ],
    ]
    print(table(["what", "median", "best"], rows, right=(1, 2)))
    print()

    # The same queries at other world sizes: the cost does not follow the world size.
    print(
        "Per-query cost against world size (same degrees, dp_shard fills the rest; domain "
        f"`dense`, rank world_size * 3 // 4; per call, best of {settings.timeit_repeat}):\n"
    )
    rows = []
    for world in SCALING_WORLDS:
        rows.append(_scaling_row(world, settings))
    print(
        table(
            [
                "world_size",
                "dp_shard",
                "model_validate",
                "coordinate",
                "group (dp_replicate, fsdp)",
                'crosses_nodes("tp", 8)',
                'crosses_nodes("fsdp", 8)',
            ],
            rows,
            right=(1, 2, 3, 4, 5, 6),
        )
    )
    print()


# --------------------------------------------------------------------------- main


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="smoke run: fewer repetitions")
    args = parser.parse_args(argv)
    settings = Settings(args.quick)

    print(preamble("meshconf core speed", args.quick, ("meshconf", "pydantic", "PyYAML")))

    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="meshconf-bench-") as name:
        tmp = Path(name)
        part_a(settings, tmp)
        part_b(settings, tmp)
    print(f"Total benchmark time: {time.perf_counter() - start:.1f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
