"""The model and training options of ``plan``, ``show`` and ``measure`` as the command line
declares them: their names, kinds, defaults and help, and the words that give them again."""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from meshconf.cli.common import one_of
from meshconf.core.training import (
    CHECKPOINTING,
    DTYPE_BYTES,
    FP8_OR_WIDER_BYTES,
    MFU_COUNTS,
    MFU_OVER,
    NORM_KERNELS,
    OPTIMIZER_DTYPES,
    RESHARDING,
    SCHEDULES,
    SEQUENCE_PARALLEL,
    ZERO_STAGES,
)
from meshconf.features.plan.estimate.gpus import GPUS
from meshconf.features.plan.estimate.presets import PRESETS
from meshconf.features.plan.estimate.training import Training

DEFAULTS = Training()
#: The training options, which need a model: integers, positive numbers, and choices.
INTEGERS = (
    "seq_len",
    "micro_batch",
    "global_batch_tokens",
    "checkpoint_every",
    "checkpoint_first",
    "checkpoint_group",
    "virtual_stages",
    "microbatch_group",
    "layers_per_stage",
    "first_stage_layers",
    "last_stage_layers",
    "embedding_as_layers",
    "output_as_layers",
    "moe_max_nodes",
)
NUMBERS = (
    "gpu_memory_gib",
    "intra_node_gb_s",
    "inter_node_gb_s",
    "peak_tflops",
    "mfu",
    "runtime_gib",
    "cuda_context_gib",
    "nccl_communicator_gib",
    "allocator_gib",
)
#: The options that took bandwidths in Gb/s, by the GB/s setting that replaces each; they
#: still work, converted, with a note, until the next release.
DEPRECATED_GBPS: Mapping[str, str] = MappingProxyType(
    {"intra_node_gbps": "intra_node_gb_s", "inter_node_gbps": "inter_node_gb_s"}
)
CHOICES = (
    "param_dtype",
    "grad_dtype",
    "checkpointing",
    "schedule",
    "reshard_after_forward",
    "zero_stage",
    "dispatch_dtype",
    "activation_dtype",
    "optimizer_dtype",
    "sequence_parallel",
    "norm_kernel",
    "mfu_counts",
    "mfu_over",
)
#: Switches: given, they are true.
FLAGS = ("ep_overlap", "fp8_param_gather")


#: The option of each model and training setting, by attribute, in the order an emitted
#: command line gives them.
MODEL_OPTIONS: Mapping[str, str] = MappingProxyType(
    {
        "model": "--model",
        "model_file": "--model-file",
        "seq_len": "--seq-len",
        "micro_batch": "--micro-batch",
        "global_batch_tokens": "--global-batch-tokens",
        "param_dtype": "--param-dtype",
        "grad_dtype": "--grad-dtype",
        "checkpointing": "--activation-checkpointing",
        "checkpoint_every": "--checkpoint-every",
        "checkpoint_first": "--checkpoint-first",
        "checkpoint_group": "--checkpoint-group",
        "schedule": "--pp-schedule",
        "virtual_stages": "--virtual-stages",
        "microbatch_group": "--microbatch-group",
        "layers_per_stage": "--layers-per-stage",
        "first_stage_layers": "--first-stage-layers",
        "last_stage_layers": "--last-stage-layers",
        "embedding_as_layers": "--embedding-as-layers",
        "output_as_layers": "--output-as-layers",
        "reshard_after_forward": "--reshard-after-forward",
        "zero_stage": "--zero-stage",
        "moe_max_nodes": "--moe-max-nodes",
        "ep_overlap": "--ep-overlap",
        "dispatch_dtype": "--dispatch-dtype",
        "fp8_param_gather": "--fp8-param-gather",
        "activation_dtype": "--activation-dtype",
        "optimizer_dtype": "--optimizer-dtype",
        "sequence_parallel": "--sequence-parallel",
        "norm_kernel": "--norm-kernel",
        "gpu": "--gpu",
        "gpu_memory_gib": "--gpu-memory-gib",
        "intra_node_gb_s": "--intra-node-gb-s",
        "inter_node_gb_s": "--inter-node-gb-s",
        "intra_node_gbps": "--intra-node-gbps",
        "inter_node_gbps": "--inter-node-gbps",
        "peak_tflops": "--peak-tflops",
        "mfu": "--mfu",
        "mfu_counts": "--mfu-counts",
        "mfu_over": "--mfu-over",
        "runtime_gib": "--runtime-gib",
        "cuda_context_gib": "--cuda-context-gib",
        "nccl_communicator_gib": "--nccl-communicator-gib",
        "allocator_gib": "--allocator-gib",
    }
)


def add_model_options(parser: argparse.ArgumentParser) -> None:
    """``--model`` or ``--model-file``, and the training settings with their defaults."""
    group = parser.add_argument_group("model (memory and step-time estimates: docs/plan.md)")

    def option(name: str, **settings: Any) -> None:
        group.add_argument(MODEL_OPTIONS[name], dest=name, **settings)

    option("model", metavar="NAME", **one_of(PRESETS), help=f"a preset: {', '.join(PRESETS)}")
    option("model_file", metavar="FILE", help="a model described in YAML")
    option("seq_len", metavar="S", help=f"tokens per sequence ({DEFAULTS.seq_len})")
    option("micro_batch", metavar="B", help=f"sequences per micro-batch ({DEFAULTS.micro_batch})")
    option(
        "global_batch_tokens",
        metavar="T",
        help="tokens per step; sets the micro-batches per step (default: one per GPU)",
    )
    dtypes = tuple(DTYPE_BYTES)
    option(
        "param_dtype",
        **one_of(dtypes),
        help=f"stored parameters and activations ({DEFAULTS.param_dtype})",
    )
    option(
        "grad_dtype",
        **one_of(dtypes),
        help=f"gradients and their reduction ({DEFAULTS.grad_dtype})",
    )
    option(
        "checkpointing",
        **one_of(CHECKPOINTING),
        help="what the backward pass recomputes: nothing, what torchtitan's per-op selective "
        "policy does not keep, every block, or the norms, latent attention's up-projections "
        "and the experts' SwiGLU outputs (DeepSeek-V3's report, sections 3.2.3 and 3.3.3) "
        f"({DEFAULTS.checkpointing})",
    )
    option(
        "checkpoint_every",
        metavar="N",
        help="with full checkpointing, only every N-th block of a pipeline rank is recomputed "
        'and the others keep their activations (torchtitan\'s selective_ac_option = "N", '
        "its default 2; default: every block)",
    )
    option(
        "checkpoint_first",
        metavar="N",
        help="with full checkpointing, only the first N blocks of each model chunk are "
        "recomputed and the others keep their activations (Megatron's --recompute-method block "
        "--recompute-num-layers N; default: every block)",
    )
    option(
        "checkpoint_group",
        metavar="N",
        help="with full checkpointing, the blocks of each model chunk are recomputed in groups "
        "of N, each group keeping only its input (Megatron's --recompute-method uniform "
        "--recompute-num-layers N; default: 1, each block alone)",
    )
    option(
        "schedule",
        **one_of(SCHEDULES),
        help="pipeline schedule; llama3 is Llama 3's interleaved schedule, whose "
        f"--microbatch-group may be below pp ({DEFAULTS.schedule})",
    )
    option(
        "virtual_stages",
        metavar="V",
        help="model chunks per pipeline rank, for --pp-schedule interleaved, llama3 or loopedbfs",
    )
    option(
        "microbatch_group",
        metavar="G",
        help="with --pp-schedule interleaved or llama3, the micro-batches each model chunk "
        "runs before the next chunk's (Megatron's "
        "--microbatch-group-size-per-virtual-pipeline-stage, pp to the step's micro-batches; "
        "Llama 3's N, any number up to them; default: torch's rounds, pp when the "
        "micro-batches are a multiple of pp)",
    )
    option(
        "layers_per_stage",
        metavar="N",
        help="layers of each model chunk, the embedding's and output's weights counted: the "
        "chunks per pipeline rank follow from the model, as torchtitan's "
        "pipeline_parallel_layers_per_stage sets them (excludes --virtual-stages)",
    )
    option(
        "first_stage_layers",
        metavar="N",
        help="layers of the first pipeline chunk (0: the embedding alone); by default the "
        "layers are shared evenly",
    )
    option(
        "last_stage_layers",
        metavar="N",
        help="layers of the last pipeline chunk (0: the output and loss alone)",
    )
    option(
        "embedding_as_layers",
        metavar="N",
        help="the embedding counts as N layers when the layers are shared among pipeline "
        "chunks, the first chunk holding N fewer (torchtitan's "
        "pipeline_parallel_first_stage_less_layers, 1 there by default; Megatron's "
        "--account-for-embedding-in-pipeline-split: 1; default: an even split)",
    )
    option(
        "output_as_layers",
        metavar="N",
        help="the output and loss count as N layers, the last chunk holding N fewer "
        "(torchtitan's pipeline_parallel_last_stage_less_layers; Megatron's "
        "--account-for-loss-in-pipeline-split: 1; default: an even split)",
    )
    option(
        "reshard_after_forward",
        **one_of(RESHARDING),
        help="whether FSDP frees gathered parameters after each forward pass, as torchtitan's "
        "policy: default (never with pp > 1, else always), always, never",
    )
    option(
        "zero_stage",
        # compared as text: argparse's int() would take "٣" or "0_3" for 3
        **one_of(str(stage) for stage in ZERO_STAGES),
        help="what data parallelism over fsdp shards: 1 the optimizer state (Megatron's "
        "distributed optimizer), 2 also gradients, 3 also parameters "
        f"(FSDP; {DEFAULTS.zero_stage})",
    )
    option(
        "moe_max_nodes",
        metavar="M",
        help="node-limited routing: each token goes to experts on at most M units of the level "
        "its expert group crosses, one copy each (DeepSeek-V3: 4)",
    )
    option(
        "ep_overlap",
        action="store_const",
        const=True,
        help="the experts' dispatch and combine run under another micro-batch's compute, as "
        "DeepSeek-V3's DualPipe does (default: they wait)",
    )
    option(
        "dispatch_dtype",
        **one_of(FP8_OR_WIDER_BYTES),
        help="the dtype tokens are dispatched to their experts in (default: --param-dtype); "
        "the combine stays in --param-dtype",
    )
    option(
        "fp8_param_gather",
        action="store_const",
        const=True,
        help="data parallelism gathers the blocks' dense linear weights in fp8, and under "
        "ZeRO 1 and 2 keeps them in fp8 (torchtitan's enable_fsdp_float8_all_gather, "
        "Megatron's --fp8-param-gather; default: in --param-dtype)",
    )
    option(
        "activation_dtype",
        **one_of(FP8_OR_WIDER_BYTES),
        help="the dtype of the activations kept for the backward pass; fp8 keeps the linear "
        "layers' inputs in fp8 and the rest in --param-dtype, as DeepSeek-V3 does (default: "
        "--param-dtype)",
    )
    option(
        "optimizer_dtype",
        **one_of(OPTIMIZER_DTYPES),
        help="the dtype of AdamW's two moments, the master weights staying fp32 (DeepSeek-V3: "
        f"bf16; Megatron's --exp-avg-dtype and --exp-avg-sq-dtype; {DEFAULTS.optimizer_dtype})",
    )
    option(
        "sequence_parallel",
        **one_of(SEQUENCE_PARALLEL),
        help="with tp > 1, what happens to the tensors outside its split cores: dtensor splits "
        "them over the sequence and keeps each norm's gathered output whole (torchtitan); "
        "megatron keeps that split too and gathers it again in the backward pass "
        "(Megatron's --sequence-parallel); none splits nothing outside the cores "
        f"({DEFAULTS.sequence_parallel})",
    )
    option(
        "norm_kernel",
        **one_of(NORM_KERNELS),
        help="how RMSNorm runs: fused (torch's RMSNorm compiled, Transformer Engine) or eager "
        "on an fp32 copy of its input (Hugging Face's LlamaRMSNorm), which keeps 4 bytes more "
        f"per element ({DEFAULTS.norm_kernel})",
    )
    option(
        "gpu",
        **one_of(GPUS),
        help=f"the GPU: its memory, dense bf16 peak and the bandwidths inside a node and "
        f"across, from its datasheet (docs/plan.md); the options below override each "
        f"({DEFAULTS.gpu}). Without --gpus-per-node and --level, its node and NVLink domain too",
    )
    option(
        "gpu_memory_gib",
        metavar="GIB",
        help=f"memory per GPU (the GPU's; {DEFAULTS.gpu_memory_gib:g})",
    )
    option(
        "intra_node_gb_s",
        metavar="GB/S",
        help="bandwidth per GPU inside a node, GB/s each way, as a level's bandwidth_gb_s "
        f"(the GPU's NVLink or Infinity Fabric; {DEFAULTS.intra_node_gb_s:g})",
    )
    option(
        "inter_node_gb_s",
        metavar="GB/S",
        help=f"bandwidth per GPU across nodes, GB/s ({DEFAULTS.inter_node_gb_s:g})",
    )
    for name, replacement in DEPRECATED_GBPS.items():
        option(name, metavar="GBPS", help=f"deprecated: {MODEL_OPTIONS[replacement]} in Gb/s")
    option(
        "peak_tflops",
        metavar="TF",
        help=f"peak dense TFLOP/s of one GPU (the GPU's; {DEFAULTS.peak_tflops:g})",
    )
    option("mfu", metavar="F", help=f"fraction of peak reached ({DEFAULTS.mfu:g})")
    option(
        "mfu_counts",
        **one_of(MFU_COUNTS),
        help="what --mfu is a fraction of: model FLOPs (6N plus attention, as published MFU "
        "counts them; recomputation not counted) or hardware FLOPs (recomputation counted) "
        f"({DEFAULTS.mfu_counts})",
    )
    option(
        "mfu_over",
        **one_of(MFU_OVER),
        help="what --mfu is measured over: the compute alone, the pipeline bubble and the "
        "communication not hidden coming on top; or the whole step, as a published MFU is, "
        f"the estimate then saying what share of the peak the compute needs ({DEFAULTS.mfu_over})",
    )
    option(
        "runtime_gib",
        metavar="GIB",
        help="GiB per GPU for the CUDA context, NCCL's buffers and the allocator's reserve "
        "together, replacing the published figures below (0: the training state alone)",
    )
    option(
        "cuda_context_gib",
        metavar="GIB",
        help="the CUDA context (published: about 0.3 GB with lazy module loading)",
    )
    option(
        "nccl_communicator_gib",
        metavar="GIB",
        help="NCCL's buffers per communicator a rank sends over (published, NCCL #964: 544 MB "
        "for 2 GPUs, 688 MB for more)",
    )
    option(
        "allocator_gib",
        metavar="GIB",
        help="the caching allocator's reserve beyond the tensors at the peak, as a trainer's "
        "max_reserved - max_allocated measures it (no published figure: 0)",
    )


def model_words(args: argparse.Namespace) -> list[str]:
    """The model and training options as given, as command-line words."""
    return [
        flag if name in FLAGS else f"{flag} {getattr(args, name)}"
        for name, flag in MODEL_OPTIONS.items()
        if getattr(args, name) is not None
    ]
