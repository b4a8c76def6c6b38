"""The model and training options of ``plan``, ``show`` and ``measure``: reading them (over
a config's ``training`` block), and the estimate of a config's layout they ask for."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import replace
from types import MappingProxyType
from typing import Any

from meshconf.cli.common import EXIT_INVALID, bounded_int, bounded_number, emit, usage_error
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
from meshconf.core.errors import ConfigError, Diagnostic, SourceError
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
from meshconf.features.plan.runnable import Unrunnable, unrunnable
from meshconf.model.config import MeshConfig
from meshconf.model.training import TrainingOptions, setting_name
from meshconf.sources.loading import load_located
from meshconf.sources.reading import Source

#: The keys of a training block that name the model estimated, as ``--model`` and
#: ``--model-file`` do.
MODEL_KEYS = ("model", "model_file")


def model_origin(
    args: argparse.Namespace, config_settings: Mapping[str, Any], config_path: str | None
) -> tuple[str, str] | None:
    """The model the options ask for, else the one ``config_settings`` (the training block
    of the config at ``config_path``) names: ``("model", preset)`` or ``("model_file",
    path)``, a relative path of the config read from the config's folder; None without
    one."""
    if args.model is not None:
        return "model", args.model
    if args.model_file is not None:
        return "model_file", args.model_file
    if "model" in config_settings:
        return "model", config_settings["model"]
    if "model_file" in config_settings:
        return "model_file", _from_config(config_path, config_settings["model_file"])
    return None


def _from_config(config_path: str | None, path: str) -> str:
    """``path`` as the config at ``config_path`` gives it: from the config's folder."""
    return path if config_path is None else os.path.join(os.path.dirname(config_path), path)


def planned_block(
    args: argparse.Namespace, block: TrainingOptions | None, training: Training
) -> dict[str, Any]:
    """The ``training`` block ``plan --emit`` writes: with a model, the model (a preset's
    name, or the model file's absolute path, as the planner does not know where the config
    will be saved), the GPU, the sequence, the micro-batch and the global batch, and every
    other key that an option or the config's block gave, with the value ``training`` holds
    for it; without a model, the config's block as it is."""
    written = {} if block is None else block.model_dump(exclude_none=True)
    origin = model_origin(args, written, args.path)
    if origin is None:
        return written
    kind, name = origin
    planned: dict[str, Any] = {kind: name if kind == "model" else os.path.abspath(name)}
    for key in TrainingOptions.model_fields:
        always = key in ("gpu", "seq_len", "micro_batch", "global_batch_tokens")
        if key not in MODEL_KEYS and (always or key in written or _given(args, key)):
            planned[key] = getattr(training, setting_name(key))
    return TrainingOptions.model_validate(planned).model_dump(exclude_none=True)


def _given(args: argparse.Namespace, key: str) -> bool:
    """Whether an option gave the setting of the block's ``key``, itself or through a
    deprecated option."""
    setting = setting_name(key)
    deprecated = [name for name, instead in DEPRECATED_GBPS.items() if instead == setting]
    return any(getattr(args, name) is not None for name in (setting, *deprecated))


def model_request(
    args: argparse.Namespace,
    config_settings: Mapping[str, Any] = MappingProxyType({}),
    config_path: str | None = None,
) -> tuple[Architecture | None, Training] | int:
    """The model and settings the options ask for, over ``config_settings`` (the
    ``training`` block of the config at ``config_path``,
    :meth:`TrainingOptions.estimate_settings`) over the defaults, or the exit code after
    printing a usage error or the problems of an invalid model file. A note on standard
    error names each option that replaces a value of the config."""
    for note in deprecation_notes(args):
        print(f"meshconf: note: {note}", file=sys.stderr)
    notes: list[str] = []
    found = _model_request(args, config_settings, config_path, notes)
    if isinstance(found, str):
        return usage_error(found)
    for note in notes:
        print(f"meshconf: note: {note}", file=sys.stderr)
    return found


def _model_request(
    args: argparse.Namespace,
    config_settings: Mapping[str, Any],
    config_path: str | None,
    notes: list[str],
) -> tuple[Architecture | None, Training] | str | int:
    names = [*INTEGERS, *NUMBERS, *DEPRECATED_GBPS, *CHOICES, *FLAGS]
    given = {name: getattr(args, name) for name in names if getattr(args, name) is not None}
    if args.model is not None and args.model_file is not None:
        return "--model and --model-file exclude each other"
    # the config's GPU figures replace its GPU's, whichever GPU is estimated
    configured = {
        name: value for name, value in config_settings.items() if name not in (*MODEL_KEYS, "gpu")
    }
    hardware = gpu_settings(args.gpu or config_settings.get("gpu"))
    origin = model_origin(args, config_settings, config_path)
    if origin is None:
        if given:
            return f"{MODEL_OPTIONS[next(iter(given))]} needs --model or --model-file"
        return None, replace(DEFAULTS, **hardware)
    settings: dict[str, Any] = {}
    replacing: dict[str, str] = {}
    for name, text in given.items():
        if name in CHOICES or name in FLAGS:
            settings[name] = int(text) if name == "zero_stage" else text
            replacing[name] = MODEL_OPTIONS[name] + ("" if name in FLAGS else f" {text}")
            continue
        value = _value(name, text)
        if isinstance(value, str):
            return value
        replacing[name] = f"{MODEL_OPTIONS[name]} {text}"
        if name in DEPRECATED_GBPS:
            replacement = DEPRECATED_GBPS[name]
            if replacement in given:
                return f"{MODEL_OPTIONS[name]} and {MODEL_OPTIONS[replacement]} exclude each other"
            replacing[replacement] = replacing.pop(name)
            name, value = replacement, float(value) / 8
        settings[name] = value
    training = Training(**{**DEFAULTS.__dict__, **hardware, **configured, **settings})
    problem = _settings_problem(training)
    if problem:
        return problem
    notes += _replacement_notes(args, config_settings, config_path, origin, settings, replacing)
    kind, name = origin
    if kind == "model":
        if name not in PRESETS:
            return f"--model: unknown model {name!r}; presets: {', '.join(PRESETS)}"
        return PRESETS[name], training
    try:
        return load_model_file(name), training
    except SourceError as error:
        if args.model_file is not None:
            return str(error)
        return (
            f"training.model_file of {config_path}: {error} (a relative path is read from the "
            "config's folder)"
        )
    except ConfigError as error:
        for diagnostic in error.diagnostics:
            print(diagnostic.render(), file=sys.stderr)
        return EXIT_INVALID


def _replacement_notes(
    args: argparse.Namespace,
    config_settings: Mapping[str, Any],
    config_path: str | None,
    origin: tuple[str, str],
    settings: Mapping[str, Any],
    replacing: Mapping[str, str],
) -> list[str]:
    """A note for each option whose value replaces another of the config's training block:
    ``--seq-len 8192 replaces training.seq_len 4096 of best.yaml``."""
    found: list[tuple[str, str, Any]] = []
    kind, name = origin
    written = next(
        ((key, config_settings[key]) for key in MODEL_KEYS if key in config_settings), None
    )
    if written is not None and (args.model or args.model_file) is not None:
        key, value = written
        same = (
            os.path.abspath(name) == os.path.abspath(_from_config(config_path, value))
            if (kind, key) == ("model_file", "model_file")
            else (kind, name) == written
        )
        if not same:
            option = "--model" if kind == "model" else "--model-file"
            found.append((f"{option} {name}", key, value))
    if args.gpu is not None and config_settings.get("gpu", args.gpu) != args.gpu:
        found.append((f"--gpu {args.gpu}", "gpu", config_settings["gpu"]))
    for setting, value in settings.items():
        if config_settings.get(setting, value) != value:
            key = _KEYS.get(setting, setting)
            found.append((replacing[setting], key, config_settings[setting]))
    return [
        f"{option} replaces training.{key} {_written(value)} of {config_path}"
        for option, key, value in found
    ]


#: The keys of the training block by the estimate's setting names (:func:`setting_name`).
_KEYS = {setting_name(key): key for key in TrainingOptions.model_fields}


def _written(value: Any) -> str:
    """A value of the config as YAML writes it."""
    if isinstance(value, bool):
        return str(value).lower()
    return f"{value:g}" if isinstance(value, float) else str(value)


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
    settings = {} if block is None else block.estimate_settings()
    modelled = model_request(args, settings, args.path)
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


def runnable_diagnostics(located: Source, problems: Sequence[Unrunnable]) -> list[Diagnostic]:
    """Each degree of a config's layout that its model cannot run, placed at the degree's
    key as the config's own problems are."""
    return [
        located.diagnostic(("degrees", problem.degree), problem.message) for problem in problems
    ]


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
    problems = unrunnable(model, config.resolved_degrees, training, config.resolved_world_size)
    if problems:
        _, located = load_located(args.path, args.overrides, args.key, world_size=args.world_size)
        lines = [diagnostic.render() for diagnostic in runnable_diagnostics(located, problems)]
        emit(lambda: print("\n".join(lines)))
        return EXIT_INVALID
    report["estimate"] = {"model": model.name, **memory_json(result)}
    lines = ["", settings_line(model, training), *memory_lines(result, training)]
    if args.explain:
        report["estimate"]["terms"] = memory_terms(result, training)
        report["estimate"]["not_counted"] = NOT_COUNTED
        lines += explain_lines(result, training)
    return lines
