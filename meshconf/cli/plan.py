"""``meshconf plan --world-size N``: every valid assignment of the degrees, ranked by node
locality or, with a model, by fit and estimated step time; ``--emit`` prints one as a
config."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from collections.abc import Sequence
from typing import Any

import yaml

from meshconf.cli.common import EXIT_OK, bounded_number, emit, positive_int, usage_error
from meshconf.cli.estimate_explain import explain_lines
from meshconf.cli.estimate_options import model_request, training_block
from meshconf.cli.estimate_report import gib, headroom_gib, memory_json, memory_lines, settings_line
from meshconf.cli.model_options import add_model_options, model_words
from meshconf.core.degrees import DEGREE_NAMES, WORLD_FACTORS
from meshconf.core.domains import MAX_NAME_LENGTH, NAME_PATTERN
from meshconf.core.levels import Level, plural_units, unit_article
from meshconf.core.messages import shorten, spoken_list
from meshconf.core.training import GIB
from meshconf.features.plan.ranking import (
    Assignment,
    DimLocality,
    Plan,
    build_config,
    config_data,
    make_plan,
    rationale,
)
from meshconf.features.plan.request import (
    PlanError,
    Request,
    level_text,
    node_warning,
    option_flag,
)
from meshconf.model.fields import MAX_BANDWIDTH_GB_S, MAX_LEVELS

DEFAULT_LIMIT = 10
#: The options that take an integer >= 1, checked by ``run`` so that a bad value is one line.
_NUMBER_OPTIONS = ("world_size", "gpus_per_node", *DEGREE_NAMES, "limit", "emit", "explain")


def _numbers(args: argparse.Namespace) -> dict[str, int] | str:
    """The integer options that were given, or the message of the first bad one."""
    numbers: dict[str, int] = {}
    for name in _NUMBER_OPTIONS:
        text = getattr(args, name)
        if text is None:
            continue
        try:
            numbers[name] = positive_int(text)
        except argparse.ArgumentTypeError as error:
            return f"{option_flag(name)}: {error}"
    if "world_size" not in numbers:
        return "--world-size N is required"
    return numbers


def _levels(args: argparse.Namespace) -> tuple[Level, ...] | str:
    """The ``--level NAME=SIZE[@GB/S]`` options, or the message of the first bad one."""
    levels: list[Level] = []
    for text in args.level or ():
        name, equals, rest = text.partition("=")
        size, at, bandwidth = rest.partition("@")
        if not equals or NAME_PATTERN.fullmatch(name) is None or len(name) > MAX_NAME_LENGTH:
            return (
                f"--level {shorten(text)!r}: expected NAME=SIZE or NAME=SIZE@GB/S, such as "
                "nvlink=72@900 (NAME: letters, digits and '_')"
            )
        try:
            level = Level(
                name,
                positive_int(size),
                bounded_number(
                    bandwidth,
                    minimum=0.01,
                    maximum=MAX_BANDWIDTH_GB_S,
                    beyond="far past any link built",
                )
                if at
                else None,
            )
        except argparse.ArgumentTypeError as error:
            return f"--level {shorten(text)!r}: {error}"
        levels.append(level)
    if len(levels) > MAX_LEVELS:
        return f"--level: {len(levels)} levels are more than {MAX_LEVELS}"
    return tuple(levels)


def _command_line(request: Request, index: int, model_words: list[str]) -> str:
    """The command that prints this config again, options in a fixed order."""
    words = ["meshconf plan", f"--world-size {request.world_size}"]
    if request.gpus_per_node is not None:
        words.append(f"--gpus-per-node {request.gpus_per_node}")
    words += [f"--level {level_text(level)}" for level in request.levels]
    if request.order is not None:
        words.append(f"--order {','.join(request.order)}")
    words += [
        f"{option_flag(name)} {request.pins[name]}" for name in DEGREE_NAMES if name in request.pins
    ]
    words += model_words
    words.append(f"--emit {index}")
    return " ".join(words)


def _dims_text(dims: Sequence[DimLocality]) -> str:
    return " ".join(f"{dim.name}({dim.size})" for dim in dims) or "-"


def _split(dims: list[DimLocality], levels: int = 1) -> list[str]:
    """The dims of more than one rank by how many of ``levels`` levels their groups cross,
    the most first: with nodes alone, those that cross nodes and those that stay in one."""
    used = [dim for dim in dims if dim.size > 1]
    return [
        _dims_text([dim for dim in used if len(dim.crossed) == count])
        for count in reversed(range(levels + 1))
    ]


def _split_headings(request: Request) -> list[str]:
    """The headings of :func:`_split`'s columns: ``groups cross nodes``, ``groups stay in a
    node``, and with levels above the node, where between them the groups sit."""
    names = [level.name for level in request.topology]
    headings = [f"groups cross {plural_units(names[-1])}"]
    for count in reversed(range(1, len(names))):
        headings.append(f"cross {plural_units(names[count - 1])}, in {unit_article(names[count])}")
    return [*headings, "groups stay in a node"]


class _ConfigDumper(yaml.SafeDumper):
    """Lists on one line, as the examples write ``order``."""


def _flow_list(dumper: yaml.SafeDumper, items: list[str]) -> yaml.Node:
    return dumper.represent_sequence("tag:yaml.org,2002:seq", items, flow_style=True)


_ConfigDumper.add_representer(list, _flow_list)


def _emit_yaml(plan: Plan, index: int, model_words: list[str], training: dict[str, Any]) -> str:
    request = plan.request
    assignment = plan.best[index - 1]
    config = build_config(request, assignment.degrees)
    columns = _split(rationale(request, config), len(request.topology))
    locality = (
        "# groups "
        + "; ".join(
            f"{heading.removeprefix('groups ')}: {dims}"
            for heading, dims in zip(_split_headings(request), columns, strict=True)
        )
        + "\n"
        if request.gpus_per_node is not None
        else ""
    )
    data = config_data(request, assignment.degrees)
    if training:
        data["training"] = training
    body = yaml.dump(data, Dumper=_ConfigDumper, sort_keys=False)
    return (
        f"# {_command_line(request, index, model_words)} (assignment {index} of {plan.total})"
        f"\n{locality}{_estimate_comment(assignment)}{body}"
    )


def _explained(plan: Plan, index: int) -> list[str]:
    """Row ``index`` with its memory by term, what each holds and its source."""
    request = plan.request
    assignment = plan.best[index - 1]
    found = assignment.estimate
    assert request.model is not None and found is not None
    degrees = " ".join(f"{name}={assignment.degrees[name]}" for name in WORLD_FACTORS)
    return [
        f"assignment {index} of {plan.total}: {degrees}",
        settings_line(request.model, request.training),
        *memory_lines(found, request.training),
        *explain_lines(found, request.training),
    ]


def _estimate_comment(assignment: Assignment) -> str:
    found = assignment.estimate
    if found is None:
        return ""
    verdict = "fits" if found.fits else "does NOT fit"
    return (
        f"# estimated: {gib(found.memory.total):g} GiB per GPU ({verdict}), "
        f"step {found.step_seconds:.3g} s, {found.exposed_seconds:.3g} s of it communication "
        "not hidden\n"
    )


def _header(plan: Plan) -> list[str]:
    request = plan.request
    gpus = request.gpus_per_node
    if gpus is None:
        world = f"world_size {request.world_size}"
    elif request.world_size % gpus == 0:
        world = (
            f"world_size {request.world_size} = {request.world_size // gpus} nodes x {gpus} GPUs"
        )
    else:
        world = f"world_size {request.world_size}, {gpus} GPUs per node"
    pins = " ".join(f"{name}={value}" for name, value in request.pins.items()) or "none"
    order = "" if request.order is None else f"; order: {', '.join(request.order)}"
    shown = len(plan.best)
    if plan.total == 1:
        count = "1 valid assignment"
    else:
        which = f"the best {shown}" if shown < plan.total else "all"
        count = f"{plan.total} valid assignments; {which}, best first (ranking: docs/plan.md)"
    lines = [f"{world}; pinned: {pins}{order}"]
    if request.model is not None:
        lines.append(settings_line(request.model, request.training))
        fit = f"{plan.fitting} fit in {request.training.gpu_memory_gib:g} GiB"
        count = count.replace(";", f"; {fit};", 1) if ";" in count else f"{count}; {fit}"
    lines.append(count)
    if plan.left_out_by_order:
        lines.append(
            f"{plan.left_out_by_order} more left out: under this order their expert dims would "
            "split world factors unevenly"
        )
    if gpus is None:
        lines.append(
            "no --gpus-per-node: node locality unknown; ranked by smaller pp, dp_replicate, cp, "
            "dp_shard in turn"
        )
    return lines


def _rows(plan: Plan) -> list[list[str]]:
    """The table, header first: index, world factors, rationale."""
    located = plan.request.gpus_per_node is not None
    estimated = plan.request.model is not None
    header = ["#", *WORLD_FACTORS]
    header += ["GiB", "headroom", "step s", "compute s", "exposed s"] if estimated else []
    header += _split_headings(plan.request) if located else ["dims (ranks)"]
    rows = [header]
    for index, assignment in enumerate(plan.best, start=1):
        dims = rationale(plan.request, build_config(plan.request, assignment.degrees))
        cells = [str(index), *(str(assignment.degrees[name]) for name in WORLD_FACTORS)]
        found = assignment.estimate
        if found is not None:
            gpu = plan.request.training.gpu_memory_gib
            headroom = "-" if found.problem else f"{headroom_gib(found, gpu):.1f}"
            cells += [
                f"{found.memory.total / GIB:.1f}",
                headroom,
                f"{found.step_seconds:.3g}",
                f"{found.compute_seconds:.3g}",
                f"{found.exposed_seconds:.3g}",
            ]
        levels = len(plan.request.topology)
        cells += _split(dims, levels) if located else [_dims_text([d for d in dims if d.size > 1])]
        rows.append(cells)
    return rows


def _print_table(plan: Plan) -> None:
    print("\n".join(_header(plan)))
    rows = _rows(plan)
    numeric = 1 + len(WORLD_FACTORS) + (5 if plan.request.model is not None else 0)
    widths = [max(len(row[column]) for row in rows) for column in range(len(rows[0]))]
    for row in rows:
        cells = [
            cell.rjust(width) if column < numeric else cell.ljust(width)
            for column, (cell, width) in enumerate(zip(row, widths, strict=True))
        ]
        print("  ".join(cells).rstrip())


def _json_entry(plan: Plan, index: int, assignment: Assignment) -> dict[str, Any]:
    dims = rationale(plan.request, build_config(plan.request, assignment.degrees))
    entry: dict[str, Any] = {
        "index": index,
        "degrees": dict(assignment.degrees),
        "dims": [
            {"name": dim.name, "size": dim.size, "crosses_nodes": dim.crosses_nodes}
            | ({"crosses": list(dim.crossed)} if plan.request.levels else {})
            for dim in dims
        ],
    }
    if assignment.estimate is not None:
        entry.update(memory_json(assignment.estimate, plan.request.training.gpu_memory_gib))
    return entry


def _json_report(plan: Plan) -> dict[str, Any]:
    request = plan.request
    report: dict[str, Any] = {
        "world_size": request.world_size,
        "gpus_per_node": request.gpus_per_node,
        **(
            {"levels": [dataclasses.asdict(level) for level in request.levels]}
            if request.levels
            else {}
        ),
        "pins": dict(request.pins),
        "order": list(request.rank_order),
        "total": plan.total,
        "left_out_by_order": plan.left_out_by_order,
        "assignments": [
            _json_entry(plan, index, assignment)
            for index, assignment in enumerate(plan.best, start=1)
        ],
    }
    if request.model is not None:
        report["model"] = request.model.name
        report["training"] = dict(request.training.__dict__)
        report["fitting"] = plan.fitting
    return report


def run(args: argparse.Namespace) -> int:
    numbers = _numbers(args)
    if isinstance(numbers, str):
        return usage_error(numbers)
    if "emit" in numbers and args.format == "json":
        return usage_error("--emit prints a YAML config; leave out --format json")
    if "explain" in numbers and ("emit" in numbers or args.format == "json"):
        return usage_error(
            "--explain prints one row's memory as text; leave out --emit and --format json"
        )
    modelled = model_request(args)
    if isinstance(modelled, int):
        return modelled
    model, training = modelled
    levels = _levels(args)
    if isinstance(levels, str):
        return usage_error(levels)
    request = Request(
        world_size=numbers["world_size"],
        levels=levels,
        gpus_per_node=numbers.get("gpus_per_node"),
        pins={name: numbers[name] for name in DEGREE_NAMES if name in numbers},
        model=model,
        training=training,
        order=None if args.order is None else tuple(args.order.split(",")),
    )
    if "explain" in numbers and model is None:
        return usage_error("--explain needs --model or --model-file")
    wanted = numbers.get("emit", numbers.get("explain", numbers.get("limit", DEFAULT_LIMIT)))
    try:
        plan = make_plan(request, wanted)
    except PlanError as error:
        return usage_error(str(error))
    warning = node_warning(request)
    if warning is not None:
        print(f"meshconf: warning: {warning}", file=sys.stderr)
    shown = next((name for name in ("emit", "explain") if name in numbers), None)
    if shown is not None and numbers[shown] > plan.total:
        return usage_error(
            f"--{shown} {numbers[shown]} is not a row: there are {plan.total} valid assignments"
        )
    if "emit" in numbers:
        text = _emit_yaml(plan, numbers["emit"], model_words(args), training_block(args, training))
        emit(lambda: print(text, end=""))
    elif "explain" in numbers:
        lines = _explained(plan, numbers["explain"])
        emit(lambda: print("\n".join(lines)))
    elif args.format == "json":
        report = _json_report(plan)
        emit(lambda: print(json.dumps(report)))
    else:
        emit(lambda: _print_table(plan))
    return EXIT_OK


def add_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "plan",
        help="list the valid degree assignments for a world size, ranked by node locality",
        description=f"List every assignment of {spoken_list(WORLD_FACTORS)} whose "
        "product is the world size, under the pinned degrees, ranked so that the groups "
        "with the most traffic stay inside a node; --emit prints one as a config.",
    )
    parser.add_argument("--world-size", metavar="N", help="the number of ranks (required)")
    parser.add_argument("--gpus-per-node", metavar="G", help="ranks per node, for locality")
    parser.add_argument(
        "--level",
        action="append",
        metavar="NAME=SIZE[@GB/S]",
        help="a level above the node, inner to outer, as a config's levels: GPUs in one unit "
        "and, optionally, the bandwidth inside it in GB/s per GPU (nvlink=72@900); repeat "
        "for each level. Groups' traffic is charged at the bandwidth of the smallest level "
        "that holds them",
    )
    for name in DEGREE_NAMES:
        parser.add_argument(option_flag(name), dest=name, metavar="D", help=f"pin {name} to D")
    parser.add_argument(
        "--order",
        metavar="F1,F2,...",
        help="the rank order of the world factors, outer to inner, as a config's order: "
        f"every one of {', '.join(WORLD_FACTORS)} once (default: that order)",
    )
    parser.add_argument(
        "--limit", metavar="K", help=f"show the best K assignments (default {DEFAULT_LIMIT})"
    )
    parser.add_argument(
        "--emit", metavar="INDEX", help="print assignment INDEX (1 is the best) as a config"
    )
    parser.add_argument(
        "--explain",
        metavar="INDEX",
        help="with a model: assignment INDEX's memory by term, what each holds and its source",
    )
    parser.add_argument(
        "--format",
        choices=("text", "json"),
        default="text",
        help="text: a table (default); json: the same as data",
    )
    add_model_options(parser)
    parser.set_defaults(run=run)
