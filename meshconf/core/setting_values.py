"""What a row of the table of training settings (:mod:`meshconf.core.settings`) holds, and
the values the settings take: their choices (dtypes, what the backward pass recomputes, the
model and GPU presets...), the bytes of each dtype and the bounds of their numbers."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal, get_args

#: The choices of the settings: each one's row in :mod:`meshconf.core.settings` says what
#: they mean and whose they are.
#: ``activation_checkpointing``; norms-latent-swiglu is DeepSeek-V3's (its report, sections
#: 3.2.3 and 3.3.3).
Checkpointing = Literal["none", "selective", "full", "norms-latent-swiglu"]
CHECKPOINTING: tuple[Checkpointing, ...] = get_args(Checkpointing)
Resharding = Literal["default", "always", "never"]
#: ``zero_stage``, after Rajbhandari et al., "ZeRO" (SC 2020), figure 1.
ZeroStage = Literal[0, 1, 2, 3]
#: ``mfu_counts``: model FLOPs (MFU) or hardware FLOPs, recomputation included (HFU).
MfuCounts = Literal["model", "hardware"]
MfuOver = Literal["compute", "step"]
OptimizerDtype = Literal["fp32", "bf16"]
NormKernel = Literal["fused", "eager"]
#: ``sequence_parallel``; megatron's is Korthikanti et al.'s, section 4.2.2.
SequenceParallel = Literal["dtensor", "megatron", "none"]
#: The dtypes parameters and gradients are kept in (the keys of :data:`DTYPE_BYTES`).
Dtype = Literal["fp32", "bf16", "fp16"]
#: A dtype fp8 may stand in for where a step keeps or sends a tensor: the tokens a mixture of
#: experts dispatches (DeepSeek-V3 sends fp8), the activations kept for the backward pass.
Fp8OrWider = Literal["fp8", "fp32", "bf16", "fp16"]
DispatchDtype = Fp8OrWider
ActivationDtype = Fp8OrWider
#: Layers of the first and the last pipeline chunk, None where the split decides.
Ends = tuple[int | None, int | None]
#: Bytes per element of each dtype the options take.
DTYPE_BYTES: Mapping[str, int] = {"fp32": 4, "bf16": 2, "fp16": 2}
FP8_BYTES = 1
FP8_OR_WIDER_BYTES: Mapping[str, int] = {"fp8": FP8_BYTES, **DTYPE_BYTES}
GIB = 2**30
#: The names ``--model`` takes: the presets of ``meshconf.features.plan.estimate.presets``,
#: named here too so that a config's ``training.model`` is checked where it is read.
ModelPreset = Literal[
    "llama3-8b", "llama3-70b", "llama3-405b", "deepseek-v3", "mixtral-8x7b", "qwen3-30b-a3b"
]
#: The names ``--gpu`` takes: the presets of ``meshconf.features.plan.estimate.gpus``.
GpuPreset = Literal["a100-80g", "h100-sxm", "h200", "h800", "b200", "gb200", "mi300x", "mi325x"]


@dataclass(frozen=True)
class Bound:
    """The values a training number may take: what a real model or machine reaches, with a
    margin, so that no sum, product or quotient of the estimators overflows, underflows to
    zero or divides by zero; ``beyond`` says what a larger value would be."""

    minimum: float
    maximum: float
    beyond: str


#: The bounds of the settings' numbers.
LAYERS = Bound(1, 100_000, "more layers than any model has")
LAYERS_OR_NONE = Bound(0, 100_000, "more layers than any model has")
MEMORY_TERM = Bound(0, 16384, "more memory than any GPU has")
SEQUENCE_TOKENS = Bound(1, 2**24, "more tokens per sequence than any model is trained on")
MICRO_BATCH = Bound(1, 2**16, "more sequences per micro-batch than any GPU holds")
STEP_TOKENS = Bound(1, 2**40, "more tokens per step than any run takes")
ZERO = Bound(0, 3, "the last ZeRO stage")
CHUNKS = Bound(1, 1024, "more model chunks per pipeline rank than layers")
MICRO_BATCHES = Bound(1, 2**30, "more micro-batches than any step runs")
NODES = Bound(1, 2**20, "more nodes than any cluster has")
GPU_MEMORY = Bound(0.125, 16384, "more memory than any GPU has")
NODE_LINK = Bound(0.01, 100_000, "faster than any link inside a node")
NETWORK = Bound(0.01, 100_000, "faster than any network between nodes")
PEAK = Bound(0.01, 1_000_000, "more than any GPU computes")
FRACTION = Bound(0.001, 1, "more than the peak")

#: A setting's value type: an integer or a number within its bound, one of its choices, a
#: switch (true or false), or the path of a file.
SettingKind = Literal["integer", "number", "choice", "switch", "path"]


class _Unset:
    """The value of a setting that a trainer leaves to meshconf: none of its own."""

    def __repr__(self) -> str:
        return "UNSET"


UNSET: Any = _Unset()


@dataclass(frozen=True)
class Spelling:
    """How another trainer spells a setting: the argument (Megatron-LM's ``--name``) or key
    (torchtitan's ``section.key``) that gives it, and how its value maps to the setting's."""

    #: The argument or key written for the setting.
    name: str
    #: A switch: the setting's value when the switch is given (its absence: :attr:`default`);
    #: None where the argument takes the setting's own value.
    on: Any = None
    #: The setting's value where the trainer is given nothing (its own default).
    default: Any = UNSET
    #: Other names the trainer reads the same way (older arguments, its YAML config's keys).
    aliases: tuple[str, ...] = ()
    #: Words written before it, which say how the trainer reads it
    #: (``--recompute-method block`` before ``--recompute-num-layers N``).
    beside: tuple[str, ...] = ()

    @property
    def names(self) -> tuple[str, ...]:
        return (self.name, *self.aliases)


@dataclass(frozen=True)
class SettingValues:
    """The values a setting takes: its key of the ``training`` block, its kind, its bound or
    choices, the estimate's default (None where another setting or the GPU decides it), the
    option's placeholder (an option with choices lists them instead) and the values the JSON
    Schema shows. :meth:`described` makes it a row of the table."""

    key: str
    kind: SettingKind
    examples: tuple[Any, ...]
    default: Any = None
    choices: tuple[Any, ...] = ()
    bound: Bound | None = None
    metavar: str | None = None

    def described(self, description: str, help: str, **more: Any) -> TrainingSetting:
        """The setting's row: these values, what the setting is (``description``, as the
        config's reference and the JSON Schema say it), its option's ``help`` (``{default}``
        is the estimate's default) and ``more`` of the row's fields."""
        return TrainingSetting(**vars(self), description=description, help=help, **more)


@dataclass(frozen=True, kw_only=True)
class TrainingSetting(SettingValues):
    """One training setting: a key of a config's ``training`` block, the command-line
    option of the same name (``--checkpoint-every`` for ``checkpoint_every``), a field of the
    estimate's settings, and how Megatron-LM and torchtitan spell it."""

    description: str
    help: str
    #: The estimate's name for it, where the option's is shorter than the key's.
    estimate_name: str = ""
    #: The option, in Gb/s (eight times the GB/s), that gave it before; deprecated.
    gbps_option: str = ""
    #: The figure of the GPU preset (``meshconf.features.plan.estimate.gpus``) that it
    #: replaces, and that it takes when the GPU is chosen.
    gpu_figure: str = ""
    #: ``plan --emit`` writes it into the block for a model even where no option gave it.
    always_emitted: bool = False
    megatron: Spelling | None = None
    torchtitan: Spelling | None = None

    @property
    def option(self) -> str:
        """The command-line option: the key with ``-`` for ``_``."""
        return "--" + self.key.replace("_", "-")

    @property
    def attribute(self) -> str:
        """The estimate's name for it (and the option's destination)."""
        return self.estimate_name or self.key


def _listed(choices: Any) -> tuple[Any, ...]:
    return choices if isinstance(choices, tuple) else get_args(choices)


def integer(
    key: str,
    bound: Bound,
    metavar: str | None,
    default: int | None = None,
    *,
    example: int,
    choices: Any = (),
) -> SettingValues:
    """An integer setting within ``bound`` (and one of ``choices``, as :func:`choice`)."""
    return SettingValues(key, "integer", (example,), default, _listed(choices), bound, metavar)


def number(
    key: str, bound: Bound, metavar: str, default: float | None = None, *, example: float
) -> SettingValues:
    """A number setting (an integer or a decimal) within ``bound``."""
    return SettingValues(key, "number", (example,), default, bound=bound, metavar=metavar)


def choice(
    key: str,
    choices: Any,
    default: Any = None,
    *,
    example: Any,
    metavar: str | None = None,
) -> SettingValues:
    """A setting that takes one of ``choices``: a tuple, or the ``Literal`` type that lists
    them."""
    return SettingValues(key, "choice", (example,), default, _listed(choices), metavar=metavar)


def switch(key: str) -> SettingValues:
    """A switch: false by default, the JSON Schema showing it true."""
    return SettingValues(key, "switch", (True,), False)


def path(key: str, metavar: str, *, example: str) -> SettingValues:
    """The path of a file."""
    return SettingValues(key, "path", (example,), metavar=metavar)
