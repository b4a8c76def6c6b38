"""The settings of how training uses a layout that the estimate reads (docs/plan.md): their
choices and bounds, in one place for the command line, the config's ``training`` block and
the estimators."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal, get_args

from meshconf.core.schedules import (
    DEFAULT_SCHEDULE,
    GROUPED_LISTED,
    LOOPED_LISTED,
    SCHEDULE_NAMES,
    SCHEDULES_DESCRIBED,
    megatron_schedule,
)

#: What the backward pass recomputes (docs/plan.md): nothing; what torchtitan's per-op
#: policy does not keep; every block from its input; or the norms, latent attention's
#: up-projections and the mixture of experts' SwiGLU outputs, keeping the SwiGLU's inputs, as
#: DeepSeek-V3 trains (its report, sections 3.2.3 and 3.3.3).
Checkpointing = Literal["none", "selective", "full", "norms-latent-swiglu"]
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
class TrainingSetting:
    """One training setting: a key of a config's ``training`` block, the command-line
    option of the same name (``--checkpoint-every`` for ``checkpoint_every``), a field of the
    estimate's settings, and how Megatron-LM and torchtitan spell it."""

    key: str
    kind: SettingKind
    #: What it is, as the config's reference and the JSON Schema describe it.
    description: str
    #: The option's help; ``{default}`` is the estimate's default.
    help: str
    #: Values the JSON Schema shows.
    examples: tuple[Any, ...]
    #: The estimate's default, None where another setting or the GPU decides it.
    default: Any = None
    choices: tuple[Any, ...] = ()
    bound: Bound | None = None
    #: The option's placeholder in its help (an option with choices lists them instead).
    metavar: str | None = None
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


_LAYERS = Bound(1, 100_000, "more layers than any model has")
_LAYERS_OR_NONE = Bound(0, 100_000, "more layers than any model has")
_MEMORY = Bound(0, 16384, "more memory than any GPU has")
_SELECTIVE_AC = "activation_checkpoint.selective_ac_option"

#: The training settings, in the order of the config's ``training`` block, the JSON Schema,
#: the Hydra node and the command line's options. Every reader builds its part from a row:
#: the block's fields and rules (``meshconf.model.training``), the options of ``plan``,
#: ``show``, ``measure`` and ``validate``, the Hydra node, and ``convert --from megatron`` and
#: ``--to megatron``.
TRAINING_SETTINGS: tuple[TrainingSetting, ...] = (
    TrainingSetting(
        "model",
        "choice",
        "The model estimated, a preset (as --model): the estimate then needs no --model. "
        "Excludes model_file.",
        "a preset: {choices}",
        ("deepseek-v3",),
        choices=get_args(ModelPreset),
        metavar="NAME",
    ),
    TrainingSetting(
        "model_file",
        "path",
        "The model estimated, a model file (as --model-file); a relative path is read from "
        "the config's folder. Excludes model.",
        "a model described in YAML",
        ("models/tiny-moe.yaml",),
        metavar="FILE",
    ),
    TrainingSetting(
        "gpu",
        "choice",
        "The GPU (as --gpu): its memory, dense bf16 peak and bandwidths, which gpu_memory_gib, "
        "peak_tflops, intra_node_gb_s and inter_node_gb_s replace one by one; h100-sxm by "
        "default.",
        "the GPU: its memory, dense bf16 peak and the bandwidths inside a node and across, "
        "from its datasheet (docs/plan.md); the options below override each ({default}). "
        "Without --gpus-per-node and --level, its node and NVLink domain too",
        ("gb200",),
        default="h100-sxm",
        choices=get_args(GpuPreset),
        gpu_figure="name",
        always_emitted=True,
    ),
    TrainingSetting(
        "seq_len",
        "integer",
        "Tokens per sequence; 8192 by default.",
        "tokens per sequence ({default})",
        (4096,),
        default=8192,
        bound=Bound(1, 2**24, "more tokens per sequence than any model is trained on"),
        metavar="S",
        torchtitan=Spelling("training.seq_len"),
        always_emitted=True,
    ),
    TrainingSetting(
        "micro_batch",
        "integer",
        "Sequences per micro-batch; 1 by default.",
        "sequences per micro-batch ({default})",
        (1,),
        default=1,
        bound=Bound(1, 2**16, "more sequences per micro-batch than any GPU holds"),
        metavar="B",
        always_emitted=True,
    ),
    TrainingSetting(
        "global_batch_tokens",
        "integer",
        "Tokens per optimizer step, which set the micro-batches each data-parallel rank runs; "
        "by default one micro-batch per GPU.",
        "tokens per step; sets the micro-batches per step (default: one per GPU)",
        (62914560,),
        bound=Bound(1, 2**40, "more tokens per step than any run takes"),
        metavar="T",
        always_emitted=True,
    ),
    TrainingSetting(
        "param_dtype",
        "choice",
        "The dtype of the stored parameters, the FSDP gathers and the activations; bf16 by "
        "default.",
        "stored parameters and activations ({default})",
        ("bf16",),
        default="bf16",
        choices=get_args(Dtype),
    ),
    TrainingSetting(
        "grad_dtype",
        "choice",
        "The dtype of the gradients and of their reduction; fp32 by default.",
        "gradients and their reduction ({default})",
        ("fp32",),
        default="fp32",
        choices=get_args(Dtype),
    ),
    TrainingSetting(
        "zero_stage",
        "integer",
        "What data parallelism over fsdp (efsdp for experts) shards: 0 nothing, 1 the "
        "optimizer state (Megatron's distributed optimizer), 2 also the gradients, 3 also the "
        "parameters (FSDP; the default).",
        "what data parallelism over fsdp shards: 1 the optimizer state (Megatron's "
        "distributed optimizer), 2 also gradients, 3 also parameters (FSDP; {default})",
        (1,),
        default=3,
        choices=get_args(ZeroStage),
        bound=Bound(0, 3, "the last ZeRO stage"),
        megatron=Spelling("--use-distributed-optimizer", on=1, default=0),
    ),
    TrainingSetting(
        "activation_checkpointing",
        "choice",
        "What the backward pass recomputes: none, selective (what torchtitan's per-op policy "
        "does not keep), full (every block) or norms-latent-swiglu (the norms, latent "
        "attention's up-projections and the experts' SwiGLU outputs, keeping the SwiGLU's "
        "inputs: DeepSeek-V3's report, sections 3.2.3 and 3.3.3); full by default.",
        "what the backward pass recomputes: nothing, what torchtitan's per-op selective "
        "policy does not keep, every block, or the norms, latent attention's up-projections "
        "and the experts' SwiGLU outputs (DeepSeek-V3's report, sections 3.2.3 and 3.3.3) "
        "({default})",
        ("selective",),
        default="full",
        choices=get_args(Checkpointing),
        estimate_name="checkpointing",
        megatron=Spelling("--recompute-granularity", default="none"),
        torchtitan=Spelling("activation_checkpoint.mode"),
    ),
    TrainingSetting(
        "checkpoint_every",
        "integer",
        "With activation_checkpointing full, only every this many-th block of a pipeline rank "
        "is recomputed and the others keep their activations: torchtitan's "
        'selective_ac_option = "N" (its default, 2); by default every block.',
        "with full checkpointing, only every N-th block of a pipeline rank is recomputed and "
        'the others keep their activations (torchtitan\'s selective_ac_option = "N", its '
        "default 2; default: every block)",
        (2,),
        bound=_LAYERS,
        metavar="N",
        torchtitan=Spelling(_SELECTIVE_AC),
    ),
    TrainingSetting(
        "checkpoint_first",
        "integer",
        "With activation_checkpointing full, only the first this many blocks of each model "
        "chunk are recomputed and the others keep their activations: Megatron's "
        "--recompute-method block --recompute-num-layers N; by default every block. Excludes "
        "checkpoint_every.",
        "with full checkpointing, only the first N blocks of each model chunk are recomputed "
        "and the others keep their activations (Megatron's --recompute-method block "
        "--recompute-num-layers N; default: every block)",
        (4,),
        bound=_LAYERS,
        metavar="N",
        megatron=Spelling("--recompute-num-layers", beside=("--recompute-method", "block")),
    ),
    TrainingSetting(
        "checkpoint_group",
        "integer",
        "With activation_checkpointing full, the blocks of each model chunk are recomputed in "
        "groups of this many, each group keeping only its input and recomputing all its "
        "blocks at once in the backward pass: Megatron's --recompute-method uniform "
        "--recompute-num-layers N; by default 1 (each block alone). Excludes checkpoint_every "
        "and checkpoint_first.",
        "with full checkpointing, the blocks of each model chunk are recomputed in groups of "
        "N, each group keeping only its input (Megatron's --recompute-method uniform "
        "--recompute-num-layers N; default: 1, each block alone)",
        (2,),
        bound=_LAYERS,
        metavar="N",
        megatron=Spelling(
            "--recompute-num-layers", default=1, beside=("--recompute-method", "uniform")
        ),
    ),
    TrainingSetting(
        "reshard_after_forward",
        "choice",
        "Whether FSDP frees gathered parameters after each forward pass, as torchtitan's "
        "fsdp_reshard_after_forward: default (never with pp > 1, else always).",
        "whether FSDP frees gathered parameters after each forward pass, as torchtitan's "
        "policy: default (never with pp > 1, else always), always, never",
        ("never",),
        default="default",
        choices=get_args(Resharding),
        torchtitan=Spelling("parallelism.fsdp_reshard_after_forward", default="default"),
    ),
    TrainingSetting(
        "pp_schedule",
        "choice",
        SCHEDULES_DESCRIBED,
        "pipeline schedule; llama3 is Llama 3's interleaved schedule, whose --microbatch-group "
        "may be below pp ({default})",
        ("interleaved",),
        default=DEFAULT_SCHEDULE,
        choices=SCHEDULE_NAMES,
        estimate_name="schedule",
        # Megatron-LM runs the interleaved schedule when given model chunks per rank.
        megatron=Spelling("", default=megatron_schedule(interleaved=False).name),
        torchtitan=Spelling("parallelism.pipeline_parallel_schedule", default="1F1B"),
    ),
    TrainingSetting(
        "virtual_stages",
        "integer",
        f"Model chunks per pipeline rank, with pp_schedule {LOOPED_LISTED}.",
        f"model chunks per pipeline rank, for --pp-schedule {LOOPED_LISTED}",
        (8,),
        default=1,
        bound=Bound(1, 1024, "more model chunks per pipeline rank than layers"),
        metavar="V",
        megatron=Spelling(
            "--num-virtual-stages-per-pipeline-rank",
            aliases=("--virtual-pipeline-model-parallel-size",),
        ),
    ),
    TrainingSetting(
        "microbatch_group",
        "integer",
        f"With pp_schedule {GROUPED_LISTED}, the micro-batches each model chunk runs "
        "before the next chunk's: Megatron-LM's "
        "--microbatch-group-size-per-virtual-pipeline-stage (its default, pp; at least pp "
        "there), Llama 3's N (any number up to the micro-batches a step); by default torch's "
        "rounds (pp when the micro-batches are a multiple of pp). Each micro-batch more in a "
        "group keeps virtual_stages - 1 more chunk-micro-batches in flight on every rank.",
        f"with --pp-schedule {GROUPED_LISTED}, the micro-batches each model chunk runs "
        "before the next chunk's (Megatron's "
        "--microbatch-group-size-per-virtual-pipeline-stage, pp to the step's micro-batches; "
        "Llama 3's N, any number up to them; default: torch's rounds, pp when the "
        "micro-batches are a multiple of pp)",
        (16,),
        bound=Bound(1, 2**30, "more micro-batches than any step runs"),
        metavar="G",
        megatron=Spelling(
            "--microbatch-group-size-per-virtual-pipeline-stage",
            aliases=("--microbatch-group-size-per-vp-stage",),
        ),
    ),
    TrainingSetting(
        "layers_per_stage",
        "integer",
        "Layers of each model chunk, the embedding's and output's weights (embedding_as_layers, "
        "output_as_layers) counted: the chunks per pipeline rank follow from the model, "
        "ceil((layers + weights) / layers_per_stage) / pp, as torchtitan's "
        "pipeline_parallel_layers_per_stage sets them. Excludes virtual_stages.",
        "layers of each model chunk, the embedding's and output's weights counted: the chunks "
        "per pipeline rank follow from the model, as torchtitan's "
        "pipeline_parallel_layers_per_stage sets them (excludes --virtual-stages)",
        (4,),
        bound=_LAYERS,
        metavar="N",
        torchtitan=Spelling("parallelism.pipeline_parallel_layers_per_stage"),
    ),
    TrainingSetting(
        "first_stage_layers",
        "integer",
        "Layers of the first pipeline chunk (0: the embedding alone); by default the layers "
        "are shared evenly.",
        "layers of the first pipeline chunk (0: the embedding alone); by default the layers "
        "are shared evenly",
        (0,),
        bound=_LAYERS_OR_NONE,
        metavar="N",
        megatron=Spelling("--decoder-first-pipeline-num-layers"),
    ),
    TrainingSetting(
        "last_stage_layers",
        "integer",
        "Layers of the last pipeline chunk (0: the output and loss alone).",
        "layers of the last pipeline chunk (0: the output and loss alone)",
        (0,),
        bound=_LAYERS_OR_NONE,
        metavar="N",
        megatron=Spelling("--decoder-last-pipeline-num-layers"),
    ),
    TrainingSetting(
        "embedding_as_layers",
        "integer",
        "How many layers the embedding counts as when the layers are shared among pipeline "
        "chunks, the first chunk holding that many fewer: torchtitan's "
        "pipeline_parallel_first_stage_less_layers (1 there by default), Megatron's "
        "--account-for-embedding-in-pipeline-split (1); by default the layers are shared evenly.",
        "the embedding counts as N layers when the layers are shared among pipeline chunks, "
        "the first chunk holding N fewer (torchtitan's "
        "pipeline_parallel_first_stage_less_layers, 1 there by default; Megatron's "
        "--account-for-embedding-in-pipeline-split: 1; default: an even split)",
        (1,),
        bound=_LAYERS_OR_NONE,
        metavar="N",
        megatron=Spelling("--account-for-embedding-in-pipeline-split", on=1),
        torchtitan=Spelling("parallelism.pipeline_parallel_first_stage_less_layers", default=1),
    ),
    TrainingSetting(
        "output_as_layers",
        "integer",
        "How many layers the output and loss count as, the last chunk holding that many fewer: "
        "torchtitan's pipeline_parallel_last_stage_less_layers (1 there by default), "
        "Megatron's --account-for-loss-in-pipeline-split (1); by default the layers are shared "
        "evenly.",
        "the output and loss count as N layers, the last chunk holding N fewer (torchtitan's "
        "pipeline_parallel_last_stage_less_layers; Megatron's "
        "--account-for-loss-in-pipeline-split: 1; default: an even split)",
        (1,),
        bound=_LAYERS_OR_NONE,
        metavar="N",
        megatron=Spelling("--account-for-loss-in-pipeline-split", on=1),
        torchtitan=Spelling("parallelism.pipeline_parallel_last_stage_less_layers", default=1),
    ),
    TrainingSetting(
        "moe_max_nodes",
        "integer",
        "Node-limited routing: each token goes to experts on at most this many units of the "
        "level its expert group crosses (DeepSeek-V3: 4).",
        "node-limited routing: each token goes to experts on at most M units of the level its "
        "expert group crosses, one copy each (DeepSeek-V3: 4)",
        (4,),
        bound=Bound(1, 2**20, "more nodes than any cluster has"),
        metavar="M",
        megatron=Spelling("--moe-router-group-topk"),
    ),
    TrainingSetting(
        "ep_overlap",
        "switch",
        "Whether the experts' dispatch and combine run under another micro-batch's compute "
        "(DeepSeek-V3's DualPipe, torchtitan's DualPipeV with "
        "pipeline_parallel_expert_parallel_overlap); false by default.",
        "the experts' dispatch and combine run under another micro-batch's compute, as "
        "DeepSeek-V3's DualPipe does (default: they wait)",
        (True,),
        default=False,
        megatron=Spelling("--overlap-moe-expert-parallel-comm", on=True, default=False),
        torchtitan=Spelling("parallelism.pipeline_parallel_expert_parallel_overlap"),
    ),
    TrainingSetting(
        "dispatch_dtype",
        "choice",
        "The dtype tokens are dispatched to their experts in; by default the parameters'.",
        "the dtype tokens are dispatched to their experts in (default: --param-dtype); the "
        "combine stays in --param-dtype",
        ("fp8",),
        choices=get_args(Fp8OrWider),
    ),
    TrainingSetting(
        "activation_dtype",
        "choice",
        "The dtype of the activations kept for the backward pass: fp8 keeps the inputs of the "
        "linear layers in fp8 and the rest in the parameters' dtype, as DeepSeek-V3 does (its "
        "report, section 3.3.3); by default the parameters' dtype.",
        "the dtype of the activations kept for the backward pass; fp8 keeps the linear layers' "
        "inputs in fp8 and the rest in --param-dtype, as DeepSeek-V3 does (default: "
        "--param-dtype)",
        ("fp8",),
        choices=get_args(Fp8OrWider),
    ),
    TrainingSetting(
        "optimizer_dtype",
        "choice",
        "The dtype of AdamW's two moments: bf16 as DeepSeek-V3 keeps them (its report, "
        "section 3.3.3; Megatron-LM's --exp-avg-dtype and --exp-avg-sq-dtype), the master "
        "weights staying fp32; fp32 by default.",
        "the dtype of AdamW's two moments, the master weights staying fp32 (DeepSeek-V3: "
        "bf16; Megatron's --exp-avg-dtype and --exp-avg-sq-dtype; {default})",
        ("bf16",),
        default="fp32",
        choices=OPTIMIZER_DTYPES,
        # both moments in the setting's dtype
        megatron=Spelling("--exp-avg-dtype", default="fp32", aliases=("--exp-avg-sq-dtype",)),
    ),
    TrainingSetting(
        "sequence_parallel",
        "choice",
        "How tensor parallelism treats the tensors outside its split cores: dtensor (the "
        "default: split over the sequence, each norm's gathered output kept whole, as "
        "torchtitan's plan runs), megatron (kept split and gathered again in the backward "
        "pass: Megatron-LM's --sequence-parallel) or none (tensor parallelism without "
        "sequence parallelism: nothing outside the cores split).",
        "with tp > 1, what happens to the tensors outside its split cores: dtensor splits them "
        "over the sequence and keeps each norm's gathered output whole (torchtitan); megatron "
        "keeps that split too and gathers it again in the backward pass (Megatron's "
        "--sequence-parallel); none splits nothing outside the cores ({default})",
        ("megatron",),
        default="dtensor",
        choices=SEQUENCE_PARALLEL,
        megatron=Spelling("--sequence-parallel", on="megatron", default="none"),
    ),
    TrainingSetting(
        "norm_kernel",
        "choice",
        "How RMSNorm runs: fused (the default: one kernel keeping its input and a reciprocal "
        "RMS per token, as torch's RMSNorm under compile and Transformer Engine run it) or "
        "eager (ops on an fp32 copy of the input, as Hugging Face's LlamaRMSNorm and Llama's "
        "reference model write it, keeping that copy and the normalized input).",
        "how RMSNorm runs: fused (torch's RMSNorm compiled, Transformer Engine) or eager on an "
        "fp32 copy of its input (Hugging Face's LlamaRMSNorm), which keeps 4 bytes more per "
        "element ({default})",
        ("eager",),
        default="fused",
        choices=NORM_KERNELS,
    ),
    TrainingSetting(
        "fp8_param_gather",
        "switch",
        "Whether data parallelism gathers the blocks' dense linear weights (attention and "
        "dense feed-forward, not routed experts) in fp8, and under ZeRO 1 and 2 keeps them in "
        "fp8: torchtitan's enable_fsdp_float8_all_gather, Megatron's --fp8-param-gather; false "
        "by default.",
        "data parallelism gathers the blocks' dense linear weights in fp8, and under ZeRO 1 "
        "and 2 keeps them in fp8 (torchtitan's enable_fsdp_float8_all_gather, Megatron's "
        "--fp8-param-gather; default: in --param-dtype)",
        (True,),
        default=False,
        megatron=Spelling("--fp8-param-gather", on=True, default=False),
        torchtitan=Spelling("quantize.linear.float8.enable_fsdp_float8_all_gather"),
    ),
    TrainingSetting(
        "gpu_memory_gib",
        "number",
        "Memory per GPU, GiB; the GPU's by default.",
        "memory per GPU (the GPU's; {default:g})",
        (180,),
        bound=Bound(0.125, 16384, "more memory than any GPU has"),
        metavar="GIB",
        gpu_figure="memory_gib",
    ),
    TrainingSetting(
        "intra_node_gb_s",
        "number",
        "Bandwidth per GPU inside a node, GB/s each way, for a level without its own "
        "bandwidth_gb_s; the GPU's by default.",
        "bandwidth per GPU inside a node, GB/s each way, as a level's bandwidth_gb_s (the "
        "GPU's NVLink or Infinity Fabric; {default:g})",
        (450,),
        bound=Bound(0.01, 100_000, "faster than any link inside a node"),
        metavar="GB/S",
        gbps_option="--intra-node-gbps",
        gpu_figure="scale_up_gb_s",
    ),
    TrainingSetting(
        "inter_node_gb_s",
        "number",
        "Bandwidth per GPU across nodes, GB/s; the GPU's by default.",
        "bandwidth per GPU across nodes, GB/s ({default:g})",
        (50,),
        bound=Bound(0.01, 100_000, "faster than any network between nodes"),
        metavar="GB/S",
        gbps_option="--inter-node-gbps",
        gpu_figure="network_gb_s",
    ),
    TrainingSetting(
        "peak_tflops",
        "number",
        "Peak dense TFLOP/s of one GPU; the GPU's by default.",
        "peak dense TFLOP/s of one GPU (the GPU's; {default:g})",
        (989,),
        bound=Bound(0.01, 1_000_000, "more than any GPU computes"),
        metavar="TF",
        gpu_figure="peak_tflops",
    ),
    TrainingSetting(
        "mfu",
        "number",
        "The fraction of the peak the matrix products reach, as mfu_counts and mfu_over say; "
        "0.4 by default.",
        "fraction of peak reached ({default:g})",
        (0.4,),
        default=0.4,
        bound=Bound(0.001, 1, "more than the peak"),
        metavar="F",
    ),
    TrainingSetting(
        "mfu_counts",
        "choice",
        "What mfu is a fraction of: model FLOPs (the default, as published MFU counts them) or "
        "hardware FLOPs (recomputation counted).",
        "what --mfu is a fraction of: model FLOPs (6N plus attention, as published MFU counts "
        "them; recomputation not counted) or hardware FLOPs (recomputation counted) "
        "({default})",
        ("hardware",),
        default="model",
        choices=MFU_COUNTS,
    ),
    TrainingSetting(
        "mfu_over",
        "choice",
        "What mfu is measured over: the compute alone (the default) or the whole step, as a "
        "published MFU is.",
        "what --mfu is measured over: the compute alone, the pipeline bubble and the "
        "communication not hidden coming on top; or the whole step, as a published MFU is, the "
        "estimate then saying what share of the peak the compute needs ({default})",
        ("step",),
        default="compute",
        choices=MFU_OVER,
    ),
    TrainingSetting(
        "runtime_gib",
        "number",
        "GiB per GPU for the CUDA context, NCCL's buffers and the allocator's reserve "
        "together, replacing the published figures of the three keys below.",
        "GiB per GPU for the CUDA context, NCCL's buffers and the allocator's reserve "
        "together, replacing the published figures below (0: the training state alone)",
        (0,),
        bound=_MEMORY,
        metavar="GIB",
    ),
    TrainingSetting(
        "cuda_context_gib",
        "number",
        "GiB of the CUDA context; the published figure by default.",
        "the CUDA context (published: about 0.3 GB with lazy module loading)",
        (0.5,),
        bound=_MEMORY,
        metavar="GIB",
    ),
    TrainingSetting(
        "nccl_communicator_gib",
        "number",
        "GiB of NCCL's buffers per communicator a rank sends over; the published figures by "
        "default.",
        "NCCL's buffers per communicator a rank sends over (published, NCCL #964: 544 MB for "
        "2 GPUs, 688 MB for more)",
        (0.5,),
        bound=_MEMORY,
        metavar="GIB",
    ),
    TrainingSetting(
        "allocator_gib",
        "number",
        "GiB of the caching allocator's reserve beyond the tensors at the peak; the estimate's "
        "figure by default.",
        "the caching allocator's reserve beyond the tensors at the peak, as a trainer's "
        "max_reserved - max_allocated measures it (no published figure: 0)",
        (2,),
        bound=_MEMORY,
        metavar="GIB",
    ),
)
SETTINGS: Mapping[str, TrainingSetting] = {row.key: row for row in TRAINING_SETTINGS}
#: The settings by the estimate's names (``checkpointing`` for ``activation_checkpointing``).
BY_ESTIMATE_NAME: Mapping[str, TrainingSetting] = {row.attribute: row for row in TRAINING_SETTINGS}
#: The bounds of every number of the estimate's training settings, by key.
TRAINING_BOUNDS: Mapping[str, Bound] = {
    row.key: row.bound for row in TRAINING_SETTINGS if row.bound is not None
}
#: The settings that name the model estimated, which an option replaces together.
MODEL_SETTINGS = ("model", "model_file")
#: The setting that names the GPU preset, whose figures the settings of
#: :attr:`TrainingSetting.gpu_figure` replace.
GPU_SETTING = next(row.key for row in TRAINING_SETTINGS if row.gpu_figure == "name")


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
