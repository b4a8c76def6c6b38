"""Convert another tool's parallelism settings into a meshconf config: torchtitan's
``[parallelism]`` table (torchtitan 0.2.1's ``Parallelism``), KempnerForge's
``[distributed]`` table, Megatron-LM's arguments, or Hugging Face accelerate's config and
launch options.

The conversion is pure: the settings as read go in; the meshconf mapping, short comments on
changed values, and one note per semantic difference come out. The mapping is validated with
:func:`~meshconf.sources.loading.load_config`, and each problem meshconf finds is placed on
the source key it came from. Reading the input and printing the YAML are left to
``meshconf convert`` (``cli/convert.py``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from meshconf.core.errors import describe_value
from meshconf.features.convert.accelerate_input import read_accelerate, recognises_accelerate
from meshconf.features.convert.accelerate_layout import ACCELERATE, convert_accelerate
from meshconf.features.convert.arguments import YAML_SUFFIXES, yaml_document
from meshconf.features.convert.draft import (
    Conversion,
    ConversionError,
    Draft,
    SourceProblem,
    validate,
    world_size_note,
)
from meshconf.features.convert.kempnerforge import from_kempnerforge
from meshconf.features.convert.megatron_input import (
    read_command_line,
    read_nemo_yaml,
    recognises_megatron,
)
from meshconf.features.convert.megatron_layout import MEGATRON, convert_megatron
from meshconf.features.convert.torchtitan_toml import from_torchtitan

TORCHTITAN = "torchtitan"
KEMPNERFORGE = "kempnerforge"


@dataclass(frozen=True)
class Source:
    """A tool meshconf converts from: one row of :data:`SOURCES`, the table that
    ``meshconf convert`` reads for its ``--from`` choices, its detection, its reading, its
    dispatch and its help."""

    #: ``--from NAME``, and :attr:`Conversion.source`.
    name: str
    #: How the notes and the help name the tool.
    tool: str
    #: What is converted, for the help: "a job TOML ([parallelism])".
    reads: str
    #: The TOML table holding the tool's settings: a TOML file with it is this tool's.
    #: ``None``: not read from TOML (only ``--from`` names it).
    table: str | None
    #: From what was read (the table, or the settings of a non-TOML source) to a validated
    #: config; keyword arguments ``world_size`` and ``gpus_per_node``.
    convert: Callable[..., Conversion]
    #: A source not read from TOML: its settings from a file's text and suffix (``.yaml``),
    #: or from ``--args`` (suffix ``""``).
    read: Callable[[str, str], Mapping[str, Any]] | None = None
    #: A source not read from TOML: whether a file's text and suffix hold its settings, for
    #: ``meshconf convert`` without ``--from``.
    recognises: Callable[[str, str], bool] | None = None


def _toml_source(
    name: str,
    tool: str,
    reads: str,
    table: str,
    build: Callable[[Draft, Mapping[str, Any]], None],
) -> Source:
    def convert_table(
        settings: Any,
        *,
        world_size: int | None = None,
        gpus_per_node: int | None = None,
        document: Mapping[str, Any] | None = None,
    ) -> Conversion:
        draft = Draft(table, world_size, gpus_per_node, document=document)
        if settings is None:
            settings = {}
            draft.notes.append(
                f"The file has no [{table}] table: every setting is {tool}'s default."
            )
        if not isinstance(settings, Mapping):
            draft.fail(None, f"expected a table, got {describe_value(settings)}")
            draft.check()
        draft.key_order = tuple(settings)
        build(draft, settings)
        config = validate(draft)
        return draft.conversion(name, [world_size_note(tool, draft, config), *draft.notes])

    return Source(name, tool, reads, table, convert_table)


SOURCES: tuple[Source, ...] = (
    _toml_source(
        TORCHTITAN,
        "torchtitan",
        "a torchtitan job TOML ([parallelism])",
        "parallelism",
        from_torchtitan,
    ),
    _toml_source(
        KEMPNERFORGE,
        "KempnerForge",
        "a KempnerForge TOML ([distributed])",
        "distributed",
        from_kempnerforge,
    ),
    Source(
        MEGATRON,
        "Megatron-LM",
        "Megatron-LM's arguments (a launch script, a command line, or NeMo's YAML)",
        None,
        convert_megatron,
        lambda text, suffix: (
            read_nemo_yaml(text) if suffix.lower() in (".yaml", ".yml") else read_command_line(text)
        ),
        recognises_megatron,
    ),
    Source(
        ACCELERATE,
        "accelerate",
        "Hugging Face accelerate's settings (the YAML `accelerate config` writes, or an "
        "`accelerate launch` line and the PARALLELISM_CONFIG_ variables it sets)",
        None,
        convert_accelerate,
        read_accelerate,
        recognises_accelerate,
    ),
)
BY_NAME: Mapping[str, Source] = {source.name: source for source in SOURCES}
#: The sources read from a TOML table, which a file's tables tell apart.
TOML_SOURCES = tuple(source for source in SOURCES if source.table is not None)


def recognise(text: str, suffix: str, document: Mapping[str, Any] | None) -> list[Source]:
    """The sources whose settings a file holds: those whose TOML table ``document`` (the
    file read as TOML, or None when it is not TOML) has, or, when it is not TOML, those that
    recognise its text."""
    if document is not None:
        return [source for source in TOML_SOURCES if source.table in document]
    if _meshconf_config(text, suffix):
        return []  # its keys (order, ...) are no other tool's settings
    return [
        source
        for source in SOURCES
        if source.recognises is not None and source.recognises(text, suffix)
    ]


def _meshconf_config(text: str, suffix: str) -> bool:
    """Whether a YAML file (``suffix`` ``.yaml``, ``.yml`` or ``.json``) is a meshconf
    config."""
    if suffix.lower() not in YAML_SUFFIXES:
        return False
    try:
        data = yaml_document(text).data
    except ConversionError:
        return False
    return isinstance(data, Mapping) and "degrees" in data


def looks_like(text: str, suffix: str) -> str:
    """What a file no source recognises seems to be, for the message that asks for
    ``--from``."""
    if suffix.lower() in YAML_SUFFIXES:
        if _meshconf_config(text, suffix):
            return (
                "a meshconf config already (`meshconf validate` checks it; `--to megatron` "
                "writes it as Megatron-LM's arguments)"
            )
        return "YAML with neither accelerate's config keys nor NeMo's parallelism settings"
    return (
        "a script or text with no `accelerate launch` line, no torchrun or Megatron-LM "
        "training script line, and no [parallelism] or [distributed] TOML table"
    )


__all__ = [
    "ACCELERATE",
    "BY_NAME",
    "KEMPNERFORGE",
    "MEGATRON",
    "SOURCES",
    "TOML_SOURCES",
    "TORCHTITAN",
    "Conversion",
    "ConversionError",
    "Source",
    "SourceProblem",
    "convert_megatron",
    "looks_like",
    "recognise",
]
