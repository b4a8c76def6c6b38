"""``meshconf plan --world-size N``: every valid assignment of the degrees, ranked by node
locality or, with a model, by fit and tokens per second per GPU; ``--emit`` prints one as
a config."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from meshconf.cli.common import (
    EXIT_INVALID,
    EXIT_OK,
    bounded_number,
    emit,
    one_of,
    positive_int,
    usage_error,
)
from meshconf.cli.estimate_options import model_request, planned_block
from meshconf.cli.model_options import add_model_options, model_words
from meshconf.cli.plan_report import emitted_yaml, explained_row, json_report, print_table
from meshconf.core.degrees import AUTO, DEGREE_NAMES, WORLD_FACTORS
from meshconf.core.domains import MAX_NAME_LENGTH, NAME_PATTERN
from meshconf.core.errors import ConfigError, SourceError
from meshconf.core.levels import NODE, NVLINK, Level
from meshconf.core.messages import shorten, spoken_list
from meshconf.features.plan.estimate.architecture import Architecture
from meshconf.features.plan.estimate.gpus import GPUS
from meshconf.features.plan.estimate.training import Training
from meshconf.features.plan.ranking import (
    make_plan,
)
from meshconf.features.plan.request import (
    PlanError,
    Request,
    level_text,
    node_warning,
    option_flag,
)
from meshconf.model.config import MeshConfig
from meshconf.model.fields import MAX_BANDWIDTH_GB_S, MAX_LEVELS, MIN_BANDWIDTH_GB_S
from meshconf.sources.loading import load_located
from meshconf.sources.reading import Source

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
    return numbers


def _levels(args: argparse.Namespace) -> tuple[Level | None, tuple[Level, ...]] | str:
    """The ``--level NAME=SIZE[@GB/S]`` options: the node's (``--level node=N`` is
    ``--gpus-per-node N``), if given, and the others; or the message of the first bad one."""
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
                    minimum=MIN_BANDWIDTH_GB_S,
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
    node = next((level for level in levels if level.name == NODE), None)
    if node is not None and levels[0] is not node:
        return f"--level {level_text(node)}: the node is the innermost level; give it first"
    return node, tuple(level for level in levels if level.name != NODE)


def _load(args: argparse.Namespace) -> tuple[MeshConfig, Source] | int:
    """The config ``plan CONFIG`` plans for, with where its keys are, or the exit code after
    its problems."""
    try:
        return load_located(args.path, args.overrides, args.key)
    except ConfigError as error:
        lines = "\n".join(diagnostic.render() for diagnostic in error.diagnostics)
        emit(lambda: print(lines))
        return EXIT_INVALID
    except SourceError as error:
        return usage_error(str(error))


def _request(
    args: argparse.Namespace,
    numbers: dict[str, int],
    config: MeshConfig | None,
    modelled: tuple[Architecture | None, Training],
    notes: list[str],
    located: Source | None = None,
) -> Request | str:
    """What to plan: the options over the config's values over the ``--gpu`` preset's
    topology; ``notes`` get a line for each option that replaces a value of the config.
    ``located`` places the config's keys: each pin the config gives is named by its key,
    file and line in messages."""
    given_levels = _levels(args)
    if isinstance(given_levels, str):
        return given_levels
    given_node, given_above = given_levels
    source = args.path

    def replaced(option: str, what: str) -> None:
        notes.append(f"{option} replaces {what} of {source}")

    world = numbers.get("world_size")
    configured_world = None if config is None else config.resolved_world_size
    if world is None:
        if configured_world is None:
            if config is None:
                return "--world-size N is required (or a CONFIG with world_size)"
            return f"--world-size N is required: {source} has no world_size"
        world = configured_world
    elif configured_world not in (None, world):
        replaced(f"--world-size {world}", f"world_size {configured_world}")

    node_size = numbers.get("gpus_per_node")
    if given_node is not None and node_size not in (None, given_node.size):
        return f"--level {level_text(given_node)} and --gpus-per-node {node_size} disagree"
    node = given_node or (None if node_size is None else Level(NODE, node_size))
    configured = () if config is None else config.topology
    configured_node = next((level for level in configured if level.name == NODE), None)
    configured_above = tuple(level for level in configured if level.name != NODE)
    if node is not None and configured_node not in (None, node):
        replaced(f"--level {level_text(node)}", f"the node level {level_text(configured_node)}")
    if given_above and configured_above and given_above != configured_above:
        written = " ".join(level_text(level) for level in configured_above)
        replaced("--level", f"the levels {written}")
    node = node or configured_node
    above = given_above or configured_above
    model, training = modelled
    block = None if config is None else config.training
    named = args.gpu or (None if block is None else block.gpu)
    if node is None and not above and named is not None:
        gpu = GPUS[named]
        node = Level(NODE, gpu.gpus_per_node)
        if gpu.nvlink_domain is not None:
            above = (Level(NVLINK, gpu.nvlink_domain, gpu.scale_up_gb_s),)
        placed = " and ".join(level_text(level) for level in (node, *above))
        where = (
            f"--gpu {gpu.name}" if args.gpu is not None else f"training.gpu {gpu.name} of {source}"
        )
        notes.append(f"{where}: levels {placed}, as its datasheet gives them")
    if above and node is None:
        return (
            f"--level {level_text(above[0])} needs the node's size: add --level node=N "
            "(or --gpus-per-node N); a level holds whole nodes"
        )

    pins: dict[str, int] = {}
    if config is not None:
        degrees = config.degrees
        pins = {
            name: getattr(degrees, name)
            for name in DEGREE_NAMES
            if name in degrees.explicit and getattr(degrees, name) != AUTO
        }
    origins = (
        {} if located is None else {name: _key_origin(located, name, pins[name]) for name in pins}
    )
    for name in DEGREE_NAMES:
        if name in numbers:
            if pins.get(name, numbers[name]) != numbers[name]:
                replaced(f"{option_flag(name)} {numbers[name]}", f"degrees.{name} {pins[name]}")
            pins[name] = numbers[name]
            origins.pop(name, None)

    order = None if args.order is None else tuple(args.order.split(","))
    if config is not None and config.order is not None:
        if order is not None and order != tuple(config.order):
            replaced(f"--order {args.order}", f"order {','.join(config.order)}")
        order = order or tuple(config.order)
    inside = {} if config is None or config.inside is None else dict(config.inside)
    if config is not None and config.inside_node is not None:
        notes.append(
            f"{source}'s inside_node is not planned: the rows are numbered without it "
            "(inside keeps dims inside levels, and plan reads it)"
        )
    return Request(
        world_size=world,
        levels=above,
        gpus_per_node=None if node is None else node.size,
        node_bandwidth_gb_s=None if node is None else node.bandwidth_gb_s,
        pins=pins,
        model=model,
        training=training,
        order=order,
        inside={level: tuple(dims) for level, dims in inside.items()},
        pin_origins=origins,
    )


def _key_origin(source: Source, name: str, value: int) -> str:
    """Where the config gives a degree: ``gb200.yaml:6: degrees.pp 16``, or the override
    that set it."""
    placed = source.diagnostic(("degrees", name), "")
    if placed.override is not None:
        return f"-o {placed.override}"
    where = placed.source or "the config"
    line = "" if placed.line is None else f":{placed.line}"
    return f"{where}{line}: {placed.key} {value}"


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
    config, source = None, None
    if args.path is not None:
        loaded = _load(args)
        if isinstance(loaded, int):
            return loaded
        config, source = loaded
    elif args.key is not None or args.overrides:
        option = "--key" if args.key is not None else "-o"
        return usage_error(f"{option} needs a config: meshconf plan CONFIG {option} ...")
    block = None if config is None else config.training
    modelled = model_request(args, {} if block is None else block.estimate_settings(), args.path)
    if isinstance(modelled, int):
        return modelled
    notes: list[str] = []
    request = _request(args, numbers, config, modelled, notes, source)
    if isinstance(request, str):
        return usage_error(request)
    for note in notes:
        print(f"meshconf: note: {note}", file=sys.stderr)
    model, training = modelled
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
            plan, numbers["emit"], _replay_words(args), planned_block(args, block, training)
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


def _replay_words(args: argparse.Namespace) -> list[str]:
    """The config and model words that, with the request's own, print the plan again."""
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
    parser.add_argument(
        "--key", metavar="K", help="dotted key of the meshconf block inside a larger file"
    )
    parser.add_argument(
        "-o",
        "--override",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        dest="overrides",
        help="override a value of CONFIG before it is read (repeatable): degrees.tp=4",
    )
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
        **one_of(("text", "json")),
        default="text",
        help="text: a table (default); json: the same as data",
    )
    add_model_options(parser)
    parser.set_defaults(run=run)
