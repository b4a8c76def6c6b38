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
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from meshconf.core.degrees import MAX_WORLD_SIZE
from meshconf.core.errors import describe_value
from meshconf.core.messages import shorten
from meshconf.features.convert.common import Draft, integer_problem
from meshconf.features.convert.shell import (
    Word,
    commands as shell_commands,
    source_error,
    unexpanded,
)
from meshconf.sources.yaml_reader import YamlDocument, YamlError, read_yaml

#: A size as Megatron's argument parser reads it: ASCII digits, with an optional plus.
_DIGITS = re.compile(r"\+?([0-9]+)")
#: Megatron's arguments that set a mesh size, by their name with ``_`` for ``-``.
SIZE_SETTINGS = (
    "tensor_model_parallel_size",
    "pipeline_model_parallel_size",
    "context_parallel_size",
    "expert_model_parallel_size",
    "expert_tensor_parallel_size",
    "num_distributed_optimizer_instances",
)
#: Megatron's arguments that say how training uses the dims, and the key of a config's
#: ``training`` block each one is: the first and last pipeline stage's own layers, the
#: interleaved schedule's model chunks per rank, and group-limited routing's groups per
#: token (DeepSeek-V3's node limit, with a group of experts per node).
TRAINING_SETTINGS = {
    "decoder_first_pipeline_num_layers": "first_stage_layers",
    "decoder_last_pipeline_num_layers": "last_stage_layers",
    "moe_router_group_topk": "moe_max_nodes",
}
#: The interleaved schedule's model chunks per rank, as NeMo and Megatron-LM give them: the
#: count itself, or the layers of each chunk, from which Megatron-LM's arguments derive it
#: over the model's layers.
VIRTUAL_STAGE_SETTINGS = (
    "virtual_pipeline_model_parallel_size",
    "num_virtual_stages_per_pipeline_rank",
)
LAYERS_PER_VIRTUAL_STAGE = "num_layers_per_virtual_pipeline_stage"
#: The micro-batches each model chunk runs before the next, as Megatron-LM's command line and
#: Megatron-Core's config name them.
GROUP_SETTINGS = (
    "microbatch_group_size_per_virtual_pipeline_stage",
    "microbatch_group_size_per_vp_stage",
)
NUM_LAYERS = "num_layers"
#: Megatron's activation recomputation: which tensors (``full`` or ``selective``), and for
#: ``full`` how layers are grouped (``uniform``) or which are recomputed (``block``).
RECOMPUTE_SETTINGS = ("recompute_granularity", "recompute_method", "recompute_num_layers")
#: Megatron's modules recomputed under ``selective`` granularity, any number of names
#: (Megatron-LM's ``--recompute-modules``, argparse's ``nargs='*'``; ``core_attn`` when not
#: given).
RECOMPUTE_MODULES = "recompute_modules"
#: The modules whose recomputation is DeepSeek-V3's, meshconf's ``norms-latent-swiglu``: the
#: norms, latent attention's up-projections and the experts' SwiGLU (Megatron-Core's
#: ``TransformerConfig.recompute_modules``).
NORMS_LATENT_SWIGLU_MODULES = ("layernorm", "mla_up_proj", "moe_act")
#: Megatron-LM's switch that splits the norms' and dropouts' activations over tp.
SEQUENCE_PARALLEL_SWITCH = "sequence_parallel"
#: Megatron-LM's dtypes of AdamW's two moments (its precision-aware optimizer).
MOMENT_DTYPE_SETTINGS = ("exp_avg_dtype", "exp_avg_sq_dtype")
#: Megatron-LM's switch that runs the experts' all-to-all under another micro-batch's compute.
EP_OVERLAP_SWITCH = "overlap_moe_expert_parallel_comm"
#: Megatron-LM's switch for ``--recompute-granularity selective``, which it overrides.
RECOMPUTE_SWITCH = "recompute_activations"
#: Megatron's switches that count the embedding or the loss as a layer of the pipeline split,
#: and the key of the ``training`` block each one sets to 1.
SPLIT_WEIGHT_SETTINGS = {
    "account_for_embedding_in_pipeline_split": "embedding_as_layers",
    "account_for_loss_in_pipeline_split": "output_as_layers",
}
#: Switches: present means true.
FLAG_SETTINGS = (
    "use_tp_pp_dp_mapping",
    "use_distributed_optimizer",
    "fp8_param_gather",
    EP_OVERLAP_SWITCH,
    RECOMPUTE_SWITCH,
    SEQUENCE_PARALLEL_SWITCH,
    *SPLIT_WEIGHT_SETTINGS,
)
#: Megatron-Core's ``initialize_model_parallel(order=...)``, such as ``tp-cp-ep-dp-pp``.
ORDER_SETTING = "order"
#: torchrun's options that give the world size.
LAUNCH_SETTINGS = ("nproc_per_node", "nnodes")
#: NeMo's trainer keys that give the world size.
NEMO_WORLD: dict[tuple[str | int, ...], str] = {
    ("trainer", "devices"): "nproc_per_node",
    ("trainer", "num_nodes"): "nnodes",
}

_VALUED = (
    *SIZE_SETTINGS,
    *TRAINING_SETTINGS,
    *VIRTUAL_STAGE_SETTINGS,
    LAYERS_PER_VIRTUAL_STAGE,
    *GROUP_SETTINGS,
    NUM_LAYERS,
    *RECOMPUTE_SETTINGS,
    *MOMENT_DTYPE_SETTINGS,
    ORDER_SETTING,
)
#: Options that take any number of values.
_LISTED = (RECOMPUTE_MODULES,)
MEGATRON_LM = "Megatron-LM"
_LAUNCHERS = re.compile(r"(.*/)?(torchrun|torch\.distributed\.(run|launch))$")
_SCRIPT = re.compile(r".*\.py$")


@dataclass(frozen=True)
class Setting:
    """One setting: its canonical name, the key as written, its value and its position."""

    name: str
    key: str
    value: Any
    position: tuple[int, int] | None


def _megatron_name(flag: str) -> str:
    return flag[2:].replace("-", "_")


def settings_from_words(
    words: list[Word],
    valued: tuple[str, ...],
    switches: tuple[str, ...],
    *,
    tool: str,
    name_of: Callable[[str], str] = _megatron_name,
    listed: tuple[str, ...] = (),
) -> dict[str, Setting]:
    """``--name value``, ``--name=value`` and switches among ``words``, each named by
    ``name_of(flag)``; the last one wins, as with ``tool``'s argument parser (argparse's),
    which refuses a value given to a switch (``store_true``). An option of ``listed`` takes
    every word up to the next option, none or more, as argparse's ``nargs='*'`` does: its
    value is their tuple.

    Raises :class:`ConversionError` when a switch is given a value or an option lacks one.
    """
    found: dict[str, Setting] = {}
    index = 0
    while index < len(words):
        word = words[index]
        index += 1
        if not word.text.startswith("--"):
            continue
        flag, equals, inline = word.text.partition("=")
        name = name_of(flag)
        if name in switches:
            if equals:
                raise source_error(
                    flag,
                    f"is a switch and takes no value, as {tool}'s parser refuses "
                    f"{shorten(word.text)!r}: give {flag} to turn it on, leave it out to keep it "
                    "off",
                    (word.line, word.column),
                )
            found[name] = Setting(name, flag, True, (word.line, word.column))
            continue
        if name in listed:
            if equals:
                at = (word.line, word.column + len(flag) + 1)
                found[name] = Setting(name, flag, (inline,), at)
                continue
            start = index
            while index < len(words) and not words[index].text.startswith("--"):
                index += 1
            values = tuple(value.text for value in words[start:index])
            found[name] = Setting(name, flag, values, (word.line, word.column))
            continue
        if name not in valued:
            continue
        if equals:
            found[name] = Setting(name, flag, inline, (word.line, word.column + len(flag) + 1))
            continue
        if index >= len(words) or words[index].text.startswith("--"):
            raise source_error(flag, "needs a value", (word.line, word.column))
        value = words[index]
        index += 1
        found[name] = Setting(name, flag, value.text, (value.line, value.column))
    return found


def yaml_document(text: str) -> YamlDocument:
    """``text`` read as YAML, with its positions.

    Raises :class:`ConversionError` for YAML that cannot be read, at its line and column.
    """
    try:
        return read_yaml(text)
    except YamlError as error:
        position = None if error.position is None else (error.position.line, error.position.column)
        raise source_error(None, f"invalid YAML: {error.message}", position) from None


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
                _LAUNCHERS.fullmatch(word.text) or _SCRIPT.fullmatch(word.text) for word in command
            )
        ),
        None,
    )
    if launch is None:
        if len(commands) > 1:
            raise source_error(
                None,
                "found no launch line: expected a command that runs torchrun or a Megatron "
                "training script such as pretrain_gpt.py",
                None,
            )
        launch = commands[0] if commands else []
    script = next((i for i, word in enumerate(launch) if _SCRIPT.fullmatch(word.text)), -1)
    settings = settings_from_words(
        launch[script + 1 :], _VALUED, FLAG_SETTINGS, tool=MEGATRON_LM, listed=_LISTED
    )
    launcher = launch[: max(script, 0)]
    return {**settings_from_words(launcher, LAUNCH_SETTINGS, (), tool="torchrun"), **settings}


def read_nemo_yaml(text: str) -> dict[str, Setting]:
    """The settings of a YAML file as NeMo writes them (``model.tensor_model_parallel_size``,
    ``trainer.strategy.…``, ``trainer.devices`` and ``trainer.num_nodes``), wherever they
    sit in the file.

    Raises :class:`ConversionError` for YAML that cannot be read, or a setting written twice
    with different values.
    """
    document = yaml_document(text)
    found: dict[str, Setting] = {}
    wanted = (*_VALUED, *FLAG_SETTINGS, *_LISTED)

    def walk(node: Any, path: tuple[str | int, ...]) -> None:
        if not isinstance(node, Mapping):
            return
        for key, value in node.items():
            here = (*path, key)
            name = NEMO_WORLD.get(here[-2:]) if len(here) >= 2 else None
            name = name or (str(key) if key in wanted else None)
            if name is None:
                walk(value, here)
                continue
            at = document.positions.get(here)
            position = None if at is None else (at.line, at.column)
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
    return found


def integer_setting(draft: Draft, setting: Setting) -> int | None:
    """A setting's integer as Megatron's argument parser reads it, or None with the problem
    reported at the setting's key."""
    value = setting.value
    if isinstance(value, str):
        digits = _DIGITS.fullmatch(value.strip())
        if digits is None:
            left = unexpanded(value)
            why = "" if left is None else f": {left}; write the number"
            draft.fail(setting.key, f"expected an integer >= 1, got {describe_value(value)}{why}")
            return None
        if len(digits[1]) > len(str(MAX_WORLD_SIZE)):
            draft.fail(
                setting.key,
                f"an integer of {len(digits[1])} digits is larger than {MAX_WORLD_SIZE}, the "
                "most ranks torch can number",
            )
            return None
        value = int(digits[1])
    problem = integer_problem(value, auto=False)
    if problem is not None:
        draft.fail(setting.key, problem)
        return None
    return int(value)
