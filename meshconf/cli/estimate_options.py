"""The model and training options of ``plan``, ``show`` and ``measure``: reading them (over
a config's ``training`` block), and the estimate of a config's layout they ask for."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from meshconf.cli.common import EXIT_INVALID, bounded_int, bounded_number, usage_error
from meshconf.cli.estimate_explain import explain_lines, memory_terms, not_counted
from meshconf.cli.estimate_report import memory_json, memory_lines, settings_line
from meshconf.core.errors import ConfigError, SourceError
from meshconf.core.levels import crossed_levels
from meshconf.core.training import (
    CHECKPOINTING,
    DISPATCH_BYTES,
    DTYPE_BYTES,
    FP8_WITHOUT_GATHERS,
    MFU_COUNTS,
    MFU_OVER,
    RESHARDING,
    SCHEDULES,
    SPLIT_CONFLICT,
    TRAINING_BOUNDS,
    ZERO_STAGES,
    fp8_without_gathers,
    recomputation_mismatch,
    schedule_mismatch,
    split_conflict,
)
from meshconf.features.plan.estimate.architecture import Architecture
from meshconf.features.plan.estimate.communication import level_bandwidths
from meshconf.features.plan.estimate.model_file import load_model_file
from meshconf.features.plan.estimate.presets import PRESETS
from meshconf.features.plan.estimate.step import Estimate, estimate
from meshconf.features.plan.estimate.training import Parallelism, Training
from meshconf.features.plan.locality import RANKED_DIMS, home_domain
from meshconf.model.config import MeshConfig
from meshconf.model.training import TrainingOptions, setting_name

_DEFAULTS = Training()
#: The training options, which need a model: integers, positive numbers, and choices.
_INTEGERS = (
    "seq_len",
    "micro_batch",
    "global_batch_tokens",
    "checkpoint_every",
    "checkpoint_first",
    "virtual_stages",
    "layers_per_stage",
    "first_stage_layers",
    "last_stage_layers",
    "embedding_as_layers",
    "output_as_layers",
    "moe_max_nodes",
)
_NUMBERS = ("gpu_memory_gib", "intra_node_gbps", "inter_node_gbps", "peak_tflops", "mfu")
_CHOICES = (
    "param_dtype",
    "grad_dtype",
    "checkpointing",
    "schedule",
    "reshard_after_forward",
    "zero_stage",
    "dispatch_dtype",
    "mfu_counts",
    "mfu_over",
)
#: Switches: given, they are true.
_FLAGS = ("ep_overlap", "fp8_param_gather")


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
        "schedule": "--pp-schedule",
        "virtual_stages": "--virtual-stages",
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
        "gpu_memory_gib": "--gpu-memory-gib",
        "intra_node_gbps": "--intra-node-gbps",
        "inter_node_gbps": "--inter-node-gbps",
        "peak_tflops": "--peak-tflops",
        "mfu": "--mfu",
        "mfu_counts": "--mfu-counts",
        "mfu_over": "--mfu-over",
    }
)


def add_model_options(parser: argparse.ArgumentParser) -> None:
    """``--model`` or ``--model-file``, and the training settings with their defaults."""
    group = parser.add_argument_group("model (memory and step-time estimates: docs/plan.md)")

    def option(name: str, **settings: Any) -> None:
        group.add_argument(MODEL_OPTIONS[name], dest=name, **settings)

    option("model", metavar="NAME", help=f"a preset: {', '.join(PRESETS)}")
    option("model_file", metavar="FILE", help="a model described in YAML")
    option("seq_len", metavar="S", help=f"tokens per sequence ({_DEFAULTS.seq_len})")
    option("micro_batch", metavar="B", help=f"sequences per micro-batch ({_DEFAULTS.micro_batch})")
    option(
        "global_batch_tokens",
        metavar="T",
        help="tokens per step; sets the micro-batches per step (default: one per GPU)",
    )
    dtypes = tuple(DTYPE_BYTES)
    option(
        "param_dtype",
        choices=dtypes,
        help=f"stored parameters and activations ({_DEFAULTS.param_dtype})",
    )
    option(
        "grad_dtype", choices=dtypes, help=f"gradients and their reduction ({_DEFAULTS.grad_dtype})"
    )
    option(
        "checkpointing",
        choices=CHECKPOINTING,
        help="what the backward pass recomputes: nothing, what torchtitan's per-op selective "
        f"policy does not keep, or every block ({_DEFAULTS.checkpointing})",
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
    option("schedule", choices=SCHEDULES, help=f"pipeline schedule ({_DEFAULTS.schedule})")
    option(
        "virtual_stages",
        metavar="V",
        help="model chunks per pipeline rank, for --pp-schedule interleaved",
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
        choices=RESHARDING,
        help="whether FSDP frees gathered parameters after each forward pass, as torchtitan's "
        "policy: default (never with pp > 1, else always), always, never",
    )
    option(
        "zero_stage",
        type=int,
        choices=ZERO_STAGES,
        help="what data parallelism over fsdp shards: 1 the optimizer state (Megatron's "
        "distributed optimizer), 2 also gradients, 3 also parameters "
        f"(FSDP; {_DEFAULTS.zero_stage})",
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
        choices=tuple(DISPATCH_BYTES),
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
    option("gpu_memory_gib", metavar="GIB", help=f"memory per GPU ({_DEFAULTS.gpu_memory_gib:g})")
    option(
        "intra_node_gbps",
        metavar="GBPS",
        help=f"bandwidth per GPU inside a node, each way ({_DEFAULTS.intra_node_gbps:g})",
    )
    option(
        "inter_node_gbps",
        metavar="GBPS",
        help=f"bandwidth per GPU across nodes ({_DEFAULTS.inter_node_gbps:g})",
    )
    option(
        "peak_tflops",
        metavar="TF",
        help=f"peak dense TFLOP/s of one GPU ({_DEFAULTS.peak_tflops:g})",
    )
    option("mfu", metavar="F", help=f"fraction of peak reached ({_DEFAULTS.mfu:g})")
    option(
        "mfu_counts",
        choices=MFU_COUNTS,
        help="what --mfu is a fraction of: model FLOPs (6N plus attention, as published MFU "
        "counts them; recomputation not counted) or hardware FLOPs (recomputation counted) "
        f"({_DEFAULTS.mfu_counts})",
    )
    option(
        "mfu_over",
        choices=MFU_OVER,
        help="what --mfu is measured over: the compute alone, the pipeline bubble and the "
        "communication not hidden coming on top; or the whole step, as a published MFU is, "
        f"the estimate then saying what share of the peak the compute needs ({_DEFAULTS.mfu_over})",
    )


def model_words(args: argparse.Namespace) -> list[str]:
    """The model and training options as given, as command-line words."""
    return [
        flag if name in _FLAGS else f"{flag} {getattr(args, name)}"
        for name, flag in MODEL_OPTIONS.items()
        if getattr(args, name) is not None
    ]


def training_block(args: argparse.Namespace, training: Training) -> dict[str, Any]:
    """The keys of a config's ``training`` block that the options set, with the values
    ``training`` holds for them: what ``plan --emit`` writes into the config."""
    return {
        key: getattr(training, setting_name(key))
        for key in TrainingOptions.model_fields
        if getattr(args, setting_name(key)) is not None
    }


def model_request(
    args: argparse.Namespace, config_settings: Mapping[str, Any] = MappingProxyType({})
) -> tuple[Architecture | None, Training] | int:
    """The model and settings the options ask for, over ``config_settings`` (a config's
    ``training`` block) over the defaults, or the exit code after printing a usage error or
    the problems of an invalid model file."""
    found = _model_request(args, config_settings)
    return usage_error(found) if isinstance(found, str) else found


def _model_request(
    args: argparse.Namespace, config_settings: Mapping[str, Any]
) -> tuple[Architecture | None, Training] | str | int:
    names = [*_INTEGERS, *_NUMBERS, *_CHOICES, *_FLAGS]
    given = {name: getattr(args, name) for name in names if getattr(args, name) is not None}
    if args.model is not None and args.model_file is not None:
        return "--model and --model-file exclude each other"
    if args.model is None and args.model_file is None:
        if given:
            return f"{MODEL_OPTIONS[next(iter(given))]} needs --model or --model-file"
        return None, _DEFAULTS
    settings: dict[str, Any] = {}
    for name, text in given.items():
        if name in _CHOICES or name in _FLAGS:
            settings[name] = text
            continue
        value = _value(name, text)
        if isinstance(value, str):
            return value
        settings[name] = value
    training = Training(**{**_DEFAULTS.__dict__, **config_settings, **settings})
    problem = _settings_problem(training)
    if problem:
        return problem
    if args.model is not None:
        if args.model not in PRESETS:
            return f"--model: unknown model {args.model!r}; presets: {', '.join(PRESETS)}"
        return PRESETS[args.model], training
    try:
        return load_model_file(args.model_file), training
    except SourceError as error:
        return str(error)
    except ConfigError as error:
        for diagnostic in error.diagnostics:
            print(diagnostic.render(), file=sys.stderr)
        return EXIT_INVALID


def _value(name: str, text: Any) -> int | float | str:
    """The number an option gives, or the message saying why it is not one."""
    bound = TRAINING_BOUNDS[name]
    try:
        if name in _INTEGERS:
            return bounded_int(
                str(text),
                minimum=int(bound.minimum),
                maximum=int(bound.maximum),
                beyond=bound.beyond,
            )
        return bounded_number(
            str(text), minimum=bound.minimum, maximum=bound.maximum, beyond=bound.beyond
        )
    except argparse.ArgumentTypeError as error:
        return f"{MODEL_OPTIONS[name]}: {error}"


def _settings_problem(training: Training) -> str | None:
    if fp8_without_gathers(training.zero_stage, training.fp8_param_gather):
        return f"--fp8-param-gather needs a ZeRO stage of 1, 2 or 3: {FP8_WITHOUT_GATHERS}"
    recomputation = recomputation_mismatch(
        training.checkpointing, training.checkpoint_every, training.checkpoint_first
    )
    if recomputation == "both":
        return "--checkpoint-every and --checkpoint-first exclude each other"
    if recomputation == "mode":
        chosen = "--checkpoint-every" if training.checkpoint_first is None else "--checkpoint-first"
        return f"{chosen} needs --activation-checkpointing full"
    weights = (training.embedding_as_layers, training.output_as_layers)
    if split_conflict((training.first_stage_layers, training.last_stage_layers), weights):
        return (
            "--embedding-as-layers and --output-as-layers exclude --first-stage-layers and "
            f"--last-stage-layers: {SPLIT_CONFLICT}"
        )
    # a virtual_stages of the default, 1, counts as not given
    virtual_stages = None if training.virtual_stages == 1 else training.virtual_stages
    mismatch = schedule_mismatch(training.schedule, virtual_stages, training.layers_per_stage)
    return {
        None: None,
        "stages": "--pp-schedule interleaved needs --virtual-stages V with V >= 2",
        "schedule": "--virtual-stages needs --pp-schedule interleaved",
        "both": "--virtual-stages and --layers-per-stage exclude each other: both set the model "
        "chunks per pipeline rank",
    }[mismatch]


def config_estimate(
    args: argparse.Namespace, config: MeshConfig
) -> tuple[Architecture, Training, Estimate] | int | None:
    """The estimate of the config's layout under the model options; None without a model;
    an exit code after a usage error or an invalid model file."""
    block = config.training
    modelled = model_request(args, {} if block is None else block.estimate_settings())
    if isinstance(modelled, int):
        return modelled
    model, training = modelled
    if model is None:
        return None
    topology = config.topology
    crosses: dict[str, int] = {}
    for name in RANKED_DIMS:
        # the dim's default domain when the config has it, else the first that holds it
        holders = [layout for layout in config.layouts.values() if name in layout.dim_names]
        home = [layout for layout in holders if layout.name == home_domain(name)]
        if topology and holders:
            crosses[name] = len(crossed_levels((home or holders)[0], name, topology))
    bandwidths = level_bandwidths(topology, training)
    degrees = Parallelism.of(config.resolved_degrees)
    return model, training, estimate(model, degrees, training, crosses, bandwidths)


def show_estimate(
    args: argparse.Namespace, config: MeshConfig, report: dict[str, Any]
) -> list[str] | int:
    """For ``show --model``: the estimate of the config's layout, added to ``report`` under
    ``estimate`` and returned as text lines (none without a model); an exit code after a
    usage error or an invalid model file."""
    found = config_estimate(args, config)
    if found is None or isinstance(found, int):
        if found is None and args.explain:
            return usage_error("--explain needs --model or --model-file")
        return [] if found is None else found
    model, training, result = found
    report["estimate"] = {"model": model.name, **memory_json(result, training.gpu_memory_gib)}
    lines = ["", settings_line(model, training), *memory_lines(result, training)]
    if args.explain:
        report["estimate"]["terms"] = memory_terms(result, training)
        report["estimate"]["not_counted"] = not_counted(result)
        lines += explain_lines(result, training)
    return lines
