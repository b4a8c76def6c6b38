"""One rank's memory in a training step of the user's own model, measured on CPU.

The user's build function makes the rank's model, parallelized over the meshes of a
:class:`~meshconf.runtime.context.DistributedContext`, and its optimizer. Here it runs for
one chosen rank of the real world size against torch's fake process group (nothing
communicates) and under ``FakeTensorMode`` (no tensor holds memory), and torch's memory
tracker follows every tensor through whole training steps: FSDPMemTracker when the model's
root is an FSDP2 module, MemTracker otherwise. This is how torchtitan's memory estimation
runs; here any world size and any meshconf layout can be measured, and the result is split
into the terms of meshconf's estimate (docs/estimate.md).
"""

from __future__ import annotations

import importlib
import os
import sys
import traceback
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any

import torch
from torch import nn

from meshconf.core.errors import MeshconfError
from meshconf.core.messages import first_line, shorten
from meshconf.model.config import MeshConfig
from meshconf.runtime.context import DistributedContext
from meshconf.runtime.torch_support import MEASURE_PROBES, check_torch

#: The terms of a measurement, as the estimate names them (``other`` is what the tracker
#: could not attribute, shown only when not zero).
TERMS = ("params", "grads", "optimizer", "gathers", "activations", "other")

#: The estimate's term of each kind of tensor the trackers tell apart (by the enum member's
#: name: ``_MemRefType`` and ``_FSDPRefType``). Buffers (rotary tables, say) sit with the
#: parameters; what FSDP gathers, and the all-gather and reduce-scatter buffers, are the
#: estimate's ``gathers``; the inputs and temporaries sit with the activations, as the loss's
#: fp32 copies do in the estimate.
_TERM_OF_KIND: Mapping[str, str] = MappingProxyType(
    {
        "PARAM": "params",
        "SHARDED_PARAM": "params",
        "BUFFER": "params",
        "GRAD": "grads",
        "SHARDED_GRAD": "grads",
        "OPT": "optimizer",
        "UNSHARDED_PARAM": "gathers",
        "UNSHARDED_GRAD": "gathers",
        "ALL_GATHER": "gathers",
        "REDUCE_SCATTER": "gathers",
        "ACT": "activations",
        "TEMP": "activations",
        "INP": "activations",
        "OTH": "other",
    }
)


class BuildError(MeshconfError):
    """The user's build function could not be loaded, failed, or returned something else
    than a :class:`TrainingStep`."""


@dataclass(frozen=True)
class TrainingStep:
    """What a build function returns for its rank: the model as parallelized, its optimizer,
    and ``forward_backward``, which runs one step's forward and backward passes (every
    micro-batch; with pipeline parallelism, the schedule's ``step``). meshconf then calls the
    optimizer's ``step`` and ``zero_grad``."""

    model: nn.Module
    optimizer: torch.optim.Optimizer
    forward_backward: Callable[[], Any]


#: A build function: the rank's context in, its training step out.
BuildFunction = Callable[[DistributedContext], TrainingStep]


@dataclass(frozen=True)
class MeasuredMemory:
    """Bytes of each term of :data:`TERMS` when the rank's memory peaked, and that peak;
    ``tracker`` is the class of torch ``torch_version`` that measured them."""

    rank: int
    world_size: int
    tracker: str
    torch_version: str
    terms: Mapping[str, int]

    @property
    def peak(self) -> int:
        return sum(self.terms.values())


def load_build(spec: str) -> BuildFunction:
    """The function ``MODULE:FUNCTION`` names; the current directory is searched first, as
    ``python -m`` does.

    Raises:
        BuildError: ``spec`` is not of that form, the module does not import, or it has no
            such callable.
    """
    module_name, _, function_name = spec.partition(":")
    if not all(part.isidentifier() for part in module_name.split(".")) or not (
        function_name.isidentifier()
    ):
        raise BuildError(
            f"--build: expected MODULE:FUNCTION (mypackage.train:build), got {shorten(spec)!r}"
        )
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except Exception as error:
        raise BuildError(
            f"--build: module {module_name!r} could not be imported: {_described(error)}"
        ) from error
    function = getattr(module, function_name, None)
    if not callable(function):
        raise BuildError(f"--build: module {module_name!r} has no function {function_name!r}")
    built: BuildFunction = function
    return built


def measure_memory(
    config: MeshConfig, build: BuildFunction, *, rank: int, world_size: int
) -> MeasuredMemory:
    """Rank ``rank``'s memory at its peak over the second of two training steps of what
    ``build`` makes (the first creates the optimizer's state), in a world of
    ``world_size``. Needs a process without a default process group; leaves none behind.

    Raises:
        UnsupportedTorchError: this torch has no memory tracker meshconf knows.
        RuntimeSetupError: as :meth:`DistributedContext.simulate` raises it.
        ConfigError: the config does not fit ``world_size``.
        BuildError: ``build`` raised, returned something else than a :class:`TrainingStep`,
            or its step raised.
    """
    check_torch(MEASURE_PROBES)
    from torch._subclasses.fake_tensor import FakeTensorMode

    context = DistributedContext.simulate(config, rank=rank, world_size=world_size)
    try:
        context.build_all()
        with FakeTensorMode():
            step = _call("the build function", build, context)
            if not isinstance(step, TrainingStep):
                raise BuildError(
                    f"the build function returned {type(step).__name__}, not a "
                    "meshconf.runtime.TrainingStep(model, optimizer, forward_backward)"
                )
            # The first step creates the optimizer's state. It runs untracked: under fake
            # tensors, DTensor's sharding propagation of the state's zeros_like shows the
            # tracker tensors of the weights' global size, which no GPU allocates.
            _step_once(step)
            tracker, name = _tracker(step)
            with tracker:
                _step_once(step)
            snapshot = tracker.get_tracker_snapshot("peak")
    finally:
        context.close()
    return MeasuredMemory(rank, world_size, name, torch.__version__, _terms(snapshot))


def _step_once(step: TrainingStep) -> None:
    _call("forward_backward", step.forward_backward)
    _call("the optimizer's step", step.optimizer.step)
    _call("the optimizer's zero_grad", step.optimizer.zero_grad)


def _tracker(step: TrainingStep) -> tuple[Any, str]:
    from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker
    from torch.distributed._tools.mem_tracker import MemTracker
    from torch.distributed.fsdp import FSDPModule

    if isinstance(step.model, FSDPModule):
        return FSDPMemTracker(step.model, step.optimizer), "FSDPMemTracker"
    tracker = MemTracker()
    tracker.track_external(step.model, step.optimizer)
    return tracker, "MemTracker"


def _terms(snapshot: Mapping[torch.device, Mapping[Any, int]]) -> dict[str, int]:
    terms = dict.fromkeys(TERMS, 0)
    for kinds in snapshot.values():
        for kind, size in kinds.items():
            name = getattr(kind, "name", None)
            if name is not None:
                terms[_TERM_OF_KIND.get(name, "other")] += size
    return terms


def _call(what: str, function: Callable[..., Any], *args: Any) -> Any:
    try:
        return function(*args)
    except MeshconfError:
        raise
    except Exception as error:
        raise BuildError(f"{what} raised {_described(error)}") from error


def _described(error: BaseException) -> str:
    """``ValueError: message (train.py:12)``: the error, and where in the user's code (the
    innermost frame outside torch, meshconf and the import machinery) it was raised."""
    text = f"{type(error).__name__}: {shorten(first_line(error), 300)}"
    library = (
        Path(torch.__file__).parent,
        Path(__file__).parents[1],
        Path(importlib.__file__).parent,
    )
    frames = [
        frame
        for frame in traceback.extract_tb(error.__traceback__)
        if not frame.filename.startswith("<frozen")
        and not any(Path(frame.filename).is_relative_to(root) for root in library)
    ]
    if frames:
        text += f" ({Path(frames[-1].filename).name}:{frames[-1].lineno})"
    return text
