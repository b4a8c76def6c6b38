"""The model and training options of ``plan``, ``show``, ``measure`` and ``validate``
(declared in :mod:`meshconf.cli.model_arguments`) read as the settings they give, and the
estimate of a config's layout they ask for."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterable, Mapping
from dataclasses import replace
from types import MappingProxyType
from typing import Any

from meshconf.cli.common import InvalidInput, UsageError, bounded_int, bounded_number
from meshconf.cli.model_arguments import DEPRECATED_GBPS, FLAGS, MODEL_OPTIONS
from meshconf.core.errors import ConfigError, Diagnostic
from meshconf.core.settings import BY_ESTIMATE_NAME, GPU_SETTING, MODEL_SETTINGS
from meshconf.features.plan import training_request
from meshconf.features.plan.estimate.architecture import Architecture
from meshconf.features.plan.estimate.step import Estimate
from meshconf.features.plan.estimate.step_inputs import Training
from meshconf.features.plan.estimate_text import (
    estimate_json,
    explain_json,
    explain_lines,
    memory_lines,
    settings_line,
)
from meshconf.features.plan.request import PlanError
from meshconf.features.plan.runnable import unrunnable
from meshconf.features.plan.training_request import (
    MODEL_OPTIONS_TEXT,
    Asked,
    layout_estimate,
    requested_settings,
    runnable_diagnostics,
)
from meshconf.model.config import MeshConfig
from meshconf.model.training import TrainingOptions
from meshconf.sources.loading import load_located
from meshconf.sources.reading import Source


def _given(args: argparse.Namespace, names: Iterable[str]) -> dict[str, Any]:
    """The options among ``names`` that were given, by destination, in the order of ``names``."""
    return {name: getattr(args, name) for name in names if getattr(args, name) is not None}


def model_words(args: argparse.Namespace) -> list[str]:
    """The model and training options as given, as command-line words."""
    given = _given(args, MODEL_OPTIONS)
    return [
        MODEL_OPTIONS[name] + ("" if name in FLAGS else f" {text}") for name, text in given.items()
    ]


#: The options of the settings besides the model's and the GPU's, by destination.
_SETTING_OPTIONS = [
    name
    for name in MODEL_OPTIONS
    if DEPRECATED_GBPS.get(name, name) not in (*MODEL_SETTINGS, GPU_SETTING)
]


def asked(args: argparse.Namespace) -> Asked:
    """The settings the model and training options give, each value read within its bounds.

    Raises:
        UsageError: a value out of its bounds, or a deprecated option beside its replacement.
    """
    settings, words = _option_settings(_given(args, _SETTING_OPTIONS))
    return Asked(
        named=_given(args, (*MODEL_SETTINGS, GPU_SETTING)),
        settings=settings,
        words=words,
        overrides=getattr(args, "overrides", ()),
        key=getattr(args, "key", None),
    )


def planned_block(
    args: argparse.Namespace, block: TrainingOptions | None, training: Training
) -> dict[str, Any]:
    """The ``training`` block ``plan --emit`` writes."""
    return training_request.planned_block(asked(args), block, training, args.path)


def model_request(
    args: argparse.Namespace,
    config_settings: Mapping[str, Any] = MappingProxyType({}),
    config_path: str | None = None,
) -> tuple[Architecture | None, Training]:
    """The model and settings the options ask for, over ``config_settings`` (the
    ``training`` block of the config at ``config_path``) over the defaults; a note on
    standard error for each deprecated option and each option that replaces the config's.

    Raises:
        UsageError: an option's value, or options that exclude each other.
        InvalidInput: the model file's problems.
    """
    for note in deprecation_notes(args):
        print(f"meshconf: note: {note}", file=sys.stderr)
    try:
        model, training, notes = requested_settings(asked(args), config_settings, config_path)
    except PlanError as error:
        raise UsageError(str(error)) from None
    except ConfigError as error:
        lines = [diagnostic.render() for diagnostic in error.diagnostics]
        raise InvalidInput(lines, to_stderr=True) from None
    for note in notes:
        print(f"meshconf: note: {note}", file=sys.stderr)
    return model, training


def _option_settings(given: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, str]]:
    """The settings the ``given`` options set, by name, and the words of each option.

    Raises:
        UsageError: as :func:`asked`.
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
    """Raises UsageError when ``text`` is not a number within the option's bounds."""
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
    return model, training, layout_estimate(model, training, config)


def unrunnable_degrees(
    args: argparse.Namespace, config: MeshConfig, located: Source
) -> list[Diagnostic]:
    """For ``validate``: the degrees of the config's layout (without a world size, those it
    writes) that the model options' model cannot run, placed at each degree; none without a
    model.

    Raises:
        UsageError, InvalidInput: as :func:`model_request`.
    """
    block = config.training
    settings = {} if block is None else block.estimate_settings()
    model, training = model_request(args, settings, located.name)
    if model is None:
        return []
    known = config.resolved_world_size is not None
    degrees = config.resolved_degrees if known else config.degrees.pinned
    problems = unrunnable(model, degrees, training, config.resolved_world_size)
    return runnable_diagnostics(located, problems)


def show_estimate(
    args: argparse.Namespace, config: MeshConfig, report: dict[str, Any]
) -> list[str]:
    """For ``show --model``: the estimate of the config's layout, added to ``report`` and
    returned as text lines (none without a model).

    Raises:
        UsageError, InvalidInput: as :func:`model_request`; UsageError for ``--explain``
            without a model.
        ConfigError: a degree of the layout that the model cannot run, at its key.
    """
    found = config_estimate(args, config)
    if found is None:
        if args.explain:
            raise UsageError(f"--explain needs {MODEL_OPTIONS_TEXT}")
        return []
    model, training, result = found
    problems = unrunnable(model, config.resolved_degrees, training, config.resolved_world_size)
    if problems:
        _, located = load_located(args.path, args.overrides, args.key, world_size=args.world_size)
        raise ConfigError(runnable_diagnostics(located, problems))
    report["estimate"] = estimate_json(model, result)
    lines = ["", settings_line(model, training), *memory_lines(result, training)]
    if args.explain:
        report["estimate"].update(explain_json(result, training))
        lines += explain_lines(result, training)
    return lines
