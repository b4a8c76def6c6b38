"""Speed of meshconf's core: validating config files and querying rank layouts.

Run from the repository root with the interpreter meshconf is installed in::

    python benchmarks/core_speed.py           # full run (well under 2 minutes)
    python benchmarks/core_speed.py --quick   # smoke run: fewer repetitions

Prints Markdown tables. Part A times ``meshconf validate`` on 100 generated, valid configs
in one process (as a subprocess, interpreter start included), the in-process cost of
``load_config`` per file and the import time of ``meshconf``. Part B times layout queries
at ``world_size = 2**20`` and shows that their cost does not grow with the world size.

Only the standard library and meshconf are used. Nothing here asserts a timing.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import random
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
import timeit
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import meshconf
from meshconf import MeshConfig, load_config
from meshconf.core.layout import process_group_count
from meshconf.sources.yaml_reader import decode, read_yaml

NUM_FILES = 100
WORLD_MIN, WORLD_MAX = 8, 65536
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


# --------------------------------------------------------------------------- helpers


def fmt_s(seconds: float) -> str:
    return f"{seconds * 1e3:.0f} ms" if seconds >= 0.01 else f"{seconds * 1e3:.2f} ms"


def fmt_us(seconds: float) -> str:
    us = seconds * 1e6
    if us >= 1000:
        return f"{us:,.0f}"
    return f"{us:.2f}" if us < 10 else f"{us:.1f}"


def table(headers: Sequence[str], rows: Sequence[Sequence[str]], right: Sequence[int] = ()) -> str:
    """A Markdown table; columns in ``right`` are right-aligned."""
    align = ["---:" if i in right else "---" for i in range(len(headers))]
    lines = ["| " + " | ".join(headers) + " |", "| " + " | ".join(align) + " |"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def per_call(fn: Callable[[], Any], settings: Settings) -> tuple[float, float]:
    """(median, best) seconds per call of ``fn`` over timeit repeats."""
    timer = timeit.Timer(fn)
    number = 1
    while True:  # like Timer.autorange, with our own target
        elapsed = timer.timeit(number)
        if elapsed >= settings.timeit_min_s:
            break
        number *= 2 if elapsed > settings.timeit_min_s / 4 else 10
    times = [elapsed / number] + [
        t / number for t in timer.repeat(repeat=settings.timeit_repeat - 1, number=number)
    ]
    return statistics.median(times), min(times)


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


# --------------------------------------------------------------------------- config files

CUSTOM_DOMAIN_SETS: list[tuple[dict[str, str], dict[str, list[str]]]] = [
    # (derived, domains): a few shapes seen in real training configs.
    ({}, {"dense": ["pp", "dp_replicate", "fsdp", "tp"], "loss": ["pp", "loss", "tp"]}),
    (
        {"expert_dp": "dp_shard * cp * tp / (ep * etp)"},
        {
            "dense": ["pp", "dp_replicate", "fsdp", "tp"],
            "moe": ["pp", "dp_replicate", "expert_dp", "ep", "etp"],
        },
    ),
    (
        {"attn_dp": "dp_shard * cp"},
        {
            "attention": ["pp", "dp_replicate", "attn_dp", "tp"],
            "dataloading": ["pp", "batch", "cp", "tp"],
        },
    ),
    (
        {"model_parallel": "pp * tp", "tokens": "dp_replicate * dp_shard * cp"},
        {
            "dense": ["pp", "dp_replicate", "fsdp", "tp"],
            "seq": ["pp", "dp_replicate", "dp_shard", "cp", "tp"],
            "loss": ["pp", "tokens", "tp"],
        },
    ),
]


def _degree_choices(rng: random.Random) -> dict[str, int] | None:
    tp = rng.choice([1, 2, 4, 8, 8])
    cp = rng.choice([1, 1, 1, 2, 4])
    pp = rng.choice([1, 1, 2, 4, 8, 16])
    dp_replicate = rng.choice([1, 1, 2, 4, 8])
    dp_shard = rng.choice([1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 128, 256, 512])
    world = tp * cp * pp * dp_replicate * dp_shard
    if not WORLD_MIN <= world <= WORLD_MAX:
        return None
    etp = rng.choice([1, 1, tp])
    lender = dp_shard * cp * tp
    eps = [ep for ep in (1, 2, 4, 8, 16, 32, 64) if lender % (ep * etp) == 0]
    ep = rng.choice(eps)
    return {
        "pp": pp,
        "dp_replicate": dp_replicate,
        "dp_shard": dp_shard,
        "cp": cp,
        "tp": tp,
        "ep": ep,
        "etp": etp,
    }


# The first configs pin the ends of the world-size range.
_ANCHORS = [
    {"pp": 1, "dp_replicate": 1, "dp_shard": 1, "cp": 1, "tp": 8, "ep": 1, "etp": 1},
    {"pp": 16, "dp_replicate": 4, "dp_shard": 128, "cp": 1, "tp": 8, "ep": 8, "etp": 1},
    {"pp": 8, "dp_replicate": 2, "dp_shard": 256, "cp": 2, "tp": 8, "ep": 16, "etp": 8},
]


def write_auto_style(
    written: dict[str, int], degrees: dict[str, int], style: int, rng: random.Random
) -> None:
    """Write the -1 one of four ways: dp_shard left out (its default), dp_shard written as -1,
    another world factor as -1, or every world factor explicit."""
    if style == 0:
        written.pop("dp_shard", None)
    elif style == 1:
        written["dp_shard"] = -1
    elif style == 2:
        auto = rng.choice([n for n in ("pp", "dp_replicate", "tp") if n in written] or ["pp"])
        written["dp_shard"] = degrees["dp_shard"]
        written[auto] = -1
    else:
        written.update({n: degrees[n] for n in ("pp", "dp_replicate", "dp_shard", "cp", "tp")})


def config_text(index: int, rng: random.Random) -> str | None:
    """One realistic config, or None if the random degrees fall outside the world range."""
    degrees = dict(_ANCHORS[index]) if index < len(_ANCHORS) else _degree_choices(rng)
    if degrees is None:
        return None
    world = math.prod(degrees[name] for name in ("pp", "dp_replicate", "dp_shard", "cp", "tp"))
    written: dict[str, int] = {}
    style = index % 4
    for name, value in degrees.items():
        if name in ("ep", "etp") and value == 1 and rng.random() < 0.7:
            continue  # left at the default
        if name != "dp_shard" and value == 1 and rng.random() < 0.5:
            continue
        written[name] = value
    write_auto_style(written, degrees, style, rng)
    lines = [f"# generated benchmark config {index:03d}: {world} ranks", f"world_size: {world}"]
    if rng.random() < 0.6:
        lines.append(f"gpus_per_node: {rng.choice([4, 8, 8, 8])}")
    lines.append("degrees:")
    lines += [f"  {name}: {value}" for name, value in written.items()]
    if index % 3 == 0:
        derived, domains = CUSTOM_DOMAIN_SETS[(index // 3) % len(CUSTOM_DOMAIN_SETS)]
        if derived:
            lines.append("derived:")
            lines += [f'  {name}: "{text}"' for name, text in derived.items()]
        lines.append("domains:")
        lines += [f"  {name}: [{', '.join(dims)}]" for name, dims in domains.items()]
    elif index % 5 == 1:
        lines += ["derived:", '  dp_total: "dp_replicate * dp_shard"']
    if rng.random() < 0.3:
        lines += [
            "runtime:",
            f"  timeout_s: {rng.choice([600, 1800, 3600])}",
            f"  backend: {rng.choice(['auto', 'nccl'])}",
        ]
    return "\n".join(lines) + "\n"


def write_configs(directory: Path, count: int = NUM_FILES) -> list[str]:
    """``count`` distinct valid configs; each is checked with load_config before use."""
    rng = random.Random(20240611)
    seen: set[str] = set()
    paths: list[str] = []
    while len(paths) < count:
        text = config_text(len(paths), rng)
        if text is None or text in seen:
            continue
        seen.add(text)
        path = directory / f"mesh_{len(paths):03d}.yaml"
        path.write_text(text)
        load_config(path)  # a generator bug should fail loudly, not skew the timing
        paths.append(str(path))
    return paths


# --------------------------------------------------------------------------- part A


def part_a(settings: Settings, tmp: Path) -> None:
    paths = write_configs(tmp)
    worlds = sorted(load_config(p).resolved_world_size or 0 for p in paths)
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
    rows = [
        [
            "`python -m meshconf validate <100 files>` (wall, whole process)",
            fmt_s(min(validate_times)),
            fmt_s(median_validate),
        ],
        [
            "`python -c pass` (bare interpreter start, for reference)",
            fmt_s(min(bare_times)),
            fmt_s(statistics.median(bare_times)),
        ],
        [
            "`python -c 'import meshconf.cli'` (wall: start + every import validate needs)",
            fmt_s(min(cli_times)),
            fmt_s(statistics.median(cli_times)),
        ],
        [
            "`import meshconf` alone, timed inside a fresh interpreter",
            fmt_s(min(import_times)),
            fmt_s(statistics.median(import_times)),
        ],
    ]
    print(table(["what", "best", "median"], rows, right=(1, 2)))
    print()
    rows = [
        ["`meshconf.load_config(path)`", fmt_us(load_each), fmt_s(load_each * NUM_FILES)],
        [
            "  of which: read YAML with key positions (`read_yaml`)",
            fmt_us(yaml_each),
            fmt_s(yaml_each * NUM_FILES),
        ],
        [
            "  of which: `MeshConfig.model_validate(data)` (all rules)",
            fmt_us(model_each),
            fmt_s(model_each * NUM_FILES),
        ],
    ]
    print(
        f"In process, median of {settings.load_rounds} round(s) over the 100 files after a "
        "warm-up round:\n"
    )
    print(table(["what", "µs per file", "x 100 files"], rows, right=(1, 2)))
    print()
    median_cli = statistics.median(cli_times)
    print(
        f"Split of the median 100-file validate ({fmt_s(median_validate)}): interpreter start "
        f"and imports {fmt_s(median_cli)} ({100 * median_cli / median_validate:.0f}%), "
        f"checking the 100 files and printing {fmt_s(max(median_validate - median_cli, 0.0))} "
        f"(in process, 100 x load_config takes {fmt_s(load_each * NUM_FILES)}).\n"
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
        per_call(lambda: MeshConfig.model_validate(data), settings)[1],
        per_call(lambda: layout.coordinate(rank), settings)[1],
        per_call(lambda: layout.group(rank, ["dp_replicate", "fsdp"]), settings)[1],
        per_call(lambda: layout.crosses_nodes("tp", 8), settings)[1],
        per_call(lambda: layout.crosses_nodes("fsdp", 8), settings)[1],
    ]
    exponent = world.bit_length() - 1
    return [f"2**{exponent} = {world:,}", f"{config.resolved_degrees['dp_shard']:,}"] + [
        fmt_us(t) for t in timings
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
        median, best = per_call(fn, settings)
        rows.append([label, fmt_us(median), fmt_us(best)])
    print(table(["query", "µs/call (median)", "µs/call (best)"], rows, right=(1, 2)))
    print()

    # O(group size): listing ranks, and `meshconf show --format json`.
    group = big_layout.group(rank, big_dim.name)
    median, best = per_call(group.ranks, settings)
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
            fmt_s(median),
            fmt_s(best),
        ],
        [
            f"`python -m meshconf show --format json` (subprocess, wall; lists {listed:,} ranks "
            f"in {len(report['domains'])} domains, {len(out):,} bytes)",
            fmt_s(statistics.median(show_times)),
            fmt_s(min(show_times)),
        ],
    ]
    print(table(["what", "median", "best"], rows, right=(1, 2)))
    print()

    # The same queries at other world sizes: the cost does not follow the world size.
    print(
        "Per-query cost against world size (same degrees, dp_shard fills the rest; domain "
        f"`dense`, rank world_size * 3 // 4; µs per call, best of {settings.timeit_repeat}):\n"
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

    command = shlex.join(["python", *sys.argv])
    print("## meshconf core speed\n")
    print(f"Command: `{command}`\n")
    print(
        f"- Python {platform.python_version()} ({platform.python_implementation()}), "
        f"meshconf from `{Path(meshconf.__file__).parent}`"
    )
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else "?"
    processor = f", processor {platform.processor()}" if platform.processor() else ""
    print(
        f"- Machine: {platform.platform()}, {platform.machine()}, "
        f"{os.cpu_count()} CPUs ({usable} usable){processor}"
    )
    mode = "quick (smoke run, few repetitions: numbers are rough)" if args.quick else "full"
    print(f"- Mode: {mode}\n")

    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="meshconf-bench-") as name:
        tmp = Path(name)
        part_a(settings, tmp)
        part_b(settings, tmp)
    print(f"Total benchmark time: {time.perf_counter() - start:.1f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
