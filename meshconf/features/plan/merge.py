"""What a plan is asked for, from three places: the values the command line gives, over a
config's, over a GPU preset's topology; with a note for each value of the config that a
given one replaces."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from meshconf.core.degrees import DEGREE_NAMES
from meshconf.core.levels import NODE, NVLINK, Level
from meshconf.features.plan.estimate.architecture import Architecture
from meshconf.features.plan.estimate.gpus import GPUS
from meshconf.features.plan.estimate.step_inputs import Training
from meshconf.features.plan.request import PlanError, Request, level_text, option_flag
from meshconf.model.config import MeshConfig
from meshconf.sources.reading import Source


@dataclass(frozen=True)
class Given:
    """What the command line gives a plan, parsed; None or empty where it gives nothing."""

    #: The config's path as given (``plan CONFIG``), which the notes name.
    path: str | None = None
    world_size: int | None = None
    gpus_per_node: int | None = None
    #: ``--level node=N``, which is ``--gpus-per-node N``.
    node: Level | None = None
    #: The other levels, inner to outer.
    levels: tuple[Level, ...] = ()
    #: The degrees pinned by their options.
    pins: Mapping[str, int] = field(default_factory=dict)
    order: tuple[str, ...] | None = None
    #: The ``--gpu`` preset, whose datasheet gives the levels when nothing else does.
    gpu_preset: str | None = None


def merged_request(
    given: Given,
    modelled: tuple[Architecture | None, Training],
    config: MeshConfig | None = None,
    located: Source | None = None,
) -> tuple[Request, list[str]]:
    """What to plan for the model and settings ``modelled``: ``given`` over ``config``'s
    values over the topology of the ``--gpu`` preset (else the config's ``training.gpu``),
    with the notes; ``located`` places the config's keys, so that messages name each pin
    the config gives by its key, file and line.

    Raises:
        PlanError: no world size is given; ``--level node=N`` and ``--gpus-per-node``
            disagree; or levels are given without the node's size.
    """
    notes: list[str] = []
    world = _world_size(given, config, notes)
    node, above = _topology(given, config, notes)
    pins, origins = _pins(given, config, located, notes)
    order = given.order
    if config is not None and config.order is not None:
        if order is not None and order != tuple(config.order):
            notes.append(
                _replaces(given, f"--order {','.join(order)}", f"order {','.join(config.order)}")
            )
        order = order or tuple(config.order)
    inside = {} if config is None or config.inside is None else dict(config.inside)
    if config is not None and config.inside_node is not None:
        notes.append(
            f"{given.path}'s inside_node is not planned: the rows are numbered without it "
            "(inside keeps dims inside levels, and plan reads it)"
        )
    request = Request(
        world_size=world,
        levels=above,
        gpus_per_node=None if node is None else node.size,
        node_bandwidth_gb_s=None if node is None else node.bandwidth_gb_s,
        pins=pins,
        model=modelled[0],
        training=modelled[1],
        order=order,
        inside={level: tuple(dims) for level, dims in inside.items()},
        pin_origins=origins,
    )
    return request, notes


def _replaces(given: Given, option: str, what: str) -> str:
    return f"{option} replaces {what} of {given.path}"


def _world_size(given: Given, config: MeshConfig | None, notes: list[str]) -> int:
    configured = None if config is None else config.resolved_world_size
    if given.world_size is None:
        if configured is not None:
            return configured
        if config is None:
            raise PlanError("--world-size N is required (or a CONFIG with world_size)")
        raise PlanError(f"--world-size N is required: {given.path} has no world_size")
    if configured not in (None, given.world_size):
        notes.append(
            _replaces(given, f"--world-size {given.world_size}", f"world_size {configured}")
        )
    return given.world_size


def _topology(
    given: Given, config: MeshConfig | None, notes: list[str]
) -> tuple[Level | None, tuple[Level, ...]]:
    """The node and the levels above it: as given, else as the config gives them, else as
    the GPU preset's datasheet does."""
    size = given.gpus_per_node
    if given.node is not None and size not in (None, given.node.size):
        raise PlanError(f"--level {level_text(given.node)} and --gpus-per-node {size} disagree")
    node = given.node or (None if size is None else Level(NODE, size))
    configured = () if config is None else config.topology
    configured_node = next((level for level in configured if level.name == NODE), None)
    configured_above = tuple(level for level in configured if level.name != NODE)
    if node is not None and configured_node not in (None, node):
        what = f"the node level {level_text(configured_node)}"
        notes.append(_replaces(given, f"--level {level_text(node)}", what))
    if given.levels and configured_above and given.levels != configured_above:
        written = " ".join(level_text(level) for level in configured_above)
        notes.append(_replaces(given, "--level", f"the levels {written}"))
    node = node or configured_node
    above = given.levels or configured_above
    block = None if config is None else config.training
    named = given.gpu_preset or (None if block is None else block.gpu)
    if node is None and not above and named is not None:
        gpu = GPUS[named]
        node = Level(NODE, gpu.gpus_per_node)
        if gpu.nvlink_domain is not None:
            above = (Level(NVLINK, gpu.nvlink_domain, gpu.scale_up_gb_s),)
        placed = " and ".join(level_text(level) for level in (node, *above))
        where = (
            f"--gpu {gpu.name}"
            if given.gpu_preset is not None
            else f"training.gpu {gpu.name} of {given.path}"
        )
        notes.append(f"{where}: levels {placed}, as its datasheet gives them")
    if above and node is None:
        raise PlanError(
            f"--level {level_text(above[0])} needs the node's size: add --level node=N "
            "(or --gpus-per-node N); a level holds whole nodes"
        )
    return node, above


def _pins(
    given: Given, config: MeshConfig | None, located: Source | None, notes: list[str]
) -> tuple[dict[str, int], dict[str, str]]:
    """The pinned degrees, the given over the config's, and where each of the config's
    comes from."""
    pins = {} if config is None else config.degrees.pinned
    origins = (
        {} if located is None else {name: _key_origin(located, name, pins[name]) for name in pins}
    )
    for name in DEGREE_NAMES:
        if name not in given.pins:
            continue
        value = given.pins[name]
        if pins.get(name, value) != value:
            notes.append(
                _replaces(given, f"{option_flag(name)} {value}", f"degrees.{name} {pins[name]}")
            )
        pins[name] = value
        origins.pop(name, None)
    return pins, origins


def _key_origin(source: Source, name: str, value: int) -> str:
    """Where the config gives a degree: ``gb200.yaml:6: degrees.pp 16``, or the override
    that set it."""
    placed = source.diagnostic(("degrees", name), "")
    if placed.override is not None:
        return f"-o {placed.override}"
    where = placed.source or "the config"
    line = "" if placed.line is None else f":{placed.line}"
    return f"{where}{line}: {placed.key} {value}"
