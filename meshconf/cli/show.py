"""``meshconf show PATH``: every domain's dims, strides, groups and node locality for a rank."""

from __future__ import annotations

import argparse
import dataclasses
import json
from collections.abc import Sequence
from typing import Any

from meshconf.cli.common import (
    EXIT_OK,
    UsageError,
    add_gpus_per_node_option,
    add_rank_options,
    add_source_options,
    emit,
    load_for_rank,
    prints_json,
    table_lines,
    warnings_json,
)
from meshconf.cli.model_arguments import add_model_options
from meshconf.cli.model_options import show_estimate
from meshconf.core.degrees import WORLD_FACTORS
from meshconf.core.hierarchy import split_degrees
from meshconf.core.layout import DomainLayout, RankGroup, process_group_count
from meshconf.core.levels import crossed_levels, unit_article
from meshconf.features.plan.topology import config_warnings
from meshconf.model.config import MeshConfig

_SHOWN_RANKS = 8
#: ``--format json`` lists at most this many ranks of a group (``group_size`` counts them all).
JSON_GROUP_RANKS = 4096
#: ``--full-groups`` lists every rank of groups up to this size, and refuses larger ones.
MAX_FULL_GROUP = 1 << 20


def _leading_ranks(group: RankGroup, count: int) -> list[int]:
    """The first ``count`` ranks of ``group`` (the last mode fastest), counted in mixed radix
    so that nothing grows with the group."""
    modes = group.modes
    index = [0] * len(modes)
    ranks: list[int] = []
    for _ in range(min(count, group.size)):
        ranks.append(
            group.base + sum(i * mode.stride for i, mode in zip(index, modes, strict=True))
        )
        for position in reversed(range(len(modes))):
            index[position] += 1
            if index[position] < modes[position].size:
                break
            index[position] = 0
    return ranks


def _dim_entry(
    layout: DomainLayout, name: str, rank: int, config: MeshConfig, listed: int
) -> dict[str, Any]:
    dim = layout.dim(name)
    gpus_per_node = config.node_size
    placement = None if gpus_per_node is None else layout.placement(name, gpus_per_node)
    group = layout.group(rank, name)
    entry = {
        "name": dim.name,
        "size": dim.size,
        "stride": dim.stride,
        "modes": [[mode.size, mode.stride] for mode in dim.modes],
        "num_groups": layout.num_groups(name),
        "group": _leading_ranks(group, listed),
        "group_size": group.size,
        "group_last": group.base + sum((mode.size - 1) * mode.stride for mode in group.modes),
        "crosses_nodes": None if placement is None else placement != "intra-node",
        "placement": placement,
    }
    if config.levels is not None:
        entry["crosses"] = list(crossed_levels(layout, name, config.topology))
    return entry


def build_report(
    config: MeshConfig, rank: int, domains: list[str], listed: int = JSON_GROUP_RANKS
) -> dict[str, Any]:
    """The data of ``show --format json``: each group's first ``listed`` ranks, its size and
    its last rank."""
    layouts = config.layouts
    levels = (
        {}
        if config.levels is None
        else {
            "levels": [dataclasses.asdict(level) for level in config.topology],
            "inside": config.inside,
            "bands": _bands(config),
        }
    )
    return {
        "world_size": config.resolved_world_size,
        "gpus_per_node": config.gpus_per_node,
        "inside_node": None if config.inside_node is None else config.inside_node.model_dump(),
        **levels,
        "order": list(config.order or WORLD_FACTORS),
        "rank": rank,
        "domains": {
            domain: {
                "dims": [
                    _dim_entry(layouts[domain], name, rank, config, listed)
                    for name in layouts[domain].dim_names
                ]
            }
            for domain in domains
        },
        "coordinates": {domain: layouts[domain].coordinate(rank) for domain in domains},
        "process_groups_per_rank": process_group_count(list(layouts.values()), rank),
        "warnings": warnings_json(config_warnings(config)),
    }


def _bands(config: MeshConfig) -> list[dict[str, Any]] | None:
    bands = None if config.inside is None else config.placement_bands
    return None if bands is None else [{"place": place, "parts": parts} for place, parts in bands]


def _ranks_text(dim: dict[str, Any]) -> str:
    group, size = dim["group"], dim["group_size"]
    if size <= _SHOWN_RANKS or len(group) == size:
        return ", ".join(map(str, group))
    head = ", ".join(map(str, group[:3]))
    return f"{head}, ..., {dim['group_last']} ({size} ranks)"


def left_out(config: MeshConfig, domains: list[str]) -> tuple[list[str], dict[str, str]]:
    """What the text view leaves out as trivial without ``--all``: the dims of size 1, and
    each domain whose dims all have size 1 or that holds the ``ep`` dim when ep is 1 (expert
    layers then use the dense meshes), with the reason; in config order."""
    layouts = config.layouts
    sizes = config.dim_sizes
    dims = [
        name
        for name in dict.fromkeys(name for domain in domains for name in layouts[domain].dim_names)
        if sizes[name] == 1
    ]
    reasons = {}
    for domain in domains:
        names = layouts[domain].dim_names
        if all(sizes[name] == 1 for name in names):
            reasons[domain] = "only dims of size 1"
        elif "ep" in names and sizes["ep"] == 1:
            reasons[domain] = "ep is 1"
    return dims, reasons


def report_text(
    config: MeshConfig,
    report: dict[str, Any],
    hidden: tuple[list[str], dict[str, str]] = ([], {}),
    extra: Sequence[str] = (),
) -> None:
    hidden_dims, hidden_domains = hidden
    rank = report["rank"]
    _print_layout(config, report)
    if hidden_dims or hidden_domains:
        parts = [f"dims {', '.join(hidden_dims)} (size 1)"] if hidden_dims else []
        for reason in dict.fromkeys(hidden_domains.values()):
            names = [domain for domain, why in hidden_domains.items() if why == reason]
            parts.append(f"domain{'s' if len(names) > 1 else ''} {', '.join(names)} ({reason})")
        print(f"not shown (trivial; --all shows them): {'; '.join(parts)}")
    for domain, body in report["domains"].items():
        if domain not in hidden_domains:
            coordinate = report["coordinates"][domain]
            _print_domain(config, rank, domain, body["dims"], coordinate, hidden_dims)
    print(
        f"\nrank {rank} belongs to {report['process_groups_per_rank']} distinct process groups "
        "of more than one rank across all domains"
    )
    for line in extra:
        print(line)


def _print_layout(config: MeshConfig, report: dict[str, Any]) -> None:
    nodes = "" if config.gpus_per_node is None else f", {config.gpus_per_node} GPUs per node"
    if config.levels is not None:
        nodes = ", levels " + " ".join(f"{level.name}={level.size}" for level in config.topology)
    print(f"world_size {report['world_size']}{nodes}; showing rank {report['rank']}")
    degrees = config.resolved_degrees
    print("degrees: " + " ".join(f"{name}={value}" for name, value in degrees.items()))
    sizes = config.dim_sizes
    derived = [f"{name}={sizes[name]}" for name in config.effective_derived if name in sizes]
    print("derived: " + " ".join(derived))
    if config.order is not None:
        print("rank order, outer to inner: " + " ".join(config.order))
    if config.inside_node is not None:
        inside, across = split_degrees(degrees, config.inside_node.model_dump())
        print(f"inside each node: {_sizes_text(inside)}; across nodes: {_sizes_text(across)}")
    for level, kept in (config.inside or {}).items():
        print(f"kept inside {unit_article(level)}: {', '.join(kept)}")
    for band in report.get("bands") or ():
        if any(size > 1 for size in band["parts"].values()):
            print(f"placed {band['place']}: {_sizes_text(band['parts'])}")
    for warning in report["warnings"]:
        print(f"warning: {warning['key']}: {warning['message']}")


def _sizes_text(sizes: dict[str, int]) -> str:
    """The sizes above 1, ``tp=8 cp=2``, or ``-`` when none is."""
    return " ".join(f"{name}={size}" for name, size in sizes.items() if size > 1) or "-"


def _print_domain(
    config: MeshConfig,
    rank: int,
    domain: str,
    all_dims: list[dict[str, Any]],
    coordinate: dict[str, int],
    hidden_dims: list[str],
) -> None:
    shape = ", ".join(f"{dim['name']}={dim['size']}" for dim in all_dims)
    dims = [dim for dim in all_dims if dim["name"] not in hidden_dims]
    print(f"\ndomain {domain} [{shape}]")
    if not dims:
        print(f"  every dim has size 1: rank {rank} is alone in each of its groups")
        return
    heading = "crosses" if config.levels is not None else "placement"
    # The headings padded to the narrowest their columns are.
    padded = [f"{'size':>7}", f"{'stride':>7}", f"{'groups':>7}", f"{heading:<10}"]
    rows = [["dim", *padded, f"group of rank {rank}"]]
    for dim in dims:
        # A dim placed partly inside and partly across nodes has one stride per part.
        strides = ",".join(str(stride) for _, stride in dim["modes"])
        # With levels, where a group sits is the levels it crosses, not one word.
        where = ",".join(dim["crosses"]) or "none" if "crosses" in dim else dim["placement"] or "-"
        counts = [str(dim["size"]), strides, str(dim["num_groups"])]
        rows.append([dim["name"], *counts, where, _ranks_text(dim)])
    for line in table_lines(rows, range(1, 4)):
        print(f"  {line}")
    shown = " ".join(f"{k}={v}" for k, v in coordinate.items() if k not in hidden_dims)
    print(f"  coordinate of rank {rank}: {shown}")


def run(args: argparse.Namespace) -> int:
    config = load_for_rank(args)
    layouts = config.layouts
    domains = list(layouts) if args.domain is None else [args.domain]
    if args.full_groups:
        largest = max(dim.size for domain in domains for dim in layouts[domain].dims)
        if largest > MAX_FULL_GROUP:
            raise UsageError(
                f"--full-groups: a group of {largest} ranks is more than the {MAX_FULL_GROUP} "
                "it lists; leave the option out to see each group's first ranks and size"
            )
        listed = MAX_FULL_GROUP
    else:
        listed = JSON_GROUP_RANKS if args.format == "json" else _SHOWN_RANKS
    report = build_report(config, args.rank, domains, listed)
    estimate_lines = show_estimate(args, config, report)
    if args.format == "json":
        emit(lambda: print(json.dumps(report)))
    else:
        # A domain asked for by name is shown even when trivial.
        dims, trivial_domains = left_out(config, domains)
        hidden = ([], {}) if args.all else (dims, {} if args.domain else trivial_domains)
        emit(lambda: report_text(config, report, hidden, estimate_lines))
    return EXIT_OK


def add_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "show",
        help="show each domain's dims, strides, groups and node placement",
        description="Show, for one rank, every domain's dims with size, stride, number of "
        "groups, the rank's group and, given gpus_per_node, where the groups sit: inside one "
        "node, one rank per node, or mixed; and warn when tp, etp or cp groups leave a node.",
    )
    add_rank_options(parser, "the rank to show (default: 0)")
    parser.add_argument("--domain", metavar="D", help="show only this domain")
    parser.add_argument(
        "--all",
        action="store_true",
        help="also show the dims of size 1 and the trivial domains (those with the ep dim "
        "when ep is 1, or with only dims of size 1); --format json always has them",
    )
    parser.add_argument(
        "--explain",
        action="store_true",
        help="with a model (--model, --model-file or the config's training.model): the "
        "memory by term, what each holds and its source",
    )
    parser.add_argument(
        "--full-groups",
        action="store_true",
        help=f"list every rank of each group (groups up to {MAX_FULL_GROUP} ranks); by "
        f"default text shows {_SHOWN_RANKS} and JSON {JSON_GROUP_RANKS}",
    )
    add_gpus_per_node_option(parser, "to place groups on nodes")
    add_source_options(parser)
    add_model_options(parser)
    parser.set_defaults(run=run, prints_data=prints_json)
