"""What the estimators need besides the model: the parallel degrees of a layout, and the
training settings (with their defaults, which ``docs/plan.md`` states)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from functools import lru_cache

from meshconf.core.degrees import DEGREE_NAMES, world_product
from meshconf.core.domains import DEFAULT_SIZE_OF
from meshconf.core.schedules import (
    DEFAULT_SCHEDULE,
    SCHEDULE_BY_NAME,
    PipelineSchedule,
    Placement,
    Schedule,
)
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
from meshconf.features.plan.estimate.gpus import DEFAULT_GPU, GPUS
from meshconf.features.plan.estimate.pipeline import (
    chunks_from_layers,
    weighted_ends,
    weights_problem,
)


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
    #: With ``full`` checkpointing, only every this many-th block of a pipeline rank is
    #: recomputed and the others keep their activations (torchtitan's layer-wise selective
    #: checkpointing); None, every block.
    checkpoint_every: int | None = None
    #: With ``full`` checkpointing, only the first this many blocks of each model chunk are
    #: recomputed (Megatron-LM's ``--recompute-method block``); None, every block.
    checkpoint_first: int | None = None
    #: With ``full`` checkpointing, the blocks of each model chunk are recomputed in groups of
    #: this many, each keeping only its input (Megatron-LM's ``--recompute-method uniform``);
    #: None, each block alone.
    checkpoint_group: int | None = None
    schedule: Schedule = DEFAULT_SCHEDULE
    virtual_stages: int = 1
    #: Under the interleaved and Llama 3 schedules, the micro-batches each model chunk runs
    #: before the next chunk's (Megatron-LM's
    #: ``--microbatch-group-size-per-virtual-pipeline-stage``, Llama 3's ``N``); None,
    #: torch's rounds (:func:`~.schedule.round_size`).
    microbatch_group: int | None = None
    reshard_after_forward: Resharding = "default"
    zero_stage: ZeroStage = 3
    #: Layers of each model chunk, the ends' weights counted: the chunks per pipeline rank
    #: then follow from the model (:meth:`for_model`), and ``virtual_stages`` is not given.
    layers_per_stage: int | None = None
    first_stage_layers: int | None = None
    last_stage_layers: int | None = None
    #: How many layers the embedding and the output count as when the layers are shared
    #: among pipeline chunks (torchtitan's split); None and None, the even split.
    embedding_as_layers: int | None = None
    output_as_layers: int | None = None
    #: Node-limited routing: each token goes to experts on at most this many units of the
    #: level its expert group crosses (DeepSeek-V3: 4 nodes); None, no limit.
    moe_max_nodes: int | None = None
    #: Whether the experts' dispatch and combine run under other compute (DualPipe).
    ep_overlap: bool = False
    #: The dtype tokens are dispatched to their experts in; None, the parameters'.
    dispatch_dtype: DispatchDtype | None = None
    #: Whether the blocks' dense linear weights are gathered (and, unsharded, kept) in fp8.
    fp8_param_gather: bool = False
    #: The dtype activations are kept in for the backward pass; ``fp8`` the linear layers'
    #: inputs only, the rest in ``param_dtype``; None, ``param_dtype``.
    activation_dtype: ActivationDtype | None = None
    optimizer_dtype: OptimizerDtype = "fp32"
    sequence_parallel: SequenceParallel = "dtensor"
    norm_kernel: NormKernel = "fused"
    #: GiB of each runtime term (:mod:`~.gpu_overheads`), None where the published figure holds;
    #: ``runtime_gib`` replaces all of them at once.
    runtime_gib: float | None = None
    cuda_context_gib: float | None = None
    nccl_communicator_gib: float | None = None
    allocator_gib: float | None = None
    #: The GPU preset (:data:`~.gpus.GPUS`) the next four figures come from, unless given.
    gpu: str = DEFAULT_GPU
    gpu_memory_gib: float = GPUS[DEFAULT_GPU].memory_gib
    #: GB/s per GPU, each way, between GPUs of one node.
    intra_node_gb_s: float = GPUS[DEFAULT_GPU].scale_up_gb_s
    #: GB/s per GPU across nodes.
    inter_node_gb_s: float = GPUS[DEFAULT_GPU].network_gb_s
    peak_tflops: float = GPUS[DEFAULT_GPU].peak_tflops
    mfu: float = 0.4
    mfu_counts: MfuCounts = "model"
    mfu_over: MfuOver = "compute"

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
        the estimators take them: the model chunks per rank that ``layers_per_stage`` gives,
        and the first and last chunk's layers that the embedding's and output's weights leave
        (torchtitan's split); with why the pipeline cannot be split so, or None."""
        resolved, problem = self, None
        if self.layers_per_stage is not None:
            per_rank, problem = chunks_from_layers(
                layers, pp, self.layers_per_stage, self.split_weights or (0, 0), self.schedule
            )
            virtual = per_rank if self.pipeline_schedule.looped else 1
            resolved = replace(self, layers_per_stage=None, virtual_stages=virtual)
        chunks = pp * resolved.chunks_per_stage
        weights = self.split_weights
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

    @property
    def stage_ends(self) -> Ends:
        """Layers of the first and the last pipeline chunk, where given (or, resolved for a
        model by :meth:`for_model`, left by the ends' weights)."""
        return (self.first_stage_layers, self.last_stage_layers)

    def reshards(self, pp: int) -> bool:
        """Whether FSDP frees a block's gathered parameters after its forward pass."""
        if self.reshard_after_forward == "default":
            return pp == 1
        return self.reshard_after_forward == "always"

    @property
    def pipeline_schedule(self) -> PipelineSchedule:
        """The schedule's row of ``meshconf.core.schedules.SCHEDULES``."""
        return SCHEDULE_BY_NAME[self.schedule]

    @property
    def chunks_per_stage(self) -> int:
        """Model chunks each pipeline rank holds: 1, the virtual stages looped, 2 in a V."""
        return self.pipeline_schedule.chunks_per_rank(self.virtual_stages)

    @property
    def placement(self) -> Placement:
        """Where the schedule places the chunks: in rounds, in a V or mirrored."""
        return self.pipeline_schedule.placement

    def chunk_share(self, pp: int) -> float:
        """The share of a rank's chunks each micro-batch passes through: all of them, but
        half mirrored, where half the micro-batches enter at each end of the pipeline and
        pass through one of the rank's two chunks (one chunk, without a pipeline)."""
        return 0.5 if self.placement == "mirror" and pp > 1 else 1.0


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
