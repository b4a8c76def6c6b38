"""``meshconf plan --world-size N``: every valid assignment of the degrees, ranked by node
locality or, with a model, by fit and tokens per second per GPU; ``--emit`` prints one as
a config."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from meshconf.cli.common import (
    EXIT_OK,
    UsageError,
    add_format_option,
    add_key_options,
    bounded_number,
    emit,
    positive_int,
)
from meshconf.cli.model_arguments import add_model_options
from meshconf.cli.model_options import model_request, model_words, planned_block
from meshconf.cli.plan_report import emitted_yaml, explained_row, json_report, print_table
from meshconf.core.degrees import DEGREE_NAMES, WORLD_FACTORS
from meshconf.core.domains import MAX_NAME_LENGTH, NAME_PATTERN
from meshconf.core.levels import NODE, Level
from meshconf.core.messages import shorten, spoken_list
from meshconf.features.plan.merge import Given, merged_request
from meshconf.features.plan.ranking import make_plan
from meshconf.features.plan.request import PlanError, level_text, node_warning, option_flag
from meshconf.features.plan.training_request import MODEL_OPTIONS_TEXT
from meshconf.model.config import MeshConfig
from meshconf.model.fields import MAX_BANDWIDTH_GB_S, MAX_LEVELS, MIN_BANDWIDTH_GB_S
from meshconf.sources.loading import load_located
from meshconf.sources.reading import Source

DEFAULT_LIMIT = 10
#: The options that take an integer >= 1, checked by ``run`` so that a bad value is one line.
_NUMBER_OPTIONS = ("world_size", "gpus_per_node", *DEGREE_NAMES, "limit", "emit", "explain")


def _numbers(args: argparse.Namespace) -> dict[str, int]:
    """The integer options that were given.

    Raises:
        UsageError: the first that is not an integer >= 1.
    """
    numbers: dict[str, int] = {}
    for name in _NUMBER_OPTIONS:
        text = getattr(args, name)
        if text is None:
            continue
        try:
            numbers[name] = positive_int(text)
        except argparse.ArgumentTypeError as error:
            raise UsageError(f"{option_flag(name)}: {error}") from None
    return numbers


def _levels(args: argparse.Namespace) -> tuple[Level | None, tuple[Level, ...]]:
    """The ``--level`` options: the node's (``--gpus-per-node N`` as ``--level node=N``), if
    given, and the others.

    Raises:
        UsageError: the first that is not a level, too many levels, the node given twice or
            not first.
    """
    levels = [_level(text) for text in args.level or ()]
    if len(levels) > MAX_LEVELS:
        raise UsageError(f"--level: {len(levels)} levels are more than {MAX_LEVELS}")
    nodes = [level for level in levels if level.name == NODE]
    if len(nodes) > 1:
        # as a repeated level above the node is refused: which one is meant is not said
        raise UsageError(
            f"--level {level_text(nodes[1])}: level {NODE!r} appears twice; give each level once"
        )
    node = nodes[0] if nodes else None
    if node is not None and levels[0] is not node:
        raise UsageError(
            f"--level {level_text(node)}: the node is the innermost level; give it first"
        )
    return node, tuple(level for level in levels if level.name != NODE)


def _level(text: str) -> Level:
    """One ``--level NAME=SIZE[@GB/S]``; raises UsageError when ``text`` is not one."""
    name, equals, rest = text.partition("=")
    size, at, bandwidth = rest.partition("@")
    if not equals or NAME_PATTERN.fullmatch(name) is None or len(name) > MAX_NAME_LENGTH:
        raise UsageError(
            f"--level {shorten(text)!r}: expected NAME=SIZE or NAME=SIZE@GB/S, such as "
            "nvlink=72@900 (NAME: letters, digits and '_')"
        )
    try:
        gb_s = None
        if at:
            gb_s = bounded_number(
                bandwidth,
                minimum=MIN_BANDWIDTH_GB_S,
                maximum=MAX_BANDWIDTH_GB_S,
                beyond="far past any link built",
            )
        return Level(name, positive_int(size), gb_s)
    except argparse.ArgumentTypeError as error:
        raise UsageError(f"--level {shorten(text)!r}: {error}") from None


def _load(args: argparse.Namespace) -> tuple[MeshConfig | None, Source | None]:
    """The config ``plan CONFIG`` plans for, with where its keys are; None without one.

    Raises:
        ConfigError, SourceError: as ``load_located``.
        UsageError: ``--key`` or ``-o`` without a config.
    """
    if args.path is not None:
        return load_located(args.path, args.overrides, args.key)
    if args.key is not None or args.overrides:
        option = "--key" if args.key is not None else "-o"
        raise UsageError(f"{option} needs a config: meshconf plan CONFIG {option} ...")
    return None, None


def _check_outputs(args: argparse.Namespace, numbers: dict[str, int]) -> None:
    """Raises UsageError when ``--emit``, ``--explain`` and ``--format json`` are mixed."""
    if "emit" in numbers and args.format == "json":
        raise UsageError("--emit prints a YAML config; leave out --format json")
    if "explain" in numbers and ("emit" in numbers or args.format == "json"):
        raise UsageError(
            "--explain prints one row's memory as text; leave out --emit and --format json"
        )


def run(args: argparse.Namespace) -> int:
    numbers = _numbers(args)
    _check_outputs(args, numbers)
    config, located = _load(args)
    block = None if config is None else config.training
    modelled = model_request(args, {} if block is None else block.estimate_settings(), args.path)
    node, levels = _levels(args)
    given = Given(
        path=args.path,
        world_size=numbers.get("world_size"),
        gpus_per_node=numbers.get("gpus_per_node"),
        node=node,
        levels=levels,
        pins={name: numbers[name] for name in DEGREE_NAMES if name in numbers},
        order=None if args.order is None else tuple(args.order.split(",")),
        gpu_preset=args.gpu,
    )
    wanted = numbers.get("emit", numbers.get("explain", numbers.get("limit", DEFAULT_LIMIT)))
    try:
        request, notes = merged_request(given, modelled, config, located)
        for note in notes:
            print(f"meshconf: note: {note}", file=sys.stderr)
        if "explain" in numbers and modelled[0] is None:
            raise UsageError(f"--explain needs {MODEL_OPTIONS_TEXT}")
        plan = make_plan(request, wanted)
    except PlanError as error:
        raise UsageError(str(error)) from None
    warning = node_warning(request)
    if warning is not None:
        print(f"meshconf: warning: {warning}", file=sys.stderr)
    shown = next((name for name in ("emit", "explain") if name in numbers), None)
    if shown is not None and numbers[shown] > plan.total:
        raise UsageError(
            f"--{shown} {numbers[shown]} is not a row: there are {plan.total} valid assignments"
        )
    if "emit" in numbers:
        training = planned_block(args, block, modelled[1])
        text = emitted_yaml(plan, numbers["emit"], _replay_words(args), training)
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


def _prints_data(args: argparse.Namespace) -> bool:
    return args.emit is not None or bool(args.format == "json")


def _replay_words(args: argparse.Namespace) -> list[str]:
    """The config and model words that, with the request's, print the plan again."""
    words = [] if args.path is None else [args.path]
    if args.key is not None:
        words.append(f"--key {args.key}")
    words += [f"-o {override}" for override in args.overrides]
    return words + model_words(args)


def add_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "plan",
        help="list the valid degree assignments for a world size, ranked by node locality",
        description=f"List every assignment of {spoken_list(WORLD_FACTORS)} whose "
        "product is the world size, under the pinned degrees, ranked so that the groups "
        "with the most traffic stay inside a node; --emit prints one as a config.",
    )
    parser.add_argument(
        "path",
        nargs="?",
        metavar="CONFIG",
        help="a config to plan for: its world size, levels, inside, order, the degrees it "
        "writes (as pins) and its training block; an option given beside it replaces the "
        "config's value, with a note",
    )
    add_key_options(parser, "of CONFIG before it is read (repeatable): degrees.tp=4")
    _add_layout_options(parser)
    _add_output_options(parser)
    add_model_options(parser)
    parser.set_defaults(run=run, prints_data=_prints_data)


def _add_layout_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--world-size", metavar="N", help="the number of ranks (required without CONFIG)"
    )
    parser.add_argument(
        "--gpus-per-node", metavar="G", help="ranks per node, for locality (--level node=G)"
    )
    parser.add_argument(
        "--level",
        action="append",
        metavar="NAME=SIZE[@GB/S]",
        help="a level, inner to outer, as a config's levels: GPUs in one unit and, "
        "optionally, the bandwidth inside it in GB/s per GPU (nvlink=72@900); repeat for each "
        "level, the node (node=4) first. Groups' traffic is charged at the bandwidth of the "
        "smallest level that holds them",
    )
    for name in DEGREE_NAMES:
        parser.add_argument(option_flag(name), dest=name, metavar="D", help=f"pin {name} to D")
    parser.add_argument(
        "--order",
        metavar="F1,F2,...",
        help="the rank order of the world factors, outer to inner, as a config's order: "
        f"every one of {', '.join(WORLD_FACTORS)} once (default: that order)",
    )


def _add_output_options(parser: argparse.ArgumentParser) -> None:
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
    add_format_option(parser, "text: a table (default); json: the same as data")
