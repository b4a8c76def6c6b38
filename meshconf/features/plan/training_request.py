"""The model and training settings an estimate is asked for, from four places: the options
given, over a config's ``training`` block, over the ``--gpu`` preset's figures, over the
estimate's defaults; with a note for each option that replaces a value of the config, and
each setting named in a refusal by its option, or by its key and where the config gives it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

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
from meshconf.features.plan.estimate.model_file import load_model_file
from meshconf.features.plan.estimate.presets import PRESETS
from meshconf.features.plan.estimate.step import Estimate, estimate
from meshconf.features.plan.estimate.step_inputs import Parallelism, Training, gpu_settings
from meshconf.features.plan.locality import RANKED_DIMS, home_domain
from meshconf.features.plan.request import PlanError
from meshconf.features.plan.runnable import Unrunnable
from meshconf.model.config import MeshConfig
from meshconf.model.training import TrainingOptions, refusal
from meshconf.sources.loading import load_located
from meshconf.sources.reading import Source

_PRESET, _FILE = MODEL_SETTINGS
#: The options that name the model estimated: ``--model or --model-file``.
MODEL_OPTIONS_TEXT = " or ".join(SETTINGS[key].option for key in MODEL_SETTINGS)
#: The estimate's settings where nothing else gives them.
DEFAULTS = Training()


@dataclass(frozen=True)
class Asked:
    """What the command line asks of an estimate, parsed; empty where it asks nothing."""

    #: The model's preset or file and the GPU preset, by the block's key.
    named: Mapping[str, str] = field(default_factory=dict)
    #: The other settings the options give, by the estimate's name, each within its bounds.
    settings: Mapping[str, Any] = field(default_factory=dict)
    #: Each of those settings as the command line wrote it (``--seq-len 4096``).
    words: Mapping[str, str] = field(default_factory=dict)
    #: How the config's keys are read again to place them in a refusal: its ``-o``
    #: overrides and its ``--key``.
    overrides: Sequence[str] = ()
    key: str | None = None


def model_origin(
    asked: Asked, config_settings: Mapping[str, Any], config_path: str | None
) -> tuple[str, str] | None:
    """The key that names the model (a preset or a model file) and its value: the options',
    else the training block's of the config at ``config_path`` (a relative path read from
    the config's folder); None without one."""
    for key in MODEL_SETTINGS:
        if key in asked.named:
            return key, asked.named[key]
    for key in MODEL_SETTINGS:
        if key in config_settings:
            name = config_settings[key]
            return key, name if key == _PRESET else _from_config(config_path, name)
    return None


def _from_config(config_path: str | None, path: str) -> str:
    """``path`` as the config at ``config_path`` gives it: from the config's folder."""
    return path if config_path is None else os.path.join(os.path.dirname(config_path), path)


def planned_block(
    asked: Asked, block: TrainingOptions | None, training: Training, config_path: str | None
) -> dict[str, Any]:
    """The ``training`` block ``plan --emit`` writes: with a model, the model (a model file
    by its absolute path: the planner does not know where the config will be saved), the
    keys always emitted and those an option or the block gave, with ``training``'s values;
    without a model, the config's block as it is."""
    written = {} if block is None else block.model_dump(exclude_none=True)
    origin = model_origin(asked, written, config_path)
    if origin is None:
        return written
    kind, name = origin
    planned: dict[str, Any] = {kind: name if kind == _PRESET else os.path.abspath(name)}
    for row in TRAINING_SETTINGS:
        given = row.key in asked.named or row.attribute in asked.settings
        if row.key not in MODEL_SETTINGS and (row.always_emitted or row.key in written or given):
            planned[row.key] = getattr(training, row.attribute)
    return TrainingOptions.model_validate(planned).model_dump(exclude_none=True)


def requested_settings(
    asked: Asked, config_settings: Mapping[str, Any], config_path: str | None
) -> tuple[Architecture | None, Training, list[str]]:
    """The model and settings ``asked`` for, over ``config_settings`` (the ``training``
    block of the config at ``config_path``, :meth:`TrainingOptions.estimate_settings`) over
    the defaults, and a note for each option that replaces a value of the config.

    Raises:
        PlanError: options that exclude each other or go against the config's block, a
            setting given without a model, or a model file that cannot be read.
        ConfigError: the model file's problems.
    """
    if all(key in asked.named for key in MODEL_SETTINGS):
        options = (SETTINGS[key].option for key in MODEL_SETTINGS)
        raise PlanError(" and ".join(options) + " exclude each other")
    # the config's GPU figures replace its GPU's, whichever GPU is estimated
    configured = {
        name: value
        for name, value in config_settings.items()
        if name not in (*MODEL_SETTINGS, GPU_SETTING)
    }
    hardware = gpu_settings(asked.named.get(GPU_SETTING) or config_settings.get(GPU_SETTING))
    origin = model_origin(asked, config_settings, config_path)
    if origin is None:
        if asked.settings:
            option = asked.words[next(iter(asked.settings))].split()[0]
            raise PlanError(f"{option} needs {MODEL_OPTIONS_TEXT}")
        return None, replace(DEFAULTS, **hardware), []
    settings = asked.settings
    training = Training(**{**DEFAULTS.__dict__, **hardware, **configured, **settings})
    problem = _refusal(asked, config_settings, config_path)
    if problem:
        raise PlanError(problem)
    model = _model(asked, origin, config_path)
    notes = _replacement_notes(asked, config_settings, config_path, origin)
    return model, training, notes


def _model(asked: Asked, origin: tuple[str, str], config_path: str | None) -> Architecture:
    """The preset or the model file ``origin`` names (a preset's name was checked where it
    was read).

    Raises:
        PlanError: a model file that cannot be read.
        ConfigError: the model file's problems.
    """
    kind, name = origin
    if kind == _PRESET:
        return PRESETS[name]
    try:
        return load_model_file(name)
    except SourceError as error:
        if _FILE in asked.named:
            raise PlanError(str(error)) from None
        raise PlanError(
            f"training.{_FILE} of {config_path}: {error} (a relative path is read from the "
            "config's folder)"
        ) from None


def _replacement_notes(
    asked: Asked,
    config_settings: Mapping[str, Any],
    config_path: str | None,
    origin: tuple[str, str],
) -> list[str]:
    """A note for each option whose value replaces another of the config's training block:
    ``--seq-len 8192 replaces training.seq_len 4096 of best.yaml``."""
    found: list[tuple[str, str, Any]] = []
    kind, name = origin
    written = next(
        ((key, config_settings[key]) for key in MODEL_SETTINGS if key in config_settings), None
    )
    if written is not None and any(key in asked.named for key in MODEL_SETTINGS):
        key, value = written
        same = (
            os.path.abspath(name) == os.path.abspath(_from_config(config_path, value))
            if kind == key == _FILE
            else (kind, name) == written
        )
        if not same:
            found.append((f"{SETTINGS[kind].option} {name}", key, value))
    gpu = asked.named.get(GPU_SETTING)
    if gpu is not None and config_settings.get(GPU_SETTING, gpu) != gpu:
        option = f"{SETTINGS[GPU_SETTING].option} {gpu}"
        found.append((option, GPU_SETTING, config_settings[GPU_SETTING]))
    for setting, value in asked.settings.items():
        if config_settings.get(setting, value) != value:
            key = BY_ESTIMATE_NAME[setting].key
            found.append((asked.words[setting], key, config_settings[setting]))
    return [
        f"{option} replaces training.{key} {_written(value)} of {config_path}"
        for option, key, value in found
    ]


def _written(value: Any) -> str:
    """A value of the config as YAML writes it."""
    if isinstance(value, bool):
        return str(value).lower()
    return f"{value:g}" if isinstance(value, float) else str(value)


def _refusal(
    asked: Asked, config_settings: Mapping[str, Any], config_path: str | None
) -> str | None:
    """Why the options' settings do not go with each other or with the config's block, as
    the block's own rules say it (:func:`refusal`); None when they go together."""
    configured = {BY_ESTIMATE_NAME[name].key: value for name, value in config_settings.items()}
    given = {BY_ESTIMATE_NAME[name].key: value for name, value in asked.settings.items()}
    merged = {
        key: value for key, value in {**configured, **given}.items() if key not in MODEL_SETTINGS
    }

    def name(key: str) -> str:
        if key in configured and key not in given and config_path is not None:
            return _in_config(asked, config_path, key)
        return SETTINGS[key].option

    return refusal(merged, name)


def _in_config(asked: Asked, config_path: str, key: str) -> str:
    """``training.seq_len at best.yaml:5:3``: a key of the config's training block and where
    the config gives it."""
    try:
        _, located = load_located(config_path, asked.overrides, asked.key)
    except (ConfigError, SourceError):
        return f"training.{key} of {config_path}"
    found = located.diagnostic(("training", key), "")
    if found.override is not None:
        return f"training.{key} (set by {found.override})"
    if found.line is None:
        return f"training.{key} of {config_path}"
    return f"training.{key} at {found.source}:{found.line}:{found.column}"


def layout_estimate(model: Architecture, training: Training, config: MeshConfig) -> Estimate:
    """The estimate of the config's layout: each ranked dim crosses the levels its home
    domain's groups cross (where the config has not that domain, the first holding it)."""
    topology = config.topology
    crosses: dict[str, int] = {}
    for name in RANKED_DIMS:
        holders = [layout for layout in config.layouts.values() if name in layout.dim_names]
        home = [layout for layout in holders if layout.name == home_domain(name)]
        if topology and holders:
            crosses[name] = len(crossed_levels((home or holders)[0], name, topology))
    bandwidths = level_bandwidths(topology, training)
    degrees = Parallelism.of(config.resolved_degrees)
    return estimate(model, degrees, training, crosses, bandwidths)


def runnable_diagnostics(located: Source, problems: Sequence[Unrunnable]) -> list[Diagnostic]:
    """Each degree its model cannot run, placed at the degree's key as a config's problem."""
    return [
        located.diagnostic(("degrees", problem.degree), problem.message) for problem in problems
    ]
