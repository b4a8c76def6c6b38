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

from meshconf.cli.common import InvalidInput, UsageError, bounded_int, bounded_number
from meshconf.cli.estimate_explain import explain_json, explain_lines
from meshconf.cli.estimate_report import memory_json, memory_lines, settings_line
from meshconf.cli.model_options import DEFAULTS, DEPRECATED_GBPS, MODEL_OPTIONS
from meshconf.core.errors import ConfigError, Diagnostic, SourceError
from meshconf.core.levels import crossed_levels
from meshconf.core.settings import (
    BY_ESTIMATE_NAME,
    GPU_SETTING,
    MODEL_SETTINGS,
    SETTINGS,
    TRAINING_SETTINGS,
)
from meshconf.features.plan.estimate.architecture import Architecture
from meshconf.features.plan.estimate.communication import level_bandwidths
from meshconf.features.plan.estimate.gpus import GPUS
from meshconf.features.plan.estimate.model_file import load_model_file
from meshconf.features.plan.estimate.presets import PRESETS
from meshconf.features.plan.estimate.step import Estimate, estimate
from meshconf.features.plan.estimate.step_inputs import Parallelism, Training
from meshconf.features.plan.locality import RANKED_DIMS, home_domain
from meshconf.features.plan.runnable import Unrunnable, unrunnable
from meshconf.model.config import MeshConfig
from meshconf.model.training import TrainingOptions, block_key, refusal, setting_name
from meshconf.sources.loading import load_located
from meshconf.sources.reading import Source

#: The keys of a training block that name the model estimated, as their options do.
MODEL_KEYS = MODEL_SETTINGS
_PRESET, _FILE = MODEL_KEYS
#: The options that name the model estimated: ``--model or --model-file``.
_MODEL_OPTIONS_TEXT = " or ".join(SETTINGS[key].option for key in MODEL_KEYS)


def model_origin(
    args: argparse.Namespace, config_settings: Mapping[str, Any], config_path: str | None
) -> tuple[str, str] | None:
    """The model the options ask for, else the one ``config_settings`` (the training block
    of the config at ``config_path``) names: the key of :data:`MODEL_KEYS` that names it (a
    preset or a model file) and its value, a relative path of the config read from the
    config's folder; None without one."""
    for key in MODEL_KEYS:
        if getattr(args, key) is not None:
            return key, getattr(args, key)
    for key in MODEL_KEYS:
        if key in config_settings:
            name = config_settings[key]
            return key, name if key == _PRESET else _from_config(config_path, name)
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
    planned: dict[str, Any] = {kind: name if kind == _PRESET else os.path.abspath(name)}
    for key in TrainingOptions.model_fields:
        always = SETTINGS[key].always_emitted
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
) -> tuple[Architecture | None, Training]:
    """The model and settings the options ask for, over ``config_settings`` (the
    ``training`` block of the config at ``config_path``,
    :meth:`TrainingOptions.estimate_settings`) over the defaults. A note on standard error
    names each option that replaces a value of the config.

    Raises:
        UsageError: an option's value, or options that exclude each other.
        InvalidInput: the model file's problems.
    """
    for note in deprecation_notes(args):
        print(f"meshconf: note: {note}", file=sys.stderr)
    given = {
        name: getattr(args, name) for name in _SETTING_OPTIONS if getattr(args, name) is not None
    }
    if args.model is not None and args.model_file is not None:
        raise UsageError(
            " and ".join(MODEL_OPTIONS[key] for key in MODEL_KEYS) + " exclude each other"
        )
    # the config's GPU figures replace its GPU's, whichever GPU is estimated
    configured = {
        name: value
        for name, value in config_settings.items()
        if name not in (*MODEL_KEYS, GPU_SETTING)
    }
    hardware = gpu_settings(args.gpu or config_settings.get(GPU_SETTING))
    origin = model_origin(args, config_settings, config_path)
    if origin is None:
        if given:
            raise UsageError(f"{MODEL_OPTIONS[next(iter(given))]} needs {_MODEL_OPTIONS_TEXT}")
        return None, replace(DEFAULTS, **hardware)
    settings, replacing = _option_settings(given)
    training = Training(**{**DEFAULTS.__dict__, **hardware, **configured, **settings})
    problem = _refusal(args, config_settings, config_path, settings)
    if problem:
        raise UsageError(problem)
    model = _model(args, origin, config_path)
    for note in _replacement_notes(args, config_settings, config_path, origin, settings, replacing):
        print(f"meshconf: note: {note}", file=sys.stderr)
    return model, training


#: The options of the settings besides the model's and the GPU's, by destination, each
#: deprecated one after the one that replaces it.
_SETTING_OPTIONS = [
    name
    for name in MODEL_OPTIONS
    if DEPRECATED_GBPS.get(name, name) not in (*MODEL_KEYS, GPU_SETTING)
]


def _option_settings(given: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, str]]:
    """The settings the ``given`` options set, by name, and the words of each option.

    Raises:
        UsageError: a value out of its bounds, or a deprecated option beside its replacement.
    """
    settings: dict[str, Any] = {}
    replacing: dict[str, str] = {}
    for name, text in given.items():
        row = BY_ESTIMATE_NAME.get(name)
        if row is not None and (row.choices or row.kind == "switch"):
            # a choice as the setting holds it (a ZeRO stage is a number)
            settings[name] = {str(choice): choice for choice in row.choices}.get(text, text)
            replacing[name] = MODEL_OPTIONS[name] + ("" if row.kind == "switch" else f" {text}")
            continue
        value = _value(name, text)
        replacing[name] = f"{MODEL_OPTIONS[name]} {text}"
        if name in DEPRECATED_GBPS:
            replacement = DEPRECATED_GBPS[name]
            if replacement in given:
                raise UsageError(
                    f"{MODEL_OPTIONS[name]} and {MODEL_OPTIONS[replacement]} exclude each other"
                )
            replacing[replacement] = replacing.pop(name)
            name, value = replacement, float(value) / 8
        settings[name] = value
    return settings, replacing


def _model(
    args: argparse.Namespace, origin: tuple[str, str], config_path: str | None
) -> Architecture:
    """The preset or the model file ``origin`` names (a preset's name is checked where it is
    read: by ``--model``'s choices, or by the block's field).

    Raises:
        UsageError: a model file that cannot be read.
        InvalidInput: the model file's problems.
    """
    kind, name = origin
    if kind == _PRESET:
        return PRESETS[name]
    try:
        return load_model_file(name)
    except SourceError as error:
        if args.model_file is not None:
            raise UsageError(str(error)) from None
        raise UsageError(
            f"training.model_file of {config_path}: {error} (a relative path is read from the "
            "config's folder)"
        ) from None
    except ConfigError as error:
        lines = [diagnostic.render() for diagnostic in error.diagnostics]
        raise InvalidInput(lines, to_stderr=True) from None


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
            if kind == key == _FILE
            else (kind, name) == written
        )
        if not same:
            found.append((f"{MODEL_OPTIONS[kind]} {name}", key, value))
    if args.gpu is not None and config_settings.get(GPU_SETTING, args.gpu) != args.gpu:
        gpu = (f"{MODEL_OPTIONS[GPU_SETTING]} {args.gpu}", GPU_SETTING)
        found.append((*gpu, config_settings[GPU_SETTING]))
    for setting, value in settings.items():
        if config_settings.get(setting, value) != value:
            key = block_key(setting)
            found.append((replacing[setting], key, config_settings[setting]))
    return [
        f"{option} replaces training.{key} {_written(value)} of {config_path}"
        for option, key, value in found
    ]


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
        row.attribute: getattr(gpu, row.gpu_figure) for row in TRAINING_SETTINGS if row.gpu_figure
    }


def deprecation_notes(args: argparse.Namespace) -> list[str]:
    """A note for each option given that goes away in the next release."""
    notes = []
    for name, replacement in DEPRECATED_GBPS.items():
        text = getattr(args, name, None)
        if text is None:
            continue
        try:
            instead = f"{float(_value(name, text)) / 8:g}"
        except UsageError:  # said after the notes
            instead = "GB/S"
        notes.append(
            f"{MODEL_OPTIONS[name]} takes Gb/s and goes away in the next release; use "
            f"{MODEL_OPTIONS[replacement]} {instead} (GB/s, as a level's bandwidth_gb_s)"
        )
    return notes


def _value(name: str, text: Any) -> int | float:
    """The number an option gives.

    Raises:
        UsageError: it is not a number within the option's bounds.
    """
    row = BY_ESTIMATE_NAME[DEPRECATED_GBPS.get(name, name)]
    assert row.bound is not None, "an option that takes a number has a bound"
    bound = row.bound
    if name in DEPRECATED_GBPS:  # Gb/s: eight times the GB/s bounds
        bound = replace(bound, minimum=bound.minimum * 8, maximum=bound.maximum * 8)
    try:
        if row.kind == "integer":
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
        raise UsageError(f"{MODEL_OPTIONS[name]}: {error}") from None


def _refusal(
    args: argparse.Namespace,
    config_settings: Mapping[str, Any],
    config_path: str | None,
    settings: Mapping[str, Any],
) -> str | None:
    """Why the options' ``settings`` do not go with each other or with the config's block,
    as the block's own rules say it: each setting named by its option, or by its key and
    where the config gives it; None when they go together."""
    configured = {block_key(name): value for name, value in config_settings.items()}
    given = {block_key(name): value for name, value in settings.items()}
    merged = {key: value for key, value in {**configured, **given}.items() if key not in MODEL_KEYS}

    def name(key: str) -> str:
        if key in configured and key not in given and config_path is not None:
            return _in_config(args, config_path, key)
        return SETTINGS[key].option

    return refusal(merged, name)


def _in_config(args: argparse.Namespace, config_path: str, key: str) -> str:
    """``training.seq_len at best.yaml:5:3``: a key of the config's training block and where
    the config gives it."""
    try:
        _, located = load_located(config_path, args.overrides, args.key)
    except (ConfigError, SourceError):
        return f"training.{key} of {config_path}"
    found = located.diagnostic(("training", key), "")
    if found.override is not None:
        return f"training.{key} (set by {found.override})"
    if found.line is None:
        return f"training.{key} of {config_path}"
    return f"training.{key} at {found.source}:{found.line}:{found.column}"


def config_estimate(
    args: argparse.Namespace, config: MeshConfig
) -> tuple[Architecture, Training, Estimate] | None:
    """The estimate of the config's layout under the model options; None without a model.

    Raises:
        UsageError, InvalidInput: as :func:`model_request`.
    """
    block = config.training
    settings = {} if block is None else block.estimate_settings()
    model, training = model_request(args, settings, args.path)
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
) -> list[str]:
    """For ``show --model``: the estimate of the config's layout, added to ``report`` under
    ``estimate`` and returned as text lines (none without a model).

    Raises:
        UsageError, InvalidInput: as :func:`model_request`; UsageError for ``--explain``
            without a model.
        ConfigError: a degree of the layout that the model cannot run, at its key.
    """
    found = config_estimate(args, config)
    if found is None:
        if args.explain:
            raise UsageError("--explain needs --model or --model-file")
        return []
    model, training, result = found
    problems = unrunnable(model, config.resolved_degrees, training, config.resolved_world_size)
    if problems:
        _, located = load_located(args.path, args.overrides, args.key, world_size=args.world_size)
        raise ConfigError(runnable_diagnostics(located, problems))
    report["estimate"] = {"model": model.name, **memory_json(result)}
    lines = ["", settings_line(model, training), *memory_lines(result, training)]
    if args.explain:
        report["estimate"].update(explain_json(result, training))
        lines += explain_lines(result, training)
    return lines
