"""``meshconf measure PATH --build MODULE:FUNCTION``: one rank's memory by term at its peak
in a step of the user's own build, under fake tensors, beside the estimate when a model is
given (meshconf.runtime.step_memory)."""

from __future__ import annotations

import argparse
import dataclasses
import json
from typing import TYPE_CHECKING, Any

from meshconf.cli.common import (
    EXIT_OK,
    InvalidInput,
    UsageError,
    add_rank_options,
    add_source_options,
    emit,
    load_for_rank,
    prints_json,
)
from meshconf.cli.model_arguments import MODEL_OPTIONS, add_model_options
from meshconf.cli.model_options import config_estimate
from meshconf.core.errors import MeshconfError, printable
from meshconf.core.setting_values import GIB
from meshconf.features.plan.estimate.architecture import Architecture
from meshconf.features.plan.estimate.step import Estimate
from meshconf.features.plan.estimate.step_inputs import Training
from meshconf.features.plan.estimate_text import STATE_PARTS, estimate_json, settings_line
from meshconf.features.simulation import check_simulation_memory, check_simulation_size
from meshconf.model.config import MeshConfig

if TYPE_CHECKING:
    from meshconf.runtime.step_memory import MeasuredMemory
    from meshconf.runtime.step_mismatches import Mismatch

_MIB = 2**20
#: What the estimate of a measured build is: its model, its settings and the estimate.
_Found = tuple[Architecture, Training, Estimate]


def run(args: argparse.Namespace) -> int:
    config = load_for_rank(args)
    world_size = config.resolved_world_size
    assert world_size is not None
    found = config_estimate(args, config)
    measured = _measure(args, config, world_size)
    report: dict[str, Any] = {
        "rank": measured.rank,
        "world_size": measured.world_size,
        "tracker": measured.tracker,
        "torch": measured.torch_version,
        "measured_bytes": {**measured.terms, "peak": measured.peak},
    }
    differences = [] if found is None else _compare(config, measured, found, report)
    if args.format == "json":
        emit(lambda: print(json.dumps(report)))
    else:
        emit(lambda: _print_text(args.build, measured, found, differences))
    return EXIT_OK


def _measure(args: argparse.Namespace, config: MeshConfig, world_size: int) -> MeasuredMemory:
    """The build's memory on ``args.rank``, measured.

    Raises:
        UsageError: the world is too large to simulate here, torch is missing, or the build
            function cannot be loaded.
        InvalidInput: the measurement failed (the build raised, or torch has no tracker).
    """
    try:
        check_simulation_size(world_size, 1)
        check_simulation_memory(world_size)
        from meshconf.runtime.step_memory import load_build, measure_memory

        build = load_build(args.build)
    except MeshconfError as error:
        raise UsageError(str(error)) from None
    try:
        return measure_memory(config, build, rank=args.rank, world_size=world_size)
    except MeshconfError as error:
        raise InvalidInput([f"meshconf: error: {printable(str(error))}"], to_stderr=True) from None


def _compare(
    config: MeshConfig, measured: MeasuredMemory, found: _Found, report: dict[str, Any]
) -> list[Mismatch]:
    """Where the estimate's settings differ from what the build ran, also added to
    ``report`` with the estimate."""
    from meshconf.runtime.step_mismatches import mismatches

    model, training, estimated = found
    memory = estimated.memory
    # the tracker sees the step's tensors on CPU: no CUDA context, NCCL or allocator
    report["estimate_bytes"] = {
        **{term: getattr(memory, term) for term in STATE_PARTS},
        "total": memory.training_state,
    }
    report["estimate"] = estimate_json(model, estimated)
    elements = memory.params // training.param_bytes
    cp = config.dim_sizes.get("cp", 1)
    differences = mismatches(measured.observed, training, elements, MODEL_OPTIONS, cp=cp)
    report["mismatches"] = [dataclasses.asdict(mismatch) for mismatch in differences]
    return differences


def _print_text(
    build: str, measured: MeasuredMemory, found: _Found | None, differences: list[Mismatch]
) -> None:
    """The measured terms at the peak, beside the estimate's when they are comparable."""
    estimate = None if found is None else found[2]
    comparable = estimate is not None and not differences
    shown = [term for term in STATE_PARTS if measured.terms[term] or comparable]
    if measured.terms["other"]:
        shown.append("other")
    # MiB when either column's largest figure is under a GiB, whose terms would round to
    # nothing in GiB
    state = None if estimate is None else estimate.memory.training_state
    smallest = measured.peak if state is None else min(measured.peak, state)
    unit, unit_name = (GIB, "GiB") if smallest >= GIB else (_MIB, "MiB")

    def amount(size: int) -> str:
        return f"{size / unit:.3f}"

    print(
        f"rank {measured.rank} of {measured.world_size}: {build}, the second of two "
        "training steps under fake tensors and torch's fake process group, measured by "
        f"torch {measured.torch_version}'s {measured.tracker}"
    )
    if found is not None:
        print(settings_line(found[0], found[1]))
    for mismatch in differences:
        print(f"not comparable: {mismatch.message}")
    header = f"{unit_name} at the peak" + ("   estimate" if comparable else "")
    print(f"{'term':<12} {header}")
    for term in [*shown, "peak"]:
        size = measured.peak if term == "peak" else measured.terms[term]
        cells = f"{amount(size):>15}"
        if estimate is not None and comparable:
            value = state if term == "peak" else getattr(estimate.memory, term, None)
            cells += f"   {'-' if value is None else amount(value):>8}"
        print(f"{term:<12} {cells}")
    if estimate is not None and comparable:
        print(
            f"not on CPU: the estimate's runtime term ({amount(estimate.memory.runtime)} "
            f"{unit_name}: the CUDA context, NCCL's buffers, the allocator's reserve) comes "
            "on top on a GPU"
        )
    if state is not None and not comparable:
        print(
            f"the estimate ({amount(state)} {unit_name}) is left out: it is "
            "for another run than the build's; give the options above to compare them"
        )


def add_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "measure",
        help="measure one rank's memory in a training step of your own model",
        description="Run your function MODULE:FUNCTION, which takes the rank's "
        "DistributedContext and returns a meshconf.runtime.TrainingStep (the parallelized "
        "model, its optimizer and a callable that runs one step's forward and backward "
        "passes), for one rank of the config's world, under fake tensors and torch's fake "
        "process group, on CPU. torch's memory tracker follows the second of two training "
        "steps (the first creates the optimizer's state); the memory at the peak is split "
        "into the estimate's terms, beside the estimate when a model is given "
        "(docs/estimate.md). Needs the torch extra.",
    )
    parser.add_argument(
        "--build",
        required=True,
        metavar="MODULE:FUNCTION",
        help="your build function (the current directory is searched first)",
    )
    add_rank_options(parser, "the rank to measure (default: 0)")
    add_source_options(parser)
    add_model_options(parser)
    parser.set_defaults(run=run, prints_data=prints_json)
