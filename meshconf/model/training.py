"""The config's ``training`` block: what the estimate of the layout reads, the model, the GPU
and the batch, and how training uses the layout's dims (how far data parallelism shards, how
the pipeline is split, how experts are reached). ``meshconf show``, ``measure`` and ``plan``
read it, ``plan --emit`` writes it; the runtime builds the same meshes whatever it says. The
choices and bounds are those of the command-line options (:mod:`meshconf.core.training`)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Annotated, Any, NoReturn

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    GetCoreSchemaHandler,
    GetJsonSchemaHandler,
    model_validator,
)
from pydantic_core import PydanticCustomError, core_schema

from meshconf.core.errors import describe_value
from meshconf.core.training import (
    FP8_WITHOUT_GATHERS,
    SPLIT_CONFLICT,
    TRAINING_BOUNDS,
    ZERO_STAGES,
    ActivationDtype,
    Checkpointing,
    DispatchDtype,
    Dtype,
    GpuPreset,
    MfuCounts,
    MfuOver,
    ModelPreset,
    NormKernel,
    OptimizerDtype,
    Resharding,
    Schedule,
    SequenceParallel,
    fp8_without_gathers,
    group_mismatch,
    recomputation_mismatch,
    schedule_mismatch,
    split_conflict,
)
from meshconf.model.errors import FieldError, validation_error
from meshconf.model.fields import IntegerBound


def _boolean(value: Any) -> bool:
    # true or false only: not pydantic's lax 1 or "yes"
    if not isinstance(value, bool):
        raise PydanticCustomError(
            "bool_type", "expected true or false, got {got}", {"got": describe_value(value)}
        )
    return value


def _bounded(name: str) -> IntegerBound:
    bound = TRAINING_BOUNDS[name]
    return IntegerBound(int(bound.minimum), int(bound.maximum), bound.beyond)


_STAGES = IntegerBound(min(ZERO_STAGES), max(ZERO_STAGES), "the last ZeRO stage")


@dataclass(frozen=True)
class _NumberBound:
    """A number (an integer or a decimal) within a training number's bounds
    (:data:`TRAINING_BOUNDS`), with the command line's messages."""

    name: str

    def check(self, value: Any) -> float:
        bound = TRAINING_BOUNDS[self.name]
        expected = f"expected a number from {bound.minimum:g} to {bound.maximum:g}"
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise PydanticCustomError(
                "number_type",
                "{expected}, got {got}",
                {"expected": expected, "got": describe_value(value)},
            )
        if math.isfinite(value) and value > bound.maximum:
            raise PydanticCustomError(
                "number_range",
                "{value} is more than {maximum}: {beyond}",
                {"value": f"{value:g}", "maximum": f"{bound.maximum:g}", "beyond": bound.beyond},
            )
        if not bound.minimum <= value <= bound.maximum:  # also refuses nan and infinities
            raise PydanticCustomError(
                "number_range",
                "{expected}, got {value}",
                {"expected": expected, "value": f"{value:g}"},
            )
        return float(value)

    def __get_pydantic_core_schema__(
        self, source: Any, handler: GetCoreSchemaHandler
    ) -> core_schema.CoreSchema:
        return core_schema.no_info_plain_validator_function(self.check)

    def __get_pydantic_json_schema__(
        self, schema: core_schema.CoreSchema, handler: GetJsonSchemaHandler
    ) -> dict[str, Any]:
        bound = TRAINING_BOUNDS[self.name]
        return {"type": "number", "minimum": bound.minimum, "maximum": bound.maximum}


def _model_file(value: Any) -> str:
    if not isinstance(value, str) or not value or "\0" in value:
        raise PydanticCustomError(
            "path_type",
            "expected the path of a model file, got {got}",
            {"got": describe_value(value)},
        )
    return value


class TrainingOptions(BaseModel):
    """What the estimate reads: the model, the GPU, the batch and how training uses the
    dims; a key left out takes the estimate's default (docs/plan.md), and a command-line
    option of the same name replaces it."""

    # strict=False: the field types check and convert values themselves; unknown keys are
    # refused and a validated block cannot change.
    model_config = ConfigDict(frozen=True, extra="forbid", strict=False)

    model: ModelPreset | None = Field(
        None,
        description="The model estimated, a preset (as --model): the estimate then needs no "
        "--model. Excludes model_file.",
        examples=["deepseek-v3"],
    )
    model_file: Annotated[str, BeforeValidator(_model_file)] | None = Field(
        None,
        description="The model estimated, a model file (as --model-file); a relative path is "
        "read from the config's folder. Excludes model.",
        examples=["models/tiny-moe.yaml"],
    )
    gpu: GpuPreset | None = Field(
        None,
        description="The GPU (as --gpu): its memory, dense bf16 peak and bandwidths, which "
        "gpu_memory_gib, peak_tflops, intra_node_gb_s and inter_node_gb_s replace one by one; "
        "h100-sxm by default.",
        examples=["gb200"],
    )
    seq_len: Annotated[int, _bounded("seq_len")] | None = Field(
        None, description="Tokens per sequence; 8192 by default.", examples=[4096]
    )
    micro_batch: Annotated[int, _bounded("micro_batch")] | None = Field(
        None, description="Sequences per micro-batch; 1 by default.", examples=[1]
    )
    global_batch_tokens: Annotated[int, _bounded("global_batch_tokens")] | None = Field(
        None,
        description="Tokens per optimizer step, which set the micro-batches each data-parallel "
        "rank runs; by default one micro-batch per GPU.",
        examples=[62914560],
    )
    param_dtype: Dtype | None = Field(
        None,
        description="The dtype of the stored parameters, the FSDP gathers and the "
        "activations; bf16 by default.",
        examples=["bf16"],
    )
    grad_dtype: Dtype | None = Field(
        None,
        description="The dtype of the gradients and of their reduction; fp32 by default.",
        examples=["fp32"],
    )
    zero_stage: Annotated[int, _STAGES] | None = Field(
        None,
        description="What data parallelism over fsdp (efsdp for experts) shards: 0 nothing, 1 "
        "the optimizer state (Megatron's distributed optimizer), 2 also the gradients, 3 also "
        "the parameters (FSDP; the default).",
        examples=[1],
    )
    activation_checkpointing: Checkpointing | None = Field(
        None,
        description="What the backward pass recomputes: none, selective (what torchtitan's "
        "per-op policy does not keep), full (every block) or norms-latent-swiglu (the norms, "
        "latent attention's up-projections and the experts' SwiGLU outputs, keeping the "
        "SwiGLU's inputs: DeepSeek-V3's report, sections 3.2.3 and 3.3.3); full by default.",
        examples=["selective"],
    )
    checkpoint_every: Annotated[int, _bounded("checkpoint_every")] | None = Field(
        None,
        description="With activation_checkpointing full, only every this many-th block of a "
        "pipeline rank is recomputed and the others keep their activations: torchtitan's "
        'selective_ac_option = "N" (its default, 2); by default every block.',
        examples=[2],
    )
    checkpoint_first: Annotated[int, _bounded("checkpoint_first")] | None = Field(
        None,
        description="With activation_checkpointing full, only the first this many blocks of "
        "each model chunk are recomputed and the others keep their activations: Megatron's "
        "--recompute-method block --recompute-num-layers N; by default every block. Excludes "
        "checkpoint_every.",
        examples=[4],
    )
    checkpoint_group: Annotated[int, _bounded("checkpoint_group")] | None = Field(
        None,
        description="With activation_checkpointing full, the blocks of each model chunk are "
        "recomputed in groups of this many, each group keeping only its input and recomputing "
        "all its blocks at once in the backward pass: Megatron's --recompute-method uniform "
        "--recompute-num-layers N; by default 1 (each block alone). Excludes checkpoint_every "
        "and checkpoint_first.",
        examples=[2],
    )
    reshard_after_forward: Resharding | None = Field(
        None,
        description="Whether FSDP frees gathered parameters after each forward pass, as "
        "torchtitan's fsdp_reshard_after_forward: default (never with pp > 1, else always).",
        examples=["never"],
    )
    pp_schedule: Schedule | None = Field(
        None,
        description="The pipeline schedule: 1f1b (the default), interleaved (1F1B over "
        "virtual_stages chunks a rank), llama3 (Llama 3's: interleaved, each chunk running "
        "microbatch_group micro-batches before the next chunk's, fewer than pp too), loopedbfs "
        "(torch's LoopedBFS: every forward pass of "
        "every chunk before the backward passes), gpipe (every forward pass before the backward "
        "passes), zbv (torch's ZBVZeroBubble), dualpipev (DualPipeV) or dualpipe "
        "(DeepSeek's DualPipe); zbv and dualpipev place two chunks on each rank in a V, the "
        "first rank holding the embedding and the output; dualpipe sends half the "
        "micro-batches from each end, each rank holding its chunk and a copy of its mirror "
        "rank's.",
        examples=["interleaved"],
    )
    virtual_stages: Annotated[int, _bounded("virtual_stages")] | None = Field(
        None,
        description="Model chunks per pipeline rank, with pp_schedule interleaved, llama3 or "
        "loopedbfs.",
        examples=[8],
    )
    microbatch_group: Annotated[int, _bounded("microbatch_group")] | None = Field(
        None,
        description="With pp_schedule interleaved or llama3, the micro-batches each model chunk "
        "runs before the next chunk's: Megatron-LM's "
        "--microbatch-group-size-per-virtual-pipeline-stage (its default, pp; at least pp "
        "there), Llama 3's N (any number up to the micro-batches a step); by default torch's "
        "rounds (pp when the micro-batches are a multiple of pp). Each micro-batch "
        "more in a group keeps virtual_stages - 1 more chunk-micro-batches in flight on every "
        "rank.",
        examples=[16],
    )
    layers_per_stage: Annotated[int, _bounded("layers_per_stage")] | None = Field(
        None,
        description="Layers of each model chunk, the embedding's and output's weights "
        "(embedding_as_layers, output_as_layers) counted: the chunks per pipeline rank follow "
        "from the model, ceil((layers + weights) / layers_per_stage) / pp, as torchtitan's "
        "pipeline_parallel_layers_per_stage sets them. Excludes virtual_stages.",
        examples=[4],
    )
    first_stage_layers: Annotated[int, _bounded("first_stage_layers")] | None = Field(
        None,
        description="Layers of the first pipeline chunk (0: the embedding alone); by default "
        "the layers are shared evenly.",
        examples=[0],
    )
    last_stage_layers: Annotated[int, _bounded("last_stage_layers")] | None = Field(
        None,
        description="Layers of the last pipeline chunk (0: the output and loss alone).",
        examples=[0],
    )
    embedding_as_layers: Annotated[int, _bounded("embedding_as_layers")] | None = Field(
        None,
        description="How many layers the embedding counts as when the layers are shared among "
        "pipeline chunks, the first chunk holding that many fewer: torchtitan's "
        "pipeline_parallel_first_stage_less_layers (1 there by default), Megatron's "
        "--account-for-embedding-in-pipeline-split (1); by default the layers are shared evenly.",
        examples=[1],
    )
    output_as_layers: Annotated[int, _bounded("output_as_layers")] | None = Field(
        None,
        description="How many layers the output and loss count as, the last chunk holding that "
        "many fewer: torchtitan's pipeline_parallel_last_stage_less_layers (1 there by "
        "default), Megatron's --account-for-loss-in-pipeline-split (1); by default the layers "
        "are shared evenly.",
        examples=[1],
    )
    moe_max_nodes: Annotated[int, _bounded("moe_max_nodes")] | None = Field(
        None,
        description="Node-limited routing: each token goes to experts on at most this many "
        "units of the level its expert group crosses (DeepSeek-V3: 4).",
        examples=[4],
    )
    ep_overlap: Annotated[bool, BeforeValidator(_boolean)] | None = Field(
        None,
        description="Whether the experts' dispatch and combine run under another "
        "micro-batch's compute (DeepSeek-V3's DualPipe, torchtitan's DualPipeV with "
        "pipeline_parallel_expert_parallel_overlap); false by default.",
        examples=[True],
    )
    dispatch_dtype: DispatchDtype | None = Field(
        None,
        description="The dtype tokens are dispatched to their experts in; by default the "
        "parameters'.",
        examples=["fp8"],
    )
    activation_dtype: ActivationDtype | None = Field(
        None,
        description="The dtype of the activations kept for the backward pass: fp8 keeps the "
        "inputs of the linear layers in fp8 and the rest in the parameters' dtype, as "
        "DeepSeek-V3 does (its report, section 3.3.3); by default the parameters' dtype.",
        examples=["fp8"],
    )
    optimizer_dtype: OptimizerDtype | None = Field(
        None,
        description="The dtype of AdamW's two moments: bf16 as DeepSeek-V3 keeps them (its "
        "report, section 3.3.3; Megatron-LM's --exp-avg-dtype and --exp-avg-sq-dtype), the "
        "master weights staying fp32; fp32 by default.",
        examples=["bf16"],
    )
    sequence_parallel: SequenceParallel | None = Field(
        None,
        description="How tensor parallelism treats the tensors outside its split cores: "
        "dtensor (the default: split over the sequence, each norm's gathered output kept "
        "whole, as torchtitan's plan runs), megatron (kept split and gathered again in the "
        "backward pass: Megatron-LM's --sequence-parallel) or none (tensor parallelism "
        "without sequence parallelism: nothing outside the cores split).",
        examples=["megatron"],
    )
    norm_kernel: NormKernel | None = Field(
        None,
        description="How RMSNorm runs: fused (the default: one kernel keeping its input and a "
        "reciprocal RMS per token, as torch's RMSNorm under compile and Transformer Engine "
        "run it) or eager (ops on an fp32 copy of the input, as Hugging Face's LlamaRMSNorm "
        "and Llama's reference model write it, keeping that copy and the normalized input).",
        examples=["eager"],
    )
    fp8_param_gather: Annotated[bool, BeforeValidator(_boolean)] | None = Field(
        None,
        description="Whether data parallelism gathers the blocks' dense linear weights "
        "(attention and dense feed-forward, not routed experts) in fp8, and under ZeRO 1 and 2 "
        "keeps them in fp8: torchtitan's enable_fsdp_float8_all_gather, Megatron's "
        "--fp8-param-gather; false by default.",
        examples=[True],
    )
    gpu_memory_gib: Annotated[float, _NumberBound("gpu_memory_gib")] | None = Field(
        None,
        description="Memory per GPU, GiB; the GPU's by default.",
        examples=[180],
    )
    intra_node_gb_s: Annotated[float, _NumberBound("intra_node_gb_s")] | None = Field(
        None,
        description="Bandwidth per GPU inside a node, GB/s each way, for a level without its "
        "own bandwidth_gb_s; the GPU's by default.",
        examples=[450],
    )
    inter_node_gb_s: Annotated[float, _NumberBound("inter_node_gb_s")] | None = Field(
        None,
        description="Bandwidth per GPU across nodes, GB/s; the GPU's by default.",
        examples=[50],
    )
    peak_tflops: Annotated[float, _NumberBound("peak_tflops")] | None = Field(
        None,
        description="Peak dense TFLOP/s of one GPU; the GPU's by default.",
        examples=[989],
    )
    mfu: Annotated[float, _NumberBound("mfu")] | None = Field(
        None,
        description="The fraction of the peak the matrix products reach, as mfu_counts and "
        "mfu_over say; 0.4 by default.",
        examples=[0.4],
    )
    mfu_counts: MfuCounts | None = Field(
        None,
        description="What mfu is a fraction of: model FLOPs (the default, as published MFU "
        "counts them) or hardware FLOPs (recomputation counted).",
        examples=["hardware"],
    )
    mfu_over: MfuOver | None = Field(
        None,
        description="What mfu is measured over: the compute alone (the default) or the whole "
        "step, as a published MFU is.",
        examples=["step"],
    )
    runtime_gib: Annotated[float, _NumberBound("runtime_gib")] | None = Field(
        None,
        description="GiB per GPU for the CUDA context, NCCL's buffers and the allocator's "
        "reserve together, replacing the published figures of the three keys below.",
        examples=[0],
    )
    cuda_context_gib: Annotated[float, _NumberBound("cuda_context_gib")] | None = Field(
        None,
        description="GiB of the CUDA context; the published figure by default.",
        examples=[0.5],
    )
    nccl_communicator_gib: Annotated[float, _NumberBound("nccl_communicator_gib")] | None = Field(
        None,
        description="GiB of NCCL's buffers per communicator a rank sends over; the published "
        "figures by default.",
        examples=[0.5],
    )
    allocator_gib: Annotated[float, _NumberBound("allocator_gib")] | None = Field(
        None,
        description="GiB of the caching allocator's reserve beyond the tensors at the peak; "
        "the estimate's figure by default.",
        examples=[2],
    )

    @model_validator(mode="after")
    def _settings_go_together(self) -> TrainingOptions:
        if self.model is not None and self.model_file is not None:
            self._refuse(
                "model_file",
                "model_conflict",
                "model and model_file exclude each other: both name the model estimated",
            )
        if fp8_without_gathers(self.zero_stage, self.fp8_param_gather):
            self._refuse(
                "fp8_param_gather",
                "fp8_without_gathers",
                f"fp8_param_gather needs zero_stage 1, 2 or 3: {FP8_WITHOUT_GATHERS}",
            )
        recomputation = recomputation_mismatch(
            self.activation_checkpointing,
            self.checkpoint_every,
            self.checkpoint_first,
            self.checkpoint_group,
        )
        if recomputation is not None:
            why, setting, before = recomputation
            self._refuse(
                setting,
                "recomputation_mismatch",
                f"{before} and {setting} exclude each other: both choose the blocks recomputed"
                if why == "both"
                else f"{setting} needs activation_checkpointing full: only full checkpointing "
                "recomputes whole blocks",
            )
        weights = (self.embedding_as_layers, self.output_as_layers)
        if split_conflict((self.first_stage_layers, self.last_stage_layers), weights):
            weighted = (
                "embedding_as_layers"
                if self.embedding_as_layers is not None
                else "output_as_layers"
            )
            self._refuse(
                weighted,
                "split_conflict",
                f"{weighted} and first_stage_layers or last_stage_layers exclude each other: "
                f"{SPLIT_CONFLICT}",
            )
        mismatch = schedule_mismatch(self.pp_schedule, self.virtual_stages, self.layers_per_stage)
        if mismatch is not None:
            self._refuse(
                "virtual_stages",
                "schedule_stages",
                {
                    "stages": f"pp_schedule {self.pp_schedule} needs virtual_stages >= 2",
                    "schedule": "virtual_stages needs pp_schedule interleaved, llama3 or loopedbfs",
                    "both": "virtual_stages and layers_per_stage exclude each other: both set "
                    "the model chunks per pipeline rank",
                }[mismatch],
            )
        if group_mismatch(self.pp_schedule, self.microbatch_group):
            self._refuse(
                "microbatch_group",
                "schedule_group",
                "microbatch_group needs pp_schedule interleaved or llama3: no other schedule "
                "groups the micro-batches of a model chunk",
            )
        return self

    def _refuse(self, key: str, code: str, message: str) -> NoReturn:
        """Refuse the block at ``key``, which does not go with the keys before it."""
        raise validation_error(
            "TrainingOptions", [FieldError((key,), code, message, input=getattr(self, key))]
        )

    def estimate_settings(self) -> dict[str, Any]:
        """The keys set, by the estimate's setting names (:func:`setting_name`): ``model``
        or ``model_file`` name the model, the others are settings of the estimate."""
        return {
            setting_name(key): value
            for key, value in self.model_dump().items()
            if value is not None
        }


#: Keys of the block whose setting the estimate names otherwise, after the command line's
#: option (``--pp-schedule``, ``--activation-checkpointing``).
_SETTING_NAMES = {"pp_schedule": "schedule", "activation_checkpointing": "checkpointing"}


def setting_name(key: str) -> str:
    """The estimate's name for a key of the block: the same, but for ``pp_schedule`` and
    ``activation_checkpointing`` (``schedule`` and ``checkpointing``)."""
    return _SETTING_NAMES.get(key, key)
