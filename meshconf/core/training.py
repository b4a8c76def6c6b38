"""The settings of how training uses a layout that the estimate reads (docs/plan.md): their
choices and bounds, in one place for the command line, the config's ``training`` block and
the estimators."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

#: What the backward pass recomputes (docs/plan.md): nothing; what torchtitan's per-op
#: policy does not keep; every block from its input; or the norms, latent attention's
#: up-projections and the mixture of experts' SwiGLU outputs, keeping the SwiGLU's inputs, as
#: DeepSeek-V3 trains (its report, sections 3.2.3 and 3.3.3).
Checkpointing = Literal["none", "selective", "full", "norms-latent-swiglu"]
Schedule = Literal[
    "1f1b", "interleaved", "llama3", "loopedbfs", "gpipe", "zbv", "dualpipev", "dualpipe"
]
Resharding = Literal["default", "always", "never"]
ZeroStage = Literal[0, 1, 2, 3]
#: What --mfu is a fraction of: the model's FLOPs (6 N plus attention per token, as published
#: MFU counts them), or the hardware's (recomputation included: HFU).
MfuCounts = Literal["model", "hardware"]
MFU_COUNTS: tuple[MfuCounts, ...] = ("model", "hardware")
#: What --mfu is measured over: the compute alone (the pipeline bubble and the communication
#: not hidden come on top), or the whole step, as a published MFU is (tokens per second of
#: the run, whatever stalled it).
MfuOver = Literal["compute", "step"]
MFU_OVER: tuple[MfuOver, ...] = ("compute", "step")
#: Layers of the first and the last pipeline chunk, None where the split decides.
Ends = tuple[int | None, int | None]
CHECKPOINTING: tuple[Checkpointing, ...] = ("none", "selective", "full", "norms-latent-swiglu")
SCHEDULES: tuple[Schedule, ...] = (
    "1f1b",
    "interleaved",
    "llama3",
    "loopedbfs",
    "gpipe",
    "zbv",
    "dualpipev",
    "dualpipe",
)
#: The schedules that run ``virtual_stages`` chunks a pipeline rank, placed in rounds:
#: chunk ``c`` on rank ``c % pp`` (torch's ``ScheduleInterleaved1F1B`` and
#: ``ScheduleLoopedBFS``; Llama 3's, The Llama 3 Herd of Models, section 3.3.2).
LOOPED_SCHEDULES: tuple[Schedule, ...] = ("interleaved", "llama3", "loopedbfs")
#: The schedules that run each model chunk on a group of micro-batches before the next
#: chunk's (``microbatch_group``): Megatron-LM's interleaved one, which takes ``pp`` to ``m``
#: in a group, and Llama 3's, which takes any number, fewer than ``pp`` too.
GROUPED_SCHEDULES: tuple[Schedule, ...] = ("interleaved", "llama3")
#: The schedules that place two model chunks on each pipeline rank in a V: chunk ``r`` and
#: chunk ``2 pp - 1 - r`` on rank ``r`` (torch's ``ScheduleZBVZeroBubble`` and
#: ``ScheduleDualPipeV``), so the first rank holds the embedding and the output.
V_SCHEDULES: tuple[Schedule, ...] = ("zbv", "dualpipev")
#: FSDP's reshard_after_forward as torchtitan's policy names it: ``default`` is ``never``
#: with pipeline parallelism and ``always`` without.
RESHARDING: tuple[Resharding, ...] = ("default", "always", "never")
#: What data parallelism over ``fsdp`` (``efsdp`` for experts) shards, after Rajbhandari et
#: al., "ZeRO" (SC 2020), figure 1: 0 nothing (plain data parallelism, Megatron-LM without
#: its distributed optimizer), 1 the optimizer state (Megatron-LM's distributed optimizer),
#: 2 also the gradients, 3 also the parameters (FSDP).
ZERO_STAGES: tuple[ZeroStage, ...] = (0, 1, 2, 3)
#: Bytes per element of each dtype the options take.
DTYPE_BYTES: Mapping[str, int] = {"fp32": 4, "bf16": 2, "fp16": 2}
FP8_BYTES = 1
#: A dtype fp8 may stand in for where a step keeps or sends a tensor: the tokens a mixture of
#: experts dispatches (DeepSeek-V3 sends fp8), the activations kept for the backward pass.
Fp8OrWider = Literal["fp8", "fp32", "bf16", "fp16"]
FP8_OR_WIDER_BYTES: Mapping[str, int] = {"fp8": FP8_BYTES, **DTYPE_BYTES}
DispatchDtype = Fp8OrWider
#: The dtype the activations kept for the backward pass are stored in; fp8 keeps the inputs
#: of the linear layers in fp8 and the rest in the parameters' dtype, as DeepSeek-V3 does
#: (its report, section 3.3.3).
ActivationDtype = Fp8OrWider
GIB = 2**30
#: The dtype AdamW keeps its two moments in: fp32 (torch's AdamW), or bf16 as DeepSeek-V3
#: does (its report, section 3.3.3; Megatron-LM's --exp-avg-dtype and --exp-avg-sq-dtype).
OptimizerDtype = Literal["fp32", "bf16"]
OPTIMIZER_DTYPES: tuple[OptimizerDtype, ...] = ("fp32", "bf16")
#: How RMSNorm runs: one fused kernel that keeps its input and one fp32 reciprocal RMS per
#: token (torch's RMSNorm under compile, Transformer Engine's, Apex's), or eager ops on an
#: fp32 copy of the input, as Hugging Face's LlamaRMSNorm and Llama's reference model write
#: it, which keep that fp32 copy and the normalized input besides.
NormKernel = Literal["fused", "eager"]
NORM_KERNELS: tuple[NormKernel, ...] = ("fused", "eager")
#: How tensor parallelism treats the tensors outside its split cores: ``dtensor`` splits
#: them over the sequence and keeps each norm's gathered output whole for the products that
#: follow (torchtitan's plan); ``megatron`` keeps it split and gathers it again in the
#: backward pass (Korthikanti et al., section 4.2.2; Megatron-LM's --sequence-parallel);
#: ``none`` splits nothing outside the cores (tensor parallelism without sequence
#: parallelism, Megatron-LM's default).
SequenceParallel = Literal["dtensor", "megatron", "none"]
SEQUENCE_PARALLEL: tuple[SequenceParallel, ...] = ("dtensor", "megatron", "none")
#: The dtypes parameters and gradients are kept in (the keys of :data:`DTYPE_BYTES`).
Dtype = Literal["fp32", "bf16", "fp16"]
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


#: Every number of the estimate's training settings, bounded where it is read (``meshconf
#: plan`` and ``show`` options, a config's ``training`` block; docs/plan.md).
TRAINING_BOUNDS: Mapping[str, Bound] = {
    "seq_len": Bound(1, 2**24, "more tokens per sequence than any model is trained on"),
    "micro_batch": Bound(1, 2**16, "more sequences per micro-batch than any GPU holds"),
    "global_batch_tokens": Bound(1, 2**40, "more tokens per step than any run takes"),
    "virtual_stages": Bound(1, 1024, "more model chunks per pipeline rank than layers"),
    "microbatch_group": Bound(1, 2**30, "more micro-batches than any step runs"),
    "checkpoint_group": Bound(1, 100_000, "more layers than any model has"),
    "checkpoint_every": Bound(1, 100_000, "more layers than any model has"),
    "checkpoint_first": Bound(1, 100_000, "more layers than any model has"),
    "layers_per_stage": Bound(1, 100_000, "more layers than any model has"),
    "first_stage_layers": Bound(0, 100_000, "more layers than any model has"),
    "moe_max_nodes": Bound(1, 2**20, "more nodes than any cluster has"),
    "last_stage_layers": Bound(0, 100_000, "more layers than any model has"),
    "embedding_as_layers": Bound(0, 100_000, "more layers than any model has"),
    "output_as_layers": Bound(0, 100_000, "more layers than any model has"),
    "gpu_memory_gib": Bound(0.125, 16384, "more memory than any GPU has"),
    "intra_node_gb_s": Bound(0.01, 100_000, "faster than any link inside a node"),
    "inter_node_gb_s": Bound(0.01, 100_000, "faster than any network between nodes"),
    "peak_tflops": Bound(0.01, 1_000_000, "more than any GPU computes"),
    "mfu": Bound(0.001, 1, "more than the peak"),
    "runtime_gib": Bound(0, 16384, "more memory than any GPU has"),
    "cuda_context_gib": Bound(0, 16384, "more memory than any GPU has"),
    "nccl_communicator_gib": Bound(0, 16384, "more memory than any GPU has"),
    "allocator_gib": Bound(0, 16384, "more memory than any GPU has"),
}


#: Why fp8 parameter gathers need a ZeRO stage above 0, for each reader's message.
FP8_WITHOUT_GATHERS = "ZeRO 0 keeps the parameters whole on every rank and gathers none"


def fp8_without_gathers(zero_stage: int | None, fp8_param_gather: bool | None) -> bool:
    """Whether parameters are to be gathered in fp8 where data parallelism gathers none:
    ZeRO 0 keeps them whole on every rank."""
    return bool(fp8_param_gather) and zero_stage == 0


#: The settings that choose which blocks full checkpointing recomputes, which exclude each
#: other.
RECOMPUTATION_CHOICES = ("checkpoint_every", "checkpoint_first", "checkpoint_group")


def recomputation_mismatch(
    checkpointing: str | None,
    every: int | None,
    first: int | None,
    group: int | None,
) -> tuple[str, str, str] | None:
    """Why the blocks to recompute cannot be chosen as asked: ``both`` when two of
    :data:`RECOMPUTATION_CHOICES` are given, ``mode`` when one is given without full
    checkpointing (the default is full); with the setting at fault and, for ``both``, the
    one given before it; None when they fit. Each reader words it with its own names."""
    given = [
        name
        for name, value in zip(RECOMPUTATION_CHOICES, (every, first, group), strict=True)
        if value is not None
    ]
    if len(given) > 1:
        return "both", given[-1], given[0]
    if given and checkpointing not in (None, "full"):
        return "mode", given[0], given[0]
    return None


#: Why the layers of the end chunks and the weights of the embedding and output exclude each
#: other, for each reader's message (Megatron-LM refuses them together too).
SPLIT_CONFLICT = "both set the layers of the first and last pipeline chunks"


def split_conflict(ends: Ends, weights: tuple[int | None, int | None]) -> bool:
    """Whether the first or last chunk's layers are given beside a weight of the embedding
    or the output."""
    return ends != (None, None) and weights != (None, None)


def schedule_mismatch(
    schedule: str | None, virtual_stages: int | None, layers_per_stage: int | None
) -> str | None:
    """Why a schedule and its model chunks per pipeline rank do not go together: ``both``
    when the chunks are given as a count and as layers per chunk, ``stages`` when a schedule
    of :data:`LOOPED_SCHEDULES` has fewer than 2, ``schedule`` when chunks are given without
    one;
    None when they fit (chunks given as layers per chunk are checked against the model).
    Each reader words it with its own option names."""
    if layers_per_stage is not None:
        return "both" if virtual_stages is not None else None
    if schedule in LOOPED_SCHEDULES:
        return "stages" if virtual_stages is None or virtual_stages < 2 else None
    return "schedule" if virtual_stages not in (None, 1) else None


def group_mismatch(schedule: str | None, group: int | None) -> bool:
    """Whether micro-batches are grouped per model chunk (``microbatch_group``) under a
    schedule other than those that group them (:data:`GROUPED_SCHEDULES`)."""
    return group is not None and schedule not in GROUPED_SCHEDULES
