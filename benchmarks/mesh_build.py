"""From a config to every mesh a training step asks for, at simulated world sizes up to 2**20:
meshconf against torchtitan 0.2.1 and 0.3.0, the same work on every side.

Run from the repository root with the interpreter meshconf and torch are installed in::

    python benchmarks/mesh_build.py                      # N = 1024, 8192, 65536, 2**20
    python benchmarks/mesh_build.py --sizes 1024 65536   # other world sizes
    python benchmarks/mesh_build.py --repeat 5           # fresh processes per cell

One cell is one fresh process (``OMP_NUM_THREADS=1``, as torchrun sets it) that builds, for
rank ``N // 2 + 3`` of a world of N on torch's fake process group, what a training loop
uses, and times it whole:

- meshconf: ``MeshConfig.model_validate(degrees)``, ``DistributedContext.simulate`` (which
  creates the fake default group and, eager, every domain's groups), then the requests;
- torchtitan: the fake default group, ``ParallelDims(...)``, ``build_mesh()``, then the
  same requests through its ``get_optional_mesh``.

The requests are those of a step: ``pp, batch, cp, tp, dp_replicate, fsdp, loss, ep, efsdp``
and ``[dp_replicate, fsdp]``. A cell then times 1,000 repeated requests (those ten, a hundred
times over): a training loop asks again every step. Cells run interleaved: each round visits
every (N, implementation) once, in an order that rotates, so slow drift of the machine falls
on every column alike; columns show the median and the best round.

torchtitan comes from its wheels, which are not installed (their package imports pull in
more): ``pip download --no-deps torchtitan==0.2.1 torchtitan==0.3.0`` one at a time into
``~/.cache/meshconf-bench`` (the script tries it itself unless ``--no-download``), and its
``torchtitan/distributed/parallel_dims.py`` is loaded with its few imports stubbed (0.3.0
also with ``spmd_backend="partial_dtensor"``, whose dense mesh is meshconf's). Nothing here
asserts a timing; the groups themselves are compared in tests/test_runtime_oracle.py.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import logging
import os
import platform
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
import types
import zipfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import fmt_time, maxrss_mib, table

DEFAULT_SIZES = (1024, 8192, 65536, 2**20)
DEGREES = {"tp": 8, "pp": 4, "ep": 8, "etp": 1, "dp_replicate": 1, "cp": 1, "dp_shard": -1}
REQUESTS: list[str | list[str]] = [
    "pp", "batch", "cp", "tp", "dp_replicate", "fsdp", "loss", "ep", "efsdp",
    ["dp_replicate", "fsdp"],
]  # fmt: skip
REPEATS = 100  # rounds of the ten requests: 1,000 repeated requests
VERSIONS = ("0.2.1", "0.3.0")
IMPLEMENTATIONS = ("meshconf", *(f"torchtitan {version}" for version in VERSIONS))
CACHE_DIR = Path.home() / ".cache" / "meshconf-bench"
ROOT = Path(__file__).resolve().parent.parent


# --------------------------------------------------------------------------- one cell


def _fake_world(rank: int, world_size: int) -> None:
    import torch.distributed as dist
    import torch.testing._internal.distributed.fake_pg  # noqa: F401  (registers "fake")
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group("fake", rank=rank, world_size=world_size, store=FakeStore())


def _count_new_groups() -> list[int]:
    import torch.distributed.distributed_c10d as c10d

    count = [0]
    original = c10d._new_group_with_tag

    def counted(*args: Any, **kwargs: Any) -> Any:
        count[0] += 1
        return original(*args, **kwargs)

    c10d._new_group_with_tag = counted  # type: ignore[attr-defined]
    return count


def _load_parallel_dims(wheel: Path, directory: Path) -> type:
    """ParallelDims from the wheel's parallel_dims.py, its imports stubbed."""
    member = "torchtitan/distributed/parallel_dims.py"
    with zipfile.ZipFile(wheel) as archive:
        archive.extract(member, directory)
    stubs: dict[str, dict[str, Any]] = {
        "torchtitan": {},
        "torchtitan.tools": {},
        "torchtitan.tools.logging": {"logger": logging.getLogger("torchtitan")},
        "torchtitan.tools.utils": {"device_type": "cpu"},
        "torchtitan.distributed": {},
        "torchtitan.config": {},
        "torchtitan.config.configs": {"ParallelismConfig": object},
        "spmd_types": {},
    }
    for name, attributes in stubs.items():
        module = types.ModuleType(name)
        module.__path__ = []  # type: ignore[attr-defined]
        module.__dict__.update(attributes)
        sys.modules[name] = module
    name = "torchtitan.distributed.parallel_dims"
    spec = importlib.util.spec_from_file_location(name, directory / member)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module.ParallelDims  # type: ignore[no-any-return]


def _cell(impl: str, world_size: int, rank: int, resolved: dict[str, int]) -> dict[str, Any]:
    if impl == "meshconf":
        from meshconf import MeshConfig
        from meshconf.runtime import DistributedContext

        count = _count_new_groups()
        start = time.perf_counter()
        config = MeshConfig.model_validate({"degrees": DEGREES})
        source: Any = DistributedContext.simulate(config, rank=rank, world_size=world_size)
    else:
        version = impl.split()[1]
        with tempfile.TemporaryDirectory(prefix="meshconf-bench-") as directory:
            parallel_dims = _load_parallel_dims(_wheel(version, False)[0], Path(directory))
        count = _count_new_groups()
        start = time.perf_counter()
        _fake_world(rank, world_size)
        names = ("dp_replicate", "dp_shard", "cp", "tp", "pp", "ep")
        options: dict[str, Any] = {name: resolved[name] for name in names}
        if version == "0.2.1":
            options["etp"] = resolved["etp"]
        else:
            options["spmd_backend"] = "partial_dtensor"
        source = parallel_dims(**options, world_size=world_size)
        source.build_mesh()
    meshes = [source.get_optional_mesh(request) for request in REQUESTS]
    build = time.perf_counter() - start
    start = time.perf_counter()
    for _ in range(REPEATS):
        for request in REQUESTS:
            source.get_optional_mesh(request)
    repeated = time.perf_counter() - start
    shapes = [None if mesh is None else list(mesh.shape) for mesh in meshes]
    return {
        "build": build,
        "repeated": repeated,
        "new_group": count[0],
        "rss": maxrss_mib(),
        "shapes": shapes,
    }


# --------------------------------------------------------------------------- the driver


def _wheel(version: str, download: bool) -> tuple[Path, str]:
    found = sorted(CACHE_DIR.glob(f"torchtitan-{version}-*.whl"))
    if found or not download:
        return (found[0], "") if found else (Path(), f"no torchtitan {version} wheel")
    command = [sys.executable, "-m", "pip", "download", "--no-deps"]
    command += [f"torchtitan=={version}", "-d", str(CACHE_DIR)]
    subprocess.run(command, capture_output=True, timeout=300, check=False)
    found = sorted(CACHE_DIR.glob(f"torchtitan-{version}-*.whl"))
    return (found[0], "") if found else (Path(), f"`{shlex.join(command)}` gave no wheel")


def _spawn(impl: str, world_size: int, resolved: dict[str, int], timeout: float) -> dict[str, Any]:
    rank = min(world_size // 2 + 3, world_size - 1)
    command = [sys.executable, str(Path(__file__).resolve()), "--cell", impl]
    command += ["--world-size", str(world_size), "--rank", str(rank)]
    command += ["--resolved", json.dumps(resolved)]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    try:
        done = subprocess.run(
            command, capture_output=True, text=True, timeout=timeout, cwd=ROOT, env=env
        )
    except subprocess.TimeoutExpired:
        return {"error": "timeout"}
    for line in done.stdout.splitlines():
        if line.startswith("RESULT "):
            result: dict[str, Any] = json.loads(line[len("RESULT ") :])
            return result
    return {"error": (done.stderr.strip().splitlines() or ["no output"])[-1][:200]}


def _resolved(world_size: int) -> dict[str, int]:
    from meshconf import MeshConfig

    config = MeshConfig.model_validate({"world_size": world_size, "degrees": DEGREES})
    return config.resolved_degrees


def _ratio(theirs: float, mine: float) -> str:
    ratio = theirs / mine
    return f"{ratio:.1f}x" if ratio < 10 else f"{ratio:.0f}x"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=list(DEFAULT_SIZES))
    parser.add_argument("--repeat", type=int, default=3, help="rounds (fresh processes per cell)")
    parser.add_argument("--cell-timeout", type=float, default=600)
    parser.add_argument("--no-download", action="store_true")
    parser.add_argument("--cell", help=argparse.SUPPRESS)
    parser.add_argument("--world-size", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--rank", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--resolved", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.cell:
        result = _cell(args.cell, args.world_size, args.rank, json.loads(args.resolved))
        print("RESULT " + json.dumps(result))
        return 0

    import torch

    missing = {f"torchtitan {v}": _wheel(v, not args.no_download)[1] for v in VERSIONS}
    impls = [impl for impl in IMPLEMENTATIONS if not missing.get(impl)]
    cells = [(n, impl) for n in args.sizes for impl in impls]
    runs: dict[tuple[int, str], list[dict[str, Any]]] = {cell: [] for cell in cells}
    resolved = {n: _resolved(n) for n in args.sizes}
    started = time.perf_counter()
    for round_index in range(args.repeat):
        shift = round_index % len(impls)
        for n in args.sizes:
            for impl in impls[shift:] + impls[:shift]:
                result = _spawn(impl, n, resolved[n], args.cell_timeout)
                runs[n, impl].append(result)
                note = result.get("error") or fmt_time(result["build"])
                print(f"  round {round_index + 1} N={n:,} {impl}: {note}", file=sys.stderr)

    def stat(n: int, impl: str, key: str, pick: Any = statistics.median) -> float | None:
        values = [run[key] for run in runs.get((n, impl), []) if key in run]
        return pick(values) if values else None

    print("## From config to every mesh a step asks for\n")
    print(f"Command: `{shlex.join(['python', *sys.argv])}`\n")
    print(
        f"- {platform.platform()}, {os.cpu_count()} CPUs; Python {platform.python_version()}; "
        f"torch {torch.__version__}; OMP_NUM_THREADS=1; {args.repeat} interleaved rounds"
    )
    print(f"- degrees {json.dumps(DEGREES)}; rank N // 2 + 3; fake process group")
    for impl, why in missing.items():
        if why:
            print(f"- {impl}: SKIPPED, {why}")
    print()
    rows = []
    for n in args.sizes:
        mine = stat(n, "meshconf", "build")
        for impl in impls:
            median, best = stat(n, impl, "build"), stat(n, impl, "build", min)
            errors = {run["error"] for run in runs[n, impl] if "error" in run}
            if median is None or best is None:
                rows.append([f"{n:,}", impl, ", ".join(errors), *[""] * 5])
                continue
            repeated = stat(n, impl, "repeated")
            rows.append(
                [
                    f"{n:,}",
                    impl,
                    fmt_time(median),
                    fmt_time(best),
                    "" if impl == "meshconf" or mine is None else _ratio(median, mine),
                    "" if repeated is None else fmt_time(repeated),
                    f"{runs[n, impl][0].get('new_group', 0):,}",
                    f"{stat(n, impl, 'rss', max) or 0:.0f}",
                ]
            )
    headers = ["N", "implementation", "config to meshes (median)", "(best)", "x meshconf"]
    headers += ["1,000 repeated requests", "new_group calls", "peak RSS (MiB)"]
    print(table(headers, rows, right=(2, 3, 4, 5, 6, 7)))
    print()
    for n in args.sizes:
        shapes = {impl: runs[n, impl][0].get("shapes") for impl in impls if runs[n, impl]}
        if len({json.dumps(value) for value in shapes.values()}) > 1:
            print(f"- N={n:,}: the implementations answered with meshes of other shapes: {shapes}")
    print(f"Total time: {time.perf_counter() - started:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
