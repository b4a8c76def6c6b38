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
from typing import Any

import torch
from torch import nn

from meshconf.core.errors import MeshconfError
from meshconf.core.messages import first_line, shorten
from meshconf.model.config import MeshConfig
from meshconf.runtime.context import DistributedContext
from meshconf.runtime.step_mismatches import Observed
from meshconf.runtime.torch_support import MEASURE_PROBES, check_torch

#: The terms of a measurement, as the estimate names them (``other`` is what the tracker
#: could not attribute, shown only when not zero).
TERMS = ("params", "grads", "optimizer", "gathers", "activations", "other")

#: The kinds of tensor the trackers tell apart (by the enum member's name: ``_MemRefType`` and
#: ``_FSDPRefType``) that each term of the estimate holds; any other kind is ``other``. Buffers
#: (rotary tables, say) sit with the parameters; what FSDP gathers, and the all-gather and
#: reduce-scatter buffers, are the estimate's ``gathers``; the inputs and temporaries sit with
#: the activations, as the loss's fp32 copies do in the estimate.
_KINDS_OF_TERM: Mapping[str, tuple[str, ...]] = {
    "params": ("PARAM", "SHARDED_PARAM", "BUFFER"),
    "grads": ("GRAD", "SHARDED_GRAD"),
    "optimizer": ("OPT",),
    "gathers": ("UNSHARDED_PARAM", "UNSHARDED_GRAD", "ALL_GATHER", "REDUCE_SCATTER"),
    "activations": ("ACT", "TEMP", "INP"),
}
_TERM_OF_KIND = {kind: term for term, kinds in _KINDS_OF_TERM.items() for kind in kinds}


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
    ``tracker`` is the class of torch ``torch_version`` that measured them; ``observed``
    what the build ran."""

    rank: int
    world_size: int
    tracker: str
    torch_version: str
    terms: Mapping[str, int]
    observed: Observed

    @property
    def peak(self) -> int:
        return sum(self.terms.values())


def load_build(spec: str) -> BuildFunction:
    """The function ``MODULE:FUNCTION`` names; the current directory is searched first, as
    ``python -m`` does.

    Raises:
        MeshconfError: ``spec`` is not of that form, the module does not import, or it has no
            such callable.
    """
    module_name, _, function_name = spec.partition(":")
    if not all(part.isidentifier() for part in module_name.split(".")) or not (
        function_name.isidentifier()
    ):
        raise MeshconfError(
            f"--build: expected MODULE:FUNCTION (mypackage.train:build), got {shorten(spec)!r}"
        )
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except KeyboardInterrupt:
        raise
    except SystemExit as leaving:
        raise MeshconfError(
            f"--build: module {module_name!r} exited while it was imported (SystemExit "
            f"{shorten(repr(leaving.code))})"
        ) from None
    except BaseException as error:
        raise MeshconfError(
            f"--build: module {module_name!r} could not be imported: {_described(error)}"
        ) from error
    function = _call(f"--build: module {module_name!r}", getattr, module, function_name, None)
    if not callable(function):
        raise MeshconfError(f"--build: module {module_name!r} has no function {function_name!r}")
    built: BuildFunction = function
    return built


def measure_memory(
    config: MeshConfig, build: BuildFunction, *, rank: int, world_size: int
) -> MeasuredMemory:
    """Rank ``rank``'s memory at its peak over the second of two training steps of what
    ``build`` makes (the first creates the optimizer's state), in a world of
    ``world_size``. Needs a process without a default process group; leaves none behind.

    Raises:
        MeshconfError: this torch has no memory tracker meshconf knows; ``build`` raised,
            returned something else than a :class:`TrainingStep`, or its step raised.
        RuntimeSetupError: as :meth:`DistributedContext.simulate` raises it.
        ConfigError: the config does not fit ``world_size``.
    """
    check_torch(MEASURE_PROBES)
    from torch._subclasses.fake_tensor import FakeTensorMode

    context = DistributedContext.simulate(config, rank=rank, world_size=world_size)
    try:
        context.build_all()
        with FakeTensorMode():
            step = _checked(_call("the build function", build, context))
            watch = _Watch(step.model)
            # The first step creates the optimizer's state. It runs untracked: under fake
            # tensors, DTensor's sharding propagation of the state's zeros_like shows the
            # tracker tensors of the weights' global size, which no GPU allocates.
            _step_once(step, watch)
            tracker, name = _call("torch's memory tracker", _tracker, step)
            _call("the tracked step", _tracked_step, step, watch, tracker)
            snapshot = tracker.get_tracker_snapshot("peak")
    finally:
        context.close()
    terms = _terms(snapshot)
    observed = watch.observed(terms["params"])
    return MeasuredMemory(rank, world_size, name, torch.__version__, terms, observed)


def _checked(step: object) -> TrainingStep:
    """``step`` if it is a :class:`TrainingStep` of a module, an optimizer and a callable.

    Raises:
        MeshconfError: it is something else, or holds something else.
    """
    if not isinstance(step, TrainingStep):
        raise MeshconfError(
            f"the build function returned {type(step).__name__}, not a "
            "meshconf.runtime.TrainingStep(model, optimizer, forward_backward)"
        )
    expected = {
        "model": (step.model, nn.Module),
        "optimizer": (step.optimizer, torch.optim.Optimizer),
    }
    wrong = [
        f"{field} is a {type(value).__name__}, not a {kind.__module__}.{kind.__qualname__}"
        for field, (value, kind) in expected.items()
        if not isinstance(value, kind)
    ]
    if not callable(step.forward_backward):
        wrong.append(f"forward_backward is a {type(step.forward_backward).__name__}, not callable")
    if wrong:
        raise MeshconfError(f"the build function's TrainingStep: {'; '.join(wrong)}")
    return step


class _Watch:
    """What the model is called with and computes in, and its gradients' dtype, seen from
    hooks on the user's root module while the steps run."""

    def __init__(self, model: nn.Module) -> None:
        self.calls: set[tuple[int, int]] = set()
        self.compute_dtypes: set[torch.dtype] = set()
        self.grad_dtypes: set[torch.dtype] = set()
        model.register_forward_pre_hook(self._before, with_kwargs=True)
        model.register_forward_hook(self._after)
        self._model = model

    def _before(self, module: nn.Module, args: Any, kwargs: Any) -> None:
        shaped = _tensors([*args, *kwargs.values()])
        wide = next((tensor for tensor in shaped if tensor.dim() >= 2), None)
        if wide is not None:
            self.calls.add((int(wide.shape[0]), int(wide.shape[1])))

    def _after(self, module: nn.Module, args: Any, output: Any) -> None:
        floating = next((t for t in _tensors([output]) if t.is_floating_point()), None)
        if floating is not None:
            self.compute_dtypes.add(floating.dtype)

    def gradients(self) -> None:
        """Note the dtype of the gradients there are, before the optimizer steps."""
        for parameter in self._model.parameters():
            if parameter.grad is not None:
                self.grad_dtypes.add(parameter.grad.dtype)

    def observed(self, parameter_bytes: int) -> Observed:
        sizes = {parameter.element_size() for parameter in self._model.parameters()}
        return Observed(
            frozenset(self.calls),
            _dtype_name(self.compute_dtypes),
            _dtype_name(self.grad_dtypes),
            parameter_bytes // sizes.pop() if len(sizes) == 1 else None,
        )


def _tensors(values: list[Any]) -> list[torch.Tensor]:
    """The tensors among ``values``, and in their lists, tuples and dicts, in order."""
    found: list[torch.Tensor] = []
    for value in values:
        if isinstance(value, torch.Tensor):
            found.append(value)
        elif isinstance(value, (list, tuple)):
            found += _tensors(list(value))
        elif isinstance(value, dict):
            found += _tensors(list(value.values()))
    return found


_DTYPE_NAMES = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}


def _dtype_name(dtypes: set[torch.dtype]) -> str | None:
    """The estimate's name of the one dtype seen, or None (none, several, or another)."""
    return _DTYPE_NAMES.get(next(iter(dtypes))) if len(dtypes) == 1 else None


def _tracked_step(step: TrainingStep, watch: _Watch, tracker: Any) -> None:
    with tracker:
        _step_once(step, watch)


def _step_once(step: TrainingStep, watch: _Watch) -> None:
    _call("forward_backward", step.forward_backward)
    watch.gradients()
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
    """``function(*args)``; whatever user code does but return is one :class:`MeshconfError`
    naming ``what``: an exception, or an exit (``SystemExit``) that would otherwise end
    meshconf with the user's status and no word. An interrupt is the user's to give."""
    try:
        return function(*args)
    except (MeshconfError, KeyboardInterrupt):
        raise
    except SystemExit as leaving:
        raise MeshconfError(f"{what} exited (SystemExit {shorten(repr(leaving.code))})") from None
    except BaseException as error:
        raise MeshconfError(f"{what} raised {_described(error)}") from error


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
