"""``meshconf plan --world-size N``: every valid assignment of the degrees, ranked by node
locality or, with a model, by fit and estimated step time; ``--emit`` prints one as a
config."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from meshconf.cli.common import EXIT_OK, bounded_number, emit, positive_int, usage_error
from meshconf.cli.estimate_options import model_request, training_block
from meshconf.cli.model_options import add_model_options, model_words
from meshconf.cli.plan_report import emitted_yaml, explained_row, json_report, print_table
from meshconf.core.degrees import DEGREE_NAMES, WORLD_FACTORS
from meshconf.core.domains import MAX_NAME_LENGTH, NAME_PATTERN
from meshconf.core.levels import Level
from meshconf.core.messages import shorten, spoken_list
from meshconf.features.plan.ranking import (
    make_plan,
)
from meshconf.features.plan.request import (
    PlanError,
    Request,
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
        text = emitted_yaml(
            plan, numbers["emit"], model_words(args), training_block(args, training)
        )
        emit(lambda: print(text, end=""))
    elif "explain" in numbers:
        lines = explained_row(plan, numbers["explain"])
        emit(lambda: print("\n".join(lines)))
    elif args.format == "json":
        report = json_report(plan)
        emit(lambda: print(json.dumps(report)))
    else:
        emit(lambda: print_table(plan))
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
