"""``meshconf simulate PATH``: build every domain's meshes for some ranks of a world of any
size, in this process, against torch's fake process group, and check them against the rank
arithmetic of the degrees (meshconf.runtime.oracle), which is written apart from the layouts."""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass
from typing import Any

from meshconf.cli.common import (
    EXIT_INVALID,
    EXIT_OK,
    UsageError,
    add_source_options,
    emit,
    load_for_rank,
    non_negative_int,
)
from meshconf.core.errors import MeshconfError
from meshconf.core.messages import shorten
from meshconf.features.simulation import (
    check_simulation_memory,
    check_simulation_size,
    mebibytes,
)
from meshconf.model.config import MeshConfig


@dataclass(frozen=True)
class RankResult:
    rank: int
    shapes: dict[str, str]
    problems: list[str]
    counters: str


def rank_list(text: str) -> list[int]:
    """``--rank``'s value: ranks separated by commas (``0,77,16383``), each read as
    ``--rank`` is elsewhere.

    Raises:
        argparse.ArgumentTypeError: a part is not a rank.
    """
    parts = text.split(",")
    if not all(part.strip().isascii() and part.strip().isdigit() for part in parts):
        raise argparse.ArgumentTypeError(
            f"expected ranks (integers >= 0) separated by commas, got {shorten(text)!r}"
        )
    return [non_negative_int(part) for part in parts]


def _simulate_rank(config: MeshConfig, rank: int, world_size: int) -> RankResult:
    from meshconf.runtime import DistributedContext

    context = DistributedContext.simulate(config, rank=rank, world_size=world_size)
    try:
        meshes = context.build_all()
        problems = context.mismatched_groups()
        counters = context.counters
    finally:
        # The next rank needs a process without a default process group.
        context.close()
    shapes = {
        domain: ", ".join(
            f"{name}={size}"
            for name, size in zip(mesh.mesh_dim_names or (), mesh.shape, strict=True)
        )
        for domain, mesh in meshes.items()
    }
    return RankResult(
        rank,
        shapes,
        problems,
        f"{counters.new_group_calls} new_group calls, {counters.real_groups} real groups, "
        f"{counters.fake_groups} fake (size-1) groups, {counters.default_group_reuses} reuses "
        f"of the default group, {counters.cache_hits} dims served by an existing group",
    )


def _verdict(mismatched_ranks: list[int], *, several: bool) -> str:
    if not mismatched_ranks:
        return "ok"
    if not several:
        return "mismatch"
    plural = "s" if len(mismatched_ranks) > 1 else ""
    return f"mismatch on rank{plural} {', '.join(map(str, mismatched_ranks))}"


def run(args: argparse.Namespace) -> int:
    # Repeated --rank options and comma-separated lists add up; a rank given twice runs once.
    args.rank = list(dict.fromkeys(rank for ranks in args.rank or [[0]] for rank in ranks))
    config = load_for_rank(args)
    world_size = config.resolved_world_size
    assert world_size is not None
    try:
        # Size and memory before torch is loaded, so that what cannot fit is refused without
        # loading it; the memory again once torch holds what it needs for itself.
        check_simulation_size(world_size, len(args.rank))
        check_simulation_memory(world_size)
        import meshconf.runtime  # noqa: F401 - only to report a missing torch as a usage error

        need = check_simulation_memory(world_size)
    except MeshconfError as error:
        raise UsageError(str(error)) from None
    start = time.perf_counter()
    results = [_simulate_rank(config, rank, world_size) for rank in args.rank]
    built = time.perf_counter() - start
    mismatched = any(result.problems for result in results)

    def report() -> None:
        ranks = ", ".join(str(result.rank) for result in results)
        which = f"rank {ranks}" if len(results) == 1 else f"ranks {ranks}"
        each = "" if len(results) == 1 else " each,"
        print(
            f"simulated {which} of {world_size} against torch's fake process group: "
            f"{len(results[0].shapes)} domains{each} built in {built:.3f} s, "
            f"needing about {mebibytes(need)} for a world of this size"
        )
        for domain, shape in results[0].shapes.items():
            bad = [r.rank for r in results if any(p.startswith(f"{domain}.") for p in r.problems)]
            print(f"  {domain} [{shape}]: groups {_verdict(bad, several=len(results) > 1)}")
        for result in results:
            for problem in result.problems:
                where = "" if len(results) == 1 else f"rank {result.rank}: "
                print(f"  MISMATCH {where}{problem}")
        for result in results:
            print(f"process groups of rank {result.rank}: {result.counters}")
        if not mismatched:
            print(
                "every group and local rank equals the rank arithmetic of the degrees, "
                "computed apart from the layouts"
            )

    emit(report)
    return EXIT_INVALID if mismatched else EXIT_OK


def add_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "simulate",
        help="build every mesh for some ranks of a simulated world and check them",
        description="Build every domain's DeviceMesh for each given rank, one after the "
        "other in this process, against torch's fake process group (any world size, no "
        "GPUs), and check every group against the rank arithmetic of the degrees, computed "
        "apart from the layouts. Needs the torch extra.",
    )
    parser.add_argument("path", metavar="PATH", help="the config file")
    parser.add_argument(
        "--rank",
        type=rank_list,
        action="append",
        metavar="R[,R...]",
        help="the ranks to simulate: a comma-separated list, and the option repeats (default: 0)",
    )
    add_source_options(parser, formats=False)
    parser.set_defaults(run=run)
