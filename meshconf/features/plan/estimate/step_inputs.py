"""What the estimators need besides the model: the parallel degrees of a layout, and the
training settings (with the defaults of ``meshconf.core.settings``, which ``docs/plan.md``
states)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from functools import lru_cache
from typing import Any

from meshconf.core.degrees import DEGREE_NAMES, world_product
from meshconf.core.domains import DEFAULT_SIZE_OF
from meshconf.core.schedules import SCHEDULE_BY_NAME, PipelineSchedule, Placement, Schedule
from meshconf.core.setting_values import (
    DTYPE_BYTES,
    FP8_BYTES,
    FP8_OR_WIDER_BYTES,
    ActivationDtype,
    Checkpointing,
    DispatchDtype,
    Ends,
    MfuCounts,
    MfuOver,
    NormKernel,
    OptimizerDtype,
    Resharding,
    SequenceParallel,
    ZeroStage,
)
from meshconf.core.settings import SETTINGS, TRAINING_SETTINGS
from meshconf.features.plan.estimate.gpus import GPUS
from meshconf.features.plan.estimate.pipeline import (
    chunks_from_layers,
    weighted_ends,
    weights_problem,
)


def gpu_settings(name: str | None) -> dict[str, Any]:
    """The training settings a ``--gpu`` preset gives (none without one)."""
    if name is None:
        return {}
    gpu = GPUS[name]
    return {
        row.attribute: getattr(gpu, row.gpu_figure) for row in TRAINING_SETTINGS if row.gpu_figure
    }


#: Each setting's default, by the estimate's name: its row's, or for a figure of the GPU
#: preset, the default GPU's.
_DEFAULTS: Mapping[str, Any] = {
    row.attribute: row.default for row in TRAINING_SETTINGS
} | gpu_settings(SETTINGS["gpu"].default)


@dataclass(frozen=True)
class Training:
    """Training settings: each field is a setting, described by its row of
    ``meshconf.core.settings.TRAINING_SETTINGS`` (found by the estimate's name), whose
    default it takes (the default GPU's figure, for a figure of the GPU)."""

    seq_len: int = _DEFAULTS["seq_len"]
    micro_batch: int = _DEFAULTS["micro_batch"]
    global_batch_tokens: int | None = _DEFAULTS["global_batch_tokens"]
    param_dtype: str = _DEFAULTS["param_dtype"]
    grad_dtype: str = _DEFAULTS["grad_dtype"]
    checkpointing: Checkpointing = _DEFAULTS["checkpointing"]
    checkpoint_every: int | None = _DEFAULTS["checkpoint_every"]
    checkpoint_first: int | None = _DEFAULTS["checkpoint_first"]
    checkpoint_group: int | None = _DEFAULTS["checkpoint_group"]
    schedule: Schedule = _DEFAULTS["schedule"]
    virtual_stages: int = _DEFAULTS["virtual_stages"]
    microbatch_group: int | None = _DEFAULTS["microbatch_group"]
    reshard_after_forward: Resharding = _DEFAULTS["reshard_after_forward"]
    zero_stage: ZeroStage = _DEFAULTS["zero_stage"]
    layers_per_stage: int | None = _DEFAULTS["layers_per_stage"]
    first_stage_layers: int | None = _DEFAULTS["first_stage_layers"]
    last_stage_layers: int | None = _DEFAULTS["last_stage_layers"]
    embedding_as_layers: int | None = _DEFAULTS["embedding_as_layers"]
    output_as_layers: int | None = _DEFAULTS["output_as_layers"]
    moe_max_nodes: int | None = _DEFAULTS["moe_max_nodes"]
    ep_overlap: bool = _DEFAULTS["ep_overlap"]
    dispatch_dtype: DispatchDtype | None = _DEFAULTS["dispatch_dtype"]
    fp8_param_gather: bool = _DEFAULTS["fp8_param_gather"]
    activation_dtype: ActivationDtype | None = _DEFAULTS["activation_dtype"]
    optimizer_dtype: OptimizerDtype = _DEFAULTS["optimizer_dtype"]
    sequence_parallel: SequenceParallel = _DEFAULTS["sequence_parallel"]
    norm_kernel: NormKernel = _DEFAULTS["norm_kernel"]
    runtime_gib: float | None = _DEFAULTS["runtime_gib"]
    cuda_context_gib: float | None = _DEFAULTS["cuda_context_gib"]
    nccl_communicator_gib: float | None = _DEFAULTS["nccl_communicator_gib"]
    allocator_gib: float | None = _DEFAULTS["allocator_gib"]
    gpu: str = _DEFAULTS["gpu"]
    gpu_memory_gib: float = _DEFAULTS["gpu_memory_gib"]
    intra_node_gb_s: float = _DEFAULTS["intra_node_gb_s"]
    inter_node_gb_s: float = _DEFAULTS["inter_node_gb_s"]
    peak_tflops: float = _DEFAULTS["peak_tflops"]
    mfu: float = _DEFAULTS["mfu"]
    mfu_counts: MfuCounts = _DEFAULTS["mfu_counts"]
    mfu_over: MfuOver = _DEFAULTS["mfu_over"]

    @property
    def param_bytes(self) -> int:
        return DTYPE_BYTES[self.param_dtype]

    @property
    def activation_bytes(self) -> int:
        """Bytes per element of the activations kept for the backward pass (of the linear
        layers' inputs, under ``fp8``)."""
        return FP8_OR_WIDER_BYTES[self.activation_dtype or self.param_dtype]

    @property
    def stored_bytes(self) -> int:
        """Bytes per element of the other activations kept: ``param_dtype``'s under fp8."""
        if self.activation_dtype in (None, "fp8"):
            return self.param_bytes
        return FP8_OR_WIDER_BYTES[self.activation_dtype]

    @property
    def moment_bytes(self) -> int:
        """Bytes per element of each of AdamW's two moments."""
        return DTYPE_BYTES[self.optimizer_dtype]

    @property
    def dispatch_bytes(self) -> int:
        return FP8_OR_WIDER_BYTES[self.dispatch_dtype or self.param_dtype]

    @property
    def linear_bytes(self) -> int:
        """Bytes per element of the blocks' dense linear weights as data parallelism gathers
        them (and, under ZeRO 1 and 2, keeps them)."""
        return FP8_BYTES if self.fp8_param_gather else self.param_bytes

    @property
    def grad_bytes(self) -> int:
        return DTYPE_BYTES[self.grad_dtype]

    @property
    def split_weights(self) -> tuple[int, int] | None:
        """How many layers the embedding and the output count as in the pipeline split, when
        either is given (the other then counts as none)."""
        weights = (self.embedding_as_layers, self.output_as_layers)
        if weights == (None, None):
            return None
        return (self.embedding_as_layers or 0, self.output_as_layers or 0)

    def for_model(self, layers: int, pp: int) -> tuple[Training, str | None]:
        """These settings resolved for a model of ``layers`` layers over ``pp`` ranks, as
        the estimators take them: the chunks per rank that ``layers_per_stage`` gives and
        the end chunks' layers the ends' weights leave; with why they cannot be, or None."""
        return _for_model(self, layers, pp)

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
    def pipeline_schedule(self) -> PipelineSchedule:
        return SCHEDULE_BY_NAME[self.schedule]

    @property
    def chunks_per_stage(self) -> int:
        """Model chunks each pipeline rank holds: 1, the virtual stages looped, 2 in a V."""
        return self.pipeline_schedule.chunks_per_rank(self.virtual_stages)

    @property
    def placement(self) -> Placement:
        return self.pipeline_schedule.placement

    def chunk_share(self, pp: int) -> float:
        """The share of a rank's chunks each micro-batch passes through: half mirrored,
        where half the micro-batches enter at each end of the pipeline."""
        return 0.5 if self.placement == "mirror" and pp > 1 else 1.0


# a plan resolves the settings for each of its layouts, which share a few pipeline degrees
@lru_cache(maxsize=256)
def _for_model(training: Training, layers: int, pp: int) -> tuple[Training, str | None]:
    resolved, problem = training, None
    if training.layers_per_stage is not None:
        per_rank, problem = chunks_from_layers(
            layers,
            pp,
            training.layers_per_stage,
            training.split_weights or (0, 0),
            training.schedule,
        )
        virtual = per_rank if training.pipeline_schedule.looped else 1
        resolved = replace(training, layers_per_stage=None, virtual_stages=virtual)
    chunks = pp * resolved.chunks_per_stage
    weights = training.split_weights
    if weights is None or chunks < 2:
        return resolved, problem
    first, last = weighted_ends(layers, chunks, *weights)
    return replace(
        resolved,
        embedding_as_layers=None,
        output_as_layers=None,
        first_stage_layers=first,
        last_stage_layers=last,
    ), problem or weights_problem(layers, chunks, *weights)


#: Blocks of each kind, chunk by chunk, of one pipeline rank.
ChunkSizes = tuple[tuple[int, ...], ...]


@lru_cache(maxsize=4096)
def recomputed_blocks(
    sizes: ChunkSizes, checkpointing: Checkpointing, every: int | None, first: int | None
) -> ChunkSizes:
    """How many of each chunk's blocks of each kind the backward pass recomputes whole, in
    the rank's order (chunk by chunk, each chunk's dense blocks before its blocks with
    experts): all of them under ``full`` checkpointing; with ``every`` N only the rank's
    N-th, 2N-th... blocks, as torchtitan counts the blocks it wraps across a rank's chunks;
    with ``first`` N the first N of each chunk, as Megatron-LM's ``--recompute-method
    block`` does; none under ``none`` and ``selective``."""
    if checkpointing != "full":
        return tuple(tuple(0 for _ in chunk) for chunk in sizes)
    if first is not None:
        found = []
        for chunk in sizes:
            left, counts = first, []
            for count in chunk:
                counts.append(min(left, count))
                left -= counts[-1]
            found.append(tuple(counts))
        return tuple(found)
    if every is None:
        return sizes
    found, before = [], 0
    for chunk in sizes:
        counts = []
        for count in chunk:
            counts.append((before + count) // every - before // every)
            before += count
        found.append(tuple(counts))
    return tuple(found)


class Parallelism:
    """Every degree of a layout, as attributes (``parallelism.tp``), 1 where not given;
    ``fsdp``, ``efsdp`` and ``batch`` follow meshconf's default formulas
    (``meshconf.core.domains.DEFAULT_DERIVED``). Equal degrees are equal and hash alike,
    so the estimators' caches key on it.

    Raises:
        TypeError: a keyword is not a degree of ``meshconf.core.degrees.DEGREES``.
    """

    # Each degree and derived dim is a slot, read as fast as an attribute: a plan reads them
    # hundreds of times per layout. The derived ones are filled when first read.
    __slots__ = ("_degrees", "_key", *DEGREE_NAMES, *DEFAULT_SIZE_OF)
    _degrees: dict[str, int]
    _key: tuple[int, ...]

    def __init__(self, **degrees: int) -> None:
        unknown = sorted(set(degrees) - set(DEGREE_NAMES))
        if unknown:
            raise TypeError(f"not degrees: {', '.join(unknown)}")
        values = {name: degrees.get(name, 1) for name in DEGREE_NAMES}
        for name, value in values.items():
            object.__setattr__(self, name, value)
        object.__setattr__(self, "_degrees", values)
        object.__setattr__(self, "_key", tuple(values.values()))

    @classmethod
    def of(cls, degrees: Mapping[str, int]) -> Parallelism:
        """From a mapping with (at least) every degree's name; other keys are left out."""
        return cls(**{name: degrees.get(name, 1) for name in DEGREE_NAMES})

    def __getattr__(self, name: str) -> int:
        # Only slots not yet set come here: a derived dim read for the first time.
        size_of = DEFAULT_SIZE_OF.get(name)
        if size_of is None:
            raise AttributeError(name)
        size = size_of(self._degrees)
        object.__setattr__(self, name, size)
        return size

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"Parallelism is immutable: cannot set {name}")

    def __reduce__(self) -> tuple[object, tuple[dict[str, int]]]:
        return (Parallelism.of, (dict(self._degrees),))

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
