"""What the estimators need besides the model: the parallel degrees of a layout, and the
training settings (with their defaults, which ``docs/plan.md`` states)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from meshconf.core.degrees import DEGREE_NAMES, world_product
from meshconf.core.domains import DEFAULT_FORMULAS
from meshconf.core.formulas import evaluate

Checkpointing = Literal["none", "selective", "full"]
Schedule = Literal["1f1b", "interleaved"]
Resharding = Literal["default", "always", "never"]
ZeroStage = Literal[1, 2, 3]
#: What --mfu is a fraction of: the model's FLOPs (6 N plus attention per token, as published
#: MFU counts them), or the hardware's (recomputation included: HFU).
MfuCounts = Literal["model", "hardware"]
MFU_COUNTS: tuple[MfuCounts, ...] = ("model", "hardware")
#: Layers of the first and the last pipeline chunk, None where the split decides.
Ends = tuple[int | None, int | None]
CHECKPOINTING: tuple[Checkpointing, ...] = ("none", "selective", "full")
SCHEDULES: tuple[Schedule, ...] = ("1f1b", "interleaved")
#: FSDP's reshard_after_forward as torchtitan's policy names it: ``default`` is ``never``
#: with pipeline parallelism and ``always`` without.
RESHARDING: tuple[Resharding, ...] = ("default", "always", "never")
#: What data parallelism over ``fsdp`` (``efsdp`` for experts) shards, after Rajbhandari et
#: al., "ZeRO" (SC 2020), figure 1: 1 the optimizer state (Megatron-LM's distributed
#: optimizer), 2 also the gradients, 3 also the parameters (FSDP).
ZERO_STAGES: tuple[ZeroStage, ...] = (1, 2, 3)
#: Bytes per element of each dtype the options take.
DTYPE_BYTES: Mapping[str, int] = {"fp32": 4, "bf16": 2, "fp16": 2}
#: Bytes per element of the tokens a mixture of experts dispatches (DeepSeek-V3 sends fp8).
DISPATCH_BYTES: Mapping[str, int] = {"fp8": 1, **DTYPE_BYTES}
GIB = 2**30


@dataclass(frozen=True)
class Bound:
    """The values a training number may take: what a real model or machine reaches, with a
    margin, so that no sum, product or quotient of the estimators overflows, underflows to
    zero or divides by zero; ``beyond`` says what a larger value would be."""

    minimum: float
    maximum: float
    beyond: str


#: Every number of :class:`Training`, bounded where it is read (``meshconf plan`` and
#: ``show`` options, docs/plan.md).
TRAINING_BOUNDS: Mapping[str, Bound] = {
    "seq_len": Bound(1, 2**24, "more tokens per sequence than any model is trained on"),
    "micro_batch": Bound(1, 2**16, "more sequences per micro-batch than any GPU holds"),
    "global_batch_tokens": Bound(1, 2**40, "more tokens per step than any run takes"),
    "virtual_stages": Bound(1, 1024, "more model chunks per pipeline rank than layers"),
    "first_stage_layers": Bound(0, 100_000, "more layers than any model has"),
    "moe_max_nodes": Bound(1, 2**20, "more nodes than any cluster has"),
    "last_stage_layers": Bound(0, 100_000, "more layers than any model has"),
    "gpu_memory_gib": Bound(0.125, 16384, "more memory than any GPU has"),
    "intra_node_gbps": Bound(0.01, 100_000, "faster than any link inside a node"),
    "inter_node_gbps": Bound(0.01, 100_000, "faster than any network between nodes"),
    "peak_tflops": Bound(0.01, 1_000_000, "more than any GPU computes"),
    "mfu": Bound(0.001, 1, "more than the peak"),
}


@dataclass(frozen=True)
class Training:
    """Training settings. ``global_batch_tokens`` ``None`` means one micro-batch per GPU
    (``world_size * micro_batch * seq_len`` tokens)."""

    seq_len: int = 8192
    micro_batch: int = 1
    global_batch_tokens: int | None = None
    param_dtype: str = "bf16"
    grad_dtype: str = "fp32"
    checkpointing: Checkpointing = "full"
    schedule: Schedule = "1f1b"
    virtual_stages: int = 1
    reshard_after_forward: Resharding = "default"
    zero_stage: ZeroStage = 3
    first_stage_layers: int | None = None
    last_stage_layers: int | None = None
    #: Node-limited routing: each token goes to experts on at most this many units of the
    #: level its expert group crosses (DeepSeek-V3: 4 nodes); None, no limit.
    moe_max_nodes: int | None = None
    #: The dtype tokens are dispatched to their experts in; None, the parameters'.
    dispatch_dtype: str | None = None
    gpu_memory_gib: float = 80.0
    intra_node_gbps: float = 3600.0
    inter_node_gbps: float = 400.0
    peak_tflops: float = 989.0
    mfu: float = 0.4
    mfu_counts: MfuCounts = "model"

    @property
    def param_bytes(self) -> int:
        return DTYPE_BYTES[self.param_dtype]

    @property
    def dispatch_bytes(self) -> int:
        return DISPATCH_BYTES[self.dispatch_dtype or self.param_dtype]

    @property
    def grad_bytes(self) -> int:
        return DTYPE_BYTES[self.grad_dtype]

    @property
    def stage_ends(self) -> Ends:
        """Layers of the first and the last pipeline chunk, where given."""
        return (self.first_stage_layers, self.last_stage_layers)

    def reshards(self, pp: int) -> bool:
        """Whether FSDP frees a block's gathered parameters after its forward pass."""
        if self.reshard_after_forward == "default":
            return pp == 1
        return self.reshard_after_forward == "always"

    @property
    def chunks_per_stage(self) -> int:
        """Model chunks each pipeline rank holds: 1, or the virtual stages when interleaved."""
        return self.virtual_stages if self.schedule == "interleaved" else 1


class Parallelism:
    """Every degree of a layout, as attributes (``parallelism.tp``), 1 where not given;
    ``fsdp``, ``efsdp`` and ``batch`` follow meshconf's default formulas
    (``meshconf.core.domains.DEFAULT_DERIVED``). Equal degrees are equal and hash alike,
    so the estimators' caches key on it.

    Raises:
        TypeError: a keyword is not a degree of ``meshconf.core.degrees.DEGREES``.
    """

    __slots__ = ("_degrees", "_key")

    def __init__(self, **degrees: int) -> None:
        unknown = sorted(set(degrees) - set(DEGREE_NAMES))
        if unknown:
            raise TypeError(f"not degrees: {', '.join(unknown)}")
        self._degrees = {name: degrees.get(name, 1) for name in DEGREE_NAMES}
        self._key = tuple(self._degrees.values())

    @classmethod
    def of(cls, degrees: Mapping[str, int]) -> Parallelism:
        """From a mapping with (at least) every degree's name; other keys are left out."""
        return cls(**{name: degrees.get(name, 1) for name in DEGREE_NAMES})

    def __getattr__(self, name: str) -> int:
        # Only names that are not slots or methods come here: the degrees, then the dims
        # derived by the default formulas. A private name is a slot not yet set (copy, pickle).
        if name.startswith("_"):
            raise AttributeError(name)
        if name in DEFAULT_FORMULAS:
            return evaluate(DEFAULT_FORMULAS[name], self._degrees)
        try:
            return self._degrees[name]
        except KeyError:
            raise AttributeError(name) from None

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Parallelism) and self._key == other._key

    def __hash__(self) -> int:
        return hash(self._key)

    def __repr__(self) -> str:
        written = ", ".join(f"{name}={value}" for name, value in self._degrees.items())
        return f"Parallelism({written})"

    @property
    def world(self) -> int:
        return world_product(self._degrees)


def microbatches(parallelism: Parallelism, training: Training) -> int:
    """Micro-batches each data-parallel rank runs per step (gradient accumulation steps, and
    the pipeline's micro-batches): the global batch over the sequences one micro-batch of all
    batch ranks holds, rounded up, at least 1."""
    tokens = training.global_batch_tokens
    per_microbatch = training.seq_len * training.micro_batch * parallelism.batch
    if tokens is None:
        return parallelism.world // parallelism.batch
    return max(1, -(-tokens // per_microbatch))
