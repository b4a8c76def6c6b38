"""Megatron-LM's parallelism settings, read from a command line, from the launch line of a
shell script, or from a YAML file as NeMo writes them; each setting keeps where it was
written, so that a problem with it is reported at its line and column.

Shell scripts are read, not run (:mod:`.shell` says what it expands, and within which
bounds): assignments are expanded where later lines use them; anything that only running
the script would give (the environment, command output, positional parameters) stays as
written, and a setting that needs it is reported with what it is.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from meshconf.core.setting_values import UNSET
from meshconf.core.settings import SETTINGS, TRAINING_SETTINGS as TRAINING_ROWS
from meshconf.features.convert.arguments import (
    PYTHON_SCRIPT,
    Setting,
    destination,
    located,
    nothing_found,
    option,
    settings_from_words,
    yaml_document,
)
from meshconf.features.convert.draft import ConversionError
from meshconf.features.convert.shell import commands as shell_commands
from meshconf.features.convert.shell_words import Word, source_error

#: Megatron's arguments that set a mesh size, by their name with ``_`` for ``-``, and the
#: meshconf degree of each.
SIZE_DEGREES = {
    "tensor_model_parallel_size": "tp",
    "pipeline_model_parallel_size": "pp",
    "context_parallel_size": "cp",
    "expert_model_parallel_size": "ep",
    "expert_tensor_parallel_size": "etp",
    "num_distributed_optimizer_instances": "dp_replicate",
}


def _names(key: str) -> tuple[str, ...]:
    """Megatron's names of the argument that gives the training setting ``key``."""
    spelling = SETTINGS[key].megatron
    assert spelling is not None, f"{key} has a Megatron-LM argument"
    return tuple(destination(name) for name in spelling.names)


#: The training settings that Megatron's arguments give as a switch, by its name: present, it
#: gives the setting's value of :attr:`~meshconf.core.settings.Spelling.on`.
SWITCHED = {
    destination(row.megatron.name): row
    for row in TRAINING_ROWS
    if row.megatron is not None and row.megatron.on is not None
}
#: Megatron's arguments that are one training setting's integer itself, and the setting's
#: key. The model chunks per rank and their groups of micro-batches, which imply the
#: interleaved schedule, are read apart.
TRAINING_SETTINGS = {
    destination(row.megatron.name): row.key
    for row in TRAINING_ROWS
    if row.kind == "integer"
    and row.megatron is not None
    and row.megatron.on is None
    and not row.megatron.beside
    and not row.megatron.aliases
}
#: The interleaved schedule's model chunks per rank, as NeMo and Megatron-LM give them: the
#: count itself, or the layers of each chunk, from which Megatron-LM's arguments derive it
#: over the model's layers.
VIRTUAL_STAGE_SETTINGS = _names("virtual_stages")[::-1]
LAYERS_PER_VIRTUAL_STAGE = "num_layers_per_virtual_pipeline_stage"
#: The micro-batches each model chunk runs before the next, as Megatron-LM's command line and
#: Megatron-Core's config name them.
GROUP_SETTINGS = _names("microbatch_group")
NUM_LAYERS = "num_layers"
#: Megatron's activation recomputation: which tensors (``full`` or ``selective``), and for
#: ``full`` how layers are grouped (``uniform``) or which are recomputed (``block``).
RECOMPUTE_SETTINGS = (
    *_names("activation_checkpointing"),
    destination(SETTINGS["checkpoint_group"].megatron.beside[0]),  # type: ignore[union-attr]
    *_names("checkpoint_group"),
)
#: Megatron's modules recomputed under ``selective`` granularity, any number of names
#: (Megatron-LM's ``--recompute-modules``, argparse's ``nargs='*'``; ``core_attn`` when not
#: given).
RECOMPUTE_MODULES = "recompute_modules"
#: The modules whose recomputation is DeepSeek-V3's, meshconf's ``norms-latent-swiglu``: the
#: norms, latent attention's up-projections and the experts' SwiGLU (Megatron-Core's
#: ``TransformerConfig.recompute_modules``).
NORMS_LATENT_SWIGLU_MODULES = ("layernorm", "mla_up_proj", "moe_act")
#: Megatron-LM's switch that splits the norms' and dropouts' activations over tp.
(SEQUENCE_PARALLEL_SWITCH,) = _names("sequence_parallel")
#: Megatron-LM's dtypes of AdamW's two moments (its precision-aware optimizer).
MOMENT_DTYPE_SETTINGS = _names("optimizer_dtype")
#: Megatron-LM's switch that runs the experts' all-to-all under another micro-batch's compute.
(EP_OVERLAP_SWITCH,) = _names("ep_overlap")
#: Megatron-LM's switch for ``--recompute-granularity selective``, which it overrides.
RECOMPUTE_SWITCH = "recompute_activations"
#: Megatron's switches that count the embedding or the loss as a layer of the pipeline split,
#: and the key of the ``training`` block each one sets to 1: the integers switched on that
#: Megatron has no value of its own for.
SPLIT_WEIGHT_SETTINGS = {
    name: row.key
    for name, row in SWITCHED.items()
    if row.kind == "integer" and row.megatron is not None and row.megatron.default is UNSET
}
#: Switches: present means true.
FLAG_SETTINGS = ("use_tp_pp_dp_mapping", *SWITCHED, RECOMPUTE_SWITCH)
#: torchrun's options that give the world size.
LAUNCH_SETTINGS = ("nproc_per_node", "nnodes")
#: NeMo's trainer keys that give the world size.
NEMO_WORLD: dict[tuple[str | int, ...], str] = {
    ("trainer", "devices"): "nproc_per_node",
    ("trainer", "num_nodes"): "nnodes",
}

_VALUED = (
    *SIZE_DEGREES,
    *TRAINING_SETTINGS,
    *VIRTUAL_STAGE_SETTINGS,
    LAYERS_PER_VIRTUAL_STAGE,
    *GROUP_SETTINGS,
    NUM_LAYERS,
    *RECOMPUTE_SETTINGS,
    *MOMENT_DTYPE_SETTINGS,
    "order",  # Megatron-Core's initialize_model_parallel(order=...): tp-cp-ep-dp-pp
)
#: Options that take any number of values.
_LISTED = (RECOMPUTE_MODULES,)
_LAUNCHERS = re.compile(r"(.*/)?(torchrun|torch\.distributed\.(run|launch))$")
#: A Megatron-LM training script: ``pretrain_gpt.py``, ``pretrain_mamba.py``, ...
_MEGATRON_SCRIPT = re.compile(r"(.*/)?pretrain_[A-Za-z0-9_]+\.py$")
_COMMAND_LINE = (
    "Megatron-LM launch line or arguments",
    "a script or command line that runs torchrun or a Megatron-LM training script "
    "(pretrain_gpt.py, ...), or Megatron-LM's arguments (--tensor-model-parallel-size, ...)",
)


def _runs_megatron(word: Word) -> bool:
    return bool(_LAUNCHERS.fullmatch(word.text) or _MEGATRON_SCRIPT.fullmatch(word.text))


def read_command_line(text: str) -> dict[str, Setting]:
    """The settings of a shell script's launch line (``torchrun ... pretrain_gpt.py ...``)
    or of a command line: Megatron's arguments after the training script, torchrun's
    ``--nproc-per-node`` and ``--nnodes`` before it.

    Raises :class:`ConversionError` when the text has no launch line (only a script's
    does: a bare command line is all Megatron arguments) or an argument lacks its value.
    """
    commands = list(shell_commands(text))
    launch = next(
        (
            command
            for command in commands
            if any(
                _LAUNCHERS.fullmatch(word.text) or PYTHON_SCRIPT.fullmatch(word.text)
                for word in command
            )
        ),
        None,
    )
    if launch is None and len(commands) > 1:
        raise nothing_found(*_COMMAND_LINE)
    launch = launch or (commands[0] if commands else [])
    script = next((i for i, word in enumerate(launch) if PYTHON_SCRIPT.fullmatch(word.text)), -1)
    settings = settings_from_words(
        launch[script + 1 :], _VALUED, FLAG_SETTINGS, tool="Megatron-LM", listed=_LISTED
    )
    launcher = launch[: max(script, 0)]
    settings = {**settings_from_words(launcher, LAUNCH_SETTINGS, (), tool="torchrun"), **settings}
    if not settings and not any(_runs_megatron(word) for word in launch):
        raise nothing_found(*_COMMAND_LINE)
    return settings


def recognises_megatron(text: str, suffix: str) -> bool:
    """Whether the text holds Megatron-LM's settings: NeMo's YAML with one of its
    parallelism settings (``suffix`` ``.yaml`` or ``.yml``), or a script or command line
    that runs torchrun or a Megatron-LM training script, or gives one of its size arguments."""
    try:
        if suffix.lower() in (".yaml", ".yml"):
            return bool(read_nemo_yaml(text))  # refuses a file with none of them
        lines = list(shell_commands(text))
    except ConversionError:
        return False
    sizes = {option(name) for name in SIZE_DEGREES}
    return any(
        _runs_megatron(word) or word.text.split("=", 1)[0] in sizes
        for line in lines
        for word in line
    )


def read_nemo_yaml(text: str) -> dict[str, Setting]:
    """The settings of a YAML file as NeMo writes them (``model.tensor_model_parallel_size``,
    ``trainer.strategy.…``, ``trainer.devices`` and ``trainer.num_nodes``), wherever they
    sit in the file.

    Raises :class:`ConversionError` for YAML that cannot be read, or a setting written twice
    with different values.
    """
    document = yaml_document(text, "NeMo's config")
    found: dict[str, Setting] = {}
    wanted = (*_VALUED, *FLAG_SETTINGS, *_LISTED)

    def walk(node: Any, path: tuple[str | int, ...]) -> None:
        if not isinstance(node, Mapping):
            return
        for key, value in node.items():
            here = (*path, key)
            name = NEMO_WORLD.get(here[-2:]) or (str(key) if key in wanted else None)
            if name is None:
                walk(value, here)
                continue
            position = located(document, here)
            dotted = ".".join(str(part) for part in here)
            if name in found and found[name].value != value:
                first = found[name]
                raise source_error(
                    dotted,
                    f"{value!r} here but {first.value!r} at {first.key}: which one is meant?",
                    position,
                )
            found[name] = Setting(name, dotted, value, position)

    walk(document.data, ())
    if not found:
        raise nothing_found(
            "NeMo parallelism settings",
            "NeMo's YAML with Megatron-LM's parallelism settings "
            "(model.tensor_model_parallel_size, trainer.devices, ...)",
        )
    return found
