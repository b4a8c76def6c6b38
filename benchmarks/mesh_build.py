"""Building one rank's DeviceMeshes at large simulated world sizes: meshconf, torchtitan, torch.

Run from the repository root with the interpreter meshconf and torch are installed in::

    python benchmarks/mesh_build.py                       # N = 64, 1024, 8192, 65536
    python benchmarks/mesh_build.py --sizes 64 1024       # other world sizes
    python benchmarks/mesh_build.py --repeat 1            # one process per cell, not five

For one rank (``N // 2 + 3``) of a simulated world of N ranks, three implementations build
the same four domains of one config (default ``tp=8, pp=4, ep=8, etp=1, dp_replicate=1,
cp=1, dp_shard=-1``; ``--degrees`` changes it):

    dataloading [pp, batch, cp, tp]     dense [pp, dp_replicate, fsdp, tp]
    sparse [pp, dp_replicate, efsdp, ep, etp]     loss [pp, loss, tp]

1. meshconf: ``DistributedContext.simulate(config, rank=r, world_size=N)`` then
   ``ctx.build_all()``.
2. torchtitan 0.2.1: ``ParallelDims(...).build_mesh()`` (it builds ``loss`` as a 1-D mesh, the
   flattened ``batch x cp``).
3. plain torch: one ``init_device_mesh("cpu", shape, mesh_dim_names=dims)`` per domain.

For 2 and 3 the default group is torch's fake backend:
``dist.init_process_group("fake", rank=r, world_size=N, store=FakeStore())``;
``simulate`` does the same for meshconf. Nothing communicates, but every ``new_group`` call
a real run would make is made.

Every cell (N, implementation) runs in a fresh subprocess of this script, so process-group
state and peak memory do not leak between cells; a cell that runs longer than
``--cell-timeout`` seconds (default 300) is reported as "timeout". Columns:

- build: wall time of the build alone (meshconf ``build_all()``; torchtitan ``build_mesh()``;
  torch the four ``init_device_mesh`` calls), median and best over ``--repeat`` fresh
  processes (the best is the least disturbed by other work on the machine). The import of
  torch and the creation of the fake default group are not included (for meshconf,
  ``simulate()`` creates it; its time is printed separately).
- new_group calls: calls of ``torch.distributed.new_group`` on this rank during the build,
  counted by a wrapper installed on every name it is reached by (``torch.distributed``,
  ``torch.distributed.distributed_c10d`` and ``torch.distributed.device_mesh``, which imports
  it by name), and cross-checked against torch's internal ``_new_group_with_tag`` (and, for
  meshconf, against ``ctx.counters.new_group_calls``).
- groups joined: distinct process-group objects this rank reaches through the dims of the
  four domain meshes; "real" of those: the groups a real run would open as communicators,
  i.e. not the fake backend (defined at the end); "rank sets": distinct sets of ranks among
  them with more than one rank, the least a real run must open.
- peak RSS: ``ru_maxrss`` of the cell's process; "over baseline": that minus the peak of a
  baseline process that only imports torch and creates the fake default group of N ranks
  (for meshconf it includes importing meshconf and pydantic, about 8 MiB); "during build":
  the growth of the peak across the build alone.

The torchtitan column needs the torchtitan 0.2.1 wheel; it is NOT installed (its package
imports pull in tyro and more). Get it once with::

    pip download --no-deps torchtitan==0.2.1 -d ~/.cache/meshconf-bench

and pass it with ``--torchtitan-wheel PATH`` or leave it in ``~/.cache/meshconf-bench/``
(without the wheel there, the script tries that ``pip download`` itself unless
``--no-download``; if it still has no wheel, it skips the torchtitan column and says so).
At run time ``torchtitan/distributed/parallel_dims.py`` is extracted from the wheel into a
temporary directory and loaded with its two small imports (``torchtitan.tools.logging.logger``
and ``torchtitan.tools.utils.device_type``) stubbed.

The plot (``--plot``, default ``docs/mesh_build.png``) needs matplotlib, which is not a
dependency of meshconf: ``pip install matplotlib``. Without it the plot is skipped with a
message. Nothing here asserts a timing.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import logging
import os
import platform
import resource
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
import types
import zipfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

DEFAULT_SIZES = (64, 1024, 8192, 65536)
DEFAULT_DEGREES = {"tp": 8, "pp": 4, "ep": 8, "etp": 1, "dp_replicate": 1, "cp": 1, "dp_shard": -1}
TORCHTITAN_VERSION = "0.2.1"
CACHE_DIR = Path.home() / ".cache" / "meshconf-bench"
ROOT = Path(__file__).resolve().parent.parent
IMPLEMENTATIONS = ("meshconf", "torchtitan", "torch")
LABELS = {
    "baseline": "baseline (import torch, fake world)",
    "meshconf": "meshconf `build_all` (after `simulate`)",
    "torchtitan": f"torchtitan {TORCHTITAN_VERSION} `ParallelDims.build_mesh`",
    "torch": "torch `init_device_mesh` x 4",
}

EPILOG = """\
"real" groups: a group a real (GPU) run would open as a communicator. In simulation every
group is fake, so the script asks what each implementation requested: meshconf's own
decision (its group registry marks a group fake only for a one-rank dim other than fsdp and
efsdp); torchtitan passes backend_override "fake" for its batch dim and for dims of degree 1
(except efsdp when ep > 1), and those are not real; every other group, made with the default
backend, is real, and so is the default group when a dim reuses it. Plain init_device_mesh
never asks for fake, so all its groups are real, one-rank groups included.
"""


# --------------------------------------------------------------------------- the cells
# Everything below up to "the driver" runs inside one fresh subprocess per cell.


def _maxrss_mib() -> float:
    # ru_maxrss is in KiB on Linux, in bytes on macOS.
    scale = 1 if sys.platform == "darwin" else 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale / 2**20


class Timer:
    """Wall time of a block."""

    def __enter__(self) -> Timer:
        self.wall = time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        self.wall = time.perf_counter() - self.wall


class GroupCallCounter:
    """Counts ``new_group`` calls, on every name torch and meshconf reach it by, and records
    the backend asked for each group this rank is a member of."""

    def __init__(self, rank: int) -> None:
        import torch.distributed as dist
        import torch.distributed.device_mesh as device_mesh
        import torch.distributed.distributed_c10d as c10d

        self.rank = rank
        self.calls = 0
        self.inner_calls = 0
        self.patched: list[str] = []
        self.backend_of: dict[int, str | None] = {}  # id(group) -> backend asked, members only
        original = c10d.new_group
        original_inner = c10d._new_group_with_tag

        def new_group(*args: Any, **kwargs: Any) -> Any:
            self.calls += 1
            group = original(*args, **kwargs)
            ranks = kwargs["ranks"] if "ranks" in kwargs else (args[0] if args else None)
            backend = (
                kwargs["backend"] if "backend" in kwargs else (args[2] if len(args) > 2 else None)
            )
            if ranks is None or rank in ranks:
                self.backend_of[id(group)] = None if backend is None else str(backend)
            return group

        def new_group_with_tag(*args: Any, **kwargs: Any) -> Any:
            self.inner_calls += 1
            return original_inner(*args, **kwargs)

        for module in (c10d, dist, device_mesh):
            if getattr(module, "new_group", None) is original:
                module.new_group = new_group  # type: ignore[attr-defined]
                self.patched.append(module.__name__)
        c10d._new_group_with_tag = new_group_with_tag  # type: ignore[attr-defined]


def _init_fake_world(rank: int, world_size: int) -> float:
    import torch.distributed as dist
    import torch.testing._internal.distributed.fake_pg  # noqa: F401  (registers "fake")
    from torch.testing._internal.distributed.fake_pg import FakeStore

    start = time.perf_counter()
    dist.init_process_group("fake", rank=rank, world_size=world_size, store=FakeStore())
    return time.perf_counter() - start


def cell_spec(degrees: dict[str, int], world_size: int) -> dict[str, Any]:
    """What every cell needs, worked out by meshconf in the driver (so the torchtitan and
    torch cells do not import meshconf): the degrees with -1 filled in, and the shape of
    every domain. meshconf's rules reject degrees that do not fit ``world_size``."""
    from meshconf import MeshConfig

    config = MeshConfig.model_validate({"world_size": world_size, "degrees": degrees})
    return {
        "degrees": degrees,
        "resolved": config.resolved_degrees,
        "shapes": {
            domain: {dim.name: dim.size for dim in layout.dims}
            for domain, layout in config.layouts.items()
        },
    }


def _mesh_facts(meshes: dict[str, Any], real_of: Callable[[Any], bool]) -> dict[str, Any]:
    """Distinct groups reachable from the meshes' dims, which are real, their rank sets, and
    one fingerprint of the ranks of each (domain, dim) to compare implementations."""
    import torch.distributed as dist

    groups: dict[int, Any] = {}
    dims: dict[str, str] = {}
    for domain, mesh in meshes.items():
        names = mesh.mesh_dim_names or tuple(str(i) for i in range(mesh.ndim))
        for index, name in enumerate(names):
            group = mesh.get_group(index)
            groups.setdefault(id(group), group)
            ranks = dist.get_process_group_ranks(group)
            dims[f"{domain}.{name}"] = hashlib.sha1(repr(sorted(ranks)).encode()).hexdigest()[:12]
    rank_sets = {tuple(sorted(dist.get_process_group_ranks(group))) for group in groups.values()}
    return {
        "groups": len(groups),
        "real": sum(real_of(group) for group in groups.values()),
        "rank_sets": sum(len(ranks) > 1 for ranks in rank_sets),
        "dims": dims,
    }


def _cell_meshconf(rank: int, world_size: int, spec: dict[str, Any]) -> dict[str, Any]:
    import torch.distributed as dist

    from meshconf import MeshConfig
    from meshconf.runtime import DistributedContext

    config = MeshConfig.model_validate({"degrees": spec["degrees"]})
    counter = GroupCallCounter(rank)
    start = time.perf_counter()
    ctx = DistributedContext.simulate(config, rank=rank, world_size=world_size)
    setup = time.perf_counter() - start
    rss_before = _maxrss_mib()
    with Timer() as timer:
        meshes = ctx.build_all()
    rss = _maxrss_mib()
    # In simulation meshconf asks for the fake backend for every group, so its own record
    # says which groups a real run would open: the registry key ends with "real".
    real_ids = {id(group) for key, group in ctx._registry._groups.items() if key[2]}
    world = dist.group.WORLD
    facts = _mesh_facts(meshes, lambda group: id(group) in real_ids or group is world)
    counters = ctx.counters
    facts["check"] = {
        "counters.new_group_calls": counters.new_group_calls,
        "counters.real_groups": counters.real_groups,
        "counters.fake_groups": counters.fake_groups,
        "counters.default_group_reuses": counters.default_group_reuses,
        "build_seconds": ctx.build_seconds,
    }
    if counters.new_group_calls != counter.calls:
        facts["problems"] = [
            f"ctx.counters.new_group_calls = {counters.new_group_calls} but the wrapper "
            f"counted {counter.calls}"
        ]
    result = {"setup": setup, "build": timer.wall, "rss_before": rss_before, "rss": rss, **facts}
    ctx.close()
    return _with_counts(result, counter)


def _load_parallel_dims(wheel: Path, directory: Path) -> tuple[type, str]:
    """ParallelDims from the wheel's parallel_dims.py, its two small imports stubbed."""
    member = "torchtitan/distributed/parallel_dims.py"
    with zipfile.ZipFile(wheel) as archive:
        archive.extract(member, directory)
        version = "?"
        for name in archive.namelist():
            if name.endswith(".dist-info/METADATA"):
                for line in archive.read(name).decode().splitlines():
                    if line.startswith("Version:"):
                        version = line.split(":", 1)[1].strip()
    stubs = {
        "torchtitan": {},
        "torchtitan.tools": {},
        "torchtitan.tools.logging": {"logger": logging.getLogger("torchtitan")},
        "torchtitan.tools.utils": {"device_type": "cpu"},
        "torchtitan.distributed": {},
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
    return module.ParallelDims, version


def _cell_torchtitan(
    rank: int, world_size: int, spec: dict[str, Any], wheel: Path
) -> dict[str, Any]:
    import torch.distributed as dist

    resolved = spec["resolved"]
    with tempfile.TemporaryDirectory(prefix="meshconf-bench-tt-") as name:
        parallel_dims_class, version = _load_parallel_dims(wheel, Path(name))
    setup = _init_fake_world(rank, world_size)
    counter = GroupCallCounter(rank)
    parallel_dims = parallel_dims_class(
        dp_replicate=resolved["dp_replicate"],
        dp_shard=resolved["dp_shard"],
        cp=resolved["cp"],
        tp=resolved["tp"],
        pp=resolved["pp"],
        ep=resolved["ep"],
        etp=resolved["etp"],
        world_size=world_size,
    )
    rss_before = _maxrss_mib()
    with Timer() as timer:
        parallel_dims.build_mesh()
    rss = _maxrss_mib()
    meshes = dict(parallel_dims._global_meshes)
    world = dist.group.WORLD
    # A group is real unless torchtitan asked for the fake backend for it.
    facts = _mesh_facts(
        meshes,
        lambda group: group is world or counter.backend_of.get(id(group), None) != "fake",
    )
    # torchtitan's loss mesh is 1-D ("loss_mesh", the flattened batch x cp): compare it with
    # the loss dim of the other implementations.
    facts["dims"] = {
        ("loss.loss" if key == "loss.loss_mesh" else key): value
        for key, value in facts["dims"].items()
    }
    result = {
        "setup": setup,
        "build": timer.wall,
        "rss_before": rss_before,
        "rss": rss,
        "version": version,
        **facts,
    }
    return _with_counts(result, counter)


def _domain_shapes(resolved: dict[str, int], world_size: int) -> dict[str, dict[str, int]]:
    from meshconf import MeshConfig

    config = MeshConfig.model_validate({"world_size": world_size, "degrees": {**resolved}})
    return {
        domain: {dim.name: dim.size for dim in layout.dims}
        for domain, layout in config.layouts.items()
    }


def _cell_torch(rank: int, world_size: int, spec: dict[str, Any]) -> dict[str, Any]:
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    shapes: dict[str, dict[str, int]] = spec["shapes"]
    setup = _init_fake_world(rank, world_size)
    counter = GroupCallCounter(rank)
    rss_before = _maxrss_mib()
    with Timer() as timer:
        meshes = {
            domain: init_device_mesh("cpu", tuple(dims.values()), mesh_dim_names=tuple(dims))
            for domain, dims in shapes.items()
        }
    rss = _maxrss_mib()
    world = dist.group.WORLD
    facts = _mesh_facts(
        meshes,
        lambda group: group is world or counter.backend_of.get(id(group), None) != "fake",
    )
    result = {"setup": setup, "build": timer.wall, "rss_before": rss_before, "rss": rss, **facts}
    return _with_counts(result, counter)


def _cell_baseline(rank: int, world_size: int) -> dict[str, Any]:
    setup = _init_fake_world(rank, world_size)
    return {"setup": setup, "rss": _maxrss_mib()}


def _with_counts(result: dict[str, Any], counter: GroupCallCounter) -> dict[str, Any]:
    result["new_group_calls"] = counter.calls
    result["inner_calls"] = counter.inner_calls
    result["patched"] = counter.patched
    problems = list(result.get("problems", []))
    if counter.inner_calls != counter.calls:
        problems.append(
            f"new_group wrapper counted {counter.calls} calls but _new_group_with_tag ran "
            f"{counter.inner_calls} times"
        )
    if "torch.distributed.device_mesh" not in counter.patched:
        problems.append("torch.distributed.device_mesh.new_group was not wrapped")
    result["problems"] = problems
    return result


def run_cell(args: argparse.Namespace) -> int:
    import torch

    impl, world_size, rank = args.cell, args.world_size, args.rank
    spec = json.loads(args.spec_json)
    if impl == "meshconf":
        result = _cell_meshconf(rank, world_size, spec)
    elif impl == "torchtitan":
        result = _cell_torchtitan(rank, world_size, spec, Path(args.torchtitan_wheel))
    elif impl == "torch":
        result = _cell_torch(rank, world_size, spec)
    else:
        result = _cell_baseline(rank, world_size)
    result["torch"] = torch.__version__
    print("RESULT " + json.dumps(result))
    return 0


# --------------------------------------------------------------------------- the driver


def find_wheel(given: str | None, download: bool) -> tuple[Path | None, str]:
    """The torchtitan wheel, or None and the reason."""
    if given:
        path = Path(given).expanduser()
        if path.is_file():
            return path, ""
        return None, f"--torchtitan-wheel {given}: no such file"
    pattern = f"torchtitan-{TORCHTITAN_VERSION}-*.whl"
    found = sorted(CACHE_DIR.glob(pattern))
    if found:
        return found[0], ""
    if not download:
        return None, f"no {pattern} in {CACHE_DIR} (and --no-download)"
    print(f"torchtitan wheel not in {CACHE_DIR}; trying pip download ...", file=sys.stderr)
    CACHE_DIR.mkdir(parents=True, exist_ok=True)
    command = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        f"torchtitan=={TORCHTITAN_VERSION}",
        "-d",
        str(CACHE_DIR),
    ]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=180, check=False)
    except (OSError, subprocess.TimeoutExpired) as error:
        return None, f"`{shlex.join(command)}` failed: {error}"
    found = sorted(CACHE_DIR.glob(pattern))
    if found:
        return found[0], ""
    tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
    return None, f"`{shlex.join(command)}` gave no wheel: {tail[0]}"


def spawn_cell(
    impl: str,
    world_size: int,
    rank: int,
    spec: dict[str, Any],
    wheel: Path | None,
    timeout: float,
) -> dict[str, Any]:
    command = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--cell",
        impl,
        "--world-size",
        str(world_size),
        "--rank",
        str(rank),
        "--spec-json",
        json.dumps(spec),
    ]
    if wheel is not None:
        command += ["--torchtitan-wheel", str(wheel)]
    try:
        done = subprocess.run(
            command, capture_output=True, text=True, timeout=timeout, check=False, cwd=ROOT
        )
    except subprocess.TimeoutExpired:
        return {"timeout": True}
    for line in done.stdout.splitlines():
        if line.startswith("RESULT "):
            result: dict[str, Any] = json.loads(line[len("RESULT ") :])
            return result
    last = (done.stderr.strip().splitlines() or ["(no output)"])[-1]
    return {"error": f"exit code {done.returncode}: {last}"}


def measure(
    impl: str,
    world_size: int,
    rank: int,
    spec: dict[str, Any],
    wheel: Path | None,
    repeat: int,
    timeout: float,
) -> dict[str, Any]:
    """Median over ``repeat`` fresh processes (counts are the same in each; checked)."""
    runs = []
    for _ in range(repeat):
        result = spawn_cell(impl, world_size, rank, spec, wheel, timeout)
        if "timeout" in result or "error" in result:
            return result
        runs.append(result)
    merged = dict(runs[0])
    for key in ("setup", "build", "rss", "rss_before"):
        if key in merged:
            merged[key] = statistics.median(run[key] for run in runs)
    if "build" in merged:
        merged["best"] = min(run["build"] for run in runs)
    for key in ("new_group_calls", "groups", "real", "rank_sets", "dims"):
        if any(run.get(key) != merged.get(key) for run in runs):
            merged["problems"] = [*merged.get("problems", []), f"{key} differs between runs"]
    return merged


def fmt_time(seconds: float) -> str:
    if seconds >= 1:
        return f"{seconds:.2f} s"
    return f"{seconds * 1e3:.1f} ms" if seconds >= 0.01 else f"{seconds * 1e3:.2f} ms"


def table(headers: Sequence[str], rows: Sequence[Sequence[str]], right: Sequence[int] = ()) -> str:
    align = ["---:" if i in right else "---" for i in range(len(headers))]
    lines = ["| " + " | ".join(headers) + " |", "| " + " | ".join(align) + " |"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def result_row(
    world_size: int, impl: str, result: dict[str, Any], baseline: float | None, skipped: str
) -> list[str]:
    label = LABELS[impl]
    if skipped:
        return [f"{world_size:,}", label, "skipped", *[""] * 8]
    if "timeout" in result:
        return [f"{world_size:,}", label, "timeout", *[""] * 8]
    if "error" in result:
        return [f"{world_size:,}", label, "error", *[""] * 8]
    if impl == "baseline":
        return [f"{world_size:,}", label, *[""] * 6, f"{result['rss']:.0f}", "", ""]
    over = "" if baseline is None else f"{result['rss'] - baseline:+.0f}"
    return [
        f"{world_size:,}",
        label,
        fmt_time(result["build"]),
        fmt_time(result["best"]),
        f"{result['new_group_calls']:,}",
        str(result["groups"]),
        str(result["real"]),
        str(result["rank_sets"]),
        f"{result['rss']:.0f}",
        over,
        f"{result['rss'] - result['rss_before']:+.0f}",
    ]


def compare_dims(results: dict[str, dict[str, Any]]) -> list[str]:
    """Do the implementations give this rank the same ranks along each (domain, dim)?"""
    problems = []
    reference = results.get("meshconf", {}).get("dims")
    if not reference:
        return problems
    for impl in ("torchtitan", "torch"):
        dims = results.get(impl, {}).get("dims")
        if not dims:
            continue
        differ = [key for key in dims if key in reference and dims[key] != reference[key]]
        if differ:
            problems.append(f"{impl} and meshconf differ on {', '.join(differ)}")
    return problems


def plot(
    path: Path,
    sizes: Sequence[int],
    results: dict[tuple[int, str], dict[str, Any]],
    degrees_text: str,
) -> str:
    try:
        import matplotlib
    except ImportError:
        return "matplotlib is not installed (pip install matplotlib): plot skipped"
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    markers = {"meshconf": "o", "torchtitan": "s", "torch": "^"}
    for impl in IMPLEMENTATIONS:
        points = [(n, results[n, impl]) for n in sizes if "build" in results.get((n, impl), {})]
        if not points:
            continue
        xs = [n for n, _ in points]
        name = LABELS[impl].replace("`", "")
        left.plot(xs, [r["build"] for _, r in points], marker=markers[impl], label=name)
        right.plot(xs, [r["new_group_calls"] for _, r in points], marker=markers[impl], label=name)
    for axis, title in ((left, "build time (s)"), (right, "new_group calls on this rank")):
        axis.set_xscale("log", base=2)
        axis.set_yscale("log")
        axis.set_xlabel("simulated world size N")
        axis.set_title(title)
        axis.grid(True, which="both", alpha=0.3)
    left.legend(fontsize=8)
    figure.suptitle(
        f"One rank's four domain meshes ({degrees_text}; fake process group)", fontsize=10
    )
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)
    return f"Plot written to {path}"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog=__doc__.split("\n\n", 1)[1] + "\n" + EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--sizes",
        type=int,
        nargs="+",
        default=list(DEFAULT_SIZES),
        help="simulated world sizes (default: %(default)s)",
    )
    parser.add_argument(
        "--degrees",
        nargs="+",
        default=[],
        metavar="NAME=VALUE",
        help=f"change degrees of the default config {json.dumps(DEFAULT_DEGREES)}",
    )
    parser.add_argument(
        "--repeat",
        type=int,
        default=5,
        help="fresh processes per cell; build time is their median (default 5)",
    )
    parser.add_argument(
        "--cell-timeout",
        type=float,
        default=300,
        help="seconds one cell process may run (default 300)",
    )
    parser.add_argument("--torchtitan-wheel", help="path of torchtitan-0.2.1-py3-none-any.whl")
    parser.add_argument(
        "--no-download", action="store_true", help=f"do not try pip download into {CACHE_DIR}"
    )
    parser.add_argument(
        "--plot",
        default=str(ROOT / "docs" / "mesh_build.png"),
        help="where to save the plot; '' for none (default: %(default)s)",
    )
    parser.add_argument("--cell", choices=(*IMPLEMENTATIONS, "baseline"), help=argparse.SUPPRESS)
    parser.add_argument("--world-size", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--rank", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--spec-json", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.cell:
        return run_cell(args)

    degrees = dict(DEFAULT_DEGREES)
    for item in args.degrees:
        name, _, value = item.partition("=")
        if name not in degrees or not value.lstrip("-").isdigit():
            parser.error(f"--degrees {item}: expected NAME=INT with NAME in {', '.join(degrees)}")
        degrees[name] = int(value)
    degrees_text = ", ".join(f"{name}={value}" for name, value in degrees.items())

    import torch

    wheel, why = find_wheel(args.torchtitan_wheel, not args.no_download)
    started = time.perf_counter()
    load_start = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print("## Mesh build at simulated world sizes\n")
    print(f"Command: `{shlex.join(['python', *sys.argv])}`\n")
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else "?"
    print(
        f"- Machine: {platform.platform()}, {platform.machine()}, {os.cpu_count()} CPUs "
        f"({usable} usable); Python {platform.python_version()}; torch {torch.__version__}"
    )
    print(
        f"- Config: {degrees_text}; rank N // 2 + 3; {args.repeat} fresh process(es) per "
        "cell, median and best build time"
    )
    if wheel is None:
        print(
            f"- torchtitan: SKIPPED, {why}. Get the wheel with `pip download --no-deps "
            f"torchtitan=={TORCHTITAN_VERSION} -d {CACHE_DIR}`"
        )
    else:
        print(f"- torchtitan: {wheel.name} (parallel_dims.py loaded from the wheel)")
    print()

    results: dict[tuple[int, str], dict[str, Any]] = {}
    rows, problems = [], []
    for world_size in args.sizes:
        rank = min(world_size // 2 + 3, world_size - 1)
        try:
            spec = cell_spec(degrees, world_size)
        except ValueError as error:
            parser.error(f"N={world_size}: the config does not fit: {error}")
        for impl in ("baseline", *IMPLEMENTATIONS):
            skipped = why if impl == "torchtitan" and wheel is None else ""
            if skipped:
                result: dict[str, Any] = {}
            else:
                result = measure(
                    impl,
                    world_size,
                    rank,
                    spec,
                    wheel,
                    1 if impl == "baseline" else args.repeat,
                    args.cell_timeout,
                )
            results[world_size, impl] = result
            if "build" in result:
                note = f"build {result['build']:.4f} s"
            elif "rss" in result:
                note = f"peak RSS {result['rss']:.0f} MiB"
            else:
                note = "skipped" if skipped else str(result.get("error") or result)[:200]
            print(f"  N={world_size:,} {impl}: {note}", file=sys.stderr, flush=True)
            for problem in result.get("problems", []):
                problems.append(f"N={world_size:,} {impl}: {problem}")
            if "error" in result:
                problems.append(f"N={world_size:,} {impl}: {result['error']}")
            baseline = results[world_size, "baseline"].get("rss")
            rows.append(result_row(world_size, impl, result, baseline, skipped))
        by_impl = {impl: results[world_size, impl] for impl in IMPLEMENTATIONS}
        problems += [f"N={world_size:,}: {p}" for p in compare_dims(by_impl)]

    print(
        table(
            [
                "N",
                "implementation",
                "build (median)",
                "build (best)",
                "new_group calls",
                "groups joined",
                "real",
                "rank sets",
                "peak RSS (MiB)",
                "over baseline",
                "during build",
            ],
            rows,
            right=tuple(range(2, 11)),
        )
    )
    print()
    ratio_rows = []
    for world_size in args.sizes:
        mine = results[world_size, "meshconf"]
        cells = [f"{world_size:,}"]
        for impl in ("torchtitan", "torch"):
            other = results[world_size, impl]
            for key in ("build", "best"):
                if key in mine and key in other:
                    ratio = other[key] / mine[key]
                    cells.append(f"{ratio:.1f}x" if ratio < 10 else f"{ratio:.0f}x")
                else:
                    cells.append("timeout" if "timeout" in other else "n/a")
        ratio_rows.append(cells)
    print("Build time relative to meshconf's (ratio of the medians, ratio of the bests):\n")
    print(
        table(
            [
                "N",
                "torchtitan / meshconf (median)",
                "(best)",
                "torch init_device_mesh / meshconf (median)",
                "(best)",
            ],
            ratio_rows,
            right=(1, 2, 3, 4),
        )
    )
    print()
    check_rows = []
    for world_size in args.sizes:
        result = results[world_size, "meshconf"]
        check = result.get("check")
        if check:
            check_rows.append(
                f"- N={world_size:,}: meshconf counters: new_group_calls "
                f"{check['counters.new_group_calls']}, real_groups {check['counters.real_groups']}"
                f", fake_groups {check['counters.fake_groups']}, default_group_reuses "
                f"{check['counters.default_group_reuses']}; ctx.build_seconds "
                f"{fmt_time(check['build_seconds'])} (first process); simulate() (median) "
                f"{fmt_time(result['setup'])}"
            )
    print("Cross-checks:\n")
    print("\n".join(check_rows))
    same = not any("differ on" in problem for problem in problems)
    print(
        f"- Same ranks along every common (domain, dim) in all implementations: "
        f"{'yes' if same else 'NO'}"
    )
    for problem in problems:
        print(f"- PROBLEM: {problem}")
    print()
    if args.plot:
        print(plot(Path(args.plot), args.sizes, results, degrees_text))
    load_end = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(
        f"Total benchmark time: {time.perf_counter() - started:.0f} s; 1-minute load "
        f"average {load_start:.2f} at the start, {load_end:.2f} at the end"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
