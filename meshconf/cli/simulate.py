"""``meshconf simulate PATH``: build every domain's meshes for one rank of a world of any size,
in this process, against torch's fake process group, and check them against the rank arithmetic
of the degrees (meshconf.runtime.oracle), which is written apart from the layouts."""

from __future__ import annotations

import argparse
import time
from typing import Any

from meshconf.cli.common import (
    EXIT_INVALID,
    EXIT_OK,
    add_source_options,
    emit,
    load_for_rank,
    non_negative_int,
    usage_error,
)
from meshconf.core.errors import MeshconfError


def run(args: argparse.Namespace) -> int:
    config = load_for_rank(args)
    if isinstance(config, int):
        return config
    world_size = config.resolved_world_size
    assert world_size is not None
    try:
        from meshconf.runtime import DistributedContext
    except MeshconfError as error:
        return usage_error(str(error))
    start = time.perf_counter()
    context = DistributedContext.simulate(config, rank=args.rank, world_size=world_size)
    try:
        meshes = context.build_all()
        built = time.perf_counter() - start
        problems = context.mismatched_groups()
        counters = context.counters
    finally:
        context.close()

    def report() -> None:
        print(
            f"simulated rank {args.rank} of {world_size} against torch's fake process group: "
            f"{len(meshes)} domains built in {built:.3f} s"
        )
        for domain, mesh in meshes.items():
            shape = ", ".join(
                f"{name}={size}"
                for name, size in zip(mesh.mesh_dim_names or (), mesh.shape, strict=True)
            )
            verdict = "mismatch" if any(p.startswith(f"{domain}.") for p in problems) else "ok"
            print(f"  {domain} [{shape}]: groups {verdict}")
        for problem in problems:
            print(f"  MISMATCH {problem}")
        print(
            f"process groups of rank {args.rank}: {counters.new_group_calls} new_group calls, "
            f"{counters.real_groups} real groups, {counters.fake_groups} fake (size-1) groups, "
            f"{counters.default_group_reuses} reuses of the default group, "
            f"{counters.cache_hits} dims served by an existing group"
        )
        if not problems:
            print(
                "every group and local rank equals the rank arithmetic of the degrees, "
                "computed apart from the layouts"
            )

    emit(report)
    return EXIT_INVALID if problems else EXIT_OK


def add_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "simulate",
        help="build every mesh for one rank of a simulated world and check it",
        description="Build every domain's DeviceMesh for one rank, in this process, against "
        "torch's fake process group (any world size, no GPUs), and check every group against "
        "the rank arithmetic of the degrees, computed apart from the layouts. Needs torch "
        "(pip install 'meshconf[torch]').",
    )
    parser.add_argument("path", metavar="PATH")
    parser.add_argument("--rank", type=non_negative_int, default=0, metavar="R")
    add_source_options(parser, formats=False)
    parser.set_defaults(run=run)
