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

from meshconf.core.degrees import AUTO, DEGREE_NAMES, MAX_WORLD_SIZE
from meshconf.core.errors import describe_value
from meshconf.features.convert.arguments import (
    Setting,
    integer_setting,
    settings_from_words,
    yaml_document,
)
from meshconf.features.convert.draft import (
    DEFAULT_DEGREES,
    Conversion,
    ConversionError,
    Draft,
    validate,
    world_size_note,
)
from meshconf.features.convert.shell import Word, commands, source_error
from meshconf.trainers.accelerate_mesh import (
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
        ConversionError: the file cannot be read, has nothing of accelerate's in it, an
            option lacks its value, or the launch line is one ``accelerate launch`` refuses.
    """
    if suffix.lower() in (".yaml", ".yml", ".json"):
        return _read_config_file(text)
    return _read_launch(text)


#: Keys of the file ``accelerate config`` writes, any one of which makes a mapping its config.
_CONFIG_KEYS = (
    *LAUNCH,
    "compute_environment",
    "fsdp_config",
    "parallelism_config",
    "deepspeed_config",
    "machine_rank",
    "main_training_function",
    "mixed_precision",
    "use_cpu",
    "gpu_ids",
)


def _is_accelerate_config(data: object) -> bool:
    """Whether YAML data is a config ``accelerate config`` writes: a mapping with one of its
    keys."""
    return isinstance(data, Mapping) and any(key in data for key in _CONFIG_KEYS)


def recognises_accelerate(text: str, suffix: str) -> bool:
    """Whether the text holds accelerate's settings: the YAML ``accelerate config`` writes
    (``suffix`` ``.yaml``, ``.yml`` or ``.json``), or a script or command line with an
    ``accelerate launch`` line."""
    try:
        if suffix.lower() in (".yaml", ".yml", ".json"):
            return _is_accelerate_config(yaml_document(text).data)
        return any(_is_launch(line) for line in commands(text))
    except ConversionError:
        return False


def _nothing_found() -> ConversionError:
    return source_error(
        None,
        "no accelerate config or launch line found: expected the YAML `accelerate config` "
        "writes (num_processes, distributed_type, parallelism_config, ...) or a script or "
        "command line that runs `accelerate launch`",
        None,
    )


def _read_config_file(text: str) -> dict[str, Setting]:
    document = yaml_document(text)
    data = document.data
    if not isinstance(data, Mapping):
        raise source_error(
            None,
            f"expected accelerate's config, a mapping, got {describe_value(data)}",
            (1, 1),
        )
    if not _is_accelerate_config(data):
        raise _nothing_found()
    found: dict[str, Setting] = {}

    def position(path: tuple[str, ...]) -> tuple[int, int] | None:
        at = document.positions.get(path)
        return None if at is None else (at.line, at.column)

    def take(path: tuple[str, ...], name: str, value: object) -> None:
        found[name] = Setting(name, ".".join(path), value, position(path))

    for key in LAUNCH:
        if key in data:
            take((key,), key, data[key])
    for table in ("fsdp_config", "parallelism_config"):
        if data.get(table) is not None and not isinstance(data[table], Mapping):
            raise source_error(
                table, f"expected a mapping, got {describe_value(data[table])}", position((table,))
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
    launch command is started with; a single command that is not a launch line is read whole.

    Without ``--use_parallelism_config`` the launcher hands the script none of its
    ``--parallelism_config_*`` sizes, and with it, it sets every ``PARALLELISM_CONFIG_*``
    from its options, replacing the environment's (``prepare_multi_gpu_env`` and
    ``prepare_extend_env_parallelism_config`` in accelerate's ``utils/launch.py``): a size
    that would not reach the script is refused where it was written.
    """
    environments: list[list[Word]] = []
    lines = list(commands(text, environments=environments))
    index = next((i for i, line in enumerate(lines) if _is_launch(line)), None)
    if index is None and len(lines) != 1:
        raise _nothing_found()
    at = 0 if index is None else index
    launch, environment = lines[at], environments[at]
    launcher = settings_from_words(
        _launcher_words(launch),
        (*PARALLELISM, *LAUNCH),
        ("use_fsdp", _USE_PARALLELISM_CONFIG),
        tool="accelerate launch",
        name_of=lambda flag: flag[2:].removeprefix(_PREFIX),
    )
    if index is None and not launcher:
        raise _nothing_found()
    found: dict[str, Setting] = {}
    for word in environment:
        variable, _, value = word.text.partition("=")
        name = LAUNCH_ENVIRONMENT.get(variable, "")
        if variable.startswith(_PREFIX.upper()):
            name = variable[len(_PREFIX) :].lower()
        if name in PARALLELISM or name in LAUNCH_ENVIRONMENT.values():
            column = word.column + len(variable) + 1
            found[name] = Setting(name, variable, value, (word.line, column))
    switch = launcher.pop(_USE_PARALLELISM_CONFIG, None)
    if switch is not None:
        _check_parallelism_switch(switch, launcher)
        # the launcher sets each size from its options, 1 where none is given
        for name in PARALLELISM:
            if name in found and name not in launcher:
                _replaced(found[name])
    else:
        for name in PARALLELISM:
            if name in launcher:
                _not_applied(launcher[name])
    found.update(launcher)
    return found


_USE_PARALLELISM_CONFIG = "use_parallelism_config"
#: Where accelerate's launcher decides what the script's environment holds.
_LAUNCH_CODE = "accelerate/utils/launch.py, prepare_multi_gpu_env"


def _check_parallelism_switch(switch: Setting, launcher: Mapping[str, Setting]) -> None:
    """``--use_parallelism_config`` as ``accelerate launch`` checks it before it starts.

    Raises:
        ConversionError: the line lacks ``--use_fsdp`` or ``--fsdp_version 2``.
    """
    if "use_fsdp" in launcher and str(_value(launcher, "fsdp_version")).strip() == "2":
        return
    raise source_error(
        switch.key,
        "accelerate launch refuses it without --use_fsdp and --fsdp_version 2 on the same "
        'line ("You cannot use `--use_parallelism_config` without `--use_fsdp` and '
        '`--fsdp_version=2`", accelerate/commands/launch.py, _validate_launch_command): add '
        "--use_fsdp --fsdp_version 2, or leave --use_parallelism_config out",
        switch.position,
    )


def _value(settings: Mapping[str, Setting], name: str) -> object:
    setting = settings.get(name)
    return None if setting is None else setting.value


def _not_applied(setting: Setting) -> None:
    variable = f"{_PREFIX}{setting.name}".upper()
    raise source_error(
        setting.key,
        f"accelerate launch hands the script no {variable} without --use_parallelism_config "
        f"({_LAUNCH_CODE}), so this setting is never applied; add --use_parallelism_config "
        f"(with --use_fsdp --fsdp_version 2), or set {variable} in the launch's environment",
        setting.position,
    )


def _replaced(setting: Setting) -> None:
    option = f"--{_PREFIX}{setting.name}"
    raise source_error(
        setting.key,
        f"is replaced by {option}'s value (its default when not given): with "
        f"--use_parallelism_config accelerate launch sets every PARALLELISM_CONFIG_ size from "
        f"its options ({_LAUNCH_CODE}); give it as {option} {setting.value}",
        setting.position,
    )


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
    written = " * ".join(f"{name} {sizes[name]}" for name in SIZE_DEGREES)
    if total > MAX_WORLD_SIZE:
        _past_the_bound(draft, sizes, keys, f"{total} ({written})")
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


def _past_the_bound(
    draft: Draft, sizes: Mapping[str, int], keys: Mapping[str, str], product_written: str
) -> None:
    """Sizes whose product (``product_written``, the product and its factors) is more ranks
    than torch numbers: reported at the size that takes the product past the bound, in
    accelerate's order.

    Raises:
        ConversionError: always.
    """
    product = 1
    for name in SIZE_DEGREES:
        product *= sizes[name]
        if product > MAX_WORLD_SIZE:
            draft.fail(
                keys[name],
                f"the parallelism sizes multiply to {product_written}, more ranks than torch "
                f"can number ({MAX_WORLD_SIZE})",
            )
            break
    draft.check()


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
        elif draft.gpus_per_node not in (None, processes // machines):
            draft.fail(
                keys["num_machines"],
                f"runs {processes // machines} processes on each machine (num_processes "
                f"{processes} / num_machines {machines}), but --gpus-per-node is "
                f"{draft.gpus_per_node}; give one of them",
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
