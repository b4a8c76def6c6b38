"""The model and training options declared: one for each row of
:data:`~meshconf.core.settings.TRAINING_SETTINGS`, and each deprecated Gb/s option. Apart
from the estimate that they ask for (``meshconf.cli.model_options``), so that ``validate``
declares them without loading the estimator."""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from meshconf.cli.common import one_of
from meshconf.core.setting_values import TrainingSetting
from meshconf.core.settings import TRAINING_SETTINGS
from meshconf.features.plan.estimate.step_inputs import Training


def _gbps_name(row: TrainingSetting) -> str:
    return row.gbps_option[2:].replace("-", "_")


#: The options that took bandwidths in Gb/s, by the GB/s setting that replaces each; they
#: still work, converted, with a note, until the next release.
DEPRECATED_GBPS: Mapping[str, str] = MappingProxyType(
    {_gbps_name(row): row.attribute for row in TRAINING_SETTINGS if row.gbps_option}
)
#: The option of each setting, by its destination, in the order ``plan --emit`` gives them.
MODEL_OPTIONS: Mapping[str, str] = MappingProxyType(
    {
        name: option
        for row in TRAINING_SETTINGS
        for name, option in (
            (row.attribute, row.option),
            *([(_gbps_name(row), row.gbps_option)] if row.gbps_option else []),
        )
    }
)
#: The estimate's settings where nothing else gives them, for the options' help: a GPU
#: figure's is the default GPU's.
_DEFAULTS = Training()
#: Switches: given, they are true.
FLAGS = tuple(row.attribute for row in TRAINING_SETTINGS if row.kind == "switch")


def _argument(row: TrainingSetting) -> dict[str, Any]:
    """What ``add_argument`` takes for a row: its help with the estimate's default, its
    choices (any case; a number's compared as text, as int() would take "٣" or "0_3" for 3),
    its switch or its placeholder."""
    default = getattr(_DEFAULTS, row.attribute, row.default)
    choices = ", ".join(str(choice) for choice in row.choices)
    settings: dict[str, Any] = {"help": row.help.format(default=default, choices=choices)}
    if row.choices:
        settings.update(one_of(str(choice) for choice in row.choices))
    if row.kind == "switch":
        settings.update(action="store_const", const=True)
    if row.metavar is not None:
        settings["metavar"] = row.metavar
    return settings


def add_model_options(parser: argparse.ArgumentParser) -> None:
    """An option for each training setting, and each deprecated Gb/s option after its
    GB/s one."""
    group = parser.add_argument_group("model (memory and step-time estimates: docs/plan.md)")
    for row in TRAINING_SETTINGS:
        group.add_argument(row.option, dest=row.attribute, **_argument(row))
        if row.gbps_option:
            group.add_argument(
                row.gbps_option,
                dest=_gbps_name(row),
                metavar="GBPS",
                help=f"deprecated: {row.option} in Gb/s",
            )
