"""The one table of training settings: how training uses a layout that the estimate reads
(docs/plan.md). Every reader builds its part from a row (:mod:`meshconf.core.setting_values`
says what a row holds): the ``training`` block's fields and rules
(``meshconf.model.training``), the options of ``plan``, ``show``, ``measure`` and
``validate``, the Hydra node, ``convert --from megatron`` and ``--to megatron``."""

from __future__ import annotations

from collections.abc import Mapping

from meshconf.core import setting_values as values
from meshconf.core.schedules import (
    DEFAULT_SCHEDULE,
    GROUPED_LISTED,
    LOOPED_LISTED,
    SCHEDULE_NAMES,
    SCHEDULES_DESCRIBED,
    megatron_schedule,
)
from meshconf.core.setting_values import Spelling, choice, integer, number, path, switch

#: The training settings, in the order of the config's ``training`` block, the JSON Schema,
#: the Hydra node and the command line's options.
TRAINING_SETTINGS: tuple[values.TrainingSetting, ...] = (
    choice("model", values.ModelPreset, example="deepseek-v3", metavar="NAME").described(
        "The model estimated, a preset (as --model): the estimate then needs no --model. "
        "Excludes model_file.",
        "a preset: {choices}",
    ),
    path("model_file", "FILE", example="models/tiny-moe.yaml").described(
        "The model estimated, a model file (as --model-file); a relative path is read from "
        "the config's folder. Excludes model.",
        "a model described in YAML",
    ),
    choice("gpu", values.GpuPreset, "h100-sxm", example="gb200").described(
        "The GPU (as --gpu): its memory, dense bf16 peak and bandwidths, which gpu_memory_gib, "
        "peak_tflops, intra_node_gb_s and inter_node_gb_s replace one by one; h100-sxm by "
        "default.",
        "the GPU: its memory, dense bf16 peak and the bandwidths inside a node and across, "
        "from its datasheet (docs/plan.md); the options below override each ({default}). "
        "Without --gpus-per-node and --level, its node and NVLink domain too",
        gpu_figure="name",
        always_emitted=True,
    ),
    integer("seq_len", values.SEQUENCE_TOKENS, "S", 8192, example=4096).described(
        "Tokens per sequence; 8192 by default.",
        "tokens per sequence ({default})",
        torchtitan=Spelling("training.seq_len"),
        always_emitted=True,
    ),
    integer("micro_batch", values.MICRO_BATCH, "B", 1, example=1).described(
        "Sequences per micro-batch; 1 by default.",
        "sequences per micro-batch ({default})",
        always_emitted=True,
    ),
    integer("global_batch_tokens", values.STEP_TOKENS, "T", example=62914560).described(
        "Tokens per optimizer step, which set the micro-batches each data-parallel rank runs; "
        "by default one micro-batch per GPU.",
        "tokens per step; sets the micro-batches per step (default: one per GPU)",
        always_emitted=True,
    ),
    choice("param_dtype", values.Dtype, "bf16", example="bf16").described(
        "The dtype of the stored parameters, the FSDP gathers and the activations; bf16 by "
        "default.",
        "stored parameters and activations ({default})",
    ),
    choice("grad_dtype", values.Dtype, "fp32", example="fp32").described(
        "The dtype of the gradients and of their reduction; fp32 by default.",
        "gradients and their reduction ({default})",
    ),
    integer("zero_stage", values.ZERO, None, 3, example=1, choices=values.ZeroStage).described(
        "What data parallelism over fsdp (efsdp for experts) shards: 0 nothing, 1 the "
        "optimizer state (Megatron's distributed optimizer), 2 also the gradients, 3 also the "
        "parameters (FSDP; the default).",
        "what data parallelism over fsdp shards: 1 the optimizer state (Megatron's "
        "distributed optimizer), 2 also gradients, 3 also parameters (FSDP; {default})",
        megatron=Spelling("--use-distributed-optimizer", on=1, default=0),
    ),
    choice("activation_checkpointing", values.Checkpointing, "full", example="selective").described(
        "What the backward pass recomputes: none, selective (what torchtitan's per-op policy "
        "does not keep), full (every block) or norms-latent-swiglu (the norms, latent "
        "attention's up-projections and the experts' SwiGLU outputs, keeping the SwiGLU's "
        "inputs: DeepSeek-V3's report, sections 3.2.3 and 3.3.3); full by default.",
        "what the backward pass recomputes: nothing, what torchtitan's per-op selective "
        "policy does not keep, every block, or the norms, latent attention's up-projections "
        "and the experts' SwiGLU outputs (DeepSeek-V3's report, sections 3.2.3 and 3.3.3) "
        "({default})",
        estimate_name="checkpointing",
        megatron=Spelling("--recompute-granularity", default="none"),
        torchtitan=Spelling("activation_checkpoint.mode"),
    ),
    integer("checkpoint_every", values.LAYERS, "N", example=2).described(
        "With activation_checkpointing full, only every this many-th block of a pipeline rank "
        "is recomputed and the others keep their activations: torchtitan's "
        'selective_ac_option = "N" (its default, 2); by default every block.',
        "with full checkpointing, only every N-th block of a pipeline rank is recomputed and "
        'the others keep their activations (torchtitan\'s selective_ac_option = "N", its '
        "default 2; default: every block)",
        torchtitan=Spelling("activation_checkpoint.selective_ac_option"),
    ),
    integer("checkpoint_first", values.LAYERS, "N", example=4).described(
        "With activation_checkpointing full, only the first this many blocks of each model "
        "chunk are recomputed and the others keep their activations: Megatron's "
        "--recompute-method block --recompute-num-layers N; by default every block. Excludes "
        "checkpoint_every.",
        "with full checkpointing, only the first N blocks of each model chunk are recomputed "
        "and the others keep their activations (Megatron's --recompute-method block "
        "--recompute-num-layers N; default: every block)",
        megatron=Spelling("--recompute-num-layers", beside=("--recompute-method", "block")),
    ),
    integer("checkpoint_group", values.LAYERS, "N", example=2).described(
        "With activation_checkpointing full, the blocks of each model chunk are recomputed in "
        "groups of this many, each group keeping only its input and recomputing all its "
        "blocks at once in the backward pass: Megatron's --recompute-method uniform "
        "--recompute-num-layers N; by default 1 (each block alone). Excludes checkpoint_every "
        "and checkpoint_first.",
        "with full checkpointing, the blocks of each model chunk are recomputed in groups of "
        "N, each group keeping only its input (Megatron's --recompute-method uniform "
        "--recompute-num-layers N; default: 1, each block alone)",
        megatron=Spelling(
            "--recompute-num-layers", default=1, beside=("--recompute-method", "uniform")
        ),
    ),
    choice("reshard_after_forward", values.Resharding, "default", example="never").described(
        "Whether FSDP frees gathered parameters after each forward pass, as torchtitan's "
        "fsdp_reshard_after_forward: default (never with pp > 1, else always).",
        "whether FSDP frees gathered parameters after each forward pass, as torchtitan's "
        "policy: default (never with pp > 1, else always), always, never",
        torchtitan=Spelling("parallelism.fsdp_reshard_after_forward", default="default"),
    ),
    choice("pp_schedule", SCHEDULE_NAMES, DEFAULT_SCHEDULE, example="interleaved").described(
        SCHEDULES_DESCRIBED,
        "pipeline schedule; llama3 is Llama 3's interleaved schedule, whose --microbatch-group "
        "may be below pp ({default})",
        estimate_name="schedule",
        # Megatron-LM runs the interleaved schedule when given model chunks per rank.
        megatron=Spelling("", default=megatron_schedule(interleaved=False).name),
        torchtitan=Spelling("parallelism.pipeline_parallel_schedule", default="1F1B"),
    ),
    integer("virtual_stages", values.CHUNKS, "V", 1, example=8).described(
        f"Model chunks per pipeline rank, with pp_schedule {LOOPED_LISTED}.",
        f"model chunks per pipeline rank, for --pp-schedule {LOOPED_LISTED}",
        megatron=Spelling(
            "--num-virtual-stages-per-pipeline-rank",
            aliases=("--virtual-pipeline-model-parallel-size",),
        ),
    ),
    integer("microbatch_group", values.MICRO_BATCHES, "G", example=16).described(
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
        megatron=Spelling(
            "--microbatch-group-size-per-virtual-pipeline-stage",
            aliases=("--microbatch-group-size-per-vp-stage",),
        ),
    ),
    integer("layers_per_stage", values.LAYERS, "N", example=4).described(
        "Layers of each model chunk, the embedding's and output's weights (embedding_as_layers, "
        "output_as_layers) counted: the chunks per pipeline rank follow from the model, "
        "ceil((layers + weights) / layers_per_stage) / pp, as torchtitan's "
        "pipeline_parallel_layers_per_stage sets them. Excludes virtual_stages.",
        "layers of each model chunk, the embedding's and output's weights counted: the chunks "
        "per pipeline rank follow from the model, as torchtitan's "
        "pipeline_parallel_layers_per_stage sets them (excludes --virtual-stages)",
        torchtitan=Spelling("parallelism.pipeline_parallel_layers_per_stage"),
    ),
    integer("first_stage_layers", values.LAYERS_OR_NONE, "N", example=0).described(
        "Layers of the first pipeline chunk (0: the embedding alone); by default the layers "
        "are shared evenly.",
        "layers of the first pipeline chunk (0: the embedding alone); by default the layers "
        "are shared evenly",
        megatron=Spelling("--decoder-first-pipeline-num-layers"),
    ),
    integer("last_stage_layers", values.LAYERS_OR_NONE, "N", example=0).described(
        "Layers of the last pipeline chunk (0: the output and loss alone).",
        "layers of the last pipeline chunk (0: the output and loss alone)",
        megatron=Spelling("--decoder-last-pipeline-num-layers"),
    ),
    integer("embedding_as_layers", values.LAYERS_OR_NONE, "N", example=1).described(
        "How many layers the embedding counts as when the layers are shared among pipeline "
        "chunks, the first chunk holding that many fewer: torchtitan's "
        "pipeline_parallel_first_stage_less_layers (1 there by default), Megatron's "
        "--account-for-embedding-in-pipeline-split (1); by default the layers are shared evenly.",
        "the embedding counts as N layers when the layers are shared among pipeline chunks, "
        "the first chunk holding N fewer (torchtitan's "
        "pipeline_parallel_first_stage_less_layers, 1 there by default; Megatron's "
        "--account-for-embedding-in-pipeline-split: 1; default: an even split)",
        megatron=Spelling("--account-for-embedding-in-pipeline-split", on=1),
        torchtitan=Spelling("parallelism.pipeline_parallel_first_stage_less_layers", default=1),
    ),
    integer("output_as_layers", values.LAYERS_OR_NONE, "N", example=1).described(
        "How many layers the output and loss count as, the last chunk holding that many fewer: "
        "torchtitan's pipeline_parallel_last_stage_less_layers (1 there by default), "
        "Megatron's --account-for-loss-in-pipeline-split (1); by default the layers are shared "
        "evenly.",
        "the output and loss count as N layers, the last chunk holding N fewer (torchtitan's "
        "pipeline_parallel_last_stage_less_layers; Megatron's "
        "--account-for-loss-in-pipeline-split: 1; default: an even split)",
        megatron=Spelling("--account-for-loss-in-pipeline-split", on=1),
        torchtitan=Spelling("parallelism.pipeline_parallel_last_stage_less_layers", default=1),
    ),
    integer("moe_max_nodes", values.NODES, "M", example=4).described(
        "Node-limited routing: each token goes to experts on at most this many units of the "
        "level its expert group crosses (DeepSeek-V3: 4).",
        "node-limited routing: each token goes to experts on at most M units of the level its "
        "expert group crosses, one copy each (DeepSeek-V3: 4)",
        megatron=Spelling("--moe-router-group-topk"),
    ),
    switch("ep_overlap").described(
        "Whether the experts' dispatch and combine run under another micro-batch's compute "
        "(DeepSeek-V3's DualPipe, torchtitan's DualPipeV with "
        "pipeline_parallel_expert_parallel_overlap); false by default.",
        "the experts' dispatch and combine run under another micro-batch's compute, as "
        "DeepSeek-V3's DualPipe does (default: they wait)",
        megatron=Spelling("--overlap-moe-expert-parallel-comm", on=True, default=False),
        torchtitan=Spelling("parallelism.pipeline_parallel_expert_parallel_overlap"),
    ),
    choice("dispatch_dtype", values.Fp8OrWider, example="fp8").described(
        "The dtype tokens are dispatched to their experts in; by default the parameters'.",
        "the dtype tokens are dispatched to their experts in (default: --param-dtype); the "
        "combine stays in --param-dtype",
    ),
    choice("activation_dtype", values.Fp8OrWider, example="fp8").described(
        "The dtype of the activations kept for the backward pass: fp8 keeps the inputs of the "
        "linear layers in fp8 and the rest in the parameters' dtype, as DeepSeek-V3 does (its "
        "report, section 3.3.3); by default the parameters' dtype.",
        "the dtype of the activations kept for the backward pass; fp8 keeps the linear layers' "
        "inputs in fp8 and the rest in --param-dtype, as DeepSeek-V3 does (default: "
        "--param-dtype)",
    ),
    choice("optimizer_dtype", values.OptimizerDtype, "fp32", example="bf16").described(
        "The dtype of AdamW's two moments: bf16 as DeepSeek-V3 keeps them (its report, "
        "section 3.3.3; Megatron-LM's --exp-avg-dtype and --exp-avg-sq-dtype), the master "
        "weights staying fp32; fp32 by default.",
        "the dtype of AdamW's two moments, the master weights staying fp32 (DeepSeek-V3: "
        "bf16; Megatron's --exp-avg-dtype and --exp-avg-sq-dtype; {default})",
        # both moments in the setting's dtype
        megatron=Spelling("--exp-avg-dtype", default="fp32", aliases=("--exp-avg-sq-dtype",)),
    ),
    choice("sequence_parallel", values.SequenceParallel, "dtensor", example="megatron").described(
        "How tensor parallelism treats the tensors outside its split cores: dtensor (the "
        "default: split over the sequence, each norm's gathered output kept whole, as "
        "torchtitan's plan runs), megatron (kept split and gathered again in the backward "
        "pass: Megatron-LM's --sequence-parallel) or none (tensor parallelism without "
        "sequence parallelism: nothing outside the cores split).",
        "with tp > 1, what happens to the tensors outside its split cores: dtensor splits them "
        "over the sequence and keeps each norm's gathered output whole (torchtitan); megatron "
        "keeps that split too and gathers it again in the backward pass (Megatron's "
        "--sequence-parallel); none splits nothing outside the cores ({default})",
        megatron=Spelling("--sequence-parallel", on="megatron", default="none"),
    ),
    choice("norm_kernel", values.NormKernel, "fused", example="eager").described(
        "How RMSNorm runs: fused (the default: one kernel keeping its input and a reciprocal "
        "RMS per token, as torch's RMSNorm under compile and Transformer Engine run it) or "
        "eager (ops on an fp32 copy of the input, as Hugging Face's LlamaRMSNorm and Llama's "
        "reference model write it, keeping that copy and the normalized input).",
        "how RMSNorm runs: fused (torch's RMSNorm compiled, Transformer Engine) or eager on an "
        "fp32 copy of its input (Hugging Face's LlamaRMSNorm), which keeps 4 bytes more per "
        "element ({default})",
    ),
    switch("fp8_param_gather").described(
        "Whether data parallelism gathers the blocks' dense linear weights (attention and "
        "dense feed-forward, not routed experts) in fp8, and under ZeRO 1 and 2 keeps them in "
        "fp8: torchtitan's enable_fsdp_float8_all_gather, Megatron's --fp8-param-gather; false "
        "by default.",
        "data parallelism gathers the blocks' dense linear weights in fp8, and under ZeRO 1 "
        "and 2 keeps them in fp8 (torchtitan's enable_fsdp_float8_all_gather, Megatron's "
        "--fp8-param-gather; default: in --param-dtype)",
        megatron=Spelling("--fp8-param-gather", on=True, default=False),
        torchtitan=Spelling("quantize.linear.float8.enable_fsdp_float8_all_gather"),
    ),
    number("gpu_memory_gib", values.GPU_MEMORY, "GIB", example=180).described(
        "Memory per GPU, GiB; the GPU's by default.",
        "memory per GPU (the GPU's; {default:g})",
        gpu_figure="memory_gib",
    ),
    number("intra_node_gb_s", values.NODE_LINK, "GB/S", example=450).described(
        "Bandwidth per GPU inside a node, GB/s each way, for a level without its own "
        "bandwidth_gb_s; the GPU's by default.",
        "bandwidth per GPU inside a node, GB/s each way, as a level's bandwidth_gb_s (the "
        "GPU's NVLink or Infinity Fabric; {default:g})",
        gbps_option="--intra-node-gbps",
        gpu_figure="scale_up_gb_s",
    ),
    number("inter_node_gb_s", values.NETWORK, "GB/S", example=50).described(
        "Bandwidth per GPU across nodes, GB/s; the GPU's by default.",
        "bandwidth per GPU across nodes, GB/s ({default:g})",
        gbps_option="--inter-node-gbps",
        gpu_figure="network_gb_s",
    ),
    number("peak_tflops", values.PEAK, "TF", example=989).described(
        "Peak dense TFLOP/s of one GPU; the GPU's by default.",
        "peak dense TFLOP/s of one GPU (the GPU's; {default:g})",
        gpu_figure="peak_tflops",
    ),
    number("mfu", values.FRACTION, "F", 0.4, example=0.4).described(
        "The fraction of the peak the matrix products reach, as mfu_counts and mfu_over say; "
        "0.4 by default.",
        "fraction of peak reached ({default:g})",
    ),
    choice("mfu_counts", values.MfuCounts, "model", example="hardware").described(
        "What mfu is a fraction of: model FLOPs (the default, as published MFU counts them) or "
        "hardware FLOPs (recomputation counted).",
        "what --mfu is a fraction of: model FLOPs (6N plus attention, as published MFU counts "
        "them; recomputation not counted) or hardware FLOPs (recomputation counted) "
        "({default})",
    ),
    choice("mfu_over", values.MfuOver, "compute", example="step").described(
        "What mfu is measured over: the compute alone (the default) or the whole step, as a "
        "published MFU is.",
        "what --mfu is measured over: the compute alone, the pipeline bubble and the "
        "communication not hidden coming on top; or the whole step, as a published MFU is, the "
        "estimate then saying what share of the peak the compute needs ({default})",
    ),
    number("runtime_gib", values.MEMORY_TERM, "GIB", example=0).described(
        "GiB per GPU for the CUDA context, NCCL's buffers and the allocator's reserve "
        "together, replacing the published figures of the three keys below.",
        "GiB per GPU for the CUDA context, NCCL's buffers and the allocator's reserve "
        "together, replacing the published figures below (0: the training state alone)",
    ),
    number("cuda_context_gib", values.MEMORY_TERM, "GIB", example=0.5).described(
        "GiB of the CUDA context; the published figure by default.",
        "the CUDA context (published: about 0.3 GB with lazy module loading)",
    ),
    number("nccl_communicator_gib", values.MEMORY_TERM, "GIB", example=0.5).described(
        "GiB of NCCL's buffers per communicator a rank sends over; the published figures by "
        "default.",
        "NCCL's buffers per communicator a rank sends over (published, NCCL #964: 544 MB for "
        "2 GPUs, 688 MB for more)",
    ),
    number("allocator_gib", values.MEMORY_TERM, "GIB", example=2).described(
        "GiB of the caching allocator's reserve beyond the tensors at the peak; the estimate's "
        "figure by default.",
        "the caching allocator's reserve beyond the tensors at the peak, as a trainer's "
        "max_reserved - max_allocated measures it (no published figure: 0)",
    ),
)
SETTINGS: Mapping[str, values.TrainingSetting] = {row.key: row for row in TRAINING_SETTINGS}
#: The settings by the estimate's names (``checkpointing`` for ``activation_checkpointing``).
BY_ESTIMATE_NAME: Mapping[str, values.TrainingSetting] = {
    row.attribute: row for row in TRAINING_SETTINGS
}
#: The bounds of every number of the estimate's training settings, by key.
TRAINING_BOUNDS: Mapping[str, values.Bound] = {
    row.key: row.bound for row in TRAINING_SETTINGS if row.bound is not None
}
#: The settings that name the model estimated, which an option replaces together.
MODEL_SETTINGS = ("model", "model_file")
#: The setting that names the GPU preset, whose figures the settings of
#: :attr:`values.TrainingSetting.gpu_figure` replace.
GPU_SETTING = next(row.key for row in TRAINING_SETTINGS if row.gpu_figure == "name")
