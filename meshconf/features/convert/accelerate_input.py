"""Hugging Face accelerate's parallelism settings, each kept with where it was written:
from what ``accelerate config`` writes (a YAML file: its ``parallelism_config`` block,
``num_processes``, ``num_machines``, ``distributed_type`` and ``fsdp_config.fsdp_version``),
or from a launch script or command line (``accelerate launch --parallelism_config_tp_size 2
...`` and the ``PARALLELISM_CONFIG_*`` variables it exports). What ``accelerate launch``
refuses, or would not hand the training script, is refused at the option responsible.
"""

from __future__ import annotations

from collections.abc import Mapping

from meshconf.core.errors import describe_value
from meshconf.features.convert.arguments import (
    PYTHON_SCRIPT,
    YAML_SUFFIXES,
    Setting,
    located,
    nothing_found,
    settings_from_words,
    yaml_document,
)
from meshconf.features.convert.draft import ConversionError
from meshconf.features.convert.shell import commands
from meshconf.features.convert.shell_words import Word, source_error
from meshconf.trainers.accelerate_mesh import LAUNCH_ENVIRONMENT, SIZE_DEGREES, SP_SIZE

#: The settings read, by the name the parallelism block, the launcher's options and the
#: environment share (``parallelism_config_`` or ``PARALLELISM_CONFIG_`` before it).
PARALLELISM = (*SIZE_DEGREES, SP_SIZE, "cp_comm_strategy", "cp_backend", "sp_backend")
LAUNCH = ("num_processes", "num_machines", "distributed_type", "fsdp_version", "use_fsdp")
_PREFIX = "parallelism_config_"
#: The config's integers, which accelerate uses as YAML types them.
_INTEGERS = ("num_processes", "num_machines")
_CONFIG_FILE = "config_file"


def read_accelerate(text: str, suffix: str) -> dict[str, Setting]:
    """The settings of a YAML or JSON file as ``accelerate config`` writes it (``suffix``
    ``.yaml``, ``.yml`` or ``.json``), or of a launch script or command line.

    Raises:
        ConversionError: the file cannot be read, has nothing of accelerate's in it, an
            option lacks its value, or the launch line is one ``accelerate launch`` refuses.
    """
    if suffix.lower() in YAML_SUFFIXES:
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
    return isinstance(data, Mapping) and any(key in data for key in _CONFIG_KEYS)


def recognises_accelerate(text: str, suffix: str) -> bool:
    """Whether the text holds accelerate's settings: the YAML ``accelerate config`` writes
    (``suffix`` ``.yaml``, ``.yml`` or ``.json``), or a script or command line with an
    ``accelerate launch`` line."""
    try:
        if suffix.lower() in YAML_SUFFIXES:
            return _is_accelerate_config(yaml_document(text).data)
        return any(_is_launch(line) for line in commands(text))
    except ConversionError:
        return False


_NOTHING_FOUND = (
    "accelerate config or launch line",
    "the YAML `accelerate config` writes (num_processes, distributed_type, parallelism_config, "
    "...) or a script or command line that runs `accelerate launch`",
)


def _read_config_file(text: str) -> dict[str, Setting]:
    document = yaml_document(text, "accelerate's config")
    data = document.data
    if not _is_accelerate_config(data):
        raise nothing_found(*_NOTHING_FOUND)
    found: dict[str, Setting] = {}

    def take(path: tuple[str, ...], name: str, value: object) -> None:
        if name in _INTEGERS and isinstance(value, str):
            raise source_error(
                ".".join(path),
                f"expected an integer, got the string {value!r}: accelerate converts none of "
                "its config's values (ClusterConfig in accelerate/commands/config/"
                "config_args.py), so its launcher would compare a string with numbers; "
                "write it without quotes",
                located(document, path),
            )
        found[name] = Setting(name, ".".join(path), value, located(document, path))

    for key in LAUNCH:
        if key in data:
            take((key,), key, data[key])
    for table in ("fsdp_config", "parallelism_config"):
        if data.get(table) is not None and not isinstance(data[table], Mapping):
            raise source_error(
                table,
                f"expected a mapping, got {describe_value(data[table])}",
                located(document, (table,)),
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
        raise nothing_found(*_NOTHING_FOUND)
    at = 0 if index is None else index
    launch, environment = lines[at], environments[at]
    launcher = settings_from_words(
        _launcher_words(launch),
        (*PARALLELISM, *LAUNCH, _CONFIG_FILE),
        ("use_fsdp", _USE_PARALLELISM_CONFIG),
        tool="accelerate launch",
        name_of=lambda flag: flag[2:].removeprefix(_PREFIX),
    )
    if _CONFIG_FILE in launcher:
        _config_file(launcher[_CONFIG_FILE])
    if index is None and not launcher:
        raise nothing_found(*_NOTHING_FOUND)
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
    version = launcher.get("fsdp_version")
    if "use_fsdp" in launcher and version is not None and str(version.value).strip() == "2":
        return
    raise source_error(
        switch.key,
        "accelerate launch refuses it without --use_fsdp and --fsdp_version 2 on the same "
        'line ("You cannot use `--use_parallelism_config` without `--use_fsdp` and '
        '`--fsdp_version=2`", accelerate/commands/launch.py, _validate_launch_command): add '
        "--use_fsdp --fsdp_version 2, or leave --use_parallelism_config out",
        switch.position,
    )


def _not_applied(setting: Setting) -> None:
    variable = f"{_PREFIX}{setting.name}".upper()
    raise source_error(
        setting.key,
        f"accelerate launch hands the script no {variable} without --use_parallelism_config "
        f"({_LAUNCH_CODE}), so this setting is never applied; add --use_parallelism_config "
        f"(with --use_fsdp --fsdp_version 2), or set {variable} in the launch's environment",
        setting.position,
    )


def _config_file(setting: Setting) -> None:
    """``--config_file PATH``: accelerate fills what the line leaves out from that file, by
    rules of its own (a paradigm from ``distributed_type`` only when the line names none,
    ``--use_parallelism_config`` from a non-empty ``parallelism_config``, a block's keys only
    where the line did not give them), which meshconf does not reproduce.

    Raises:
        ConversionError: always.
    """
    raise source_error(
        setting.key,
        f"accelerate launch fills in what this line leaves out from {setting.value} "
        "(accelerate/commands/launch.py, _validate_launch_command), which meshconf does not "
        f"merge: convert that file itself (`meshconf convert --from accelerate "
        f"{setting.value}`), with this line's settings written in it",
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
        if PYTHON_SCRIPT.fullmatch(word.text) or word.text in ("-m", "--module"):
            break
        words.append(word)
    return words
