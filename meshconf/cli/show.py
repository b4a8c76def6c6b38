"""``meshconf show PATH``: every domain's dims, strides, groups and node locality for a rank."""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from typing import Any

from meshconf.cli.common import (
    EXIT_OK,
    add_gpus_per_node_option,
    add_source_options,
    emit,
    load_for_rank,
    non_negative_int,
)
from meshconf.cli.estimate_options import add_model_options, show_estimate
from meshconf.core.errors import format_key
from meshconf.core.hierarchy import split_degrees
from meshconf.core.layout import DomainLayout, process_group_count
from meshconf.features.topology import topology_warnings
from meshconf.model.config import MeshConfig

_SHOWN_RANKS = 8


def _dim_entry(
    layout: DomainLayout, name: str, rank: int, gpus_per_node: int | None
) -> dict[str, Any]:
    dim = layout.dim(name)
    placement = None if gpus_per_node is None else layout.placement(name, gpus_per_node)
    return {
        "name": dim.name,
        "size": dim.size,
        "stride": dim.stride,
        "modes": [[mode.size, mode.stride] for mode in dim.modes],
        "num_groups": layout.num_groups(name),
        "group": layout.group(rank, name).ranks(),
        "crosses_nodes": None if placement is None else placement != "intra-node",
        "placement": placement,
    }


def build_report(config: MeshConfig, rank: int, domains: list[str]) -> dict[str, Any]:
    """The data of ``show --format json``."""
    layouts = config.layouts
    return {
        "world_size": config.resolved_world_size,
        "gpus_per_node": config.gpus_per_node,
        "inside_node": None if config.inside_node is None else config.inside_node.model_dump(),
        "rank": rank,
        "domains": {
            domain: {
                "dims": [
                    _dim_entry(layouts[domain], name, rank, config.gpus_per_node)
                    for name in layouts[domain].dim_names
                ]
            }
            for domain in domains
        },
        "coordinates": {domain: layouts[domain].coordinate(rank) for domain in domains},
        "process_groups_per_rank": process_group_count(list(layouts.values()), rank),
        "warnings": [
            {"key": format_key(warning.path), "message": warning.message}
            for warning in (
                topology_warnings(config, config.gpus_per_node) if config.gpus_per_node else []
            )
        ],
    }


def _ranks_text(group: list[int]) -> str:
    if len(group) <= _SHOWN_RANKS:
        return ", ".join(map(str, group))
    head = ", ".join(map(str, group[:3]))
    return f"{head}, ..., {group[-1]} ({len(group)} ranks)"


def report_text(config: MeshConfig, report: dict[str, Any], extra: Sequence[str] = ()) -> None:
    rank = report["rank"]
    nodes = "" if config.gpus_per_node is None else f", {config.gpus_per_node} GPUs per node"
    print(f"world_size {report['world_size']}{nodes}; showing rank {rank}")
    degrees = config.resolved_degrees
    print("degrees: " + " ".join(f"{name}={value}" for name, value in degrees.items()))
    sizes = config.dim_sizes
    derived = [f"{name}={sizes[name]}" for name in config.effective_derived if name in sizes]
    print("derived: " + " ".join(derived))
    if config.inside_node is not None:
        inside, across = split_degrees(degrees, config.inside_node.model_dump())
        print(
            "inside each node: "
            + (" ".join(f"{name}={size}" for name, size in inside.items() if size > 1) or "-")
            + "; across nodes: "
            + (" ".join(f"{name}={size}" for name, size in across.items() if size > 1) or "-")
        )
    for warning in report["warnings"]:
        print(f"warning: {warning['key']}: {warning['message']}")
    for domain, body in report["domains"].items():
        dims = body["dims"]
        shape = ", ".join(f"{dim['name']}={dim['size']}" for dim in dims)
        print(f"\ndomain {domain} [{shape}]")
        width = max(len("dim"), *(len(dim["name"]) for dim in dims))
        # A dim placed partly inside and partly across nodes has one stride per part.
        strides = {dim["name"]: ",".join(str(stride) for _, stride in dim["modes"]) for dim in dims}
        stride_width = max(7, *(len(text) for text in strides.values()))
        print(
            f"  {'dim':<{width}}  {'size':>7}  {'stride':>{stride_width}}  {'groups':>7}  "
            f"placement   group of rank {rank}"
        )
        for dim in dims:
            stride = strides[dim["name"]]
            print(
                f"  {dim['name']:<{width}}  {dim['size']:>7}  {stride:>{stride_width}}  "
                f"{dim['num_groups']:>7}  {dim['placement'] or '-':<10}  "
                f"{_ranks_text(dim['group'])}"
            )
        coordinate = " ".join(f"{k}={v}" for k, v in report["coordinates"][domain].items())
        print(f"  coordinate of rank {rank}: {coordinate}")
    print(
        f"\nrank {rank} belongs to {report['process_groups_per_rank']} distinct process groups "
        "of more than one rank across all domains"
    )
    for line in extra:
        print(line)


def run(args: argparse.Namespace) -> int:
    config = load_for_rank(args)
    if isinstance(config, int):
        return config
    layouts = config.layouts
    domains = list(layouts) if args.domain is None else [args.domain]
    report = build_report(config, args.rank, domains)
    estimate_lines = show_estimate(args, config, report)
    if isinstance(estimate_lines, int):
        return estimate_lines
    if args.format == "json":
        emit(lambda: print(json.dumps(report)))
    else:
        emit(lambda: report_text(config, report, estimate_lines))
    return EXIT_OK


def add_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "show",
        help="show each domain's dims, strides, groups and node placement",
        description="Show, for one rank, every domain's dims with size, stride, number of "
        "groups, the rank's group and, given gpus_per_node, where the groups sit: inside one "
        "node, one rank per node, or mixed; and warn when tp, etp or cp groups leave a node.",
    )
    parser.add_argument("path", metavar="PATH")
    parser.add_argument("--rank", type=non_negative_int, default=0, metavar="R")
    parser.add_argument("--domain", metavar="D", help="show only this domain")
    add_gpus_per_node_option(parser, "to place groups on nodes")
    add_source_options(parser)
    add_model_options(parser)
    parser.set_defaults(run=run)
