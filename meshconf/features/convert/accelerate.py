"""Hugging Face accelerate's parallelism settings as a meshconf config whose groups are the
ones accelerate builds.

Read from what ``accelerate config`` writes (a YAML file: its ``parallelism_config`` block,
``num_processes``, ``num_machines``, ``distributed_type`` and ``fsdp_config.fsdp_version``),
or from a launch script or command line (``accelerate launch --parallelism_config_tp_size 2
...`` and the ``PARALLELISM_CONFIG_*`` variables it exports). accelerate lays its dims out
as meshconf's default order does (dp_replicate, dp_shard, cp, tp, outer to inner), so the
degrees carry over as they are; what accelerate refuses when it starts is refused here, at
the setting responsible.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from math import prod

from meshconf.core.degrees import AUTO, DEGREE_NAMES
from meshconf.core.errors import describe_value
from meshconf.features.convert.arguments import (
    Setting,
    integer_setting,
    settings_from_words,
    yaml_document,
)
from meshconf.features.convert.common import (
    DEFAULT_DEGREES,
    Conversion,
    Draft,
    validate,
    world_size_note,
)
from meshconf.features.convert.shell import Word, commands, source_error
from meshconf.trainers.accelerate import (
    LAUNCH_ENVIRONMENT,
    SIZE_DEGREES,
    SP_SIZE,
    Launch,
    refusals,
    sp_size_problem,
    uses_fsdp,
    uses_fsdp2,
)

ACCELERATE = "accelerate"
#: The settings read, by the name the parallelism block, the launcher's options and the
#: environment share (``parallelism_config_`` or ``PARALLELISM_CONFIG_`` before it).
PARALLELISM = (*SIZE_DEGREES, SP_SIZE, "cp_comm_strategy", "cp_backend", "sp_backend")
LAUNCH = ("num_processes", "num_machines", "distributed_type", "fsdp_version", "use_fsdp")
_PREFIX = "parallelism_config_"
_SCRIPT = re.compile(r".*\.py$")


def read_accelerate(text: str, suffix: str) -> dict[str, Setting]:
    """The settings of a YAML or JSON file as ``accelerate config`` writes it (``suffix``
    ``.yaml``, ``.yml`` or ``.json``), or of a launch script or command line.

    Raises:
        ConversionError: the file cannot be read, or an option lacks its value.
    """
    if suffix.lower() in (".yaml", ".yml", ".json"):
        return _read_config_file(text)
    return _read_launch(text)


def _read_config_file(text: str) -> dict[str, Setting]:
    document = yaml_document(text)
    data = document.data
    if not isinstance(data, Mapping):
        raise source_error(
            None, f"expected accelerate's config, a mapping, got {describe_value(data)}", None
        )
    found: dict[str, Setting] = {}

    def take(path: tuple[str, ...], name: str, value: object) -> None:
        at = document.positions.get(path)
        position = None if at is None else (at.line, at.column)
        found[name] = Setting(name, ".".join(path), value, position)

    for key in LAUNCH:
        if key in data:
            take((key,), key, data[key])
    for table in ("fsdp_config", "parallelism_config"):
        if data.get(table) is not None and not isinstance(data[table], Mapping):
            at = document.positions.get((table,))
            position = None if at is None else (at.line, at.column)
            raise source_error(
                table, f"expected a mapping, got {describe_value(data[table])}", position
            )
    fsdp = data.get("fsdp_config") or {}
    if "fsdp_version" in fsdp:
        take(("fsdp_config", "fsdp_version"), "fsdp_version", fsdp["fsdp_version"])
    for key, value in (data.get("parallelism_config") or {}).items():
        name = str(key).removeprefix(_PREFIX)
        if name in PARALLELISM:
            take(("parallelism_config", str(key)), name, value)
    return found


def _read_launch(text: str) -> dict[str, Setting]:
    """``accelerate launch``'s options before the training script, and the environment the
    script sets; a command line without a launch line is read whole."""
    assigned: list[Word] = []
    lines = list(commands(text, assigned))
    launch = next((line for line in lines if _is_launch(line)), None)
    if launch is None:
        launch = lines[0] if len(lines) == 1 else []
    found: dict[str, Setting] = {}
    for word in assigned:
        variable, _, value = word.text.partition("=")
        name = LAUNCH_ENVIRONMENT.get(variable, "")
        if variable.startswith(_PREFIX.upper()):
            name = variable[len(_PREFIX) :].lower()
        if name in PARALLELISM or name in LAUNCH_ENVIRONMENT.values():
            column = word.column + len(variable) + 1
            found[name] = Setting(name, variable, value, (word.line, column))
    found.update(
        settings_from_words(
            _launcher_words(launch),
            (*PARALLELISM, *LAUNCH),
            ("use_fsdp",),
            tool="accelerate launch",
            name_of=lambda flag: flag[2:].removeprefix(_PREFIX),
        )
    )
    return found


def _is_launch(line: list[Word]) -> bool:
    texts = [word.text for word in line]
    return any(
        text.endswith("accelerate") and texts[index + 1 : index + 2] == ["launch"]
        for index, text in enumerate(texts)
    )


def _launcher_words(line: list[Word]) -> list[Word]:
    """The words between ``launch`` and the training script (or ``-m``)."""
    texts = [word.text for word in line]
    start = texts.index("launch") + 1 if "launch" in texts else 0
    words = []
    for word in line[start:]:
        if _SCRIPT.fullmatch(word.text) or word.text in ("-m", "--module"):
            break
        words.append(word)
    return words


def _values(settings: Mapping[str, Setting]) -> dict[str, object]:
    return {name: setting.value for name, setting in settings.items()}


def convert_accelerate(
    settings: Mapping[str, Setting],
    *,
    world_size: int | None = None,
    gpus_per_node: int | None = None,
) -> Conversion:
    """Convert accelerate's settings (from :func:`read_accelerate`) into a validated meshconf
    config whose groups are accelerate's.

    Raises :class:`ConversionError` with every problem, each at the setting it concerns.
    """
    draft = Draft("", world_size, gpus_per_node)
    draft.positions = {s.key: s.position for s in settings.values() if s.position is not None}
    keys = {name: setting.key for name, setting in settings.items()}
    sizes = {name: 1 for name in (*SIZE_DEGREES, SP_SIZE)}
    for name in sizes:
        if name in settings:
            value = integer_setting(draft, settings[name])
            if value is not None:
                sizes[name] = value
    problem = sp_size_problem(sizes[SP_SIZE])
    if problem is not None:
        draft.fail(keys[SP_SIZE], problem)
    processes = _world(draft, settings, keys)
    draft.check()
    degrees = {SIZE_DEGREES[name]: sizes[name] for name in SIZE_DEGREES}
    total = prod(degrees.values())
    if total == 1 and (processes is None or processes > 1):
        # Without a parallelism config accelerate's FSDP shards over every process; with one
        # of sizes 1 it replicates. Without num_processes, the -1 is every process.
        sized = any(name in settings for name in (*SIZE_DEGREES, SP_SIZE))
        every = AUTO if processes is None else processes
        if uses_fsdp(_values(settings)) and not sized:
            degrees["dp_shard"] = every
            draft.comments["degrees.dp_shard"] = "accelerate's FSDP shards over every process"
        else:
            degrees["dp_replicate"] = every
            draft.comments["degrees.dp_replicate"] = "accelerate replicates over every process"
    elif processes is not None and total != processes:
        written = " * ".join(f"{name} {sizes[name]}" for name in SIZE_DEGREES)
        draft.fail(
            keys.get("num_processes"),
            f"is {processes}, but the parallelism sizes multiply to {total} ({written}); "
            "accelerate refuses a ParallelismConfig whose total_size is not num_processes",
        )
    _refusals(draft, settings, keys, degrees)
    draft.check()
    draft.degrees = degrees
    draft.origins.update(
        {("degrees", degree): keys[name] for name, degree in SIZE_DEGREES.items() if name in keys}
    )
    config = validate(draft)
    world_note = (
        world_size_note("accelerate", draft, config, "the settings")
        if processes is None
        else f"world_size is num_processes, {processes}; at start-up meshconf checks that the "
        "launcher's world size agrees."
    )
    notes = [world_note, *_notes(settings, degrees)]
    all_degrees = DEFAULT_DEGREES | draft.degrees
    return Conversion(
        source=ACCELERATE,
        table="",
        data=draft.config_data({name: all_degrees[name] for name in DEGREE_NAMES}),
        comments=draft.comments,
        notes=tuple(notes),
    )


def _world(draft: Draft, settings: Mapping[str, Setting], keys: Mapping[str, str]) -> int | None:
    """num_processes as the world size, num_processes / num_machines as the node size."""
    processes = machines = None
    if "num_processes" in settings:
        processes = integer_setting(draft, settings["num_processes"])
    if "num_machines" in settings:
        machines = integer_setting(draft, settings["num_machines"])
    if processes is None:
        return None
    if draft.world_size is not None and draft.world_size != processes:
        draft.fail(
            keys["num_processes"],
            f"is {processes}, but --world-size is {draft.world_size}; give one of them",
        )
        return None
    draft.world_size = processes
    draft.origins[("world_size",)] = keys["num_processes"]
    if machines is not None:
        if processes % machines:
            draft.fail(
                keys["num_machines"],
                f"{machines} machines cannot share {processes} processes evenly; accelerate "
                "runs num_processes / num_machines on each",
            )
        elif draft.gpus_per_node is None:
            draft.gpus_per_node = processes // machines
            draft.origins[("gpus_per_node",)] = keys["num_machines"]
            draft.comments["gpus_per_node"] = "num_processes / num_machines"
    return processes


def _refusals(
    draft: Draft,
    settings: Mapping[str, Setting],
    keys: Mapping[str, str],
    degrees: Mapping[str, int],
) -> None:
    """What accelerate refuses when it starts, at the size responsible, or where FSDP2 was
    turned on when that size was not written."""
    launch = Launch(degrees, abs(prod(degrees.values())), uses_fsdp2(_values(settings)))
    for degree, message in refusals(launch, lambda name: f"{name}_size"):
        draft.fail(keys.get(f"{degree}_size", keys.get("fsdp_version")), message)


def _notes(settings: Mapping[str, Setting], degrees: Mapping[str, int]) -> list[str]:
    notes = []
    if uses_fsdp2(_values(settings)):
        notes.append(
            "FSDP2 shards over accelerate's dp_shard_cp, dp_shard * cp: meshconf's fsdp in the "
            "dense domain (`meshconf.compat.accelerate.parallelism_config` hands accelerate "
            "that group)."
        )
    strategy = settings.get("cp_comm_strategy")
    if strategy is not None and degrees["cp"] > 1:
        notes.append(
            f"{strategy.key} {strategy.value}: how context parallelism exchanges keys and "
            "values, which is accelerate's setting, not the mesh's; keep it in accelerate's "
            "config."
        )
    return notes
