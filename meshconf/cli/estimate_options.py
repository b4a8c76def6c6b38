"""The model and training options of ``plan``, ``show`` and ``measure``: reading them (over
a config's ``training`` block), and the estimate of a config's layout they ask for."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping
from dataclasses import replace
from types import MappingProxyType
from typing import Any

from meshconf.cli.common import EXIT_INVALID, bounded_int, bounded_number, usage_error
from meshconf.cli.estimate_explain import NOT_COUNTED, explain_lines, memory_terms
from meshconf.cli.estimate_report import memory_json, memory_lines, settings_line
from meshconf.cli.model_options import (
    CHOICES,
    DEFAULTS,
    DEPRECATED_GBPS,
    FLAGS,
    INTEGERS,
    MODEL_OPTIONS,
    NUMBERS,
)
from meshconf.core.errors import ConfigError, SourceError
from meshconf.core.levels import crossed_levels
from meshconf.core.training import (
    FP8_WITHOUT_GATHERS,
    SPLIT_CONFLICT,
    TRAINING_BOUNDS,
    fp8_without_gathers,
    group_mismatch,
    recomputation_mismatch,
    schedule_mismatch,
    split_conflict,
)
from meshconf.features.plan.estimate.architecture import Architecture
from meshconf.features.plan.estimate.communication import level_bandwidths
from meshconf.features.plan.estimate.gpus import GPUS
from meshconf.features.plan.estimate.model_file import load_model_file
from meshconf.features.plan.estimate.presets import PRESETS
from meshconf.features.plan.estimate.step import Estimate, estimate
from meshconf.features.plan.estimate.training import Parallelism, Training
from meshconf.features.plan.locality import RANKED_DIMS, home_domain
from meshconf.model.config import MeshConfig
from meshconf.model.training import TrainingOptions, setting_name


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
    for note in deprecation_notes(args):
        print(f"meshconf: note: {note}", file=sys.stderr)
    found = _model_request(args, config_settings)
    return usage_error(found) if isinstance(found, str) else found


def _model_request(
    args: argparse.Namespace, config_settings: Mapping[str, Any]
) -> tuple[Architecture | None, Training] | str | int:
    names = [*INTEGERS, *NUMBERS, *DEPRECATED_GBPS, *CHOICES, *FLAGS]
    given = {name: getattr(args, name) for name in names if getattr(args, name) is not None}
    if args.model is not None and args.model_file is not None:
        return "--model and --model-file exclude each other"
    hardware = gpu_settings(args.gpu)
    if args.model is None and args.model_file is None:
        if given:
            return f"{MODEL_OPTIONS[next(iter(given))]} needs --model or --model-file"
        return None, replace(DEFAULTS, **hardware)
    settings: dict[str, Any] = {}
    for name, text in given.items():
        if name in CHOICES or name in FLAGS:
            settings[name] = int(text) if name == "zero_stage" else text
            continue
        value = _value(name, text)
        if isinstance(value, str):
            return value
        if name in DEPRECATED_GBPS:
            replacement = DEPRECATED_GBPS[name]
            if replacement in given:
                return f"{MODEL_OPTIONS[name]} and {MODEL_OPTIONS[replacement]} exclude each other"
            name, value = replacement, float(value) / 8
        settings[name] = value
    training = Training(**{**DEFAULTS.__dict__, **hardware, **config_settings, **settings})
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


def gpu_settings(name: str | None) -> dict[str, Any]:
    """The training settings a ``--gpu`` preset gives (none without one)."""
    if name is None:
        return {}
    gpu = GPUS[name]
    return {
        "gpu": gpu.name,
        "gpu_memory_gib": gpu.memory_gib,
        "peak_tflops": gpu.peak_tflops,
        "intra_node_gb_s": gpu.scale_up_gb_s,
        "inter_node_gb_s": gpu.network_gb_s,
    }


def deprecation_notes(args: argparse.Namespace) -> list[str]:
    """A note for each option given that goes away in the next release."""
    notes = []
    for name, replacement in DEPRECATED_GBPS.items():
        text = getattr(args, name, None)
        if text is None:
            continue
        value = _value(name, text)
        instead = f"{float(value) / 8:g}" if not isinstance(value, str) else "GB/S"
        notes.append(
            f"{MODEL_OPTIONS[name]} takes Gb/s and goes away in the next release; use "
            f"{MODEL_OPTIONS[replacement]} {instead} (GB/s, as a level's bandwidth_gb_s)"
        )
    return notes


def _value(name: str, text: Any) -> int | float | str:
    """The number an option gives, or the message saying why it is not one."""
    bound = TRAINING_BOUNDS[DEPRECATED_GBPS.get(name, name)]
    if name in DEPRECATED_GBPS:  # Gb/s: eight times the GB/s bounds
        bound = replace(bound, minimum=bound.minimum * 8, maximum=bound.maximum * 8)
    try:
        if name in INTEGERS:
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
        training.checkpointing,
        training.checkpoint_every,
        training.checkpoint_first,
        training.checkpoint_group,
    )
    if recomputation is not None:
        why, setting, before = recomputation
        if why == "both":
            return f"{MODEL_OPTIONS[before]} and {MODEL_OPTIONS[setting]} exclude each other"
        return f"{MODEL_OPTIONS[setting]} needs --activation-checkpointing full"
    weights = (training.embedding_as_layers, training.output_as_layers)
    if split_conflict((training.first_stage_layers, training.last_stage_layers), weights):
        return (
            "--embedding-as-layers and --output-as-layers exclude --first-stage-layers and "
            f"--last-stage-layers: {SPLIT_CONFLICT}"
        )
    if group_mismatch(training.schedule, training.microbatch_group):
        return "--microbatch-group needs --pp-schedule interleaved or llama3"
    # a virtual_stages of the default, 1, counts as not given
    virtual_stages = None if training.virtual_stages == 1 else training.virtual_stages
    mismatch = schedule_mismatch(training.schedule, virtual_stages, training.layers_per_stage)
    return {
        None: None,
        "stages": f"--pp-schedule {training.schedule} needs --virtual-stages V with V >= 2",
        "schedule": "--virtual-stages needs --pp-schedule interleaved, llama3 or loopedbfs",
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
    report["estimate"] = {"model": model.name, **memory_json(result)}
    lines = ["", settings_line(model, training), *memory_lines(result, training)]
    if args.explain:
        report["estimate"]["terms"] = memory_terms(result, training)
        report["estimate"]["not_counted"] = NOT_COUNTED
        lines += explain_lines(result, training)
    return lines
