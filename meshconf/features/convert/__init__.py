"""Convert another tool's parallelism settings into a meshconf config: torchtitan's
``[parallelism]`` table (torchtitan 0.2.1's ``Parallelism``), KempnerForge's
``[distributed]`` table, or Megatron-LM's arguments.

The conversion is pure: the settings as read go in; the meshconf mapping, short comments on
changed values, and one note per semantic difference come out. The mapping is validated with
:func:`~meshconf.sources.loading.load_config`, and each problem meshconf finds is placed on
the source key it came from. Reading the input and printing the YAML are left to
``meshconf convert`` (``cli/convert.py``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from meshconf.core.degrees import DEGREE_NAMES
from meshconf.core.errors import describe_value
from meshconf.features.convert.common import (
    DEFAULT_DEGREES,
    Conversion,
    ConversionError,
    Draft,
    SourceProblem,
    validate,
    world_size_note,
)
from meshconf.features.convert.kempnerforge import from_kempnerforge
from meshconf.features.convert.megatron import MEGATRON, convert_megatron
from meshconf.features.convert.torchtitan import from_torchtitan

TORCHTITAN = "torchtitan"
KEMPNERFORGE = "kempnerforge"
#: The sources read from a TOML table.
TOML_SOURCES = (TORCHTITAN, KEMPNERFORGE)
SOURCES = (*TOML_SOURCES, MEGATRON)
#: The TOML table each tool keeps its parallelism settings in.
TABLES = {TORCHTITAN: "parallelism", KEMPNERFORGE: "distributed"}
#: How the notes name each tool.
TOOL_NAMES = {TORCHTITAN: "torchtitan", KEMPNERFORGE: "KempnerForge", MEGATRON: "Megatron-LM"}

__all__ = [
    "KEMPNERFORGE",
    "MEGATRON",
    "SOURCES",
    "TABLES",
    "TOML_SOURCES",
    "TOOL_NAMES",
    "TORCHTITAN",
    "Conversion",
    "ConversionError",
    "SourceProblem",
    "convert",
    "convert_megatron",
]


def convert(
    source: str,
    table: Any,
    *,
    world_size: int | None = None,
    gpus_per_node: int | None = None,
) -> Conversion:
    """Convert ``table``, a TOML source's table as read (``None`` when the file has none,
    which means the tool's defaults), into a validated meshconf config.

    Raises :class:`ConversionError` with every problem, each placed on its TOML key.
    """
    draft = Draft(TABLES[source], world_size, gpus_per_node)
    if table is None:
        table = {}
        draft.notes.append(
            f"The file has no [{draft.table}] table: every setting is "
            f"{TOOL_NAMES[source]}'s default."
        )
    if not isinstance(table, Mapping):
        draft.fail(None, f"expected a table, got {describe_value(table)}")
        draft.check()
    draft.key_order = tuple(table)
    builders: dict[str, Callable[[Draft, Mapping[str, Any]], None]] = {
        TORCHTITAN: from_torchtitan,
        KEMPNERFORGE: from_kempnerforge,
    }
    builders[source](draft, table)
    config = validate(draft)
    notes = [world_size_note(TOOL_NAMES[source], draft, config), *draft.notes]
    degrees = DEFAULT_DEGREES | draft.degrees
    return Conversion(
        source=source,
        table=draft.table,
        data=draft.config_data({name: degrees[name] for name in DEGREE_NAMES}),
        comments=draft.comments,
        notes=tuple(notes),
    )
